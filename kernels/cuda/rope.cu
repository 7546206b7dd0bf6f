/*
 * rope.cu - rotary position embedding (rope.cuh).
 *
 * One block per row. The row's rot_dim / 2 cos/sin pairs depend only on its
 * position, so the block computes them once into shared memory and every
 * head of the row reuses them; then its threads walk the row's
 * (head, pair) items. The frequencies freq_scale * theta^(-2i/rot_dim) /
 * freq_factors[i] are computed on the host in double and passed by value
 * in the launch parameters (2 KiB at most), which keeps the launch
 * graph-capturable and needs no device table.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_compat.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope.cuh"

#define MAX_PAIRS (CINFER_CUDA_ROPE_MAX_DIM / 2)
#define MAX_THREADS 256

/* freq_scale * theta^(-2i / rot_dim) / freq_factors[i] for i <
 * rot_dim / 2. */
struct rope_freqs {
    double inv_freq[MAX_PAIRS];
};

// Grid: (n), block (threads, <= MAX_THREADS): one block per row.
// MODE: CINFER_CUDA_ROPE_NORM pairs (x[2i], x[2i+1]); CINFER_CUDA_ROPE_NEOX
// pairs (x[i], x[i + n_pairs]).
template <int MODE>
__global__ void rope_kernel(float *__restrict__ x,                 // [n, n_heads * head_dim]
                            const int32_t *__restrict__ positions, // [n]
                            int n_heads, int head_dim, int n_pairs,
                            rope_freqs f)
{
    CINFER_SHARED(float, cos_t, [MAX_PAIRS]);
    CINFER_SHARED(float, sin_t, [MAX_PAIRS]);
    const double two_pi = 6.283185307179586476925286766559;
    const double inv_two_pi = 0.15915494309189533576888376337251;
    const double pos = (double)positions[blockIdx.x];
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        /* The angle and its reduction to [-pi, pi] in double: a float angle
         * at position 100k would already be off by ulp(1e5) / 2 = 0.004. */
        const double a = pos * f.inv_freq[i];
        const double r = fma(-rint(a * inv_two_pi), two_pi, a);
        float s, c;
        sincosf((float)r, &s, &c);
        cos_t[i] = c;
        sin_t[i] = s;
    }
    __syncthreads();
    float *xr = x + (int64_t)blockIdx.x * n_heads * head_dim;
    const int offset = MODE == CINFER_CUDA_ROPE_NORM ? 1 : n_pairs;
    const int items = n_heads * n_pairs;
    for (int t = threadIdx.x; t < items; t += blockDim.x) {
        const int h = t / n_pairs, i = t - h * n_pairs;
        float *e = xr + h * head_dim + (MODE == CINFER_CUDA_ROPE_NORM ? 2 * i : i);
        const float c = cos_t[i], s = sin_t[i];
        const float x0 = e[0], x1 = e[offset];
        e[0] = fmaf(x0, c, -(x1 * s));
        e[offset] = fmaf(x0, s, x1 * c);
    }
}

extern "C" cinfer_status cinfer_cuda_rope(cudaStream_t stream, float *x,
                                          const int32_t *positions, int32_t n,
                                          int n_heads, int head_dim,
                                          int rot_dim, float theta,
                                          float freq_scale,
                                          const float *freq_factors, int mode)
{
    if (n < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: n %d is negative", (int)n);
    if (n_heads < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: n_heads %d is not >= 1", n_heads);
    if (head_dim < 2)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: head_dim %d is not >= 2", head_dim);
    if ((int64_t)n_heads * head_dim > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: n_heads %d * head_dim %d exceeds "
                                "%d",
                                n_heads, head_dim, INT_MAX);
    if (rot_dim < 2 || rot_dim > head_dim || rot_dim % 2 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: rot_dim %d must be even and in "
                                "2..head_dim (%d)",
                                rot_dim, head_dim);
    if (rot_dim > CINFER_CUDA_ROPE_MAX_DIM)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda rope: rot_dim %d exceeds %d", rot_dim,
                                CINFER_CUDA_ROPE_MAX_DIM);
    if (!(theta > 0.0f) || isinf(theta))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: theta %g is not a finite value > 0",
                                (double)theta);
    if (!(freq_scale > 0.0f) || isinf(freq_scale))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: freq_scale %g is not a finite "
                                "value > 0",
                                (double)freq_scale);
    for (int i = 0; freq_factors && i < rot_dim / 2; i++)
        if (!(freq_factors[i] > 0.0f) || isinf(freq_factors[i]))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda rope: freq_factors[%d] = %g is not "
                                    "a finite value > 0",
                                    i, (double)freq_factors[i]);
    if (mode != CINFER_CUDA_ROPE_NORM && mode != CINFER_CUDA_ROPE_NEOX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: mode %d is neither NORM (0) nor "
                                "NEOX (2)",
                                mode);
    if (n == 0)
        return CINFER_OK;
    if (!x || !positions)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: %s is NULL",
                                !x ? "x" : "positions");
    const int n_pairs = rot_dim / 2;
    rope_freqs f;
    for (int i = 0; i < MAX_PAIRS; i++)
        f.inv_freq[i] =
            i < n_pairs ? (double)freq_scale *
                              pow((double)theta, -2.0 * i / rot_dim) /
                              (freq_factors ? (double)freq_factors[i] : 1.0)
                        : 0.0;
    int64_t threads = ((int64_t)n_heads * n_pairs + 31) / 32 * 32;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    const dim3 grid((unsigned)n), block((unsigned)threads);
    switch (mode) {
    case CINFER_CUDA_ROPE_NORM:
        CINFER_LAUNCH(rope_kernel<CINFER_CUDA_ROPE_NORM>, grid, block, 0,
                      stream, x, positions, n_heads, head_dim, n_pairs, f);
        break;
    case CINFER_CUDA_ROPE_NEOX:
        CINFER_LAUNCH(rope_kernel<CINFER_CUDA_ROPE_NEOX>, grid, block, 0,
                      stream, x, positions, n_heads, head_dim, n_pairs, f);
        break;
    default:
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: mode %d", mode);
    }
    CINFER_CUDA_TRY_LAUNCH("rope_kernel");
    return CINFER_OK;
}
