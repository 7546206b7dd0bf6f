/*
 * generate.c - cinfer.v1.Inference/Generate: the streaming call and its
 * sink.
 *
 * On a request thread (pool.c): decode, validate, then the request path
 * both front ends share (request.h: the desc, its engine params and its
 * deadline; admit.c: admission and submit, the one place that decides
 * refusals). From then on the engine thread drives the stream through
 * on_event:
 *
 *   sink (under c->mu): per sample pending {token ids, text, logprobs};
 *                       in_flight, finished, status_sent, gone
 *
 *   engine TOKENS  -> append to pending; pump
 *   engine FINISH  -> record the final numbers; pump; drop the engine's
 *                     reference
 *   send completed -> in_flight = 0; pump (worker thread)
 *   pump           -> if nothing is in flight: send one sample's pending
 *                     tokens as one Chunk (samples in turn), or, when every
 *                     sample finished and nothing is pending, the Final
 *                     message and the status in one batch
 *
 * So at most one SEND_MESSAGE is in flight per call, tokens sampled while
 * one is in flight coalesce into the next Chunk, and the engine thread never
 * waits for a client: a slow reader only grows its own pending buffer
 * (bounded by max_tokens).
 *
 * Cancellation: RECV_CLOSE_ON_SERVER completing with cancelled=1 (client
 * gone, or its gRPC library gave up at the deadline) cancels the engine
 * request; its FINISH event then
 * frees the engine's hold and the call is freed when nothing else is in
 * flight. The call's deadline (capped by max_request_time_ms) is also
 * handed to the engine, so a request whose deadline passes stops at the
 * engine's next step even before gRPC notices, whether it waits, prefills
 * or streams, and its KV blocks are freed there.
 *
 * Admission (resilience.h), after validation and tokenization (a request
 * may cost its prompt plus max_tokens): a deadline the server could not
 * meet even idle is refused at once (DEADLINE_EXCEEDED), then the token
 * buckets, the breaker and the shedder decide. A refused call gets its
 * status Trailers-Only with a pushback. An admitted call holds a ticket
 * (under c->mu) through its life:
 *
 *   QUEUED  from admission to its first token: the shedder's queue is the
 *           time to first token, which is what a deadline judges (CoDel
 *           judges only the engine's wait for a turn, the event's
 *           queue_ns);
 *           the watchdog re-checks it (cinfer_generate_check_queued) and a
 *           shed cancels it in the engine, ending the call Trailers-Only
 *   RUNNING from the first token (cinfer_admission_dequeue)
 *   DONE    at FINISH, with the outcome the breaker counts: FAILURE for an
 *           engine fault or a deadline that passed while the server held
 *           the request, IGNORED for a client's cancel or a bad request,
 *           SUCCESS otherwise
 */
#include <grpc/support/alloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/log.h"
#include "server/grow.h"
#include "server/server_impl.h"
#include "server/status_map.h"
#include "server/wire.h"

/* gRPC may notice a deadline this much before our clock reads it. */
#define DEADLINE_SLACK_NS 5000000

/* One sample's pending output, under c->mu. */
typedef struct {
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *text;            /* NUL-terminated */
    size_t n_text, cap_text;
    float *lp;             /* [n_ids] when want_logprobs */
    cinfer_token_logprob *top; /* [n_ids * n_top] */
    int finished;
    cinfer_finish_reason finish;
    int32_t completion_tokens;
} gen_sample;

typedef struct {
    /* Fixed at admission. */
    int want_logprobs;     /* request asked for logprobs */
    int n_top;             /* alternatives per token */
    int64_t call_deadline_ns; /* the call's own deadline; 0 = none */
    int32_t n_prompt;
    cinfer_grammar_entry *grammar; /* the request's, released with the
                                      state (the engine borrows it until the
                                      last FINISH) */

    /* Sink, under c->mu. */
    uint64_t engine_id;
    int submitted;         /* engine_id is valid */
    gen_sample *samples;   /* [n_samples] */
    int n_samples;
    int next_sample;       /* the one pump looks at first */
    int in_flight;
    int emit_posted;       /* queued for the emission thread (emit.c) */
    int finished;          /* every sample's FINISH seen */
    int status_sent;
    int gone;              /* client went away or a send failed */
    int oom;               /* a token could not be buffered */
    cinfer_gen_track tr;   /* admission ticket, shed, timings (admit.c) */
    cinfer_finish_reason finish; /* the call's: an error or cancel of any
                                    sample, else sample 0's */
    cinfer_status fin_status;
    char fin_message[256];
    int32_t prompt_tokens, completion_tokens, cached_tokens;
    int64_t queue_ns, ttft_ns, total_ns;
    int64_t chunks_sent;
} gen_state;

static cinfer_request_limits limits_of(const cinfer_server *s)
{
    return s->limits;
}

/* ---------------------------------------------------------------------- */
/* Messages                                                               */
/* ---------------------------------------------------------------------- */

static Cinfer__V1__FinishReason finish_to_proto(cinfer_finish_reason r)
{
    switch (r) {
    case CINFER_FINISH_LENGTH:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    case CINFER_FINISH_EOS:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_EOS;
    case CINFER_FINISH_STOP_SEQUENCE:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_STOP_SEQUENCE;
    case CINFER_FINISH_STOP_TOKEN:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_STOP_TOKEN;
    case CINFER_FINISH_CANCELLED:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
    case CINFER_FINISH_TIME_LIMIT:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_TIME_LIMIT;
    default:
        return CINFER__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
    }
}

/* Sample k's pending tokens as one GenerateResponse{chunk}; clears them.
 * NULL when out of memory (pending is kept). */
static grpc_byte_buffer *pack_chunk(srv_call *c, gen_state *g, int k)
{
    gen_sample *sm = &g->samples[k];
    Cinfer__V1__GenerateResponse resp = CINFER__V1__GENERATE_RESPONSE__INIT;
    Cinfer__V1__Chunk chunk = CINFER__V1__CHUNK__INIT;
    Cinfer__V1__TokenLogprob *tl = NULL, **tlp = NULL;
    Cinfer__V1__TopLogprob *tops = NULL, **topp = NULL;
    grpc_byte_buffer *bb = NULL;

    resp.request_id = c->request_id;
    resp.kind_case = CINFER__V1__GENERATE_RESPONSE__KIND_CHUNK;
    resp.chunk = &chunk;
    chunk.n_token_ids = sm->n_ids;
    chunk.token_ids = sm->ids;
    chunk.text = sm->text ? sm->text : "";
    chunk.index = k;
    if (g->want_logprobs && sm->n_ids) {
        size_t nt = sm->n_ids * (size_t)g->n_top;
        tl = calloc(sm->n_ids, sizeof *tl);
        tlp = calloc(sm->n_ids, sizeof *tlp);
        tops = calloc(nt ? nt : 1, sizeof *tops);
        topp = calloc(nt ? nt : 1, sizeof *topp);
        if (!tl || !tlp || !tops || !topp)
            goto out;
        for (size_t i = 0; i < sm->n_ids; i++) {
            cinfer__v1__token_logprob__init(&tl[i]);
            tl[i].token_id = sm->ids[i];
            tl[i].logprob = sm->lp[i];
            tl[i].n_top = (size_t)g->n_top;
            tl[i].top = topp + i * (size_t)g->n_top;
            for (int j = 0; j < g->n_top; j++) {
                size_t q = i * (size_t)g->n_top + (size_t)j;
                cinfer__v1__top_logprob__init(&tops[q]);
                tops[q].token_id = sm->top[q].id;
                tops[q].logprob = sm->top[q].logprob;
                topp[q] = &tops[q];
            }
            tlp[i] = &tl[i];
        }
        chunk.n_logprobs = sm->n_ids;
        chunk.logprobs = tlp;
    }
    bb = cinfer_bb_pack(&resp.base);
    if (bb) {
        sm->n_ids = 0;
        sm->n_text = 0;
        if (sm->text)
            sm->text[0] = '\0';
        g->chunks_sent++;
    }
out:
    free(tl);
    free(tlp);
    free(tops);
    free(topp);
    return bb;
}

static grpc_byte_buffer *pack_final(srv_call *c, gen_state *g)
{
    Cinfer__V1__GenerateResponse resp = CINFER__V1__GENERATE_RESPONSE__INIT;
    Cinfer__V1__Final fin = CINFER__V1__FINAL__INIT;
    Cinfer__V1__Usage usage = CINFER__V1__USAGE__INIT;
    Cinfer__V1__Timings tm = CINFER__V1__TIMINGS__INIT;
    Cinfer__V1__SampleFinal sf[CINFER_MAX_SAMPLES];
    Cinfer__V1__SampleFinal *sfp[CINFER_MAX_SAMPLES];
    resp.request_id = c->request_id;
    resp.kind_case = CINFER__V1__GENERATE_RESPONSE__KIND_FINAL;
    resp.final = &fin;
    fin.finish_reason = finish_to_proto(g->samples[0].finish);
    fin.usage = &usage;
    fin.timings = &tm;
    for (int k = 0; k < g->n_samples; k++) {
        cinfer__v1__sample_final__init(&sf[k]);
        sf[k].index = k;
        sf[k].finish_reason = finish_to_proto(g->samples[k].finish);
        sf[k].completion_tokens = g->samples[k].completion_tokens;
        sfp[k] = &sf[k];
    }
    fin.n_samples = (size_t)g->n_samples;
    fin.samples = sfp;
    usage.prompt_tokens = g->prompt_tokens;
    usage.completion_tokens = g->completion_tokens;
    usage.cached_tokens = g->cached_tokens;
    usage.cached = g->tr.cached;
    tm.queue_ms = (double)g->queue_ns * 1e-6;
    tm.time_to_first_token_ms = (double)g->ttft_ns * 1e-6;
    tm.total_ms = (double)g->total_ns * 1e-6;
    return cinfer_bb_pack(&resp.base);
}

/* ---------------------------------------------------------------------- */
/* Sink                                                                   */
/* ---------------------------------------------------------------------- */

/* Appends one TOKENS event to its sample. Returns 0 when out of memory. */
static int sink_append(gen_state *g, const cinfer_engine_event *ev)
{
    if (ev->sample_index < 0 || ev->sample_index >= g->n_samples)
        return 1;
    gen_sample *sm = &g->samples[ev->sample_index];
    size_t n = sm->n_ids + ev->n_ids;
    size_t cap_ids = sm->cap_ids;
    if (!cinfer_grow((void **)&sm->ids, &sm->cap_ids, n, sizeof *sm->ids))
        return 0;
    if (g->want_logprobs) {
        /* lp and top follow ids' capacity. */
        size_t c1 = cap_ids, c2 = cap_ids;
        if (!cinfer_grow((void **)&sm->lp, &c1, sm->cap_ids, sizeof *sm->lp))
            return 0;
        if (g->n_top > 0 &&
            !cinfer_grow((void **)&sm->top, &c2,
                         sm->cap_ids * (size_t)g->n_top, sizeof *sm->top))
            return 0;
    }
    size_t nt = sm->n_text + ev->text_len + 1;
    if (!cinfer_grow((void **)&sm->text, &sm->cap_text, nt, 1))
        return 0;
    for (size_t i = 0; i < ev->n_ids; i++) {
        size_t j = sm->n_ids + i;
        sm->ids[j] = ev->ids[i];
        if (g->want_logprobs) {
            sm->lp[j] = ev->logprobs ? ev->logprobs[i] : NAN;
            for (int k = 0; k < g->n_top; k++) {
                cinfer_token_logprob t = {-1, NAN};
                if (ev->top && k < ev->n_top)
                    t = ev->top[i * (size_t)ev->n_top + (size_t)k];
                sm->top[j * (size_t)g->n_top + (size_t)k] = t;
            }
        }
    }
    sm->n_ids = n;
    if (ev->text_len)
        memcpy(sm->text + sm->n_text, ev->text, ev->text_len);
    sm->n_text += ev->text_len;
    sm->text[sm->n_text] = '\0';
    return 1;
}

/* The next sample with pending output, from next_sample on; -1 = none. */
static int pending_sample(gen_state *g)
{
    for (int i = 0; i < g->n_samples; i++) {
        int k = (g->next_sample + i) % g->n_samples;
        if (g->samples[k].n_ids > 0 || g->samples[k].n_text > 0)
            return k;
    }
    return -1;
}

/* Starts the next send if none is in flight. c->mu held. */
static void pump(srv_call *c, gen_state *g)
{
    if (g->in_flight || g->status_sent || g->gone)
        return;
    int k = pending_sample(g);
    if (k >= 0) {
        grpc_byte_buffer *bb = pack_chunk(c, g, k);
        if (!bb) {
            g->oom = 1;
        } else {
            g->next_sample = (k + 1) % g->n_samples;
            g->in_flight = 1;
            if (!cinfer_call_send_message(c, OP_SEND, bb)) {
                g->in_flight = 0;
                g->gone = 1;
            }
            return;
        }
    }
    if (!g->finished)
        return;

    cinfer_status st = CINFER_OK;
    const char *detail = NULL;
    char msg[320];
    grpc_byte_buffer *fin = NULL;
    cinfer_pushback pb = {.reason = g->tr.shed,
                          .retry_after_ms = g->tr.shed_retry_ms};
    if (g->oom) {
        st = CINFER_E_NOMEM;
        detail = "out of memory buffering the output";
    } else if (g->tr.shed != CINFER_REJECT_NONE) {
        st = cinfer_reject_status(g->tr.shed);
        cinfer_request_reject_message(g->tr.shed, pb.retry_after_ms, NULL,
                                      msg, sizeof msg);
        detail = msg;
    } else if (g->finish == CINFER_FINISH_ERROR) {
        /* The request passed validation: what the engine refuses after
         * that is the server's fault, never the client's argument. */
        st = g->fin_status != CINFER_OK ? g->fin_status : CINFER_E_INTERNAL;
        if (cinfer_server_grpc_status(st) == GRPC_STATUS_INVALID_ARGUMENT)
            st = CINFER_E_INTERNAL;
        snprintf(msg, sizeof msg, "engine error: %s", g->fin_message);
        detail = msg;
    } else if (g->finish == CINFER_FINISH_CANCELLED) {
        st = g->tr.aborted           ? CINFER_E_UNAVAILABLE
             : g->tr.deadline_passed ? CINFER_E_TIMEOUT
                                     : CINFER_E_CANCELLED;
        detail = g->tr.aborted ? "the server shut down before the request "
                                 "finished"
                 : g->tr.deadline_passed ? "deadline exceeded"
                                         : "the request was cancelled";
    } else if (g->finish == CINFER_FINISH_TIME_LIMIT &&
               g->tr.deadline_is_hard) {
        st = CINFER_E_TIMEOUT;
        snprintf(msg, sizeof msg,
                 "deadline exceeded after %d generated tokens",
                 (int)g->completion_tokens);
        detail = msg;
    } else {
        fin = pack_final(c, g);
        if (!fin) {
            st = CINFER_E_NOMEM;
            detail = "out of memory packing the final message";
        }
    }
    g->status_sent = 1;
    g->in_flight = 1;
    if (!cinfer_call_send_status_ex(c, OP_SEND, fin, st, detail,
                                    g->tr.shed != CINFER_REJECT_NONE ? &pb
                                                                     : NULL)) {
        g->in_flight = 0;
        g->gone = 1;
    }
}

static void log_done(srv_call *c, gen_state *g)
{
    cinfer_log_line l;
    if (!cinfer_log_begin(&l, CINFER_LOG_INFO, "generate done",
                          c->request_id))
        return;
    cinfer_log_str(&l, "frontend", "grpc");
    cinfer_log_str(&l, "finish", cinfer_finish_reason_name(g->finish));
    cinfer_log_int(&l, "prompt_tokens", g->prompt_tokens);
    cinfer_log_int(&l, "completion_tokens", g->completion_tokens);
    cinfer_log_int(&l, "cached_tokens", g->cached_tokens);
    if (g->n_samples > 1)
        cinfer_log_int(&l, "samples", g->n_samples);
    cinfer_log_double(&l, "queue_ms", (double)g->queue_ns * 1e-6);
    cinfer_log_double(&l, "ttft_ms", (double)g->ttft_ns * 1e-6);
    cinfer_log_double(&l, "total_ms", (double)g->total_ns * 1e-6);
    cinfer_log_int(&l, "chunks", g->chunks_sent);
    if (g->tr.shed != CINFER_REJECT_NONE)
        cinfer_log_str(&l, "shed", cinfer_reject_name(g->tr.shed));
    if (g->tr.cached)
        cinfer_log_str(&l, "response_cache", "hit");
    if (g->gone)
        cinfer_log_str(&l, "client", "gone");
    if (g->finish == CINFER_FINISH_ERROR)
        cinfer_log_str(&l, "error", g->fin_message);
    if (cinfer_call_key_name(c))
        cinfer_log_str(&l, "api_key", cinfer_call_key_name(c));
    cinfer_trace_log(&l, &c->trace);
    cinfer_log_end(&l);
}

/* One sample's FINISH: its numbers, and the call's when it is the last.
 * c->mu held. Returns 1 for the last. */
static int on_sample_finish(srv_call *c, gen_state *g,
                            const cinfer_engine_event *ev, int64_t now)
{
    int last = cinfer_gen_track_finish(c->srv, &g->tr, ev, now);
    if (ev->sample_index >= 0 && ev->sample_index < g->n_samples) {
        gen_sample *sm = &g->samples[ev->sample_index];
        sm->finished = 1;
        sm->finish = ev->finish;
        sm->completion_tokens = ev->completion_tokens;
    }
    if (ev->finish == CINFER_FINISH_ERROR && g->fin_status == CINFER_OK) {
        g->fin_status = ev->status;
        snprintf(g->fin_message, sizeof g->fin_message, "%s",
                 ev->message ? ev->message : "");
    }
    /* The call's end: an error, a cancel or a time limit of any sample,
     * else sample 0's. */
    int rank = 0;
    g->finish = g->samples[0].finished ? g->samples[0].finish : ev->finish;
    for (int k = 0; k < g->n_samples; k++) {
        cinfer_finish_reason f = g->samples[k].finish;
        int rk = !g->samples[k].finished       ? 0
                 : f == CINFER_FINISH_ERROR     ? 3
                 : f == CINFER_FINISH_CANCELLED ? 2
                 : f == CINFER_FINISH_TIME_LIMIT ? 1
                                                 : 0;
        if (rk > rank) {
            rank = rk;
            g->finish = f;
        }
    }
    g->prompt_tokens = ev->prompt_tokens;
    g->completion_tokens += ev->completion_tokens;
    g->cached_tokens = ev->cached_tokens;
    if (g->tr.n_finished == 1 || (ev->ttft_ns && ev->ttft_ns < g->ttft_ns)) {
        g->queue_ns = ev->queue_ns;
        g->ttft_ns = ev->ttft_ns;
    }
    if (ev->total_ns > g->total_ns)
        g->total_ns = ev->total_ns;
    if (last)
        g->finished = 1;
    return last;
}

/* Engine thread. */
/* With an emission thread, pump runs there: c is queued (once) when
 * pump would send something. Returns 0 to pump here instead. */
static int post_pump(srv_call *c, gen_state *g)
{
    srv_emitter *e = c->srv->emitter;
    if (!e)
        return 0;
    if (g->emit_posted || g->in_flight || g->status_sent || g->gone)
        return 1; /* queued already, or nothing pump would send */
    if (!cinfer_emitter_post(e, c))
        return 0;
    g->emit_posted = 1;
    return 1;
}

void cinfer_generate_emit(srv_call *c)
{
    gen_state *g = c->rpc;
    pthread_mutex_lock(&c->mu);
    g->emit_posted = 0;
    pump(c, g);
    /* the client may have left between the FINISH and here */
    if (g->finished && g->gone && !g->status_sent)
        cinfer_call_count_ended(c);
    pthread_mutex_unlock(&c->mu);
}

static void on_event(void *user, const cinfer_engine_event *ev)
{
    srv_call *c = user;
    gen_state *g = c->rpc;
    int64_t now = cinfer_server_now_ns();
    int cancel = 0, finished = 0;
    pthread_mutex_lock(&c->mu);
    if (ev->kind == CINFER_EVENT_TOKENS) {
        cinfer_gen_track_tokens(c->srv, &g->tr, ev, now, &cancel);
        if (g->tr.shed == CINFER_REJECT_NONE && !g->gone && !g->oom &&
            !sink_append(g, ev))
            g->oom = 1;
    } else {
        finished = on_sample_finish(c, g, ev, now);
    }
    if (!post_pump(c, g))
        pump(c, g);
    /* A stream the client cancelled (or whose deadline gRPC enforced) ends
     * with no status of ours: counted here, once. */
    if (finished && g->gone && !g->status_sent)
        cinfer_call_count_ended(c);
    if (finished)
        log_done(c, g); /* reads the sink: under the lock */
    pthread_mutex_unlock(&c->mu);
    if (cancel) {
        cinfer_log(CINFER_LOG_INFO, "shed at first token; cancelling",
                   c->request_id);
        cinfer_engine_cancel(c->srv->engine, ev->request_id);
    }
    if (finished)
        cinfer_call_unref(c); /* the engine's hold */
}

/* ---------------------------------------------------------------------- */
/* Admission                                                              */
/* ---------------------------------------------------------------------- */

/* The call's deadline on the monotonic clock, or 0 when it has none (or
 * one too far away to matter). One already past is now + 1: the engine
 * stops it at once. */
static int64_t call_deadline_ns(const srv_call *c)
{
    gpr_timespec d = c->details.deadline;
    return cinfer_wire_deadline_ns(d, gpr_now(d.clock_type),
                                   cinfer_server_now_ns());
}

static void reject(srv_call *c, cinfer_status st)
{
    cinfer_call_send_status(c, OP_STEP, NULL, st, cinfer_last_error());
}

static void send_refusal(srv_call *c, const cinfer_refusal *r)
{
    cinfer_call_send_status_ex(c, OP_STEP, NULL, r->status, r->message,
                               r->has_pb ? &r->pb : NULL);
}

/* The client a per-client bucket is keyed by: the x-client-id metadata,
 * else the peer's address without its port (a client's connections share
 * a bucket). *peer is gpr_malloc'd when the peer was used (gpr_free it). */
static const char *client_key(srv_call *c, size_t *len, char **peer)
{
    *peer = NULL;
    for (size_t i = 0; i < c->request_md.count; i++) {
        const grpc_metadata *md = &c->request_md.metadata[i];
        if (GRPC_SLICE_LENGTH(md->key) == 11 &&
            memcmp(GRPC_SLICE_START_PTR(md->key), "x-client-id", 11) == 0 &&
            GRPC_SLICE_LENGTH(md->value) > 0) {
            *len = GRPC_SLICE_LENGTH(md->value);
            return (const char *)GRPC_SLICE_START_PTR(md->value);
        }
    }
    char *p = grpc_call_get_peer(c->call);
    if (!p)
        return NULL;
    *peer = p;
    size_t n = strlen(p);
    if (strncmp(p, "ipv4:", 5) == 0 || strncmp(p, "ipv6:", 5) == 0) {
        char *colon = strrchr(p, ':');
        if (colon && colon > p + 4)
            n = (size_t)(colon - p);
    }
    *len = n;
    return p;
}

/* Admission of a Generate call (admit.c decides). Returns 1 with the
 * ticket QUEUED, or 0 when the call was answered (refused). */
static int admit(srv_call *c, gen_state *g, int priority, int64_t tokens,
                 size_t n_prompt, int64_t deadline_ns, int64_t now)
{
    char *peer = NULL;
    cinfer_admit_in in = {
        .key_set = c->key_set,
        .key_index = c->key_index,
        .priority = priority,
        .tokens = tokens,
        .n_prompt = n_prompt,
        .deadline_ns = deadline_ns,
    };
    if (!c->key_set)
        in.client_id = client_key(c, &in.client_id_len, &peer);
    cinfer_refusal r;
    int ok = cinfer_server_admit(c->srv, &in, now, &g->tr.ticket, &r);
    if (peer)
        gpr_free(peer);
    if (!ok) {
        send_refusal(c, &r);
        return 0;
    }
    g->tr.admitted = 1;
    return 1;
}

/* Decodes the request message; 0 when the call was answered. */
static int decode(srv_call *c, grpc_byte_buffer *msg,
                  Cinfer__V1__GenerateRequest **out)
{
    if (!msg) {
        cinfer_call_set_request_id(c, NULL);
        cinfer_set_error(CINFER_E_INVALID_ARG,
                         "the request message is missing");
        reject(c, CINFER_E_INVALID_ARG);
        return 0;
    }
    uint8_t *buf;
    size_t len;
    cinfer_status rst = cinfer_call_read(c, msg, &buf, &len);
    grpc_byte_buffer_destroy(msg);
    if (rst != CINFER_OK) {
        cinfer_call_set_request_id(c, NULL);
        reject(c, rst);
        return 0;
    }
    cinfer_status ust =
        cinfer_wire_unpack(&cinfer__v1__generate_request__descriptor, buf,
                           len, (ProtobufCMessage **)out);
    free(buf);
    if (ust != CINFER_OK) {
        cinfer_call_set_request_id(c, NULL);
        reject(c, ust);
        return 0;
    }
    return 1;
}

/* Everything about the request the server checks before admission: the
 * fields, the API key's priority bound, the prompt, the grammar. */
static cinfer_status prepare(srv_call *c, const Cinfer__V1__GenerateRequest *r,
                             const cinfer_gen_desc *d, int32_t **prompt,
                             size_t *n_prompt, cinfer_grammar_entry **gram)
{
    cinfer_server *s = c->srv;
    const cinfer_request_fields *f = &cinfer_request_fields_grpc;
    cinfer_request_limits lim = limits_of(s);
    cinfer_status st = cinfer_validate_generate(r, &lim);
    if (st == CINFER_OK)
        st = cinfer_request_validate(d, &lim, f);
    if (st != CINFER_OK)
        return st;
    if (c->key_set) {
        const cinfer_api_key *k =
            cinfer_api_keys_get(c->key_set, c->key_index);
        if (k && k->has_max_priority && d->priority > k->max_priority)
            return cinfer_set_error(CINFER_E_PERMISSION,
                                    "priority %d is above the maximum of API "
                                    "key %s (%d)",
                                    (int)d->priority, k->name,
                                    (int)k->max_priority);
    }
    st = cinfer_request_encode(s->tk, &s->chat, d, prompt, n_prompt);
    if (st == CINFER_OK)
        st = cinfer_request_check_prompt(d, *n_prompt, &lim, f);
    if (st == CINFER_OK)
        st = cinfer_request_compile_grammar(d, f, s->grammars, gram);
    return st;
}

/* Puts the call on the server's list of Generate calls, unless the server
 * no longer serves (then it is answered: 0). */
static int list_call(srv_call *c, gen_state *g)
{
    cinfer_server *s = c->srv;
    /* Listing races with drain: decide under the server lock. */
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->state) != SERVER_SERVING) {
        pthread_mutex_unlock(&s->mu);
        cinfer_gen_track_drop(s, &g->tr);
        cinfer_pushback pb = {.reason = CINFER_REJECT_DRAINING,
                              .retry_after_ms = 0};
        cinfer_call_send_status_ex(c, OP_STEP, NULL, CINFER_E_UNAVAILABLE,
                                   "the server is shutting down", &pb);
        return 0;
    }
    c->listed = 1;
    c->prev = NULL;
    c->next = s->generate_list;
    if (s->generate_list)
        s->generate_list->prev = c;
    s->generate_list = c;
    s->generate_open++;
    pthread_mutex_unlock(&s->mu);
    return 1;
}

static void log_start(srv_call *c, const cinfer_request_params *rp,
                      int64_t hard_dl, int64_t now)
{
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "generate start",
                         c->request_id)) {
        cinfer_log_str(&l, "frontend", "grpc");
        cinfer_log_int(&l, "prompt_tokens",
                       (int64_t)(rp->n_prompt + rp->n_prompt_embeds));
        cinfer_log_int(&l, "max_tokens", rp->max_tokens);
        if (rp->n_samples > 1)
            cinfer_log_int(&l, "n", rp->n_samples);
        cinfer_log_double(&l, "temperature", rp->sampling.temperature);
        if (hard_dl)
            cinfer_log_double(&l, "deadline_ms",
                              (double)(hard_dl - now) * 1e-6);
        cinfer_log_end(&l);
    }
}

static void generate_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_server *s = c->srv;
    Cinfer__V1__GenerateRequest *r = NULL;
    if (!decode(c, msg, &r))
        return;
    /* A valid id is echoed; an invalid one is replaced. */
    cinfer_call_set_request_id(
        c, cinfer_request_id_ok(r->request_id) ? r->request_id : NULL);
    cinfer_gen_desc d;
    cinfer_gen_desc_from_proto(r, &d);
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    cinfer_grammar_entry *gram = NULL;
    cinfer_status st = prepare(c, r, &d, &prompt, &n_prompt, &gram);
    gen_state *g = NULL;
    if (st != CINFER_OK)
        goto fail;

    cinfer_request_limits lim = limits_of(s);
    cinfer_request_params rp;
    cinfer_request_to_engine(&d, &lim, prompt, n_prompt,
                             cinfer_server_random_seed(),
                             gram ? cinfer_grammar_entry_grammar(gram) : NULL,
                             &rp);
    g = calloc(1, sizeof *g);
    if (g)
        g->samples = calloc((size_t)rp.n_samples, sizeof *g->samples);
    if (!g || !g->samples) {
        if (g)
            free(g);
        g = NULL;
        st = cinfer_set_error(CINFER_E_NOMEM, "no memory");
        goto fail;
    }
    g->n_samples = rp.n_samples;
    g->grammar = gram;
    gram = NULL;
    /* prompt positions: embedding rows count as prompt tokens */
    n_prompt += rp.n_prompt_embeds;
    g->n_prompt = (int32_t)n_prompt;
    g->want_logprobs = d.has_logprobs;
    g->n_top = d.has_logprobs ? d.logprobs : 0;
    cinfer_gen_track_init(&g->tr, CINFER_FRONTEND_GRPC, c->start_ns,
                          rp.n_samples);

    int64_t now = cinfer_server_now_ns();
    g->call_deadline_ns = call_deadline_ns(c);
    cinfer_request_deadline dl = cinfer_request_deadline_of(
        c->start_ns, g->call_deadline_ns, s->params.max_request_time_ms,
        d.time_limit_ms);
    rp.deadline_ns = dl.engine_ns;
    g->tr.deadline_is_hard = dl.is_hard;
    rp.on_event = on_event;
    rp.user = c;
    /* A request thread runs this: the close may come meanwhile on the
     * call's completion-queue thread, which reads c->rpc under c->mu. */
    pthread_mutex_lock(&c->mu);
    c->rpc = g;
    if (c->closed && c->close_cancelled)
        g->gone = 1;
    int gone_early = g->gone;
    pthread_mutex_unlock(&c->mu);
    if (gone_early) {
        /* The client left while its request was read: counted as such,
         * no engine work. */
        cinfer_call_count_ended(c);
        goto out;
    }

    if (s->adm) {
        int64_t total =
            (int64_t)n_prompt + (int64_t)rp.max_tokens * rp.n_samples;
        if (!admit(c, g, d.priority, total, n_prompt, dl.hard_ns, now))
            goto out; /* answered */
    }
    if (!list_call(c, g))
        goto out; /* answered */

    c->state = CALL_STREAMING;
    cinfer_call_ref(c); /* the engine's hold, until the last FINISH */
    uint64_t id = 0;
    cinfer_refusal ref;
    cinfer_rcache_entry *hit = NULL;
    st = cinfer_server_submit(s, &d, &rp, &id, &hit, &ref);
    if (st != CINFER_OK) {
        cinfer_call_unref(c); /* never the last: this handler holds one */
        c->state = CALL_RECEIVING;
        pthread_mutex_lock(&c->mu);
        cinfer_gen_track_drop(s, &g->tr);
        pthread_mutex_unlock(&c->mu);
        send_refusal(c, &ref);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    g->engine_id = id;
    g->submitted = 1;
    g->tr.cached = hit != NULL;
    /* The watchdog may have shed it between listing and now, or the
     * client may have left (generate_on_close saw it unsubmitted). */
    int shed_early = (g->tr.shed != CINFER_REJECT_NONE || g->gone) &&
                     !g->finished;
    pthread_mutex_unlock(&c->mu);
    if (hit)
        cinfer_server_replay(s, hit, &rp); /* the engine's part, here */
    else if (shed_early)
        cinfer_engine_cancel(s->engine, id);
    log_start(c, &rp, dl.hard_ns, now);
out:
    free(prompt);
    cinfer__v1__generate_request__free_unpacked(r, NULL);
    return;

fail:
    free(prompt);
    cinfer_grammar_entry_release(gram);
    cinfer__v1__generate_request__free_unpacked(r, NULL);
    reject(c, st);
}

/* ---------------------------------------------------------------------- */
/* Send completions, close, shutdown                                      */
/* ---------------------------------------------------------------------- */

static void generate_on_send(srv_call *c, int ok)
{
    gen_state *g = c->rpc;
    pthread_mutex_lock(&c->mu);
    if (c->send_buf) {
        grpc_byte_buffer_destroy(c->send_buf);
        c->send_buf = NULL;
    }
    g->in_flight = 0;
    if (!ok)
        g->gone = 1;
    else
        pump(c, g);
    pthread_mutex_unlock(&c->mu);
}

static void generate_on_close(srv_call *c)
{
    int64_t now = cinfer_server_now_ns();
    pthread_mutex_lock(&c->mu);
    gen_state *g = c->rpc;
    if (!g) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    int cancel = 0;
    uint64_t id = g->engine_id;
    if (c->close_cancelled) {
        g->gone = 1;
        /* A client resets its call at the deadline: cancelled=1 too. */
        g->tr.deadline_passed =
            g->call_deadline_ns &&
            now + DEADLINE_SLACK_NS >= g->call_deadline_ns;
        cancel = g->submitted && !g->finished;
    }
    pthread_mutex_unlock(&c->mu);
    if (cancel) {
        cinfer_log(CINFER_LOG_INFO,
                   g->tr.deadline_passed ? "deadline passed; cancelling"
                                      : "client gone; cancelling",
                   c->request_id);
        cinfer_engine_cancel(c->srv->engine, id);
    }
}

static void generate_free(srv_call *c)
{
    gen_state *g = c->rpc;
    if (!g)
        return;
    for (int k = 0; k < g->n_samples; k++) {
        free(g->samples[k].ids);
        free(g->samples[k].text);
        free(g->samples[k].lp);
        free(g->samples[k].top);
    }
    free(g->samples);
    cinfer_grammar_entry_release(g->grammar);
    free(g);
    c->rpc = NULL;
}

void cinfer_generate_abort_all(cinfer_server *s)
{
    /* Collect ids under the locks, cancel outside them (the engine thread
     * may be freeing calls, which takes s->mu). */
    size_t n = 0, cap = 0;
    uint64_t *ids = NULL;
    pthread_mutex_lock(&s->mu);
    for (srv_call *c = s->generate_list; c; c = c->next)
        cap++;
    ids = cap ? malloc(cap * sizeof *ids) : NULL;
    for (srv_call *c = s->generate_list; c && ids; c = c->next) {
        gen_state *g = c->rpc;
        pthread_mutex_lock(&c->mu);
        if (g && g->submitted && !g->finished) {
            g->tr.aborted = 1;
            ids[n++] = g->engine_id;
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        cinfer_engine_cancel(s->engine, ids[i]);
    if (n) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_WARN, "cancelled running streams",
                             NULL)) {
            cinfer_log_int(&l, "streams", (int64_t)n);
            cinfer_log_end(&l);
        }
    }
    free(ids);
}

void cinfer_generate_check_queued(cinfer_server *s, int64_t now_ns)
{
    if (!s->adm)
        return;
    /* Decide under the locks, cancel outside them (as abort_all). */
    uint64_t small[64];
    uint64_t *ids = small;
    size_t n = 0, cap = 64;
    pthread_mutex_lock(&s->mu);
    for (srv_call *c = s->generate_list; c; c = c->next) {
        if (n == cap) {
            /* Room for one more id first; without memory the rest wait
             * for the next round. */
            uint64_t *more = malloc(2 * cap * sizeof *more);
            if (!more)
                break;
            memcpy(more, ids, n * sizeof *ids);
            if (ids != small)
                free(ids);
            ids = more;
            cap *= 2;
        }
        gen_state *g = c->rpc;
        pthread_mutex_lock(&c->mu);
        if (g && g->tr.admitted && g->tr.shed == CINFER_REJECT_NONE &&
            !g->tr.started && !g->finished) {
            cinfer_admission_decision d =
                cinfer_admission_check_queued(s->adm, &g->tr.ticket, now_ns);
            if (d.reason != CINFER_REJECT_NONE) {
                g->tr.shed = d.reason;
                g->tr.shed_retry_ms = d.retry_after_ms;
                /* Not yet submitted: the submitter cancels it. */
                if (g->submitted)
                    ids[n++] = g->engine_id;
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < n; i++)
        cinfer_engine_cancel(s->engine, ids[i]);
    if (ids != small)
        free(ids);
}

const rpc_method cinfer_rpc_generate = {
    .path = "/cinfer.v1.Inference/Generate",
    .kind = RPC_GENERATE,
    .needs_model = 1,
    .off_cq = 1,
    .on_message = generate_on_message,
    .on_send = generate_on_send,
    .on_close = generate_on_close,
    .free_rpc = generate_free,
};
