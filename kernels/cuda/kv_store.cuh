/*
 * kv_store.cuh - writes a step's new K and V rows into the paged KV cache
 * of one attention layer on the CUDA backend.
 *
 * The cache of a layer is [n_blocks, block_size, n_kv_heads, head_dim]; a
 * token's slot is block * block_size + offset (its sequence's block table
 * resolved by the caller), so the cache is addressed here as
 * [n_slots, width] rows with width = n_kv_heads * head_dim. Each cache is
 * F32 (a copy) or F16 (round to nearest even, as cinfer_fp32_to_fp16 in
 * kernels/dtype.c, NaN stored as 0x7e00 with its sign), chosen per cache.
 *
 * Host launcher: checks its arguments, launches on `stream`, returns
 * CINFER_E_DEVICE if the launch fails. Pointers are device memory; slots
 * are checked against the cache size by the caller.
 *
 *     cinfer_status s = cinfer_cuda_kv_store(stream, k, v, slots, n_rows,
 *                                            n_kv_heads * head_dim,
 *                                            k_cache, CINFER_DTYPE_F16,
 *                                            v_cache, CINFER_DTYPE_F16);
 */
#ifndef CINFER_CUDA_KV_STORE_CUH
#define CINFER_CUDA_KV_STORE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For r < n: k_cache row slots[r] = k[r], v_cache row slots[r] = v[r],
 * converted to kdt / vdt (F16 or F32).  k, v: [n, width] F32; slots: [n];
 * k_cache, v_cache: [n_slots, width]. */
cinfer_status cinfer_cuda_kv_store(cudaStream_t stream, const float *k,
                                   const float *v, const int32_t *slots,
                                   int32_t n, int64_t width, void *k_cache,
                                   cinfer_dtype kdt, void *v_cache,
                                   cinfer_dtype vdt);

#ifdef __cplusplus
}
#endif

/* Device side, shared with rope.cu's fused rope and store: one element
 * into a cache of float or __half. */
#if defined(__cplusplus) && (defined(__CUDACC__) || defined(CINFER_CUDASIM))
#include "kernels/cuda/cuda_compat.cuh"

static __device__ __forceinline__ void cinfer_kv_put(float *p, float v)
{
    *p = v;
}

static __device__ __forceinline__ void cinfer_kv_put(__half *p, float v)
{
    if (isnan(v)) {
        /* the quiet NaN cinfer_fp32_to_fp16 writes, rather than the
         * conversion's canonical one */
        __half_raw h;
        h.x = signbit(v) ? (unsigned short)0xfe00u : (unsigned short)0x7e00u;
        *p = __half(h);
    } else {
        *p = __float2half_rn(v);
    }
}
#endif
#endif /* CINFER_CUDA_KV_STORE_CUH */
