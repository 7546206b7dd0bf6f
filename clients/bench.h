/*
 * bench.h - the pieces of cinfer-bench, the serving load generator.
 *
 * cinfer-bench drives a server the way vLLM's `bench serve` does: a
 * workload of requests (prompt, output length, arrival time) is fixed up
 * front from a seed, a single thread starts each request when its arrival
 * time has come and a concurrency slot is free, and every stream runs
 * concurrently on one event loop (a gRPC completion queue, or a libcurl
 * multi handle for llama.cpp's HTTP server). The loop timestamps each
 * token as it arrives; the statistics (TTFT, TPOT, ITL, end-to-end latency,
 * throughput, goodput) are computed afterwards from those timestamps, with
 * vLLM's definitions and key names.
 *
 *   workload  (bench_workload.c)  seeded lengths, prompts and arrivals
 *   driver    (bench_grpc.c, bench_http.c)  one protocol's streams
 *   stats     (bench_stats.c)  per-request records to the report and JSON
 *
 *     cinfer_bench_workload *w;
 *     cinfer_bench_workload_create(&wp, &w);
 *     cinfer_bench_driver *d;
 *     cinfer_bench_grpc_create(&dp, &d);
 *     ... d->ops->start(d, &reqs[i]); d->ops->poll(d, 0.1); ...
 *     cinfer_bench_summary s;
 *     cinfer_bench_summarize(reqs, n, duration_s, &slo, &s);
 *     cinfer_bench_driver_destroy(d);
 *
 * Everything here runs on the one thread of the load generator; nothing is
 * thread-safe.
 */
#ifndef CINFER_BENCH_H
#define CINFER_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic seconds. */
double cinfer_bench_now_s(void);

/* ---------------------------------------------------------------------- */
/* Random numbers (xoshiro256**, seeded through splitmix64)               */
/* ---------------------------------------------------------------------- */

typedef struct {
    uint64_t s[4];
} cinfer_bench_rng;

void cinfer_bench_rng_init(cinfer_bench_rng *r, uint64_t seed);
uint64_t cinfer_bench_rng_next(cinfer_bench_rng *r);
/* Uniform in [0, 1). */
double cinfer_bench_rng_uniform(cinfer_bench_rng *r);
/* Uniform integer in [lo, hi] (lo <= hi). */
int64_t cinfer_bench_rng_range(cinfer_bench_rng *r, int64_t lo, int64_t hi);
/* Gamma(shape, scale), shape > 0, scale > 0 (Marsaglia and Tsang). */
double cinfer_bench_rng_gamma(cinfer_bench_rng *r, double shape, double scale);

/* ---------------------------------------------------------------------- */
/* Workload                                                               */
/* ---------------------------------------------------------------------- */

typedef struct {
    int num_requests;          /* requests in the run, >= 1 */
    int input_len;             /* prompt tokens (synthetic prompts), >= 1 */
    int output_len;            /* tokens to generate per request, >= 1 */
    double range_ratio;        /* lengths uniform in [len*(1-r), len*(1+r)],
                                  r in [0, 1); 0 = fixed lengths */
    int vocab_size;            /* synthetic ids are uniform in [0, vocab);
                                  needed unless prompts_file is set */
    const char *prompts_file;  /* one prompt per line (empty lines skipped),
                                  used in order, cycled; NULL = synthetic */
    double rate_per_s;         /* mean arrival rate; 0 = all at time 0 */
    double burstiness;         /* gamma shape of the gaps: 1 = Poisson,
                                  < 1 burstier, > 1 more regular; 0 = 1 */
    uint64_t seed;             /* everything above that is random */
} cinfer_bench_workload_params;

cinfer_bench_workload_params cinfer_bench_workload_default_params(void);

/* One request of the workload. */
typedef struct {
    double arrival_s;          /* offset from the run's start */
    int input_len;             /* synthetic prompt length (0 for text) */
    int output_len;            /* max tokens to ask for */
    const int32_t *prompt_ids; /* input_len ids, or NULL */
    const char *prompt_text;   /* a line of the prompts file, or NULL */
} cinfer_bench_item;

typedef struct cinfer_bench_workload cinfer_bench_workload;

cinfer_status cinfer_bench_workload_create(
    const cinfer_bench_workload_params *p, cinfer_bench_workload **out);
void cinfer_bench_workload_destroy(cinfer_bench_workload *w);
int cinfer_bench_workload_count(const cinfer_bench_workload *w);
/* The i-th request; the pointers live as long as the workload. */
const cinfer_bench_item *cinfer_bench_workload_item(
    const cinfer_bench_workload *w, int i);

/* ---------------------------------------------------------------------- */
/* Per-request records                                                    */
/* ---------------------------------------------------------------------- */

#define CINFER_BENCH_STATUS_LEN 40

typedef struct {
    int index;                 /* position in the workload */
    const cinfer_bench_item *item;
    uint64_t seed;             /* sampling seed sent with it */
    /* Filled by the driver and cinfer_bench_req_tokens(). */
    double t_send_s;           /* when the request was started */
    double t_first_s;          /* first token's arrival (0 = none yet) */
    double t_last_s;           /* latest token's arrival */
    double t_end_s;            /* the stream's end */
    int input_tokens;          /* prompt tokens (the server's count when it
                                  reports one) */
    int output_tokens;         /* token ids received */
    double *itl_ms;            /* gap before each token after the first */
    int n_itl, cap_itl;
    int done;                  /* finished, successfully or not */
    int ok;                    /* finished with the whole stream */
    char status[CINFER_BENCH_STATUS_LEN]; /* "OK", a gRPC status name
                                  ("UNAVAILABLE"), "HTTP_503", "CURLE_7" */
    char *detail;              /* the failure's message (malloc'd) or NULL */
} cinfer_bench_req;

void cinfer_bench_req_init(cinfer_bench_req *r, int index,
                           const cinfer_bench_item *item, uint64_t seed);
void cinfer_bench_req_cleanup(cinfer_bench_req *r);
/* n new tokens arrived together at t: the first of them gets the gap since
 * the previous token, the others 0 (they came in the same message). */
cinfer_status cinfer_bench_req_tokens(cinfer_bench_req *r, int n, double t);
/* Marks the request finished; ok = whole stream received. `status` is
 * copied; `detail` may be NULL. */
void cinfer_bench_req_finish(cinfer_bench_req *r, double t, int ok,
                             const char *status, const char *detail);

/* ---------------------------------------------------------------------- */
/* Statistics                                                             */
/* ---------------------------------------------------------------------- */

/* Service-level objectives for goodput; 0 = not part of the SLO. */
typedef struct {
    double ttft_ms;
    double tpot_ms;
    double e2el_ms;
} cinfer_bench_slo;

typedef struct {
    double mean, median, std, p90, p95, p99, min, max;
    size_t n;
} cinfer_bench_dist;

typedef struct {
    char name[CINFER_BENCH_STATUS_LEN];
    int count;
} cinfer_bench_error_count;

typedef struct {
    int num_requests, completed, failed;
    long long total_input_tokens, total_output_tokens;
    double duration_s;
    double request_throughput;     /* completed / s */
    double output_throughput;      /* output tokens / s */
    double total_token_throughput; /* (input + output tokens) / s */
    int has_goodput;
    int good;                      /* completed requests within the SLO */
    double request_goodput;        /* good / s */
    cinfer_bench_dist ttft_ms, tpot_ms, itl_ms, e2el_ms;
    cinfer_bench_error_count *errors; /* by status name, most frequent first */
    int n_errors;
} cinfer_bench_summary;

/* Percentile p in [0, 100] of sorted values, linearly interpolated between
 * ranks (numpy's default). 0 for an empty array. */
double cinfer_bench_percentile(const double *sorted, size_t n, double p);

/* Summarizes finished requests; only completed ones count toward tokens,
 * throughput and latency (as vLLM does). slo may be NULL (no goodput). */
cinfer_status cinfer_bench_summarize(const cinfer_bench_req *reqs, int n,
                                     double duration_s,
                                     const cinfer_bench_slo *slo,
                                     cinfer_bench_summary *out);
void cinfer_bench_summary_cleanup(cinfer_bench_summary *s);

/* vLLM's text report. */
void cinfer_bench_print_report(FILE *f, const cinfer_bench_summary *s,
                               const char *title);

/* Describes the run for the JSON file. */
typedef struct {
    const char *backend;       /* "cinfer" or "llamacpp" */
    const char *server;        /* HOST:PORT */
    const char *model_id;      /* the server's model name, or "" */
    double request_rate;       /* 0 = inf */
    double burstiness;
    int max_concurrency;       /* 0 = none */
    int input_len, output_len;
    double range_ratio;
    uint64_t seed;
    int ignore_eos;
    double temperature;
    const cinfer_bench_slo *slo; /* or NULL */
    int detailed;              /* add per-request arrays */
    int max_attempts;          /* attempts a request may take, the first
                                  included (1 = no retries) */
} cinfer_bench_run_info;

/* Writes the result as one JSON object with vLLM's key names. */
cinfer_status cinfer_bench_write_json(FILE *f, const cinfer_bench_summary *s,
                                      const cinfer_bench_run_info *info,
                                      const cinfer_bench_req *reqs, int n);

/* ---------------------------------------------------------------------- */
/* Drivers                                                                */
/* ---------------------------------------------------------------------- */

typedef struct cinfer_bench_driver cinfer_bench_driver;

typedef struct {
    /* Starts a request now (t_send_s set inside). On failure the request
     * is finished as failed and CINFER_OK is still returned unless the
     * driver itself is broken. */
    cinfer_status (*start)(cinfer_bench_driver *d, cinfer_bench_req *r);
    /* Waits up to timeout_s for stream events and handles those that are
     * ready; *finished gets how many requests finished. */
    cinfer_status (*poll)(cinfer_bench_driver *d, double timeout_s,
                          int *finished);
    void (*destroy)(cinfer_bench_driver *d);
} cinfer_bench_driver_ops;

struct cinfer_bench_driver {
    const cinfer_bench_driver_ops *ops;
};

/* Cancels what is still open and frees the driver (NULL ok). The records
 * of requests still open are not touched, so they may be gone already. */
static inline void cinfer_bench_driver_destroy(cinfer_bench_driver *d)
{
    if (d)
        d->ops->destroy(d);
}

typedef struct {
    const char *server;        /* HOST:PORT */
    int ignore_eos;            /* keep generating past end-of-generation */
    double temperature;        /* 0 = greedy */
    double timeout_s;          /* per-request deadline, all attempts
                                  together; 0 = none */
    /* gRPC only: gRPC core's own retries of Generate (a retryPolicy in the
     * channel's service config). A request refused with UNAVAILABLE or
     * RESOURCE_EXHAUSTED before any response is tried again, up to
     * max_attempts in all, after an exponential backoff from
     * retry_backoff_ms (x2 per retry, at most 10x) or the server's
     * grpc-retry-pushback-ms when it sends one. */
    int max_attempts;          /* 1 = no retries; 2..5 (gRPC's cap) */
    int retry_backoff_ms;      /* >= 1 */
    /* HTTP only: 1 = an OpenAI-compatible server (cinfer-server's
     * --http-listen: POST /v1/completions); 0 = llama-server's
     * /completion. */
    int openai;
} cinfer_bench_driver_params;

/* The most attempts gRPC core makes of one call. */
#define CINFER_BENCH_MAX_ATTEMPTS 5

/* 127.0.0.1:50051, ignore_eos on, greedy, no deadline, no retries (100 ms
 * backoff when turned on). */
cinfer_bench_driver_params cinfer_bench_driver_default_params(void);

/* What the server says about its model, for synthetic prompts. */
typedef struct {
    int vocab_size;
    int context_length;        /* 0 = unknown */
    char model[128];
} cinfer_bench_model_info;

/* gRPC: cinfer.v1.Inference/Generate over one channel and one completion
 * queue. */
cinfer_status cinfer_bench_grpc_create(const cinfer_bench_driver_params *p,
                                       cinfer_bench_driver **out);
cinfer_status cinfer_bench_grpc_model_info(cinfer_bench_driver *d,
                                           double timeout_s,
                                           cinfer_bench_model_info *out);

/* HTTP: llama.cpp's llama-server /completion, streamed (server-sent
 * events), on one libcurl multi handle. CINFER_E_UNSUPPORTED when the
 * program was built without libcurl. */
cinfer_status cinfer_bench_http_create(const cinfer_bench_driver_params *p,
                                       cinfer_bench_driver **out);
cinfer_status cinfer_bench_http_model_info(cinfer_bench_driver *d,
                                           double timeout_s,
                                           cinfer_bench_model_info *out);

/* Shared by the drivers: a JSON string's escaped form appended to a
 * growing buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} cinfer_bench_buf;

cinfer_status cinfer_bench_buf_append(cinfer_bench_buf *b, const char *s,
                                      size_t n);
cinfer_status cinfer_bench_buf_printf(cinfer_bench_buf *b, const char *fmt,
                                      ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
cinfer_status cinfer_bench_buf_json_string(cinfer_bench_buf *b,
                                           const char *s);
void cinfer_bench_buf_free(cinfer_bench_buf *b);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_BENCH_H */
