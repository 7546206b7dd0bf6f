/*
 * sample.cuh - token choice on the CUDA backend, so that only token ids,
 * not rows of logits, come back to the host: the greedy choice of each row
 * (backend.h, cinfer_backend_greedy), and a draw as engine/sampler.c
 * makes it, bit for bit (cinfer_backend_choose: temperature, top_k, top_p
 * and min_p), after the sampler's stages 1-3 (logit_bias, min_tokens' mask,
 * the three penalties) applied to the rows where they are
 * (cinfer_backend_edit_logits), and the parts of the chosen tokens'
 * logprobs that need the whole row (cinfer_backend_logprobs); a grammar's
 * mask stays on the host.
 *
 *     out[r] = the index of the largest of x[r][0..n), the lowest on ties
 *              (-0.0 equals +0.0), as cinfer_sampler_argmax chooses;
 *              -1 when the whole row is -INFINITY; -2 - (2 i + nan) when
 *              x[r][i] is the row's first NaN (nan = 1) or +INFINITY
 *              (nan = 0).
 *
 * Exact: comparisons only, so the same token as the CPU backend and the
 * host sampler, whatever the order the threads meet the entries in.
 *
 *     cinfer_status s = cinfer_cuda_greedy(stream, logits, rows, n_vocab,
 *                                          tokens);
 *
 * Host launcher: checks its arguments, launches on `stream` (asynchronous),
 * returns CINFER_E_INVALID_ARG for bad arguments and CINFER_E_DEVICE if
 * the launch fails. Pointers are device memory.
 */
#ifndef CINFER_CUDA_SAMPLE_CUH
#define CINFER_CUDA_SAMPLE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x: [rows, n] F32, 1 <= n <= 2^28, rows <= 2^31 - 1; out: [rows] I32. */
cinfer_status cinfer_cuda_greedy(cudaStream_t stream, const float *x,
                                  int64_t rows, int64_t n, int32_t *out);

/* cinfer_backend_choose's rows (backend.h): draws [rows] in device memory.
 * x: [rows, n] F32, 1 <= n <= CINFER_CHOOSE_MAX_N; out: [rows] I32. */
cinfer_status cinfer_cuda_choose(cudaStream_t stream, const float *x,
                                  int64_t rows, int64_t n,
                                  const cinfer_draw *draws, int32_t *out);

/* cinfer_backend_logprobs' rows (backend.h): tokens, n_top [rows] and out
 * [rows] in device memory. x: [rows, n] F32, 1 <= n <=
 * CINFER_CHOOSE_MAX_N. */
cinfer_status cinfer_cuda_logprobs(cudaStream_t stream, const float *x,
                                   int64_t rows, int64_t n,
                                   const int32_t *tokens,
                                   const int32_t *n_top,
                                   cinfer_row_logprobs *out);

/* cinfer_backend_edit_logits' entries (backend.h) applied to x [rows, n]
 * F32 in place, the values they replace into raw [count]; with undo, raw
 * put back instead (cinfer_backend_unedit_logits). edits [count] and raw
 * in device memory, at most one entry per (row, token), each checked by
 * the caller. */
cinfer_status cinfer_cuda_edit_logits(cudaStream_t stream, float *x,
                                      int64_t rows, int64_t n,
                                      const cinfer_logit_edit *edits,
                                      int64_t count, float *raw, int undo);

/* w[i] = the weight choose gives x[i] (engine/sampler.h's
 * cinfer_sampler_weight, the same bits), for the tests. Device pointers;
 * asynchronous on `stream`. */
cinfer_status cinfer_cuda_sampler_weights(cudaStream_t stream, const float *x,
                                          int64_t n, float max, float inv_t,
                                          float min_w, float *w);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_SAMPLE_CUH */
