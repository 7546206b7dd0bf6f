/*
 * test_server_metrics.c - Prometheus metrics (server/metrics.c): counts
 * recorded from several threads, the text exposition format checked line by
 * line by a parser in this file, histogram invariants, label escaping and
 * bounds, the collector's gauges, process metrics, and the HTTP listener
 * fetched over a plain socket.
 *
 * The parser is strict about what the format allows: metric and label
 * names, label values with only \\, \" and \n escapes, one TYPE and HELP
 * per family before its samples, families not interleaved, histograms with
 * increasing `le`, non-decreasing cumulative counts, a last +Inf bucket
 * equal to _count, and a _sum.
 */
#define _GNU_SOURCE /* strcasestr */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "server/metrics.h"

/* ------------------------------------------------------------------------ */
/* Exposition parser                                                        */
/* ------------------------------------------------------------------------ */

#define MAX_SAMPLES 1024
#define MAX_FAMILIES 128

typedef struct {
    char name[128];
    char labels[512]; /* canonical: k="unescaped",k2="..." in input order,
                         without le */
    char le[32];      /* the le label of a _bucket sample, else "" */
    double value;
} sample;

typedef struct {
    char name[128];
    char type[16];
    int has_help, has_type, has_samples, closed;
} family;

typedef struct {
    sample s[MAX_SAMPLES];
    int n;
    family f[MAX_FAMILIES];
    int nf;
    int errors;
} parsed;

static void perr(parsed *p, int line, const char *what, const char *text)
{
    fprintf(stderr, "exposition line %d: %s: %.120s\n", line, what, text);
    p->errors++;
}

static int is_name_start(char c, int colon_ok)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (colon_ok && c == ':');
}

static int is_name_char(char c, int colon_ok)
{
    return is_name_start(c, colon_ok) || (c >= '0' && c <= '9');
}

/* Reads a metric (colon_ok) or label name; returns its length, 0 if none. */
static size_t read_name(const char *s, int colon_ok, char *out, size_t cap)
{
    size_t n = 0;
    if (!is_name_start(s[0], colon_ok))
        return 0;
    while (is_name_char(s[n], colon_ok))
        n++;
    if (n >= cap)
        return 0;
    memcpy(out, s, n);
    out[n] = '\0';
    return n;
}

static int parse_value(const char *s, double *v)
{
    if (strcmp(s, "+Inf") == 0) {
        *v = INFINITY;
        return 1;
    }
    if (strcmp(s, "-Inf") == 0) {
        *v = -INFINITY;
        return 1;
    }
    if (strcmp(s, "NaN") == 0) {
        *v = NAN;
        return 1;
    }
    char *end = NULL;
    if (!*s)
        return 0;
    *v = strtod(s, &end);
    return *end == '\0' &&
           !(s[0] == 'i' || s[0] == 'I' || s[0] == 'n' || s[0] == 'N');
}

static family *find_family(parsed *p, const char *name)
{
    for (int i = 0; i < p->nf; i++) {
        if (strcmp(p->f[i].name, name) == 0)
            return &p->f[i];
    }
    return NULL;
}

static family *add_family(parsed *p, const char *name)
{
    family *f = find_family(p, name);
    if (f)
        return f;
    if (p->nf == MAX_FAMILIES)
        return NULL;
    f = &p->f[p->nf++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

/* The family a sample belongs to: its own name, or for histograms its name
 * without _bucket, _sum or _count. */
static family *sample_family(parsed *p, const char *name)
{
    family *f = find_family(p, name);
    if (f && f->has_type)
        return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(name), k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0) {
            char base[128];
            snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
            f = find_family(p, base);
            if (f && f->has_type && strcmp(f->type, "histogram") == 0)
                return f;
        }
    }
    return NULL;
}

static void parse_comment(parsed *p, int ln, const char *line, family **current)
{
    char name[128];
    int help = strncmp(line, "# HELP ", 7) == 0;
    int type = strncmp(line, "# TYPE ", 7) == 0;
    if (!help && !type)
        return; /* a plain comment */
    size_t n = read_name(line + 7, 1, name, sizeof name);
    if (!n || (line[7 + n] != ' ' && line[7 + n] != '\0')) {
        perr(p, ln, "bad name in comment", line);
        return;
    }
    family *f = add_family(p, name);
    if (!f) {
        perr(p, ln, "too many families", line);
        return;
    }
    if (f->closed || f->has_samples)
        perr(p, ln, "HELP/TYPE after the family's samples", line);
    if (*current && *current != f)
        (*current)->closed = (*current)->has_samples;
    *current = f;
    const char *rest = line + 7 + n;
    if (*rest == ' ')
        rest++;
    if (help) {
        if (f->has_help)
            perr(p, ln, "second HELP", line);
        f->has_help = 1;
        /* In HELP only \\ and \n are escapes. */
        for (const char *c = rest; *c; c++) {
            if (*c == '\\') {
                if (c[1] != '\\' && c[1] != 'n')
                    perr(p, ln, "bad escape in HELP", line);
                c++;
            }
        }
    } else {
        if (f->has_type)
            perr(p, ln, "second TYPE", line);
        f->has_type = 1;
        if (strcmp(rest, "counter") && strcmp(rest, "gauge") &&
            strcmp(rest, "histogram") && strcmp(rest, "summary") &&
            strcmp(rest, "untyped"))
            perr(p, ln, "unknown TYPE", line);
        snprintf(f->type, sizeof f->type, "%s", rest);
    }
}

static void parse_sample(parsed *p, int ln, const char *line, family **current)
{
    if (p->n == MAX_SAMPLES) {
        perr(p, ln, "too many samples", line);
        return;
    }
    sample *s = &p->s[p->n];
    memset(s, 0, sizeof *s);
    size_t n = read_name(line, 1, s->name, sizeof s->name);
    if (!n) {
        perr(p, ln, "bad metric name", line);
        return;
    }
    const char *c = line + n;
    size_t lab = 0;
    if (*c == '{') {
        c++;
        while (*c != '}') {
            char lname[64];
            size_t k = read_name(c, 0, lname, sizeof lname);
            if (!k || c[k] != '=' || c[k + 1] != '"') {
                perr(p, ln, "bad label name", line);
                return;
            }
            c += k + 2;
            char val[256];
            size_t vn = 0;
            while (*c && *c != '"') {
                char ch = *c;
                if (ch == '\\') {
                    c++;
                    if (*c == '\\')
                        ch = '\\';
                    else if (*c == '"')
                        ch = '"';
                    else if (*c == 'n')
                        ch = '\n';
                    else {
                        perr(p, ln, "bad escape in label value", line);
                        return;
                    }
                } else if (ch == '\n') {
                    perr(p, ln, "raw line feed in label value", line);
                    return;
                }
                if (vn + 1 < sizeof val)
                    val[vn++] = ch;
                c++;
            }
            val[vn] = '\0';
            if (*c != '"') {
                perr(p, ln, "unterminated label value", line);
                return;
            }
            c++;
            if (strcmp(lname, "le") == 0) {
                snprintf(s->le, sizeof s->le, "%.31s", val);
            } else {
                int w = snprintf(s->labels + lab, sizeof s->labels - lab,
                                 "%s%s=\"%s\"", lab ? "," : "", lname, val);
                if (w > 0)
                    lab += (size_t)w;
            }
            if (*c == ',')
                c++;
            else if (*c != '}') {
                perr(p, ln, "expected , or } after a label", line);
                return;
            }
        }
        c++;
    }
    if (*c != ' ') {
        perr(p, ln, "expected a space before the value", line);
        return;
    }
    c++;
    if (strchr(c, ' ')) {
        perr(p, ln, "unexpected text (timestamp?) after the value", line);
        return;
    }
    if (!parse_value(c, &s->value)) {
        perr(p, ln, "bad value", line);
        return;
    }
    family *f = sample_family(p, s->name);
    if (!f) {
        perr(p, ln, "sample without a TYPE", line);
        return;
    }
    if (f != *current || f->closed)
        perr(p, ln, "family's samples are not contiguous", line);
    f->has_samples = 1;
    if (strcmp(f->type, "histogram") == 0) {
        size_t nl = strlen(s->name);
        int bucket = nl > 7 && strcmp(s->name + nl - 7, "_bucket") == 0;
        if (bucket != (s->le[0] != '\0'))
            perr(p, ln, "le label only and always on _bucket", line);
    }
    if (strcmp(f->type, "counter") == 0 && !(s->value >= 0))
        perr(p, ln, "negative counter", line);
    p->n++;
}

/* Parses the whole text into p; returns p->errors. Also checks every
 * histogram's buckets against its _count and _sum. */
static int parse_exposition(const char *text, parsed *p)
{
    memset(p, 0, sizeof *p);
    family *current = NULL;
    int ln = 0;
    const char *c = text;
    if (!text) {
        p->errors = 1;
        return 1;
    }
    while (*c) {
        const char *nl = strchr(c, '\n');
        if (!nl) {
            perr(p, ln + 1, "last line without a line feed", c);
            break;
        }
        char line[1024];
        size_t len = (size_t)(nl - c);
        ln++;
        if (len >= sizeof line) {
            perr(p, ln, "line too long", c);
            c = nl + 1;
            continue;
        }
        memcpy(line, c, len);
        line[len] = '\0';
        c = nl + 1;
        if (len == 0)
            continue;
        if (line[0] == '#')
            parse_comment(p, ln, line, &current);
        else
            parse_sample(p, ln, line, &current);
    }
    for (int i = 0; i < p->nf; i++) {
        family *f = &p->f[i];
        if (!f->has_type || !f->has_help)
            perr(p, 0, "family without TYPE or HELP", f->name);
        if (strcmp(f->type, "histogram") != 0)
            continue;
        char bname[160], cname[160], sname[160];
        snprintf(bname, sizeof bname, "%s_bucket", f->name);
        snprintf(cname, sizeof cname, "%s_count", f->name);
        snprintf(sname, sizeof sname, "%s_sum", f->name);
        /* One series per label set (this module's histograms have none
         * besides le, but the check does not assume so). */
        for (int j = 0; j < p->n; j++) {
            if (strcmp(p->s[j].name, cname) != 0)
                continue;
            const char *labels = p->s[j].labels;
            double prev_le = -INFINITY, prev_count = 0, inf_count = -1;
            int nb = 0, has_sum = 0;
            for (int k = 0; k < p->n; k++) {
                const sample *s = &p->s[k];
                if (strcmp(s->labels, labels) != 0)
                    continue;
                if (strcmp(s->name, sname) == 0)
                    has_sum = 1;
                if (strcmp(s->name, bname) != 0)
                    continue;
                double le;
                if (!parse_value(s->le, &le) || !(le > prev_le))
                    perr(p, 0, "le not increasing", bname);
                if (s->value < prev_count)
                    perr(p, 0, "bucket counts decrease", bname);
                prev_le = le;
                prev_count = s->value;
                if (isinf(le) && le > 0)
                    inf_count = s->value;
                nb++;
            }
            if (nb < 2 || !isinf(prev_le))
                perr(p, 0, "histogram does not end with le=\"+Inf\"", bname);
            if (inf_count != p->s[j].value)
                perr(p, 0, "+Inf bucket differs from _count", bname);
            if (!has_sum)
                perr(p, 0, "histogram without _sum", f->name);
        }
    }
    return p->errors;
}

/* The value of the sample with this name, labels (canonical form, without
 * le) and le ("" for none); NAN if absent. */
static double get(const parsed *p, const char *name, const char *labels,
                  const char *le)
{
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->s[i].name, name) == 0 &&
            strcmp(p->s[i].labels, labels ? labels : "") == 0 &&
            strcmp(p->s[i].le, le ? le : "") == 0)
            return p->s[i].value;
    }
    return NAN;
}

static int count_samples(const parsed *p, const char *name)
{
    int n = 0;
    for (int i = 0; i < p->n; i++)
        n += strcmp(p->s[i].name, name) == 0;
    return n;
}

static parsed g_parsed; /* large; one at a time */

/* The canonical labels of a per-request series of each front end. */
#define FE_GRPC "frontend=\"grpc\""
#define FE_OPENAI "frontend=\"openai\""

static cinfer_metrics *make(const char *listen)
{
    cinfer_metrics_params p = cinfer_metrics_default_params();
    p.listen = listen;
    cinfer_metrics *m = NULL;
    CHECK_OK(cinfer_metrics_create(&p, &m));
    return m;
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

static void test_null_is_off(void)
{
    cinfer_metrics_request_done(NULL, CINFER_FRONTEND_GRPC, "Generate", 0);
    cinfer_metrics_observe(NULL, CINFER_FRONTEND_GRPC, CINFER_HIST_TTFT, 0.1);
    cinfer_metrics_add_tokens(NULL, CINFER_FRONTEND_GRPC, 1, 2);
    cinfer_metrics_rejected(NULL, CINFER_FRONTEND_GRPC, "breaker_open");
    cinfer_metrics_set_collector(NULL, NULL, NULL);
    CHECK(cinfer_metrics_render(NULL) == NULL);
    CHECK_EQ_INT(cinfer_metrics_port(NULL), 0);
    cinfer_metrics_destroy(NULL);
    CHECK_EQ_STR(cinfer_metrics_default_params().listen, "127.0.0.1:9090");
    CHECK_EQ_INT(cinfer_metrics_create(NULL, NULL), CINFER_E_INVALID_ARG);
}

static void test_render_fresh(void)
{
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    CHECK_EQ_INT(cinfer_metrics_port(m), 0);
    char *text = cinfer_metrics_render(m);
    CHECK(text != NULL);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    CHECK(strstr(text, "# TYPE cinfer:request_total counter\n") != NULL);
    CHECK(strstr(text, "# TYPE cinfer:rejected_requests_total counter\n"));
    CHECK_EQ_INT(count_samples(p, "cinfer:request_total"), 0);
    CHECK_EQ_INT(get(p, "cinfer:prompt_tokens_total", FE_GRPC, ""), 0);
    CHECK_EQ_INT(get(p, "cinfer:generation_tokens_total", FE_GRPC, ""), 0);
    static const char *const hists[] = {"cinfer:time_to_first_token_seconds",
                                        "cinfer:inter_token_latency_seconds",
                                        "cinfer:e2e_request_latency_seconds",
                                        "cinfer:request_queue_time_seconds",
                                        "cinfer:rejection_latency_seconds"};
    for (int i = 0; i < 5; i++) {
        family *f = find_family(&g_parsed, hists[i]);
        CHECK(f != NULL && strcmp(f->type, "histogram") == 0);
        char name[128];
        snprintf(name, sizeof name, "%s_count", hists[i]);
        CHECK_EQ_INT(get(p, name, FE_GRPC, ""), 0);
        snprintf(name, sizeof name, "%s_sum", hists[i]);
        CHECK_EQ_INT(get(p, name, FE_GRPC, ""), 0);
        snprintf(name, sizeof name, "%s_bucket", hists[i]);
        CHECK(count_samples(p, name) >= 10);
    }
    /* The bucket ranges the module promises. */
    CHECK_EQ_INT(
        get(p, "cinfer:time_to_first_token_seconds_bucket", FE_GRPC, "0.001"),
        0);
    CHECK_EQ_INT(
        get(p, "cinfer:time_to_first_token_seconds_bucket", FE_GRPC, "60"), 0);
    CHECK_EQ_INT(
        get(p, "cinfer:inter_token_latency_seconds_bucket", FE_GRPC, "2.5"), 0);
    CHECK_EQ_INT(
        get(p, "cinfer:e2e_request_latency_seconds_bucket", FE_GRPC, "300"), 0);
    CHECK_EQ_INT(
        get(p, "cinfer:rejection_latency_seconds_bucket", FE_GRPC, "0.0001"),
        0);
    /* No collector: the collector's gauges are absent. */
    CHECK(find_family(&g_parsed, "cinfer:num_requests_running") == NULL);
    free(text);
    cinfer_metrics_destroy(m);
}

/* ---- recording from several threads --------------------------------- */

#define N_THREADS 4
#define N_PER_THREAD 20000

static const int codes[3] = {0, 8,
                             14}; /* OK, RESOURCE_EXHAUSTED, UNAVAILABLE */
/* TTFT observations: on a bound, between bounds, past the last bound, and
 * negative (counted as 0). */
static const double ttft_values[4] = {0.001, 0.0015, 0.5, 100.0};

static void *record_thread(void *arg)
{
    cinfer_metrics *m = arg;
    for (int i = 0; i < N_PER_THREAD; i++) {
        cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC,
                                    (i & 1) ? "Generate" : "Tokenize",
                                    codes[i % 3]);
        cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_TTFT,
                               ttft_values[i % 4]);
        cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_ITL, 0.02);
        cinfer_metrics_add_tokens(m, CINFER_FRONTEND_GRPC, 3, 5);
        if (i % 10 == 0)
            cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC,
                                    (i % 20) ? "shed_codel"
                                             : "rate_limited_global");
    }
    return NULL;
}

static void test_threads_record_exact(void)
{
    cinfer_metrics *m = make("");
    if (!m)
        return;
    pthread_t th[N_THREADS];
    for (int t = 0; t < N_THREADS; t++)
        pthread_create(&th[t], NULL, record_thread, m);
    for (int t = 0; t < N_THREADS; t++)
        pthread_join(th[t], NULL);
    char *text = cinfer_metrics_render(m);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;

    /* Expected counts, from the same loop run once. */
    long long req[2][3] = {{0}}, ttft_in[4] = {0};
    long long rl = 0, codel = 0;
    for (int i = 0; i < N_PER_THREAD; i++) {
        req[i & 1][i % 3] += N_THREADS;
        ttft_in[i % 4] += N_THREADS;
        if (i % 10 == 0) {
            if (i % 20)
                codel += N_THREADS;
            else
                rl += N_THREADS;
        }
    }
    static const char *const code_names[3] = {"OK", "RESOURCE_EXHAUSTED",
                                              "UNAVAILABLE"};
    for (int meth = 0; meth < 2; meth++) {
        for (int c = 0; c < 3; c++) {
            char labels[128];
            snprintf(labels, sizeof labels,
                     "frontend=\"grpc\",method=\"%s\",code=\"%s\"",
                     meth ? "Generate" : "Tokenize", code_names[c]);
            CHECK_EQ_INT(get(p, "cinfer:request_total", labels, ""),
                         req[meth][c]);
        }
    }
    CHECK_EQ_INT(count_samples(p, "cinfer:request_total"), 6);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total",
                     "frontend=\"grpc\",reason=\"rate_limited_global\"", ""),
                 rl);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total",
                     "frontend=\"grpc\",reason=\"shed_codel\"", ""),
                 codel);
    long long total = (long long)N_THREADS * N_PER_THREAD;
    CHECK_EQ_INT(get(p, "cinfer:prompt_tokens_total", FE_GRPC, ""), 3 * total);
    CHECK_EQ_INT(get(p, "cinfer:generation_tokens_total", FE_GRPC, ""),
                 5 * total);

    const char *b = "cinfer:time_to_first_token_seconds_bucket";
    /* 0.001 is on the first bound (le is inclusive). */
    CHECK_EQ_INT(get(p, b, FE_GRPC, "0.001"), ttft_in[0]);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "0.0025"), ttft_in[0] + ttft_in[1]);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "0.25"), ttft_in[0] + ttft_in[1]);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "0.5"),
                 ttft_in[0] + ttft_in[1] + ttft_in[2]);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "60"),
                 ttft_in[0] + ttft_in[1] + ttft_in[2]);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "+Inf"), total);
    CHECK_EQ_INT(
        get(p, "cinfer:time_to_first_token_seconds_count", FE_GRPC, ""), total);
    double sum = 0;
    for (int k = 0; k < 4; k++)
        sum += (double)ttft_in[k] * ttft_values[k];
    CHECK_NEAR(get(p, "cinfer:time_to_first_token_seconds_sum", FE_GRPC, ""),
               sum, sum * 1e-9);
    CHECK_EQ_INT(
        get(p, "cinfer:inter_token_latency_seconds_bucket", FE_GRPC, "0.015"),
        0);
    CHECK_EQ_INT(
        get(p, "cinfer:inter_token_latency_seconds_bucket", FE_GRPC, "0.02"),
        total);
    CHECK_NEAR(get(p, "cinfer:inter_token_latency_seconds_sum", FE_GRPC, ""),
               0.02 * (double)total, 0.02 * (double)total * 1e-9);
    free(text);
    cinfer_metrics_destroy(m);
}

static void test_observe_edges(void)
{
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_E2E,
                           -1.0); /* counted as 0 */
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_E2E,
                           NAN); /* ignored */
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_E2E, 300.0);
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_E2E,
                           300.0000001);
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, (cinfer_hist)-1,
                           1.0); /* ignored */
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_COUNT_,
                           1.0); /* ignored */
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_REJECT, 0.0001);
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_REJECT,
                           0.00011);
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_QUEUE, 0.1);
    char *text = cinfer_metrics_render(m);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    const char *e = "cinfer:e2e_request_latency_seconds_bucket";
    CHECK_EQ_INT(get(p, e, FE_GRPC, "0.01"), 1);
    CHECK_EQ_INT(get(p, e, FE_GRPC, "240"), 1);
    CHECK_EQ_INT(get(p, e, FE_GRPC, "300"), 2);
    CHECK_EQ_INT(get(p, e, FE_GRPC, "+Inf"), 3);
    CHECK_NEAR(get(p, "cinfer:e2e_request_latency_seconds_sum", FE_GRPC, ""),
               600.0000001, 1e-9);
    const char *r = "cinfer:rejection_latency_seconds_bucket";
    CHECK_EQ_INT(get(p, r, FE_GRPC, "0.0001"), 1);
    CHECK_EQ_INT(get(p, r, FE_GRPC, "0.00025"), 2);
    CHECK_EQ_INT(
        get(p, "cinfer:request_queue_time_seconds_bucket", FE_GRPC, "0.08"), 0);
    CHECK_EQ_INT(
        get(p, "cinfer:request_queue_time_seconds_bucket", FE_GRPC, "0.1"), 1);
    CHECK_EQ_INT(get(p, "cinfer:request_queue_time_seconds_count", FE_GRPC, ""),
                 1);
    CHECK_EQ_INT(
        get(p, "cinfer:time_to_first_token_seconds_count", FE_GRPC, ""), 0);
    free(text);
    cinfer_metrics_destroy(m);
}

static void test_label_escaping(void)
{
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    const char *odd = "we\"ird\\name\nx";
    cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, odd, 0);
    cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, NULL,
                                99); /* unknown method and code */
    cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, "", -1);
    cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC, NULL);
    cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC, "a}b,c=\"d\"");
    char *text = cinfer_metrics_render(m);
    CHECK(strstr(text, "cinfer:request_total{frontend=\"grpc\",method="
                       "\"we\\\"ird\\\\name\\nx\","
                       "code=\"OK\"} 1\n") != NULL);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    char labels[128];
    snprintf(labels, sizeof labels,
             "frontend=\"grpc\",method=\"%s\",code=\"OK\"", odd);
    CHECK_EQ_INT(get(p, "cinfer:request_total", labels, ""), 1);
    CHECK_EQ_INT(get(p, "cinfer:request_total",
                     "frontend=\"grpc\",method=\"unknown\",code=\"UNKNOWN\"",
                     ""),
                 2);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total",
                     "frontend=\"grpc\",reason=\"unknown\"", ""),
                 1);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total",
                     "frontend=\"grpc\",reason=\"a}b,c=\"d\"\"", ""),
                 1);
    free(text);
    cinfer_metrics_destroy(m);
}

/* A client controls the method path: the label set stays bounded, nothing
 * is lost, and long names are cut. */
static void test_label_table_bounded(void)
{
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    char name[256];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "/evil.Service/Method%d", i);
        cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, name, 12);
    }
    memset(name, 'x', 200);
    name[200] = '\0';
    cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC, name);
    char *text = cinfer_metrics_render(m);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    int n = count_samples(p, "cinfer:request_total");
    CHECK(n <= 32 && n >= 2);
    double total = 0;
    for (int i = 0; i < p->n; i++) {
        if (strcmp(p->s[i].name, "cinfer:request_total") == 0)
            total += p->s[i].value;
    }
    CHECK_EQ_INT(total, 1000);
    CHECK(get(p, "cinfer:request_total",
              "frontend=\"grpc\",method=\"other\",code=\"UNIMPLEMENTED\"",
              "") > 900);
    char labels[128];
    snprintf(labels, sizeof labels, "frontend=\"grpc\",reason=\"%.64s\"", name);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total", labels, ""), 1);
    free(text);
    cinfer_metrics_destroy(m);
}

/* ---- front ends ------------------------------------------------------ */

/* Each front end's calls count in the same families under their own
 * frontend label; a sum over the label is the total; a fresh server shows
 * both front ends' histograms at zero. */
static void test_frontends(void)
{
    CHECK_EQ_STR(cinfer_frontend_name(CINFER_FRONTEND_GRPC), "grpc");
    CHECK_EQ_STR(cinfer_frontend_name(CINFER_FRONTEND_OPENAI), "openai");
    CHECK_EQ_STR(cinfer_frontend_name((cinfer_frontend)7), "grpc");
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    char *text = cinfer_metrics_render(m);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    CHECK_EQ_INT(get(&g_parsed, "cinfer:time_to_first_token_seconds_count",
                     FE_OPENAI, ""),
                 0);
    CHECK_EQ_INT(get(&g_parsed, "cinfer:rejection_latency_seconds_bucket",
                     FE_OPENAI, "+Inf"),
                 0);
    CHECK_EQ_INT(get(&g_parsed, "cinfer:prompt_tokens_total", FE_OPENAI, ""),
                 0);
    free(text);

    for (int i = 0; i < 3; i++)
        cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, "Generate", 0);
    cinfer_metrics_request_done(m, CINFER_FRONTEND_OPENAI,
                                "/v1/chat/completions", 0);
    cinfer_metrics_request_done(m, CINFER_FRONTEND_OPENAI,
                                "/v1/chat/completions", 8);
    cinfer_metrics_request_done(m, CINFER_FRONTEND_OPENAI, "/v1/completions",
                                0);
    cinfer_metrics_request_done(m, (cinfer_frontend)-1, "Generate", 0);
    cinfer_metrics_rejected(m, CINFER_FRONTEND_OPENAI, "rate_limited_global");
    cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC, "rate_limited_global");
    cinfer_metrics_rejected(m, CINFER_FRONTEND_GRPC, "rate_limited_global");
    cinfer_metrics_observe(m, CINFER_FRONTEND_OPENAI, CINFER_HIST_TTFT, 0.03);
    cinfer_metrics_observe(m, CINFER_FRONTEND_OPENAI, CINFER_HIST_TTFT, 0.07);
    cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_TTFT, 0.5);
    cinfer_metrics_observe(m, CINFER_FRONTEND_OPENAI, CINFER_HIST_REJECT,
                           0.0002);
    cinfer_metrics_add_tokens(m, CINFER_FRONTEND_OPENAI, 10, 4);
    cinfer_metrics_add_tokens(m, CINFER_FRONTEND_GRPC, 1, 2);
    text = cinfer_metrics_render(m);
    CHECK(strstr(text, "cinfer:request_total{frontend=\"openai\",method=\"/"
                       "v1/chat/completions\",code=\"RESOURCE_EXHAUSTED\"} "
                       "1\n") != NULL);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    CHECK_EQ_INT(get(p, "cinfer:request_total",
                     FE_GRPC ",method=\"Generate\",code=\"OK\"", ""),
                 4);
    CHECK_EQ_INT(get(p, "cinfer:request_total",
                     FE_OPENAI ",method=\"/v1/chat/completions\",code=\"OK\"",
                     ""),
                 1);
    CHECK_EQ_INT(get(p, "cinfer:request_total",
                     FE_OPENAI ",method=\"/v1/completions\",code=\"OK\"", ""),
                 1);
    CHECK(isnan(get(p, "cinfer:request_total",
                    FE_OPENAI ",method=\"Generate\",code=\"OK\"", "")));
    double sum = 0;
    for (int i = 0; i < p->n; i++)
        if (strcmp(p->s[i].name, "cinfer:request_total") == 0)
            sum += p->s[i].value;
    CHECK_EQ_INT(sum, 7);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total",
                     FE_OPENAI ",reason=\"rate_limited_global\"", ""),
                 1);
    CHECK_EQ_INT(get(p, "cinfer:rejected_requests_total",
                     FE_GRPC ",reason=\"rate_limited_global\"", ""),
                 2);
    const char *b = "cinfer:time_to_first_token_seconds_bucket";
    CHECK_EQ_INT(get(p, b, FE_OPENAI, "0.04"), 1);
    CHECK_EQ_INT(get(p, b, FE_OPENAI, "0.08"), 2);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "0.25"), 0);
    CHECK_EQ_INT(get(p, b, FE_GRPC, "0.5"), 1);
    CHECK_NEAR(get(p, "cinfer:time_to_first_token_seconds_sum", FE_OPENAI, ""),
               0.1, 1e-12);
    CHECK_EQ_INT(
        get(p, "cinfer:time_to_first_token_seconds_count", FE_GRPC, ""), 1);
    CHECK_EQ_INT(
        get(p, "cinfer:rejection_latency_seconds_count", FE_OPENAI, ""), 1);
    CHECK_EQ_INT(get(p, "cinfer:rejection_latency_seconds_count", FE_GRPC, ""),
                 0);
    CHECK_EQ_INT(get(p, "cinfer:prompt_tokens_total", FE_OPENAI, ""), 10);
    CHECK_EQ_INT(get(p, "cinfer:generation_tokens_total", FE_OPENAI, ""), 4);
    CHECK_EQ_INT(get(p, "cinfer:prompt_tokens_total", FE_GRPC, ""), 1);
    CHECK(strstr(text, "frontend_requests_total") == NULL);
    free(text);
    cinfer_metrics_destroy(m);
}

static int collect_calls;

static void collect(void *user, cinfer_metrics_snapshot *s)
{
    const cinfer_metrics_snapshot *want = user;
    *s = *want;
    collect_calls++;
}

static void test_collector_gauges(void)
{
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    cinfer_metrics_snapshot want = {
        .requests_running = 3,
        .requests_waiting = 7,
        .kv_cache_usage = 0.25,
        .prefix_cache_queries = 1000,
        .prefix_cache_hits = 640,
        .preemptions = 2,
        .breaker_state = 2,
        .breaker_transitions = 5,
        .serving = 1,
    };
    collect_calls = 0;
    cinfer_metrics_set_collector(m, collect, &want);
    char *text = cinfer_metrics_render(m);
    CHECK_EQ_INT(collect_calls, 1);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    CHECK_EQ_INT(get(p, "cinfer:num_requests_running", "", ""), 3);
    CHECK_EQ_INT(get(p, "cinfer:num_requests_waiting", "", ""), 7);
    CHECK_NEAR(get(p, "cinfer:kv_cache_usage_perc", "", ""), 0.25, 0);
    CHECK_EQ_INT(get(p, "cinfer:prefix_cache_queries_total", "", ""), 1000);
    CHECK_EQ_INT(get(p, "cinfer:prefix_cache_hits_total", "", ""), 640);
    CHECK_EQ_INT(get(p, "cinfer:num_preemptions_total", "", ""), 2);
    CHECK_EQ_INT(get(p, "cinfer:breaker_state", "", ""), 2);
    CHECK_EQ_INT(get(p, "cinfer:breaker_transitions_total", "", ""), 5);
    CHECK_EQ_INT(get(p, "cinfer:health_serving", "", ""), 1);
    CHECK_EQ_STR(
        find_family(&g_parsed, "cinfer:breaker_transitions_total")->type,
        "counter");
    CHECK_EQ_STR(find_family(&g_parsed, "cinfer:kv_cache_usage_perc")->type,
                 "gauge");
    free(text);
    cinfer_metrics_set_collector(m, NULL, NULL);
    text = cinfer_metrics_render(m);
    CHECK_EQ_INT(collect_calls, 1);
    CHECK(strstr(text, "cinfer:num_requests_running") == NULL);
    free(text);
    cinfer_metrics_destroy(m);
}

static void test_process_metrics(void)
{
    cinfer_metrics *m = make(NULL);
    if (!m)
        return;
    char *text = cinfer_metrics_render(m);
    CHECK_EQ_INT(parse_exposition(text, &g_parsed), 0);
    const parsed *p = &g_parsed;
    double rss = get(p, "process_resident_memory_bytes", "", "");
    CHECK(rss > 1e5 && rss < 1e12);
    CHECK(get(p, "process_virtual_memory_bytes", "", "") >= rss);
    double start = get(p, "process_start_time_seconds", "", "");
    double now = (double)time(NULL);
    CHECK(start > now - 3600 && start <= now + 2);
    CHECK(get(p, "process_open_fds", "", "") >= 3);
    CHECK(get(p, "process_cpu_seconds_total", "", "") >= 0);
    free(text);
    cinfer_metrics_destroy(m);
}

/* ---- HTTP ------------------------------------------------------------- */

typedef struct {
    int status;
    char content_type[128];
    char *body; /* malloc'd */
    size_t body_len;
} http_reply;

/* One request over a fresh connection; returns 0 and fills r on success. */
static int http_fetch(int port, const char *method, const char *path,
                      http_reply *r)
{
    memset(r, 0, sizeof *r);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    char req[256];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Connection: close\r\n\r\n",
                     method, path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t k = read(fd, buf + len, cap - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    close(fd);
    buf[len] = '\0';
    char *hdr_end = strstr(buf, "\r\n\r\n");
    if (!hdr_end || sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1) {
        free(buf);
        return -1;
    }
    *hdr_end = '\0';
    const char *ct = strcasestr(buf, "\r\nContent-Type: ");
    if (ct) {
        ct += 16;
        size_t k = strcspn(ct, "\r");
        snprintf(r->content_type, sizeof r->content_type, "%.*s", (int)k, ct);
    }
    r->body_len = len - (size_t)(hdr_end + 4 - buf);
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, hdr_end + 4, r->body_len);
    r->body[r->body_len] = '\0';
    free(buf);
    return 0;
}

static _Atomic int stop_recording;

static void *record_until_stopped(void *arg)
{
    cinfer_metrics *m = arg;
    while (!atomic_load(&stop_recording)) {
        cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_TTFT, 0.03);
        cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_ITL, 0.003);
        cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, "Generate", 0);
    }
    return NULL;
}

static void test_http_listener(void)
{
    cinfer_metrics *m = make("127.0.0.1:0");
    if (!m)
        return;
    int port = cinfer_metrics_port(m);
    CHECK(port > 0 && port < 65536);
    cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, "Tokenize", 3);
    http_reply r;
    CHECK_EQ_INT(http_fetch(port, "GET", "/metrics", &r), 0);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_STR(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
    CHECK_EQ_INT(parse_exposition(r.body, &g_parsed), 0);
    CHECK_EQ_INT(
        get(&g_parsed, "cinfer:request_total",
            "frontend=\"grpc\",method=\"Tokenize\",code=\"INVALID_ARGUMENT\"",
            ""),
        1);
    free(r.body);

    CHECK_EQ_INT(http_fetch(port, "HEAD", "/metrics", &r), 0);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(r.body_len, 0);
    free(r.body);
    CHECK_EQ_INT(http_fetch(port, "GET", "/", &r), 0);
    CHECK_EQ_INT(r.status, 404);
    free(r.body);
    CHECK_EQ_INT(http_fetch(port, "GET", "/metricsx", &r), 0);
    CHECK_EQ_INT(r.status, 404);
    free(r.body);
    CHECK_EQ_INT(http_fetch(port, "POST", "/metrics", &r), 0);
    CHECK_EQ_INT(r.status, 405);
    free(r.body);

    /* Scrapes while other threads record: each one parses, and every
     * histogram's +Inf bucket equals its _count. */
    atomic_store(&stop_recording, 0);
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
        pthread_create(&th[t], NULL, record_until_stopped, m);
    double last = 0;
    for (int i = 0; i < 20; i++) {
        if (http_fetch(port, "GET", "/metrics", &r) != 0) {
            CHECK(0);
            break;
        }
        CHECK_EQ_INT(r.status, 200);
        CHECK_EQ_INT(parse_exposition(r.body, &g_parsed), 0);
        double c = get(&g_parsed, "cinfer:time_to_first_token_seconds_count",
                       FE_GRPC, "");
        CHECK(c >= last);
        last = c;
        free(r.body);
    }
    atomic_store(&stop_recording, 1);
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);

    /* The port is taken while the listener runs, free after destroy. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    cinfer_metrics_params p = cinfer_metrics_default_params();
    p.listen = addr;
    cinfer_metrics *m2 = NULL;
    CHECK_EQ_INT(cinfer_metrics_create(&p, &m2), CINFER_E_IO);
    CHECK(m2 == NULL);
    CHECK(strstr(cinfer_last_error(), addr) != NULL);
    cinfer_metrics_destroy(m);
    CHECK_OK(cinfer_metrics_create(&p, &m2));
    CHECK_EQ_INT(cinfer_metrics_port(m2), port);
    cinfer_metrics_destroy(m2);
}

static void test_bad_listen_addresses(void)
{
    static const char *const bad[] = {
        "127.0.0.1",    "127.0.0.1:",    "127.0.0.1:65536", "127.0.0.1:-1",
        "127.0.0.1:9x", "127.0.0.1: 90", "127.0.0.1:+80",   "[::1:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cinfer_metrics_params p = cinfer_metrics_default_params();
        p.listen = bad[i];
        cinfer_metrics *m = NULL;
        cinfer_status st = cinfer_metrics_create(&p, &m);
        if (st == CINFER_OK) {
            fprintf(stderr, "accepted listen address \"%s\"\n", bad[i]);
            cinfer_metrics_destroy(m);
        }
        CHECK(st == CINFER_E_INVALID_ARG || st == CINFER_E_IO);
        CHECK(m == NULL);
        CHECK(strstr(cinfer_last_error(), bad[i]) != NULL);
    }
    /* A bracketed IPv6 loopback, where the machine has one. */
    cinfer_metrics_params p = cinfer_metrics_default_params();
    p.listen = "[::1]:0";
    cinfer_metrics *m = NULL;
    cinfer_status st = cinfer_metrics_create(&p, &m);
    CHECK(st == CINFER_OK || st == CINFER_E_IO);
    if (st == CINFER_OK)
        CHECK(cinfer_metrics_port(m) > 0);
    cinfer_metrics_destroy(m);
}

int main(void)
{
    RUN(test_null_is_off);
    RUN(test_render_fresh);
    RUN(test_threads_record_exact);
    RUN(test_observe_edges);
    RUN(test_label_escaping);
    RUN(test_label_table_bounded);
    RUN(test_frontends);
    RUN(test_collector_gauges);
    RUN(test_process_metrics);
    RUN(test_http_listener);
    RUN(test_bad_listen_addresses);
    return harness_done();
}
#endif
