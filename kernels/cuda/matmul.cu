/*
 * matmul.cu - the CUDA matmul dispatcher: input preparation once per
 * format, then cuBLAS or the quantized kernels per weight. See matmul.cuh.
 */
#include "kernels/cuda/matmul.cuh"

#include <limits.h>
#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/mmvq.cuh"
#include "kernels/cuda/quantize.cuh"

#define MM_MAX_WEIGHTS 4
static_assert(MM_MAX_WEIGHTS <= CINFER_CUDA_MMVQ_MAX_W &&
                  MM_MAX_WEIGHTS <= CINFER_CUDA_MMQ_MAX_W,
              "a call's weights of one type fit one launch");
#define SCRATCH_ALIGN 256

/* Where each prepared copy of the input lives in the scratch. */
typedef struct {
    size_t q8_1;  /* offset of the Q8_1 blocks (k % 32 == 0 only) */
    size_t f16;   /* offset of the F16 copy */
    size_t bf16;  /* offset of the BF16 copy */
    size_t total; /* bytes */
} scratch_layout;

static size_t align_up(size_t v)
{
    return (v + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

static scratch_layout layout_for(int32_t n, int64_t k)
{
    scratch_layout l;
    const size_t half_bytes = (size_t)n * (size_t)k * 2;
    l.q8_1 = 0;
    l.f16 = align_up(cinfer_cuda_q8_1_bytes(n, k));
    l.bf16 = l.f16 + align_up(half_bytes);
    l.total = l.bf16 + align_up(half_bytes);
    return l;
}

extern "C" size_t cinfer_cuda_matmul_scratch_bytes(int32_t n, int64_t k)
{
    if (n < 1 || k < 1)
        return 0;
    return layout_for(n, k).total;
}

static int is_quantized(cinfer_dtype t)
{
    return t == CINFER_DTYPE_Q8_0 || t == CINFER_DTYPE_Q4_0 ||
           t == CINFER_DTYPE_Q4_1;
}

/* ---------------------------------------------------------------------- */
/* checks                                                                  */
/* ---------------------------------------------------------------------- */

static cinfer_status check_weight(int i, const cinfer_cuda_mm_weight *w,
                                  int64_t k)
{
    size_t align;
    switch (w->dtype) {
    case CINFER_DTYPE_F32:
        align = 4;
        break;
    case CINFER_DTYPE_F16:
    case CINFER_DTYPE_BF16:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
        align = 2;
        break;
    default:
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "cuda matmul: w[%d].dtype %s (F32, F16, BF16, "
                                "Q8_0, Q4_0 or Q4_1)",
                                i, cinfer_dtype_name(w->dtype));
    }
    if (w->data == NULL || w->out == NULL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: w[%d].data and .out must be set",
                                i);
    if ((uintptr_t)w->data % align != 0 || (uintptr_t)w->out % 4 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: w[%d].data must be %zu-byte and "
                                ".out 4-byte aligned",
                                i, align);
    if (w->n_out < 1 || w->n_out > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: w[%d].n_out = %lld out of range",
                                i, (long long)w->n_out);
    if (is_quantized(w->dtype) && k % CINFER_QK != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: k = %lld is not a multiple of "
                                "32, as w[%d].dtype %s needs",
                                (long long)k, i, cinfer_dtype_name(w->dtype));
    return CINFER_OK;
}

static cinfer_status check_args(cublasHandle_t cublas, int n_w,
                                const cinfer_cuda_mm_weight *w, const float *x,
                                int32_t n, int64_t k, const void *scratch,
                                size_t scratch_bytes, int invariant)
{
    if (n_w < 1 || n_w > MM_MAX_WEIGHTS || w == NULL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: n_w = %d (1..4, w set)", n_w);
    if (x == NULL || (uintptr_t)x % 4 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: x must be set, 4-byte aligned");
    if (n < 1 || n > CINFER_CUDA_MMQ_MAX_ROWS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: n = %d out of range", (int)n);
    if (k < 1 || k > INT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: k = %lld out of range",
                                (long long)k);
    if (scratch == NULL || (uintptr_t)scratch % 16 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: scratch must be set, 16-byte "
                                "aligned");
    if (scratch_bytes < cinfer_cuda_matmul_scratch_bytes(n, k))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul: scratch_bytes = %zu < %zu needed",
                                scratch_bytes,
                                cinfer_cuda_matmul_scratch_bytes(n, k));
    for (int i = 0; i < n_w; i++) {
        cinfer_status st = check_weight(i, &w[i], k);
        if (st != CINFER_OK)
            return st;
        if (!is_quantized(w[i].dtype) && cublas == NULL && !invariant)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "cuda matmul: cublas must be set for "
                                    "w[%d].dtype %s",
                                    i, cinfer_dtype_name(w[i].dtype));
    }
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* dispatch                                                                */
/* ---------------------------------------------------------------------- */

/* out = x * w^T through cuBLAS. In column-major terms out^T (n_out x n,
 * ld n_out) = W^T (w is k x n_out, ld k) times X (k x n, ld k). */
static cinfer_status gemm(cublasHandle_t cublas, const cinfer_cuda_mm_weight *w,
                          const void *x, cudaDataType_t type, int32_t n,
                          int64_t k)
{
    const float alpha = 1.0f, beta = 0.0f;
    CINFER_CUBLAS_TRY(cublasGemmEx(
        cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->n_out, (int)n, (int)k,
        &alpha, w->data, type, (int)k, x, type, (int)k, &beta, w->out,
        CUDA_R_32F, (int)w->n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_matmul(cudaStream_t stream,
                                            cublasHandle_t cublas, int n_w,
                                            const cinfer_cuda_mm_weight *w,
                                            const float *x, int32_t n,
                                            int64_t k, void *scratch,
                                            size_t scratch_bytes,
                                            int batch_invariant)
{
    cinfer_status st = check_args(cublas, n_w, w, x, n, k, scratch,
                                  scratch_bytes, batch_invariant);
    if (st != CINFER_OK)
        return st;

    const scratch_layout l = layout_for(n, k);
    uint8_t *base = (uint8_t *)scratch;
    void *xq = base + l.q8_1, *x16 = base + l.f16, *xb16 = base + l.bf16;
    int need_q8 = 0, need_f16 = 0, need_bf16 = 0, need_blas = 0;
    for (int i = 0; i < n_w; i++) {
        need_q8 |= is_quantized(w[i].dtype);
        need_f16 |= w[i].dtype == CINFER_DTYPE_F16;
        need_bf16 |= w[i].dtype == CINFER_DTYPE_BF16;
        need_blas |= !is_quantized(w[i].dtype);
    }
    if (batch_invariant) /* our kernels for the float weights (dense.cuh) */
        need_blas = 0;
    if (need_q8) {
        st = cinfer_cuda_quantize_q8_1(stream, x, xq, n, k);
        if (st != CINFER_OK)
            return st;
    }
    if (need_f16) {
        st = cinfer_cuda_convert_f32(stream, CINFER_DTYPE_F16, x, x16,
                                     (int64_t)n * k);
        if (st != CINFER_OK)
            return st;
    }
    if (need_bf16) {
        st = cinfer_cuda_convert_f32(stream, CINFER_DTYPE_BF16, x, xb16,
                                     (int64_t)n * k);
        if (st != CINFER_OK)
            return st;
    }
    if (need_blas)
        CINFER_CUBLAS_TRY(cublasSetStream(cublas, stream));

    for (int i = 0; i < n_w; i++) {
        const cinfer_cuda_mm_weight *wi = &w[i];
        if (is_quantized(wi->dtype)) {
            /* this weight and the next ones of its type: one launch */
            const void *ws[MM_MAX_WEIGHTS];
            int64_t no[MM_MAX_WEIGHTS];
            float *os[MM_MAX_WEIGHTS];
            int m = 0;
            while (i + m < n_w && w[i + m].dtype == wi->dtype) {
                ws[m] = w[i + m].data;
                no[m] = w[i + m].n_out;
                os[m] = w[i + m].out;
                m++;
            }
            st = n <= CINFER_CUDA_MMVQ_MAX_ROWS
                     ? cinfer_cuda_mmvq_set(stream, wi->dtype, m, ws, no, xq,
                                            n, k, os)
                     : cinfer_cuda_mmq_set(stream, wi->dtype, m, ws, no, xq,
                                           n, k, os);
            if (st != CINFER_OK)
                return st;
            i += m - 1;
            continue;
        }
        switch (wi->dtype) {
        case CINFER_DTYPE_F32:
        case CINFER_DTYPE_F16:
        case CINFER_DTYPE_BF16:
            if (batch_invariant && wi->dtype == CINFER_DTYPE_F32)
                st = cinfer_cuda_dense(stream, wi->dtype, wi->data, wi->n_out,
                                       x, n, k, wi->out);
            else if (batch_invariant)
                st = cinfer_cuda_dense_mma(
                    stream, wi->dtype, wi->data, wi->n_out,
                    wi->dtype == CINFER_DTYPE_F16 ? x16 : xb16, n, k,
                    wi->out);
            else if (wi->dtype == CINFER_DTYPE_F32)
                st = gemm(cublas, wi, x, CUDA_R_32F, n, k);
            else if (wi->dtype == CINFER_DTYPE_F16)
                st = gemm(cublas, wi, x16, CUDA_R_16F, n, k);
            else
                st = gemm(cublas, wi, xb16, CUDA_R_16BF, n, k);
            break;
        default: /* check_weight refused it */
            st = cinfer_set_error(CINFER_E_INTERNAL,
                                  "cuda matmul: w[%d].dtype unchecked", i);
            break;
        }
        if (st != CINFER_OK)
            return st;
    }
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_matmul_silu_mul(
    cudaStream_t stream, cublasHandle_t cublas, const cinfer_cuda_mm_weight *w,
    const float *x, int32_t n, int64_t k, void *scratch, size_t scratch_bytes,
    int batch_invariant)
{
    cinfer_status st = check_args(cublas, 2, w, x, n, k, scratch,
                                  scratch_bytes, batch_invariant);
    if (st != CINFER_OK)
        return st;
    if (n <= CINFER_CUDA_MMVQ_MAX_ROWS && is_quantized(w[0].dtype) &&
        w[1].dtype == w[0].dtype && w[1].n_out == w[0].n_out) {
        const scratch_layout l = layout_for(n, k);
        void *xq = (uint8_t *)scratch + l.q8_1;
        st = cinfer_cuda_quantize_q8_1(stream, x, xq, n, k);
        if (st != CINFER_OK)
            return st;
        return cinfer_cuda_mmvq_silu_mul(stream, w[0].dtype, w[0].data,
                                         w[1].data, w[0].n_out, xq, n, k,
                                         w[0].out);
    }
    if (w[1].n_out != w[0].n_out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda matmul_silu_mul: gate n_out %lld != up "
                                "n_out %lld",
                                (long long)w[0].n_out, (long long)w[1].n_out);
    st = cinfer_cuda_matmul(stream, cublas, 2, w, x, n, k, scratch,
                            scratch_bytes, batch_invariant);
    if (st != CINFER_OK)
        return st;
    return cinfer_cuda_silu_mul(stream, w[0].out, w[1].out, w[0].out,
                                (int64_t)n * w[0].n_out);
}
