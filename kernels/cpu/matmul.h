/*
 * matmul.h - CPU matrix-product kernels behind the backend's matmul op.
 *
 * out[r][o] = dot(x[r], w[o]) for activations x ([n, n_in], F32) and a weight
 * matrix w ([n_out, n_in], any weight dtype). The op runs in two phases, both
 * split over the backend's threads by the caller (cpu_backend.c):
 *
 *   1. prepare: each input row is converted once to the activation format
 *      paired with the weight type (as GGML pairs them: Q4_1 -> Q8_1,
 *      Q8_0/Q4_0/IQ4_NL -> Q8_0, the K-quants and IQ4_XS -> Q8_K, F16 ->
 *      F16, BF16 -> BF16, F32 -> F32);
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

/* ---- weights packed for the AVX-512 kernels ------------------------------
 *
 * The same bytes as a [n_out, n_in] Q8_0, Q4_0 or Q4_1 matrix, reordered so
 * that the weight rows a decode tile reads side by side (G = 8 for Q8_0,
 * 16 for Q4_0 / Q4_1) are one aligned stream. A block is SB scale bytes
 * (d; d and m for Q4_1) then QB quant bytes; with n_full = n_out / G * G
 * and nb = n_in / 32:
 *   quants  n_full / G groups of nb * G * QB bytes: block b of the group's
 *           row k at b * G * QB + QB * k; Q8_0 quants stored as q ^ 0x80
 *           (q + 128, the unsigned operand vpdpbusd takes);
 *   scales  n_full / G groups of nb * G * SB bytes: row k's block b at
 *           b * G * SB + SB * k;
 *   tail    rows n_full .. n_out - 1 unchanged.
 * The size is n_out * cinfer_dtype_row_bytes(wt, n_in), as unpacked.
 * Products over packed weights give the same bits as over the rows.
 *
 * The K-quants, IQ4_XS and IQ4_NL (G = 16) are packed block by block for
 * kernels whose vector lanes are the G weight rows: with bb the block's
 * bytes and nb the blocks a row (n_in / 256; IQ4_NL n_in / 32), block b of
 * group j is G * bb bytes at (j * nb + b) * G * bb. In it come the 2-byte
 * fields (Q2_K, Q4_K, Q5_K: d, then dmin; IQ4_XS: d, then scales_h;
 * IQ4_NL: d), each the G rows' values side by side
 * (row k's at 2k of the field's 2G bytes); then planes of 4G bytes, each
 * one 4-byte word of the rest of the block for the G rows side by side
 * (row k's at 4k): in the block's order (Q2_K: 16 scale bytes, 64 qs;
 * Q4_K: 12 scale bytes, 128 qs; Q5_K: 12 scale bytes, 32 qh, 128 qs;
 * IQ4_XS: 4 scales_l bytes, 128 qs; IQ4_NL: 16 qs), but Q3_K's and Q6_K's in their
 * kernels' reading order (Q3_K: its 3 scale words, hmask word u and qs
 * word u by turns for u = 0..7, qs words 8..15; Q6_K: its 4
 * scale words, then for h = 0..1, n = 0..1, j = 0..3 and l = 4h + j: ql
 * words 16n + l and 16n + 8 + l, qh word 8n + l); Q3_K's and Q6_K's d
 * comes after the planes. The tail is as above. */

/* G for a packable type, 0 for the others. */
int cinfer_cpu_pack_rows(cinfer_dtype wt);

/* Packs matrix w ([n_out, n_in] of type wt) into dst (64-byte aligned). */
void cinfer_cpu_pack(cinfer_dtype wt, const void *w, int64_t n_out,
                     int64_t n_in, void *dst);

/* The same in independent parts, for threads: cinfer_cpu_pack_parts parts
 * (each group of G rows, then the tail), of which this packs [p0, p1). */
int64_t cinfer_cpu_pack_parts(cinfer_dtype wt, int64_t n_out);
void cinfer_cpu_pack_range(cinfer_dtype wt, const void *w, int64_t n_out,
                           int64_t n_in, void *dst, int64_t p0, int64_t p1);

/* Writes blocks [b0, b1) of row `row` of a packed matrix as blocks of wt. */
void cinfer_cpu_packed_row(cinfer_dtype wt, const void *p, int64_t n_out,
                           int64_t n_in, int64_t row, int64_t b0, int64_t b1,
                           void *dst);

/* cinfer_cpu_matmul_compute over packed weights (AVX-512 only: the caller
 * packs only where cinfer_cpu_isa_supported(AVX512)); o0 and o1 are
 * multiples of G or o1 == n_out. Built on x86-64 alone (matmul_impl.h). */
#if defined(__x86_64__) || defined(_M_X64)
void cinfer_cpu_matmul_compute_packed_avx512(cinfer_dtype wt, const void *w,
                                             int64_t n_out, const void *act,
                                             int64_t n, int64_t n_in,
                                             float *out, int64_t out_stride,
                                             int64_t o0, int64_t o1);
#endif

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CPU_MATMUL_H */
