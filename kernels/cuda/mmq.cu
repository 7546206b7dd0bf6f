/*
 * mmq.cu - tiled quantized matrix products over Q8_1 activations. See
 * mmq.cuh for the tiling and mmvq.cuh for the reduction order both kernels
 * share.
 */
#include "kernels/cuda/mmq.cuh"

#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"
#include "kernels/cuda/mmvq.cuh"

#define MMQ_ROWS 16 /* activation rows per CTA */
#define MMQ_OUTS 16 /* weight rows per CTA */
#define MMQ_WARPS 8
#define MMQ_THREADS (32 * MMQ_WARPS)
#define MMQ_WROWS 4 /* activation rows per warp: MMQ_ROWS / 4 row groups */
#define MMQ_WOUTS 8 /* weight rows per warp: MMQ_OUTS / 2 out groups */
#define MMQ_KB CINFER_MM_SLOTS /* blocks per step along k, one per lane */
#define FULL_MASK 0xffffffffu

/* ---------------------------------------------------------------------- */
/* kernel                                                                  */
/* ---------------------------------------------------------------------- */

/* Shared weight block: word 0 = d (| m << 16 for Q4_1), then the qs ints.
 * An odd stride in words keeps lane s's reads of block s conflict-free. */
template <cinfer_dtype T> struct mmq_smem {
    enum { WW = mm_block_traits<T>::INTS + 1 };
};

/* Stages step kt's weight tile (MMQ_OUTS rows x MMQ_KB blocks) and
 * activation tile (MMQ_ROWS rows x MMQ_KB blocks) in shared memory,
 * zero-filling what lies past n_out, n or nb; consecutive threads read
 * consecutive words. */
template <cinfer_dtype T>
__device__ __forceinline__ void
mmq_stage(const uint16_t *__restrict__ w, // [n_out, nb * U16]
          const int *__restrict__ xq,     // [n, nb * 9]
          int *__restrict__ ws,           // [MMQ_OUTS, MMQ_KB, WW]
          int *__restrict__ xs,           // [MMQ_ROWS, MMQ_KB, 9]
          int64_t o0, int64_t r0, int64_t kb0, int64_t n_out, int64_t n,
          int64_t nb)
{
    typedef mm_block_traits<T> tr;
    const int WW = mmq_smem<T>::WW;
    const int tid = (int)threadIdx.x;

#pragma unroll 2
    for (int i = tid; i < MMQ_OUTS * MMQ_KB * WW; i += MMQ_THREADS) {
        const int j = i / (MMQ_KB * WW);
        const int rem = i % (MMQ_KB * WW);
        const int b = rem / WW;
        const int wd = rem % WW;
        int v = 0;
        if (o0 + j < n_out && kb0 + b < nb) {
            const uint16_t *wb =
                w + ((o0 + j) * nb + kb0 + b) * (int64_t)tr::U16;
            if (wd == 0) {
                v = wb[0];
                if (T == CINFER_DTYPE_Q4_1)
                    v |= (int)((unsigned)wb[1] << 16);
            } else {
                const uint16_t *p = wb + tr::QS + 2 * (wd - 1);
                v = (int)((unsigned)p[0] | ((unsigned)p[1] << 16));
            }
        }
        ws[i] = v;
    }

#pragma unroll 2
    for (int i = tid; i < MMQ_ROWS * MMQ_KB * CINFER_MM_Q8_1_WORDS;
         i += MMQ_THREADS) {
        const int r = i / (MMQ_KB * CINFER_MM_Q8_1_WORDS);
        const int rem = i % (MMQ_KB * CINFER_MM_Q8_1_WORDS);
        const int b = rem / CINFER_MM_Q8_1_WORDS;
        int v = 0;
        if (r0 + r < n && kb0 + b < nb)
            v = xq[(r0 + r) * nb * CINFER_MM_Q8_1_WORDS +
                   kb0 * CINFER_MM_Q8_1_WORDS + rem];
        xs[i] = v;
    }
}

/* One step of the slot reduce-scatter: acc[0..2M) in, acc[0..M) out. */
template <int M>
__device__ __forceinline__ void mmq_scatter_step(float *acc, int lane)
{
    const bool upper = (lane & M) != 0;
#pragma unroll
    for (int c = 0; c < M; c++) {
        const float send = upper ? acc[c] : acc[c + M];
        const float keep = upper ? acc[c + M] : acc[c];
        acc[c] = keep + __shfl_xor_sync(FULL_MASK, send, M);
    }
}

/* The weights of one launch: column tiles [tiles[i], tiles[i + 1]) of the
 * grid are weight i's, MMQ_OUTS rows each. */
struct mmq_set {
    const uint16_t *w[CINFER_CUDA_MMQ_MAX_W];
    float *out[CINFER_CUDA_MMQ_MAX_W];
    int64_t n_out[CINFER_CUDA_MMQ_MAX_W];
    int64_t tiles[CINFER_CUDA_MMQ_MAX_W + 1];
    int nw;
};

// Grid: (column tiles of every weight, ceil(n / MMQ_ROWS)), block
// (MMQ_THREADS). CTA (bx, by), bx the t-th tile of weight i, computes
// out_i[16 by .. +16)[16 t .. +16); warp g takes rows 4 (g % 4) .. +4 and
// weight rows 8 (g / 4) .. +8 of the tile, lane s block s of every step
// (reduction slot s). Every weight of the set takes the same code.
template <cinfer_dtype T>
__global__ void __launch_bounds__(MMQ_THREADS)
mmq_kernel(const mmq_set set,          // w_i: [n_out_i, nb * U16] of T,
                                       // out_i: [n, n_out_i]
           const int *__restrict__ xq, // [n, nb * 9] Q8_1 blocks
           int64_t n, int64_t nb)
{
    typedef mm_block_traits<T> tr;
    const int WW = mmq_smem<T>::WW;
    CINFER_SHARED(int, ws, [MMQ_OUTS * MMQ_KB * mmq_smem<T>::WW]);
    CINFER_SHARED(int, xs, [MMQ_ROWS * MMQ_KB * CINFER_MM_Q8_1_WORDS]);

    const int lane = (int)threadIdx.x % 32;
    const int warp = (int)threadIdx.x / 32;
    const int rg = warp % (MMQ_ROWS / MMQ_WROWS);
    const int og = warp / (MMQ_ROWS / MMQ_WROWS);
    int wi = 0;
    while (wi + 1 < set.nw && (int64_t)blockIdx.x >= set.tiles[wi + 1])
        wi++;
    const uint16_t *__restrict__ w = set.w[wi];
    float *__restrict__ out = set.out[wi];
    const int64_t n_out = set.n_out[wi];
    const int64_t o0 = ((int64_t)blockIdx.x - set.tiles[wi]) * MMQ_OUTS;
    const int64_t r0 = (int64_t)blockIdx.y * MMQ_ROWS;

    /* acc[i * 8 + j]: row 4 rg + i, weight row 8 og + j, slot `lane` */
    float acc[MMQ_WROWS * MMQ_WOUTS];
#pragma unroll
    for (int c = 0; c < MMQ_WROWS * MMQ_WOUTS; c++)
        acc[c] = 0.0f;

    for (int64_t kb0 = 0; kb0 < nb; kb0 += MMQ_KB) {
        if (kb0 > 0)
            __syncthreads(); /* the previous step's reads are done */
        mmq_stage<T>(w, xq, ws, xs, o0, r0, kb0, n_out, n, nb);
        __syncthreads();
        if (kb0 + lane >= nb)
            continue; /* past the row's last block: this slot has no term */

        int xv[MMQ_WROWS][8];
        float dx[MMQ_WROWS], sx[MMQ_WROWS];
        int xsum[MMQ_WROWS];
#pragma unroll
        for (int i = 0; i < MMQ_WROWS; i++) {
            const int *xb = xs + ((rg * MMQ_WROWS + i) * MMQ_KB + lane) *
                                     CINFER_MM_Q8_1_WORDS;
            const unsigned ds = (unsigned)xb[0];
            dx[i] = mm_f16(ds);
            sx[i] = mm_f16(ds >> 16);
            xsum[i] = 0;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                xv[i][q] = xb[1 + q];
                if (T == CINFER_DTYPE_Q4_0)
                    xsum[i] = __dp4a(0x01010101, xv[i][q], xsum[i]);
            }
        }

#pragma unroll
        for (int j = 0; j < MMQ_WOUTS; j++) {
            const int *wb = ws + ((og * MMQ_WOUTS + j) * MMQ_KB + lane) * WW;
            const unsigned dm = (unsigned)wb[0];
            const float dw = mm_f16(dm);
            const float mw = T == CINFER_DTYPE_Q4_1 ? mm_f16(dm >> 16) : 0.0f;
            int wv[tr::INTS];
#pragma unroll
            for (int q = 0; q < tr::INTS; q++)
                wv[q] = wb[1 + q];
#pragma unroll
            for (int i = 0; i < MMQ_WROWS; i++) {
                int isum = 0;
                if (T == CINFER_DTYPE_Q8_0) {
#pragma unroll
                    for (int q = 0; q < 8; q++)
                        isum = __dp4a(wv[q], xv[i][q], isum);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        isum = __dp4a(wv[q] & 0x0F0F0F0F, xv[i][q], isum);
                        isum = __dp4a((wv[q] >> 4) & 0x0F0F0F0F, xv[i][q + 4],
                                      isum);
                    }
                    if (T == CINFER_DTYPE_Q4_0)
                        isum -= 8 * xsum[i];
                }
                acc[i * MMQ_WOUTS + j] = mm_block_acc<T>(
                    acc[i * MMQ_WOUTS + j], isum, dw, mw, dx[i], sx[i]);
            }
        }
    }

    /* The slot tree (mmvq.cuh) as a reduce-scatter over the lanes: at step
     * m, lane l keeps the half of its outputs selected by bit m of l and
     * adds its partner's partial for them, so after m = 16, 8, 4, 2, 1 lane
     * l holds the sum of output l. */
    mmq_scatter_step<16>(acc, lane);
    mmq_scatter_step<8>(acc, lane);
    mmq_scatter_step<4>(acc, lane);
    mmq_scatter_step<2>(acc, lane);
    mmq_scatter_step<1>(acc, lane);
    const int64_t r = r0 + rg * MMQ_WROWS + lane / MMQ_WOUTS;
    const int64_t o = o0 + og * MMQ_WOUTS + lane % MMQ_WOUTS;
    if (r < n && o < n_out)
        out[r * n_out + o] = acc[0];
}

/* ---------------------------------------------------------------------- */
/* launcher                                                                */
/* ---------------------------------------------------------------------- */

#define MAX_GRID_X 2147483647LL

extern "C" cinfer_status cinfer_cuda_mmq_set(cudaStream_t stream,
                                             cinfer_dtype w_type, int n_w,
                                             const void *const *w,
                                             const int64_t *n_out,
                                             const void *xq, int32_t n,
                                             int64_t k, float *const *out)
{
    if (n_w < 1 || n_w > CINFER_CUDA_MMQ_MAX_W || !w || !n_out || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmq takes 1..%d weights, got %d",
                                CINFER_CUDA_MMQ_MAX_W, n_w);
    if (xq == NULL || (uintptr_t)xq % 4 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmq xq must be set and 4-byte "
                                "aligned");
    if (n < 1 || n > CINFER_CUDA_MMQ_MAX_ROWS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmq n = %d out of range", (int)n);
    if (k < CINFER_QK || k % CINFER_QK != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmq k = %lld (need a positive "
                                "multiple of 32)",
                                (long long)k);
    mmq_set set;
    memset(&set, 0, sizeof set);
    set.nw = n_w;
    for (int i = 0; i < n_w; i++) {
        if (w[i] == NULL || out[i] == NULL || (uintptr_t)w[i] % 2 != 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: mmq w[%d] and out[%d] must "
                                    "be set, w 2-byte aligned",
                                    i, i);
        const int64_t t = n_out[i] < 1 ? 0 : (n_out[i] + MMQ_OUTS - 1) / MMQ_OUTS;
        if (t < 1 || t > MAX_GRID_X - set.tiles[i])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: mmq n_out[%d] = %lld out "
                                    "of range",
                                    i, (long long)n_out[i]);
        set.w[i] = (const uint16_t *)w[i];
        set.out[i] = out[i];
        set.n_out[i] = n_out[i];
        set.tiles[i + 1] = set.tiles[i] + t;
    }
    const int64_t nb = k / CINFER_QK;
    const dim3 grid((unsigned)set.tiles[n_w],
                    (unsigned)((n + MMQ_ROWS - 1) / MMQ_ROWS));
    const dim3 block(MMQ_THREADS);
    const int *x32 = (const int *)xq;
    switch (w_type) {
    case CINFER_DTYPE_Q8_0:
        CINFER_LAUNCH(mmq_kernel<CINFER_DTYPE_Q8_0>, grid, block, 0, stream,
                      set, x32, (int64_t)n, nb);
        break;
    case CINFER_DTYPE_Q4_0:
        CINFER_LAUNCH(mmq_kernel<CINFER_DTYPE_Q4_0>, grid, block, 0, stream,
                      set, x32, (int64_t)n, nb);
        break;
    case CINFER_DTYPE_Q4_1:
        CINFER_LAUNCH(mmq_kernel<CINFER_DTYPE_Q4_1>, grid, block, 0, stream,
                      set, x32, (int64_t)n, nb);
        break;
    default:
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda matmul: mmq w_type %s (Q8_0, Q4_0 or "
                                "Q4_1)",
                                cinfer_dtype_name(w_type));
    }
    CINFER_CUDA_TRY_LAUNCH("mmq_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_mmq(cudaStream_t stream,
                                         cinfer_dtype w_type, const void *w,
                                         int64_t n_out, const void *xq,
                                         int32_t n, int64_t k, float *out)
{
    return cinfer_cuda_mmq_set(stream, w_type, 1, &w, &n_out, xq, n, k, &out);
}
