/*
 * comm.c - the communicator's common calls and the LOCAL kind: CPU ranks,
 * threads of one process, meeting at a shared barrier.
 *
 * A collective is two barriers around a table of the ranks' buffers:
 *
 *   1. each rank writes its entry (collective, count, pointers) and waits
 *      until all N have arrived;
 *   2. each rank checks that the entries agree, then does its share of
 *      the work over every rank's buffers: for an all-reduce the slice
 *      [n*r/N, n*(r+1)/N) of the elements, each summed over ranks 0..N-1
 *      in that order and written back to every rank's buffer; for an
 *      all-gather its own receive buffer;
 *   3. it waits at the second barrier until every rank is done with the
 *      others' buffers, and returns.
 *
 * Every element is owned by exactly one rank in step 2, so no two threads
 * touch it, and its sum is the same sequence of float additions whoever
 * runs it and whenever: the result is bit-identical to a sequential sum in
 * rank order, run after run. The mutex orders the table and the buffer
 * contents between the steps.
 *
 * Bounded waits: the first barrier gives up after timeout_ms, naming the
 * ranks that have not arrived (those that entered fewer barriers than the
 * waiter), and breaks the communicator, so the others fail too instead of
 * waiting for a collective that cannot complete. The second barrier
 * ignores an abort (the ranks are all inside, touching each other's
 * buffers: none may leave before the others are done) but keeps the
 * timeout, which only a thread stalled mid-copy could reach.
 */
#include "comm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_TIMEOUT_MS 60000

/* ---------------------------------------------------------------------- */
/* any kind                                                                */
/* ---------------------------------------------------------------------- */

int cinfer_comm_rank(const cinfer_comm *c)
{
    return c ? c->rank : 0;
}

int cinfer_comm_size(const cinfer_comm *c)
{
    return c ? c->size : 1;
}

cinfer_comm_kind cinfer_comm_get_kind(const cinfer_comm *c)
{
    return c ? c->kind : CINFER_COMM_LOCAL;
}

/* Here rather than in comm_nccl.c: plain values, in every build. */
cinfer_comm_nccl_params cinfer_comm_nccl_default_params(void)
{
    cinfer_comm_nccl_params p;
    memset(&p, 0, sizeof p);
    p.n_nodes = 1;
    p.timeout_ms = DEFAULT_TIMEOUT_MS;
    return p;
}

static void local_abort(cinfer_comm *c, const char *why);
static void local_release(cinfer_comm *c);

void cinfer_comm_abort(cinfer_comm *c, const char *why)
{
    if (!c)
        return;
    if (c->kind == CINFER_COMM_LOCAL)
        local_abort(c, why);
    else if (c->abort)
        c->abort(c, why);
}

void cinfer_comm_destroy(cinfer_comm *c)
{
    if (!c)
        return;
    if (c->kind == CINFER_COMM_LOCAL) {
        local_release(c);
        free(c);
    } else if (c->destroy) {
        c->destroy(c);
    } else {
        free(c);
    }
}

/* ---------------------------------------------------------------------- */
/* LOCAL: the shared table and barrier                                     */
/* ---------------------------------------------------------------------- */

typedef enum { OP_ALL_REDUCE = 1, OP_ALL_GATHER = 2 } coll_op;

static const char *op_name(coll_op op)
{
    return op == OP_ALL_REDUCE ? "all_reduce_sum" : "all_gather";
}

/* One rank's entry for the current collective. */
typedef struct {
    coll_op op;
    size_t n;          /* floats per rank */
    float *buf;        /* all-reduce: in place */
    const float *send; /* all-gather */
    float *recv;       /* all-gather: n * size floats */
    const char *bad;   /* the rank's own arguments are wrong: why */
} entry;

struct comm_local_shared {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int n_ranks;
    int refs;             /* handles not yet destroyed */
    unsigned long long gen; /* barriers completed */
    int arrived;          /* ranks waiting at the current barrier */
    unsigned long long *entered; /* [n_ranks] barriers each rank entered */
    entry *entries;       /* [n_ranks] */
    cinfer_status broken; /* CINFER_OK while usable */
    char broken_msg[320];
};

static void deadline_after(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* The calling rank's copy of the broken communicator's error. Lock held. */
static cinfer_status fail_broken(const struct comm_local_shared *s)
{
    return cinfer_set_error(s->broken, "%s", s->broken_msg);
}

/* Breaks the communicator with a timeout naming the ranks that have not
 * entered as many barriers as `rank`. Lock held. */
static void break_timeout(struct comm_local_shared *s, int rank, coll_op op,
                          int timeout_ms)
{
    char who[160];
    size_t at = 0;
    int missing = 0;
    who[0] = '\0';
    for (int r = 0; r < s->n_ranks; r++) {
        if (s->entered[r] >= s->entered[rank])
            continue;
        if (at < sizeof who) {
            int k = snprintf(who + at, sizeof who - at, "%s%d",
                             missing ? ", " : "", r);
            at += k > 0 ? (size_t)k : 0;
        }
        missing++;
    }
    if (at >= sizeof who)
        snprintf(who + sizeof who - 5, 5, "...");
    s->broken = CINFER_E_TIMEOUT;
    snprintf(s->broken_msg, sizeof s->broken_msg,
             "comm %s (collective %llu): rank%s %s of %d did not arrive "
             "within %d ms; the communicator is broken",
             op_name(op), (s->entered[rank] + 1) / 2, missing == 1 ? "" : "s",
             who, s->n_ranks, timeout_ms);
}

/* Waits until every rank has entered this barrier. The first barrier of a
 * collective (entry != NULL: the rank's entry is written on the way in)
 * fails at once on a broken communicator and breaks it on a timeout; the
 * second ignores a break. */
static cinfer_status barrier(cinfer_comm *c, const entry *e, coll_op op)
{
    struct comm_local_shared *s = c->local;
    cinfer_status st = CINFER_OK;
    pthread_mutex_lock(&s->m);
    if (e && s->broken != CINFER_OK) {
        st = fail_broken(s);
        goto out;
    }
    if (e)
        s->entries[c->rank] = *e;
    unsigned long long mine = s->gen;
    s->entered[c->rank]++;
    if (++s->arrived == s->n_ranks) {
        s->arrived = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
        goto out;
    }
    struct timespec deadline;
    deadline_after(&deadline, c->timeout_ms);
    while (s->gen == mine && !(e && s->broken != CINFER_OK)) {
        int rc = pthread_cond_timedwait(&s->cv, &s->m, &deadline);
        if (rc == ETIMEDOUT && s->gen == mine) {
            if (s->broken == CINFER_OK)
                break_timeout(s, c->rank, op, c->timeout_ms);
            pthread_cond_broadcast(&s->cv);
            break;
        }
    }
    if (s->gen == mine)
        st = fail_broken(s);
out:
    pthread_mutex_unlock(&s->m);
    return st;
}

static void local_abort(cinfer_comm *c, const char *why)
{
    struct comm_local_shared *s = c->local;
    pthread_mutex_lock(&s->m);
    if (s->broken == CINFER_OK) {
        s->broken = CINFER_E_CANCELLED;
        snprintf(s->broken_msg, sizeof s->broken_msg,
                 "comm: rank %d of %d aborted the communicator: %s", c->rank,
                 s->n_ranks, why ? why : "(no reason given)");
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->m);
}

static void shared_free(struct comm_local_shared *s)
{
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->m);
    free(s->entered);
    free(s->entries);
    free(s);
}

static void local_release(cinfer_comm *c)
{
    struct comm_local_shared *s = c->local;
    pthread_mutex_lock(&s->m);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->m);
    if (last)
        shared_free(s);
}

/* ---------------------------------------------------------------------- */
/* LOCAL: creation                                                         */
/* ---------------------------------------------------------------------- */

cinfer_comm_local_params cinfer_comm_local_default_params(void)
{
    cinfer_comm_local_params p;
    memset(&p, 0, sizeof p);
    p.n_ranks = 1;
    p.timeout_ms = DEFAULT_TIMEOUT_MS;
    return p;
}

static struct comm_local_shared *shared_new(int n)
{
    struct comm_local_shared *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->entered = calloc((size_t)n, sizeof *s->entered);
    s->entries = calloc((size_t)n, sizeof *s->entries);
    pthread_condattr_t ca;
    int ok = s->entered && s->entries && pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&s->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (ok && pthread_mutex_init(&s->m, NULL) != 0) {
        pthread_cond_destroy(&s->cv);
        ok = 0;
    }
    if (!ok) {
        free(s->entered);
        free(s->entries);
        free(s);
        return NULL;
    }
    s->n_ranks = n;
    s->refs = n;
    return s;
}

cinfer_status cinfer_comm_create_local(const cinfer_comm_local_params *p,
                                       cinfer_comm **comms)
{
    cinfer_comm_local_params dp = cinfer_comm_local_default_params();
    if (!p)
        p = &dp;
    if (!comms)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_local: comms is NULL");
    int n = p->n_ranks == 0 ? 1 : p->n_ranks;
    if (n < 1 || n > CINFER_COMM_MAX_RANKS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_local: n_ranks %d is outside "
                                "1..%d",
                                p->n_ranks, CINFER_COMM_MAX_RANKS);
    if (p->timeout_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_local: timeout_ms %d is negative",
                                p->timeout_ms);
    int timeout_ms = p->timeout_ms ? p->timeout_ms : DEFAULT_TIMEOUT_MS;
    cinfer_comm **made = calloc((size_t)n, sizeof *made);
    struct comm_local_shared *s = shared_new(n);
    if (!made || !s)
        goto fail_nomem;
    for (int r = 0; r < n; r++) {
        made[r] = calloc(1, sizeof *made[r]);
        if (!made[r])
            goto fail_nomem;
        made[r]->kind = CINFER_COMM_LOCAL;
        made[r]->rank = r;
        made[r]->size = n;
        made[r]->timeout_ms = timeout_ms;
        made[r]->local = s;
        made[r]->device = -1;
    }
    memcpy(comms, made, (size_t)n * sizeof *made);
    free(made);
    return CINFER_OK;

fail_nomem:
    if (made)
        for (int r = 0; r < n; r++)
            free(made[r]);
    free(made);
    if (s)
        shared_free(s);
    return cinfer_set_error(CINFER_E_NOMEM,
                            "comm_create_local: no memory for %d ranks", n);
}

/* ---------------------------------------------------------------------- */
/* LOCAL: the collectives                                                  */
/* ---------------------------------------------------------------------- */

/* [lo, hi) of n elements for rank r of size: n / size each, the first
 * n % size ranks one more. */
static void slice(size_t n, int r, int size, size_t *lo, size_t *hi)
{
    size_t q = n / (size_t)size, m = n % (size_t)size, ur = (size_t)r;
    *lo = q * ur + (ur < m ? ur : m);
    *hi = *lo + q + (ur < m ? 1 : 0);
}

/* Rank r's slice of the sum, in rank order, written to every buffer. */
static void reduce_slice(const entry *es, int size, int r)
{
    enum { CHUNK = 256 };
    float acc[CHUNK];
    size_t lo, hi;
    slice(es[0].n, r, size, &lo, &hi);
    for (size_t i0 = lo; i0 < hi; i0 += CHUNK) {
        size_t m = hi - i0 < CHUNK ? hi - i0 : CHUNK;
        memcpy(acc, es[0].buf + i0, m * sizeof(float));
        for (int k = 1; k < size; k++) {
            const float *b = es[k].buf + i0;
            for (size_t j = 0; j < m; j++)
                acc[j] += b[j];
        }
        for (int k = 0; k < size; k++)
            memcpy(es[k].buf + i0, acc, m * sizeof(float));
    }
}

/* Rank r's receive buffer from every rank's send. */
static void gather_into(const entry *es, int size, int r)
{
    size_t n = es[0].n;
    float *recv = es[r].recv;
    for (int k = 0; k < size; k++)
        if (es[k].send != recv + (size_t)k * n)
            memcpy(recv + (size_t)k * n, es[k].send, n * sizeof(float));
}

/* The first disagreement between the entries (all ranks compute the same
 * one), as an error; CINFER_OK if they agree. */
static cinfer_status check_entries(const cinfer_comm *c, const entry *es)
{
    for (int r = 0; r < c->size; r++)
        if (es[r].bad)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "comm %s: rank %d of %d: %s",
                                    op_name(es[r].op), r, c->size, es[r].bad);
    for (int r = 1; r < c->size; r++)
        if (es[r].op != es[0].op || es[r].n != es[0].n)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "comm: rank %d calls %s of %zu floats "
                                    "while rank 0 calls %s of %zu",
                                    r, op_name(es[r].op), es[r].n,
                                    op_name(es[0].op), es[0].n);
    return CINFER_OK;
}

static cinfer_status local_collective(cinfer_comm *c, const entry *e)
{
    cinfer_status st = barrier(c, e, e->op);
    if (st != CINFER_OK)
        return st;
    const entry *es = c->local->entries;
    cinfer_status agree = check_entries(c, es);
    char msg[320];
    if (agree != CINFER_OK)
        snprintf(msg, sizeof msg, "%s", cinfer_last_error());
    else if (e->op == OP_ALL_REDUCE)
        reduce_slice(es, c->size, c->rank);
    else
        gather_into(es, c->size, c->rank);
    st = barrier(c, NULL, e->op);
    if (st != CINFER_OK)
        return st;
    if (agree != CINFER_OK)
        return cinfer_set_error(agree, "%s", msg);
    return CINFER_OK;
}

static cinfer_status need_local(const char *op, const cinfer_comm *c)
{
    if (!c)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "comm %s: comm is NULL",
                                op);
    if (c->kind != CINFER_COMM_LOCAL)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "comm %s: an NCCL communicator works on device "
                                "memory (cinfer_backend_all_reduce_sum, "
                                "cinfer_backend_all_gather)",
                                op);
    return CINFER_OK;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A LOCAL collective, timed for cinfer_comm_stats. */
static cinfer_status timed_collective(cinfer_comm *c, const entry *e)
{
    uint64_t t0 = mono_ns();
    cinfer_status st = local_collective(c, e);
    c->collective_ns += mono_ns() - t0;
    c->n_collectives++;
    return st;
}

void cinfer_comm_stats(const cinfer_comm *c, uint64_t *n, uint64_t *ns)
{
    *n = c && c->kind == CINFER_COMM_LOCAL ? c->n_collectives : 0;
    *ns = c && c->kind == CINFER_COMM_LOCAL ? c->collective_ns : 0;
}

cinfer_status cinfer_comm_all_reduce_sum(cinfer_comm *c, float *buf, size_t n)
{
    cinfer_status st = need_local("all_reduce_sum", c);
    if (st != CINFER_OK)
        return st;
    entry e = {OP_ALL_REDUCE, n, buf, NULL, NULL, NULL};
    if (!buf && n > 0)
        e.bad = "buf is NULL";
    if (c->size == 1)
        return e.bad ? cinfer_set_error(CINFER_E_INVALID_ARG,
                                        "comm all_reduce_sum: %s", e.bad)
                     : CINFER_OK;
    return timed_collective(c, &e);
}

cinfer_status cinfer_comm_all_gather(cinfer_comm *c, const float *send,
                                     size_t n, float *recv)
{
    cinfer_status st = need_local("all_gather", c);
    if (st != CINFER_OK)
        return st;
    entry e = {OP_ALL_GATHER, n, NULL, send, recv, NULL};
    if (n > SIZE_MAX / sizeof(float) / (size_t)c->size)
        e.bad = "n * size floats do not fit in memory";
    else if ((!send || !recv) && n > 0)
        e.bad = "send or recv is NULL";
    else if (n > 0) {
        uintptr_t s0 = (uintptr_t)send, r0 = (uintptr_t)recv;
        size_t nb = n * sizeof(float);
        int overlaps = s0 < r0 + nb * (size_t)c->size && r0 < s0 + nb;
        if (overlaps && send != recv + (size_t)c->rank * n)
            e.bad = "send overlaps recv other than at recv + rank * n";
    }
    if (c->size == 1) {
        if (e.bad)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "comm all_gather: %s", e.bad);
        if (n > 0 && send != recv)
            memcpy(recv, send, n * sizeof(float));
        return CINFER_OK;
    }
    return timed_collective(c, &e);
}
