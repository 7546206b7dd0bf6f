/*
 * exec.cc - cudasim's executor: runs a kernel launch's blocks on OS
 * threads, each CUDA thread of a block as a fiber (Boost.Context fcontext).
 *
 * TEST DOUBLE (cudasim.h has the model). The parts:
 *
 *   - A pool of CUDASIM_THREADS OS threads, the launching thread being one:
 *     blocks are taken from an atomic counter, one block at a time per OS
 *     thread, so a block's fibers never migrate and atomics between blocks
 *     are real.
 *   - Carriers: a fiber (pooled stack, guard page below) runs CUDA threads
 *     one after the other until one of them blocks at a sync point; only
 *     then is another carrier needed for the next thread. A kernel that
 *     never syncs costs one function call per CUDA thread and no switch.
 *   - Sync points put the thread to sleep and switch straight to the next
 *     runnable thread: first those a completed barrier or warp exchange
 *     released (queued in schedule order), then threads not yet started
 *     (in schedule order). When nothing can run and threads still wait, the
 *     block is deadlocked: that is reported, never a hang.
 *   - An error inside a kernel abandons its block (its fibers are dropped,
 *     their stacks reused) and no further block of the launch starts.
 *
 * Under AddressSanitizer every switch is announced with
 * __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber, and a
 * stack is unpoisoned before reuse when its fiber was abandoned mid-call.
 */
#include <boost/context/detail/fcontext.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <ctime>
#include <deque>
#include <mutex>
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
#include <sanitizer/common_interface_defs.h>
#define CUDASIM_NO_ASAN __attribute__((no_sanitize_address))
#else
#define CUDASIM_NO_ASAN
#endif

__thread cudasim_builtins cudasim_bi;

namespace cudasim {
namespace {

using boost::context::detail::fcontext_t;
using boost::context::detail::jump_fcontext;
using boost::context::detail::make_fcontext;
using boost::context::detail::transfer_t;

/* ---------------------------------------------------------------------- */
/* Per-OS-thread state                                                     */
/* ---------------------------------------------------------------------- */

enum : uint8_t { T_UNSTARTED, T_RUNNING, T_READY, T_BAR, T_WARP, T_DONE };

struct fiber;

/* One CUDA thread of the block being run. */
struct cthread {
    unsigned linear;        /* threadIdx is derived from it (tid_of) */
    uint8_t state;
    fiber *fib;             /* the carrier running it, once started */
    const char *file;       /* where it waits (barrier or warp operation) */
    int line;
    /* Its slot in the warp exchange. */
    int op;
    unsigned mask;
    int arg;
    int width;
    unsigned long long val, result;
};

struct warp_state {
    unsigned existing;      /* lanes that exist (a partial last warp has fewer) */
    unsigned pending;       /* lanes waiting in an exchange */
    unsigned exited;
};

struct fiber {
    fcontext_t ctx = nullptr;
    char *stack_lo = nullptr; /* lowest usable byte (the guard page is below) */
    size_t size = 0;
    void *fake = nullptr;   /* ASan's fake-stack handle while switched out */
    cthread *thr = nullptr;
    bool dirty = false;     /* abandoned mid-call: unpoison before reuse */
};

struct job;

struct worker {
    fiber main;             /* the OS thread's own stack */
    fiber *cur = nullptr;   /* the running fiber */
    std::vector<fiber *> free_fibers;
    std::vector<fiber *> all_fibers;

    /* The block being run. */
    const job *j = nullptr;
    bool in_block = false;
    bool aborted = false;
    cthread threads[MAX_THREADS];
    warp_state warps[MAX_THREADS / 32];
    unsigned short perm[MAX_THREADS]; /* start order (random schedule) */
    unsigned short rq[MAX_THREADS];   /* released threads, in run order */
    unsigned rq_head = 0, rq_tail = 0;
    int n = 0, next_start = 0, live = 0, exited = 0, arrived = 0;
    int first_exited = 0;
    const char *bar_file = nullptr;
    int bar_line = 0, bar_kind = 0, bar_acc = 0, bar_result = 0;
    int sched = CUDASIM_SCHEDULE_FORWARD;
    uint64_t rng = 0;

    /* Shared memory: dynamic at the start, static after it. */
    char *arena = nullptr;
    size_t dyn = 0, static_top = 0;
    struct {
        const void *key;
        void *p;
    } statics[64];
    int nstatic = 0;
    size_t static_max = 0;

    /* Counters, added to the globals after each launch. */
    long long n_blocks = 0, n_threads = 0, n_switches = 0, n_fibers = 0;
};

struct job {
    launch_desc d;
    long nblocks = 0;
    int sched = 0;
    uint64_t seed = 0;
    uint64_t launch_no = 0;
    std::atomic<long> next{0};
    std::atomic<int> error{0};      /* first error found, cudaError_t */
    std::atomic<bool> sticky{false};
    std::atomic<size_t> static_max{0};
    int helpers = 0;                /* pool threads inside (under pool.m) */
    const std::function<void(long)> *host = nullptr; /* host work, no fibers */
};

thread_local worker *tls_worker;

/* Frees a thread's worker when the thread ends: the threads that launch
 * kernels (an engine thread, a test's threads) run blocks too and may come
 * and go, and their fiber stacks must not outlive them (LeakSanitizer
 * reports them at exit otherwise). Pool threads never end. */
struct worker_owner {
    worker *w = nullptr;
    ~worker_owner();
};
thread_local worker_owner tls_owner;

std::atomic<int> g_sched{CUDASIM_SCHEDULE_FORWARD};
std::atomic<unsigned long long> g_seed{0};
std::atomic<unsigned long long> g_launch_no{0};
std::atomic<long long> g_launches{0}, g_blocks{0}, g_threads{0}, g_switches{0},
    g_fibers{0};

worker *get_worker()
{
    worker *w = tls_worker;
    if (!w) {
        /* Lives as long as its thread; pool threads never end. */
        w = new worker;
        w->arena = static_cast<char *>(aligned_alloc(128, SMEM_OPTIN + 4096));
        tls_worker = w;
        tls_owner.w = w;
    }
    return w;
}

worker_owner::~worker_owner()
{
    if (!w)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (fiber *f : w->all_fibers) {
#ifdef CUDASIM_ASAN
        /* The next mapping at these addresses must not inherit poison. */
        __asan_unpoison_memory_region(f->stack_lo, f->size);
#endif
        munmap(f->stack_lo - page, f->size + page);
        delete f;
    }
    free(w->arena);
    delete w;
    tls_worker = nullptr;
    w = nullptr;
}

uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------------- */
/* Fibers                                                                  */
/* ---------------------------------------------------------------------- */

void carrier_entry(transfer_t t);

fiber *new_fiber(worker *w)
{
    if (!w->free_fibers.empty()) {
        fiber *f = w->free_fibers.back();
        w->free_fibers.pop_back();
        return f;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = (env().stack_bytes + page - 1) / page * page;
    void *m = mmap(nullptr, size + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "cudasim: cannot map a %zu-byte fiber stack\n", size);
        abort();
    }
    mprotect(m, page, PROT_NONE); /* overflow faults instead of corrupting */
    fiber *f = new fiber;
    f->stack_lo = static_cast<char *>(m) + page;
    f->size = size;
    w->all_fibers.push_back(f);
    w->n_fibers++;
    return f;
}

/* Gives carrier f a fresh context that starts thread t. */
void start_on(worker *w, fiber *f, cthread *t)
{
#ifdef CUDASIM_ASAN
    if (f->dirty)
        __asan_unpoison_memory_region(f->stack_lo, f->size);
#endif
    f->dirty = false;
    f->fake = nullptr;
    f->ctx = make_fcontext(f->stack_lo + f->size, f->size, carrier_entry);
    f->thr = t;
    t->fib = f;
}

CUDASIM_NO_ASAN inline void landed(worker *w, transfer_t tr)
{
#ifdef CUDASIM_ASAN
    const void *bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(w->cur->fake, &bottom, &size);
    if (tr.data == &w->main && w->main.size == 0) {
        w->main.stack_lo = static_cast<char *>(const_cast<void *>(bottom));
        w->main.size = size;
    }
#endif
    if (tr.data)
        static_cast<fiber *>(tr.data)->ctx = tr.fctx;
}

/* Switches from the running fiber to `to`. A dying fiber (its thread is
 * finished or abandoned) passes dying: nothing will resume it. */
CUDASIM_NO_ASAN inline void switch_to(worker *w, fiber *to, bool dying)
{
    fiber *from = w->cur;
    w->n_switches++;
    w->cur = to;
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &from->fake, to->stack_lo, to->size);
#endif
    transfer_t tr = jump_fcontext(to->ctx, dying ? nullptr : from);
    landed(w, tr);
}

inline uint3 tid_of(unsigned l)
{
    const uint3 &b = cudasim_bi.bdim;
    if (b.y == 1 && b.z == 1)
        return make_uint3(l, 0, 0);
    return make_uint3(l % b.x, (l / b.x) % b.y, l / (b.x * b.y));
}

inline void set_builtins(const cthread *t)
{
    cudasim_bi.tid = tid_of(t->linear);
    cudasim_bi.linear = t->linear;
}

/* ---------------------------------------------------------------------- */
/* Scheduling                                                              */
/* ---------------------------------------------------------------------- */

/* The next thread to run: released ones first, then unstarted ones, in
 * schedule order; nullptr when none. A returned thread is T_RUNNING; an
 * unstarted one has no fiber yet. */
inline cthread *pick_next(worker *w)
{
    if (w->rq_head != w->rq_tail) {
        cthread *t = &w->threads[w->rq[w->rq_head++ % MAX_THREADS]];
        t->state = T_RUNNING;
        return t;
    }
    if (w->next_start >= w->n)
        return nullptr;
    int i = w->next_start++;
    unsigned l = w->sched == CUDASIM_SCHEDULE_FORWARD   ? (unsigned)i
                 : w->sched == CUDASIM_SCHEDULE_REVERSE ? (unsigned)(w->n - 1 - i)
                                                        : w->perm[i];
    cthread *t = &w->threads[l];
    t->linear = l;
    t->state = T_RUNNING;
    t->fib = nullptr;
    return t;
}

inline void release(worker *w, unsigned l)
{
    w->threads[l].state = T_READY;
    w->rq[w->rq_tail++ % MAX_THREADS] = (unsigned short)l;
}

/* Queues threads first..first+count-1 (those matching `bits` if bits is not
 * all ones, bit i for thread first+i) in schedule order. */
void release_range(worker *w, unsigned first, unsigned count, uint64_t bits)
{
    unsigned short idx[MAX_THREADS];
    unsigned k = 0;
    for (unsigned i = 0; i < count; i++)
        if (count > 64 || ((bits >> i) & 1))
            idx[k++] = (unsigned short)(first + i);
    if (w->sched == CUDASIM_SCHEDULE_REVERSE) {
        for (unsigned i = k; i-- > 0;)
            release(w, idx[i]);
        return;
    }
    if (w->sched == CUDASIM_SCHEDULE_RANDOM) {
        for (unsigned i = k; i > 1; i--) {
            unsigned r = (unsigned)(splitmix(&w->rng) % i);
            std::swap(idx[i - 1], idx[r]);
        }
    }
    for (unsigned i = 0; i < k; i++)
        release(w, idx[i]);
}

/* The running thread t sleeps (its state already says why) or yields;
 * returns when it runs again. */
void block_current(worker *w, cthread *t)
{
    cthread *n = pick_next(w);
    if (n == t)
        return;
    fiber *to;
    if (!n) {
        to = &w->main; /* nothing runnable: the block loop sees the deadlock */
    } else {
        if (!n->fib)
            start_on(w, new_fiber(w), n);
        set_builtins(n);
        to = n->fib;
    }
    switch_to(w, to, false);
    set_builtins(t);
}

/* ---------------------------------------------------------------------- */
/* Errors inside a kernel                                                  */
/* ---------------------------------------------------------------------- */

/* Reports "kernel K block (x,y,z): <text> -> error" and records the
 * launch's first error; the block is abandoned (w->aborted). */
void record_fail(worker *w, cudaError_t e, bool sticky, const char *text)
{
    const uint3 &b = cudasim_bi.bid;
    report("kernel %s block (%u,%u,%u): %s -> %s%s", w->j->d.name, b.x, b.y, b.z, text,
           cudaGetErrorName(e), sticky ? " (sticky)" : "");
    job *j = const_cast<job *>(w->j);
    int expected = 0;
    if (j->error.compare_exchange_strong(expected, (int)e))
        j->sticky.store(sticky);
    w->aborted = true;
}

/* Leaves the running thread's fiber for good: control goes back to the
 * block loop. */
[[noreturn]] void abandon(worker *w)
{
    fiber *f = w->cur;
    f->dirty = true;
    f->thr->fib = nullptr;
    f->thr->state = T_DONE;
    w->free_fibers.push_back(f);
    switch_to(w, &w->main, true);
    __builtin_unreachable();
}

[[noreturn]] void fail_block(worker *w, cudaError_t e, bool sticky, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

[[noreturn]] void fail_block(worker *w, cudaError_t e, bool sticky, const char *fmt, ...)
{
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    record_fail(w, e, sticky, text);
    abandon(w);
}

const char *op_name(int op)
{
    switch (op) {
    case CUDASIM_SYNCWARP: return "__syncwarp";
    case CUDASIM_SHFL_IDX: return "__shfl_sync";
    case CUDASIM_SHFL_UP: return "__shfl_up_sync";
    case CUDASIM_SHFL_DOWN: return "__shfl_down_sync";
    case CUDASIM_SHFL_XOR: return "__shfl_xor_sync";
    case CUDASIM_BALLOT: return "__ballot_sync";
    case CUDASIM_ANY: return "__any_sync";
    case CUDASIM_ALL: return "__all_sync";
    case CUDASIM_MATCH_ANY: return "__match_any_sync";
    case CUDASIM_MATCH_ALL: return "__match_all_sync";
    case CUDASIM_MMA_S8_16832: return "mma.sync.m16n8k32.s8";
    case CUDASIM_LDMATRIX_X4: return "ldmatrix.x4";
    case CUDASIM_MMA_F16_16816: return "mma.sync.m16n8k16.f16";
    case CUDASIM_MMA_BF16_16816: return "mma.sync.m16n8k16.bf16";
    default: return "__reduce_*_sync";
    }
}

/* "thread (x,y,z)" */
struct tname {
    char s[48];
    explicit tname(const cthread &t)
    {
        uint3 i = tid_of(t.linear);
        snprintf(s, sizeof s, "thread (%u,%u,%u)", i.x, i.y, i.z);
    }
};

/* What thread t is doing, for "... never arrived (it waits at ...)". */
void describe(const cthread &t, char *out, size_t n)
{
    switch (t.state) {
    case T_DONE: snprintf(out, n, "it exited"); break;
    case T_BAR:
        snprintf(out, n, "it waits at barrier at %s:%d", short_path(t.file), t.line);
        break;
    case T_WARP:
        snprintf(out, n, "it waits at %s at %s:%d with mask 0x%08x", op_name(t.op),
                 short_path(t.file), t.line, t.mask);
        break;
    default: snprintf(out, n, "it is not waiting"); break;
    }
}

/* "__shfl_sync at f.cu:12, thread (3,0,0) (warp 0 lane 3): <text>" */
void warp_fail_text(char *out, size_t n, const cthread &t, const char *fmt, va_list ap)
{
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    snprintf(out, n, "%s at %s:%d, %s (warp %u lane %u): %s", op_name(t.op), short_path(t.file),
             t.line, tname(t).s, t.linear / 32, t.linear % 32, text);
}

[[noreturn]] void fail_warp(worker *w, const cthread &t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

[[noreturn]] void fail_warp(worker *w, const cthread &t, const char *fmt, ...)
{
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    warp_fail_text(text, sizeof text, t, fmt, ap);
    va_end(ap);
    record_fail(w, cudaErrorIllegalInstruction, true, text);
    abandon(w);
}

void record_warp(worker *w, const cthread &t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void record_warp(worker *w, const cthread &t, const char *fmt, ...)
{
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    warp_fail_text(text, sizeof text, t, fmt, ap);
    va_end(ap);
    record_fail(w, cudaErrorIllegalInstruction, true, text);
}

/* Nothing can run, threads still wait (called on the block loop's stack):
 * names one lane that never arrives. */
void fail_deadlock(worker *w)
{
    char what[256];
    for (int i = 0; i < w->n; i++) {
        const cthread &t = w->threads[i];
        if (t.state != T_WARP)
            continue;
        const warp_state &ws = w->warps[i / 32];
        unsigned missing = t.mask & ws.existing & ~ws.pending;
        if (missing) {
            int l = __builtin_ctz(missing);
            describe(w->threads[(i & ~31) + l], what, sizeof what);
            record_warp(w, t, "lane %d of mask 0x%08x never arrived (%s)", l, t.mask, what);
        } else {
            record_warp(w, t, "the lanes of mask 0x%08x wait at different operations", t.mask);
        }
        return;
    }
    char text[128];
    snprintf(text, sizeof text, "deadlock: %d threads wait and none can run", w->live);
    record_fail(w, cudaErrorLaunchFailure, true, text);
}

/* ---------------------------------------------------------------------- */
/* Threads                                                                 */
/* ---------------------------------------------------------------------- */

void thread_exited(worker *w, cthread *t)
{
    t->state = T_DONE;
    w->live--;
    if (w->exited++ == 0)
        w->first_exited = (int)t->linear;
    warp_state &ws = w->warps[t->linear / 32];
    unsigned me = 1u << (t->linear % 32);
    ws.exited |= me;
    if (w->arrived)
        fail_block(w, cudaErrorLaunchFailure, true,
                   "barrier at %s:%d not reached by %s: it exited", short_path(w->bar_file),
                   w->bar_line, tname(*t).s);
    if (ws.pending) {
        for (int l = 0; l < 32; l++) {
            const cthread &u = w->threads[(t->linear & ~31u) + l];
            if (((ws.pending >> l) & 1) && (u.mask & me))
                fail_warp(w, u, "lane %u of mask 0x%08x exited", t->linear % 32, u.mask);
        }
    }
}

/* A carrier's body: runs threads until one blocks (then another carrier
 * takes the next) or none is left; never returns. */
CUDASIM_NO_ASAN void carrier_entry(transfer_t tr)
{
    worker *w = tls_worker;
    landed(w, tr);
    fiber *self = w->cur;
    closure *fn = w->j->d.fn;
    for (;;) {
        cthread *t = self->thr;
        set_builtins(t);
        w->n_threads++;
        fn->run();
        thread_exited(w, t);
        cthread *n = pick_next(w);
        if (n && !n->fib) {
            self->thr = n;
            n->fib = self;
            continue;
        }
        w->free_fibers.push_back(self);
        fiber *to = &w->main;
        if (n) {
            set_builtins(n);
            to = n->fib;
        }
        switch_to(w, to, true);
    }
}

/* ---------------------------------------------------------------------- */
/* Blocks and launches                                                     */
/* ---------------------------------------------------------------------- */

void run_block(worker *w, const job *j, long b)
{
    const launch_desc &d = j->d;
    cudasim_bi.bid = make_uint3((unsigned)(b % d.grid.x), (unsigned)((b / d.grid.x) % d.grid.y),
                                (unsigned)(b / ((long)d.grid.x * d.grid.y)));
    cudasim_bi.bdim = make_uint3(d.block.x, d.block.y, d.block.z);
    cudasim_bi.gdim = make_uint3(d.grid.x, d.grid.y, d.grid.z);
    w->j = j;
    w->n = (int)(d.block.x * d.block.y * d.block.z);
    w->next_start = 0;
    w->live = w->n;
    w->exited = w->arrived = 0;
    w->rq_head = w->rq_tail = 0;
    w->aborted = false;
    w->sched = j->sched;
    w->rng = j->seed ^ (j->launch_no * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)b * 0xc2b2ae3d27d4eb4full);
    for (int i = 0; i * 32 < w->n; i++) {
        int lanes = w->n - i * 32;
        w->warps[i].existing = lanes >= 32 ? 0xffffffffu : (1u << lanes) - 1;
        w->warps[i].pending = w->warps[i].exited = 0;
    }
    if (w->sched == CUDASIM_SCHEDULE_RANDOM) {
        for (int i = 0; i < w->n; i++)
            w->perm[i] = (unsigned short)i;
        for (int i = w->n; i > 1; i--)
            std::swap(w->perm[i - 1], w->perm[splitmix(&w->rng) % (unsigned)i]);
    }
    w->dyn = d.smem_dynamic;
    memset(w->arena, 0xff, w->dyn);
    w->static_top = (w->dyn + 15) & ~(size_t)15;
    w->nstatic = 0;
    w->n_blocks++;

    w->in_block = true;
    w->cur = &w->main;
    cthread *t = pick_next(w);
    start_on(w, new_fiber(w), t);
    set_builtins(t);
    switch_to(w, t->fib, false);
    if (!w->aborted && w->live > 0)
        fail_deadlock(w);
    if (w->aborted) {
        /* Drop the fibers of threads that will never resume. */
        for (int i = 0; i < w->next_start; i++) {
            cthread &u = w->threads[w->sched == CUDASIM_SCHEDULE_FORWARD   ? i
                                    : w->sched == CUDASIM_SCHEDULE_REVERSE ? w->n - 1 - i
                                                                           : w->perm[i]];
            if (u.state != T_DONE && u.fib) {
                u.fib->dirty = true;
                w->free_fibers.push_back(u.fib);
                u.fib = nullptr;
                u.state = T_DONE;
            }
        }
    }
    w->in_block = false;
}

void run_blocks(worker *w, job *j)
{
    if (j->host) {
        for (long b; (b = j->next.fetch_add(1)) < j->nblocks;)
            (*j->host)(b);
        return;
    }
    for (;;) {
        if (j->error.load(std::memory_order_relaxed))
            break;
        long b = j->next.fetch_add(1, std::memory_order_relaxed);
        if (b >= j->nblocks)
            break;
        w->static_max = 0;
        run_block(w, j, b);
        size_t m = j->static_max.load(std::memory_order_relaxed);
        while (w->static_max > m && !j->static_max.compare_exchange_weak(m, w->static_max)) {
        }
    }
    g_blocks += w->n_blocks;
    g_threads += w->n_threads;
    g_switches += w->n_switches;
    g_fibers += w->n_fibers;
    w->n_blocks = w->n_threads = w->n_switches = w->n_fibers = 0;
}

/* The pool of helper OS threads: they join whatever job is posted. */
struct pool_state {
    std::mutex m;
    std::condition_variable work, done;
    std::deque<job *> jobs;
    int started = 0;
};
pool_state *g_pool = new pool_state; /* never destroyed: its threads outlive main */

void helper_main()
{
    worker *w = get_worker();
    std::unique_lock<std::mutex> lk(g_pool->m);
    for (;;) {
        g_pool->work.wait(lk, [] { return !g_pool->jobs.empty(); });
        job *j = g_pool->jobs.front();
        j->helpers++;
        lk.unlock();
        run_blocks(w, j);
        lk.lock();
        if (--j->helpers == 0)
            g_pool->done.notify_all();
        /* The job's blocks are all taken: let the next job be seen. */
        if (!g_pool->jobs.empty() && g_pool->jobs.front() == j)
            g_pool->jobs.pop_front();
    }
}

void ensure_helpers(int want)
{
    std::lock_guard<std::mutex> lk(g_pool->m);
    while (g_pool->started < want) {
        std::thread(helper_main).detach();
        g_pool->started++;
    }
}

void run_job(job *j)
{
    worker *w = get_worker();
    if (w->in_block) {
        fprintf(stderr, "cudasim: %s started inside a kernel: not supported\n", j->d.name);
        abort();
    }
    int helpers = env().threads - 1;
    bool posted = j->nblocks > 1 && helpers > 0;
    if (posted) {
        ensure_helpers(helpers);
        std::lock_guard<std::mutex> lk(g_pool->m);
        g_pool->jobs.push_back(j);
        g_pool->work.notify_all();
    }
    run_blocks(w, j);
    if (posted) {
        std::unique_lock<std::mutex> lk(g_pool->m);
        for (auto it = g_pool->jobs.begin(); it != g_pool->jobs.end(); ++it) {
            if (*it == j) {
                g_pool->jobs.erase(it);
                break;
            }
        }
        g_pool->done.wait(lk, [j] { return j->helpers == 0; });
    }
}

} // namespace

/* ---------------------------------------------------------------------- */
/* Entry points                                                            */
/* ---------------------------------------------------------------------- */

launch_outcome exec_launch(const launch_desc &d)
{
    job j;
    j.d = d;
    j.nblocks = (long)d.grid.x * d.grid.y * d.grid.z;
    j.sched = g_sched.load();
    j.seed = g_seed.load();
    j.launch_no = g_launch_no.fetch_add(1);
    run_job(&j);
    g_launches++;
    launch_outcome o;
    o.error = (cudaError_t)j.error.load();
    o.sticky = j.sticky.load();
    o.smem_static = j.static_max.load();
    return o;
}

void exec_set_schedule(int kind, unsigned long long seed)
{
    g_sched = kind;
    g_seed = seed;
}

int exec_get_schedule(unsigned long long *seed)
{
    if (seed)
        *seed = g_seed.load();
    return g_sched.load();
}

void exec_get_stats(cudasim_stats *s)
{
    s->launches = g_launches;
    s->blocks = g_blocks;
    s->threads = g_threads;
    s->switches = g_switches;
    s->fibers = g_fibers;
}

void exec_reset_stats(void)
{
    g_launches = g_blocks = g_threads = g_switches = g_fibers = 0;
    g_launch_no = 0;
}

void exec_parallel_for(long n, const std::function<void(long)> &fn)
{
    job j;
    j.nblocks = n;
    j.host = &fn;
    j.d.name = "host work";
    run_job(&j);
}

} // namespace cudasim

/* ---------------------------------------------------------------------- */
/* Device functions (cudasim.h)                                            */
/* ---------------------------------------------------------------------- */

using namespace cudasim;

static worker *kernel_worker(const char *what)
{
    worker *w = tls_worker;
    if (!w || !w->in_block) {
        fprintf(stderr, "cudasim: %s called outside a kernel\n", what);
        abort();
    }
    return w;
}

void *cudasim_shared_dynamic(void) { return kernel_worker("dynamic shared memory")->arena; }

void *cudasim_shared_static(const void *key, size_t bytes, size_t align)
{
    worker *w = kernel_worker("CINFER_SHARED");
    for (int i = 0; i < w->nstatic; i++)
        if (w->statics[i].key == key)
            return w->statics[i].p;
    if (align < 16)
        align = 16;
    size_t off = (w->static_top + align - 1) & ~(align - 1);
    size_t used = off + bytes - w->dyn;
    if (used > w->j->d.smem_static_limit || w->nstatic == 64)
        fail_block(w, cudaErrorInvalidValue, false,
                   "static shared memory: %zu bytes with %zu dynamic exceed the limit "
                   "(48 KB static, 227 KB in all); the kernel's size is known from now on",
                   used, w->dyn);
    void *p = w->arena + off;
    memset(p, 0xff, bytes);
    w->static_top = off + bytes;
    if (used > w->static_max)
        w->static_max = used;
    w->statics[w->nstatic].key = key;
    w->statics[w->nstatic].p = p;
    w->nstatic++;
    return p;
}

int cudasim_barrier(int kind, int pred, const char *file, int line)
{
    worker *w = kernel_worker("__syncthreads");
    cthread *t = w->cur->thr;
    if (w->exited)
        fail_block(w, cudaErrorLaunchFailure, true,
                   "barrier at %s:%d not reached by %s: it exited", short_path(file), line,
                   tname(w->threads[w->first_exited]).s);
    if (w->arrived == 0) {
        w->bar_file = file;
        w->bar_line = line;
        w->bar_kind = kind;
        w->bar_acc = kind == CUDASIM_BAR_AND ? 1 : 0;
    } else if (line != w->bar_line || (file != w->bar_file && strcmp(file, w->bar_file) != 0)) {
        fail_block(w, cudaErrorLaunchFailure, true,
                   "barrier at %s:%d not reached by %s: it waits at barrier at %s:%d",
                   short_path(w->bar_file), w->bar_line, tname(*t).s, short_path(file), line);
    }
    switch (kind) {
    case CUDASIM_BAR_COUNT: w->bar_acc += pred != 0; break;
    case CUDASIM_BAR_AND: w->bar_acc &= pred != 0; break;
    case CUDASIM_BAR_OR: w->bar_acc |= pred != 0; break;
    default: break;
    }
    t->file = file;
    t->line = line;
    t->state = T_BAR;
    if (++w->arrived == w->live) {
        w->bar_result = w->bar_acc;
        w->arrived = 0;
        release_range(w, 0, (unsigned)w->n, ~0ull);
    }
    block_current(w, t);
    return w->bar_result;
}

unsigned cudasim_activemask(void)
{
    worker *w = kernel_worker("__activemask");
    const warp_state &ws = w->warps[cudasim_bi.linear / 32];
    return ws.existing & ~ws.exited;
}

void cudasim_trap(const char *file, int line)
{
    worker *w = kernel_worker("__trap");
    fail_block(w, cudaErrorLaunchFailure, true, "__trap() at %s:%d by %s", short_path(file), line,
               tname(*w->cur->thr).s);
}

long long cudasim_clock64(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Source lane of a shuffle, as PTX shfl.sync computes it: c packs the
 * segment mask (32 - width) and the clamp (31, or 0 for up). */
static unsigned shfl_source(int op, unsigned lane, int arg, int width)
{
    unsigned segmask = (unsigned)(32 - width) & 31;
    unsigned clamp = op == CUDASIM_SHFL_UP ? 0 : 31;
    unsigned b = (unsigned)arg & 31;
    unsigned max_lane = (lane & segmask) | (clamp & ~segmask);
    unsigned min_lane = lane & segmask;
    int j;
    bool ok;
    switch (op) {
    case CUDASIM_SHFL_UP:
        j = (int)lane - (int)b;
        ok = j >= (int)max_lane;
        break;
    case CUDASIM_SHFL_DOWN:
        j = (int)(lane + b);
        ok = j <= (int)max_lane;
        break;
    case CUDASIM_SHFL_XOR:
        j = (int)(lane ^ b);
        ok = j <= (int)max_lane;
        break;
    default:
        j = (int)(min_lane | (b & ~segmask));
        ok = j <= (int)max_lane;
        break;
    }
    return ok ? (unsigned)j : lane;
}

/* Every lane of `need` has deposited: check they agree, compute each
 * lane's result and release them. */
/* What a lane of mma.sync / ldmatrix deposits (cudasim_mma_s8_16832 and
 * cudasim_ldmatrix_x4 below): the exchange's value is its address. */
struct mma_frag {
    unsigned a[4], b[2];
    int *d;
};
struct ldm_frag {
    const char *row;
    unsigned *r;
};
struct mmaf_frag {
    unsigned a[4], b[2];
    float *d;
};

/* A 16-bit float (IEEE half, or bfloat16: the top half of an f32) as f32. */
static float half_bits(uint16_t h, bool bf16)
{
    if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
    const float v = e == 0    ? ldexpf((float)m, -24)
                    : e == 31 ? (m ? NAN : INFINITY)
                              : ldexpf((float)(m | 1024u), (int)e - 25);
    return (h >> 15) ? -v : v;
}

/* mma.sync m16n8k16 .row.col .f32 .f16/.bf16 for the warp (PTX ISA
 * fragment layouts; kernels/cuda/mma.cuh): lane l = 4 gid + tid holds
 * A[gid][2 tid, 2 tid + 1], A[gid + 8][2 tid ..], A[gid][8 + 2 tid ..],
 * A[gid + 8][8 + 2 tid ..] (the lower k in the low half of each
 * register); B[2 tid ..][gid], B[8 + 2 tid ..][gid]; D as for m16n8k32. */
static void exchange_mma_f(const cthread *lanes, bool bf16)
{
    float A[16][16], B[8][16]; /* B by column: B[n][k] */
    for (unsigned l = 0; l < 32; l++) {
        const mmaf_frag *f = reinterpret_cast<const mmaf_frag *>((uintptr_t)lanes[l].val);
        unsigned gid = l / 4, tid = l % 4;
        for (int e = 0; e < 2; e++) {
            A[gid][2 * tid + e] = half_bits((uint16_t)(f->a[0] >> (16 * e)), bf16);
            A[gid + 8][2 * tid + e] = half_bits((uint16_t)(f->a[1] >> (16 * e)), bf16);
            A[gid][8 + 2 * tid + e] = half_bits((uint16_t)(f->a[2] >> (16 * e)), bf16);
            A[gid + 8][8 + 2 * tid + e] = half_bits((uint16_t)(f->a[3] >> (16 * e)), bf16);
            B[gid][2 * tid + e] = half_bits((uint16_t)(f->b[0] >> (16 * e)), bf16);
            B[gid][8 + 2 * tid + e] = half_bits((uint16_t)(f->b[1] >> (16 * e)), bf16);
        }
    }
    for (unsigned l = 0; l < 32; l++) {
        const mmaf_frag *f = reinterpret_cast<const mmaf_frag *>((uintptr_t)lanes[l].val);
        unsigned gid = l / 4, tid = l % 4;
        for (int e = 0; e < 4; e++) {
            unsigned m = gid + 8 * (e >> 1), n = 2 * tid + (e & 1);
            float acc = f->d[e];
            for (int k = 0; k < 16; k++)
                acc = fmaf(A[m][k], B[n][k], acc);
            f->d[e] = acc;
        }
    }
}

/* mma.sync m16n8k32 .row.col .s8.s8.s32 for the warp, from the PTX ISA's
 * fragment layouts (kernels/cuda/mma.cuh): lane l = 4 gid + tid holds
 * A[gid][4 tid ..], A[gid + 8][4 tid ..], A[gid][16 + 4 tid ..],
 * A[gid + 8][16 + 4 tid ..]; B[4 tid ..][gid], B[16 + 4 tid ..][gid]; and
 * D[gid][2 tid], D[gid][2 tid + 1], D[gid + 8][2 tid], D[gid + 8][2 tid + 1]. */
static void exchange_mma(const cthread *lanes)
{
    int8_t A[16][32], B[8][32]; /* B by column: B[n][k] */
    for (unsigned l = 0; l < 32; l++) {
        const mma_frag *f = reinterpret_cast<const mma_frag *>((uintptr_t)lanes[l].val);
        unsigned gid = l / 4, tid = l % 4;
        for (int e = 0; e < 4; e++) {
            A[gid][4 * tid + e] = (int8_t)(f->a[0] >> (8 * e));
            A[gid + 8][4 * tid + e] = (int8_t)(f->a[1] >> (8 * e));
            A[gid][16 + 4 * tid + e] = (int8_t)(f->a[2] >> (8 * e));
            A[gid + 8][16 + 4 * tid + e] = (int8_t)(f->a[3] >> (8 * e));
            B[gid][4 * tid + e] = (int8_t)(f->b[0] >> (8 * e));
            B[gid][16 + 4 * tid + e] = (int8_t)(f->b[1] >> (8 * e));
        }
    }
    for (unsigned l = 0; l < 32; l++) {
        const mma_frag *f = reinterpret_cast<const mma_frag *>((uintptr_t)lanes[l].val);
        unsigned gid = l / 4, tid = l % 4;
        for (int e = 0; e < 4; e++) {
            unsigned m = gid + 8 * (e >> 1), n = 2 * tid + (e & 1);
            uint32_t acc = (uint32_t)f->d[e];
            for (int k = 0; k < 32; k++)
                acc += (uint32_t)((int)A[m][k] * (int)B[n][k]);
            f->d[e] = (int)acc;
        }
    }
}

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane 8 i + j names row j of
 * matrix i; lane l gets, in r[i], the 32-bit word l % 4 of row l / 4 of
 * matrix i. */
static void exchange_ldmatrix(worker *w, const cthread *lanes)
{
    size_t size = SMEM_OPTIN + 4096;
    for (unsigned l = 0; l < 32; l++) {
        const ldm_frag *f = reinterpret_cast<const ldm_frag *>((uintptr_t)lanes[l].val);
        uintptr_t p = (uintptr_t)f->row, lo = (uintptr_t)w->arena;
        if (p % 16 != 0 || p < lo || p + 16 > lo + size)
            fail_warp(w, lanes[l], "row address %p is not a 16-byte aligned row of shared "
                      "memory", (const void *)f->row);
    }
    for (unsigned l = 0; l < 32; l++) {
        const ldm_frag *f = reinterpret_cast<const ldm_frag *>((uintptr_t)lanes[l].val);
        for (int i = 0; i < 4; i++) {
            const ldm_frag *src = reinterpret_cast<const ldm_frag *>(
                (uintptr_t)lanes[8 * i + l / 4].val);
            memcpy(&f->r[i], src->row + 4 * (l % 4), 4);
        }
    }
}

static void complete_exchange(worker *w, unsigned warp, unsigned need, cthread *me)
{
    cthread *lanes = &w->threads[warp * 32];
    const warp_state &ws = w->warps[warp];
    for (unsigned l = 0; l < 32; l++) {
        if (!((need >> l) & 1))
            continue;
        const cthread &u = lanes[l];
        if (u.op != me->op || u.mask != me->mask || (u.op >= CUDASIM_SHFL_IDX && u.op <= CUDASIM_SHFL_XOR && u.width != me->width))
            fail_warp(w, *me, "lane %u calls %s at %s:%d with mask 0x%08x width %d, this lane mask 0x%08x width %d",
                      l, op_name(u.op), short_path(u.file), u.line, u.mask, u.width, me->mask, me->width);
    }
    int op = me->op;
    unsigned long long acc = 0;
    switch (op) {
    case CUDASIM_SHFL_IDX:
    case CUDASIM_SHFL_UP:
    case CUDASIM_SHFL_DOWN:
    case CUDASIM_SHFL_XOR:
        for (unsigned l = 0; l < 32; l++) {
            if (!((need >> l) & 1))
                continue;
            unsigned s = shfl_source(op, l, lanes[l].arg, lanes[l].width);
            if (!((need >> s) & 1))
                fail_warp(w, lanes[l], "source lane %u %s mask 0x%08x", s,
                          (ws.existing >> s) & 1 ? "is outside" : "does not exist in the block; mask",
                          lanes[l].mask);
            lanes[l].result = lanes[s].val;
        }
        break;
    case CUDASIM_BALLOT:
    case CUDASIM_ANY:
    case CUDASIM_ALL: {
        unsigned bits = 0;
        for (unsigned l = 0; l < 32; l++)
            if (((need >> l) & 1) && lanes[l].val)
                bits |= 1u << l;
        acc = op == CUDASIM_BALLOT ? bits : op == CUDASIM_ANY ? bits != 0 : bits == need;
        break;
    }
    case CUDASIM_MATCH_ANY:
        for (unsigned l = 0; l < 32; l++) {
            if (!((need >> l) & 1))
                continue;
            unsigned bits = 0;
            for (unsigned k = 0; k < 32; k++)
                if (((need >> k) & 1) && lanes[k].val == lanes[l].val)
                    bits |= 1u << k;
            lanes[l].result = bits;
        }
        break;
    case CUDASIM_MATCH_ALL: {
        bool all = true;
        for (unsigned l = 0; l < 32; l++)
            if (((need >> l) & 1) && lanes[l].val != me->val)
                all = false;
        acc = all ? (need | (1ull << 32)) : 0;
        break;
    }
    case CUDASIM_MMA_S8_16832:
    case CUDASIM_LDMATRIX_X4:
    case CUDASIM_MMA_F16_16816:
    case CUDASIM_MMA_BF16_16816:
        if (need != 0xffffffffu)
            fail_warp(w, *me, "needs all 32 lanes of the warp, mask 0x%08x (existing 0x%08x)",
                      me->mask, ws.existing);
        if (op == CUDASIM_MMA_S8_16832)
            exchange_mma(lanes);
        else if (op == CUDASIM_LDMATRIX_X4)
            exchange_ldmatrix(w, lanes);
        else
            exchange_mma_f(lanes, op == CUDASIM_MMA_BF16_16816);
        break;
    case CUDASIM_SYNCWARP: break;
    default: { /* __reduce_*_sync over 32-bit values */
        bool first = true;
        uint32_t r = 0;
        for (unsigned l = 0; l < 32; l++) {
            if (!((need >> l) & 1))
                continue;
            uint32_t v = (uint32_t)lanes[l].val;
            if (first) {
                r = v;
                first = false;
                continue;
            }
            switch (op) {
            case CUDASIM_REDUCE_ADD: r += v; break;
            case CUDASIM_REDUCE_MIN: r = (int32_t)v < (int32_t)r ? v : r; break;
            case CUDASIM_REDUCE_MAX: r = (int32_t)v > (int32_t)r ? v : r; break;
            case CUDASIM_REDUCE_MIN_U: r = v < r ? v : r; break;
            case CUDASIM_REDUCE_MAX_U: r = v > r ? v : r; break;
            case CUDASIM_REDUCE_AND: r &= v; break;
            case CUDASIM_REDUCE_OR: r |= v; break;
            default: r ^= v; break;
            }
        }
        acc = r;
        break;
    }
    }
    bool per_lane = (op >= CUDASIM_SHFL_IDX && op <= CUDASIM_SHFL_XOR) || op == CUDASIM_MATCH_ANY;
    if (!per_lane)
        for (unsigned l = 0; l < 32; l++)
            if ((need >> l) & 1)
                lanes[l].result = acc;
    w->warps[warp].pending &= ~need;
    release_range(w, warp * 32, 32, need);
}

unsigned long long cudasim_warp(int op, unsigned mask, unsigned long long value, int arg,
                                int width, const char *file, int line)
{
    worker *w = kernel_worker("a warp intrinsic");
    cthread *t = w->cur->thr;
    unsigned warp = t->linear / 32, lane = t->linear % 32, me = 1u << lane;
    warp_state &ws = w->warps[warp];
    t->op = op;
    t->mask = mask;
    t->arg = arg;
    t->width = width;
    t->val = value;
    t->file = file;
    t->line = line;
    if (!(mask & me))
        fail_warp(w, *t, "mask 0x%08x leaves out the calling lane %u", mask, lane);
    if (op >= CUDASIM_SHFL_IDX && op <= CUDASIM_SHFL_XOR &&
        (width < 1 || width > 32 || (width & (width - 1))))
        fail_warp(w, *t, "width %d is not a power of two up to 32", width);
    unsigned need = mask & ws.existing;
    if (need & ws.exited)
        fail_warp(w, *t, "lane %d of mask 0x%08x exited", __builtin_ctz(need & ws.exited), mask);
    ws.pending |= me;
    if ((ws.pending & need) == need) {
        complete_exchange(w, warp, need, t);
        t->state = T_READY;
    } else {
        t->state = T_WARP;
    }
    block_current(w, t);
    return t->result;
}

void cudasim_mma_s8_16832(int d[4], const unsigned a[4], const unsigned b[2], const char *file,
                          int line)
{
    mma_frag f = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}, d};
    cudasim_warp(CUDASIM_MMA_S8_16832, 0xffffffffu, (unsigned long long)(uintptr_t)&f, 0, 32,
                 file, line);
}

void cudasim_mma_f_16816(int bf16, float d[4], const unsigned a[4], const unsigned b[2],
                         const char *file, int line)
{
    mmaf_frag f = {{a[0], a[1], a[2], a[3]}, {b[0], b[1]}, d};
    cudasim_warp(bf16 ? CUDASIM_MMA_BF16_16816 : CUDASIM_MMA_F16_16816, 0xffffffffu,
                 (unsigned long long)(uintptr_t)&f, 0, 32, file, line);
}

void cudasim_ldmatrix_x4(unsigned r[4], const void *row, const char *file, int line)
{
    ldm_frag f = {static_cast<const char *>(row), r};
    cudasim_warp(CUDASIM_LDMATRIX_X4, 0xffffffffu, (unsigned long long)(uintptr_t)&f, 0, 32,
                 file, line);
}
