/*
 * test_token_bucket.c - the token bucket's transitions, driven by an
 * injected clock: starts full, exact refill boundaries (integer and
 * fractional rates, no drift), cap after idle, pushback value, cost over
 * capacity, clock going backwards, overflow at the ends of every range.
 */
#include "resilience/resilience.h"
#include "tests/unit/harness.h"

#define MS 1000000LL
#define S 1000000000LL

static cinfer_tb make(double rate, uint64_t burst)
{
    cinfer_tb_params p = {.rate_per_s = rate, .burst = burst};
    cinfer_tb tb;
    CHECK_OK(cinfer_tb_init(&tb, &p));
    return tb;
}

static void test_starts_full(void)
{
    cinfer_tb tb = make(10, 5);
    int64_t t0 = 123 * S;
    CHECK_EQ_INT(cinfer_tb_available(&tb, t0), 5);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(cinfer_tb_take(&tb, 1, t0, NULL), 1);
    int64_t w = -1;
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, t0, &w), 0);
    CHECK_EQ_INT(w, 100 * MS);
    CHECK_EQ_INT(cinfer_tb_available(&tb, t0), 0);
}

static void test_refill_exact_boundary(void)
{
    cinfer_tb tb = make(10, 5); /* one token per 100 ms */
    int64_t t0 = 0;
    CHECK_EQ_INT(cinfer_tb_take(&tb, 5, t0, NULL), 1);
    int64_t w = 0;
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, t0 + 100 * MS - 1, &w), 0);
    CHECK_EQ_INT(w, 1);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, t0 + 100 * MS, &w), 1);
    CHECK_EQ_INT(w, 0);
    /* the next token is due exactly 100 ms after the first */
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, t0 + 200 * MS - 1, NULL), 0);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, t0 + 200 * MS, NULL), 1);
}

static void test_refill_fractional_rate_boundary(void)
{
    /* 3 tokens/s: a token every 333,333,333.3 ns, so the first is there at
     * the ceiling, 333,333,334 ns, and three are there at exactly 1 s. */
    cinfer_tb tb = make(3, 3);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 3, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&tb, 1, 0), 333333334);
    CHECK_EQ_INT(cinfer_tb_available(&tb, 333333333), 0);
    CHECK_EQ_INT(cinfer_tb_available(&tb, 333333334), 1);
    CHECK_EQ_INT(cinfer_tb_available(&tb, 666666666), 1);
    CHECK_EQ_INT(cinfer_tb_available(&tb, 666666667), 2);
    CHECK_EQ_INT(cinfer_tb_available(&tb, S - 1), 2);
    CHECK_EQ_INT(cinfer_tb_available(&tb, S), 3);

    /* sub-1 rates: 0.5/s is one token per 2 s */
    cinfer_tb h = make(0.5, 1);
    CHECK_EQ_INT(cinfer_tb_take(&h, 1, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&h, 1, 0), 2 * S);
}

static void test_refill_no_drift(void)
{
    /* A bucket looked at every 997 ns holds, at every step, exactly what a
     * bucket looked at once holds: the refill is exact integer math. */
    cinfer_tb a = make(7.001, 1000000);
    cinfer_tb b = a;
    CHECK_EQ_INT(cinfer_tb_take(&a, 1000000, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_take(&b, 1000000, 0, NULL), 1);
    int64_t t = 0;
    for (int i = 0; i < 1000000; i++) {
        t += 997;
        cinfer_tb_available(&a, t);
    }
    CHECK_EQ_INT(cinfer_tb_available(&b, t), cinfer_tb_available(&a, t));
    CHECK_EQ_INT(a.whole, b.whole);
    CHECK_EQ_INT(a.frac, b.frac);
    /* 997e6 ns at 7.001/s = 6.979997 tokens */
    CHECK_EQ_INT(a.whole, 6);
    CHECK_EQ_INT(a.frac, 979997000000ull);
}

static void test_cap_after_idle(void)
{
    cinfer_tb tb = make(1000, 50);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 50, 0, NULL), 1);
    /* an hour idle refills to the cap, not beyond */
    CHECK_EQ_INT(cinfer_tb_available(&tb, 3600 * S), 50);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 50, 3600 * S, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, 3600 * S, NULL), 0);
    /* and starts refilling from the take, not from the idle start */
    CHECK_EQ_INT(cinfer_tb_available(&tb, 3600 * S + MS - 1), 0);
    CHECK_EQ_INT(cinfer_tb_available(&tb, 3600 * S + MS), 1);
}

static void test_pushback_value(void)
{
    cinfer_tb tb = make(2, 10); /* a token per 500 ms */
    CHECK_EQ_INT(cinfer_tb_take(&tb, 9, 0, NULL), 1);
    /* 1 token there; 4 needs 3 more: 1.5 s */
    int64_t w = 0;
    CHECK_EQ_INT(cinfer_tb_take(&tb, 4, 0, &w), 0);
    CHECK_EQ_INT(w, 1500 * MS);
    /* the pushback is exact: not a nanosecond early, not late */
    CHECK_EQ_INT(cinfer_tb_take(&tb, 4, w - 1, NULL), 0);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 4, w, NULL), 1);
    /* a refused take takes nothing */
    cinfer_tb u = make(2, 10);
    CHECK_EQ_INT(cinfer_tb_take(&u, 3, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_take(&u, 8, 0, NULL), 0);
    CHECK_EQ_INT(cinfer_tb_available(&u, 0), 7);
    /* n = 0 always passes */
    CHECK_EQ_INT(cinfer_tb_take(&u, 0, 0, &w), 1);
    CHECK_EQ_INT(w, 0);
}

static void test_cost_over_capacity_never(void)
{
    cinfer_tb tb = make(100, 10);
    int64_t w = 0;
    CHECK_EQ_INT(cinfer_tb_take(&tb, 11, 0, &w), 0);
    CHECK_EQ_INT(w, INT64_MAX);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 11, 3600 * S, &w), 0);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 10, 3600 * S, &w), 1);
}

static void test_clock_going_backwards(void)
{
    cinfer_tb tb = make(10, 5);
    int64_t t = 10 * S;
    CHECK_EQ_INT(cinfer_tb_take(&tb, 5, t, NULL), 1);
    int64_t w_at_t = cinfer_tb_wait_ns(&tb, 1, t);
    CHECK_EQ_INT(w_at_t, 100 * MS);
    /* back 5 s: no time passed, nothing refills, nothing breaks */
    CHECK_EQ_INT(cinfer_tb_available(&tb, 5 * S), 0);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&tb, 1, 5 * S), w_at_t);
    CHECK_EQ_INT(cinfer_tb_take(&tb, 1, 5 * S, NULL), 0);
    /* back to the far past */
    CHECK_EQ_INT(cinfer_tb_available(&tb, INT64_MIN), 0);
    /* forward again: only the time after t counts, once */
    CHECK_EQ_INT(cinfer_tb_available(&tb, t + 100 * MS - 1), 0);
    CHECK_EQ_INT(cinfer_tb_available(&tb, t + 100 * MS), 1);
    CHECK_EQ_INT(cinfer_tb_available(&tb, 7 * S), 1);
    CHECK_EQ_INT(cinfer_tb_available(&tb, t + 200 * MS), 2);
}

static void test_overflow(void)
{
    /* largest rate and capacity, time across the whole int64 range */
    cinfer_tb tb = make(CINFER_TB_MAX_RATE_PER_S, UINT64_MAX);
    CHECK_EQ_INT(cinfer_tb_take(&tb, UINT64_MAX, INT64_MIN, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_available(&tb, INT64_MIN), 0);
    CHECK(cinfer_tb_available(&tb, INT64_MAX) == UINT64_MAX);
    CHECK_EQ_INT(cinfer_tb_take(&tb, UINT64_MAX, INT64_MAX, NULL), 1);
    /* 1e15 tokens/s is 1e6 tokens per ns */
    CHECK_EQ_INT(cinfer_tb_wait_ns(&tb, 1, INT64_MAX), 1);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&tb, 1000000, INT64_MAX), 1);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&tb, 1000001, INT64_MAX), 2);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&tb, UINT64_MAX, INT64_MAX),
                 UINT64_MAX / 1000000 + 1);

    /* slowest rate, largest cost: the wait exceeds int64 and saturates */
    cinfer_tb slow = make(0.001, UINT64_MAX);
    CHECK_EQ_INT(cinfer_tb_take(&slow, UINT64_MAX, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&slow, UINT64_MAX, 0), INT64_MAX);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&slow, 1, 0), 1000 * S);
    /* refilled up to the end of time: INT64_MAX - 1 ns at 1e-12 token/ns */
    CHECK_EQ_INT(cinfer_tb_available(&slow, INT64_MAX - 1),
                 (INT64_MAX - 1) / 1000000000000LL);
    CHECK_EQ_INT(cinfer_tb_wait_ns(&slow, UINT64_MAX, INT64_MAX), INT64_MAX);
}

/* clock.h: the time source and the saturating arithmetic the buckets,
 * breaker and shedder rely on. */
static void test_time_arithmetic_saturates(void)
{
    int64_t a = cinfer_clock_now_ns();
    int64_t b = cinfer_clock_now_ns();
    CHECK(a > 0 && b >= a);
    CHECK_EQ_INT(cinfer_ns_add_sat(INT64_MAX - 1, 5), INT64_MAX);
    CHECK_EQ_INT(cinfer_ns_add_sat(INT64_MIN + 1, -5), INT64_MIN);
    CHECK_EQ_INT(cinfer_ns_add_sat(5, -7), -2);
    CHECK_EQ_INT(cinfer_ms_to_ns(INT64_MAX / 1000000),
                 INT64_MAX / 1000000 * 1000000);
    CHECK_EQ_INT(cinfer_ms_to_ns(INT64_MAX / 1000000 + 1), INT64_MAX);
    CHECK_EQ_INT(cinfer_ms_to_ns(-3), 0);
    CHECK_EQ_INT(cinfer_ns_to_ms_ceil(1), 1);
    CHECK_EQ_INT(cinfer_ns_to_ms_ceil(1000000), 1);
    CHECK_EQ_INT(cinfer_ns_to_ms_ceil(1000001), 2);
    CHECK_EQ_INT(cinfer_ns_to_ms_ceil(0), 0);
    CHECK_EQ_INT(cinfer_ns_to_ms_ceil(-1), 0);
    CHECK_EQ_INT(cinfer_ns_to_ms_ceil(INT64_MAX), INT64_MAX / 1000000 + 1);
}

static void test_params(void)
{
    cinfer_tb tb;
    cinfer_tb_params p = cinfer_tb_default_params();
    CHECK_OK(cinfer_tb_init(&tb, &p));
    CHECK_EQ_INT(cinfer_tb_enabled(&tb), 0); /* rate 0 = off */
    CHECK_EQ_INT(cinfer_tb_take(&tb, UINT64_MAX, 0, NULL), 1);
    CHECK(cinfer_tb_capacity(&tb) == UINT64_MAX);

    p.rate_per_s = 2.5; /* burst 0 = one second's worth, rounded up */
    CHECK_OK(cinfer_tb_init(&tb, &p));
    CHECK_EQ_INT(cinfer_tb_capacity(&tb), 3);
    p.rate_per_s = 0.5;
    CHECK_OK(cinfer_tb_init(&tb, &p));
    CHECK_EQ_INT(cinfer_tb_capacity(&tb), 1);

    double bad[] = {-1, NAN, INFINITY, 2e15, 0.0001};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cinfer_tb keep = make(1, 1);
        cinfer_tb before;
        memcpy(&before, &keep, sizeof keep);
        p.rate_per_s = bad[i];
        CHECK_EQ_INT(cinfer_tb_init(&keep, &p), CINFER_E_INVALID_ARG);
        CHECK(strstr(cinfer_last_error(), "rate_per_s") != NULL);
        CHECK(memcmp(&keep, &before, sizeof keep) == 0);
    }
}

int main(void)
{
    RUN(test_starts_full);
    RUN(test_refill_exact_boundary);
    RUN(test_refill_fractional_rate_boundary);
    RUN(test_refill_no_drift);
    RUN(test_cap_after_idle);
    RUN(test_pushback_value);
    RUN(test_cost_over_capacity_never);
    RUN(test_clock_going_backwards);
    RUN(test_overflow);
    RUN(test_time_arithmetic_saturates);
    RUN(test_params);
    return harness_done();
}
