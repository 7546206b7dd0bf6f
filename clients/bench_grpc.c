/*
 * bench_grpc.c - cinfer-bench's gRPC driver: Generate streams against
 * cinfer-server on gRPC's core C API.
 *
 * Every stream shares one channel (one HTTP/2 connection) and one
 * completion queue that the load generator's only thread polls. A stream is
 * a heap context with three tags: the start batch (initial metadata, the
 * request, half-close, the server's initial metadata), the status batch
 * (posted at once, completes with the trailers) and the message batch
 * (reposted after each message until the stream ends). Each message is
 * timestamped when the thread takes its completion off the queue; its
 * token ids count as tokens arriving together. The context is freed when
 * no batch of it is pending any more, the only safe moment, since each
 * pending batch still holds its tag.
 *
 * Retries (max_attempts > 1) are gRPC core's: the channel's service config
 * gives Generate a retryPolicy, and the retry filter under the surface API
 * sends a refused call again (honouring grpc-retry-pushback-ms) before any
 * completion reaches this queue. A stream therefore sees only the attempt
 * that answered; the deadline set at the call's creation covers them all.
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cinfer/v1/cinfer.pb-c.h"

typedef enum { TAG_START, TAG_RECV, TAG_STATUS, TAG_UNARY } tag_kind;

typedef struct grpc_stream grpc_stream;

typedef struct {
    grpc_stream *s;
    tag_kind kind;
} stream_tag;

struct grpc_stream {
    cinfer_bench_req *req;
    grpc_call *call;
    grpc_byte_buffer *send;
    grpc_byte_buffer *recv;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice details;
    int pending;               /* batches started and not yet completed */
    int got_final;
    double t_status_s;         /* when the status arrived (0 = not yet) */
    char bad[160];             /* a protocol problem seen, "" if none */
    stream_tag t_start, t_recv, t_status;
    grpc_stream *prev, *next;  /* the driver's open streams */
};

typedef struct {
    cinfer_bench_driver base;
    cinfer_bench_driver_params p;
    grpc_channel *ch;
    grpc_completion_queue *cq;
    grpc_stream *open;
} grpc_driver;

static const char *status_name(grpc_status_code c)
{
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
        "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE",
        "DATA_LOSS", "UNAUTHENTICATED"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : "UNKNOWN";
}

static gpr_timespec deadline_after(double s)
{
    if (s <= 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(s * 1e6), GPR_TIMESPAN));
}

/* Packs a message into a byte buffer the call can send. */
static grpc_byte_buffer *pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    protobuf_c_message_pack(m, buf);
    grpc_slice s = grpc_slice_new(buf, n, free);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* The message's bytes (malloc'd) or NULL. */
static uint8_t *unpack_bytes(grpc_byte_buffer *bb, size_t *len)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb))
        return NULL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(s);
    uint8_t *out = malloc(n ? n : 1);
    if (out) {
        memcpy(out, GRPC_SLICE_START_PTR(s), n);
        *len = n;
    }
    grpc_slice_unref(s);
    return out;
}

/* ---------------------------------------------------------------------- */
/* Streams                                                                */
/* ---------------------------------------------------------------------- */

static void stream_free(grpc_driver *d, grpc_stream *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        d->open = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (s->send)
        grpc_byte_buffer_destroy(s->send);
    if (s->recv)
        grpc_byte_buffer_destroy(s->recv);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_slice_unref(s->details);
    if (s->call)
        grpc_call_unref(s->call);
    free(s);
}

/* All batches are done: records the outcome and frees the stream. */
static void stream_finish(grpc_driver *d, grpc_stream *s, double t)
{
    cinfer_bench_req *r = s->req;
    size_t dl = GRPC_SLICE_LENGTH(s->details);
    char *detail = malloc(dl + 1);
    if (detail) {
        memcpy(detail, GRPC_SLICE_START_PTR(s->details), dl);
        detail[dl] = '\0';
    }
    if (s->bad[0]) /* checked first: it cancelled the call */
        cinfer_bench_req_finish(r, t, 0, "BAD_RESPONSE", s->bad);
    else if (s->status != GRPC_STATUS_OK)
        cinfer_bench_req_finish(r, t, 0, status_name(s->status), detail);
    else if (!s->got_final)
        cinfer_bench_req_finish(r, t, 0, "NO_FINAL",
                                "the stream ended without a Final message");
    else
        cinfer_bench_req_finish(r, t, 1, "OK", NULL);
    free(detail);
    stream_free(d, s);
}

static int start_recv(grpc_stream *s)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv;
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_recv, NULL) !=
        GRPC_CALL_OK)
        return 0;
    s->pending++;
    return 1;
}

static void mark_bad(grpc_stream *s, const char *what)
{
    if (!s->bad[0])
        snprintf(s->bad, sizeof s->bad, "%s", what);
    grpc_call_cancel(s->call, NULL);
}

/* One response message arrived at t. Returns 1 to keep reading. */
static int on_message(grpc_stream *s, double t)
{
    size_t len = 0;
    uint8_t *data = unpack_bytes(s->recv, &len);
    grpc_byte_buffer_destroy(s->recv);
    s->recv = NULL;
    if (!data) {
        mark_bad(s, "a response could not be read");
        return 0;
    }
    Cinfer__V1__GenerateResponse *m =
        cinfer__v1__generate_response__unpack(NULL, len, data);
    free(data);
    if (!m) {
        mark_bad(s, "a response does not decode as GenerateResponse");
        return 0;
    }
    int more = 1;
    if (s->got_final) {
        mark_bad(s, "a message after the Final message");
        more = 0;
    } else if (m->kind_case == CINFER__V1__GENERATE_RESPONSE__KIND_CHUNK) {
        if (cinfer_bench_req_tokens(s->req, (int)m->chunk->n_token_ids, t) !=
            CINFER_OK) {
            mark_bad(s, cinfer_last_error());
            more = 0;
        }
    } else if (m->kind_case == CINFER__V1__GENERATE_RESPONSE__KIND_FINAL) {
        s->got_final = 1;
        if (m->final->usage && m->final->usage->prompt_tokens > 0)
            s->req->input_tokens = m->final->usage->prompt_tokens;
    } else {
        mark_bad(s, "a response with neither chunk nor final");
        more = 0;
    }
    cinfer__v1__generate_response__free_unpacked(m, NULL);
    return more;
}

static cinfer_status build_request(const grpc_driver *d,
                                   const cinfer_bench_req *r,
                                   grpc_byte_buffer **out)
{
    Cinfer__V1__GenerateRequest req = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__SamplingParams sp = CINFER__V1__SAMPLING_PARAMS__INIT;
    Cinfer__V1__StoppingCriteria sc = CINFER__V1__STOPPING_CRITERIA__INIT;
    Cinfer__V1__TokenIds ids = CINFER__V1__TOKEN_IDS__INIT;
    char rid[32];
    snprintf(rid, sizeof rid, "bench-%d", r->index);
    req.request_id = rid;
    if (r->item->prompt_ids) {
        ids.n_ids = (size_t)r->item->input_len;
        ids.ids = (int32_t *)r->item->prompt_ids;
        req.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
        req.token_ids = &ids;
    } else {
        req.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
        req.text = (char *)r->item->prompt_text;
    }
    sp.opt_temperature_case =
        CINFER__V1__SAMPLING_PARAMS__OPT_TEMPERATURE_TEMPERATURE;
    sp.temperature = (float)d->p.temperature;
    sp.opt_seed_case = CINFER__V1__SAMPLING_PARAMS__OPT_SEED_SEED;
    sp.seed = r->seed;
    sc.opt_max_tokens_case =
        CINFER__V1__STOPPING_CRITERIA__OPT_MAX_TOKENS_MAX_TOKENS;
    sc.max_tokens = r->item->output_len;
    sc.opt_ignore_eos_case =
        CINFER__V1__STOPPING_CRITERIA__OPT_IGNORE_EOS_IGNORE_EOS;
    sc.ignore_eos = d->p.ignore_eos ? 1 : 0;
    req.sampling = &sp;
    req.stopping = &sc;
    *out = pack(&req.base);
    if (!*out)
        return cinfer_set_error(CINFER_E_NOMEM, "request: out of memory");
    return CINFER_OK;
}

static cinfer_status grpc_start(cinfer_bench_driver *base,
                                cinfer_bench_req *r)
{
    grpc_driver *d = (grpc_driver *)base;
    grpc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return cinfer_set_error(CINFER_E_NOMEM, "stream: out of memory");
    s->req = r;
    s->t_start = (stream_tag){s, TAG_START};
    s->t_recv = (stream_tag){s, TAG_RECV};
    s->t_status = (stream_tag){s, TAG_STATUS};
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    s->status = GRPC_STATUS_UNKNOWN;
    s->next = d->open;
    if (d->open)
        d->open->prev = s;
    d->open = s;

    cinfer_status st = build_request(d, r, &s->send);
    if (st != CINFER_OK) {
        stream_free(d, s);
        return st;
    }
    grpc_slice path = grpc_slice_from_static_string(
        "/cinfer.v1.Inference/Generate");
    s->call = grpc_channel_create_call(d->ch, NULL, GRPC_PROPAGATE_DEFAULTS,
                                       d->cq, path, NULL,
                                       deadline_after(d->p.timeout_s), NULL);
    grpc_slice_unref(path);

    r->t_send_s = cinfer_bench_now_s();
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = s->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
    if (grpc_call_start_batch(s->call, ops, 4, &s->t_start, NULL) ==
        GRPC_CALL_OK)
        s->pending++;

    grpc_op sop;
    memset(&sop, 0, sizeof sop);
    sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sop.data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    sop.data.recv_status_on_client.status = &s->status;
    sop.data.recv_status_on_client.status_details = &s->details;
    if (grpc_call_start_batch(s->call, &sop, 1, &s->t_status, NULL) ==
        GRPC_CALL_OK)
        s->pending++;
    else
        mark_bad(s, "the status batch did not start");
    if (!start_recv(s))
        mark_bad(s, "the first receive did not start");
    if (s->pending == 0) {
        /* Nothing started: no completion will ever come. */
        s->status = GRPC_STATUS_INTERNAL;
        stream_finish(d, s, cinfer_bench_now_s());
    }
    return CINFER_OK;
}

/* Handles one completion; returns 1 if it finished a request. */
static int handle_event(grpc_driver *d, grpc_event ev, double t)
{
    stream_tag *tag = ev.tag;
    grpc_stream *s = tag->s;
    s->pending--;
    switch (tag->kind) {
    case TAG_START:
        break;
    case TAG_RECV:
        /* When the next receive does not start, the stream is over and
         * the status batch completes it. */
        if (ev.success && s->recv && on_message(s, t))
            start_recv(s);
        break;
    case TAG_STATUS:
        s->t_status_s = t;
        break;
    case TAG_UNARY:
        CINFER_ASSERT(!"unary tag on the stream queue");
        break;
    }
    if (s->pending == 0) {
        /* The stream ended with its status, even if a receive batch
         * completed a moment later. */
        stream_finish(d, s, s->t_status_s > 0 ? s->t_status_s : t);
        return 1;
    }
    return 0;
}

static cinfer_status grpc_poll(cinfer_bench_driver *base, double timeout_s,
                               int *finished)
{
    grpc_driver *d = (grpc_driver *)base;
    *finished = 0;
    gpr_timespec deadline = timeout_s > 0 ? deadline_after(timeout_s)
                                          : gpr_inf_past(GPR_CLOCK_MONOTONIC);
    /* Take what is ready, without blocking after the first event, so a
     * burst of messages is stamped as it comes and the caller can start
     * new requests soon after a finish. */
    for (int i = 0; i < 256; i++) {
        grpc_event ev = grpc_completion_queue_next(d->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            return cinfer_set_error(CINFER_E_INTERNAL,
                                    "completion queue shut down");
        *finished += handle_event(d, ev, cinfer_bench_now_s());
        if (*finished)
            break;
        deadline = gpr_inf_past(GPR_CLOCK_MONOTONIC);
    }
    return CINFER_OK;
}

static void grpc_destroy(cinfer_bench_driver *base)
{
    grpc_driver *d = (grpc_driver *)base;
    if (!d)
        return;
    /* Streams still open (a run that stopped early): cancel them and let
     * their batches complete, without touching their records. */
    for (grpc_stream *s = d->open; s; s = s->next)
        grpc_call_cancel(s->call, NULL);
    while (d->open) {
        grpc_event ev = grpc_completion_queue_next(
            d->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        stream_tag *tag = ev.tag;
        grpc_stream *s = tag->s;
        s->pending--;
        if (tag->kind == TAG_RECV && s->recv) {
            grpc_byte_buffer_destroy(s->recv);
            s->recv = NULL;
        }
        if (s->pending == 0)
            stream_free(d, s);
    }
    grpc_channel_destroy(d->ch);
    grpc_completion_queue_shutdown(d->cq);
    while (grpc_completion_queue_next(d->cq,
                                      gpr_inf_future(GPR_CLOCK_MONOTONIC),
                                      NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(d->cq);
    free(d);
    grpc_shutdown_blocking();
}

/* The service config with Generate's retry policy: maxAttempts counts the
 * first attempt; retries back off exponentially (jittered by gRPC) from
 * initialBackoff, x2 each time, up to maxBackoff, unless the server sent a
 * pushback, which gRPC waits instead. */
static int retry_service_config(char *buf, size_t size, int max_attempts,
                                int backoff_ms)
{
    long long max_ms = 10LL * backoff_ms;
    int n = snprintf(
        buf, size,
        "{\"methodConfig\": [{"
        "\"name\": [{\"service\": \"cinfer.v1.Inference\", "
        "\"method\": \"Generate\"}], "
        "\"retryPolicy\": {"
        "\"maxAttempts\": %d, "
        "\"initialBackoff\": \"%d.%03ds\", "
        "\"maxBackoff\": \"%lld.%03llds\", "
        "\"backoffMultiplier\": 2, "
        "\"retryableStatusCodes\": [\"UNAVAILABLE\", "
        "\"RESOURCE_EXHAUSTED\"]}}]}",
        max_attempts, backoff_ms / 1000, backoff_ms % 1000, max_ms / 1000,
        max_ms % 1000);
    return n > 0 && (size_t)n < size;
}

static const cinfer_bench_driver_ops grpc_ops = {
    grpc_start,
    grpc_poll,
    grpc_destroy,
};

cinfer_status cinfer_bench_grpc_create(const cinfer_bench_driver_params *p,
                                       cinfer_bench_driver **out)
{
    *out = NULL;
    char config[512];
    char k_retries[] = GRPC_ARG_ENABLE_RETRIES;
    char k_config[] = GRPC_ARG_SERVICE_CONFIG;
    grpc_arg args[2];
    grpc_channel_args chargs = {0, args};
    if (p->max_attempts > 1) {
        if (p->max_attempts > CINFER_BENCH_MAX_ATTEMPTS ||
            p->retry_backoff_ms < 1 ||
            !retry_service_config(config, sizeof config, p->max_attempts,
                                  p->retry_backoff_ms))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "retries: %d attempts, %d ms backoff",
                                    p->max_attempts, p->retry_backoff_ms);
        memset(args, 0, sizeof args);
        args[0].type = GRPC_ARG_INTEGER;
        args[0].key = k_retries;
        args[0].value.integer = 1;
        args[1].type = GRPC_ARG_STRING;
        args[1].key = k_config;
        args[1].value.string = config;
        chargs.num_args = 2;
    }
    grpc_driver *d = calloc(1, sizeof *d);
    if (!d)
        return cinfer_set_error(CINFER_E_NOMEM, "driver: out of memory");
    grpc_init();
    d->base.ops = &grpc_ops;
    d->p = *p;
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    d->ch = grpc_channel_create(p->server, creds,
                                chargs.num_args ? &chargs : NULL);
    grpc_channel_credentials_release(creds);
    d->cq = grpc_completion_queue_create_for_next(NULL);
    *out = &d->base;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* GetModelInfo                                                           */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_bench_grpc_model_info(cinfer_bench_driver *base,
                                           double timeout_s,
                                           cinfer_bench_model_info *out)
{
    grpc_driver *d = (grpc_driver *)base;
    memset(out, 0, sizeof *out);
    CINFER_ASSERT(!d->open);
    Cinfer__V1__GetModelInfoRequest req =
        CINFER__V1__GET_MODEL_INFO_REQUEST__INIT;
    grpc_byte_buffer *send = pack(&req.base);
    if (!send)
        return cinfer_set_error(CINFER_E_NOMEM, "request: out of memory");
    grpc_slice path =
        grpc_slice_from_static_string("/cinfer.v1.Inference/GetModelInfo");
    grpc_call *call = grpc_channel_create_call(
        d->ch, NULL, GRPC_PROPAGATE_DEFAULTS, d->cq, path, NULL,
        deadline_after(timeout_s), NULL);
    grpc_slice_unref(path);

    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    /* Fail fast (no wait-for-ready): nothing listening is an answer. */
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &details;
    stream_tag tag = {NULL, TAG_UNARY};
    cinfer_status st = CINFER_OK;
    if (grpc_call_start_batch(call, ops, 6, &tag, NULL) != GRPC_CALL_OK) {
        st = cinfer_set_error(CINFER_E_INTERNAL,
                              "GetModelInfo: the batch did not start");
        goto out;
    }
    /* No stream is open, so the next completion is this call's. */
    grpc_event ev = grpc_completion_queue_next(
        d->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    CINFER_ASSERT(ev.type == GRPC_OP_COMPLETE && ev.tag == &tag);
    if (status != GRPC_STATUS_OK) {
        st = cinfer_set_error(CINFER_E_UNAVAILABLE,
                              "GetModelInfo on %s: %s: %.*s", d->p.server,
                              status_name(status),
                              (int)GRPC_SLICE_LENGTH(details),
                              (const char *)GRPC_SLICE_START_PTR(details));
        goto out;
    }
    size_t len = 0;
    uint8_t *data = recv ? unpack_bytes(recv, &len) : NULL;
    Cinfer__V1__GetModelInfoResponse *m =
        data ? cinfer__v1__get_model_info_response__unpack(NULL, len, data)
             : NULL;
    free(data);
    if (!m) {
        st = cinfer_set_error(CINFER_E_FORMAT,
                              "GetModelInfo: the response does not decode");
        goto out;
    }
    out->vocab_size = m->vocab_size;
    out->context_length = m->context_length;
    snprintf(out->model, sizeof out->model, "%s", m->name);
    cinfer__v1__get_model_info_response__free_unpacked(m, NULL);
out:
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    return st;
}
