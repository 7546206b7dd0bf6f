/*
 * bench_http.c - cinfer-bench's HTTP driver: streamed completions from
 * llama.cpp's llama-server, or from an OpenAI-compatible server
 * (cinfer-server's --http-listen), so the same workload can drive them.
 *
 * OpenAI (--protocol openai): a POST /v1/completions with the model's id
 * (from GET /v1/models), the prompt, max_tokens, stream with
 * stream_options.include_usage, ignore_eos, temperature, seed and
 * logprobs 0, so that each event's logprobs.tokens counts the tokens it
 * brings (a server may coalesce several into one event); the usage event
 * gives the prompt's length and `data: [DONE]` ends the stream.
 *
 * llama.cpp:
 *
 * Each request is a POST /completion with the prompt as an array of token
 * ids (or the prompt file's text), n_predict, stream, ignore_eos,
 * temperature, seed and cache_prompt false. The reply is server-sent
 * events, one `data: {json}` line per sampled token; every event carries
 * tokens_predicted (tokens generated so far), so the tokens an event
 * brings are the increase of that count (a token that ends inside a UTF-8
 * character is held back by the server and arrives with the next one), and
 * the last event has "stop": true. Events are timestamped in libcurl's
 * write callback, which runs on the load generator's thread inside
 * curl_multi_perform: all streams share one multi handle, each on its own
 * keep-alive connection from the multi handle's pool.
 *
 * Failures are named by their cause: CURLE_<n> (libcurl's error code),
 * HTTP_<status>, SERVER_ERROR (an error event or object in the stream),
 * NO_FINAL (the stream ended without its stop event).
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifndef CINFER_HAVE_CURL

cinfer_status cinfer_bench_http_create(const cinfer_bench_driver_params *p,
                                       cinfer_bench_driver **out)
{
    *out = NULL;
    return cinfer_set_error(CINFER_E_UNSUPPORTED,
                            "built without libcurl: --protocol llamacpp is "
                            "not available");
}

cinfer_status cinfer_bench_http_model_info(cinfer_bench_driver *d,
                                           double timeout_s,
                                           cinfer_bench_model_info *out)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED, "built without libcurl");
}

#else

#include <curl/curl.h>

typedef struct http_driver http_driver;

typedef struct http_stream {
    http_driver *d;
    cinfer_bench_req *req;
    CURL *easy;
    struct curl_slist *headers;
    cinfer_bench_buf body;
    cinfer_bench_buf line;     /* the event line being received */
    cinfer_bench_buf other;    /* the start of non-event text (an error) */
    long predicted;            /* tokens_predicted of the latest event */
    int openai;                /* the OpenAI API's events */
    int saw_stop;
    int server_error;
    int failed_tokens;         /* recording a token failed (memory) */
    char curl_error[CURL_ERROR_SIZE];
    struct http_stream *prev, *next;
} http_stream;

struct http_driver {
    cinfer_bench_driver base;
    cinfer_bench_driver_params p;
    char base_url[256];
    char model[128];           /* the OpenAI model id (/v1/models) */
    CURLM *multi;
    http_stream *open;
};

/* ---------------------------------------------------------------------- */
/* A little JSON: top-level fields of one event object                    */
/* ---------------------------------------------------------------------- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

/* p at '"': returns the character after the closing quote, or NULL. */
static const char *skip_string(const char *p)
{
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!*++p)
                return NULL;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* p at a value: returns the character after it, or NULL. */
static const char *skip_value(const char *p)
{
    if (*p == '"')
        return skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') {
                p = skip_string(p);
                if (!p)
                    return NULL;
                continue;
            }
            if (*p == '{' || *p == '[')
                depth++;
            else if (*p == '}' || *p == ']')
                depth--;
            p++;
            if (depth == 0)
                return p;
        }
        return NULL;
    }
    while (*p && *p != ',' && *p != '}' && *p != ']')
        p++;
    return p;
}

/* The value of top-level field `key` of the object at s, or NULL. */
static const char *json_field(const char *s, const char *key)
{
    size_t kl = strlen(key);
    const char *p = skip_ws(s);
    if (*p != '{')
        return NULL;
    p = skip_ws(p + 1);
    while (*p == '"') {
        const char *k = p + 1;
        const char *after = skip_string(p);
        if (!after)
            return NULL;
        size_t len = (size_t)(after - 1 - k);
        p = skip_ws(after);
        if (*p != ':')
            return NULL;
        p = skip_ws(p + 1);
        if (len == kl && memcmp(k, key, kl) == 0)
            return p;
        p = skip_value(p);
        if (!p)
            return NULL;
        p = skip_ws(p);
        if (*p != ',')
            return NULL;
        p = skip_ws(p + 1);
    }
    return NULL;
}

static int json_long(const char *s, const char *key, long *out)
{
    const char *v = json_field(s, key);
    if (!v)
        return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (end == v)
        return 0;
    *out = x;
    return 1;
}

/* The items of the array at p (after skip_ws), or -1 if p holds none. */
static long array_items(const char *p)
{
    p = skip_ws(p);
    if (*p != '[')
        return -1;
    p = skip_ws(p + 1);
    if (*p == ']')
        return 0;
    long n = 0;
    while (p && *p) {
        p = skip_value(p);
        n++;
        if (!p)
            return -1;
        p = skip_ws(p);
        if (*p == ']')
            return n;
        if (*p != ',')
            return -1;
        p = skip_ws(p + 1);
    }
    return -1;
}

/* ---------------------------------------------------------------------- */
/* Streams                                                                */
/* ---------------------------------------------------------------------- */

/* An OpenAI completion event: its first choice's logprobs.tokens count the
 * tokens; the usage event the prompt; [DONE] the end. */
static void on_openai_event(http_stream *s, const char *json, double t)
{
    if (strncmp(json, "[DONE]", 6) == 0) {
        s->saw_stop = 1;
        return;
    }
    if (json_field(json, "error")) {
        s->server_error = 1;
        if (!s->other.len)
            cinfer_bench_buf_append(&s->other, json, strlen(json));
        return;
    }
    const char *usage = json_field(json, "usage");
    long prompt;
    if (usage && *usage == '{' && json_long(usage, "prompt_tokens", &prompt) &&
        prompt > 0)
        s->req->input_tokens = (int)prompt;
    const char *choices = json_field(json, "choices");
    if (!choices || *skip_ws(choices) != '[')
        return;
    const char *c0 = skip_ws(skip_ws(choices) + 1);
    if (*c0 != '{')
        return;
    const char *lp = json_field(c0, "logprobs");
    const char *toks = lp && *lp == '{' ? json_field(lp, "tokens") : NULL;
    long n = toks ? array_items(toks) : -1;
    if (n < 0) {
        /* No counts: one token per event with text. */
        const char *text = json_field(c0, "text");
        n = text && text[0] == '"' && text[1] != '"' ? 1 : 0;
    }
    if (n > 0 && cinfer_bench_req_tokens(s->req, (int)n, t) != CINFER_OK)
        s->failed_tokens = 1;
}

static void on_event(http_stream *s, const char *json, double t)
{
    if (s->openai) {
        on_openai_event(s, json, t);
        return;
    }
    if (json_field(json, "error")) {
        s->server_error = 1;
        if (!s->other.len)
            cinfer_bench_buf_append(&s->other, json, strlen(json));
        return;
    }
    long predicted;
    long n = 0;
    if (json_long(json, "tokens_predicted", &predicted)) {
        n = predicted - s->predicted;
        if (n < 0)
            n = 0;
        s->predicted = predicted;
    } else {
        /* A server without the count: one token per event with text. */
        const char *c = json_field(json, "content");
        if (c && c[0] == '"' && c[1] != '"')
            n = 1;
    }
    if (n > 0 && cinfer_bench_req_tokens(s->req, (int)n, t) != CINFER_OK)
        s->failed_tokens = 1;
    const char *stop = json_field(json, "stop");
    if (stop && strncmp(stop, "true", 4) == 0) {
        s->saw_stop = 1;
        long evaluated;
        if (json_long(json, "tokens_evaluated", &evaluated) && evaluated > 0)
            s->req->input_tokens = (int)evaluated;
    }
}

static void on_line(http_stream *s, char *line, double t)
{
    size_t n = strlen(line);
    if (n && line[n - 1] == '\r')
        line[--n] = '\0';
    if (n == 0)
        return;
    if (strncmp(line, "data:", 5) == 0) {
        on_event(s, line + 5 + (line[5] == ' '), t);
    } else if (strncmp(line, "error:", 6) == 0) {
        s->server_error = 1;
        if (!s->other.len)
            cinfer_bench_buf_append(&s->other, line, n);
    } else if (s->other.len < 512) {
        /* A plain (non-stream) reply: an error object. */
        cinfer_bench_buf_append(&s->other, line, n < 512 ? n : 512);
    }
}

static size_t on_write(char *data, size_t size, size_t nmemb, void *user)
{
    http_stream *s = user;
    size_t n = size * nmemb;
    double t = cinfer_bench_now_s();
    while (n > 0) {
        char *nl = memchr(data, '\n', n);
        size_t k = nl ? (size_t)(nl - data) : n;
        if (cinfer_bench_buf_append(&s->line, data, k) != CINFER_OK)
            return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
        if (!nl)
            break;
        on_line(s, s->line.data, t);
        s->line.len = 0;
        data += k + 1;
        n -= k + 1;
    }
    return size * nmemb;
}

static void stream_free(http_driver *d, http_stream *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        d->open = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (s->easy) {
        curl_multi_remove_handle(d->multi, s->easy);
        curl_easy_cleanup(s->easy);
    }
    curl_slist_free_all(s->headers);
    cinfer_bench_buf_free(&s->body);
    cinfer_bench_buf_free(&s->line);
    cinfer_bench_buf_free(&s->other);
    free(s);
}

static void stream_finish(http_driver *d, http_stream *s, CURLcode rc,
                          double t)
{
    cinfer_bench_req *r = s->req;
    long code = 0;
    curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &code);
    char name[CINFER_BENCH_STATUS_LEN];
    if (s->line.len) /* a last line without its newline */
        on_line(s, s->line.data, t);
    if (rc != CURLE_OK) {
        snprintf(name, sizeof name, "CURLE_%d", (int)rc);
        cinfer_bench_req_finish(r, t, 0, name,
                                s->curl_error[0] ? s->curl_error
                                                 : curl_easy_strerror(rc));
    } else if (code != 200) {
        snprintf(name, sizeof name, "HTTP_%ld", code);
        cinfer_bench_req_finish(r, t, 0, name, s->other.data);
    } else if (s->server_error) {
        cinfer_bench_req_finish(r, t, 0, "SERVER_ERROR", s->other.data);
    } else if (s->failed_tokens) {
        cinfer_bench_req_finish(r, t, 0, "CLIENT_NOMEM", "out of memory");
    } else if (!s->saw_stop) {
        cinfer_bench_req_finish(r, t, 0, "NO_FINAL",
                                "the stream ended without its stop event");
    } else {
        cinfer_bench_req_finish(r, t, 1, "OK", NULL);
    }
    stream_free(d, s);
}

static cinfer_status build_body(const http_driver *d,
                                const cinfer_bench_req *r,
                                cinfer_bench_buf *b)
{
    cinfer_status st = CINFER_OK;
    if (d->p.openai) {
        st = cinfer_bench_buf_append(b, "{\"model\": ", 10);
        if (st == CINFER_OK)
            st = cinfer_bench_buf_json_string(b, d->model);
        if (st == CINFER_OK)
            st = cinfer_bench_buf_append(b, ", ", 2);
    } else {
        st = cinfer_bench_buf_append(b, "{", 1);
    }
    if (st == CINFER_OK)
        st = cinfer_bench_buf_append(b, "\"prompt\": ", 10);
    if (st == CINFER_OK && r->item->prompt_ids) {
        st = cinfer_bench_buf_append(b, "[", 1);
        for (int i = 0; st == CINFER_OK && i < r->item->input_len; i++)
            st = cinfer_bench_buf_printf(b, i ? ",%d" : "%d",
                                         (int)r->item->prompt_ids[i]);
        if (st == CINFER_OK)
            st = cinfer_bench_buf_append(b, "]", 1);
    } else if (st == CINFER_OK) {
        st = cinfer_bench_buf_json_string(b, r->item->prompt_text);
    }
    if (st == CINFER_OK && d->p.openai)
        return cinfer_bench_buf_printf(
            b,
            ", \"max_tokens\": %d, \"stream\": true, \"stream_options\": "
            "{\"include_usage\": true}, \"logprobs\": 0, \"ignore_eos\": %s, "
            "\"temperature\": %.9g, \"seed\": %llu}",
            r->item->output_len, d->p.ignore_eos ? "true" : "false",
            d->p.temperature, (unsigned long long)(r->seed & 0xffffffffu));
    if (st == CINFER_OK)
        st = cinfer_bench_buf_printf(
            b,
            ", \"n_predict\": %d, \"stream\": true, \"ignore_eos\": %s, "
            "\"temperature\": %.9g, \"seed\": %llu, \"cache_prompt\": false}",
            r->item->output_len, d->p.ignore_eos ? "true" : "false",
            d->p.temperature, (unsigned long long)(r->seed & 0xffffffffu));
    return st;
}

static cinfer_status http_start(cinfer_bench_driver *base,
                                cinfer_bench_req *r)
{
    http_driver *d = (http_driver *)base;
    http_stream *s = calloc(1, sizeof *s);
    if (!s)
        return cinfer_set_error(CINFER_E_NOMEM, "stream: out of memory");
    s->d = d;
    s->req = r;
    s->openai = d->p.openai;
    s->next = d->open;
    if (d->open)
        d->open->prev = s;
    d->open = s;

    cinfer_status st = build_body(d, r, &s->body);
    if (st != CINFER_OK)
        goto fail;
    s->easy = curl_easy_init();
    if (!s->easy) {
        st = cinfer_set_error(CINFER_E_NOMEM, "curl_easy_init failed");
        goto fail;
    }
    struct curl_slist *h = NULL, *h2;
    static const char *const hdrs[] = {"Content-Type: application/json",
                                       "Accept: text/event-stream",
                                       "Expect:"};
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++) {
        h2 = curl_slist_append(h, hdrs[i]);
        if (!h2) {
            curl_slist_free_all(h);
            st = cinfer_set_error(CINFER_E_NOMEM, "headers: out of memory");
            goto fail;
        }
        h = h2;
    }
    s->headers = h;
    char url[300];
    snprintf(url, sizeof url, "%s%s", d->base_url,
             d->p.openai ? "/v1/completions" : "/completion");
    curl_easy_setopt(s->easy, CURLOPT_URL, url);
    curl_easy_setopt(s->easy, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(s->easy, CURLOPT_HTTPHEADER, s->headers);
    curl_easy_setopt(s->easy, CURLOPT_POSTFIELDS, s->body.data);
    curl_easy_setopt(s->easy, CURLOPT_POSTFIELDSIZE_LARGE,
                     (curl_off_t)s->body.len);
    curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(s->easy, CURLOPT_PRIVATE, s);
    curl_easy_setopt(s->easy, CURLOPT_ERRORBUFFER, s->curl_error);
    curl_easy_setopt(s->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->easy, CURLOPT_TCP_NODELAY, 1L);
    if (d->p.timeout_s > 0)
        curl_easy_setopt(s->easy, CURLOPT_TIMEOUT_MS,
                         (long)(d->p.timeout_s * 1e3));
    r->t_send_s = cinfer_bench_now_s();
    CURLMcode mc = curl_multi_add_handle(d->multi, s->easy);
    if (mc != CURLM_OK) {
        st = cinfer_set_error(CINFER_E_INTERNAL, "curl_multi_add_handle: %s",
                              curl_multi_strerror(mc));
        curl_easy_cleanup(s->easy);
        s->easy = NULL;
        goto fail;
    }
    /* Let the transfer begin now rather than at the next poll. */
    int running;
    curl_multi_perform(d->multi, &running);
    return CINFER_OK;

fail:
    stream_free(d, s);
    return st;
}

/* Finishes the transfers libcurl reports done; returns how many. */
static int reap(http_driver *d)
{
    int n = 0, left;
    CURLMsg *m;
    double t = cinfer_bench_now_s();
    for (;;) {
        m = curl_multi_info_read(d->multi, &left);
        if (!m)
            break;
        if (m->msg != CURLMSG_DONE)
            continue;
        char *priv = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
        http_stream *s = (http_stream *)priv;
        CURLcode rc = m->data.result;
        stream_finish(d, s, rc, t);
        n++;
    }
    return n;
}

static cinfer_status http_poll(cinfer_bench_driver *base, double timeout_s,
                               int *finished)
{
    http_driver *d = (http_driver *)base;
    int running;
    CURLMcode mc = curl_multi_perform(d->multi, &running);
    *finished = reap(d);
    if (*finished || mc != CURLM_OK)
        goto out;
    int ms = timeout_s > 0 ? (int)(timeout_s * 1e3 + 0.5) : 0;
    mc = curl_multi_poll(d->multi, NULL, 0, ms, NULL);
    if (mc == CURLM_OK)
        mc = curl_multi_perform(d->multi, &running);
    *finished += reap(d);
out:
    if (mc != CURLM_OK)
        return cinfer_set_error(CINFER_E_INTERNAL, "curl multi: %s",
                                curl_multi_strerror(mc));
    return CINFER_OK;
}

static void http_destroy(cinfer_bench_driver *base)
{
    http_driver *d = (http_driver *)base;
    if (!d)
        return;
    while (d->open) /* a run that stopped early */
        stream_free(d, d->open);
    curl_multi_cleanup(d->multi);
    free(d);
    curl_global_cleanup();
}

static const cinfer_bench_driver_ops http_ops = {
    http_start,
    http_poll,
    http_destroy,
};

cinfer_status cinfer_bench_http_create(const cinfer_bench_driver_params *p,
                                       cinfer_bench_driver **out)
{
    *out = NULL;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return cinfer_set_error(CINFER_E_INTERNAL, "curl_global_init failed");
    http_driver *d = calloc(1, sizeof *d);
    if (!d) {
        curl_global_cleanup();
        return cinfer_set_error(CINFER_E_NOMEM, "driver: out of memory");
    }
    d->base.ops = &http_ops;
    d->p = *p;
    const char *scheme = strstr(p->server, "://") ? "" : "http://";
    size_t len = strlen(p->server);
    while (len && p->server[len - 1] == '/')
        len--;
    if (strlen(scheme) + len + 1 > sizeof d->base_url - 32) {
        free(d);
        curl_global_cleanup();
        return cinfer_set_error(CINFER_E_INVALID_ARG, "server address too "
                                                      "long");
    }
    snprintf(d->base_url, sizeof d->base_url, "%s%.*s", scheme, (int)len,
             p->server);
    d->multi = curl_multi_init();
    if (!d->multi) {
        free(d);
        curl_global_cleanup();
        return cinfer_set_error(CINFER_E_NOMEM, "curl_multi_init failed");
    }
    /* Keep every stream's connection for the next request. */
    curl_multi_setopt(d->multi, CURLMOPT_MAXCONNECTS, 1024L);
    *out = &d->base;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* /v1/models                                                             */
/* ---------------------------------------------------------------------- */

static size_t on_body(char *data, size_t size, size_t nmemb, void *user)
{
    if (cinfer_bench_buf_append(user, data, size * nmemb) != CINFER_OK)
        return 0;
    return size * nmemb;
}

/* A number after `"key":` anywhere in s (the fields sit nested in the
 * reply; their names appear once). */
static long find_long(const char *s, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(s, pat);
    if (!p)
        return 0;
    return strtol(skip_ws(p + strlen(pat)), NULL, 10);
}

cinfer_status cinfer_bench_http_model_info(cinfer_bench_driver *base,
                                           double timeout_s,
                                           cinfer_bench_model_info *out)
{
    http_driver *d = (http_driver *)base;
    memset(out, 0, sizeof *out);
    CURL *e = curl_easy_init();
    if (!e)
        return cinfer_set_error(CINFER_E_NOMEM, "curl_easy_init failed");
    cinfer_bench_buf body = {0};
    char url[300], err[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s/v1/models", d->base_url);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    if (timeout_s > 0)
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1e3));
    CURLcode rc = curl_easy_perform(e);
    long code = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(e);
    cinfer_status st = CINFER_OK;
    if (rc != CURLE_OK) {
        st = cinfer_set_error(CINFER_E_UNAVAILABLE, "GET %s: %s", url,
                              err[0] ? err : curl_easy_strerror(rc));
    } else if (code != 200 || !body.data) {
        st = cinfer_set_error(CINFER_E_UNAVAILABLE, "GET %s: HTTP %ld", url,
                              code);
    } else {
        /* llama-server's meta, or cinfer's fields beside OpenAI's */
        out->vocab_size = (int)find_long(body.data, "n_vocab");
        if (!out->vocab_size)
            out->vocab_size = (int)find_long(body.data, "vocab_size");
        out->context_length = (int)find_long(body.data, "n_ctx");
        if (!out->context_length)
            out->context_length = (int)find_long(body.data, "max_model_len");
        const char *id = strstr(body.data, "\"id\":");
        if (id) {
            id = skip_ws(id + 5);
            const char *end = *id == '"' ? strchr(id + 1, '"') : NULL;
            if (end) {
                snprintf(out->model, sizeof out->model, "%.*s",
                         (int)(end - id - 1), id + 1);
                snprintf(d->model, sizeof d->model, "%.*s",
                         (int)(end - id - 1), id + 1);
            }
        }
    }
    cinfer_bench_buf_free(&body);
    return st;
}

#endif /* CINFER_HAVE_CURL */
