/*
 * ops_avx512.c - attention inner loops for AVX-512 (F, BW, VL).
 *
 * Same shape as ops_avx2.c with 16 lanes; a head dimension that is not a
 * multiple of 16 is finished with masked loads instead of scalar code, so
 * every element of a dot product goes through the same vector FMA chain.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "cpu_impl.h"

/* Sum of the 16 lanes in a fixed order. */
static inline float hsum16(__m512 v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                              _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8),
                          _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m512 load_f32(const float *p, __mmask16 m)
{
    return _mm512_maskz_loadu_ps(m, p);
}

static inline __m512 load_f16(const uint16_t *p, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

static inline __mmask16 lanes(int left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

#define QK_BODY(LOAD)                                                          \
    int j = 0;                                                                 \
    for (; j + 4 <= n; j += 4) {                                               \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;           \
        for (int d = 0; d < head_dim; d += 16) {                               \
            __mmask16 m = lanes(head_dim - d);                                 \
            __m512 qv = _mm512_maskz_loadu_ps(m, q + d);                       \
            a0 = _mm512_fmadd_ps(qv, LOAD(k + (j + 0) * stride + d, m), a0);   \
            a1 = _mm512_fmadd_ps(qv, LOAD(k + (j + 1) * stride + d, m), a1);   \
            a2 = _mm512_fmadd_ps(qv, LOAD(k + (j + 2) * stride + d, m), a2);   \
            a3 = _mm512_fmadd_ps(qv, LOAD(k + (j + 3) * stride + d, m), a3);   \
        }                                                                      \
        scores[j + 0] = hsum16(a0) * scale;                                    \
        scores[j + 1] = hsum16(a1) * scale;                                    \
        scores[j + 2] = hsum16(a2) * scale;                                    \
        scores[j + 3] = hsum16(a3) * scale;                                    \
    }                                                                          \
    for (; j < n; j++) {                                                       \
        __m512 a0 = _mm512_setzero_ps();                                       \
        for (int d = 0; d < head_dim; d += 16) {                               \
            __mmask16 m = lanes(head_dim - d);                                 \
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d),             \
                                 LOAD(k + j * stride + d, m), a0);             \
        }                                                                      \
        scores[j] = hsum16(a0) * scale;                                        \
    }

static void qk_f32(const float *q, const float *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores)
{
    QK_BODY(load_f32)
}

static void qk_f16(const float *q, const uint16_t *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores)
{
    QK_BODY(load_f16)
}

/* acc += sum_j p[j] * v_j; up to 64 accumulator lanes in registers. */
#define PV_BODY(LOAD)                                                          \
    int d = 0;                                                                 \
    for (; d + 64 <= head_dim; d += 64) {                                      \
        __m512 a0 = _mm512_loadu_ps(acc + d);                                  \
        __m512 a1 = _mm512_loadu_ps(acc + d + 16);                             \
        __m512 a2 = _mm512_loadu_ps(acc + d + 32);                             \
        __m512 a3 = _mm512_loadu_ps(acc + d + 48);                             \
        for (int j = 0; j < n; j++) {                                          \
            __m512 pj = _mm512_set1_ps(p[j]);                                  \
            a0 = _mm512_fmadd_ps(pj, LOAD(v + j * stride + d, 0xffff), a0);    \
            a1 = _mm512_fmadd_ps(pj, LOAD(v + j * stride + d + 16, 0xffff),   \
                                 a1);                                          \
            a2 = _mm512_fmadd_ps(pj, LOAD(v + j * stride + d + 32, 0xffff),   \
                                 a2);                                          \
            a3 = _mm512_fmadd_ps(pj, LOAD(v + j * stride + d + 48, 0xffff),   \
                                 a3);                                          \
        }                                                                      \
        _mm512_storeu_ps(acc + d, a0);                                         \
        _mm512_storeu_ps(acc + d + 16, a1);                                    \
        _mm512_storeu_ps(acc + d + 32, a2);                                    \
        _mm512_storeu_ps(acc + d + 48, a3);                                    \
    }                                                                          \
    for (; d < head_dim; d += 16) {                                            \
        __mmask16 m = lanes(head_dim - d);                                     \
        __m512 a0 = _mm512_maskz_loadu_ps(m, acc + d);                         \
        for (int j = 0; j < n; j++)                                            \
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]),                         \
                                 LOAD(v + j * stride + d, m), a0);             \
        _mm512_mask_storeu_ps(acc + d, m, a0);                                 \
    }

static void pv_f32(float *acc, const float *p, const float *v, int64_t stride,
                   int n, int head_dim)
{
    PV_BODY(load_f32)
}

static void pv_f16(float *acc, const float *p, const uint16_t *v,
                   int64_t stride, int n, int head_dim)
{
    PV_BODY(load_f16)
}

const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx512 = {qk_f32, qk_f16, pv_f32,
                                                       pv_f16};
#endif
