/*
 * http.c - the OpenAI-compatible HTTP front end (--http-listen): POST
 * /v1/completions, POST /v1/chat/completions, GET /v1/models, GET
 * /health, on libmicrohttpd, over the request path gRPC uses (request.c
 * for the fields, admit.c for admission and submit).
 *
 * Threads. The daemon runs a thread per connection (bounded by
 * HTTP_MAX_CONNECTIONS, and by the caps and descriptor reserve it shares
 * with the gRPC port, conn_limit.h: a connection refused there is closed
 * before its request is read). A request's connection thread decodes,
 * admits and submits it, then waits for the engine's events on the request's
 * condition variable in slices of WAIT_SLICE_MS: a non-streamed request
 * until every sample finished, a streamed one inside the response's
 * content callback, which hands MHD each server-sent event as it comes.
 * Between slices the thread looks at its socket: a client that hung up
 * has its engine request cancelled (its KV blocks are freed at the
 * engine's next step) and the connection ends. So no thread blocks the
 * daemon, and none waits forever: the engine finishes every request it
 * took, cancelled or not.
 *
 * Lifetime: an http_req has two holders, the connection (until MHD's
 * request-completed notice) and the engine (from submit to the last
 * FINISH); the last to let go frees it. From admission until both have
 * let go, the request counts in the server's generate_open, so a drain
 * waits for its answer and its last events, as for a gRPC stream (a
 * connection can end before the engine's last FINISH: its client left, or
 * the answer went out while the engine thread still logs). Destroy
 * cancels what the engine still holds (cinfer_http_abort_all) and, should
 * the server's bounded wait end first, waits for those requests itself.
 *
 * Metrics: each answer of an API path counts once in
 * cinfer:request_total{frontend="openai"} under its path, with the gRPC
 * code of its status (count_answer): a non-streamed one when it is
 * queued, a stream when its last event is (or CANCELLED when the client
 * left first); /health probes and unknown paths are not counted, as gRPC's
 * health and reflection calls are not.
 *
 * Errors are OpenAI's JSON: 400 naming the field (param), 401 without a
 * valid key, 404 for another model or path, 413 past the body bound,
 * 429 (rate limits) and 503 (shedding, breaker, drain, loading) with
 * Retry-After, 504 for deadlines, 500 for engine faults.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <netdb.h>
#include <unistd.h>

#include "server/grow.h"
#include "server/http.h"
#include "server/log.h"
#include "server/openai.h"
#include "server/server_impl.h"
#include "server/status_map.h"

#define HTTP_MAX_CONNECTIONS 256
/* How long destroy waits for the engine's last events (s). */
#define HTTP_DESTROY_WAIT_S 30
#define WAIT_SLICE_MS 50

struct cinfer_http {
    cinfer_server *srv;
    struct MHD_Daemon *daemon;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t idle;   /* live became empty (mu; CLOCK_MONOTONIC) */
    struct http_req *live; /* requests the engine holds (mu) */
    atomic_ullong next_id;
};

typedef struct {
    char *text;
    size_t n_text, cap_text, sent_text; /* sent: streamed so far */
    int32_t *ids;
    float *lp;
    cinfer_token_logprob *top; /* [n_ids * n_top] */
    size_t n_ids, cap_ids, sent_ids;
    int finished, role_sent;
    cinfer_finish_reason finish;
    int32_t completion_tokens;
} http_sample;

typedef struct http_req {
    cinfer_http *h;
    cinfer_server *s;
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd;
    char id[48];
    int64_t created_s;
    int64_t start_ns;  /* arrival (the rejection latency's start) */
    const char *path;  /* the API path (a static string): the metrics'
                          method; NULL = not counted */
    atomic_int counted; /* the answer is in the metrics */
    int chat;
    /* body */
    char *body;
    size_t n_body;
    int too_large;
    /* the request */
    cinfer_openai_req q;
    cinfer_grammar_entry *gram; /* released with the request, after the
                                   engine's last FINISH */
    cinfer_api_keys *key_set;
    int key_index;
    /* the engine's side (mu) */
    uint64_t engine_id;
    int submitted, held, listed;
    cinfer_gen_track tr;
    http_sample *samples;
    int n_samples, n_top;
    int finished; /* every sample */
    int gone;
    int oom;
    int32_t prompt_tokens, cached_tokens, completion_tokens;
    cinfer_status fin_status;
    char fin_message[256];
    /* streaming */
    char *out;
    size_t n_out, cap_out, off_out;
    int done_sent;
    struct http_req *next, *prev; /* h->live */
} http_req;

/* ---------------------------------------------------------------------- */
/* Small pieces                                                           */
/* ---------------------------------------------------------------------- */

static void req_free(http_req *r)
{
    for (int k = 0; k < r->n_samples; k++) {
        free(r->samples[k].text);
        free(r->samples[k].ids);
        free(r->samples[k].lp);
        free(r->samples[k].top);
    }
    free(r->samples);
    cinfer_grammar_entry_release(r->gram);
    cinfer_openai_req_cleanup(&r->q);
    cinfer_api_keys_unref(r->key_set);
    free(r->body);
    free(r->out);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    cinfer_server *srv = r->s;
    int listed = r->listed;
    free(r);
    /* Last: once generate_open reaches 0 a drain may end and the server
     * (and this front end) go; nothing of either is touched after. */
    if (listed)
        cinfer_server_stream_end(srv);
}

static void req_unref(http_req *r)
{
    if (atomic_fetch_sub(&r->refs, 1) == 1)
        req_free(r);
}

/* The client hung up: its socket reads end-of-file or errs. */
static int client_gone(int fd)
{
    if (fd < 0)
        return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
        return 1;
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void timed_wait(http_req *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* Cancels the engine request of a client that left. r->mu held; drops
 * and retakes it. */
static void cancel_gone(http_req *r)
{
    if (r->gone)
        return;
    r->gone = 1;
    int cancel = r->submitted && !r->finished;
    uint64_t id = r->engine_id;
    pthread_mutex_unlock(&r->mu);
    if (cancel) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "client gone; cancelling",
                             r->id)) {
            cinfer_log_str(&l, "frontend", "openai");
            cinfer_log_end(&l);
        }
        cinfer_engine_cancel(r->s->engine, id);
    }
    pthread_mutex_lock(&r->mu);
}

static const char *finish_name(cinfer_finish_reason f)
{
    return f == CINFER_FINISH_LENGTH || f == CINFER_FINISH_TIME_LIMIT
               ? "length"
               : "stop";
}

/* ---------------------------------------------------------------------- */
/* Responses                                                              */
/* ---------------------------------------------------------------------- */

static enum MHD_Result send_body(struct MHD_Connection *c, unsigned status,
                                 char *body, const char *type,
                                 int64_t retry_after_ms)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (retry_after_ms > 0) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)((retry_after_ms + 999) / 1000));
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    enum MHD_Result ret = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status,
                                 json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (j)
        json_decref(j);
    return send_body(c, status, s, "application/json", 0);
}

/* An error status: its HTTP code and OpenAI type. */
static unsigned http_status(cinfer_status st, const char **type)
{
    *type = "invalid_request_error";
    switch (st) {
    case CINFER_E_INVALID_ARG:
    case CINFER_E_RANGE:
        return 400;
    case CINFER_E_UNAUTHENTICATED:
        *type = "authentication_error";
        return 401;
    case CINFER_E_PERMISSION:
        *type = "permission_error";
        return 403;
    case CINFER_E_NOT_FOUND:
        return 404;
    case CINFER_E_EXHAUSTED:
        *type = "rate_limit_error";
        return 429;
    case CINFER_E_UNAVAILABLE:
        *type = "service_unavailable_error";
        return 503;
    case CINFER_E_TIMEOUT:
        *type = "timeout_error";
        return 504;
    default:
        *type = "server_error";
        return 500;
    }
}

/* Counts the request's answer, once: cinfer:request_total under its path
 * with the gRPC code of st, and a refusal under its reason with the time
 * the server took to answer it. */
static void count_answer(http_req *r, cinfer_status st,
                         const cinfer_pushback *pb)
{
    if (!r->path || atomic_exchange(&r->counted, 1))
        return;
    cinfer_metrics *m = r->s->metrics;
    cinfer_metrics_request_done(m, CINFER_FRONTEND_OPENAI, r->path,
                                (int)cinfer_server_grpc_status(st));
    if (pb && pb->reason != CINFER_REJECT_NONE) {
        cinfer_metrics_rejected(m, CINFER_FRONTEND_OPENAI,
                                cinfer_reject_name(pb->reason));
        cinfer_metrics_observe(
            m, CINFER_FRONTEND_OPENAI, CINFER_HIST_REJECT,
            (double)(cinfer_server_now_ns() - r->start_ns) * 1e-9);
    }
}

static enum MHD_Result send_error(http_req *r, struct MHD_Connection *c,
                                  cinfer_status st, const char *message,
                                  const cinfer_pushback *pb)
{
    const char *rid = r->id;
    const char *type;
    unsigned code = http_status(st, &type);
    char param[64] = "";
    if (code == 400)
        cinfer_openai_error_param(message, param, sizeof param);
    if (pb && pb->reason != CINFER_REJECT_NONE) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "call rejected", rid)) {
            cinfer_log_str(&l, "frontend", "openai");
            cinfer_log_str(&l, "reason", cinfer_reject_name(pb->reason));
            cinfer_log_int(&l, "retry_after_ms", pb->retry_after_ms);
            cinfer_log_end(&l);
        }
    } else if (code >= 500 || code == 401) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, code >= 500 ? CINFER_LOG_WARN : CINFER_LOG_INFO,
                             "call failed", rid)) {
            cinfer_log_str(&l, "frontend", "openai");
            cinfer_log_int(&l, "status", code);
            cinfer_log_str(&l, "message", message);
            cinfer_log_end(&l);
        }
    }
    count_answer(r, st, pb);
    int64_t retry = 0;
    if (pb && (code == 429 || code == 503))
        retry = pb->retry_after_ms > 0 ? pb->retry_after_ms : 1;
    else if (code == 503)
        retry = 1000;
    char *body = cinfer_openai_error_json(
        message, type, param, pb && pb->reason != CINFER_REJECT_NONE
                                  ? cinfer_reject_name(pb->reason)
                                  : NULL);
    if (!body)
        body = cinfer_openai_error_json("error", type, NULL, NULL);
    return send_body(c, code, body, "application/json", retry);
}

static const char *model_id(cinfer_server *s)
{
    const cinfer_model_info *mi = s->model ? cinfer_model_get_info(s->model)
                                           : NULL;
    return mi && mi->name[0] ? mi->name : "cinfer";
}

/* A token's text for logprobs (ill-formed UTF-8 replaced). */
static json_t *token_str(cinfer_server *s, int32_t id)
{
    const char *b = NULL;
    size_t n = 0;
    if (id < 0 || cinfer_tokenizer_token_piece(s->tk, id, &b, &n) != CINFER_OK)
        return json_string("");
    char buf[3 * 256 + 1];
    if (n > 256)
        n = 256;
    size_t o = cinfer_utf8_sanitize(b, n, buf);
    return json_stringn(buf, o);
}

/* The logprobs object of sample tokens [from, to). */
static json_t *logprobs_json(http_req *r, http_sample *sm, size_t from,
                             size_t to)
{
    cinfer_server *s = r->s;
    if (r->chat) {
        json_t *content = json_array();
        for (size_t i = from; i < to; i++) {
            json_t *tops = json_array();
            for (int k = 0; k < r->n_top; k++) {
                cinfer_token_logprob t = sm->top[i * (size_t)r->n_top + k];
                if (t.id < 0)
                    continue;
                json_array_append_new(
                    tops, json_pack("{s:o, s:f, s:n}", "token",
                                    token_str(s, t.id), "logprob",
                                    (double)t.logprob, "bytes"));
            }
            json_array_append_new(
                content, json_pack("{s:o, s:f, s:n, s:o}", "token",
                                   token_str(s, sm->ids[i]), "logprob",
                                   (double)sm->lp[i], "bytes", "top_logprobs",
                                   tops));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    size_t off = 0;
    for (size_t i = from; i < to; i++) {
        json_t *t = token_str(s, sm->ids[i]);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_string_length(t);
        json_array_append_new(toks, t);
        json_array_append_new(lps, json_real((double)sm->lp[i]));
        json_t *m = json_object();
        for (int k = 0; k < r->n_top; k++) {
            cinfer_token_logprob tl = sm->top[i * (size_t)r->n_top + k];
            if (tl.id < 0)
                continue;
            json_t *ts = token_str(s, tl.id);
            json_object_set_new(m, json_string_value(ts),
                                json_real((double)tl.logprob));
            json_decref(ts);
        }
        json_array_append_new(tops, m);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks,
                     "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offs);
}

/* cinfer_response_cached, our extension: the answer came from the
 * response cache (--response-cache-mb), not from the engine; OpenAI's
 * cached_tokens stays the prefix cache's count (0 for such an answer). */
static json_t *usage_json(http_req *r)
{
    return json_pack("{s:i, s:i, s:i, s:{s:i}, s:b}", "prompt_tokens",
                     (int)r->prompt_tokens, "completion_tokens",
                     (int)r->completion_tokens, "total_tokens",
                     (int)(r->prompt_tokens + r->completion_tokens),
                     "prompt_tokens_details", "cached_tokens",
                     (int)r->cached_tokens, "cinfer_response_cached",
                     r->tr.cached);
}

static json_t *envelope(http_req *r, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object", object,
                     "created", (json_int_t)r->created_s, "model",
                     model_id(r->s));
}

/* The whole answer of a non-streamed request. */
static json_t *full_response(http_req *r)
{
    json_t *j = envelope(r, r->chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int k = 0; k < r->n_samples; k++) {
        http_sample *sm = &r->samples[k];
        json_t *text = json_stringn(sm->text ? sm->text : "", sm->n_text);
        json_t *lp = r->q.logprobs ? logprobs_json(r, sm, 0, sm->n_ids)
                                   : json_null();
        json_t *ch;
        if (r->chat)
            ch = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", k,
                           "message", "role", "assistant", "content", text,
                           "logprobs", lp, "finish_reason",
                           finish_name(sm->finish));
        else
            ch = json_pack("{s:i, s:o, s:o, s:s}", "index", k, "text", text,
                           "logprobs", lp, "finish_reason",
                           finish_name(sm->finish));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(j, "choices", choices);
    json_object_set_new(j, "usage", usage_json(r));
    return j;
}

/* ---------------------------------------------------------------------- */
/* Engine events (engine thread)                                          */
/* ---------------------------------------------------------------------- */

static int sample_append(http_req *r, const cinfer_engine_event *ev)
{
    if (ev->sample_index < 0 || ev->sample_index >= r->n_samples)
        return 1;
    http_sample *sm = &r->samples[ev->sample_index];
    if (!cinfer_grow((void **)&sm->text, &sm->cap_text,
                     sm->n_text + ev->text_len + 1, 1))
        return 0;
    memcpy(sm->text + sm->n_text, ev->text, ev->text_len);
    sm->n_text += ev->text_len;
    sm->text[sm->n_text] = '\0';
    if (!r->q.logprobs || ev->n_ids == 0)
        return 1;
    size_t need = sm->n_ids + ev->n_ids;
    size_t c0 = sm->cap_ids, c1 = sm->cap_ids, c2 = sm->cap_ids;
    if (!cinfer_grow((void **)&sm->ids, &c0, need, sizeof *sm->ids) ||
        !cinfer_grow((void **)&sm->lp, &c1, need, sizeof *sm->lp) ||
        !cinfer_grow((void **)&sm->top, &c2,
                     need * (size_t)(r->n_top ? r->n_top : 1),
                     sizeof *sm->top))
        return 0;
    sm->cap_ids = c0;
    for (size_t i = 0; i < ev->n_ids; i++) {
        size_t j = sm->n_ids + i;
        sm->ids[j] = ev->ids[i];
        sm->lp[j] = ev->logprobs ? ev->logprobs[i] : 0.0f;
        for (int k = 0; k < r->n_top; k++) {
            cinfer_token_logprob t = {-1, 0.0f};
            if (ev->top && k < ev->n_top)
                t = ev->top[i * (size_t)ev->n_top + (size_t)k];
            sm->top[j * (size_t)r->n_top + (size_t)k] = t;
        }
    }
    sm->n_ids = need;
    return 1;
}

static void unlist(http_req *r)
{
    cinfer_http *h = r->h;
    pthread_mutex_lock(&h->mu);
    if (r->prev)
        r->prev->next = r->next;
    else if (h->live == r)
        h->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->next = r->prev = NULL;
    if (!h->live)
        pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
}

static void on_event(void *user, const cinfer_engine_event *ev)
{
    http_req *r = user;
    int64_t now = cinfer_server_now_ns();
    int cancel = 0, last = 0;
    pthread_mutex_lock(&r->mu);
    if (ev->kind == CINFER_EVENT_TOKENS) {
        cinfer_gen_track_tokens(r->s, &r->tr, ev, now, &cancel);
        if (r->tr.shed == CINFER_REJECT_NONE && !r->oom &&
            !sample_append(r, ev))
            r->oom = 1;
    } else {
        last = cinfer_gen_track_finish(r->s, &r->tr, ev, now);
        if (ev->sample_index >= 0 && ev->sample_index < r->n_samples) {
            http_sample *sm = &r->samples[ev->sample_index];
            sm->finished = 1;
            sm->finish = ev->finish;
            sm->completion_tokens = ev->completion_tokens;
        }
        if (ev->finish == CINFER_FINISH_ERROR && r->fin_status == CINFER_OK) {
            r->fin_status = ev->status != CINFER_OK ? ev->status
                                                    : CINFER_E_INTERNAL;
            snprintf(r->fin_message, sizeof r->fin_message, "engine error: %s",
                     ev->message ? ev->message : "");
        }
        if (ev->finish == CINFER_FINISH_TIME_LIMIT && r->tr.deadline_is_hard &&
            r->fin_status == CINFER_OK) {
            r->fin_status = CINFER_E_TIMEOUT;
            snprintf(r->fin_message, sizeof r->fin_message,
                     "deadline exceeded");
        }
        if (ev->finish == CINFER_FINISH_CANCELLED && r->tr.aborted &&
            r->fin_status == CINFER_OK) {
            r->fin_status = CINFER_E_UNAVAILABLE;
            snprintf(r->fin_message, sizeof r->fin_message,
                     "the server shut down before the request finished");
        }
        r->prompt_tokens = ev->prompt_tokens;
        r->cached_tokens = ev->cached_tokens;
        r->completion_tokens += ev->completion_tokens;
        if (last)
            r->finished = 1;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (cancel)
        cinfer_engine_cancel(r->s->engine, ev->request_id);
    if (last) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "generate done", r->id)) {
            cinfer_log_str(&l, "frontend", "openai");
            cinfer_log_str(&l, "finish", cinfer_finish_reason_name(ev->finish));
            cinfer_log_int(&l, "prompt_tokens", r->prompt_tokens);
            cinfer_log_int(&l, "completion_tokens", r->completion_tokens);
            if (r->tr.cached)
                cinfer_log_str(&l, "response_cache", "hit");
            if (r->gone)
                cinfer_log_str(&l, "client", "gone");
            cinfer_log_end(&l);
        }
        unlist(r);
        req_unref(r); /* the engine's hold */
    }
}

/* ---------------------------------------------------------------------- */
/* Streaming                                                              */
/* ---------------------------------------------------------------------- */

static int out_add(http_req *r, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (j)
        json_decref(j);
    if (!s)
        return 0;
    size_t n = strlen(s);
    int ok = cinfer_grow((void **)&r->out, &r->cap_out, r->n_out + n + 9, 1);
    if (ok) {
        memcpy(r->out + r->n_out, "data: ", 6);
        memcpy(r->out + r->n_out + 6, s, n);
        memcpy(r->out + r->n_out + 6 + n, "\n\n", 2);
        r->n_out += n + 8;
    }
    free(s);
    return ok;
}

static json_t *chunk_of(http_req *r, int k, json_t *delta_text, json_t *lp,
                        const char *finish)
{
    json_t *j = envelope(r, r->chat ? "chat.completion.chunk"
                                    : "text_completion");
    json_t *ch;
    if (r->chat) {
        json_t *delta = json_object();
        if (!r->samples[k].role_sent)
            json_object_set_new(delta, "role", json_string("assistant"));
        r->samples[k].role_sent = 1;
        if (delta_text)
            json_object_set_new(delta, "content", delta_text);
        ch = json_pack("{s:i, s:o}", "index", k, "delta", delta);
    } else {
        ch = json_pack("{s:i, s:o}", "index", k, "text",
                       delta_text ? delta_text : json_string(""));
    }
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason",
                        finish ? json_string(finish) : json_null());
    json_object_set_new(j, "choices", json_pack("[o]", ch));
    return j;
}

/* Turns what arrived into events in r->out. r->mu held. */
static void stream_collect(http_req *r)
{
    for (int k = 0; k < r->n_samples; k++) {
        http_sample *sm = &r->samples[k];
        if (sm->n_text > sm->sent_text || sm->n_ids > sm->sent_ids) {
            json_t *lp = r->q.logprobs
                             ? logprobs_json(r, sm, sm->sent_ids, sm->n_ids)
                             : NULL;
            out_add(r, chunk_of(r, k,
                                json_stringn(sm->text + sm->sent_text,
                                             sm->n_text - sm->sent_text),
                                lp, NULL));
            sm->sent_text = sm->n_text;
            sm->sent_ids = sm->n_ids;
        }
    }
    if (!r->finished || r->done_sent)
        return;
    if (r->fin_status == CINFER_OK && r->tr.shed == CINFER_REJECT_NONE) {
        count_answer(r, CINFER_OK, NULL);
        for (int k = 0; k < r->n_samples; k++)
            out_add(r, chunk_of(r, k, NULL, NULL,
                                finish_name(r->samples[k].finish)));
        if (r->q.include_usage) {
            json_t *j = envelope(r, r->chat ? "chat.completion.chunk"
                                            : "text_completion");
            json_object_set_new(j, "choices", json_array());
            json_object_set_new(j, "usage", usage_json(r));
            out_add(r, j);
        }
    } else {
        /* Headers are sent: the error travels as an event, and is counted
         * (a shed under its reason) as the non-streamed answer's. */
        cinfer_pushback pb = {.reason = r->tr.shed,
                              .retry_after_ms = r->tr.shed_retry_ms};
        count_answer(r,
                     r->fin_status != CINFER_OK
                         ? r->fin_status
                         : cinfer_reject_status(r->tr.shed),
                     r->fin_status != CINFER_OK ? NULL : &pb);
        const char *type;
        http_status(r->fin_status != CINFER_OK ? r->fin_status
                                               : cinfer_reject_status(r->tr.shed),
                    &type);
        char msg[320];
        if (r->fin_status != CINFER_OK)
            snprintf(msg, sizeof msg, "%s", r->fin_message);
        else
            cinfer_request_reject_message(r->tr.shed, r->tr.shed_retry_ms,
                                          NULL, msg, sizeof msg);
        char *e = cinfer_openai_error_json(msg, type, NULL, NULL);
        if (e) {
            json_t *j = json_loads(e, 0, NULL);
            free(e);
            out_add(r, j);
        }
    }
    const char *done = "data: [DONE]\n\n";
    if (cinfer_grow((void **)&r->out, &r->cap_out,
                    r->n_out + strlen(done) + 1, 1)) {
        memcpy(r->out + r->n_out, done, strlen(done));
        r->n_out += strlen(done);
    }
    r->done_sent = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_req *r = cls;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->off_out < r->n_out) {
            size_t n = r->n_out - r->off_out;
            if (n > max)
                n = max;
            memcpy(buf, r->out + r->off_out, n);
            r->off_out += n;
            if (r->off_out == r->n_out)
                r->off_out = r->n_out = 0;
            pthread_mutex_unlock(&r->mu);
            return (ssize_t)n;
        }
        if (r->done_sent) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (r->gone && r->finished) {
            pthread_mutex_unlock(&r->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        stream_collect(r);
        if (r->n_out > 0)
            continue;
        if (!r->gone && client_gone(r->fd))
            cancel_gone(r);
        else
            timed_wait(r);
    }
}

/* ---------------------------------------------------------------------- */
/* Requests                                                               */
/* ---------------------------------------------------------------------- */

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The API key of the request, when the server has keys. Returns 0 when
 * it was answered 401. */
static int authenticate(http_req *r, struct MHD_Connection *c,
                        enum MHD_Result *ret)
{
    cinfer_server *s = r->s;
    pthread_mutex_lock(&s->keys_mu);
    cinfer_api_keys *ks = s->keys;
    if (ks)
        cinfer_api_keys_ref(ks);
    pthread_mutex_unlock(&s->keys_mu);
    if (!ks)
        return 1;
    const char *key = NULL;
    size_t key_len = 0;
    const char *names[] = {"authorization", "x-api-key"};
    for (int i = 0; i < 2 && !key; i++) {
        const char *v =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, names[i]);
        if (v)
            cinfer_api_key_from_header(names[i], strlen(names[i]), v,
                                       strlen(v), &key, &key_len);
    }
    int idx = -1;
    if (key && key_len <= CINFER_API_KEY_MAX_BYTES)
        idx = cinfer_api_keys_find(ks, key, key_len);
    if (idx < 0) {
        cinfer_api_keys_unref(ks);
        *ret = send_error(r, c, CINFER_E_UNAUTHENTICATED,
                          key ? "the API key is not valid"
                              : "an API key is required (Authorization: "
                                "Bearer KEY)",
                          NULL);
        return 0;
    }
    r->key_set = ks;
    r->key_index = idx;
    const cinfer_api_key *k = cinfer_api_keys_get(ks, idx);
    if (k)
        cinfer_metrics_api_key(s->metrics, k->name);
    return 1;
}

/* Decodes and checks the body, tokenizes, compiles the grammar. */
static cinfer_status prepare(http_req *r, int32_t **prompt, size_t *n_prompt)
{
    cinfer_server *s = r->s;
    const cinfer_request_fields *f = &cinfer_request_fields_openai;
    cinfer_status st = cinfer_openai_decode(r->body, r->n_body, r->chat, &r->q);
    if (st != CINFER_OK)
        return st;
    if (!r->q.model)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "model is required");
    if (strcmp(r->q.model, model_id(s)) != 0)
        return cinfer_set_error(CINFER_E_NOT_FOUND,
                                "The model `%.128s` does not exist; this "
                                "server serves `%s`",
                                r->q.model, model_id(s));
    st = cinfer_request_validate(&r->q.d, &s->limits, f);
    if (st != CINFER_OK)
        return st;
    if (r->key_set) {
        const cinfer_api_key *k = cinfer_api_keys_get(r->key_set, r->key_index);
        if (k && k->has_max_priority && r->q.d.priority > k->max_priority)
            return cinfer_set_error(CINFER_E_PERMISSION,
                                    "priority %d is above the maximum of API "
                                    "key %s (%d)",
                                    (int)r->q.d.priority, k->name,
                                    (int)k->max_priority);
    }
    st = cinfer_request_encode(s->tk, &s->chat, &r->q.d, prompt, n_prompt);
    if (st == CINFER_OK)
        st = cinfer_request_check_prompt(&r->q.d, *n_prompt, &s->limits, f);
    if (st == CINFER_OK)
        st = cinfer_request_compile_grammar(&r->q.d, f, s->grammars,
                                            &r->gram);
    return st;
}

static enum MHD_Result generate(http_req *r, struct MHD_Connection *c)
{
    cinfer_server *s = r->s;
    enum MHD_Result ret = MHD_NO;
    if (!authenticate(r, c, &ret))
        return ret;
    if (r->too_large) {
        char msg[96];
        snprintf(msg, sizeof msg, "the body is larger than %d bytes",
                 CINFER_OPENAI_MAX_BODY);
        /* gRPC's answer to a message past its bound */
        count_answer(r, CINFER_E_EXHAUSTED, NULL);
        return send_body(c, 413,
                         cinfer_openai_error_json(msg, "invalid_request_error",
                                                  NULL, NULL),
                         "application/json", 0);
    }
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    cinfer_status st = prepare(r, &prompt, &n_prompt);
    if (st != CINFER_OK) {
        free(prompt);
        return send_error(r, c, st, cinfer_last_error(), NULL);
    }
    cinfer_request_params rp;
    cinfer_request_to_engine(&r->q.d, &s->limits, prompt, n_prompt,
                             cinfer_server_random_seed(),
                             r->gram ? cinfer_grammar_entry_grammar(r->gram)
                                     : NULL,
                             &rp);
    r->n_samples = rp.n_samples;
    r->n_top = r->q.top_logprobs;
    r->samples = calloc((size_t)rp.n_samples, sizeof *r->samples);
    if (!r->samples) {
        free(prompt);
        return send_error(r, c, CINFER_E_NOMEM, "no memory", NULL);
    }
    int64_t start = cinfer_server_now_ns();
    cinfer_gen_track_init(&r->tr, CINFER_FRONTEND_OPENAI, start,
                          rp.n_samples);
    cinfer_request_deadline dl =
        cinfer_request_deadline_of(start, 0, s->params.max_request_time_ms, 0);
    rp.deadline_ns = dl.engine_ns;
    r->tr.deadline_is_hard = dl.is_hard;
    rp.on_event = on_event;
    rp.user = r;

    cinfer_refusal ref;
    if (s->adm) {
        const char *peer = NULL;
        char ip[64] = "";
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (!r->q.user && ci && ci->client_addr &&
            getnameinfo(ci->client_addr,
                        ci->client_addr->sa_family == AF_INET6
                            ? sizeof(struct sockaddr_in6)
                            : sizeof(struct sockaddr_in),
                        ip, sizeof ip, NULL, 0, NI_NUMERICHOST) == 0)
            peer = ip;
        const char *cid = r->q.user ? r->q.user : peer;
        cinfer_admit_in in = {
            .client_id = cid,
            .client_id_len = cid ? strlen(cid) : 0,
            .key_set = r->key_set,
            .key_index = r->key_index,
            .priority = r->q.d.priority,
            .tokens = (int64_t)(n_prompt + rp.n_prompt_embeds) +
                      (int64_t)rp.max_tokens * rp.n_samples,
            .n_prompt = n_prompt + rp.n_prompt_embeds, /* positions */
            .deadline_ns = dl.hard_ns,
        };
        if (!cinfer_server_admit(s, &in, start, &r->tr.ticket, &ref)) {
            free(prompt);
            return send_error(r, c, ref.status, ref.message,
                              ref.has_pb ? &ref.pb : NULL);
        }
        r->tr.admitted = 1;
    }
    if (!cinfer_server_stream_begin(s)) {
        free(prompt);
        cinfer_gen_track_drop(s, &r->tr);
        cinfer_pushback pb = {.reason = CINFER_REJECT_DRAINING,
                              .retry_after_ms = 1000};
        return send_error(r, c, CINFER_E_UNAVAILABLE,
                          "the server is shutting down", &pb);
    }
    r->listed = 1; /* in generate_open until both holders let go */
    atomic_fetch_add(&r->refs, 1); /* the engine's hold */
    pthread_mutex_lock(&r->h->mu);
    r->next = r->h->live;
    if (r->next)
        r->next->prev = r;
    r->h->live = r;
    pthread_mutex_unlock(&r->h->mu);
    pthread_mutex_lock(&r->mu); /* events wait until the id is known */
    uint64_t id = 0;
    cinfer_rcache_entry *hit = NULL;
    st = cinfer_server_submit(s, &r->q.d, &rp, &id, &hit, &ref);
    free(prompt);
    if (st != CINFER_OK) {
        pthread_mutex_unlock(&r->mu);
        cinfer_gen_track_drop(s, &r->tr);
        unlist(r);
        atomic_fetch_sub(&r->refs, 1);
        return send_error(r, c, ref.status, ref.message,
                          ref.has_pb ? &ref.pb : NULL);
    }
    r->engine_id = id;
    r->submitted = 1;
    r->tr.cached = hit != NULL;
    if (hit) {
        /* Its events take r->mu, as the engine's would. */
        pthread_mutex_unlock(&r->mu);
        cinfer_server_replay(s, hit, &rp);
        pthread_mutex_lock(&r->mu);
    }

    if (r->q.stream) {
        pthread_mutex_unlock(&r->mu);
        struct MHD_Response *resp = MHD_create_response_from_callback(
            MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, r, NULL);
        if (!resp)
            return MHD_NO; /* the connection ends: its notice cancels */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                                "no-cache");
        ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    while (!r->finished) {
        if (!r->gone && client_gone(r->fd))
            cancel_gone(r);
        else
            timed_wait(r);
    }
    int gone = r->gone;
    cinfer_status fst = r->oom ? CINFER_E_NOMEM : r->fin_status;
    cinfer_reject shed = r->tr.shed;
    pthread_mutex_unlock(&r->mu);
    if (gone)
        return MHD_NO;
    if (shed != CINFER_REJECT_NONE) {
        char msg[320];
        cinfer_request_reject_message(shed, r->tr.shed_retry_ms, NULL, msg,
                                      sizeof msg);
        cinfer_pushback pb = {.reason = shed,
                              .retry_after_ms = r->tr.shed_retry_ms};
        return send_error(r, c, cinfer_reject_status(shed), msg, &pb);
    }
    if (fst != CINFER_OK)
        return send_error(r, c, fst,
                          r->oom ? "out of memory" : r->fin_message, NULL);
    count_answer(r, CINFER_OK, NULL);
    return send_json(c, 200, full_response(r));
}

static enum MHD_Result get_models(http_req *r, struct MHD_Connection *c)
{
    enum MHD_Result ret = MHD_NO;
    if (!authenticate(r, c, &ret))
        return ret;
    cinfer_server *s = r->s;
    count_answer(r, CINFER_OK, NULL);
    return send_json(
        c, 200,
        json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i, s:i}]}", "object",
                  "list", "data", "id", model_id(s), "object", "model",
                  "created", (json_int_t)r->created_s, "owned_by", "cinfer",
                  "max_model_len", (int)s->limits.n_ctx, "vocab_size",
                  (int)s->limits.n_vocab));
}

static enum MHD_Result route(http_req *r, struct MHD_Connection *c,
                             const char *url, const char *method)
{
    cinfer_server *s = r->s;
    int post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    int get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    if (strcmp(url, "/health") == 0 && get) {
        int ok = cinfer_server_healthy(s);
        return send_body(c, ok ? 200 : 503,
                         strdup(ok ? "{\"status\":\"ok\"}"
                                   : "{\"status\":\"unavailable\"}"),
                         "application/json", ok ? 0 : 1000);
    }
    int completions = strcmp(url, "/v1/completions") == 0;
    int chat = strcmp(url, "/v1/chat/completions") == 0;
    int models = strcmp(url, "/v1/models") == 0;
    if (!completions && !chat && !models)
        return send_error(r, c, CINFER_E_NOT_FOUND, "no such path", NULL);
    r->path = completions ? "/v1/completions"
              : chat      ? "/v1/chat/completions"
                          : "/v1/models";
    if ((models && !get) || (!models && !post))
        return send_error(r, c, CINFER_E_INVALID_ARG,
                          "the method is not allowed on this path", NULL);
    if (atomic_load(&s->state) != SERVER_SERVING) {
        cinfer_pushback pb = {.reason = atomic_load(&s->state) ==
                                                SERVER_LOADING
                                            ? CINFER_REJECT_NONE
                                            : CINFER_REJECT_DRAINING,
                              .retry_after_ms = 1000};
        return send_error(r, c, CINFER_E_UNAVAILABLE,
                          atomic_load(&s->state) == SERVER_LOADING
                              ? "the model is loading"
                              : "the server is shutting down",
                          &pb);
    }
    if (models)
        return get_models(r, c);
    r->chat = chat;
    return generate(r, c);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    (void)version;
    cinfer_http *h = cls;
    http_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->h = h;
        r->s = h->srv;
        atomic_init(&r->refs, 1);
        atomic_init(&r->counted, 0);
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->cv, NULL);
        r->fd = conn_fd(c);
        r->created_s = (int64_t)time(NULL);
        r->start_ns = cinfer_server_now_ns();
        snprintf(r->id, sizeof r->id, "cmpl-%llu",
                 (unsigned long long)atomic_fetch_add(&h->next_id, 1) + 1);
        *con_cls = r;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!r->too_large) {
            if (r->n_body + *upload_size > CINFER_OPENAI_MAX_BODY) {
                r->too_large = 1;
            } else {
                size_t cap = r->n_body;
                char *b = realloc(r->body, r->n_body + *upload_size + 1);
                if (!b)
                    return MHD_NO;
                (void)cap;
                r->body = b;
                memcpy(r->body + r->n_body, upload, *upload_size);
                r->n_body += *upload_size;
                r->body[r->n_body] = '\0';
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!r->body) {
        r->body = strdup("");
        if (!r->body)
            return MHD_NO;
    }
    return route(r, c, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    http_req *r = *con_cls;
    if (!r)
        return;
    *con_cls = NULL;
    pthread_mutex_lock(&r->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        cancel_gone(r);
    pthread_mutex_unlock(&r->mu);
    /* An answer not counted yet never reached its end: the client left. */
    count_answer(r, CINFER_E_CANCELLED, NULL);
    /* It stays counted in generate_open until both holders let go
     * (req_free): the answer is out and the engine's last event is done,
     * so a drain waits for both, and for the event's unlist too. */
    req_unref(r); /* the connection's hold */
}

/* ---------------------------------------------------------------------- */
/* The daemon                                                             */
/* ---------------------------------------------------------------------- */

/* The server's connection caps and descriptor reserve (conn_limit.h),
 * which the gRPC port shares: asked before a connection is taken, told
 * when it opens and closes (its address kept in the socket context). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr,
                                 socklen_t len)
{
    cinfer_http *h = cls;
    return cinfer_conn_limit_check_addr(h->srv->conns, addr, len) ==
                   CINFER_CONN_ADMIT
               ? MHD_YES
               : MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **ctx,
                          enum MHD_ConnectionNotificationCode toe)
{
    cinfer_http *h = cls;
    struct sockaddr_storage *ss = *ctx;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        ss = calloc(1, sizeof *ss);
        if (!ss)
            return;
        if (ci && ci->client_addr)
            memcpy(ss, ci->client_addr,
                   ci->client_addr->sa_family == AF_INET6
                       ? sizeof(struct sockaddr_in6)
                       : sizeof(struct sockaddr_in));
        cinfer_conn_limit_open_addr(h->srv->conns, (struct sockaddr *)ss,
                                    sizeof *ss);
        *ctx = ss;
    } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && ss) {
        cinfer_conn_limit_close_addr(h->srv->conns, (struct sockaddr *)ss,
                                     sizeof *ss);
        free(ss);
        *ctx = NULL;
    }
}

/* libmicrohttpd's own lines (each failed accept, out of descriptors), at
 * most HTTP_LOG_PER_S a second. */
#define HTTP_LOG_PER_S 5
#define HTTP_LOG_BURST 20

static pthread_mutex_t http_log_mu = PTHREAD_MUTEX_INITIALIZER;
static cinfer_log_limit http_log_limit;
static int http_log_limit_ready;

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    uint64_t suppressed = 0;
    pthread_mutex_lock(&http_log_mu);
    if (!http_log_limit_ready) {
        cinfer_log_limit_init(&http_log_limit, HTTP_LOG_PER_S,
                              HTTP_LOG_BURST);
        http_log_limit_ready = 1;
    }
    int ok = cinfer_log_limit_take(&http_log_limit, cinfer_server_now_ns(),
                                   &suppressed);
    pthread_mutex_unlock(&http_log_mu);
    if (!ok)
        return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_WARN, "http daemon", NULL)) {
        cinfer_log_str(&l, "error", msg);
        if (suppressed)
            cinfer_log_int(&l, "suppressed", (int64_t)suppressed);
        cinfer_log_end(&l);
    }
}

cinfer_status cinfer_http_create(cinfer_server *s, const char *listen,
                                 cinfer_http **out)
{
    *out = NULL;
    int fd = -1, port = 0;
    cinfer_status st = cinfer_metrics_open_listener(listen, "http listen",
                                                    &fd, &port);
    if (st != CINFER_OK)
        return st;
    cinfer_http *h = calloc(1, sizeof *h);
    if (!h) {
        close(fd);
        return cinfer_set_error(CINFER_E_NOMEM, "no memory");
    }
    h->srv = s;
    h->port = port;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->idle, &ca);
    pthread_condattr_destroy(&ca);
    h->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
            MHD_USE_ERROR_LOG,
        0, on_accept, h, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
        on_mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_MAX_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)120,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    if (!h->daemon) {
        close(fd);
        pthread_cond_destroy(&h->idle);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return cinfer_set_error(CINFER_E_IO,
                                "http listen address \"%s\": the HTTP daemon "
                                "did not start",
                                listen);
    }
    *out = h;
    return CINFER_OK;
}

int cinfer_http_port(const cinfer_http *h)
{
    return h ? h->port : 0;
}

void cinfer_http_abort_all(cinfer_http *h)
{
    if (!h)
        return;
    uint64_t ids[1024];
    size_t n = 0;
    pthread_mutex_lock(&h->mu);
    for (http_req *r = h->live; r && n < 1024; r = r->next) {
        pthread_mutex_lock(&r->mu);
        if (r->submitted && !r->finished) {
            r->tr.aborted = 1;
            ids[n++] = r->engine_id;
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&h->mu);
    for (size_t i = 0; i < n; i++)
        cinfer_engine_cancel(h->srv->engine, ids[i]);
}

void cinfer_http_check_queued(cinfer_http *h, int64_t now_ns)
{
    if (!h || !h->srv->adm)
        return;
    /* Decide under the locks, cancel outside them. */
    uint64_t ids[256];
    size_t n = 0;
    pthread_mutex_lock(&h->mu);
    for (http_req *r = h->live; r && n < 256; r = r->next) {
        pthread_mutex_lock(&r->mu);
        if (r->tr.admitted && r->tr.shed == CINFER_REJECT_NONE &&
            !r->tr.started && !r->finished) {
            cinfer_admission_decision d = cinfer_admission_check_queued(
                h->srv->adm, &r->tr.ticket, now_ns);
            if (d.reason != CINFER_REJECT_NONE) {
                r->tr.shed = d.reason;
                r->tr.shed_retry_ms = d.retry_after_ms;
                if (r->submitted)
                    ids[n++] = r->engine_id;
            }
        }
        pthread_mutex_unlock(&r->mu);
    }
    pthread_mutex_unlock(&h->mu);
    for (size_t i = 0; i < n; i++)
        cinfer_engine_cancel(h->srv->engine, ids[i]);
}

void cinfer_http_destroy(cinfer_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->daemon); /* joins the connection threads */
    /* A request whose connection ended first (its client left, or its
     * answer went out before its last FINISH) is still held by the
     * engine, and its last event unlists it from h: wait for those,
     * cancelling again what started after the server's abort. The engine
     * finishes every request it took, cancelled ones at its next step;
     * if it does not within the bound, h is left allocated rather than
     * freed under a request that still points to it. */
    cinfer_http_abort_all(h);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += HTTP_DESTROY_WAIT_S;
    int left = 0;
    pthread_mutex_lock(&h->mu);
    while (h->live &&
           pthread_cond_timedwait(&h->idle, &h->mu, &until) != ETIMEDOUT)
        ;
    left = h->live != NULL;
    pthread_mutex_unlock(&h->mu);
    if (left) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR,
                             "http requests still held by the engine", NULL))
            cinfer_log_end(&l);
        return;
    }
    pthread_cond_destroy(&h->idle);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
