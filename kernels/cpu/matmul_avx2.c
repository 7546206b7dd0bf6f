/*
 * matmul_avx2.c - CPU matrix-product kernels for AVX2 + FMA + F16C
 * processors without AVX-512 (Haswell .. Zen 3).
 *
 * Same tiling idea as matmul_avx512.c with 16 ymm registers: a tile of up
 * to 2 activation rows x 3..8 weight columns, each weight block decoded
 * once per tile, and every output element following the reduction order of
 * matmul_impl.h lane by lane.
 *
 * Int8 block types keep GGML's layout directly: one ymm of eight int32
 * partial sums per element and block, from vpmaddubsw (u8 x s8 -> s16
 * pairs) and vpmaddwd with ones. The unsigned operand is the Q4 nibble
 * (Q4_0's "- 8" subtracted as 8 * a in 16-bit, exact) or |w| for Q8_0
 * (with the activation's sign flipped where w < 0, as GGML does); no pair
 * sum can saturate (at most 2 * 128 * 127).
 *
 * Four or more rows of the int8-block types take decoded weight panels
 * instead (see "batched int8 products" below): tiles of 4 activation rows
 * x 2 weight rows over weights decoded once per panel: the same
 * per-element arithmetic, with the decoding and the scale work moved out
 * of the inner loop.
 *
 * F32 / F16: 16-lane accumulators held as two ymm. BF16: the vdpbf16ps
 * order emulated with two FMAs per lane, odd element first.
 */
#include "matmul_impl.h"

#ifdef CINFER_MATMUL_HAVE_AVX2

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

/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static ALWAYS_INLINE float hsum8(__m256 v)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

/* 16 lanes held as lo (0..7) and hi (8..15): h8 = lo + hi, then as hsum8
 * (whose tree continues the 16-lane one exactly). */
static ALWAYS_INLINE float hsum16(__m256 lo, __m256 hi)
{
    return hsum8(_mm256_add_ps(lo, hi));
}

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

static ALWAYS_INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* One Q8 block as the reference quantizer makes it; 0 (nothing written)
 * if the block holds a non-finite value. */
static ALWAYS_INLINE int quant_q8_block(const float *x, int8_t *qs, float *d_out,
                                        int *sum_out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 v[4], mx = _mm256_setzero_ps();
    int bad = 0;
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 a = _mm256_andnot_ps(sign, v[k]);
        bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
        mx = _mm256_max_ps(mx, a);
    }
    if (bad)
        return 0;
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4);
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; k++)
        q[k] = _mm256_cvtps_epi32(_mm256_round_ps(
            _mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *sum_out = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]),
                                         _mm256_add_epi32(q[2], q[3])));
    /* packs work per 128-bit lane; the permute restores element order */
    __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
    __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qs, p);
    *d_out = d;
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
        for (; i + 8 <= n_in; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
                cinfer_quantize_row(at, x + i, o + i, 8);
                continue;
            }
            _mm_storeu_si128((__m128i *)(o + i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        if (i < n_in)
            cinfer_quantize_row(at, x + i, o + i, n_in - i);
        return;
    }
    case CINFER_DTYPE_BF16: {
        uint16_t *o = (uint16_t *)dst;
        const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
        const __m256i absm = _mm256_set1_epi32(0x7fffffff);
        const __m256i expm = _mm256_set1_epi32(0x7f800000);
        const __m256i qbit = _mm256_set1_epi32(0x40);
        int64_t i = 0;
        for (; i + 16 <= n_in; i += 16) {
            __m256i r[2];
            for (int k = 0; k < 2; k++) {
                __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * k));
                __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
                __m256i rr = _mm256_srli_epi32(
                    _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
                __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), expm);
                __m256i nv = _mm256_or_si256(_mm256_srli_epi32(u, 16), qbit);
                r[k] = _mm256_blendv_epi8(rr, nv, nan);
            }
            __m256i p = _mm256_packus_epi32(r[0], r[1]);
            p = _mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0));
            _mm256_storeu_si256((__m256i *)(o + i), p);
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

void cinfer_cpu_matmul_prepare_avx2(cinfer_dtype act_type, const float *x,
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

typedef struct {
    const uint8_t *a[2];
    const uint8_t *w[8];
    float *o[2];
    int nc;
    int64_t nb; /* blocks (quantized) or elements (float) per row */
    const uint8_t *pf; /* next tile's weights, see matmul_avx512.c */
    size_t pf_step;
    int pf_lines;
    int pf_nta;
} tile;

static ALWAYS_INLINE void prefetch_next(const tile *t, int64_t it)
{
    const uint8_t *p = t->pf + (size_t)it * t->pf_step;
    if (t->pf_nta) {
        for (int i = 0; i < t->pf_lines; i++)
            _mm_prefetch((const char *)(p + 64 * i), _MM_HINT_NTA);
    } else {
        for (int i = 0; i < t->pf_lines; i++)
            _mm_prefetch((const char *)(p + 64 * i), _MM_HINT_T0);
    }
}

/* Weight kinds of the int8 tile. */
enum { W_Q41, W_Q40, W_Q8 };

/* Int8 block types: R rows x C columns, one ymm accumulator per element. */
static ALWAYS_INLINE void tile_q(const tile *t, const int R, const int C, const int wk)
{
    const size_t wbs = wk == W_Q41 ? sizeof(cinfer_block_q4_1)
                       : wk == W_Q40 ? sizeof(cinfer_block_q4_0)
                                     : sizeof(cinfer_block_q8_0);
    const size_t abs_ = wk == W_Q41 ? sizeof(cinfer_block_q8_1) : sizeof(cinfer_block_q8_0);
    const int wqo = wk == W_Q41 ? 4 : 2;
    const int aqo = wk == W_Q41 ? 4 : 2;
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    const __m256i eight = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);

    __m256 acc[2][8];
    __m128 summs[2][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
        summs[r][0] = summs[r][1] = _mm_setzero_ps();
    }

    for (int64_t b = 0; b < t->nb; b++) {
        prefetch_next(t, b);
        const size_t wo = (size_t)b * wbs, ao = (size_t)b * abs_;
        /* Column scales (and Q4_1 minimums) as floats, four at a time. */
        float dw[8], mw[8];
#pragma GCC unroll 2
        for (int g = 0; g < (C + 3) / 4; g++) {
            const uint8_t *p[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
                p[k] = t->w[4 * g + k < C ? 4 * g + k : C - 1] + wo;
            if (wk == W_Q41) {
                __m128i dm = _mm_set_epi32((int)ld32(p[3]), (int)ld32(p[2]),
                                           (int)ld32(p[1]), (int)ld32(p[0]));
                __m256 f = _mm256_cvtph_ps(dm); /* d0 m0 d1 m1 ... */
                __m256 sh = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
                _mm_storeu_ps(dw + 4 * g, _mm256_castps256_ps128(sh));
                _mm_storeu_ps(mw + 4 * g, _mm256_extractf128_ps(sh, 1));
            } else {
                __m128i dd = _mm_set_epi16(0, 0, 0, 0, (short)ld16(p[3]), (short)ld16(p[2]),
                                           (short)ld16(p[1]), (short)ld16(p[0]));
                _mm_storeu_ps(dw + 4 * g, _mm_cvtph_ps(dd));
            }
        }
        __m256i qa[2], corr[2];
        __m256 da[2];
        __m128 sa[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const uint8_t *ab = t->a[r] + ao;
            qa[r] = _mm256_loadu_si256((const __m256i *)(ab + aqo));
            __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(wk == W_Q41 ? ld32(ab) : ld16(ab))));
            da[r] = _mm256_broadcastss_ps(ds);
            sa[r] = _mm_permute_ps(ds, _MM_SHUFFLE(1, 1, 1, 1));
            corr[r] = wk == W_Q40 ? _mm256_maddubs_epi16(eight, qa[r]) : _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const uint8_t *p = t->w[c] + wo;
            __m256i qw;
            if (wk == W_Q8) {
                qw = _mm256_loadu_si256((const __m256i *)(p + wqo));
            } else {
                __m128i raw = _mm_loadu_si128((const __m128i *)(p + wqo));
                qw = _mm256_and_si256(
                    _mm256_inserti128_si256(_mm256_castsi128_si256(raw),
                                            _mm_srli_epi16(raw, 4), 1),
                    m0f);
            }
            __m256i uw = wk == W_Q8 ? _mm256_sign_epi8(qw, qw) : qw;
            __m256 dwc = _mm256_broadcast_ss(dw + c);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i sy = wk == W_Q8 ? _mm256_sign_epi8(qa[r], qw) : qa[r];
                __m256i p16 = _mm256_maddubs_epi16(uw, sy);
                if (wk == W_Q40)
                    p16 = _mm256_sub_epi16(p16, corr[r]);
                __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc[r][c] = _mm256_fmadd_ps(_mm256_mul_ps(dwc, da[r]), f, acc[r][c]);
            }
        }
        if (wk == W_Q41) {
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
#pragma GCC unroll 2
                for (int g = 0; g < (C + 3) / 4; g++)
                    summs[r][g] = _mm_fmadd_ps(_mm_loadu_ps(mw + 4 * g), sa[r], summs[r][g]);
        }
    }

#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        float s[8];
        if (wk == W_Q41) {
            _mm_storeu_ps(s, summs[r][0]);
            _mm_storeu_ps(s + 4, summs[r][1]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            if (c < t->nc) {
                float v = hsum8(acc[r][c]);
                t->o[r][c] = wk == W_Q41 ? v + s[c] : v;
            }
        }
    }
}

/* Element loads widened to fp32: 8 at element offset i. */
static ALWAYS_INLINE __m256 load8(const uint8_t *p, int64_t i, const int f16)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
    return _mm256_loadu_ps((const float *)p + i);
}

/* A zero-padded copy of the partial last chunk (of `chunk` elements). */
static ALWAYS_INLINE void pad_copy(uint8_t *dst, const uint8_t *row, int64_t i,
                                   int64_t n, int esize, int chunk)
{
    memset(dst, 0, (size_t)(chunk * esize));
    memcpy(dst, row + (size_t)i * (size_t)esize, (size_t)((n - i) * esize));
}

/* F32 / F16: R rows x C columns, 16 lanes per element as two ymm. */
static ALWAYS_INLINE void tile_f(const tile *t, const int R, const int C, const int f16)
{
    __m256 acc[2][4][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();

    const int64_t n = t->nb;
    const int es = f16 ? 2 : 4;
    uint8_t pad[6][64];
    for (int64_t i = 0; i < n; i += 16) {
        prefetch_next(t, i / 16);
        const uint8_t *ap[2], *wp[4];
        int64_t off = i;
        if (n - i >= 16) {
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                ap[r] = t->a[r];
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                wp[c] = t->w[c];
        } else {
            for (int r = 0; r < R; r++) {
                pad_copy(pad[r], t->a[r], i, n, es, 16);
                ap[r] = pad[r];
            }
            for (int c = 0; c < C; c++) {
                pad_copy(pad[2 + c], t->w[c], i, n, es, 16);
                wp[c] = pad[2 + c];
            }
            off = 0;
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 a[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                a[r] = load8(ap[r], off + 8 * h, f16);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256 w = load8(wp[c], off + 8 * h, f16);
#pragma GCC unroll 2
                for (int r = 0; r < R; r++)
                    acc[r][c][h] = _mm256_fmadd_ps(w, a[r], acc[r][c][h]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            if (c < t->nc)
                t->o[r][c] = hsum16(acc[r][c][0], acc[r][c][1]);
}

/* BF16: the vdpbf16ps order, lane l = pair (2l, 2l + 1) of a 32-element
 * chunk, odd element first. A dword of raw bf16 data holds the even
 * element in its low half and the odd one in its high half. */
static ALWAYS_INLINE void tile_bf16(const tile *t, const int R, const int C)
{
    const __m256i hi_mask = _mm256_set1_epi32((int)0xffff0000u);
    __m256 acc[2][4][2];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();

    const int64_t n = t->nb;
    uint8_t pad[6][64];
    for (int64_t i = 0; i < n; i += 32) {
        prefetch_next(t, i / 32);
        const uint8_t *ap[2], *wp[4];
        int64_t off = i;
        if (n - i >= 32) {
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                ap[r] = t->a[r];
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                wp[c] = t->w[c];
        } else {
            for (int r = 0; r < R; r++) {
                pad_copy(pad[r], t->a[r], i, n, 2, 32);
                ap[r] = pad[r];
            }
            for (int c = 0; c < C; c++) {
                pad_copy(pad[2 + c], t->w[c], i, n, 2, 32);
                wp[c] = pad[2 + c];
            }
            off = 0;
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 ao[2], ae[2];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(ap[r] + 2 * (off + 16 * h)));
                ao[r] = _mm256_castsi256_ps(_mm256_and_si256(raw, hi_mask));
                ae[r] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(wp[c] + 2 * (off + 16 * h)));
                __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(raw, hi_mask));
                __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++) {
                    acc[r][c][h] = _mm256_fmadd_ps(wo, ao[r], acc[r][c][h]);
                    acc[r][c][h] = _mm256_fmadd_ps(we, ae[r], acc[r][c][h]);
                }
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            if (c < t->nc)
                t->o[r][c] = hsum16(acc[r][c][0], acc[r][c][1]);
}

/* ---------------------------------------------------------------------- */
/* batched int8 products: decoded weight panels                           */
/* ---------------------------------------------------------------------- */

/* Beyond a few rows (prefill, batched decode) the int8 products are bound
 * by vector uops, not by the weight stream, and tile_q decodes each weight
 * block (nibbles, scale and minimum conversions) and multiplies the scales
 * again for every pair of rows. So many rows take this path instead: a
 * panel of weight rows is decoded once into scratch on the stack (nibbles
 * as bytes, scales as floats laid out lane by lane for the tile), and
 * every tile of PN_R activation rows x PN_C weight rows runs over it, with
 * the activations as memory operands. Per element and block the inner loop is vpmaddubsw,
 * vpmaddwd, vcvtdq2ps and one FMA (plus vpsignb for Q8_0, vpsubw for
 * Q4_0); the scale products of a whole tile are one vmulps and Q4_1's
 * minimum terms one FMA. The per-element arithmetic is tile_q's (the order
 * of matmul_impl.h): the same exact int32 block sums, the same exact scale
 * product, the same FMA chain and final sums, so which path computes a
 * row never changes its bits. */

enum {
    PN_R = 4,         /* activation rows per tile */
    PN_C = 2,         /* weight rows per tile; lane 2r + c of a pattern is (r, c) */
    PN_WBLKS = 512,   /* decoded blocks of a panel (64 KiB); more blocks a
                       * row (n_in > 16384) stay on tile_q */
    PN_MIN_ROWS = 4,  /* fewer rows stay on tile_q */
};

/* One block of a tile's PN_C weight rows, decoded. */
typedef struct {
    uint8_t q[PN_C][32]; /* quants in element order: Q4 nibbles 0..15, Q8_0 as is */
    float dw[8];         /* lane 2r + c: column c's scale */
    float mw[8];         /* lane 2r + c: column c's minimum (Q4_1) */
} pn_wblk;

/* One block of a tile's PN_R activation rows' scales. */
typedef struct {
    float da[8]; /* lane 2r + c: row r's scale */
    float sa[8]; /* lane 2r + c: row r's s (Q8_1) */
} pn_ablk;

/* A call's scratch, on its stack (112 KiB; the kernels run on the
 * backend's pool threads and its caller, all with default stacks). */
typedef struct {
    pn_wblk w[PN_WBLKS]; /* the panel's tiles, nb blocks each */
    pn_ablk a[PN_WBLKS]; /* the row tile's blocks */
    float dd[PN_WBLKS][8];
} pn_scratch;

/* Decodes weight rows w0 and w1 (the same row for a lone last column). */
static ALWAYS_INLINE void pn_decode(const int wk, const uint8_t *w0, const uint8_t *w1,
                                    int64_t nb, pn_wblk *dst)
{
    const size_t wbs = wk == W_Q41 ? sizeof(cinfer_block_q4_1)
                       : wk == W_Q40 ? sizeof(cinfer_block_q4_0)
                                     : sizeof(cinfer_block_q8_0);
    const int wqo = wk == W_Q41 ? 4 : 2;
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        for (int c = 0; c < PN_C; c++) {
            const uint8_t *p = (c ? w1 : w0) + (size_t)b * wbs;
            __m256i q;
            if (wk == W_Q8) {
                q = _mm256_loadu_si256((const __m256i *)(p + wqo));
            } else {
                __m128i raw = _mm_loadu_si128((const __m128i *)(p + wqo));
                q = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(raw),
                                                             _mm_srli_epi16(raw, 4), 1),
                                     m0f);
            }
            _mm256_store_si256((__m256i *)dst[b].q[c], q);
            float d = _cvtsh_ss(ld16(p));
            float m = wk == W_Q41 ? _cvtsh_ss(ld16(p + 2)) : 0.0f;
            for (int r = 0; r < PN_R; r++) {
                dst[b].dw[PN_C * r + c] = d;
                dst[b].mw[PN_C * r + c] = m;
            }
        }
    }
}

/* The scales (and Q8_1 sums) of activation rows a[0..PN_R). */
static ALWAYS_INLINE void pn_scales(const int wk, const uint8_t *const *a, int64_t nb,
                                    pn_ablk *dst)
{
    const size_t abs_ = wk == W_Q41 ? sizeof(cinfer_block_q8_1) : sizeof(cinfer_block_q8_0);
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < PN_R; r++) {
            const uint8_t *p = a[r] + (size_t)b * abs_;
            float d = _cvtsh_ss(ld16(p));
            float s = wk == W_Q41 ? _cvtsh_ss(ld16(p + 2)) : 0.0f;
            for (int c = 0; c < PN_C; c++) {
                dst[b].da[PN_C * r + c] = d;
                dst[b].sa[PN_C * r + c] = s;
            }
        }
    }
}

/* One tile: rows a[0..PN_R) x the decoded weight rows of w; writes the
 * first nr rows and nc columns through o[r][c]. */
static ALWAYS_INLINE void pn_tile(const int wk, const uint8_t *const *a, const pn_wblk *w,
                                  const pn_ablk *as, float (*pn_dd)[8], int64_t nb,
                                  float *const *o, int nr, int nc)
{
    const size_t abs_ = wk == W_Q41 ? sizeof(cinfer_block_q8_1) : sizeof(cinfer_block_q8_0);
    const int aqo = wk == W_Q41 ? 4 : 2;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc[PN_R][PN_C];
#pragma GCC unroll 4
    for (int r = 0; r < PN_R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < PN_C; c++)
            acc[r][c] = _mm256_setzero_ps();
    __m256 summs = _mm256_setzero_ps();

    /* dw * da (exact) for the whole tile, a block a vmulps, written ahead
     * of the loop that broadcasts it: a store read back at once by narrower
     * loads would stall on store forwarding every block. */
    for (int64_t b = 0; b < nb; b++)
        _mm256_store_ps(pn_dd[b], _mm256_mul_ps(_mm256_load_ps(w[b].dw), _mm256_load_ps(as[b].da)));

    for (int64_t b = 0; b < nb; b++) {
        const size_t ao = (size_t)b * abs_ + (size_t)aqo;
        const float *dd = pn_dd[b];
        if (wk == W_Q41) /* mw * sa is exact: the FMA adds it as tile_q does */
            summs = _mm256_fmadd_ps(_mm256_load_ps(w[b].mw), _mm256_load_ps(as[b].sa), summs);
        __m256i wq[PN_C], uw[PN_C];
#pragma GCC unroll 2
        for (int c = 0; c < PN_C; c++) {
            wq[c] = _mm256_load_si256((const __m256i *)w[b].q[c]);
            uw[c] = wk == W_Q8 ? _mm256_sign_epi8(wq[c], wq[c]) : wq[c];
        }
#pragma GCC unroll 4
        for (int r = 0; r < PN_R; r++) {
            const __m256i qa = _mm256_loadu_si256((const __m256i *)(a[r] + ao));
            const __m256i corr = wk == W_Q40 ? _mm256_maddubs_epi16(eight, qa)
                                             : _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int c = 0; c < PN_C; c++) {
                __m256i p16;
                if (wk == W_Q8) {
                    p16 = _mm256_maddubs_epi16(uw[c], _mm256_sign_epi8(qa, wq[c]));
                } else {
                    p16 = _mm256_maddubs_epi16(wq[c], qa);
                    if (wk == W_Q40)
                        p16 = _mm256_sub_epi16(p16, corr);
                }
                __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(dd + PN_C * r + c), f,
                                            acc[r][c]);
            }
        }
    }

    float s[8];
    _mm256_storeu_ps(s, summs);
#pragma GCC unroll 4
    for (int r = 0; r < PN_R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < PN_C; c++)
            if (r < nr && c < nc) {
                float v = hsum8(acc[r][c]);
                o[r][c] = wk == W_Q41 ? v + s[PN_C * r + c] : v;
            }
}

/* Rows [0, n) x columns [o0, o1) of weight kind wk, a panel at a time. */
static ALWAYS_INLINE void pn_compute(const int wk, const uint8_t *w, size_t w_row_bytes,
                                     const uint8_t *act, size_t arb, int64_t n,
                                     int64_t nb, float *out, int64_t out_stride,
                                     int64_t o0, int64_t o1)
{
    pn_scratch sc __attribute__((aligned(64)));
    pn_wblk *const pn_w = sc.w;
    pn_ablk *const pn_a = sc.a;
    const int64_t panel_tiles = PN_WBLKS / nb; /* >= 1: the caller checks */
    const int64_t panel_cols = panel_tiles * PN_C;
    for (int64_t pc = o0; pc < o1; pc += panel_cols) {
        const int64_t pe = pc + panel_cols < o1 ? pc + panel_cols : o1;
        const int64_t nt = (pe - pc + PN_C - 1) / PN_C;
        for (int64_t t = 0; t < nt; t++) {
            const int64_t c0 = pc + PN_C * t;
            const int64_t c1 = c0 + 1 < pe ? c0 + 1 : c0;
            pn_decode(wk, w + (size_t)c0 * w_row_bytes, w + (size_t)c1 * w_row_bytes, nb,
                      pn_w + t * nb);
        }
        for (int64_t r = 0; r < n; r += PN_R) {
            const int nr = n - r >= PN_R ? PN_R : (int)(n - r);
            const uint8_t *a[PN_R];
            for (int i = 0; i < PN_R; i++)
                a[i] = act + (size_t)(r + (i < nr ? i : nr - 1)) * arb;
            pn_scales(wk, a, nb, pn_a);
            for (int64_t t = 0; t < nt; t++) {
                const int64_t c0 = pc + PN_C * t;
                const int nc = pe - c0 >= PN_C ? PN_C : (int)(pe - c0);
                float *o[PN_R];
                for (int i = 0; i < PN_R; i++)
                    o[i] = out + (r + (i < nr ? i : 0)) * out_stride + c0;
                pn_tile(wk, a, pn_w + t * nb, pn_a, sc.dd, nb, o, nr, nc);
            }
        }
    }
}

static __attribute__((noinline)) void pn_q41(const uint8_t *w, size_t wrb, const uint8_t *act,
                                             size_t arb, int64_t n, int64_t nb, float *out,
                                             int64_t os, int64_t o0, int64_t o1)
{
    pn_compute(W_Q41, w, wrb, act, arb, n, nb, out, os, o0, o1);
}

static __attribute__((noinline)) void pn_q40(const uint8_t *w, size_t wrb, const uint8_t *act,
                                             size_t arb, int64_t n, int64_t nb, float *out,
                                             int64_t os, int64_t o0, int64_t o1)
{
    pn_compute(W_Q40, w, wrb, act, arb, n, nb, out, os, o0, o1);
}

static __attribute__((noinline)) void pn_q8(const uint8_t *w, size_t wrb, const uint8_t *act,
                                            size_t arb, int64_t n, int64_t nb, float *out,
                                            int64_t os, int64_t o0, int64_t o1)
{
    pn_compute(W_Q8, w, wrb, act, arb, n, nb, out, os, o0, o1);
}

/* ---------------------------------------------------------------------- */
/* drivers                                                                */
/* ---------------------------------------------------------------------- */

typedef enum { K_Q41, K_Q40, K_Q8, K_F32, K_F16, K_BF16 } kind;

/* Tile columns for 1 and 2 rows. */
static int tile_cols(kind k, int rows)
{
    if (k == K_Q41 || k == K_Q40 || k == K_Q8)
        return rows == 1 ? 8 : 4;
    /* F16 decode (the path Zen 4 takes for it, matmul.c) streams fastest
     * two weight rows at a time: 1 thread 77 -> 92 tok/s against four
     * (alternating runs, weights in huge pages); one row was slower still
     * (53), six slower too (54). */
    if (k == K_F16 && rows == 1)
        return 2;
    return rows == 1 ? 4 : 3;
}

static __attribute__((noinline)) void q41_r1(const tile *t) { tile_q(t, 1, 8, W_Q41); }
static __attribute__((noinline)) void q41_r2(const tile *t) { tile_q(t, 2, 4, W_Q41); }
static __attribute__((noinline)) void q40_r1(const tile *t) { tile_q(t, 1, 8, W_Q40); }
static __attribute__((noinline)) void q40_r2(const tile *t) { tile_q(t, 2, 4, W_Q40); }
static __attribute__((noinline)) void q8_r1(const tile *t) { tile_q(t, 1, 8, W_Q8); }
static __attribute__((noinline)) void q8_r2(const tile *t) { tile_q(t, 2, 4, W_Q8); }
static __attribute__((noinline)) void f32_r1(const tile *t) { tile_f(t, 1, 4, 0); }
static __attribute__((noinline)) void f32_r2(const tile *t) { tile_f(t, 2, 3, 0); }
static __attribute__((noinline)) void f16_r1(const tile *t) { tile_f(t, 1, 2, 1); }
static __attribute__((noinline)) void f16_r2(const tile *t) { tile_f(t, 2, 3, 1); }
static __attribute__((noinline)) void bf16_r1(const tile *t) { tile_bf16(t, 1, 4); }
static __attribute__((noinline)) void bf16_r2(const tile *t) { tile_bf16(t, 2, 3); }

typedef void (*tile_fn)(const tile *t);
static const tile_fn k_tile_fns[6][2] = {
    [K_Q41] = {q41_r1, q41_r2}, [K_Q40] = {q40_r1, q40_r2},
    [K_Q8] = {q8_r1, q8_r2},    [K_F32] = {f32_r1, f32_r2},
    [K_F16] = {f16_r1, f16_r2}, [K_BF16] = {bf16_r1, bf16_r2},
};

void cinfer_cpu_matmul_compute_avx2(cinfer_dtype wt, const void *w,
                                    size_t w_row_bytes, const void *act,
                                    int64_t n, int64_t n_in, float *out,
                                    int64_t out_stride, int64_t o0, int64_t o1)
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
    const int64_t iters = k == K_F32 || k == K_F16 ? (n_in + 15) / 16
                          : k == K_BF16           ? (n_in + 31) / 32
                                                  : nb;
    const uint8_t *wb = (const uint8_t *)w;
    const uint8_t *ab = (const uint8_t *)act;

    if ((k == K_Q41 || k == K_Q40 || k == K_Q8) && n >= PN_MIN_ROWS && nb >= 1 &&
        nb <= PN_WBLKS) {
        void (*fn)(const uint8_t *, size_t, const uint8_t *, size_t, int64_t, int64_t,
                   float *, int64_t, int64_t, int64_t) = k == K_Q41   ? pn_q41
                                                         : k == K_Q40 ? pn_q40
                                                                      : pn_q8;
        fn(wb, w_row_bytes, ab, arb, n, nb, out, out_stride, o0, o1);
        return;
    }

    /* Column blocks only pay when several row tiles reuse them. */
    const int64_t cblk = n > 2 ? col_block(w_row_bytes) : o1 - o0;
    for (int64_t cb = o0; cb < o1; cb += cblk) {
        const int64_t ce = cb + cblk < o1 ? cb + cblk : o1;
        for (int64_t r = 0; r < n; r += 2) {
            const int rows = n - r >= 2 ? 2 : 1;
            const int ct = tile_cols(k, rows);
            tile t;
            t.nb = nb;
            t.pf_nta = n <= 2;
            for (int i = 0; i < 2; i++) {
                int64_t rr = r + (i < rows ? i : rows - 1);
                t.a[i] = ab + (size_t)rr * arb;
                t.o[i] = NULL;
            }
            for (int64_t c = cb; c < ce; c += ct) {
                const int nc = ce - c >= ct ? ct : (int)(ce - c);
                t.nc = nc;
                for (int i = 0; i < ct; i++)
                    t.w[i] = wb + (size_t)(c + (i < nc ? i : nc - 1)) * w_row_bytes;
                const int64_t nn = ce - (c + nc) < ct ? ce - (c + nc) : ct;
                const size_t pf_bytes = (size_t)(nn > 0 ? nn : 0) * w_row_bytes;
                t.pf = wb + (size_t)(c + nc) * w_row_bytes;
                t.pf_step = (pf_bytes / (size_t)(iters > 0 ? iters : 1) + 63) / 64 * 64;
                t.pf_lines = (int)(t.pf_step / 64);
                for (int i = 0; i < rows; i++)
                    t.o[i] = out + (r + i) * out_stride + c;
                k_tile_fns[k][rows - 1](&t);
            }
        }
    }
}

#endif /* CINFER_MATMUL_HAVE_AVX2 */
