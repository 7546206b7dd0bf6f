/*
 * matmul.h - CPU matrix-product kernels behind the backend's matmul op.
 *
 * out[r][o] = dot(x[r], w[o]) for activations x ([n, n_in], F32) and a weight
 * matrix w ([n_out, n_in], any weight dtype). The op runs in two phases, both
 * split over the backend's threads by the caller (cpu_backend.c):
 *
 *   1. prepare: each input row is converted once to the activation format
 *      paired with the weight type (as GGML pairs them: Q4_1 -> Q8_1,
 *      Q8_0/Q4_0 -> Q8_0, F16 -> F16, BF16 -> BF16, F32 -> F32);
 *   2. compute: a thread computes all rows for its range of output columns
 *      [o0, o1).
 *
 * Batch invariance: every output element is reduced over n_in in an order
 * that depends on n_in alone, never on n, on r, or on [o0, o1), so a row's
 * result is bit-identical whatever batch it is computed in.
 *
 * Every ISA (portable C, AVX2, AVX-512) implements the same functions; the
 * isa argument picks one. The caller guarantees the ISA is supported, n_in is
 * a multiple of the weight's block size, and buffers do not overlap.
 */
#ifndef CINFER_CPU_MATMUL_H
#define CINFER_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "../backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if weights of type `wt` have a matmul kernel. */
int cinfer_cpu_matmul_supported(cinfer_dtype wt);

/* The activation format paired with weight type `wt`. */
cinfer_dtype cinfer_cpu_matmul_act_type(cinfer_dtype wt);

/* Converts rows [r0, r1) of x (row stride n_in floats) into `act`, whose
 * rows are cinfer_dtype_row_bytes(act_type, n_in) bytes apart (row r at
 * act + r * that). Thread-safe for disjoint row ranges. */
void cinfer_cpu_matmul_prepare(cinfer_cpu_isa isa, cinfer_dtype act_type,
                               const float *x, int64_t n_in, int64_t r0,
                               int64_t r1, void *act);

/* For r in [0, n) and o in [o0, o1):
 *     out[r * out_stride + o] = dot(act row r, w row o)
 * w rows are w_row_bytes apart (cinfer_dtype_row_bytes(wt, n_in)).
 * Thread-safe for disjoint [o0, o1). */
void cinfer_cpu_matmul_compute(cinfer_cpu_isa isa, cinfer_dtype wt,
                               const void *w, size_t w_row_bytes,
                               const void *act, int64_t n, int64_t n_in,
                               float *out, int64_t out_stride, int64_t o0,
                               int64_t o1);

/* ---- Q8_0 weights packed for the AVX-512 kernel ------------------------
 *
 * The same bytes as a [n_out, n_in] Q8_0 matrix, reordered so that a tile
 * of eight weight rows is one aligned stream: with n_full = n_out / 8 * 8
 * and nb = n_in / 32,
 *   quants  n_full / 8 groups of nb * 256 bytes: block b of the group's
 *           row k at b * 256 + 32 * k, each quant stored as q ^ 0x80
 *           (q + 128, the unsigned operand vpdpbusd takes);
 *   scales  n_full / 8 groups of nb * 16 bytes: row k's block b at
 *           b * 16 + 2 * k (fp16);
 *   tail    rows n_full .. n_out - 1 unchanged, as Q8_0 rows.
 * The size is n_out * cinfer_dtype_row_bytes(Q8_0, n_in), as unpacked.
 * Products over packed weights give the same bits as over the Q8_0 rows. */

/* Packs the Q8_0 matrix w ([n_out, n_in]) into dst (64-byte aligned). */
void cinfer_cpu_q8p_pack(const void *w, int64_t n_out, int64_t n_in, void *dst);

/* Writes blocks [b0, b1) of row `row` of a packed matrix as Q8_0 blocks. */
void cinfer_cpu_q8p_row(const void *p, int64_t n_out, int64_t n_in,
                        int64_t row, int64_t b0, int64_t b1, void *dst);

/* cinfer_cpu_matmul_compute over packed Q8_0 weights (AVX-512 only: the
 * caller packs only where cinfer_cpu_isa_supported(AVX512)); o0 and o1
 * are multiples of 8 or o1 == n_out. */
void cinfer_cpu_matmul_compute_q8p_avx512(const void *w, int64_t n_out,
                                          const void *act, int64_t n,
                                          int64_t n_in, float *out,
                                          int64_t out_stride, int64_t o0,
                                          int64_t o1);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CPU_MATMUL_H */
