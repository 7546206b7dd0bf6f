/*
 * embed.cu - token embedding lookup (embed.cuh).
 *
 * A row per blockIdx.x, its columns strided over blockIdx.y and the
 * threads, one output element per thread and iteration (four for an
 * aligned F32 table). For the block types a warp's 32 consecutive
 * elements are one 32-element block, so its scale is one broadcast load
 * and its quants one contiguous run.
 */
#include <stddef.h>

#include "kernels/cuda/cuda_compat.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/embed.cuh"

#define THREADS 256
#define MAX_BLOCKS 65535

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static __device__ __forceinline__ float half_bits(uint16_t bits)
{
    __half_raw h;
    h.x = bits;
    return __half2float(__half(h));
}

/* Element i of a row of type DT (exactly cinfer_dequantize_row's value). */
template <int DT>
static __device__ __forceinline__ float elem(const unsigned char *row,
                                             int64_t i)
{
    const int64_t b = i / CINFER_QK;
    const int j = (int)(i % CINFER_QK);
    switch (DT) {
    case CINFER_DTYPE_F32:
        return reinterpret_cast<const float *>(row)[i];
    case CINFER_DTYPE_F16:
        return __half2float(reinterpret_cast<const __half *>(row)[i]);
    case CINFER_DTYPE_BF16:
        return __bfloat162float(
            reinterpret_cast<const __nv_bfloat16 *>(row)[i]);
    case CINFER_DTYPE_Q8_0: {
        const cinfer_block_q8_0 *blk =
            reinterpret_cast<const cinfer_block_q8_0 *>(row) + b;
        return half_bits(blk->d) * (float)blk->qs[j];
    }
    case CINFER_DTYPE_Q4_0: {
        const cinfer_block_q4_0 *blk =
            reinterpret_cast<const cinfer_block_q4_0 *>(row) + b;
        const int q = j < 16 ? blk->qs[j] & 15 : blk->qs[j - 16] >> 4;
        return half_bits(blk->d) * (float)(q - 8);
    }
    case CINFER_DTYPE_Q4_1: {
        const cinfer_block_q4_1 *blk =
            reinterpret_cast<const cinfer_block_q4_1 *>(row) + b;
        const int q = j < 16 ? blk->qs[j] & 15 : blk->qs[j - 16] >> 4;
        /* __fmul_rn: no fused multiply-add, as the CPU rounds d * q first */
        return __fmul_rn(half_bits(blk->d), (float)q) + half_bits(blk->m);
    }
    default:
        return 0.0f; /* not instantiated: the launcher's switch rejects it */
    }
}

// Grid: (n, min(ceil(d / VEC / THREADS), MAX_BLOCKS)), block (THREADS).
// DT: the table's cinfer_dtype. VEC 4 (F32 only): d % 4 == 0 and table,
// out 16-byte aligned.
template <int DT, int VEC>
__global__ void embed_kernel(const unsigned char *__restrict__ table, // [vocab, d] of DT
                             size_t row_bytes,
                             const int32_t *__restrict__ tokens, // [n]
                             int64_t d,
                             float *__restrict__ out) // [n, d]
{
    const unsigned char *row = table + (size_t)tokens[blockIdx.x] * row_bytes;
    float *o = out + (int64_t)blockIdx.x * d;
    const int64_t stride = (int64_t)gridDim.y * blockDim.x;
    const int64_t t = (int64_t)blockIdx.y * blockDim.x + threadIdx.x;
    if (VEC == 4) {
        const float4 *s4 = reinterpret_cast<const float4 *>(row);
        float4 *o4 = reinterpret_cast<float4 *>(o);
        for (int64_t i = t; i < d / 4; i += stride)
            o4[i] = s4[i];
    } else {
        for (int64_t i = t; i < d; i += stride)
            o[i] = elem<DT>(row, i);
    }
}

template <int DT, int VEC>
static cinfer_status launch(cudaStream_t stream, const void *table,
                            size_t row_bytes, const int32_t *tokens, int32_t n,
                            int64_t d, float *out)
{
    const int64_t cols = (d / VEC + THREADS - 1) / THREADS;
    const dim3 grid((unsigned)n,
                    (unsigned)(cols < MAX_BLOCKS ? cols : MAX_BLOCKS));
    CINFER_LAUNCH((embed_kernel<DT, VEC>), grid, dim3(THREADS), 0, stream,
                  (const unsigned char *)table, row_bytes, tokens, d, out);
    CINFER_CUDA_TRY_LAUNCH("embed_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_embed(cudaStream_t stream,
                                           cinfer_dtype dtype,
                                           const void *table, int64_t vocab,
                                           int64_t d, const int32_t *tokens,
                                           int32_t n, float *out)
{
    if (n < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda embed: n %d is negative", (int)n);
    if (vocab < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda embed: vocab %lld is not >= 1",
                                (long long)vocab);
    if (d < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda embed: d %lld is negative",
                                (long long)d);
    const size_t row_bytes = cinfer_dtype_row_bytes(dtype, d);
    if (d > 0 && row_bytes == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda embed: d %lld is not a multiple of %s's "
                                "block of %d",
                                (long long)d, cinfer_dtype_name(dtype),
                                cinfer_dtype_block_elems(dtype));
    if (n == 0 || d == 0)
        return CINFER_OK;
    if (!table || !tokens || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda embed: %s is NULL",
                                !table ? "table" : !tokens ? "tokens" : "out");
    switch (dtype) {
    case CINFER_DTYPE_F32:
        if (d % 4 == 0 && aligned16(table) && aligned16(out))
            return launch<CINFER_DTYPE_F32, 4>(stream, table, row_bytes,
                                               tokens, n, d, out);
        return launch<CINFER_DTYPE_F32, 1>(stream, table, row_bytes, tokens, n,
                                           d, out);
    case CINFER_DTYPE_F16:
        return launch<CINFER_DTYPE_F16, 1>(stream, table, row_bytes, tokens, n,
                                           d, out);
    case CINFER_DTYPE_BF16:
        return launch<CINFER_DTYPE_BF16, 1>(stream, table, row_bytes, tokens,
                                            n, d, out);
    case CINFER_DTYPE_Q8_0:
        return launch<CINFER_DTYPE_Q8_0, 1>(stream, table, row_bytes, tokens,
                                            n, d, out);
    case CINFER_DTYPE_Q4_0:
        return launch<CINFER_DTYPE_Q4_0, 1>(stream, table, row_bytes, tokens,
                                            n, d, out);
    case CINFER_DTYPE_Q4_1:
        return launch<CINFER_DTYPE_Q4_1, 1>(stream, table, row_bytes, tokens,
                                            n, d, out);
    default:
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda embed: table type %s (%d) is not F32, "
                                "F16, BF16, Q8_0, Q4_0 or Q4_1",
                                cinfer_dtype_name(dtype), (int)dtype);
    }
}
