/*
 * server.h - the cinfer gRPC server (gRPC core C API, protobuf-c).
 *
 * Serves cinfer.v1.Inference (Generate, Tokenize, Detokenize, GetModelInfo),
 * grpc.health.v1.Health (Check, Watch) and server reflection
 * (grpc.reflection.v1 and v1alpha) on one HTTP/2 port.
 *
 * Life of a server, as main.c drives it:
 *
 *     cinfer_server_params sp = cinfer_server_default_params();
 *     sp.listen = "127.0.0.1:50051";
 *     cinfer_server *s;
 *     cinfer_server_create(&sp, &s);       // listening; health NOT_SERVING,
 *                                          // Inference calls UNAVAILABLE
 *     ... load the model, create the engine ...
 *     cinfer_server_attach(s, model, engine);  // health SERVING
 *     ... wait for SIGTERM ...
 *     cinfer_server_drain(s, 30000);       // NOT_SERVING, new calls
 *                                          // UNAVAILABLE, streams finish
 *     cinfer_server_destroy(s);            // cancels what is left, joins
 *     cinfer_engine_destroy(engine); cinfer_model_destroy(model);
 *
 * Threads: `grpc_threads` threads each poll their own completion queue and
 * run the state machines of the calls bound to it; the engine thread feeds
 * Generate streams through a per-call sink (see generate.c); a watchdog
 * thread (from attach to destroy) re-checks queued requests against the
 * shedder, feeds it the KV-cache usage and turns health NOT_SERVING while
 * the engine is stuck or faulting (watchdog.c). No call ever blocks a
 * completion-queue thread.
 *
 * Resilience: every Generate call passes admission (resilience.h: token
 * buckets, breaker, shedder) after validation; a rejection is sent
 * Trailers-Only with grpc-retry-pushback-ms and a google.rpc.Status in
 * grpc-status-details-bin (rejection.c). params.resilience = 0 switches
 * admission off (deadlines are still honoured).
 *
 * Ownership: the model, the engine and the metrics are borrowed; they must
 * outlive cinfer_server_destroy.
 *
 * Thread safety: create/attach/drain/destroy are called by one thread (the
 * main thread); cinfer_server_port may be called from any thread.
 */
#ifndef CINFER_SERVER_H
#define CINFER_SERVER_H

#include <stdint.h>

#include "common/status.h"
#include "engine/engine.h"
#include "resilience/resilience.h"
#include "server/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_server cinfer_server;

/* Connection and stream limits, gRPC core's channel arguments on the
 * listening port (and the server's own receive timeout). 0 = no limit
 * (gRPC core's default) unless noted; cinfer_server_default_params sets
 * the safe defaults README.md lists. */
typedef struct {
    int max_concurrent_streams;     /* streams per connection, advertised in
                                       SETTINGS; more are refused by the
                                       transport (REFUSED_STREAM) */
    int64_t max_connection_idle_ms; /* a connection without calls for this
                                       long is sent GOAWAY (a connection
                                       that only sent its preface too) */
    int64_t max_connection_age_ms;  /* a connection this old is sent
                                       GOAWAY, so a mesh can rebalance */
    int64_t max_connection_age_grace_ms; /* then its calls get this long
                                       before it is closed */
    int64_t min_ping_interval_ms;   /* pings closer than this (with no
                                       data between) are strikes */
    int max_ping_strikes;           /* strikes before GOAWAY
                                       (ENHANCE_YOUR_CALM); 0 = never */
    int max_header_list_bytes;      /* request metadata per call; larger is
                                       refused */
    int64_t handshake_timeout_ms;   /* from accept to the client's HTTP/2
                                       SETTINGS (and the TLS handshake) */
    int64_t receive_timeout_ms;     /* from accept to the call's request
                                       message; past it the call ends with
                                       DEADLINE_EXCEEDED */
    int max_connections;            /* open at once over the gRPC and HTTP
                                       ports together; more are closed
                                       before their handshake
                                       (conn_limit.h) */
    int max_connections_per_peer;   /* the same from one IP address */
    int fd_reserve;                 /* descriptors below RLIMIT_NOFILE
                                       that connections never take (left
                                       for the listeners, /metrics and
                                       files); within it new connections
                                       are refused and health is
                                       NOT_SERVING */
} cinfer_server_conn_limits;

typedef struct {
    const char *listen;             /* "HOST:PORT" ("[::1]:PORT" for IPv6);
                                       port 0 = a free port (see
                                       cinfer_server_port); NULL =
                                       "127.0.0.1:50051" */
    int grpc_threads;               /* completion-queue threads; 0 = 2 */
    int request_threads;            /* threads that decode, tokenize and
                                       submit requests (off the
                                       completion-queue threads); 0 = none
                                       (the completion-queue threads do
                                       it); the default is 2 */
    int emit_thread;                /* 1 = Generate streams send from a
                                       thread of their own, not the
                                       engine's (for a GPU backend, whose
                                       device idles while the engine's
                                       thread sends); 0 = from the
                                       engine's thread */
    int request_queue;              /* requests waiting for one; more are
                                       UNAVAILABLE at once; 0 = 1024 */
    int max_receive_message_bytes;  /* largest request message; larger ones
                                       fail with RESOURCE_EXHAUSTED; 0 =
                                       4 MiB */
    int default_max_tokens;         /* max_tokens when a request leaves it
                                       unset; 0 = 256 */
    int max_seqs;                   /* reported in GetModelInfo (the
                                       engine's limit); 0 = unknown */
    int max_batched_tokens;         /* reported in GetModelInfo; 0 =
                                       unknown */
    int resilience;                 /* 1 = Generate calls pass admission
                                       (rate limits, breaker, shedder);
                                       0 = every valid call goes to the
                                       engine */
    cinfer_admission_params admission; /* the limits; used when
                                       resilience = 1 */
    int rate_limit_tokens;          /* 1 = a call costs prompt + max_tokens
                                       bucket tokens; 0 = one */
    int64_t max_request_time_ms;    /* cap on a Generate call's deadline
                                       (none = this long); 0 = no cap */
    int64_t watchdog_ms;            /* health NOT_SERVING while the engine
                                       has work and finishes no step for
                                       this long; 0 = off */
    int unhealthy_after_faults;     /* health NOT_SERVING after this many
                                       device faults in a row, until the
                                       engine serves again; 0 = off */
    int prefix_cache;               /* the engine reuses prompt prefixes
                                       (the idle service-time bound then
                                       assumes a cached prompt) */
    cinfer_server_conn_limits conn; /* connection and stream limits */
    const char *tls_cert_path;      /* PEM certificate chain: TLS on the
                                       port (with tls_key_path); NULL =
                                       plaintext */
    const char *tls_key_path;       /* its PEM private key */
    const char *tls_client_ca_path; /* PEM CAs client certificates must
                                       chain to: mTLS, a client certificate
                                       required; NULL = none asked */
    const char *api_keys_path;      /* key file (api_keys.h): every call
                                       but health, reflection and ORCA must
                                       carry a listed key; NULL = no keys */
    int api_keys_all_methods;       /* 1 = health, reflection and ORCA
                                       need a key too */
    const char *http_listen;        /* "HOST:PORT" of the OpenAI-compatible
                                       HTTP API (http.h); NULL or "" = off */
    cinfer_metrics *metrics;        /* borrowed, outlives the server; the
                                       server records into it and installs
                                       its collector; NULL = none */
    size_t grammar_cache_bytes;     /* compiled grammars, regexes and JSON
                                       schemas kept by their text
                                       (engine/grammar_cache.h); 0 = 64 MiB */
    size_t response_cache_bytes;    /* answers of deterministic requests
                                       kept and replayed
                                       (response_cache.h); 0 = off */
} cinfer_server_params;

cinfer_server_params cinfer_server_default_params(void);

/* Binds the address and starts the completion-queue threads. Until attach,
 * health reports NOT_SERVING and Inference calls get UNAVAILABLE ("model
 * is loading"); reflection already works. Errors: CINFER_E_INVALID_ARG (bad
 * params), CINFER_E_IO (the address cannot be bound), CINFER_E_NOMEM. */
cinfer_status cinfer_server_create(const cinfer_server_params *p,
                                   cinfer_server **out);

/* The bound port (useful with port 0). */
int cinfer_server_port(const cinfer_server *s);
/* The HTTP API's bound port, 0 when it is off. */
int cinfer_server_http_port(const cinfer_server *s);

/* Starts serving the model through the engine: health SERVING. Reads the
 * model's chat template. Call once. Errors: CINFER_E_INVALID_ARG (NULL
 * model or engine, or called twice). */
cinfer_status cinfer_server_attach(cinfer_server *s, cinfer_model *model,
                                   cinfer_engine *engine);

/* Graceful stop, first half: health goes NOT_SERVING (Watch streams are
 * told), new calls other than health and reflection get UNAVAILABLE, and
 * running Generate streams are waited for, at most timeout_ms (< 0 = no
 * limit). Returns the number of streams still running when it gave up
 * (they are cancelled by destroy), 0 if all finished. */
int cinfer_server_drain(cinfer_server *s, int64_t timeout_ms);

/* Reads the reloadable configuration again (SIGHUP): the TLS certificate,
 * key and client CAs, which new connections then get (running ones keep
 * theirs), and the API key file, which new calls are checked against. A
 * part that fails to load keeps its old configuration (the error is
 * logged and returned). Called by the main thread. */
cinfer_status cinfer_server_reload(cinfer_server *s);

/* Stops the server: cancels the engine requests of calls still running
 * (they end with UNAVAILABLE), cancels every other call, waits until every
 * call's state is freed, joins the threads. NULL is fine. */
void cinfer_server_destroy(cinfer_server *s);

/* ---- the program --------------------------------------------------------
 * cinfer-server's main (run.c): flags and environment, metrics, model
 * loading, signals, drain. Test programs call it with hooks to run the real
 * server over another backend. */
typedef struct {
    /* Makes the backend the model runs on (n_threads: --threads, 0 = all
     * cores); the program destroys it after the model. NULL = the model's
     * own CPU backend. */
    cinfer_status (*create_backend)(void *user, int n_threads,
                                    cinfer_backend **out);
    void *user;
} cinfer_server_main_hooks;

/* Runs the program; returns its exit code (0 after a drain, 1 on a start
 * failure, 2 on bad flags). hooks may be NULL. */
int cinfer_server_main(int argc, char **argv,
                       const cinfer_server_main_hooks *hooks);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_H */
