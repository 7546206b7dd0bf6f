/*
 * cublas.cc - cudasim's cuBLAS: the handle functions and the GEMMs the CUDA
 * backend calls (cublasSgemm, cublasGemmEx, cublasGemmStridedBatchedEx),
 * defined with the toolkit's declarations (cublas_v2.h) and answered by a
 * reference GEMM on the host.
 *
 * TEST DOUBLE (cudasim.h has the model). Column-major as cuBLAS; ops N and
 * T (C is T for real types); A and B both CUDA_R_32F, CUDA_R_16F or
 * CUDA_R_16BF; C CUDA_R_32F or the type of A; compute CUBLAS_COMPUTE_32F,
 * its _PEDANTIC and _FAST_* variants (all computed the same way: float
 * products summed in float, k in order, then alpha * sum + beta * C). Other
 * combinations return CUBLAS_STATUS_NOT_SUPPORTED. beta == 0 never reads C,
 * as cuBLAS. A GEMM is stream work: it runs at once or is recorded into the
 * capturing stream's graph (host-mode alpha and beta by value).
 *
 * The GEMM packs op(A) into panels of 8 rows and op(B) into panels of 4
 * columns (converted to float) and runs an 8x4 register tile over them, in
 * parallel over row panels on the executor's threads.
 */
#include <cublas_v2.h>

#include <mutex>
#include <set>
#include <vector>

#include "tests/cudasim/cudasim_impl.h"

struct cublasContext {
    int device = 0;
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
};

namespace cudasim {
namespace {

std::mutex g_m;
std::set<cublasContext *> *g_handles = new std::set<cublasContext *>; /* never destroyed */

bool live(cublasHandle_t h)
{
    std::lock_guard<std::mutex> lk(g_m);
    return g_handles->count(h) != 0;
}

/* A counted cuBLAS call: an injected fault, or a device already unusable,
 * fails it the way a failed kernel launch inside cuBLAS would. */
bool call_fails()
{
    int code;
    if (fault_fires(&code))
        return true;
    if (env().devices == 0)
        return true;
    return device_sticky() != cudaSuccess;
}

/* ---------------------------------------------------------------------- */
/* The reference GEMM                                                      */
/* ---------------------------------------------------------------------- */

constexpr int MR = 8, NR = 4;

typedef float v4 __attribute__((vector_size(16)));

float half_table_entry(uint16_t h)
{
    __half_raw r;
    r.x = h;
    return __half2float(__half(r));
}

/* f16 -> f32 for every bit pattern: packing converts whole weight matrices. */
const float *half_table()
{
    static const float *t = [] {
        float *p = new float[65536];
        for (unsigned i = 0; i < 65536; i++)
            p[i] = half_table_entry((uint16_t)i);
        return p;
    }();
    return t;
}

inline float load(const void *base, cudaDataType t, size_t i)
{
    switch (t) {
    case CUDA_R_16F: return half_table()[static_cast<const uint16_t *>(base)[i]];
    case CUDA_R_16BF: {
        uint32_t u = (uint32_t) static_cast<const uint16_t *>(base)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    default: return static_cast<const float *>(base)[i];
    }
}

inline void store(void *base, cudaDataType t, size_t i, float v)
{
    switch (t) {
    case CUDA_R_16F: static_cast<__half *>(base)[i] = __float2half_rn(v); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float *>(base)[i] = v; break;
    }
}

struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    const void *A, *B;
    void *C;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    long long sa, sb, sc;
    int batch;
    float alpha, beta;
    const float *alpha_dev = nullptr, *beta_dev = nullptr; /* device pointer mode */
};

/* op(A)(i, p) and op(B)(p, j) as element offsets. */
inline size_t a_at(const gemm_args &g, int i, int p)
{
    return g.ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * g.lda : (size_t)p + (size_t)i * g.lda;
}
inline size_t b_at(const gemm_args &g, int p, int j)
{
    return g.tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * g.ldb : (size_t)j + (size_t)p * g.ldb;
}

/* acc[c] (rows 0..7 as two v4) += Ap[p][0..7] * Bp[p][c], p = 0..k-1. */
template <int N>
void tile(const float *ap, const float *bp, int k, v4 acc[NR][2])
{
    v4 a0[N], a1[N];
    for (int c = 0; c < N; c++)
        a0[c] = a1[c] = v4{0, 0, 0, 0};
    for (int p = 0; p < k; p++) {
        v4 x0, x1;
        memcpy(&x0, ap + p * MR, 16);
        memcpy(&x1, ap + p * MR + 4, 16);
        for (int c = 0; c < N; c++) {
            float b = bp[p * NR + c];
            a0[c] += x0 * b;
            a1[c] += x1 * b;
        }
    }
    for (int c = 0; c < N; c++) {
        acc[c][0] = a0[c];
        acc[c][1] = a1[c];
    }
}

void gemm_one(const gemm_args &g, const void *A, const void *B, void *C, float alpha, float beta)
{
    const int m = g.m, n = g.n, k = g.k;
    const int npanels = (n + NR - 1) / NR;
    std::vector<float> bp((size_t)npanels * NR * (k ? k : 1), 0.0f);
    for (int jp = 0; jp < npanels; jp++)
        for (int p = 0; p < k; p++)
            for (int c = 0; c < NR; c++) {
                int j = jp * NR + c;
                if (j < n)
                    bp[((size_t)jp * k + p) * NR + c] = load(B, g.bt, b_at(g, p, j));
            }
    const int mpanels = (m + MR - 1) / MR;
    /* Tasks of row panels sized to about 4 Mflop each. */
    long flop_per_panel = 2l * MR * n * (k ? k : 1);
    int per_task = (int)std::max(1l, std::min<long>(mpanels, (4l << 20) / flop_per_panel));
    long tasks = (mpanels + per_task - 1) / per_task;
    exec_parallel_for(tasks, [&](long t) {
        std::vector<float> ap((size_t)MR * (k ? k : 1));
        for (int ip = (int)t * per_task; ip < std::min(mpanels, (int)(t + 1) * per_task); ip++) {
            for (int p = 0; p < k; p++)
                for (int r = 0; r < MR; r++) {
                    int i = ip * MR + r;
                    ap[(size_t)p * MR + r] = i < m ? load(A, g.at, a_at(g, i, p)) : 0.0f;
                }
            for (int jp = 0; jp < npanels; jp++) {
                v4 acc[NR][2];
                const float *b = &bp[(size_t)jp * k * NR];
                int cols = std::min(NR, n - jp * NR);
                switch (cols) {
                case 1: tile<1>(ap.data(), b, k, acc); break;
                case 2: tile<2>(ap.data(), b, k, acc); break;
                case 3: tile<3>(ap.data(), b, k, acc); break;
                default: tile<4>(ap.data(), b, k, acc); break;
                }
                for (int c = 0; c < cols; c++) {
                    int j = jp * NR + c;
                    float sum[MR];
                    memcpy(sum, &acc[c][0], 16);
                    memcpy(sum + 4, &acc[c][1], 16);
                    for (int r = 0; r < MR; r++) {
                        int i = ip * MR + r;
                        if (i >= m)
                            break;
                        size_t ci = (size_t)i + (size_t)j * g.ldc;
                        float v = alpha * sum[r];
                        if (beta != 0.0f)
                            v += beta * load(C, g.ct, ci);
                        store(C, g.ct, ci, v);
                    }
                }
            }
        }
    });
}

size_t type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* The bytes a column-major rows x cols matrix with leading dimension ld
 * spans, over batch matrices stride apart. */
size_t span_bytes(int rows, int cols, int ld, long long stride, int batch, cudaDataType t)
{
    if (!rows || !cols || !batch)
        return 0;
    size_t elems = (size_t)(cols - 1) * ld + rows;
    if (batch > 1)
        elems += (size_t)(batch - 1) * (size_t)(stride < 0 ? -stride : stride);
    return elems * type_size(t);
}

struct gemm_op final : stream_op {
    gemm_args g;
    cudaError_t run() override
    {
        int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
        int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
        bool ok = true;
        if (g.k > 0) {
            ok &= check_range(g.A, span_bytes(ar, ac, g.lda, g.sa, g.batch, g.at), "cuBLAS GEMM A");
            ok &= check_range(g.B, span_bytes(br, bc, g.ldb, g.sb, g.batch, g.bt), "cuBLAS GEMM B");
        }
        ok &= check_range(g.C, span_bytes(g.m, g.n, g.ldc, g.sc, g.batch, g.ct), "cuBLAS GEMM C");
        if (!ok) {
            /* A GEMM kernel reading or writing outside memory faults. */
            set_sticky(cudaErrorIllegalAddress);
            return cudaErrorIllegalAddress;
        }
        float alpha = g.alpha_dev ? *g.alpha_dev : g.alpha;
        float beta = g.beta_dev ? *g.beta_dev : g.beta;
        for (int b = 0; b < g.batch; b++)
            gemm_one(g, static_cast<const char *>(g.A) + b * g.sa * (long long)type_size(g.at),
                     static_cast<const char *>(g.B) + b * g.sb * (long long)type_size(g.bt),
                     static_cast<char *>(g.C) + b * g.sc * (long long)type_size(g.ct), alpha, beta);
        check_guards("after a cuBLAS GEMM");
        return device_sticky();
    }
};

bool real_type(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

cublasStatus_t gemm(cublasHandle_t h, gemm_args g, const void *alpha, const void *beta,
                    cublasComputeType_t compute)
{
    if (!live(h))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (call_fails())
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (g.ta == CUBLAS_OP_C)
        g.ta = CUBLAS_OP_T;
    if (g.tb == CUBLAS_OP_C)
        g.tb = CUBLAS_OP_T;
    if ((g.ta != CUBLAS_OP_N && g.ta != CUBLAS_OP_T) || (g.tb != CUBLAS_OP_N && g.tb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (g.lda < std::max(1, g.ta == CUBLAS_OP_N ? g.m : g.k) ||
        g.ldb < std::max(1, g.tb == CUBLAS_OP_N ? g.k : g.n) || g.ldc < std::max(1, g.m))
        return CUBLAS_STATUS_INVALID_VALUE;
    bool compute_ok = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                      compute == CUBLAS_COMPUTE_32F_FAST_16F ||
                      compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
                      compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    if (!compute_ok || !real_type(g.at) || g.at != g.bt || (g.ct != CUDA_R_32F && g.ct != g.at))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (g.m == 0 || g.n == 0 || g.batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE) {
        g.alpha_dev = static_cast<const float *>(alpha);
        g.beta_dev = static_cast<const float *>(beta);
    } else {
        g.alpha = *static_cast<const float *>(alpha);
        g.beta = *static_cast<const float *>(beta);
    }
    auto *op = new gemm_op;
    op->g = g;
    cudaError_t e = submit(h->stream, op);
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace

void cublas_reset(void)
{
    std::lock_guard<std::mutex> lk(g_m);
    for (cublasContext *h : *g_handles)
        delete h;
    g_handles->clear();
}

} // namespace cudasim

using namespace cudasim;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (call_fails())
        return CUBLAS_STATUS_NOT_INITIALIZED;
    auto *h = new cublasContext;
    h->device = current_device();
    std::lock_guard<std::mutex> lk(g_m);
    g_handles->insert(h);
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    int code;
    bool fault = fault_fires(&code);
    std::lock_guard<std::mutex> lk(g_m);
    if (!g_handles->count(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    g_handles->erase(handle);
    delete handle;
    return fault ? CUBLAS_STATUS_EXECUTION_FAILED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int code;
    if (fault_fires(&code))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    int code;
    if (fault_fires(&code))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int code;
    if (fault_fires(&code))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    int code;
    if (fault_fires(&code))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (bytes && !check_range(workspace, bytes, "cublasSetWorkspace"))
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    }
    return "unknown error";
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float *alpha,
                              const float *A, int lda, const float *B, int ldb, const float *beta,
                              float *C, int ldc)
{
    gemm_args g{transa, transb, m, n, k, A, B, C, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                lda, ldb, ldc, 0, 0, 0, 1, 0.0f, 0.0f};
    return gemm(handle, g, alpha, beta, CUBLAS_COMPUTE_32F);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    gemm_args g{transa, transb, m, n, k, A, B, C, Atype, Btype, Ctype,
                lda, ldb, ldc, 0, 0, 0, 1, 0.0f, 0.0f};
    return gemm(handle, g, alpha, beta, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    gemm_args g{transa, transb, m, n, k, A, B, C, Atype, Btype, Ctype,
                lda, ldb, ldc, strideA, strideB, strideC, batchCount, 0.0f, 0.0f};
    return gemm(handle, g, alpha, beta, computeType);
}

} // extern "C"
