/*
 * matmul_impl.h - internals shared by the CPU matrix-product kernels: the
 * per-ISA entry points behind matmul.c's dispatch, and the reduction order
 * every one of them follows.
 *
 * The reduction order is the contract that makes results batch invariant
 * (and, by design, identical across ISAs). For out[r][o] = dot(act r, w o):
 *
 *   Int8 block types (Q8_0 x Q8_0, Q4_0 x Q8_0, Q4_1 x Q8_1), as GGML's x86
 *   ggml_vec_dot_*_q8_* and llamafile's tinyBLAS_Q0_AVX compute them:
 *     acc[0..7] = 0 (float); summs = 0 (Q4_1 only)
 *     for each block b in order:
 *       isum[l] = sum_{j=4l..4l+3} qw[j] * qa[j]   (exact int32, l = 0..7,
 *                                                   qw = q - 8 for Q4_0)
 *       acc[l]  = fma(f(d_w) * f(d_a), (float)isum[l], acc[l])
 *       summs   = summs + f(m_w) * f(s_a)           (Q4_1; exact product)
 *     out = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
 *           [+ summs for Q4_1]
 *   where f() is the fp16 -> fp32 conversion; d_w * d_a is exact in fp32.
 *
 *   F32 and F16 (both operands widened to fp32 exactly): 16 lanes; chunk c
 *   covers elements 16c .. 16c + 15, the last chunk zero padded:
 *       acc[l] = fma(w[16c + l], a[16c + l], acc[l])
 *
 *   BF16 (the semantics of AVX512-BF16 vdpbf16ps): 16 lanes; chunk c covers
 *   elements 32c .. 32c + 31, zero padded; lane l takes the pair 2l, 2l + 1,
 *   odd element first:
 *       acc[l] = fma(w[odd], a[odd], acc[l]); acc[l] = fma(w[even], a[even], acc[l])
 *   (products of bf16 values are exact in fp32, so each step rounds once).
 *   vdpbf16ps treats subnormal inputs and results as zero; the other ISAs
 *   do not, so BF16 results may differ across ISAs when values reach the
 *   fp32 subnormal range (below 1.2e-38).
 *
 *   Float 16-lane reduction tree: h8[i] = l[i] + l[i + 8]; h4[i] = h8[i] +
 *   h8[i + 4]; h2[i] = h4[i] + h4[i + 2]; out = h2[0] + h2[1].
 *
 *   K-quants (Q2_K .. Q6_K x Q8_K), IQ4_XS x Q8_K and IQ4_NL x Q8_0: the
 *   orders written out in matmul_kquant.c.
 *
 * Every code path (one row or a tile of rows, a full column tile or a tail)
 * performs exactly these per-element operations; tiling only changes which
 * elements share a register, never what is added to what.
 */
#ifndef CINFER_CPU_MATMUL_IMPL_H
#define CINFER_CPU_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x86-64 builds compile the SIMD files with their instruction-set flags
 * (kernels/CMakeLists.txt); elsewhere only the portable code exists. */
#if defined(__x86_64__) || defined(_M_X64)
#define CINFER_MATMUL_X86 1
#define CINFER_MATMUL_HAVE_AVX512 1
#define CINFER_MATMUL_HAVE_AVX2 1
#endif

/* Portable C: the reference implementation of the order above. */
void cinfer_cpu_matmul_prepare_portable(cinfer_dtype act_type, const float *x,
                                        int64_t n_in, int64_t r0, int64_t r1,
                                        void *act);
void cinfer_cpu_matmul_compute_portable(cinfer_dtype wt, const void *w,
                                        size_t w_row_bytes, const void *act,
                                        int64_t n, int64_t n_in, float *out,
                                        int64_t out_stride, int64_t o0,
                                        int64_t o1);

/* 1 for the types whose products live in matmul_kquant*.c: the K-quants,
 * IQ4_XS and IQ4_NL (matmul.c). */
int cinfer_cpu_matmul_is_kquant(cinfer_dtype wt);

/* K-quant and IQ4 weights x Q8_K / Q8_0 activations (matmul_kquant.c). */
void cinfer_cpu_matmul_compute_kquant_portable(cinfer_dtype wt, const void *w,
                                               size_t w_row_bytes,
                                               const void *act, int64_t n,
                                               int64_t n_in, float *out,
                                               int64_t out_stride, int64_t o0,
                                               int64_t o1);

/* Their dispatch by ISA (matmul_kquant.c); isa is a resolved one. */
void cinfer_cpu_matmul_compute_kquant(cinfer_cpu_isa isa, cinfer_dtype wt,
                                      const void *w, size_t w_row_bytes,
                                      const void *act, int64_t n, int64_t n_in,
                                      float *out, int64_t out_stride,
                                      int64_t o0, int64_t o1);

#ifdef CINFER_MATMUL_X86
/* The same for AVX-512 F/BW/VL/DQ + VNNI (matmul_kquant_avx512.c). */
void cinfer_cpu_matmul_compute_kquant_avx512(cinfer_dtype wt, const void *w,
                                             size_t w_row_bytes,
                                             const void *act, int64_t n,
                                             int64_t n_in, float *out,
                                             int64_t out_stride, int64_t o0,
                                             int64_t o1);

/* The K-quants and IQ4 over weights packed as matmul.h says, o0 a
 * multiple of 16 (matmul_kquant_avx512.c). */
void cinfer_cpu_matmul_compute_kquant_packed_avx512(cinfer_dtype wt, const void *w,
                                                    int64_t n_out, const void *act,
                                                    int64_t n, int64_t n_in, float *out,
                                                    int64_t out_stride, int64_t o0,
                                                    int64_t o1);

/* The same for AVX2 + FMA + F16C (matmul_kquant_avx2.c). */
void cinfer_cpu_matmul_compute_kquant_avx2(cinfer_dtype wt, const void *w,
                                           size_t w_row_bytes, const void *act,
                                           int64_t n, int64_t n_in, float *out,
                                           int64_t out_stride, int64_t o0,
                                           int64_t o1);

/* AVX2 + FMA + F16C (matmul_avx2.c). */
void cinfer_cpu_matmul_prepare_avx2(cinfer_dtype act_type, const float *x,
                                    int64_t n_in, int64_t r0, int64_t r1,
                                    void *act);
void cinfer_cpu_matmul_compute_avx2(cinfer_dtype wt, const void *w,
                                    size_t w_row_bytes, const void *act,
                                    int64_t n, int64_t n_in, float *out,
                                    int64_t out_stride, int64_t o0, int64_t o1);

/* AVX-512 F/BW/VL/DQ + VNNI + BF16 (matmul_avx512.c). */
void cinfer_cpu_matmul_prepare_avx512(cinfer_dtype act_type, const float *x,
                                      int64_t n_in, int64_t r0, int64_t r1,
                                      void *act);
void cinfer_cpu_matmul_compute_avx512(cinfer_dtype wt, const void *w,
                                      size_t w_row_bytes, const void *act,
                                      int64_t n, int64_t n_in, float *out,
                                      int64_t out_stride, int64_t o0,
                                      int64_t o1);
#endif

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CPU_MATMUL_IMPL_H */
