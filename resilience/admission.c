/*
 * admission.c - the composition the server calls: drain flag -> global
 * bucket -> client bucket -> breaker -> shedder, behind one mutex
 * (resilience.h).
 *
 * Why all-or-nothing: each stage is looked at before anything is taken, and
 * tokens are taken only once every stage has said yes. A client that is
 * over its own limit therefore cannot drain the global bucket for everyone
 * else, and a request the breaker or shedder refuses costs no quota. The
 * breaker permit is the one thing acquired before the shedder decides (the
 * half-open probe count must be decided in order); a shed gives it back as
 * IGNORED at once.
 *
 * Why one mutex: the stages read each other's answers (the pushback of a
 * rate-limited request is the later of both buckets' waits), the critical
 * section is a few hundred nanoseconds of arithmetic, and the primitives
 * stay free of locks and atomics so tests drive them directly.
 */
#include "resilience/resilience.h"

#include <pthread.h>
#include <string.h>

struct cinfer_admission {
    pthread_mutex_t mu;
    cinfer_tb global;
    cinfer_client_table *clients; /* NULL when per-client limiting is off */
    size_t max_client_id;
    cinfer_breaker breaker;
    cinfer_shedder shedder;
    int draining;
    uint64_t admitted;
    uint64_t rejected[CINFER_REJECT_COUNT];
    uint64_t started;
    uint64_t finished[CINFER_OUTCOME_COUNT];
    uint64_t running;
};

/* ---------------------------------------------------------------------- */
/* Reasons                                                                */
/* ---------------------------------------------------------------------- */

const char *cinfer_reject_name(cinfer_reject r)
{
    switch (r) {
#define CINFER_REJECT_NAME_(name, label, status)                               \
    case name:                                                                 \
        return label;
        CINFER_REJECT_LIST(CINFER_REJECT_NAME_)
#undef CINFER_REJECT_NAME_
    case CINFER_REJECT_COUNT:
        break;
    }
    return "unknown";
}

cinfer_status cinfer_reject_status(cinfer_reject r)
{
    switch (r) {
#define CINFER_REJECT_STATUS_(name, label, status)                             \
    case name:                                                                 \
        return status;
        CINFER_REJECT_LIST(CINFER_REJECT_STATUS_)
#undef CINFER_REJECT_STATUS_
    case CINFER_REJECT_COUNT:
        break;
    }
    return CINFER_E_INTERNAL;
}

/* ---------------------------------------------------------------------- */
/* Create, destroy                                                        */
/* ---------------------------------------------------------------------- */

cinfer_admission_params cinfer_admission_default_params(void)
{
    cinfer_admission_params p = {
        .global = cinfer_tb_default_params(),
        .client = cinfer_tb_default_params(),
        .max_clients = 10000,
        .max_client_id_bytes = 128,
        .hash_seed = {0, 0},
        .breaker = cinfer_breaker_default_params(),
        .shedder = cinfer_shedder_default_params(),
    };
    return p;
}

cinfer_status cinfer_admission_create(const cinfer_admission_params *p,
                                      cinfer_admission **out)
{
    if (!p || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "admission: NULL");
    cinfer_status st;
    cinfer_admission *a = calloc(1, sizeof *a);
    if (!a)
        return cinfer_set_error(CINFER_E_NOMEM, "admission: no memory");
    st = cinfer_tb_init(&a->global, &p->global);
    if (st != CINFER_OK)
        goto fail_alloc;
    st = cinfer_breaker_init(&a->breaker, &p->breaker);
    if (st != CINFER_OK)
        goto fail_alloc;
    st = cinfer_shedder_init(&a->shedder, &p->shedder);
    if (st != CINFER_OK)
        goto fail_alloc;
    cinfer_tb probe;
    st = cinfer_tb_init(&probe, &p->client);
    if (st != CINFER_OK)
        goto fail_alloc;
    if (cinfer_tb_enabled(&probe)) {
        cinfer_client_table_params tp = cinfer_client_table_default_params();
        tp.max_clients = p->max_clients;
        tp.max_id_bytes = p->max_client_id_bytes;
        tp.hash_seed[0] = p->hash_seed[0];
        tp.hash_seed[1] = p->hash_seed[1];
        tp.bucket = p->client;
        st = cinfer_client_table_create(&tp, &a->clients);
        if (st != CINFER_OK)
            goto fail_alloc;
        a->max_client_id = tp.max_id_bytes ? tp.max_id_bytes : 128;
    }
    if (pthread_mutex_init(&a->mu, NULL) != 0) {
        st = cinfer_set_error(CINFER_E_NOMEM, "admission: mutex init failed");
        goto fail_table;
    }
    *out = a;
    return CINFER_OK;

fail_table:
    cinfer_client_table_destroy(a->clients);
fail_alloc:
    free(a);
    return st;
}

void cinfer_admission_destroy(cinfer_admission *a)
{
    if (!a)
        return;
    pthread_mutex_destroy(&a->mu);
    cinfer_client_table_destroy(a->clients);
    free(a);
}

/* ---------------------------------------------------------------------- */
/* Admit                                                                  */
/* ---------------------------------------------------------------------- */

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Decides under the lock; returns the reason, *pushback in ns. */
static cinfer_reject admit_locked(cinfer_admission *a,
                                  const cinfer_admission_request *rq,
                                  int64_t now_ns, cinfer_admission_ticket *t,
                                  int64_t *pushback)
{
    *pushback = 0;
    if (a->draining)
        return CINFER_REJECT_DRAINING;

    /* Limiters: look at both, take nothing yet. */
    uint64_t cost = rq->cost ? rq->cost : 1;
    uint64_t gcost = min_u64(cost, cinfer_tb_capacity(&a->global));
    int64_t gwait = cinfer_tb_wait_ns(&a->global, gcost, now_ns);
    cinfer_tb *cb = NULL;
    uint64_t ccost = 0;
    int64_t cwait = 0;
    if (a->clients && rq->client_id) {
        if (gwait > 0) {
            /* refused anyway: no new entry, just the pushback */
            cb = cinfer_client_table_find(a->clients, rq->client_id,
                                          rq->client_id_len);
        } else {
            cinfer_status st = cinfer_client_table_get(
                a->clients, rq->client_id, rq->client_id_len, &cb);
            CINFER_ASSERT(st == CINFER_OK); /* length checked by the caller */
        }
        if (cb) {
            ccost = min_u64(cost, cinfer_tb_capacity(cb));
            cwait = cinfer_tb_wait_ns(cb, ccost, now_ns);
        }
    }
    if (gwait > 0) {
        *pushback = gwait > cwait ? gwait : cwait;
        return CINFER_REJECT_RATE_LIMITED_GLOBAL;
    }
    if (cwait > 0) {
        *pushback = cwait;
        return CINFER_REJECT_RATE_LIMITED_CLIENT;
    }

    /* Breaker. */
    cinfer_breaker_permit permit;
    int64_t retry = 0;
    if (!cinfer_breaker_acquire(&a->breaker, now_ns, &permit, &retry)) {
        *pushback = retry;
        return CINFER_REJECT_BREAKER_OPEN;
    }

    /* Shedder. */
    cinfer_shed_request sr = {.tokens = rq->tokens,
                              .priority = rq->priority,
                              .deadline_ns = rq->deadline_ns,
                              .gen_tokens = rq->gen_tokens,
                              .running = a->running};
    cinfer_shed_entry entry;
    cinfer_reject r =
        cinfer_shedder_admit(&a->shedder, &sr, now_ns, &entry, pushback);
    if (r != CINFER_REJECT_NONE) {
        cinfer_breaker_record(&a->breaker, &permit, CINFER_OUTCOME_IGNORED,
                              now_ns);
        return r;
    }

    /* Admitted: now take the tokens (both buckets were looked at at this
     * same time under this lock, so both takes succeed). */
    int took = cinfer_tb_take(&a->global, gcost, now_ns, NULL);
    CINFER_ASSERT(took);
    if (cb) {
        took = cinfer_tb_take(cb, ccost, now_ns, NULL);
        CINFER_ASSERT(took);
    }
    t->state = CINFER_TICKET_QUEUED;
    t->permit = permit;
    t->entry = entry;
    return CINFER_REJECT_NONE;
}

cinfer_status cinfer_admission_admit(cinfer_admission *a,
                                     const cinfer_admission_request *rq,
                                     int64_t now_ns,
                                     cinfer_admission_decision *d,
                                     cinfer_admission_ticket *t)
{
    if (!a || !rq || !d || !t)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "admission: NULL");
    if (a->clients && rq->client_id && rq->client_id_len > a->max_client_id)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "x-client-id of %zu bytes exceeds %zu",
                                rq->client_id_len, a->max_client_id);
    memset(t, 0, sizeof *t);
    int64_t pushback;
    pthread_mutex_lock(&a->mu);
    cinfer_reject r = admit_locked(a, rq, now_ns, t, &pushback);
    if (r == CINFER_REJECT_NONE)
        a->admitted++;
    else
        a->rejected[r]++;
    pthread_mutex_unlock(&a->mu);
    d->reason = r;
    d->retry_after_ms = cinfer_ns_to_ms_ceil(pushback);
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Queued, running, done                                                  */
/* ---------------------------------------------------------------------- */

/* A queued request was shed (already out of the shedder's queue). Its
 * permit is released, or counts as a failure when its deadline passed
 * while the server held it. */
static void shed_queued(cinfer_admission *a, cinfer_admission_ticket *t,
                        cinfer_reject r, int64_t now_ns)
{
    int expired = r == CINFER_REJECT_SHED_DEADLINE && t->entry.deadline_ns &&
                  a->shedder.last_ns >= t->entry.deadline_ns;
    cinfer_breaker_record(
        &a->breaker, &t->permit,
        expired ? CINFER_OUTCOME_FAILURE : CINFER_OUTCOME_IGNORED, now_ns);
    a->rejected[r]++;
    t->state = CINFER_TICKET_DONE;
}

cinfer_admission_decision cinfer_admission_dequeue(cinfer_admission *a,
                                                   cinfer_admission_ticket *t,
                                                   int64_t now_ns,
                                                   int64_t wait_ns)
{
    cinfer_admission_decision d = {CINFER_REJECT_NONE, 0};
    int64_t pushback = 0;
    pthread_mutex_lock(&a->mu);
    if (t->state == CINFER_TICKET_QUEUED) {
        d.reason =
            cinfer_shedder_dequeue(&a->shedder, &t->entry, now_ns, wait_ns,
                                   &pushback);
        if (d.reason == CINFER_REJECT_NONE) {
            t->state = CINFER_TICKET_RUNNING;
            a->started++;
            a->running++;
        } else {
            shed_queued(a, t, d.reason, now_ns);
        }
    }
    pthread_mutex_unlock(&a->mu);
    d.retry_after_ms = cinfer_ns_to_ms_ceil(pushback);
    return d;
}

cinfer_admission_decision
cinfer_admission_check_queued(cinfer_admission *a, cinfer_admission_ticket *t,
                              int64_t now_ns)
{
    cinfer_admission_decision d = {CINFER_REJECT_NONE, 0};
    int64_t pushback = 0;
    pthread_mutex_lock(&a->mu);
    if (t->state == CINFER_TICKET_QUEUED) {
        d.reason =
            cinfer_shedder_check(&a->shedder, &t->entry, now_ns, &pushback);
        if (d.reason != CINFER_REJECT_NONE) {
            cinfer_shedder_remove(&a->shedder, &t->entry, now_ns);
            shed_queued(a, t, d.reason, now_ns);
        }
    }
    pthread_mutex_unlock(&a->mu);
    d.retry_after_ms = cinfer_ns_to_ms_ceil(pushback);
    return d;
}

void cinfer_admission_finish(cinfer_admission *a, cinfer_admission_ticket *t,
                             cinfer_outcome o, int64_t now_ns)
{
    if ((unsigned)o >= CINFER_OUTCOME_COUNT)
        o = CINFER_OUTCOME_IGNORED;
    pthread_mutex_lock(&a->mu);
    if (t->state == CINFER_TICKET_QUEUED || t->state == CINFER_TICKET_RUNNING) {
        if (t->state == CINFER_TICKET_QUEUED)
            cinfer_shedder_remove(&a->shedder, &t->entry, now_ns);
        else
            a->running--;
        cinfer_breaker_record(&a->breaker, &t->permit, o, now_ns);
        a->finished[o]++;
        t->state = CINFER_TICKET_DONE;
    }
    pthread_mutex_unlock(&a->mu);
}

/* ---------------------------------------------------------------------- */
/* Signals and stats                                                      */
/* ---------------------------------------------------------------------- */

void cinfer_admission_set_draining(cinfer_admission *a, int draining)
{
    pthread_mutex_lock(&a->mu);
    a->draining = draining != 0;
    pthread_mutex_unlock(&a->mu);
}

void cinfer_admission_observe_token_time(cinfer_admission *a, int64_t ns)
{
    pthread_mutex_lock(&a->mu);
    cinfer_shedder_observe_token_time(&a->shedder, ns);
    pthread_mutex_unlock(&a->mu);
}

void cinfer_admission_set_kv_usage(cinfer_admission *a, uint32_t permille)
{
    pthread_mutex_lock(&a->mu);
    cinfer_shedder_set_kv_usage(&a->shedder, permille);
    pthread_mutex_unlock(&a->mu);
}

void cinfer_admission_set_engine_waiting(cinfer_admission *a,
                                         int64_t waiting)
{
    pthread_mutex_lock(&a->mu);
    cinfer_shedder_set_engine_waiting(&a->shedder, waiting);
    pthread_mutex_unlock(&a->mu);
}

void cinfer_admission_stats_get(cinfer_admission *a, int64_t now_ns,
                                cinfer_admission_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&a->mu);
    out->admitted = a->admitted;
    memcpy(out->rejected, a->rejected, sizeof out->rejected);
    out->started = a->started;
    memcpy(out->finished, a->finished, sizeof out->finished);
    out->running = a->running;
    out->queued_requests = a->shedder.queued_requests;
    out->queued_tokens = a->shedder.queued_tokens;
    out->breaker_state = cinfer_breaker_get_state(&a->breaker);
    memcpy(out->breaker_transitions, a->breaker.transitions,
           sizeof out->breaker_transitions);
    cinfer_breaker_window(&a->breaker, now_ns, &out->breaker_window_calls,
                          &out->breaker_window_failures);
    out->service_rate_tokens_per_s =
        a->shedder.rate_known ? (double)a->shedder.rate_mtps / 1000.0 : -1.0;
    out->codel_overloaded = cinfer_codel_overloaded(&a->shedder.codel, now_ns);
    out->kv_usage_permille = a->shedder.kv_permille;
    if (a->clients) {
        out->clients = cinfer_client_table_size(a->clients);
        out->client_evictions = cinfer_client_table_evictions(a->clients);
    }
    out->draining = a->draining;
    pthread_mutex_unlock(&a->mu);
}
