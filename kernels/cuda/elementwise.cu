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
#include <stdio.h>

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

/* The two-input flat ops: out[i] = Op()(a[i], b[i]). */
struct add_op {
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        return a + b;
    }
};

struct silu_mul_op { /* a = gate, b = up (elementwise.cuh) */
    __device__ __forceinline__ float operator()(float g, float u) const
    {
        return cinfer_silu_mul(g, u);
    }
};

/* ---------------------------------------------------------------------- */
/* add, silu_mul: one flat two-input kernel                                */
/* ---------------------------------------------------------------------- */

// Grid: (min(ceil(n / VEC / THREADS), MAX_BLOCKS)), block (THREADS).
// VEC 4: a, b and out are 16-byte aligned.
template <typename Op, int VEC>
__global__ void flat2_kernel(const float *a, // [n]
                             const float *b, // [n]
                             float *out,     // [n], may alias a or b
                             int64_t n)
{
    const Op op;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t done = 0;
    if (VEC == 4) {
        const int64_t n4 = n / 4;
        for (int64_t i = t; i < n4; i += stride) {
            const float4 x = reinterpret_cast<const float4 *>(a)[i];
            const float4 y = reinterpret_cast<const float4 *>(b)[i];
            float4 z;
            z.x = op(x.x, y.x);
            z.y = op(x.y, y.y);
            z.z = op(x.z, y.z);
            z.w = op(x.w, y.w);
            reinterpret_cast<float4 *>(out)[i] = z;
        }
        done = n4 * 4;
    }
    for (int64_t i = done + t; i < n; i += stride)
        out[i] = op(a[i], b[i]);
}

/* Checks and launches flat2_kernel<Op>; `what` names the op and a_name /
 * b_name its inputs in error messages. */
template <typename Op>
static cinfer_status launch_flat2(const char *what, const char *a_name,
                                  const char *b_name, cudaStream_t stream,
                                  const float *a, const float *b, float *out,
                                  int64_t n_elems)
{
    if (n_elems < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda %s: n_elems %lld is negative", what,
                                (long long)n_elems);
    if (n_elems == 0)
        return CINFER_OK;
    if (!a || !b || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "cuda %s: %s is NULL",
                                what, !a ? a_name : !b ? b_name : "out");
    const int vec = aligned16(a) && aligned16(b) && aligned16(out) ? 4 : 1;
    const dim3 grid(flat_blocks(vec == 4 ? n_elems / 4 + 1 : n_elems));
    switch (vec) {
    case 4:
        CINFER_LAUNCH((flat2_kernel<Op, 4>), grid, dim3(THREADS), 0, stream, a,
                      b, out, n_elems);
        break;
    case 1:
        CINFER_LAUNCH((flat2_kernel<Op, 1>), grid, dim3(THREADS), 0, stream, a,
                      b, out, n_elems);
        break;
    default:
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda %s: vector width %d", what, vec);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        char stmt[64];
        snprintf(stmt, sizeof stmt, "launch flat2_kernel (%s)", what);
        return cinfer_cuda_fail((int)e, stmt, __FILE__, __LINE__);
    }
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_add(cudaStream_t stream, const float *a,
                                         const float *b, float *out,
                                         int64_t n_elems)
{
    return launch_flat2<add_op>("add", "a", "b", stream, a, b, out, n_elems);
}

extern "C" cinfer_status cinfer_cuda_silu_mul(cudaStream_t stream,
                                              const float *gate,
                                              const float *up, float *out,
                                              int64_t n_elems)
{
    return launch_flat2<silu_mul_op>("silu_mul", "gate", "up", stream, gate,
                                     up, out, n_elems);
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
