/*
 * elementwise.cu - add, add_bias and silu_mul (elementwise.cuh).
 *
 * Memory-bound: each kernel is a grid-stride loop over float4 groups when
 * every pointer is 16-byte aligned (the tail, n % 4 elements, scalar), and
 * over single floats otherwise. Pointers that an output may alias are not
 * __restrict__: the compiler must not assume they are distinct.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_compat.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Blocks for a grid-stride loop over `units` work items. */
static unsigned flat_blocks(int64_t units)
{
    int64_t b = (units + THREADS - 1) / THREADS;
    if (b < 1)
        b = 1;
    return (unsigned)(b < MAX_BLOCKS ? b : MAX_BLOCKS);
}

static __device__ __forceinline__ float silu_mul1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* ---------------------------------------------------------------------- */
/* add                                                                     */
/* ---------------------------------------------------------------------- */

// Grid: (min(ceil(n / VEC / THREADS), MAX_BLOCKS)), block (THREADS).
// VEC 4: a, b and out are 16-byte aligned.
template <int VEC>
__global__ void add_kernel(const float *a, // [n]
                           const float *b, // [n]
                           float *out,     // [n], may alias a or b
                           int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (VEC == 4) {
        const int64_t n4 = n / 4;
        for (int64_t i = t; i < n4; i += stride) {
            const float4 x = reinterpret_cast<const float4 *>(a)[i];
            const float4 y = reinterpret_cast<const float4 *>(b)[i];
            float4 z;
            z.x = x.x + y.x;
            z.y = x.y + y.y;
            z.z = x.z + y.z;
            z.w = x.w + y.w;
            reinterpret_cast<float4 *>(out)[i] = z;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + t; i < n; i += stride)
        out[i] = a[i] + b[i];
}

extern "C" cinfer_status cinfer_cuda_add(cudaStream_t stream, const float *a,
                                         const float *b, float *out,
                                         int64_t n_elems)
{
    if (n_elems < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda add: n_elems %lld is negative",
                                (long long)n_elems);
    if (n_elems == 0)
        return CINFER_OK;
    if (!a || !b || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda add: %s is NULL",
                                !a ? "a" : !b ? "b" : "out");
    const int vec = aligned16(a) && aligned16(b) && aligned16(out) ? 4 : 1;
    const dim3 grid(flat_blocks(vec == 4 ? n_elems / 4 + 1 : n_elems));
    switch (vec) {
    case 4:
        CINFER_LAUNCH(add_kernel<4>, grid, dim3(THREADS), 0, stream, a, b, out,
                      n_elems);
        break;
    case 1:
        CINFER_LAUNCH(add_kernel<1>, grid, dim3(THREADS), 0, stream, a, b, out,
                      n_elems);
        break;
    default:
        return cinfer_set_error(CINFER_E_INTERNAL, "cuda add: vector width %d",
                                vec);
    }
    CINFER_CUDA_TRY_LAUNCH("add_kernel");
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* add_bias                                                                */
/* ---------------------------------------------------------------------- */

// Grid: (n, min(ceil(d / VEC / THREADS), MAX_BLOCKS)), block (THREADS):
// blockIdx.x is the row, blockIdx.y strides over its columns.
// VEC 4: d % 4 == 0 and x, b 16-byte aligned.
template <int VEC>
__global__ void add_bias_kernel(float *__restrict__ x,       // [n, d]
                                const float *__restrict__ b, // [d]
                                int64_t d)
{
    float *xr = x + (int64_t)blockIdx.x * d;
    const int64_t stride = (int64_t)gridDim.y * blockDim.x;
    const int64_t t = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (VEC == 4) {
        float4 *x4 = reinterpret_cast<float4 *>(xr);
        const float4 *b4 = reinterpret_cast<const float4 *>(b);
        for (int64_t i = t; i < d / 4; i += stride) {
            float4 v = x4[i];
            const float4 w = b4[i];
            v.x += w.x;
            v.y += w.y;
            v.z += w.z;
            v.w += w.w;
            x4[i] = v;
        }
    } else {
        for (int64_t i = t; i < d; i += stride)
            xr[i] += b[i];
    }
}

extern "C" cinfer_status cinfer_cuda_add_bias(cudaStream_t stream, float *x,
                                              const float *b, int64_t n,
                                              int64_t d)
{
    if (n < 0 || n > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda add_bias: n %lld is not in 0..%d",
                                (long long)n, INT_MAX);
    if (d < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda add_bias: d %lld is negative",
                                (long long)d);
    if (n == 0 || d == 0)
        return CINFER_OK;
    if (!x || !b)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda add_bias: %s is NULL", !x ? "x" : "b");
    const int vec = d % 4 == 0 && aligned16(x) && aligned16(b) ? 4 : 1;
    const dim3 grid((unsigned)n, flat_blocks(d / vec));
    switch (vec) {
    case 4:
        CINFER_LAUNCH(add_bias_kernel<4>, grid, dim3(THREADS), 0, stream, x, b,
                      d);
        break;
    case 1:
        CINFER_LAUNCH(add_bias_kernel<1>, grid, dim3(THREADS), 0, stream, x, b,
                      d);
        break;
    default:
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda add_bias: vector width %d", vec);
    }
    CINFER_CUDA_TRY_LAUNCH("add_bias_kernel");
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* silu_mul                                                                */
/* ---------------------------------------------------------------------- */

// Grid: (min(ceil(n / VEC / THREADS), MAX_BLOCKS)), block (THREADS).
// VEC 4: gate, up and out are 16-byte aligned.
template <int VEC>
__global__ void silu_mul_kernel(const float *gate, // [n]
                                const float *up,   // [n]
                                float *out,        // [n], may alias gate, up
                                int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (VEC == 4) {
        const int64_t n4 = n / 4;
        for (int64_t i = t; i < n4; i += stride) {
            const float4 g = reinterpret_cast<const float4 *>(gate)[i];
            const float4 u = reinterpret_cast<const float4 *>(up)[i];
            float4 z;
            z.x = silu_mul1(g.x, u.x);
            z.y = silu_mul1(g.y, u.y);
            z.z = silu_mul1(g.z, u.z);
            z.w = silu_mul1(g.w, u.w);
            reinterpret_cast<float4 *>(out)[i] = z;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + t; i < n; i += stride)
        out[i] = silu_mul1(gate[i], up[i]);
}

extern "C" cinfer_status cinfer_cuda_silu_mul(cudaStream_t stream,
                                              const float *gate,
                                              const float *up, float *out,
                                              int64_t n_elems)
{
    if (n_elems < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda silu_mul: n_elems %lld is negative",
                                (long long)n_elems);
    if (n_elems == 0)
        return CINFER_OK;
    if (!gate || !up || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda silu_mul: %s is NULL",
                                !gate ? "gate" : !up ? "up" : "out");
    const int vec =
        aligned16(gate) && aligned16(up) && aligned16(out) ? 4 : 1;
    const dim3 grid(flat_blocks(vec == 4 ? n_elems / 4 + 1 : n_elems));
    switch (vec) {
    case 4:
        CINFER_LAUNCH(silu_mul_kernel<4>, grid, dim3(THREADS), 0, stream, gate,
                      up, out, n_elems);
        break;
    case 1:
        CINFER_LAUNCH(silu_mul_kernel<1>, grid, dim3(THREADS), 0, stream, gate,
                      up, out, n_elems);
        break;
    default:
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda silu_mul: vector width %d", vec);
    }
    CINFER_CUDA_TRY_LAUNCH("silu_mul_kernel");
    return CINFER_OK;
}
