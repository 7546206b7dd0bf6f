/*
 * quantize.cuh - activation preparation for the matrix products: F32 rows to
 * Q8_1 blocks (for the quantized kernels in mmvq.cu / mmq.cu) and F32 to
 * F16 / BF16 copies (for cuBLAS).
 *
 * Q8_1 is computed exactly as kernels/dtype.c's cinfer_quantize_row does on
 * the CPU (the form GGML's x86 quantize_row_q8_1 uses): per block of 32,
 * d = amax / 127, q = round-half-even(x * (127 / amax)), s = d * sum(q),
 * d and s stored as f16 rounded to nearest even, so a row quantized here has
 * the CPU's bytes. One warp quantizes one block, as in ggml-cuda's
 * quantize_q8_1 (a lane per element, amax and sum by warp reduction).
 *
 *     // x: [n, k] F32 on the device, k a multiple of 32
 *     // xq: n * (k / 32) blocks of cinfer_block_q8_1 on the device
 *     cinfer_status st = cinfer_cuda_quantize_q8_1(stream, x, xq, n, k);
 *
 * Launchers are asynchronous on `stream`; they return CINFER_E_INVALID_ARG
 * for bad arguments (nothing launched) and CINFER_E_DEVICE for a failed
 * launch. Thread safety: as the stream's.
 */
#ifndef CINFER_CUDA_QUANTIZE_CUH
#define CINFER_CUDA_QUANTIZE_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of n rows of k elements as Q8_1 blocks (0 if k % 32 != 0). */
size_t cinfer_cuda_q8_1_bytes(int32_t n, int64_t k);

/* xq = Q8_1(x).  x: [n, k] F32; xq: [n, k / 32] cinfer_block_q8_1, 4-byte
 * aligned. n >= 1, k >= 32 and a multiple of 32. */
cinfer_status cinfer_cuda_quantize_q8_1(cudaStream_t stream, const float *x,
                                        void *xq, int32_t n, int64_t k);

/* dst = x converted to `dst_type` (CINFER_DTYPE_F16 or CINFER_DTYPE_BF16),
 * rounding to nearest even.  x: [count] F32; dst: [count], 2-byte aligned.
 * count >= 1. */
cinfer_status cinfer_cuda_convert_f32(cudaStream_t stream,
                                      cinfer_dtype dst_type, const float *x,
                                      void *dst, int64_t count);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_QUANTIZE_CUH */
