/*
 * test_server_rejection.c - what a rejection carries (server/rejection.c),
 * the gRPC code of every rejection reason (status_map.c over resilience's
 * reasons), and the lower bound of the service time that refuses
 * unmeetable deadlines (generate.c).
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <stdlib.h>

#include "google/protobuf/duration.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "server/server_impl.h"
#include "server/status_map.h"

static Google__Rpc__Status *unpack_slice(grpc_slice s)
{
    return google__rpc__status__unpack(NULL, GRPC_SLICE_LENGTH(s),
                                       GRPC_SLICE_START_PTR(s));
}

static void test_status_carries_retry_info(void)
{
    cinfer_pushback pb = {.reason = CINFER_REJECT_SHED_CODEL,
                          .retry_after_ms = 2345};
    grpc_slice s;
    CHECK(cinfer_rpc_status_pack(14, "overloaded", &pb, &s));
    Google__Rpc__Status *st = unpack_slice(s);
    CHECK(st != NULL);
    if (st) {
        CHECK_EQ_INT(st->code, 14);
        CHECK_EQ_STR(st->message, "overloaded");
        CHECK_EQ_INT(st->n_details, 1);
        if (st->n_details == 1) {
            CHECK_EQ_STR(st->details[0]->type_url,
                         "type.googleapis.com/google.rpc.RetryInfo");
            Google__Rpc__RetryInfo *ri = google__rpc__retry_info__unpack(
                NULL, st->details[0]->value.len,
                st->details[0]->value.data);
            CHECK(ri != NULL && ri->retry_delay != NULL);
            if (ri && ri->retry_delay) {
                CHECK_EQ_INT(ri->retry_delay->seconds, 2);
                CHECK_EQ_INT(ri->retry_delay->nanos, 345000000);
            }
            google__rpc__retry_info__free_unpacked(ri, NULL);
        }
        google__rpc__status__free_unpacked(st, NULL);
    }
    grpc_slice_unref(s);
}

static void test_rate_limit_adds_quota_failure(void)
{
    cinfer_pushback pb = {.reason = CINFER_REJECT_RATE_LIMITED_CLIENT,
                          .retry_after_ms = 7,
                          .quota_subject = "client:alice",
                          .quota_desc = "per-client limit"};
    grpc_slice s;
    CHECK(cinfer_rpc_status_pack(8, "rate limited", &pb, &s));
    Google__Rpc__Status *st = unpack_slice(s);
    CHECK(st != NULL);
    if (st) {
        CHECK_EQ_INT(st->n_details, 2);
        if (st->n_details == 2) {
            CHECK_EQ_STR(st->details[1]->type_url,
                         "type.googleapis.com/google.rpc.QuotaFailure");
            Google__Rpc__QuotaFailure *qf =
                google__rpc__quota_failure__unpack(
                    NULL, st->details[1]->value.len,
                    st->details[1]->value.data);
            CHECK(qf != NULL && qf->n_violations == 1);
            if (qf && qf->n_violations == 1) {
                CHECK_EQ_STR(qf->violations[0]->subject, "client:alice");
                CHECK_EQ_STR(qf->violations[0]->description,
                             "per-client limit");
            }
            google__rpc__quota_failure__free_unpacked(qf, NULL);
            Google__Rpc__RetryInfo *ri = google__rpc__retry_info__unpack(
                NULL, st->details[0]->value.len,
                st->details[0]->value.data);
            CHECK(ri && ri->retry_delay && ri->retry_delay->seconds == 0 &&
                  ri->retry_delay->nanos == 7000000);
            google__rpc__retry_info__free_unpacked(ri, NULL);
        }
        google__rpc__status__free_unpacked(st, NULL);
    }
    grpc_slice_unref(s);
}

static void test_zero_and_negative_pushback_is_zero_delay(void)
{
    int64_t values[] = {0, -5};
    for (size_t i = 0; i < 2; i++) {
        cinfer_pushback pb = {.reason = CINFER_REJECT_DRAINING,
                              .retry_after_ms = values[i]};
        grpc_slice s;
        CHECK(cinfer_rpc_status_pack(14, NULL, &pb, &s));
        Google__Rpc__Status *st = unpack_slice(s);
        CHECK(st && st->n_details == 1);
        if (st && st->n_details == 1) {
            CHECK_EQ_STR(st->message, "");
            Google__Rpc__RetryInfo *ri = google__rpc__retry_info__unpack(
                NULL, st->details[0]->value.len,
                st->details[0]->value.data);
            CHECK(ri && ri->retry_delay && ri->retry_delay->seconds == 0 &&
                  ri->retry_delay->nanos == 0);
            google__rpc__retry_info__free_unpacked(ri, NULL);
        }
        google__rpc__status__free_unpacked(st, NULL);
        grpc_slice_unref(s);
    }
}

/* DESIGN.md's table: rate limits RESOURCE_EXHAUSTED, an unmeetable
 * deadline DEADLINE_EXCEEDED, the rest UNAVAILABLE; never CANCELLED. */
static void test_every_reason_maps_to_its_code(void)
{
    for (int r = 1; r < CINFER_REJECT_COUNT; r++) {
        grpc_status_code code =
            cinfer_server_grpc_status(cinfer_reject_status((cinfer_reject)r));
        grpc_status_code want = GRPC_STATUS_UNAVAILABLE;
        if (r == CINFER_REJECT_RATE_LIMITED_GLOBAL ||
            r == CINFER_REJECT_RATE_LIMITED_CLIENT)
            want = GRPC_STATUS_RESOURCE_EXHAUSTED;
        else if (r == CINFER_REJECT_SHED_DEADLINE)
            want = GRPC_STATUS_DEADLINE_EXCEEDED;
        if (code != want)
            fprintf(stderr, "reason %s\n", cinfer_reject_name((cinfer_reject)r));
        CHECK_EQ_INT(code, want);
        CHECK(code != GRPC_STATUS_CANCELLED);
    }
}

/* The bound for n prompt tokens is the largest fastest-time among the
 * size classes wholly at or below n. */
static void test_service_time_bound_is_monotonic(void)
{
    cinfer_service_times *s = NULL;
    CHECK_OK(cinfer_service_times_create(&s));
    if (!s)
        return;
    CHECK_EQ_INT(cinfer_service_time_min(s, 1000), 0); /* nothing seen */
    cinfer_service_time_record(s, 1, 5000000);          /* class 0 */
    cinfer_service_time_record(s, 1, 7000000);          /* slower: kept 5 */
    cinfer_service_time_record(s, 100, 40000000);       /* class 6: 64..127 */
    cinfer_service_time_record(s, 120, 30000000);       /* faster: 30 */
    cinfer_service_time_record(s, 0, 1);                /* ignored */
    cinfer_service_time_record(s, 5, -3);               /* ignored */
    CHECK_EQ_INT(cinfer_service_time_min(s, 1), 5000000);
    CHECK_EQ_INT(cinfer_service_time_min(s, 100), 5000000); /* 64..127 may
                                                               exceed 100 */
    CHECK_EQ_INT(cinfer_service_time_min(s, 127), 30000000);
    CHECK_EQ_INT(cinfer_service_time_min(s, 1 << 20), 30000000);
    CHECK_EQ_INT(cinfer_service_time_min(s, 0), 0);
    cinfer_service_times_destroy(s);
}

int main(void)
{
    RUN(test_status_carries_retry_info);
    RUN(test_rate_limit_adds_quota_failure);
    RUN(test_zero_and_negative_pushback_is_zero_delay);
    RUN(test_every_reason_maps_to_its_code);
    RUN(test_service_time_bound_is_monotonic);
    return harness_done();
}
#endif
