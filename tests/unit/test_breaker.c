/*
 * test_breaker.c - the circuit breaker's transitions with an injected
 * clock: no trip below min-calls, trips at exactly the threshold, windows
 * expiring, lazy half-open, exactly P probes, ignored outcomes release
 * permits, backoff growth and cap, stale outcomes, clock going backwards,
 * times at the ends of the int64 range.
 */
#include "resilience/resilience.h"
#include "tests/unit/harness.h"

#define MS 1000000LL
#define S 1000000000LL

/* 50 %, 10 calls, 10 s in 10 one-second buckets, 1 s wait doubling to 8 s,
 * 3 probes. */
static cinfer_breaker make(void)
{
    cinfer_breaker_params p = cinfer_breaker_default_params();
    p.failure_rate_pct = 50;
    p.min_calls = 10;
    p.window_ms = 10000;
    p.window_buckets = 10;
    p.wait_ms = 1000;
    p.max_wait_ms = 8000;
    p.wait_multiplier = 2;
    p.half_open_probes = 3;
    cinfer_breaker b;
    CHECK_OK(cinfer_breaker_init(&b, &p));
    return b;
}

/* One call through: acquire (must pass) and record. */
static void call(cinfer_breaker *b, cinfer_outcome o, int64_t t)
{
    cinfer_breaker_permit pm;
    int ok = cinfer_breaker_acquire(b, t, &pm, NULL);
    CHECK_EQ_INT(ok, 1);
    cinfer_breaker_record(b, &pm, o, t);
}

/* Trips a fresh or closed breaker at time t with 10 failures. */
static void trip_at(cinfer_breaker *b, int64_t t)
{
    for (int i = 0; i < 10; i++)
        call(b, CINFER_OUTCOME_FAILURE, t);
    CHECK_EQ_INT(cinfer_breaker_get_state(b), CINFER_BREAKER_OPEN);
}

static void test_no_trip_below_min_calls(void)
{
    cinfer_breaker b = make();
    for (int i = 0; i < 9; i++)
        call(&b, CINFER_OUTCOME_FAILURE, i * MS);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    uint64_t calls, failures;
    cinfer_breaker_window(&b, 9 * MS, &calls, &failures);
    CHECK_EQ_INT(calls, 9);
    CHECK_EQ_INT(failures, 9);
    /* the tenth call, even a success, makes 9/10 >= 50 %: trip */
    call(&b, CINFER_OUTCOME_SUCCESS, 10 * MS);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);
}

static void test_trips_at_exactly_threshold(void)
{
    /* 4 failures in 10 calls: 40 % < 50 % */
    cinfer_breaker b = make();
    for (int i = 0; i < 6; i++)
        call(&b, CINFER_OUTCOME_SUCCESS, 0);
    for (int i = 0; i < 4; i++)
        call(&b, CINFER_OUTCOME_FAILURE, 0);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    /* an 11th outcome, a failure: 5/11 = 45 % still below */
    call(&b, CINFER_OUTCOME_FAILURE, 0);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    /* a 12th, a failure: 6/12 = exactly 50 %: trips */
    call(&b, CINFER_OUTCOME_FAILURE, 0);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);
    CHECK_EQ_INT(b.transitions[CINFER_BREAKER_OPEN], 1);

    /* a threshold that is not a round share: 34 % of 50 calls trips at
     * 17 failures (1700 >= 1700), not at 16 */
    cinfer_breaker_params p = cinfer_breaker_default_params();
    p.failure_rate_pct = 34;
    p.min_calls = 50;
    cinfer_breaker c;
    CHECK_OK(cinfer_breaker_init(&c, &p));
    for (int i = 0; i < 34; i++)
        call(&c, CINFER_OUTCOME_SUCCESS, 0);
    for (int i = 0; i < 16; i++)
        call(&c, CINFER_OUTCOME_FAILURE, 0);
    CHECK_EQ_INT(cinfer_breaker_get_state(&c), CINFER_BREAKER_CLOSED);
    cinfer_breaker d;
    CHECK_OK(cinfer_breaker_init(&d, &p));
    for (int i = 0; i < 33; i++)
        call(&d, CINFER_OUTCOME_SUCCESS, 0);
    for (int i = 0; i < 17; i++)
        call(&d, CINFER_OUTCOME_FAILURE, 0);
    CHECK_EQ_INT(cinfer_breaker_get_state(&d), CINFER_BREAKER_OPEN);
}

static void test_windows_expiring(void)
{
    cinfer_breaker b = make();
    /* 4 failures in the first second, 5 successes at 5 s */
    for (int i = 0; i < 4; i++)
        call(&b, CINFER_OUTCOME_FAILURE, 500 * MS);
    for (int i = 0; i < 5; i++)
        call(&b, CINFER_OUTCOME_SUCCESS, 5 * S);
    uint64_t calls, failures;
    cinfer_breaker_window(&b, 9999 * MS, &calls, &failures);
    CHECK_EQ_INT(calls, 9);
    CHECK_EQ_INT(failures, 4);
    /* at 10 s the first bucket (0..1 s) has left the window */
    cinfer_breaker_window(&b, 10 * S, &calls, &failures);
    CHECK_EQ_INT(calls, 5);
    CHECK_EQ_INT(failures, 0);
    /* with the old failures still in, the next failure would make 5/10;
     * expired, it takes 5 new ones */
    for (int i = 0; i < 4; i++)
        call(&b, CINFER_OUTCOME_FAILURE, 10 * S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    call(&b, CINFER_OUTCOME_FAILURE, 10 * S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);

    /* a long gap clears everything */
    cinfer_breaker c = make();
    for (int i = 0; i < 9; i++)
        call(&c, CINFER_OUTCOME_FAILURE, 0);
    cinfer_breaker_window(&c, 3600 * S, &calls, &failures);
    CHECK_EQ_INT(calls, 0);
    call(&c, CINFER_OUTCOME_FAILURE, 3600 * S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&c), CINFER_BREAKER_CLOSED);
}

/* Random outcomes at random, rising (sometimes repeated or earlier) times:
 * the window's totals always equal a brute-force count of the outcomes in
 * the last window_buckets buckets. */
static void test_window_matches_reference(void)
{
    cinfer_breaker_params p = cinfer_breaker_default_params();
    p.min_calls = UINT32_MAX; /* never trips */
    p.window_ms = 700;
    p.window_buckets = 7; /* 100 ms buckets */
    cinfer_breaker b;
    CHECK_OK(cinfer_breaker_init(&b, &p));
    enum { N = 4000 };
    static int64_t when[N];
    static int failed[N];
    uint64_t seed = 99;
    int64_t t = 10 * S, latest = INT64_MIN;
    for (int i = 0; i < N; i++) {
        uint64_t r = harness_rand(&seed);
        if (r % 10 == 0)
            t -= (int64_t)(r % (300 * MS)); /* back in time */
        else
            t += (int64_t)(r % (120 * MS));
        if (t > latest)
            latest = t;
        cinfer_outcome o =
            r % 3 == 0 ? CINFER_OUTCOME_FAILURE : CINFER_OUTCOME_SUCCESS;
        call(&b, o, t);
        when[i] = latest; /* where it was counted: the latest time seen */
        failed[i] = o == CINFER_OUTCOME_FAILURE;
        uint64_t calls = 0, failures = 0, want_c = 0, want_f = 0;
        cinfer_breaker_window(&b, t, &calls, &failures);
        int64_t head = latest / (100 * MS);
        for (int j = 0; j <= i; j++) {
            int64_t e = when[j] / (100 * MS);
            if (e > head - 7) {
                want_c++;
                want_f += (uint64_t)failed[j];
            }
        }
        CHECK_EQ_INT(calls, want_c);
        CHECK_EQ_INT(failures, want_f);
        if (calls != want_c)
            break;
    }
}

static void test_open_refuses_with_time_left(void)
{
    cinfer_breaker b = make();
    trip_at(&b, 2 * S);
    cinfer_breaker_permit pm;
    int64_t retry = 0;
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, 2 * S + 300 * MS, &pm, &retry), 0);
    CHECK_EQ_INT(retry, 700 * MS);
    CHECK_EQ_INT(pm.valid, 0);
    /* recording a refused permit does nothing */
    cinfer_breaker_record(&b, &pm, CINFER_OUTCOME_FAILURE, 2 * S + 300 * MS);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);
}

static void test_lazy_half_open(void)
{
    cinfer_breaker b = make();
    trip_at(&b, 0);
    /* the wait passes, but nothing moves until someone asks */
    uint64_t calls;
    cinfer_breaker_window(&b, 5 * S, &calls, NULL);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);
    CHECK_EQ_INT(b.transitions[CINFER_BREAKER_HALF_OPEN], 0);
    cinfer_breaker c = make();
    trip_at(&c, 0);
    cinfer_breaker_permit pm;
    int64_t retry = 0;
    CHECK_EQ_INT(cinfer_breaker_acquire(&c, 1 * S - 1, &pm, &retry), 0);
    CHECK_EQ_INT(retry, 1);
    CHECK_EQ_INT(cinfer_breaker_get_state(&c), CINFER_BREAKER_OPEN);
    CHECK_EQ_INT(cinfer_breaker_acquire(&c, 1 * S, &pm, &retry), 1);
    CHECK_EQ_INT(pm.probe, 1);
    CHECK_EQ_INT(cinfer_breaker_get_state(&c), CINFER_BREAKER_HALF_OPEN);
    CHECK_EQ_INT(c.transitions[CINFER_BREAKER_HALF_OPEN], 1);
}

static void test_exactly_p_probes(void)
{
    cinfer_breaker b = make();
    trip_at(&b, 0);
    cinfer_breaker_permit pm[4];
    int64_t retry = 0;
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &pm[i], NULL), 1);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &pm[3], &retry), 0);
    CHECK_EQ_INT(retry, 1000 * MS);
    /* still refused while the probes run, however long */
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, 100 * S, &pm[3], NULL), 0);
    /* two successes: not yet closed, and no new permits */
    cinfer_breaker_record(&b, &pm[0], CINFER_OUTCOME_SUCCESS, 2 * S);
    cinfer_breaker_record(&b, &pm[1], CINFER_OUTCOME_SUCCESS, 2 * S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_HALF_OPEN);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, 2 * S, &pm[3], NULL), 0);
    /* the third success closes, with an empty window */
    cinfer_breaker_record(&b, &pm[2], CINFER_OUTCOME_SUCCESS, 2 * S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    CHECK_EQ_INT(b.transitions[CINFER_BREAKER_CLOSED], 1);
    uint64_t calls = 1;
    cinfer_breaker_window(&b, 2 * S, &calls, NULL);
    CHECK_EQ_INT(calls, 0);
    call(&b, CINFER_OUTCOME_SUCCESS, 2 * S);
}

static void test_probe_failure_reopens(void)
{
    cinfer_breaker b = make();
    trip_at(&b, 0);
    cinfer_breaker_permit a, c;
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &a, NULL), 1);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &c, NULL), 1);
    cinfer_breaker_record(&b, &a, CINFER_OUTCOME_SUCCESS, S + 10 * MS);
    cinfer_breaker_record(&b, &c, CINFER_OUTCOME_FAILURE, S + 20 * MS);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);
    /* second trip: the wait doubled to 2 s */
    int64_t retry = 0;
    cinfer_breaker_permit x;
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S + 20 * MS, &x, &retry), 0);
    CHECK_EQ_INT(retry, 2 * S);
}

static void test_ignored_outcomes_release_permits(void)
{
    cinfer_breaker b = make();
    /* in CLOSED, ignored outcomes count for nothing */
    for (int i = 0; i < 100; i++)
        call(&b, CINFER_OUTCOME_IGNORED, 0);
    uint64_t calls = 1;
    cinfer_breaker_window(&b, 0, &calls, NULL);
    CHECK_EQ_INT(calls, 0);

    trip_at(&b, 0);
    cinfer_breaker_permit pm[3], more;
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &pm[i], NULL), 1);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &more, NULL), 0);
    /* a client cancel gives its permit back: one more probe may go */
    cinfer_breaker_record(&b, &pm[1], CINFER_OUTCOME_IGNORED, S);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &more, NULL), 1);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &pm[1], NULL), 0);
    /* recording the same permit twice does nothing the second time */
    cinfer_breaker_record(&b, &pm[0], CINFER_OUTCOME_SUCCESS, S);
    cinfer_breaker_record(&b, &pm[0], CINFER_OUTCOME_SUCCESS, S);
    CHECK_EQ_INT(b.probes_ok, 1);
    cinfer_breaker_record(&b, &pm[2], CINFER_OUTCOME_SUCCESS, S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_HALF_OPEN);
    cinfer_breaker_record(&b, &more, CINFER_OUTCOME_SUCCESS, S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
}

static void test_backoff_growth_and_cap(void)
{
    cinfer_breaker b = make();
    int64_t t = 0;
    int64_t want[] = {1 * S, 2 * S, 4 * S, 8 * S, 8 * S, 8 * S};
    trip_at(&b, t);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t retry = 0;
        cinfer_breaker_permit pm;
        CHECK_EQ_INT(cinfer_breaker_acquire(&b, t, &pm, &retry), 0);
        CHECK_EQ_INT(retry, want[i]);
        t += retry;
        CHECK_EQ_INT(cinfer_breaker_acquire(&b, t, &pm, NULL), 1);
        cinfer_breaker_record(&b, &pm, CINFER_OUTCOME_FAILURE, t);
    }
    CHECK_EQ_INT(b.transitions[CINFER_BREAKER_OPEN], 7);
    /* close (three successful probes), trip again: back to 1 s */
    int64_t retry = 0;
    cinfer_breaker_permit pm;
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, t, &pm, &retry), 0);
    t += retry;
    for (int i = 0; i < 3; i++)
        call(&b, CINFER_OUTCOME_SUCCESS, t);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    trip_at(&b, t);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, t, &pm, &retry), 0);
    CHECK_EQ_INT(retry, 1 * S);

    /* no growth: a cap below the wait, or a multiplier of 1 */
    for (int k = 0; k < 2; k++) {
        cinfer_breaker_params p = cinfer_breaker_default_params();
        p.min_calls = 1;
        p.wait_ms = 300;
        p.max_wait_ms = k == 0 ? 100 : 10000;
        p.wait_multiplier = k == 0 ? 2 : 1;
        p.half_open_probes = 1;
        cinfer_breaker c;
        CHECK_OK(cinfer_breaker_init(&c, &p));
        t = 0;
        for (int i = 0; i < 4; i++) {
            call(&c, CINFER_OUTCOME_FAILURE, t);
            CHECK_EQ_INT(cinfer_breaker_acquire(&c, t, &pm, &retry), 0);
            CHECK_EQ_INT(retry, 300 * MS);
            t += retry;
        }
    }
}

static void test_stale_outcomes_count_for_nothing(void)
{
    cinfer_breaker b = make();
    /* five calls admitted while closed, still running at the trip */
    cinfer_breaker_permit late[5];
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(cinfer_breaker_acquire(&b, 0, &late[i], NULL), 1);
    trip_at(&b, 0);
    /* they finish during half-open: they are not probes */
    cinfer_breaker_permit pm[3];
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(cinfer_breaker_acquire(&b, S, &pm[i], NULL), 1);
    cinfer_breaker_record(&b, &late[0], CINFER_OUTCOME_FAILURE, S);
    cinfer_breaker_record(&b, &late[1], CINFER_OUTCOME_SUCCESS, S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_HALF_OPEN);
    CHECK_EQ_INT(b.probes_out, 3);
    for (int i = 0; i < 3; i++)
        cinfer_breaker_record(&b, &pm[i], CINFER_OUTCOME_SUCCESS, S);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);
    /* and after closing they do not refill the window */
    for (int i = 2; i < 5; i++)
        cinfer_breaker_record(&b, &late[i], CINFER_OUTCOME_FAILURE, S);
    uint64_t calls = 1;
    cinfer_breaker_window(&b, S, &calls, NULL);
    CHECK_EQ_INT(calls, 0);
    CHECK_EQ_INT(b.stale_outcomes, 5);
}

static void test_clock_going_backwards(void)
{
    cinfer_breaker b = make();
    for (int i = 0; i < 5; i++)
        call(&b, CINFER_OUTCOME_FAILURE, 100 * S);
    /* outcomes stamped earlier land in the current bucket */
    for (int i = 0; i < 4; i++)
        call(&b, CINFER_OUTCOME_FAILURE, 50 * S);
    uint64_t calls = 0;
    cinfer_breaker_window(&b, 0, &calls, NULL);
    CHECK_EQ_INT(calls, 9);
    call(&b, CINFER_OUTCOME_SUCCESS, INT64_MIN);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_OPEN);
    /* open since 100 s (the latest time seen); asking at 60 s is asking at
     * 100 s: the whole wait is left */
    cinfer_breaker_permit pm;
    int64_t retry = 0;
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, 60 * S, &pm, &retry), 0);
    CHECK_EQ_INT(retry, 1 * S);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, 101 * S, &pm, &retry), 1);
}

static void test_time_at_range_ends(void)
{
    /* tripping near INT64_MAX: open_until saturates, still reachable */
    cinfer_breaker b = make();
    trip_at(&b, INT64_MAX - 10);
    cinfer_breaker_permit pm;
    int64_t retry = 0;
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, INT64_MAX - 1, &pm, &retry), 0);
    CHECK_EQ_INT(retry, 1);
    CHECK_EQ_INT(cinfer_breaker_acquire(&b, INT64_MAX, &pm, &retry), 1);
    /* negative times order correctly in the window */
    cinfer_breaker c = make();
    for (int i = 0; i < 9; i++)
        call(&c, CINFER_OUTCOME_FAILURE, INT64_MIN);
    uint64_t calls = 0;
    cinfer_breaker_window(&c, INT64_MIN + 9 * S, &calls, NULL);
    CHECK_EQ_INT(calls, 9);
    cinfer_breaker_window(&c, INT64_MIN + 10 * S, &calls, NULL);
    CHECK_EQ_INT(calls, 0);
    cinfer_breaker_window(&c, -1, &calls, NULL);
    cinfer_breaker_window(&c, INT64_MAX, &calls, NULL);
    CHECK_EQ_INT(calls, 0);
}

static void test_off_and_params(void)
{
    cinfer_breaker_params p = cinfer_breaker_default_params();
    p.failure_rate_pct = 0;
    cinfer_breaker b;
    CHECK_OK(cinfer_breaker_init(&b, &p));
    for (int i = 0; i < 1000; i++)
        call(&b, CINFER_OUTCOME_FAILURE, i);
    CHECK_EQ_INT(cinfer_breaker_get_state(&b), CINFER_BREAKER_CLOSED);

    cinfer_breaker before;
    memcpy(&before, &b, sizeof b);
    p = cinfer_breaker_default_params();
    p.failure_rate_pct = 101;
    CHECK_EQ_INT(cinfer_breaker_init(&b, &p), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "failure_rate_pct") != NULL);
    p = cinfer_breaker_default_params();
    p.window_buckets = CINFER_BREAKER_MAX_BUCKETS + 1;
    CHECK_EQ_INT(cinfer_breaker_init(&b, &p), CINFER_E_INVALID_ARG);
    p = cinfer_breaker_default_params();
    p.wait_ms = -1;
    CHECK_EQ_INT(cinfer_breaker_init(&b, &p), CINFER_E_INVALID_ARG);
    CHECK(memcmp(&b, &before, sizeof b) == 0);

    /* every 0 takes its default */
    cinfer_breaker_params z = {.failure_rate_pct = 50};
    CHECK_OK(cinfer_breaker_init(&b, &z));
    CHECK_EQ_INT(b.p.min_calls, 1);
    CHECK_EQ_INT(b.p.window_buckets, 10);
    CHECK_EQ_INT(b.bucket_ns, 1 * S);
    CHECK_EQ_INT(b.p.half_open_probes, 3);
    CHECK_EQ_STR(cinfer_breaker_state_name(CINFER_BREAKER_HALF_OPEN),
                 "half_open");
}

int main(void)
{
    RUN(test_no_trip_below_min_calls);
    RUN(test_trips_at_exactly_threshold);
    RUN(test_windows_expiring);
    RUN(test_window_matches_reference);
    RUN(test_open_refuses_with_time_left);
    RUN(test_lazy_half_open);
    RUN(test_exactly_p_probes);
    RUN(test_probe_failure_reopens);
    RUN(test_ignored_outcomes_release_permits);
    RUN(test_backoff_growth_and_cap);
    RUN(test_stale_outcomes_count_for_nothing);
    RUN(test_clock_going_backwards);
    RUN(test_time_at_range_ends);
    RUN(test_off_and_params);
    return harness_done();
}
