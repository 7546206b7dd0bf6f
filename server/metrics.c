/*
 * metrics.c - Prometheus metrics of the server, served over HTTP (see
 * metrics.h).
 *
 * Recording is lock-free: every counter and every histogram bucket is a
 * relaxed 64-bit atomic, and a histogram's sum is a double kept in a 64-bit
 * atomic and updated with compare-and-swap. Buckets are stored per
 * interval (not cumulative) so an observation touches one bucket; the
 * exposition adds them up, and derives _count from the same bucket reads,
 * so the +Inf bucket always equals _count even while other threads record.
 *
 * Labels: every per-request series carries its front end (`frontend`,
 * the first index of its table: one fixed slot per cinfer_frontend). The
 * method of cinfer:request_total and the reason of
 * cinfer:rejected_requests_total come from small append-only tables of
 * names, shared by the front ends. A lookup scans the published names
 * without a lock; a new name is appended under a mutex. The tables are
 * bounded (a client can send any method path), and names past the bound
 * share the label "other". The gRPC code is the last index of a fixed
 * [frontend][method][code] table.
 *
 * Gauges that belong to other subsystems (engine, admission, breaker,
 * health) come from the collector callback at scrape time; process metrics
 * (resident memory, CPU time, start time, file descriptors) from /proc.
 *
 * HTTP: libmicrohttpd with its internal polling thread (epoll on Linux) on
 * a listening socket this file creates, so a bind failure reports errno
 * with the address, port 0 works, and the bound port is read back with
 * getsockname. Only GET and HEAD of /metrics answer 200; other paths 404,
 * other methods 405. A certificate reload (SIGHUP) starts a second daemon
 * on the same socket and stops the first once its connections are done,
 * so the port never closes.
 */
#include "server/metrics.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/log.h"

/* ------------------------------------------------------------------------ */
/* Tables                                                                   */
/* ------------------------------------------------------------------------ */

/* gRPC status codes 0..16 by name; anything else counts as UNKNOWN. */
#define N_GRPC_CODES 17
static const char *const grpc_code_names[N_GRPC_CODES] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

/* Label tables hold this many names; the last slot is "other". */
#define MAX_LABELS 32
/* Longer label values are cut to this many bytes. */
#define MAX_LABEL_LEN 64

typedef struct {
    pthread_mutex_t mu; /* serializes appends */
    _Atomic int n;      /* published names in names[0..n) */
    char *names[MAX_LABELS];
} label_table;

/* Histogram bounds (upper, inclusive: an observation v goes to the first
 * bucket with v <= le). Chosen for LLM serving on CPUs and GPUs. */
static const double b_ttft[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                0.08,  0.1,    0.25,  0.5,  0.75, 1.0,  2.5,
                                5.0,   7.5,    10.0,  20.0, 40.0, 60.0};
static const double b_itl[] = {0.001, 0.0025, 0.005, 0.01,  0.015, 0.02, 0.025,
                               0.03,  0.04,   0.05,  0.075, 0.1,   0.15, 0.2,
                               0.3,   0.4,    0.5,   0.75,  1.0,   2.5};
static const double b_e2e[] = {0.01, 0.025, 0.05,  0.1,   0.25, 0.5,  1.0,
                               2.5,  5.0,   10.0,  15.0,  20.0, 30.0, 40.0,
                               50.0, 60.0,  120.0, 240.0, 300.0};
static const double b_reject[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                  0.005,  0.01,    0.025,  0.05,  0.1};

#define MAX_BUCKETS 24
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))
_Static_assert(NELEM(b_ttft) <= MAX_BUCKETS && NELEM(b_itl) <= MAX_BUCKETS &&
                   NELEM(b_e2e) <= MAX_BUCKETS &&
                   NELEM(b_reject) <= MAX_BUCKETS,
               "histogram bounds exceed MAX_BUCKETS");

typedef struct {
    const char *name;
    const char *help;
    const double *bounds;
    int n_bounds;
} hist_def;

static const hist_def hist_defs[CINFER_HIST_COUNT_] = {
    [CINFER_HIST_TTFT] = {"cinfer:time_to_first_token_seconds",
                          "Time from arrival to the first generated token.",
                          b_ttft, (int)NELEM(b_ttft)},
    [CINFER_HIST_ITL] = {"cinfer:inter_token_latency_seconds",
                         "Time between consecutive generated tokens.", b_itl,
                         (int)NELEM(b_itl)},
    [CINFER_HIST_E2E] = {"cinfer:e2e_request_latency_seconds",
                         "Time from arrival to the end of the response.", b_e2e,
                         (int)NELEM(b_e2e)},
    [CINFER_HIST_QUEUE] = {"cinfer:request_queue_time_seconds",
                           "Time a request waited before it was scheduled.",
                           b_ttft, (int)NELEM(b_ttft)},
    [CINFER_HIST_REJECT] = {"cinfer:rejection_latency_seconds",
                            "Time to answer a rejected call.", b_reject,
                            (int)NELEM(b_reject)},
};

typedef struct {
    /* counts[i] for bucket i (v <= bounds[i], v > bounds[i-1]);
     * counts[n_bounds] for v > the last bound. */
    _Atomic uint64_t counts[MAX_BUCKETS + 1];
    _Atomic uint64_t sum_bits; /* a double's bits */
} hist;

struct cinfer_metrics {
    struct MHD_Daemon *daemon; /* NULL without a listener */
    int port;

    label_table methods;
    _Atomic uint64_t requests[CINFER_FRONTEND_COUNT_][MAX_LABELS]
                             [N_GRPC_CODES];
    label_table reasons;
    _Atomic uint64_t rejected[CINFER_FRONTEND_COUNT_][MAX_LABELS];
    label_table keys;
    _Atomic uint64_t key_requests[MAX_LABELS];
    char *tls_cert, *tls_key;  /* HTTPS: the PEM texts, for the daemon's
                                  life */
    int listen_fd;             /* the daemon's listening socket (a
                                  reload's new daemon takes it over) */

    hist hists[CINFER_FRONTEND_COUNT_][CINFER_HIST_COUNT_];
    _Atomic uint64_t prompt_tokens[CINFER_FRONTEND_COUNT_];
    _Atomic uint64_t generated_tokens[CINFER_FRONTEND_COUNT_];

    pthread_mutex_t collect_mu; /* guards collect_fn/collect_user and the
                                   call of the collector */
    cinfer_metrics_collect_fn collect_fn;
    void *collect_user;

    double start_time_s; /* process start, Unix seconds */
};

static int label_table_init(label_table *t)
{
    memset(t, 0, sizeof *t);
    if (pthread_mutex_init(&t->mu, NULL) != 0)
        return -1;
    t->names[MAX_LABELS - 1] = strdup("other");
    if (!t->names[MAX_LABELS - 1]) {
        pthread_mutex_destroy(&t->mu);
        return -1;
    }
    atomic_init(&t->n, 0);
    return 0;
}

static void label_table_cleanup(label_table *t)
{
    for (int i = 0; i < MAX_LABELS; i++)
        free(t->names[i]);
    pthread_mutex_destroy(&t->mu);
}

static int label_scan(label_table *t, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++) {
        if (strncmp(t->names[i], name, len) == 0 && t->names[i][len] == '\0')
            return i;
    }
    return -1;
}

/* The slot of `name` (NULL or "" = "unknown"), appending it if new; the
 * "other" slot when the table is full or memory is short. */
static int label_index(label_table *t, const char *name)
{
    if (!name || !*name)
        name = "unknown";
    size_t len = strnlen(name, MAX_LABEL_LEN);
    int n = atomic_load_explicit(&t->n, memory_order_acquire);
    int i = label_scan(t, n, name, len);
    if (i >= 0)
        return i;
    pthread_mutex_lock(&t->mu);
    n = atomic_load_explicit(&t->n, memory_order_relaxed);
    i = label_scan(t, n, name, len);
    if (i < 0 && n < MAX_LABELS - 1) {
        char *copy = strndup(name, len);
        if (copy) {
            t->names[n] = copy;
            atomic_store_explicit(&t->n, n + 1, memory_order_release);
            i = n;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return i >= 0 ? i : MAX_LABELS - 1;
}

/* ------------------------------------------------------------------------ */
/* Recording                                                                */
/* ------------------------------------------------------------------------ */

static const char *const frontend_names[CINFER_FRONTEND_COUNT_] = {
    [CINFER_FRONTEND_GRPC] = "grpc",
    [CINFER_FRONTEND_OPENAI] = "openai",
};

/* A front end's slot; out of range counts as gRPC. */
static int fe_slot(cinfer_frontend fe)
{
    return (int)fe >= 0 && fe < CINFER_FRONTEND_COUNT_ ? (int)fe
                                                      : CINFER_FRONTEND_GRPC;
}

const char *cinfer_frontend_name(cinfer_frontend fe)
{
    return frontend_names[fe_slot(fe)];
}

void cinfer_metrics_request_done(cinfer_metrics *m, cinfer_frontend fe,
                                 const char *method, int grpc_code)
{
    if (!m)
        return;
    if (grpc_code < 0 || grpc_code >= N_GRPC_CODES)
        grpc_code = 2; /* UNKNOWN */
    int i = label_index(&m->methods, method);
    atomic_fetch_add_explicit(&m->requests[fe_slot(fe)][i][grpc_code], 1,
                              memory_order_relaxed);
}

void cinfer_metrics_rejected(cinfer_metrics *m, cinfer_frontend fe,
                             const char *reason)
{
    if (!m)
        return;
    int i = label_index(&m->reasons, reason);
    atomic_fetch_add_explicit(&m->rejected[fe_slot(fe)][i], 1,
                              memory_order_relaxed);
}

void cinfer_metrics_api_key(cinfer_metrics *m, const char *name)
{
    if (!m)
        return;
    int i = label_index(&m->keys, name);
    atomic_fetch_add_explicit(&m->key_requests[i], 1, memory_order_relaxed);
}

void cinfer_metrics_add_tokens(cinfer_metrics *m, cinfer_frontend fe,
                               uint64_t prompt, uint64_t generated)
{
    if (!m)
        return;
    int f = fe_slot(fe);
    if (prompt)
        atomic_fetch_add_explicit(&m->prompt_tokens[f], prompt,
                                  memory_order_relaxed);
    if (generated)
        atomic_fetch_add_explicit(&m->generated_tokens[f], generated,
                                  memory_order_relaxed);
}

static uint64_t dbits(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double bitsd(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

void cinfer_metrics_observe(cinfer_metrics *m, cinfer_frontend fe,
                            cinfer_hist h, double seconds)
{
    if (!m || (int)h < 0 || h >= CINFER_HIST_COUNT_ || isnan(seconds))
        return;
    if (seconds < 0)
        seconds = 0; /* a clock step; a duration is never negative */
    const hist_def *d = &hist_defs[h];
    /* Binary search for the first bound >= seconds. */
    int lo = 0, hi = d->n_bounds;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (seconds <= d->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    hist *hs = &m->hists[fe_slot(fe)][h];
    atomic_fetch_add_explicit(&hs->counts[lo], 1, memory_order_relaxed);
    uint64_t old = atomic_load_explicit(&hs->sum_bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(
        &hs->sum_bits, &old, dbits(bitsd(old) + seconds), memory_order_relaxed,
        memory_order_relaxed)) {
    }
}

void cinfer_metrics_set_collector(cinfer_metrics *m,
                                  cinfer_metrics_collect_fn fn, void *user)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->collect_mu);
    m->collect_fn = fn;
    m->collect_user = user;
    pthread_mutex_unlock(&m->collect_mu);
}

/* ------------------------------------------------------------------------ */
/* Exposition                                                               */
/* ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t more)
{
    if (b->oom || b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t len)
{
    sb_reserve(b, len);
    if (b->oom)
        return;
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)k < sizeof tmp) {
        sb_put(b, tmp, (size_t)k);
        return;
    }
    sb_reserve(b, (size_t)k);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

/* A sample value or bound the way Prometheus writes it: +Inf, -Inf, NaN,
 * else the shortest of %.15g / %.17g that reads back as the same double. */
static void fmt_double(char out[40], double v)
{
    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    snprintf(out, 40, "%.15g", v);
    if (strtod(out, NULL) != v)
        snprintf(out, 40, "%.17g", v);
}

/* A label value: backslash, double quote and line feed escaped. */
static void sb_label_value(sbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            sb_put(b, "\\\\", 2);
        else if (*s == '"')
            sb_put(b, "\\\"", 2);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else
            sb_put(b, s, 1);
    }
}

static void sb_family(sbuf *b, const char *name, const char *type,
                      const char *help)
{
    /* The help texts are constants here without backslash or line feed,
     * which are the two characters HELP would need escaped. */
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sb_sample_u64(sbuf *b, const char *name, uint64_t v)
{
    sb_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void sb_sample_double(sbuf *b, const char *name, double v)
{
    char num[40];
    fmt_double(num, v);
    sb_printf(b, "%s %s\n", name, num);
}

/* One front end's series of a histogram. */
static void render_histogram_series(sbuf *b, const hist_def *d, hist *h,
                                    const char *fe)
{
    uint64_t cum = 0;
    char num[40];
    for (int i = 0; i <= d->n_bounds; i++) {
        cum += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
        if (i < d->n_bounds)
            fmt_double(num, d->bounds[i]);
        else
            strcpy(num, "+Inf");
        sb_printf(b, "%s_bucket{frontend=\"%s\",le=\"%s\"} %llu\n", d->name,
                  fe, num, (unsigned long long)cum);
    }
    fmt_double(num,
               bitsd(atomic_load_explicit(&h->sum_bits, memory_order_relaxed)));
    sb_printf(b, "%s_sum{frontend=\"%s\"} %s\n", d->name, fe, num);
    sb_printf(b, "%s_count{frontend=\"%s\"} %llu\n", d->name, fe,
              (unsigned long long)cum);
}

/* Histogram h of every front end, each always shown (zeros included), so
 * a rate over it starts from the server's start. */
static void render_histogram(sbuf *b, cinfer_metrics *m, int h)
{
    const hist_def *d = &hist_defs[h];
    sb_family(b, d->name, "histogram", d->help);
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        render_histogram_series(b, d, &m->hists[f][h], frontend_names[f]);
}

/* Process metrics, with the names the Prometheus client libraries use. */
static void render_process(sbuf *b, const cinfer_metrics *m)
{
    long page = sysconf(_SC_PAGESIZE);
    long tick = sysconf(_SC_CLK_TCK);
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long long size = 0, resident = 0;
        if (fscanf(f, "%llu %llu", &size, &resident) == 2 && page > 0) {
            sb_family(b, "process_virtual_memory_bytes", "gauge",
                      "Virtual memory size in bytes.");
            sb_sample_u64(b, "process_virtual_memory_bytes",
                          size * (unsigned long long)page);
            sb_family(b, "process_resident_memory_bytes", "gauge",
                      "Resident memory size in bytes.");
            sb_sample_u64(b, "process_resident_memory_bytes",
                          resident * (unsigned long long)page);
        }
        fclose(f);
    }
    f = fopen("/proc/self/stat", "r");
    if (f) {
        char line[1024];
        size_t n = fread(line, 1, sizeof line - 1, f);
        line[n] = '\0';
        fclose(f);
        /* Fields after the command name "(...)": state is field 3, utime
         * and stime are fields 14 and 15. */
        const char *p = strrchr(line, ')');
        unsigned long long utime = 0, stime = 0;
        if (p && tick > 0 &&
            sscanf(p + 1,
                   " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                   &utime, &stime) == 2) {
            sb_family(b, "process_cpu_seconds_total", "counter",
                      "Total user and system CPU time spent in seconds.");
            sb_sample_double(b, "process_cpu_seconds_total",
                             (double)(utime + stime) / (double)tick);
        }
    }
    int fds = 0;
    DIR *dir = opendir("/proc/self/fd");
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (e->d_name[0] != '.')
                fds++;
        }
        closedir(dir);
        /* Do not count the directory's own descriptor. */
        sb_family(b, "process_open_fds", "gauge",
                  "Number of open file descriptors.");
        sb_sample_u64(b, "process_open_fds", (uint64_t)(fds > 0 ? fds - 1 : 0));
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        sb_family(b, "process_max_fds", "gauge",
                  "Maximum number of open file descriptors.");
        sb_sample_u64(b, "process_max_fds", (uint64_t)rl.rlim_cur);
    }
    sb_family(b, "process_start_time_seconds", "gauge",
              "Start time of the process since unix epoch in seconds.");
    sb_sample_double(b, "process_start_time_seconds", m->start_time_s);
}

static void render_snapshot(sbuf *b, const cinfer_metrics_snapshot *s)
{
    sb_family(b, "cinfer:num_requests_running", "gauge",
              "Requests in the running batch.");
    sb_sample_u64(
        b, "cinfer:num_requests_running",
        (uint64_t)(s->requests_running > 0 ? s->requests_running : 0));
    sb_family(b, "cinfer:num_requests_waiting", "gauge",
              "Requests waiting to be scheduled.");
    sb_sample_u64(
        b, "cinfer:num_requests_waiting",
        (uint64_t)(s->requests_waiting > 0 ? s->requests_waiting : 0));
    sb_family(b, "cinfer:kv_cache_usage_perc", "gauge",
              "Fraction of KV-cache blocks in use (1 = all).");
    sb_sample_double(b, "cinfer:kv_cache_usage_perc", s->kv_cache_usage);
    sb_family(b, "cinfer:prefix_cache_queries_total", "counter",
              "Prompt tokens looked up in the prefix cache.");
    sb_sample_u64(b, "cinfer:prefix_cache_queries_total",
                  s->prefix_cache_queries);
    sb_family(b, "cinfer:prefix_cache_hits_total", "counter",
              "Prompt tokens found in the prefix cache.");
    sb_sample_u64(b, "cinfer:prefix_cache_hits_total", s->prefix_cache_hits);
    sb_family(b, "cinfer:num_preemptions_total", "counter",
              "Running requests preempted for lack of KV-cache blocks.");
    sb_sample_u64(b, "cinfer:num_preemptions_total", s->preemptions);
    sb_family(b, "cinfer:spec_draft_tokens_total", "counter",
              "Speculative draft tokens verified (--spec-ngram).");
    sb_sample_u64(b, "cinfer:spec_draft_tokens_total", s->spec_draft_tokens);
    sb_family(b, "cinfer:spec_accepted_tokens_total", "counter",
              "Speculative draft tokens accepted.");
    sb_sample_u64(b, "cinfer:spec_accepted_tokens_total",
                  s->spec_accepted_tokens);
    sb_family(b, "cinfer:grammar_cache_hits_total", "counter",
              "Grammar, regex and JSON-schema lookups found compiled.");
    sb_sample_u64(b, "cinfer:grammar_cache_hits_total", s->grammar_cache_hits);
    sb_family(b, "cinfer:grammar_cache_misses_total", "counter",
              "Grammar, regex and JSON-schema lookups that compiled.");
    sb_sample_u64(b, "cinfer:grammar_cache_misses_total",
                  s->grammar_cache_misses);
    sb_family(b, "cinfer:grammar_cache_bytes", "gauge",
              "Bytes of compiled grammars kept (--grammar-cache-mb).");
    sb_sample_u64(b, "cinfer:grammar_cache_bytes", s->grammar_cache_bytes);
    sb_family(b, "cinfer:grammar_cache_entries", "gauge",
              "Compiled grammars kept.");
    sb_sample_u64(b, "cinfer:grammar_cache_entries", s->grammar_cache_entries);
    /* A hit skips the engine: its tokens are not in the token counters
     * nor its times in the latency histograms; it is in request_total. */
    sb_family(b, "cinfer:response_cache_hits_total", "counter",
              "Deterministic requests (greedy, or sampled with a seed) "
              "answered from the response cache (--response-cache-mb), "
              "without the engine.");
    sb_sample_u64(b, "cinfer:response_cache_hits_total",
                  s->response_cache_hits);
    sb_family(b, "cinfer:response_cache_misses_total", "counter",
              "Deterministic requests the response cache did not hold "
              "(sent to the engine; stored if they finish by themselves).");
    sb_sample_u64(b, "cinfer:response_cache_misses_total",
                  s->response_cache_misses);
    sb_family(b, "cinfer:response_cache_insertions_total", "counter",
              "Answers stored in the response cache.");
    sb_sample_u64(b, "cinfer:response_cache_insertions_total",
                  s->response_cache_insertions);
    sb_family(b, "cinfer:response_cache_evictions_total", "counter",
              "Least recently used answers dropped to keep the response "
              "cache within --response-cache-mb.");
    sb_sample_u64(b, "cinfer:response_cache_evictions_total",
                  s->response_cache_evictions);
    sb_family(b, "cinfer:response_cache_bytes", "gauge",
              "Bytes the response cache holds: its answers' events, "
              "tokens, text and logprobs, and their keys.");
    sb_sample_u64(b, "cinfer:response_cache_bytes", s->response_cache_bytes);
    sb_family(b, "cinfer:response_cache_entries", "gauge",
              "Answers the response cache holds.");
    sb_sample_u64(b, "cinfer:response_cache_entries",
                  s->response_cache_entries);
    sb_family(b, "cinfer:breaker_state", "gauge",
              "Circuit breaker state: 0 closed, 1 open, 2 half-open.");
    sb_sample_u64(b, "cinfer:breaker_state",
                  (uint64_t)(s->breaker_state > 0 ? s->breaker_state : 0));
    sb_family(b, "cinfer:breaker_transitions_total", "counter",
              "Circuit breaker state changes.");
    sb_sample_u64(b, "cinfer:breaker_transitions_total",
                  s->breaker_transitions);
    sb_family(b, "cinfer:health_serving", "gauge",
              "1 while health checks answer SERVING, else 0.");
    sb_sample_u64(b, "cinfer:health_serving", s->serving ? 1 : 0);
    static const char *const refuse_reasons[3] = {
        "max_connections", "max_connections_per_peer", "fd_reserve"};
    sb_family(b, "cinfer:connections_open", "gauge",
              "Client connections open, by front end (--max-connections).");
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        sb_printf(b, "cinfer:connections_open{frontend=\"%s\"} %d\n",
                  frontend_names[f],
                  s->connections_open[f] > 0 ? s->connections_open[f] : 0);
    sb_family(b, "cinfer:connections_refused_total", "counter",
              "Connections closed before their handshake, by front end and "
              "reason (max_connections, max_connections_per_peer, "
              "fd_reserve).");
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        for (int r = 0; r < 3; r++)
            sb_printf(b,
                      "cinfer:connections_refused_total{frontend=\"%s\","
                      "reason=\"%s\"} %llu\n",
                      frontend_names[f], refuse_reasons[r],
                      (unsigned long long)s->connections_refused[f][r]);
}

char *cinfer_metrics_render(cinfer_metrics *m)
{
    if (!m)
        return NULL;
    sbuf b = {0};
    sb_reserve(&b, 16384);

    sb_family(&b, "cinfer:request_total", "counter",
              "Finished calls by front end (grpc, openai), method (the RPC, "
              "or the HTTP path) and gRPC status code. An HTTP answer has "
              "the code of its status: 200 OK, 400 INVALID_ARGUMENT, 401 "
              "UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 413 "
              "and 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 "
              "DEADLINE_EXCEEDED, 500 INTERNAL or the fault's own; a client "
              "gone before the end is CANCELLED.");
    int nm = atomic_load_explicit(&m->methods.n, memory_order_acquire);
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++) {
        for (int k = 0; k <= nm; k++) {
            /* The published names, then the "other" slot. */
            int i = k < nm ? k : MAX_LABELS - 1;
            for (int c = 0; c < N_GRPC_CODES; c++) {
                uint64_t v = atomic_load_explicit(&m->requests[f][i][c],
                                                  memory_order_relaxed);
                if (!v)
                    continue;
                sb_printf(&b, "cinfer:request_total{frontend=\"%s\",method=\"",
                          frontend_names[f]);
                sb_label_value(&b, m->methods.names[i]);
                sb_printf(&b, "\",code=\"%s\"} %llu\n", grpc_code_names[c],
                          (unsigned long long)v);
            }
        }
    }

    sb_family(&b, "cinfer:rejected_requests_total", "counter",
              "Calls refused by the rate limiter, breaker or load shedder, "
              "by front end and reason.");
    int nr = atomic_load_explicit(&m->reasons.n, memory_order_acquire);
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++) {
        for (int k = 0; k <= nr; k++) {
            int i = k < nr ? k : MAX_LABELS - 1;
            uint64_t v = atomic_load_explicit(&m->rejected[f][i],
                                              memory_order_relaxed);
            if (!v)
                continue;
            sb_printf(&b,
                      "cinfer:rejected_requests_total{frontend=\"%s\","
                      "reason=\"",
                      frontend_names[f]);
            sb_label_value(&b, m->reasons.names[i]);
            sb_printf(&b, "\"} %llu\n", (unsigned long long)v);
        }
    }

    int nk = atomic_load_explicit(&m->keys.n, memory_order_acquire);
    if (nk > 0) {
        sb_family(&b, "cinfer:api_key_requests_total", "counter",
                  "Calls authenticated with an API key, by the key's name.");
        for (int k = 0; k <= nk; k++) {
            int i = k < nk ? k : MAX_LABELS - 1;
            uint64_t v = atomic_load_explicit(&m->key_requests[i],
                                              memory_order_relaxed);
            if (!v)
                continue;
            sb_str(&b, "cinfer:api_key_requests_total{key=\"");
            sb_label_value(&b, m->keys.names[i]);
            sb_printf(&b, "\"} %llu\n", (unsigned long long)v);
        }
    }

    sb_family(&b, "cinfer:prompt_tokens_total", "counter",
              "Prompt tokens of finished requests, by front end.");
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        sb_printf(&b, "cinfer:prompt_tokens_total{frontend=\"%s\"} %llu\n",
                  frontend_names[f],
                  (unsigned long long)atomic_load_explicit(
                      &m->prompt_tokens[f], memory_order_relaxed));
    sb_family(&b, "cinfer:generation_tokens_total", "counter",
              "Generated tokens of finished requests, by front end.");
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        sb_printf(&b,
                  "cinfer:generation_tokens_total{frontend=\"%s\"} %llu\n",
                  frontend_names[f],
                  (unsigned long long)atomic_load_explicit(
                      &m->generated_tokens[f], memory_order_relaxed));

    for (int h = 0; h < CINFER_HIST_COUNT_; h++)
        render_histogram(&b, m, h);

    pthread_mutex_lock(&m->collect_mu);
    if (m->collect_fn) {
        cinfer_metrics_snapshot s;
        memset(&s, 0, sizeof s);
        m->collect_fn(m->collect_user, &s);
        render_snapshot(&b, &s);
    }
    pthread_mutex_unlock(&m->collect_mu);

#ifdef CINFER_VERSION
    sb_family(&b, "cinfer:build_info", "gauge",
              "Always 1; the version is the label.");
    sb_str(&b, "cinfer:build_info{version=\"");
    sb_label_value(&b, CINFER_VERSION);
    sb_str(&b, "\"} 1\n");
#endif

    render_process(&b, m);

    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */
/* ------------------------------------------------------------------------ */

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status,
                                  const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; charset=utf-8");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    static int first_call_marker;
    cinfer_metrics *m = cls;
    if (*con_cls == NULL) {
        /* First call: headers only. Answer on the next one, after any
         * request body has been read (and dropped). */
        *con_cls = &first_call_marker;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                          "method not allowed\n");
    if (strcmp(url, "/metrics") != 0)
        return reply_text(c, MHD_HTTP_NOT_FOUND, "not found; try /metrics\n");

    char *text = cinfer_metrics_render(m);
    if (!text)
        return reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    /* MHD frees the text with free() once it is sent. */
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* libmicrohttpd logs each failed accept: out of file descriptors it wrote
 * 185 MB/s of them. At most MHD_LOG_PER_S lines a second pass. */
#define MHD_LOG_PER_S 5
#define MHD_LOG_BURST 20

static pthread_mutex_t mhd_log_mu = PTHREAD_MUTEX_INITIALIZER;
static cinfer_log_limit mhd_log_limit;
static int mhd_log_limit_ready;

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    uint64_t suppressed = 0;
    pthread_mutex_lock(&mhd_log_mu);
    if (!mhd_log_limit_ready) {
        cinfer_log_limit_init(&mhd_log_limit, MHD_LOG_PER_S, MHD_LOG_BURST);
        mhd_log_limit_ready = 1;
    }
    int ok = cinfer_log_limit_take(&mhd_log_limit, now, &suppressed);
    pthread_mutex_unlock(&mhd_log_mu);
    if (!ok)
        return;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
        msg[--n] = '\0';
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_WARN, "metrics http", NULL)) {
        cinfer_log_str(&l, "error", msg);
        if (suppressed)
            cinfer_log_int(&l, "suppressed", (int64_t)suppressed);
        cinfer_log_end(&l);
    }
}

/* Splits "HOST:PORT" / "[V6]:PORT" (an empty HOST = every interface) and
 * opens a non-blocking listening socket bound to it. */
cinfer_status cinfer_metrics_open_listener(const char *addr, const char *what,
                                           int *fd_out, int *port_out)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s address \"%s\": expected "
                                "HOST:PORT",
                                what, addr);
    size_t hlen = (size_t)(colon - addr);
    const char *h = addr;
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    if (hlen >= sizeof host)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s address \"%s\": host too long",
                                what, addr);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    const char *port_s = colon + 1;
    size_t plen = strlen(port_s);
    if (plen == 0 || plen > 5 || strspn(port_s, "0123456789") != plen ||
        atoi(port_s) > 65535)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s address \"%s\": bad port",
                                what, addr);

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(hlen ? host : NULL, port_s, &hints, &res);
    if (gai != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s address \"%s\": %s", what, addr,
                                gai_strerror(gai));
    int fd = -1, err = EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 64) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return cinfer_set_error(CINFER_E_IO,
                                "%s address \"%s\": %s", what, addr,
                                strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        err = errno;
        close(fd);
        return cinfer_set_error(CINFER_E_IO,
                                "%s address \"%s\": getsockname: "
                                "%s",
                                what, addr, strerror(err));
    }
    *port_out = 0;
    if (ss.ss_family == AF_INET)
        *port_out = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
        *port_out = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    *fd_out = fd;
    return CINFER_OK;
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                */
/* ------------------------------------------------------------------------ */

/* The daemon on listening socket fd; HTTPS when cert and key are given.
 * MHD_USE_ITC lets a reload quiesce it. */
static struct MHD_Daemon *start_daemon(cinfer_metrics *m, int fd,
                                       const char *cert, const char *key)
{
    int tls = cert && key;
    /* The TLS options come last: without TLS, MHD_OPTION_END ends the
     * list before them. */
    return MHD_start_daemon(
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_USE_ITC |
            (tls ? MHD_USE_TLS : 0),
        0, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
        NULL, MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)64, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)10,
        tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, cert,
        MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_END);
}

/* Process start in Unix seconds: boot time (/proc/stat btime) plus the
 * process's start in clock ticks after boot (/proc/self/stat field 22);
 * the current time when /proc is not there. */
static double process_start_time(void)
{
    double now = (double)time(NULL);
    long tick = sysconf(_SC_CLK_TCK);
    unsigned long long btime = 0, start = 0;
    char line[1024];
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return now;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "btime %llu", &btime) == 1)
            break;
    }
    fclose(f);
    f = fopen("/proc/self/stat", "r");
    if (!f)
        return now;
    size_t n = fread(line, 1, sizeof line - 1, f);
    line[n] = '\0';
    fclose(f);
    const char *p = strrchr(line, ')');
    /* Field 22 is the 20th after the command name. */
    if (!p || !btime || tick <= 0 ||
        sscanf(p + 1,
               " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
               "%*d %*d %*d %*d %llu",
               &start) != 1)
        return now;
    return (double)btime + (double)start / (double)tick;
}

static void free_tls(cinfer_metrics *m)
{
    if (m->tls_key) {
        memset(m->tls_key, 0, strlen(m->tls_key));
        free(m->tls_key);
    }
    free(m->tls_cert);
    m->tls_key = m->tls_cert = NULL;
}

cinfer_metrics_params cinfer_metrics_default_params(void)
{
    cinfer_metrics_params p;
    memset(&p, 0, sizeof p);
    p.listen = "127.0.0.1:9090";
    return p;
}

cinfer_status cinfer_metrics_create(const cinfer_metrics_params *p,
                                    cinfer_metrics **out)
{
    if (!p || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cinfer_metrics_create: params and out are "
                                "required");
    cinfer_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return cinfer_set_error(CINFER_E_NOMEM, "metrics: out of memory");
    cinfer_status st = CINFER_OK;
    if (label_table_init(&m->methods) != 0) {
        st = cinfer_set_error(CINFER_E_NOMEM, "metrics: out of memory");
        goto fail_methods;
    }
    if (label_table_init(&m->reasons) != 0) {
        st = cinfer_set_error(CINFER_E_NOMEM, "metrics: out of memory");
        goto fail_reasons;
    }
    if (label_table_init(&m->keys) != 0) {
        st = cinfer_set_error(CINFER_E_NOMEM, "metrics: out of memory");
        goto fail_keys;
    }
    if (pthread_mutex_init(&m->collect_mu, NULL) != 0) {
        st = cinfer_set_error(CINFER_E_NOMEM, "metrics: mutex init failed");
        goto fail_mutex;
    }
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        for (int h = 0; h < CINFER_HIST_COUNT_; h++)
            atomic_init(&m->hists[f][h].sum_bits, dbits(0.0));
    m->start_time_s = process_start_time();

    if (p->listen && *p->listen) {
        int fd = -1;
        st = cinfer_metrics_open_listener(p->listen, "metrics listen", &fd,
                                          &m->port);
        if (st != CINFER_OK)
            goto fail_listen;
        int tls = p->tls_cert_pem && p->tls_key_pem;
        if (tls) {
            m->tls_cert = strdup(p->tls_cert_pem);
            m->tls_key = strdup(p->tls_key_pem);
            if (!m->tls_cert || !m->tls_key) {
                close(fd);
                st = cinfer_set_error(CINFER_E_NOMEM, "metrics: no memory");
                goto fail_listen;
            }
        }
        m->listen_fd = fd;
        m->daemon = start_daemon(m, fd, m->tls_cert, m->tls_key);
        if (!m->daemon) {
            close(fd);
            st = cinfer_set_error(CINFER_E_IO,
                                  "metrics listen address \"%s\": the HTTP "
                                  "server did not start",
                                  p->listen);
            goto fail_listen;
        }
    }
    *out = m;
    return CINFER_OK;

fail_listen:
    free_tls(m);
    pthread_mutex_destroy(&m->collect_mu);
fail_mutex:
    label_table_cleanup(&m->keys);
fail_keys:
    label_table_cleanup(&m->reasons);
fail_reasons:
    label_table_cleanup(&m->methods);
fail_methods:
    free(m);
    return st;
}

void cinfer_metrics_destroy(cinfer_metrics *m)
{
    if (!m)
        return;
    if (m->daemon)
        MHD_stop_daemon(m->daemon); /* joins its thread, closes the socket */
    pthread_mutex_destroy(&m->collect_mu);
    free_tls(m);
    label_table_cleanup(&m->keys);
    label_table_cleanup(&m->reasons);
    label_table_cleanup(&m->methods);
    free(m);
}

/* How long a reload lets the old daemon's connections finish. */
#define RELOAD_GRACE_MS 2000

cinfer_status cinfer_metrics_reload_tls(cinfer_metrics *m,
                                        const char *cert_pem,
                                        const char *key_pem)
{
    if (!m || !m->daemon || !m->tls_cert)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "metrics: not serving HTTPS");
    if (!cert_pem || !key_pem)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "metrics: a certificate and its key are "
                                "required");
    char *cert = strdup(cert_pem), *key = strdup(key_pem);
    if (!cert || !key) {
        free(cert);
        free(key);
        return cinfer_set_error(CINFER_E_NOMEM, "metrics: no memory");
    }
    /* The new daemon accepts on the same socket before the old one stops
     * accepting: the port never closes, and a pair that does not load
     * leaves the old one serving. */
    struct MHD_Daemon *nd = start_daemon(m, m->listen_fd, cert, key);
    if (!nd) {
        memset(key, 0, strlen(key));
        free(key);
        free(cert);
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "metrics: the new certificate and key do "
                                "not start HTTPS (kept the old ones)");
    }
    struct MHD_Daemon *old = m->daemon;
    MHD_quiesce_daemon(old); /* it keeps the socket open: nd has it */
    m->daemon = nd;
    for (int waited = 0; waited < RELOAD_GRACE_MS; waited += 10) {
        const union MHD_DaemonInfo *di =
            MHD_get_daemon_info(old, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!di || di->num_connections == 0)
            break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(old);
    free_tls(m);
    m->tls_cert = cert;
    m->tls_key = key;
    return CINFER_OK;
}

int cinfer_metrics_port(const cinfer_metrics *m)
{
    return m && m->daemon ? m->port : 0;
}
