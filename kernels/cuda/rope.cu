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
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/rope.cuh"

#define MAX_PAIRS (CINFER_CUDA_ROPE_MAX_DIM / 2)
#define MAX_THREADS 256

/* freq_scale * theta^(-2i / rot_dim) / freq_factors[i] for i <
 * rot_dim / 2. */
struct rope_freqs {
    double inv_freq[MAX_PAIRS];
};

/* The row's cos / sin table, by the block's threads (a sync follows). */
static __device__ __forceinline__ void rope_table(float *cos_t, float *sin_t,
                                                  double pos, int n_pairs,
                                                  const rope_freqs &f)
{
    const double two_pi = 6.283185307179586476925286766559;
    const double inv_two_pi = 0.15915494309189533576888376337251;
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
}

/* Rotates the n_heads heads of one row xr in place, the block's threads
 * over its (head, pair) items. */
template <int MODE>
static __device__ __forceinline__ void rope_row(float *xr, int n_heads,
                                                int head_dim, int n_pairs,
                                                const float *cos_t,
                                                const float *sin_t)
{
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
    rope_table(cos_t, sin_t, (double)positions[blockIdx.x], n_pairs, f);
    __syncthreads();
    rope_row<MODE>(x + (int64_t)blockIdx.x * n_heads * head_dim, n_heads,
                   head_dim, n_pairs, cos_t, sin_t);
}

// Grid: (n), block (threads, <= MAX_THREADS): one block per row. rope_kernel
// on the row of q (n_heads) and of k (n_kv_heads) with one table, then
// kv_store_kernel's copy of the roped k and of v into cache row slots[r]:
// the same arithmetic as the three launches.
template <int MODE, typename KT, typename VT>
__global__ void rope_kv_kernel(float *__restrict__ q, // [n, n_heads * head_dim]
                               float *__restrict__ k, // [n, width]
                               const float *__restrict__ v, // [n, width]
                               const int32_t *__restrict__ positions, // [n]
                               const int32_t *__restrict__ slots,     // [n]
                               int n_heads, int n_kv_heads, int head_dim,
                               int n_pairs, rope_freqs f,
                               KT *__restrict__ k_cache, // [n_slots, width]
                               VT *__restrict__ v_cache) // [n_slots, width]
{
    CINFER_SHARED(float, cos_t, [MAX_PAIRS]);
    CINFER_SHARED(float, sin_t, [MAX_PAIRS]);
    const int64_t r = blockIdx.x, width = (int64_t)n_kv_heads * head_dim;
    rope_table(cos_t, sin_t, (double)positions[r], n_pairs, f);
    __syncthreads();
    rope_row<MODE>(q + r * n_heads * head_dim, n_heads, head_dim, n_pairs,
                   cos_t, sin_t);
    float *kr = k + r * width;
    rope_row<MODE>(kr, n_kv_heads, head_dim, n_pairs, cos_t, sin_t);
    __syncthreads(); /* the row of k is roped by every thread's part */
    const float *vr = v + r * width;
    KT *kc = k_cache + (int64_t)slots[r] * width;
    VT *vc = v_cache + (int64_t)slots[r] * width;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
        cinfer_kv_put(kc + i, kr[i]);
        cinfer_kv_put(vc + i, vr[i]);
    }
}

/* The launchers' checks; the frequencies into *f. */
static cinfer_status rope_check(int32_t n, int n_heads, int head_dim,
                                int rot_dim, float theta, float freq_scale,
                                const float *freq_factors, int mode,
                                rope_freqs *f)
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
    const int n_pairs = rot_dim / 2;
    for (int i = 0; i < MAX_PAIRS; i++)
        f->inv_freq[i] =
            i < n_pairs ? (double)freq_scale *
                              pow((double)theta, -2.0 * i / rot_dim) /
                              (freq_factors ? (double)freq_factors[i] : 1.0)
                        : 0.0;
    return CINFER_OK;
}

/* Threads for rows of `items` (head, pair) items. */
static unsigned rope_threads(int64_t items)
{
    int64_t threads = (items + 31) / 32 * 32;
    return (unsigned)(threads > MAX_THREADS ? MAX_THREADS : threads);
}

extern "C" cinfer_status cinfer_cuda_rope(cudaStream_t stream, float *x,
                                          const int32_t *positions, int32_t n,
                                          int n_heads, int head_dim,
                                          int rot_dim, float theta,
                                          float freq_scale,
                                          const float *freq_factors, int mode)
{
    rope_freqs f;
    cinfer_status st = rope_check(n, n_heads, head_dim, rot_dim, theta,
                                  freq_scale, freq_factors, mode, &f);
    if (st != CINFER_OK)
        return st;
    if (n == 0)
        return CINFER_OK;
    if (!x || !positions)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope: %s is NULL",
                                !x ? "x" : "positions");
    const int n_pairs = rot_dim / 2;
    const unsigned threads = rope_threads((int64_t)n_heads * n_pairs);
    const dim3 grid((unsigned)n), block(threads);
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

template <int MODE, typename KT, typename VT>
static cinfer_status launch_rope_kv(cudaStream_t stream, int32_t n,
                                    unsigned threads, float *q, float *k,
                                    const float *v, const int32_t *positions,
                                    const int32_t *slots, int n_heads,
                                    int n_kv_heads, int head_dim, int n_pairs,
                                    const rope_freqs &f, void *k_cache,
                                    void *v_cache)
{
    CINFER_LAUNCH((rope_kv_kernel<MODE, KT, VT>), dim3((unsigned)n),
                  dim3(threads), 0, stream, q, k, v, positions, slots,
                  n_heads, n_kv_heads, head_dim, n_pairs, f, (KT *)k_cache,
                  (VT *)v_cache);
    CINFER_CUDA_TRY_LAUNCH("rope_kv_kernel");
    return CINFER_OK;
}

template <int MODE>
static cinfer_status launch_rope_kv_mode(
    cudaStream_t stream, int32_t n, unsigned threads, float *q, float *k,
    const float *v, const int32_t *positions, const int32_t *slots,
    int n_heads, int n_kv_heads, int head_dim, int n_pairs,
    const rope_freqs &f, void *k_cache, int kh, void *v_cache, int vh)
{
#define ROPE_KV(KT, VT)                                                        \
    launch_rope_kv<MODE, KT, VT>(stream, n, threads, q, k, v, positions,       \
                                 slots, n_heads, n_kv_heads, head_dim,         \
                                 n_pairs, f, k_cache, v_cache)
    if (kh && vh)
        return ROPE_KV(__half, __half);
    if (kh)
        return ROPE_KV(__half, float);
    if (vh)
        return ROPE_KV(float, __half);
    return ROPE_KV(float, float);
#undef ROPE_KV
}

extern "C" cinfer_status cinfer_cuda_rope_kv_store(
    cudaStream_t stream, float *q, float *k, const float *v,
    const int32_t *positions, const int32_t *slots, int32_t n, int n_heads,
    int n_kv_heads, int head_dim, int rot_dim, float theta, float freq_scale,
    const float *freq_factors, int mode, void *k_cache, cinfer_dtype kdt,
    void *v_cache, cinfer_dtype vdt)
{
    rope_freqs f;
    cinfer_status st = rope_check(n, n_heads, head_dim, rot_dim, theta,
                                  freq_scale, freq_factors, mode, &f);
    if (st != CINFER_OK)
        return st;
    if (n_kv_heads < 1 || (int64_t)n_kv_heads * head_dim > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope_kv_store: n_kv_heads %d is not in "
                                "1..%d / head_dim",
                                n_kv_heads, INT_MAX);
    const int kh = kdt == CINFER_DTYPE_F16, vh = vdt == CINFER_DTYPE_F16;
    if ((!kh && kdt != CINFER_DTYPE_F32) || (!vh && vdt != CINFER_DTYPE_F32))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda rope_kv_store: cache types %s, %s (F16 "
                                "or F32)",
                                cinfer_dtype_name(kdt), cinfer_dtype_name(vdt));
    if (n == 0)
        return CINFER_OK;
    if (!q || !k || !v || !positions || !slots || !k_cache || !v_cache)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda rope_kv_store: a pointer is NULL");
    const int n_pairs = rot_dim / 2;
    const int heads = n_heads > n_kv_heads ? n_heads : n_kv_heads;
    const unsigned threads = rope_threads((int64_t)heads * n_pairs);
    if (mode == CINFER_CUDA_ROPE_NORM)
        return launch_rope_kv_mode<CINFER_CUDA_ROPE_NORM>(
            stream, n, threads, q, k, v, positions, slots, n_heads,
            n_kv_heads, head_dim, n_pairs, f, k_cache, kh, v_cache, vh);
    return launch_rope_kv_mode<CINFER_CUDA_ROPE_NEOX>(
        stream, n, threads, q, k, v, positions, slots, n_heads, n_kv_heads,
        head_dim, n_pairs, f, k_cache, kh, v_cache, vh);
}
