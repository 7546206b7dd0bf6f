/*
 * cudasim_impl.h - what the parts of cudasim (the CPU test double for CUDA,
 * see cudasim.h) share: the executor (exec.cc) runs launches, the runtime
 * (runtime.cc) owns devices, memory, streams, errors and reports, cuBLAS
 * (cublas.cc) and NCCL (nccl.cc) queue their work on the runtime's streams.
 *
 * Internal to tests/cudasim/.
 */
#ifndef CINFER_CUDASIM_IMPL_H
#define CINFER_CUDASIM_IMPL_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "tests/cudasim/cudasim.h"
#include "tests/cudasim/cudasim_ctl.h"

namespace cudasim {

/* ---- environment (runtime.cc) ------------------------------------------ */

struct env_config {
    int threads;              /* CUDASIM_THREADS */
    int devices;              /* CUDASIM_DEVICES */
    size_t memory_bytes;      /* CUDASIM_MEMORY_MB */
    size_t stack_bytes;       /* CUDASIM_STACK_KB */
    bool quiet;               /* CUDASIM_QUIET */
};
const env_config &env(void);

/* ---- reports (runtime.cc) ---------------------------------------------- */

/* Prints "cudasim: <text>" on stderr (unless CUDASIM_QUIET) and keeps the
 * text for cudasim_last_report(). */
void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The path of a source file as reports show it (relative to the project). */
const char *short_path(const char *file);

/* ---- executor (exec.cc) ------------------------------------------------- */

/* Device limits the launch check and cudaGetDeviceProperties share. */
constexpr size_t SMEM_DEFAULT = 48 * 1024;   /* dynamic + static without opt-in */
constexpr size_t SMEM_OPTIN = 227 * 1024;    /* per block with opt-in */
constexpr int MAX_THREADS = 1024;

struct launch_desc {
    const char *name;         /* the kernel as written at CINFER_LAUNCH */
    const void *kernel_id;    /* the kernel's address */
    closure *fn;              /* borrowed; runs once per CUDA thread */
    dim3 grid, block;
    size_t smem_dynamic;
    size_t smem_static_limit; /* what static shared may reach (227 KB - dynamic, <= 48 KB) */
};

struct launch_outcome {
    cudaError_t error;        /* cudaSuccess, or what the kernel did wrong */
    bool sticky;              /* error leaves the device unusable */
    size_t smem_static;       /* the most static shared memory one block used */
};

/* Runs every block of the launch; returns when all have finished. Errors
 * found inside the kernel are reported before it returns. */
launch_outcome exec_launch(const launch_desc &d);

void exec_set_schedule(int kind, unsigned long long seed);
int exec_get_schedule(unsigned long long *seed);
void exec_get_stats(cudasim_stats *s);
void exec_reset_stats(void);

/* Runs fn(0) .. fn(n-1) over the executor's OS threads (the caller among
 * them); returns when all have run. For host-side work such as the GEMM. */
void exec_parallel_for(long n, const std::function<void(long)> &fn);

/* ---- runtime (runtime.cc) ---------------------------------------------- */

/* A unit of stream work: run now, or recorded into a graph and run at each
 * replay. run() returns cudaSuccess or an error for the caller of the
 * replay (a sticky one is already set on the device). */
struct stream_op {
    virtual ~stream_op() {}
    virtual cudaError_t run() = 0;
};

/* Counts a call for fault injection: returns true (and the code to fail
 * with in *code, after making it sticky if asked) when this call is the
 * one planted to fail. */
bool fault_fires(int *code);

/* The calling thread's current device (cudaSetDevice). */
int current_device(void);

/* Frees the handles of cuBLAS and NCCL (cudasim_reset). */
void cublas_reset(void);
void nccl_reset(void);

/* The sticky error of the current device, or cudaSuccess. */
cudaError_t device_sticky(void);
/* Marks the current device unusable with e. */
void set_sticky(cudaError_t e);

/* Submits op on stream (0 = the legacy default): runs it at once, or
 * records it when the stream is capturing. Takes ownership of op. Returns
 * what the runtime call should return (invalid stream, capture misuse,
 * or the op's error). */
cudaError_t submit(cudaStream_t stream, stream_op *op);

/* A device range [p, p + n) inside one live allocation (or pinned host
 * allocation): true. Otherwise reports, naming `what`, and returns false. */
bool check_range(const void *p, size_t n, const char *what);

/* Checks the guard zones of every live allocation; a damaged one is
 * reported and makes the device sticky (cudaErrorIllegalAddress). Returns
 * false if one was damaged. `after` names the point of the check. */
bool check_guards(const char *after);

} // namespace cudasim

#endif /* CINFER_CUDASIM_IMPL_H */
