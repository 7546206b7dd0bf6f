/*
 * norm.cuh - RMSNorm on the CUDA backend: the normalisation before each
 * attention and feed-forward block and before the output head of a
 * Llama-family model.
 *
 *     out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w
 *
 * One thread block per row: its threads sum the squares in fp32 (each a
 * strided part of the row, then a shuffle tree and a tree over the warps),
 * so a row's result does not depend on the other rows of the batch. The
 * scale is 1 / sqrtf(mean + eps) and each output x * scale * w, as the CPU
 * backend computes them (kernels/cpu/ops.c, which sums in double: the two
 * agree to float rounding).
 *
 * Host launcher: checks its arguments, launches on `stream`, returns
 * CINFER_E_DEVICE if the launch fails. Pointers are device memory.
 *
 *     cinfer_status s = cinfer_cuda_rms_norm(stream, x, attn_norm_w, 1e-5f,
 *                                             h, n_rows, n_embd);
 *     // the residual add and the next norm, one launch:
 *     s = cinfer_cuda_add_rms_norm(stream, x, h, ffn_norm_w, 1e-5f, h,
 *                                  n_rows, n_embd);
 */
#ifndef CINFER_CUDA_NORM_CUH
#define CINFER_CUDA_NORM_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for r < n.  x, out: [n, d]
 * (out may alias x); w: [d]. eps must be finite and >= 0. */
cinfer_status cinfer_cuda_rms_norm(cudaStream_t stream, const float *x,
                                   const float *w, float eps, float *out,
                                   int64_t n, int64_t d);

/* The residual add and the norm after it, in one launch: x[r] += dx[r],
 * then out[r] = rms_norm(x[r]) * w, the bits of cinfer_cuda_add followed
 * by cinfer_cuda_rms_norm. out may alias dx, not x. */
cinfer_status cinfer_cuda_add_rms_norm(cudaStream_t stream, float *x,
                                       const float *dx, const float *w,
                                       float eps, float *out, int64_t n,
                                       int64_t d);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_NORM_CUH */
