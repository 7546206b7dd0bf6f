/*
 * matmul_kquant_avx2.c - K-quant and IQ4 products (Q2_K .. Q6_K and IQ4_XS
 * x Q8_K, IQ4_NL x Q8_0) for AVX2 + FMA + F16C, in the reduction order of
 * matmul_kquant.c.
 *
 * One output element at a time, a super-block per step: vpmaddubsw of the
 * unsigned quants with the activation (no pair sum can saturate: at most
 * 2 * 63 * 127; the signed IQ4 levels go through |v| and the sign moved
 * onto the activation, at most 2 * 127 * 127), vpmaddwd by the sub-block
 * scales, eight int32 lanes per
 * element whose lane l covers bytes 4l .. 4l + 3 of each 32-byte part.
 * AVX-512 processors run matmul_kquant_avx512.c instead: the same bits.
 *
 * The loops over a super-block's parts are unrolled (#pragma GCC unroll,
 * or written out): at the build's -O2 GCC keeps them rolled, rebuilding
 * the per-part shuffle constants and shift counts each time, which made
 * the products 1.3-1.5x slower than ggml's on the same instructions.
 */
#include "matmul_impl.h"

#ifdef CINFER_MATMUL_HAVE_AVX2

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "matmul_kquant_x86.h"

/* Sub-block scales sc[0..7] in bytes 0..7, mins in 8..15: the 12 packed
 * bytes unpacked four at a time (cinfer_dtype_k4_scale_min's layout). */
static inline __m128i k4_scales_mins(const uint8_t *scales)
{
    uint32_t u[4];
    memcpy(u, scales, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4); /* mins 4..7 */
    const uint32_t mins03 = u[1] & m6;
    u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4); /* scales 4..7 */
    u[2] = mins03;
    u[0] &= m6; /* scales 0..3 */
    return _mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]);
}

/* Shuffles that broadcast int16 lane k (bytes 2k, 2k + 1) of a register. */
static inline __m256i bcast16(const __m256i v, int k)
{
    const __m256i idx = _mm256_set1_epi16((short)(2 * k | (2 * k + 1) << 8));
    return _mm256_shuffle_epi8(v, idx);
}

/* matmul_kquant.c's Q4_K order: exact ints per super-block, two scalars. */
static float dot_q4_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q4_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF);
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins(x[b].scales));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[b].bsums);
        const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs),
                                            _mm256_extracti128_si256(bs, 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs32);

        const __m128i sc128 = _mm256_castsi256_si128(sm);
        const __m256i sc = _mm256_setr_m128i(sc128, sc128);
        const uint8_t *q = x[b].qs;
        const int8_t *a = y[b].qs;
        __m256i sumi = _mm256_setzero_si256();
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i al = _mm256_loadu_si256((const __m256i *)(a + 64 * c));
            const __m256i ah = _mm256_loadu_si256((const __m256i *)(a + 64 * c + 32));
            __m256i pl = _mm256_madd_epi16(bcast16(sc, 2 * c),
                                           _mm256_maddubs_epi16(lo, al));
            __m256i ph = _mm256_madd_epi16(bcast16(sc, 2 * c + 1),
                                           _mm256_maddubs_epi16(hi, ah));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        const int isum = hsum8_epi32(sumi);
        acc = fmaf((float)isum, f16(x[b].d) * y[b].d, acc);
        accm = fmaf((float)hsum4_epi32(prod), f16(x[b].dmin) * y[b].d, accm);
    }
    return acc - accm;
}

static float dot_q5_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q5_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * f16(x[b].d);
        const float dmin = -y[b].d * f16(x[b].dmin);
        const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins(x[b].scales));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[b].bsums);
        const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs),
                                            _mm256_extracti128_si256(bs, 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs32);
        const __m128i z = _mm_setzero_si128();
        const int msum = _mm_cvtsi128_si32(_mm_hadd_epi32(_mm_hadd_epi32(prod, z), z));
        summs = fmaf(dmin, (float)msum, summs);

        const __m128i sc128 = _mm256_castsi256_si128(sm);
        const __m256i sc = _mm256_setr_m128i(sc128, sc128);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[b].qh);
        const uint8_t *q = x[b].qs;
        const int8_t *a = y[b].qs;
        __m256i sumi = _mm256_setzero_si256();
        #pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(q + 32 * c));
            const __m256i hl =
                _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * c)), one);
            const __m256i hh =
                _mm256_and_si256(_mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * c + 1)), one);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4),
                                               _mm256_slli_epi16(hl, 4));
            const __m256i hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), _mm256_slli_epi16(hh, 4));
            const __m256i al = _mm256_loadu_si256((const __m256i *)(a + 64 * c));
            const __m256i ah = _mm256_loadu_si256((const __m256i *)(a + 64 * c + 32));
            __m256i pl = _mm256_madd_epi16(bcast16(sc, 2 * c),
                                           _mm256_maddubs_epi16(lo, al));
            __m256i ph = _mm256_madd_epi16(bcast16(sc, 2 * c + 1),
                                           _mm256_maddubs_epi16(hi, ah));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc) + summs;
}

/* Byte shuffles for Q6_K part p: scale 2p eight times, then 2p + 1. */
static const uint8_t k_pick6[8][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},
    {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13},
    {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

static float dot_q6_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q6_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * f16(x[b].d);
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[b].bsums);
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[b].scales));
        const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[b].scales);
        __m256i sumi = _mm256_setzero_si256();
        #pragma GCC unroll 4
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h;
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)(x[b].qh + 32 * h));
            __m256i q6[4];
            q6[0] = _mm256_or_si256(_mm256_and_si256(b1, m15),
                                    _mm256_slli_epi16(_mm256_and_si256(bh, m3), 4));
            q6[1] = _mm256_or_si256(_mm256_and_si256(b2, m15),
                                    _mm256_slli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(12)), 2));
            q6[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15),
                                    _mm256_and_si256(bh, _mm256_set1_epi8(48)));
            q6[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15),
                                    _mm256_srli_epi16(_mm256_and_si256(bh, _mm256_set1_epi8(-64)), 2));
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int p = 4 * h + i;
                const __m256i av =
                    _mm256_loadu_si256((const __m256i *)(y[b].qs + 32 * p));
                /* scales 2p (bytes 0..15 of the part), 2p + 1 (16..31) */
                const __m128i pick = _mm_loadu_si128((const __m128i *)k_pick6[p]);
                const __m256i s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, pick));
                sumi = _mm256_add_epi32(
                    sumi, _mm256_madd_epi16(s, _mm256_maddubs_epi16(q6[i], av)));
            }
        }
        sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8(acc);
}

/* Shuffles for 32-byte part k of a 128-element half (Q2_K, Q3_K): int16
 * scale 2k in the low 128-bit lane, 2k + 1 in the high one. */
static const uint8_t k_pick_q3k[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
     2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
     6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9,
     10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
     14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
};

static inline __m256i pick_q3k(__m256i scales, int k)
{
    return _mm256_shuffle_epi8(scales, _mm256_loadu_si256((const __m256i *)k_pick_q3k[k]));
}

/* Q2_K, one 128-element half: the 2-bit parts at shifts 0, 2, 4, 6 (the
 * shifts written out: -O2 keeps short loops rolled, and a variable shift
 * costs a register move per use). */
static inline __m256i q2k_half(const uint8_t *q, const int8_t *a, __m256i scales)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)q);
    const __m256i q0 = _mm256_and_si256(bits, m3);
    const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(bits, 2), m3);
    const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m3);
    const __m256i q3 = _mm256_and_si256(_mm256_srli_epi16(bits, 6), m3);
    __m256i p0 = _mm256_maddubs_epi16(q0, _mm256_loadu_si256((const __m256i *)a));
    __m256i p1 = _mm256_maddubs_epi16(q1, _mm256_loadu_si256((const __m256i *)(a + 32)));
    __m256i p2 = _mm256_maddubs_epi16(q2, _mm256_loadu_si256((const __m256i *)(a + 64)));
    __m256i p3 = _mm256_maddubs_epi16(q3, _mm256_loadu_si256((const __m256i *)(a + 96)));
    p0 = _mm256_madd_epi16(pick_q3k(scales, 0), p0);
    p1 = _mm256_madd_epi16(pick_q3k(scales, 1), p1);
    p2 = _mm256_madd_epi16(pick_q3k(scales, 2), p2);
    p3 = _mm256_madd_epi16(pick_q3k(scales, 3), p3);
    return _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
}

static float dot_q2_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q2_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    const __m128i m4 = _mm_set1_epi8(0xF);
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const __m128i ms = _mm_loadu_si128((const __m128i *)x[b].scales);
        const __m128i sc8 = _mm_and_si128(ms, m4);
        const __m128i mn8 = _mm_and_si128(_mm_srli_epi16(ms, 4), m4);
        const __m256i prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mn8),
                                               _mm256_loadu_si256((const __m256i *)y[b].bsums));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m128i lo = _mm256_castsi256_si128(sc16), hi = _mm256_extracti128_si256(sc16, 1);
        const __m256i s0 = q2k_half(x[b].qs, y[b].qs, _mm256_setr_m128i(lo, lo));
        const __m256i s1 = q2k_half(x[b].qs + 32, y[b].qs + 128, _mm256_setr_m128i(hi, hi));
        acc = fmaf((float)hsum8_epi32(_mm256_add_epi32(s0, s1)), f16(x[b].d) * y[b].d, acc);
        accm = fmaf((float)hsum8_epi32(prod), f16(x[b].dmin) * y[b].d, accm);
    }
    return acc - accm;
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

/* Q3_K part: low bits ql (0..3), hmask bit `bit` clear -> 4 subtracted. */
#define Q3K_PART(ql, bit, ak, k)                                                 \
    _mm256_madd_epi16(                                                           \
        pick_q3k(scales, k),                                                     \
        _mm256_sub_epi16(                                                        \
            _mm256_maddubs_epi16(ql, ak),                                        \
            _mm256_maddubs_epi16(                                                \
                _mm256_slli_epi16(                                               \
                    _mm256_srli_epi16(                                           \
                        _mm256_andnot_si256(hbits, _mm256_slli_epi16(one, bit)), \
                        bit),                                                    \
                    2),                                                          \
                ak)))

/* Q3_K, one 128-element half j (hmask bits 4j .. 4j + 3). */
static inline __m256i q3k_half(const uint8_t *q, const int8_t *a, __m256i scales,
                               __m256i hbits, int j)
{
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)q);
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)a);
    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a + 32));
    const __m256i a2 = _mm256_loadu_si256((const __m256i *)(a + 64));
    const __m256i a3 = _mm256_loadu_si256((const __m256i *)(a + 96));
    const __m256i q0 = _mm256_and_si256(bits, m3);
    const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(bits, 2), m3);
    const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m3);
    const __m256i q3 = _mm256_and_si256(_mm256_srli_epi16(bits, 6), m3);
    __m256i p0, p1, p2, p3;
    if (j == 0) {
        p0 = Q3K_PART(q0, 0, a0, 0);
        p1 = Q3K_PART(q1, 1, a1, 1);
        p2 = Q3K_PART(q2, 2, a2, 2);
        p3 = Q3K_PART(q3, 3, a3, 3);
    } else {
        p0 = Q3K_PART(q0, 4, a0, 0);
        p1 = Q3K_PART(q1, 5, a1, 1);
        p2 = Q3K_PART(q2, 6, a2, 2);
        p3 = Q3K_PART(q3, 7, a3, 3);
    }
    return _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3));
}

static float dot_q3_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q3_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * f16(x[b].d);
        const __m256i sc16 = _mm256_cvtepi8_epi16(q3k_scales(x[b].scales));
        const __m128i lo = _mm256_castsi256_si128(sc16), hi = _mm256_extracti128_si256(sc16, 1);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[b].hmask);
        const __m256i s0 = q3k_half(x[b].qs, y[b].qs, _mm256_setr_m128i(lo, lo), hbits, 0);
        const __m256i s1 = q3k_half(x[b].qs + 32, y[b].qs + 128, _mm256_setr_m128i(hi, hi), hbits, 1);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum8(acc);
}

/* 16 nibble bytes as 32 IQ4 levels: low nibbles (elements 0..15), then
 * high nibbles (16..31). */
static inline __m256i iq4_levels(const uint8_t *qs, const __m128i values)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i bits = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_setr_m128i(_mm_shuffle_epi8(values, _mm_and_si128(bits, m4)),
                             _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4)));
}

/* Pair sums of signed bytes v * a as int16 (exact: |v|, |a| <= 127). */
static inline __m256i mul_add_i8(__m256i v, __m256i a)
{
    return _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(a, v));
}

static float dot_iq4_xs(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_iq4_xs *x = vx;
    const cinfer_block_q8_k *y = vy;
    const __m128i values = _mm_loadu_si128((const __m128i *)cinfer_iq4nl_values);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *qs = x[b].qs;
        const int8_t *a = y[b].qs;
        unsigned sh = x[b].scales_h;
        __m256i sumi1 = _mm256_setzero_si256(), sumi2 = _mm256_setzero_si256();
        #pragma GCC unroll 4
        for (int j = 0; j < 8; j += 2) {
            const __m256i p1 = mul_add_i8(iq4_levels(qs, values),
                                          _mm256_loadu_si256((const __m256i *)a));
            const __m256i p2 = mul_add_i8(iq4_levels(qs + 16, values),
                                          _mm256_loadu_si256((const __m256i *)(a + 32)));
            const int ls1 = ((x[b].scales_l[j / 2] & 15) | ((sh << 4) & 0x30)) - 32;
            const int ls2 = ((x[b].scales_l[j / 2] >> 4) | ((sh << 2) & 0x30)) - 32;
            sh >>= 4;
            sumi1 = _mm256_add_epi32(sumi1, _mm256_madd_epi16(p1, _mm256_set1_epi16((short)ls1)));
            sumi2 = _mm256_add_epi32(sumi2, _mm256_madd_epi16(p2, _mm256_set1_epi16((short)ls2)));
            qs += 32;
            a += 64;
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16(x[b].d) * y[b].d),
                              _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)), acc);
    }
    return hsum8(acc);
}

static inline __m256i iq4_nl_block(const cinfer_block_iq4_nl *x, const cinfer_block_q8_0 *y,
                                   __m128i values)
{
    const __m256i p = mul_add_i8(iq4_levels(x->qs, values),
                                 _mm256_loadu_si256((const __m256i *)y->qs));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

static float dot_iq4_nl(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_iq4_nl *x = vx;
    const cinfer_block_q8_0 *y = vy;
    const __m128i values = _mm_loadu_si128((const __m128i *)cinfer_iq4nl_values);
    float out = 0.0f;
    int64_t b = 0;
    /* eight blocks at a time: one reduction tree (8 x 8 lanes -> 8 exact
     * ints), then their fmas in block order */
    for (; b + 7 < nb; b += 8) {
        __m256i v[8];
        for (int k = 0; k < 8; k++)
            v[k] = iq4_nl_block(&x[b + k], &y[b + k], values);
        int32_t is[8];
        hsum8x8_epi32(v, is);
        for (int k = 0; k < 8; k++)
            out = fmaf((float)is[k], f16(x[b + k].d) * f16(y[b + k].d), out);
    }
    for (; b < nb; b++) {
        const __m256i p = iq4_nl_block(&x[b], &y[b], values);
        out = fmaf((float)hsum8_epi32(p), f16(x[b].d) * f16(y[b].d), out);
    }
    return out;
}

typedef float (*dot_fn)(const void *x, const void *y, int64_t nb);

static dot_fn pick(cinfer_dtype wt)
{
    switch (wt) {
    case CINFER_DTYPE_Q2_K: return dot_q2_k;
    case CINFER_DTYPE_Q3_K: return dot_q3_k;
    case CINFER_DTYPE_Q4_K: return dot_q4_k;
    case CINFER_DTYPE_Q5_K: return dot_q5_k;
    case CINFER_DTYPE_IQ4_XS: return dot_iq4_xs;
    case CINFER_DTYPE_IQ4_NL: return dot_iq4_nl;
    default: return dot_q6_k;
    }
}

void cinfer_cpu_matmul_compute_kquant_avx2(cinfer_dtype wt, const void *w,
                                           size_t w_row_bytes, const void *act,
                                           int64_t n, int64_t n_in, float *out,
                                           int64_t out_stride, int64_t o0,
                                           int64_t o1)
{
    const size_t arb = cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), n_in);
    const int64_t nb = n_in / cinfer_dtype_block_elems(wt);
    const dot_fn dot = pick(wt);
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const uint8_t *)w + (size_t)o * w_row_bytes;
        for (int64_t r = 0; r < n; r++)
            out[r * out_stride + o] = dot(wrow, (const uint8_t *)act + (size_t)r * arb, nb);
    }
}

#endif /* CINFER_MATMUL_HAVE_AVX2 */
