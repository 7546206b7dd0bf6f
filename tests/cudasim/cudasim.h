/*
 * cudasim.h - the device side of cudasim, a CPU test double for CUDA.
 *
 * TEST INFRASTRUCTURE ONLY: nothing here is linked into the shipped server.
 * cudasim runs the project's CUDA kernels (the .cu files of kernels/cuda/) on
 * the CPU and
 * answers the CUDA runtime, cuBLAS and NCCL calls the CUDA backend makes, so
 * the backend can be tested on machines without a GPU. It checks what a GPU
 * would not tell you (barrier divergence, shuffle masks, writes past an
 * allocation, reads of shared memory nothing wrote); it says nothing about
 * speed, occupancy or memory coalescing.
 *
 * Compiling a kernel under it: a .cu file is compiled as C++17 by g++ or
 * clang++ with
 *
 *     -x c++ -std=c++17 -DCINFER_CUDASIM -include <root>/tests/cudasim/cudasim.h
 *     -I<root> -I/usr/local/cuda/include
 *
 * and linked with the cinfer_cudasim library. In CMake (tests/cudasim/):
 *
 *     cinfer_cudasim_kernels(my_kernels kernels/cuda/elementwise.cu ...)
 *     target_link_libraries(my_test PRIVATE my_kernels)   # brings cinfer_cudasim
 *
 * The model (DESIGN.md, "Testing CUDA without a GPU"):
 *   - CINFER_LAUNCH runs the whole grid before it returns (or, while the
 *     stream is capturing a graph, records it). Blocks are spread over
 *     CUDASIM_THREADS OS threads (default 2, the caller being one of them);
 *     every CUDA thread of a block is a fiber on that block's OS thread.
 *   - Fibers switch only at sync points: __syncthreads (and its _count/_and/
 *     _or forms), __syncwarp, shuffles and votes. Between sync points the
 *     threads of a block run in forward, reverse or seeded random order
 *     (CUDASIM_SCHEDULE=forward|reverse|random[:SEED], or
 *     cudasim_set_schedule() from tests/cudasim/cudasim_ctl.h), so a missing
 *     barrier gives a wrong result under some order.
 *   - __syncthreads is strict. An error, reported on stderr with the kernel,
 *     block and thread, and a sticky cudaErrorLaunchFailure (the block stops;
 *     no later block starts):
 *       * threads waiting at barriers at different call sites (file:line);
 *       * any thread waiting at a barrier once another thread of the block
 *         has exited, or exiting while others wait ("barrier at f.cu:42 not
 *         reached by thread (7,0,0): it exited"). So `if (i >= n) return;`
 *         followed by __syncthreads() is reported, although many GPUs let it
 *         pass: the CUDA programming guide leaves it undefined.
 *   - Warp operations (warp = 32 consecutive linear thread ids) go through a
 *     per-warp exchange: each lane deposits its value and waits until every
 *     lane of `mask` has arrived. Errors (sticky cudaErrorIllegalInstruction):
 *     the calling lane not in its mask; a lane of the mask that exited or
 *     never arrives (it waits at a barrier, or nothing is left to run);
 *     lanes of one exchange disagreeing on the operation, mask or width; a
 *     shuffle's source lane outside the mask; a width that is not a power of
 *     two up to 32. Lanes past the end of a partial last warp do not exist:
 *     a mask may name them (they are ignored), a shuffle may not read them.
 *   - Shared memory (CINFER_SHARED, CINFER_DYN_SHARED) is per block and
 *     filled with 0xFF bytes (NaN as f32/f16/bf16) when each block starts.
 *   - Atomics are real atomics (relaxed, as CUDA's): blocks run in parallel.
 *     Blocks are not all resident at once (CUDA does not promise it either):
 *     a block that spins until another block does something may hang.
 *   - __CUDA_ARCH__ and __CUDACC__ are not defined: code under
 *     #ifdef __CUDA_ARCH__ is not compiled here. Plain `__shared__` is a
 *     compile error (it would silently make a per-thread array); use the
 *     CINFER_SHARED macros. A template kernel is launched with its template
 *     arguments spelled out (CINFER_LAUNCH(k<128>, ...)); a kernel whose
 *     name has a comma goes in parentheses: CINFER_LAUNCH((k<a, b>), ...).
 *
 * g++ warns about nvcc's `#pragma unroll`; cinfer_cudasim_flags() adds
 * -Wno-unknown-pragmas for it. Fiber stacks are CUDASIM_STACK_KB (128 KiB,
 * 512 under ASan) with a guard page: a kernel whose locals overflow that
 * dies with SIGSEGV. Host-side limits and environment variables are in
 * cudasim_ctl.h.
 *
 * Include system and toolkit headers a kernel file needs; this header has
 * already included the common ones (<cmath>, <cstdint>, <memory>, ...)
 * before it defines the CUDA keywords, and later headers that spell
 * __noinline__ or __shared__ themselves would not compile.
 */
#ifndef CINFER_CUDASIM_H
#define CINFER_CUDASIM_H

#ifndef __cplusplus
#error "cudasim.h is C++: compile .cu files with -x c++ -std=c++17"
#endif

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

/* ---------------------------------------------------------------------- */
/* Keywords                                                                */
/* ---------------------------------------------------------------------- */

/* __global__, __device__, __host__, __forceinline__ and __constant__ come
 * from the toolkit's host_defines.h (empty or plain GNU attributes for a
 * host compiler); these two it leaves to the CUDA compiler. */
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#undef __shared__
#define __shared__ cudasim_use_CINFER_SHARED_not___shared__

static constexpr int warpSize = 32;

/* ---------------------------------------------------------------------- */
/* Built-in variables                                                      */
/* ---------------------------------------------------------------------- */

/* Set by the harness for the CUDA thread running on this OS thread: the
 * fiber switcher rewrites tid/linear at every switch, the block loop the
 * rest at every block start. */
struct cudasim_builtins {
    uint3 tid;
    uint3 bid;
    uint3 bdim; /* uint3, not dim3: __thread needs a trivial type */
    uint3 gdim;
    unsigned linear; /* tid.x + tid.y * bdim.x + tid.z * bdim.x * bdim.y */
};
extern __thread cudasim_builtins cudasim_bi;

#define threadIdx (static_cast<const uint3 &>(cudasim_bi.tid))
#define blockIdx (static_cast<const uint3 &>(cudasim_bi.bid))
#define blockDim (static_cast<const uint3 &>(cudasim_bi.bdim))
#define gridDim (static_cast<const uint3 &>(cudasim_bi.gdim))

/* ---------------------------------------------------------------------- */
/* Launch and shared memory                                                */
/* ---------------------------------------------------------------------- */

namespace cudasim {

/* One launch's kernel and arguments, converted to the kernel's parameter
 * types once at launch (as a real launch copies them). run() is one CUDA
 * thread's call. */
struct closure {
    virtual ~closure() {}
    virtual void run() = 0;
};

template <typename... P> struct closure_of final : closure {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
    template <typename... A>
    explicit closure_of(void (*k)(P...), A &&...a)
        : kernel(k), args(std::forward<A>(a)...)
    {
    }
    void run() override { std::apply(kernel, args); }
};

/* Takes ownership of c. Validates the configuration (setting the error
 * cudaGetLastError() returns), then runs or records the launch. */
void launch_closure(const char *name, const void *kernel_id, closure *c,
                    dim3 grid, dim3 block, size_t smem_bytes,
                    cudaStream_t stream);

template <typename... P, typename... A>
inline void launch(const char *name, void (*kernel)(P...), dim3 grid,
                   dim3 block, size_t smem_bytes, cudaStream_t stream,
                   A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A),
                  "CINFER_LAUNCH: the argument count differs from the "
                  "kernel's parameter count");
    launch_closure(name, reinterpret_cast<const void *>(kernel),
                   new closure_of<P...>(kernel, std::forward<A>(args)...),
                   grid, block, smem_bytes, stream);
}

} // namespace cudasim

/* cuda_runtime.h keeps its kernel-pointer overloads of these for nvcc. */
template <typename T>
inline cudaError_t cudaFuncSetAttribute(T *kernel, enum cudaFuncAttribute attr, int value)
{
    return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel), attr, value);
}
template <typename T>
inline cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, T *kernel)
{
    return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void *>(kernel));
}

#define CINFER_LAUNCH(kernel, grid, block, smem_bytes, stream, ...)            \
    ::cudasim::launch(#kernel, kernel, (grid), (block), (smem_bytes),          \
                      (stream), ##__VA_ARGS__)

/* Per-block static shared memory: `key` names the declaration; the first
 * thread of a block to reach it allocates from the block's arena, the others
 * get the same address. */
void *cudasim_shared_static(const void *key, size_t bytes, size_t align);
/* The launch's dynamic shared memory for the running block. */
void *cudasim_shared_dynamic(void);

#define CINFER_SHARED(type, name, dims)                                        \
    static char cudasim_key_##name;                                            \
    type(&name) dims = *reinterpret_cast<type(*) dims>(cudasim_shared_static(  \
        &cudasim_key_##name, sizeof(type dims), alignof(type)))
#define CINFER_DYN_SHARED(type, name)                                          \
    type *name = static_cast<type *>(cudasim_shared_dynamic())

/* ---------------------------------------------------------------------- */
/* Block and warp synchronisation                                          */
/* ---------------------------------------------------------------------- */

/* Call sites are recorded through default arguments so that reports name
 * the kernel's line, not this header's. */
#define CUDASIM_SITE const char *file = __builtin_FILE(), int line = __builtin_LINE()

enum cudasim_bar_kind { CUDASIM_BAR, CUDASIM_BAR_COUNT, CUDASIM_BAR_AND, CUDASIM_BAR_OR };
int cudasim_barrier(int kind, int pred, const char *file, int line);

inline void __syncthreads(CUDASIM_SITE) { cudasim_barrier(CUDASIM_BAR, 0, file, line); }
inline int __syncthreads_count(int pred, CUDASIM_SITE)
{
    return cudasim_barrier(CUDASIM_BAR_COUNT, pred, file, line);
}
inline int __syncthreads_and(int pred, CUDASIM_SITE)
{
    return cudasim_barrier(CUDASIM_BAR_AND, pred, file, line);
}
inline int __syncthreads_or(int pred, CUDASIM_SITE)
{
    return cudasim_barrier(CUDASIM_BAR_OR, pred, file, line);
}

/* Warp exchange operations (exec.cc, cudasim_warp). */
enum cudasim_warp_op {
    CUDASIM_SYNCWARP,
    CUDASIM_SHFL_IDX,
    CUDASIM_SHFL_UP,
    CUDASIM_SHFL_DOWN,
    CUDASIM_SHFL_XOR,
    CUDASIM_BALLOT,
    CUDASIM_ANY,
    CUDASIM_ALL,
    CUDASIM_REDUCE_ADD,
    CUDASIM_REDUCE_MIN,
    CUDASIM_REDUCE_MAX,
    CUDASIM_REDUCE_MIN_U,
    CUDASIM_REDUCE_MAX_U,
    CUDASIM_REDUCE_AND,
    CUDASIM_REDUCE_OR,
    CUDASIM_REDUCE_XOR,
    CUDASIM_MATCH_ANY,
    CUDASIM_MATCH_ALL,
    CUDASIM_MMA_S8_16832,
    CUDASIM_LDMATRIX_X4,
    CUDASIM_MMA_F16_16816,
    CUDASIM_MMA_BF16_16816,
};
/* Deposits `value` (raw bits), waits for the lanes of `mask`, returns this
 * lane's result bits. For shuffles `arg` is the source lane, delta or lane
 * mask; for __match_all_sync the result's bit 32 is the predicate. */
unsigned long long cudasim_warp(int op, unsigned mask, unsigned long long value,
                                int arg, int width, const char *file, int line);
/* The tensor-core instructions kernels/cuda/mma.cuh wraps, as warp
 * exchanges: every lane of the warp (all 32 must exist) deposits its
 * fragments and the last to arrive computes the whole instruction from the
 * PTX ISA's fragment layouts (mma.cuh lists them), so one exchange does
 * what the instruction does. mma.sync m16n8k32 .s8.s8.s32: d += A * B
 * (wrapping as the s32 accumulator does). ldmatrix .x4 .b16: each lane
 * names one 16-byte row in shared memory (16-byte aligned, inside the
 * block's shared memory; else the warp fails as for any bad warp operation)
 * and gets its four registers. */
void cudasim_mma_s8_16832(int d[4], const unsigned a[4], const unsigned b[2],
                          const char *file, int line);
void cudasim_ldmatrix_x4(unsigned r[4], const void *row, const char *file,
                         int line);
/* mma.sync m16n8k16 .row.col .f32 over .f16 (bf16 = 0) or .bf16 (1)
 * inputs: d += A * B, each element of D summed from its accumulator then
 * k = 0..15 in order, one fmaf a product (the products of 16-bit floats
 * are exact in f32). A device sums inside the instruction in an order of
 * its own, so its bits may differ in the last places; the fragment
 * layouts are the PTX ISA's (mma.cuh). */
void cudasim_mma_f_16816(int bf16, float d[4], const unsigned a[4],
                         const unsigned b[2], const char *file, int line);
/* The lanes of this warp that have not exited (no synchronisation). */
unsigned cudasim_activemask(void);
/* __trap(): reports and fails the launch (sticky cudaErrorLaunchFailure). */
[[noreturn]] void cudasim_trap(const char *file, int line);

inline void __syncwarp(unsigned mask = 0xffffffffu, CUDASIM_SITE)
{
    cudasim_warp(CUDASIM_SYNCWARP, mask, 0, 0, 32, file, line);
}
inline unsigned __activemask(void) { return cudasim_activemask(); }
inline unsigned __ballot_sync(unsigned mask, int pred, CUDASIM_SITE)
{
    return (unsigned)cudasim_warp(CUDASIM_BALLOT, mask, pred != 0, 0, 32, file, line);
}
inline int __any_sync(unsigned mask, int pred, CUDASIM_SITE)
{
    return (int)cudasim_warp(CUDASIM_ANY, mask, pred != 0, 0, 32, file, line);
}
inline int __all_sync(unsigned mask, int pred, CUDASIM_SITE)
{
    return (int)cudasim_warp(CUDASIM_ALL, mask, pred != 0, 0, 32, file, line);
}
inline void __trap(CUDASIM_SITE) { cudasim_trap(file, line); }

/* Shuffles for every type CUDA has them for: the value travels as raw bits. */
namespace cudasim {
template <typename T> inline unsigned long long to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "shuffle type");
    unsigned long long b = 0;
    std::memcpy(&b, static_cast<const void *>(&v), sizeof v);
    return b;
}
template <typename T> inline T from_bits(unsigned long long b)
{
    T v;
    std::memcpy(static_cast<void *>(&v), &b, sizeof v);
    return v;
}
} // namespace cudasim

#define CUDASIM_SHFL_TYPE(T)                                                   \
    inline T __shfl_sync(unsigned mask, T var, int src_lane,                   \
                         int width = warpSize, CUDASIM_SITE)                   \
    {                                                                          \
        return cudasim::from_bits<T>(cudasim_warp(CUDASIM_SHFL_IDX, mask,      \
            cudasim::to_bits(var), src_lane, width, file, line));              \
    }                                                                          \
    inline T __shfl_up_sync(unsigned mask, T var, unsigned delta,              \
                            int width = warpSize, CUDASIM_SITE)                \
    {                                                                          \
        return cudasim::from_bits<T>(cudasim_warp(CUDASIM_SHFL_UP, mask,       \
            cudasim::to_bits(var), (int)delta, width, file, line));            \
    }                                                                          \
    inline T __shfl_down_sync(unsigned mask, T var, unsigned delta,            \
                              int width = warpSize, CUDASIM_SITE)              \
    {                                                                          \
        return cudasim::from_bits<T>(cudasim_warp(CUDASIM_SHFL_DOWN, mask,     \
            cudasim::to_bits(var), (int)delta, width, file, line));            \
    }                                                                          \
    inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask,              \
                             int width = warpSize, CUDASIM_SITE)               \
    {                                                                          \
        return cudasim::from_bits<T>(cudasim_warp(CUDASIM_SHFL_XOR, mask,      \
            cudasim::to_bits(var), lane_mask, width, file, line));             \
    }
CUDASIM_SHFL_TYPE(int)
CUDASIM_SHFL_TYPE(unsigned)
CUDASIM_SHFL_TYPE(long)
CUDASIM_SHFL_TYPE(unsigned long)
CUDASIM_SHFL_TYPE(long long)
CUDASIM_SHFL_TYPE(unsigned long long)
CUDASIM_SHFL_TYPE(float)
CUDASIM_SHFL_TYPE(double)
CUDASIM_SHFL_TYPE(__half)
CUDASIM_SHFL_TYPE(__half2)
CUDASIM_SHFL_TYPE(__nv_bfloat16)
CUDASIM_SHFL_TYPE(__nv_bfloat162)
#undef CUDASIM_SHFL_TYPE

/* sm_80 warp reductions and matches. */
#define CUDASIM_REDUCE(name, T, op)                                            \
    inline T name(unsigned mask, T value, CUDASIM_SITE)                        \
    {                                                                          \
        return (T)cudasim_warp(op, mask, (unsigned)value, 0, 32, file, line);  \
    }
CUDASIM_REDUCE(__reduce_add_sync, unsigned, CUDASIM_REDUCE_ADD)
CUDASIM_REDUCE(__reduce_add_sync, int, CUDASIM_REDUCE_ADD)
CUDASIM_REDUCE(__reduce_min_sync, unsigned, CUDASIM_REDUCE_MIN_U)
CUDASIM_REDUCE(__reduce_min_sync, int, CUDASIM_REDUCE_MIN)
CUDASIM_REDUCE(__reduce_max_sync, unsigned, CUDASIM_REDUCE_MAX_U)
CUDASIM_REDUCE(__reduce_max_sync, int, CUDASIM_REDUCE_MAX)
CUDASIM_REDUCE(__reduce_and_sync, unsigned, CUDASIM_REDUCE_AND)
CUDASIM_REDUCE(__reduce_or_sync, unsigned, CUDASIM_REDUCE_OR)
CUDASIM_REDUCE(__reduce_xor_sync, unsigned, CUDASIM_REDUCE_XOR)
#undef CUDASIM_REDUCE

#define CUDASIM_MATCH(T)                                                       \
    inline unsigned __match_any_sync(unsigned mask, T value, CUDASIM_SITE)     \
    {                                                                          \
        return (unsigned)cudasim_warp(CUDASIM_MATCH_ANY, mask,                 \
                                      cudasim::to_bits(value), 0, 32, file, line); \
    }                                                                          \
    inline unsigned __match_all_sync(unsigned mask, T value, int *pred,        \
                                     CUDASIM_SITE)                             \
    {                                                                          \
        unsigned long long r = cudasim_warp(CUDASIM_MATCH_ALL, mask,           \
                                            cudasim::to_bits(value), 0, 32,    \
                                            file, line);                       \
        *pred = (int)(r >> 32);                                                \
        return (unsigned)r;                                                    \
    }
CUDASIM_MATCH(int)
CUDASIM_MATCH(unsigned)
CUDASIM_MATCH(long)
CUDASIM_MATCH(unsigned long)
CUDASIM_MATCH(long long)
CUDASIM_MATCH(unsigned long long)
CUDASIM_MATCH(float)
CUDASIM_MATCH(double)
#undef CUDASIM_MATCH

/* ---------------------------------------------------------------------- */
/* Atomics (relaxed, as CUDA's) and fences                                 */
/* ---------------------------------------------------------------------- */

#define CUDASIM_ATOMIC_INT(T)                                                  \
    inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
    inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
    inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
    inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); } \
    inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
    inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); } \
    inline T atomicCAS(T *p, T cmp, T v)                                       \
    {                                                                          \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED,       \
                                    __ATOMIC_RELAXED);                         \
        return cmp;                                                            \
    }                                                                          \
    inline T atomicMax(T *p, T v)                                              \
    {                                                                          \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                          \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true,       \
                              __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {           \
        }                                                                      \
        return old;                                                            \
    }                                                                          \
    inline T atomicMin(T *p, T v)                                              \
    {                                                                          \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                          \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true,       \
                              __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {           \
        }                                                                      \
        return old;                                                            \
    }
CUDASIM_ATOMIC_INT(int)
CUDASIM_ATOMIC_INT(unsigned)
CUDASIM_ATOMIC_INT(unsigned long long)
CUDASIM_ATOMIC_INT(long long)
#undef CUDASIM_ATOMIC_INT

namespace cudasim {
/* Floating-point read-modify-write through a compare-and-swap on the bits. */
template <typename F, typename U, typename Op> inline F atomic_fp(F *p, F v, Op op)
{
    U *u = reinterpret_cast<U *>(p);
    U old = __atomic_load_n(u, __ATOMIC_RELAXED);
    for (;;) {
        F f;
        std::memcpy(static_cast<void *>(&f), &old, sizeof f);
        F n = op(f, v);
        U nu;
        std::memcpy(&nu, static_cast<const void *>(&n), sizeof nu);
        if (__atomic_compare_exchange_n(u, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return f;
    }
}
} // namespace cudasim

inline float atomicAdd(float *p, float v)
{
    return cudasim::atomic_fp<float, unsigned>(p, v, [](float a, float b) { return a + b; });
}
inline double atomicAdd(double *p, double v)
{
    return cudasim::atomic_fp<double, unsigned long long>(p, v,
                                                          [](double a, double b) { return a + b; });
}
inline float atomicExch(float *p, float v)
{
    return cudasim::atomic_fp<float, unsigned>(p, v, [](float, float b) { return b; });
}
/* __half2 / __nv_bfloat162 adds (sm_60 / sm_80): the pair as one 32-bit word. */
inline __half2 atomicAdd(__half2 *p, __half2 v)
{
    return cudasim::atomic_fp<__half2, unsigned>(p, v, [](__half2 a, __half2 b) { return __hadd2(a, b); });
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162 *p, __nv_bfloat162 v)
{
    return cudasim::atomic_fp<__nv_bfloat162, unsigned>(
        p, v, [](__nv_bfloat162 a, __nv_bfloat162 b) { return __hadd2(a, b); });
}

inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block(void) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---------------------------------------------------------------------- */
/* Loads, integer and fast-math intrinsics                                 */
/* ---------------------------------------------------------------------- */

template <typename T> inline T __ldg(const T *p) { return *p; }
template <typename T> inline T __ldcg(const T *p) { return *p; }
template <typename T> inline T __ldca(const T *p) { return *p; }
template <typename T> inline T __ldcs(const T *p) { return *p; }
template <typename T> inline T __ldlu(const T *p) { return *p; }
template <typename T> inline T __ldcv(const T *p) { return *p; }
template <typename T> inline void __stcg(T *p, T v) { *p = v; }
template <typename T> inline void __stcs(T *p, T v) { *p = v; }
template <typename T> inline void __stwb(T *p, T v) { *p = v; }
template <typename T> inline void __stwt(T *p, T v) { *p = v; }

inline int __dp4a(int a, int b, int c)
{
    for (int i = 0; i < 32; i += 8)
        c += (int)(int8_t)(a >> i) * (int)(int8_t)(b >> i);
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c)
{
    for (int i = 0; i < 32; i += 8)
        c += ((a >> i) & 0xffu) * ((b >> i) & 0xffu);
    return c;
}
inline int __dp2a_lo(int a, int b, int c)
{
    return c + (int)(int16_t)a * (int)(int8_t)b + (int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 8);
}
inline int __dp2a_hi(int a, int b, int c)
{
    return c + (int)(int16_t)a * (int)(int8_t)(b >> 16) +
           (int)(int16_t)(a >> 16) * (int)(int8_t)(b >> 24);
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b)
{
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline int __mul24(int a, int b) { return (int)((unsigned)((a << 8) >> 8) * (unsigned)((b << 8) >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s)
{
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((v << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s)
{
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (s & 31));
}

inline float __int_as_float(int x) { return cudasim::from_bits<float>((unsigned)x); }
inline int __float_as_int(float x) { return (int)(unsigned)cudasim::to_bits(x); }
inline float __uint_as_float(unsigned x) { return cudasim::from_bits<float>(x); }
inline unsigned __float_as_uint(float x) { return (unsigned)cudasim::to_bits(x); }
inline double __longlong_as_double(long long x) { return cudasim::from_bits<double>((unsigned long long)x); }
inline long long __double_as_longlong(double x) { return (long long)cudasim::to_bits(x); }

/* Float to int conversions saturate and send NaN to 0, as the device's. */
namespace cudasim {
inline int sat_int(float r)
{
    if (r != r)
        return 0;
    if (r >= 2147483648.0f)
        return INT_MAX;
    if (r < -2147483648.0f)
        return INT_MIN;
    return (int)r;
}
inline unsigned sat_uint(float r)
{
    if (r != r || r <= 0.0f)
        return 0;
    if (r >= 4294967296.0f)
        return UINT_MAX;
    return (unsigned)r;
}
} // namespace cudasim
inline int __float2int_rn(float x) { return cudasim::sat_int(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return cudasim::sat_int(std::trunc(x)); }
inline int __float2int_rd(float x) { return cudasim::sat_int(std::floor(x)); }
inline int __float2int_ru(float x) { return cudasim::sat_int(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return cudasim::sat_uint(std::nearbyint(x)); }
inline unsigned __float2uint_rz(float x) { return cudasim::sat_uint(std::trunc(x)); }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }

/* Fast math: the device's approximations are replaced by the exact
 * functions (results agree to the approximations' documented error). */
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float *s, float *c)
{
    *s = sinf(x);
    *c = cosf(x);
}
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : x > 0.0f ? x : 0.0f; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

/* CUDA's global min/max overloads (crt/math_functions.hpp). */
#define CUDASIM_MINMAX(R, A, B)                                                \
    inline R min(A a, B b) { return (R)a < (R)b ? (R)a : (R)b; }               \
    inline R max(A a, B b) { return (R)a > (R)b ? (R)a : (R)b; }
CUDASIM_MINMAX(int, int, int)
CUDASIM_MINMAX(unsigned, unsigned, unsigned)
CUDASIM_MINMAX(unsigned, int, unsigned)
CUDASIM_MINMAX(unsigned, unsigned, int)
CUDASIM_MINMAX(long, long, long)
CUDASIM_MINMAX(unsigned long, unsigned long, unsigned long)
CUDASIM_MINMAX(unsigned long, long, unsigned long)
CUDASIM_MINMAX(unsigned long, unsigned long, long)
CUDASIM_MINMAX(long long, long long, long long)
CUDASIM_MINMAX(unsigned long long, unsigned long long, unsigned long long)
CUDASIM_MINMAX(unsigned long long, long long, unsigned long long)
CUDASIM_MINMAX(unsigned long long, unsigned long long, long long)
#undef CUDASIM_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline double min(float a, double b) { return fmin(a, b); }
inline double max(float a, double b) { return fmax(a, b); }
inline double min(double a, float b) { return fmin(a, b); }
inline double max(double a, float b) { return fmax(a, b); }

/* A nanosecond counter standing in for the SM clock. */
long long cudasim_clock64(void);
inline long long clock64(void) { return cudasim_clock64(); }
inline void __nanosleep(unsigned) {}

/* ---------------------------------------------------------------------- */
/* fp16 / bf16 functions the toolkit headers give the device only          */
/* ---------------------------------------------------------------------- */

/* Computed in float and rounded once to the 16-bit type (for __hfma the
 * float fmaf's rounding comes first: double rounding is possible, rarely). */
inline __half __hfma(__half a, __half b, __half c)
{
    return __float2half(fmaf(__half2float(a), __half2float(b), __half2float(c)));
}
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c)
{
    return __halves2half2(__hfma(__low2half(a), __low2half(b), __low2half(c)),
                          __hfma(__high2half(a), __high2half(b), __high2half(c)));
}
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c)
{
    return __float2bfloat16(fmaf(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c)
{
    return __halves2bfloat162(__hfma(__low2bfloat16(a), __low2bfloat16(b), __low2bfloat16(c)),
                              __hfma(__high2bfloat16(a), __high2bfloat16(b), __high2bfloat16(c)));
}
#define CUDASIM_HMATH(name, fn)                                                \
    inline __half name(__half x) { return __float2half(fn(__half2float(x))); } \
    inline __nv_bfloat16 name(__nv_bfloat16 x)                                 \
    {                                                                          \
        return __float2bfloat16(fn(__bfloat162float(x)));                      \
    }                                                                          \
    inline __half2 name##2(__half2 x)                                          \
    {                                                                          \
        return __halves2half2(name(__low2half(x)), name(__high2half(x)));      \
    }                                                                          \
    inline __nv_bfloat162 name##2(__nv_bfloat162 x)                            \
    {                                                                          \
        return __halves2bfloat162(name(__low2bfloat16(x)), name(__high2bfloat16(x))); \
    }
CUDASIM_HMATH(hexp, expf)
CUDASIM_HMATH(hexp2, exp2f)
CUDASIM_HMATH(hlog, logf)
CUDASIM_HMATH(hlog2, log2f)
CUDASIM_HMATH(hsqrt, sqrtf)
CUDASIM_HMATH(hrsqrt, rsqrtf)
CUDASIM_HMATH(hrcp, 1.0f /)
CUDASIM_HMATH(hsin, sinf)
CUDASIM_HMATH(hcos, cosf)
CUDASIM_HMATH(htanh, tanhf)
CUDASIM_HMATH(hfloor, floorf)
CUDASIM_HMATH(hceil, ceilf)
CUDASIM_HMATH(htrunc, truncf)
CUDASIM_HMATH(hrint, rintf)
#undef CUDASIM_HMATH

#endif /* CINFER_CUDASIM_H */
