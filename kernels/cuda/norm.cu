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
// per row. VEC 4: d % 4 == 0 and x, dx, w, out 16-byte aligned. ADD: the
// residual add first, x[r] += dx[r], stored back to x, the norm then taken
// of the sum (add_rms_norm: the same arithmetic as the add kernel followed
// by this one without ADD, so the same bits). No pointer is __restrict__:
// out may alias x (without ADD) or dx (with it); each element is read and
// then written by the same thread.
template <int VEC, int ADD>
__global__ void rms_norm_kernel(float *x,        // [n, d]
                                const float *dx, // [n, d] (ADD)
                                const float *__restrict__ w, // [d]
                                float eps,
                                float *out, // [n, d]
                                int d)
{
    float *xr = x + (int64_t)blockIdx.x * d;
    const float *dr = ADD ? dx + (int64_t)blockIdx.x * d : nullptr;
    float *yr = out + (int64_t)blockIdx.x * d;
    const int nv = d / VEC;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        if (VEC == 4) {
            float4 v = reinterpret_cast<const float4 *>(xr)[i];
            if (ADD) {
                const float4 e = reinterpret_cast<const float4 *>(dr)[i];
                v.x = v.x + e.x;
                v.y = v.y + e.y;
                v.z = v.z + e.z;
                v.w = v.w + e.w;
                reinterpret_cast<float4 *>(xr)[i] = v;
            }
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        } else {
            float v = xr[i];
            if (ADD) {
                v = v + dr[i];
                xr[i] = v;
            }
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

/* Both launchers: checks, then one block per row. */
static cinfer_status norm_launch(cudaStream_t stream, const char *name,
                                 float *x, const float *dx, const float *w,
                                 float eps, float *out, int64_t n, int64_t d)
{
    if (n < 0 || n > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda %s: n %lld is not in 0..%d", name,
                                (long long)n, INT_MAX);
    if (d < 1 || d > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda %s: d %lld is not in 1..%d", name,
                                (long long)d, INT_MAX);
    if (!(eps >= 0.0f) || isinf(eps))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda %s: eps %g is not finite and >= 0", name,
                                (double)eps);
    if (n == 0)
        return CINFER_OK;
    const int add = dx != nullptr;
    if (!x || !w || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "cuda %s: %s is NULL",
                                name, !x ? "x" : !w ? "w" : "out");
    const int vec = d % 4 == 0 && aligned16(x) && (!add || aligned16(dx)) &&
                            aligned16(w) && aligned16(out)
                        ? 4
                        : 1;
    int64_t threads = (d / vec + 31) / 32 * 32;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    const dim3 grid((unsigned)n), block((unsigned)threads);
    if (vec == 4 && add)
        CINFER_LAUNCH((rms_norm_kernel<4, 1>), grid, block, 0, stream, x, dx,
                      w, eps, out, (int)d);
    else if (vec == 4)
        CINFER_LAUNCH((rms_norm_kernel<4, 0>), grid, block, 0, stream, x, dx,
                      w, eps, out, (int)d);
    else if (add)
        CINFER_LAUNCH((rms_norm_kernel<1, 1>), grid, block, 0, stream, x, dx,
                      w, eps, out, (int)d);
    else
        CINFER_LAUNCH((rms_norm_kernel<1, 0>), grid, block, 0, stream, x, dx,
                      w, eps, out, (int)d);
    CINFER_CUDA_TRY_LAUNCH("rms_norm_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_rms_norm(cudaStream_t stream,
                                              const float *x, const float *w,
                                              float eps, float *out, int64_t n,
                                              int64_t d)
{
    /* without ADD the kernel only reads x */
    return norm_launch(stream, "rms_norm", (float *)x, nullptr, w, eps, out,
                       n, d);
}

extern "C" cinfer_status cinfer_cuda_add_rms_norm(cudaStream_t stream,
                                                  float *x, const float *dx,
                                                  const float *w, float eps,
                                                  float *out, int64_t n,
                                                  int64_t d)
{
    if (!dx)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda add_rms_norm: dx is NULL");
    return norm_launch(stream, "add_rms_norm", x, dx, w, eps, out, n, d);
}
