/*
 * test_server_orca.c - the ORCA load report's parts (server/orca.c): the
 * call-rate window and the CPU sampler on made-up clocks (including clocks
 * that go back), the cgroup CPU quota, the report's wire form decoded with
 * the ORCA protos, and the out-of-band interval's checks.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <stdlib.h>
#include <string.h>

#include "server/orca.h"
#include "xds/data/orca/v3/orca_load_report.pb-c.h"

#define S 1000000000LL

static void test_rate_window(void)
{
    cinfer_orca_rate r;
    double rps, eps;
    int64_t t0 = 1000 * S;
    cinfer_orca_rate_init(&r, t0);
    cinfer_orca_rate_get(&r, t0, &rps, &eps);
    CHECK_NEAR(rps, 0.0, 1e-12);
    /* 5 calls, 2 errors within the first half second: the span is at
     * least 1 s. */
    for (int i = 0; i < 5; i++)
        cinfer_orca_rate_add(&r, t0 + i * 100000000LL, i < 2);
    cinfer_orca_rate_get(&r, t0 + S / 2, &rps, &eps);
    CHECK_NEAR(rps, 5.0, 1e-9);
    CHECK_NEAR(eps, 2.0, 1e-9);
    /* Ten more over the next four seconds: 15 calls in 5 s. */
    for (int i = 0; i < 10; i++)
        cinfer_orca_rate_add(&r, t0 + S + i * 400000000LL, 0);
    cinfer_orca_rate_get(&r, t0 + 5 * S, &rps, &eps);
    CHECK_NEAR(rps, 3.0, 1e-9);
    CHECK_NEAR(eps, 0.4, 1e-9);
    /* Past the window the first second's calls are gone. At t0 + 10.5 s
     * the window is seconds 1001..1010, 9.5 s long, and holds the ten. */
    cinfer_orca_rate_get(&r, t0 + 10 * S + S / 2, &rps, &eps);
    CHECK_NEAR(rps, 10.0 / 9.5, 1e-9);
    CHECK_NEAR(eps, 0.0, 1e-12);
    /* Long idle: nothing left. */
    cinfer_orca_rate_get(&r, t0 + 100 * S, &rps, &eps);
    CHECK_NEAR(rps, 0.0, 1e-12);
}

static void test_rate_clock_backwards(void)
{
    cinfer_orca_rate r;
    double rps, eps;
    int64_t t0 = 50 * S;
    cinfer_orca_rate_init(&r, t0);
    cinfer_orca_rate_add(&r, t0 + 3 * S, 0);
    /* Earlier times count at the latest one seen. */
    cinfer_orca_rate_add(&r, t0 + S, 1);
    cinfer_orca_rate_add(&r, t0 - 40 * S, 0);
    cinfer_orca_rate_get(&r, t0 + 3 * S, &rps, &eps);
    CHECK_NEAR(rps, 1.0, 1e-9); /* 3 calls over 3 s */
    CHECK_NEAR(eps, 1.0 / 3.0, 1e-9);
    /* A query from the past reads at the latest time too. */
    double rps2, eps2;
    cinfer_orca_rate_get(&r, t0, &rps2, &eps2);
    CHECK_NEAR(rps2, rps, 1e-12);
    /* Negative times (tests may start anywhere) bucket correctly. */
    cinfer_orca_rate_init(&r, -5 * S);
    cinfer_orca_rate_add(&r, -5 * S + 1, 0);
    cinfer_orca_rate_add(&r, -S / 2, 0);
    cinfer_orca_rate_get(&r, 0, &rps, &eps);
    CHECK_NEAR(rps, 2.0 / 5.0, 1e-9);
}

static void test_cpu_sampler(void)
{
    cinfer_orca_cpu c;
    cinfer_orca_cpu_init(&c, 0, 0);
    /* Before a full second: the partial measure. 2 CPUs, 0.5 s wall,
     * 0.5 s CPU = 0.5. */
    CHECK_NEAR(cinfer_orca_cpu_update(&c, S / 2, S / 2, 2.0), 0.5, 1e-12);
    /* At 1 s: 1.5 s CPU over 1 s on 2 CPUs = 0.75, and a new sample. */
    CHECK_NEAR(cinfer_orca_cpu_update(&c, S, 3 * S / 2, 2.0), 0.75, 1e-12);
    /* Within the next second the last full measure stays. */
    CHECK_NEAR(cinfer_orca_cpu_update(&c, S + S / 2, 3 * S, 2.0), 0.75, 1e-12);
    /* 2 s later, 1 s CPU: 0.25. */
    CHECK_NEAR(cinfer_orca_cpu_update(&c, 3 * S, 5 * S / 2, 2.0), 0.25, 1e-12);
    /* Wall clock back: the last value. CPU clock back: counted as 0. */
    CHECK_NEAR(cinfer_orca_cpu_update(&c, 2 * S, 9 * S, 2.0), 0.25, 1e-12);
    CHECK_NEAR(cinfer_orca_cpu_update(&c, 5 * S, 0, 2.0), 0.0, 1e-12);
    /* No CPUs: the last value. */
    CHECK_NEAR(cinfer_orca_cpu_update(&c, 9 * S, 9 * S, 0.0), 0.0, 1e-12);
}

static void test_cpus(void)
{
    CHECK_NEAR(cinfer_orca_cpus(16, NULL), 16.0, 1e-12);
    CHECK_NEAR(cinfer_orca_cpus(16, "max 100000\n"), 16.0, 1e-12);
    CHECK_NEAR(cinfer_orca_cpus(16, "250000 100000\n"), 2.5, 1e-12);
    CHECK_NEAR(cinfer_orca_cpus(2, "400000 100000\n"), 2.0, 1e-12);
    CHECK_NEAR(cinfer_orca_cpus(0, "garbage"), 1.0, 1e-12);
    CHECK_NEAR(cinfer_orca_cpus(4, "0 100000"), 4.0, 1e-12);
}

static double named(const Xds__Data__Orca__V3__OrcaLoadReport *r,
                    const char *key)
{
    for (size_t i = 0; i < r->n_named_metrics; i++)
        if (strcmp(r->named_metrics[i]->key, key) == 0)
            return r->named_metrics[i]->value;
    return -1.0;
}

static void test_pack(void)
{
    cinfer_orca_numbers n = {
        .cpu_utilization = 0.25,
        .application_utilization = 0.5,
        .rps = 3.5,
        .eps = 0.5,
        .kv_cache_usage = 0.5,
        .running = 4,
        .waiting = 7,
    };
    uint8_t *buf;
    size_t len;
    CHECK_OK(cinfer_orca_pack(&n, &buf, &len));
    Xds__Data__Orca__V3__OrcaLoadReport *r =
        xds__data__orca__v3__orca_load_report__unpack(NULL, len, buf);
    free(buf);
    CHECK(r != NULL);
    if (!r)
        return;
    CHECK_NEAR(r->cpu_utilization, 0.25, 0);
    CHECK_NEAR(r->application_utilization, 0.5, 0);
    CHECK_NEAR(r->rps_fractional, 3.5, 0);
    CHECK_NEAR(r->eps, 0.5, 0);
    CHECK_EQ_INT(r->n_named_metrics, 3);
    CHECK_NEAR(named(r, "kv_cache_usage"), 0.5, 0);
    CHECK_NEAR(named(r, "num_requests_running"), 4.0, 0);
    CHECK_NEAR(named(r, "num_requests_waiting"), 7.0, 0);
    xds__data__orca__v3__orca_load_report__free_unpacked(r, NULL);
}

static void test_interval(void)
{
    int64_t ns = 0;
    CHECK_OK(cinfer_orca_interval(1, 2, 500000000, &ns));
    CHECK_EQ_INT(ns, 2500000000LL);
    /* Unset, zero or below the minimum: the minimum. */
    CHECK_OK(cinfer_orca_interval(0, 0, 0, &ns));
    CHECK_EQ_INT(ns, (int64_t)CINFER_ORCA_MIN_INTERVAL_MS * 1000000);
    CHECK_OK(cinfer_orca_interval(1, 0, 1000, &ns));
    CHECK_EQ_INT(ns, (int64_t)CINFER_ORCA_MIN_INTERVAL_MS * 1000000);
    CHECK_OK(cinfer_orca_interval(1, CINFER_ORCA_MAX_INTERVAL_S, 0, &ns));
    CHECK_EQ_INT(ns, (int64_t)CINFER_ORCA_MAX_INTERVAL_S * S);

    ns = 42;
    CHECK_EQ_INT(cinfer_orca_interval(1, -1, 0, &ns), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "report_interval") != NULL);
    CHECK_EQ_INT(cinfer_orca_interval(1, 1, -5, &ns), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "report_interval: nanos") != NULL);
    CHECK_EQ_INT(cinfer_orca_interval(1, 1, 1000000000, &ns),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_orca_interval(1, CINFER_ORCA_MAX_INTERVAL_S, 1, &ns),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "at most") != NULL);
    CHECK_EQ_INT(cinfer_orca_interval(1, INT64_MAX, 0, &ns),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(ns, 42); /* a failed call changes nothing */
}

int main(void)
{
    RUN(test_rate_window);
    RUN(test_rate_clock_backwards);
    RUN(test_cpu_sampler);
    RUN(test_cpus);
    RUN(test_pack);
    RUN(test_interval);
    return harness_done();
}
#endif
