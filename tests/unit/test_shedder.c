/*
 * test_shedder.c - load shedding with an injected clock: queue and token
 * bounds, lower priority shed first, Little's-law prediction (a predicted
 * wait equal to the time left is admitted, one nanosecond more is shed; no
 * deadline is an infinite one; only work of a priority >= the request's is
 * ahead of it), the measured service rate (backlog-only samples, EWMA, a
 * stuck queue, a batch leaving together measured whole, a stale estimate
 * recovering, a first sample that waits for a first departure), the request's own stream time in the deadline check,
 * re-checks of queued requests, KV pressure, CoDel at
 * admission, while waiting and at dequeue, pushback clamping, the clock
 * going backwards and overflow.
 */
#include "resilience/resilience.h"
#include "tests/unit/harness.h"

#define MS 1000000LL
#define S 1000000000LL

static cinfer_shedder_params base_params(void)
{
    cinfer_shedder_params p = cinfer_shedder_default_params();
    p.max_queued_requests = 0;
    p.max_queued_tokens = 0;
    p.kv_shed_permille = 0;
    p.codel.target_ms = 0; /* CoDel off unless a test wants it */
    return p;
}

static cinfer_shedder make(const cinfer_shedder_params *p)
{
    cinfer_shedder s;
    CHECK_OK(cinfer_shedder_init(&s, p));
    return s;
}

static cinfer_reject admit(cinfer_shedder *s, uint64_t tokens, int prio,
                           int64_t deadline, int64_t t, cinfer_shed_entry *e)
{
    cinfer_shed_request rq = {
        .tokens = tokens, .priority = prio, .deadline_ns = deadline};
    cinfer_shed_entry scratch;
    return cinfer_shedder_admit(s, &rq, t, e ? e : &scratch, NULL);
}

/* Gives s a measured rate of tps tokens/s: a request of tps tokens queued
 * at t and run 1 s later (one sample of 1 s of backlog). Returns t + 1 s. */
static int64_t set_rate(cinfer_shedder *s, uint64_t tps, int64_t t)
{
    cinfer_shed_entry e;
    CHECK_EQ_INT(admit(s, tps, 0, 0, t, &e), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(s, &e, t + S, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(s->rate_known, 1);
    CHECK_EQ_INT(s->rate_mtps, tps * 1000);
    return t + S;
}

static void test_queue_bound(void)
{
    cinfer_shedder_params p = base_params();
    p.max_queued_requests = 4;
    cinfer_shedder s = make(&p);
    cinfer_shed_entry e[5];
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(admit(&s, 10, 0, 0, 0, &e[i]), CINFER_REJECT_NONE);
    cinfer_shed_request rq = {.tokens = 10};
    int64_t pb = 0;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, 0, &e[4], &pb),
                 CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(e[4].queued, 0);
    CHECK_EQ_INT(pb, 1000 * MS); /* rate unknown: pushback_unknown_ms */
    CHECK_EQ_INT(s.queued_requests, 4);
    CHECK_EQ_INT(s.queued_tokens, 40);
    cinfer_shedder_remove(&s, &e[1], 0);
    cinfer_shedder_remove(&s, &e[1], 0); /* twice: no-op */
    CHECK_EQ_INT(s.queued_requests, 3);
    CHECK_EQ_INT(admit(&s, 10, 0, 0, 0, &e[4]), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 10, 0, 0, 0, NULL), CINFER_REJECT_SHED_QUEUE_FULL);
}

static void test_token_bound(void)
{
    cinfer_shedder_params p = base_params();
    p.max_queued_tokens = 100;
    cinfer_shedder s = make(&p);
    cinfer_shed_entry a, b;
    /* an empty queue takes a request of any size */
    CHECK_EQ_INT(admit(&s, 500, 0, 0, 0, &a), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, 0, 0, 0, NULL), CINFER_REJECT_SHED_TOKENS);
    cinfer_shedder_remove(&s, &a, 0);
    CHECK_EQ_INT(admit(&s, 60, 0, 0, 0, &a), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 41, 0, 0, 0, NULL), CINFER_REJECT_SHED_TOKENS);
    CHECK_EQ_INT(admit(&s, 40, 0, 0, 0, &b), CINFER_REJECT_NONE); /* = 100 */
    CHECK_EQ_INT(s.queued_tokens, 100);
}

static void test_lower_priority_shed_first(void)
{
    cinfer_shedder_params p = base_params();
    p.max_queued_requests = 10;
    p.low_priority_spread_pct = 50; /* -100: 5, -50: 8, >= 0: 10 */
    cinfer_shedder s = make(&p);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(admit(&s, 1, 0, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, -100, 0, 0, NULL), CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(admit(&s, 1, 0, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, 100, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, 100, 0, 0, NULL), CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(s.queued_requests, 10);

    /* the token bound and KV threshold scale the same way */
    p = base_params();
    p.max_queued_tokens = 1000;
    p.kv_shed_permille = 990; /* -100: 495, -50: 743 */
    p.low_priority_spread_pct = 50;
    s = make(&p);
    CHECK_EQ_INT(admit(&s, 400, 0, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 101, -100, 0, 0, NULL), CINFER_REJECT_SHED_TOKENS);
    CHECK_EQ_INT(admit(&s, 100, -100, 0, 0, NULL), CINFER_REJECT_NONE);
    /* -50: at most 750 tokens, KV threshold 743 permille */
    cinfer_shedder_set_kv_usage(&s, 743);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_SHED_KV_PRESSURE);
    cinfer_shedder_set_kv_usage(&s, 742);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_NONE);
    cinfer_shedder_set_kv_usage(&s, 989);
    CHECK_EQ_INT(admit(&s, 1, -50, 0, 0, NULL), CINFER_REJECT_SHED_KV_PRESSURE);
    CHECK_EQ_INT(admit(&s, 1, 0, 0, 0, NULL), CINFER_REJECT_NONE);

    /* spread 0: priority does not change the bounds */
    p = base_params();
    p.max_queued_requests = 2;
    p.low_priority_spread_pct = 0;
    s = make(&p);
    CHECK_EQ_INT(admit(&s, 1, -100, 0, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, -100, 0, 0, NULL), CINFER_REJECT_NONE);
    /* and the smallest share is never 0: an empty queue takes anyone */
    p.max_queued_requests = 1;
    p.low_priority_spread_pct = 100;
    s = make(&p);
    CHECK_EQ_INT(admit(&s, 1, -100, 0, 0, NULL), CINFER_REJECT_NONE);
}

static void test_littles_law_predicted_wait_equal_to_deadline(void)
{
    /* Decision: a predicted wait equal to the time left is admitted; the
     * request is shed only when the prediction exceeds it. */
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1000, 0); /* 1000 tokens/s */
    cinfer_shed_entry a, b;
    CHECK_EQ_INT(admit(&s, 500, 0, 0, t, &a), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t), 500 * MS);
    cinfer_shed_request rq = {.tokens = 7, .deadline_ns = t + 500 * MS - 1};
    int64_t pb = 0;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &b, &pb),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(pb, 500 * MS); /* the predicted wait */
    rq.deadline_ns = t + 500 * MS;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &b, &pb), CINFER_REJECT_NONE);
    CHECK_EQ_INT(pb, 0);
    /* the queue's own wait moves the line: 507 tokens ahead now */
    CHECK_EQ_INT(admit(&s, 1, 0, t + 507 * MS, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, 0, t + 508 * MS - 1, t, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
}

static void test_no_deadline_is_infinite(void)
{
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1, 0); /* 1 token/s */
    CHECK_EQ_INT(admit(&s, 1000000, 0, 0, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t), 1000000 * S);
    CHECK_EQ_INT(admit(&s, 1, 0, 0, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, 0, t + 3600 * S, t, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(admit(&s, 1, 0, INT64_MAX, t, NULL), CINFER_REJECT_NONE);
}

static void test_deadline_already_passed(void)
{
    /* even on an idle server with an unknown rate */
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    CHECK_EQ_INT(admit(&s, 1, 0, 5 * S, 5 * S, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(admit(&s, 1, 0, 4 * S, 5 * S, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(admit(&s, 1, 0, 5 * S + 1, 5 * S, NULL), CINFER_REJECT_NONE);
}

static void test_only_higher_priority_work_is_ahead(void)
{
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1000, 0);
    CHECK_EQ_INT(admit(&s, 500, 0, 0, t, NULL), CINFER_REJECT_NONE);
    /* a higher priority runs first: nothing ahead of it */
    CHECK_EQ_INT(admit(&s, 1, 10, t + 1, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 50, t), 0);
    /* a lower one waits for the 501 tokens above it */
    CHECK_EQ_INT(admit(&s, 1, -10, t + 100 * MS, t, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(admit(&s, 1, -10, t + 501 * MS, t, NULL), CINFER_REJECT_NONE);
}

static void test_unknown_rate_sheds_nothing_on_prediction(void)
{
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    for (int i = 0; i < 100; i++)
        CHECK_EQ_INT(admit(&s, 1000000, 0, 1, 0, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, 0), -1);
}

static void test_service_rate_measured_over_backlog(void)
{
    cinfer_shedder_params p = base_params();
    p.rate_sample_ms = 1000;
    p.rate_ewma_pct = 25;
    p.rate_stale_ms = 3600 * 1000; /* staleness: see the recovery test */
    cinfer_shedder s = make(&p);
    /* idle time does not count: 10 s of nothing, then a backlog of 1 s */
    cinfer_shed_entry e;
    int64_t t = 10 * S;
    CHECK_EQ_INT(admit(&s, 400, 0, 0, t, &e), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e, t + 500 * MS, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(s.rate_known, 0); /* half a second of backlog so far */
    t += 20 * S;
    CHECK_EQ_INT(admit(&s, 400, 0, 0, t, &e), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e, t + 500 * MS, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(s.rate_known, 1);
    CHECK_EQ_INT(s.rate_mtps, 800 * 1000); /* 800 tokens in 1 s */
    /* a second sample at 1600 tokens/s: EWMA moves a quarter of the way */
    t += 10 * S;
    CHECK_EQ_INT(admit(&s, 1600, 0, 0, t, &e), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e, t + S, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(s.rate_mtps, 1000 * 1000);
    /* a stuck queue: a second of backlog with no departure pulls it down */
    t += 10 * S;
    CHECK_EQ_INT(admit(&s, 10, 0, 0, t, &e), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t + S),
                 10 * MS * 4 / 3);
    CHECK_EQ_INT(s.rate_mtps, 750 * 1000);
    for (int i = 2; i < 40; i++)
        cinfer_shedder_predicted_wait_ns(&s, 0, t + i * S);
    CHECK(s.rate_mtps < 10 * 1000);
    /* and a dead one: rate 0, every deadline is missed */
    s.rate_mtps = 0;
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t + 40 * S),
                 INT64_MAX);
    CHECK_EQ_INT(admit(&s, 1, 0, t + 3600 * S, t + 40 * S, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
}

static void test_batch_dequeue_measures_the_full_rate(void)
{
    cinfer_shedder_params p = base_params();
    p.rate_sample_ms = 1000;
    p.rate_ewma_pct = 25;
    cinfer_shedder s = make(&p);
    CHECK_EQ_INT(s.p.batch_gap_ms, 10); /* rate_sample_ms / 100 */
    /* eight requests of 100 tokens queued at 0; a batch takes all eight
     * off the queue at 1 s, a few microseconds apart */
    cinfer_shed_entry e[8];
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(admit(&s, 100, 0, 0, 0, &e[i]), CINFER_REJECT_NONE);
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[i], S + i * 3000, -1, NULL),
                     CINFER_REJECT_NONE);
    /* the sample closed at the first; the whole batch counts: 800 tokens
     * in 1 s of backlog, not 100 */
    CHECK_EQ_INT(s.rate_known, 1);
    CHECK_EQ_INT(s.rate_mtps, 800 * 1000);
    CHECK_EQ_INT(s.departed_tokens, 0);
    /* a second batch, same size and time: the EWMA stays at 800 (the
     * batch is not split between two samples; the 21 us the first batch
     * took to leave are backlog of this sample) */
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(admit(&s, 100, 0, 0, 2 * S, &e[i]), CINFER_REJECT_NONE);
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(
            cinfer_shedder_dequeue(&s, &e[i], 3 * S + i * 3000, -1, NULL),
            CINFER_REJECT_NONE);
    CHECK(s.rate_mtps > 799990 && s.rate_mtps <= 800 * 1000);
    uint64_t r2 = s.rate_mtps;
    /* a departure past the gap opens the next sample instead */
    CHECK_EQ_INT(admit(&s, 100, 0, 0, 4 * S, &e[0]), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 100, 0, 0, 4 * S, &e[1]), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[0], 4 * S + 500 * MS, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(s.rate_mtps, r2); /* 0.5 s of backlog: still open */
    CHECK_EQ_INT(s.departed_tokens, 100);
    /* shed departures are not service: they do not join a batch */
    CHECK_EQ_INT(admit(&s, 100, 0, 5 * S + 1, 4 * S, &e[2]),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[1], 5 * S, -1, NULL),
                 CINFER_REJECT_NONE); /* closes: 200 tokens in 1 s */
    uint64_t r3 = r2 - (r2 - 200 * 1000) / 4;
    CHECK(s.rate_mtps + 2 >= r3 && s.rate_mtps <= r3 + 2);
    r3 = s.rate_mtps;
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[2], 5 * S + 1, -1, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(s.rate_mtps, r3);
}

static void test_stale_estimate_recovers(void)
{
    cinfer_shedder_params p = base_params();
    p.rate_sample_ms = 1000;
    p.rate_ewma_pct = 25;
    cinfer_shedder s = make(&p);
    CHECK_EQ_INT(s.p.rate_stale_ms, 8000); /* 8 x rate_sample_ms */
    /* a known rate (the last departure at 1 s), then a stuck engine: a
     * second of backlog with no departure pulls the rate down, and after
     * many such seconds it is as good as 0 */
    int64_t t0 = set_rate(&s, 1000, 0);
    cinfer_shed_entry stuck;
    CHECK_EQ_INT(admit(&s, 10, 0, 0, t0, &stuck), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t0 + S),
                 10 * MS * 4 / 3);
    CHECK_EQ_INT(s.rate_mtps, 750 * 1000);
    s.rate_mtps = 0;
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t0 + S), INT64_MAX);
    /* while fresh, everything behind it with a deadline is shed */
    int64_t pb = 0;
    cinfer_shed_request rq = {.tokens = 1, .deadline_ns = 3600 * S};
    cinfer_shed_entry e;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t0 + 8 * S, &e, &pb),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(pb, 30000 * MS);
    /* 8 s without a departure and one ns more: stale, so the estimate
     * that sheds everything no longer does (nothing leaves to correct it) */
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t0 + 8 * S + 1), -1);
    rq.deadline_ns = t0 + 8 * S + 2 * S;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t0 + 8 * S + 1, &e, &pb),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(pb, 0);
    /* a queued request is not shed on a stale prediction either */
    CHECK_EQ_INT(cinfer_shedder_check(&s, &e, t0 + 9 * S, NULL),
                 CINFER_REJECT_NONE);
    /* the engine moves again: departures measure the rate and it climbs
     * back (EWMA) from 0 */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &stuck, t0 + 9 * S, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e, t0 + 9 * S, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK(s.rate_mtps > 0);
    int64_t t = t0 + 10 * S;
    for (int i = 0; i < 20; i++, t += S) {
        CHECK_EQ_INT(admit(&s, 1000, 0, 0, t, &e), CINFER_REJECT_NONE);
        CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e, t + S, -1, NULL),
                     CINFER_REJECT_NONE);
    }
    CHECK(s.rate_mtps > 990 * 1000 && s.rate_mtps <= 1000 * 1000);
    /* fresh again: prediction is back */
    CHECK_EQ_INT(admit(&s, 500, 0, 0, t, &e), CINFER_REJECT_NONE);
    int64_t w = cinfer_shedder_predicted_wait_ns(&s, 0, t);
    CHECK(w >= 500 * MS && w < 506 * MS);
}

/* A first prompt slower to its first token than a sample (a long prompt on
 * a CPU) is not a stuck engine: the rate stays unknown, nothing is shed on
 * prediction, and the first departure measures the rate over the whole
 * backlog. */
static void test_first_sample_waits_for_a_departure(void)
{
    cinfer_shedder_params p = base_params();
    p.rate_sample_ms = 1000;
    cinfer_shedder s = make(&p);
    cinfer_shed_entry first;
    CHECK_EQ_INT(admit(&s, 4000, 0, 0, 0, &first), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, 5 * S), -1);
    CHECK_EQ_INT(s.rate_known, 0);
    /* a newcomer with a deadline is admitted, not shed on a rate of 0 */
    cinfer_shed_entry e;
    CHECK_EQ_INT(admit(&s, 10, 0, 60 * S, 5 * S, &e), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &first, 10 * S, -1, NULL),
                 CINFER_REJECT_NONE);
    /* 4000 tokens over 10 s of backlog */
    CHECK_EQ_INT(s.rate_known, 1);
    CHECK_EQ_INT(s.rate_mtps, 400 * 1000);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e, 10 * S, -1, NULL),
                 CINFER_REJECT_NONE);
}

static void test_stream_time_counted_in_deadline_check(void)
{
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1000, 0); /* 1000 tokens/s */
    cinfer_shedder_observe_token_time(&s, 0);  /* ignored */
    cinfer_shedder_observe_token_time(&s, -5); /* ignored */
    CHECK_EQ_INT(s.token_ns, 0);
    cinfer_shedder_observe_token_time(&s, 10 * MS);
    CHECK_EQ_INT(s.token_ns, 10 * MS);
    cinfer_shedder_observe_token_time(&s, 18 * MS); /* weight 1/8 */
    CHECK_EQ_INT(s.token_ns, 11 * MS);
    cinfer_shedder_observe_token_time(&s, 3 * MS);
    CHECK_EQ_INT(s.token_ns, 10 * MS);

    /* 100 tokens to stream at 10 ms: 1 s of its own. Joining a running
     * batch with 500 ms left it can not finish: shed, pushback unknown
     * (nothing to drain, its stream is too long) */
    int64_t pb = 0;
    cinfer_shed_entry e;
    cinfer_shed_request rq = {.tokens = 110,
                              .deadline_ns = t + 500 * MS,
                              .gen_tokens = 100,
                              .running = 1};
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &e, &pb),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(pb, 1000 * MS);
    /* exactly 1 s left: admitted (a tie is given the benefit) */
    rq.deadline_ns = t + S;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &e, NULL),
                 CINFER_REJECT_NONE);
    /* now 110 tokens are queued ahead: wait 110 ms + stream 1 s */
    rq.running = 0;
    rq.deadline_ns = t + 1110 * MS - 1;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &e, &pb),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(pb, 110 * MS); /* the queue ahead drains in 110 ms */
    rq.deadline_ns = t + 1110 * MS;
    cinfer_shed_entry e2;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &e2, NULL),
                 CINFER_REJECT_NONE);
    /* without gen_tokens only the wait counts */
    rq.gen_tokens = 0;
    rq.deadline_ns = t + 300 * MS;
    CHECK_EQ_INT(admit(&s, 110, 0, t + 300 * MS, t, NULL),
                 CINFER_REJECT_NONE);

    /* an idle server (nothing queued, nothing running) counts the wait
     * alone: a client may want the partial stream it can get */
    cinfer_shedder idle = make(&p);
    cinfer_shedder_observe_token_time(&idle, 10 * MS);
    cinfer_shed_request lone = {
        .tokens = 110, .deadline_ns = 100 * MS, .gen_tokens = 100};
    CHECK_EQ_INT(cinfer_shedder_admit(&idle, &lone, 0, &e, NULL),
                 CINFER_REJECT_NONE);
    /* an unknown per-token time counts nothing */
    cinfer_shedder fresh = make(&p);
    lone.running = 5;
    CHECK_EQ_INT(cinfer_shedder_admit(&fresh, &lone, 0, &e, NULL),
                 CINFER_REJECT_NONE);
}

static void test_queued_request_rechecked(void)
{
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1000, 0);
    cinfer_shed_entry a, b, c;
    CHECK_EQ_INT(admit(&s, 500, 0, 0, t, &a), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 500, 0, t + S, t, &b), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 500, 0, 0, t, &c), CINFER_REJECT_NONE);
    /* b has a's 500 tokens ahead (not c's, which came later) */
    int64_t pb = -1;
    CHECK_EQ_INT(cinfer_shedder_check(&s, &b, t + 500 * MS, &pb),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(pb, 0);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &b, t + 500 * MS + 1, &pb),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(pb, 500 * MS);
    /* once a has gone to run, nothing is ahead of b */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &a, t + 600 * MS, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &b, t + 600 * MS, NULL),
                 CINFER_REJECT_NONE);
    /* until the deadline itself passes */
    CHECK_EQ_INT(cinfer_shedder_check(&s, &b, t + S - 1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &b, t + S, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    /* check changes nothing: the caller removes */
    CHECK_EQ_INT(b.queued, 1);
    CHECK_EQ_INT(s.queued_requests, 2);
    /* and at dequeue, a passed deadline is a shed, out of the queue */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &b, t + S, -1, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(b.queued, 0);
    CHECK_EQ_INT(s.queued_requests, 1);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &b, t + S, NULL),
                 CINFER_REJECT_NONE); /* unqueued: nothing to check */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &b, t + S, -1, NULL),
                 CINFER_REJECT_NONE);
    cinfer_shedder_remove(&s, &c, t + S);
    CHECK_EQ_INT(s.queued_requests, 0);
    CHECK_EQ_INT(s.queued_tokens, 0);
}

static void test_kv_pressure(void)
{
    cinfer_shedder_params p = base_params();
    p.kv_shed_permille = 990;
    cinfer_shedder s = make(&p);
    cinfer_shedder_set_kv_usage(&s, 995);
    /* nothing waits: a newcomer waits for nobody, admitted */
    CHECK_EQ_INT(admit(&s, 1, 0, 0, 0, NULL), CINFER_REJECT_NONE);
    int64_t pb = 0;
    cinfer_shed_request rq = {.tokens = 1};
    cinfer_shed_entry e;
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, 0, &e, &pb),
                 CINFER_REJECT_SHED_KV_PRESSURE);
    CHECK_EQ_INT(pb, 1000 * MS);
    cinfer_shedder_set_kv_usage(&s, 989);
    CHECK_EQ_INT(admit(&s, 1, 0, 0, 0, NULL), CINFER_REJECT_NONE);
    cinfer_shedder_set_kv_usage(&s, 5000); /* clamped to 1000 */
    CHECK_EQ_INT(s.kv_permille, 1000);
    CHECK_EQ_INT(admit(&s, 1, 100, 0, 0, NULL), CINFER_REJECT_SHED_KV_PRESSURE);
}

static void test_codel_at_admission_while_queued_and_at_dequeue(void)
{
    cinfer_shedder_params p = base_params();
    p.codel.target_ms = 5;
    p.codel.interval_ms = 100;
    cinfer_shedder s = make(&p);
    /* nine requests queued at 0; the first runs at 1 s (1000 tokens/s).
     * CoDel sheds only requests with a deadline (someone waits on a
     * timer); these have a far one, e[7] none. */
    const int64_t far = 100 * S;
    cinfer_shed_entry r0, e[8];
    CHECK_EQ_INT(admit(&s, 1000, 0, far, 0, &r0), CINFER_REJECT_NONE);
    for (int i = 0; i < 8; i++)
        CHECK_EQ_INT(admit(&s, 1, 0, i < 7 ? far : 0, 0, &e[i]),
                     CINFER_REJECT_NONE);
    int64_t t = S;
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &r0, t, -1, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(s.rate_mtps, 1000 * 1000);
    /* more 1 s waits in CoDel's first interval [t, t + 100 ms): judged
     * only at its end, nothing drops */
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(
            cinfer_shedder_dequeue(&s, &e[i], t + (i + 1) * 20 * MS, -1, NULL),
            CINFER_REJECT_NONE);
    /* at t + 100 ms the interval is judged: overloaded. The first request
     * of the new interval runs; the next one, 1 s in the queue, drops. */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[4], t + 100 * MS, -1, NULL),
                 CINFER_REJECT_NONE);
    int64_t pb = -1;
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[5], t + 101 * MS, -1, &pb),
                 CINFER_REJECT_SHED_CODEL);
    /* e[6] and e[7] ahead at 1000 tokens/s drain in 2 ms, but CoDel
     * judges again only after its interval: the pushback is that */
    CHECK_EQ_INT(pb, 100 * MS);
    CHECK_EQ_INT(e[5].queued, 0);
    /* a queued request past the slough timeout is shed while it waits */
    CHECK_EQ_INT(cinfer_shedder_check(&s, &e[6], t + 102 * MS, NULL),
                 CINFER_REJECT_SHED_CODEL);
    /* but not one without a deadline */
    CHECK_EQ_INT(cinfer_shedder_check(&s, &e[7], t + 102 * MS, NULL),
                 CINFER_REJECT_NONE);
    /* a newcomer is shed when its predicted wait exceeds 10 ms */
    CHECK_EQ_INT(admit(&s, 20, 0, far, t + 102 * MS, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t + 102 * MS),
                 22 * MS);
    CHECK_EQ_INT(admit(&s, 1, 0, far, t + 102 * MS, NULL),
                 CINFER_REJECT_SHED_CODEL);
    CHECK_EQ_INT(admit(&s, 1, 0, 0, t + 102 * MS, NULL), CINFER_REJECT_NONE);
    /* one of a priority with nothing ahead is not */
    CHECK_EQ_INT(admit(&s, 1, 1, far, t + 102 * MS, NULL), CINFER_REJECT_NONE);
    /* a whole interval without a dequeue: CoDel lets go */
    CHECK_EQ_INT(admit(&s, 1, 0, far, t + 300 * MS, NULL), CINFER_REJECT_NONE);
}

/* CoDel judges the wait for a turn, and a request the engine starts at
 * once is no standing queue, whatever CoDel's last verdict. */
static void test_codel_spares_requests_that_do_not_queue(void)
{
    cinfer_shedder_params p = base_params();
    p.codel.target_ms = 5;
    p.codel.interval_ms = 100;
    cinfer_shedder s = make(&p);
    const int64_t far = 100 * S;
    cinfer_shed_entry e[6];
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(admit(&s, 1, 0, far, 0, &e[i]), CINFER_REJECT_NONE);
    /* an overloaded verdict: 1 s waits through the first interval */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[0], S, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[1], S + 100 * MS, -1, NULL),
                 CINFER_REJECT_NONE);
    CHECK(cinfer_codel_overloaded(&s.codel, S + 101 * MS));
    /* e[2] was 1.1 s from admission to its first token, but the engine
     * scheduled it 1 ms after its submit (the rest was its prefill):
     * not dropped */
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[2], S + 101 * MS, MS, NULL),
                 CINFER_REJECT_NONE);
    /* the same with a long wait for its turn drops */
    int64_t pb = -1;
    CHECK_EQ_INT(cinfer_shedder_dequeue(&s, &e[3], S + 102 * MS, S, &pb),
                 CINFER_REJECT_SHED_CODEL);
    CHECK(pb >= 100 * MS);
    /* while the engine holds requests back, one waiting past the slough
     * timeout is shed... */
    cinfer_shedder_set_engine_waiting(&s, 3);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &e[4], S + 103 * MS, NULL),
                 CINFER_REJECT_SHED_CODEL);
    /* ...but once the engine has started everything, nothing is: the
     * waits left are prefill, not queue */
    cinfer_shedder_set_engine_waiting(&s, 0);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &e[4], S + 103 * MS, NULL),
                 CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_check(&s, &e[5], S + 103 * MS, NULL),
                 CINFER_REJECT_NONE);
    /* and newcomers on a server with no engine queue are admitted however
     * long their predicted wait */
    cinfer_shedder_remove(&s, &e[4], S + 103 * MS);
    cinfer_shedder_remove(&s, &e[5], S + 103 * MS);
    CHECK_EQ_INT(s.queued_requests, 0);
    CHECK_EQ_INT(admit(&s, 1, 0, far, S + 104 * MS, NULL), CINFER_REJECT_NONE);
    CHECK(cinfer_shedder_predicted_wait_ns(&s, 0, S + 104 * MS) > 10 * MS);
    CHECK_EQ_INT(admit(&s, 1, 0, far, S + 104 * MS, NULL), CINFER_REJECT_NONE);
    cinfer_shedder_set_engine_waiting(&s, 1);
    CHECK_EQ_INT(admit(&s, 1, 0, far, S + 104 * MS, NULL),
                 CINFER_REJECT_SHED_CODEL);
}

static void test_pushback_clamped(void)
{
    cinfer_shedder_params p = base_params();
    p.max_queued_requests = 1;
    p.pushback_min_ms = 50;
    p.pushback_max_ms = 2000;
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1, 0);
    cinfer_shed_request rq = {.tokens = 1};
    cinfer_shed_entry e;
    int64_t pb = 0;
    CHECK_EQ_INT(admit(&s, 0, 0, 0, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &e, &pb),
                 CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(pb, 50 * MS); /* predicted 0: the minimum */
    s = make(&p);
    t = set_rate(&s, 1, 0);
    CHECK_EQ_INT(admit(&s, 100, 0, 0, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(cinfer_shedder_admit(&s, &rq, t, &e, &pb),
                 CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(pb, 2000 * MS); /* predicted 100 s: the maximum */
}

static void test_clock_backwards_and_overflow(void)
{
    cinfer_shedder_params p = base_params();
    cinfer_shedder s = make(&p);
    int64_t t = set_rate(&s, 1000, 10 * S);
    cinfer_shed_entry a, b;
    /* huge work saturates instead of wrapping */
    CHECK_EQ_INT(admit(&s, UINT64_MAX, 0, 0, t, &a), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, UINT64_MAX, 0, 0, t, &b), CINFER_REJECT_NONE);
    CHECK(s.queued_tokens == UINT64_MAX);
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, t), INT64_MAX);
    /* deadline at the end of time, asked at the start of time: the clock
     * went back, so "now" is the latest time seen, and the time left
     * (near INT64_MAX) does not overflow */
    CHECK_EQ_INT(admit(&s, 1, 0, INT64_MAX, INT64_MIN, NULL),
                 CINFER_REJECT_SHED_DEADLINE); /* INT64_MAX wait > left */
    CHECK_EQ_INT(admit(&s, 1, 1, INT64_MAX, INT64_MIN, NULL),
                 CINFER_REJECT_NONE);
    /* a deadline in the past of a clock gone back is still past */
    CHECK_EQ_INT(admit(&s, 1, 1, t - 1, 0, NULL), CINFER_REJECT_SHED_DEADLINE);
    /* out-of-range priorities are clamped */
    CHECK_EQ_INT(admit(&s, 1, 1000, t + 1, t, NULL), CINFER_REJECT_NONE);
    CHECK_EQ_INT(admit(&s, 1, -1000, t + S, t, NULL),
                 CINFER_REJECT_SHED_DEADLINE);
    cinfer_shedder_remove(&s, &a, t);
    cinfer_shedder_remove(&s, &b, t);
    CHECK_EQ_INT(s.queued_requests, 2);
    /* time jumps across the whole range in the backlog */
    CHECK_EQ_INT(cinfer_shedder_predicted_wait_ns(&s, 0, INT64_MAX) >= -1, 1);
    CHECK_EQ_INT(s.last_ns, INT64_MAX);
}

static void test_params(void)
{
    cinfer_shedder s;
    memset(&s, 0x5a, sizeof s);
    cinfer_shedder before;
    memcpy(&before, &s, sizeof s);
    cinfer_shedder_params p = base_params();
    p.kv_shed_permille = 1001;
    CHECK_EQ_INT(cinfer_shedder_init(&s, &p), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "kv_shed_permille") != NULL);
    p = base_params();
    p.low_priority_spread_pct = 101;
    CHECK_EQ_INT(cinfer_shedder_init(&s, &p), CINFER_E_INVALID_ARG);
    p = base_params();
    p.codel.interval_ms = -1;
    CHECK_EQ_INT(cinfer_shedder_init(&s, &p), CINFER_E_INVALID_ARG);
    p = base_params();
    p.pushback_max_ms = -1;
    CHECK_EQ_INT(cinfer_shedder_init(&s, &p), CINFER_E_INVALID_ARG);
    CHECK(memcmp(&s, &before, sizeof s) == 0);
    cinfer_shedder_params z;
    memset(&z, 0, sizeof z);
    CHECK_OK(cinfer_shedder_init(&s, &z));
    CHECK_EQ_INT(s.p.rate_sample_ms, 1000);
    CHECK_EQ_INT(s.p.pushback_max_ms, 30000);
    CHECK_EQ_INT(s.codel.target_ns, 0);
}

int main(void)
{
    RUN(test_queue_bound);
    RUN(test_token_bound);
    RUN(test_lower_priority_shed_first);
    RUN(test_littles_law_predicted_wait_equal_to_deadline);
    RUN(test_no_deadline_is_infinite);
    RUN(test_deadline_already_passed);
    RUN(test_only_higher_priority_work_is_ahead);
    RUN(test_unknown_rate_sheds_nothing_on_prediction);
    RUN(test_service_rate_measured_over_backlog);
    RUN(test_batch_dequeue_measures_the_full_rate);
    RUN(test_stale_estimate_recovers);
    RUN(test_first_sample_waits_for_a_departure);
    RUN(test_stream_time_counted_in_deadline_check);
    RUN(test_queued_request_rechecked);
    RUN(test_kv_pressure);
    RUN(test_codel_at_admission_while_queued_and_at_dequeue);
    RUN(test_codel_spares_requests_that_do_not_queue);
    RUN(test_pushback_clamped);
    RUN(test_clock_backwards_and_overflow);
    RUN(test_params);
    return harness_done();
}
