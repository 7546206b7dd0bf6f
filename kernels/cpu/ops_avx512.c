/*
 * ops_avx512.c - the backend's inner loops for AVX-512 (F, BW, VL).
 *
 * Attention QK: a dot product over the head dimension leaves 16 partial
 * sums per position. Sixteen positions are reduced together by a
 * transpose-and-add network whose additions for each position form the same
 * tree as hsum16() (lanes i + i+8, then + i+4, + i+2, + i+1), so a position
 * gets the same bits in a group of 16 or alone at the end of a block. A head
 * dimension that is not a multiple of 16 is finished with masked loads.
 *
 * exp: Cephes' expf polynomial on x - n ln2 (n = round(x log2 e), ln2 split
 * in two), scaled by 2^n in two steps so subnormal results round once;
 * within about 1 ulp of the true value, NaN in NaN out.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

/* Fully unrolled loops keep accumulator arrays in registers. */
#define UNROLL _Pragma("GCC unroll 16")

/* Sum of the 16 lanes: ((l_i + l_{i+8}) + ...) halving, as in the network. */
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

/* Lane j of the result = hsum16(v[j]), bit for bit. */
static inline __m512 hsum16x16(const __m512 *v)
{
    __m512 w[8], x[4], y[2];
    UNROLL
    for (int k = 0; k < 8; k++) /* lanes i + i+8 */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xee));
    UNROLL
    for (int k = 0; k < 4; k++) /* + i+4 */
        x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xdd));
    UNROLL
    for (int k = 0; k < 2; k++) /* + i+2 */
        y[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0x44),
                             _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0xee));
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), /* + i+1 */
                             _mm512_shuffle_ps(y[0], y[1], 0xdd));
    /* lane 4m + i holds position m + 4i */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10,
                                          14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, z);
}

static inline __mmask16 lanes(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* Loads of 16 K/V elements (or the first lanes of m), widened to float. */
static inline __m512 ld_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 ldm_f32(__mmask16 m, const float *p)
{
    return _mm512_maskz_loadu_ps(m, p);
}
static inline __m512 ld_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 ldm_f16(__mmask16 m, const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* Dot products over the head dimension: whole 16-lane chunks, then one
 * masked chunk for the rest (zero lanes add nothing). */
static void qk(const float *q, const float *k, int64_t stride, int n,
               int head_dim, float scale, float *scores)
{
    const __m512 vs = _mm512_set1_ps(scale);
    const int d16 = head_dim & ~15;
    const __mmask16 mt = lanes(head_dim - d16);
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const float *kj = k + j * stride;
        __m512 acc[16];
        UNROLL
        for (int p = 0; p < 16; p++)
            acc[p] = _mm512_setzero_ps();
        for (int d = 0; d < d16; d += 16) {
            __m512 qv = _mm512_loadu_ps(q + d);
            UNROLL
            for (int p = 0; p < 16; p++)
                acc[p] = _mm512_fmadd_ps(
                    qv, ld_f32(kj + p * stride + d), acc[p]);
        }
        if (mt) {
            __m512 qv = _mm512_maskz_loadu_ps(mt, q + d16);
            UNROLL
            for (int p = 0; p < 16; p++)
                acc[p] = _mm512_fmadd_ps(
                    qv, ldm_f32(mt, kj + p * stride + d16),
                    acc[p]);
        }
        _mm512_storeu_ps(scores + j, _mm512_mul_ps(hsum16x16(acc), vs));
    }
    for (; j < n; j++) {
        const float *kj = k + j * stride;
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < d16; d += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d),
                                  ld_f32(kj + d), acc);
        if (mt)
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, q + d16),
                                  ldm_f32(mt, kj + d16), acc);
        scores[j] = hsum16(acc) * scale;
    }
}

static void qk_f16(const float *q, const uint16_t *k, int64_t stride, int n,
               int head_dim, float scale, float *scores)
{
    const __m512 vs = _mm512_set1_ps(scale);
    const int d16 = head_dim & ~15;
    const __mmask16 mt = lanes(head_dim - d16);
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const uint16_t *kj = k + j * stride;
        __m512 acc[16];
        UNROLL
        for (int p = 0; p < 16; p++)
            acc[p] = _mm512_setzero_ps();
        for (int d = 0; d < d16; d += 16) {
            __m512 qv = _mm512_loadu_ps(q + d);
            UNROLL
            for (int p = 0; p < 16; p++)
                acc[p] = _mm512_fmadd_ps(
                    qv, ld_f16(kj + p * stride + d), acc[p]);
        }
        if (mt) {
            __m512 qv = _mm512_maskz_loadu_ps(mt, q + d16);
            UNROLL
            for (int p = 0; p < 16; p++)
                acc[p] = _mm512_fmadd_ps(
                    qv, ldm_f16(mt, kj + p * stride + d16),
                    acc[p]);
        }
        _mm512_storeu_ps(scores + j, _mm512_mul_ps(hsum16x16(acc), vs));
    }
    for (; j < n; j++) {
        const uint16_t *kj = k + j * stride;
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < d16; d += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d),
                                  ld_f16(kj + d), acc);
        if (mt)
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mt, q + d16),
                                  ldm_f16(mt, kj + d16), acc);
        scores[j] = hsum16(acc) * scale;
    }
}

/* Up to 64 accumulator lanes stay in registers across the positions. */
static void pv(float *acc, const float *p, const float *v, int64_t stride,
               int n, int head_dim)
{
    int d = 0;
    for (; d + 64 <= head_dim; d += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + d);
        __m512 a1 = _mm512_loadu_ps(acc + d + 16);
        __m512 a2 = _mm512_loadu_ps(acc + d + 32);
        __m512 a3 = _mm512_loadu_ps(acc + d + 48);
        for (int j = 0; j < n; j++) {
            const float *vj = v + j * stride + d;
            __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(pj, ld_f32(vj), a0);
            a1 = _mm512_fmadd_ps(pj, ld_f32(vj + 16), a1);
            a2 = _mm512_fmadd_ps(pj, ld_f32(vj + 32), a2);
            a3 = _mm512_fmadd_ps(pj, ld_f32(vj + 48), a3);
        }
        _mm512_storeu_ps(acc + d, a0);
        _mm512_storeu_ps(acc + d + 16, a1);
        _mm512_storeu_ps(acc + d + 32, a2);
        _mm512_storeu_ps(acc + d + 48, a3);
    }
    for (; d < head_dim; d += 16) {
        __mmask16 m = lanes(head_dim - d);
        __m512 a0 = _mm512_maskz_loadu_ps(m, acc + d);
        for (int j = 0; j < n; j++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]),
                                 ldm_f32(m, v + j * stride + d),
                                 a0);
        _mm512_mask_storeu_ps(acc + d, m, a0);
    }
}

static void pv_f16(float *acc, const float *p, const uint16_t *v, int64_t stride,
               int n, int head_dim)
{
    int d = 0;
    for (; d + 64 <= head_dim; d += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + d);
        __m512 a1 = _mm512_loadu_ps(acc + d + 16);
        __m512 a2 = _mm512_loadu_ps(acc + d + 32);
        __m512 a3 = _mm512_loadu_ps(acc + d + 48);
        for (int j = 0; j < n; j++) {
            const uint16_t *vj = v + j * stride + d;
            __m512 pj = _mm512_set1_ps(p[j]);
            a0 = _mm512_fmadd_ps(pj, ld_f16(vj), a0);
            a1 = _mm512_fmadd_ps(pj, ld_f16(vj + 16), a1);
            a2 = _mm512_fmadd_ps(pj, ld_f16(vj + 32), a2);
            a3 = _mm512_fmadd_ps(pj, ld_f16(vj + 48), a3);
        }
        _mm512_storeu_ps(acc + d, a0);
        _mm512_storeu_ps(acc + d + 16, a1);
        _mm512_storeu_ps(acc + d + 32, a2);
        _mm512_storeu_ps(acc + d + 48, a3);
    }
    for (; d < head_dim; d += 16) {
        __mmask16 m = lanes(head_dim - d);
        __m512 a0 = _mm512_maskz_loadu_ps(m, acc + d);
        for (int j = 0; j < n; j++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]),
                                 ldm_f16(m, v + j * stride + d),
                                 a0);
        _mm512_mask_storeu_ps(acc + d, m, a0);
    }
}

static void widen_rows(const uint16_t *src, int64_t stride, int n,
                       int head_dim, float *dst)
{
    const int d16 = head_dim & ~15;
    const __mmask16 mt = lanes(head_dim - d16);
    for (int j = 0; j < n; j++) {
        const uint16_t *s = src + j * stride;
        float *o = dst + j * head_dim;
        for (int d = 0; d < d16; d += 16)
            _mm512_storeu_ps(o + d, _mm512_cvtph_ps(_mm256_loadu_si256(
                                        (const __m256i *)(s + d))));
        if (mt)
            _mm512_mask_storeu_ps(
                o + d16, mt,
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mt, s + d16)));
    }
}

static inline __m512 exp16(__m512 x)
{
    /* max/min return their second operand for NaN: NaN passes through */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
    __m512 n = _mm512_roundscale_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r),
                        _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i ni = _mm512_cvtps_epi32(n);
    __m512i n1 = _mm512_srai_epi32(ni, 1);
    __m512i n2 = _mm512_sub_epi32(ni, n1);
    const __m512i bias = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
    __m512 s2 = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

static double softmax_exp(float *s, int n)
{
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16)
        vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, lanes(n - j),
                                                        s + j));
    vmax = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    for (int j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vmax));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(s + j, m, e);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double l[8];
    _mm512_storeu_pd(l, _mm512_add_pd(lo, hi));
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static void silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)),
                                 _mm512_maskz_loadu_ps(m, up + i));
        _mm512_mask_storeu_ps(out + i, m, y);
    }
}

static void to_f16(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = lanes(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                    _MM_FROUND_TO_NEAREST_INT |
                                        _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx512 = {
    qk, pv, qk_f16, pv_f16, widen_rows, softmax_exp, silu_mul, to_f16,
};
#endif
