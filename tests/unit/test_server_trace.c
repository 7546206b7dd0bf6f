/*
 * test_server_trace.c - W3C traceparent parsing and the server's span
 * (server/trace.c): valid headers join the caller's trace, every malformed
 * one starts a new trace, and the echoed header is well formed.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <string.h>

#include "server/trace.h"

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static int parses(const char *v)
{
    char tid[33], pid[17];
    uint8_t fl = 0;
    return cinfer_trace_parse(v, strlen(v), tid, pid, &fl);
}

static void test_parse_valid(void)
{
    char tid[33], pid[17];
    uint8_t fl = 0;
    CHECK(cinfer_trace_parse(TP, strlen(TP), tid, pid, &fl));
    CHECK_EQ_STR(tid, "4bf92f3577b34da6a3ce929d0e0e4736");
    CHECK_EQ_STR(pid, "00f067aa0ba902b7");
    CHECK_EQ_INT(fl, 1);
    /* A later version may carry more fields after a dash. */
    CHECK(parses("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09"));
    CHECK(parses("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-x"));
}

static void test_parse_invalid(void)
{
    static const char *const bad[] = {
        "",
        "00",
        /* uppercase hex */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        /* all-zero trace id, all-zero parent id */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        /* version ff is invalid */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        /* version 00 is exactly 55 bytes */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
        /* a later version's extra data must follow a dash */
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09x",
        /* wrong separators, short fields, non-hex */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (parses(bad[i])) {
            fprintf(stderr, "accepted: '%s'\n", bad[i]);
            CHECK(0);
        }
    }
    char tid[33], pid[17];
    uint8_t fl;
    CHECK(!cinfer_trace_parse(NULL, 0, tid, pid, &fl));
    /* Length is what counts, not a terminator: a cut header is invalid. */
    CHECK(!cinfer_trace_parse(TP, strlen(TP) - 1, tid, pid, &fl));
}

static void test_init_joins_or_starts(void)
{
    uint8_t rnd[CINFER_TRACE_RANDOM_BYTES];
    for (int i = 0; i < CINFER_TRACE_RANDOM_BYTES; i++)
        rnd[i] = (uint8_t)(0xa0 + i);
    cinfer_trace t;
    cinfer_trace_init(&t, TP, strlen(TP), rnd);
    CHECK_EQ_STR(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    CHECK_EQ_STR(t.parent_id, "00f067aa0ba902b7");
    /* The server's span: bytes 16..23 of the random input. */
    CHECK_EQ_STR(t.span_id, "b0b1b2b3b4b5b6b7");
    CHECK_EQ_STR(t.header,
                 "00-4bf92f3577b34da6a3ce929d0e0e4736-b0b1b2b3b4b5b6b7-01");

    const char *bad = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7";
    cinfer_trace_init(&t, bad, strlen(bad), rnd);
    CHECK_EQ_STR(t.trace_id, "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf");
    CHECK_EQ_STR(t.parent_id, "");
    CHECK_EQ_STR(t.header,
                 "00-a0a1a2a3a4a5a6a7a8a9aaabacadaeaf-b0b1b2b3b4b5b6b7-00");
    /* The echoed header parses. */
    CHECK(parses(t.header));

    /* All-zero random bytes still give valid (nonzero) ids. */
    memset(rnd, 0, sizeof rnd);
    cinfer_trace_init(&t, NULL, 0, rnd);
    CHECK(parses(t.header));
}

static void test_metadata(void)
{
    uint8_t rnd[CINFER_TRACE_RANDOM_BYTES] = {1};
    cinfer_trace t;
    cinfer_trace_init(&t, TP, strlen(TP), rnd);
    grpc_metadata md[CINFER_TRACE_MD];
    size_t n = cinfer_trace_metadata(&t, "req-7", md);
    CHECK_EQ_INT(n, 2);
    CHECK(grpc_slice_str_cmp(md[0].key, "traceparent") == 0);
    CHECK(grpc_slice_str_cmp(md[0].value, t.header) == 0);
    CHECK(grpc_slice_str_cmp(md[1].key, "x-request-id") == 0);
    CHECK(grpc_slice_str_cmp(md[1].value, "req-7") == 0);
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(md[i].key);
        grpc_slice_unref(md[i].value);
    }
    n = cinfer_trace_metadata(&t, "", md);
    CHECK_EQ_INT(n, 1);
    grpc_slice_unref(md[0].key);
    grpc_slice_unref(md[0].value);

    grpc_metadata_array arr;
    grpc_metadata_array_init(&arr);
    grpc_metadata in[2];
    memset(in, 0, sizeof in);
    in[0].key = grpc_slice_from_static_string("x-other");
    in[0].value = grpc_slice_from_static_string("1");
    in[1].key = grpc_slice_from_static_string("traceparent");
    in[1].value = grpc_slice_from_static_string(TP);
    arr.metadata = in;
    arr.count = 2;
    size_t len;
    const char *v = cinfer_metadata_get(&arr, "traceparent", &len);
    CHECK(v != NULL);
    CHECK_EQ_INT(len, strlen(TP));
    cinfer_trace_from_metadata(&t, &arr);
    CHECK_EQ_STR(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    CHECK(cinfer_metadata_get(&arr, "x-request-id", &len) == NULL);
    CHECK_EQ_INT(len, 0);
}

/* Without a traceparent the server starts a trace: every call's ids are
 * fresh, across the refills of the per-thread random buffer (64 calls to
 * a buffer). */
static void test_fresh_ids(void)
{
    enum { N = 200 };
    static char ids[N][33];
    grpc_metadata_array arr;
    grpc_metadata_array_init(&arr);
    for (int i = 0; i < N; i++) {
        cinfer_trace t;
        cinfer_trace_from_metadata(&t, &arr);
        CHECK_EQ_INT(strlen(t.trace_id), 32);
        CHECK_EQ_INT(strlen(t.span_id), 16);
        memcpy(ids[i], t.trace_id, 33);
        for (int j = 0; j < i; j++)
            if (strcmp(ids[i], ids[j]) == 0) {
                fprintf(stderr, "trace ids %d and %d are both %s\n", j, i,
                        ids[i]);
                CHECK(0);
            }
    }
}

int main(void)
{
    RUN(test_parse_valid);
    RUN(test_parse_invalid);
    RUN(test_init_joins_or_starts);
    RUN(test_metadata);
    RUN(test_fresh_ids);
    return harness_done();
}
#endif
