/*
 * mmq.cu - tiled quantized matrix products over Q8_1 activations. See
 * mmq.cuh for the tiling and mmvq.cuh for the reduction order both kernels
 * share.
 */
#include "kernels/cuda/mmq.cuh"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"
#include "kernels/cuda/mma.cuh"
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

/* Word wd of a weight block as shared memory holds it (wb: the block, 2-byte
 * aligned): word 0 = d (| m << 16 for Q4_1), then the qs ints. */
template <cinfer_dtype T>
__device__ __forceinline__ int mmq_weight_word(const uint16_t *wb, int wd)
{
    typedef mm_block_traits<T> tr;
    if (wd == 0)
        return T == CINFER_DTYPE_Q4_1 ? (int)((unsigned)wb[0] |
                                              ((unsigned)wb[1] << 16))
                                      : (int)wb[0];
    const uint16_t *p = wb + tr::QS + 2 * (wd - 1);
    return (int)((unsigned)p[0] | ((unsigned)p[1] << 16));
}

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
        ws[i] = o0 + j < n_out && kb0 + b < nb
                    ? mmq_weight_word<T>(w + ((o0 + j) * nb + kb0 + b) *
                                                 (int64_t)tr::U16,
                                         wd)
                    : 0;
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

/* The weight of the set this CTA's column of the grid computes, and
 * (*o0) its first weight row there, for tiles of `tile` rows. */
__device__ __forceinline__ int mmq_pick(const mmq_set &set, int64_t tile,
                                        int64_t *o0)
{
    int wi = 0;
    while (wi + 1 < set.nw && (int64_t)blockIdx.x >= set.tiles[wi + 1])
        wi++;
    *o0 = ((int64_t)blockIdx.x - set.tiles[wi]) * tile;
    return wi;
}

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
    int64_t o0;
    const int wi = mmq_pick(set, MMQ_OUTS, &o0);
    const uint16_t *__restrict__ w = set.w[wi];
    float *__restrict__ out = set.out[wi];
    const int64_t n_out = set.n_out[wi];
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
/* kernel on int8 tensor cores                                             */
/* ---------------------------------------------------------------------- */

#define MMA_OUTS 64 /* weight rows per CTA: 4 m-tiles of 16 */
#define MMA_ROWS 32 /* activation rows per CTA: 2 x 2 n-tiles of 8 */
#define MMA_WARPS 8
#define MMA_THREADS (32 * MMA_WARPS)
#define MMA_SB 8  /* blocks staged per step */
#define MMA_OUT 8 /* outputs per thread: 2 n-tiles x 4 */

/* Slot s of the reduction (block b in slot b % 32) comes r-th in the
 * kernel's walk over k, s = the 5-bit reversal of r: then the slot tree's
 * pairs (slot bit 4 first, mmvq.cuh) are neighbours in the walk and a
 * finished slot folds into a binary counter of 5 partial sums. */
__device__ __forceinline__ int mma_slot(int r)
{
    return (int)(__brev((unsigned)r) >> 27);
}

/* Folds slot r's sums v[] into the counter stk[level][]: the pending
 * partial of every level where r has a 1 bit is added (the tree's pair),
 * and the result waits at the first level where r has a 0 bit, or, for
 * r = 31, is the whole tree (left in v). */
__device__ __forceinline__ void mma_fold(float (&stk)[5][MMA_OUT],
                                         float (&v)[MMA_OUT], int r)
{
#pragma unroll
    for (int l = 0; l < 5; l++) {
        if (!((r >> l) & 1))
            break;
#pragma unroll
        for (int e = 0; e < MMA_OUT; e++)
            v[e] = stk[l][e] + v[e];
    }
    const int level = __ffs(~r) - 1; /* r's trailing ones */
#pragma unroll
    for (int l = 0; l < 5; l++)
        if (l == level) {
#pragma unroll
            for (int e = 0; e < MMA_OUT; e++)
                stk[l][e] = v[e];
        }
}

/* Four Q4_0 nibbles (0..15, one a byte) less 8, as int8: per byte
 * (x | 0x80) - 8 stays in 120..135 (no borrow), and the flip of bit 7
 * makes it x - 8. */
__device__ __forceinline__ unsigned mma_s4(unsigned x)
{
    return ((x | 0x80808080u) - 0x08080808u) ^ 0x80808080u;
}

/* The step's blocks: the next MMA_SB of the walk from block b of slot
 * mma_slot(r) (b >= nb: that slot is done), in lst (-1 past the walk's
 * end); returns how many there are. */
__device__ __forceinline__ int mma_next(int r, int64_t b, int64_t nb,
                                        int64_t (&lst)[MMA_SB])
{
    int cnt = 0;
#pragma unroll
    for (int j = 0; j < MMA_SB; j++) {
        while (r < 32 && b >= nb) {
            r++;
            b = r < 32 ? mma_slot(r) : nb;
        }
        lst[j] = r < 32 ? b : -1;
        cnt += r < 32;
        b += CINFER_MM_SLOTS;
    }
    return cnt;
}

/* Stages the step's blocks lst[0..MMA_SB) (-1: none) of the CTA's
 * MMA_OUTS weight rows from o0 and MMA_ROWS activation rows from r0:
 * ws[j][row][WW], xs[j][row][9], zeros past n_out and n. */
template <cinfer_dtype T>
__device__ __forceinline__ void
mma_stage(const uint16_t *__restrict__ w, // [n_out, nb * U16]
          const int *__restrict__ xq,     // [n, nb * 9]
          int *__restrict__ ws,           // [MMA_SB, MMA_OUTS, WW]
          int *__restrict__ xs,           // [MMA_SB, MMA_ROWS, 9]
          const int64_t (&lst)[MMA_SB], int64_t o0, int64_t r0,
          int64_t n_out, int64_t n, int64_t nb)
{
    typedef mm_block_traits<T> tr;
    enum { WW = mmq_smem<T>::WW };
    const int tidx = (int)threadIdx.x;
#pragma unroll
    for (int j = 0; j < MMA_SB; j++) {
        if (lst[j] < 0)
            continue;
        for (int i = tidx; i < MMA_OUTS * WW; i += MMA_THREADS) {
            const int row = i / WW, wd = i % WW;
            ws[j * MMA_OUTS * WW + i] =
                o0 + row < n_out
                    ? mmq_weight_word<T>(w + ((o0 + row) * nb + lst[j]) *
                                                 (int64_t)tr::U16,
                                         wd)
                    : 0;
        }
        for (int i = tidx; i < MMA_ROWS * CINFER_MM_Q8_1_WORDS;
             i += MMA_THREADS) {
            const int row = i / CINFER_MM_Q8_1_WORDS;
            const int wd = i % CINFER_MM_Q8_1_WORDS;
            int v = 0;
            if (r0 + row < n)
                v = xq[((r0 + row) * nb + lst[j]) * CINFER_MM_Q8_1_WORDS + wd];
            xs[j * MMA_ROWS * CINFER_MM_Q8_1_WORDS + i] = v;
        }
    }
}

/* One staged block for the warp's 16 weight rows (m-tile wm) and 16
 * activation rows (n-tiles 2 wn, 2 wn + 1): two mma.sync, each int32
 * result turned into the block's float term on cur (mm_block_acc). */
template <cinfer_dtype T>
__device__ __forceinline__ void
mma_block(const int *__restrict__ wsj, // [MMA_OUTS, WW] the block's weights
          const int *__restrict__ xsj, // [MMA_ROWS, 9] its activations
          int wm, int wn, float (&cur)[MMA_OUT])
{
    enum { WW = mmq_smem<T>::WW };
    const int lane = cinfer_lane(), gid = lane / 4, tid = lane % 4;
    const int *w0 = wsj + (16 * wm + gid) * WW;
    const int *w1 = w0 + 8 * WW;
    const unsigned dm0 = (unsigned)w0[0], dm1 = (unsigned)w1[0];
    const float dw[2] = {mm_f16(dm0), mm_f16(dm1)};
    const float mw[2] = {T == CINFER_DTYPE_Q4_1 ? mm_f16(dm0 >> 16) : 0.0f,
                         T == CINFER_DTYPE_Q4_1 ? mm_f16(dm1 >> 16) : 0.0f};
    unsigned a[4];
    if (T == CINFER_DTYPE_Q8_0) {
        a[0] = (unsigned)w0[1 + tid];
        a[1] = (unsigned)w1[1 + tid];
        a[2] = (unsigned)w0[5 + tid];
        a[3] = (unsigned)w1[5 + tid];
    } else {
        const unsigned q0 = (unsigned)w0[1 + tid];
        const unsigned q1 = (unsigned)w1[1 + tid];
        a[0] = q0 & 0x0F0F0F0Fu;
        a[1] = q1 & 0x0F0F0F0Fu;
        a[2] = (q0 >> 4) & 0x0F0F0F0Fu;
        a[3] = (q1 >> 4) & 0x0F0F0F0Fu;
        if (T == CINFER_DTYPE_Q4_0) {
#pragma unroll
            for (int q = 0; q < 4; q++)
                a[q] = mma_s4(a[q]);
        }
    }
#pragma unroll
    for (int t = 0; t < 2; t++) {
        const int *xb = xsj + (16 * wn + 8 * t + gid) * CINFER_MM_Q8_1_WORDS;
        const unsigned bf[2] = {(unsigned)xb[1 + tid], (unsigned)xb[5 + tid]};
        int d[4] = {0, 0, 0, 0};
        cinfer_mma_s8_16832(d, a, bf);
        const int *xd =
            xsj + (16 * wn + 8 * t + 2 * tid) * CINFER_MM_Q8_1_WORDS;
        const unsigned ds[2] = {(unsigned)xd[0],
                                (unsigned)xd[CINFER_MM_Q8_1_WORDS]};
#pragma unroll
        for (int e = 0; e < 4; e++)
            cur[4 * t + e] =
                mm_block_acc<T>(cur[4 * t + e], d[e], dw[e >> 1], mw[e >> 1],
                                mm_f16(ds[e & 1]), mm_f16(ds[e & 1] >> 16));
    }
}

// Grid: (column tiles of MMA_OUTS of every weight, ceil(n / MMA_ROWS)),
// block (MMA_THREADS). CTA (bx, by), bx the t-th tile of weight i, computes
// out_i[32 by .. +32)[64 t .. +64); warp g takes the 16 weight rows
// 16 (g % 4) .. of the tile (one m-tile of mma m16n8k32) and the 16
// activation rows 16 (g / 4) .. (two n-tiles), so a thread holds 8
// outputs. One mma is one block of 32 along k: its int32 results are the
// blocks' integer dot products, exact as dp4a's, and each becomes a float
// term through mm_block_acc. The CTA walks k slot by slot (mma_slot),
// each slot's blocks in increasing b, MMA_SB blocks staged in shared
// memory a step; a slot's sum folds into the counter (mma_fold) when its
// last block is in, an empty slot's (nb < 32) as 0. Every output element
// therefore gets the float operations of mmq_kernel and mmvq, in their
// order: the same bits.
template <cinfer_dtype T>
__global__ void __launch_bounds__(MMA_THREADS)
mmq_mma_kernel(const mmq_set set,          // as mmq_kernel's, MMA_OUTS a tile
               const int *__restrict__ xq, // [n, nb * 9] Q8_1 blocks
               int64_t n, int64_t nb)
{
    enum { WW = mmq_smem<T>::WW };
    CINFER_SHARED(int, ws, [MMA_SB * MMA_OUTS * mmq_smem<T>::WW]);
    CINFER_SHARED(int, xs, [MMA_SB * MMA_ROWS * CINFER_MM_Q8_1_WORDS]);

    const int tidx = (int)threadIdx.x;
    const int lane = tidx % 32, warp = tidx / 32;
    const int gid = lane / 4, tid = lane % 4;
    const int wm = warp % 4, wn = warp / 4;
    int64_t o0;
    const int wi = mmq_pick(set, MMA_OUTS, &o0);
    const uint16_t *__restrict__ w = set.w[wi];
    float *__restrict__ out = set.out[wi];
    const int64_t n_out = set.n_out[wi];
    const int64_t r0 = (int64_t)blockIdx.y * MMA_ROWS;

    /* cur[4 t + e]: the running slot's sum of d[e] of n-tile t */
    float cur[MMA_OUT], stk[5][MMA_OUT];
#pragma unroll
    for (int e = 0; e < MMA_OUT; e++) {
        cur[e] = 0.0f;
#pragma unroll
        for (int l = 0; l < 5; l++)
            stk[l][e] = 0.0f;
    }

    /* The walk's cursor: the next block is b of slot mma_slot(r); b >= nb
     * once the slot is done. Uniform across the CTA. */
    int r = 0;
    int64_t b = 0;
    for (;;) {
        while (r < 32 && b >= nb) { /* finished or empty slots */
            mma_fold(stk, cur, r);
            if (++r == 32)
                break; /* the fold of slot 31 left the whole tree in cur */
#pragma unroll
            for (int e = 0; e < MMA_OUT; e++)
                cur[e] = 0.0f;
            b = mma_slot(r);
        }
        if (r == 32)
            break;

        int64_t lst[MMA_SB];
        const int cnt = mma_next(r, b, nb, lst);
        mma_stage<T>(w, xq, ws, xs, lst, o0, r0, n_out, n, nb);
        __syncthreads();

        for (int j = 0; j < cnt; j++) {
            while (b >= nb) { /* a slot ended inside the step */
                mma_fold(stk, cur, r);
#pragma unroll
                for (int e = 0; e < MMA_OUT; e++)
                    cur[e] = 0.0f;
                r++;
                b = mma_slot(r); /* the walk has blocks left: r < 32 */
            }
            mma_block<T>(ws + j * MMA_OUTS * WW, xs + j * MMA_ROWS *
                                                  CINFER_MM_Q8_1_WORDS,
                         wm, wn, cur);
            b += CINFER_MM_SLOTS;
        }
        __syncthreads(); /* the step's reads are done */
    }

    /* r = 32: the last fold left the whole tree in cur */
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t row = r0 + 16 * wn + 8 * t + 2 * tid + (e & 1);
            const int64_t o = o0 + 16 * wm + gid + 8 * (e >> 1);
            if (row < n && o < n_out)
                out[row * n_out + o] = cur[4 * t + e];
        }
}

/* ---------------------------------------------------------------------- */
/* launcher                                                                */
/* ---------------------------------------------------------------------- */

#define MAX_GRID_X 2147483647LL

/* What AUTO runs: CINFER_CUDA_MMQ=dp4a or =mma in the environment says
 * (read once; anything else is AUTO), else MMA where the current device
 * has int8 mma (sm_80 and later, asked once per device). */
static bool auto_uses_mma(void)
{
    static int forced; /* 0 unread, 1 none, 2 dp4a, 3 mma */
    int f = __atomic_load_n(&forced, __ATOMIC_RELAXED);
    if (f == 0) {
        const char *e = getenv("CINFER_CUDA_MMQ");
        f = !e                       ? 1
            : strcmp(e, "dp4a") == 0 ? 2
            : strcmp(e, "mma") == 0  ? 3
                                     : 1;
        __atomic_store_n(&forced, f, __ATOMIC_RELAXED);
    }
    if (f != 1)
        return f == 3;
    static int cache[64]; /* 0 unknown, 1 no, 2 yes */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64)
        return false;
    int c = __atomic_load_n(&cache[dev], __ATOMIC_RELAXED);
    if (c == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                   dev) != cudaSuccess)
            return false;
        c = major >= 8 ? 2 : 1;
        __atomic_store_n(&cache[dev], c, __ATOMIC_RELAXED);
    }
    return c == 2;
}

extern "C" cinfer_status
cinfer_cuda_mmq_set_kernel(cudaStream_t stream, cinfer_cuda_mmq_kernel kernel,
                           cinfer_dtype w_type, int n_w, const void *const *w,
                           const int64_t *n_out, const void *xq, int32_t n,
                           int64_t k, float *const *out)
{
    if (kernel != CINFER_CUDA_MMQ_AUTO && kernel != CINFER_CUDA_MMQ_DP4A &&
        kernel != CINFER_CUDA_MMQ_MMA)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: mmq kernel %d unknown",
                                (int)kernel);
    cinfer_status st = cinfer_cuda_mm_check("mmq", w_type, n_w,
                                            CINFER_CUDA_MMQ_MAX_W, w, n_out,
                                            out, xq, n,
                                            CINFER_CUDA_MMQ_MAX_ROWS, k);
    if (st != CINFER_OK)
        return st;
    const bool mma = kernel == CINFER_CUDA_MMQ_MMA ||
                     (kernel == CINFER_CUDA_MMQ_AUTO && auto_uses_mma());
    const int64_t tile = mma ? MMA_OUTS : MMQ_OUTS;
    const int64_t rows = mma ? MMA_ROWS : MMQ_ROWS;
    mmq_set set;
    memset(&set, 0, sizeof set);
    set.nw = n_w;
    for (int i = 0; i < n_w; i++) {
        if (n_out[i] > (MAX_GRID_X - set.tiles[i]) * tile)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: mmq n_out[%d] = %lld out "
                                    "of range",
                                    i, (long long)n_out[i]);
        set.w[i] = (const uint16_t *)w[i];
        set.out[i] = out[i];
        set.n_out[i] = n_out[i];
        set.tiles[i + 1] = set.tiles[i] + (n_out[i] + tile - 1) / tile;
    }
    const int64_t nb = k / CINFER_QK;
    const dim3 grid((unsigned)set.tiles[n_w],
                    (unsigned)((n + rows - 1) / rows));
    const int *x32 = (const int *)xq;
#define MMQ_GO(K, TY)                                                          \
    CINFER_LAUNCH((K<TY>), grid, dim3(mma ? MMA_THREADS : MMQ_THREADS), 0,     \
                  stream, set, x32, (int64_t)n, nb)
    if (mma) {
        if (w_type == CINFER_DTYPE_Q8_0)
            MMQ_GO(mmq_mma_kernel, CINFER_DTYPE_Q8_0);
        else if (w_type == CINFER_DTYPE_Q4_0)
            MMQ_GO(mmq_mma_kernel, CINFER_DTYPE_Q4_0);
        else
            MMQ_GO(mmq_mma_kernel, CINFER_DTYPE_Q4_1);
        CINFER_CUDA_TRY_LAUNCH("mmq_mma_kernel");
    } else {
        if (w_type == CINFER_DTYPE_Q8_0)
            MMQ_GO(mmq_kernel, CINFER_DTYPE_Q8_0);
        else if (w_type == CINFER_DTYPE_Q4_0)
            MMQ_GO(mmq_kernel, CINFER_DTYPE_Q4_0);
        else
            MMQ_GO(mmq_kernel, CINFER_DTYPE_Q4_1);
        CINFER_CUDA_TRY_LAUNCH("mmq_kernel");
    }
#undef MMQ_GO
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_mmq_set(cudaStream_t stream,
                                             cinfer_dtype w_type, int n_w,
                                             const void *const *w,
                                             const int64_t *n_out,
                                             const void *xq, int32_t n,
                                             int64_t k, float *const *out)
{
    return cinfer_cuda_mmq_set_kernel(stream, CINFER_CUDA_MMQ_AUTO, w_type,
                                      n_w, w, n_out, xq, n, k, out);
}

extern "C" cinfer_status cinfer_cuda_mmq(cudaStream_t stream,
                                         cinfer_dtype w_type, const void *w,
                                         int64_t n_out, const void *xq,
                                         int32_t n, int64_t k, float *out)
{
    return cinfer_cuda_mmq_set(stream, w_type, 1, &w, &n_out, xq, n, k, &out);
}
