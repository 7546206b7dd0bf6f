/*
 * shedder.c - load shedding: bounded queue accounting, Little's-law wait
 * prediction, deadline checks, KV pressure, and CoDel (resilience.h).
 *
 * Why these signals: a generation server's queue is cheap to hold and
 * expensive to serve, so the bound alone lets every queued request miss its
 * deadline when the queue is deep. Little's law (L = lambda W, so W = L /
 * lambda) turns the work queued ahead of a newcomer and the measured rate
 * at which work leaves the queue into its expected wait, which is compared
 * with its deadline before it costs anything. CoDel catches what prediction
 * misses (a rate that fell, work that grew): a standing queue that never
 * drains below the target over a whole interval. KV pressure is what the
 * engine admits against; when it is high and requests already wait, a
 * newcomer only adds wait.
 *
 * The service rate is the tokens that leave the queue per second of
 * backlog (time with a non-empty queue): during a backlog the departure
 * rate is the engine's service rate, and idle time, which says nothing
 * about capacity, is left out. Samples of rate_sample_ms of backlog are
 * averaged with an EWMA; a sample with no departure (a stuck engine) pulls
 * a known rate towards 0, so predictions grow and deadlines shed. The first
 * sample waits for a first departure, however long that takes.
 *
 * Continuous batching takes many requests off the queue at once, and a
 * sample closes at the first of them: the later departures of that batch
 * (within batch_gap_ms) are added to the closed sample and the EWMA step is
 * redone, so the sample holds the whole batch instead of one request of it.
 * A low estimate sheds nearly everything, and then nothing leaves the
 * queue to correct it: with no departure for rate_stale_ms the estimate is
 * stale and prediction sheds nothing (deadlines that passed, the bounds
 * and CoDel still apply) until departures measure the rate again.
 *
 * Per-priority counters (201 levels) give the work ahead of a request: all
 * queued work of a higher priority, plus the work of its own priority
 * enqueued before it that has not left yet (the level's enqueued-tokens
 * count at its arrival minus the tokens that left the level since). When a
 * request behind it leaves first the estimate is low, never high.
 */
#include "resilience/resilience.h"

#include <string.h>

typedef unsigned __int128 u128;

#define UNITS_PER_TOKEN 1000000000000ull /* mtps * ns / 1e12 = tokens */

/* ---------------------------------------------------------------------- */
/* CoDel                                                                  */
/* ---------------------------------------------------------------------- */

cinfer_codel_params cinfer_codel_default_params(void)
{
    cinfer_codel_params p = {.target_ms = 5, .interval_ms = 100};
    return p;
}

cinfer_status cinfer_codel_init(cinfer_codel *c, const cinfer_codel_params *p)
{
    if (!c || !p)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "codel: NULL");
    if (p->target_ms < 0 || p->interval_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "codel: target_ms %lld and interval_ms %lld "
                                "must not be negative",
                                (long long)p->target_ms,
                                (long long)p->interval_ms);
    memset(c, 0, sizeof *c);
    c->target_ns = cinfer_ms_to_ns(p->target_ms);
    c->interval_ns = cinfer_ms_to_ns(p->interval_ms ? p->interval_ms : 100);
    return CINFER_OK;
}

int64_t cinfer_codel_slough_ns(const cinfer_codel *c)
{
    return cinfer_ns_add_sat(c->target_ns, c->target_ns);
}

int cinfer_codel_on_dequeue(cinfer_codel *c, int64_t wait_ns, int64_t now_ns)
{
    if (!c->target_ns)
        return 0;
    if (wait_ns < 0)
        wait_ns = 0;
    if (!c->started) {
        c->started = 1;
        c->last_ns = now_ns;
        c->overloaded = 0;
        c->interval_end_ns = cinfer_ns_add_sat(now_ns, c->interval_ns);
        c->min_wait_ns = wait_ns;
        return 0;
    }
    if (now_ns > c->last_ns)
        c->last_ns = now_ns;
    int64_t t = c->last_ns;
    if (t >= c->interval_end_ns) {
        /* Judge the interval that ended; an interval with no dequeue at
         * all means the queue went idle, which is not overload. */
        if (t >= cinfer_ns_add_sat(c->interval_end_ns, c->interval_ns))
            c->overloaded = 0;
        else
            c->overloaded = c->min_wait_ns > c->target_ns;
        c->interval_end_ns = cinfer_ns_add_sat(t, c->interval_ns);
        c->min_wait_ns = wait_ns;
        return 0; /* the first of an interval is never dropped */
    }
    if (wait_ns < c->min_wait_ns)
        c->min_wait_ns = wait_ns;
    if (c->overloaded && wait_ns > cinfer_codel_slough_ns(c)) {
        c->drops++;
        return 1;
    }
    return 0;
}

int cinfer_codel_overloaded(const cinfer_codel *c, int64_t now_ns)
{
    if (!c->target_ns || !c->started)
        return 0;
    int64_t t = now_ns > c->last_ns ? now_ns : c->last_ns;
    if (t >= cinfer_ns_add_sat(c->interval_end_ns, c->interval_ns))
        return 0; /* a whole interval without a dequeue: idle */
    if (t >= c->interval_end_ns)
        return c->min_wait_ns > c->target_ns; /* the verdict due next */
    return c->overloaded;
}

/* ---------------------------------------------------------------------- */
/* Shedder: params                                                        */
/* ---------------------------------------------------------------------- */

cinfer_shedder_params cinfer_shedder_default_params(void)
{
    cinfer_shedder_params p = {
        .max_queued_requests = 1024,
        .max_queued_tokens = 0,
        .kv_shed_permille = 990,
        .low_priority_spread_pct = 50,
        .rate_sample_ms = 1000,
        .rate_ewma_pct = 25,
        .pushback_min_ms = 0,
        .pushback_max_ms = 30000,
        .pushback_unknown_ms = 1000,
        .codel = cinfer_codel_default_params(),
        .rate_stale_ms = 0,
        .batch_gap_ms = 0,
    };
    return p;
}

cinfer_status cinfer_shedder_init(cinfer_shedder *s,
                                  const cinfer_shedder_params *p)
{
    if (!s || !p)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "shedder: NULL");
    if (p->kv_shed_permille > 1000)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "shedder: kv_shed_permille %u exceeds 1000",
                                p->kv_shed_permille);
    if (p->low_priority_spread_pct > 100)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "shedder: low_priority_spread_pct %u exceeds "
                                "100",
                                p->low_priority_spread_pct);
    if (p->rate_ewma_pct > 100)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "shedder: rate_ewma_pct %u exceeds 100",
                                p->rate_ewma_pct);
    if (p->rate_sample_ms < 0 || p->pushback_min_ms < 0 ||
        p->rate_stale_ms < 0 || p->batch_gap_ms < 0 ||
        p->pushback_max_ms < 0 || p->pushback_unknown_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "shedder: rate_sample_ms, rate_stale_ms, "
                                "batch_gap_ms and pushback_*_ms must not be "
                                "negative");
    cinfer_codel c;
    cinfer_status st = cinfer_codel_init(&c, &p->codel);
    if (st != CINFER_OK)
        return st;
    cinfer_shedder_params r = *p;
    if (!r.rate_sample_ms)
        r.rate_sample_ms = 1000;
    if (!r.rate_ewma_pct)
        r.rate_ewma_pct = 25;
    if (!r.pushback_max_ms)
        r.pushback_max_ms = 30000;
    if (r.pushback_min_ms > r.pushback_max_ms)
        r.pushback_min_ms = r.pushback_max_ms;
    if (!r.pushback_unknown_ms)
        r.pushback_unknown_ms = 1000;
    if (!r.rate_stale_ms)
        r.rate_stale_ms = r.rate_sample_ms > INT64_MAX / 8
                              ? INT64_MAX
                              : 8 * r.rate_sample_ms;
    if (!r.batch_gap_ms)
        r.batch_gap_ms = r.rate_sample_ms / 100 ? r.rate_sample_ms / 100 : 1;
    memset(s, 0, sizeof *s);
    s->p = r;
    s->codel = c;
    s->engine_waiting = -1;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Shedder: time and the service rate                                     */
/* ---------------------------------------------------------------------- */

static uint64_t add_sat_u64(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* Time from t to the deadline, saturating; <= 0 when it has passed. */
static int64_t time_left(int64_t deadline_ns, int64_t t)
{
    int64_t r;
    if (__builtin_sub_overflow(deadline_ns, t, &r))
        return deadline_ns > t ? INT64_MAX : INT64_MIN;
    return r;
}

/* The effective time (never earlier than one seen); backlog time
 * accumulates while the queue is non-empty. */
static int64_t see(cinfer_shedder *s, int64_t now_ns)
{
    if (!s->started) {
        s->started = 1;
        s->last_ns = now_ns;
        s->last_departure_ns = now_ns;
    } else if (now_ns > s->last_ns) {
        if (s->queued_requests) {
            uint64_t d = (uint64_t)now_ns - (uint64_t)s->last_ns;
            s->backlog_ns = d > (uint64_t)(INT64_MAX - s->backlog_ns)
                                ? INT64_MAX
                                : s->backlog_ns + (int64_t)d;
        }
        s->last_ns = now_ns;
    }
    return s->last_ns;
}

static uint64_t ewma(const cinfer_shedder *s, uint64_t rate, uint64_t x)
{
    if (x >= rate)
        return rate +
               (uint64_t)((u128)(x - rate) * s->p.rate_ewma_pct / 100);
    return rate - (uint64_t)((u128)(rate - x) * s->p.rate_ewma_pct / 100);
}

static uint64_t rate_of(uint64_t tokens, int64_t backlog_ns)
{
    if (backlog_ns <= 0)
        return UINT64_MAX;
    u128 r = (u128)tokens * UNITS_PER_TOKEN / (uint64_t)backlog_ns;
    return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

/* Closes a rate sample once it holds rate_sample_ms of backlog. Until a
 * first departure the rate stays unknown: a first prompt that takes longer
 * than a sample to its first token (a long one on a CPU) says how long
 * that prompt is, not that the engine is stuck, and a rate of 0 from it
 * would shed every deadline for rate_stale_ms. The sample grows until
 * something leaves; a stuck engine is then the watchdog's and CoDel's. */
static void sample(cinfer_shedder *s)
{
    int64_t need = cinfer_ms_to_ns(s->p.rate_sample_ms);
    if (s->backlog_ns < need || (!s->rate_known && !s->departed_tokens))
        return;
    uint64_t x = rate_of(s->departed_tokens, s->backlog_ns);
    s->closed_ns = s->last_ns;
    s->closed_backlog_ns = s->backlog_ns;
    s->closed_tokens = s->departed_tokens;
    s->closed_prev_mtps = s->rate_mtps;
    s->closed_prev_known = s->rate_known;
    s->rate_mtps = s->rate_known ? ewma(s, s->rate_mtps, x) : x;
    s->rate_known = 1;
    s->backlog_ns = 0;
    s->departed_tokens = 0;
}

/* A departure of `tokens` at the effective time t: counted in the sample
 * that closed within batch_gap_ms (its batch), else in the open one. */
static void depart(cinfer_shedder *s, uint64_t tokens, int64_t t)
{
    s->last_departure_ns = t;
    int64_t gap = cinfer_ms_to_ns(s->p.batch_gap_ms);
    if (s->closed_ns && t - s->closed_ns <= gap) {
        s->closed_tokens = add_sat_u64(s->closed_tokens, tokens);
        uint64_t x = rate_of(s->closed_tokens, s->closed_backlog_ns);
        s->rate_mtps = s->closed_prev_known ? ewma(s, s->closed_prev_mtps, x)
                                            : x;
        return;
    }
    s->departed_tokens = add_sat_u64(s->departed_tokens, tokens);
}

/* The rate is stale after rate_stale_ms without a departure (counted from
 * the first time seen when nothing ever left). */
static int stale(const cinfer_shedder *s)
{
    int64_t since = time_left(s->last_ns, s->last_departure_ns);
    return since > cinfer_ms_to_ns(s->p.rate_stale_ms);
}

/* ---------------------------------------------------------------------- */
/* Shedder: predictions and bounds                                        */
/* ---------------------------------------------------------------------- */

static int level_of(int priority)
{
    if (priority < CINFER_PRIORITY_MIN)
        priority = CINFER_PRIORITY_MIN;
    if (priority > CINFER_PRIORITY_MAX)
        priority = CINFER_PRIORITY_MAX;
    return priority - CINFER_PRIORITY_MIN;
}

/* A bound as it applies to a priority: whole for >= 0, cut linearly down
 * to (100 - spread) % at the lowest priority, never below 1. */
static uint64_t bound_for(const cinfer_shedder *s, uint64_t bound, int level)
{
    int prio = level + CINFER_PRIORITY_MIN;
    if (!bound || prio >= 0)
        return bound;
    u128 cut = (u128)bound * s->p.low_priority_spread_pct * (uint64_t)(-prio) /
               (100 * (uint64_t)-CINFER_PRIORITY_MIN);
    uint64_t b = bound - (uint64_t)cut;
    return b ? b : 1;
}

/* Queued tokens of a strictly higher priority than level. */
static uint64_t tokens_above(const cinfer_shedder *s, int level)
{
    uint64_t sum = 0;
    for (int l = level + 1; l < CINFER_PRIORITY_LEVELS; l++)
        sum = add_sat_u64(sum, s->level_tokens[l]);
    return sum;
}

/* Predicted wait for `ahead` tokens: -1 unknown or stale rate, INT64_MAX
 * at rate 0. */
static int64_t predict(const cinfer_shedder *s, uint64_t ahead)
{
    if (!s->rate_known || stale(s))
        return -1;
    if (!ahead)
        return 0;
    if (!s->rate_mtps)
        return INT64_MAX;
    u128 ns = (u128)ahead * UNITS_PER_TOKEN / s->rate_mtps;
    return ns > (u128)INT64_MAX ? INT64_MAX : (int64_t)ns;
}

static int64_t pushback_ns(const cinfer_shedder *s, int64_t predicted)
{
    if (predicted < 0)
        return cinfer_ms_to_ns(s->p.pushback_unknown_ms);
    int64_t lo = cinfer_ms_to_ns(s->p.pushback_min_ms);
    int64_t hi = cinfer_ms_to_ns(s->p.pushback_max_ms);
    return predicted < lo ? lo : predicted > hi ? hi : predicted;
}

int64_t cinfer_shedder_predicted_wait_ns(cinfer_shedder *s, int priority,
                                         int64_t now_ns)
{
    see(s, now_ns);
    sample(s);
    int level = level_of(priority);
    return predict(s,
                   add_sat_u64(tokens_above(s, level), s->level_tokens[level]));
}

void cinfer_shedder_observe_token_time(cinfer_shedder *s, int64_t ns)
{
    if (ns <= 0)
        return;
    if (!s->token_ns)
        s->token_ns = ns;
    else
        s->token_ns += (ns - s->token_ns) / 8;
    if (s->token_ns <= 0)
        s->token_ns = 1;
}

/* Its own stream time: gen_tokens at the per-token time, saturating; 0
 * when not counted (no gen_tokens, unknown per-token time, idle server). */
static int64_t stream_ns(const cinfer_shedder *s,
                         const cinfer_shed_request *rq, uint64_t ahead)
{
    if (!rq->gen_tokens || s->token_ns <= 0 || (!ahead && !rq->running))
        return 0;
    u128 ns = (u128)rq->gen_tokens * (uint64_t)s->token_ns;
    return ns > (u128)INT64_MAX ? INT64_MAX : (int64_t)ns;
}

void cinfer_shedder_set_kv_usage(cinfer_shedder *s, uint32_t permille)
{
    s->kv_permille = permille > 1000 ? 1000 : permille;
}

void cinfer_shedder_set_engine_waiting(cinfer_shedder *s, int64_t waiting)
{
    s->engine_waiting = waiting < 0 ? 0 : waiting;
}

/* CoDel sheds a request that waits (or would wait) past the slough
 * timeout only while it says overloaded and the engine holds requests
 * back: one the engine starts at once is no standing queue. */
static int codel_sheds(cinfer_shedder *s, int64_t wait_ns, int64_t t)
{
    return s->engine_waiting != 0 &&
           wait_ns > cinfer_codel_slough_ns(&s->codel) &&
           cinfer_codel_overloaded(&s->codel, t);
}

/* A CoDel shed's pushback: at least the interval after which CoDel judges
 * the queue again. */
static int64_t codel_pushback_ns(const cinfer_shedder *s, int64_t pushback)
{
    return pushback < s->codel.interval_ns ? s->codel.interval_ns : pushback;
}

/* ---------------------------------------------------------------------- */
/* Shedder: queue                                                         */
/* ---------------------------------------------------------------------- */

cinfer_reject cinfer_shedder_admit(cinfer_shedder *s,
                                   const cinfer_shed_request *rq,
                                   int64_t now_ns, cinfer_shed_entry *entry,
                                   int64_t *pushback)
{
    int64_t t = see(s, now_ns);
    sample(s);
    memset(entry, 0, sizeof *entry);
    int level = level_of(rq->priority);
    uint64_t ahead =
        add_sat_u64(tokens_above(s, level), s->level_tokens[level]);
    int64_t predicted = predict(s, ahead);
    cinfer_reject r = CINFER_REJECT_NONE;
    uint64_t lr = bound_for(s, s->p.max_queued_requests, level);
    uint64_t lt = bound_for(s, s->p.max_queued_tokens, level);
    uint64_t lkv = bound_for(s, s->p.kv_shed_permille, level);
    int64_t left = rq->deadline_ns ? time_left(rq->deadline_ns, t) : INT64_MAX;

    if (left <= 0)
        r = CINFER_REJECT_SHED_DEADLINE;
    else if (lr && s->queued_requests >= lr)
        r = CINFER_REJECT_SHED_QUEUE_FULL;
    else if (lt && s->queued_requests &&
             add_sat_u64(s->queued_tokens, rq->tokens) > lt)
        r = CINFER_REJECT_SHED_TOKENS;
    else if (lkv && s->queued_requests && s->kv_permille >= lkv)
        r = CINFER_REJECT_SHED_KV_PRESSURE;
    else if (predicted > left)
        r = CINFER_REJECT_SHED_DEADLINE;
    else if (cinfer_ns_add_sat(predicted > 0 ? predicted : 0,
                               stream_ns(s, rq, ahead)) > left) {
        r = CINFER_REJECT_SHED_DEADLINE;
        if (predicted <= 0)
            predicted = -1; /* its own stream is too long: no drain time */
    }
    else if (rq->deadline_ns && codel_sheds(s, predicted, t))
        r = CINFER_REJECT_SHED_CODEL;

    if (pushback) {
        *pushback = r == CINFER_REJECT_NONE ? 0 : pushback_ns(s, predicted);
        if (r == CINFER_REJECT_SHED_CODEL)
            *pushback = codel_pushback_ns(s, *pushback);
    }
    if (r != CINFER_REJECT_NONE)
        return r;

    entry->queued = 1;
    entry->level = level;
    entry->tokens = rq->tokens;
    entry->ahead_mark = s->level_in[level];
    entry->enqueued_ns = t;
    entry->deadline_ns = rq->deadline_ns;
    s->queued_requests++;
    s->queued_tokens = add_sat_u64(s->queued_tokens, rq->tokens);
    s->level_requests[level]++;
    s->level_tokens[level] = add_sat_u64(s->level_tokens[level], rq->tokens);
    s->level_in[level] += rq->tokens; /* wraps consistently with level_out */
    return CINFER_REJECT_NONE;
}

static void take_out(cinfer_shedder *s, cinfer_shed_entry *e)
{
    int l = e->level;
    CINFER_ASSERT(s->queued_requests > 0 && s->level_requests[l] > 0);
    s->queued_requests--;
    s->level_requests[l]--;
    s->queued_tokens -=
        e->tokens < s->queued_tokens ? e->tokens : s->queued_tokens;
    s->level_tokens[l] -=
        e->tokens < s->level_tokens[l] ? e->tokens : s->level_tokens[l];
    s->level_out[l] += e->tokens;
    e->queued = 0;
}

cinfer_reject cinfer_shedder_check(cinfer_shedder *s,
                                   const cinfer_shed_entry *e, int64_t now_ns,
                                   int64_t *pushback)
{
    if (pushback)
        *pushback = 0;
    if (!e->queued)
        return CINFER_REJECT_NONE;
    int64_t t = see(s, now_ns);
    sample(s);
    int l = e->level;
    /* its own level: enqueued before it and not gone yet */
    int64_t diff = (int64_t)(e->ahead_mark - s->level_out[l]); /* mod 2^64 */
    uint64_t same = diff > 0 ? (uint64_t)diff : 0;
    uint64_t others =
        s->level_tokens[l] > e->tokens ? s->level_tokens[l] - e->tokens : 0;
    if (same > others)
        same = others;
    int64_t predicted = predict(s, add_sat_u64(tokens_above(s, l), same));
    int64_t left = e->deadline_ns ? time_left(e->deadline_ns, t) : INT64_MAX;
    int64_t waited = time_left(t, e->enqueued_ns);
    cinfer_reject r = CINFER_REJECT_NONE;
    if (left <= 0 || predicted > left)
        r = CINFER_REJECT_SHED_DEADLINE;
    else if (e->deadline_ns && codel_sheds(s, waited, t))
        r = CINFER_REJECT_SHED_CODEL;
    if (pushback && r != CINFER_REJECT_NONE) {
        *pushback = pushback_ns(s, predicted);
        if (r == CINFER_REJECT_SHED_CODEL)
            *pushback = codel_pushback_ns(s, *pushback);
    }
    return r;
}

cinfer_reject cinfer_shedder_dequeue(cinfer_shedder *s, cinfer_shed_entry *e,
                                     int64_t now_ns, int64_t wait_ns,
                                     int64_t *pushback)
{
    if (pushback)
        *pushback = 0;
    if (!e->queued)
        return CINFER_REJECT_NONE;
    int64_t t = see(s, now_ns);
    int64_t waited = wait_ns >= 0 ? wait_ns : time_left(t, e->enqueued_ns);
    cinfer_reject r = CINFER_REJECT_NONE;
    if (e->deadline_ns && time_left(e->deadline_ns, t) <= 0)
        r = CINFER_REJECT_SHED_DEADLINE;
    else if (cinfer_codel_on_dequeue(&s->codel, waited, t) && e->deadline_ns)
        r = CINFER_REJECT_SHED_CODEL;
    take_out(s, e);
    if (r == CINFER_REJECT_NONE)
        depart(s, e->tokens, t);
    sample(s);
    if (pushback && r != CINFER_REJECT_NONE) {
        uint64_t ahead =
            add_sat_u64(tokens_above(s, e->level), s->level_tokens[e->level]);
        *pushback = pushback_ns(s, predict(s, ahead));
        if (r == CINFER_REJECT_SHED_CODEL)
            *pushback = codel_pushback_ns(s, *pushback);
    }
    return r;
}

void cinfer_shedder_remove(cinfer_shedder *s, cinfer_shed_entry *e,
                           int64_t now_ns)
{
    if (!e->queued)
        return;
    see(s, now_ns);
    take_out(s, e);
    sample(s);
}
