/*
 * kv_store.cu - the KV cache write (kv_store.cuh).
 *
 * Grid: a row per blockIdx.x, its columns strided over blockIdx.y and the
 * threads; each thread converts and stores one K and one V element per
 * iteration, so reads and writes of a warp are contiguous. The four
 * (K type, V type) pairs are separate instantiations.
 */
#include <limits.h>
#include <math.h>

#include "kernels/cuda/cuda_compat.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/kv_store.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535

// Grid: (n, min(ceil(width / THREADS), MAX_BLOCKS)), block (THREADS).
// KT, VT: float or __half, the caches' element types.
template <typename KT, typename VT>
__global__ void kv_store_kernel(const float *__restrict__ k,       // [n, width]
                                const float *__restrict__ v,       // [n, width]
                                const int32_t *__restrict__ slots, // [n]
                                int64_t width,
                                KT *__restrict__ k_cache, // [n_slots, width]
                                VT *__restrict__ v_cache) // [n_slots, width]
{
    const int64_t r = blockIdx.x;
    const int64_t slot = slots[r];
    const float *kr = k + r * width, *vr = v + r * width;
    KT *kc = k_cache + slot * width;
    VT *vc = v_cache + slot * width;
    const int64_t stride = (int64_t)gridDim.y * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; i < width;
         i += stride) {
        cinfer_kv_put(kc + i, kr[i]);
        cinfer_kv_put(vc + i, vr[i]);
    }
}

template <typename KT, typename VT>
static cinfer_status launch(cudaStream_t stream, dim3 grid, const float *k,
                            const float *v, const int32_t *slots,
                            int64_t width, void *k_cache, void *v_cache)
{
    CINFER_LAUNCH((kv_store_kernel<KT, VT>), grid, dim3(THREADS), 0, stream,
                  k, v, slots, width, (KT *)k_cache, (VT *)v_cache);
    CINFER_CUDA_TRY_LAUNCH("kv_store_kernel");
    return CINFER_OK;
}

static int cache_type_ok(cinfer_dtype t)
{
    return t == CINFER_DTYPE_F16 || t == CINFER_DTYPE_F32;
}

extern "C" cinfer_status cinfer_cuda_kv_store(cudaStream_t stream,
                                              const float *k, const float *v,
                                              const int32_t *slots, int32_t n,
                                              int64_t width, void *k_cache,
                                              cinfer_dtype kdt, void *v_cache,
                                              cinfer_dtype vdt)
{
    if (n < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda kv_store: n %d is negative", (int)n);
    if (width < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda kv_store: width %lld is negative",
                                (long long)width);
    if (!cache_type_ok(kdt) || !cache_type_ok(vdt))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda kv_store: %s cache type %s is not F16 "
                                "or F32",
                                !cache_type_ok(kdt) ? "k" : "v",
                                cinfer_dtype_name(!cache_type_ok(kdt) ? kdt
                                                                      : vdt));
    if (n == 0 || width == 0)
        return CINFER_OK;
    if (!k || !v || !slots || !k_cache || !v_cache)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda kv_store: %s is NULL",
                                !k ? "k" : !v ? "v" : !slots ? "slots"
                                : !k_cache ? "k_cache" : "v_cache");
    int64_t cols = (width + THREADS - 1) / THREADS;
    const dim3 grid((unsigned)n,
                    (unsigned)(cols < MAX_BLOCKS ? cols : MAX_BLOCKS));
    const int kh = kdt == CINFER_DTYPE_F16, vh = vdt == CINFER_DTYPE_F16;
    switch (kh * 2 + vh) {
    case 3:
        return launch<__half, __half>(stream, grid, k, v, slots, width,
                                      k_cache, v_cache);
    case 2:
        return launch<__half, float>(stream, grid, k, v, slots, width, k_cache,
                                     v_cache);
    case 1:
        return launch<float, __half>(stream, grid, k, v, slots, width, k_cache,
                                     v_cache);
    case 0:
        return launch<float, float>(stream, grid, k, v, slots, width, k_cache,
                                    v_cache);
    default:
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda kv_store: cache types %d, %d", (int)kdt,
                                (int)vdt);
    }
}
