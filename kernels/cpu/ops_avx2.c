/*
 * ops_avx2.c - attention inner loops for AVX2 + FMA + F16C.
 *
 * Decode at long contexts spends its time here: each query head reads every
 * cached K and V row of its sequence. K/V rows in F16 are widened with F16C.
 * Scores are computed four positions at a time with independent
 * accumulators (latency hiding), but each position's dot product is the same
 * sequence of FMAs over the head dimension whichever group it lands in, so
 * results do not depend on where a block boundary or the context end falls.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>

#include "cpu_impl.h"

/* Sum of the 8 lanes in a fixed order. */
static inline float hsum8(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 load8_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Dot products of q with 4 rows (ends: head_dim % 8 scalar elements). */
#define QK_BODY(LOAD, SCALAR)                                                  \
    int j = 0;                                                                 \
    int d8 = head_dim & ~7;                                                    \
    for (; j + 4 <= n; j += 4) {                                               \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;           \
        for (int d = 0; d < d8; d += 8) {                                      \
            __m256 qv = _mm256_loadu_ps(q + d);                                \
            a0 = _mm256_fmadd_ps(qv, LOAD(k + (j + 0) * stride + d), a0);      \
            a1 = _mm256_fmadd_ps(qv, LOAD(k + (j + 1) * stride + d), a1);      \
            a2 = _mm256_fmadd_ps(qv, LOAD(k + (j + 2) * stride + d), a2);      \
            a3 = _mm256_fmadd_ps(qv, LOAD(k + (j + 3) * stride + d), a3);      \
        }                                                                      \
        float s0 = hsum8(a0), s1 = hsum8(a1), s2 = hsum8(a2), s3 = hsum8(a3); \
        for (int d = d8; d < head_dim; d++) {                                  \
            s0 = fmaf(q[d], SCALAR(k[(j + 0) * stride + d]), s0);              \
            s1 = fmaf(q[d], SCALAR(k[(j + 1) * stride + d]), s1);              \
            s2 = fmaf(q[d], SCALAR(k[(j + 2) * stride + d]), s2);              \
            s3 = fmaf(q[d], SCALAR(k[(j + 3) * stride + d]), s3);              \
        }                                                                      \
        scores[j + 0] = s0 * scale;                                            \
        scores[j + 1] = s1 * scale;                                            \
        scores[j + 2] = s2 * scale;                                            \
        scores[j + 3] = s3 * scale;                                            \
    }                                                                          \
    for (; j < n; j++) {                                                       \
        __m256 a0 = _mm256_setzero_ps();                                       \
        for (int d = 0; d < d8; d += 8)                                        \
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d),                      \
                                 LOAD(k + j * stride + d), a0);                \
        float s0 = hsum8(a0);                                                  \
        for (int d = d8; d < head_dim; d++)                                    \
            s0 = fmaf(q[d], SCALAR(k[j * stride + d]), s0);                    \
        scores[j] = s0 * scale;                                                \
    }

#define LOAD_F32(p) _mm256_loadu_ps(p)
#define SCALAR_F32(x) (x)
#define SCALAR_F16(x) _cvtsh_ss(x)

static void qk_f32(const float *q, const float *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores)
{
    QK_BODY(LOAD_F32, SCALAR_F32)
}

static void qk_f16(const float *q, const uint16_t *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores)
{
    QK_BODY(load8_f16, SCALAR_F16)
}

/* acc += sum_j p[j] * v_j, one FMA per element and position, j ascending.
 * Up to 32 accumulator lanes stay in registers across the positions. */
#define PV_BODY(LOAD, SCALAR)                                                  \
    int d = 0;                                                                 \
    for (; d + 32 <= head_dim; d += 32) {                                      \
        __m256 a0 = _mm256_loadu_ps(acc + d);                                  \
        __m256 a1 = _mm256_loadu_ps(acc + d + 8);                              \
        __m256 a2 = _mm256_loadu_ps(acc + d + 16);                             \
        __m256 a3 = _mm256_loadu_ps(acc + d + 24);                             \
        for (int j = 0; j < n; j++) {                                          \
            __m256 pj = _mm256_set1_ps(p[j]);                                  \
            a0 = _mm256_fmadd_ps(pj, LOAD(v + j * stride + d), a0);            \
            a1 = _mm256_fmadd_ps(pj, LOAD(v + j * stride + d + 8), a1);        \
            a2 = _mm256_fmadd_ps(pj, LOAD(v + j * stride + d + 16), a2);       \
            a3 = _mm256_fmadd_ps(pj, LOAD(v + j * stride + d + 24), a3);       \
        }                                                                      \
        _mm256_storeu_ps(acc + d, a0);                                         \
        _mm256_storeu_ps(acc + d + 8, a1);                                     \
        _mm256_storeu_ps(acc + d + 16, a2);                                    \
        _mm256_storeu_ps(acc + d + 24, a3);                                    \
    }                                                                          \
    for (; d + 8 <= head_dim; d += 8) {                                        \
        __m256 a0 = _mm256_loadu_ps(acc + d);                                  \
        for (int j = 0; j < n; j++)                                            \
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),                         \
                                 LOAD(v + j * stride + d), a0);                \
        _mm256_storeu_ps(acc + d, a0);                                         \
    }                                                                          \
    for (; d < head_dim; d++) {                                                \
        float a0 = acc[d];                                                     \
        for (int j = 0; j < n; j++)                                            \
            a0 = fmaf(p[j], SCALAR(v[j * stride + d]), a0);                    \
        acc[d] = a0;                                                           \
    }

static void pv_f32(float *acc, const float *p, const float *v, int64_t stride,
                   int n, int head_dim)
{
    PV_BODY(LOAD_F32, SCALAR_F32)
}

static void pv_f16(float *acc, const float *p, const uint16_t *v,
                   int64_t stride, int n, int head_dim)
{
    PV_BODY(load8_f16, SCALAR_F16)
}

const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx2 = {qk_f32, qk_f16, pv_f32,
                                                     pv_f16};
#endif
