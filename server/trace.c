/*
 * trace.c - W3C traceparent parsing, the server's span, and the metadata
 * that echoes them (see trace.h).
 */
#include "server/trace.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static const char hexdigits[] = "0123456789abcdef";

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1; /* uppercase is invalid in traceparent */
}

/* n lowercase hex digits, not all zero when nonzero is set. */
static int hex_field(const char *v, size_t n, int nonzero)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        int d = hexval(v[i]);
        if (d < 0)
            return 0;
        any |= d;
    }
    return !nonzero || any;
}

int cinfer_trace_parse(const char *v, size_t n, char trace_id[33],
                       char parent_id[17], uint8_t *flags)
{
    /* version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 */
    enum { LEN = 55 };
    if (!v || n < LEN)
        return 0;
    if (!hex_field(v, 2, 0) || (v[0] == 'f' && v[1] == 'f'))
        return 0;
    int v00 = v[0] == '0' && v[1] == '0';
    /* Version 00 is exactly 55 bytes; a later version may append fields
     * after a dash. */
    if (v00 ? n != LEN : (n > LEN && v[LEN] != '-'))
        return 0;
    if (v[2] != '-' || v[35] != '-' || v[52] != '-')
        return 0;
    if (!hex_field(v + 3, 32, 1) || !hex_field(v + 36, 16, 1) ||
        !hex_field(v + 53, 2, 0))
        return 0;
    memcpy(trace_id, v + 3, 32);
    trace_id[32] = '\0';
    memcpy(parent_id, v + 36, 16);
    parent_id[16] = '\0';
    *flags = (uint8_t)(hexval(v[53]) << 4 | hexval(v[54]));
    return 1;
}

/* n random bytes as 2n hex digits, never all zero. */
static void hex_id(char *out, const uint8_t *rnd, size_t n)
{
    int any = 0;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexdigits[rnd[i] >> 4];
        out[2 * i + 1] = hexdigits[rnd[i] & 15];
        any |= rnd[i];
    }
    if (!any)
        out[2 * n - 1] = '1';
    out[2 * n] = '\0';
}

void cinfer_trace_init(cinfer_trace *t, const char *traceparent, size_t n,
                       const uint8_t rnd[CINFER_TRACE_RANDOM_BYTES])
{
    memset(t, 0, sizeof *t);
    if (!cinfer_trace_parse(traceparent, n, t->trace_id, t->parent_id,
                            &t->flags)) {
        hex_id(t->trace_id, rnd, 16);
        t->parent_id[0] = '\0';
        t->flags = 0;
    }
    hex_id(t->span_id, rnd + 16, 8);
    snprintf(t->header, sizeof t->header, "00-%s-%s-%c%c", t->trace_id,
             t->span_id, hexdigits[t->flags >> 4], hexdigits[t->flags & 15]);
}

const char *cinfer_metadata_get(const grpc_metadata_array *md,
                                const char *key, size_t *len)
{
    size_t k = strlen(key);
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) == k &&
            memcmp(GRPC_SLICE_START_PTR(m->key), key, k) == 0) {
            *len = GRPC_SLICE_LENGTH(m->value);
            return (const char *)GRPC_SLICE_START_PTR(m->value);
        }
    }
    *len = 0;
    return NULL;
}

/* Random bytes for ids, from getrandom a buffer at a time per thread (a
 * call takes 24: one system call per call was the server's most frequent
 * one); when getrandom cannot deliver, a per-process counter mixed with
 * the clock (ids stay unique, not unpredictable). */
#define RANDOM_BUF 1536
static _Thread_local uint8_t rnd_buf[RANDOM_BUF];
static _Thread_local size_t rnd_left;

static void random_bytes(uint8_t *out, size_t n)
{
    if (n <= RANDOM_BUF) {
        if (rnd_left < n &&
            getrandom(rnd_buf, RANDOM_BUF, GRND_NONBLOCK) == RANDOM_BUF)
            rnd_left = RANDOM_BUF;
        if (rnd_left >= n) {
            memcpy(out, rnd_buf + RANDOM_BUF - rnd_left, n);
            /* bytes handed out are not kept */
            memset(rnd_buf + RANDOM_BUF - rnd_left, 0, n);
            rnd_left -= n;
            return;
        }
    }
    if (getrandom(out, n, GRND_NONBLOCK) == (ssize_t)n)
        return;
    static atomic_ullong counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    x ^= atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        /* splitmix64 */
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        out[i] = (uint8_t)(z ^ (z >> 31));
    }
}

void cinfer_trace_from_metadata(cinfer_trace *t, const grpc_metadata_array *md)
{
    uint8_t rnd[CINFER_TRACE_RANDOM_BYTES];
    random_bytes(rnd, sizeof rnd);
    size_t n;
    const char *v = cinfer_metadata_get(md, "traceparent", &n);
    cinfer_trace_init(t, v, n, rnd);
}

size_t cinfer_trace_metadata(const cinfer_trace *t, const char *request_id,
                             grpc_metadata *out)
{
    size_t n = 0;
    memset(out, 0, CINFER_TRACE_MD * sizeof *out);
    out[n].key = grpc_slice_from_static_string("traceparent");
    out[n].value = grpc_slice_from_copied_string(t->header);
    n++;
    if (request_id && request_id[0]) {
        out[n].key = grpc_slice_from_static_string("x-request-id");
        out[n].value = grpc_slice_from_copied_string(request_id);
        n++;
    }
    return n;
}

void cinfer_trace_log(cinfer_log_line *l, const cinfer_trace *t)
{
    if (!t->trace_id[0])
        return;
    cinfer_log_str(l, "trace_id", t->trace_id);
    cinfer_log_str(l, "span_id", t->span_id);
    if (t->parent_id[0])
        cinfer_log_str(l, "parent_span_id", t->parent_id);
}
