/*
 * matmul_avx512.c - CPU matrix-product kernels for AVX-512 (F, BW, VL, DQ,
 * VNNI, BF16), the fast path on Zen 4 and recent Xeons.
 *
 * Every kernel computes a tile of R activation rows x C weight columns and
 * decodes each weight block once per tile, so the same code serves decode
 * (R = 1, weights streamed from memory at bandwidth) and prefill (R = 4,
 * compute bound). Each output element still follows exactly the reduction
 * order of matmul_impl.h, lane by lane: tiles only decide which elements
 * share a register. Tails reuse the full kernel with clamped row/column
 * pointers and store only the valid elements.
 *
 * Int8 block types use vpdpbusd (u8 x s8 -> s32 per 4 bytes), which yields
 * exactly GGML's eight per-block partial sums:
 *   - Q4_1 / Q4_0: four columns share a register: the low nibbles of the
 *     four columns' blocks (elements 0..15) in one zmm, the high nibbles
 *     (16..31) in another; the activation halves are broadcast to all four
 *     128-bit lanes. Lanes 0..3 of a column are GGML's l0..l3 (low) and
 *     l4..l7 (high). Q4_0's "- 8" is folded into the accumulator start as
 *     -8 * sum(a) per group.
 *   - Q8_0: two columns share a register (32 bytes each); weights are
 *     flipped to unsigned (w ^ 0x80 = w + 128) and the accumulator starts at
 *     -128 * sum(a) per group.
 * Each block's partial sums are converted to float and fused-multiply-added
 * with d_w * d_a, the way GGML's AVX2 vec_dot does.
 *
 * 24 or more rows of the int8-block types take decoded panels instead
 * (see "batched int8 products" below): 16 weight rows across the lanes of
 * a register, 3 token rows per tile, the same per-element arithmetic.
 *
 * F32 / F16 use 16-lane FMA chunks (F16 widened with vcvtph2ps); BF16 uses
 * vdpbf16ps directly.
 */
#include "matmul_impl.h"

#ifdef CINFER_MATMUL_HAVE_AVX512

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* ---------------------------------------------------------------------- */
/* small helpers                                                          */
/* ---------------------------------------------------------------------- */

static ALWAYS_INLINE uint16_t ld16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static ALWAYS_INLINE uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 16-lane reduction tree of matmul_impl.h. */
static ALWAYS_INLINE float hsum16(__m512 v)
{
    __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                              _mm512_extractf32x8_ps(v, 1));
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8),
                           _mm256_extractf128_ps(h8, 1));
    __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    __m128 h1 = _mm_add_ss(h2, _mm_movehdup_ps(h2));
    return _mm_cvtss_f32(h1);
}

/* Given t with t0..t3 = l0+l4 .. l3+l7 in each 128-bit lane, lane 4k of
 * the result holds (t0 + t2) + (t1 + t3) of 128-bit lane k. */
static ALWAYS_INLINE __m512 hsum4_lanes(__m512 t)
{
    __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
}

/* Rows per column block, so one block of weight rows stays in L2 while
 * every row tile passes over it. */
static int64_t col_block(size_t w_row_bytes)
{
    /* a multiple of every tile width (16, 8, 6, 4, 3) */
    int64_t cols = (int64_t)((192u * 1024u) / (w_row_bytes ? w_row_bytes : 1));
    cols = cols / 48 * 48;
    return cols < 48 ? 48 : cols;
}

/* ---------------------------------------------------------------------- */
/* prepare                                                                */
/* ---------------------------------------------------------------------- */

/* One Q8 block as the reference quantizer makes it; returns 0 (writing
 * nothing) when the block holds a non-finite value, for the caller to fall
 * back on the reference. */
static ALWAYS_INLINE int quant_q8_block(const float *x, int8_t *qs, float *d_out,
                                        int *sum_out)
{
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
    __m512 inf = _mm512_set1_ps(INFINITY);
    __mmask16 bad = _mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) |
                    _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ);
    if (bad)
        return 0;
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    __m512 vid = _mm512_set1_ps(id);
    __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(
        _mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(
        _mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(i1));
    *d_out = d;
    *sum_out = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    return 1;
}

static void prepare_row(cinfer_dtype at, const float *x, int64_t n_in,
                        uint8_t *dst)
{
    switch (at) {
    case CINFER_DTYPE_Q8_0: {
        cinfer_block_q8_0 *b = (cinfer_block_q8_0 *)dst;
        for (int64_t i = 0; i < n_in / CINFER_QK; i++) {
            float d;
            int sum;
            if (quant_q8_block(x + i * CINFER_QK, b[i].qs, &d, &sum))
                b[i].d = cinfer_fp32_to_fp16(d);
            else
                cinfer_quantize_row(at, x + i * CINFER_QK, &b[i], CINFER_QK);
        }
        return;
    }
    case CINFER_DTYPE_Q8_1: {
        cinfer_block_q8_1 *b = (cinfer_block_q8_1 *)dst;
        for (int64_t i = 0; i < n_in / CINFER_QK; i++) {
            float d;
            int sum;
            if (quant_q8_block(x + i * CINFER_QK, b[i].qs, &d, &sum)) {
                b[i].d = cinfer_fp32_to_fp16(d);
                b[i].s = cinfer_fp32_to_fp16(d * (float)sum);
            } else {
                cinfer_quantize_row(at, x + i * CINFER_QK, &b[i], CINFER_QK);
            }
        }
        return;
    }
    case CINFER_DTYPE_F16: {
        uint16_t *o = (uint16_t *)dst;
        int64_t i = 0;
        for (; i + 16 <= n_in; i += 16) {
            __m512 v = _mm512_loadu_ps(x + i);
            if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
                /* NaN: the reference's canonical quiet NaN */
                cinfer_quantize_row(at, x + i, o + i, 16);
                continue;
            }
            _mm256_storeu_si256(
                (__m256i *)(o + i),
                _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        if (i < n_in)
            cinfer_quantize_row(at, x + i, o + i, n_in - i);
        return;
    }
    case CINFER_DTYPE_BF16: {
        uint16_t *o = (uint16_t *)dst;
        const __m512i lsb1 = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
        const __m512i absm = _mm512_set1_epi32(0x7fffffff);
        const __m512i expm = _mm512_set1_epi32(0x7f800000);
        const __m512i qbit = _mm512_set1_epi32(0x40);
        int64_t i = 0;
        for (; i + 16 <= n_in; i += 16) {
            __m512i u = _mm512_loadu_si512(x + i);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb1);
            __m512i r = _mm512_srli_epi32(
                _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), expm);
            r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), qbit);
            _mm256_storeu_si256((__m256i *)(o + i), _mm512_cvtepi32_epi16(r));
        }
        if (i < n_in)
            cinfer_quantize_row(at, x + i, o + i, n_in - i);
        return;
    }
    default:
        cinfer_quantize_row(at, x, dst, n_in);
        return;
    }
}

void cinfer_cpu_matmul_prepare_avx512(cinfer_dtype act_type, const float *x,
                                      int64_t n_in, int64_t r0, int64_t r1,
                                      void *act)
{
    size_t rb = cinfer_dtype_row_bytes(act_type, n_in);
    for (int64_t r = r0; r < r1; r++)
        prepare_row(act_type, x + r * n_in, n_in, (uint8_t *)act + r * rb);
}

/* ---------------------------------------------------------------------- */
/* tiles                                                                  */
/* ---------------------------------------------------------------------- */

/* What a tile kernel needs: R activation row pointers, C weight row
 * pointers (clamped for tails), R output row pointers (already offset to
 * the tile's first column) and how many of the C columns to store. */
typedef struct {
    const uint8_t *a[4];
    const uint8_t *w[16];
    float *o[4];
    int nc;
    int64_t nb; /* blocks (quantized) or elements (float) per row */
    /* Software prefetch of the next tile's weights, spread over this
     * tile's iterations: a tile reads its columns' rows side by side, a
     * pattern of many short streams the hardware prefetchers follow
     * poorly. pf_lines cache lines from pf + it * pf_step per iteration. */
    const uint8_t *pf;
    size_t pf_step;
    int pf_lines;
    /* Into every cache level (T0), for decode too: with the weights in
     * huge pages (engine/gguf.h) that streamed Q4_1 and Q8_0 decode about
     * a tenth faster at 1 thread than the non-temporal hint, which won
     * while the weights were a 4 KiB-page file mapping. */
} tile;

static ALWAYS_INLINE void prefetch_next(const tile *t, int64_t it)
{
    const uint8_t *p = t->pf + (size_t)it * t->pf_step;
    for (int i = 0; i < t->pf_lines; i++)
        _mm_prefetch((const char *)(p + 64 * i), _MM_HINT_T0);
}

/* Stores the first t->nc of `k` results of row r at column offset `col`. */
static ALWAYS_INLINE void store_cols(const tile *t, int r, int col, __m128 v, int k)
{
    int left = t->nc - col;
    if (left <= 0)
        return;
    if (left > k)
        left = k;
    _mm_mask_storeu_ps(t->o[r] + col, (__mmask8)((1u << left) - 1u), v);
}

/* Q4_0 / Q4_1 weights: R rows x 4G columns. */
/* packed: the layout of matmul.h, t->w[0] and t->w[1] the tile's first
 * column pair's quants and scales in its group of 16; else t->w[] the
 * columns' Q4 rows. */
static ALWAYS_INLINE void tile_q4(const tile *t, const int R, const int G,
                                  const int q41, const int packed)
{
    const size_t wbs = q41 ? sizeof(cinfer_block_q4_1) : sizeof(cinfer_block_q4_0);
    const size_t abs_ = q41 ? sizeof(cinfer_block_q8_1) : sizeof(cinfer_block_q8_0);
    const int wqo = q41 ? 4 : 2; /* offset of qs in the weight block */
    const int aqo = q41 ? 4 : 2; /* offset of qs in the activation block */
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i idx_d4 = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2,
                                            0, 0, 0, 0);
    const __m512i idx_d2 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1,
                                            0, 0, 0, 0);

    /* Q4_1's summs accumulate in the odd lanes of a [d0 m0 d1 m1 ...]
     * vector (the even lanes collect d * s and are ignored), which saves a
     * permute per block. */
    __m512 acc_lo[4][4], acc_hi[4][4];
    __m256 summs[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            acc_lo[r][g] = _mm512_setzero_ps();
            acc_hi[r][g] = _mm512_setzero_ps();
            summs[r][g] = _mm256_setzero_ps();
        }

    for (int64_t b = 0; b < t->nb; b++) {
        prefetch_next(t, b);
        __m512i wlo[4], whi[4];
        __m512 dvec[4];
        __m256 dmvec[4];
        const size_t wo = (size_t)b * wbs;
#pragma GCC unroll 4
        for (int g = 0; g < G && packed; g++) {
            const uint8_t *qp = t->w[0] + (size_t)b * 256 + 64 * g;
            const uint8_t *sp = t->w[1] + (size_t)b * (q41 ? 64 : 32) + (q41 ? 16 : 8) * g;
            __m512i raw = _mm512_loadu_si512((const void *)qp);
            wlo[g] = _mm512_and_si512(raw, m0f);
            whi[g] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f);
            if (q41) {
                __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sp));
                dvec[g] = _mm512_permutexvar_ps(idx_d4, _mm512_castps256_ps512(f));
                dmvec[g] = f;
            } else {
                __m128 f = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)sp));
                dvec[g] = _mm512_permutexvar_ps(idx_d2, _mm512_castps128_ps512(f));
                dmvec[g] = _mm256_castps128_ps256(f);
            }
        }
#pragma GCC unroll 4
        for (int g = 0; g < G && !packed; g++) {
            const uint8_t *p0 = t->w[4 * g] + wo, *p1 = t->w[4 * g + 1] + wo;
            const uint8_t *p2 = t->w[4 * g + 2] + wo, *p3 = t->w[4 * g + 3] + wo;
            __m512i raw = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p0 + wqo)));
            raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(p1 + wqo)), 1);
            raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(p2 + wqo)), 2);
            raw = _mm512_inserti32x4(raw, _mm_loadu_si128((const __m128i *)(p3 + wqo)), 3);
            wlo[g] = _mm512_and_si512(raw, m0f);
            whi[g] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m0f);
            /* The four columns' scales, combined in general registers. */
            if (q41) {
                uint64_t lo = ld32(p0) | (uint64_t)ld32(p1) << 32;
                uint64_t hi = ld32(p2) | (uint64_t)ld32(p3) << 32;
                __m256 f = _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
                dvec[g] = _mm512_permutexvar_ps(idx_d4, _mm512_castps256_ps512(f));
                dmvec[g] = f; /* d0 m0 d1 m1 d2 m2 d3 m3 */
            } else {
                uint64_t dd = ld16(p0) | (uint64_t)ld16(p1) << 16 |
                              (uint64_t)ld16(p2) << 32 | (uint64_t)ld16(p3) << 48;
                __m128 f = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dd));
                dvec[g] = _mm512_permutexvar_ps(idx_d2, _mm512_castps128_ps512(f));
                dmvec[g] = _mm256_castps128_ps256(f);
            }
        }
        const size_t ao = (size_t)b * abs_;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *ab = t->a[r] + ao;
            __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ab + aqo)));
            __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ab + aqo + 16)));
            __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(q41 ? ld32(ab) : ld16(ab))));
            __m512 da = _mm512_broadcastss_ps(ds);
            __m512i slo = zero, shi = zero;
            if (!q41) {
                slo = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, eight, alo));
                shi = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, eight, ahi));
            }
            __m256 sa = _mm256_broadcastss_ps(_mm_movehdup_ps(ds));
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) {
                __m512i plo = _mm512_dpbusd_epi32(slo, wlo[g], alo);
                __m512i phi = _mm512_dpbusd_epi32(shi, whi[g], ahi);
                __m512 dd = _mm512_mul_ps(dvec[g], da);
                acc_lo[r][g] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(plo), acc_lo[r][g]);
                acc_hi[r][g] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(phi), acc_hi[r][g]);
                if (q41)
                    summs[r][g] = _mm256_fmadd_ps(dmvec[g], sa, summs[r][g]);
            }
        }
    }

#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m512 v = hsum4_lanes(_mm512_add_ps(acc_lo[r][g], acc_hi[r][g]));
            __m128 s = _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, v));
            if (q41) {
                __m256 m = _mm256_permutevar8x32_ps(summs[r][g],
                                                    _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7));
                s = _mm_add_ps(s, _mm256_castps256_ps128(m));
            }
            store_cols(t, r, 4 * g, s, 4);
        }
}

/* Q8_0 helpers shared by tile_q8 and tile_q8p. */

/* dvec[g]: column 2g's scale in lanes 0..7, column 2g + 1's in 8..15,
 * from the block's scales df[0..2G). */
static ALWAYS_INLINE void q8_scales(__m256 df, const int G, __m512 *dvec)
{
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) {
        const __m512i idx = _mm512_set_epi32(
            2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1,
            2 * g + 1, 2 * g + 1, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g, 2 * g,
            2 * g, 2 * g);
        dvec[g] = _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(df));
    }
}

/* Block b of every row against the column pairs' unsigned quants wv[g]
 * (w ^ 0x80) and scales dvec[g]. */
static ALWAYS_INLINE void q8_rows(const tile *t, const int R, const int G,
                                  int64_t b, const __m512i *wv,
                                  const __m512 *dvec, __m512 acc[4][4])
{
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const __m512i zero = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *ab = t->a[r] + (size_t)b * sizeof(cinfer_block_q8_0);
        __m512i a = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(ab + 2)));
        __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, x80, a));
        __m512 da = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(ld16(ab))));
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            __m512i p = _mm512_dpbusd_epi32(corr, wv[g], a);
            __m512 dd = _mm512_mul_ps(dvec[g], da);
            acc[r][g] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(p), acc[r][g]);
        }
    }
}

static ALWAYS_INLINE void q8_store(const tile *t, const int R, const int G,
                                   __m512 acc[4][4])
{
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            /* l_i + l_{i+4} within each column's 256 bits */
            __m512 v = acc[r][g];
            __m512 t4 = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
            __m512 h = hsum4_lanes(t4);
            __m128 s = _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x0101, h));
            store_cols(t, r, 2 * g, s, 2);
        }
}

/* Q8_0 weights: R rows x 2G columns, a column pair per register. */
static ALWAYS_INLINE void tile_q8(const tile *t, const int R, const int G)
{
    const size_t bs = sizeof(cinfer_block_q8_0);
    const __m512i x80 = _mm512_set1_epi8((char)0x80);

    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++)
            acc[r][g] = _mm512_setzero_ps();

    /* Two blocks an iteration: decode at 1 thread about 5% faster (more
     * independent loads in flight); prompts unchanged. */
#pragma GCC unroll 2
    for (int64_t b = 0; b < t->nb; b++) {
        prefetch_next(t, b);
        const size_t off = (size_t)b * bs;
        __m512i wv[4];
        __m512 dvec[4];
        uint16_t dh[8];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) {
            const uint8_t *p0 = t->w[2 * g] + off, *p1 = t->w[2 * g + 1] + off;
            __m512i raw = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2)));
            raw = _mm512_inserti64x4(raw, _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1);
            wv[g] = _mm512_xor_si512(raw, x80);
            dh[2 * g] = ld16(p0);
            dh[2 * g + 1] = ld16(p1);
        }
#pragma GCC unroll 4
        for (int g = 2 * G; g < 8; g++)
            dh[g] = 0;
        q8_scales(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)), G, dvec);
        q8_rows(t, R, G, b, wv, dvec, acc);
    }
    q8_store(t, R, G, acc);
}

/* Q8_0 weights in the packed layout (matmul.h): a group of 8 columns per
 * tile, its quants one stream of 64-byte aligned column pairs, already
 * flipped to unsigned, and its 8 scales one 16-byte load per block. The
 * arithmetic is tile_q8's, lane for lane. t->w[0]: the group's quants;
 * t->w[1]: its scales. */
static ALWAYS_INLINE void tile_q8p(const tile *t, const int R)
{
    const uint8_t *q = t->w[0], *sc = t->w[1];

    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            acc[r][g] = _mm512_setzero_ps();

#pragma GCC unroll 2
    for (int64_t b = 0; b < t->nb; b++) {
        prefetch_next(t, b);
        const uint8_t *qb = q + (size_t)b * 256;
        __m512i wv[4];
        __m512 dvec[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            wv[g] = _mm512_load_si512((const void *)(qb + 64 * g));
        q8_scales(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(sc + (size_t)b * 16))),
                  4, dvec);
        q8_rows(t, R, 4, b, wv, dvec, acc);
    }
    q8_store(t, R, 4, acc);
}

/* F32 / F16 weights (and activations of the same type): R rows x C
 * columns, one 16-lane accumulator per element. */
static ALWAYS_INLINE __m512 load_f(const uint8_t *p, int64_t i, const int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i)));
    return _mm512_loadu_ps((const float *)p + i);
}

static ALWAYS_INLINE __m512 load_f_mask(const uint8_t *p, int64_t i, __mmask16 m,
                                        const int f16)
{
    if (f16)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

static ALWAYS_INLINE void tile_f(const tile *t, const int R, const int C, const int f16)
{
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();

    const int64_t n = t->nb;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch_next(t, i / 16);
        __m512 a[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[r] = load_f(t->a[r], i, f16);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 w = load_f(t->w[c], i, f16);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(w, a[r], acc[r][c]);
        }
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        __m512 a[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[r] = load_f_mask(t->a[r], i, m, f16);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 w = load_f_mask(t->w[c], i, m, f16);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(w, a[r], acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            if (c < t->nc)
                t->o[r][c] = hsum16(acc[r][c]);
}

/* BF16 weights and activations: vdpbf16ps over 32-element chunks. */
static ALWAYS_INLINE void tile_bf16(const tile *t, const int R, const int C)
{
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();

    const int64_t n = t->nb;
    int64_t i = 0;
    for (; i < n; i += 32) {
        prefetch_next(t, i / 32);
        __m512i a[4];
        __mmask32 m = n - i >= 32 ? ~(__mmask32)0 : (__mmask32)((1u << (n - i)) - 1u);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[r] = _mm512_maskz_loadu_epi16(m, (const uint16_t *)t->a[r] + i);
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512i w = _mm512_maskz_loadu_epi16(m, (const uint16_t *)t->w[c] + i);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)w, (__m512bh)a[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            if (c < t->nc)
                t->o[r][c] = hsum16(acc[r][c]);
}

/* ---------------------------------------------------------------------- */
/* batched int8 products: decoded panels, columns across lanes            */
/* ---------------------------------------------------------------------- */

/* Beyond a few rows (prefill, batched decode) the int8 products are bound
 * by vector uops, and the row tiles above spend most of theirs on
 * per-block scale work (permutes, a vmulps per vpdpbusd) and on
 * horizontal sums. So many rows take this path instead.
 *
 * A group of 16 weight rows is decoded once into scratch, block by block,
 * "transposed": register q[l] of block b holds the l-th dword (elements
 * 4l .. 4l + 3, as unsigned bytes: Q4 nibbles, Q8_0 as w + 128) of the 16
 * weight rows, one row per 32-bit lane. Then vpdpbusd of q[l] with the
 * activation's dword l broadcast (a memory operand) is exactly GGML's
 * partial sum l of every one of the 16 (token row, weight row) pairs, and
 * the float accumulator acc[r][l] holds lane l of the 16 pairs of token
 * row r: per vpdpbusd one vcvtdq2ps and one FMA, the scale product
 * d_w * d_a one vmulps per token row and block for all 16 weight rows,
 * and the final sum ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) is
 * seven vertical adds. Q8_0's + 128 and Q4_0's - 8 are folded into the
 * int32 start of each partial sum (-128 or -8 times the activation
 * group's sum, computed once per token row and block); Q4_1's m_w * s_a
 * terms are one FMA per token row and block, summed in block order after
 * the main loop. The per-element arithmetic is therefore the reference's
 * (matmul_impl.h): the same exact int32 sums, the same exact scale
 * product, the same FMA chain per lane and the same final sums.
 *
 * A tile is BP_R token rows (the last of a batch 1 or 2) x 16 weight
 * rows (24 accumulators); a panel of groups is decoded once and every row
 * tile runs over it. Per
 * vpdpbusd the loop issues that vpdpbusd, one vcvtdq2ps, one FMA and two
 * broadcast loads; on Zen 5 the FMA shares vpdpbusd's two pipes, so no
 * kernel with these bits passes half the vpdpbusd rate (cinfer-kbench's
 * "int8 block mix"). */

enum {
    BP_R = 3,          /* token rows per tile */
    BP_MAX_NB = 256,   /* blocks a row; more (n_in > 8192) stay on the tiles */
    BP_PANEL = 256,    /* decoded blocks of a panel (160 KiB) */
    BP_MIN_ROWS = 24,  /* fewer rows stay on the tiles above (at 16 rows and
                        * 2 threads the panels ran 0.66-0.93x of them) */
};

enum { W_Q41, W_Q40, W_Q8 };

/* One block of a group of 16 weight rows, decoded. */
typedef struct {
    uint8_t q[8][64]; /* q[l]: dword l of each row, row k in lane k */
    float dw[16];     /* the rows' scales */
    float mw[16];     /* the rows' minimums (Q4_1) */
} bp_wblk;

/* What a row tile's blocks need besides the quants. */
typedef struct {
    int32_t corr[BP_MAX_NB][BP_R][8]; /* the int32 start of partial sum l */
    float da[BP_MAX_NB][BP_R];        /* the activation's scale */
    float sa[BP_MAX_NB][BP_R];        /* Q8_1's s */
} bp_rows;

typedef struct {
    bp_wblk w[BP_PANEL];
    bp_rows rows;
} bp_scratch;

/* Q4: four registers of four weight rows' 16 quant bytes (rows 4k ..
 * 4k + 3 in z[k]) into q[0..7]. */
static ALWAYS_INLINE void bp_split_q4(const __m512i z[4], bp_wblk *dst)
{
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    /* rows 0..7 (or 8..15) of dwords d, d + 1: element e is row e % 8 */
    const __m512i i01 = _mm512_set_epi32(29, 25, 21, 17, 13, 9, 5, 1,
                                         28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i i23 = _mm512_add_epi32(i01, _mm512_set1_epi32(2));
    __m512i x01 = _mm512_permutex2var_epi32(z[0], i01, z[1]);
    __m512i x23 = _mm512_permutex2var_epi32(z[0], i23, z[1]);
    __m512i y01 = _mm512_permutex2var_epi32(z[2], i01, z[3]);
    __m512i y23 = _mm512_permutex2var_epi32(z[2], i23, z[3]);
    __m512i t[4];
    t[0] = _mm512_shuffle_i64x2(x01, y01, _MM_SHUFFLE(1, 0, 1, 0));
    t[1] = _mm512_shuffle_i64x2(x01, y01, _MM_SHUFFLE(3, 2, 3, 2));
    t[2] = _mm512_shuffle_i64x2(x23, y23, _MM_SHUFFLE(1, 0, 1, 0));
    t[3] = _mm512_shuffle_i64x2(x23, y23, _MM_SHUFFLE(3, 2, 3, 2));
    for (int d = 0; d < 4; d++) {
        _mm512_store_si512((void *)dst->q[d], _mm512_and_si512(t[d], m0f));
        _mm512_store_si512((void *)dst->q[d + 4],
                           _mm512_and_si512(_mm512_srli_epi16(t[d], 4), m0f));
    }
}

/* Q8_0: eight registers of two weight rows' 32 unsigned quant bytes (rows
 * 2k, 2k + 1 in v[k]) into q[0..7]. */
static ALWAYS_INLINE void bp_split_q8(const __m512i v[8], bp_wblk *dst)
{
    /* rows 4j .. 4j + 3 of dwords 4h .. 4h + 3: 128-bit lane dd holds
     * dword 4h + dd of the four rows */
    const __m512i i0 = _mm512_set_epi32(27, 19, 11, 3, 26, 18, 10, 2,
                                        25, 17, 9, 1, 24, 16, 8, 0);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(4));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i ih = h ? i1 : i0;
        __m512i a[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_permutex2var_epi32(v[2 * j], ih, v[2 * j + 1]);
        __m512i b0 = _mm512_shuffle_i64x2(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i b1 = _mm512_shuffle_i64x2(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2));
        __m512i b2 = _mm512_shuffle_i64x2(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i b3 = _mm512_shuffle_i64x2(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2));
        _mm512_store_si512((void *)dst->q[4 * h + 0],
                           _mm512_shuffle_i64x2(b0, b2, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_store_si512((void *)dst->q[4 * h + 1],
                           _mm512_shuffle_i64x2(b0, b2, _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_store_si512((void *)dst->q[4 * h + 2],
                           _mm512_shuffle_i64x2(b1, b3, _MM_SHUFFLE(2, 0, 2, 0)));
        _mm512_store_si512((void *)dst->q[4 * h + 3],
                           _mm512_shuffle_i64x2(b1, b3, _MM_SHUFFLE(3, 1, 3, 1)));
    }
}

/* Q4_1's 16 (d, m) pairs, converted, into dw and mw. */
static ALWAYS_INLINE void bp_dm(__m512 f0, __m512 f1, bp_wblk *dst)
{
    const __m512i ev = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8,
                                        6, 4, 2, 0);
    const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
    _mm512_store_ps(dst->dw, _mm512_permutex2var_ps(f0, ev, f1));
    _mm512_store_ps(dst->mw, _mm512_permutex2var_ps(f0, od, f1));
}

/* Decodes blocks [0, nb) of 16 weight rows given as row pointers (rows
 * of the file's layout). */
static ALWAYS_INLINE void bp_decode_rows(const int wk, const uint8_t *const *w, int64_t nb,
                                         bp_wblk *dst)
{
    const size_t wbs = wk == W_Q41 ? sizeof(cinfer_block_q4_1)
                       : wk == W_Q40 ? sizeof(cinfer_block_q4_0)
                                     : sizeof(cinfer_block_q8_0);
    const int wqo = wk == W_Q41 ? 4 : 2;
    for (int64_t b = 0; b < nb; b++) {
        const size_t off = (size_t)b * wbs;
        uint16_t h[32];
        for (int k = 0; k < 16; k++) {
            h[2 * k] = ld16(w[k] + off);
            h[2 * k + 1] = wk == W_Q41 ? ld16(w[k] + off + 2) : 0;
        }
        if (wk == W_Q41) {
            bp_dm(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)),
                  _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 16))), dst + b);
        } else {
            uint16_t d[16];
            for (int k = 0; k < 16; k++)
                d[k] = h[2 * k];
            _mm512_store_ps(dst[b].dw, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d)));
        }
        if (wk == W_Q8) {
            const __m512i x80 = _mm512_set1_epi8((char)0x80);
            __m512i v[8];
            for (int k = 0; k < 8; k++) {
                __m512i r = _mm512_castsi256_si512(
                    _mm256_loadu_si256((const __m256i *)(w[2 * k] + off + wqo)));
                r = _mm512_inserti64x4(
                    r, _mm256_loadu_si256((const __m256i *)(w[2 * k + 1] + off + wqo)), 1);
                v[k] = _mm512_xor_si512(r, x80);
            }
            bp_split_q8(v, dst + b);
        } else {
            __m512i z[4];
            for (int k = 0; k < 4; k++) {
                const uint8_t *const *p = w + 4 * k;
                __m512i r = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[0] + off + wqo)));
                r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)(p[1] + off + wqo)), 1);
                r = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)(p[2] + off + wqo)), 2);
                z[k] = _mm512_inserti32x4(r, _mm_loadu_si128((const __m128i *)(p[3] + off + wqo)), 3);
            }
            bp_split_q4(z, dst + b);
        }
    }
}

/* The same from the packed layout (matmul.h): q0 / s0 the quants and
 * scales of the group's first row in its packed group (Q4: the group of
 * 16; Q8_0: rows 0..7 from q0 / s0, rows 8..15 from q1 / s1). */
static ALWAYS_INLINE void bp_decode_packed(const int wk, const uint8_t *q0, const uint8_t *s0,
                                           const uint8_t *q1, const uint8_t *s1, int64_t nb,
                                           bp_wblk *dst)
{
    for (int64_t b = 0; b < nb; b++) {
        if (wk == W_Q8) {
            __m256i h = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_load_si128((const __m128i *)(s0 + (size_t)b * 16))),
                _mm_load_si128((const __m128i *)(s1 + (size_t)b * 16)), 1);
            _mm512_store_ps(dst[b].dw, _mm512_cvtph_ps(h));
            __m512i v[8];
            for (int k = 0; k < 4; k++) {
                v[k] = _mm512_load_si512((const void *)(q0 + (size_t)b * 256 + 64 * k));
                v[4 + k] = _mm512_load_si512((const void *)(q1 + (size_t)b * 256 + 64 * k));
            }
            bp_split_q8(v, dst + b);
        } else {
            if (wk == W_Q41) {
                const uint8_t *sp = s0 + (size_t)b * 64;
                bp_dm(_mm512_cvtph_ps(_mm256_load_si256((const __m256i *)sp)),
                      _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(sp + 32))), dst + b);
            } else {
                _mm512_store_ps(dst[b].dw, _mm512_cvtph_ps(_mm256_load_si256(
                                               (const __m256i *)(s0 + (size_t)b * 32))));
            }
            __m512i z[4];
            for (int k = 0; k < 4; k++)
                z[k] = _mm512_load_si512((const void *)(q0 + (size_t)b * 256 + 64 * k));
            bp_split_q4(z, dst + b);
        }
    }
}

/* The scales and partial-sum starts of token rows a[0..BP_R). */
static ALWAYS_INLINE void bp_prep_rows(const int wk, const uint8_t *const *a, int64_t nb,
                                       bp_rows *dst)
{
    const size_t abs_ = wk == W_Q41 ? sizeof(cinfer_block_q8_1) : sizeof(cinfer_block_q8_0);
    const __m256i k = _mm256_set1_epi8(wk == W_Q8 ? (char)0x80 : 8);
    const __m256i zero = _mm256_setzero_si256();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < BP_R; r++) {
            const uint8_t *p = a[r] + (size_t)b * abs_;
            dst->da[b][r] = _cvtsh_ss(ld16(p));
            dst->sa[b][r] = wk == W_Q41 ? _cvtsh_ss(ld16(p + 2)) : 0.0f;
            if (wk != W_Q41) {
                /* -128 or -8 times each group's sum of activations */
                __m256i s = _mm256_dpbusd_epi32(
                    zero, k, _mm256_loadu_si256((const __m256i *)(p + 2)));
                _mm256_storeu_si256((__m256i *)dst->corr[b][r], _mm256_sub_epi32(zero, s));
            }
        }
    }
}

/* One tile: token rows a[0..R) (R <= BP_R) x the group decoded in w;
 * stores their columns selected by cm through o[r]. */
static ALWAYS_INLINE void bp_tile(const int wk, const int R, const uint8_t *const *a,
                                  const bp_wblk *w, const bp_rows *rs, int64_t nb,
                                  float *const *o, __mmask16 cm)
{
    const size_t abs_ = wk == W_Q41 ? sizeof(cinfer_block_q8_1) : sizeof(cinfer_block_q8_0);
    const int aqo = wk == W_Q41 ? 4 : 2;
    __m512 acc[BP_R][8];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++)
            acc[r][l] = _mm512_setzero_ps();

    for (int64_t b = 0; b < nb; b++) {
        const __m512 dw = _mm512_load_ps(w[b].dw);
        __m512 dd[BP_R];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) /* exact */
            dd[r] = _mm512_mul_ps(dw, _mm512_set1_ps(rs->da[b][r]));
        const size_t ao = (size_t)b * abs_ + (size_t)aqo;
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            const __m512i q = _mm512_load_si512((const void *)w[b].q[l]);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) {
                int32_t av;
                memcpy(&av, a[r] + ao + 4 * l, 4);
                __m512i p = wk == W_Q41 ? _mm512_setzero_si512()
                                        : _mm512_set1_epi32(rs->corr[b][r][l]);
                p = _mm512_dpbusd_epi32(p, q, _mm512_set1_epi32(av));
                acc[r][l] = _mm512_fmadd_ps(dd[r], _mm512_cvtepi32_ps(p), acc[r][l]);
            }
        }
    }

    __m512 summs[BP_R];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
        summs[r] = _mm512_setzero_ps();
    if (wk == W_Q41) /* m_w * s_a is exact: the FMA adds it as the reference does */
        for (int64_t b = 0; b < nb; b++) {
            const __m512 mw = _mm512_load_ps(w[b].mw);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++)
                summs[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(rs->sa[b][r]), summs[r]);
        }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++) {
        __m512 v = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][4]), _mm512_add_ps(acc[r][2], acc[r][6])),
            _mm512_add_ps(_mm512_add_ps(acc[r][1], acc[r][5]), _mm512_add_ps(acc[r][3], acc[r][7])));
        if (wk == W_Q41)
            v = _mm512_add_ps(v, summs[r]);
        _mm512_mask_storeu_ps(o[r], cm, v);
    }
}

/* Where a call's weight rows are: the file's rows (w, w_row_bytes) or the
 * packed layout (quants, scales, gr). */
typedef struct {
    const uint8_t *w;
    size_t w_row_bytes;
    const uint8_t *quants, *scales;
    size_t gq, gs; /* a packed group's quant and scale bytes */
    int gr;        /* packed group rows; 0: the file's rows */
} bp_src;

/* Decodes the 16 weight rows from column c (the last valid one repeated
 * past ce) into dst. */
static ALWAYS_INLINE void bp_decode(const int wk, const bp_src *s, int64_t c, int64_t ce,
                                    int64_t nb, bp_wblk *dst)
{
    if (s->gr == 0) {
        const uint8_t *rows[16];
        for (int k = 0; k < 16; k++)
            rows[k] = s->w + (size_t)(c + k < ce ? c + k : ce - 1) * s->w_row_bytes;
        bp_decode_rows(wk, rows, nb, dst);
        return;
    }
    /* c is a multiple of gr; for Q8_0 (gr 8) the second half is the next
     * group, or this one again past ce */
    const size_t g0 = (size_t)(c / s->gr);
    const size_t g1 = wk == W_Q8 && c + 8 < ce ? g0 + 1 : g0;
    bp_decode_packed(wk, s->quants + g0 * s->gq, s->scales + g0 * s->gs,
                     s->quants + g1 * s->gq, s->scales + g1 * s->gs, nb, dst);
}

/* Rows [0, n) x columns [o0, o1) of weight kind wk. */
static ALWAYS_INLINE void bp_compute(const int wk, const bp_src *s, const uint8_t *act,
                                     size_t arb, int64_t n, int64_t nb, float *out,
                                     int64_t out_stride, int64_t o0, int64_t o1)
{
    bp_scratch sc __attribute__((aligned(64)));
    const int64_t panel = BP_PANEL / nb * 16; /* columns; nb <= BP_MAX_NB */
    for (int64_t pc = o0; pc < o1; pc += panel) {
        const int64_t pe = pc + panel < o1 ? pc + panel : o1;
        const int64_t ng = (pe - pc + 15) / 16;
        for (int64_t g = 0; g < ng; g++)
            bp_decode(wk, s, pc + 16 * g, pe, nb, sc.w + g * nb);
        for (int64_t r = 0; r < n; r += BP_R) {
            const int nr = n - r >= BP_R ? BP_R : (int)(n - r);
            const uint8_t *a[BP_R];
            for (int i = 0; i < BP_R; i++)
                a[i] = act + (size_t)(r + (i < nr ? i : nr - 1)) * arb;
            bp_prep_rows(wk, a, nb, &sc.rows);
            for (int64_t g = 0; g < ng; g++) {
                const int64_t c = pc + 16 * g;
                const int nc = pe - c >= 16 ? 16 : (int)(pe - c);
                float *o[BP_R];
                for (int i = 0; i < BP_R; i++)
                    o[i] = out + (r + (i < nr ? i : 0)) * out_stride + c;
                const __mmask16 cm = (__mmask16)((1u << nc) - 1u);
                /* a last tile of fewer rows computes only those */
                if (nr == 3)
                    bp_tile(wk, 3, a, sc.w + g * nb, &sc.rows, nb, o, cm);
                else if (nr == 2)
                    bp_tile(wk, 2, a, sc.w + g * nb, &sc.rows, nb, o, cm);
                else
                    bp_tile(wk, 1, a, sc.w + g * nb, &sc.rows, nb, o, cm);
            }
        }
    }
}

static __attribute__((noinline)) void bp_q41(const bp_src *s, const uint8_t *act, size_t arb,
                                             int64_t n, int64_t nb, float *out, int64_t os,
                                             int64_t o0, int64_t o1)
{
    bp_compute(W_Q41, s, act, arb, n, nb, out, os, o0, o1);
}

static __attribute__((noinline)) void bp_q40(const bp_src *s, const uint8_t *act, size_t arb,
                                             int64_t n, int64_t nb, float *out, int64_t os,
                                             int64_t o0, int64_t o1)
{
    bp_compute(W_Q40, s, act, arb, n, nb, out, os, o0, o1);
}

static __attribute__((noinline)) void bp_q8(const bp_src *s, const uint8_t *act, size_t arb,
                                            int64_t n, int64_t nb, float *out, int64_t os,
                                            int64_t o0, int64_t o1)
{
    bp_compute(W_Q8, s, act, arb, n, nb, out, os, o0, o1);
}

/* The batched path for weight type wt, or NULL where n rows of nb blocks
 * stay on the tiles. */
typedef void (*bp_fn)(const bp_src *, const uint8_t *, size_t, int64_t, int64_t, float *,
                      int64_t, int64_t, int64_t);
static bp_fn bp_pick(cinfer_dtype wt, int64_t n, int64_t nb)
{
    if (n < BP_MIN_ROWS || nb < 1 || nb > BP_MAX_NB)
        return NULL;
    switch (wt) {
    case CINFER_DTYPE_Q4_1: return bp_q41;
    case CINFER_DTYPE_Q4_0: return bp_q40;
    case CINFER_DTYPE_Q8_0: return bp_q8;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------------- */
/* drivers                                                                */
/* ---------------------------------------------------------------------- */

typedef enum { K_Q41, K_Q40, K_Q8, K_F32, K_F16, K_BF16 } kind;

/* Tile shapes by row count R (1..4): 4-column groups for Q4, column pairs
 * for Q8_0, columns for the float kernels. Decode (R = 1) takes wider
 * tiles: it has registers to spare and amortizes the activation's
 * broadcasts over more columns. */
#define Q4_GROUPS(R) ((R) == 1 ? 4 : 2)
#define Q8_PAIRS(R) 4
#define F_COLS(R) ((R) <= 2 ? 8 : 6)

/* Columns per tile for a row count, per kernel kind. */
static int tile_cols(kind k, int rows)
{
    switch (k) {
    case K_Q41:
    case K_Q40:
        return 4 * Q4_GROUPS(rows);
    case K_Q8:
        return 2 * Q8_PAIRS(rows);
    case K_BF16:
    case K_F32:
    case K_F16:
        return F_COLS(rows);
    }
    return 4;
}

/* One function per (kernel, rows) so each is compiled with its tile shape
 * fixed and its accumulators in registers. */
#define TILE_FNS(name, call)                                                   \
    static __attribute__((noinline)) void name##_r1(const tile *t) { call(1); } \
    static __attribute__((noinline)) void name##_r2(const tile *t) { call(2); } \
    static __attribute__((noinline)) void name##_r3(const tile *t) { call(3); } \
    static __attribute__((noinline)) void name##_r4(const tile *t) { call(4); }
#define Q41_CALL(R) tile_q4(t, R, Q4_GROUPS(R), 1, 0)
#define Q40_CALL(R) tile_q4(t, R, Q4_GROUPS(R), 0, 0)
#define Q8_CALL(R) tile_q8(t, R, Q8_PAIRS(R))
#define F32_CALL(R) tile_f(t, R, F_COLS(R), 0)
#define F16_CALL(R) tile_f(t, R, F_COLS(R), 1)
#define BF16_CALL(R) tile_bf16(t, R, F_COLS(R))
TILE_FNS(q41, Q41_CALL)
TILE_FNS(q40, Q40_CALL)
TILE_FNS(q8, Q8_CALL)
#define Q8P_CALL(R) tile_q8p(t, R)
#define Q41P_CALL(R) tile_q4(t, R, Q4_GROUPS(R), 1, 1)
#define Q40P_CALL(R) tile_q4(t, R, Q4_GROUPS(R), 0, 1)
TILE_FNS(q8p, Q8P_CALL)
TILE_FNS(q41p, Q41P_CALL)
TILE_FNS(q40p, Q40P_CALL)
TILE_FNS(f32, F32_CALL)
TILE_FNS(f16, F16_CALL)
TILE_FNS(bf16, BF16_CALL)

typedef void (*tile_fn)(const tile *t);
static const tile_fn k_tile_fns[6][4] = {
    [K_Q41] = {q41_r1, q41_r2, q41_r3, q41_r4},
    [K_Q40] = {q40_r1, q40_r2, q40_r3, q40_r4},
    [K_Q8] = {q8_r1, q8_r2, q8_r3, q8_r4},
    [K_F32] = {f32_r1, f32_r2, f32_r3, f32_r4},
    [K_F16] = {f16_r1, f16_r2, f16_r3, f16_r4},
    [K_BF16] = {bf16_r1, bf16_r2, bf16_r3, bf16_r4},
};

/* A row tile's activation rows r .. r + rows - 1 (the last repeated up to
 * four) and their output rows. */
static void tile_set_rows(tile *t, float **orow, const uint8_t *ab, size_t arb,
                          float *out, int64_t out_stride, int64_t r, int rows)
{
    for (int i = 0; i < 4; i++) {
        int64_t rr = r + (i < rows ? i : rows - 1);
        t->a[i] = ab + (size_t)rr * arb;
        orow[i] = out + rr * out_stride;
    }
}

void cinfer_cpu_matmul_compute_avx512(cinfer_dtype wt, const void *w,
                                      size_t w_row_bytes, const void *act,
                                      int64_t n, int64_t n_in, float *out,
                                      int64_t out_stride, int64_t o0,
                                      int64_t o1)
{
    kind k;
    switch (wt) {
    case CINFER_DTYPE_Q4_1: k = K_Q41; break;
    case CINFER_DTYPE_Q4_0: k = K_Q40; break;
    case CINFER_DTYPE_Q8_0: k = K_Q8; break;
    case CINFER_DTYPE_F16: k = K_F16; break;
    case CINFER_DTYPE_BF16: k = K_BF16; break;
    default: k = K_F32; break;
    }
    const size_t arb = cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), n_in);
    const int64_t nb = cinfer_dtype_block_elems(wt) > 1 ? n_in / CINFER_QK : n_in;
    const uint8_t *wb = (const uint8_t *)w;
    const uint8_t *ab = (const uint8_t *)act;
    /* Iterations of a tile's inner loop. */
    const int64_t iters = k == K_F32 || k == K_F16 ? (n_in + 15) / 16
                          : k == K_BF16           ? (n_in + 31) / 32
                                                  : nb;

    const bp_fn bp = bp_pick(wt, n, nb);
    if (bp) {
        const bp_src src = {.w = wb, .w_row_bytes = w_row_bytes};
        bp(&src, ab, arb, n, nb, out, out_stride, o0, o1);
        return;
    }

    /* Column blocks only pay when several row tiles reuse them. */
    const int64_t cblk = n > 4 ? col_block(w_row_bytes) : o1 - o0;
    for (int64_t cb = o0; cb < o1; cb += cblk) {
        const int64_t ce = cb + cblk < o1 ? cb + cblk : o1;
        for (int64_t r = 0; r < n; r += 4) {
            const int rows = n - r >= 4 ? 4 : (int)(n - r);
            const int ct = tile_cols(k, rows);
            tile t;
            float *orow[4];
            t.nb = nb;
            tile_set_rows(&t, orow, ab, arb, out, out_stride, r, rows);
            for (int64_t c = cb; c < ce; c += ct) {
                const int nc = ce - c >= ct ? ct : (int)(ce - c);
                t.nc = nc;
                for (int i = 0; i < ct; i++)
                    t.w[i] = wb + (size_t)(c + (i < nc ? i : nc - 1)) * w_row_bytes;
                /* The next tile's rows, within this column block. */
                const int64_t nn = ce - (c + nc) < ct ? ce - (c + nc) : ct;
                const size_t pf_bytes = (size_t)(nn > 0 ? nn : 0) * w_row_bytes;
                t.pf = wb + (size_t)(c + nc) * w_row_bytes;
                t.pf_step = (pf_bytes / (size_t)(iters > 0 ? iters : 1) + 63) / 64 * 64;
                t.pf_lines = (int)(t.pf_step / 64);
                for (int i = 0; i < 4; i++)
                    t.o[i] = orow[i] + c;
                k_tile_fns[k][rows - 1](&t);
            }
        }
    }
}

void cinfer_cpu_matmul_compute_packed_avx512(cinfer_dtype wt, const void *w,
                                             int64_t n_out, const void *act,
                                             int64_t n, int64_t n_in,
                                             float *out, int64_t out_stride,
                                             int64_t o0, int64_t o1)
{
    if (cinfer_cpu_matmul_is_kquant(wt)) {
        cinfer_cpu_matmul_compute_kquant_packed_avx512(wt, w, n_out, act, n, n_in, out,
                                                       out_stride, o0, o1);
        return;
    }
    static const tile_fn q8[4] = {q8p_r1, q8p_r2, q8p_r3, q8p_r4};
    static const tile_fn q41[4] = {q41p_r1, q41p_r2, q41p_r3, q41p_r4};
    static const tile_fn q40[4] = {q40p_r1, q40p_r2, q40p_r3, q40p_r4};
    const tile_fn *fns = wt == CINFER_DTYPE_Q8_0   ? q8
                         : wt == CINFER_DTYPE_Q4_1 ? q41
                                                   : q40;
    const kind k = wt == CINFER_DTYPE_Q8_0   ? K_Q8
                   : wt == CINFER_DTYPE_Q4_1 ? K_Q41
                                             : K_Q40;
    const int gr = cinfer_cpu_pack_rows(wt);
    const int64_t nb = n_in / CINFER_QK;
    const int64_t n_full = n_out / gr * gr;
    const size_t wrb = cinfer_dtype_row_bytes(wt, n_in);
    const size_t sb = wt == CINFER_DTYPE_Q4_1 ? 4 : 2;
    const size_t qb = cinfer_dtype_row_bytes(wt, CINFER_QK) - sb;
    const size_t arb = cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), n_in);
    const size_t gq = (size_t)nb * (size_t)gr * qb, gs = (size_t)nb * (size_t)gr * sb;
    const uint8_t *quants = (const uint8_t *)w;
    const uint8_t *scales = quants + (size_t)(n_full / gr) * gq;
    const uint8_t *ab = (const uint8_t *)act;
    const int64_t e = o1 < n_full ? o1 : n_full;
    const bp_fn bp = bp_pick(wt, n, nb);
    if (bp && o0 < e) {
        const bp_src src = {.quants = quants, .scales = scales, .gq = gq, .gs = gs, .gr = gr};
        bp(&src, ab, arb, n, nb, out, out_stride, o0, e);
    }

    /* Column blocks only pay when several row tiles reuse them. */
    const int64_t cblk = n > 4 ? col_block(wrb) : e - o0;
    for (int64_t cb = o0; cb < e && !bp; cb += cblk) {
        const int64_t ce = cb + cblk < e ? cb + cblk : e;
        for (int64_t r = 0; r < n; r += 4) {
            const int rows = n - r >= 4 ? 4 : (int)(n - r);
            const int ct = tile_cols(k, rows); /* divides gr */
            tile t;
            float *orow[4];
            t.nb = nb;
            tile_set_rows(&t, orow, ab, arb, out, out_stride, r, rows);
            for (int64_t c = cb; c < ce; c += ct) {
                /* the tile's place in its group: quants and scales of its
                 * first column */
                const size_t in = (size_t)(c % gr);
                t.nc = ct;
                t.w[0] = quants + (size_t)(c / gr) * gq + in * qb;
                t.w[1] = scales + (size_t)(c / gr) * gs + in * sb;
                /* the next group's quants, spread over this group's tiles */
                const int last = c + ct >= ce;
                const int64_t tiles = gr / ct;
                t.pf = quants + (size_t)(c / gr + 1) * gq + (size_t)(c % gr / ct) * (gq / (size_t)tiles);
                t.pf_step = last ? 0 : (gq / (size_t)tiles / (size_t)(nb > 0 ? nb : 1) + 63) / 64 * 64;
                t.pf_lines = (int)(t.pf_step / 64);
                for (int i = 0; i < 4; i++)
                    t.o[i] = orow[i] + c;
                fns[rows - 1](&t);
            }
        }
    }
    /* The rows past the last whole group keep their layout. */
    if (o1 > n_full) {
        const int64_t t0 = o0 > n_full ? o0 : n_full;
        cinfer_cpu_matmul_compute_avx512(wt, scales + (size_t)(n_full / gr) * gs,
                                         wrb, act, n, n_in, out + n_full,
                                         out_stride, t0 - n_full, o1 - n_full);
    }
}

#endif /* CINFER_MATMUL_HAVE_AVX512 */
