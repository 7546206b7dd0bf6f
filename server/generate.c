/*
 * generate.c - cinfer.v1.Inference/Generate: the streaming call and its
 * sink.
 *
 * On a request thread (pool.c): decode, validate, tokenize (text, ids, or
 * chat through the template), submit to the engine. From then on the
 * engine thread drives the stream through on_event:
 *
 *   sink (under c->mu): pending {token ids, text, logprobs}, in_flight,
 *                       finished, status_sent, gone
 *
 *   engine TOKENS  -> append to pending; pump
 *   engine FINISH  -> record the final numbers; pump; drop the engine's
 *                     reference
 *   send completed -> in_flight = 0; pump (worker thread)
 *   pump           -> if nothing is in flight: send all pending as one
 *                     Chunk, or, when finished and nothing is pending, the
 *                     Final message and the status in one batch
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
#include <sys/random.h>

#include "server/log.h"
#include "server/server_impl.h"
#include "server/status_map.h"
#include "server/wire.h"

/* Pushback when the engine's own waiting queue is full. */
#define ENGINE_FULL_PUSHBACK_MS 1000

/* gRPC may notice a deadline this much before our clock reads it. */
#define DEADLINE_SLACK_NS 5000000

/* Pushback for the engine's refusal for load on this thread: its own
 * estimate of when a request like it would be taken (at least 1 ms, at
 * most the queue-full pushback). */
static int64_t engine_retry_ms(void)
{
    int64_t ms = (cinfer_engine_refusal_retry_ns() + 999999) / 1000000;
    if (ms < 1)
        ms = 1;
    return ms < ENGINE_FULL_PUSHBACK_MS ? ms : ENGINE_FULL_PUSHBACK_MS;
}

typedef struct {
    /* Fixed at admission. */
    int want_logprobs;     /* request asked for logprobs */
    int n_top;             /* alternatives per token */
    int deadline_is_hard;  /* the engine deadline is the call's deadline
                              or max_request_time, not time_limit_ms */
    int64_t call_deadline_ns; /* the call's own deadline; 0 = none */
    int32_t n_prompt;

    /* Sink, under c->mu. */
    uint64_t engine_id;
    int submitted;         /* engine_id is valid */
    int32_t *ids;
    size_t n_ids, cap_ids;
    char *text;            /* NUL-terminated */
    size_t n_text, cap_text;
    float *lp;             /* [n_ids] when want_logprobs */
    cinfer_token_logprob *top; /* [n_ids * n_top] */
    int in_flight;
    int finished;          /* FINISH seen */
    int status_sent;
    int gone;              /* client went away or a send failed */
    int aborted;           /* cancelled by server shutdown */
    int oom;               /* a token could not be buffered */
    cinfer_admission_ticket ticket; /* valid when the server admits calls */
    int started;           /* the first token came (ticket dequeued) */
    int64_t last_token_ns; /* arrival of the latest token */
    cinfer_reject shed;    /* shed after admission: the call ends with
                              this reason's status and pushback */
    int64_t shed_retry_ms;
    int deadline_passed;   /* gRPC ended the call at its deadline */
    cinfer_finish_reason finish;
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

/* The pending tokens as one GenerateResponse{chunk}; clears pending. NULL
 * when out of memory (pending is kept). */
static grpc_byte_buffer *pack_chunk(srv_call *c, gen_state *g)
{
    Cinfer__V1__GenerateResponse resp = CINFER__V1__GENERATE_RESPONSE__INIT;
    Cinfer__V1__Chunk chunk = CINFER__V1__CHUNK__INIT;
    Cinfer__V1__TokenLogprob *tl = NULL, **tlp = NULL;
    Cinfer__V1__TopLogprob *tops = NULL, **topp = NULL;
    grpc_byte_buffer *bb = NULL;

    resp.request_id = c->request_id;
    resp.kind_case = CINFER__V1__GENERATE_RESPONSE__KIND_CHUNK;
    resp.chunk = &chunk;
    chunk.n_token_ids = g->n_ids;
    chunk.token_ids = g->ids;
    chunk.text = g->text ? g->text : "";
    if (g->want_logprobs && g->n_ids) {
        size_t nt = g->n_ids * (size_t)g->n_top;
        tl = calloc(g->n_ids, sizeof *tl);
        tlp = calloc(g->n_ids, sizeof *tlp);
        tops = calloc(nt ? nt : 1, sizeof *tops);
        topp = calloc(nt ? nt : 1, sizeof *topp);
        if (!tl || !tlp || !tops || !topp)
            goto out;
        for (size_t i = 0; i < g->n_ids; i++) {
            cinfer__v1__token_logprob__init(&tl[i]);
            tl[i].token_id = g->ids[i];
            tl[i].logprob = g->lp[i];
            tl[i].n_top = (size_t)g->n_top;
            tl[i].top = topp + i * (size_t)g->n_top;
            for (int k = 0; k < g->n_top; k++) {
                size_t j = i * (size_t)g->n_top + (size_t)k;
                cinfer__v1__top_logprob__init(&tops[j]);
                tops[j].token_id = g->top[j].id;
                tops[j].logprob = g->top[j].logprob;
                topp[j] = &tops[j];
            }
            tlp[i] = &tl[i];
        }
        chunk.n_logprobs = g->n_ids;
        chunk.logprobs = tlp;
    }
    bb = cinfer_bb_pack(&resp.base);
    if (bb) {
        g->n_ids = 0;
        g->n_text = 0;
        if (g->text)
            g->text[0] = '\0';
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
    resp.request_id = c->request_id;
    resp.kind_case = CINFER__V1__GENERATE_RESPONSE__KIND_FINAL;
    resp.final = &fin;
    fin.finish_reason = finish_to_proto(g->finish);
    fin.usage = &usage;
    fin.timings = &tm;
    usage.prompt_tokens = g->prompt_tokens;
    usage.completion_tokens = g->completion_tokens;
    usage.cached_tokens = g->cached_tokens;
    tm.queue_ms = (double)g->queue_ns * 1e-6;
    tm.time_to_first_token_ms = (double)g->ttft_ns * 1e-6;
    tm.total_ms = (double)g->total_ns * 1e-6;
    return cinfer_bb_pack(&resp.base);
}

/* ---------------------------------------------------------------------- */
/* Sink                                                                   */
/* ---------------------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t n = *cap ? *cap : 16;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = n;
    return 1;
}

/* Appends one TOKENS event. Returns 0 when out of memory. */
static int sink_append(gen_state *g, const cinfer_engine_event *ev)
{
    size_t n = g->n_ids + ev->n_ids;
    size_t cap_ids = g->cap_ids;
    if (!grow((void **)&g->ids, &g->cap_ids, n, sizeof *g->ids))
        return 0;
    if (g->want_logprobs) {
        /* lp and top follow ids' capacity. */
        size_t c1 = cap_ids, c2 = cap_ids;
        if (!grow((void **)&g->lp, &c1, g->cap_ids, sizeof *g->lp))
            return 0;
        if (g->n_top > 0 &&
            !grow((void **)&g->top, &c2, g->cap_ids * (size_t)g->n_top,
                  sizeof *g->top))
            return 0;
    }
    size_t nt = g->n_text + ev->text_len + 1;
    if (!grow((void **)&g->text, &g->cap_text, nt, 1))
        return 0;
    for (size_t i = 0; i < ev->n_ids; i++) {
        size_t j = g->n_ids + i;
        g->ids[j] = ev->ids[i];
        if (g->want_logprobs) {
            g->lp[j] = ev->logprobs ? ev->logprobs[i] : NAN;
            for (int k = 0; k < g->n_top; k++) {
                cinfer_token_logprob t = {-1, NAN};
                if (ev->top && k < ev->n_top)
                    t = ev->top[i * (size_t)ev->n_top + (size_t)k];
                g->top[j * (size_t)g->n_top + (size_t)k] = t;
            }
        }
    }
    g->n_ids = n;
    if (ev->text_len)
        memcpy(g->text + g->n_text, ev->text, ev->text_len);
    g->n_text += ev->text_len;
    g->text[g->n_text] = '\0';
    return 1;
}

/* The status message of a rejection. client: the client id of a client
 * rate limit, else NULL. */
static void reject_message(cinfer_reject r, int64_t retry_ms,
                           const char *client, char *buf, size_t n)
{
    const char *what = "overloaded";
    switch (r) {
    case CINFER_REJECT_RATE_LIMITED_GLOBAL:
        what = "rate limited: the server's request rate limit is exceeded";
        break;
    case CINFER_REJECT_RATE_LIMITED_CLIENT:
        snprintf(buf, n,
                 "rate limited: client %.128s exceeds its request rate "
                 "limit; retry in %lld ms",
                 client ? client : "?", (long long)retry_ms);
        return;
    case CINFER_REJECT_BREAKER_OPEN:
        what = "the server is failing: circuit breaker open";
        break;
    case CINFER_REJECT_SHED_QUEUE_FULL:
        what = "overloaded: the request queue is full";
        break;
    case CINFER_REJECT_SHED_TOKENS:
        what = "overloaded: the queued tokens exceed the limit";
        break;
    case CINFER_REJECT_SHED_DEADLINE:
        what = "deadline exceeded: the request can not start before its "
               "deadline";
        break;
    case CINFER_REJECT_SHED_CODEL:
        what = "overloaded: requests wait longer than the queue target";
        break;
    case CINFER_REJECT_SHED_KV_PRESSURE:
        what = "overloaded: the KV cache is full";
        break;
    case CINFER_REJECT_SHED_FIRST_TOKEN:
        what = "overloaded: the first token would come too late";
        break;
    case CINFER_REJECT_DRAINING:
        what = "the server is shutting down";
        break;
    default:
        break;
    }
    snprintf(buf, n, "%s; retry in %lld ms", what, (long long)retry_ms);
}

/* The breaker's view of how a request ended. */
static cinfer_outcome classify(const gen_state *g,
                               const cinfer_engine_event *ev)
{
    switch (ev->finish) {
    case CINFER_FINISH_ERROR:
        /* A validated request the engine fails is a server fault, its
         * reason what it may (pump sends it as INTERNAL). */
        return CINFER_OUTCOME_FAILURE;
    case CINFER_FINISH_TIME_LIMIT:
        return g->deadline_is_hard ? CINFER_OUTCOME_FAILURE
                                   : CINFER_OUTCOME_SUCCESS;
    case CINFER_FINISH_CANCELLED:
        /* A client's cancel or the server's shutdown count for nothing; a
         * deadline that gRPC enforced is the server's slowness. */
        return g->deadline_passed && !g->aborted ? CINFER_OUTCOME_FAILURE
                                                 : CINFER_OUTCOME_IGNORED;
    default:
        return CINFER_OUTCOME_SUCCESS;
    }
}

/* Starts the next send if none is in flight. c->mu held. */
static void pump(srv_call *c, gen_state *g)
{
    if (g->in_flight || g->status_sent || g->gone)
        return;
    if (g->n_ids > 0 || g->n_text > 0) {
        grpc_byte_buffer *bb = pack_chunk(c, g);
        if (!bb) {
            g->oom = 1;
        } else {
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
    cinfer_pushback pb = {.reason = g->shed,
                          .retry_after_ms = g->shed_retry_ms};
    if (g->oom) {
        st = CINFER_E_NOMEM;
        detail = "out of memory buffering the output";
    } else if (g->shed != CINFER_REJECT_NONE) {
        st = cinfer_reject_status(g->shed);
        reject_message(g->shed, pb.retry_after_ms, NULL, msg, sizeof msg);
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
        st = g->aborted           ? CINFER_E_UNAVAILABLE
             : g->deadline_passed ? CINFER_E_TIMEOUT
                                  : CINFER_E_CANCELLED;
        detail = g->aborted ? "the server shut down before the request "
                              "finished"
                 : g->deadline_passed ? "deadline exceeded"
                                      : "the request was cancelled";
    } else if (g->finish == CINFER_FINISH_TIME_LIMIT && g->deadline_is_hard) {
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
                                    g->shed != CINFER_REJECT_NONE ? &pb
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
    cinfer_log_str(&l, "finish", cinfer_finish_reason_name(g->finish));
    cinfer_log_int(&l, "prompt_tokens", g->prompt_tokens);
    cinfer_log_int(&l, "completion_tokens", g->completion_tokens);
    cinfer_log_int(&l, "cached_tokens", g->cached_tokens);
    cinfer_log_double(&l, "queue_ms", (double)g->queue_ns * 1e-6);
    cinfer_log_double(&l, "ttft_ms", (double)g->ttft_ns * 1e-6);
    cinfer_log_double(&l, "total_ms", (double)g->total_ns * 1e-6);
    cinfer_log_int(&l, "chunks", g->chunks_sent);
    if (g->shed != CINFER_REJECT_NONE)
        cinfer_log_str(&l, "shed", cinfer_reject_name(g->shed));
    if (g->gone)
        cinfer_log_str(&l, "client", "gone");
    if (g->finish == CINFER_FINISH_ERROR)
        cinfer_log_str(&l, "error", g->fin_message);
    if (cinfer_call_key_name(c))
        cinfer_log_str(&l, "api_key", cinfer_call_key_name(c));
    cinfer_trace_log(&l, &c->trace);
    cinfer_log_end(&l);
}

/* A TOKENS event's timing: the first token leaves the shedder's queue
 * (which may shed it: then *cancel is set and its tokens are dropped) and
 * is the TTFT; later ones give the inter-token latency. c->mu held. */
static void on_tokens_timing(srv_call *c, gen_state *g,
                             const cinfer_engine_event *ev, int64_t now,
                             int *cancel)
{
    cinfer_server *s = c->srv;
    if (ev->n_ids == 0 || g->shed != CINFER_REJECT_NONE)
        return;
    if (!g->started) {
        g->started = 1;
        if (s->adm) {
            cinfer_admission_decision d =
                cinfer_admission_dequeue(s->adm, &g->ticket, now,
                                         ev->queue_ns);
            if (d.reason != CINFER_REJECT_NONE) {
                g->shed = d.reason;
                g->shed_retry_ms = d.retry_after_ms;
                *cancel = 1;
                return;
            }
        }
        cinfer_metrics_observe(s->metrics, CINFER_HIST_TTFT,
                               (double)(now - c->start_ns) * 1e-9);
    } else {
        double gap = (double)(now - g->last_token_ns) * 1e-9 /
                     (double)ev->n_ids;
        for (size_t i = 0; i < ev->n_ids; i++)
            cinfer_metrics_observe(s->metrics, CINFER_HIST_ITL, gap);
        if (ev->n_ids == 1)
            cinfer_service_time_record(s, 1, now - g->last_token_ns);
        /* the stream time admission counts against deadlines */
        if (s->adm)
            cinfer_admission_observe_token_time(
                s->adm, (now - g->last_token_ns) / (int64_t)ev->n_ids);
    }
    g->last_token_ns = now;
}

/* A FINISH event's accounting: the breaker outcome, the metrics, the
 * device-fault run health watches, the service-time bound. c->mu held. */
static void on_finish_accounting(srv_call *c, gen_state *g,
                                 const cinfer_engine_event *ev, int64_t now)
{
    cinfer_server *s = c->srv;
    if (s->adm)
        cinfer_admission_finish(s->adm, &g->ticket, classify(g, ev), now);
    if (g->shed == CINFER_REJECT_NONE) {
        cinfer_metrics_observe(s->metrics, CINFER_HIST_E2E,
                               (double)(now - c->start_ns) * 1e-9);
        if (g->started)
            cinfer_metrics_observe(s->metrics, CINFER_HIST_QUEUE,
                                   (double)ev->queue_ns * 1e-9);
    }
    cinfer_metrics_add_tokens(s->metrics,
                              (uint64_t)(ev->prompt_tokens > 0
                                             ? ev->prompt_tokens
                                             : 0),
                              (uint64_t)(ev->completion_tokens > 0
                                             ? ev->completion_tokens
                                             : 0));
    int fault = ev->finish == CINFER_FINISH_ERROR &&
                ev->status == CINFER_E_DEVICE;
    int ok = ev->completion_tokens > 0 && ev->finish != CINFER_FINISH_ERROR;
    cinfer_watchdog_note_outcome(s, fault, ok);
    if (ok && ev->ttft_ns > ev->queue_ns) {
        int64_t uncached = (int64_t)ev->prompt_tokens - ev->cached_tokens;
        cinfer_service_time_record(s, uncached > 0 ? uncached : 1,
                                   ev->ttft_ns - ev->queue_ns);
    }
}

/* Engine thread. */
static void on_event(void *user, const cinfer_engine_event *ev)
{
    srv_call *c = user;
    gen_state *g = c->rpc;
    int64_t now = cinfer_server_now_ns();
    int cancel = 0;
    pthread_mutex_lock(&c->mu);
    if (ev->kind == CINFER_EVENT_TOKENS) {
        on_tokens_timing(c, g, ev, now, &cancel);
        if (g->shed == CINFER_REJECT_NONE && !g->gone && !g->oom &&
            !sink_append(g, ev))
            g->oom = 1;
    } else {
        on_finish_accounting(c, g, ev, now);
        g->finished = 1;
        g->finish = ev->finish;
        g->fin_status = ev->status;
        snprintf(g->fin_message, sizeof g->fin_message, "%s",
                 ev->message ? ev->message : "");
        g->prompt_tokens = ev->prompt_tokens;
        g->completion_tokens = ev->completion_tokens;
        g->cached_tokens = ev->cached_tokens;
        g->queue_ns = ev->queue_ns;
        g->ttft_ns = ev->ttft_ns;
        g->total_ns = ev->total_ns;
    }
    pump(c, g);
    int finished = ev->kind == CINFER_EVENT_FINISH;
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

/* Tokenizes text with the defaults cinfer-run uses: the vocabulary's own
 * BOS/EOS rule and special-token parsing. */
static cinfer_status encode_text(const cinfer_tokenizer *tk, const char *text,
                                 int add_special, int32_t **ids, size_t *n)
{
    size_t len = strlen(text);
    size_t cap = len + 4;
    int32_t *buf = malloc(cap * sizeof *buf);
    if (!buf)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenize: no memory");
    size_t got = 0;
    cinfer_status st =
        cinfer_tokenizer_encode(tk, text, len, add_special, 1, buf, cap, &got);
    if (st == CINFER_E_RANGE && got > cap) {
        int32_t *b2 = realloc(buf, got * sizeof *buf);
        if (!b2) {
            free(buf);
            return cinfer_set_error(CINFER_E_NOMEM, "tokenize: no memory");
        }
        buf = b2;
        cap = got;
        st = cinfer_tokenizer_encode(tk, text, len, add_special, 1, buf, cap,
                                     &got);
    }
    if (st != CINFER_OK) {
        free(buf);
        return st;
    }
    *ids = buf;
    *n = got;
    return CINFER_OK;
}

cinfer_status cinfer_server_encode_input(const cinfer_server *s,
                                         int input_case, const char *text,
                                         const Cinfer__V1__Chat *chat,
                                         int add_special, int32_t **ids,
                                         size_t *n)
{
    if (input_case == 0)
        return encode_text(s->tk, text, add_special, ids, n);
    return cinfer_chat_encode(&s->chat, s->tk, chat, ids, n);
}

static uint64_t random_seed(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = (uint64_t)cinfer_server_now_ns() * 0x9E3779B97F4A7C15ull;
    return v;
}

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

/* Admission of a Generate call: the idle service-time bound against the
 * deadline, then the token buckets, the breaker and the shedder. Returns 1
 * with g->ticket QUEUED, or 0 when the call was answered (refused). */
static int admit(srv_call *c, gen_state *g, int priority, int64_t tokens,
                 size_t n_prompt, int64_t deadline_ns, int64_t now)
{
    cinfer_server *s = c->srv;
    char msg[320];

    /* A deadline shorter than the fastest this server ever served such a
     * request to its first token can not be met even idle. */
    if (deadline_ns) {
        int64_t min_ns = cinfer_service_time_min(
            s, s->params.prefix_cache ? 1 : (int64_t)n_prompt);
        if (min_ns > 0 && cinfer_ns_add_sat(now, min_ns) > deadline_ns) {
            snprintf(msg, sizeof msg,
                     "the deadline cannot be met: %.1f ms left, the first "
                     "token takes at least %.1f ms on an idle server",
                     (double)(deadline_ns - now) * 1e-6,
                     (double)min_ns * 1e-6);
            cinfer_pushback pb = {.reason = CINFER_REJECT_SHED_DEADLINE,
                                  .retry_after_ms = 0};
            cinfer_call_send_status_ex(c, OP_STEP, NULL, CINFER_E_TIMEOUT,
                                       msg, &pb);
            return 0;
        }
    }

    char *peer = NULL;
    size_t id_len = 0;
    const char *id = NULL;
    if (c->key_set) {
        /* With API keys, the key's own bucket replaces the per-client
         * ones. */
        int64_t retry_ms;
        if (!cinfer_api_keys_take(c->key_set, c->key_index, now,
                                  &retry_ms)) {
            const char *name = cinfer_call_key_name(c);
            char subject[96];
            snprintf(subject, sizeof subject, "api_key:%s", name);
            snprintf(msg, sizeof msg,
                     "rate limited: API key %s exceeds its request rate; "
                     "retry in %lld ms",
                     name, (long long)retry_ms);
            cinfer_pushback pb = {
                .reason = CINFER_REJECT_RATE_LIMITED_CLIENT,
                .retry_after_ms = retry_ms,
                .quota_subject = subject,
                .quota_desc = "the API key's request rate (qps= in the "
                              "--api-keys file)",
            };
            cinfer_call_send_status_ex(c, OP_STEP, NULL, CINFER_E_EXHAUSTED,
                                       msg, &pb);
            return 0;
        }
    } else {
        id = client_key(c, &id_len, &peer);
    }
    cinfer_admission_request rq = {
        .client_id = id,
        .client_id_len = id_len,
        .cost = s->params.rate_limit_tokens ? (uint64_t)tokens : 1,
        .tokens = (uint64_t)tokens,
        .priority = priority,
        .deadline_ns = deadline_ns,
        .gen_tokens = tokens > (int64_t)n_prompt
                          ? (uint64_t)(tokens - (int64_t)n_prompt)
                          : 0,
    };
    cinfer_admission_decision d;
    cinfer_status st = cinfer_admission_admit(s->adm, &rq, now, &d,
                                              &g->ticket);
    if (st != CINFER_OK) {
        if (peer)
            gpr_free(peer);
        cinfer_call_send_status(c, OP_STEP, NULL, st, cinfer_last_error());
        return 0;
    }
    if (d.reason == CINFER_REJECT_NONE) {
        if (peer)
            gpr_free(peer);
        return 1;
    }
    char subject[160];
    cinfer_pushback pb = {.reason = d.reason,
                          .retry_after_ms = d.retry_after_ms};
    char client[132];
    snprintf(client, sizeof client, "%.*s", (int)(id_len > 128 ? 128 : id_len),
             id ? id : "");
    if (d.reason == CINFER_REJECT_RATE_LIMITED_GLOBAL) {
        pb.quota_subject = "server";
        pb.quota_desc = "the server's request rate limit (--rate-limit-qps)";
    } else if (d.reason == CINFER_REJECT_RATE_LIMITED_CLIENT) {
        snprintf(subject, sizeof subject, "client:%s", client);
        pb.quota_subject = subject;
        pb.quota_desc = "the client's request rate limit "
                        "(--client-rate-limit-qps)";
    }
    reject_message(d.reason, d.retry_after_ms, client, msg, sizeof msg);
    if (peer)
        gpr_free(peer);
    cinfer_call_send_status_ex(c, OP_STEP, NULL, cinfer_reject_status(d.reason),
                               msg, &pb);
    return 0;
}

static void generate_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_server *s = c->srv;
    if (!msg) {
        cinfer_call_set_request_id(c, NULL);
        cinfer_set_error(CINFER_E_INVALID_ARG,
                         "the request message is missing");
        reject(c, CINFER_E_INVALID_ARG);
        return;
    }
    uint8_t *buf;
    size_t len;
    cinfer_status rst = cinfer_call_read(c, msg, &buf, &len);
    grpc_byte_buffer_destroy(msg);
    if (rst != CINFER_OK) {
        cinfer_call_set_request_id(c, NULL);
        reject(c, rst);
        return;
    }
    Cinfer__V1__GenerateRequest *r = NULL;
    cinfer_status ust =
        cinfer_wire_unpack(&cinfer__v1__generate_request__descriptor, buf,
                           len, (ProtobufCMessage **)&r);
    free(buf);
    if (ust != CINFER_OK) {
        cinfer_call_set_request_id(c, NULL);
        reject(c, ust);
        return;
    }
    cinfer_request_limits lim = limits_of(s);
    cinfer_status st = cinfer_validate_generate(r, &lim);
    /* A valid id is echoed; an invalid one is replaced. */
    cinfer_call_set_request_id(
        c, cinfer_request_id_ok(r->request_id) ? r->request_id : NULL);
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    gen_state *g = NULL;
    if (st != CINFER_OK)
        goto fail;
    if (c->key_set) {
        const cinfer_api_key *k =
            cinfer_api_keys_get(c->key_set, c->key_index);
        if (k && k->has_max_priority && r->priority > k->max_priority) {
            st = cinfer_set_error(CINFER_E_PERMISSION,
                                  "priority %d is above the maximum of API "
                                  "key %s (%d)",
                                  (int)r->priority, k->name,
                                  (int)k->max_priority);
            goto fail;
        }
    }

    switch (r->input_case) {
    case CINFER__V1__GENERATE_REQUEST__INPUT_TEXT:
        st = cinfer_server_encode_input(s, 0, r->text, NULL, 1, &prompt,
                                        &n_prompt);
        break;
    case CINFER__V1__GENERATE_REQUEST__INPUT_CHAT:
        st = cinfer_server_encode_input(s, 1, NULL, r->chat, 1, &prompt,
                                        &n_prompt);
        break;
    default:
        prompt = malloc(r->token_ids->n_ids * sizeof *prompt);
        if (!prompt) {
            st = cinfer_set_error(CINFER_E_NOMEM, "no memory");
            break;
        }
        memcpy(prompt, r->token_ids->ids, r->token_ids->n_ids * sizeof *prompt);
        n_prompt = r->token_ids->n_ids;
        break;
    }
    if (st != CINFER_OK)
        goto fail;
    if (n_prompt == 0) {
        st = cinfer_set_error(CINFER_E_INVALID_ARG,
                              "text: tokenizes to no tokens");
        goto fail;
    }
    if (n_prompt >= (size_t)lim.n_ctx) {
        st = cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "%s: the prompt is %zu tokens; the context holds %d (prompt plus "
            "at least one generated token)",
            r->input_case == CINFER__V1__GENERATE_REQUEST__INPUT_TEXT ? "text"
                                                                      : "chat",
            n_prompt, (int)lim.n_ctx);
        goto fail;
    }

    g = calloc(1, sizeof *g);
    if (!g) {
        st = cinfer_set_error(CINFER_E_NOMEM, "no memory");
        goto fail;
    }
    g->n_prompt = (int32_t)n_prompt;
    g->want_logprobs = CINFER_PB_HAS(r, logprobs);
    g->n_top = g->want_logprobs ? r->logprobs : 0;

    cinfer_request_params rp = cinfer_request_default_params();
    rp.prompt = prompt;
    rp.n_prompt = n_prompt;
    rp.sampling = cinfer_sampler_default_params();
    rp.sampling.n_vocab = lim.n_vocab;
    rp.sampling.seed = random_seed();
    const Cinfer__V1__SamplingParams *sp = r->sampling;
    if (sp) {
        if (CINFER_PB_HAS(sp, temperature))
            rp.sampling.temperature = sp->temperature;
        if (CINFER_PB_HAS(sp, top_k))
            rp.sampling.top_k = sp->top_k;
        if (CINFER_PB_HAS(sp, top_p))
            rp.sampling.top_p = sp->top_p;
        if (CINFER_PB_HAS(sp, min_p))
            rp.sampling.min_p = sp->min_p;
        if (CINFER_PB_HAS(sp, repetition_penalty))
            rp.sampling.repetition_penalty = sp->repetition_penalty;
        if (CINFER_PB_HAS(sp, presence_penalty))
            rp.sampling.presence_penalty = sp->presence_penalty;
        if (CINFER_PB_HAS(sp, frequency_penalty))
            rp.sampling.frequency_penalty = sp->frequency_penalty;
        if (CINFER_PB_HAS(sp, seed))
            rp.sampling.seed = sp->seed;
    }
    rp.sampling.n_logprobs = g->n_top;
    rp.logprobs = g->want_logprobs;
    rp.max_tokens = cinfer_validate_max_tokens(r, &lim);
    const Cinfer__V1__StoppingCriteria *sc = r->stopping;
    int64_t time_limit_ns = 0;
    if (sc) {
        if (CINFER_PB_HAS(sc, min_tokens))
            rp.min_tokens = sc->min_tokens;
        if (CINFER_PB_HAS(sc, ignore_eos))
            rp.ignore_eos = sc->ignore_eos;
        rp.stop = (const char *const *)sc->stop;
        rp.n_stop = sc->n_stop;
        rp.stop_ids = sc->stop_token_ids;
        rp.n_stop_ids = sc->n_stop_token_ids;
        if (CINFER_PB_HAS(sc, time_limit_ms))
            time_limit_ns =
                c->start_ns + (int64_t)sc->time_limit_ms * 1000000;
    }
    rp.priority = r->priority;
    int64_t now = cinfer_server_now_ns();
    g->call_deadline_ns = call_deadline_ns(c);
    int64_t hard_dl = g->call_deadline_ns;
    if (s->params.max_request_time_ms > 0) {
        int64_t cap = cinfer_ns_add_sat(
            c->start_ns, cinfer_ms_to_ns(s->params.max_request_time_ms));
        if (!hard_dl || cap < hard_dl)
            hard_dl = cap;
    }
    rp.deadline_ns = time_limit_ns;
    if (hard_dl && (!time_limit_ns || hard_dl <= time_limit_ns)) {
        rp.deadline_ns = hard_dl;
        g->deadline_is_hard = 1;
    }
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
        int64_t total = (int64_t)n_prompt + rp.max_tokens;
        if (!admit(c, g, r->priority, total, n_prompt, hard_dl, now))
            goto out; /* answered */
    }

    /* Listing races with drain: decide under the server lock. */
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->state) != SERVER_SERVING) {
        pthread_mutex_unlock(&s->mu);
        if (s->adm)
            cinfer_admission_finish(s->adm, &g->ticket, CINFER_OUTCOME_IGNORED,
                                    cinfer_server_now_ns());
        cinfer_pushback pb = {.reason = CINFER_REJECT_DRAINING,
                              .retry_after_ms = 0};
        cinfer_call_send_status_ex(c, OP_STEP, NULL, CINFER_E_UNAVAILABLE,
                                   "the server is shutting down", &pb);
        goto out;
    }
    c->listed = 1;
    c->prev = NULL;
    c->next = s->generate_list;
    if (s->generate_list)
        s->generate_list->prev = c;
    s->generate_list = c;
    s->generate_open++;
    pthread_mutex_unlock(&s->mu);

    c->state = CALL_STREAMING;
    cinfer_call_ref(c); /* the engine's hold, until FINISH */
    uint64_t id = 0;
    st = cinfer_engine_submit(s->engine, &rp, &id);
    if (st != CINFER_OK) {
        cinfer_call_unref(c); /* never the last: this handler holds one */
        c->state = CALL_RECEIVING;
        if (s->adm) {
            pthread_mutex_lock(&c->mu);
            cinfer_admission_finish(s->adm, &g->ticket,
                                    CINFER_OUTCOME_IGNORED,
                                    cinfer_server_now_ns());
            pthread_mutex_unlock(&c->mu);
        }
        /* The engine's refusals for its load, at once with a pushback:
         * UNAVAILABLE, a queue too long to wait in (--max-queue-wait-ms),
         * a first token too late (--max-ttft-ms) or the engine stopping;
         * TIMEOUT, the deadline foreseen to pass at the current load (as
         * the shedder does); EXHAUSTED, its own queue bound
         * (--max-queued). */
        if (st == CINFER_E_UNAVAILABLE || st == CINFER_E_TIMEOUT ||
            st == CINFER_E_EXHAUSTED) {
            cinfer_pushback pb = {.reason = CINFER_REJECT_NONE,
                                  .retry_after_ms = ENGINE_FULL_PUSHBACK_MS};
            if (st != CINFER_E_EXHAUSTED) {
                pb.reason =
                    st == CINFER_E_TIMEOUT ? CINFER_REJECT_SHED_DEADLINE
                    : cinfer_engine_refusal_kind() ==
                            CINFER_ENGINE_REFUSAL_FIRST_TOKEN
                        ? CINFER_REJECT_SHED_FIRST_TOKEN
                        : CINFER_REJECT_SHED_QUEUE_FULL;
                pb.retry_after_ms = engine_retry_ms();
            }
            cinfer_call_send_status_ex(c, OP_STEP, NULL, st,
                                       cinfer_last_error(), &pb);
            goto out;
        }
        goto fail;
    }
    pthread_mutex_lock(&c->mu);
    g->engine_id = id;
    g->submitted = 1;
    /* The watchdog may have shed it between listing and now, or the
     * client may have left (generate_on_close saw it unsubmitted). */
    int shed_early = (g->shed != CINFER_REJECT_NONE || g->gone) &&
                     !g->finished;
    pthread_mutex_unlock(&c->mu);
    if (shed_early)
        cinfer_engine_cancel(s->engine, id);

    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "generate start",
                         c->request_id)) {
        cinfer_log_int(&l, "prompt_tokens", (int64_t)n_prompt);
        cinfer_log_int(&l, "max_tokens", rp.max_tokens);
        cinfer_log_double(&l, "temperature", rp.sampling.temperature);
        if (hard_dl)
            cinfer_log_double(&l, "deadline_ms",
                              (double)(hard_dl - now) * 1e-6);
        cinfer_log_end(&l);
    }
out:
    free(prompt);
    cinfer__v1__generate_request__free_unpacked(r, NULL);
    return;

fail:
    free(prompt);
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
        g->deadline_passed = g->call_deadline_ns &&
                             now + DEADLINE_SLACK_NS >= g->call_deadline_ns;
        cancel = g->submitted && !g->finished;
    }
    pthread_mutex_unlock(&c->mu);
    if (cancel) {
        cinfer_log(CINFER_LOG_INFO,
                   g->deadline_passed ? "deadline passed; cancelling"
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
    free(g->ids);
    free(g->text);
    free(g->lp);
    free(g->top);
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
            g->aborted = 1;
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
        if (g && g->shed == CINFER_REJECT_NONE && !g->started &&
            !g->finished) {
            cinfer_admission_decision d =
                cinfer_admission_check_queued(s->adm, &g->ticket, now_ns);
            if (d.reason != CINFER_REJECT_NONE) {
                g->shed = d.reason;
                g->shed_retry_ms = d.retry_after_ms;
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

/* ---------------------------------------------------------------------- */
/* Service-time bound                                                     */
/* ---------------------------------------------------------------------- */

static int size_class(int64_t tokens)
{
    int k = 0;
    while (k < 31 && tokens >= ((int64_t)2 << k))
        k++;
    return k;
}

void cinfer_service_time_record(cinfer_server *s, int64_t tokens,
                                int64_t first_ns)
{
    if (tokens < 1 || first_ns <= 0)
        return;
    int k = size_class(tokens);
    pthread_mutex_lock(&s->prefill_mu);
    if (!s->min_first_ns[k] || first_ns < s->min_first_ns[k])
        s->min_first_ns[k] = first_ns;
    pthread_mutex_unlock(&s->prefill_mu);
}

int64_t cinfer_service_time_min(cinfer_server *s, int64_t tokens)
{
    /* More prompt tokens never take less time: every class whose largest
     * size is <= tokens bounds it from below. */
    int64_t best = 0;
    pthread_mutex_lock(&s->prefill_mu);
    for (int k = 0; k < 31 && ((int64_t)2 << k) - 1 <= tokens; k++)
        if (s->min_first_ns[k] > best)
            best = s->min_first_ns[k];
    pthread_mutex_unlock(&s->prefill_mu);
    return best;
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
