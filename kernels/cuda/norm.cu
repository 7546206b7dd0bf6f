/*
 * norm.cu - RMSNorm (norm.cuh).
 *
 * A block of up to 1024 threads per row (a multiple of 32, no more than the
 * row needs): first pass sums squares into registers, a block reduction
 * gives every thread the row's sum, the second pass re-reads x (from L1/L2)
 * and writes the output. float4 loads when d % 4 == 0 and x, w, out are
 * 16-byte aligned.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_compat.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/norm.cuh"

#define MAX_THREADS 1024

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The sum of v over the block, returned to every thread. blockDim.x is a
 * multiple of 32; every thread of the block calls it. */
static __device__ float block_sum(float v)
{
    CINFER_SHARED(float, warp_sums, [MAX_THREADS / 32]);
    CINFER_SHARED(float, total, [1]);
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_warps = blockDim.x / 32;
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < n_warps ? warp_sums[lane] : 0.0f;
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0)
            total[0] = s;
    }
    __syncthreads();
    return total[0];
}

// Grid: (n), block (threads, a multiple of 32, <= MAX_THREADS): one block
// per row. VEC 4: d % 4 == 0 and x, w, out 16-byte aligned. x and out are
// not __restrict__ because out may alias x; each element is read (twice)
// and then written by the same thread.
template <int VEC>
__global__ void rms_norm_kernel(const float *x,              // [n, d]
                                const float *__restrict__ w, // [d]
                                float eps,
                                float *out, // [n, d]
                                int d)
{
    const float *xr = x + (int64_t)blockIdx.x * d;
    float *yr = out + (int64_t)blockIdx.x * d;
    const int nv = d / VEC;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        if (VEC == 4) {
            const float4 v = reinterpret_cast<const float4 *>(xr)[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        } else {
            const float v = xr[i];
            ss += v * v;
        }
    }
    const float sum = block_sum(ss);
    const float scale = 1.0f / sqrtf(sum / (float)d + eps);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        if (VEC == 4) {
            const float4 v = reinterpret_cast<const float4 *>(xr)[i];
            const float4 g = reinterpret_cast<const float4 *>(w)[i];
            float4 y;
            y.x = v.x * scale * g.x;
            y.y = v.y * scale * g.y;
            y.z = v.z * scale * g.z;
            y.w = v.w * scale * g.w;
            reinterpret_cast<float4 *>(yr)[i] = y;
        } else {
            yr[i] = xr[i] * scale * w[i];
        }
    }
}

extern "C" cinfer_status cinfer_cuda_rms_norm(cudaStream_t stream,
                                              const float *x, const float *w,
                                              float eps, float *out, int64_t n,
                                              int64_t d)
{
    if (n < 0 || n > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rms_norm: n %lld is not in 0..%d",
                                (long long)n, INT_MAX);
    if (d < 1 || d > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rms_norm: d %lld is not in 1..%d",
                                (long long)d, INT_MAX);
    if (!(eps >= 0.0f) || isinf(eps))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rms_norm: eps %g is not finite and >= 0",
                                (double)eps);
    if (n == 0)
        return CINFER_OK;
    if (!x || !w || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rms_norm: %s is NULL",
                                !x ? "x" : !w ? "w" : "out");
    const int vec =
        d % 4 == 0 && aligned16(x) && aligned16(w) && aligned16(out) ? 4 : 1;
    int64_t threads = (d / vec + 31) / 32 * 32;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    const dim3 grid((unsigned)n), block((unsigned)threads);
    switch (vec) {
    case 4:
        CINFER_LAUNCH(rms_norm_kernel<4>, grid, block, 0, stream, x, w, eps,
                      out, (int)d);
        break;
    case 1:
        CINFER_LAUNCH(rms_norm_kernel<1>, grid, block, 0, stream, x, w, eps,
                      out, (int)d);
        break;
    default:
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda rms_norm: vector width %d", vec);
    }
    CINFER_CUDA_TRY_LAUNCH("rms_norm_kernel");
    return CINFER_OK;
}
