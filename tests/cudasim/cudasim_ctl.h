/*
 * cudasim_ctl.h - the control API of cudasim, the CPU test double for CUDA
 * (tests/cudasim/cudasim.h explains the model). C and C++; for tests only.
 *
 * Tests choose the order threads run in, plant faults in the runtime and
 * cuBLAS calls, check for leaks and read what the harness last reported:
 *
 *     cudasim_set_schedule(CUDASIM_SCHEDULE_RANDOM, 42);
 *     cudasim_inject_fault(3, 2, 0);    // the 4th call from now fails
 *                                       // with cudaErrorMemoryAllocation
 *     ... run the backend ...
 *     CHECK(strstr(cudasim_last_report(), "barrier") != NULL);
 *     cudasim_reset();                  // as a fresh process
 *
 * Environment variables read at the first call into the harness:
 *   CUDASIM_SCHEDULE=forward|reverse|random[:SEED]   default forward
 *   CUDASIM_THREADS=N        OS threads that run blocks (default 2)
 *   CUDASIM_DEVICES=N        devices cudaGetDeviceCount reports (default 1; 0
 *                            is allowed, to test the no-GPU path)
 *   CUDASIM_MEMORY_MB=N      memory per device (default 16384)
 *   CUDASIM_FAULT=N:CODE[:sticky]   as cudasim_inject_fault(N, CODE, sticky);
 *                            CODE is a number or a name (cudaErrorLaunchFailure)
 *   CUDASIM_STACK_KB=N       fiber stack size (default 128, 512 under ASan)
 *   CUDASIM_QUIET=1          reports are kept (cudasim_last_report) but not
 *                            printed on stderr
 *
 * Thread safety: every function may be called from any thread;
 * cudasim_reset() only while no other thread is inside the harness.
 */
#ifndef CINFER_CUDASIM_CTL_H
#define CINFER_CUDASIM_CTL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum cudasim_schedule {
    CUDASIM_SCHEDULE_FORWARD = 0, /* threads in linear id order */
    CUDASIM_SCHEDULE_REVERSE = 1, /* highest linear id first */
    CUDASIM_SCHEDULE_RANDOM = 2,  /* a fresh seeded permutation per sync point */
};

/* The order threads of a block run in between sync points, for launches
 * from now on. seed is used by CUDASIM_SCHEDULE_RANDOM only. */
void cudasim_set_schedule(int kind, unsigned long long seed);
/* The current kind; its seed in *seed if seed is not NULL. */
int cudasim_get_schedule(unsigned long long *seed);

/* The nth counted call from now (0 = the next) fails. Counted calls: every
 * CUDA runtime function that returns a status, every kernel launch (as
 * cudaLaunchKernel would be), the cuBLAS calls that create, destroy or
 * configure a handle or run a GEMM, and NCCL's ncclGetUniqueId, comm
 * init and destroy and collectives. A runtime call or launch returns (sets)
 * cuda_error; a cuBLAS call returns CUBLAS_STATUS_EXECUTION_FAILED (create:
 * NOT_INITIALIZED), an NCCL call ncclUnhandledCudaError. With sticky != 0
 * the device keeps cuda_error as a sticky error afterwards, as after a
 * device fault. nth < 0 cancels a pending fault. */
void cudasim_inject_fault(long nth, int cuda_error, int sticky);

/* Back to a fresh process: frees every allocation, stream, event, graph and
 * cuBLAS handle (NCCL communicators stay the caller's), clears sticky errors, pending faults, last errors of the calling
 * thread and the last report, and re-reads the environment. */
void cudasim_reset(void);

/* Bytes and count of live allocations, all devices: cudaMalloc and the
 * pinned host memory of cudaMallocHost / cudaHostAlloc. */
size_t cudasim_live_bytes(void);
long cudasim_live_allocations(void);

/* The text of the last error the harness found (barrier divergence, a
 * write past an allocation, ...), "" if none since the last reset. The
 * pointer stays valid until the next report or reset from any thread. */
const char *cudasim_last_report(void);

/* How many errors the harness has reported since the last reset. */
long cudasim_report_count(void);

/* Guard zones of new allocations are poisoned under AddressSanitizer, so a
 * write past an allocation stops the process at the faulting instruction.
 * Tests that check the harness's own guard check turn it off (0); it
 * applies to allocations made afterwards. No effect without ASan. */
void cudasim_set_asan_guards(int on);

typedef struct cudasim_stats {
    long long launches;       /* kernels run (not recorded into graphs) */
    long long blocks;         /* blocks run */
    long long threads;        /* CUDA threads run */
    long long switches;       /* fiber switches */
    long long fibers;         /* fiber stacks ever created */
} cudasim_stats;

/* Counters since the last reset. */
cudasim_stats cudasim_get_stats(void);

#ifdef __cplusplus
}
#endif

#endif /* CINFER_CUDASIM_CTL_H */
