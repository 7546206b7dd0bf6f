/*
 * bench_stats.c - cinfer-bench's per-request records and what is computed
 * from them: vLLM's bench serve metrics, its text report and its JSON keys.
 *
 * Definitions (vLLM's, per completed request):
 *   TTFT  first token's arrival - the request's start
 *   E2EL  the stream's end - the request's start
 *   TPOT  (E2EL - TTFT) / (output tokens - 1), requests with >= 2 tokens
 *   ITL   the gap before each token after the first, over all requests.
 *         Tokens that arrive in one message (a server coalesces tokens
 *         while a send is in flight) count as arriving together: the first
 *         of them gets the gap, the rest 0, so mean ITL matches TPOT and
 *         coalescing shows as a spread between p50 and p99.
 * TTFT counts completed requests with at least one token. Percentiles
 * interpolate linearly between ranks (numpy's default); std is the
 * population standard deviation (numpy's default). Failed requests count
 * only as errors, by status name.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

/* ---------------------------------------------------------------------- */
/* Growing buffers                                                        */
/* ---------------------------------------------------------------------- */

static cinfer_status buf_reserve(cinfer_bench_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return CINFER_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d)
        return cinfer_set_error(CINFER_E_NOMEM, "buffer: out of memory");
    b->data = d;
    b->cap = cap;
    return CINFER_OK;
}

cinfer_status cinfer_bench_buf_append(cinfer_bench_buf *b, const char *s,
                                      size_t n)
{
    cinfer_status st = buf_reserve(b, n);
    if (st != CINFER_OK)
        return st;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return CINFER_OK;
}

cinfer_status cinfer_bench_buf_printf(cinfer_bench_buf *b, const char *fmt,
                                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return cinfer_set_error(CINFER_E_INTERNAL, "buffer: bad format");
    cinfer_status st = buf_reserve(b, (size_t)n);
    if (st != CINFER_OK)
        return st;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return CINFER_OK;
}

cinfer_status cinfer_bench_buf_json_string(cinfer_bench_buf *b,
                                           const char *s)
{
    cinfer_status st = cinfer_bench_buf_append(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s;
         st == CINFER_OK && *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            st = cinfer_bench_buf_append(b, e, 2);
        } else if (*p < 0x20) {
            st = cinfer_bench_buf_printf(b, "\\u%04x", *p);
        } else {
            st = cinfer_bench_buf_append(b, (const char *)p, 1);
        }
    }
    if (st == CINFER_OK)
        st = cinfer_bench_buf_append(b, "\"", 1);
    return st;
}

void cinfer_bench_buf_free(cinfer_bench_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---------------------------------------------------------------------- */
/* Driver parameters                                                      */
/* ---------------------------------------------------------------------- */

cinfer_bench_driver_params cinfer_bench_driver_default_params(void)
{
    cinfer_bench_driver_params p;
    memset(&p, 0, sizeof p);
    p.server = "127.0.0.1:50051";
    p.ignore_eos = 1;
    p.temperature = 0;
    p.timeout_s = 0;
    p.max_attempts = 1;
    p.retry_backoff_ms = 100;
    return p;
}

/* ---------------------------------------------------------------------- */
/* Request records                                                        */
/* ---------------------------------------------------------------------- */

void cinfer_bench_req_init(cinfer_bench_req *r, int index,
                           const cinfer_bench_item *item, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->index = index;
    r->item = item;
    r->seed = seed;
    r->input_tokens = item ? item->input_len : 0;
}

void cinfer_bench_req_cleanup(cinfer_bench_req *r)
{
    free(r->itl_ms);
    free(r->detail);
    r->itl_ms = NULL;
    r->detail = NULL;
    r->n_itl = r->cap_itl = 0;
}

cinfer_status cinfer_bench_req_tokens(cinfer_bench_req *r, int n, double t)
{
    if (n <= 0)
        return CINFER_OK;
    int gaps = r->output_tokens == 0 ? n - 1 : n;
    if (r->n_itl + gaps > r->cap_itl) {
        int cap = r->cap_itl ? r->cap_itl : 64;
        while (cap < r->n_itl + gaps)
            cap *= 2;
        double *d = realloc(r->itl_ms, (size_t)cap * sizeof *d);
        if (!d)
            return cinfer_set_error(CINFER_E_NOMEM, "itl: out of memory");
        r->itl_ms = d;
        r->cap_itl = cap;
    }
    if (r->output_tokens == 0) {
        r->t_first_s = t;
    } else {
        r->itl_ms[r->n_itl++] = (t - r->t_last_s) * 1e3;
        gaps--;
    }
    for (int i = 0; i < gaps; i++)
        r->itl_ms[r->n_itl++] = 0.0;
    r->t_last_s = t;
    r->output_tokens += n;
    return CINFER_OK;
}

void cinfer_bench_req_finish(cinfer_bench_req *r, double t, int ok,
                             const char *status, const char *detail)
{
    r->done = 1;
    r->ok = ok;
    r->t_end_s = t;
    snprintf(r->status, sizeof r->status, "%s", status);
    free(r->detail);
    r->detail = detail && detail[0] ? strdup(detail) : NULL;
}

/* ---------------------------------------------------------------------- */
/* Summary                                                                */
/* ---------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cinfer_bench_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0.0;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    if (lo >= n - 1)
        return sorted[n - 1];
    double frac = rank - (double)lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

/* Sorts v in place and describes it. */
static void describe(double *v, size_t n, cinfer_bench_dist *d)
{
    memset(d, 0, sizeof *d);
    d->n = n;
    if (n == 0)
        return;
    qsort(v, n, sizeof *v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    d->mean = sum / (double)n;
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (v[i] - d->mean) * (v[i] - d->mean);
    d->std = sqrt(ss / (double)n);
    d->median = cinfer_bench_percentile(v, n, 50);
    d->p90 = cinfer_bench_percentile(v, n, 90);
    d->p95 = cinfer_bench_percentile(v, n, 95);
    d->p99 = cinfer_bench_percentile(v, n, 99);
    d->min = v[0];
    d->max = v[n - 1];
}

static int cmp_errors(const void *a, const void *b)
{
    const cinfer_bench_error_count *x = a, *y = b;
    if (x->count != y->count)
        return y->count - x->count;
    return strcmp(x->name, y->name);
}

static double req_ttft_ms(const cinfer_bench_req *r)
{
    return r->output_tokens > 0 ? (r->t_first_s - r->t_send_s) * 1e3 : 0.0;
}

static double req_e2el_ms(const cinfer_bench_req *r)
{
    return (r->t_end_s - r->t_send_s) * 1e3;
}

static double req_tpot_ms(const cinfer_bench_req *r)
{
    if (r->output_tokens < 2)
        return 0.0;
    return (req_e2el_ms(r) - req_ttft_ms(r)) / (double)(r->output_tokens - 1);
}

cinfer_status cinfer_bench_summarize(const cinfer_bench_req *reqs, int n,
                                     double duration_s,
                                     const cinfer_bench_slo *slo,
                                     cinfer_bench_summary *out)
{
    memset(out, 0, sizeof *out);
    out->num_requests = n;
    out->duration_s = duration_s;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++)
        if (reqs[i].ok)
            n_itl += (size_t)reqs[i].n_itl;
    size_t nn = (size_t)n;
    double *ttft = malloc((nn ? nn : 1) * sizeof *ttft);
    double *tpot = malloc((nn ? nn : 1) * sizeof *tpot);
    double *e2el = malloc((nn ? nn : 1) * sizeof *e2el);
    double *itl = malloc((n_itl ? n_itl : 1) * sizeof *itl);
    cinfer_bench_error_count *errs = calloc(nn ? nn : 1, sizeof *errs);
    if (!ttft || !tpot || !e2el || !itl || !errs) {
        free(ttft);
        free(tpot);
        free(e2el);
        free(itl);
        free(errs);
        return cinfer_set_error(CINFER_E_NOMEM, "summary: out of memory");
    }
    int has_slo = slo && (slo->ttft_ms > 0 || slo->tpot_ms > 0 ||
                          slo->e2el_ms > 0);
    size_t n_ttft = 0, n_tpot = 0, n_e2el = 0, k_itl = 0;
    int n_err = 0;
    for (int i = 0; i < n; i++) {
        const cinfer_bench_req *r = &reqs[i];
        if (!r->done)
            continue;
        if (!r->ok) {
            out->failed++;
            int j = 0;
            while (j < n_err && strcmp(errs[j].name, r->status) != 0)
                j++;
            if (j == n_err) {
                snprintf(errs[j].name, sizeof errs[j].name, "%s", r->status);
                n_err++;
            }
            errs[j].count++;
            continue;
        }
        out->completed++;
        out->total_input_tokens += r->input_tokens;
        out->total_output_tokens += r->output_tokens;
        double t1 = req_ttft_ms(r), tp = req_tpot_ms(r), e = req_e2el_ms(r);
        if (r->output_tokens > 0)
            ttft[n_ttft++] = t1;
        if (r->output_tokens > 1)
            tpot[n_tpot++] = tp;
        e2el[n_e2el++] = e;
        for (int k = 0; k < r->n_itl; k++)
            itl[k_itl++] = r->itl_ms[k];
        if (has_slo && (slo->ttft_ms <= 0 || t1 <= slo->ttft_ms) &&
            (slo->tpot_ms <= 0 || tp <= slo->tpot_ms) &&
            (slo->e2el_ms <= 0 || e <= slo->e2el_ms))
            out->good++;
    }
    describe(ttft, n_ttft, &out->ttft_ms);
    describe(tpot, n_tpot, &out->tpot_ms);
    describe(itl, k_itl, &out->itl_ms);
    describe(e2el, n_e2el, &out->e2el_ms);
    free(ttft);
    free(tpot);
    free(e2el);
    free(itl);
    qsort(errs, (size_t)n_err, sizeof *errs, cmp_errors);
    out->errors = errs;
    out->n_errors = n_err;
    if (duration_s > 0) {
        out->request_throughput = out->completed / duration_s;
        out->output_throughput = (double)out->total_output_tokens / duration_s;
        out->total_token_throughput =
            (double)(out->total_input_tokens + out->total_output_tokens) /
            duration_s;
    }
    out->has_goodput = has_slo;
    if (has_slo && duration_s > 0)
        out->request_goodput = out->good / duration_s;
    return CINFER_OK;
}

void cinfer_bench_summary_cleanup(cinfer_bench_summary *s)
{
    free(s->errors);
    s->errors = NULL;
    s->n_errors = 0;
}

/* ---------------------------------------------------------------------- */
/* Text report                                                            */
/* ---------------------------------------------------------------------- */

static void banner(FILE *f, const char *title, char fill)
{
    int width = 50, tl = (int)strlen(title);
    int left = (width - tl) / 2, right = width - tl - left;
    for (int i = 0; i < left; i++)
        fputc(fill, f);
    fputs(title, f);
    for (int i = 0; i < right; i++)
        fputc(fill, f);
    fputc('\n', f);
}

static void line_d(FILE *f, const char *label, double v)
{
    fprintf(f, "%-40s %-10.2f\n", label, v);
}

static void line_i(FILE *f, const char *label, long long v)
{
    fprintf(f, "%-40s %-10lld\n", label, v);
}

static void dist_lines(FILE *f, const char *title, const char *abbr,
                       const cinfer_bench_dist *d)
{
    char label[64];
    banner(f, title, '-');
    snprintf(label, sizeof label, "Mean %s (ms):", abbr);
    line_d(f, label, d->mean);
    snprintf(label, sizeof label, "Median %s (ms):", abbr);
    line_d(f, label, d->median);
    snprintf(label, sizeof label, "P90 %s (ms):", abbr);
    line_d(f, label, d->p90);
    snprintf(label, sizeof label, "P99 %s (ms):", abbr);
    line_d(f, label, d->p99);
}

void cinfer_bench_print_report(FILE *f, const cinfer_bench_summary *s,
                               const char *title)
{
    char t[64];
    snprintf(t, sizeof t, " %s ", title);
    banner(f, t, '=');
    line_i(f, "Successful requests:", s->completed);
    line_i(f, "Failed requests:", s->failed);
    line_d(f, "Benchmark duration (s):", s->duration_s);
    line_i(f, "Total input tokens:", s->total_input_tokens);
    line_i(f, "Total generated tokens:", s->total_output_tokens);
    line_d(f, "Request throughput (req/s):", s->request_throughput);
    if (s->has_goodput)
        line_d(f, "Request goodput (req/s):", s->request_goodput);
    line_d(f, "Output token throughput (tok/s):", s->output_throughput);
    line_d(f, "Total Token throughput (tok/s):", s->total_token_throughput);
    dist_lines(f, "Time to First Token", "TTFT", &s->ttft_ms);
    dist_lines(f, "Time per Output Token (excl. 1st token)", "TPOT",
               &s->tpot_ms);
    dist_lines(f, "Inter-token Latency", "ITL", &s->itl_ms);
    dist_lines(f, "End-to-end Latency", "E2EL", &s->e2el_ms);
    if (s->n_errors > 0) {
        banner(f, "Errors", '-');
        for (int i = 0; i < s->n_errors; i++)
            fprintf(f, "%-40s %-10d\n", s->errors[i].name, s->errors[i].count);
    }
    banner(f, "", '=');
}

/* ---------------------------------------------------------------------- */
/* JSON                                                                   */
/* ---------------------------------------------------------------------- */

/* The shortest decimal that reads back as v (JSON has no NaN/inf: null). */
static cinfer_status json_num(cinfer_bench_buf *b, double v)
{
    if (!isfinite(v))
        return cinfer_bench_buf_append(b, "null", 4);
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    return cinfer_bench_buf_append(b, tmp, strlen(tmp));
}

typedef struct {
    cinfer_bench_buf *b;
    int first;
    cinfer_status st;
} json_obj;

static void key(json_obj *o, const char *k)
{
    if (o->st != CINFER_OK)
        return;
    o->st = cinfer_bench_buf_append(o->b, o->first ? "\n  " : ",\n  ",
                                    o->first ? 3 : 4);
    o->first = 0;
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_json_string(o->b, k);
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_append(o->b, ": ", 2);
}

static void kv_num(json_obj *o, const char *k, double v)
{
    key(o, k);
    if (o->st == CINFER_OK)
        o->st = json_num(o->b, v);
}

static void kv_int(json_obj *o, const char *k, long long v)
{
    key(o, k);
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_printf(o->b, "%lld", v);
}

static void kv_str(json_obj *o, const char *k, const char *v)
{
    key(o, k);
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_json_string(o->b, v);
}

static void kv_raw(json_obj *o, const char *k, const char *v)
{
    key(o, k);
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_append(o->b, v, strlen(v));
}

static void kv_dist(json_obj *o, const char *metric,
                    const cinfer_bench_dist *d)
{
    static const char *const stat[] = {"mean", "median", "std", "p50",
                                       "p90",  "p95",    "p99"};
    const double v[] = {d->mean, d->median, d->std, d->median,
                        d->p90,  d->p95,    d->p99};
    for (size_t i = 0; i < sizeof stat / sizeof stat[0]; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s_%s_ms", stat[i], metric);
        kv_num(o, k, v[i]);
    }
}

/* A per-request array: value(r) for every request, in workload order. */
static void kv_array(json_obj *o, const char *k, const cinfer_bench_req *reqs,
                     int n, double (*value)(const cinfer_bench_req *))
{
    key(o, k);
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_append(o->b, "[", 1);
    for (int i = 0; i < n && o->st == CINFER_OK; i++) {
        if (i)
            o->st = cinfer_bench_buf_append(o->b, ", ", 2);
        if (o->st == CINFER_OK)
            o->st = json_num(o->b, value(&reqs[i]));
    }
    if (o->st == CINFER_OK)
        o->st = cinfer_bench_buf_append(o->b, "]", 1);
}

static double v_input(const cinfer_bench_req *r) { return r->input_tokens; }
static double v_output(const cinfer_bench_req *r) { return r->output_tokens; }
static double v_ttft_s(const cinfer_bench_req *r) { return req_ttft_ms(r) / 1e3; }
static double v_e2el_s(const cinfer_bench_req *r) { return req_e2el_ms(r) / 1e3; }
static double v_start_s(const cinfer_bench_req *r) { return r->t_send_s; }

cinfer_status cinfer_bench_write_json(FILE *f, const cinfer_bench_summary *s,
                                      const cinfer_bench_run_info *info,
                                      const cinfer_bench_req *reqs, int n)
{
    cinfer_bench_buf b = {0};
    json_obj o = {&b, 1, CINFER_OK};
    o.st = cinfer_bench_buf_append(&b, "{", 1);

    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
    kv_str(&o, "date", date);
    kv_str(&o, "backend", info->backend);
    kv_str(&o, "server", info->server);
    kv_str(&o, "model_id", info->model_id ? info->model_id : "");
    kv_int(&o, "num_prompts", s->num_requests);
    if (info->request_rate > 0)
        kv_num(&o, "request_rate", info->request_rate);
    else
        kv_str(&o, "request_rate", "inf");
    kv_num(&o, "burstiness", info->burstiness);
    if (info->max_concurrency > 0)
        kv_int(&o, "max_concurrency", info->max_concurrency);
    else
        kv_raw(&o, "max_concurrency", "null");
    kv_int(&o, "input_len", info->input_len);
    kv_int(&o, "output_len", info->output_len);
    kv_num(&o, "range_ratio", info->range_ratio);
    kv_int(&o, "seed", (long long)info->seed);
    kv_raw(&o, "ignore_eos", info->ignore_eos ? "true" : "false");
    kv_num(&o, "temperature", info->temperature);
    /* gRPC core does not tell its client how many attempts a call took,
     * so the policy's bound is what the run can state. */
    kv_int(&o, "max_attempts",
           info->max_attempts > 1 ? info->max_attempts : 1);
    kv_num(&o, "duration", s->duration_s);
    kv_int(&o, "completed", s->completed);
    kv_int(&o, "failed", s->failed);
    kv_int(&o, "total_input_tokens", s->total_input_tokens);
    kv_int(&o, "total_output_tokens", s->total_output_tokens);
    kv_num(&o, "request_throughput", s->request_throughput);
    if (s->has_goodput)
        kv_num(&o, "request_goodput", s->request_goodput);
    else
        kv_raw(&o, "request_goodput", "null");
    if (info->slo && s->has_goodput) {
        key(&o, "goodput_slo_ms");
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_printf(
                &b, "{\"ttft\": %.17g, \"tpot\": %.17g, \"e2el\": %.17g}",
                info->slo->ttft_ms, info->slo->tpot_ms, info->slo->e2el_ms);
    }
    kv_num(&o, "output_throughput", s->output_throughput);
    kv_num(&o, "total_token_throughput", s->total_token_throughput);
    kv_dist(&o, "ttft", &s->ttft_ms);
    kv_dist(&o, "tpot", &s->tpot_ms);
    kv_dist(&o, "itl", &s->itl_ms);
    kv_dist(&o, "e2el", &s->e2el_ms);

    key(&o, "errors");
    if (o.st == CINFER_OK)
        o.st = cinfer_bench_buf_append(&b, "{", 1);
    for (int i = 0; i < s->n_errors && o.st == CINFER_OK; i++) {
        if (i)
            o.st = cinfer_bench_buf_append(&b, ", ", 2);
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_json_string(&b, s->errors[i].name);
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_printf(&b, ": %d", s->errors[i].count);
    }
    if (o.st == CINFER_OK)
        o.st = cinfer_bench_buf_append(&b, "}", 1);

    if (info->detailed) {
        kv_array(&o, "input_lens", reqs, n, v_input);
        kv_array(&o, "output_lens", reqs, n, v_output);
        kv_array(&o, "ttfts", reqs, n, v_ttft_s);
        kv_array(&o, "e2els", reqs, n, v_e2el_s);
        kv_array(&o, "start_times", reqs, n, v_start_s);
        key(&o, "itls");
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_append(&b, "[", 1);
        for (int i = 0; i < n && o.st == CINFER_OK; i++) {
            o.st = cinfer_bench_buf_append(&b, i ? ", [" : "[", i ? 3 : 1);
            for (int k = 0; k < reqs[i].n_itl && o.st == CINFER_OK; k++) {
                if (k)
                    o.st = cinfer_bench_buf_append(&b, ", ", 2);
                if (o.st == CINFER_OK)
                    o.st = json_num(&b, reqs[i].itl_ms[k] / 1e3);
            }
            if (o.st == CINFER_OK)
                o.st = cinfer_bench_buf_append(&b, "]", 1);
        }
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_append(&b, "]", 1);
        key(&o, "statuses");
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_append(&b, "[", 1);
        for (int i = 0; i < n && o.st == CINFER_OK; i++) {
            if (i)
                o.st = cinfer_bench_buf_append(&b, ", ", 2);
            if (o.st == CINFER_OK)
                o.st = cinfer_bench_buf_json_string(
                    &b, reqs[i].done ? reqs[i].status : "NOT_RUN");
        }
        if (o.st == CINFER_OK)
            o.st = cinfer_bench_buf_append(&b, "]", 1);
    }
    if (o.st == CINFER_OK)
        o.st = cinfer_bench_buf_append(&b, "\n}\n", 3);
    cinfer_status st = o.st;
    if (st == CINFER_OK && fwrite(b.data, 1, b.len, f) != b.len)
        st = cinfer_set_error(CINFER_E_IO, "json: write failed");
    cinfer_bench_buf_free(&b);
    return st;
}
