/*
 * runtime.cc - cudasim's CUDA runtime: the libcudart functions the CUDA
 * backend calls, defined with the toolkit's own declarations
 * (cuda_runtime_api.h), answered on the host.
 *
 * TEST DOUBLE (cudasim.h has the model). What it keeps:
 *
 *   - Devices: CUDASIM_DEVICES of them (default 1, 0 allowed), each with a
 *     memory limit (CUDASIM_MEMORY_MB), a sticky error and a legacy default
 *     stream. The current device and the last error are per host thread,
 *     as in CUDA. A sticky error (a kernel fault, a damaged guard zone, an
 *     injected sticky fault) is returned by every later call that uses the
 *     device; cudaGetLastError does not clear it, and neither does
 *     cudaDeviceReset (CUDA documents the process as unusable);
 *     cudasim_reset() does.
 *   - Memory: cudaMalloc returns host memory with a 256-byte guard zone in
 *     front and at least 256 bytes behind (the size is rounded up to 256),
 *     filled with a pattern that is checked at every cudaFree, stream and
 *     device synchronisation and after every kernel: a damaged zone is
 *     reported with the allocation's size and the offset, and the device
 *     gets a sticky cudaErrorIllegalAddress. New memory is filled with 0xFF
 *     bytes (NaN as floats). Under ASan the zones are also poisoned, so the
 *     faulting write stops the process with ASan's report. Copies and
 *     memsets check that their device ranges lie inside a live allocation
 *     (cudaErrorInvalidValue and a report otherwise).
 *   - Streams: work runs at once, in call order, on the calling thread; a
 *     stream is a device tag and a capture state. Events record host time.
 *   - Graphs: while a stream captures, its launches, copies, memsets, event
 *     records and cuBLAS calls are recorded with their arguments by value;
 *     cudaGraphLaunch runs them again in order. Synchronising a capturing
 *     stream, or a synchronous call (cudaMalloc, cudaFree, cudaMemcpy,
 *     cudaMemset, cudaDeviceSynchronize, work on the legacy stream) while a
 *     capture forbids it, fails as on a device and invalidates the capture.
 *   - Faults: cudasim_inject_fault / CUDASIM_FAULT make the nth counted call
 *     fail (cudasim_ctl.h).
 */
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdarg>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/cudasim/cudasim_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#endif
#ifdef CUDASIM_ASAN
#include <sanitizer/asan_interface.h>
#endif

/* Opaque handles of the toolkit headers, defined here. */
struct CUgraph_st {
    std::vector<std::shared_ptr<cudasim::stream_op>> ops;
};
struct CUgraphExec_st {
    std::vector<std::shared_ptr<cudasim::stream_op>> ops;
};
struct CUstream_st {
    int device = 0;
    unsigned flags = 0;
    bool legacy = false;
    bool capturing = false;
    bool invalidated = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id capture_thread;
    CUstream_st *origin = nullptr; /* the stream that began the capture */
    CUgraph_st *graph = nullptr;
};
struct CUevent_st {
    int device = 0;
    unsigned flags = 0;
    bool recorded = false;
    double t_ms = 0;
    CUgraph_st *capture = nullptr; /* recorded into this capture */
    CUstream_st *capture_origin = nullptr;
};

namespace cudasim {

/* ---------------------------------------------------------------------- */
/* Environment                                                             */
/* ---------------------------------------------------------------------- */

namespace {

env_config g_env;
std::once_flag g_env_once;

#if defined(CUDASIM_ASAN)
constexpr size_t DEFAULT_STACK_KB = 512;
#else
constexpr size_t DEFAULT_STACK_KB = 128;
#endif

long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "cudasim: %s=%s is not a number in [%ld, %ld]; using %ld\n", name, v, lo,
                hi, dflt);
        return dflt;
    }
    return x;
}

int error_from_name(const char *s);
void set_fault(long nth, int code, int sticky);
void make_devices(int n);

void load_env()
{
    g_env.threads = (int)env_long("CUDASIM_THREADS", 2, 1, 256);
    g_env.devices = (int)env_long("CUDASIM_DEVICES", 1, 0, 64);
    g_env.memory_bytes = (size_t)env_long("CUDASIM_MEMORY_MB", 16384, 1, 1l << 30) << 20;
    g_env.stack_bytes = (size_t)env_long("CUDASIM_STACK_KB", DEFAULT_STACK_KB, 16, 65536) << 10;
    const char *q = getenv("CUDASIM_QUIET");
    g_env.quiet = q && *q && strcmp(q, "0") != 0;

    const char *s = getenv("CUDASIM_SCHEDULE");
    int kind = CUDASIM_SCHEDULE_FORWARD;
    unsigned long long seed = 1;
    if (s && *s) {
        if (!strcmp(s, "forward"))
            kind = CUDASIM_SCHEDULE_FORWARD;
        else if (!strcmp(s, "reverse"))
            kind = CUDASIM_SCHEDULE_REVERSE;
        else if (!strncmp(s, "random", 6) && (s[6] == 0 || s[6] == ':')) {
            kind = CUDASIM_SCHEDULE_RANDOM;
            if (s[6] == ':')
                seed = strtoull(s + 7, nullptr, 0);
        } else
            fprintf(stderr, "cudasim: CUDASIM_SCHEDULE=%s is not forward, reverse or "
                            "random[:SEED]; using forward\n", s);
    }
    exec_set_schedule(kind, seed);

    const char *f = getenv("CUDASIM_FAULT");
    set_fault(-1, 0, 0);
    if (f && *f) {
        char buf[128];
        snprintf(buf, sizeof buf, "%s", f);
        char *code = strchr(buf, ':');
        char *end = nullptr;
        long nth = strtol(buf, &end, 10);
        if (!code || end != code) {
            fprintf(stderr, "cudasim: CUDASIM_FAULT=%s is not N:CODE[:sticky]\n", f);
            return;
        }
        *code++ = 0;
        char *st = strchr(code, ':');
        int sticky = 0;
        if (st) {
            *st++ = 0;
            sticky = !strcmp(st, "sticky") || !strcmp(st, "1");
        }
        int c = error_from_name(code);
        if (c <= 0) {
            fprintf(stderr, "cudasim: CUDASIM_FAULT: %s is not a CUDA error\n", code);
            return;
        }
        set_fault(nth, c, sticky);
    }
}

void load_all()
{
    load_env();
    make_devices(g_env.devices);
}

} // namespace

const env_config &env(void)
{
    std::call_once(g_env_once, load_all);
    return g_env;
}

/* ---------------------------------------------------------------------- */
/* Error names                                                             */
/* ---------------------------------------------------------------------- */

namespace {

#define CUDASIM_ERRORS(X)                                                      \
    X(cudaSuccess, "no error")                                                 \
    X(cudaErrorInvalidValue, "invalid argument")                               \
    X(cudaErrorMemoryAllocation, "out of memory")                              \
    X(cudaErrorInitializationError, "initialization error")                    \
    X(cudaErrorCudartUnloading, "driver shutting down")                        \
    X(cudaErrorInvalidConfiguration, "invalid configuration argument")         \
    X(cudaErrorInvalidPitchValue, "invalid pitch argument")                    \
    X(cudaErrorInvalidSymbol, "invalid device symbol")                         \
    X(cudaErrorInvalidHostPointer, "invalid host pointer")                     \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                 \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")    \
    X(cudaErrorMissingConfiguration, "__global__ function call is not configured") \
    X(cudaErrorInvalidDeviceFunction, "invalid device function")               \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                 \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                        \
    X(cudaErrorStartupFailure, "device kernel image is invalid")               \
    X(cudaErrorInvalidKernelImage, "device kernel image is invalid")           \
    X(cudaErrorNoKernelImageForDevice, "no kernel image is available for execution on the device") \
    X(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered")        \
    X(cudaErrorUnsupportedLimit, "limit is not supported on this architecture") \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")               \
    X(cudaErrorIllegalState, "the operation cannot be performed in the present state") \
    X(cudaErrorNotReady, "device not ready")                                   \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")     \
    X(cudaErrorLaunchOutOfResources, "too many resources requested for launch") \
    X(cudaErrorLaunchTimeout, "the launch timed out and was terminated")       \
    X(cudaErrorAssert, "device-side assert triggered")                         \
    X(cudaErrorHardwareStackError, "an illegal memory access was encountered") \
    X(cudaErrorIllegalInstruction, "an illegal instruction was encountered")   \
    X(cudaErrorMisalignedAddress, "misaligned address")                        \
    X(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space") \
    X(cudaErrorInvalidPc, "invalid program counter")                           \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                    \
    X(cudaErrorNotPermitted, "operation not permitted")                        \
    X(cudaErrorNotSupported, "operation not supported")                        \
    X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing") \
    X(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture") \
    X(cudaErrorStreamCaptureMerge, "operation would result in a merge of separate capture sequences") \
    X(cudaErrorStreamCaptureUnmatched, "capture was not ended in the same stream as it began") \
    X(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work")    \
    X(cudaErrorStreamCaptureIsolation, "dependency created on uncaptured work in another stream") \
    X(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(cudaErrorCapturedEvent, "operation not permitted on an event last recorded in a capturing stream") \
    X(cudaErrorStreamCaptureWrongThread, "attempt to terminate a thread-local capture sequence from another thread") \
    X(cudaErrorTimeout, "wait operation timed out")                            \
    X(cudaErrorGraphExecUpdateFailure, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update") \
    X(cudaErrorUnknown, "unknown error")

struct error_entry {
    int code;
    const char *name, *text;
};
#define CUDASIM_ERROR_ENTRY(e, s) {(int)e, #e, s},
const error_entry g_errors[] = {CUDASIM_ERRORS(CUDASIM_ERROR_ENTRY)};
#undef CUDASIM_ERROR_ENTRY

const error_entry *find_error(int code)
{
    for (const auto &e : g_errors)
        if (e.code == code)
            return &e;
    return nullptr;
}

int error_from_name(const char *s)
{
    char *end;
    long v = strtol(s, &end, 0);
    if (*s && !*end)
        return (int)v;
    for (const auto &e : g_errors)
        if (!strcmp(e.name, s))
            return e.code;
    return -1;
}

} // namespace

/* ---------------------------------------------------------------------- */
/* State                                                                   */
/* ---------------------------------------------------------------------- */

namespace {

constexpr size_t GUARD = 256;

struct allocation {
    char *base;      /* what aligned_alloc returned */
    size_t size;     /* the caller's bytes */
    size_t back;     /* guard bytes behind (padding included) */
    int device;      /* -1: pinned host memory */
    bool poisoned;   /* guard zones poisoned for ASan */
};

struct func_info {
    int max_dynamic = (int)SMEM_DEFAULT;
    size_t static_seen = 0;
};

struct device_state {
    std::atomic<int> sticky{0};
    size_t used = 0;
    CUstream_st legacy;
};

struct state {
    std::mutex m;
    std::map<uintptr_t, allocation> allocs; /* by the caller's address */
    size_t live_bytes = 0;
    long live_count = 0;
    std::vector<std::unique_ptr<device_state>> devices;
    std::set<CUstream_st *> streams;
    std::set<CUevent_st *> events;
    std::set<CUgraph_st *> graphs;
    std::set<CUgraphExec_st *> execs;
    std::map<const void *, func_info> funcs;
    bool asan_guards = true;

    std::mutex report_m;
    std::string last_report;
    long reports = 0;
};

state &S()
{
    static state *s = [] {
        state *n = new state; /* never destroyed: pool threads may outlive main */
        return n;
    }();
    return *s;
}

std::atomic<long> g_fault_countdown{-1};
std::atomic<int> g_fault_code{0};
std::atomic<int> g_fault_sticky{0};
std::atomic<int> g_global_captures{0};

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;
thread_local int t_captures = 0; /* non-relaxed captures this thread began */

void set_fault(long nth, int code, int sticky)
{
    g_fault_code = code;
    g_fault_sticky = sticky;
    g_fault_countdown = nth < 0 ? -1 : nth;
}

/* Devices are made when the environment is read (once, or at a reset);
 * CUDASIM_DEVICES=0 still makes one, so lookups stay valid while every
 * call fails with cudaErrorNoDevice. */
void make_devices(int n)
{
    state &s = S();
    size_t want = n > 0 ? (size_t)n : 1;
    while (s.devices.size() < want) {
        auto d = std::make_unique<device_state>();
        d->legacy.device = (int)s.devices.size();
        d->legacy.legacy = true;
        s.devices.push_back(std::move(d));
    }
}

device_state &dev(int d)
{
    env();
    state &s = S();
    if (d < 0 || d >= (int)s.devices.size())
        d = 0;
    return *s.devices[(size_t)d];
}

inline cudaError_t set_last(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

} // namespace

bool fault_fires(int *code)
{
    if (g_fault_countdown.load(std::memory_order_relaxed) < 0)
        return false;
    long v = g_fault_countdown.fetch_sub(1);
    if (v != 0)
        return false;
    *code = g_fault_code.load();
    if (g_fault_sticky.load())
        set_sticky((cudaError_t)*code);
    return true;
}

int current_device(void) { return t_device; }

cudaError_t device_sticky(void) { return (cudaError_t)dev(t_device).sticky.load(std::memory_order_relaxed); }

void set_sticky(cudaError_t e)
{
    int expected = 0;
    dev(t_device).sticky.compare_exchange_strong(expected, (int)e);
}

/* The common entry of a counted call that uses the device. */
static cudaError_t enter(void)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    cudaError_t s = device_sticky();
    if (s != cudaSuccess)
        return set_last(s);
    return cudaSuccess;
}

#define ENTER()                                                                \
    do {                                                                       \
        cudaError_t enter_e_ = cudasim::enter();                               \
        if (enter_e_ != cudaSuccess)                                           \
            return enter_e_;                                                   \
    } while (0)

/* ---------------------------------------------------------------------- */
/* Reports                                                                 */
/* ---------------------------------------------------------------------- */

void report(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    state &s = S();
    {
        std::lock_guard<std::mutex> lk(s.report_m);
        s.last_report = text;
        s.reports++;
    }
    if (!env().quiet)
        fprintf(stderr, "cudasim: %s\n", text);
}

const char *short_path(const char *file)
{
#ifdef CUDASIM_ROOT
    size_t n = strlen(CUDASIM_ROOT);
    if (file && !strncmp(file, CUDASIM_ROOT, n) && file[n] == '/')
        return file + n + 1;
#endif
    return file ? file : "?";
}

/* ---------------------------------------------------------------------- */
/* Capture rules                                                           */
/* ---------------------------------------------------------------------- */

namespace {

/* Whether this thread may make a call that would synchronise with a
 * capturing stream (CUDA's "potentially unsafe" calls). */
bool capture_forbids() { return g_global_captures.load() > 0 || t_captures > 0; }

/* A forbidden call invalidates the captures that forbade it. */
void invalidate_captures()
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    std::thread::id me = std::this_thread::get_id();
    for (CUstream_st *st : s.streams)
        if (st->capturing && (st->mode == cudaStreamCaptureModeGlobal ||
                              (st->mode == cudaStreamCaptureModeThreadLocal &&
                               st->capture_thread == me)))
            st->invalidated = true;
}

cudaError_t unsafe_call(cudaError_t e)
{
    invalidate_captures();
    return set_last(e);
}

/* nullptr for a handle that is not a live stream. */
CUstream_st *resolve(cudaStream_t s)
{
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return &dev(t_device).legacy;
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    return st.streams.count(s) ? s : nullptr;
}

} // namespace

cudaError_t submit(cudaStream_t stream, stream_op *op)
{
    std::shared_ptr<stream_op> sp(op);
    CUstream_st *s = resolve(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    if (s->capturing) {
        if (s->invalidated)
            return cudaErrorStreamCaptureInvalidated;
        s->graph->ops.push_back(sp);
        return cudaSuccess;
    }
    if (s->legacy && capture_forbids()) {
        invalidate_captures();
        return cudaErrorStreamCaptureImplicit;
    }
    return sp->run();
}

/* ---------------------------------------------------------------------- */
/* Memory                                                                  */
/* ---------------------------------------------------------------------- */

namespace {

/* The guard pattern: varies with the offset, so a stray copy of a guard
 * zone does not look intact. */
inline unsigned char guard_byte(size_t i) { return (unsigned char)(0xA5 ^ (i * 0x3B)); }

const unsigned char *guard_pattern()
{
    static unsigned char *p = [] {
        unsigned char *b = new unsigned char[2 * GUARD + 256];
        for (size_t i = 0; i < 2 * GUARD + 256; i++)
            b[i] = guard_byte(i);
        return b;
    }();
    return p;
}

void fill_guard(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = guard_byte(i);
}

/* First damaged byte of a guard zone of n bytes, or n if intact. */
size_t damaged_at(const unsigned char *p, size_t n)
{
    if (memcmp(p, guard_pattern(), n) == 0)
        return n;
    for (size_t i = 0; i < n; i++)
        if (p[i] != guard_byte(i))
            return i;
    return n;
}

/* Checks one allocation (state lock held); reports and restores a damaged
 * zone. Returns false if damaged. */
bool check_one(uintptr_t user, allocation &a, const char *after)
{
    if (a.device < 0 || a.poisoned)
        return true;
    unsigned char *front = reinterpret_cast<unsigned char *>(a.base);
    unsigned char *back = reinterpret_cast<unsigned char *>(user + a.size);
    size_t f = damaged_at(front, GUARD), b = damaged_at(back, a.back);
    if (f == GUARD && b == a.back)
        return true;
    if (b != a.back) {
        size_t last = b;
        for (size_t i = a.back; i-- > b;)
            if (back[i] != guard_byte(i)) {
                last = i;
                break;
            }
        report("write past the end of an allocation of %zu bytes at %p (device %d), found %s: "
               "bytes changed at offsets %zu..%zu (%zu to %zu bytes past its end) "
               "-> cudaErrorIllegalAddress (sticky)",
               a.size, reinterpret_cast<void *>(user), a.device, after, a.size + b,
               a.size + last, b + 1, last + 1);
    } else {
        report("write before the start of an allocation of %zu bytes at %p (device %d), found "
               "%s: byte at offset -%zu changed -> cudaErrorIllegalAddress (sticky)",
               a.size, reinterpret_cast<void *>(user), a.device, after, GUARD - f);
    }
    fill_guard(front, GUARD);
    fill_guard(back, a.back);
    int expected = 0;
    dev(a.device).sticky.compare_exchange_strong(expected, (int)cudaErrorIllegalAddress);
    return false;
}

void poison_guards(uintptr_t user, allocation &a, bool on)
{
#ifdef CUDASIM_ASAN
    if (on) {
        ASAN_POISON_MEMORY_REGION(a.base, GUARD);
        ASAN_POISON_MEMORY_REGION(reinterpret_cast<void *>(user + a.size), a.back);
    } else {
        ASAN_UNPOISON_MEMORY_REGION(a.base, GUARD);
        ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void *>(user + a.size), a.back);
    }
    a.poisoned = on;
#else
    (void)user;
    (void)a;
    (void)on;
#endif
}

/* The allocation holding p (state lock held), or end(). */
std::map<uintptr_t, allocation>::iterator holder(state &s, uintptr_t p)
{
    auto it = s.allocs.upper_bound(p);
    if (it == s.allocs.begin())
        return s.allocs.end();
    --it;
    if (p < it->first + (it->second.size ? it->second.size : 1))
        return it;
    return s.allocs.end();
}

void free_allocation(state &s, std::map<uintptr_t, allocation>::iterator it)
{
    allocation &a = it->second;
    if (a.device >= 0) {
        poison_guards(it->first, a, false);
        dev(a.device).used -= a.size;
    }
    s.live_bytes -= a.size;
    s.live_count--;
    free(a.base);
    s.allocs.erase(it);
}

} // namespace

bool check_range(const void *p, size_t n, const char *what)
{
    if (n == 0)
        return true;
    state &s = S();
    uintptr_t u = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lk(s.m);
    auto it = holder(s, u);
    if (it == s.allocs.end()) {
        report("%s: %zu bytes at %p are not in a live allocation -> cudaErrorInvalidValue", what, n,
               p);
        return false;
    }
    if (u + n > it->first + it->second.size) {
        report("%s: %zu bytes at offset %zu of an allocation of %zu bytes at %p run %zu bytes "
               "past its end -> cudaErrorInvalidValue",
               what, n, (size_t)(u - it->first), it->second.size,
               reinterpret_cast<void *>(it->first), (size_t)(u + n - it->first - it->second.size));
        return false;
    }
    return true;
}

bool check_guards(const char *after)
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    bool ok = true;
    for (auto &kv : s.allocs)
        ok &= check_one(kv.first, kv.second, after);
    return ok;
}

} // namespace cudasim

using namespace cudasim;

/* ---------------------------------------------------------------------- */
/* Errors and versions                                                     */
/* ---------------------------------------------------------------------- */

extern "C" {

const char *cudaGetErrorName(cudaError_t error)
{
    const error_entry *e = find_error((int)error);
    return e ? e->name : "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    const error_entry *e = find_error((int)error);
    return e ? e->text : "unrecognized error code";
}

cudaError_t cudaGetLastError(void)
{
    int code;
    if (fault_fires(&code))
        return (cudaError_t)code;
    cudaError_t s = env().devices ? device_sticky() : cudaSuccess;
    if (s != cudaSuccess)
        return s;
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    int code;
    if (fault_fires(&code))
        return (cudaError_t)code;
    cudaError_t s = env().devices ? device_sticky() : cudaSuccess;
    return s != cudaSuccess ? s : t_last;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (!v)
        return set_last(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (!v)
        return set_last(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

/* ---------------------------------------------------------------------- */
/* Devices                                                                 */
/* ---------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (!count)
        return set_last(cudaErrorInvalidValue);
    *count = env().devices;
    return env().devices ? cudaSuccess : set_last(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    if (device < 0 || device >= env().devices)
        return set_last(cudaErrorInvalidDevice);
    t_device = device;
    return device_sticky();
}

cudaError_t cudaGetDevice(int *device)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    if (!device)
        return set_last(cudaErrorInvalidValue);
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    if (!p)
        return set_last(cudaErrorInvalidValue);
    if (device < 0 || device >= env().devices)
        return set_last(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudasim (CPU harness)");
    p->uuid.bytes[0] = (char)device;
    p->totalGlobalMem = env().memory_bytes;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->reservedSharedMemPerBlock = 1024;
    p->regsPerBlock = 65536;
    p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = MAX_THREADS;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = 132;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = device + 1;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 6144;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->persistingL2CacheMaxSize = 30 * 1024 * 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->managedMemory = 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->maxBlocksPerMultiProcessor = 32;
    p->memoryPoolsSupported = 1;
    p->clusterLaunch = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    if (!value)
        return set_last(cudaErrorInvalidValue);
    if (device < 0 || device >= env().devices)
        return set_last(cudaErrorInvalidDevice);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, device);
    int v;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: v = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: v = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: v = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: v = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: v = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrTotalConstantMemory: v = (int)p.totalConstMem; break;
    case cudaDevAttrWarpSize: v = 32; break;
    case cudaDevAttrMaxPitch: v = (int)p.memPitch; break;
    case cudaDevAttrMaxRegistersPerBlock: v = p.regsPerBlock; break;
    case cudaDevAttrClockRate: v = 1980000; break;
    case cudaDevAttrMultiProcessorCount: v = p.multiProcessorCount; break;
    case cudaDevAttrKernelExecTimeout: v = 0; break;
    case cudaDevAttrIntegrated: v = 0; break;
    case cudaDevAttrCanMapHostMemory: v = 1; break;
    case cudaDevAttrComputeMode: v = cudaComputeModeDefault; break;
    case cudaDevAttrConcurrentKernels: v = 1; break;
    case cudaDevAttrEccEnabled: v = 1; break;
    case cudaDevAttrPciBusId: v = p.pciBusID; break;
    case cudaDevAttrMemoryClockRate: v = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: v = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: v = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrAsyncEngineCount: v = p.asyncEngineCount; break;
    case cudaDevAttrUnifiedAddressing: v = 1; break;
    case cudaDevAttrComputeCapabilityMajor: v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: v = p.regsPerMultiprocessor; break;
    case cudaDevAttrManagedMemory: v = 1; break;
    case cudaDevAttrCooperativeLaunch: v = 1; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: v = p.maxBlocksPerMultiProcessor; break;
    case cudaDevAttrMemoryPoolsSupported: v = 1; break;
    default: return set_last(cudaErrorInvalidValue);
    }
    *value = v;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    ENTER();
    if (!free_bytes || !total)
        return set_last(cudaErrorInvalidValue);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    *total = env().memory_bytes;
    *free_bytes = env().memory_bytes - dev(t_device).used;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    if (capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureUnsupported);
    check_guards("at cudaDeviceSynchronize");
    return set_last(device_sticky());
}

cudaError_t cudaDeviceReset(void)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    for (auto it = s.allocs.begin(); it != s.allocs.end();) {
        auto next = std::next(it);
        if (it->second.device == t_device)
            free_allocation(s, it);
        it = next;
    }
    for (auto it = s.streams.begin(); it != s.streams.end();) {
        auto next = std::next(it);
        if ((*it)->device == t_device) {
            delete *it;
            s.streams.erase(it);
        }
        it = next;
    }
    for (auto it = s.events.begin(); it != s.events.end();) {
        auto next = std::next(it);
        if ((*it)->device == t_device) {
            delete *it;
            s.events.erase(it);
        }
        it = next;
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------------- */
/* Kernels                                                                 */
/* ---------------------------------------------------------------------- */

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    ENTER();
    if (!func)
        return set_last(cudaErrorInvalidDeviceFunction);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    func_info &f = s.funcs[func];
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        if (value < 0 || (size_t)value + f.static_seen > SMEM_OPTIN)
            return set_last(cudaErrorInvalidValue);
        f.max_dynamic = value;
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        if (value < -1 || value > 100)
            return set_last(cudaErrorInvalidValue);
        return cudaSuccess;
    default: return set_last(cudaErrorInvalidValue);
    }
}

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    ENTER();
    if (!attr)
        return set_last(cudaErrorInvalidValue);
    if (!func)
        return set_last(cudaErrorInvalidDeviceFunction);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    func_info &f = s.funcs[func];
    memset(attr, 0, sizeof *attr);
    attr->sharedSizeBytes = f.static_seen; /* known once a block has run */
    attr->maxThreadsPerBlock = MAX_THREADS;
    attr->maxDynamicSharedSizeBytes = f.max_dynamic;
    attr->numRegs = 32;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->preferredShmemCarveout = -1;
    return cudaSuccess;
}

} // extern "C"

namespace cudasim {
namespace {

struct kernel_op final : stream_op {
    const char *name;
    const void *kernel_id;
    std::shared_ptr<closure> fn;
    dim3 grid, block;
    size_t smem;

    cudaError_t run() override
    {
        size_t static_seen, max_dyn;
        {
            state &s = S();
            std::lock_guard<std::mutex> lk(s.m);
            func_info &f = s.funcs[kernel_id];
            static_seen = f.static_seen;
            max_dyn = (size_t)f.max_dynamic;
        }
        if (smem > max_dyn || smem + static_seen > SMEM_OPTIN) {
            report("launch of %s: %zu bytes of dynamic shared memory%s exceed the kernel's limit "
                   "of %zu (raise it with cudaFuncSetAttribute(MaxDynamicSharedMemorySize), up "
                   "to 227 KB with static) -> cudaErrorInvalidValue",
                   name, smem, static_seen ? " with its static shared memory" : "", max_dyn);
            return cudaErrorInvalidValue;
        }
        launch_desc d;
        d.name = name;
        d.kernel_id = kernel_id;
        d.fn = fn.get();
        d.grid = grid;
        d.block = block;
        d.smem_dynamic = smem;
        d.smem_static_limit = std::min(SMEM_DEFAULT, SMEM_OPTIN - smem);
        launch_outcome o = exec_launch(d);
        if (o.smem_static > static_seen) {
            state &s = S();
            std::lock_guard<std::mutex> lk(s.m);
            func_info &f = s.funcs[kernel_id];
            f.static_seen = std::max(f.static_seen, o.smem_static);
        }
        if (o.error != cudaSuccess && o.sticky)
            set_sticky(o.error);
        char after[256];
        snprintf(after, sizeof after, "after kernel %s", name);
        if (!check_guards(after) && o.error == cudaSuccess)
            return cudaErrorIllegalAddress;
        return o.error;
    }
};

/* Launch configuration limits of an sm_90 device. */
cudaError_t check_config(const char *name, dim3 g, dim3 b)
{
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    const char *why = nullptr;
    if (!b.x || !b.y || !b.z)
        why = "a block dimension is 0";
    else if (b.x > 1024 || b.y > 1024 || b.z > 64)
        why = "a block dimension exceeds (1024, 1024, 64)";
    else if (threads > (unsigned long long)MAX_THREADS)
        why = "the block has more than 1024 threads";
    else if (!g.x || !g.y || !g.z)
        why = "a grid dimension is 0";
    else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        why = "a grid dimension exceeds (2^31-1, 65535, 65535)";
    if (!why)
        return cudaSuccess;
    report("launch of %s with grid (%u,%u,%u) block (%u,%u,%u): %s -> "
           "cudaErrorInvalidConfiguration (the kernel does not run)",
           name, g.x, g.y, g.z, b.x, b.y, b.z, why);
    return cudaErrorInvalidConfiguration;
}

} // namespace

void launch_closure(const char *name, const void *kernel_id, closure *c, dim3 grid, dim3 block,
                    size_t smem_bytes, cudaStream_t stream)
{
    std::shared_ptr<closure> fn(c);
    int code;
    if (fault_fires(&code)) {
        set_last((cudaError_t)code);
        return;
    }
    if (env().devices == 0) {
        set_last(cudaErrorNoDevice);
        return;
    }
    cudaError_t e = device_sticky();
    if (e == cudaSuccess)
        e = check_config(name, grid, block);
    if (e == cudaSuccess) {
        auto *op = new kernel_op;
        op->name = name;
        op->kernel_id = kernel_id;
        op->fn = fn;
        op->grid = grid;
        op->block = block;
        op->smem = smem_bytes;
        e = submit(stream, op);
    }
    set_last(e);
}

} // namespace cudasim

/* ---------------------------------------------------------------------- */
/* Memory                                                                  */
/* ---------------------------------------------------------------------- */

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    ENTER();
    if (capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureUnsupported);
    if (!ptr)
        return set_last(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = nullptr;
        return cudaSuccess;
    }
    state &s = S();
    device_state &d = dev(t_device);
    size_t padded = (size + 255) / 256 * 256;
    size_t back = padded - size + GUARD;
    {
        std::lock_guard<std::mutex> lk(s.m);
        if (size > env().memory_bytes - d.used)
            return set_last(cudaErrorMemoryAllocation);
        d.used += size; /* reserved before the (slow) fill */
    }
    char *base = static_cast<char *>(aligned_alloc(256, GUARD + padded + GUARD));
    if (!base) {
        std::lock_guard<std::mutex> lk(s.m);
        d.used -= size;
        return set_last(cudaErrorMemoryAllocation);
    }
    char *user = base + GUARD;
    fill_guard(reinterpret_cast<unsigned char *>(base), GUARD);
    memset(user, 0xff, size);
    fill_guard(reinterpret_cast<unsigned char *>(user + size), back);
    allocation a{base, size, back, t_device, false};
    std::lock_guard<std::mutex> lk(s.m);
    if (s.asan_guards)
        poison_guards(reinterpret_cast<uintptr_t>(user), a, true);
    s.allocs[reinterpret_cast<uintptr_t>(user)] = a;
    s.live_bytes += size;
    s.live_count++;
    *ptr = user;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (env().devices == 0)
        return set_last(cudaErrorNoDevice);
    if (!ptr)
        return set_last(device_sticky());
    if (capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureUnsupported);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    auto it = s.allocs.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s.allocs.end() || it->second.device < 0) {
        auto h = holder(s, reinterpret_cast<uintptr_t>(ptr));
        if (h != s.allocs.end() && h->second.device >= 0)
            report("cudaFree(%p): points %zu bytes into an allocation of %zu bytes at %p -> "
                   "cudaErrorInvalidValue",
                   ptr, (size_t)(reinterpret_cast<uintptr_t>(ptr) - h->first), h->second.size,
                   reinterpret_cast<void *>(h->first));
        else
            report("cudaFree(%p): not a live device allocation -> cudaErrorInvalidValue", ptr);
        return set_last(cudaErrorInvalidValue);
    }
    check_one(it->first, it->second, "at cudaFree");
    free_allocation(s, it);
    /* After a sticky error the memory is released all the same (so leak
     * checks see what the caller freed) and the error returned, as CUDA
     * returns it from every call. */
    return set_last(device_sticky());
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags)
{
    ENTER();
    if (capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureUnsupported);
    if (!ptr || flags > 15)
        return set_last(cudaErrorInvalidValue);
    if (size == 0) {
        *ptr = nullptr;
        return cudaSuccess;
    }
    char *p = static_cast<char *>(aligned_alloc(4096, (size + 4095) / 4096 * 4096));
    if (!p)
        return set_last(cudaErrorMemoryAllocation);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    s.allocs[reinterpret_cast<uintptr_t>(p)] = allocation{p, size, 0, -1, false};
    s.live_bytes += size;
    s.live_count++;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void *ptr)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (!ptr)
        return cudaSuccess;
    if (capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureUnsupported);
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    auto it = s.allocs.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s.allocs.end() || it->second.device >= 0) {
        report("cudaFreeHost(%p): not a live pinned host allocation -> cudaErrorInvalidValue", ptr);
        return set_last(cudaErrorInvalidValue);
    }
    free_allocation(s, it);
    return cudaSuccess;
}

} // extern "C"

namespace cudasim {
namespace {

/* Checks the device side(s) of a copy; kind must be valid. */
bool copy_ranges_ok(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *what)
{
    char w[96];
    bool ok = true;
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) {
        snprintf(w, sizeof w, "%s destination", what);
        ok &= check_range(dst, n, w);
    }
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) {
        snprintf(w, sizeof w, "%s source", what);
        ok &= check_range(src, n, w);
    }
    if (kind == cudaMemcpyDefault) {
        /* Unified addressing: a pointer inside an allocation must fit in it. */
        state &s = S();
        bool dst_dev, src_dev;
        {
            std::lock_guard<std::mutex> lk(s.m);
            dst_dev = holder(s, reinterpret_cast<uintptr_t>(dst)) != s.allocs.end();
            src_dev = holder(s, reinterpret_cast<uintptr_t>(src)) != s.allocs.end();
        }
        snprintf(w, sizeof w, "%s destination", what);
        if (dst_dev)
            ok &= check_range(dst, n, w);
        snprintf(w, sizeof w, "%s source", what);
        if (src_dev)
            ok &= check_range(src, n, w);
    }
    return ok;
}

struct copy_op final : stream_op {
    void *dst;
    const void *src;
    size_t n;
    cudaMemcpyKind kind;
    cudaError_t run() override
    {
        if (!copy_ranges_ok(dst, src, n, kind, "cudaMemcpy"))
            return cudaErrorInvalidValue;
        if (n)
            memmove(dst, src, n);
        return cudaSuccess;
    }
};

struct set_op final : stream_op {
    void *p;
    int value;
    size_t n;
    cudaError_t run() override
    {
        if (!check_range(p, n, "cudaMemset"))
            return cudaErrorInvalidValue;
        if (n)
            memset(p, value, n);
        return cudaSuccess;
    }
};

cudaError_t memcpy_common(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                          cudaStream_t stream, bool sync)
{
    ENTER();
    if ((int)kind < 0 || (int)kind > 4)
        return set_last(cudaErrorInvalidMemcpyDirection);
    if (n && (!dst || !src)) {
        report("cudaMemcpy%s of %zu bytes with a NULL %s -> cudaErrorInvalidValue",
               sync ? "" : "Async", n, dst ? "source" : "destination");
        return set_last(cudaErrorInvalidValue);
    }
    if (!copy_ranges_ok(dst, src, n, kind, sync ? "cudaMemcpy" : "cudaMemcpyAsync"))
        return set_last(cudaErrorInvalidValue);
    if (sync && capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureImplicit);
    auto *op = new copy_op;
    op->dst = dst;
    op->src = src;
    op->n = n;
    op->kind = kind;
    return set_last(submit(stream, op));
}

cudaError_t memset_common(void *p, int value, size_t n, cudaStream_t stream, bool sync)
{
    ENTER();
    if (!check_range(p, n, sync ? "cudaMemset" : "cudaMemsetAsync"))
        return set_last(cudaErrorInvalidValue);
    if (sync && capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureImplicit);
    auto *op = new set_op;
    op->p = p;
    op->value = value;
    op->n = n;
    return set_last(submit(stream, op));
}

} // namespace
} // namespace cudasim

extern "C" {

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return memcpy_common(dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return memcpy_common(dst, src, count, kind, stream, false);
}

cudaError_t cudaMemset(void *p, int value, size_t count)
{
    return memset_common(p, value, count, nullptr, true);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
    return memset_common(p, value, count, stream, false);
}

/* ---------------------------------------------------------------------- */
/* Streams                                                                 */
/* ---------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    ENTER();
    if (!stream || flags > cudaStreamNonBlocking)
        return set_last(cudaErrorInvalidValue);
    auto *s = new CUstream_st;
    s->device = t_device;
    s->flags = flags;
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    st.streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    if (!st.streams.count(stream))
        return set_last(cudaErrorInvalidResourceHandle);
    if (stream->capturing)
        return set_last(cudaErrorStreamCaptureUnsupported);
    st.streams.erase(stream);
    delete stream;
    return set_last(env().devices ? device_sticky() : cudaSuccess);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    if (s->capturing) {
        s->invalidated = true;
        return set_last(cudaErrorStreamCaptureUnsupported);
    }
    if (s->legacy && capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureImplicit);
    check_guards("at cudaStreamSynchronize");
    return set_last(device_sticky());
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    ENTER();
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    if (s->capturing) {
        s->invalidated = true;
        return set_last(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess; /* work finished when it was issued */
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    ENTER();
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    {
        state &st = S();
        std::lock_guard<std::mutex> lk(st.m);
        if (!st.events.count(event))
            return set_last(cudaErrorInvalidResourceHandle);
    }
    if (flags > 1)
        return set_last(cudaErrorInvalidValue);
    /* Work is already ordered; an event of a capture pulls the waiting
     * stream into it (CUDA's fork), so its later work is recorded too. */
    if (event->capture && !s->capturing) {
        if (s->legacy)
            return unsafe_call(cudaErrorStreamCaptureImplicit);
        CUstream_st *o = event->capture_origin;
        s->capturing = true;
        s->invalidated = false;
        s->graph = event->capture;
        s->origin = o;
        s->mode = o->mode;
        s->capture_thread = o->capture_thread;
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------------- */
/* Events                                                                  */
/* ---------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    ENTER();
    if (!event || flags > 15)
        return set_last(cudaErrorInvalidValue);
    auto *e = new CUevent_st;
    e->device = t_device;
    e->flags = flags;
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    st.events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

namespace {
struct event_op final : stream_op {
    CUevent_st *e;
    cudaError_t run() override
    {
        e->recorded = true;
        e->t_ms = now_ms();
        return cudaSuccess;
    }
};
bool live_event(cudaEvent_t e)
{
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    return st.events.count(e) != 0;
}
} // namespace

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    ENTER();
    if (!live_event(event))
        return set_last(cudaErrorInvalidResourceHandle);
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    if (s->capturing) {
        event->capture = s->graph;
        event->capture_origin = s->origin ? s->origin : s;
    } else {
        event->capture = nullptr;
    }
    auto *op = new event_op;
    op->e = event;
    return set_last(submit(stream, op));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    ENTER();
    if (!live_event(event))
        return set_last(cudaErrorInvalidResourceHandle);
    if (event->capture)
        return set_last(cudaErrorCapturedEvent);
    check_guards("at cudaEventSynchronize");
    return set_last(device_sticky());
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    ENTER();
    if (!live_event(event))
        return set_last(cudaErrorInvalidResourceHandle);
    if (event->capture)
        return set_last(cudaErrorCapturedEvent);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    ENTER();
    if (!ms)
        return set_last(cudaErrorInvalidValue);
    if (!live_event(start) || !live_event(end))
        return set_last(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming)
        return set_last(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded)
        return set_last(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    if (!st.events.count(event))
        return set_last(cudaErrorInvalidResourceHandle);
    st.events.erase(event);
    delete event;
    return set_last(env().devices ? device_sticky() : cudaSuccess);
}

/* ---------------------------------------------------------------------- */
/* Graphs                                                                  */
/* ---------------------------------------------------------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    ENTER();
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    if (s->legacy)
        return set_last(cudaErrorStreamCaptureUnsupported);
    if (s->capturing)
        return set_last(cudaErrorIllegalState);
    if ((int)mode < 0 || (int)mode > 2)
        return set_last(cudaErrorInvalidValue);
    auto *g = new CUgraph_st;
    {
        state &st = S();
        std::lock_guard<std::mutex> lk(st.m);
        st.graphs.insert(g);
    }
    s->capturing = true;
    s->invalidated = false;
    s->mode = mode;
    s->capture_thread = std::this_thread::get_id();
    s->origin = nullptr;
    s->graph = g;
    if (mode == cudaStreamCaptureModeGlobal)
        g_global_captures++;
    if (mode != cudaStreamCaptureModeRelaxed)
        t_captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    if (!graph)
        return set_last(cudaErrorInvalidValue);
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    if (!s->capturing)
        return set_last(cudaErrorIllegalState);
    if (s->origin)
        return set_last(cudaErrorStreamCaptureUnmatched);
    if (s->mode != cudaStreamCaptureModeRelaxed && s->capture_thread != std::this_thread::get_id())
        return set_last(cudaErrorStreamCaptureWrongThread);
    CUgraph_st *g = s->graph;
    bool invalid = s->invalidated;
    state &st = S();
    {
        std::lock_guard<std::mutex> lk(st.m);
        for (CUstream_st *o : st.streams)
            if (o->graph == g) {
                invalid |= o->invalidated;
                o->capturing = false;
                o->graph = nullptr;
                o->origin = nullptr;
            }
        for (CUevent_st *e : st.events)
            if (e->capture == g)
                e->capture = nullptr;
    }
    if (s->mode == cudaStreamCaptureModeGlobal)
        g_global_captures--;
    if (s->mode != cudaStreamCaptureModeRelaxed)
        t_captures--;
    if (invalid) {
        std::lock_guard<std::mutex> lk(st.m);
        st.graphs.erase(g);
        delete g;
        *graph = nullptr;
        return set_last(cudaErrorStreamCaptureInvalidated);
    }
    *graph = g;
    cudaError_t e = env().devices ? device_sticky() : cudaSuccess;
    return set_last(e);
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    ENTER();
    if (!status)
        return set_last(cudaErrorInvalidValue);
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    *status = !s->capturing     ? cudaStreamCaptureStatusNone
              : s->invalidated ? cudaStreamCaptureStatusInvalidated
                               : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    ENTER();
    if (!exec)
        return set_last(cudaErrorInvalidValue);
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    if (!st.graphs.count(graph))
        return set_last(cudaErrorInvalidValue);
    (void)flags;
    auto *x = new CUgraphExec_st;
    x->ops = graph->ops;
    st.execs.insert(x);
    *exec = x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    ENTER();
    {
        state &st = S();
        std::lock_guard<std::mutex> lk(st.m);
        if (!st.execs.count(exec))
            return set_last(cudaErrorInvalidResourceHandle);
    }
    CUstream_st *s = resolve(stream);
    if (!s)
        return set_last(cudaErrorInvalidResourceHandle);
    if (s->capturing) {
        if (s->invalidated)
            return set_last(cudaErrorStreamCaptureInvalidated);
        for (auto &op : exec->ops)
            s->graph->ops.push_back(op);
        return cudaSuccess;
    }
    if (s->legacy && capture_forbids())
        return unsafe_call(cudaErrorStreamCaptureImplicit);
    for (auto &op : exec->ops) {
        cudaError_t e = op->run();
        if (e != cudaSuccess)
            return set_last(e);
        if (device_sticky() != cudaSuccess)
            return set_last(device_sticky());
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    if (!st.execs.count(exec))
        return set_last(cudaErrorInvalidResourceHandle);
    st.execs.erase(exec);
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    int code;
    if (fault_fires(&code))
        return set_last((cudaError_t)code);
    state &st = S();
    std::lock_guard<std::mutex> lk(st.m);
    if (!st.graphs.count(graph))
        return set_last(cudaErrorInvalidValue);
    st.graphs.erase(graph);
    delete graph;
    return cudaSuccess;
}

/* ---------------------------------------------------------------------- */
/* Control API (cudasim_ctl.h)                                             */
/* ---------------------------------------------------------------------- */

void cudasim_set_schedule(int kind, unsigned long long seed)
{
    env();
    exec_set_schedule(kind, seed);
}

int cudasim_get_schedule(unsigned long long *seed)
{
    env();
    return exec_get_schedule(seed);
}

void cudasim_inject_fault(long nth, int cuda_error, int sticky)
{
    env();
    set_fault(nth, cuda_error, sticky);
}

size_t cudasim_live_bytes(void)
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    return s.live_bytes;
}

long cudasim_live_allocations(void)
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    return s.live_count;
}

const char *cudasim_last_report(void)
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.report_m);
    return s.last_report.c_str();
}

long cudasim_report_count(void)
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.report_m);
    return s.reports;
}

void cudasim_set_asan_guards(int on)
{
    state &s = S();
    std::lock_guard<std::mutex> lk(s.m);
    s.asan_guards = on != 0;
}

cudasim_stats cudasim_get_stats(void)
{
    cudasim_stats st;
    exec_get_stats(&st);
    return st;
}

} // extern "C"

extern "C" void cudasim_reset(void)
{
    state &s = S();
    {
        std::lock_guard<std::mutex> lk(s.m);
        while (!s.allocs.empty())
            free_allocation(s, s.allocs.begin());
        for (CUstream_st *p : s.streams)
            delete p;
        s.streams.clear();
        for (CUevent_st *p : s.events)
            delete p;
        s.events.clear();
        for (CUgraph_st *p : s.graphs)
            delete p;
        s.graphs.clear();
        for (CUgraphExec_st *p : s.execs)
            delete p;
        s.execs.clear();
        s.funcs.clear();
        for (auto &d : s.devices) {
            d->sticky = 0;
            d->used = 0;
        }
        s.asan_guards = true;
    }
    {
        std::lock_guard<std::mutex> lk(s.report_m);
        s.last_report.clear();
        s.reports = 0;
    }
    cublas_reset();
    nccl_reset();
    g_global_captures = 0;
    t_captures = 0;
    t_last = cudaSuccess;
    t_device = 0;
    env();
    load_all();
    exec_reset_stats();
}
