/*
 * dense.cu - the batch-invariant float-weight products (dense.cuh): F32
 * weights on CUDA cores, F16 and BF16 on tensor cores.
 */
#include "kernels/cuda/dense.cuh"

#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"
#include "kernels/cuda/mma.cuh"

#define DENSE_ROWS 8 /* activation rows per CTA */
#define FULL_MASK 0xffffffffu
#define MAX_GRID 65535

template <cinfer_dtype T> __device__ __forceinline__ float dense_w(const void *w, int64_t i);

template <> __device__ __forceinline__ float dense_w<CINFER_DTYPE_F32>(const void *w, int64_t i)
{
    return ((const float *)w)[i];
}

template <> __device__ __forceinline__ float dense_w<CINFER_DTYPE_F16>(const void *w, int64_t i)
{
    return __half2float(__ushort_as_half(((const unsigned short *)w)[i]));
}

template <> __device__ __forceinline__ float dense_w<CINFER_DTYPE_BF16>(const void *w, int64_t i)
{
    return __uint_as_float((unsigned)((const unsigned short *)w)[i] << 16);
}

/* grid.x: weight rows (o = blockIdx.x + MAX_GRID * blockIdx.z), grid.y:
 * chunks of DENSE_ROWS activation rows; one warp. */
template <cinfer_dtype T>
__global__ void __launch_bounds__(32)
dense_kernel(const void *__restrict__ w, const float *__restrict__ x,
             float *__restrict__ out, int64_t n_out, int32_t n, int64_t k)
{
    const int lane = (int)threadIdx.x;
    const int64_t o = (int64_t)blockIdx.x + (int64_t)MAX_GRID * blockIdx.z;
    if (o >= n_out)
        return; /* uniform over the warp */
    const int32_t r0 = (int32_t)blockIdx.y * DENSE_ROWS;
    const int32_t nr = n - r0 < DENSE_ROWS ? n - r0 : DENSE_ROWS;
    float acc[DENSE_ROWS];
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; r++)
        acc[r] = 0.0f;
    const int64_t wrow = o * k;
    for (int64_t j = lane; j < k; j += 32) {
        const float wv = dense_w<T>(w, wrow + j);
#pragma unroll
        for (int r = 0; r < DENSE_ROWS; r++)
            if (r < nr)
                acc[r] = fmaf(wv, x[(int64_t)(r0 + r) * k + j], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; r++) {
        float v = acc[r];
        v += __shfl_xor_sync(FULL_MASK, v, 16);
        v += __shfl_xor_sync(FULL_MASK, v, 8);
        v += __shfl_xor_sync(FULL_MASK, v, 4);
        v += __shfl_xor_sync(FULL_MASK, v, 2);
        v += __shfl_xor_sync(FULL_MASK, v, 1);
        if (lane == 0 && r < nr)
            out[(int64_t)(r0 + r) * n_out + o] = v;
    }
}

extern "C" cinfer_status cinfer_cuda_dense(cudaStream_t stream,
                                           cinfer_dtype w_type, const void *w,
                                           int64_t n_out, const float *x,
                                           int32_t n, int64_t k, float *out)
{
    if (!w || !x || !out || n < 1 || k < 1 || n_out < 1 ||
        (int64_t)n * k > ((int64_t)1 << 40))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense: bad arguments (n %d, k %lld, "
                                "n_out %lld)",
                                (int)n, (long long)k, (long long)n_out);
    const int64_t zs = (n_out + MAX_GRID - 1) / MAX_GRID;
    const int64_t ys = ((int64_t)n + DENSE_ROWS - 1) / DENSE_ROWS;
    if (zs > MAX_GRID || ys > MAX_GRID)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense: %lld outputs x %d rows is past "
                                "the grid",
                                (long long)n_out, (int)n);
    const dim3 grid((unsigned)(n_out < MAX_GRID ? n_out : MAX_GRID),
                    (unsigned)ys, (unsigned)zs),
        block(32);
    switch (w_type) {
    case CINFER_DTYPE_F32:
        CINFER_LAUNCH((dense_kernel<CINFER_DTYPE_F32>), grid, block, 0, stream,
                      w, x, out, n_out, n, k);
        break;
    case CINFER_DTYPE_F16:
        CINFER_LAUNCH((dense_kernel<CINFER_DTYPE_F16>), grid, block, 0, stream,
                      w, x, out, n_out, n, k);
        break;
    case CINFER_DTYPE_BF16:
        CINFER_LAUNCH((dense_kernel<CINFER_DTYPE_BF16>), grid, block, 0, stream,
                      w, x, out, n_out, n, k);
        break;
    default:
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense: weight type %s (F32, F16 or "
                                "BF16)",
                                cinfer_dtype_name(w_type));
    }
    CINFER_CUDA_TRY_LAUNCH("dense_kernel");
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* on tensor cores: F16 / BF16 weights                                     */
/* ---------------------------------------------------------------------- */

#define DM_BK 32          /* k per shared-memory stage: two mma steps */
#define DM_LD (DM_BK + 8) /* a staged row, padded: 80 bytes, so that the
                             fragment reads of a warp hit 32 banks */
#define DM_THREADS 128

/* 8 16-bit values of row src (NULL: a row past the matrix) from k0 + c
 * on, zeros past k, into dst (16-byte aligned). vec: rows are 16-byte
 * aligned (k % 8 == 0). */
__device__ __forceinline__ void dm_load8(uint16_t *dst, const uint16_t *src,
                                         int64_t at, int64_t k, int vec)
{
    if (src && vec && at + 8 <= k) {
        *reinterpret_cast<uint4 *>(dst) =
            *reinterpret_cast<const uint4 *>(src + at);
        return;
    }
    for (int e = 0; e < 8; e++)
        dst[e] = src && at + e < k ? src[at + e] : (uint16_t)0;
}

__device__ __forceinline__ unsigned dm_ld32(const uint16_t *p)
{
    return *reinterpret_cast<const unsigned *>(p);
}

/* Grid (ceil(n_out / BN), ceil(n / BM)); block DM_THREADS (4 warps, WM x
 * WN of them, each 16 rows by 8 NT outputs). out = x16 * w^T. */
template <bool BF16, int WM, int WN, int NT>
__global__ void __launch_bounds__(DM_THREADS)
    dense_mma_kernel(const uint16_t *__restrict__ w,
                     const uint16_t *__restrict__ x, float *__restrict__ out,
                     int64_t n_out, int32_t n, int64_t k, int vec)
{
    constexpr int BM = 16 * WM, BN = 8 * NT * WN;
    /* uint4 for the 16-byte alignment of the staged rows */
    CINFER_SHARED(uint4, as4, [BM * DM_LD / 8]);
    CINFER_SHARED(uint4, bs4, [BN * DM_LD / 8]);
    uint16_t *as = reinterpret_cast<uint16_t *>(as4);
    uint16_t *bs = reinterpret_cast<uint16_t *>(bs4);
    const int t = (int)threadIdx.x, warp = t / 32, lane = t % 32;
    const int gid = lane / 4, tid = lane % 4;
    const int wm = warp / WN, wn = warp % WN;
    const int64_t o0 = (int64_t)blockIdx.x * BN;
    const int64_t m0 = (int64_t)blockIdx.y * BM;
    float acc[NT][4];
    for (int j = 0; j < NT; j++)
        for (int i = 0; i < 4; i++)
            acc[j][i] = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += DM_BK) {
        for (int c = t; c < BM * 4; c += DM_THREADS) {
            const int r = c / 4, c8 = (c % 4) * 8;
            const uint16_t *src = m0 + r < n ? x + (m0 + r) * k : NULL;
            dm_load8(as + r * DM_LD + c8, src, k0 + c8, k, vec);
        }
        for (int c = t; c < BN * 4; c += DM_THREADS) {
            const int r = c / 4, c8 = (c % 4) * 8;
            const uint16_t *src = o0 + r < n_out ? w + (o0 + r) * k : NULL;
            dm_load8(bs + r * DM_LD + c8, src, k0 + c8, k, vec);
        }
        __syncthreads();
        for (int ks = 0; ks < DM_BK / 16; ks++) {
            const uint16_t *ar = as + (wm * 16 + gid) * DM_LD + ks * 16 + 2 * tid;
            const unsigned a[4] = {dm_ld32(ar), dm_ld32(ar + 8 * DM_LD),
                                   dm_ld32(ar + 8), dm_ld32(ar + 8 * DM_LD + 8)};
            for (int j = 0; j < NT; j++) {
                const uint16_t *br =
                    bs + (wn * 8 * NT + j * 8 + gid) * DM_LD + ks * 16 + 2 * tid;
                const unsigned b[2] = {dm_ld32(br), dm_ld32(br + 8)};
                if (BF16)
                    cinfer_mma_bf16_16816(acc[j], a, b);
                else
                    cinfer_mma_f16_16816(acc[j], a, b);
            }
        }
        __syncthreads();
    }
    for (int j = 0; j < NT; j++)
        for (int i = 0; i < 4; i++) {
            const int64_t r = m0 + wm * 16 + gid + 8 * (i >> 1);
            const int64_t o = o0 + wn * 8 * NT + j * 8 + 2 * tid + (i & 1);
            if (r < n && o < n_out)
                out[r * n_out + o] = acc[j][i];
        }
}

template <bool BF16>
static cinfer_status dense_mma_launch(cudaStream_t stream, const void *w,
                                      int64_t n_out, const void *x, int32_t n,
                                      int64_t k, float *out)
{
    const int vec = k % 8 == 0;
    const uint16_t *wp = static_cast<const uint16_t *>(w);
    const uint16_t *xp = static_cast<const uint16_t *>(x);
    if (n <= 16) {
        const dim3 grid((unsigned)((n_out + 31) / 32), 1);
        CINFER_LAUNCH((dense_mma_kernel<BF16, 1, 4, 1>), grid,
                      dim3(DM_THREADS), 0, stream, wp, xp, out, n_out, n, k,
                      vec);
    } else {
        const dim3 grid((unsigned)((n_out + 63) / 64),
                        (unsigned)(((int64_t)n + 63) / 64));
        CINFER_LAUNCH((dense_mma_kernel<BF16, 4, 1, 8>), grid,
                      dim3(DM_THREADS), 0, stream, wp, xp, out, n_out, n, k,
                      vec);
    }
    CINFER_CUDA_TRY_LAUNCH("dense_mma_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_dense_mma(cudaStream_t stream,
                                               cinfer_dtype w_type,
                                               const void *w, int64_t n_out,
                                               const void *x16, int32_t n,
                                               int64_t k, float *out)
{
    if (!w || !x16 || !out || n < 1 || k < 1 || n_out < 1 ||
        (n_out + 31) / 32 > ((int64_t)1 << 31) - 1 ||
        ((int64_t)n + 63) / 64 > MAX_GRID)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda dense_mma: bad arguments (n %d, k %lld, "
                                "n_out %lld)",
                                (int)n, (long long)k, (long long)n_out);
    if (w_type == CINFER_DTYPE_BF16)
        return dense_mma_launch<true>(stream, w, n_out, x16, n, k, out);
    if (w_type == CINFER_DTYPE_F16)
        return dense_mma_launch<false>(stream, w, n_out, x16, n, k, out);
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "cuda dense_mma: weight type %s (F16 or BF16)",
                            cinfer_dtype_name(w_type));
}
