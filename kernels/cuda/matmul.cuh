/*
 * matmul.cuh - the CUDA backend's matmul: up to 4 weights of any supported
 * type against one F32 input, the input prepared once per format.
 *
 * The model is ggml-cuda's mul_mat dispatch: F32 / F16 / BF16 weights go to
 * cuBLAS (cublasGemmEx, fp32 compute, the activations converted to the
 * weight's type); Q8_0 / Q4_0 / Q4_1 weights stay quantized and meet Q8_1
 * activations in cinfer_cuda_mmvq_set (n <= 8 rows) or cinfer_cuda_mmq_set
 * (more rows), consecutive weights of one type in one launch, as Q, K and
 * V or gate and up are. `cublas` may be NULL
 * when no weight is F32, F16 or BF16. The two quantized kernels share one
 * reduction order (mmvq.cuh), so
 * a row's outputs over quantized weights do not depend on n. cuBLAS picks
 * its kernel by shape, so over F32 / F16 / BF16 weights they can; with
 * batch_invariant those go to our kernels instead (dense.cuh: F32 to
 * cinfer_cuda_dense, F16 / BF16 over the same rounded copy of x to
 * cinfer_cuda_dense_mma, on tensor cores), whose bits a row fixes alone.
 *
 *     size_t sb = cinfer_cuda_matmul_scratch_bytes(n, k);   // once, max n
 *     cinfer_cuda_mm_weight w[3] = {
 *         {CINFER_DTYPE_Q4_0, wq_dev, n_q, q_dev},
 *         {CINFER_DTYPE_Q4_0, wk_dev, n_kv, k_dev},
 *         {CINFER_DTYPE_F16, wv_dev, n_kv, v_dev},
 *     };
 *     st = cinfer_cuda_matmul(stream, cublas, 3, w, h_dev, n, k, scratch, sb,
 *                             0);
 *
 * Asynchronous on `stream` (the cuBLAS handle is set to it). Arguments are
 * checked before anything is launched: CINFER_E_INVALID_ARG or
 * CINFER_E_UNSUPPORTED naming the argument; a failed launch or cuBLAS call
 * returns CINFER_E_DEVICE (weights before it have been computed). Thread
 * safety: one caller per stream and handle at a time.
 */
#ifndef CINFER_CUDA_MATMUL_CUH
#define CINFER_CUDA_MATMUL_CUH

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    cinfer_dtype dtype; /* F32, F16, BF16, Q8_0, Q4_0 or Q4_1 */
    const void *data;   /* [n_out, k] device memory, the file's layout (whole
                           blocks per row); borrowed for the call */
    int64_t n_out;      /* weight rows, >= 1 */
    float *out;         /* [n, n_out] device, F32; written */
} cinfer_cuda_mm_weight;

/* For each i < n_w (1..4): w[i].out = x * w[i]^T, i.e.
 * out[r][o] = dot(x[r], w[i][o]).  x: [n, k] F32 device, n >= 1.
 * The input is prepared once per format the weights need (Q8_1 blocks for
 * the quantized types; an F16 or BF16 copy for cuBLAS) in `scratch`
 * (device, 16-byte aligned as cudaMalloc's pointers are, at least
 * cinfer_cuda_matmul_scratch_bytes(n, k) bytes; overwritten). k must be a multiple of 32 for the
 * quantized types. Outputs must not overlap x, scratch or each other. */
cinfer_status cinfer_cuda_matmul(cudaStream_t stream, cublasHandle_t cublas,
                                 int n_w, const cinfer_cuda_mm_weight *w,
                                 const float *x, int32_t n, int64_t k,
                                 void *scratch, size_t scratch_bytes,
                                 int batch_invariant);

/* The gate and up products and SwiGLU after them: cinfer_cuda_matmul of
 * w[0] (gate) and w[1] (up) followed by cinfer_cuda_silu_mul(w[0].out,
 * w[1].out, w[0].out), the same bits. With n <= 8 rows and both weights of
 * one quantized type and shape, one launch after the activations'
 * quantization, and w[1].out is not written. */
cinfer_status cinfer_cuda_matmul_silu_mul(cudaStream_t stream,
                                          cublasHandle_t cublas,
                                          const cinfer_cuda_mm_weight *w,
                                          const float *x, int32_t n,
                                          int64_t k, void *scratch,
                                          size_t scratch_bytes,
                                          int batch_invariant);

/* Scratch cinfer_cuda_matmul needs for n rows of k inputs, whatever the
 * weight types (0 for n < 1 or k < 1). */
size_t cinfer_cuda_matmul_scratch_bytes(int32_t n, int64_t k);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_MATMUL_CUH */
