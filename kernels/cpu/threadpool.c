/*
 * threadpool.c - persistent workers, generation-counter dispatch.
 *
 * Protocol (all shared words are C11 atomics):
 *
 *   dispatch (caller)                      worker
 *   -----------------                      ------
 *   write job (fn, ctx, n_tasks)           wait until generation != seen
 *   remaining = n_threads - 1                (spin, then futex sleep)
 *   generation++        (release) ───────▶ load generation (acquire)
 *   wake sleepers if any                   read job, run its range
 *   run range 0                            remaining-- (release)
 *   wait remaining == 0 (acquire) ◀─────── the last one wakes the caller
 *
 * The job fields are plain memory: the caller writes them before the release
 * store of generation and rewrites them only after the acquire load that sees
 * remaining reach 0, so no worker can still be reading them.
 *
 * Sleeping without lost wake-ups: a worker increments n_sleeping and then
 * re-reads generation before it sleeps; the caller stores generation and then
 * reads n_sleeping. Both pairs are sequentially consistent, so either the
 * worker sees the new generation or the caller sees the sleeper and wakes it.
 * The futex wait itself rechecks the word, closing the last gap. The caller's
 * own wait for `remaining` uses the same scheme with caller_sleeping.
 */
#include "threadpool.h"

#include "common/thread_priority.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---------------------------------------------------------------------- */
/* wait / wake on a 32-bit word                                            */
/* ---------------------------------------------------------------------- */

typedef struct {
#ifndef __linux__
    pthread_mutex_t mu;
    pthread_cond_t cv;
#else
    int unused;
#endif
} waiter;

static int waiter_init(waiter *w)
{
#ifndef __linux__
    if (pthread_mutex_init(&w->mu, NULL) != 0)
        return -1;
    if (pthread_cond_init(&w->cv, NULL) != 0) {
        pthread_mutex_destroy(&w->mu);
        return -1;
    }
#else
    w->unused = 0;
#endif
    return 0;
}

static void waiter_cleanup(waiter *w)
{
#ifndef __linux__
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
#else
    (void)w;
#endif
}

/* Sleeps while *word == expected (may return spuriously). */
static void word_wait(waiter *w, _Atomic uint32_t *word, uint32_t expected)
{
#ifdef __linux__
    (void)w;
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL,
            NULL, 0);
#else
    pthread_mutex_lock(&w->mu);
    if (atomic_load(word) == expected)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
#endif
}

/* Wakes every thread sleeping on word (the word was changed before). */
static void word_wake_all(waiter *w, _Atomic uint32_t *word)
{
#ifdef __linux__
    (void)w;
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL,
            NULL, 0);
#else
    (void)word;
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
#endif
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------------- */
/* pool                                                                    */
/* ---------------------------------------------------------------------- */

typedef struct {
    cinfer_threadpool *pool;
    int index;
} worker_arg;

struct cinfer_threadpool {
    int n_threads;
    int64_t spin_ns;
    int prio;
    pthread_t *threads;
    worker_arg *args;
    int n_started;

    /* The job: written by the caller only while no worker runs. */
    cinfer_parallel_fn fn;
    void *ctx;
    int64_t n_tasks;

    alignas(64) _Atomic uint32_t generation; /* bumped per dispatch */
    _Atomic uint32_t n_sleeping;             /* workers in word_wait */
    _Atomic uint32_t stop;                   /* read after a generation bump */
    alignas(64) _Atomic uint32_t remaining;  /* workers yet to finish */
    _Atomic uint32_t caller_sleeping;
    alignas(64) waiter gen_waiter;
    waiter done_waiter;
};

cinfer_threadpool_params cinfer_threadpool_default_params(void)
{
    cinfer_threadpool_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 1;
    p.spin_us = 0;
    return p;
}

static void run_range(cinfer_threadpool *pool, int thread)
{
    int64_t n = pool->n_tasks;
    int64_t nt = pool->n_threads;
    int64_t t0 = n * thread / nt;
    int64_t t1 = n * (thread + 1) / nt;
    if (t0 < t1)
        pool->fn(pool->ctx, t0, t1, thread);
}

/* Waits until generation differs from `seen` and returns the new value. */
static uint32_t wait_generation(cinfer_threadpool *pool, uint32_t seen)
{
    uint32_t g;
    if (pool->spin_ns > 0) {
        int64_t deadline = 0;
        for (unsigned i = 1;; i++) {
            g = atomic_load_explicit(&pool->generation, memory_order_acquire);
            if (g != seen)
                return g;
            cpu_relax();
            if ((i & 63) == 0) {
                int64_t t = now_ns();
                if (deadline == 0)
                    deadline = t + pool->spin_ns;
                else if (t >= deadline)
                    break;
            }
        }
    }
    for (;;) {
        atomic_fetch_add(&pool->n_sleeping, 1);
        g = atomic_load(&pool->generation);
        if (g == seen)
            word_wait(&pool->gen_waiter, &pool->generation, seen);
        atomic_fetch_sub(&pool->n_sleeping, 1);
        g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen)
            return g;
    }
}

static void *worker_main(void *p)
{
    worker_arg *arg = p;
    cinfer_threadpool *pool = arg->pool;
    uint32_t seen = 0; /* the pool starts at generation 0 */
    /* A new thread starts at its creator's priority; the caller of
     * parallel_for sets its own. */
    cinfer_thread_set_priority((cinfer_thread_prio)pool->prio);
    for (;;) {
        seen = wait_generation(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
            break;
        run_range(pool, arg->index);
        if (atomic_fetch_sub(&pool->remaining, 1) == 1 &&
            atomic_load(&pool->caller_sleeping))
            word_wake_all(&pool->done_waiter, &pool->remaining);
    }
    return NULL;
}

/* Publishes the current job (or the stop request) to the workers. */
static void publish(cinfer_threadpool *pool)
{
    atomic_store_explicit(&pool->remaining, (uint32_t)(pool->n_started),
                          memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1); /* seq_cst: release + store */
    if (atomic_load(&pool->n_sleeping) > 0)
        word_wake_all(&pool->gen_waiter, &pool->generation);
}

static void wait_done(cinfer_threadpool *pool)
{
    if (pool->spin_ns > 0) {
        int64_t deadline = 0;
        for (unsigned i = 1;; i++) {
            if (atomic_load_explicit(&pool->remaining, memory_order_acquire) ==
                0)
                return;
            cpu_relax();
            if ((i & 63) == 0) {
                int64_t t = now_ns();
                if (deadline == 0)
                    deadline = t + pool->spin_ns;
                else if (t >= deadline)
                    break;
            }
        }
    }
    atomic_store(&pool->caller_sleeping, 1);
    for (;;) {
        uint32_t v = atomic_load(&pool->remaining);
        if (v == 0)
            break;
        word_wait(&pool->done_waiter, &pool->remaining, v);
    }
    atomic_store(&pool->caller_sleeping, 0);
    /* Pairs with the workers' release decrements. */
    (void)atomic_load_explicit(&pool->remaining, memory_order_acquire);
}

static void stop_workers(cinfer_threadpool *pool)
{
    if (pool->n_started == 0)
        return;
    atomic_store_explicit(&pool->stop, 1, memory_order_relaxed);
    publish(pool);
    for (int i = 0; i < pool->n_started; i++)
        pthread_join(pool->threads[i], NULL);
    pool->n_started = 0;
}

cinfer_status cinfer_threadpool_create(const cinfer_threadpool_params *p,
                                       cinfer_threadpool **out)
{
    if (!p || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "threadpool_create: params and out are "
                                "required");
    *out = NULL;
    int n = p->n_threads == 0 ? 1 : p->n_threads;
    if (n < 1 || n > 1024)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "threadpool_create: n_threads %d is outside "
                                "1..1024",
                                p->n_threads);

    cinfer_threadpool *pool;
    if (posix_memalign((void **)&pool, 64, sizeof *pool) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "threadpool_create: no memory");
    memset(pool, 0, sizeof *pool);
    pool->n_threads = n;
    pool->prio = p->prio;
    pool->spin_ns = p->spin_us == 0   ? 100000
                    : p->spin_us < 0 ? 0
                                     : (int64_t)p->spin_us * 1000;
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->stop, 0);
    atomic_init(&pool->remaining, 0);
    atomic_init(&pool->caller_sleeping, 0);

    cinfer_status st = CINFER_OK;
    if (waiter_init(&pool->gen_waiter) != 0) {
        st = cinfer_set_error(CINFER_E_INTERNAL,
                              "threadpool_create: waiter init failed");
        goto fail_pool;
    }
    if (waiter_init(&pool->done_waiter) != 0) {
        st = cinfer_set_error(CINFER_E_INTERNAL,
                              "threadpool_create: waiter init failed");
        goto fail_gen_waiter;
    }
    if (n > 1) {
        pool->threads = calloc((size_t)(n - 1), sizeof *pool->threads);
        pool->args = calloc((size_t)(n - 1), sizeof *pool->args);
        if (!pool->threads || !pool->args) {
            st = cinfer_set_error(CINFER_E_NOMEM,
                                  "threadpool_create: no memory");
            goto fail_threads;
        }
        for (int i = 0; i < n - 1; i++) {
            pool->args[i].pool = pool;
            pool->args[i].index = i + 1;
            int rc = pthread_create(&pool->threads[i], NULL, worker_main,
                                    &pool->args[i]);
            if (rc != 0) {
                st = cinfer_set_error(CINFER_E_INTERNAL,
                                      "threadpool_create: pthread_create: %s",
                                      strerror(rc));
                goto fail_threads;
            }
            pool->n_started++;
        }
    }
    *out = pool;
    return CINFER_OK;

fail_threads:
    stop_workers(pool);
    free(pool->args);
    free(pool->threads);
    waiter_cleanup(&pool->done_waiter);
fail_gen_waiter:
    waiter_cleanup(&pool->gen_waiter);
fail_pool:
    free(pool);
    return st;
}

void cinfer_threadpool_destroy(cinfer_threadpool *pool)
{
    if (!pool)
        return;
    stop_workers(pool);
    free(pool->args);
    free(pool->threads);
    waiter_cleanup(&pool->done_waiter);
    waiter_cleanup(&pool->gen_waiter);
    free(pool);
}

int cinfer_threadpool_n_threads(const cinfer_threadpool *pool)
{
    return pool->n_threads;
}

void cinfer_threadpool_parallel_for(cinfer_threadpool *pool, int64_t n_tasks,
                                    cinfer_parallel_fn fn, void *ctx)
{
    if (n_tasks <= 0)
        return;
    if (n_tasks == 1 || pool->n_threads == 1) {
        fn(ctx, 0, n_tasks, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    publish(pool);
    run_range(pool, 0);
    wait_done(pool);
}
