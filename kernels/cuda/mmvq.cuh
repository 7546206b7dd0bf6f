/*
 * mmvq.cuh - quantized matrix-vector products for 1..8 activation rows:
 * out = x * w^T with w in Q8_0, Q4_0 or Q4_1 and x already in Q8_1 blocks
 * (quantize.cuh).
 *
 * The model is llama.cpp's ggml-cuda mmvq.cu: a CTA of 4 warps per weight
 * row, lanes along k (4 lanes per 32-element block, so a warp reads 8
 * consecutive weight blocks), integer dot products with dp4a, each weight
 * block loaded once and used by every activation row.
 *
 * Unlike llama.cpp, the float reduction order of an output element is
 * fixed by k alone (backend.h's batch invariance), and is the same in the
 * tiled kernel (mmq.cu), so a row gives the same bits alone, in a batch of
 * 8 or in a batch of 300:
 *   - a block's integer dot product is formed in full (exact) before any
 *     float arithmetic, and turned into a float term by mm_block_acc below;
 *   - block b goes to slot b % 32; each slot sums its blocks in increasing
 *     b with fmaf;
 *   - the 32 slots are added as a binary tree, pairing slot bit 4 first,
 *     then bits 3, 2, 1, 0.
 * Q4_0 subtracts its offset 8 exactly (8 * sum of the activation quants),
 * as the CPU does; Q4_1 uses the activation block's s = d * sum(q), as GGML
 * and the CPU do.
 *
 *     // xq from cinfer_cuda_quantize_q8_1(stream, x, xq, n, k), n <= 8
 *     cinfer_cuda_mmvq(stream, CINFER_DTYPE_Q4_0, w, n_out, xq, n, k, out);
 *
 * The launcher is asynchronous on `stream`; it returns CINFER_E_INVALID_ARG
 * or CINFER_E_UNSUPPORTED for bad arguments (nothing launched) and
 * CINFER_E_DEVICE for a failed launch.
 */
#ifndef CINFER_CUDA_MMVQ_CUH
#define CINFER_CUDA_MMVQ_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most activation rows the matrix-vector kernel takes. */
#define CINFER_CUDA_MMVQ_MAX_ROWS 8

/* Most weights one launch takes (cinfer_cuda_mmvq_set). */
#define CINFER_CUDA_MMVQ_MAX_W 4

/* out[r][o] = dot(x[r], w[o]) for r < n, o < n_out.
 * w: [n_out, k / 32] blocks of w_type (Q8_0, Q4_0 or Q4_1; GGML's layout),
 * 2-byte aligned; xq: [n, k / 32] cinfer_block_q8_1, 4-byte aligned;
 * out: [n, n_out] F32. 1 <= n <= 8, k a positive multiple of 32. */
cinfer_status cinfer_cuda_mmvq(cudaStream_t stream, cinfer_dtype w_type,
                               const void *w, int64_t n_out, const void *xq,
                               int32_t n, int64_t k, float *out);

/* cinfer_cuda_mmvq for n_w (1..CINFER_CUDA_MMVQ_MAX_W) weights of one type
 * that share the input xq (Q, K and V; gate and up), in one launch: out[i]
 * = x * w[i]^T, [n, n_out[i]], each element the bits cinfer_cuda_mmvq
 * gives it alone. */
cinfer_status cinfer_cuda_mmvq_set(cudaStream_t stream, cinfer_dtype w_type,
                                   int n_w, const void *const *w,
                                   const int64_t *n_out, const void *xq,
                                   int32_t n, int64_t k, float *const *out);

/* out = silu(x * w_gate^T) * (x * w_up^T), [n, n_out], in one launch, the
 * bits of cinfer_cuda_mmvq_set on the two weights followed by
 * cinfer_cuda_silu_mul (elementwise.cuh). */
cinfer_status cinfer_cuda_mmvq_silu_mul(cudaStream_t stream,
                                        cinfer_dtype w_type,
                                        const void *w_gate, const void *w_up,
                                        int64_t n_out, const void *xq,
                                        int32_t n, int64_t k, float *out);

/* The argument checks cinfer_cuda_mmvq_set and cinfer_cuda_mmq_set share:
 * 1..max_w weights of a quantized type, each w 2-byte aligned with its
 * out, n_out[i] >= 1; xq set and 4-byte aligned; 1 <= n <= max_n; k a
 * positive multiple of 32. CINFER_E_INVALID_ARG or CINFER_E_UNSUPPORTED
 * naming the argument and `kernel`. */
cinfer_status cinfer_cuda_mm_check(const char *kernel, cinfer_dtype w_type,
                                   int n_w, int max_w, const void *const *w,
                                   const int64_t *n_out, float *const *out,
                                   const void *xq, int32_t n, int32_t max_n,
                                   int64_t k);

#ifdef __cplusplus
}
#endif

/* ---------------------------------------------------------------------- */
/* device side, shared with mmq.cu: the block term and the slot order      */
/* ---------------------------------------------------------------------- */

#if defined(__cplusplus) && (defined(__CUDACC__) || defined(CINFER_CUDASIM))
#include "kernels/cuda/cuda_compat.cuh"

/* Float slots of an output element's reduction along k (block b in slot
 * b % CINFER_MM_SLOTS). */
#define CINFER_MM_SLOTS 32

/* A weight type's block as 16-bit words: u16 words per block, the first
 * word of qs, 32-bit words of qs. */
template <cinfer_dtype T> struct mm_block_traits;
template <> struct mm_block_traits<CINFER_DTYPE_Q8_0> {
    enum { U16 = 17, QS = 1, INTS = 8 };
};
template <> struct mm_block_traits<CINFER_DTYPE_Q4_0> {
    enum { U16 = 9, QS = 1, INTS = 4 };
};
template <> struct mm_block_traits<CINFER_DTYPE_Q4_1> {
    enum { U16 = 10, QS = 2, INTS = 4 };
};

/* A Q8_1 block as 9 32-bit words: d | s << 16, then qs[0..31]. */
#define CINFER_MM_Q8_1_WORDS 9

__device__ __forceinline__ float mm_f16(unsigned bits)
{
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xffffu)));
}

/* acc plus one block's contribution. isum: the block's integer dot product
 * of weight and activation quants (for Q4_0 of q - 8, i.e. less 8 * the sum
 * of the activation quants; for Q4_1 of the raw nibbles); dw, mw: the
 * weight block's d (and m for Q4_1); dx, sx: the Q8_1 block's d and s.
 * The products of two f16 values are exact in f32, so only the fmaf
 * rounds: the same bits wherever this is inlined. */
template <cinfer_dtype T>
__device__ __forceinline__ float mm_block_acc(float acc, int isum, float dw,
                                              float mw, float dx, float sx)
{
    if (T == CINFER_DTYPE_Q4_1)
        return fmaf(dw * dx, (float)isum, acc + mw * sx);
    (void)mw;
    (void)sx;
    return fmaf(dw * dx, (float)isum, acc);
}

#endif /* device side */

#endif /* CINFER_CUDA_MMVQ_CUH */
