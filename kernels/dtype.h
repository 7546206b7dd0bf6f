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
 * The K-quants store super-blocks of CINFER_QK_K (256) elements, GGML's
 * layouts byte for byte:
 *
 *   Q4_K: { f16 d, dmin; u8 scales[12]; u8 qs[128]; }      144 bytes
 *         8 sub-blocks of 32 with 6-bit scale sc[k] and min m[k] (packed
 *         as GGML's get_scale_min_k4 reads them); x = d*sc*q - dmin*m,
 *         q in 0..15; byte 32c + l holds element 64c + l (low nibble) and
 *         64c + 32 + l (high nibble).
 *   Q5_K: { f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; } 176 bytes
 *         as Q4_K with q in 0..31: bit 2c (low) / 2c + 1 (high) of qh[l]
 *         is bit 4 of the elements byte 32c + l of qs holds.
 *   Q6_K: { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; } 210 bytes
 *         16 sub-blocks of 16, x = d * scales[e / 16] * (q - 32), q in
 *         0..63; within each half h of 128 elements (e = 128h + i):
 *         low 4 bits in ql[64h + i % 64] (nibble i / 64), high 2 bits in
 *         qh[32h + i % 32] at bit 2 * (i / 32).
 *   Q2_K: { u8 scales[16]; u8 qs[64]; f16 d, dmin; }        84 bytes
 *         16 sub-blocks of 16, x = d * (scales[e/16] & 15) * q
 *         - dmin * (scales[e/16] >> 4), q in 0..3 at bits 2 * (i / 32) of
 *         qs[32h + i % 32] (e = 128h + i).
 *   Q3_K: { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; } 110 bytes
 *         16 sub-blocks of 16, x = d * (s[e/16] - 32) * (q - 4), q in 0..7:
 *         low 2 bits as Q2_K's, bit 2 is bit e / 32 of hmask[e % 32]; the
 *         6-bit s[j]: low nibble in scales[j % 8] (nibble j / 8), high 2
 *         bits in scales[8 + j % 4] at bit 2 * (j / 4).
 *   Q8_K: { f32 d; i8 qs[256]; i16 bsums[16]; }            292 bytes
 *         the activation format of all K-quants and IQ4_XS, x = d * q;
 *         bsums[k] is the sum of qs[16k .. 16k + 15].
 *
 * The non-linear 4-bit types map a nibble through GGML's table
 * kvalues_iq4nl (cinfer_iq4nl_values):
 *
 *   IQ4_NL: { f16 d; u8 qs[16]; }                           18 bytes
 *         blocks of 32 (nibbles as Q4_0's), x = d * kv[q]; paired with Q8_0.
 *   IQ4_XS: { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; } 136 bytes
 *         8 sub-blocks of 32, x = d * (ls - 32) * kv[q]; the 6-bit ls of
 *         sub-block j: nibble j % 2 of scales_l[j / 2], high 2 bits at bit
 *         2j of scales_h; byte 16j + l holds elements 32j + l (low nibble)
 *         and 32j + 16 + l (high). Paired with Q8_K.
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
#define CINFER_QK_K 256

typedef enum {
    CINFER_DTYPE_F32 = 0,
    CINFER_DTYPE_F16 = 1,
    CINFER_DTYPE_Q4_0 = 2,
    CINFER_DTYPE_Q4_1 = 3,
    CINFER_DTYPE_Q5_0 = 6, /* storage only: read from files, converted to
                              Q8_0 at load (lossless); no kernels */
    CINFER_DTYPE_Q8_0 = 8,
    CINFER_DTYPE_Q8_1 = 9,
    CINFER_DTYPE_Q2_K = 10,
    CINFER_DTYPE_Q3_K = 11,
    CINFER_DTYPE_Q4_K = 12,
    CINFER_DTYPE_Q5_K = 13,
    CINFER_DTYPE_Q6_K = 14,
    CINFER_DTYPE_Q8_K = 15,
    CINFER_DTYPE_IQ4_NL = 20,
    CINFER_DTYPE_IQ4_XS = 23,
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

/* x = d * (q - 16), q's low 4 bits in qs (elements j and j + 16 share
 * byte j), its fifth in bit j of qh (little-endian u32). */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[CINFER_QK / 2];
} cinfer_block_q5_0;

typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[CINFER_QK / 2];
} cinfer_block_q4_1;

typedef struct {
    uint8_t scales[CINFER_QK_K / 16];
    uint8_t qs[CINFER_QK_K / 4];
    uint16_t d;
    uint16_t dmin;
} cinfer_block_q2_k;

typedef struct {
    uint8_t hmask[CINFER_QK_K / 8];
    uint8_t qs[CINFER_QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
} cinfer_block_q3_k;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[CINFER_QK_K / 2];
} cinfer_block_q4_k;

typedef struct {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[CINFER_QK_K / 8];
    uint8_t qs[CINFER_QK_K / 2];
} cinfer_block_q5_k;

typedef struct {
    uint8_t ql[CINFER_QK_K / 2];
    uint8_t qh[CINFER_QK_K / 4];
    int8_t scales[CINFER_QK_K / 16];
    uint16_t d;
} cinfer_block_q6_k;

typedef struct {
    float d;
    int8_t qs[CINFER_QK_K];
    int16_t bsums[CINFER_QK_K / 16];
} cinfer_block_q8_k;

typedef struct {
    uint16_t d;
    uint8_t qs[CINFER_QK / 2];
} cinfer_block_iq4_nl;

typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[CINFER_QK_K / 64];
    uint8_t qs[CINFER_QK_K / 2];
} cinfer_block_iq4_xs;

/* GGML's kvalues_iq4nl: the 16 levels of IQ4_NL and IQ4_XS. */
extern const int8_t cinfer_iq4nl_values[16];

/* 1 if `id` (a GGML type id) is one this project supports. */
int cinfer_dtype_valid(uint32_t id);

/* GGML's name of type id `id`, supported or not ("Q2_K", "IQ4_XS", ...;
 * "?" for an id GGML does not define), for messages that refuse a type. */
const char *cinfer_dtype_ggml_name(uint32_t id);

/* Scale sc and min m of sub-block j (0..7) of a Q4_K / Q5_K super-block. */
void cinfer_dtype_k4_scale_min(const uint8_t *scales, int j, uint8_t *sc,
                               uint8_t *m);

/* The 16 6-bit scales (0..63, before GGML's "- 32") of a Q3_K super-block
 * from its 12 packed bytes. */
void cinfer_dtype_q3k_scales(const uint8_t *scales, uint8_t out[16]);

/* "F32", "Q4_1", ... ("?" for an unknown id). */
const char *cinfer_dtype_name(cinfer_dtype t);

/* Elements per block (1 for scalar types) and bytes per block. */
int cinfer_dtype_block_elems(cinfer_dtype t);
size_t cinfer_dtype_block_bytes(cinfer_dtype t);

/* Bytes of one row of `n` elements; 0 if `n` is not a multiple of the block
 * size. */
size_t cinfer_dtype_row_bytes(cinfer_dtype t, int64_t n);

/* Q5_0 blocks as Q8_0 blocks: the same scale and integers, so a Q8_0 dot
 * product computes what GGML's Q5_0 x Q8_0 one does. */
void cinfer_dtype_q5_0_to_q8_0(const void *src, void *dst, int64_t n_blocks);

float cinfer_fp16_to_fp32(uint16_t h);
uint16_t cinfer_fp32_to_fp16(float f); /* round to nearest even */
float cinfer_bf16_to_fp32(uint16_t h);
uint16_t cinfer_fp32_to_bf16(float f); /* round to nearest even, NaN kept */

/* Converts `n` floats into row `dst` of type `t` (any type above but I32).
 * `n` must be a multiple of the block size. Thread-safe. Q8_K is GGML's
 * quantize_row_q8_K bit for bit; the K-quants (Q2_K .. Q6_K), IQ4_NL and
 * IQ4_XS use a plain round-to-nearest (valid blocks, not GGML's
 * error-minimising search). */
void cinfer_quantize_row(cinfer_dtype t, const float *src, void *dst,
                         int64_t n);

/* Converts a row of `n` elements of type `t` back to floats. */
void cinfer_dequantize_row(cinfer_dtype t, const void *src, float *dst,
                           int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_DTYPE_H */
