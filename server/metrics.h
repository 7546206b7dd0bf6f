/*
 * metrics.h - Prometheus metrics of the server, served over HTTP.
 *
 * Counters and histograms are recorded by the gRPC threads as requests end
 * (thread-safe, cheap: atomics or a short mutex); gauges that live in other
 * subsystems (engine statistics, admission and breaker state) are pulled at
 * scrape time through a collector callback, so nothing polls. The text
 * exposition format is served by libmicrohttpd on --metrics-listen
 * (default 127.0.0.1:9090) at /metrics. Names follow vLLM's (prefix
 * `cinfer:`), e.g. cinfer:time_to_first_token_seconds.
 *
 *     cinfer_metrics_params p = cinfer_metrics_default_params();
 *     p.listen = "127.0.0.1:9090";
 *     cinfer_metrics *m;
 *     cinfer_metrics_create(&p, &m);
 *     cinfer_metrics_set_collector(m, collect_fn, server);
 *     ...
 *     cinfer_metrics_request_done(m, CINFER_FRONTEND_GRPC, "Generate", 0);
 *     cinfer_metrics_observe(m, CINFER_FRONTEND_GRPC, CINFER_HIST_TTFT,
 *                            0.012);
 *     cinfer_metrics_destroy(m);
 *
 * Every per-request series carries the front end that answered the call
 * (`frontend="grpc"` or `frontend="openai"`), so both front ends are
 * counted in the same families and a sum over `frontend` is the total.
 *
 * Every recording function accepts m == NULL (metrics off) and does nothing.
 */
#ifndef CINFER_SERVER_METRICS_H
#define CINFER_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_metrics cinfer_metrics;

typedef struct {
    const char *listen; /* "HOST:PORT" for /metrics; NULL or "" = no HTTP
                           listener (recording still works, for tests) */
    const char *tls_cert_pem; /* PEM certificate chain (text, copied):
                                 /metrics over HTTPS; NULL = HTTP */
    const char *tls_key_pem;  /* its PEM private key (text, copied) */
} cinfer_metrics_params;

cinfer_metrics_params cinfer_metrics_default_params(void);

/* Starts the HTTP listener (if any). CINFER_E_IO if the address can not be
 * bound, with the address in the message. */
cinfer_status cinfer_metrics_create(const cinfer_metrics_params *p,
                                    cinfer_metrics **out);
/* Stops the listener and frees everything. NULL is fine. */
void cinfer_metrics_destroy(cinfer_metrics *m);

/* The port the listener is bound to (useful with port 0), or 0. */
int cinfer_metrics_port(const cinfer_metrics *m);

/* SIGHUP: serves HTTPS with a new certificate chain and key (PEM text,
 * copied) without closing the port: a new daemon takes over the listening
 * socket, then the old one stops accepting and is stopped once its
 * connections are done (at most 2 s). A pair that does not load changes
 * nothing. Errors: CINFER_E_INVALID_ARG (not serving HTTPS, or the new
 * pair does not start), CINFER_E_NOMEM. Not concurrent with destroy. */
cinfer_status cinfer_metrics_reload_tls(cinfer_metrics *m,
                                        const char *cert_pem,
                                        const char *key_pem);

/* ---- recording (thread-safe) ------------------------------------------ */

/* The front end that answered a call: the `frontend` label. Values out of
 * range count as gRPC. */
typedef enum {
    CINFER_FRONTEND_GRPC = 0, /* "grpc" */
    CINFER_FRONTEND_OPENAI,   /* "openai": the OpenAI-compatible HTTP API */
    CINFER_FRONTEND_COUNT_
} cinfer_frontend;

/* "grpc", "openai" (the label value, also the logs' "frontend" field). */
const char *cinfer_frontend_name(cinfer_frontend fe);

/* cinfer:request_total{frontend, method, code} - every finished call:
 * over gRPC by method name ("Generate", "Tokenize", ...), over HTTP by
 * path ("/v1/chat/completions", ...); the code is the gRPC status code
 * name ("OK", "RESOURCE_EXHAUSTED", ...) of the call's status on both
 * front ends (an HTTP answer's code is that of the status it maps). */
void cinfer_metrics_request_done(cinfer_metrics *m, cinfer_frontend fe,
                                 const char *method, int grpc_code);

typedef enum {
    CINFER_HIST_TTFT = 0,   /* cinfer:time_to_first_token_seconds */
    CINFER_HIST_ITL,        /* cinfer:inter_token_latency_seconds */
    CINFER_HIST_E2E,        /* cinfer:e2e_request_latency_seconds */
    CINFER_HIST_QUEUE,      /* cinfer:request_queue_time_seconds */
    CINFER_HIST_REJECT,     /* cinfer:rejection_latency_seconds (time to
                               answer a rejected call) */
    CINFER_HIST_COUNT_
} cinfer_hist;

/* One observation of histogram h{frontend}. */
void cinfer_metrics_observe(cinfer_metrics *m, cinfer_frontend fe,
                            cinfer_hist h, double seconds);

/* cinfer:prompt_tokens_total{frontend},
 * cinfer:generation_tokens_total{frontend} */
void cinfer_metrics_add_tokens(cinfer_metrics *m, cinfer_frontend fe,
                               uint64_t prompt, uint64_t generated);

/* Opens a non-blocking listening socket on "HOST:PORT" ("[V6]:PORT"; an
 * empty HOST = every interface); *port_out is the bound port. Errors name
 * `what` and the address. */
cinfer_status cinfer_metrics_open_listener(const char *addr, const char *what,
                                           int *fd_out, int *port_out);

/* cinfer:rejected_requests_total{frontend, reason} - limiter, breaker and
 * shedder rejections, by the admission layer's reason name
 * ("rate_limited_global", "breaker_open", "shed_queue_full", ...). */
void cinfer_metrics_rejected(cinfer_metrics *m, cinfer_frontend fe,
                             const char *reason);

/* cinfer:api_key_requests_total{key} - calls authenticated with the API
 * key of that name (the name from the key file; never the key). */
void cinfer_metrics_api_key(cinfer_metrics *m, const char *name);

/* ---- gauges pulled at scrape time ------------------------------------- */

typedef struct {
    int requests_running;          /* cinfer:num_requests_running */
    int requests_waiting;          /* cinfer:num_requests_waiting */
    double kv_cache_usage;         /* cinfer:kv_cache_usage_perc, 0..1 */
    uint64_t prefix_cache_queries; /* cinfer:prefix_cache_queries_total
                                      (prompt tokens looked up) */
    uint64_t prefix_cache_hits;    /* cinfer:prefix_cache_hits_total */
    uint64_t preemptions;          /* cinfer:num_preemptions_total */
    uint64_t spec_draft_tokens;    /* cinfer:spec_draft_tokens_total
                                      (draft tokens verified) */
    uint64_t spec_accepted_tokens; /* cinfer:spec_accepted_tokens_total */
    uint64_t grammar_cache_hits;   /* cinfer:grammar_cache_hits_total */
    uint64_t grammar_cache_misses; /* cinfer:grammar_cache_misses_total */
    uint64_t grammar_cache_bytes;  /* cinfer:grammar_cache_bytes */
    uint64_t grammar_cache_entries; /* cinfer:grammar_cache_entries */
    uint64_t response_cache_hits;  /* cinfer:response_cache_hits_total */
    uint64_t response_cache_misses; /* cinfer:response_cache_misses_total */
    uint64_t response_cache_insertions; /* cinfer:response_cache_insertions_total */
    uint64_t response_cache_evictions; /* cinfer:response_cache_evictions_total */
    uint64_t response_cache_bytes; /* cinfer:response_cache_bytes */
    uint64_t response_cache_entries; /* cinfer:response_cache_entries */
    int breaker_state;             /* cinfer:breaker_state (0 closed,
                                      1 open, 2 half-open) */
    uint64_t breaker_transitions;  /* cinfer:breaker_transitions_total */
    int serving;                   /* cinfer:health_serving (1/0) */
    int connections_open[CINFER_FRONTEND_COUNT_]; /* cinfer:connections_open
                                      {frontend} (conn_limit.h) */
    uint64_t connections_refused[CINFER_FRONTEND_COUNT_][3];
                                   /* cinfer:connections_refused_total
                                      {frontend, reason}: [0]
                                      max_connections, [1]
                                      max_connections_per_peer, [2]
                                      fd_reserve */
} cinfer_metrics_snapshot;

typedef void (*cinfer_metrics_collect_fn)(void *user,
                                          cinfer_metrics_snapshot *out);

/* Sets the callback called (from the HTTP thread) at each scrape. The user
 * pointer must stay valid until destroy. */
void cinfer_metrics_set_collector(cinfer_metrics *m,
                                  cinfer_metrics_collect_fn fn, void *user);

/* The exposition text (malloc'd, caller frees), as /metrics serves it. */
char *cinfer_metrics_render(cinfer_metrics *m);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_METRICS_H */
