/*
 * gather.cu - row gather (gather.cuh).
 *
 * A row per blockIdx.x, its columns strided over blockIdx.y and the
 * threads; float4 copies when d % 4 == 0 and x, out are 16-byte aligned.
 */
#include "kernels/cuda/cuda_compat.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gather.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// Grid: (n_out, min(ceil(d / VEC / THREADS), MAX_BLOCKS)), block (THREADS).
// VEC 4: d % 4 == 0 and x, out 16-byte aligned.
template <int VEC>
__global__ void gather_rows_kernel(const float *__restrict__ x,      // [*, d]
                                   const int32_t *__restrict__ rows, // [n_out]
                                   int64_t d,
                                   float *__restrict__ out) // [n_out, d]
{
    const float *src = x + (int64_t)rows[blockIdx.x] * d;
    float *dst = out + (int64_t)blockIdx.x * d;
    const int64_t stride = (int64_t)gridDim.y * blockDim.x;
    const int64_t t = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (VEC == 4) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        float4 *d4 = reinterpret_cast<float4 *>(dst);
        for (int64_t i = t; i < d / 4; i += stride)
            d4[i] = s4[i];
    } else {
        for (int64_t i = t; i < d; i += stride)
            dst[i] = src[i];
    }
}

extern "C" cinfer_status cinfer_cuda_gather_rows(cudaStream_t stream,
                                                 const float *x,
                                                 const int32_t *rows,
                                                 int32_t n_out, int64_t d,
                                                 float *out)
{
    if (n_out < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda gather_rows: n_out %d is negative",
                                (int)n_out);
    if (d < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda gather_rows: d %lld is negative",
                                (long long)d);
    if (n_out == 0 || d == 0)
        return CINFER_OK;
    if (!x || !rows || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda gather_rows: %s is NULL",
                                !x ? "x" : !rows ? "rows" : "out");
    const int vec = d % 4 == 0 && aligned16(x) && aligned16(out) ? 4 : 1;
    const int64_t cols = (d / vec + THREADS - 1) / THREADS;
    const dim3 grid((unsigned)n_out,
                    (unsigned)(cols < MAX_BLOCKS ? cols : MAX_BLOCKS));
    switch (vec) {
    case 4:
        CINFER_LAUNCH(gather_rows_kernel<4>, grid, dim3(THREADS), 0, stream, x,
                      rows, d, out);
        break;
    case 1:
        CINFER_LAUNCH(gather_rows_kernel<1>, grid, dim3(THREADS), 0, stream, x,
                      rows, d, out);
        break;
    default:
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda gather_rows: vector width %d", vec);
    }
    CINFER_CUDA_TRY_LAUNCH("gather_rows_kernel");
    return CINFER_OK;
}
