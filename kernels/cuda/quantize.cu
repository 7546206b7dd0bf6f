/*
 * quantize.cu - F32 activations to Q8_1 blocks and to F16 / BF16 copies.
 * See quantize.cuh.
 */
#include "kernels/cuda/quantize.cuh"

#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"

#define QUANT_WARPS 8 /* Q8_1 blocks per CTA, one per warp */
#define CONVERT_THREADS 256
#define FULL_MASK 0xffffffffu

/* ---------------------------------------------------------------------- */
/* kernels                                                                 */
/* ---------------------------------------------------------------------- */

// Grid: (ceil(n_blocks / QUANT_WARPS)), block (32 * QUANT_WARPS): warp w of
// CTA c quantizes block c * QUANT_WARPS + w, lane l its element l.
__global__ void quantize_q8_1_kernel(
    const float *__restrict__ x,          // [n_blocks * 32]
    cinfer_block_q8_1 *__restrict__ xq,   // [n_blocks]
    int64_t n_blocks)
{
    const int64_t blk =
        (int64_t)blockIdx.x * QUANT_WARPS + (int64_t)(threadIdx.x / 32);
    const int lane = (int)(threadIdx.x % 32);
    if (blk >= n_blocks)
        return; /* the whole warp leaves together */

    const float v = x[blk * CINFER_QK + lane];
    float amax = fabsf(v);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, m));

    /* kernels/dtype.c's quant_q8: the same operations in the same order, so
     * the bytes match the CPU's */
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)rintf(v * id);
    int sum = q;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        sum += __shfl_xor_sync(FULL_MASK, sum, m);

    xq[blk].qs[lane] = (int8_t)q;
    if (lane == 0) {
        xq[blk].d = __half_as_ushort(__float2half_rn(d));
        xq[blk].s = __half_as_ushort(__float2half_rn(d * (float)sum));
    }
}

// Grid: (ceil(count / CONVERT_THREADS)), block (CONVERT_THREADS): one
// element per thread.
__global__ void convert_f16_kernel(const float *__restrict__ x, // [count]
                                   __half *__restrict__ dst,     // [count]
                                   int64_t count)
{
    const int64_t i = (int64_t)blockIdx.x * CONVERT_THREADS + threadIdx.x;
    if (i < count)
        dst[i] = __float2half_rn(x[i]);
}

// Grid: (ceil(count / CONVERT_THREADS)), block (CONVERT_THREADS).
__global__ void convert_bf16_kernel(const float *__restrict__ x,      // [count]
                                    __nv_bfloat16 *__restrict__ dst,  // [count]
                                    int64_t count)
{
    const int64_t i = (int64_t)blockIdx.x * CONVERT_THREADS + threadIdx.x;
    if (i < count)
        dst[i] = __float2bfloat16_rn(x[i]);
}

/* ---------------------------------------------------------------------- */
/* launchers                                                               */
/* ---------------------------------------------------------------------- */

#define MAX_GRID_X 2147483647LL

extern "C" size_t cinfer_cuda_q8_1_bytes(int32_t n, int64_t k)
{
    if (n < 0 || k < 0 || k % CINFER_QK != 0)
        return 0;
    return (size_t)n * (size_t)(k / CINFER_QK) * sizeof(cinfer_block_q8_1);
}

extern "C" cinfer_status cinfer_cuda_quantize_q8_1(cudaStream_t stream,
                                                   const float *x, void *xq,
                                                   int32_t n, int64_t k)
{
    if (x == NULL || xq == NULL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda quantize_q8_1: x and xq must be set");
    if ((uintptr_t)xq % 4 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda quantize_q8_1: xq must be 4-byte aligned");
    if (n < 1 || k < CINFER_QK || k % CINFER_QK != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda quantize_q8_1: n = %d, k = %lld (need "
                                "n >= 1, k a positive multiple of 32)",
                                (int)n, (long long)k);
    const int64_t n_blocks = (int64_t)n * (k / CINFER_QK);
    const int64_t grid = (n_blocks + QUANT_WARPS - 1) / QUANT_WARPS;
    if (grid > MAX_GRID_X)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda quantize_q8_1: n * k = %lld too large",
                                (long long)(n_blocks * CINFER_QK));
    CINFER_LAUNCH(quantize_q8_1_kernel, dim3((unsigned)grid),
                  dim3(32 * QUANT_WARPS), 0, stream, x,
                  (cinfer_block_q8_1 *)xq, n_blocks);
    CINFER_CUDA_TRY_LAUNCH("quantize_q8_1_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_convert_f32(cudaStream_t stream,
                                                 cinfer_dtype dst_type,
                                                 const float *x, void *dst,
                                                 int64_t count)
{
    if (x == NULL || dst == NULL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda convert_f32: x and dst must be set");
    if ((uintptr_t)dst % 2 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda convert_f32: dst must be 2-byte aligned");
    const int64_t grid = count < 1 ? 0 : (count + CONVERT_THREADS - 1) / CONVERT_THREADS;
    if (grid < 1 || grid > MAX_GRID_X)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda convert_f32: count = %lld out of range",
                                (long long)count);
    switch (dst_type) {
    case CINFER_DTYPE_F16:
        CINFER_LAUNCH(convert_f16_kernel, dim3((unsigned)grid),
                      dim3(CONVERT_THREADS), 0, stream, x, (__half *)dst,
                      count);
        CINFER_CUDA_TRY_LAUNCH("convert_f16_kernel");
        return CINFER_OK;
    case CINFER_DTYPE_BF16:
        CINFER_LAUNCH(convert_bf16_kernel, dim3((unsigned)grid),
                      dim3(CONVERT_THREADS), 0, stream, x,
                      (__nv_bfloat16 *)dst, count);
        CINFER_CUDA_TRY_LAUNCH("convert_bf16_kernel");
        return CINFER_OK;
    default:
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda convert_f32: dst_type %s (need F16 or "
                                "BF16)",
                                cinfer_dtype_name(dst_type));
    }
}
