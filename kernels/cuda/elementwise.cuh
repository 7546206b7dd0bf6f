/*
 * elementwise.cuh - the CUDA backend's flat elementwise ops: add (the
 * residual connection), add_bias (a projection's bias, qwen2's QKV) and
 * silu_mul (the SwiGLU gate of a Llama feed-forward block).
 *
 * The arithmetic is the CPU backend's (kernels/cpu/ops.c): one float add
 * per element; silu(g) * u = g / (1 + expf(-g)) * u with an accurate expf,
 * not the fast-math __expf. Outputs may alias inputs where noted: each
 * element is read and written by the same thread, at the same index.
 *
 * Host launchers: they check their arguments (cinfer_set_error names the
 * argument), launch on `stream` and return CINFER_E_DEVICE if the launch
 * fails. All pointers are device memory. Not synchronising: errors from the
 * kernel itself surface at the stream's next checked call.
 *
 *     cinfer_status s = cinfer_cuda_silu_mul(stream, gate, up, gate, n * ffn);
 *     if (s == CINFER_OK)
 *         s = cinfer_cuda_add(stream, resid, ffn_out, resid, n * d);
 */
#ifndef CINFER_CUDA_ELEMENTWISE_CUH
#define CINFER_CUDA_ELEMENTWISE_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out = a + b over n_elems floats. out may alias a or b. */
cinfer_status cinfer_cuda_add(cudaStream_t stream, const float *a,
                              const float *b, float *out, int64_t n_elems);

/* x[r] += b for each of the n rows.  x: [n, d]; b: [d]. */
cinfer_status cinfer_cuda_add_bias(cudaStream_t stream, float *x,
                                   const float *b, int64_t n, int64_t d);

/* out = gate / (1 + exp(-gate)) * up over n_elems floats. out may alias
 * gate (or up). */
cinfer_status cinfer_cuda_silu_mul(cudaStream_t stream, const float *gate,
                                   const float *up, float *out,
                                   int64_t n_elems);

#ifdef __cplusplus
}
#endif

/* Device side, shared with mmvq.cu's fused gate-up product: silu(g) * u
 * (expf, not the fast __expf). */
#if defined(__cplusplus) && (defined(__CUDACC__) || defined(CINFER_CUDASIM))
#include "kernels/cuda/cuda_compat.cuh"

static __device__ __forceinline__ float cinfer_silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}
#endif
#endif /* CINFER_CUDA_ELEMENTWISE_CUH */
