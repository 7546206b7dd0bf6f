/*
 * test_threadpool.c - the CPU backend's fork-join pool.
 *
 * Checks that every task of every dispatch runs exactly once, on the thread
 * the static split assigns it, for n_tasks 0, 1, few, many and large; that
 * plain memory written by tasks is visible to the caller and to the next
 * dispatch (the tasks move between threads as n changes); and a bounded
 * stress of back-to-back dispatches both with spinning workers and with
 * workers that sleep in the kernel after every job; and that workers
 * take the pool's scheduling class.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../common/thread_priority.h"
#include "../../kernels/cpu/threadpool.h"
#include "harness.h"

typedef struct {
    int n_threads;
    int64_t n;
    _Atomic int *count;   /* [n] runs per task */
    int *thread_of;       /* [n] thread that ran the task */
    _Atomic int bad_call; /* calls with an empty or foreign range */
} count_ctx;

static void count_fn(void *p, int64_t t0, int64_t t1, int thread)
{
    count_ctx *c = p;
    /* one task or one thread: everything runs on the caller */
    int split = c->n > 1 && c->n_threads > 1;
    int64_t e0 = split ? c->n * thread / c->n_threads : 0;
    int64_t e1 = split ? c->n * (thread + 1) / c->n_threads : c->n;
    if (t0 >= t1 || t0 != e0 || t1 != e1 || thread < 0 ||
        thread >= c->n_threads)
        atomic_fetch_add(&c->bad_call, 1);
    for (int64_t i = t0; i < t1; i++) {
        atomic_fetch_add(&c->count[i], 1);
        c->thread_of[i] = thread;
    }
}

/* Runs one dispatch of n tasks and checks each ran once where it should. */
static int dispatch_and_check(cinfer_threadpool *pool, int64_t n)
{
    int nt = cinfer_threadpool_n_threads(pool);
    count_ctx c;
    c.n_threads = nt;
    c.n = n;
    c.count = calloc((size_t)(n > 0 ? n : 1), sizeof *c.count);
    c.thread_of = calloc((size_t)(n > 0 ? n : 1), sizeof *c.thread_of);
    atomic_init(&c.bad_call, 0);
    cinfer_threadpool_parallel_for(pool, n, count_fn, &c);
    int errors = atomic_load(&c.bad_call);
    for (int64_t i = 0; i < n; i++) {
        int expect_thread = (n == 1 || nt == 1) ? 0 : -1;
        if (atomic_load(&c.count[i]) != 1)
            errors++;
        if (expect_thread == 0 && c.thread_of[i] != 0)
            errors++;
        /* static split: task i belongs to the thread whose range holds it */
        if (expect_thread != 0) {
            int t = c.thread_of[i];
            if (!(n * t / nt <= i && i < n * (t + 1) / nt))
                errors++;
        }
    }
    free(c.count);
    free(c.thread_of);
    return errors;
}

static void test_create_destroy(void)
{
    for (int nt = 0; nt <= 5; nt++) {
        cinfer_threadpool_params p = cinfer_threadpool_default_params();
        p.n_threads = nt;
        cinfer_threadpool *pool = NULL;
        CHECK_OK(cinfer_threadpool_create(&p, &pool));
        CHECK(pool != NULL);
        if (!pool)
            continue;
        CHECK_EQ_INT(cinfer_threadpool_n_threads(pool), nt == 0 ? 1 : nt);
        cinfer_threadpool_destroy(pool);
    }
    cinfer_threadpool_destroy(NULL);

    cinfer_threadpool_params p = cinfer_threadpool_default_params();
    p.n_threads = -2;
    cinfer_threadpool *pool = (cinfer_threadpool *)&p;
    CHECK_EQ_INT(cinfer_threadpool_create(&p, &pool), CINFER_E_INVALID_ARG);
    CHECK(pool == NULL);
    CHECK_EQ_INT(cinfer_threadpool_create(NULL, &pool), CINFER_E_INVALID_ARG);
}

static void never_called(void *p, int64_t t0, int64_t t1, int thread)
{
    atomic_fetch_add((_Atomic int *)p, 1);
}

static void test_sizes(void)
{
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 64, 1000, 100003};
    for (int nt = 1; nt <= 4; nt++) {
        cinfer_threadpool_params p = cinfer_threadpool_default_params();
        p.n_threads = nt;
        cinfer_threadpool *pool;
        CHECK_OK(cinfer_threadpool_create(&p, &pool));
        _Atomic int calls;
        atomic_init(&calls, 0);
        cinfer_threadpool_parallel_for(pool, 0, never_called, &calls);
        cinfer_threadpool_parallel_for(pool, -5, never_called, &calls);
        CHECK_EQ_INT(atomic_load(&calls), 0);
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            CHECK_EQ_INT(dispatch_and_check(pool, sizes[i]), 0);
        cinfer_threadpool_destroy(pool);
    }
}

/* Every dispatch adds its index to each element, with n (and so the thread
 * owning an element) changing from one dispatch to the next. The plain
 * (non-atomic) read-modify-writes are correct only if each dispatch's writes
 * happen before the next dispatch's reads. */
typedef struct {
    int64_t *a;
    int64_t k;
} add_ctx;

static void add_fn(void *p, int64_t t0, int64_t t1, int thread)
{
    add_ctx *c = p;
    for (int64_t i = t0; i < t1; i++)
        c->a[i] += c->k;
}

static void run_chain(int n_threads, int spin_us, int n_dispatch)
{
    cinfer_threadpool_params p = cinfer_threadpool_default_params();
    p.n_threads = n_threads;
    p.spin_us = spin_us;
    cinfer_threadpool *pool;
    CHECK_OK(cinfer_threadpool_create(&p, &pool));
    enum { N = 257 };
    int64_t a[N] = {0};
    int64_t expect[N] = {0};
    for (int k = 1; k <= n_dispatch; k++) {
        int64_t n = 2 + (k * 37) % (N - 2); /* 2..N-1 */
        add_ctx c = {a, k};
        cinfer_threadpool_parallel_for(pool, n, add_fn, &c);
        for (int64_t i = 0; i < n; i++)
            expect[i] += k;
    }
    int mismatches = 0;
    for (int i = 0; i < N; i++)
        mismatches += a[i] != expect[i];
    CHECK_EQ_INT(mismatches, 0);
    cinfer_threadpool_destroy(pool);
}

static void test_chain_spinning(void) { run_chain(3, 0, 5000); }

static void test_chain_sleeping(void)
{
    /* spin_us < 0: workers sleep in the kernel after every job, so every
     * dispatch goes through the wake-up path. */
    run_chain(3, -1, 1000);
    run_chain(2, -1, 1000);
}

static void test_stress_exactly_once(void)
{
    cinfer_threadpool_params p = cinfer_threadpool_default_params();
    p.n_threads = 4; /* more threads than this machine may have cores */
    p.spin_us = 20;
    cinfer_threadpool *pool;
    CHECK_OK(cinfer_threadpool_create(&p, &pool));
    int errors = 0;
    for (int k = 0; k < 300; k++)
        errors += dispatch_and_check(pool, 1 + (k * 7919) % 97);
    CHECK_EQ_INT(errors, 0);
    cinfer_threadpool_destroy(pool);
}

static int thread_nice_now(void)
{
    errno = 0;
    int v = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    return v == -1 && errno ? 100 : v;
}

typedef struct {
    int nice[4];
    int policy[4];
} prio_ctx;

static void prio_fn(void *p, int64_t t0, int64_t t1, int thread)
{
    (void)t0;
    (void)t1;
    prio_ctx *c = p;
    c->nice[thread] = thread_nice_now();
    c->policy[thread] = sched_getscheduler(0);
}

static void run_prio(cinfer_thread_prio prio, prio_ctx *c)
{
    cinfer_threadpool_params p = cinfer_threadpool_default_params();
    p.n_threads = 3;
    p.prio = prio;
    cinfer_threadpool *pool = NULL;
    CHECK_OK(cinfer_threadpool_create(&p, &pool));
    for (int i = 0; i < 4; i++)
        c->nice[i] = c->policy[i] = -1;
    cinfer_threadpool_parallel_for(pool, 3, prio_fn, c);
    cinfer_threadpool_destroy(pool);
}

/* Workers take the pool's class; the caller is left alone and sets its
 * own with cinfer_thread_set_priority. */
static void test_workers_priority(void)
{
    const int base = thread_nice_now();
    const int policy = sched_getscheduler(0);
    CHECK(base <= 19);
    CHECK_EQ_INT(policy, SCHED_OTHER);
    const int low = base + 10 > 19 ? 19 : base + 10;
    prio_ctx c;
    run_prio(CINFER_THREAD_PRIO_NORMAL, &c);
    for (int t = 0; t < 3; t++) {
        CHECK_EQ_INT(c.nice[t], base);
        CHECK_EQ_INT(c.policy[t], SCHED_OTHER);
    }
    run_prio(CINFER_THREAD_PRIO_LOW, &c);
    CHECK_EQ_INT(c.nice[0], base);
    for (int t = 1; t < 3; t++) {
        CHECK_EQ_INT(c.nice[t], low);
        CHECK_EQ_INT(c.policy[t], SCHED_OTHER);
    }
    run_prio(CINFER_THREAD_PRIO_IDLE, &c);
    CHECK_EQ_INT(c.policy[0], SCHED_OTHER);
    for (int t = 1; t < 3; t++)
        CHECK_EQ_INT(c.policy[t], SCHED_IDLE);

    CHECK_EQ_INT(cinfer_thread_set_priority(CINFER_THREAD_PRIO_NORMAL), 0);
    CHECK_EQ_INT(thread_nice_now(), base);
    CHECK_EQ_INT(cinfer_thread_set_priority(CINFER_THREAD_PRIO_LOW), 0);
    CHECK_EQ_INT(thread_nice_now(), low);
    CHECK_EQ_INT(cinfer_thread_set_priority(CINFER_THREAD_PRIO_IDLE), 0);
    CHECK_EQ_INT(sched_getscheduler(0), SCHED_IDLE);
    CHECK(strcmp(cinfer_thread_prio_name(CINFER_THREAD_PRIO_IDLE), "idle") == 0);
    CHECK(cinfer_thread_prio_name((cinfer_thread_prio)7) == NULL);
}

int main(void)
{
    RUN(test_create_destroy);
    RUN(test_sizes);
    RUN(test_chain_spinning);
    RUN(test_chain_sleeping);
    RUN(test_stress_exactly_once);
    /* last: it leaves this thread at idle priority */
    RUN(test_workers_priority);
    return harness_done();
}
