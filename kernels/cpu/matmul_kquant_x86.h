/*
 * matmul_kquant_x86.h - the small reductions the AVX2 and AVX-512 K-quant
 * and IQ4 kernels share (matmul_kquant_avx2.c, matmul_kquant_avx512.c).
 * AVX2 + F16C intrinsics only, so it compiles in either file; include it
 * after <immintrin.h>, inside the file's ISA guard.
 */
#ifndef CINFER_MATMUL_KQUANT_X86_H
#define CINFER_MATMUL_KQUANT_X86_H

#include <stdint.h>

/* The float 8-lane tree of matmul_impl.h / matmul_kquant.c's hsum8. */
static inline float hsum8(__m256 x)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float f16(uint16_t h) { return _cvtsh_ss(h); }

/* Integer lane sums (exact, so any order). */
static inline int hsum4_epi32(__m128i v)
{
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
    return _mm_cvtsi128_si32(v);
}

static inline int hsum8_epi32(__m256i v)
{
    return hsum4_epi32(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* out[k] = the sum of v[k]'s eight lanes, for eight vectors at once: one
 * hadd tree instead of eight horizontal sums (exact, so any order). */
static inline void hsum8x8_epi32(const __m256i v[8], int32_t out[8])
{
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                         _mm256_hadd_epi32(v[2], v[3]));
    const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                         _mm256_hadd_epi32(v[6], v[7]));
    _mm256_storeu_si256((__m256i *)out,
                        _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                                         _mm256_permute2x128_si256(q0, q1, 0x31)));
}

#endif
