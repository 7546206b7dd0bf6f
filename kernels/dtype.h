/*
 * dtype.h - element types, quantized block layouts and their reference
 * conversions.
 *
 * Type ids equal GGML's (and so GGUF's) so a tensor's type in a file maps
 * one to one. Quantized types store rows as consecutive blocks of
 * CINFER_QK (32) elements:
 *
 *   Q8_0: { f16 d; int8 qs[32]; }            x = d * q
 *   Q8_1: { f16 d; f16 s; int8 qs[32]; }     x = d * q, s = d * sum(q)
 *   Q4_0: { f16 d; uint8 qs[16]; }           x = d * (q - 8)
 *   Q4_1: { f16 d; f16 m; uint8 qs[16]; }    x = d * q + m
 *
 * In the 4-bit types byte j holds element j in its low nibble and element
 * j + 16 in its high nibble. Q8_1 is the activation format paired with Q4_1
 * (as in GGML), Q8_0 the one paired with Q8_0 and Q4_0.
 *
 * The functions here are the scalar reference: the CPU kernels must agree
 * with them bit for bit when they quantize activations.
 *
 *     uint8_t blocks[cinfer_dtype_row_bytes(CINFER_DTYPE_Q4_1, 64)];
 *     cinfer_quantize_row(CINFER_DTYPE_Q4_1, src, blocks, 64);
 */
#ifndef CINFER_DTYPE_H
#define CINFER_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CINFER_QK 32

typedef enum {
    CINFER_DTYPE_F32 = 0,
    CINFER_DTYPE_F16 = 1,
    CINFER_DTYPE_Q4_0 = 2,
    CINFER_DTYPE_Q4_1 = 3,
    CINFER_DTYPE_Q8_0 = 8,
    CINFER_DTYPE_Q8_1 = 9,
    CINFER_DTYPE_I32 = 26,
    CINFER_DTYPE_BF16 = 30,
} cinfer_dtype;

typedef struct {
    uint16_t d;
    int8_t qs[CINFER_QK];
} cinfer_block_q8_0;

typedef struct {
    uint16_t d;
    uint16_t s;
    int8_t qs[CINFER_QK];
} cinfer_block_q8_1;

typedef struct {
    uint16_t d;
    uint8_t qs[CINFER_QK / 2];
} cinfer_block_q4_0;

typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[CINFER_QK / 2];
} cinfer_block_q4_1;

/* 1 if `id` (a GGML type id) is one this project supports. */
int cinfer_dtype_valid(uint32_t id);

/* "F32", "Q4_1", ... ("?" for an unknown id). */
const char *cinfer_dtype_name(cinfer_dtype t);

/* Elements per block (1 for scalar types) and bytes per block. */
int cinfer_dtype_block_elems(cinfer_dtype t);
size_t cinfer_dtype_block_bytes(cinfer_dtype t);

/* Bytes of one row of `n` elements; 0 if `n` is not a multiple of the block
 * size. */
size_t cinfer_dtype_row_bytes(cinfer_dtype t, int64_t n);

float cinfer_fp16_to_fp32(uint16_t h);
uint16_t cinfer_fp32_to_fp16(float f); /* round to nearest even */
float cinfer_bf16_to_fp32(uint16_t h);
uint16_t cinfer_fp32_to_bf16(float f); /* round to nearest even, NaN kept */

/* Converts `n` floats into row `dst` of type `t` (any type above but I32).
 * `n` must be a multiple of the block size. Thread-safe. */
void cinfer_quantize_row(cinfer_dtype t, const float *src, void *dst,
                         int64_t n);

/* Converts a row of `n` elements of type `t` back to floats. */
void cinfer_dequantize_row(cinfer_dtype t, const void *src, float *dst,
                           int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_DTYPE_H */
