/*
 * ops_avx2.c - the backend's inner loops for AVX2 + FMA + F16C.
 *
 * Same structure as ops_avx512.c with 8 lanes: attention QK reduces eight
 * positions at once through a transpose-and-add network that adds, for each
 * position, exactly as hsum8() does (lanes i + i+4, + i+2, + i+1); a head
 * dimension that is not a multiple of 8 is finished with scalar FMAs after
 * the reduction, in both paths. Tails of the flat loops go through a padded
 * 8-lane buffer so every element takes the vector code.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

/* Fully unrolled loops keep accumulator arrays in registers. */
#define UNROLL _Pragma("GCC unroll 16")

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane j of the result = hsum8(v[j]), bit for bit. */
static inline __m256 hsum8x8(const __m256 *v)
{
    __m256 w[4], x[2];
    UNROLL
    for (int k = 0; k < 4; k++) /* lanes i + i+4 */
        w[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
    UNROLL
    for (int k = 0; k < 2; k++) /* + i+2 */
        x[k] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * k], w[2 * k + 1], 0x44),
                             _mm256_shuffle_ps(w[2 * k], w[2 * k + 1], 0xee));
    __m256 z = _mm256_add_ps(_mm256_shuffle_ps(x[0], x[1], 0x88), /* + i+1 */
                             _mm256_shuffle_ps(x[0], x[1], 0xdd));
    /* lane 4h + i holds position h + 2i */
    return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Loads of 8 K/V elements and single elements, widened to float. */
static inline __m256 ld_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 ld_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline float el_f32(float x) { return x; }
static inline float el_f16(uint16_t x) { return _cvtsh_ss(x); }

static void qk(const float *q, const float *k, int64_t stride, int n,
               int head_dim, float scale, float *scores)
{
    const int d8 = head_dim & ~7;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 acc[8];
        UNROLL
        for (int p = 0; p < 8; p++)
            acc[p] = _mm256_setzero_ps();
        for (int d = 0; d < d8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            UNROLL
            for (int p = 0; p < 8; p++)
                acc[p] = _mm256_fmadd_ps(
                    qv, ld_f32(k + (j + p) * stride + d), acc[p]);
        }
        float s[8];
        _mm256_storeu_ps(s, hsum8x8(acc));
        for (int p = 0; p < 8; p++) {
            for (int d = d8; d < head_dim; d++)
                s[p] = fmaf(q[d], el_f32(k[(j + p) * stride + d]), s[p]);
            scores[j + p] = s[p] * scale;
        }
    }
    for (; j < n; j++) {
        __m256 acc = _mm256_setzero_ps();
        for (int d = 0; d < d8; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d),
                                  ld_f32(k + j * stride + d), acc);
        float s = hsum8(acc);
        for (int d = d8; d < head_dim; d++)
            s = fmaf(q[d], el_f32(k[j * stride + d]), s);
        scores[j] = s * scale;
    }
}

static void qk_f16(const float *q, const uint16_t *k, int64_t stride, int n,
               int head_dim, float scale, float *scores)
{
    const int d8 = head_dim & ~7;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 acc[8];
        UNROLL
        for (int p = 0; p < 8; p++)
            acc[p] = _mm256_setzero_ps();
        for (int d = 0; d < d8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            UNROLL
            for (int p = 0; p < 8; p++)
                acc[p] = _mm256_fmadd_ps(
                    qv, ld_f16(k + (j + p) * stride + d), acc[p]);
        }
        float s[8];
        _mm256_storeu_ps(s, hsum8x8(acc));
        for (int p = 0; p < 8; p++) {
            for (int d = d8; d < head_dim; d++)
                s[p] = fmaf(q[d], el_f16(k[(j + p) * stride + d]), s[p]);
            scores[j + p] = s[p] * scale;
        }
    }
    for (; j < n; j++) {
        __m256 acc = _mm256_setzero_ps();
        for (int d = 0; d < d8; d += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d),
                                  ld_f16(k + j * stride + d), acc);
        float s = hsum8(acc);
        for (int d = d8; d < head_dim; d++)
            s = fmaf(q[d], el_f16(k[j * stride + d]), s);
        scores[j] = s * scale;
    }
}

/* Up to 32 accumulator lanes stay in registers across the positions. */
static void pv(float *acc, const float *p, const float *v, int64_t stride,
               int n, int head_dim)
{
    int d = 0;
    for (; d + 32 <= head_dim; d += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        __m256 a1 = _mm256_loadu_ps(acc + d + 8);
        __m256 a2 = _mm256_loadu_ps(acc + d + 16);
        __m256 a3 = _mm256_loadu_ps(acc + d + 24);
        for (int j = 0; j < n; j++) {
            const float *vj = v + j * stride + d;
            __m256 pj = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(pj, ld_f32(vj), a0);
            a1 = _mm256_fmadd_ps(pj, ld_f32(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, ld_f32(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, ld_f32(vj + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= head_dim; d += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        for (int j = 0; j < n; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),
                                 ld_f32(v + j * stride + d), a0);
        _mm256_storeu_ps(acc + d, a0);
    }
    for (; d < head_dim; d++) {
        float a0 = acc[d];
        for (int j = 0; j < n; j++)
            a0 = fmaf(p[j], el_f32(v[j * stride + d]), a0);
        acc[d] = a0;
    }
}

static void pv_f16(float *acc, const float *p, const uint16_t *v, int64_t stride,
               int n, int head_dim)
{
    int d = 0;
    for (; d + 32 <= head_dim; d += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        __m256 a1 = _mm256_loadu_ps(acc + d + 8);
        __m256 a2 = _mm256_loadu_ps(acc + d + 16);
        __m256 a3 = _mm256_loadu_ps(acc + d + 24);
        for (int j = 0; j < n; j++) {
            const uint16_t *vj = v + j * stride + d;
            __m256 pj = _mm256_set1_ps(p[j]);
            a0 = _mm256_fmadd_ps(pj, ld_f16(vj), a0);
            a1 = _mm256_fmadd_ps(pj, ld_f16(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, ld_f16(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, ld_f16(vj + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= head_dim; d += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        for (int j = 0; j < n; j++)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]),
                                 ld_f16(v + j * stride + d), a0);
        _mm256_storeu_ps(acc + d, a0);
    }
    for (; d < head_dim; d++) {
        float a0 = acc[d];
        for (int j = 0; j < n; j++)
            a0 = fmaf(p[j], el_f16(v[j * stride + d]), a0);
        acc[d] = a0;
    }
}

static void widen_rows(const uint16_t *src, int64_t stride, int n,
                       int head_dim, float *dst)
{
    const int d8 = head_dim & ~7;
    for (int j = 0; j < n; j++) {
        const uint16_t *s = src + j * stride;
        float *o = dst + j * head_dim;
        for (int d = 0; d < d8; d += 8)
            _mm256_storeu_ps(o + d, _mm256_cvtph_ps(_mm_loadu_si128(
                                        (const __m128i *)(s + d))));
        for (int d = d8; d < head_dim; d++)
            o[d] = _cvtsh_ss(s[d]);
    }
}

static inline __m256 exp8(__m256 x)
{
    /* max/min return their second operand for NaN: NaN passes through */
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), x);
    __m256 n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r),
                        _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static double softmax_exp(float *s, int n)
{
    float max = -INFINITY;
    int j = 0;
    if (n >= 8) {
        __m256 vm = _mm256_loadu_ps(s);
        for (j = 8; j + 8 <= n; j += 8)
            vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
        float l[8];
        _mm256_storeu_ps(l, vm);
        for (int i = 0; i < 8; i++)
            max = l[i] > max ? l[i] : max;
    }
    for (; j < n; j++)
        max = s[j] > max ? s[j] : max;

    const __m256 vmax = _mm256_set1_ps(max);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (j = 0; j < n; j += 8) {
        float pad[8];
        int m = n - j < 8 ? n - j : 8;
        const float *src = s + j;
        if (m < 8) { /* -inf lanes become exp() = 0 */
            for (int i = 0; i < 8; i++)
                pad[i] = i < m ? s[j + i] : -INFINITY;
            src = pad;
        }
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(src), vmax));
        if (m < 8) {
            _mm256_storeu_ps(pad, e);
            memcpy(s + j, pad, sizeof(float) * (size_t)m);
        } else {
            _mm256_storeu_ps(s + j, e);
        }
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double l[4];
    _mm256_storeu_pd(l, _mm256_add_pd(lo, hi));
    return (l[0] + l[2]) + (l[1] + l[3]);
}

static inline __m256 silu8(__m256 g, __m256 u)
{
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                         u);
}

static void silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, silu8(_mm256_loadu_ps(gate + i),
                                        _mm256_loadu_ps(up + i)));
    if (i < n) {
        float g[8] = {0}, u[8] = {0}, o[8];
        memcpy(g, gate + i, sizeof(float) * (size_t)(n - i));
        memcpy(u, up + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(o, silu8(_mm256_loadu_ps(g), _mm256_loadu_ps(u)));
        memcpy(out + i, o, sizeof(float) * (size_t)(n - i));
    }
}

#define F16_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static void to_f16(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), F16_RNE));
    if (i < n) {
        float s[8] = {0};
        uint16_t h[8];
        memcpy(s, src + i, sizeof(float) * (size_t)(n - i));
        _mm_storeu_si128((__m128i *)h,
                         _mm256_cvtps_ph(_mm256_loadu_ps(s), F16_RNE));
        memcpy(dst + i, h, sizeof(uint16_t) * (size_t)(n - i));
    }
}

const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx2 = {
    qk, pv, qk_f16, pv_f16, widen_rows, softmax_exp, silu_mul, to_f16,
};
#endif
