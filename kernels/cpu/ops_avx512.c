/*
 * ops_avx512.c - the backend's inner loops for AVX-512 (F, BW, VL, DQ).
 *
 * The arithmetic is the portable reference's (cpu_impl.h, ops.c), bit for
 * bit. Attention QK: a dot product over the head dimension leaves 16 partial
 * sums per position; sixteen positions are reduced together by a
 * transpose-and-add network whose additions for each position form the same
 * tree as hsum16() (lanes i + i+8, then + i+4, + i+2, + i+1). A head
 * dimension that is not a multiple of 16 is finished with masked loads
 * (lane l takes the elements d = l mod 16). exp is GGML's ggml_v_expf.
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

static inline __mmask16 tail_mask(int64_t left)
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
    const __mmask16 mt = tail_mask(head_dim - d16);
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
    const __mmask16 mt = tail_mask(head_dim - d16);
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

/* The "dot" arithmetic (cpu_impl.h): four 16-lane accumulators over each
 * 64 elements, folded (a0 + a2) + (a1 + a3), the tree, the rest in double. */
static void qk_dot_f32(const float *q, const float *k, int64_t stride, int n,
                       int head_dim, float scale, float *scores)
{
    const int d64 = head_dim & ~63;
    for (int j = 0; j < n; j++) {
        const float *kj = k + j * stride;
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int d = 0; d < d64; d += 64)
            for (int i = 0; i < 4; i++)
                a[i] = _mm512_fmadd_ps(ld_f32(kj + d + 16 * i),
                                       _mm512_loadu_ps(q + d + 16 * i), a[i]);
        double sum = (double)hsum16(_mm512_add_ps(_mm512_add_ps(a[0], a[2]),
                                                  _mm512_add_ps(a[1], a[3])));
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
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                       _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int d = 0; d < d64; d += 64)
            for (int i = 0; i < 4; i++)
                a[i] = _mm512_fmadd_ps(ld_f16(kj + d + 16 * i),
                                       _mm512_loadu_ps(q + d + 16 * i), a[i]);
        double sum = (double)hsum16(_mm512_add_ps(_mm512_add_ps(a[0], a[2]),
                                                  _mm512_add_ps(a[1], a[3])));
        for (int d = d64; d < head_dim; d++)
            sum += (double)(_cvtsh_ss(kj[d]) * q[d]);
        scores[j] = (float)sum * scale;
    }
}

/* lanes[(j0 + j) % n_lanes][d] = fma(v[j][d], p[j], same) */
static void pv_f32(float *lanes, int n_lanes, int j0, const float *p,
                   const float *v, int64_t stride, int n, int head_dim)
{
    const int d16 = head_dim & ~15;
    const __mmask16 mt = tail_mask(head_dim - d16);
    for (int j = 0; j < n; j++) {
        float *l = lanes + (size_t)((j0 + j) & (n_lanes - 1)) * (size_t)head_dim;
        const float *vj = v + j * stride;
        const __m512 pj = _mm512_set1_ps(p[j]);
        for (int d = 0; d < d16; d += 16)
            _mm512_storeu_ps(l + d, _mm512_fmadd_ps(ld_f32(vj + d), pj,
                                                    _mm512_loadu_ps(l + d)));
        if (mt)
            _mm512_mask_storeu_ps(
                l + d16, mt,
                _mm512_fmadd_ps(ldm_f32(mt, vj + d16), pj,
                                _mm512_maskz_loadu_ps(mt, l + d16)));
    }
}

static void pv_f16(float *lanes, int n_lanes, int j0, const float *p,
                   const uint16_t *v, int64_t stride, int n, int head_dim)
{
    const int d16 = head_dim & ~15;
    const __mmask16 mt = tail_mask(head_dim - d16);
    for (int j = 0; j < n; j++) {
        float *l = lanes + (size_t)((j0 + j) & (n_lanes - 1)) * (size_t)head_dim;
        const uint16_t *vj = v + j * stride;
        const __m512 pj = _mm512_set1_ps(p[j]);
        for (int d = 0; d < d16; d += 16)
            _mm512_storeu_ps(l + d, _mm512_fmadd_ps(ld_f16(vj + d), pj,
                                                    _mm512_loadu_ps(l + d)));
        if (mt)
            _mm512_mask_storeu_ps(
                l + d16, mt,
                _mm512_fmadd_ps(ldm_f16(mt, vj + d16), pj,
                                _mm512_maskz_loadu_ps(mt, l + d16)));
    }
}

/* out[d] = tree over the 16 lanes, elementwise across d. */
static void lanes_sum(const float *lanes, int head_dim, float *out)
{
    for (int d = 0; d < head_dim; d += 16) {
        const __mmask16 m = tail_mask(head_dim - d);
        __m512 v[16];
        UNROLL
        for (int l = 0; l < 16; l++)
            v[l] = _mm512_maskz_loadu_ps(m, lanes + (size_t)l * head_dim + d);
        UNROLL
        for (int l = 0; l < 8; l++)
            v[l] = _mm512_add_ps(v[l], v[l + 8]);
        UNROLL
        for (int l = 0; l < 4; l++)
            v[l] = _mm512_add_ps(v[l], v[l + 4]);
        _mm512_mask_storeu_ps(out + d, m,
                              _mm512_add_ps(_mm512_add_ps(v[0], v[2]),
                                            _mm512_add_ps(v[1], v[3])));
    }
}

/* GGML's ggml_v_expf. */
static inline __m512 gexp16(__m512 x)
{
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(
        n, _mm512_set1_ps(0x1.7f7d1cp-20f),
        _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b,
                                        _mm512_set1_ps(0x1.573e2ep-5f)),
                        u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b,
                                        _mm512_set1_ps(0x1.fffdb6p-2f))),
        u,
        _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b,
                        _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n),
                                           _mm512_set1_ps(192.0f),
                                           _CMP_GT_OQ);
    if (!d)
        return res;
    const __m512 alt = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
        _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(d, res, alt);
}

static double softmax_exp(float *s, int n, float max)
{
    const __m512 vmax = _mm512_set1_ps(max);
    double sum = 0.0;
    for (int j = 0; j < n; j += 16) {
        const __mmask16 m = tail_mask(n - j);
        __m512 e = gexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + j), vmax));
        e = _mm512_maskz_mov_ps(m, e);
        _mm512_mask_storeu_ps(s + j, m, e);
        sum += (double)hsum16(e);
    }
    return sum;
}

static void silu_mul(const float *gate, const float *up, float *out, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
        __m512 e = gexp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        __m512 y = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)),
                                 _mm512_maskz_loadu_ps(m, up + i));
        _mm512_mask_storeu_ps(out + i, m, y);
    }
}

static void to_f16(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i),
                                    _MM_FROUND_TO_NEAREST_INT |
                                        _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

static void round_f16(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
                                    _MM_FROUND_TO_NEAREST_INT |
                                        _MM_FROUND_NO_EXC);
        _mm512_mask_storeu_ps(x + i, m, _mm512_cvtph_ps(h));
    }
}

static void scale_rows(float *x, int64_t n, float s, int f16)
{
    const __m512 vs = _mm512_set1_ps(s);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs);
        if (f16)
            v = _mm512_cvtph_ps(_mm512_cvtps_ph(
                v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_mask_storeu_ps(x + i, m, v);
    }
}

/* Gathered context (cpu_impl.h). QK in the "dot" arithmetic, sixteen
 * positions at a time: each position's four accumulators are folded
 * (a0 + a2) + (a1 + a3) at once, and the sixteen folded vectors reduced
 * together by hsum16x16. A short last group repeats its first row in the
 * unused lanes, which are not stored. */
static inline __attribute__((always_inline)) __m512 ld_row(const void *row,
                                                           int d, int f16)
{
    return f16 ? ld_f16((const uint16_t *)row + d)
               : ld_f32((const float *)row + d);
}

static inline __attribute__((always_inline)) void
qk_dot_rows_t(const float *q, const void *const *rows, int n, int head_dim,
              float scale, float *scores, const int f16)
{
    const __m512 vs = _mm512_set1_ps(scale);
    for (int j = 0; j < n; j += 16) {
        const int m = n - j < 16 ? n - j : 16;
        __m512 acc[16];
        UNROLL
        for (int p = 0; p < 16; p++) {
            const void *kp = rows[j + (p < m ? p : 0)];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < head_dim; d += 64) {
                a0 = _mm512_fmadd_ps(ld_row(kp, d, f16),
                                     _mm512_loadu_ps(q + d), a0);
                a1 = _mm512_fmadd_ps(ld_row(kp, d + 16, f16),
                                     _mm512_loadu_ps(q + d + 16), a1);
                a2 = _mm512_fmadd_ps(ld_row(kp, d + 32, f16),
                                     _mm512_loadu_ps(q + d + 32), a2);
                a3 = _mm512_fmadd_ps(ld_row(kp, d + 48, f16),
                                     _mm512_loadu_ps(q + d + 48), a3);
            }
            acc[p] = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
        }
        _mm512_mask_storeu_ps(scores + j, tail_mask(m),
                              _mm512_mul_ps(hsum16x16(acc), vs));
    }
}

static void qk_dot_rows(const float *q, const void *const *rows, int f16,
                        int n, int head_dim, float scale, float *scores)
{
    if (f16)
        qk_dot_rows_t(q, rows, n, head_dim, scale, scores, 1);
    else
        qk_dot_rows_t(q, rows, n, head_dim, scale, scores, 0);
}

/* PV a lane row at a time: the positions of lane row l (j = l mod n_lanes,
 * in order) accumulate in registers, 64 output elements per pass; for 64
 * lanes the four rows l, l + 16, l + 32, l + 48 are folded as they finish. */
static inline __attribute__((always_inline)) void
pv_rows_t(const void *const *rows, const float *p, int n, int n_lanes,
          int head_dim, float *lanes16, const int f16)
{
    const int parts = n_lanes / 16;
    for (int d0 = 0; d0 < head_dim; d0 += 64) {
        const int nv = (head_dim - d0 < 64 ? head_dim - d0 : 64) / 16;
        for (int l = 0; l < 16; l++) {
            __m512 r[4][4];
            for (int part = 0; part < parts; part++) {
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int j = l + 16 * part; j < n; j += n_lanes) {
                    const __m512 pj = _mm512_set1_ps(p[j]);
                    const void *vr = rows[j];
                    a0 = _mm512_fmadd_ps(ld_row(vr, d0, f16), pj, a0);
                    if (nv > 1)
                        a1 = _mm512_fmadd_ps(ld_row(vr, d0 + 16, f16), pj, a1);
                    if (nv > 2)
                        a2 = _mm512_fmadd_ps(ld_row(vr, d0 + 32, f16), pj, a2);
                    if (nv > 3)
                        a3 = _mm512_fmadd_ps(ld_row(vr, d0 + 48, f16), pj, a3);
                }
                r[part][0] = a0;
                r[part][1] = a1;
                r[part][2] = a2;
                r[part][3] = a3;
            }
            float *out = lanes16 + (size_t)l * (size_t)head_dim + d0;
            for (int i = 0; i < nv; i++) {
                __m512 o = r[0][i];
                if (parts == 4)
                    o = _mm512_add_ps(_mm512_add_ps(r[0][i], r[2][i]),
                                      _mm512_add_ps(r[1][i], r[3][i]));
                _mm512_storeu_ps(out + 16 * i, o);
            }
        }
    }
}

static void pv_rows(const void *const *rows, int f16, const float *p, int n,
                    int n_lanes, int head_dim, float *lanes16)
{
    if (f16)
        pv_rows_t(rows, p, n, n_lanes, head_dim, lanes16, 1);
    else
        pv_rows_t(rows, p, n, n_lanes, head_dim, lanes16, 0);
}

/* In place: r[p] lane d becomes r[d] lane p. */
static inline __attribute__((always_inline)) void tr16x16(__m512 r[16])
{
    __m512 t[16];
    UNROLL
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    UNROLL
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    UNROLL
    for (int i = 0; i < 2; i++)
        UNROLL
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
        }
    UNROLL
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88);
        r[8 + k] = _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd);
    }
}

/* The lane sums of qk for QN queries, sixteen positions in the lanes:
 * kt[d] holds element d of the sixteen K rows, so lane l of qk's
 * accumulator (the fma chain over d = l, l + 16, ...) is u(l) here, and
 * hsum16x16's tree ((l + l+8) + (l+4 + l+12)) + ... is the same tree of
 * vertical adds: every score keeps qk's bits, without a shuffle. */
/* The most queries qk_t_tree takes at once: its five levels of partial
 * sums stay in registers. */
#define QK_T_QN 6

static inline __attribute__((always_inline)) void
qk_t_lanes(__m512 *u, const float *const *q, const float *kt, int l,
           const int qn, const int nc)
{
    UNROLL
    for (int i = 0; i < qn; i++)
        u[i] = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        const __m512 k = _mm512_load_ps(kt + (size_t)(16 * c + l) * 16);
        UNROLL
        for (int i = 0; i < qn; i++)
            u[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][16 * c + l]), k, u[i]);
    }
}

static inline __attribute__((always_inline)) void
qk_t_pair(__m512 *o, const float *const *q, const float *kt, int l,
          const int qn, const int nc)
{
    __m512 b[QK_T_QN];
    qk_t_lanes(o, q, kt, l, qn, nc);
    qk_t_lanes(b, q, kt, l + 8, qn, nc);
    UNROLL
    for (int i = 0; i < qn; i++)
        o[i] = _mm512_add_ps(o[i], b[i]);
}

static inline __attribute__((always_inline)) void
qk_t_quad(__m512 *o, const float *const *q, const float *kt, int l,
          const int qn, const int nc)
{
    __m512 b[QK_T_QN];
    qk_t_pair(o, q, kt, l, qn, nc);
    qk_t_pair(b, q, kt, l + 4, qn, nc);
    UNROLL
    for (int i = 0; i < qn; i++)
        o[i] = _mm512_add_ps(o[i], b[i]);
}

static inline __attribute__((always_inline)) void
qk_t_oct(__m512 *o, const float *const *q, const float *kt, int l,
         const int qn, const int nc)
{
    __m512 b[QK_T_QN];
    qk_t_quad(o, q, kt, l, qn, nc);
    qk_t_quad(b, q, kt, l + 2, qn, nc);
    UNROLL
    for (int i = 0; i < qn; i++)
        o[i] = _mm512_add_ps(o[i], b[i]);
}

static inline __attribute__((always_inline)) void
qk_t_tree(__m512 *o, const float *const *q, const float *kt, const int qn,
          const int nc)
{
    __m512 b[QK_T_QN];
    qk_t_oct(o, q, kt, 0, qn, nc);
    qk_t_oct(b, q, kt, 1, qn, nc);
    UNROLL
    for (int i = 0; i < qn; i++)
        o[i] = _mm512_add_ps(o[i], b[i]);
}

/* Several queries against one gathered context (cpu_impl.h: qk_tile,
 * pv_tile). Each group of sixteen K rows is widened and transposed once
 * into kt (the caller's, kept for its next call on the same rows, or a
 * block on the stack) and then serves every query, up to QK_T_QN at a time, as
 * qk_f16 / qk would (qk_t_lanes); positions past a query's n are
 * computed from repeated rows and not stored. Positions below lo[i] are
 * set to -INFINITY and max[i] is the largest score at or above it (vmaxps
 * keeps the running maximum where a score is NaN, as attend's comparison
 * does; the sign of a zero maximum does not change exp(s - max)). */
static inline __attribute__((always_inline)) void
qk_tile_t(const float *const *q, int nq, const void *const *rows,
          const int32_t *n, const int32_t *lo, int head_dim, float scale,
          float *scores, size_t cs, float *max, float *ktc, int32_t *kt_done,
          const int f16, const int hdc)
{
    if (hdc) /* a constant head size: kt's rows at constant offsets */
        head_dim = hdc;
    const int nc = head_dim / 16;
    const __m512 vs = _mm512_set1_ps(scale);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx[CINFER_CPU_ATTN_TILE];
    int32_t nmax = 0;
    for (int i = 0; i < nq; i++) {
        nmax = n[i] > nmax ? n[i] : nmax;
        mx[i] = ninf;
    }
    float kt1[256 * 16] __attribute__((aligned(64)));
    const int32_t done = ktc ? *kt_done : 0;
    for (int32_t j = 0; j < nmax; j += 16) {
        const int m = nmax - j < 16 ? nmax - j : 16;
        float *kt = ktc ? ktc + (size_t)j * (size_t)head_dim : kt1;
        for (int c = 0; j >= done && c < nc; c++) {
            __m512 r[16];
            UNROLL
            for (int p = 0; p < 16; p++) {
                const void *row = rows[j + (p < m ? p : 0)];
                r[p] = f16 ? ld_f16((const uint16_t *)row + 16 * c)
                           : _mm512_loadu_ps((const float *)row + 16 * c);
            }
            tr16x16(r);
            UNROLL
            for (int d = 0; d < 16; d++)
                _mm512_store_ps(kt + (size_t)(16 * c + d) * 16, r[d]);
        }
        int i0 = 0;
        while (i0 < nq && n[i0] <= j)
            i0++;
        for (int i = i0; i < nq; i += QK_T_QN) {
            __m512 sc[QK_T_QN];
            const int qn = nq - i < QK_T_QN ? nq - i : QK_T_QN;
            if (qn == 6)
                qk_t_tree(sc, q + i, kt, 6, nc);
            else if (qn == 5)
                qk_t_tree(sc, q + i, kt, 5, nc);
            else if (qn == 4)
                qk_t_tree(sc, q + i, kt, 4, nc);
            else if (qn == 3)
                qk_t_tree(sc, q + i, kt, 3, nc);
            else if (qn == 2)
                qk_t_tree(sc, q + i, kt, 2, nc);
            else
                qk_t_tree(sc, q + i, kt, 1, nc);
            for (int t = 0; t < qn; t++) {
                const int k = i + t;
                if (n[k] <= j)
                    continue;
                const int mi = n[k] - j < 16 ? n[k] - j : 16;
                const __mmask16 keep = tail_mask(mi);
                __m512 v = _mm512_mul_ps(sc[t], vs);
                if (lo[k] > j) { /* masked by the window */
                    const int h = lo[k] - j < 16 ? lo[k] - j : 16;
                    v = _mm512_mask_mov_ps(v, tail_mask(h), ninf);
                }
                mx[k] = _mm512_mask_max_ps(mx[k], keep, v, mx[k]);
                _mm512_mask_storeu_ps(scores + (size_t)k * cs + j, keep, v);
            }
        }
    }
    for (int i = 0; i < nq; i++)
        max[i] = _mm512_reduce_max_ps(mx[i]);
    if (ktc && nmax / 16 * 16 > done)
        *kt_done = nmax / 16 * 16;
}

static void qk_tile(const float *const *q, int nq, const void *const *rows,
                    int f16, const int32_t *n, const int32_t *lo, int head_dim,
                    float scale, float *scores, size_t cs, float *max,
                    float *kt, int32_t *kt_done)
{
    if (f16 && head_dim == 64)
        qk_tile_t(q, nq, rows, n, lo, head_dim, scale, scores, cs, max, kt,
                  kt_done, 1, 64);
    else if (f16 && head_dim == 128)
        qk_tile_t(q, nq, rows, n, lo, head_dim, scale, scores, cs, max, kt,
                  kt_done, 1, 128);
    else if (f16)
        qk_tile_t(q, nq, rows, n, lo, head_dim, scale, scores, cs, max, kt,
                  kt_done, 1, 0);
    else
        qk_tile_t(q, nq, rows, n, lo, head_dim, scale, scores, cs, max, kt,
                  kt_done, 0, 0);
}

/* pv_rows_t with 16 lanes for nq <= PV_TILE queries: each V row is loaded
 * once and multiplied into every query's accumulators that still reach
 * it, in the same order (j = l, l + 16, ...); four 16-float accumulators
 * a query stay in registers. Specialised on nq, the element type and
 * whole 64-float chunks; positions every query reaches run unchecked. */
#define PV_TILE 6

/* One V row j into the accumulators of pv_tile_t's queries; `checked`:
 * only those whose n reaches past j (positions every query reaches skip
 * the test). */
static inline __attribute__((always_inline)) void
pv_tile_row(__m512 a[][4], const void *vr, const float *const *p, const int32_t *n,
            int32_t j, const int nq, const int nv, int d0, const int f16,
            const int checked)
{
    __m512 x[4];
    UNROLL
    for (int v = 0; v < 4; v++)
        x[v] = v < nv ? ld_row(vr, d0 + 16 * v, f16) : _mm512_setzero_ps();
    UNROLL
    for (int i = 0; i < nq; i++) {
        if (checked && j >= n[i])
            continue;
        const __m512 pj = _mm512_set1_ps(p[i][j]);
        UNROLL
        for (int v = 0; v < 4; v++)
            if (v < nv)
                a[i][v] = _mm512_fmadd_ps(x[v], pj, a[i][v]);
    }
}

static inline __attribute__((always_inline)) void
pv_tile_t(const void *const *rows, const float *const *p, const int32_t *n,
          const int nq, int head_dim, float *lanes16, const int f16,
          const int whole, int32_t jb, int32_t je)
{
    int32_t nmax = 0, nmin = n[0];
    for (int i = 0; i < nq; i++) {
        nmax = n[i] > nmax ? n[i] : nmax;
        nmin = n[i] < nmin ? n[i] : nmin;
    }
    nmax = nmax < je ? nmax : je;
    nmin = nmin < je ? nmin : je;
    const size_t ls = (size_t)16 * (size_t)head_dim;
    for (int d0 = 0; d0 < head_dim; d0 += 64) {
        const int nv = whole ? 4 : (head_dim - d0 < 64 ? head_dim - d0 : 64) / 16;
        for (int l = 0; l < 16; l++) {
            __m512 a[PV_TILE][4];
            UNROLL
            for (int i = 0; i < nq; i++) {
                const float *in = lanes16 + (size_t)i * ls + (size_t)l * (size_t)head_dim + d0;
                UNROLL
                for (int v = 0; v < 4; v++)
                    a[i][v] = jb == 0 || v >= nv ? _mm512_setzero_ps()
                                                 : _mm512_loadu_ps(in + 16 * v);
            }
            int32_t j = jb + l;
            for (; j < nmin; j += 16)
                pv_tile_row(a, rows[j], p, n, j, nq, nv, d0, f16, 0);
            for (; j < nmax; j += 16)
                pv_tile_row(a, rows[j], p, n, j, nq, nv, d0, f16, 1);
            UNROLL
            for (int i = 0; i < nq; i++) {
                float *out = lanes16 + (size_t)i * ls + (size_t)l * (size_t)head_dim + d0;
                UNROLL
                for (int v = 0; v < 4; v++)
                    if (v < nv)
                        _mm512_storeu_ps(out + 16 * v, a[i][v]);
            }
        }
    }
}

#define PV_TILE_CASE(NQ)                                                        \
    case NQ:                                                                    \
        if (f16 && whole)                                                       \
            pv_tile_t(rows, p, n, NQ, head_dim, lanes16, 1, 1, jb, je);                 \
        else if (f16)                                                           \
            pv_tile_t(rows, p, n, NQ, head_dim, lanes16, 1, 0, jb, je);                 \
        else if (whole)                                                         \
            pv_tile_t(rows, p, n, NQ, head_dim, lanes16, 0, 1, jb, je);                 \
        else                                                                    \
            pv_tile_t(rows, p, n, NQ, head_dim, lanes16, 0, 0, jb, je);                 \
        return;

static void pv_tile_n(const void *const *rows, int f16, const float *const *p,
                      const int32_t *n, int nq, int head_dim, float *lanes16,
                      int32_t jb, int32_t je)
{
    const int whole = head_dim % 64 == 0;
    switch (nq) {
        PV_TILE_CASE(1)
        PV_TILE_CASE(2)
        PV_TILE_CASE(3)
        PV_TILE_CASE(4)
        PV_TILE_CASE(5)
        default: PV_TILE_CASE(6)
    }
}
#undef PV_TILE_CASE

/* Positions in blocks of PV_BLOCK (a multiple of 16), each block's V rows
 * serving every chunk of PV_TILE queries while they are in cache; the
 * accumulators go to lanes16 between blocks, and each lane still takes
 * its positions in order. */
#define PV_BLOCK 256

static void pv_tile(const void *const *rows, int f16, const float *const *p,
                    const int32_t *n, int nq, int head_dim, float *lanes16)
{
    const size_t ls = (size_t)16 * (size_t)head_dim;
    int32_t nmax = 0;
    for (int i = 0; i < nq; i++)
        nmax = n[i] > nmax ? n[i] : nmax;
    for (int32_t jb = 0; jb < nmax; jb += PV_BLOCK)
        for (int i = 0; i < nq; i += PV_TILE) {
            const int c = nq - i < PV_TILE ? nq - i : PV_TILE;
            pv_tile_n(rows, f16, p + i, n + i, c, head_dim, lanes16 + i * ls,
                      jb, jb + PV_BLOCK);
        }
}

const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx512 = {
    qk,          qk_f16, qk_dot_f32, qk_dot_f16, softmax_exp,
    pv_f32,      pv_f16, lanes_sum,  silu_mul,   to_f16,
    round_f16,   scale_rows, qk_dot_rows, pv_rows, qk_tile, pv_tile,
};
#endif
