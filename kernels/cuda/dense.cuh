/*
 * dense.cuh - float-weight products whose bits a row fixes alone: the
 * batch-invariant path for F32, F16 and BF16 weights (backend.h's batch
 * invariance; cinfer_backend_cuda_params.batch_invariant), where cuBLAS
 * picks its algorithm, tiling and split-K by the batch's shape, so a row's
 * result would change with its neighbours.
 *
 * One warp per output element and up to 8 activation rows: lane l sums
 * k = l, l + 32, l + 64, ... in increasing order with fmaf (the weight
 * widened to f32 exactly), then the 32 lanes are added as a binary tree
 * (xor 16, 8, 4, 2, 1). Nothing depends on n or on the other rows.
 * Correct and invariant, not tuned: F32 weights take it; F16 and BF16
 * take cinfer_cuda_dense_mma below, on tensor cores. What each costs
 * against cuBLAS is for a device to measure.
 *
 *     cinfer_cuda_dense(stream, CINFER_DTYPE_F32, w, n_out, x, n, k, out);
 *     cinfer_cuda_dense_mma(stream, CINFER_DTYPE_BF16, w, n_out, xb16, n, k,
 *                           out);
 *
 * Asynchronous on `stream`; CINFER_E_INVALID_ARG for bad arguments
 * (nothing launched), CINFER_E_DEVICE for a failed launch.
 */
#ifndef CINFER_CUDA_DENSE_CUH
#define CINFER_CUDA_DENSE_CUH

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r][o] = dot(x[r], w[o]) for r < n, o < n_out. w: [n_out, k] of
 * w_type (F32, F16 or BF16), x: [n, k] F32, out: [n, n_out] F32. */
cinfer_status cinfer_cuda_dense(cudaStream_t stream, cinfer_dtype w_type,
                                const void *w, int64_t n_out, const float *x,
                                int32_t n, int64_t k, float *out);

/* The same product for F16 and BF16 weights on tensor cores (mma.sync
 * m16n8k16, f32 accumulators; mma.cuh), over x already rounded to the
 * weights' type (x16: [n, k] F16 or BF16, the copy the cuBLAS path
 * multiplies too). Every output sums its k in steps of 16, in increasing
 * order, each step one instruction over the same 16 products, whatever
 * the tile: a block takes 16 activation rows and 32 weight rows when n
 * <= 16, 64 and 64 above, and a row's bits are the same either way.
 * Asynchronous; CINFER_E_INVALID_ARG for bad arguments. */
cinfer_status cinfer_cuda_dense_mma(cudaStream_t stream, cinfer_dtype w_type,
                                    const void *w, int64_t n_out,
                                    const void *x16, int32_t n, int64_t k,
                                    float *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_DENSE_CUH */
