/*
 * threadpool.h - persistent worker threads with a fork-join parallel_for.
 *
 * The CPU backend runs a few hundred ops per decoded token, each split over
 * the same threads, so dispatch must cost microseconds, not a thread start.
 * The pool keeps n_threads - 1 workers alive; the calling thread is thread 0
 * and does its own share. A dispatch publishes the job and bumps a generation
 * counter; workers spin on that counter for a short while (spin_us) after
 * each job and then sleep in the kernel (futex on Linux), so an idle server
 * burns no CPU and a busy one pays no wake-up latency.
 *
 * The split is static: with T threads and n tasks, thread t runs the
 * contiguous range [n * t / T, n * (t + 1) / T). Which task lands on which
 * thread depends only on n and T, never on timing.
 *
 *     static void work(void *ctx, int64_t t0, int64_t t1, int thread)
 *     {
 *         for (int64_t i = t0; i < t1; i++) ...
 *     }
 *     cinfer_threadpool_params p = cinfer_threadpool_default_params();
 *     p.n_threads = 4;
 *     cinfer_threadpool *pool;
 *     cinfer_threadpool_create(&p, &pool);
 *     cinfer_threadpool_parallel_for(pool, n, work, &ctx);
 *     cinfer_threadpool_destroy(pool);
 *
 * Thread safety: one thread at a time calls parallel_for (the pool's owner);
 * fn must not call parallel_for on the same pool.
 */
#ifndef CINFER_CPU_THREADPOOL_H
#define CINFER_CPU_THREADPOOL_H

#include <stdint.h>

#include "../../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_threadpool cinfer_threadpool;

/* Runs tasks [t0, t1) (t0 < t1) on thread `thread` (0 = the caller,
 * 1..n_threads-1 = workers). */
typedef void (*cinfer_parallel_fn)(void *ctx, int64_t t0, int64_t t1,
                                   int thread);

typedef struct {
    int n_threads; /* threads incl. the caller, >= 1; 0 = 1 */
    int spin_us;   /* microseconds an idle thread polls before sleeping;
                      0 = 100, negative = sleep at once */
    int prio;      /* the workers' cinfer_thread_prio
                      (common/thread_priority.h); 0 = as their creator's */
} cinfer_threadpool_params;

cinfer_threadpool_params cinfer_threadpool_default_params(void);

/* Starts n_threads - 1 workers. */
cinfer_status cinfer_threadpool_create(const cinfer_threadpool_params *p,
                                       cinfer_threadpool **out);

/* Stops and joins the workers (NULL is fine). */
void cinfer_threadpool_destroy(cinfer_threadpool *pool);

int cinfer_threadpool_n_threads(const cinfer_threadpool *pool);

/* Splits tasks [0, n_tasks) into one contiguous range per thread (see the
 * header comment) and returns when every range has run. Threads whose range
 * is empty do not call fn. n_tasks <= 0 does nothing; n_tasks == 1 or a
 * one-thread pool runs fn on the caller without waking anyone. */
void cinfer_threadpool_parallel_for(cinfer_threadpool *pool, int64_t n_tasks,
                                    cinfer_parallel_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CPU_THREADPOOL_H */
