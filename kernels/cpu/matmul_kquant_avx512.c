/*
 * matmul_kquant_avx512.c - K-quant and IQ4 products (Q2_K .. Q6_K and
 * IQ4_XS x Q8_K, IQ4_NL x Q8_0) for AVX-512 F/BW/VL/DQ + VNNI, in the
 * reduction order of matmul_kquant.c.
 *
 * The integer work is 512 bits wide: one register holds two 32-element
 * parts of a super-block, so its 16 int32 lanes are lane l of part p (0..7)
 * and lane l of part p + 1 (8..15). Quants are widened to pair sums with
 * vpmaddubsw (unsigned quant x signed activation, no pair can saturate, as
 * in the AVX2 file) and scaled and summed into int32 by VNNI's vpdpwssd.
 * Adding the upper eight lanes onto the lower eight is exact, and leaves
 * the eight int32 isum[l] of the reduction order; from there the float
 * steps (one fma per super-block and row, the final tree) are the AVX2
 * file's, on 256-bit registers, so every ISA computes the same bits.
 *   - Q4_K sums the eight lanes too (exact) and keeps two scalar
 *     accumulators per row: the order of llama.cpp's repacked gemv.
 *   - Q3_K's quants q - 4 are signed: the activation goes in offset by 128
 *     (a ^ 0x80, unsigned) and the weight's 128 * sum(q - 4) * scale,
 *     computed once per super-block, starts the accumulator negated.
 *   - IQ4 levels are signed: |v| goes in unsigned and the activation is
 *     negated where v < 0 (level index bit 3 clear), as vpsignb does on
 *     AVX2 (|a| <= 127 for Q8_0 and Q8_K, so the negation is exact).
 *   - IQ4_NL x Q8_0 puts two blocks in one register, even one in the low
 *     eight lanes and odd one in the high; each half is reduced to the
 *     block's exact int, which takes its fma in block order.
 *
 * Batches: each weight super-block is decoded once (levels, scales) and
 * reused for up to ROWS activation rows, which is what makes the prefill
 * products faster than AVX2's, which decode it for every row.
 *
 * Q4_K, Q5_K and Q6_K weights are packed by the backend (matmul.h) and
 * take the lane-per-row kernels below (kqp_*), with the same bits; the
 * tiles above serve the other types, the rows past a packed matrix's last
 * group of 16, and callers with the file's layout. The packed planes are
 * laid out in the order one decode row reads them: read out of order,
 * the same kernels decoded at half the speed or less (bench/results/
 * kernels-kquant-packed.md).
 */
#include "matmul_impl.h"

#ifdef CINFER_MATMUL_HAVE_AVX512

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "matmul_kquant_x86.h"

/* Activation rows sharing one decoded weight super-block. */
#define ROWS 8

#define INLINE static inline __attribute__((always_inline))

/* Lanes 8..15 added onto 0..7 (exact): the eight isum[l]. */
static inline __m256i fold(__m512i s)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

static inline const void *row_at(const void *act, size_t arb, int64_t r)
{
    return (const uint8_t *)act + (size_t)r * arb;
}

/* int16 lane j of the result: scale 2k + (j >= 16) of the eight int16
 * scales in the low 128 bits of s (32-element scales: Q4_K, Q5_K,
 * IQ4_XS), or scale 4k + j / 8 of the sixteen in the low 256 bits
 * (16-element scales: Q2_K, Q3_K, Q6_K). In-lane byte shuffles of the
 * scales' 128-bit half repeated, as vpermw costs more on AMD cores. */
static inline __m512i scales32(__m512i s, int k)
{
    const __m512i b = _mm512_broadcast_i32x4(_mm512_castsi512_si128(s));
    const long long lo = 0x0100010001000100LL * 1 + 0x0202020202020202LL * (2 * k);
    const long long hi = lo + 0x0202020202020202LL;
    return _mm512_shuffle_epi8(b, _mm512_set_epi64(hi, hi, hi, hi, lo, lo, lo, lo));
}

static inline __m512i scales16(__m512i s, int k)
{
    const __m256i s256 = _mm512_castsi512_si256(s);
    const __m128i half = k < 2 ? _mm256_castsi256_si128(s256) : _mm256_extracti128_si256(s256, 1);
    const __m512i b = _mm512_broadcast_i32x4(half);
    const long long s0 = 0x0100010001000100LL + 0x0202020202020202LL * (4 * (k % 2));
    const long long st = 0x0202020202020202LL;
    return _mm512_shuffle_epi8(b, _mm512_set_epi64(s0 + 3 * st, s0 + 3 * st, s0 + 2 * st,
                                                   s0 + 2 * st, s0 + st, s0 + st, s0, s0));
}

/* Sub-block scales sc[0..7] in bytes 0..7, mins in 8..15, from the 12
 * packed bytes (cinfer_dtype_k4_scale_min's layout) in byte shuffles:
 * j < 4: sc = q[j] & 63, m = q[j + 4] & 63; j >= 4: sc = (q[j + 4] & 15)
 * | (q[j - 4] >> 6) << 4, m = (q[j + 4] >> 4) | (q[j] >> 6) << 4. The
 * 16-byte load stays inside the block (the quants follow the scales). */
static inline __m128i k4_scales_mins(const uint8_t *scales)
{
    const __m128i q = _mm_loadu_si128((const __m128i *)scales);
    const __m128i p1 = _mm_shuffle_epi8(q, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7,
                                                         8, 9, 10, 11));
    const __m128i p2 = _mm_shuffle_epi8(q, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1,
                                                         -1, -1, 4, 5, 6, 7));
    const __m128i lo = _mm_mask_blend_epi8(
        0xF000, _mm_and_si128(p1, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63,
                                                0, 0, 0, 0)),
        _mm_and_si128(_mm_srli_epi16(p1, 4), _mm_set1_epi8(15)));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(p2, 2), _mm_set1_epi8(0x30));
    return _mm_or_si128(lo, hi);
}

/* Integer part of one row against four decoded weight registers. */
INLINE __m256i dot4(const __m512i w[4], const __m512i s[4], const int8_t *a)
{
    __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512i av = _mm512_loadu_si512((const void *)(a + 64 * k));
        acc[k % 2] = _mm512_dpwssd_epi32(acc[k % 2], _mm512_maddubs_epi16(w[k], av), s[k]);
    }
    return fold(_mm512_add_epi32(acc[0], acc[1]));
}

/* ---------------------------------------------------------------------- */
/* Q4_K and Q5_K                                                          */
/* ---------------------------------------------------------------------- */

/* Register k: sub-blocks 2k (low nibbles of qs[32k ..]) and 2k + 1 (high
 * nibbles), elements 64k .. 64k + 63 in order. */
INLINE void k4_levels(const uint8_t *qs, __m512i w[4])
{
    const __m512i m4 = _mm512_set1_epi8(0xF);
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i bits = _mm512_loadu_si512((const void *)(qs + 64 * h));
        const __m512i lo = _mm512_and_si512(bits, m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
        w[2 * h] = _mm512_shuffle_i64x2(lo, hi, 0x44);
        w[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, 0xEE);
    }
}

/* Q5_K's fifth bit: qh bit 2k for the low half of register k, 2k + 1 for
 * the high half. */
INLINE void k5_high_bits(const uint8_t *qh, __m512i w[4])
{
    const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i sixteen = _mm512_set1_epi8(16);
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m512i sel = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi8((char)(1 << (2 * k))),
                                                    _mm512_set1_epi8((char)(1 << (2 * k + 1))));
        const __mmask64 m = _mm512_test_epi8_mask(hb, sel);
        w[k] = _mm512_mask_add_epi8(w[k], m, w[k], sixteen);
    }
}

INLINE void tile_q45_k(cinfer_dtype wt, const void *wrow, const void *act, size_t arb,
                       int64_t nb, int rt, float *out, int64_t out_stride)
{
    __m256 acc[ROWS];
    float summs[ROWS];
    float acc4[ROWS], accm4[ROWS]; /* Q4_K's two scalars per row */
    for (int r = 0; r < rt; r++) {
        acc[r] = _mm256_setzero_ps();
        summs[r] = 0.0f;
        acc4[r] = accm4[r] = 0.0f;
    }
    const int q5 = wt == CINFER_DTYPE_Q5_K;
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t *hd;
        const uint8_t *scales;
        __m512i w[4], s[4];
        if (q5) {
            const cinfer_block_q5_k *x = (const cinfer_block_q5_k *)wrow + b;
            hd = &x->d;
            scales = x->scales;
            k4_levels(x->qs, w);
            k5_high_bits(x->qh, w);
        } else {
            const cinfer_block_q4_k *x = (const cinfer_block_q4_k *)wrow + b;
            hd = &x->d;
            scales = x->scales;
            k4_levels(x->qs, w);
        }
        const float xd = f16(hd[0]), xm = f16(hd[1]);
        const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins(scales));
        const __m512i sc = _mm512_castsi256_si512(sm);
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            s[k] = scales32(sc, k);
        #pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
            const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs),
                                                _mm256_extracti128_si256(bs, 1));
            const __m128i prod = _mm_madd_epi16(mins, bs32);
            if (!q5) {
                /* matmul_kquant.c's Q4_K order: exact ints, two scalars */
                const int imin = hsum4_epi32(prod);
                const int isum = hsum8_epi32(dot4(w, s, y->qs));
                acc4[r] = fmaf((float)isum, xd * y->d, acc4[r]);
                accm4[r] = fmaf((float)imin, xm * y->d, accm4[r]);
                continue;
            }
            const float d = y->d * xd, dmin = -y->d * xm;
            summs[r] = fmaf(dmin, (float)hsum4_epi32(prod), summs[r]);
            const __m256i isum = dot4(w, s, y->qs);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        out[r * out_stride] = q5 ? hsum8(acc[r]) + summs[r] : acc4[r] - accm4[r];
}

/* ---------------------------------------------------------------------- */
/* Q6_K                                                                   */
/* ---------------------------------------------------------------------- */

/* Register k: parts 2k, 2k + 1 (elements 64k ..): ql[64h ..] (h = k / 2)
 * low nibbles for k even, high for k odd, and two qh bits each. */
INLINE void q6_levels(const cinfer_block_q6_k *x, __m512i w[4])
{
    const __m512i m15 = _mm512_set1_epi8(15);
    /* qh bits of parts 0..3 of a half: masks 3, 12, 48, 192 moved to bit 4 */
    const __m512i mlo = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi8(3), _mm512_set1_epi8(12));
    const __m512i mhi = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi8(48), _mm512_set1_epi8(-64));
    const __m512i shl = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m512i shr = _mm512_mask_blend_epi64(0xF0, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i l = _mm512_loadu_si512((const void *)(x->ql + 64 * h));
        const __m512i bh =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qh + 32 * h)));
        w[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m15),
                                   _mm512_sllv_epi16(_mm512_and_si512(bh, mlo), shl));
        w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m15),
                                       _mm512_srlv_epi16(_mm512_and_si512(bh, mhi), shr));
    }
}

INLINE void tile_q6_k(const void *wrow, const void *act, size_t arb, int64_t nb, int rt,
                      float *out, int64_t out_stride)
{
    __m256 acc[ROWS];
    for (int r = 0; r < rt; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const cinfer_block_q6_k *x = (const cinfer_block_q6_k *)wrow + b;
        __m512i w[4], s[4];
        q6_levels(x, w);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
        const __m512i sc = _mm512_castsi256_si512(sc16);
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            s[k] = scales16(sc, k);
        const float xd = f16(x->d);
        #pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
            const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
            const __m256i isum = _mm256_sub_epi32(dot4(w, s, y->qs), sub);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * xd), _mm256_cvtepi32_ps(isum), acc[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        out[r * out_stride] = hsum8(acc[r]);
}

/* ---------------------------------------------------------------------- */
/* Q2_K and Q3_K                                                          */
/* ---------------------------------------------------------------------- */

/* Register k: parts 2k, 2k + 1, the 2-bit fields of qs[32 (k / 2) ..] at
 * shifts 4 (k % 2) and 4 (k % 2) + 2. */
INLINE void q2_levels(const uint8_t *qs, __m512i w[4])
{
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i sh0 = _mm512_mask_blend_epi64(0xF0, _mm512_setzero_si512(), _mm512_set1_epi16(2));
    const __m512i sh1 = _mm512_add_epi16(sh0, _mm512_set1_epi16(4));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i bits =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
        w[2 * h] = _mm512_and_si512(_mm512_srlv_epi16(bits, sh0), m3);
        w[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi16(bits, sh1), m3);
    }
}

INLINE void tile_q2_k(const void *wrow, const void *act, size_t arb, int64_t nb, int rt,
                      float *out, int64_t out_stride)
{
    float acc[ROWS], accm[ROWS];
    for (int r = 0; r < rt; r++)
        acc[r] = accm[r] = 0.0f;
    const __m128i m4 = _mm_set1_epi8(0xF);
    for (int64_t b = 0; b < nb; b++) {
        const cinfer_block_q2_k *x = (const cinfer_block_q2_k *)wrow + b;
        __m512i w[4], s[4];
        q2_levels(x->qs, w);
        const __m128i ms = _mm_loadu_si128((const __m128i *)x->scales);
        const __m256i mn16 = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16(ms, 4), m4));
        const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_and_si128(ms, m4)));
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            s[k] = scales16(sc, k);
        const float xd = f16(x->d), xm = f16(x->dmin);
        #pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            const __m256i prod =
                _mm256_madd_epi16(mn16, _mm256_loadu_si256((const __m256i *)y->bsums));
            const __m256i isum = dot4(w, s, y->qs);
            /* one exact int each per super-block (ggml's repacked gemv) */
            acc[r] = fmaf((float)hsum8_epi32(isum), xd * y->d, acc[r]);
            accm[r] = fmaf((float)hsum8_epi32(prod), xm * y->d, accm[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        out[r * out_stride] = acc[r] - accm[r];
}

/* The 16 6-bit Q3_K scales minus 32, as bytes (GGML's unpacking). */
static inline __m128i q3k_scales(const uint8_t *scales)
{
    uint32_t aux[3];
    memcpy(aux, scales, 12);
    const uint32_t m2 = 0x03030303u, m4 = 0x0f0f0f0fu;
    const __m128i s = _mm_set_epi32((int)(((aux[1] >> 4) & m4) | (((aux[2] >> 6) & m2) << 4)),
                                    (int)(((aux[0] >> 4) & m4) | (((aux[2] >> 4) & m2) << 4)),
                                    (int)((aux[1] & m4) | (((aux[2] >> 2) & m2) << 4)),
                                    (int)((aux[0] & m4) | ((aux[2] & m2) << 4)));
    return _mm_sub_epi8(s, _mm_set1_epi8(32));
}

/* Q3_K weights q - 4 (signed, -4..3) against activations a + 128 (a ^
 * 0x80, unsigned): the accumulator starts at -128 * sum(q - 4) * scale,
 * computed once per super-block for the batch. */
INLINE void tile_q3_k(const void *wrow, const void *act, size_t arb, int64_t nb, int rt,
                      float *out, int64_t out_stride)
{
    __m256 acc[ROWS];
    for (int r = 0; r < rt; r++)
        acc[r] = _mm256_setzero_ps();
    const __m512i four = _mm512_set1_epi8(4), bias = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++) {
        const cinfer_block_q3_k *x = (const cinfer_block_q3_k *)wrow + b;
        __m512i w[4], s[4];
        q2_levels(x->qs, w);
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->hmask));
        const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(q3k_scales(x->scales)));
        const float xd = f16(x->d);
        if (rt == 1) {
            /* one row: (q - 4) a as q2 a - 4 (1 - h) a (AVX2's form), no
             * per-block correction to amortise */
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)act + b;
            __m512i si = _mm512_setzero_si512();
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i sel = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi8((char)(1 << (2 * k))),
                                                            _mm512_set1_epi8((char)(1 << (2 * k + 1))));
                const __m512i h4 = _mm512_maskz_mov_epi8(_mm512_testn_epi8_mask(hb, sel), four);
                const __m512i av = _mm512_loadu_si512((const void *)(y->qs + 64 * k));
                const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(w[k], av),
                                                   _mm512_maddubs_epi16(h4, av));
                si = _mm512_dpwssd_epi32(si, p, scales16(sc, k));
            }
            acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * xd), _mm256_cvtepi32_ps(fold(si)), acc[0]);
            continue;
        }
        __m512i corr = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i sel = _mm512_mask_blend_epi64(
                0xF0, _mm512_set1_epi8((char)(1 << (2 * k))), _mm512_set1_epi8((char)(1 << (2 * k + 1))));
            const __mmask64 clear = _mm512_testn_epi8_mask(hb, sel);
            w[k] = _mm512_mask_sub_epi8(w[k], clear, w[k], four);
            s[k] = scales16(sc, k);
            corr = _mm512_dpwssd_epi32(corr, _mm512_maddubs_epi16(bias, w[k]), s[k]);
        }
        const __m512i init = _mm512_sub_epi32(_mm512_setzero_si512(), corr);
        #pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            __m512i si = init;
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i av = _mm512_xor_si512(
                    _mm512_loadu_si512((const void *)(y->qs + 64 * k)), bias);
                si = _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(av, w[k]), s[k]);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * xd), _mm256_cvtepi32_ps(fold(si)), acc[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        out[r * out_stride] = hsum8(acc[r]);
}

/* ---------------------------------------------------------------------- */
/* IQ4_XS and IQ4_NL                                                      */
/* ---------------------------------------------------------------------- */

/* 128-bit lanes [lo, lo, hi, hi] of 32 nibble bytes as level indices:
 * lanes 0 and 2 the low nibbles, 1 and 3 the high ones, so each 32-byte
 * half is one 32-element block in Q4_0's order. |level| in w, and in neg
 * the lanes whose level is negative (index bit 3 clear). */
INLINE __m512i iq4_abs(__m512i twice, __mmask64 *neg)
{
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i sh = _mm512_mask_blend_epi64(0xCC, _mm512_setzero_si512(), _mm512_set1_epi16(4));
    const __m512i absval = _mm512_broadcast_i32x4(_mm_setr_epi8(
        127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
    const __m512i idx = _mm512_and_si512(_mm512_srlv_epi16(twice, sh), m4);
    *neg = _mm512_testn_epi8_mask(idx, _mm512_set1_epi8(8));
    return _mm512_shuffle_epi8(absval, idx);
}

INLINE void tile_iq4_xs(const void *wrow, const void *act, size_t arb, int64_t nb, int rt,
                        float *out, int64_t out_stride)
{
    __m256 acc[ROWS];
    for (int r = 0; r < rt; r++)
        acc[r] = _mm256_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t b = 0; b < nb; b++) {
        const cinfer_block_iq4_xs *x = (const cinfer_block_iq4_xs *)wrow + b;
        __m512i w[4], s[4];
        __mmask64 neg[4];
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i q = _mm512_loadu_si512((const void *)(x->qs + 64 * h));
            w[2 * h] = iq4_abs(_mm512_shuffle_i64x2(q, q, 0x50), &neg[2 * h]);
            w[2 * h + 1] = iq4_abs(_mm512_shuffle_i64x2(q, q, 0xFA), &neg[2 * h + 1]);
        }
        /* ls_j - 32: nibble j of scales_l, bits 2j.. of scales_h */
        uint32_t sl;
        memcpy(&sl, x->scales_l, 4);
        const __m256i lo = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
            _mm256_set1_epi32(15));
        const __m256i hi = _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(x->scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
            _mm256_set1_epi32(3));
        const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)),
                                            _mm256_set1_epi32(32));
        const __m512i sc = _mm512_castsi128_si512(_mm256_cvtepi32_epi16(ls));
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            s[k] = scales32(sc, k);
        const float xd = f16(x->d);
        #pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            __m512i si = zero;
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i av = _mm512_loadu_si512((const void *)(y->qs + 64 * k));
                av = _mm512_mask_sub_epi8(av, neg[k], zero, av);
                si = _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(w[k], av), s[k]);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(xd * y->d), _mm256_cvtepi32_ps(fold(si)), acc[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        out[r * out_stride] = hsum8(acc[r]);
}

/* IQ4_NL: blocks b (low 256 bits) and b + 1 (high) of a weight row. */
INLINE __m512i iq4_nl_pair(const cinfer_block_iq4_nl *x, __mmask64 *neg)
{
    const __m256i b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x[0].qs));
    const __m256i b1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)x[1].qs));
    return iq4_abs(_mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1), neg);
}

INLINE void tile_iq4_nl(const void *wrow, const void *act, size_t arb, int64_t nb, int rt,
                        float *out, int64_t out_stride)
{
    const cinfer_block_iq4_nl *x = wrow;
    float res[ROWS];
    for (int r = 0; r < rt; r++)
        res[r] = 0.0f;
    const __m512i zero = _mm512_setzero_si512();
    int64_t b = 0;
    /* eight blocks at a time: their exact ints come out of one reduction
     * tree (8 x 8 lanes -> 8 sums), then take their fmas in block order */
    for (; b + 7 < nb; b += 8) {
        __m512i w[4];
        __mmask64 neg[4];
        float xd[8];
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            w[k] = iq4_nl_pair(x + b + 2 * k, &neg[k]);
        for (int k = 0; k < 8; k++)
            xd[k] = f16(x[b + k].d);
        #pragma GCC unroll 2
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_0 *y = (const cinfer_block_q8_0 *)row_at(act, arb, r) + b;
            __m256i v[8];
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i av = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[2 * k].qs)),
                    _mm256_loadu_si256((const __m256i *)y[2 * k + 1].qs), 1);
                av = _mm512_mask_sub_epi8(av, neg[k], zero, av);
                const __m512i si = _mm512_dpbusd_epi32(zero, w[k], av);
                v[2 * k] = _mm512_castsi512_si256(si);
                v[2 * k + 1] = _mm512_extracti64x4_epi64(si, 1);
            }
            int32_t is[8];
            hsum8x8_epi32(v, is);
            float acc = res[r];
            for (int k = 0; k < 8; k++)
                acc = fmaf((float)is[k], xd[k] * f16(y[k].d), acc);
            res[r] = acc;
        }
    }
    for (; b + 1 < nb; b += 2) {
        __mmask64 neg;
        const __m512i w = iq4_nl_pair(x + b, &neg);
        const float xd0 = f16(x[b].d), xd1 = f16(x[b + 1].d);
        #pragma GCC unroll 8
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_0 *y = (const cinfer_block_q8_0 *)row_at(act, arb, r) + b;
            __m512i av = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[0].qs)),
                _mm256_loadu_si256((const __m256i *)y[1].qs), 1);
            av = _mm512_mask_sub_epi8(av, neg, zero, av);
            const __m512i si = _mm512_dpbusd_epi32(zero, w, av);
            /* one exact int per block, then one fma each, in order */
            const int s0 = _mm512_mask_reduce_add_epi32(0x00FF, si);
            const int s1 = _mm512_mask_reduce_add_epi32(0xFF00, si);
            res[r] = fmaf((float)s0, xd0 * f16(y[0].d), res[r]);
            res[r] = fmaf((float)s1, xd1 * f16(y[1].d), res[r]);
        }
    }
    if (b < nb) {
        /* an odd last block, the same way */
        const __m256i m4 = _mm256_set1_epi8(0xF);
        const __m128i bits = _mm_loadu_si128((const __m128i *)x[b].qs);
        const __m256i raw = _mm256_setr_m128i(bits, _mm_srli_epi16(bits, 4));
        const __m256i idx = _mm256_and_si256(raw, m4);
        const __m256i absval = _mm256_broadcastsi128_si256(_mm_setr_epi8(
            127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
        const __m256i w = _mm256_shuffle_epi8(absval, idx);
        const __mmask32 neg = _mm256_testn_epi8_mask(idx, _mm256_set1_epi8(8));
        const float xd = f16(x[b].d);
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_0 *y = (const cinfer_block_q8_0 *)row_at(act, arb, r) + b;
            __m256i av = _mm256_loadu_si256((const __m256i *)y->qs);
            av = _mm256_mask_sub_epi8(av, neg, _mm256_setzero_si256(), av);
            const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, av);
            res[r] = fmaf((float)hsum8_epi32(p), xd * f16(y->d), res[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        out[r * out_stride] = res[r];
}

/* ---------------------------------------------------------------------- */
/* K-quants and IQ4 packed (matmul.h): one int32 lane per weight row     */
/* ---------------------------------------------------------------------- */

/* In the packed layout a register holds one 4-byte word of 16 weight rows,
 * so the rows' scales, mins and d are vectors too, unpacked once per
 * group block instead of once per row, and the Q8_K block sums meet the
 * mins in a few vpdpwssd for the 16 rows. Each type's kernel below says
 * its planes; Q4_K and Q5_K first (kqp_group). Word t of qs holds elements 4l ..
 * 4l + 3 (l = t % 8) of sub-blocks 2 (t / 8) (low nibbles) and 2 (t / 8) +
 * 1 (high); against the activation's same four bytes, broadcast, one
 * vpmaddubsw + vpdpwssd gives every row's sum of those four products times
 * the sub-block's scale: the isum[l] of the row order, each lane its row's.
 * Q5_K keeps its eight float accumulators per row as eight vectors (lane =
 * row) and ends in the 8-lane tree done vertically; Q4_K's two scalars per
 * row are one vector each. Same bits as tile_q45_k. */

#define KG 16 /* rows of a packed group */
#define KR 4  /* activation rows sharing a decoded group block */

/* pshufb control: int32 lane (row) k gets int16 pair (byte j0, byte j1) of
 * its own lane, zero-extended. */
static inline __m512i pair_ctl(int j0, int j1)
{
    const __m512i t = _mm512_set_epi32(0xC000C, 0x80008, 0x40004, 0, 0xC000C, 0x80008, 0x40004, 0,
                                       0xC000C, 0x80008, 0x40004, 0, 0xC000C, 0x80008, 0x40004, 0);
    return _mm512_add_epi32(t, _mm512_set1_epi32((int)(0x80008000u | (unsigned)j0 |
                                                        ((unsigned)j1 << 16))));
}

/* hsum8's tree (matmul_kquant_x86.h), lane by lane: acc[l] holds lane l
 * of the eight-lane accumulator of each of 16 rows. */
static inline __m512 hsum8_lanes(const __m512 acc[8])
{
    const __m512 u0 = _mm512_add_ps(_mm512_add_ps(acc[4], acc[0]), _mm512_add_ps(acc[6], acc[2]));
    const __m512 u1 = _mm512_add_ps(_mm512_add_ps(acc[5], acc[1]), _mm512_add_ps(acc[7], acc[3]));
    return _mm512_add_ps(u0, u1);
}

/* One packed group's rows, KR activation rows a pass, then the rest;
 * GROUP(rt, grp, nb, act, arb, out, out_stride) with rt constant. */
#define KQP_ROWS(NAME, GROUP)                                                                  \
    static void NAME(const uint8_t *grp, int64_t nb, const uint8_t *act, size_t arb,           \
                     int64_t n, float *out, int64_t out_stride)                                \
    {                                                                                          \
        int64_t r = 0;                                                                         \
        for (; r + KR <= n; r += KR)                                                           \
            GROUP(KR, grp, nb, act + (size_t)r * arb, arb, out + r * out_stride, out_stride);  \
        switch (n - r) {                                                                       \
        case 3: GROUP(3, grp, nb, act + (size_t)r * arb, arb, out + r * out_stride, out_stride); break; \
        case 2: GROUP(2, grp, nb, act + (size_t)r * arb, arb, out + r * out_stride, out_stride); break; \
        case 1: GROUP(1, grp, nb, act + (size_t)r * arb, arb, out + r * out_stride, out_stride); break; \
        default: break;                                                                        \
        }                                                                                      \
    }

INLINE void kqp_group(const int q5, const int rt, const uint8_t *grp, int64_t nb, size_t bb,
                      const uint8_t *act, size_t arb, float *out, int64_t out_stride)
{
    const __m512i zero = _mm512_setzero_si512();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
    const __m512i sixteen = _mm512_set1_epi8(16);
    __m512 acc[KR][8], summs[KR];
    for (int r = 0; r < rt; r++) {
        summs[r] = _mm512_setzero_ps();
        for (int l = 0; l < 8; l++)
            acc[r][l] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = grp + (size_t)b * KG * bb;
        const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        const __m512 xm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        const __m512i p0 = _mm512_loadu_si512((const void *)(gb + 64));
        const __m512i p1 = _mm512_loadu_si512((const void *)(gb + 128));
        const __m512i p2 = _mm512_loadu_si512((const void *)(gb + 192));
        /* the k4 6-bit fields (k4_scales_mins), byte j of each row's lane */
        const __m512i scl = _mm512_and_si512(p0, m6);
        const __m512i sch = _mm512_or_si512(_mm512_and_si512(p2, m4),
                                            _mm512_and_si512(_mm512_srli_epi16(p0, 2), m30));
        const __m512i mnl = _mm512_and_si512(p1, m6);
        const __m512i mnh = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p2, 4), m4),
                                            _mm512_and_si512(_mm512_srli_epi16(p1, 2), m30));
        __m512i s[8];
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            s[j] = _mm512_shuffle_epi8(scl, pair_ctl(j, j));
            s[j + 4] = _mm512_shuffle_epi8(sch, pair_ctl(j, j));
        }
        const __m512i mp[4] = {_mm512_shuffle_epi8(mnl, pair_ctl(0, 1)),
                               _mm512_shuffle_epi8(mnl, pair_ctl(2, 3)),
                               _mm512_shuffle_epi8(mnh, pair_ctl(0, 1)),
                               _mm512_shuffle_epi8(mnh, pair_ctl(2, 3))};
        const int8_t *aq[KR];
        __m512 dr[KR];
        __m512i itot[KR];
        #pragma GCC unroll 4
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
            int32_t bp[4];
            _mm_storeu_si128((__m128i *)bp, _mm_hadd_epi16(_mm256_castsi256_si128(bs),
                                                           _mm256_extracti128_si256(bs, 1)));
            __m512i im = zero;
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                im = _mm512_dpwssd_epi32(im, mp[p], _mm512_set1_epi32(bp[p]));
            const __m512 imf = _mm512_cvtepi32_ps(im);
            if (q5) {
                summs[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-y->d), xm), imf, summs[r]);
                dr[r] = _mm512_mul_ps(_mm512_set1_ps(y->d), xd);
            } else {
                /* Q4_K: accm4 in summs, acc4 in acc[r][0] */
                summs[r] = _mm512_fmadd_ps(imf, _mm512_mul_ps(xm, _mm512_set1_ps(y->d)), summs[r]);
                dr[r] = _mm512_mul_ps(xd, _mm512_set1_ps(y->d));
            }
            aq[r] = y->qs;
            itot[r] = zero;
        }
        const uint8_t *qh = gb + 256, *qs = gb + (q5 ? 768 : 256);
        if (rt == 1) {
            /* one row (decode): the words in memory order, eight
             * independent isum[l] chains */
            __m512i isum[8];
            #pragma GCC unroll 8
            for (int l = 0; l < 8; l++)
                isum[l] = zero;
            #pragma GCC unroll 4
            for (int j2 = 0; j2 < 4; j2++) {
                #pragma GCC unroll 8
                for (int l = 0; l < 8; l++) {
                    const __m512i q = _mm512_loadu_si512((const void *)(qs + 64 * (8 * j2 + l)));
                    __m512i w0 = _mm512_and_si512(q, m4);
                    __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    if (q5) {
                        const __m512i hb = _mm512_loadu_si512((const void *)(qh + 64 * l));
                        w0 = _mm512_mask_add_epi8(w0, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << (2 * j2)))),
                                                  w0, sixteen);
                        w1 = _mm512_mask_add_epi8(w1, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << (2 * j2 + 1)))),
                                                  w1, sixteen);
                    }
                    int32_t a0, a1;
                    memcpy(&a0, aq[0] + 64 * j2 + 4 * l, 4);
                    memcpy(&a1, aq[0] + 64 * j2 + 32 + 4 * l, 4);
                    isum[l] = _mm512_dpwssd_epi32(isum[l], _mm512_maddubs_epi16(w0, _mm512_set1_epi32(a0)),
                                                  s[2 * j2]);
                    isum[l] = _mm512_dpwssd_epi32(isum[l], _mm512_maddubs_epi16(w1, _mm512_set1_epi32(a1)),
                                                  s[2 * j2 + 1]);
                }
            }
            if (q5) {
                #pragma GCC unroll 8
                for (int l = 0; l < 8; l++)
                    acc[0][l] = _mm512_fmadd_ps(dr[0], _mm512_cvtepi32_ps(isum[l]), acc[0][l]);
            } else {
                const __m512i t = _mm512_add_epi32(
                    _mm512_add_epi32(_mm512_add_epi32(isum[0], isum[1]), _mm512_add_epi32(isum[2], isum[3])),
                    _mm512_add_epi32(_mm512_add_epi32(isum[4], isum[5]), _mm512_add_epi32(isum[6], isum[7])));
                acc[0][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), dr[0], acc[0][0]);
            }
            continue;
        }
        #pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            __m512i hb = zero, isum[KR];
            if (q5)
                hb = _mm512_loadu_si512((const void *)(qh + 64 * l));
            for (int r = 0; r < rt; r++)
                isum[r] = zero;
            #pragma GCC unroll 4
            for (int j2 = 0; j2 < 4; j2++) {
                const __m512i q = _mm512_loadu_si512((const void *)(qs + 64 * (8 * j2 + l)));
                __m512i w0 = _mm512_and_si512(q, m4);
                __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                if (q5) {
                    w0 = _mm512_mask_add_epi8(w0, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << (2 * j2)))),
                                              w0, sixteen);
                    w1 = _mm512_mask_add_epi8(w1, _mm512_test_epi8_mask(hb, _mm512_set1_epi8((char)(1 << (2 * j2 + 1)))),
                                              w1, sixteen);
                }
                #pragma GCC unroll 4
                for (int r = 0; r < rt; r++) {
                    int32_t a0, a1;
                    memcpy(&a0, aq[r] + 64 * j2 + 4 * l, 4);
                    memcpy(&a1, aq[r] + 64 * j2 + 32 + 4 * l, 4);
                    isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(w0, _mm512_set1_epi32(a0)),
                                                  s[2 * j2]);
                    isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(w1, _mm512_set1_epi32(a1)),
                                                  s[2 * j2 + 1]);
                }
            }
            #pragma GCC unroll 4
            for (int r = 0; r < rt; r++) {
                if (q5)
                    acc[r][l] = _mm512_fmadd_ps(dr[r], _mm512_cvtepi32_ps(isum[r]), acc[r][l]);
                else
                    itot[r] = _mm512_add_epi32(itot[r], isum[r]); /* exact */
            }
        }
        if (!q5)
            for (int r = 0; r < rt; r++)
                acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(itot[r]), dr[r], acc[r][0]);
    }
    for (int r = 0; r < rt; r++) {
        __m512 v;
        if (q5) {
            v = _mm512_add_ps(hsum8_lanes(acc[r]), summs[r]);
        } else {
            v = _mm512_sub_ps(acc[r][0], summs[r]);
        }
        _mm512_storeu_ps(out + r * out_stride, v);
    }
}

/* pshufb control: int32 lane (row) k gets int16 pair (byte j0 << 8, byte
 * j1 << 8) of its own lane; an arithmetic shift right by 8 then
 * sign-extends the bytes (Q6_K's scales are signed). */
static inline __m512i pair_ctl_hi(int j0, int j1)
{
    const __m512i t = _mm512_set_epi32(0xC000C00, 0x8000800, 0x4000400, 0, 0xC000C00, 0x8000800,
                                       0x4000400, 0, 0xC000C00, 0x8000800, 0x4000400, 0,
                                       0xC000C00, 0x8000800, 0x4000400, 0);
    return _mm512_add_epi32(t, _mm512_set1_epi32((int)(0x00800080u | ((unsigned)j0 << 8) |
                                                        ((unsigned)j1 << 24))));
}

/* Where ql words 16n + l, 16n + 8 + l and qh word 8n + l (l = 4h + j) of
 * a packed Q6_K group block are: three planes side by side. */
static inline const uint8_t *q6p_plane(const uint8_t *gb, int h, int n, int j)
{
    return gb + 64 * (4 + 3 * ((2 * h + n) * 4 + j));
}

/* Q6_K's four parts 4n .. 4n + 3 at elements 4l .. 4l + 3, from the ql
 * words (a, b) and qh word (h) at pl: q6_levels' fields, one row a lane. */
INLINE void q6p_levels(const uint8_t *pl, __m512i w[4])
{
    const __m512i a = _mm512_loadu_si512((const void *)pl);
    const __m512i b = _mm512_loadu_si512((const void *)(pl + 64));
    const __m512i h = _mm512_loadu_si512((const void *)(pl + 128));
    const __m512i m15 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    w[0] = _mm512_or_si512(_mm512_and_si512(a, m15), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30));
    w[1] = _mm512_or_si512(_mm512_and_si512(b, m15), _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
    w[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(a, 4), m15), _mm512_and_si512(h, m30));
    w[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(b, 4), m15),
                           _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
}

/* Q6_K packed: scale planes 0..3, the quant planes in reading order
 * (matmul.h; q6p_plane), then d.
 * isum[l] starts at -32 (sc[2l] bs[2l] + sc[2l + 1] bs[2l + 1]), the
 * lane's correction in tile_q6_k; same bits as tile_q6_k. */
INLINE void kqp_group6(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                       size_t arb, float *out, int64_t out_stride)
{
    const size_t gbb = KG * sizeof(cinfer_block_q6_k);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[KR][8];
    for (int r = 0; r < rt; r++)
        for (int l = 0; l < 8; l++)
            acc[r][l] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = grp + (size_t)b * gbb;
        const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 64 * 52)));
        __m512i pl[4];
        #pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            pl[q] = _mm512_loadu_si512((const void *)(gb + 64 * q));
        const int8_t *aq[KR];
        const uint8_t *bsp[KR];
        __m512 dr[KR];
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            aq[r] = y->qs;
            bsp[r] = (const uint8_t *)y->bsums;
            dr[r] = _mm512_mul_ps(_mm512_set1_ps(y->d), xd);
        }
        /* lanes l = 4h .. 4h + 3 share the scales sc[2p + h] of parts p */
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i sh[8];
            #pragma GCC unroll 8
            for (int p = 0; p < 8; p++)
                sh[p] = _mm512_srai_epi16(
                    _mm512_shuffle_epi8(pl[(2 * p + h) / 4], pair_ctl_hi((2 * p + h) % 4, (2 * p + h) % 4)), 8);
            if (rt == 1) {
                /* one row (decode): four isum chains, one per lane */
                __m512i isum[4];
                #pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const int l = 4 * h + i;
                    const __m512i subp = _mm512_srai_epi16(
                        _mm512_shuffle_epi8(pl[l / 2], pair_ctl_hi(2 * (l % 2), 2 * (l % 2) + 1)), 8);
                    int32_t bs;
                    memcpy(&bs, bsp[0] + 4 * l, 4);
                    isum[i] = _mm512_sub_epi32(
                        zero, _mm512_slli_epi32(_mm512_dpwssd_epi32(zero, subp, _mm512_set1_epi32(bs)), 5));
                }
                #pragma GCC unroll 2
                for (int n = 0; n < 2; n++) {
                    #pragma GCC unroll 4
                    for (int i = 0; i < 4; i++) {
                        const int l = 4 * h + i;
                        __m512i w[4];
                        q6p_levels(q6p_plane(gb, h, n, i), w);
                        #pragma GCC unroll 4
                        for (int m = 0; m < 4; m++) {
                            const int p = 4 * n + m;
                            int32_t a;
                            memcpy(&a, aq[0] + 32 * p + 4 * l, 4);
                            isum[i] = _mm512_dpwssd_epi32(
                                isum[i], _mm512_maddubs_epi16(w[m], _mm512_set1_epi32(a)), sh[p]);
                        }
                    }
                }
                #pragma GCC unroll 4
                for (int i = 0; i < 4; i++)
                    acc[0][4 * h + i] =
                        _mm512_fmadd_ps(dr[0], _mm512_cvtepi32_ps(isum[i]), acc[0][4 * h + i]);
                continue;
            }
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int l = 4 * h + i;
                const __m512i subp = _mm512_srai_epi16(
                    _mm512_shuffle_epi8(pl[l / 2], pair_ctl_hi(2 * (l % 2), 2 * (l % 2) + 1)), 8);
                __m512i isum[KR];
                #pragma GCC unroll 4
                for (int r = 0; r < rt; r++) {
                    int32_t bs;
                    memcpy(&bs, bsp[r] + 4 * l, 4);
                    isum[r] = _mm512_sub_epi32(
                        zero, _mm512_slli_epi32(_mm512_dpwssd_epi32(zero, subp, _mm512_set1_epi32(bs)), 5));
                }
                #pragma GCC unroll 2
                for (int n = 0; n < 2; n++) {
                    __m512i w[4];
                    q6p_levels(q6p_plane(gb, h, n, i), w);
                    #pragma GCC unroll 4
                    for (int m = 0; m < 4; m++) {
                        const int p = 4 * n + m;
                        #pragma GCC unroll 4
                        for (int r = 0; r < rt; r++) {
                            int32_t a;
                            memcpy(&a, aq[r] + 32 * p + 4 * l, 4);
                            isum[r] = _mm512_dpwssd_epi32(
                                isum[r], _mm512_maddubs_epi16(w[m], _mm512_set1_epi32(a)), sh[p]);
                        }
                    }
                }
                #pragma GCC unroll 4
                for (int r = 0; r < rt; r++)
                    acc[r][l] = _mm512_fmadd_ps(dr[r], _mm512_cvtepi32_ps(isum[r]), acc[r][l]);
            }
        }
    }
    for (int r = 0; r < rt; r++)
        _mm512_storeu_ps(out + r * out_stride, hsum8_lanes(acc[r]));
}

/* Q2_K packed: d and dmin, scale planes 1..4 (sc | m << 4 per 16-element
 * sub-block), then qs planes 5..20. Qs word t, shift 2m holds elements
 * 128 (t / 8) + 32m + 4 (t % 8) .. + 3, sub-block 8 (t / 8) + 2m + (t % 8
 * >= 4). One exact int per row and super-block (ggml's repacked gemv
 * order, tile_q2_k); same bits. */
INLINE void kqp_group2(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                       size_t arb, float *out, int64_t out_stride)
{
    const size_t gbb = KG * sizeof(cinfer_block_q2_k);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    __m512 acc[KR], accm[KR];
    for (int r = 0; r < rt; r++)
        acc[r] = accm[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = grp + (size_t)b * gbb;
        const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        const __m512 xm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        __m512i sv[16], mp[8];
        #pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const __m512i pq = _mm512_loadu_si512((const void *)(gb + 64 * (1 + q)));
            const __m512i sc = _mm512_and_si512(pq, m4);
            const __m512i mn = _mm512_and_si512(_mm512_srli_epi16(pq, 4), m4);
            #pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                sv[4 * q + j] = _mm512_shuffle_epi8(sc, pair_ctl(j, j));
            mp[2 * q] = _mm512_shuffle_epi8(mn, pair_ctl(0, 1));
            mp[2 * q + 1] = _mm512_shuffle_epi8(mn, pair_ctl(2, 3));
        }
        const int8_t *aq[KR];
        __m512 dd[KR];
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            __m512i im = zero;
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                int32_t bs;
                memcpy(&bs, (const uint8_t *)y->bsums + 4 * i, 4);
                im = _mm512_dpwssd_epi32(im, mp[i], _mm512_set1_epi32(bs));
            }
            accm[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(xm, _mm512_set1_ps(y->d)),
                                      accm[r]);
            dd[r] = _mm512_mul_ps(xd, _mm512_set1_ps(y->d));
            aq[r] = y->qs;
        }
        /* two chains a row (eight for one row), summed exactly */
        __m512i isum[KR][8];
        const int nc = rt == 1 ? 8 : 2;
        for (int r = 0; r < rt; r++)
            for (int c = 0; c < nc; c++)
                isum[r][c] = zero;
        #pragma GCC unroll 16
        for (int t = 0; t < 16; t++) {
            const __m512i q = _mm512_loadu_si512((const void *)(gb + 64 * (5 + t)));
            const int n = t / 8, u = t % 8, c = rt == 1 ? u : u >= 4;
            #pragma GCC unroll 4
            for (int m = 0; m < 4; m++) {
                const __m512i w = _mm512_and_si512(_mm512_srli_epi16(q, 2 * m), m3);
                const __m512i s = sv[8 * n + 2 * m + (u >= 4)];
                #pragma GCC unroll 4
                for (int r = 0; r < rt; r++) {
                    int32_t a;
                    memcpy(&a, aq[r] + 128 * n + 32 * m + 4 * u, 4);
                    isum[r][c] = _mm512_dpwssd_epi32(
                        isum[r][c], _mm512_maddubs_epi16(w, _mm512_set1_epi32(a)), s);
                }
            }
        }
        for (int r = 0; r < rt; r++) {
            __m512i tot = isum[r][0];
            for (int c = 1; c < nc; c++)
                tot = _mm512_add_epi32(tot, isum[r][c]); /* exact */
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), dd[r], acc[r]);
        }
    }
    for (int r = 0; r < rt; r++)
        _mm512_storeu_ps(out + r * out_stride, _mm512_sub_ps(acc[r], accm[r]));
}

/* |level| of the low (hf 0) or high (hf 1) nibbles of a packed IQ4 plane,
 * and in *neg the bytes whose level is negative (iq4_abs, one row a lane). */
static inline __m512i iq4p_abs(__m512i q, int hf, __mmask64 *neg)
{
    const __m512i absval = _mm512_broadcast_i32x4(_mm_setr_epi8(
        127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
    const __m512i idx = _mm512_and_si512(hf ? _mm512_srli_epi16(q, 4) : q, _mm512_set1_epi8(0x0F));
    *neg = _mm512_testn_epi8_mask(idx, _mm512_set1_epi8(8));
    return _mm512_shuffle_epi8(absval, idx);
}

/* IQ4_XS packed: d and scales_h planes, the scales_l plane, then qs planes
 * 1..32: qs word t holds elements 32 (t / 4) + 4 (t % 4) .. + 3 (low
 * nibbles, lane l = t % 4) and the same + 16 (high, lane 4 + t % 4). The
 * levels go in as |v| against the activation negated where v < 0, as in
 * tile_iq4_xs; same bits. */
INLINE void kqp_group_xs(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                         size_t arb, float *out, int64_t out_stride)
{
    const size_t gbb = KG * sizeof(cinfer_block_iq4_xs);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[KR][8];
    for (int r = 0; r < rt; r++)
        for (int l = 0; l < 8; l++)
            acc[r][l] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = grp + (size_t)b * gbb;
        const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        const __m512i sh = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gb + 32)));
        const __m512i sl = _mm512_loadu_si512((const void *)(gb + 64));
        __m512i sv[8];
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            /* ls_j - 32 as the int16 pair (s, s) */
            const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(sl, 8 * (j / 2) + 4 * (j % 2)),
                                                _mm512_set1_epi32(15));
            const __m512i hi = _mm512_slli_epi32(
                _mm512_and_si512(_mm512_srli_epi32(sh, 2 * j), _mm512_set1_epi32(3)), 4);
            const __m512i v = _mm512_sub_epi32(_mm512_or_si512(lo, hi), _mm512_set1_epi32(32));
            sv[j] = _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)),
                                    _mm512_slli_epi32(v, 16));
        }
        const int8_t *aq[KR];
        __m512 dr[KR];
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            aq[r] = y->qs;
            dr[r] = _mm512_mul_ps(xd, _mm512_set1_ps(y->d));
        }
        if (rt == 1) {
            /* one row: planes in memory order, eight isum[l] chains */
            __m512i isum[8];
            #pragma GCC unroll 8
            for (int l = 0; l < 8; l++)
                isum[l] = zero;
            #pragma GCC unroll 32
            for (int t = 0; t < 32; t++) {
                const __m512i q = _mm512_loadu_si512((const void *)(gb + 64 * (2 + t)));
                const int j = t / 4, v = t % 4;
                #pragma GCC unroll 2
                for (int hf = 0; hf < 2; hf++) {
                    __mmask64 neg;
                    const __m512i w = iq4p_abs(q, hf, &neg);
                    int32_t a;
                    memcpy(&a, aq[0] + 32 * j + 16 * hf + 4 * v, 4);
                    __m512i av = _mm512_set1_epi32(a);
                    av = _mm512_mask_sub_epi8(av, neg, zero, av);
                    isum[4 * hf + v] = _mm512_dpwssd_epi32(isum[4 * hf + v], _mm512_maddubs_epi16(w, av), sv[j]);
                }
            }
            #pragma GCC unroll 8
            for (int l = 0; l < 8; l++)
                acc[0][l] = _mm512_fmadd_ps(dr[0], _mm512_cvtepi32_ps(isum[l]), acc[0][l]);
            continue;
        }
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            __m512i isum[KR][2];
            for (int r = 0; r < rt; r++)
                isum[r][0] = isum[r][1] = zero;
            #pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m512i q = _mm512_loadu_si512((const void *)(gb + 64 * (2 + 4 * j + v)));
                #pragma GCC unroll 2
                for (int hf = 0; hf < 2; hf++) {
                    __mmask64 neg;
                    const __m512i w = iq4p_abs(q, hf, &neg);
                    #pragma GCC unroll 4
                    for (int r = 0; r < rt; r++) {
                        int32_t a;
                        memcpy(&a, aq[r] + 32 * j + 16 * hf + 4 * v, 4);
                        __m512i av = _mm512_set1_epi32(a);
                        av = _mm512_mask_sub_epi8(av, neg, zero, av);
                        isum[r][hf] = _mm512_dpwssd_epi32(isum[r][hf], _mm512_maddubs_epi16(w, av), sv[j]);
                    }
                }
            }
            for (int r = 0; r < rt; r++) {
                acc[r][v] = _mm512_fmadd_ps(dr[r], _mm512_cvtepi32_ps(isum[r][0]), acc[r][v]);
                acc[r][4 + v] = _mm512_fmadd_ps(dr[r], _mm512_cvtepi32_ps(isum[r][1]), acc[r][4 + v]);
            }
        }
    }
    for (int r = 0; r < rt; r++)
        _mm512_storeu_ps(out + r * out_stride, hsum8_lanes(acc[r]));
}

/* Q3_K packed: scale planes 0..2, hmask plane u at 3 + 2u and qs plane u
 * at 4 + 2u (u = 0..7), qs planes 8..15 at 19..26, then d. Qs word t, shift 2m holds elements 32p + 4u .. + 3 of part p =
 * 4 (t / 8) + m (u = t % 8, the lane), whose high bits are bit p of
 * hmask word u; scale 2p + (u >= 4). One row: (q - 4) a as q2 a - 4 (1 -
 * h) a; batches: (a + 128) (q - 4) less the weights' 128 (q - 4) s,
 * once per group block, as tile_q3_k; same bits. */
static inline const uint8_t *q3p_hm(const uint8_t *gb, int u) { return gb + 64 * (3 + 2 * u); }

static inline const uint8_t *q3p_qs(const uint8_t *gb, int t)
{
    return gb + 64 * (t < 8 ? 4 + 2 * t : 11 + t);
}

INLINE void kqp_group3(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                       size_t arb, float *out, int64_t out_stride)
{
    const size_t gbb = KG * sizeof(cinfer_block_q3_k);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 acc[KR][8];
    for (int r = 0; r < rt; r++)
        for (int l = 0; l < 8; l++)
            acc[r][l] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = grp + (size_t)b * gbb;
        const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gb + 64 * 27)));
        /* GGML's 6-bit unpacking of the 16 scales, word by word, minus 32 */
        const __m512i w0 = _mm512_loadu_si512((const void *)gb);
        const __m512i w1 = _mm512_loadu_si512((const void *)(gb + 64));
        const __m512i w2 = _mm512_loadu_si512((const void *)(gb + 128));
        const __m512i k2 = _mm512_set1_epi32(0x03030303), k4 = _mm512_set1_epi32(0x0f0f0f0f);
        const __m512i s32 = _mm512_set1_epi8(32);
        const __m512i sp[4] = {
            _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(w0, k4),
                                            _mm512_slli_epi32(_mm512_and_si512(w2, k2), 4)), s32),
            _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(w1, k4),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 2), k2), 4)), s32),
            _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w0, 4), k4),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 4), k2), 4)), s32),
            _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w1, 4), k4),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 6), k2), 4)), s32)};
        __m512i sv[16];
        #pragma GCC unroll 16
        for (int c = 0; c < 16; c++)
            sv[c] = _mm512_srai_epi16(_mm512_shuffle_epi8(sp[c / 4], pair_ctl_hi(c % 4, c % 4)), 8);
        const int8_t *aq[KR];
        __m512 dr[KR];
        for (int r = 0; r < rt; r++) {
            const cinfer_block_q8_k *y = (const cinfer_block_q8_k *)row_at(act, arb, r) + b;
            aq[r] = y->qs;
            dr[r] = _mm512_mul_ps(_mm512_set1_ps(y->d), xd);
        }
        if (rt == 1) {
            __m512i isum[8];
            #pragma GCC unroll 8
            for (int u = 0; u < 8; u++)
                isum[u] = zero;
            #pragma GCC unroll 16
            for (int t = 0; t < 16; t++) {
                const int n = t / 8, u = t % 8;
                const __m512i q = _mm512_loadu_si512((const void *)q3p_qs(gb, t));
                const __m512i hb = _mm512_loadu_si512((const void *)q3p_hm(gb, u));
                #pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    const int p = 4 * n + m;
                    const __m512i w = _mm512_and_si512(_mm512_srli_epi16(q, 2 * m), m3);
                    const __m512i h4 = _mm512_maskz_mov_epi8(
                        _mm512_testn_epi8_mask(hb, _mm512_set1_epi8((char)(1 << p))), four);
                    int32_t a;
                    memcpy(&a, aq[0] + 32 * p + 4 * u, 4);
                    const __m512i av = _mm512_set1_epi32(a);
                    const __m512i prod = _mm512_sub_epi16(_mm512_maddubs_epi16(w, av),
                                                          _mm512_maddubs_epi16(h4, av));
                    isum[u] = _mm512_dpwssd_epi32(isum[u], prod, sv[2 * p + (u >= 4)]);
                }
            }
            #pragma GCC unroll 8
            for (int u = 0; u < 8; u++)
                acc[0][u] = _mm512_fmadd_ps(dr[0], _mm512_cvtepi32_ps(isum[u]), acc[0][u]);
            continue;
        }
        #pragma GCC unroll 8
        for (int u = 0; u < 8; u++) {
            const __m512i hb = _mm512_loadu_si512((const void *)q3p_hm(gb, u));
            __m512i corr = zero, isum[KR];
            for (int r = 0; r < rt; r++)
                isum[r] = zero;
            #pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                const __m512i q = _mm512_loadu_si512((const void *)q3p_qs(gb, 8 * n + u));
                #pragma GCC unroll 4
                for (int m = 0; m < 4; m++) {
                    const int p = 4 * n + m;
                    const __m512i s = sv[2 * p + (u >= 4)];
                    __m512i w = _mm512_and_si512(_mm512_srli_epi16(q, 2 * m), m3);
                    w = _mm512_mask_sub_epi8(w, _mm512_testn_epi8_mask(hb, _mm512_set1_epi8((char)(1 << p))),
                                             w, four);
                    corr = _mm512_dpwssd_epi32(corr, _mm512_maddubs_epi16(bias, w), s);
                    #pragma GCC unroll 4
                    for (int r = 0; r < rt; r++) {
                        int32_t a;
                        memcpy(&a, aq[r] + 32 * p + 4 * u, 4);
                        const __m512i av = _mm512_xor_si512(_mm512_set1_epi32(a), bias);
                        isum[r] = _mm512_dpwssd_epi32(isum[r], _mm512_maddubs_epi16(av, w), s);
                    }
                }
            }
            for (int r = 0; r < rt; r++)
                acc[r][u] = _mm512_fmadd_ps(dr[r], _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r], corr)),
                                            acc[r][u]);
        }
    }
    for (int r = 0; r < rt; r++)
        _mm512_storeu_ps(out + r * out_stride, hsum8_lanes(acc[r]));
}

/* IQ4_NL packed, a group block of 32 elements: d, then qs planes 0..3:
 * word v holds elements 4v .. 4v + 3 (low nibbles) and 16 + 4v .. (high).
 * One exact int per row and block, its fma in block order (ggml's
 * repacked gemv, tile_iq4_nl); same bits. */
INLINE void kqp_group_nl(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                         size_t arb, float *out, int64_t out_stride)
{
    const size_t gbb = KG * sizeof(cinfer_block_iq4_nl);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[KR];
    for (int r = 0; r < rt; r++)
        acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = grp + (size_t)b * gbb;
        const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)gb));
        __m512i isum[KR][2];
        const cinfer_block_q8_0 *y[KR];
        for (int r = 0; r < rt; r++) {
            y[r] = (const cinfer_block_q8_0 *)row_at(act, arb, r) + b;
            isum[r][0] = isum[r][1] = zero;
        }
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m512i q = _mm512_loadu_si512((const void *)(gb + 32 + 64 * v));
            #pragma GCC unroll 2
            for (int hf = 0; hf < 2; hf++) {
                __mmask64 neg;
                const __m512i w = iq4p_abs(q, hf, &neg);
                #pragma GCC unroll 4
                for (int r = 0; r < rt; r++) {
                    int32_t a;
                    memcpy(&a, y[r]->qs + 16 * hf + 4 * v, 4);
                    __m512i av = _mm512_set1_epi32(a);
                    av = _mm512_mask_sub_epi8(av, neg, zero, av);
                    isum[r][hf] = _mm512_dpbusd_epi32(isum[r][hf], w, av);
                }
            }
        }
        for (int r = 0; r < rt; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(isum[r][0], isum[r][1])),
                                     _mm512_mul_ps(xd, _mm512_set1_ps(f16(y[r]->d))), acc[r]);
    }
    for (int r = 0; r < rt; r++)
        _mm512_storeu_ps(out + r * out_stride, acc[r]);
}

KQP_ROWS(kqp_rows_q6, kqp_group6)
KQP_ROWS(kqp_rows_q2, kqp_group2)
KQP_ROWS(kqp_rows_q3, kqp_group3)
KQP_ROWS(kqp_rows_xs, kqp_group_xs)
KQP_ROWS(kqp_rows_nl, kqp_group_nl)

INLINE void kqp_group4(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                       size_t arb, float *out, int64_t out_stride)
{
    kqp_group(0, rt, grp, nb, sizeof(cinfer_block_q4_k), act, arb, out, out_stride);
}

INLINE void kqp_group5(const int rt, const uint8_t *grp, int64_t nb, const uint8_t *act,
                       size_t arb, float *out, int64_t out_stride)
{
    kqp_group(1, rt, grp, nb, sizeof(cinfer_block_q5_k), act, arb, out, out_stride);
}

KQP_ROWS(kqp_rows_q4, kqp_group4)
KQP_ROWS(kqp_rows_q5, kqp_group5)

void cinfer_cpu_matmul_compute_kquant_packed_avx512(cinfer_dtype wt, const void *w,
                                                    int64_t n_out, const void *act, int64_t n,
                                                    int64_t n_in, float *out,
                                                    int64_t out_stride, int64_t o0, int64_t o1)
{
    const int64_t be = cinfer_dtype_block_elems(wt), nb = n_in / be, n_full = n_out / KG * KG;
    const size_t bb = cinfer_dtype_row_bytes(wt, be), rb = bb * (size_t)nb;
    const size_t arb = cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), n_in);
    const uint8_t *base = w;
    const int64_t e = o1 < n_full ? o1 : n_full;
    for (int64_t o = o0; o < e; o += KG) {
        const uint8_t *grp = base + (size_t)(o / KG * nb) * KG * bb;
        if (wt == CINFER_DTYPE_Q6_K)
            kqp_rows_q6(grp, nb, act, arb, n, out + o, out_stride);
        else if (wt == CINFER_DTYPE_Q2_K)
            kqp_rows_q2(grp, nb, act, arb, n, out + o, out_stride);
        else if (wt == CINFER_DTYPE_Q3_K)
            kqp_rows_q3(grp, nb, act, arb, n, out + o, out_stride);
        else if (wt == CINFER_DTYPE_IQ4_XS)
            kqp_rows_xs(grp, nb, act, arb, n, out + o, out_stride);
        else if (wt == CINFER_DTYPE_IQ4_NL)
            kqp_rows_nl(grp, nb, act, arb, n, out + o, out_stride);
        else if (wt == CINFER_DTYPE_Q5_K)
            kqp_rows_q5(grp, nb, act, arb, n, out + o, out_stride);
        else
            kqp_rows_q4(grp, nb, act, arb, n, out + o, out_stride);
    }
    /* The rows past the last whole group keep their layout. */
    if (o1 > n_full) {
        const int64_t t0 = o0 > n_full ? o0 : n_full;
        cinfer_cpu_matmul_compute_kquant_avx512(wt, base + (size_t)n_full * rb, rb, act, n, n_in,
                                                out + n_full, out_stride, t0 - n_full,
                                                o1 - n_full);
    }
}

/* ---------------------------------------------------------------------- */
/* entry                                                                  */
/* ---------------------------------------------------------------------- */

/* One weight row against rt activation rows; inlined with rt = ROWS and
 * rt = 1 constant (the accumulators then live in registers), and once with
 * a variable count for a batch's last rows. */
INLINE void tile(cinfer_dtype wt, const void *wrow, const void *act, size_t arb, int64_t nb,
                 int rt, float *out, int64_t out_stride)
{
    switch (wt) {
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K: tile_q45_k(wt, wrow, act, arb, nb, rt, out, out_stride); return;
    case CINFER_DTYPE_Q6_K: tile_q6_k(wrow, act, arb, nb, rt, out, out_stride); return;
    case CINFER_DTYPE_Q2_K: tile_q2_k(wrow, act, arb, nb, rt, out, out_stride); return;
    case CINFER_DTYPE_Q3_K: tile_q3_k(wrow, act, arb, nb, rt, out, out_stride); return;
    case CINFER_DTYPE_IQ4_XS: tile_iq4_xs(wrow, act, arb, nb, rt, out, out_stride); return;
    default: tile_iq4_nl(wrow, act, arb, nb, rt, out, out_stride); return;
    }
}

INLINE void compute_rows(cinfer_dtype wt, const uint8_t *w, size_t w_row_bytes,
                         const uint8_t *act, size_t arb, int64_t n, int64_t nb, float *out,
                         int64_t out_stride, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = w + (size_t)o * w_row_bytes;
        int64_t r = 0;
        for (; r + ROWS <= n; r += ROWS)
            tile(wt, wrow, act + (size_t)r * arb, arb, nb, ROWS, out + r * out_stride + o,
                 out_stride);
        if (r < n)
            tile(wt, wrow, act + (size_t)r * arb, arb, nb, (int)(n - r), out + r * out_stride + o,
                 out_stride);
    }
}

INLINE void compute_one(cinfer_dtype wt, const uint8_t *w, size_t w_row_bytes,
                        const uint8_t *act, int64_t nb, float *out, int64_t o0, int64_t o1)
{
    for (int64_t o = o0; o < o1; o++)
        tile(wt, w + (size_t)o * w_row_bytes, act, 0, nb, 1, out + o, 0);
}

#define KQ_TYPES(X) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_XS) X(IQ4_NL)

/* One copy per type, so each tile is specialised (the switch folds). */
#define KQ_FN(T)                                                                                \
    static void rows_##T(const uint8_t *w, size_t wrb, const uint8_t *act, size_t arb,          \
                         int64_t n, int64_t nb, float *out, int64_t os, int64_t o0, int64_t o1) \
    {                                                                                           \
        if (n == 1)                                                                             \
            compute_one(CINFER_DTYPE_##T, w, wrb, act, nb, out, o0, o1);                        \
        else                                                                                    \
            compute_rows(CINFER_DTYPE_##T, w, wrb, act, arb, n, nb, out, os, o0, o1);           \
    }
KQ_TYPES(KQ_FN)
#undef KQ_FN

void cinfer_cpu_matmul_compute_kquant_avx512(cinfer_dtype wt, const void *w,
                                             size_t w_row_bytes, const void *act,
                                             int64_t n, int64_t n_in, float *out,
                                             int64_t out_stride, int64_t o0,
                                             int64_t o1)
{
    const size_t arb = cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), n_in);
    const int64_t nb = n_in / cinfer_dtype_block_elems(wt);
    switch (wt) {
#define KQ_CASE(T)                                                                        \
    case CINFER_DTYPE_##T:                                                                \
        rows_##T(w, w_row_bytes, act, arb, n, nb, out, out_stride, o0, o1);               \
        return;
        KQ_TYPES(KQ_CASE)
#undef KQ_CASE
    default: return;
    }
}

#endif /* CINFER_MATMUL_HAVE_AVX512 */
