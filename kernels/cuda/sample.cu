/*
 * sample.cu - token choice on the device (sample.cuh).
 *
 * Greedy: a CTA per row. Each thread walks its strided entries keeping the
 * largest value seen (strictly larger replaces it, so the lowest of its
 * indices wins a tie) and its first NaN or +inf; the warps, then the CTA,
 * combine (value, index) pairs, the larger value or on a tie the lower
 * index, and the lowest bad index.
 */
#include "kernels/cuda/cuda_compat.cuh"

#include <math.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sample.cuh"

#define THREADS 256
#define FULL_MASK 0xffffffffu
#define NONE 0x7fffffff /* no index */

/* (v, i) and (w, j): the larger value, the lower index on a tie; an index
 * of NONE has no value. */
__device__ __forceinline__ void greedy_pick(float &v, int &i, float w, int j)
{
    if (j == NONE)
        return;
    if (i == NONE || w > v || (w == v && j < i)) {
        v = w;
        i = j;
    }
}

// Grid: (rows), block (THREADS).
__global__ void __launch_bounds__(THREADS)
greedy_kernel(const float *__restrict__ x, // [rows, n]
              int64_t n, int32_t *__restrict__ out) // [rows]
{
    CINFER_SHARED(float, sv, [THREADS / 32]);
    CINFER_SHARED(int, si, [THREADS / 32]);
    CINFER_SHARED(int, sb, [THREADS / 32]);
    const float *row = x + (int64_t)blockIdx.x * n;
    const int t = (int)threadIdx.x, lane = t % 32, warp = t / 32;
    float best = -INFINITY;
    int bi = NONE, bad = NONE;
    for (int64_t k = t; k < n; k += THREADS) {
        const float v = row[k];
        if (!(v < INFINITY)) { /* NaN or +inf */
            if (bad == NONE)
                bad = (int)k;
        } else if (v > best) {
            best = v;
            bi = (int)k;
        }
    }
    for (int m = 16; m > 0; m /= 2) {
        const float w = __shfl_xor_sync(FULL_MASK, best, m);
        const int j = __shfl_xor_sync(FULL_MASK, bi, m);
        const int b = __shfl_xor_sync(FULL_MASK, bad, m);
        greedy_pick(best, bi, w, j);
        bad = b < bad ? b : bad;
    }
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
        sb[warp] = bad;
    }
    __syncthreads();
    if (t == 0) {
        for (int w = 1; w < THREADS / 32; w++) {
            greedy_pick(best, bi, sv[w], si[w]);
            bad = sb[w] < bad ? sb[w] : bad;
        }
        int32_t r;
        if (bad != NONE)
            r = -2 - (2 * bad + (row[bad] != row[bad]));
        else
            r = bi == NONE ? -1 : bi; /* NONE: the row is all -inf */
        out[blockIdx.x] = r;
    }
}

extern "C" cinfer_status cinfer_cuda_greedy(cudaStream_t stream,
                                            const float *x, int64_t rows,
                                            int64_t n, int32_t *out)
{
    if (rows < 0 || rows > 2147483647LL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda greedy: rows %lld out of range",
                                (long long)rows);
    if (n < 1 || n > ((int64_t)1 << 28))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda greedy: n %lld (1 to 2^28)",
                                (long long)n);
    if (rows == 0)
        return CINFER_OK;
    if (!x || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda greedy: %s is NULL", !x ? "x" : "out");
    CINFER_LAUNCH(greedy_kernel, dim3((unsigned)rows), dim3(THREADS), 0,
                  stream, x, n, out);
    CINFER_CUDA_TRY_LAUNCH("greedy_kernel");
    return CINFER_OK;
}
