/*
 * test_codel.c - CoDel in folly's form with an injected clock: at least
 * two requests per interval before a drop, no drop below target, a drop
 * only after a full interval above target and only beyond twice the
 * target, recovery, an idle queue ending overload, the clock going
 * backwards and times near INT64_MAX.
 */
#include "resilience/resilience.h"
#include "tests/unit/harness.h"

#define MS 1000000LL

static cinfer_codel make(void)
{
    cinfer_codel_params p = cinfer_codel_default_params(); /* 5 ms, 100 ms */
    cinfer_codel c;
    CHECK_OK(cinfer_codel_init(&c, &p));
    return c;
}

/* Dequeue at t_ms after waiting wait_ns: 1 = dropped. */
static int dq(cinfer_codel *c, int64_t wait_ns, int64_t t_ms)
{
    return cinfer_codel_on_dequeue(c, wait_ns, t_ms * MS);
}

/* Makes c overloaded: an interval [0, 100) ms of 50 ms waits, judged by
 * the dequeue at 100 ms (kept, the first of its interval). */
static void overload(cinfer_codel *c)
{
    for (int t = 0; t < 100; t += 10)
        CHECK_EQ_INT(dq(c, 50 * MS, t), 0);
    CHECK_EQ_INT(cinfer_codel_overloaded(c, 99 * MS), 0);
    CHECK_EQ_INT(dq(c, 50 * MS, 100), 0);
    CHECK_EQ_INT(cinfer_codel_overloaded(c, 100 * MS), 1);
}

static void test_at_least_two_requests_per_interval_before_drop(void)
{
    cinfer_codel c = make();
    overload(&c);
    /* the second request of the interval is the first that may go */
    CHECK_EQ_INT(dq(&c, 50 * MS, 101), 1);
    CHECK_EQ_INT(dq(&c, 50 * MS, 150), 1);
    /* the next interval's first request is kept again */
    CHECK_EQ_INT(dq(&c, 50 * MS, 200), 0);
    CHECK_EQ_INT(dq(&c, 50 * MS, 201), 1);
    CHECK_EQ_INT(c.drops, 3);

    /* one request per interval: overloaded all along, never a drop */
    cinfer_codel d = make();
    overload(&d);
    for (int k = 2; k < 20; k++) {
        CHECK_EQ_INT(dq(&d, 500 * MS, k * 100), 0);
        CHECK_EQ_INT(cinfer_codel_overloaded(&d, k * 100 * MS), 1);
    }
    CHECK_EQ_INT(d.drops, 0);
}

static void test_no_drop_below_target(void)
{
    cinfer_codel c = make();
    /* waits at exactly the target (not above), with spikes: the minimum of
     * every interval is at the target, so never overloaded */
    for (int t = 0; t < 2000; t += 10) {
        int64_t w = t % 50 == 0 ? 5 * MS : 500 * MS;
        CHECK_EQ_INT(dq(&c, w, t), 0);
        CHECK_EQ_INT(cinfer_codel_overloaded(&c, t * MS), 0);
    }
    CHECK_EQ_INT(c.drops, 0);
}

static void test_drop_after_full_interval_above_target(void)
{
    cinfer_codel c = make();
    /* within the first interval nothing is judged: no drop at any wait */
    CHECK_EQ_INT(dq(&c, 6 * MS, 0), 0);
    for (int t = 1; t < 100; t++)
        CHECK_EQ_INT(dq(&c, 10000 * MS, t), 0);
    /* its minimum, 6 ms, was above target: overloaded from 100 ms */
    CHECK_EQ_INT(dq(&c, 6 * MS, 100), 0);
    /* only waits beyond twice the target (10 ms) are dropped */
    CHECK_EQ_INT(dq(&c, 7 * MS, 101), 0);
    CHECK_EQ_INT(dq(&c, 10 * MS, 102), 0);
    CHECK_EQ_INT(dq(&c, 10 * MS + 1, 103), 1);
    CHECK_EQ_INT(cinfer_codel_slough_ns(&c), 10 * MS);
}

static void test_recovery(void)
{
    cinfer_codel c = make();
    overload(&c);
    CHECK_EQ_INT(dq(&c, 50 * MS, 110), 1);
    /* one short wait in this interval: its minimum is below target */
    CHECK_EQ_INT(dq(&c, 1 * MS, 150), 0);
    CHECK_EQ_INT(dq(&c, 50 * MS, 160), 1); /* still overloaded until judged */
    /* judged at 200 ms: recovered, nothing dropped in the interval */
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 200 * MS), 0);
    CHECK_EQ_INT(dq(&c, 50 * MS, 200), 0);
    for (int t = 201; t < 300; t += 5)
        CHECK_EQ_INT(dq(&c, 50 * MS, t), 0);
    /* that interval's minimum was 50 ms: overloaded again from 300 ms */
    CHECK_EQ_INT(dq(&c, 50 * MS, 300), 0);
    CHECK_EQ_INT(dq(&c, 50 * MS, 301), 1);
}

static void test_idle_interval_ends_overload(void)
{
    cinfer_codel c = make();
    overload(&c);
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 150 * MS), 1);
    /* the interval [100, 200) ended with one 50 ms wait: verdict due */
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 250 * MS), 1);
    /* a whole interval more without any dequeue: idle, not overloaded */
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 300 * MS), 0);
    CHECK_EQ_INT(dq(&c, 50 * MS, 1000), 0);
    CHECK_EQ_INT(dq(&c, 50 * MS, 1001), 0);
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 1001 * MS), 0);
}

static void test_off_and_params(void)
{
    cinfer_codel_params p = {.target_ms = 0, .interval_ms = 0};
    cinfer_codel c;
    CHECK_OK(cinfer_codel_init(&c, &p));
    for (int t = 0; t < 1000; t++)
        CHECK_EQ_INT(dq(&c, 10000 * MS, t), 0);
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 1000 * MS), 0);
    CHECK_EQ_INT(c.interval_ns, 100 * MS);
    p.target_ms = -1;
    CHECK_EQ_INT(cinfer_codel_init(&c, &p), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "target_ms") != NULL);
}

static void test_clock_going_backwards(void)
{
    cinfer_codel c = make();
    overload(&c);
    /* a dequeue stamped in the past counts at the latest time seen: it is
     * in the current interval, not a new one */
    CHECK_EQ_INT(dq(&c, 50 * MS, 20), 1);
    CHECK_EQ_INT(dq(&c, 50 * MS, -1000000), 1);
    /* negative waits are zero waits */
    CHECK_EQ_INT(dq(&c, -5 * MS, 120), 0);
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, 0), 1);
    CHECK_EQ_INT(dq(&c, 50 * MS, 200), 0); /* min was 0: recovered */
    CHECK_EQ_INT(dq(&c, 50 * MS, 201), 0);
}

static void test_time_near_int64_max(void)
{
    cinfer_codel c = make();
    int64_t t = INT64_MAX - 150 * MS;
    CHECK_EQ_INT(cinfer_codel_on_dequeue(&c, 50 * MS, t), 0);
    CHECK_EQ_INT(cinfer_codel_on_dequeue(&c, 50 * MS, t + 10 * MS), 0);
    /* the interval ends at t + 100 ms; the next would end past INT64_MAX
     * and saturates */
    CHECK_EQ_INT(cinfer_codel_on_dequeue(&c, 50 * MS, t + 100 * MS), 0);
    CHECK_EQ_INT(c.interval_end_ns, INT64_MAX);
    CHECK_EQ_INT(cinfer_codel_on_dequeue(&c, 50 * MS, INT64_MAX - 1), 1);
    CHECK_EQ_INT(cinfer_codel_overloaded(&c, INT64_MAX - 1), 1);
    /* at INT64_MAX itself the saturated interval has ended and the next
     * one cannot start: judged as idle, nothing dropped, nothing broken */
    CHECK_EQ_INT(cinfer_codel_on_dequeue(&c, INT64_MAX, INT64_MAX), 0);
    CHECK_EQ_INT(cinfer_codel_on_dequeue(&c, INT64_MAX, INT64_MAX), 0);
}

int main(void)
{
    RUN(test_at_least_two_requests_per_interval_before_drop);
    RUN(test_no_drop_below_target);
    RUN(test_drop_after_full_interval_above_target);
    RUN(test_recovery);
    RUN(test_idle_interval_ends_overload);
    RUN(test_off_and_params);
    RUN(test_clock_going_backwards);
    RUN(test_time_near_int64_max);
    return harness_done();
}
