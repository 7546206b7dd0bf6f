/*
 * trace.h - W3C Trace Context on every call: the `traceparent` request
 * header read, the server's own span id made, both carried into the log
 * lines of the request and echoed to the client.
 *
 * A call whose `traceparent` parses (W3C Trace Context level 1: version,
 * 32-hex trace id, 16-hex parent id, 2-hex flags, lowercase, ids not all
 * zero, version ff invalid, later versions read by their first four
 * fields) joins that trace: its trace id and flags are kept, the caller's
 * span becomes the parent, and the server makes a new span id. A call with
 * none, or with one that does not parse, starts a new trace (random ids,
 * flags 00): a bad header is never an error.
 *
 * The response carries `traceparent: 00-<trace id>-<server span>-<flags>`
 * and `x-request-id: <the request id>` in its initial metadata, or, when
 * the response is Trailers-Only (a rejection before any message), in its
 * trailers: gRPC writes a Trailers-Only response only when the initial
 * metadata is empty, and retry policies need it.
 *
 *     cinfer_trace t;
 *     uint8_t rnd[CINFER_TRACE_RANDOM_BYTES];    // getrandom()
 *     cinfer_trace_init(&t, hdr, hdr_len, rnd);  // hdr may be NULL
 *     // t.trace_id, t.span_id, t.parent_id ("" = started here)
 *
 * Thread safety: plain value functions; no state.
 */
#ifndef CINFER_SERVER_TRACE_H
#define CINFER_SERVER_TRACE_H

#include <grpc/grpc.h>
#include <stddef.h>
#include <stdint.h>

#include "server/log.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Random bytes cinfer_trace_init consumes: 16 for a new trace id, 8 for
 * the server's span id. */
#define CINFER_TRACE_RANDOM_BYTES 24

typedef struct {
    char trace_id[33];   /* 32 lowercase hex digits */
    char span_id[17];    /* the server's span: 16 lowercase hex digits */
    char parent_id[17];  /* the caller's span; "" when the trace started
                            here */
    uint8_t flags;       /* trace-flags (bit 0 = sampled) */
    char header[56];     /* the traceparent the response carries */
} cinfer_trace;

/* Parses a traceparent value of n bytes. Returns 1 and fills the ids and
 * flags when it is valid, 0 otherwise (outputs untouched). */
int cinfer_trace_parse(const char *v, size_t n, char trace_id[33],
                       char parent_id[17], uint8_t *flags);

/* Fills t from the caller's traceparent (NULL or invalid = a new trace)
 * and `rnd` (CINFER_TRACE_RANDOM_BYTES random bytes). */
void cinfer_trace_init(cinfer_trace *t, const char *traceparent, size_t n,
                       const uint8_t rnd[CINFER_TRACE_RANDOM_BYTES]);

/* cinfer_trace_init from a call's request metadata (its first
 * `traceparent`) and fresh random bytes. */
void cinfer_trace_from_metadata(cinfer_trace *t, const grpc_metadata_array *md);

/* The first value of metadata `key` (lowercase), or NULL; *len gets its
 * length. The slice stays owned by md. */
const char *cinfer_metadata_get(const grpc_metadata_array *md,
                                const char *key, size_t *len);

/* Writes the response's traceparent and x-request-id (when request_id is
 * not empty) into out[0..] with copied slices the caller unrefs. Returns
 * the count (at most CINFER_TRACE_MD). */
#define CINFER_TRACE_MD 2
size_t cinfer_trace_metadata(const cinfer_trace *t, const char *request_id,
                             grpc_metadata *out);

/* Adds trace_id, span_id and (when there is one) parent_span_id to a log
 * line. */
void cinfer_trace_log(cinfer_log_line *l, const cinfer_trace *t);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_TRACE_H */
