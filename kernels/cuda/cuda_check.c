/*
 * cuda_check.c - the failure paths of the check macros (cuda_check.h).
 *
 * Each records which statement failed, where, and the library's name for
 * the error, and returns CINFER_E_DEVICE. The names of cuBLAS and NCCL
 * results are spelled out here rather than asked of those libraries, so
 * this file needs only the CUDA runtime (and the harness, which answers
 * cudaGetErrorName, links without cuBLAS or NCCL symbols from it).
 */
#include "cuda_check.h"

#include <stdatomic.h>

static atomic_int sticky_seen;

/* Characters of the failed statement a message keeps (cublasGemmEx's
 * arguments would push the error's name out of the message). */
#define STMT_MAX 64

int cinfer_cuda_error_is_sticky(int e)
{
    /* The errors after which CUDA says the context cannot be used again
     * (cudaError_t's documentation: "the process must be terminated and
     * relaunched"). */
    switch ((cudaError_t)e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
        return 1;
    default:
        return 0;
    }
}

int cinfer_cuda_sticky_seen(void)
{
    return atomic_load(&sticky_seen);
}

cinfer_status cinfer_cuda_fail(int e, const char *stmt, const char *file,
                               int line)
{
    int sticky = cinfer_cuda_error_is_sticky(e);
    if (sticky)
        atomic_store(&sticky_seen, 1);
    return cinfer_set_error(CINFER_E_DEVICE, "%.*s failed at %s:%d: %s (%s)%s",
                            STMT_MAX, stmt, file, line,
                            cudaGetErrorName((cudaError_t)e),
                            cudaGetErrorString((cudaError_t)e),
                            sticky ? "; the device is unusable" : "");
}

static const char *cublas_name(int s)
{
    switch (s) {
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "cuBLAS status";
    }
}

cinfer_status cinfer_cublas_fail(int s, const char *stmt, const char *file,
                                 int line)
{
    /* A cuBLAS call that failed on a device error leaves it pending */
    cudaError_t e = cudaPeekAtLastError();
    return cinfer_set_error(CINFER_E_DEVICE,
                            "%.*s failed at %s:%d: %s (%d)%s%s", STMT_MAX,
                            stmt, file, line, cublas_name(s), s,
                            e != cudaSuccess ? "; CUDA: " : "",
                            e != cudaSuccess ? cudaGetErrorName(e) : "");
}

static const char *nccl_name(int r)
{
    switch (r) {
    case 1: return "ncclUnhandledCudaError";
    case 2: return "ncclSystemError";
    case 3: return "ncclInternalError";
    case 4: return "ncclInvalidArgument";
    case 5: return "ncclInvalidUsage";
    case 6: return "ncclRemoteError";
    case 7: return "ncclInProgress";
    default: return "NCCL result";
    }
}

cinfer_status cinfer_nccl_fail(int r, const char *stmt, const char *file,
                               int line)
{
    return cinfer_set_error(CINFER_E_DEVICE, "%.*s failed at %s:%d: %s (%d)",
                            STMT_MAX, stmt, file, line, nccl_name(r), r);
}
