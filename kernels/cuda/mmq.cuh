/*
 * mmq.cuh - tiled quantized matrix products for batches of rows (prefill):
 * out = x * w^T with w in Q8_0, Q4_0 or Q4_1 and x already in Q8_1 blocks
 * (quantize.cuh).
 *
 * The model is llama.cpp's ggml-cuda mmq.cuh. Two kernels, the same bits:
 *   - dp4a (any GPU): a CTA computes a 16 x 16 tile of outputs; per step
 *     along k it stages 32 blocks (1024 elements) of 16 weight rows and of
 *     16 activation rows in shared memory, and every weight block there is
 *     used by 16 rows. Thread (warp g, lane s) takes block s of the step
 *     for 4 rows x 8 weight rows, so lane s is reduction slot s of
 *     mmvq.cuh; the slots are added by a reduce-scatter across the warp
 *     (lane bit 4 first), which leaves lane l with output l of the warp's
 *     32.
 *   - int8 mma (sm_80 and later; mma.cuh): a CTA computes 32 activation
 *     rows x 64 weight rows, a warp 16 x 16 through mma.sync m16n8k32, one
 *     instruction per 32-element block, so its int32 results are the
 *     blocks' exact integer dot products. The CTA walks k slot by slot, in
 *     the order that makes the slot tree's pairs neighbours (slot = the
 *     5-bit reversal of the walk's position), a slot's blocks in
 *     increasing b, and folds each finished slot into a binary counter of
 *     5 partial sums, so a thread keeps 6 floats per output, not 32.
 * Each output element therefore has exactly the float operations of
 * cinfer_cuda_mmvq in both: the kernels give the same bits for a row, and
 * a row gives the same bits alone and in any batch.
 *
 *     // xq from cinfer_cuda_quantize_q8_1(stream, x, xq, n, k), any n >= 1
 *     cinfer_cuda_mmq(stream, CINFER_DTYPE_Q8_0, w, n_out, xq, n, k, out);
 *
 * The launcher is asynchronous on `stream`; it returns CINFER_E_INVALID_ARG
 * or CINFER_E_UNSUPPORTED for bad arguments (nothing launched) and
 * CINFER_E_DEVICE for a failed launch.
 */
#ifndef CINFER_CUDA_MMQ_CUH
#define CINFER_CUDA_MMQ_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most activation rows cinfer_cuda_mmq takes (the grid's y limit). */
#define CINFER_CUDA_MMQ_MAX_ROWS (65535 * 16)

/* out[r][o] = dot(x[r], w[o]) for r < n, o < n_out.
 * w: [n_out, k / 32] blocks of w_type (Q8_0, Q4_0 or Q4_1; GGML's layout),
 * 2-byte aligned; xq: [n, k / 32] cinfer_block_q8_1, 4-byte aligned;
 * out: [n, n_out] F32. 1 <= n <= CINFER_CUDA_MMQ_MAX_ROWS, k a positive
 * multiple of 32. */
cinfer_status cinfer_cuda_mmq(cudaStream_t stream, cinfer_dtype w_type,
                              const void *w, int64_t n_out, const void *xq,
                              int32_t n, int64_t k, float *out);

/* Most weights one launch takes (cinfer_cuda_mmq_set). */
#define CINFER_CUDA_MMQ_MAX_W 4

/* cinfer_cuda_mmq for n_w (1..CINFER_CUDA_MMQ_MAX_W) weights of one type
 * that share the input xq, in one launch: out[i] = x * w[i]^T, [n,
 * n_out[i]], each element the bits cinfer_cuda_mmq gives it alone. */
cinfer_status cinfer_cuda_mmq_set(cudaStream_t stream, cinfer_dtype w_type,
                                  int n_w, const void *const *w,
                                  const int64_t *n_out, const void *xq,
                                  int32_t n, int64_t k, float *const *out);

/* Which kernel cinfer_cuda_mmq_set_kernel runs. AUTO: what the
 * environment's CINFER_CUDA_MMQ says (dp4a or mma, read once: for A/B
 * runs, scripts/gpu-check.sh's), else MMA where the device has int8 mma
 * (sm_80 and later; the harness says sm_90), else DP4A. The two give the
 * same bits. */
typedef enum {
    CINFER_CUDA_MMQ_AUTO = 0,
    CINFER_CUDA_MMQ_DP4A = 1, /* dp4a, 16 x 16 tiles */
    CINFER_CUDA_MMQ_MMA = 2,  /* mma.sync m16n8k32, 64 x 32 tiles */
} cinfer_cuda_mmq_kernel;

/* cinfer_cuda_mmq_set on the kernel named (the tests run both). MMA on a
 * GPU older than sm_80 runs mma's shuffle form (mma.cuh): right, slow. */
cinfer_status cinfer_cuda_mmq_set_kernel(cudaStream_t stream,
                                         cinfer_cuda_mmq_kernel kernel,
                                         cinfer_dtype w_type, int n_w,
                                         const void *const *w,
                                         const int64_t *n_out, const void *xq,
                                         int32_t n, int64_t k,
                                         float *const *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_MMQ_CUH */
