/*
 * dense.cu - the batch-invariant float-weight product (dense.cuh).
 */
#include "kernels/cuda/dense.cuh"

#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"

#define DENSE_ROWS 8 /* activation rows per CTA */
#define FULL_MASK 0xffffffffu
#define MAX_GRID 65535

template <cinfer_dtype T> __device__ __forceinline__ float dense_w(const void *w, int64_t i);

template <> __device__ __forceinline__ float dense_w<CINFER_DTYPE_F32>(const void *w, int64_t i)
{
    return ((const float *)w)[i];
}

template <> __device__ __forceinline__ float dense_w<CINFER_DTYPE_F16>(const void *w, int64_t i)
{
    return __half2float(__ushort_as_half(((const unsigned short *)w)[i]));
}

template <> __device__ __forceinline__ float dense_w<CINFER_DTYPE_BF16>(const void *w, int64_t i)
{
    return __uint_as_float((unsigned)((const unsigned short *)w)[i] << 16);
}

/* grid.x: weight rows (o = blockIdx.x + MAX_GRID * blockIdx.z), grid.y:
 * chunks of DENSE_ROWS activation rows; one warp. */
template <cinfer_dtype T>
__global__ void __launch_bounds__(32)
dense_kernel(const void *__restrict__ w, const float *__restrict__ x,
             float *__restrict__ out, int64_t n_out, int32_t n, int64_t k)
{
    const int lane = (int)threadIdx.x;
    const int64_t o = (int64_t)blockIdx.x + (int64_t)MAX_GRID * blockIdx.z;
    if (o >= n_out)
        return; /* uniform over the warp */
    const int32_t r0 = (int32_t)blockIdx.y * DENSE_ROWS;
    const int32_t nr = n - r0 < DENSE_ROWS ? n - r0 : DENSE_ROWS;
    float acc[DENSE_ROWS];
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; r++)
        acc[r] = 0.0f;
    const int64_t wrow = o * k;
    for (int64_t j = lane; j < k; j += 32) {
        const float wv = dense_w<T>(w, wrow + j);
#pragma unroll
        for (int r = 0; r < DENSE_ROWS; r++)
            if (r < nr)
                acc[r] = fmaf(wv, x[(int64_t)(r0 + r) * k + j], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; r++) {
        float v = acc[r];
        v += __shfl_xor_sync(FULL_MASK, v, 16);
        v += __shfl_xor_sync(FULL_MASK, v, 8);
        v += __shfl_xor_sync(FULL_MASK, v, 4);
        v += __shfl_xor_sync(FULL_MASK, v, 2);
        v += __shfl_xor_sync(FULL_MASK, v, 1);
        if (lane == 0 && r < nr)
            out[(int64_t)(r0 + r) * n_out + o] = v;
    }
}

extern "C" cinfer_status cinfer_cuda_dense(cudaStream_t stream,
                                           cinfer_dtype w_type, const void *w,
                                           int64_t n_out, const float *x,
                                           int32_t n, int64_t k, float *out)
{
    if (!w || !x || !out || n < 1 || k < 1 || n_out < 1 ||
        (int64_t)n * k > ((int64_t)1 << 40))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense: bad arguments (n %d, k %lld, "
                                "n_out %lld)",
                                (int)n, (long long)k, (long long)n_out);
    const int64_t zs = (n_out + MAX_GRID - 1) / MAX_GRID;
    const int64_t ys = ((int64_t)n + DENSE_ROWS - 1) / DENSE_ROWS;
    if (zs > MAX_GRID || ys > MAX_GRID)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense: %lld outputs x %d rows is past "
                                "the grid",
                                (long long)n_out, (int)n);
    const dim3 grid((unsigned)(n_out < MAX_GRID ? n_out : MAX_GRID),
                    (unsigned)ys, (unsigned)zs),
        block(32);
    switch (w_type) {
    case CINFER_DTYPE_F32:
        CINFER_LAUNCH((dense_kernel<CINFER_DTYPE_F32>), grid, block, 0, stream,
                      w, x, out, n_out, n, k);
        break;
    case CINFER_DTYPE_F16:
        CINFER_LAUNCH((dense_kernel<CINFER_DTYPE_F16>), grid, block, 0, stream,
                      w, x, out, n_out, n, k);
        break;
    case CINFER_DTYPE_BF16:
        CINFER_LAUNCH((dense_kernel<CINFER_DTYPE_BF16>), grid, block, 0, stream,
                      w, x, out, n_out, n, k);
        break;
    default:
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense: weight type %s (F32, F16 or "
                                "BF16)",
                                cinfer_dtype_name(w_type));
    }
    CINFER_CUDA_TRY_LAUNCH("dense_kernel");
    return CINFER_OK;
}
