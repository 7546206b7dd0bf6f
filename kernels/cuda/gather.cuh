/*
 * gather.cuh - row gather on the CUDA backend: picks the rows of the final
 * hidden state whose logits a step wants (the last prompt token of each
 * prefill, every decode row) before the output norm and head.
 *
 *     out[j] = x[rows[j]]   for j < n_out
 *
 * A copy: the output is bit-identical to the input rows.
 *
 * Host launcher: checks its arguments, launches on `stream`, returns
 * CINFER_E_DEVICE if the launch fails. Pointers are device memory; rows are
 * checked against x's row count by the caller.
 *
 *     cinfer_status s = cinfer_cuda_gather_rows(stream, hidden, out_rows,
 *                                               n_out, n_embd, picked);
 */
#ifndef CINFER_CUDA_GATHER_CUH
#define CINFER_CUDA_GATHER_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[j] = x[rows[j]].  x: [*, d]; rows: [n_out]; out: [n_out, d] (not
 * overlapping x). */
cinfer_status cinfer_cuda_gather_rows(cudaStream_t stream, const float *x,
                                      const int32_t *rows, int32_t n_out,
                                      int64_t d, float *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_GATHER_CUH */
