/*
 * cuda_check.h - check macros for CUDA runtime, cuBLAS and NCCL calls.
 *
 * Every call into the CUDA runtime, cuBLAS or NCCL goes through one of
 * these (STYLE.md rule 15): on failure the statement, file and line and the
 * library's error name are recorded with cinfer_set_error() and the
 * enclosing function returns CINFER_E_DEVICE, so a device fault fails a
 * step (and trips the server's breaker) instead of aborting the process.
 * Errors CUDA documents as sticky (the context is unusable afterwards:
 * illegal address, launch failure, uncorrectable ECC, ...) are also
 * counted in a process-wide flag the backend reads to report itself
 * unhealthy.
 *
 * C and C++ (the launchers in the .cu files use them too).
 *
 *     CINFER_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
 *     CINFER_CUBLAS_TRY(cublasGemmEx(...));
 */
#ifndef CINFER_CUDA_CHECK_H
#define CINFER_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records "`stmt` failed at file:line: cudaErrorX (text)" and returns
 * CINFER_E_DEVICE; a sticky error also sets the sticky flag. */
cinfer_status cinfer_cuda_fail(int cuda_error, const char *stmt,
                               const char *file, int line);
/* The same for a cuBLAS status (cublasStatus_t) and an NCCL result. */
cinfer_status cinfer_cublas_fail(int cublas_status, const char *stmt,
                                 const char *file, int line);
cinfer_status cinfer_nccl_fail(int nccl_result, const char *stmt,
                               const char *file, int line);

/* 1 if a CUDA error CUDA documents as leaving the context unusable. */
int cinfer_cuda_error_is_sticky(int cuda_error);

/* 1 once any check in this process has seen a sticky error. Thread-safe. */
int cinfer_cuda_sticky_seen(void);

#ifdef __cplusplus
}
#endif

#define CINFER_CUDA_TRY(stmt)                                                  \
    do {                                                                       \
        cudaError_t cinfer_e_ = (stmt);                                        \
        if (cinfer_e_ != cudaSuccess)                                          \
            return cinfer_cuda_fail((int)cinfer_e_, #stmt, __FILE__,           \
                                    __LINE__);                                 \
    } while (0)

/* After a CINFER_LAUNCH: the launch's configuration error, if any. */
#define CINFER_CUDA_TRY_LAUNCH(kernel_name)                                    \
    do {                                                                       \
        cudaError_t cinfer_e_ = cudaGetLastError();                            \
        if (cinfer_e_ != cudaSuccess)                                          \
            return cinfer_cuda_fail((int)cinfer_e_, "launch " kernel_name,     \
                                    __FILE__, __LINE__);                       \
    } while (0)

#define CINFER_CUBLAS_TRY(stmt)                                                \
    do {                                                                       \
        int cinfer_s_ = (int)(stmt);                                           \
        if (cinfer_s_ != 0)                                                    \
            return cinfer_cublas_fail(cinfer_s_, #stmt, __FILE__, __LINE__);   \
    } while (0)

#define CINFER_NCCL_TRY(stmt)                                                  \
    do {                                                                       \
        int cinfer_r_ = (int)(stmt);                                           \
        if (cinfer_r_ != 0)                                                    \
            return cinfer_nccl_fail(cinfer_r_, #stmt, __FILE__, __LINE__);     \
    } while (0)

#endif /* CINFER_CUDA_CHECK_H */
