/*
 * server.c - the gRPC server: completion-queue threads, call dispatch, the
 * per-call state machine's common part, drain and shutdown.
 *
 * Every method is accepted through the generic grpc_server_request_call, so
 * unknown methods reach us too and get UNIMPLEMENTED, and a call is routed
 * by its path to an rpc_method (the files generate.c, tokenize.c, ...).
 * Each worker thread owns one completion queue, keeps a few request_call
 * tags posted on it, and runs every call accepted there; calls are spread
 * over the queues by whichever queue's accept fires. See server_impl.h for
 * the state machine and the locking rules.
 *
 * Every status goes out through cinfer_call_send_status_ex, which also
 * counts it in the metrics and, for a rejection, adds the trailers a
 * client's retry policy and a mesh sidecar read (grpc-retry-pushback-ms,
 * grpc-status-details-bin). A rejection sent before any message is one
 * batch of SEND_INITIAL_METADATA (empty) and SEND_STATUS_FROM_SERVER, which
 * gRPC core writes as a single HEADERS frame: Trailers-Only.
 *
 * One status per call, never after the core ended it: a call whose
 * RECV_MESSAGE failed (the client reset it before its message came) or
 * whose RECV_CLOSE_ON_SERVER came back cancelled gets none, and counts
 * once as CANCELLED (DEADLINE_EXCEEDED when its deadline passed). The
 * server enforces deadlines itself (the core's deadline checks are off:
 * on a zero grpc-timeout they wrote a second status of their own): a
 * message read after its deadline is answered DEADLINE_EXCEEDED, and a
 * Generate's deadline is the engine's (generate.c).
 */
#include "server/http.h"
#include "server/server_impl.h"

#include <dlfcn.h>
#include <errno.h>
#include <grpc/grpc_security.h>
#include <grpc/support/log.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "proto/descriptor_set.h"
#include "server/log.h"
#include "server/status_map.h"
#include "server/wire.h"

/* Accepts kept posted per completion queue. */
#define ACCEPTS_PER_CQ 8

/* How long destroy waits for cancelled Generate streams to send their
 * UNAVAILABLE status before cancelling the calls outright. */
#define ABORT_GRACE_MS 5000

/* CoDel on the engine's queue wait (submit to first scheduled, the
 * request's own prefill not counted): a standing queue is one whose
 * fastest request in CODEL_INTERVAL waited more than CODEL_TARGET for its
 * turn. */
#define SERVER_CODEL_TARGET_MS 500
#define SERVER_CODEL_INTERVAL_MS 5000

/* Pushback of calls refused while the model loads. */
#define LOADING_PUSHBACK_MS 1000

/* Pushback of calls refused because the request threads' queue is full. */
#define BUSY_PUSHBACK_MS 100

static const rpc_method *const methods[] = {
    &cinfer_rpc_generate,          &cinfer_rpc_tokenize,
    &cinfer_rpc_detokenize,        &cinfer_rpc_model_info,
    &cinfer_rpc_health_check,      &cinfer_rpc_health_watch,
    &cinfer_rpc_reflection_v1,     &cinfer_rpc_reflection_v1alpha,
    &cinfer_rpc_orca_stream,
};

int64_t cinfer_server_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

cinfer_server_params cinfer_server_default_params(void)
{
    cinfer_server_params p;
    memset(&p, 0, sizeof p);
    p.listen = "127.0.0.1:50051";
    p.grpc_threads = 2;
    p.request_threads = 2;
    p.request_queue = 1024;
    p.max_receive_message_bytes = 4 << 20;
    p.default_max_tokens = 256;
    p.resilience = 1;
    p.admission = cinfer_admission_default_params();
    /* The shedder's queue is admission to first token (the prediction
     * and the deadline checks count prefill), but CoDel judges only the
     * wait for a turn: a request's own prefill is service, not queue. */
    p.admission.shedder.codel.target_ms = SERVER_CODEL_TARGET_MS;
    p.admission.shedder.codel.interval_ms = SERVER_CODEL_INTERVAL_MS;
    p.max_request_time_ms = 0;
    p.watchdog_ms = 30000;
    p.unhealthy_after_faults = 5;
    p.prefix_cache = 1;
    p.conn.max_concurrent_streams = 100;
    p.conn.max_connection_idle_ms = 300000;
    p.conn.max_connection_age_ms = 0;
    p.conn.max_connection_age_grace_ms = 30000;
    p.conn.min_ping_interval_ms = 10000;
    p.conn.max_ping_strikes = 2;
    p.conn.max_header_list_bytes = 16384;
    p.conn.handshake_timeout_ms = 10000;
    p.conn.receive_timeout_ms = 30000;
    p.conn.max_connections = 10000;
    p.conn.max_connections_per_peer = 1000;
    p.conn.fd_reserve = 128;
    return p;
}

/* gRPC core's channel arguments for the listening port (a[] holds 20). */
static size_t channel_args(const cinfer_server_params *sp,
                           cinfer_conn_limit *conns, grpc_arg *a)
{
    size_t n = 0;
    /* Connection caps and the descriptor reserve: the core hands every
     * accepted socket to the limiter before its handshake. */
    if (conns && cinfer_conn_limit_grpc_arg(conns, &a[n]))
        n++;
#define ARG_INT(name, v)                                                       \
    do {                                                                       \
        a[n].type = GRPC_ARG_INTEGER;                                          \
        a[n].key = (char *)(name);                                               \
        a[n].value.integer = (int)(v);                                         \
        n++;                                                                   \
    } while (0)
    const cinfer_server_conn_limits *l = &sp->conn;
    ARG_INT(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, sp->max_receive_message_bytes);
    ARG_INT(GRPC_ARG_ALLOW_REUSEPORT, 0);
    /* The server enforces deadlines (see the top of this file). */
    ARG_INT(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
    /* Compressed messages reach the server as they came and are inflated
     * within the receive limit (cinfer_call_read); the core would
     * inflate them in full first. */
    ARG_INT(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
    if (l->max_concurrent_streams > 0)
        ARG_INT(GRPC_ARG_MAX_CONCURRENT_STREAMS, l->max_concurrent_streams);
    if (l->max_connection_idle_ms > 0)
        ARG_INT(GRPC_ARG_MAX_CONNECTION_IDLE_MS, l->max_connection_idle_ms);
    if (l->max_connection_age_ms > 0) {
        ARG_INT(GRPC_ARG_MAX_CONNECTION_AGE_MS, l->max_connection_age_ms);
        ARG_INT(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                l->max_connection_age_grace_ms > 0
                    ? l->max_connection_age_grace_ms
                    : INT32_MAX);
    }
    ARG_INT(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
            l->min_ping_interval_ms);
    ARG_INT(GRPC_ARG_HTTP2_MAX_PING_STRIKES, l->max_ping_strikes);
    /* Clients' keepalive pings between calls are fine at the interval. */
    ARG_INT(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    if (l->max_header_list_bytes > 0)
        ARG_INT(GRPC_ARG_MAX_METADATA_SIZE, l->max_header_list_bytes);
    if (l->handshake_timeout_ms > 0)
        ARG_INT(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, l->handshake_timeout_ms);
#undef ARG_INT
    return n;
}

/* ---------------------------------------------------------------------- */
/* Byte buffers                                                           */
/* ---------------------------------------------------------------------- */

int cinfer_bb_read(grpc_byte_buffer *bb, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return 0;
    size_t n = grpc_byte_buffer_length(bb);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        grpc_byte_buffer_reader_destroy(&r);
        return 0;
    }
    size_t off = 0;
    grpc_slice s;
    while (grpc_byte_buffer_reader_next(&r, &s)) {
        size_t k = GRPC_SLICE_LENGTH(s);
        if (off + k <= n) {
            memcpy(buf + off, GRPC_SLICE_START_PTR(s), k);
            off += k;
        }
        grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&r);
    *out = buf;
    *len = off;
    return 1;
}

cinfer_status cinfer_call_read(srv_call *c, grpc_byte_buffer *bb,
                               uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    if (bb->type == GRPC_BB_RAW &&
        bb->data.raw.compression != GRPC_COMPRESS_NONE) {
        grpc_compression_algorithm a = bb->data.raw.compression;
        if (a != GRPC_COMPRESS_GZIP && a != GRPC_COMPRESS_DEFLATE)
            return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                    "request compression %d is not "
                                    "supported (gzip, deflate)",
                                    (int)a);
        const grpc_slice_buffer *sb = &bb->data.raw.slice_buffer;
        size_t max = (size_t)c->srv->params.max_receive_message_bytes;
        return cinfer_wire_inflate(sb->slices, sb->count, max, out, len);
    }
    if (!cinfer_bb_read(bb, out, len))
        return cinfer_set_error(CINFER_E_NOMEM,
                                "out of memory reading the request");
    return CINFER_OK;
}

grpc_byte_buffer *cinfer_bb_wrap(uint8_t *data, size_t len)
{
    grpc_slice s = len ? grpc_slice_new(data, len, free)
                       : grpc_empty_slice();
    if (!len)
        free(data);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_byte_buffer *cinfer_bb_pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    protobuf_c_message_pack(m, buf);
    return cinfer_bb_wrap(buf, n);
}

/* ---------------------------------------------------------------------- */
/* Calls                                                                  */
/* ---------------------------------------------------------------------- */

static srv_call *call_new(cinfer_server *s, srv_worker *w)
{
    srv_call *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->srv = s;
    c->w = w;
    c->state = CALL_ACCEPTING;
    atomic_init(&c->refs, 0);
    atomic_init(&c->core_ended, 0);
    atomic_init(&c->recv_expired, 0);
    pthread_mutex_init(&c->mu, NULL);
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->request_md);
    pthread_mutex_lock(&s->mu);
    s->calls_live++;
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* ---- the wait for the first message (conn.receive_timeout_ms) ---- */

static void recv_unlist_locked(srv_call *c)
{
    cinfer_server *s = c->srv;
    if (!c->recv_listed)
        return;
    if (c->rprev)
        c->rprev->rnext = c->rnext;
    else
        s->recv_list = c->rnext;
    if (c->rnext)
        c->rnext->rprev = c->rprev;
    c->rnext = c->rprev = NULL;
    c->recv_listed = 0;
}

static void recv_list(srv_call *c)
{
    cinfer_server *s = c->srv;
    int64_t t = s->params.conn.receive_timeout_ms;
    if (t <= 0)
        return;
    pthread_mutex_lock(&s->mu);
    c->recv_deadline_ns = c->start_ns + cinfer_ms_to_ns(t);
    c->rprev = NULL;
    c->rnext = s->recv_list;
    if (s->recv_list)
        s->recv_list->rprev = c;
    s->recv_list = c;
    c->recv_listed = 1;
    pthread_mutex_unlock(&s->mu);
}

static void recv_unlist(srv_call *c)
{
    cinfer_server *s = c->srv;
    pthread_mutex_lock(&s->mu);
    recv_unlist_locked(c);
    pthread_mutex_unlock(&s->mu);
}

/* A reference for a call found on a list under s->mu; 0 when its last one
 * is gone (call_free waits for s->mu to take it off). */
static int ref_listed(srv_call *c)
{
    int r = atomic_load(&c->refs);
    while (r > 0 && !atomic_compare_exchange_weak(&c->refs, &r, r + 1)) {
    }
    return r > 0;
}

void cinfer_server_expire_receives(cinfer_server *s, int64_t now_ns)
{
    srv_call *due[64];
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    for (srv_call *c = s->recv_list; c && n < 64;) {
        srv_call *next = c->rnext;
        if (now_ns >= c->recv_deadline_ns) {
            recv_unlist_locked(c);
            if (ref_listed(c))
                due[n++] = c;
        }
        c = next;
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++) {
        srv_call *c = due[i];
        atomic_store(&c->recv_expired, 1);
        char msg[96];
        snprintf(msg, sizeof msg, "no request message within %lld ms",
                 (long long)s->params.conn.receive_timeout_ms);
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED,
                                     msg, NULL);
        cinfer_call_unref(c);
    }
}

/* The one function that frees a call: runs when its last reference goes,
 * on whichever thread dropped it. */
static void call_free(srv_call *c)
{
    cinfer_server *s = c->srv;
    /* Off the lists first, so nobody walking them (health notify, abort)
     * can reach the call while it is taken apart. */
    pthread_mutex_lock(&s->mu);
    recv_unlist_locked(c);
    if (c->listed) {
        int gen = c->method && c->method->kind == RPC_GENERATE;
        srv_call **head = gen ? &s->generate_list : &s->watch_list;
        if (c->prev)
            c->prev->next = c->next;
        else
            *head = c->next;
        if (c->next)
            c->next->prev = c->prev;
        c->listed = 0;
        if (gen)
            s->generate_open--;
    }
    pthread_mutex_unlock(&s->mu);

    if (c->method && c->method->free_rpc)
        c->method->free_rpc(c);
    if (c->recv_buf)
        grpc_byte_buffer_destroy(c->recv_buf);
    if (c->step_buf)
        grpc_byte_buffer_destroy(c->step_buf);
    if (c->send_buf)
        grpc_byte_buffer_destroy(c->send_buf);
    if (c->has_status_details)
        grpc_slice_unref(c->status_details);
    for (size_t i = 0; i < c->n_trailers; i++) {
        grpc_slice_unref(c->trailers[i].key);
        grpc_slice_unref(c->trailers[i].value);
    }
    for (size_t i = 0; i < c->n_initial_md; i++) {
        grpc_slice_unref(c->initial_md[i].key);
        grpc_slice_unref(c->initial_md[i].value);
    }
    cinfer_api_keys_unref(c->key_set);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->request_md);
    if (c->call)
        grpc_call_unref(c->call);
    pthread_mutex_destroy(&c->mu);
    int accepted = c->accepted;
    free(c);

    /* Last: destroy waits for calls_live == 0 before shutting gRPC down. */
    pthread_mutex_lock(&s->mu);
    if (accepted)
        s->calls_open--;
    s->calls_live--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void cinfer_call_ref(srv_call *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void cinfer_call_unref(srv_call *c)
{
    int before = atomic_fetch_sub(&c->refs, 1);
    CINFER_ASSERT(before > 0);
    if (before == 1)
        call_free(c);
}

/* Starts a batch tagged (c, op), holding a reference for it. */
static int call_start(srv_call *c, int op, const grpc_op *ops, size_t n)
{
    cinfer_call_ref(c);
    grpc_call_error e =
        grpc_call_start_batch(c->call, ops, n, cinfer_call_tag(c, op), NULL);
    if (e != GRPC_CALL_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_WARN, "start_batch failed",
                             c->request_id)) {
            cinfer_log_str(&l, "error", grpc_call_error_to_string(e));
            cinfer_log_end(&l);
        }
        cinfer_call_unref(c);
        return 0;
    }
    return 1;
}

void cinfer_call_recv(srv_call *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    c->state = CALL_RECEIVING;
    call_start(c, OP_STEP, &op, 1);
}

/* The initial metadata: the trace echo (traceparent, x-request-id), or
 * nothing when the response is Trailers-Only (gRPC writes one only when the
 * initial metadata is empty; the echo then goes in the trailers). */
static void put_initial_md(srv_call *c, grpc_op *op, int trailers_only)
{
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    c->initial_md_sent = 1;
    if (trailers_only || !c->trace.trace_id[0])
        return;
    c->n_initial_md = cinfer_trace_metadata(&c->trace, c->request_id,
                                            c->initial_md);
    op->data.send_initial_metadata.count = c->n_initial_md;
    op->data.send_initial_metadata.metadata = c->initial_md;
}

int cinfer_call_send_message(srv_call *c, int op, grpc_byte_buffer *msg)
{
    grpc_op ops[2];
    size_t n = 0;
    if (!c->initial_md_sent)
        put_initial_md(c, &ops[n++], 0);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = msg;
    n++;
    grpc_byte_buffer **slot = op == OP_STEP ? &c->step_buf : &c->send_buf;
    CINFER_ASSERT(*slot == NULL);
    *slot = msg;
    if (op == OP_STEP)
        c->state = CALL_SENDING;
    if (!call_start(c, op, ops, n)) {
        *slot = NULL;
        grpc_byte_buffer_destroy(msg);
        return 0;
    }
    return 1;
}

const char *cinfer_call_method_name(const srv_call *c)
{
    if (!c->method)
        return "unknown";
    const char *slash = strrchr(c->method->path, '/');
    return slash ? slash + 1 : c->method->path;
}

/* The trailers of a rejection: grpc-retry-pushback-ms and
 * grpc-status-details-bin. Returns 0 when out of memory (the status is then
 * sent without them). */
static int put_trailers(srv_call *c, cinfer_status st, const char *details,
                        const cinfer_pushback *pb)
{
    CINFER_ASSERT(c->n_trailers == 0);
    grpc_slice bin;
    if (!cinfer_rpc_status_pack((int)cinfer_server_grpc_status(st), details,
                                pb, &bin))
        return 0;
    char ms[32];
    snprintf(ms, sizeof ms, "%lld",
             (long long)(pb->retry_after_ms > 0 ? pb->retry_after_ms : 0));
    c->trailers[0].key = grpc_slice_from_static_string("grpc-retry-pushback-ms");
    c->trailers[0].value = grpc_slice_from_copied_string(ms);
    c->trailers[1].key =
        grpc_slice_from_static_string("grpc-status-details-bin");
    c->trailers[1].value = bin;
    c->n_trailers = 2;
    return 1;
}

/* A cinfer.v1.Inference call: counted in the metrics, carries a load
 * report. */
static int is_inference(const srv_call *c)
{
    if (!c->method)
        return 0;
    switch (c->method->kind) {
    case RPC_GENERATE:
    case RPC_TOKENIZE:
    case RPC_DETOKENIZE:
    case RPC_MODEL_INFO:
        return 1;
    default:
        return 0;
    }
}

/* Counts a status in the metrics: the code of every cinfer.v1.Inference
 * call (health probes and reflection would drown them), and for a
 * rejection its reason and how long the server took to answer. */
static void count_status(srv_call *c, cinfer_status st,
                         const cinfer_pushback *pb)
{
    cinfer_metrics *m = c->srv->metrics;
    if (!is_inference(c) || c->counted)
        return;
    c->counted = 1;
    cinfer_orca_note_call(c->srv->orca, cinfer_server_now_ns(),
                          st != CINFER_OK);
    if (!m)
        return;
    cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC,
                                cinfer_call_method_name(c),
                                (int)cinfer_server_grpc_status(st));
    if (pb && pb->reason != CINFER_REJECT_NONE) {
        cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC,
                                cinfer_reject_name(pb->reason));
        int64_t ns = cinfer_server_now_ns() - c->start_ns;
        cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_REJECT,
                               (double)ns * 1e-9);
    }
}

static int deadline_passed(const srv_call *c)
{
    gpr_timespec d = c->details.deadline;
    return gpr_time_cmp(gpr_now(d.clock_type), d) >= 0;
}

int cinfer_call_ended_by_core(srv_call *c)
{
    return atomic_load(&c->core_ended);
}

void cinfer_call_count_ended(srv_call *c)
{
    if (c->counted)
        return;
    cinfer_status st = deadline_passed(c) || atomic_load(&c->recv_expired)
                           ? CINFER_E_TIMEOUT
                           : CINFER_E_CANCELLED;
    count_status(c, st, NULL);
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "call ended by the client",
                         c->request_id[0] ? c->request_id : NULL)) {
        cinfer_log_str(&l, "frontend", "grpc");
        cinfer_log_str(&l, "method", c->method ? c->method->path : "?");
        cinfer_log_str(&l, "status", cinfer_status_name(st));
        cinfer_log_end(&l);
    }
}

int cinfer_call_send_status(srv_call *c, int op, grpc_byte_buffer *msg,
                            cinfer_status st, const char *details)
{
    return cinfer_call_send_status_ex(c, op, msg, st, details, NULL);
}

int cinfer_call_send_status_ex(srv_call *c, int op, grpc_byte_buffer *msg,
                               cinfer_status st, const char *details,
                               const cinfer_pushback *pb)
{
    /* A call the core already ended (the client's RST_STREAM, a passed
     * deadline) gets no second status: it counts as what ended it. */
    if (cinfer_call_ended_by_core(c)) {
        if (msg)
            grpc_byte_buffer_destroy(msg);
        cinfer_call_count_ended(c);
        if (op == OP_STEP)
            c->state = CALL_DONE;
        return 0;
    }
    grpc_op ops[3];
    size_t n = 0;
    int trailers_only = !c->initial_md_sent && !msg;
    if (!c->initial_md_sent)
        put_initial_md(c, &ops[n++], trailers_only);
    grpc_byte_buffer **slot = op == OP_STEP ? &c->step_buf : &c->send_buf;
    if (msg) {
        CINFER_ASSERT(*slot == NULL);
        *slot = msg;
        memset(&ops[n], 0, sizeof ops[n]);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = msg;
        n++;
    }
    CINFER_ASSERT(!c->has_status_details);
    c->status_details = grpc_slice_from_copied_string(details ? details : "");
    c->has_status_details = 1;
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = cinfer_server_grpc_status(st);
    ops[n].data.send_status_from_server.status_details =
        st == CINFER_OK ? NULL : &c->status_details;
    if (pb && st != CINFER_OK)
        put_trailers(c, st, details, pb);
    count_status(c, st, pb);
    /* After count_status: the report's rates include this call. */
    if (c->srv->orca && is_inference(c) &&
        cinfer_orca_trailer(c->srv->orca, cinfer_server_now_ns(),
                            &c->trailers[c->n_trailers]))
        c->n_trailers++;
    if (trailers_only && c->trace.trace_id[0])
        c->n_trailers += cinfer_trace_metadata(&c->trace, c->request_id,
                                               &c->trailers[c->n_trailers]);
    if (c->n_trailers > 0) {
        ops[n].data.send_status_from_server.trailing_metadata_count =
            c->n_trailers;
        ops[n].data.send_status_from_server.trailing_metadata = c->trailers;
    }
    n++;
    if (op == OP_STEP)
        c->state = CALL_FINISHING;
    if (st != CINFER_OK) {
        if (pb) {
            cinfer_log_line l;
            if (cinfer_log_begin(&l, CINFER_LOG_INFO, "call rejected",
                                 c->request_id)) {
                cinfer_log_str(&l, "frontend", "grpc");
                cinfer_log_str(&l, "method", c->method ? c->method->path : "?");
                cinfer_log_str(&l, "status", cinfer_status_name(st));
                cinfer_log_int(&l, "grpc_status",
                               (int)cinfer_server_grpc_status(st));
                if (pb->reason != CINFER_REJECT_NONE)
                    cinfer_log_str(&l, "reason",
                                   cinfer_reject_name(pb->reason));
                cinfer_log_int(&l, "retry_after_ms", pb->retry_after_ms);
                cinfer_log_str(&l, "detail", details ? details : "");
                if (cinfer_call_key_name(c))
                    cinfer_log_str(&l, "api_key", cinfer_call_key_name(c));
                cinfer_trace_log(&l, &c->trace);
                cinfer_log_end(&l);
            }
        } else {
            cinfer_call_log_status(c, st, details);
        }
    }
    if (!call_start(c, op, ops, n)) {
        if (msg) {
            *slot = NULL;
            grpc_byte_buffer_destroy(msg);
        }
        c->state = CALL_DONE;
        return 0;
    }
    return 1;
}

void cinfer_call_log_status(srv_call *c, cinfer_status st,
                            const char *details)
{
    int server_fault = st == CINFER_E_INTERNAL || st == CINFER_E_IO ||
                       st == CINFER_E_DEVICE || st == CINFER_E_FORMAT ||
                       st == CINFER_E_NOMEM;
    cinfer_log_line l;
    if (!cinfer_log_begin(&l, server_fault ? CINFER_LOG_WARN : CINFER_LOG_INFO,
                          "call failed", c->request_id))
        return;
    cinfer_log_str(&l, "frontend", "grpc");
    cinfer_log_str(&l, "method", c->method ? c->method->path : "?");
    cinfer_log_str(&l, "status", cinfer_status_name(st));
    cinfer_log_int(&l, "grpc_status", (int)cinfer_server_grpc_status(st));
    cinfer_log_str(&l, "detail", details ? details : "");
    if (cinfer_call_key_name(c))
        cinfer_log_str(&l, "api_key", cinfer_call_key_name(c));
    cinfer_trace_log(&l, &c->trace);
    cinfer_log_end(&l);
}

void cinfer_call_set_request_id(srv_call *c, const char *client_id)
{
    if (client_id && client_id[0]) {
        snprintf(c->request_id, sizeof c->request_id, "%s", client_id);
        return;
    }
    /* Else the x-request-id a proxy or client set, when it is a valid id. */
    size_t xn;
    const char *xid = cinfer_metadata_get(&c->request_md, "x-request-id", &xn);
    if (xid && xn > 0 && xn <= CINFER_MAX_REQUEST_ID_BYTES) {
        char id[CINFER_MAX_REQUEST_ID_BYTES + 1];
        memcpy(id, xid, xn);
        id[xn] = '\0';
        if (memchr(id, '\0', xn) == NULL && cinfer_request_id_ok(id)) {
            memcpy(c->request_id, id, xn + 1);
            return;
        }
    }
    unsigned long long n = atomic_fetch_add(&c->srv->next_request_seq, 1);
    snprintf(c->request_id, sizeof c->request_id, "req-%llu", n);
}

void cinfer_call_unary(srv_call *c, grpc_byte_buffer *msg, cinfer_unary_fn fn)
{
    if (!msg) {
        cinfer_call_send_status(c, OP_STEP, NULL, CINFER_E_INVALID_ARG,
                                "the request message is missing");
        return;
    }
    uint8_t *req;
    size_t len;
    cinfer_status rst = cinfer_call_read(c, msg, &req, &len);
    grpc_byte_buffer_destroy(msg);
    if (rst != CINFER_OK) {
        cinfer_call_set_request_id(c, NULL);
        cinfer_call_send_status(c, OP_STEP, NULL, rst, cinfer_last_error());
        return;
    }
    grpc_byte_buffer *out = NULL;
    cinfer_clear_error();
    cinfer_status st = fn(c, req, len, &out);
    free(req);
    if (st == CINFER_OK)
        cinfer_call_send_status(c, OP_STEP, out, CINFER_OK, NULL);
    else
        cinfer_call_send_status(c, OP_STEP, NULL, st, cinfer_last_error());
}

/* ---------------------------------------------------------------------- */
/* Accepting and dispatching                                              */
/* ---------------------------------------------------------------------- */

static void post_accept(cinfer_server *s, srv_worker *w)
{
    if (atomic_load(&s->state) == SERVER_STOPPING)
        return;
    srv_call *c = call_new(s, w);
    if (!c) {
        cinfer_log(CINFER_LOG_ERROR, "out of memory posting an accept", NULL);
        return;
    }
    cinfer_call_ref(c);
    grpc_call_error e = grpc_server_request_call(
        s->grpc, &c->call, &c->details, &c->request_md, w->cq, w->cq,
        cinfer_call_tag(c, OP_STEP));
    if (e != GRPC_CALL_OK)
        cinfer_call_unref(c);
}

static const rpc_method *find_method(const grpc_slice *path)
{
    size_t n = GRPC_SLICE_LENGTH(*path);
    const char *p = (const char *)GRPC_SLICE_START_PTR(*path);
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        if (strlen(methods[i]->path) == n &&
            memcmp(methods[i]->path, p, n) == 0)
            return methods[i];
    }
    return NULL;
}

/* Health, reflection and the load reports need no key unless
 * api_keys_all_methods says so. */
static int needs_key(const srv_call *c)
{
    if (c->srv->params.api_keys_all_methods || !c->method)
        return 1;
    switch (c->method->kind) {
    case RPC_HEALTH_CHECK:
    case RPC_HEALTH_WATCH:
    case RPC_REFLECTION:
    case RPC_ORCA_STREAM:
        return 0;
    default:
        return 1;
    }
}

const char *cinfer_call_key_name(const srv_call *c)
{
    const cinfer_api_key *k =
        c->key_set ? cinfer_api_keys_get(c->key_set, c->key_index) : NULL;
    return k ? k->name : NULL;
}

/* Checks the call's API key when the server has keys. Returns 1 to go on,
 * 0 when the call was answered UNAUTHENTICATED. */
static int authenticate(srv_call *c)
{
    cinfer_server *s = c->srv;
    pthread_mutex_lock(&s->keys_mu);
    cinfer_api_keys *ks = s->keys;
    if (ks)
        cinfer_api_keys_ref(ks);
    pthread_mutex_unlock(&s->keys_mu);
    if (!ks)
        return 1;
    if (!needs_key(c)) {
        cinfer_api_keys_unref(ks);
        return 1;
    }
    const char *key = NULL;
    size_t key_len = 0;
    for (size_t i = 0; i < c->request_md.count && !key; i++) {
        const grpc_metadata *md = &c->request_md.metadata[i];
        cinfer_api_key_from_header(
            (const char *)GRPC_SLICE_START_PTR(md->key),
            GRPC_SLICE_LENGTH(md->key),
            (const char *)GRPC_SLICE_START_PTR(md->value),
            GRPC_SLICE_LENGTH(md->value), &key, &key_len);
    }
    int idx = -1;
    if (key && key_len <= CINFER_API_KEY_MAX_BYTES)
        idx = cinfer_api_keys_find(ks, key, key_len);
    if (idx < 0) {
        cinfer_api_keys_unref(ks);
        cinfer_call_set_request_id(c, NULL);
        cinfer_call_send_status(
            c, OP_STEP, NULL, CINFER_E_UNAUTHENTICATED,
            key ? "the API key is not valid"
                : "an API key is required (authorization: Bearer KEY, or "
                  "x-api-key: KEY)");
        return 0;
    }
    c->key_set = ks;
    c->key_index = idx;
    cinfer_metrics_api_key(s->metrics, cinfer_call_key_name(c));
    return 1;
}

static void dispatch(srv_call *c)
{
    cinfer_server *s = c->srv;
    c->start_ns = cinfer_server_now_ns();
    pthread_mutex_lock(&s->mu);
    c->accepted = 1;
    s->calls_open++;
    s->calls_total++;
    pthread_mutex_unlock(&s->mu);


    /* Learn at once when the client goes away or the deadline passes. */
    grpc_op close_op;
    memset(&close_op, 0, sizeof close_op);
    close_op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    close_op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    if (!call_start(c, OP_CLOSE, &close_op, 1))
        return;

    cinfer_trace_from_metadata(&c->trace, &c->request_md);
    c->method = find_method(&c->details.method);
    /* Before anything else reads the call, and before its message. */
    if (!authenticate(c))
        return;
    if (!c->method) {
        char msg[300];
        size_t n = GRPC_SLICE_LENGTH(c->details.method);
        snprintf(msg, sizeof msg, "unknown method %.*s",
                 (int)(n > 200 ? 200 : n),
                 (const char *)GRPC_SLICE_START_PTR(c->details.method));
        cinfer_call_set_request_id(c, NULL);
        cinfer_call_send_status(c, OP_STEP, NULL, CINFER_E_UNSUPPORTED, msg);
        return;
    }
    if (c->method->needs_model) {
        int state = atomic_load(&s->state);
        if (state != SERVER_SERVING) {
            /* Retry at once on another replica while draining; after a
             * second while the model loads. */
            int loading = state == SERVER_LOADING;
            cinfer_pushback pb = {
                .reason = loading ? CINFER_REJECT_NONE : CINFER_REJECT_DRAINING,
                .retry_after_ms = loading ? LOADING_PUSHBACK_MS : 0,
            };
            cinfer_call_set_request_id(c, NULL);
            cinfer_call_send_status_ex(c, OP_STEP, NULL, CINFER_E_UNAVAILABLE,
                                       loading ? "the model is loading"
                                               : "the server is shutting down",
                                       &pb);
            return;
        }
    }
    recv_list(c);
    cinfer_call_recv(c);
}

static void on_step(srv_call *c, int ok)
{
    switch (c->state) {
    case CALL_ACCEPTING:
        if (!ok)
            return; /* the server is shutting down */
        post_accept(c->srv, c->w);
        dispatch(c);
        return;
    case CALL_RECEIVING: {
        grpc_byte_buffer *msg = c->recv_buf;
        c->recv_buf = NULL;
        if (c->srv->params.conn.receive_timeout_ms > 0)
            recv_unlist(c);
        if (!ok && msg) {
            grpc_byte_buffer_destroy(msg);
            msg = NULL;
        }
        /* No message because the call failed under us (the client
         * reset it or went away, the deadline passed) rather than a
         * half-close: RECV_CLOSE finishes it, and it counts as
         * cancelled, never as a request without a message. */
        if (!ok || (!msg && grpc_call_failed_before_recv_message(c->call))) {
            cinfer_call_set_request_id(c, NULL);
            cinfer_call_count_ended(c);
            c->state = CALL_DONE;
            return;
        }
        /* Deadlines are the server's to enforce (the core's own checks
         * are off: on a zero grpc-timeout they wrote two statuses). */
        if (msg && deadline_passed(c)) {
            grpc_byte_buffer_destroy(msg);
            cinfer_call_set_request_id(c, NULL);
            cinfer_call_send_status(c, OP_STEP, NULL, CINFER_E_TIMEOUT,
                                    "deadline exceeded before the request "
                                    "was read");
            return;
        }
        if (c->method->off_cq && c->srv->pool) {
            if (!cinfer_pool_push(c->srv->pool, c, msg)) {
                grpc_byte_buffer_destroy(msg);
                cinfer_call_set_request_id(c, NULL);
                cinfer_pushback pb = {.reason = CINFER_REJECT_NONE,
                                      .retry_after_ms = BUSY_PUSHBACK_MS};
                cinfer_call_send_status_ex(c, OP_STEP, NULL,
                                           CINFER_E_UNAVAILABLE,
                                           "overloaded: too many requests "
                                           "wait to be read",
                                           &pb);
            }
            return;
        }
        c->method->on_message(c, msg);
        return;
    }
    case CALL_SENDING:
        if (c->step_buf) {
            grpc_byte_buffer_destroy(c->step_buf);
            c->step_buf = NULL;
        }
        if (!ok) {
            c->state = CALL_DONE;
            return;
        }
        if (c->method->on_sent)
            c->method->on_sent(c, ok);
        return;
    case CALL_FINISHING:
        if (c->step_buf) {
            grpc_byte_buffer_destroy(c->step_buf);
            c->step_buf = NULL;
        }
        c->state = CALL_DONE;
        return;
    case CALL_STREAMING:
    case CALL_DONE:
        return;
    }
}

static void on_completion(void *tag, int ok)
{
    srv_call *c = (srv_call *)((uintptr_t)tag & ~CALL_OP_MASK);
    int op = (int)((uintptr_t)tag & CALL_OP_MASK);
    switch (op) {
    case OP_STEP:
        on_step(c, ok);
        break;
    case OP_CLOSE:
        pthread_mutex_lock(&c->mu);
        c->closed = 1;
        if (c->close_cancelled)
            atomic_store(&c->core_ended, 1);
        pthread_mutex_unlock(&c->mu);
        if (c->method && c->method->on_close)
            c->method->on_close(c);
        break;
    case OP_SEND:
        if (c->method && c->method->on_send)
            c->method->on_send(c, ok);
        break;
    default:
        CINFER_ASSERT(0);
    }
    cinfer_call_unref(c);
}

static void *worker_main(void *arg)
{
    srv_worker *w = arg;
    cinfer_server *s = w->srv;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(
            w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        if (ev.tag == &s->shutdown_tag) {
            pthread_mutex_lock(&s->mu);
            s->shutdown_done = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        on_completion(ev.tag, ev.success);
    }
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* Lifecycle                                                              */
/* ---------------------------------------------------------------------- */

/* gRPC's own log lines, as JSON lines like ours (stderr stays parseable),
 * at most GRPC_LOG_PER_S a second (it logs each failed accept). */
#define GRPC_LOG_PER_S 20
#define GRPC_LOG_BURST 100

static pthread_mutex_t grpc_log_mu = PTHREAD_MUTEX_INITIALIZER;
static cinfer_log_limit grpc_log_limit;
static int grpc_log_limit_ready;

/* Debian builds abseil without NDEBUG, and absl::Mutex then runs its
 * deadlock detector on every lock gRPC core takes: each Lock updates a
 * process-wide lock-order graph under one global spin lock (about 4% of the
 * server's CPU on a unary call, and contention between the completion-queue
 * threads). A release build of abseil never runs it. abseil's switch,
 * absl::SetMutexDeadlockDetectionMode, is C++, so the server looks it up
 * by its mangled name, for the inline namespaces it knows (Debian's and
 * none), and leaves the detector as it is where the name is not found. */
static void absl_deadlock_detection_off(void)
{
    static const char *const names[] = {
        "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE",
        "_ZN4absl29SetMutexDeadlockDetectionModeENS_15OnDeadlockCycleE",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *f = dlsym(RTLD_DEFAULT, names[i]);
        if (f) {
            /* absl::OnDeadlockCycle::kIgnore is 0; the enum is passed as an int. */
            void (*set_mode)(int);
            memcpy(&set_mode, &f, sizeof set_mode);
            set_mode(0);
            return;
        }
    }
}

static void grpc_log_to_json(gpr_log_func_args *a)
{
    uint64_t suppressed = 0;
    pthread_mutex_lock(&grpc_log_mu);
    if (!grpc_log_limit_ready) {
        cinfer_log_limit_init(&grpc_log_limit, GRPC_LOG_PER_S,
                              GRPC_LOG_BURST);
        grpc_log_limit_ready = 1;
    }
    int pass = cinfer_log_limit_take(&grpc_log_limit, cinfer_server_now_ns(),
                                     &suppressed);
    pthread_mutex_unlock(&grpc_log_mu);
    if (!pass)
        return;
    cinfer_log_level lvl = a->severity == GPR_LOG_SEVERITY_ERROR ? CINFER_LOG_ERROR
                           : a->severity == GPR_LOG_SEVERITY_INFO ? CINFER_LOG_INFO
                                                                  : CINFER_LOG_DEBUG;
    cinfer_log_line l;
    if (!cinfer_log_begin(&l, lvl, "grpc", NULL))
        return;
    cinfer_log_str(&l, "detail", a->message);
    cinfer_log_str(&l, "file", a->file);
    cinfer_log_int(&l, "line", a->line);
    if (suppressed)
        cinfer_log_int(&l, "suppressed", (int64_t)suppressed);
    cinfer_log_end(&l);
}

int cinfer_server_stream_begin(cinfer_server *s)
{
    pthread_mutex_lock(&s->mu);
    int ok = atomic_load(&s->state) == SERVER_SERVING;
    if (ok)
        s->generate_open++;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void cinfer_server_stream_end(cinfer_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->generate_open--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int cinfer_server_http_port(const cinfer_server *s)
{
    return cinfer_http_port(s->http);
}

int cinfer_server_port(const cinfer_server *s)
{
    return s->port;
}

cinfer_status cinfer_server_reload(cinfer_server *s)
{
    cinfer_status st = CINFER_OK;
    if (s->params.api_keys_path) {
        pthread_mutex_lock(&s->keys_mu);
        cinfer_api_keys *old = s->keys;
        cinfer_api_keys_ref(old);
        pthread_mutex_unlock(&s->keys_mu);
        cinfer_api_keys *ks = NULL;
        st = cinfer_api_keys_load(s->params.api_keys_path, old, &ks);
        if (st == CINFER_OK) {
            pthread_mutex_lock(&s->keys_mu);
            cinfer_api_keys *prev = s->keys;
            s->keys = ks;
            pthread_mutex_unlock(&s->keys_mu);
            cinfer_api_keys_unref(prev);
        }
        cinfer_api_keys_unref(old);
        cinfer_log_line l;
        if (cinfer_log_begin(&l, st == CINFER_OK ? CINFER_LOG_INFO
                                                 : CINFER_LOG_ERROR,
                             st == CINFER_OK ? "api keys reloaded"
                                             : "api keys reload failed",
                             NULL)) {
            if (st == CINFER_OK)
                cinfer_log_int(&l, "keys",
                               (int64_t)cinfer_api_keys_count(ks));
            else
                cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
    }
    if (s->tls) {
        cinfer_status tst = cinfer_tls_reload(s->tls);
        if (tst != CINFER_OK)
            st = tst;
        cinfer_log_line l;
        if (cinfer_log_begin(&l, tst == CINFER_OK ? CINFER_LOG_INFO
                                                  : CINFER_LOG_ERROR,
                             tst == CINFER_OK ? "tls reloaded"
                                              : "tls reload failed",
                             NULL)) {
            if (tst != CINFER_OK)
                cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
    }
    return st;
}

static void set_state(cinfer_server *s, server_state st)
{
    atomic_store(&s->state, (int)st);
    cinfer_health_notify(s);
}

int cinfer_server_healthy(const cinfer_server *s)
{
    cinfer_server *m = (cinfer_server *)s;
    return atomic_load(&m->state) == SERVER_SERVING &&
           cinfer_watchdog_healthy(m->wd) &&
           !cinfer_conn_limit_starved(m->conns);
}

static void check_queued_hook(void *user, int64_t now_ns)
{
    cinfer_generate_check_queued(user, now_ns);
}

static void http_check_queued_hook(void *user, int64_t now_ns)
{
    cinfer_http_check_queued(((cinfer_server *)user)->http, now_ns);
}

static void expire_receives_hook(void *user, int64_t now_ns)
{
    cinfer_server_expire_receives(user, now_ns);
}

static void conn_limit_hook(void *user, int64_t now_ns)
{
    cinfer_conn_limit_tick(((cinfer_server *)user)->conns, now_ns);
}

/* Last of the watchdog's hooks: a change of health is told to the
 * Health.Watch streams. */
static void health_hook(void *user, int64_t now_ns)
{
    (void)now_ns;
    cinfer_server *s = user;
    int healthy = cinfer_server_healthy(s);
    if (healthy == s->health_reported)
        return;
    s->health_reported = healthy;
    /* Outside SERVING, attach and drain tell the streams. */
    if (atomic_load(&s->state) == SERVER_SERVING) {
        cinfer_watchdog_log_health(s->wd, healthy);
        cinfer_health_notify(s);
    }
}

/* The metrics collector: gauges read at scrape time (HTTP thread). */
static void collect(void *user, cinfer_metrics_snapshot *out)
{
    cinfer_server *s = user;
    memset(out, 0, sizeof *out);
    out->serving = cinfer_server_healthy(s);
    /* The engine is published by attach before SERVING. */
    if (atomic_load(&s->state) != SERVER_LOADING && s->engine) {
        cinfer_engine_stats es;
        cinfer_engine_get_stats(s->engine, &es);
        out->requests_running = es.running;
        out->requests_waiting = es.waiting;
        out->kv_cache_usage = es.kv_blocks_total > 0
                                  ? (double)es.kv_blocks_used /
                                        (double)es.kv_blocks_total
                                  : 0.0;
        out->prefix_cache_queries = es.prompt_tokens + es.cached_tokens;
        out->prefix_cache_hits = es.cached_tokens;
        out->preemptions = es.preemptions;
        out->spec_draft_tokens = es.spec_drafted;
        out->spec_accepted_tokens = es.spec_accepted;
    }
    if (s->grammars) {
        cinfer_grammar_cache_stats gs;
        cinfer_grammar_cache_stats_get(s->grammars, &gs);
        out->grammar_cache_hits = gs.hits;
        out->grammar_cache_misses = gs.misses;
        out->grammar_cache_bytes = gs.bytes;
        out->grammar_cache_entries = gs.entries;
    }
    if (s->rcache) {
        cinfer_rcache_stats rs;
        cinfer_rcache_stats_get(s->rcache, &rs);
        out->response_cache_hits = rs.hits;
        out->response_cache_misses = rs.misses;
        out->response_cache_insertions = rs.insertions;
        out->response_cache_evictions = rs.evictions;
        out->response_cache_bytes = rs.bytes;
        out->response_cache_entries = rs.entries;
    }
    if (s->adm) {
        cinfer_admission_stats as;
        cinfer_admission_stats_get(s->adm, cinfer_server_now_ns(), &as);
        out->breaker_state = (int)as.breaker_state;
        for (int i = 0; i < CINFER_BREAKER_STATE_COUNT; i++)
            out->breaker_transitions += as.breaker_transitions[i];
    }
    cinfer_conn_limit_stats cs;
    cinfer_conn_limit_get_stats(s->conns, &cs);
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++) {
        out->connections_open[f] = cs.open[f];
        for (int v = 1; v < CINFER_CONN_VERDICT_COUNT_; v++)
            out->connections_refused[f][v - 1] = cs.refused[f][v];
    }
}

cinfer_status cinfer_server_create(const cinfer_server_params *p,
                                   cinfer_server **out)
{
    *out = NULL;
    cinfer_server_params d = cinfer_server_default_params();
    cinfer_server_params sp = p ? *p : d;
    if (!sp.listen || !sp.listen[0])
        sp.listen = d.listen;
    if (sp.grpc_threads <= 0)
        sp.grpc_threads = d.grpc_threads;
    if (sp.request_threads < 0 || sp.request_threads > 256)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "request_threads must be in [0, 256], got %d",
                                sp.request_threads);
    if (sp.request_queue <= 0)
        sp.request_queue = d.request_queue;
    if (sp.grpc_threads > 256)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grpc_threads must be in [1, 256], got %d",
                                sp.grpc_threads);
    if (sp.max_receive_message_bytes <= 0)
        sp.max_receive_message_bytes = d.max_receive_message_bytes;
    if (sp.default_max_tokens <= 0)
        sp.default_max_tokens = d.default_max_tokens;
    if (sp.max_request_time_ms < 0 || sp.watchdog_ms < 0 ||
        sp.unhealthy_after_faults < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "max_request_time_ms, watchdog_ms and "
                                "unhealthy_after_faults must be >= 0");
    const cinfer_server_conn_limits *cl = &sp.conn;
    const int64_t lims[] = {cl->max_concurrent_streams,
                            cl->max_connection_idle_ms,
                            cl->max_connection_age_ms,
                            cl->max_connection_age_grace_ms,
                            cl->min_ping_interval_ms,
                            cl->max_ping_strikes,
                            cl->max_header_list_bytes,
                            cl->handshake_timeout_ms,
                            cl->receive_timeout_ms,
                            cl->max_connections,
                            cl->max_connections_per_peer,
                            cl->fd_reserve};
    for (size_t i = 0; i < sizeof lims / sizeof lims[0]; i++)
        if (lims[i] < 0 || lims[i] > INT32_MAX)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "connection limits must be in [0, %d]",
                                    INT32_MAX);

    cinfer_server *s = calloc(1, sizeof *s);
    if (!s)
        return cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
    s->params = sp;
    s->listen = strdup(sp.listen);
    s->params.listen = s->listen;
    atomic_init(&s->state, SERVER_LOADING);
    atomic_init(&s->next_worker, 0);
    atomic_init(&s->next_request_seq, 1);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->keys_mu, NULL);
    s->metrics = sp.metrics;
    cinfer_chat_template_detect(&s->chat, NULL, 0);
    cinfer_status st = CINFER_OK;
    if (!s->listen) {
        st = cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
        goto fail_alloc;
    }
    st = cinfer_watchdog_create(s, &s->wd);
    if (st == CINFER_OK)
        st = cinfer_service_times_create(&s->svc);
    if (st == CINFER_OK) {
        cinfer_grammar_cache_params gp = cinfer_grammar_cache_default_params();
        if (sp.grammar_cache_bytes)
            gp.max_bytes = sp.grammar_cache_bytes;
        st = cinfer_grammar_cache_create(&gp, &s->grammars);
    }
    if (st == CINFER_OK && sp.response_cache_bytes) {
        cinfer_rcache_params rp = {.max_bytes = sp.response_cache_bytes};
        st = cinfer_rcache_create(&rp, &s->rcache);
    }
    if (st != CINFER_OK)
        goto fail_alloc;

    cinfer_conn_limit_params clp = {cl->max_connections,
                                    cl->max_connections_per_peer,
                                    cl->fd_reserve};
    st = cinfer_conn_limit_create(&clp, &s->conns);
    if (st != CINFER_OK)
        goto fail_alloc;

    if (sp.api_keys_path && sp.api_keys_path[0]) {
        st = cinfer_api_keys_load(sp.api_keys_path, NULL, &s->keys);
        if (st != CINFER_OK)
            goto fail_alloc;
    } else {
        s->params.api_keys_path = NULL;
    }

    if (sp.resilience) {
        cinfer_admission_params ap = sp.admission;
        if (getrandom(ap.hash_seed, sizeof ap.hash_seed, GRND_NONBLOCK) !=
            (ssize_t)sizeof ap.hash_seed) {
            ap.hash_seed[0] = (uint64_t)cinfer_server_now_ns();
            ap.hash_seed[1] = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull;
        }
        st = cinfer_admission_create(&ap, &s->adm);
        if (st != CINFER_OK)
            goto fail_alloc;
    }

    if (sp.request_threads > 0) {
        st = cinfer_pool_create(sp.request_threads, sp.request_queue,
                                &s->pool);
        if (st != CINFER_OK)
            goto fail_alloc;
    }
    if (sp.emit_thread) {
        st = cinfer_emitter_create(&s->emitter);
        if (st != CINFER_OK)
            goto fail_alloc;
    }

    st = cinfer_refl_index_create(cinfer_proto_descriptor_set,
                                  cinfer_proto_descriptor_set_len, &s->refl);
    if (st != CINFER_OK)
        goto fail_alloc;
    st = cinfer_orca_create(s, &s->orca);
    if (st != CINFER_OK) {
        cinfer_refl_index_destroy(s->refl);
        goto fail_alloc;
    }

    gpr_set_log_function(grpc_log_to_json);
    absl_deadlock_detection_off();
    grpc_init();
    grpc_arg args[20];
    memset(args, 0, sizeof args);
    grpc_channel_args ch_args = {channel_args(&sp, s->conns, args), args};
    s->grpc = grpc_server_create(&ch_args, NULL);
    if (!s->grpc) {
        st = cinfer_set_error(CINFER_E_INTERNAL, "grpc_server_create failed");
        goto fail_grpc;
    }

    s->n_workers = sp.grpc_threads;
    s->workers = calloc((size_t)s->n_workers, sizeof *s->workers);
    if (!s->workers) {
        st = cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
        goto fail_server;
    }
    for (int i = 0; i < s->n_workers; i++) {
        s->workers[i].srv = s;
        s->workers[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->grpc, s->workers[i].cq,
                                              NULL);
    }

    grpc_server_credentials *creds = NULL;
    if (sp.tls_cert_path && sp.tls_cert_path[0]) {
        cinfer_tls_params tp = {sp.tls_cert_path, sp.tls_key_path,
                                sp.tls_client_ca_path};
        st = cinfer_tls_create(&tp, &s->tls);
        if (st != CINFER_OK)
            goto fail_cqs;
        creds = cinfer_tls_credentials(s->tls);
    } else if (sp.tls_client_ca_path && sp.tls_client_ca_path[0]) {
        st = cinfer_set_error(CINFER_E_INVALID_ARG,
                              "--tls-client-ca needs --tls-cert and "
                              "--tls-key");
        goto fail_cqs;
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    if (!creds) {
        st = cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
        goto fail_cqs;
    }
    s->port = grpc_server_add_http2_port(s->grpc, s->listen, creds);
    grpc_server_credentials_release(creds);
    if (s->port <= 0) {
        st = cinfer_set_error(CINFER_E_IO, "cannot listen on %s%s", s->listen,
                              s->tls ? " with TLS (do --tls-cert and "
                                       "--tls-key hold a certificate and "
                                       "its key?)"
                                     : "");
        goto fail_cqs;
    }
    grpc_server_start(s->grpc);

    /* Threads first, accepts after: every posted accept then has a thread
     * polling its queue, which destroy relies on. */
    for (int i = 0; i < s->n_workers; i++) {
        if (pthread_create(&s->workers[i].thread, NULL, worker_main,
                           &s->workers[i]) != 0) {
            st = cinfer_set_error(CINFER_E_INTERNAL,
                                  "cannot start a server thread");
            if (i == 0)
                goto fail_started;
            /* Worker 0 runs: destroy can shut the server down. The other
             * queues have nothing posted. */
            s->n_workers = i;
            cinfer_server_destroy(s);
            return st;
        }
        s->workers[i].started = 1;
    }
    for (int i = 0; i < s->n_workers; i++)
        for (int k = 0; k < ACCEPTS_PER_CQ; k++)
            post_accept(s, &s->workers[i]);
    if (s->metrics)
        cinfer_metrics_set_collector(s->metrics, collect, s);
    if (sp.http_listen && *sp.http_listen) {
        st = cinfer_http_create(s, sp.http_listen, &s->http);
        if (st != CINFER_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", cinfer_last_error());
            cinfer_server_destroy(s);
            return cinfer_set_error(st, "%s", msg);
        }
    }
    *out = s;
    return CINFER_OK;

fail_started:
    /* Started with no thread and no call: shut down by hand. */
    grpc_server_shutdown_and_notify(s->grpc, s->workers[0].cq,
                                    &s->shutdown_tag);
    grpc_completion_queue_next(s->workers[0].cq,
                               gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
fail_cqs:
    grpc_server_destroy(s->grpc);
    for (int i = 0; i < s->n_workers; i++) {
        grpc_completion_queue_shutdown(s->workers[i].cq);
        while (grpc_completion_queue_next(s->workers[i].cq,
                                          gpr_inf_future(GPR_CLOCK_REALTIME),
                                          NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(s->workers[i].cq);
    }
    free(s->workers);
    goto fail_grpc;
fail_server:
    grpc_server_destroy(s->grpc);
fail_grpc:
    grpc_shutdown_blocking();
    cinfer_tls_destroy(s->tls); /* after the core let its credentials go */
    cinfer_refl_index_destroy(s->refl);
fail_alloc:
    cinfer_conn_limit_release(s->conns);
    cinfer_pool_destroy(s->pool);
    cinfer_emitter_destroy(s->emitter);
    cinfer_orca_destroy(s->orca);
    cinfer_admission_destroy(s->adm);
    cinfer_api_keys_unref(s->keys);
    cinfer_watchdog_destroy(s->wd);
    cinfer_service_times_destroy(s->svc);
    cinfer_grammar_cache_destroy(s->grammars);
    cinfer_rcache_destroy(s->rcache);
    pthread_mutex_destroy(&s->keys_mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->listen);
    free(s);
    return st;
}

cinfer_status cinfer_server_attach(cinfer_server *s, cinfer_model *model,
                                   cinfer_engine *engine)
{
    if (!model || !engine)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "server attach: model and engine are "
                                "required");
    if (s->engine)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "server attach: already attached");
    const cinfer_model_info *mi = cinfer_model_get_info(model);
    s->model = model;
    s->engine = engine;
    s->tk = cinfer_model_tokenizer(model);
    s->limits.n_vocab = cinfer_tokenizer_n_vocab(s->tk);
    s->limits.n_ctx = mi->n_ctx;
    s->limits.default_max_tokens = s->params.default_max_tokens;
    s->limits.n_embd = cinfer_model_input_embeds(model) ? mi->n_embd : 0;

    cinfer_gguf_str tmpl = {NULL, 0};
    const cinfer_gguf *g = cinfer_model_gguf(model);
    if (g && cinfer_gguf_get_str(g, "tokenizer.chat_template", &tmpl) !=
                 CINFER_OK) {
        tmpl.ptr = NULL;
        tmpl.len = 0;
    }
    cinfer_chat_template_cleanup(&s->chat);
    cinfer_status st = cinfer_chat_template_init(&s->chat, tmpl.ptr,
                                                 (size_t)tmpl.len, s->tk);
    if (st != CINFER_OK)
        return st;
    s->limits.chat_supported = s->chat.format != CINFER_CHAT_NONE;

    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "serving", NULL)) {
        cinfer_log_str(&l, "model", mi->name);
        cinfer_log_str(&l, "arch", mi->arch);
        cinfer_log_str(&l, "quant", mi->quant);
        cinfer_log_int(&l, "n_ctx", mi->n_ctx);
        cinfer_log_int(&l, "n_vocab", s->limits.n_vocab);
        cinfer_backend *be = cinfer_model_backend(model);
        cinfer_log_str(&l, "backend", cinfer_backend_name(be));
        cinfer_log_str(&l, "device", cinfer_backend_device_desc(be));
        /* Memory as planned at start (GetModelInfo's Backend has the
         * bytes); budget 0 = none (the CPU). */
        const double mib = 1024.0 * 1024.0;
        cinfer_log_double(&l, "weights_mib",
                          (double)mi->weights_held_bytes / mib);
        cinfer_log_double(&l, "activations_mib",
                          (double)mi->activation_bytes / mib);
        cinfer_log_double(&l, "scratch_mib", (double)mi->scratch_bytes / mib);
        cinfer_log_double(&l, "kv_mib", (double)mi->kv_bytes / mib);
        cinfer_log_int(&l, "kv_blocks", mi->n_kv_blocks);
        cinfer_log_double(&l, "budget_mib", (double)mi->budget_bytes / mib);
        cinfer_log_str(&l, "chat_template",
                       tmpl.ptr ? (s->chat.format ? cinfer_chat_format_name(
                                                        s->chat.format)
                                                  : "unsupported")
                                : "none");
        cinfer_log_end(&l);
    }
    /* The watchdog reads s->engine: start it once that is set, with the
     * periodic work of the calls' files as its hooks. */
    st = cinfer_watchdog_add_hook(s->wd, check_queued_hook, s);
    if (st == CINFER_OK)
        st = cinfer_watchdog_add_hook(s->wd, expire_receives_hook, s);
    if (st == CINFER_OK)
        st = cinfer_watchdog_add_hook(s->wd, conn_limit_hook, s);
    if (st == CINFER_OK && s->http)
        st = cinfer_watchdog_add_hook(s->wd, http_check_queued_hook, s);
    if (st == CINFER_OK)
        st = cinfer_watchdog_add_hook(s->wd, health_hook, s);
    s->health_reported = 1; /* SERVING comes next and tells */
    if (st == CINFER_OK)
        st = cinfer_watchdog_start(s->wd);
    if (st != CINFER_OK)
        return st;
    /* Publishes model/engine/limits to the worker threads: they read them
     * only after seeing SERVING (sequentially consistent atomics). */
    set_state(s, SERVER_SERVING);
    return CINFER_OK;
}

/* Waits on s->cv until *cond or the absolute monotonic deadline (ns, < 0 =
 * none). Called with s->mu held. Returns 0 on timeout. */
static int wait_until(cinfer_server *s, int (*cond)(cinfer_server *),
                      int64_t deadline_ns)
{
    while (!cond(s)) {
        if (deadline_ns < 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        struct timespec ts = {(time_t)(deadline_ns / 1000000000),
                              (long)(deadline_ns % 1000000000)};
        if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) == ETIMEDOUT)
            return cond(s);
    }
    return 1;
}

static int no_generate(cinfer_server *s)
{
    return s->generate_open == 0;
}

static int all_freed(cinfer_server *s)
{
    return s->shutdown_done && s->calls_live == 0;
}

int cinfer_server_drain(cinfer_server *s, int64_t timeout_ms)
{
    if (s->adm)
        cinfer_admission_set_draining(s->adm, 1);
    if (atomic_load(&s->state) < SERVER_DRAINING)
        set_state(s, SERVER_DRAINING);
    pthread_mutex_lock(&s->mu);
    int n0 = s->generate_open;
    pthread_mutex_unlock(&s->mu);
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "draining", NULL)) {
        cinfer_log_int(&l, "streams", n0);
        cinfer_log_int(&l, "timeout_ms", timeout_ms);
        cinfer_log_end(&l);
    }
    int64_t deadline =
        timeout_ms < 0 ? -1 : cinfer_server_now_ns() + timeout_ms * 1000000;
    pthread_mutex_lock(&s->mu);
    wait_until(s, no_generate, deadline);
    int left = s->generate_open;
    pthread_mutex_unlock(&s->mu);
    if (cinfer_log_begin(&l, left ? CINFER_LOG_WARN : CINFER_LOG_INFO,
                         "drained", NULL)) {
        cinfer_log_int(&l, "streams_left", left);
        cinfer_log_end(&l);
    }
    return left;
}

void cinfer_server_destroy(cinfer_server *s)
{
    if (!s)
        return;
    /* No scrape reads the server from here on. */
    if (s->metrics)
        cinfer_metrics_set_collector(s->metrics, NULL, NULL);
    if (s->adm)
        cinfer_admission_set_draining(s->adm, 1);
    if (atomic_load(&s->state) < SERVER_DRAINING)
        set_state(s, SERVER_DRAINING);
    atomic_store(&s->state, SERVER_STOPPING);
    /* The watchdog stops first: it holds an engine request of its own (the
     * health probe) and walks the Generate list. */
    cinfer_watchdog_stop(s->wd);
    /* The out-of-band reports stop; their streams end with the other
     * calls below (the statuses sent meanwhile still carry a report: the
     * engine outlives the server). */
    cinfer_orca_stop(s->orca);

    /* Streams still running: stop them in the engine; each sends
     * UNAVAILABLE once its FINISH arrives. */
    cinfer_generate_abort_all(s);
    cinfer_http_abort_all(s->http);
    pthread_mutex_lock(&s->mu);
    wait_until(s, no_generate,
               cinfer_server_now_ns() + (int64_t)ABORT_GRACE_MS * 1000000);
    pthread_mutex_unlock(&s->mu);

    /* The HTTP connections end (their requests finished or were
     * cancelled above). */
    cinfer_http_destroy(s->http);
    s->http = NULL;
    grpc_server_shutdown_and_notify(s->grpc, s->workers[0].cq,
                                    &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->grpc);
    pthread_mutex_lock(&s->mu);
    wait_until(s, all_freed, -1);
    pthread_mutex_unlock(&s->mu);
    /* Every call is freed: the request threads and the emission thread
     * have nothing queued. */
    cinfer_pool_destroy(s->pool);
    cinfer_emitter_destroy(s->emitter);

    for (int i = 0; i < s->n_workers; i++)
        grpc_completion_queue_shutdown(s->workers[i].cq);
    for (int i = 0; i < s->n_workers; i++) {
        if (s->workers[i].started)
            pthread_join(s->workers[i].thread, NULL);
        grpc_completion_queue_destroy(s->workers[i].cq);
    }
    grpc_server_destroy(s->grpc);
    grpc_shutdown_blocking();
    cinfer_tls_destroy(s->tls);
    free(s->workers);
    cinfer_refl_index_destroy(s->refl);
    cinfer_chat_template_cleanup(&s->chat);
    cinfer_orca_destroy(s->orca);
    cinfer_admission_destroy(s->adm);
    cinfer_api_keys_unref(s->keys);
    cinfer_conn_limit_release(s->conns);
    cinfer_watchdog_destroy(s->wd);
    cinfer_service_times_destroy(s->svc);
    cinfer_grammar_cache_destroy(s->grammars);
    cinfer_rcache_destroy(s->rcache);
    pthread_mutex_destroy(&s->keys_mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    cinfer_log(CINFER_LOG_INFO, "stopped", NULL);
    free(s->listen);
    free(s);
}
