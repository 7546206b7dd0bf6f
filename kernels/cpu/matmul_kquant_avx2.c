/*
 * matmul_kquant_avx2.c - K-quant products (Q4_K, Q5_K, Q6_K x Q8_K) for AVX2 +
 * FMA + F16C, in the reduction order of matmul_kquant.c.
 *
 * One output element at a time, a super-block per step: vpmaddubsw of the
 * unsigned quants with the activation (no pair sum can saturate: at most
 * 2 * 63 * 127), vpmaddwd by the sub-block scales, eight int32 lanes per
 * element whose lane l covers bytes 4l .. 4l + 3 of each 32-byte part.
 * AVX-512 processors run these too (matmul.c): the bits are the same.
 */
#include "matmul_impl.h"

#ifdef CINFER_MATMUL_HAVE_AVX2

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float hsum8(__m256 x)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

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

static float dot_q4_k(const cinfer_block_q4_k *x, const cinfer_block_q8_k *y,
                      int64_t nb)
{
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * f16(x[b].d);
        const float dmin = -y[b].d * f16(x[b].dmin);
        const __m256i sm = _mm256_cvtepu8_epi16(k4_scales_mins(x[b].scales));
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[b].bsums);
        const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs),
                                            _mm256_extracti128_si256(bs, 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs32);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), accm);

        const __m128i sc128 = _mm256_castsi256_si128(sm);
        const __m256i sc = _mm256_setr_m128i(sc128, sc128);
        const uint8_t *q = x[b].qs;
        const int8_t *a = y[b].qs;
        __m256i sumi = _mm256_setzero_si256();
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
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return hsum8(acc) + _mm_cvtss_f32(accm);
}

static float dot_q5_k(const cinfer_block_q5_k *x, const cinfer_block_q8_k *y,
                      int64_t nb)
{
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

static float dot_q6_k(const cinfer_block_q6_k *x, const cinfer_block_q8_k *y,
                      int64_t nb)
{
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

void cinfer_cpu_matmul_compute_kquant_avx2(cinfer_dtype wt, const void *w,
                                           size_t w_row_bytes, const void *act,
                                           int64_t n, int64_t n_in, float *out,
                                           int64_t out_stride, int64_t o0,
                                           int64_t o1)
{
    const size_t arb = cinfer_dtype_row_bytes(CINFER_DTYPE_Q8_K, n_in);
    const int64_t nb = n_in / CINFER_QK_K;
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const uint8_t *)w + (size_t)o * w_row_bytes;
        for (int64_t r = 0; r < n; r++) {
            const cinfer_block_q8_k *arow =
                (const cinfer_block_q8_k *)((const uint8_t *)act + (size_t)r * arb);
            out[r * out_stride + o] =
                wt == CINFER_DTYPE_Q4_K   ? dot_q4_k(wrow, arow, nb)
                : wt == CINFER_DTYPE_Q5_K ? dot_q5_k(wrow, arow, nb)
                                          : dot_q6_k(wrow, arow, nb);
        }
    }
}

#endif /* CINFER_MATMUL_HAVE_AVX2 */
