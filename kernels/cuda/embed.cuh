/*
 * embed.cuh - token embedding lookup on the CUDA backend: the first op of a
 * Llama-family forward pass, one row of the token table per step row.
 *
 *     out[r] = dequantize(table[tokens[r]])
 *
 * The table keeps its file type on the device (F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1; block layouts in kernels/dtype.h) and each row is decoded exactly
 * as cinfer_dequantize_row does on the CPU (Q8_0: d * q; Q4_0:
 * d * (q - 8); Q4_1: d * q + m, the product rounded before the add), so the
 * output matches the CPU backend's bit for bit.
 *
 * Host launcher: checks its arguments, launches on `stream`, returns
 * CINFER_E_DEVICE if the launch fails. Pointers are device memory; tokens
 * are checked against vocab by the caller.
 *
 *     cinfer_status s = cinfer_cuda_embed(stream, CINFER_DTYPE_Q8_0, tok_embd,
 *                                         n_vocab, n_embd, tokens, n_rows, x);
 */
#ifndef CINFER_CUDA_EMBED_CUH
#define CINFER_CUDA_EMBED_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r] = table[tokens[r]] as floats, r < n.  table: [vocab, d] of dtype
 * (d a multiple of 32 for the block types); tokens: [n], each < vocab;
 * out: [n, d] F32. */
cinfer_status cinfer_cuda_embed(cudaStream_t stream, cinfer_dtype dtype,
                                const void *table, int64_t vocab, int64_t d,
                                const int32_t *tokens, int32_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_EMBED_CUH */
