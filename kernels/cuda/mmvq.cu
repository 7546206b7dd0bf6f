/*
 * mmvq.cu - quantized matrix-vector products for 1..8 rows over Q8_1
 * activations. See mmvq.cuh for the design and the reduction order.
 */
#include "kernels/cuda/mmvq.cuh"

#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"
#include "kernels/cuda/elementwise.cuh"

#define MMVQ_WARPS 4
#define MMVQ_THREADS (32 * MMVQ_WARPS)
#define MMVQ_LANES_PER_BLOCK 4 /* MMVQ_THREADS / CINFER_MM_SLOTS */
#define FULL_MASK 0xffffffffu

/* ---------------------------------------------------------------------- */
/* kernel                                                                  */
/* ---------------------------------------------------------------------- */

/* Two u16 words from p[0], p[1] (2-byte aligned data) as one int. */
__device__ __forceinline__ int mmvq_int_b2(const uint16_t *__restrict__ p)
{
    return (int)((unsigned)p[0] | ((unsigned)p[1] << 16));
}

/* The weights of one launch: CTA c computes row c - start[i] of weight i,
 * start[i] <= c < start[i + 1]. */
struct mmvq_set {
    const uint16_t *w[CINFER_CUDA_MMVQ_MAX_W];
    float *out[CINFER_CUDA_MMVQ_MAX_W];
    int64_t n_out[CINFER_CUDA_MMVQ_MAX_W];
    int64_t start[CINFER_CUDA_MMVQ_MAX_W + 1];
    int nw;
};

// One weight row against NR activation rows, by the CTA (MMVQ_THREADS):
// thread t is slot t / 4 (blocks t / 4, t / 4 + 32, ...) and quarter t % 4
// of each block: qs ints q, q + 4 for Q8_0, nibble int q for Q4_x
// (elements 4q..4q+3 and 16+4q..16+4q+3), against activation ints q and
// q + 4. The row's NR results land in v of warp 0's lane 0; every thread
// of the CTA calls it (red is the CTA's shared scratch).
template <cinfer_dtype T, int NR>
static __device__ __forceinline__ void
mmvq_row(const uint16_t *__restrict__ wrow, // [nb * U16] blocks of T
         const int *__restrict__ xq,        // [NR, nb * 9] Q8_1 blocks
         int64_t nb, float (&red)[MMVQ_WARPS][NR][8], float (&v)[NR])
{
    typedef mm_block_traits<T> tr;
    const int tid = (int)threadIdx.x;
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int slot = tid / MMVQ_LANES_PER_BLOCK; /* 8 * warp + lane / 4 */
    const int q = tid % MMVQ_LANES_PER_BLOCK;

    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++)
        acc[r] = v[r] = 0.0f; /* v: set below in warp 0 */

    /* b0 is uniform over the CTA, so every lane reaches the shuffles */
    for (int64_t b0 = 0; b0 < nb; b0 += CINFER_MM_SLOTS) {
        const int64_t b = b0 + slot;
        const bool valid = b < nb;
        int w0 = 0, w1 = 0;
        float dw = 0.0f, mw = 0.0f;
        if (valid) {
            const uint16_t *wb = wrow + b * tr::U16;
            dw = mm_f16(wb[0]);
            if (T == CINFER_DTYPE_Q4_1)
                mw = mm_f16(wb[1]);
            w0 = mmvq_int_b2(wb + tr::QS + 2 * q);
            if (T == CINFER_DTYPE_Q8_0)
                w1 = mmvq_int_b2(wb + tr::QS + 2 * (q + 4));
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            int x0 = 0, x1 = 0;
            unsigned ds = 0;
            if (valid) {
                const int *xb = xq + (r * nb + b) * CINFER_MM_Q8_1_WORDS;
                ds = (unsigned)xb[0];
                x0 = xb[1 + q];
                x1 = xb[1 + q + 4];
            }
            int part;
            if (T == CINFER_DTYPE_Q8_0) {
                part = __dp4a(w0, x0, __dp4a(w1, x1, 0));
            } else {
                part = __dp4a(w0 & 0x0F0F0F0F, x0,
                              __dp4a((w0 >> 4) & 0x0F0F0F0F, x1, 0));
                if (T == CINFER_DTYPE_Q4_0)
                    part -= 8 * __dp4a(0x01010101, x0,
                                       __dp4a(0x01010101, x1, 0));
            }
            /* the block's four quarters: exact integer sums */
            part += __shfl_xor_sync(FULL_MASK, part, 1);
            part += __shfl_xor_sync(FULL_MASK, part, 2);
            if (valid)
                acc[r] = mm_block_acc<T>(acc[r], part, dw, mw, mm_f16(ds),
                                         mm_f16(ds >> 16));
        }
    }

    /* The slot tree (mmvq.cuh): slot = 8 * warp + lane / 4, so slot bits 4
     * and 3 are warp bits 1 and 0 (through shared memory), bits 2..0 are
     * lane bits 4..2 (shuffles). */
    if (q == 0) {
#pragma unroll
        for (int r = 0; r < NR; r++)
            red[warp][r][lane / 4] = acc[r];
    }
    __syncthreads();
    if (warp == 0) {
        const int g = lane % 8;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float t = (red[0][r][g] + red[2][r][g]) +
                      (red[1][r][g] + red[3][r][g]);
            t += __shfl_xor_sync(FULL_MASK, t, 4);
            t += __shfl_xor_sync(FULL_MASK, t, 2);
            t += __shfl_xor_sync(FULL_MASK, t, 1);
            v[r] = t;
        }
    }
}

// Grid: (sum of n_out), block (MMVQ_THREADS). CTA o of weight i computes
// out_i[0..NR)[o]; every weight of the set takes the same code.
template <cinfer_dtype T, int NR>
__global__ void __launch_bounds__(MMVQ_THREADS)
mmvq_kernel(const mmvq_set set,          // w_i: [n_out_i, nb * U16] of T,
                                         // out_i: [NR, n_out_i]
            const int *__restrict__ xq, // [NR, nb * 9] Q8_1 blocks
            int64_t nb)
{
    typedef mm_block_traits<T> tr;
    CINFER_SHARED(float, red, [MMVQ_WARPS][NR][8]);
    int wi = 0;
    while (wi + 1 < set.nw && (int64_t)blockIdx.x >= set.start[wi + 1])
        wi++;
    const int64_t o = (int64_t)blockIdx.x - set.start[wi];
    const int64_t n_out = set.n_out[wi];
    float v[NR];
    mmvq_row<T, NR>(set.w[wi] + o * nb * tr::U16, xq, nb, red, v);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < NR; r++)
            set.out[wi][r * n_out + o] = v[r];
    }
}

// Grid: (n_out), block (MMVQ_THREADS). CTA o computes row o of the gate
// and of the up weight as mmvq_kernel does, then out[r][o] = silu(gate) *
// up as the silu_mul kernel does: the bits of the two launches and the
// third, in one.
template <cinfer_dtype T, int NR>
__global__ void __launch_bounds__(MMVQ_THREADS)
mmvq_glu_kernel(const uint16_t *__restrict__ wg, // [n_out, nb * U16] of T
                const uint16_t *__restrict__ wu, // [n_out, nb * U16] of T
                const int *__restrict__ xq,      // [NR, nb * 9] Q8_1 blocks
                float *__restrict__ out,         // [NR, n_out]
                int64_t n_out, int64_t nb)
{
    typedef mm_block_traits<T> tr;
    CINFER_SHARED(float, red, [MMVQ_WARPS][NR][8]);
    const int64_t o = blockIdx.x;
    float g[NR], u[NR];
    mmvq_row<T, NR>(wg + o * nb * tr::U16, xq, nb, red, g);
    __syncthreads(); /* warp 0 has read red */
    mmvq_row<T, NR>(wu + o * nb * tr::U16, xq, nb, red, u);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < NR; r++)
            out[r * n_out + o] = cinfer_silu_mul(g[r], u[r]);
    }
}

/* ---------------------------------------------------------------------- */
/* launcher                                                                */
/* ---------------------------------------------------------------------- */

#define MAX_GRID_X 2147483647LL

/* The activation row counts the kernels are made for: X(NR) for each. */
#define MMVQ_FOR_ROWS(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)

static cinfer_status rows_unsupported(int32_t n)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED,
                            "cuda matmul: mmvq n = %d (1..8)", (int)n);
}

template <cinfer_dtype T>
static cinfer_status launch_rows(cudaStream_t stream, const mmvq_set &set,
                                 const int *xq, int32_t n, int64_t nb)
{
    const dim3 grid((unsigned)set.start[set.nw]), block(MMVQ_THREADS);
    switch (n) {
#define MMVQ_CASE(NR)                                                          \
    case NR:                                                                   \
        CINFER_LAUNCH((mmvq_kernel<T, NR>), grid, block, 0, stream, set, xq,   \
                      nb);                                                     \
        break;
        MMVQ_FOR_ROWS(MMVQ_CASE)
#undef MMVQ_CASE
    default:
        return rows_unsupported(n);
    }
    CINFER_CUDA_TRY_LAUNCH("mmvq_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_mmvq_set(cudaStream_t stream,
                                              cinfer_dtype w_type, int n_w,
                                              const void *const *w,
                                              const int64_t *n_out,
                                              const void *xq, int32_t n,
                                              int64_t k, float *const *out)
{
    cinfer_status st = cinfer_cuda_mm_check("mmvq", w_type, n_w,
                                            CINFER_CUDA_MMVQ_MAX_W, w, n_out,
                                            out, xq, n,
                                            CINFER_CUDA_MMVQ_MAX_ROWS, k);
    if (st != CINFER_OK)
        return st;
    mmvq_set set;
    memset(&set, 0, sizeof set);
    set.nw = n_w;
    for (int i = 0; i < n_w; i++) {
        if (n_out[i] > MAX_GRID_X - set.start[i])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: mmvq n_out[%d] = %lld out "
                                    "of range",
                                    i, (long long)n_out[i]);
        set.w[i] = (const uint16_t *)w[i];
        set.out[i] = out[i];
        set.n_out[i] = n_out[i];
        set.start[i + 1] = set.start[i] + n_out[i];
    }
    const int64_t nb = k / CINFER_QK;
    const int *x32 = (const int *)xq;
    switch (w_type) {
    case CINFER_DTYPE_Q8_0:
        return launch_rows<CINFER_DTYPE_Q8_0>(stream, set, x32, n, nb);
    case CINFER_DTYPE_Q4_0:
        return launch_rows<CINFER_DTYPE_Q4_0>(stream, set, x32, n, nb);
    default: /* Q4_1: cinfer_cuda_mm_check took no other type */
        return launch_rows<CINFER_DTYPE_Q4_1>(stream, set, x32, n, nb);
    }
}

extern "C" cinfer_status
cinfer_cuda_mm_check(const char *kernel, cinfer_dtype w_type, int n_w,
                     int max_w, const void *const *w, const int64_t *n_out,
                     float *const *out, const void *xq, int32_t n,
                     int32_t max_n, int64_t k)
{
    if (n_w < 1 || n_w > max_w || !w || !n_out || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: %s takes 1..%d weights, got %d",
                                kernel, max_w, n_w);
    if (xq == NULL || (uintptr_t)xq % 4 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: %s xq must be set and 4-byte "
                                "aligned",
                                kernel);
    if (k < CINFER_QK || k % CINFER_QK != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: %s k = %lld (need a positive "
                                "multiple of 32)",
                                kernel, (long long)k);
    if (n < 1 || n > max_n)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: %s n = %d (1..%d)", kernel,
                                (int)n, (int)max_n);
    if (w_type != CINFER_DTYPE_Q8_0 && w_type != CINFER_DTYPE_Q4_0 &&
        w_type != CINFER_DTYPE_Q4_1)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda matmul: %s w_type %s (Q8_0, Q4_0 or "
                                "Q4_1)",
                                kernel, cinfer_dtype_name(w_type));
    for (int i = 0; i < n_w; i++) {
        if (w[i] == NULL || out[i] == NULL || (uintptr_t)w[i] % 2 != 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: %s w[%d] and out[%d] must "
                                    "be set, w 2-byte aligned",
                                    kernel, i, i);
        if (n_out[i] < 1)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: %s n_out[%d] = %lld out "
                                    "of range",
                                    kernel, i, (long long)n_out[i]);
    }
    return CINFER_OK;
}

template <cinfer_dtype T>
static cinfer_status launch_glu(cudaStream_t stream, const uint16_t *wg,
                                const uint16_t *wu, const int *xq, int32_t n,
                                int64_t nb, float *out, int64_t n_out)
{
    const dim3 grid((unsigned)n_out), block(MMVQ_THREADS);
    switch (n) {
#define MMVQ_CASE(NR)                                                          \
    case NR:                                                                   \
        CINFER_LAUNCH((mmvq_glu_kernel<T, NR>), grid, block, 0, stream, wg,    \
                      wu, xq, out, n_out, nb);                                 \
        break;
        MMVQ_FOR_ROWS(MMVQ_CASE)
#undef MMVQ_CASE
    default:
        return rows_unsupported(n);
    }
    CINFER_CUDA_TRY_LAUNCH("mmvq_glu_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_mmvq_silu_mul(
    cudaStream_t stream, cinfer_dtype w_type, const void *w_gate,
    const void *w_up, int64_t n_out, const void *xq, int32_t n, int64_t k,
    float *out)
{
    if (!w_gate || !w_up || !xq || !out || (uintptr_t)w_gate % 2 != 0 ||
        (uintptr_t)w_up % 2 != 0 || (uintptr_t)xq % 4 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmvq_silu_mul w_gate, w_up "
                                "(2-byte aligned), xq (4-byte) and out must "
                                "be set");
    if (n_out < 1 || n_out > MAX_GRID_X)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmvq n_out = %lld out of range",
                                (long long)n_out);
    if (k < CINFER_QK || k % CINFER_QK != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmvq k = %lld (need a positive "
                                "multiple of 32)",
                                (long long)k);
    if (n < 1 || n > CINFER_CUDA_MMVQ_MAX_ROWS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmvq n = %d (1..8)", (int)n);
    const int64_t nb = k / CINFER_QK;
    const uint16_t *g16 = (const uint16_t *)w_gate, *u16 = (const uint16_t *)w_up;
    const int *x32 = (const int *)xq;
    switch (w_type) {
    case CINFER_DTYPE_Q8_0:
        return launch_glu<CINFER_DTYPE_Q8_0>(stream, g16, u16, x32, n, nb, out,
                                             n_out);
    case CINFER_DTYPE_Q4_0:
        return launch_glu<CINFER_DTYPE_Q4_0>(stream, g16, u16, x32, n, nb, out,
                                             n_out);
    case CINFER_DTYPE_Q4_1:
        return launch_glu<CINFER_DTYPE_Q4_1>(stream, g16, u16, x32, n, nb, out,
                                             n_out);
    default:
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda matmul: mmvq w_type %s (Q8_0, Q4_0 or "
                                "Q4_1)",
                                cinfer_dtype_name(w_type));
    }
}

extern "C" cinfer_status cinfer_cuda_mmvq(cudaStream_t stream,
                                          cinfer_dtype w_type, const void *w,
                                          int64_t n_out, const void *xq,
                                          int32_t n, int64_t k, float *out)
{
    return cinfer_cuda_mmvq_set(stream, w_type, 1, &w, &n_out, xq, n, k,
                                &out);
}
