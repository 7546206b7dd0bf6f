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

    /* Column blocks only pay when several row tiles reuse them. */
    const int64_t cblk = n > 4 ? col_block(wrb) : e - o0;
    for (int64_t cb = o0; cb < e; cb += cblk) {
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
