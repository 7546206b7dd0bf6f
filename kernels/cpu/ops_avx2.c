/*
 * ops_avx2.c - the backend's inner loops for AVX2 + FMA + F16C.
 *
 * The arithmetic is the portable reference's (cpu_impl.h, ops.c), bit for
 * bit, with 8-wide registers: the reference's 16 dot-product lanes are two
 * registers (lanes 0-7 and 8-15), whose sum is the tree's first level, so
 * hsum8(lo + hi) is the reference's tree16. Element tails go through
 * zero-padded buffers so every element takes the vector code. exp is GGML's
 * ggml_v_expf with its final scaling by 2^n done as two exact-power
 * multiplies (AVX2 has no vscalefps), which rounds once as vscalefps does.
 */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

/* (v0 + v4) ..., then (0 + 2) + (1 + 3): the last three levels of tree16. */
static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 ld_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* Copies elements [d0, head_dim) of a row into a zeroed 16-float buffer. */
static inline void tail_f32(const float *src, int d0, int head_dim, float *t)
{
    memset(t, 0, 16 * sizeof(float));
    memcpy(t, src + d0, sizeof(float) * (size_t)(head_dim - d0));
}

static inline void tail_f16(const uint16_t *src, int d0, int head_dim,
                            float *t)
{
    memset(t, 0, 16 * sizeof(float));
    for (int d = d0; d < head_dim; d++)
        t[d - d0] = _cvtsh_ss(src[d]);
}

static void qk_f32(const float *q, const float *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores)
{
    const int d16 = head_dim & ~15;
    float qt[16], kt[16];
    if (d16 < head_dim)
        tail_f32(q, d16, head_dim, qt);
    for (int j = 0; j < n; j++) {
        const float *kj = k + j * stride;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int d = 0; d < d16; d += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(kj + d),
                                 _mm256_loadu_ps(q + d), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(kj + d + 8),
                                 _mm256_loadu_ps(q + d + 8), hi);
        }
        if (d16 < head_dim) {
            tail_f32(kj, d16, head_dim, kt);
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(kt), _mm256_loadu_ps(qt), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(kt + 8),
                                 _mm256_loadu_ps(qt + 8), hi);
        }
        scores[j] = hsum8(_mm256_add_ps(lo, hi)) * scale;
    }
}

static void qk_f16(const float *q, const uint16_t *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores)
{
    const int d16 = head_dim & ~15;
    float qt[16], kt[16];
    if (d16 < head_dim)
        tail_f32(q, d16, head_dim, qt);
    for (int j = 0; j < n; j++) {
        const uint16_t *kj = k + j * stride;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int d = 0; d < d16; d += 16) {
            lo = _mm256_fmadd_ps(ld_f16(kj + d), _mm256_loadu_ps(q + d), lo);
            hi = _mm256_fmadd_ps(ld_f16(kj + d + 8), _mm256_loadu_ps(q + d + 8),
                                 hi);
        }
        if (d16 < head_dim) {
            tail_f16(kj, d16, head_dim, kt);
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(kt), _mm256_loadu_ps(qt), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(kt + 8),
                                 _mm256_loadu_ps(qt + 8), hi);
        }
        scores[j] = hsum8(_mm256_add_ps(lo, hi)) * scale;
    }
}

/* The "dot" arithmetic (cpu_impl.h): 64 lanes as eight registers, folded
 * (a0 + a2) + (a1 + a3) per half, the halves added (the tree's first
 * level), the rest of the tree, the elements past the last 64 in double. */
static inline float fold64(const __m256 *a)
{
    __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]),
                              _mm256_add_ps(a[2], a[6]));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]),
                              _mm256_add_ps(a[3], a[7]));
    return hsum8(_mm256_add_ps(lo, hi));
}

static void qk_dot_f32(const float *q, const float *k, int64_t stride, int n,
                       int head_dim, float scale, float *scores)
{
    const int d64 = head_dim & ~63;
    for (int j = 0; j < n; j++) {
        const float *kj = k + j * stride;
        __m256 a[8];
        for (int i = 0; i < 8; i++)
            a[i] = _mm256_setzero_ps();
        for (int d = 0; d < d64; d += 64)
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kj + d + 8 * i),
                                       _mm256_loadu_ps(q + d + 8 * i), a[i]);
        double sum = (double)fold64(a);
        for (int d = d64; d < head_dim; d++)
            sum += (double)(kj[d] * q[d]);
        scores[j] = (float)sum * scale;
    }
}

static void qk_dot_f16(const float *q, const uint16_t *k, int64_t stride,
                       int n, int head_dim, float scale, float *scores)
{
    const int d64 = head_dim & ~63;
    for (int j = 0; j < n; j++) {
        const uint16_t *kj = k + j * stride;
        __m256 a[8];
        for (int i = 0; i < 8; i++)
            a[i] = _mm256_setzero_ps();
        for (int d = 0; d < d64; d += 64)
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_fmadd_ps(ld_f16(kj + d + 8 * i),
                                       _mm256_loadu_ps(q + d + 8 * i), a[i]);
        double sum = (double)fold64(a);
        for (int d = d64; d < head_dim; d++)
            sum += (double)(_cvtsh_ss(kj[d]) * q[d]);
        scores[j] = (float)sum * scale;
    }
}

/* 2^e for integer lanes e in [-126, 127]. */
static inline __m256 pow2i8(__m256i e)
{
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}

/* GGML's ggml_v_expf. */
static inline __m256 gexp8(__m256 x)
{
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(
        n, _mm256_set1_ps(0x1.7f7d1cp-20f),
        _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                        _mm256_set1_ps(0x1.573e2ep-5f)),
                        u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                        _mm256_set1_ps(0x1.fffdb6p-2f))),
        u,
        _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b,
                        _mm256_set1_ps(1.0f)));
    /* j * 2^n: n is integral; |n| <= 192 splits into two halves whose
     * powers are normal floats, the first multiply exact */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2i8(n1)), pow2i8(n2));
    const __m256 absn = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 d = _mm256_cmp_ps(absn, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    if (_mm256_testz_ps(d, d))
        return res;
    const __m256 alt = _mm256_blendv_ps(
        _mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
        _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    return _mm256_blendv_ps(res, alt, d);
}

static double softmax_exp(float *s, int n, float max)
{
    const __m256 vmax = _mm256_set1_ps(max);
    double sum = 0.0;
    for (int j = 0; j < n; j += 16) {
        float x[16] = {0}, e[16];
        int m = n - j < 16 ? n - j : 16;
        memcpy(x, s + j, sizeof(float) * (size_t)m);
        __m256 lo = gexp8(_mm256_sub_ps(_mm256_loadu_ps(x), vmax));
        __m256 hi = gexp8(_mm256_sub_ps(_mm256_loadu_ps(x + 8), vmax));
        _mm256_storeu_ps(e, lo);
        _mm256_storeu_ps(e + 8, hi);
        for (int l = m; l < 16; l++) /* positions past n add nothing */
            e[l] = 0.0f;
        memcpy(s + j, e, sizeof(float) * (size_t)m);
        sum += (double)hsum8(
            _mm256_add_ps(_mm256_loadu_ps(e), _mm256_loadu_ps(e + 8)));
    }
    return sum;
}

static void pv_f32(float *lanes, int n_lanes, int j0, const float *p,
                   const float *v, int64_t stride, int n, int head_dim)
{
    const int d8 = head_dim & ~7;
    for (int j = 0; j < n; j++) {
        float *l = lanes + (size_t)((j0 + j) & (n_lanes - 1)) * (size_t)head_dim;
        const float *vj = v + j * stride;
        const __m256 pj = _mm256_set1_ps(p[j]);
        int d = 0;
        for (; d < d8; d += 8)
            _mm256_storeu_ps(l + d, _mm256_fmadd_ps(_mm256_loadu_ps(vj + d), pj,
                                                    _mm256_loadu_ps(l + d)));
        for (; d < head_dim; d++)
            l[d] = fmaf(vj[d], p[j], l[d]);
    }
}

static void pv_f16(float *lanes, int n_lanes, int j0, const float *p,
                   const uint16_t *v, int64_t stride, int n, int head_dim)
{
    const int d8 = head_dim & ~7;
    for (int j = 0; j < n; j++) {
        float *l = lanes + (size_t)((j0 + j) & (n_lanes - 1)) * (size_t)head_dim;
        const uint16_t *vj = v + j * stride;
        const __m256 pj = _mm256_set1_ps(p[j]);
        int d = 0;
        for (; d < d8; d += 8)
            _mm256_storeu_ps(l + d, _mm256_fmadd_ps(ld_f16(vj + d), pj,
                                                    _mm256_loadu_ps(l + d)));
        for (; d < head_dim; d++)
            l[d] = fmaf(_cvtsh_ss(vj[d]), p[j], l[d]);
    }
}

static void lanes_sum(const float *lanes, int head_dim, float *out)
{
    const int d8 = head_dim & ~7;
    int d = 0;
    for (; d < d8; d += 8) {
        __m256 v[16];
        for (int l = 0; l < 16; l++)
            v[l] = _mm256_loadu_ps(lanes + (size_t)l * head_dim + d);
        for (int l = 0; l < 8; l++)
            v[l] = _mm256_add_ps(v[l], v[l + 8]);
        for (int l = 0; l < 4; l++)
            v[l] = _mm256_add_ps(v[l], v[l + 4]);
        _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_add_ps(v[0], v[2]),
                                                _mm256_add_ps(v[1], v[3])));
    }
    for (; d < head_dim; d++) {
        float t8[8], t4[4];
        for (int l = 0; l < 8; l++)
            t8[l] = lanes[l * head_dim + d] + lanes[(l + 8) * head_dim + d];
        for (int l = 0; l < 4; l++)
            t4[l] = t8[l] + t8[l + 4];
        out[d] = (t4[0] + t4[2]) + (t4[1] + t4[3]);
    }
}

static inline __m256 silu8(__m256 g, __m256 u)
{
    __m256 e = gexp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
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

static void round_f16(float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(
                                    _mm256_loadu_ps(x + i), F16_RNE)));
    for (; i < n; i++)
        x[i] = _cvtsh_ss(_cvtss_sh(x[i], F16_RNE));
}

static void scale_rows(float *x, int64_t n, float s, int f16)
{
    const __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (f16)
            v = _mm256_cvtph_ps(_mm256_cvtps_ph(v, F16_RNE));
        _mm256_storeu_ps(x + i, v);
    }
    for (; i < n; i++) {
        x[i] *= s;
        if (f16)
            x[i] = _cvtsh_ss(_cvtss_sh(x[i], F16_RNE));
    }
}

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
    qk_f32, qk_f16, qk_dot_f32, qk_dot_f16, softmax_exp,
    pv_f32, pv_f16, lanes_sum,  silu_mul,   to_f16,
    round_f16, scale_rows, NULL, NULL, NULL, NULL,
};
#endif
