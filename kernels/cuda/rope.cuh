/*
 * rope.cuh - rotary position embedding (RoPE) on the CUDA backend, applied
 * in place to the query and key rows of a Llama-family attention layer.
 *
 * For each row r at position p = positions[r], each head, and each pair
 * i < rot_dim / 2 with angle a = freq_scale * p * theta^(-2i / rot_dim) /
 * freq_factors[i] (linear scaling and Llama 3's frequency factors;
 * freq_scale 1 and no factors for plain rope):
 *   NORM (llama):        (x[2i], x[2i+1])           rotated by a
 *   NEOX (qwen2, neox):  (x[i], x[i + rot_dim/2])    rotated by a
 * as x0' = x0 cos a - x1 sin a, x1' = x0 sin a + x1 cos a; dimensions at
 * and past rot_dim are untouched. The CPU backend (kernels/cpu/ops.c) builds
 * the angle by repeated float products, as GGML does, so its error grows
 * with the position; here the frequencies are computed on the host in
 * double, the angle is formed and reduced modulo 2 pi in double, and only
 * the reduced angle goes through sincosf (accurate, not __sinf), so results
 * stay within a few float ulps of the exact rotation at positions of 100k
 * and more.
 *
 * Host launcher: checks its arguments (as the CPU backend's rope does),
 * launches on `stream`, returns CINFER_E_DEVICE if the launch fails.
 * Pointers are device memory.
 *
 *     cinfer_status s = cinfer_cuda_rope(stream, q, positions, n_rows,
 *                                        n_heads, 128, 128, 500000.0f,
 *                                        1.0f, NULL, CINFER_CUDA_ROPE_NORM);
 */
#ifndef CINFER_CUDA_ROPE_CUH
#define CINFER_CUDA_ROPE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The mode values of cinfer_rope_mode (kernels/backend.h). */
#define CINFER_CUDA_ROPE_NORM 0
#define CINFER_CUDA_ROPE_NEOX 2

/* The largest rot_dim the kernel takes (its frequencies travel in the
 * launch's parameters). */
#define CINFER_CUDA_ROPE_MAX_DIM 512

/* Rotates x in place.  x: [n, n_heads * head_dim]; positions: [n].
 * n_heads >= 1, head_dim >= 2, rot_dim even in 2..head_dim (and <=
 * CINFER_CUDA_ROPE_MAX_DIM), theta and freq_scale finite and > 0,
 * freq_factors NULL or [rot_dim / 2] finite values > 0 in host memory
 * (read before the call returns: they travel in the launch's parameters),
 * mode NORM or NEOX. */
cinfer_status cinfer_cuda_rope(cudaStream_t stream, float *x,
                               const int32_t *positions, int32_t n,
                               int n_heads, int head_dim, int rot_dim,
                               float theta, float freq_scale,
                               const float *freq_factors, int mode);

/* cinfer_cuda_rope of q (n_heads) and of k (n_kv_heads), then
 * cinfer_cuda_kv_store of the roped k and of v, in one launch with the
 * same bits: k: [n, n_kv_heads * head_dim], roped in place and stored with
 * v at cache rows slots[r]; kdt / vdt F16 or F32 (kv_store.cuh). */
cinfer_status cinfer_cuda_rope_kv_store(
    cudaStream_t stream, float *q, float *k, const float *v,
    const int32_t *positions, const int32_t *slots, int32_t n, int n_heads,
    int n_kv_heads, int head_dim, int rot_dim, float theta, float freq_scale,
    const float *freq_factors, int mode, void *k_cache, cinfer_dtype kdt,
    void *v_cache, cinfer_dtype vdt);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CUDA_ROPE_CUH */
