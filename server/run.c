/*
 * run.c - cinfer-server's program: flags and environment, metrics, model
 * loading, signals (main.c calls cinfer_server_main; test programs call it
 * with hooks, e.g. to run the real server over a fault-injecting backend).
 *
 *   cinfer-server [--listen 127.0.0.1:50051] [--model PATH] [--threads N] ...
 *
 * Every flag can also come from an environment variable (CINFER_LISTEN,
 * CINFER_MODEL, ...; see --help), as container deployments expect; a flag on
 * the command line wins over the environment.
 *
 * Order of events: the port is bound first and health reports NOT_SERVING
 * while the model loads; then the engine starts and health turns SERVING.
 * SIGHUP re-reads the TLS certificate, key and client CAs and the API
 * key file (cinfer_server_reload), and /metrics's HTTPS certificate.
 * SIGTERM or SIGINT drains: health NOT_SERVING, new calls UNAVAILABLE,
 * running streams get --drain-timeout seconds to finish, then the process
 * exits 0. The signals are blocked in every thread and taken synchronously
 * by the main thread with sigwait, so no handler runs inside gRPC or the
 * engine.
 *
 * Device: --device auto|cpu|cuda[:N] picks the backend (auto = CUDA device
 * 0 when there is one, else the CPU). On CUDA the memory is planned at
 * start within --gpu-memory-fraction of the device (engine/model.h): the
 * KV cache takes what weights, activations and scratch leave, unless
 * --kv-cache-mem is given; a model that does not fit is refused with the
 * sizes. A device that cannot be opened (none, or a build without the
 * CUDA backend) is an error at start, exit 1.
 *
 * Resilience flags (rate limits, breaker, shedder, CoDel, deadlines, the
 * watchdog) fill the server's params; --resilience off switches admission
 * off altogether, for comparison. /metrics is served on --metrics-listen
 * unless it is "" or "off"; when the default address cannot be bound (a
 * second server on the machine) the server logs an error and runs without
 * it, while an address given explicitly must bind.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>

#include <grpc/grpc.h>

#include "common/thread_priority.h"
#include "engine/engine.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/tls.h"

#ifndef CINFER_VERSION
#define CINFER_VERSION "0.1.0"
#endif

/* --device: which backend runs the model. */
typedef enum { DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA } device_kind;

typedef struct {
    const char *listen;
    const char *model;
    device_kind device;
    int cuda_device;       /* ordinal for DEVICE_CUDA */
    double gpu_memory_fraction;
    long threads;
    long tensor_parallel; /* ranks the model is split over (all nodes) */
    long nnodes;          /* processes the ranks span (CUDA) */
    long node_rank;       /* this one; 0 serves, the others follow */
    const char *dist_init_addr; /* node 0's HOST:PORT */
    long dist_timeout_ms;
    int compute_prio; /* cinfer_thread_prio */
    long grpc_threads;
    long request_threads;
    int emit_thread; /* -1 = on for a CUDA backend */
    long max_seqs;
    long max_batched_tokens;
    long min_prefill_tokens;
    long max_prefill_tokens;
    long max_queued;
    long ctx_size;
    long default_max_tokens;
    long long kv_cache_mem;
    int kv_cache_mem_given; /* on CUDA the budget sizes the cache otherwise */
    double drain_timeout_s;
    long max_receive_message_bytes;
    long prefix_cache;
    long grammar_cache_mb;
    long response_cache_mb;
    long spec_ngram;
    long spec_ngram_min, spec_ngram_max;
    long spec_max_seqs;
    long use_mmap;
    const char *log_level;
    /* resilience */
    int resilience;
    int cuda_graphs;
    double rate_limit_qps;
    long rate_limit_burst;
    double client_rate_limit_qps;
    long client_rate_limit_burst;
    long max_clients;
    long rate_limit_tokens;
    long max_queued_requests;
    long long max_queued_tokens;
    long kv_shed_percent;
    long low_priority_spread;
    long breaker_failure_rate;
    long breaker_min_calls;
    long breaker_window_ms;
    long breaker_wait_ms;
    long breaker_max_wait_ms;
    long breaker_half_open_probes;
    long codel_target_ms;
    long codel_interval_ms;
    long max_queue_wait_ms;
    long max_ttft_ms;
    double max_request_time_s;
    double watchdog_timeout_s;
    long unhealthy_after_faults;
    const char *metrics_listen;
    const char *http_listen;
    int metrics_listen_given;
    cinfer_server_conn_limits conn; /* connection and stream limits */
    const char *tls_cert;
    const char *tls_key;
    const char *tls_client_ca;
    const char *api_keys;
    long api_keys_all_methods;
} config;

/* How a flag's value is parsed, and into what. */
typedef enum {
    ARG_STR,      /* any string, kept (const char *) */
    ARG_NONEMPTY, /* a non-empty string */
    ARG_LONG,     /* an integer in [lo, hi] (long) */
    ARG_LLONG,    /* (long long) */
    ARG_INT,      /* (int) */
    ARG_I64,      /* (int64_t) */
    ARG_DOUBLE,   /* a number in [lo, hi] (double) */
    ARG_ONOFF,    /* on, off, 1 or 0 (int) */
    ARG_SPECIAL,  /* apply_special knows it */
} arg_kind;

/* One row per flag: its name, environment variable, argument and help,
 * and how its value is parsed. The one table drives the parsing of flags
 * and environment, and --help. */
typedef struct {
    const char *name;
    const char *env;
    const char *arg;
    const char *help;
    arg_kind kind;
    size_t off;       /* its field in config */
    double lo, hi;    /* the range of a number */
    const char *hint; /* added to the bad-value message; NULL = none */
} flag_doc;

#define OFF(field) offsetof(config, field)

static const flag_doc flags[] = {
    {"listen", "CINFER_LISTEN", "HOST:PORT",
     "address to serve on (default 127.0.0.1:50051; 0.0.0.0:PORT in "
     "containers; port 0 picks a free one)",
     ARG_NONEMPTY, OFF(listen), 0, 0, NULL},
    {"model", "CINFER_MODEL", "PATH", "GGUF model (default: %s)",
     ARG_STR, OFF(model), 0, 0, NULL},
    {"device", "CINFER_DEVICE", "auto|cpu|cuda[:N]",
     "where the model runs: cuda:N = CUDA device N (cuda = cuda:0), cpu = "
     "the CPU (see --threads), auto = cuda:0 when a CUDA device is present, "
     "else the CPU. A CUDA device that cannot be opened (none, or a build "
     "without the CUDA backend) is an error at start (default auto)",
     ARG_SPECIAL, 0, 0, 0, " (auto, cpu, cuda or cuda:N)"},
    {"gpu-memory-fraction", "CINFER_GPU_MEMORY_FRACTION", "F",
     "share of the CUDA device's memory the server may hold, in (0, 1]: "
     "weights, activations and scratch first, then the KV cache takes what "
     "is left; a model that does not fit is refused at start (default 0.9)",
     ARG_SPECIAL, 0, 0, 0, " (a share in (0, 1])"},
    {"cuda-graphs", "CINFER_CUDA_GRAPHS", "on|off",
     "on CUDA, each decode step's launches are recorded as one graph per "
     "row bucket (1, 2, 4 ... 256 rows, the step padded up to its bucket) "
     "the first time it is seen and replayed after: one launch a step "
     "(default on; off = every kernel launched on its own)",
     ARG_ONOFF, OFF(cuda_graphs), 0, 0, NULL},
    {"threads", "CINFER_THREADS", "N",
     "CPU threads for the model on the CPU backend (default: all cores)",
     ARG_LONG, OFF(threads), 0, 1024, NULL},
    {"tensor-parallel", "CINFER_TENSOR_PARALLEL", "N",
     "split the model over N ranks, Megatron-style: on --device cuda one "
     "CUDA device per rank from --device's ordinal up, over NCCL (auto: "
     "CUDA when there are devices enough); on the CPU rank threads with a "
     "shared-memory all-reduce, sharing --threads out. The model's head "
     "counts must divide by N (default 1)",
     ARG_LONG, OFF(tensor_parallel), 1, 256, NULL},
    {"nnodes", "CINFER_NNODES", "N",
     "processes (hosts) the --tensor-parallel CUDA ranks span, each with "
     "N / nnodes of them, NCCL between them (default 1)",
     ARG_LONG, OFF(nnodes), 1, 256, NULL},
    {"node-rank", "CINFER_NODE_RANK", "K",
     "this process among --nnodes, 0..nnodes-1: node 0 serves; the others "
     "load their ranks, compute node 0's steps and serve nothing, ending "
     "when node 0 does (default 0)",
     ARG_LONG, OFF(node_rank), 0, 255, NULL},
    {"dist-init-addr", "CINFER_DIST_INIT_ADDR", "HOST:PORT",
     "where node 0 meets the other nodes (NCCL's id, then the steps); "
     "needed with --nnodes above 1",
     ARG_SPECIAL, 0, 0, 0, NULL},
    {"dist-timeout-ms", "CINFER_DIST_TIMEOUT_MS", "MS",
     "bound on each wait for another node: meeting, its model load, a step "
     "(default 60000)",
     ARG_LONG, OFF(dist_timeout_ms), 1, (1L << 30), NULL},
    {"compute-priority", "CINFER_COMPUTE_PRIORITY", "normal|low|idle",
     "scheduling class of the compute threads (engine and CPU workers), so "
     "that the network threads answer and refuse calls at once while a "
     "batch keeps the cores busy: idle = SCHED_IDLE, for a server with its "
     "cores (its container) to itself; low = nice +10, where other busy "
     "processes share the cores; normal = as the network threads (default "
     "idle)",
     ARG_SPECIAL, 0, 0, 0, NULL},
    {"grpc-threads", "CINFER_GRPC_THREADS", "N",
     "completion-queue threads (default 2)",
     ARG_LONG, OFF(grpc_threads), 1, 256, NULL},
    {"request-threads", "CINFER_REQUEST_THREADS", "N",
     "threads that read, decode, tokenize and submit requests at nice +10, "
     "off the completion-queue threads, so that health checks, reflection "
     "and rejections answer at once whatever the requests are (default 2; "
     "0 = the completion-queue threads do it)",
     ARG_LONG, OFF(request_threads), 0, 256, NULL},
    {"emit-thread", "CINFER_EMIT_THREAD", "on|off",
     "Generate streams' chunks and statuses packed and sent from a thread "
     "of their own, not the engine's, so the next step starts while they "
     "go out (default on with a CUDA backend, where the device would idle "
     "meanwhile; off on the CPU, whose cores the step needs)",
     ARG_ONOFF, OFF(emit_thread), 0, 0, NULL},
    {"max-seqs", "CINFER_MAX_SEQS", "N",
     "sequences decoded together (default 64)",
     ARG_LONG, OFF(max_seqs), 1, 4096, NULL},
    {"max-batched-tokens", "CINFER_MAX_BATCHED_TOKENS", "N",
     "tokens per engine step, decodes and prefill chunks together "
     "(default 64: on a CPU a step of 64 rows keeps inter-token gaps near "
     "those of a decode-only step; larger favours time to first token)",
     ARG_LONG, OFF(max_batched_tokens), 1, (1 << 20), NULL},
    {"min-prefill-tokens", "CINFER_MIN_PREFILL_TOKENS", "N",
     "prefill rows a step may carry beyond --max-batched-tokens when the "
     "running streams' decodes leave fewer, so that new prompts are not "
     "starved (default 32, 0 = none)",
     ARG_LONG, OFF(min_prefill_tokens), 0, (1 << 20), NULL},
    {"max-prefill-tokens", "CINFER_MAX_PREFILL_TOKENS", "N",
     "rows a step may take when no stream is decoding (prompts alone), so "
     "that a long prompt on an idle server goes through in larger chunks "
     "(default 512; at most --max-batched-tokens = off)",
     ARG_LONG, OFF(max_prefill_tokens), 1, (1 << 20), NULL},
    {"max-queued", "CINFER_MAX_QUEUED", "N",
     "waiting requests before new ones get RESOURCE_EXHAUSTED (default 0 = "
     "no limit)",
     ARG_LONG, OFF(max_queued), 0, (1 << 24), NULL},
    {"ctx-size", "CINFER_CTX_SIZE", "N",
     "tokens per sequence (default: the model's, at most 8192)",
     ARG_LONG, OFF(ctx_size), 0, (1 << 20), NULL},
    {"grammar-cache-mb", "CINFER_GRAMMAR_CACHE_MB", "N",
     "MiB of compiled grammars, regexes and JSON schemas kept by their "
     "text, so repeated ones compile once (default 64)",
     ARG_LONG, OFF(grammar_cache_mb), 1, (1 << 20), NULL},
    {"response-cache-mb", "CINFER_RESPONSE_CACHE_MB", "N",
     "MiB of answers to deterministic requests (greedy, or sampled with a "
     "seed) kept by their prompt and every field that decides the output, "
     "and replayed to the same request without the engine (default 0 = "
     "off)",
     ARG_LONG, OFF(response_cache_mb), 0, (1 << 20), NULL},
    {"spec-ngram", "CINFER_SPEC_NGRAM", "K",
     "prompt-lookup speculative decoding: draft tokens per sequence and "
     "step, found by matching the latest n-gram earlier in the prompt or "
     "output; changes the speed, never the text (default 0 = off)",
     ARG_LONG, OFF(spec_ngram), 0, CINFER_ENGINE_SPEC_MAX_K, NULL},
    {"spec-ngram-range", "CINFER_SPEC_NGRAM_RANGE", "MIN,MAX",
     "shortest and longest n-gram --spec-ngram matches (default 2,4)",
     ARG_SPECIAL, 0, 0, 0, NULL},
    {"spec-max-seqs", "CINFER_SPEC_MAX_SEQS", "N",
     "speculate only while at most this many sequences run (default 4)",
     ARG_LONG, OFF(spec_max_seqs), 1, 4096, NULL},
    {"kv-cache-mem", "CINFER_KV_CACHE_MEM", "BYTES",
     "KV cache size, with K/M/G suffix (default 512M on the CPU; on CUDA "
     "the cache takes what --gpu-memory-fraction leaves unless this is "
     "given)",
     ARG_SPECIAL, 0, 0, 0, NULL},
    {"default-max-tokens", "CINFER_DEFAULT_MAX_TOKENS", "N",
     "max_tokens of requests that leave it unset (default 256)",
     ARG_LONG, OFF(default_max_tokens), 1, (1 << 20), NULL},
    {"drain-timeout", "CINFER_DRAIN_TIMEOUT", "SECONDS",
     "on SIGTERM, how long running streams may take to finish (default 30)",
     ARG_DOUBLE, OFF(drain_timeout_s), 0, 9999999.0, NULL},
    {"max-receive-message-bytes", "CINFER_MAX_RECEIVE_MESSAGE_BYTES", "N",
     "largest request message (default 4194304)",
     ARG_LONG, OFF(max_receive_message_bytes), 1024, (1L << 30), NULL},
    {"mmap", "CINFER_MMAP", "0|1",
     "1 = use the weights from a mapping of the file (shared with other "
     "processes, evictable); 0 = read them into memory in huge pages, "
     "which decodes faster (default 0)",
     ARG_LONG, OFF(use_mmap), 0, 1, NULL},
    {"prefix-cache", "CINFER_PREFIX_CACHE", "0|1",
     "reuse the KV cache of shared prompt prefixes (default 1)",
     ARG_LONG, OFF(prefix_cache), 0, 1, NULL},
    {"log-level", "CINFER_LOG_LEVEL", "LEVEL",
     "debug, info, warn, error or off (default info)",
     ARG_SPECIAL, 0, 0, 0, NULL},
    {"metrics-listen", "CINFER_METRICS_LISTEN", "HOST:PORT",
     "Prometheus /metrics address (default 127.0.0.1:9090; \"\" or off = "
     "none)",
     ARG_SPECIAL, 0, 0, 0, NULL},
    {"http-listen", "CINFER_HTTP_LISTEN", "HOST:PORT",
     "OpenAI-compatible HTTP API address (/v1/completions, "
     "/v1/chat/completions, /v1/models, /health); default off",
     ARG_STR, OFF(http_listen), 0, 0, NULL},
    {"resilience", "CINFER_RESILIENCE", "on|off",
     "admission control of Generate: rate limits, circuit breaker, load "
     "shedding, and the engine holding back requests that would make "
     "running ones miss their deadlines (default on; off = every valid "
     "request goes to the engine and runs as soon as a slot is free)",
     ARG_ONOFF, OFF(resilience), 0, 0, NULL},
    {"rate-limit-qps", "CINFER_RATE_LIMIT_QPS", "RATE",
     "requests per second the server admits, a token bucket "
     "(RESOURCE_EXHAUSTED beyond; default 0 = no limit)",
     ARG_DOUBLE, OFF(rate_limit_qps), 0, 1e12, NULL},
    {"rate-limit-burst", "CINFER_RATE_LIMIT_BURST", "N",
     "the bucket's size (default 0 = one second's worth)",
     ARG_LONG, OFF(rate_limit_burst), 0, (1L << 40), NULL},
    {"client-rate-limit-qps", "CINFER_CLIENT_RATE_LIMIT_QPS", "RATE",
     "requests per second per client (x-client-id metadata, else the peer "
     "address; default 0 = no limit)",
     ARG_DOUBLE, OFF(client_rate_limit_qps), 0, 1e12, NULL},
    {"client-rate-limit-burst", "CINFER_CLIENT_RATE_LIMIT_BURST", "N",
     "each client's bucket size (default 0 = one second's worth)",
     ARG_LONG, OFF(client_rate_limit_burst), 0, (1L << 40), NULL},
    {"max-clients", "CINFER_MAX_CLIENTS", "N",
     "clients tracked for the per-client limit, least recently seen "
     "forgotten beyond (default 10000)",
     ARG_LONG, OFF(max_clients), 1, (1 << 24), NULL},
    {"rate-limit-tokens", "CINFER_RATE_LIMIT_TOKENS", "0|1",
     "1 = a request costs its prompt plus max_tokens in the buckets, so the "
     "rates and bursts count tokens (default 0 = one per request)",
     ARG_LONG, OFF(rate_limit_tokens), 0, 1, NULL},
    {"max-queued-requests", "CINFER_MAX_QUEUED_REQUESTS", "N",
     "requests waiting for their first token before new ones are shed "
     "(UNAVAILABLE; default 1024, 0 = no bound)",
     ARG_LONG, OFF(max_queued_requests), 0, (1L << 30), NULL},
    {"max-queued-tokens", "CINFER_MAX_QUEUED_TOKENS", "N",
     "their prompt plus max_tokens, summed (default 0 = no bound)",
     ARG_LLONG, OFF(max_queued_tokens), 0, (1L << 50), NULL},
    {"kv-shed-percent", "CINFER_KV_SHED_PERCENT", "PCT",
     "KV-cache usage at which newcomers are shed while requests wait "
     "(default 99, 0 = off)",
     ARG_LONG, OFF(kv_shed_percent), 0, 100, NULL},
    {"low-priority-spread", "CINFER_LOW_PRIORITY_SPREAD", "PCT",
     "share of the queue bounds taken from priority -100 (linearly less up "
     "to priority 0), so lower priorities are shed first (default 50)",
     ARG_LONG, OFF(low_priority_spread), 0, 100, NULL},
    {"breaker-failure-rate", "CINFER_BREAKER_FAILURE_RATE", "PCT",
     "server-fault rate that opens the circuit breaker (UNAVAILABLE while "
     "open; default 50, 0 = no breaker)",
     ARG_LONG, OFF(breaker_failure_rate), 0, 100, NULL},
    {"breaker-min-calls", "CINFER_BREAKER_MIN_CALLS", "N",
     "outcomes in the window before the rate is judged (default 20)",
     ARG_LONG, OFF(breaker_min_calls), 1, (1L << 30), NULL},
    {"breaker-window-ms", "CINFER_BREAKER_WINDOW_MS", "MS",
     "sliding window of outcomes (default 10000)",
     ARG_LONG, OFF(breaker_window_ms), 1, (1L << 40), NULL},
    {"breaker-wait-ms", "CINFER_BREAKER_WAIT_MS", "MS",
     "time open after a trip, doubling with each trip in a row (default "
     "5000)",
     ARG_LONG, OFF(breaker_wait_ms), 1, (1L << 40), NULL},
    {"breaker-max-wait-ms", "CINFER_BREAKER_MAX_WAIT_MS", "MS",
     "cap of the growing open time (default 60000)",
     ARG_LONG, OFF(breaker_max_wait_ms), 1, (1L << 40), NULL},
    {"breaker-half-open-probes", "CINFER_BREAKER_HALF_OPEN_PROBES", "N",
     "requests let through after the wait; all must succeed to close "
     "(default 3)",
     ARG_LONG, OFF(breaker_half_open_probes), 1, (1 << 20), NULL},
    {"codel-target-ms", "CINFER_CODEL_TARGET_MS", "MS",
     "CoDel on the time to first token: when even the fastest request "
     "waited longer than this for an interval, requests waiting over twice "
     "it are shed (default 500, 0 = off)",
     ARG_LONG, OFF(codel_target_ms), 0, (1L << 40), NULL},
    {"codel-interval-ms", "CINFER_CODEL_INTERVAL_MS", "MS",
     "CoDel's judging interval (default 5000)",
     ARG_LONG, OFF(codel_interval_ms), 1, (1L << 40), NULL},
    {"max-queue-wait-ms", "CINFER_MAX_QUEUE_WAIT_MS", "MS",
     "a request with a deadline that the engine predicts would wait longer "
     "than this for its turn is refused at once with UNAVAILABLE and a "
     "pushback, rather than queued (default 0 = no bound)",
     ARG_LONG, OFF(max_queue_wait_ms), 0, (1L << 40), NULL},
    {"max-ttft-ms", "CINFER_MAX_TTFT_MS", "MS",
     "a request with a deadline whose first token the engine predicts "
     "later than this (its wait, then its prompt's steps beside the running "
     "batch) is refused at once with UNAVAILABLE and a pushback, unless it "
     "would take as long on an idle engine; this bounds how large the "
     "running batch grows under overload (default 0 = no bound; "
     "bench/overload.py runs with 400)",
     ARG_LONG, OFF(max_ttft_ms), 0, (1L << 40), NULL},
    {"max-request-time", "CINFER_MAX_REQUEST_TIME", "SECONDS",
     "cap on every Generate call's deadline; past it the call ends with "
     "DEADLINE_EXCEEDED (default 0 = none)",
     ARG_DOUBLE, OFF(max_request_time_s), 0, 1e9, NULL},
    {"watchdog-timeout", "CINFER_WATCHDOG_TIMEOUT", "SECONDS",
     "health NOT_SERVING while the engine has work and completes no step "
     "for this long (default 30, 0 = off)",
     ARG_DOUBLE, OFF(watchdog_timeout_s), 0, 1e9, NULL},
    {"unhealthy-after-faults", "CINFER_UNHEALTHY_AFTER_FAULTS", "N",
     "health NOT_SERVING after N device faults in a row, until the engine "
     "serves again (default 5, 0 = off)",
     ARG_LONG, OFF(unhealthy_after_faults), 0, (1L << 30), NULL},
    {"tls-cert", "CINFER_TLS_CERT", "PEM",
     "TLS on the gRPC port with this certificate chain (and --tls-key); "
     "re-read on SIGHUP: new connections get the new one, running streams "
     "go on (default: plaintext)",
     ARG_STR, OFF(tls_cert), 0, 0, NULL},
    {"tls-key", "CINFER_TLS_KEY", "PEM", "the certificate's private key",
     ARG_STR, OFF(tls_key), 0, 0, NULL},
    {"tls-client-ca", "CINFER_TLS_CLIENT_CA", "PEM",
     "mTLS: clients must present a certificate that chains to these CAs "
     "(a handshake without one fails); re-read on SIGHUP",
     ARG_STR, OFF(tls_client_ca), 0, 0, NULL},
    {"api-keys", "CINFER_API_KEYS", "FILE",
     "API keys: one line per key, its SHA-256 in hex, a name, and optional "
     "qps=R burst=N max_priority=P; calls then need authorization: Bearer "
     "KEY (or x-api-key: KEY), else UNAUTHENTICATED; a key with qps= has "
     "its own rate limit instead of the per-client one; re-read on SIGHUP "
     "(default: no keys)",
     ARG_STR, OFF(api_keys), 0, 0, NULL},
    {"api-keys-all-methods", "CINFER_API_KEYS_ALL_METHODS", "0|1",
     "1 = health, reflection and the ORCA stream need a key too (default "
     "0)",
     ARG_LONG, OFF(api_keys_all_methods), 0, 1, NULL},
    {"max-concurrent-streams", "CINFER_MAX_CONCURRENT_STREAMS", "N",
     "streams per connection, advertised in SETTINGS; more are refused "
     "(default 100, 0 = no limit)",
     ARG_INT, OFF(conn.max_concurrent_streams), 0, INT32_MAX, NULL},
    {"max-connection-idle-ms", "CINFER_MAX_CONNECTION_IDLE_MS", "MS",
     "a connection without calls (one that only sent its HTTP/2 preface "
     "too) is sent GOAWAY after this long (default 300000, 0 = never)",
     ARG_I64, OFF(conn.max_connection_idle_ms), 0, INT32_MAX, NULL},
    {"max-connection-age-ms", "CINFER_MAX_CONNECTION_AGE_MS", "MS",
     "a connection this old is sent GOAWAY, so that a mesh or load "
     "balancer can rebalance (default 0 = no limit)",
     ARG_I64, OFF(conn.max_connection_age_ms), 0, INT32_MAX, NULL},
    {"max-connection-age-grace-ms", "CINFER_MAX_CONNECTION_AGE_GRACE_MS",
     "MS",
     "then its running calls get this long before it is closed (default "
     "30000, 0 = as long as they take)",
     ARG_I64, OFF(conn.max_connection_age_grace_ms), 0, INT32_MAX, NULL},
    {"keepalive-min-ping-interval-ms",
     "CINFER_KEEPALIVE_MIN_PING_INTERVAL_MS", "MS",
     "client pings closer together than this, with no data between, are "
     "strikes (default 10000, 0 = any interval)",
     ARG_I64, OFF(conn.min_ping_interval_ms), 0, INT32_MAX, NULL},
    {"keepalive-max-ping-strikes", "CINFER_KEEPALIVE_MAX_PING_STRIKES", "N",
     "strikes before the connection gets GOAWAY ENHANCE_YOUR_CALM (default "
     "2, 0 = never)",
     ARG_INT, OFF(conn.max_ping_strikes), 0, INT32_MAX, NULL},
    {"max-header-list-bytes", "CINFER_MAX_HEADER_LIST_BYTES", "N",
     "request metadata per call; a larger header list is refused (default "
     "16384, 0 = gRPC's)",
     ARG_INT, OFF(conn.max_header_list_bytes), 0, INT32_MAX, NULL},
    {"handshake-timeout-ms", "CINFER_HANDSHAKE_TIMEOUT_MS", "MS",
     "from accept to the client's HTTP/2 SETTINGS (the TLS handshake "
     "included); slower connections are closed (default 10000, 0 = "
     "gRPC's)",
     ARG_I64, OFF(conn.handshake_timeout_ms), 0, INT32_MAX, NULL},
    {"receive-timeout-ms", "CINFER_RECEIVE_TIMEOUT_MS", "MS",
     "from a call's headers to its request message (a half-open stream); "
     "past it the call ends with DEADLINE_EXCEEDED (default 30000, 0 = "
     "none)",
     ARG_I64, OFF(conn.receive_timeout_ms), 0, INT32_MAX, NULL},
    {"max-connections", "CINFER_MAX_CONNECTIONS", "N",
     "connections open at once over the gRPC and HTTP ports together; "
     "more are closed before their handshake while the open ones go on "
     "(default 10000, 0 = no limit)",
     ARG_INT, OFF(conn.max_connections), 0, INT32_MAX, NULL},
    {"max-connections-per-peer", "CINFER_MAX_CONNECTIONS_PER_PEER", "N",
     "the same from one client IP address (default 1000, 0 = no limit)",
     ARG_INT, OFF(conn.max_connections_per_peer), 0, INT32_MAX, NULL},
    {"fd-reserve", "CINFER_FD_RESERVE", "N",
     "file descriptors below RLIMIT_NOFILE that connections never take, "
     "so the listeners, health and /metrics keep working; within it new "
     "connections are refused and health is NOT_SERVING (default 128, at "
     "most a quarter of the limit, 0 = none)",
     ARG_INT, OFF(conn.fd_reserve), 0, INT32_MAX, NULL},
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])

static void usage(FILE *f)
{
    const char *dm = cinfer_model_default_path();
    fprintf(f, "usage: cinfer-server [options]\n\n"
               "Serves a GGUF model over gRPC: cinfer.v1.Inference (Generate, "
               "Tokenize,\nDetokenize, GetModelInfo), grpc.health.v1.Health "
               "and server reflection.\nLogs are JSON lines on stderr.\n\n"
               "options (each also read from the environment variable "
               "shown):\n");
    for (int i = 0; i < N_FLAGS; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s %s", flags[i].name, flags[i].arg);
        fprintf(f, "  %-36s ", left);
        fprintf(f, flags[i].help, dm && dm[0] ? dm : "(none installed)");
        fprintf(f, "\n  %-36s [%s]\n", "", flags[i].env);
    }
    fprintf(f, "  %-36s print this help\n", "-h, --help");
    fprintf(f, "  %-36s print the version\n", "--version");
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return 0;
    *out = v;
    return 1;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* "512M", "1G", "1GiB", "4096" -> bytes. */
static int parse_bytes(const char *s, long long *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return 0;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: return 0;
        }
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
        if (*end)
            return 0;
    }
    double b = v * mul;
    if (b > 9e18)
        return 0;
    *out = (long long)b;
    return 1;
}

/* "auto", "cpu", "cuda", "cuda:N" -> kind and ordinal. */
static int parse_device(const char *s, device_kind *kind, int *ordinal)
{
    *ordinal = 0;
    if (strcmp(s, "auto") == 0) {
        *kind = DEVICE_AUTO;
        return 1;
    }
    if (strcmp(s, "cpu") == 0) {
        *kind = DEVICE_CPU;
        return 1;
    }
    if (strncmp(s, "cuda", 4) != 0)
        return 0;
    *kind = DEVICE_CUDA;
    if (s[4] == '\0')
        return 1;
    long n;
    if (s[4] != ':' || !parse_long(s + 5, 0, 1023, &n))
        return 0;
    *ordinal = (int)n;
    return 1;
}

/* The flags whose parsing is more than a type and a range. */
static int apply_special(config *cfg, const char *name, const char *v)
{
    if (strcmp(name, "compute-priority") == 0) {
        for (int k = CINFER_THREAD_PRIO_NORMAL; k <= CINFER_THREAD_PRIO_IDLE;
             k++) {
            if (strcmp(v, cinfer_thread_prio_name((cinfer_thread_prio)k)) ==
                0) {
                cfg->compute_prio = k;
                return 1;
            }
        }
        return 0;
    }
    if (strcmp(name, "device") == 0)
        return parse_device(v, &cfg->device, &cfg->cuda_device);
    if (strcmp(name, "gpu-memory-fraction") == 0)
        /* parse_double's range is closed; 0 is not a share */
        return parse_double(v, 0, 1, &cfg->gpu_memory_fraction) &&
               cfg->gpu_memory_fraction > 0;
    if (strcmp(name, "dist-init-addr") == 0) {
        cfg->dist_init_addr = v;
        return v[0] != '\0' && strchr(v, ':') != NULL;
    }
    if (strcmp(name, "spec-ngram-range") == 0) {
        const char *comma = strchr(v, ',');
        char lo[32];
        if (!comma || (size_t)(comma - v) >= sizeof lo)
            return 0;
        memcpy(lo, v, (size_t)(comma - v));
        lo[comma - v] = '\0';
        return parse_long(lo, 1, 64, &cfg->spec_ngram_min) &&
               parse_long(comma + 1, 1, 64, &cfg->spec_ngram_max) &&
               cfg->spec_ngram_min <= cfg->spec_ngram_max;
    }
    if (strcmp(name, "kv-cache-mem") == 0) {
        cfg->kv_cache_mem_given = 1;
        return parse_bytes(v, &cfg->kv_cache_mem);
    }
    if (strcmp(name, "log-level") == 0) {
        cfg->log_level = v;
        return cinfer_log_level_parse(v) >= 0;
    }
    if (strcmp(name, "metrics-listen") == 0) {
        cfg->metrics_listen = v;
        cfg->metrics_listen_given = 1;
        return 1;
    }
    return 0;
}

/* Applies one option value (from a flag or the environment) to cfg, as
 * its row of the table says. Returns 0 and prints the problem if the
 * value is bad. */
static int apply(config *cfg, int i, const char *v, const char *from)
{
    const flag_doc *f = &flags[i];
    char *field = (char *)cfg + f->off;
    long n = 0;
    int ok = 1;
    switch (f->kind) {
    case ARG_STR:
        *(const char **)(void *)field = v;
        break;
    case ARG_NONEMPTY:
        *(const char **)(void *)field = v;
        ok = v[0] != '\0';
        break;
    case ARG_LONG:
        ok = parse_long(v, (long)f->lo, (long)f->hi, (long *)(void *)field);
        break;
    case ARG_LLONG:
    case ARG_INT:
    case ARG_I64:
        ok = parse_long(v, (long)f->lo, (long)f->hi, &n);
        if (ok && f->kind == ARG_LLONG)
            *(long long *)(void *)field = n;
        else if (ok && f->kind == ARG_INT)
            *(int *)(void *)field = (int)n;
        else if (ok)
            *(int64_t *)(void *)field = n;
        break;
    case ARG_DOUBLE:
        ok = parse_double(v, f->lo, f->hi, (double *)(void *)field);
        break;
    case ARG_ONOFF:
        if (strcasecmp(v, "on") == 0 || strcmp(v, "1") == 0)
            *(int *)(void *)field = 1;
        else if (strcasecmp(v, "off") == 0 || strcmp(v, "0") == 0)
            *(int *)(void *)field = 0;
        else
            ok = 0;
        break;
    case ARG_SPECIAL:
        ok = apply_special(cfg, f->name, v);
        break;
    }
    if (!ok)
        fprintf(stderr, "cinfer-server: bad value '%s' for %s%s%s\n", v, from,
                from[0] == '-' ? f->name : "", f->hint ? f->hint : "");
    return ok;
}

/* The backend --device asks for: *out stays NULL for the CPU (the model
 * then makes its own, with --threads); a CUDA device that cannot be opened
 * is an error, logged with the backend's reason. */
static int open_device(const config *cfg, cinfer_backend **out)
{
    *out = NULL;
    int ordinal = cfg->cuda_device;
    if (cfg->device == DEVICE_CPU ||
        (cfg->device == DEVICE_AUTO && cinfer_cuda_device_count() <= 0))
        return 1;
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    cp.device = ordinal;
    cp.memory_fraction = cfg->gpu_memory_fraction;
    cp.eager = !cfg->cuda_graphs;
    if (cinfer_backend_cuda_create(&cp, out) == CINFER_OK)
        return 1;
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "cannot open device", NULL)) {
        char dev[32];
        snprintf(dev, sizeof dev, "cuda:%d", ordinal);
        cinfer_log_str(&l, "device", dev);
        cinfer_log_str(&l, "error", cinfer_last_error());
        cinfer_log_end(&l);
    }
    return 0;
}

/* KV blocks that fit in `bytes`, from the model file's shape (read without
 * loading the model). 0 when the file cannot be read (the model load then
 * reports the problem). */
static int kv_blocks_for(const char *path, long long bytes, int block_size)
{
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = path;
    cinfer_gguf *g;
    if (cinfer_gguf_create(&gp, &g) != CINFER_OK)
        return 0;
    int blocks = 0;
    cinfer_gguf_str arch;
    if (cinfer_gguf_get_str(g, "general.architecture", &arch) == CINFER_OK &&
        arch.len < 64) {
        char key[128];
        uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, hd = 0;
#define KEY(suffix) (snprintf(key, sizeof key, "%.*s." suffix, (int)arch.len, arch.ptr), key)
        cinfer_gguf_get_u32(g, KEY("block_count"), &n_layer);
        cinfer_gguf_get_u32(g, KEY("embedding_length"), &n_embd);
        cinfer_gguf_get_u32(g, KEY("attention.head_count"), &n_head);
        if (cinfer_gguf_get_u32(g, KEY("attention.head_count_kv"),
                                &n_head_kv) != CINFER_OK)
            n_head_kv = n_head;
        if (cinfer_gguf_get_u32(g, KEY("attention.key_length"), &hd) !=
                CINFER_OK &&
            n_head)
            hd = n_embd / n_head;
#undef KEY
        /* K and V, F16. */
        double per_block = 2.0 * n_layer * n_head_kv * hd * block_size * 2.0;
        if (per_block > 0) {
            double b = (double)bytes / per_block;
            blocks = b > 1e7 ? 10000000 : (int)b;
        }
    }
    cinfer_clear_error();
    cinfer_gguf_destroy(g);
    return blocks;
}

static void load_progress(float f, void *user)
{
    int *last = user;
    int q = (int)(f * 4.0f);
    if (q <= *last)
        return;
    *last = q;
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "loading", NULL)) {
        cinfer_log_int(&l, "percent", q * 25);
        cinfer_log_end(&l);
    }
}

static int tp_on_cuda(const config *cfg);

/* 1 when the model will run on CUDA (as open_backend and model_params
 * decide). */
static int on_cuda(const config *cfg)
{
    if (cfg->nnodes > 1 || (cfg->tensor_parallel > 1 && tp_on_cuda(cfg)))
        return 1;
    return cfg->device == DEVICE_CUDA ||
           (cfg->device == DEVICE_AUTO && cinfer_cuda_device_count() > 0);
}

/* The server's params from the configuration. */
static void server_params(const config *cfg, cinfer_server_params *sp)
{
    sp->listen = cfg->listen;
    sp->grpc_threads = (int)cfg->grpc_threads;
    sp->request_threads = (int)cfg->request_threads;
    sp->emit_thread = cfg->emit_thread >= 0 ? cfg->emit_thread
                                            : on_cuda(cfg);
    sp->max_receive_message_bytes = (int)cfg->max_receive_message_bytes;
    sp->default_max_tokens = (int)cfg->default_max_tokens;
    sp->max_seqs = (int)cfg->max_seqs;
    sp->max_batched_tokens = (int)cfg->max_batched_tokens;
    sp->resilience = cfg->resilience;
    sp->rate_limit_tokens = (int)cfg->rate_limit_tokens;
    sp->max_request_time_ms = (int64_t)(cfg->max_request_time_s * 1000.0);
    sp->watchdog_ms = (int64_t)(cfg->watchdog_timeout_s * 1000.0);
    sp->unhealthy_after_faults = (int)cfg->unhealthy_after_faults;
    sp->prefix_cache = (int)cfg->prefix_cache;
    sp->grammar_cache_bytes = (size_t)cfg->grammar_cache_mb << 20;
    sp->response_cache_bytes = (size_t)cfg->response_cache_mb << 20;
    sp->conn = cfg->conn;
    sp->tls_cert_path = cfg->tls_cert;
    sp->tls_key_path = cfg->tls_key;
    sp->tls_client_ca_path = cfg->tls_client_ca;
    sp->api_keys_path = cfg->api_keys;
    sp->http_listen = cfg->http_listen;
    sp->api_keys_all_methods = (int)cfg->api_keys_all_methods;

    cinfer_admission_params *ap = &sp->admission;
    ap->global.rate_per_s = cfg->rate_limit_qps;
    ap->global.burst = (uint64_t)cfg->rate_limit_burst;
    ap->client.rate_per_s = cfg->client_rate_limit_qps;
    ap->client.burst = (uint64_t)cfg->client_rate_limit_burst;
    ap->max_clients = (size_t)cfg->max_clients;
    ap->breaker.failure_rate_pct = (uint32_t)cfg->breaker_failure_rate;
    ap->breaker.min_calls = (uint32_t)cfg->breaker_min_calls;
    ap->breaker.window_ms = cfg->breaker_window_ms;
    ap->breaker.wait_ms = cfg->breaker_wait_ms;
    ap->breaker.max_wait_ms = cfg->breaker_max_wait_ms;
    ap->breaker.half_open_probes = (uint32_t)cfg->breaker_half_open_probes;
    ap->shedder.max_queued_requests = (uint64_t)cfg->max_queued_requests;
    ap->shedder.max_queued_tokens = (uint64_t)cfg->max_queued_tokens;
    ap->shedder.kv_shed_permille = (uint32_t)cfg->kv_shed_percent * 10;
    ap->shedder.low_priority_spread_pct = (uint32_t)cfg->low_priority_spread;
    ap->shedder.codel.target_ms = cfg->codel_target_ms;
    ap->shedder.codel.interval_ms = cfg->codel_interval_ms;
}

/* The metrics listener: NULL (and *ok = 1) when switched off or when the
 * default address is taken; *ok = 0 when an explicit one fails. */
/* 1 when HOST:PORT names a loopback host. */
static int is_loopback(const char *addr)
{
    return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]:", 6) == 0 ||
           strncmp(addr, "localhost:", 10) == 0;
}

static cinfer_metrics *start_metrics(const config *cfg, int *ok)
{
    *ok = 1;
    const char *addr = cfg->metrics_listen;
    if (!addr || !addr[0] || strcasecmp(addr, "off") == 0)
        return NULL;
    cinfer_metrics_params mp = cinfer_metrics_default_params();
    mp.listen = addr;
    /* Off loopback, /metrics gets the gRPC port's TLS too. */
    char *cert = NULL, *key = NULL;
    if (cfg->tls_cert && cfg->tls_cert[0] && !is_loopback(addr)) {
        if (cinfer_tls_read_pem("--tls-cert", cfg->tls_cert, &cert) !=
                CINFER_OK ||
            cinfer_tls_read_pem("--tls-key", cfg->tls_key ? cfg->tls_key : "",
                                &key) != CINFER_OK) {
            cinfer_log_line l;
            if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "cannot serve metrics",
                                 NULL)) {
                cinfer_log_str(&l, "error", cinfer_last_error());
                cinfer_log_end(&l);
            }
            free(cert);
            free(key);
            *ok = 0;
            return NULL;
        }
        mp.tls_cert_pem = cert;
        mp.tls_key_pem = key;
    }
    cinfer_metrics *m = NULL;
    int https = cert != NULL;
    cinfer_status mst = cinfer_metrics_create(&mp, &m);
    if (key)
        memset(key, 0, strlen(key));
    free(cert);
    free(key);
    if (mst != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR,
                             cfg->metrics_listen_given
                                 ? "cannot serve metrics"
                                 : "cannot serve metrics; running without",
                             NULL)) {
            cinfer_log_str(&l, "address", addr);
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        *ok = !cfg->metrics_listen_given;
        return NULL;
    }
    char where[300];
    const char *colon = strrchr(addr, ':');
    int hl = colon ? (int)(colon - addr) : (int)strlen(addr);
    snprintf(where, sizeof where, "%.*s:%d", hl > 250 ? 250 : hl, addr,
             cinfer_metrics_port(m));
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "metrics listening", NULL)) {
        cinfer_log_str(&l, "address", where);
        cinfer_log_int(&l, "port", cinfer_metrics_port(m));
        cinfer_log_str(&l, "tls", https ? "on" : "off");
        cinfer_log_end(&l);
    }
    return m;
}

/* SIGHUP: /metrics over HTTPS (off loopback with --tls-cert) gets the
 * certificate and key the gRPC port reloads, on the same port. */
static void reload_metrics(const config *cfg, cinfer_metrics *m)
{
    if (!m || !cfg->tls_cert || !cfg->tls_cert[0] || !cfg->metrics_listen ||
        is_loopback(cfg->metrics_listen))
        return;
    char *cert = NULL, *key = NULL;
    cinfer_status st =
        cinfer_tls_read_pem("--tls-cert", cfg->tls_cert, &cert);
    if (st == CINFER_OK)
        st = cinfer_tls_read_pem("--tls-key", cfg->tls_key ? cfg->tls_key
                                                            : "",
                                 &key);
    if (st == CINFER_OK)
        st = cinfer_metrics_reload_tls(m, cert, key);
    if (key)
        memset(key, 0, strlen(key));
    free(cert);
    free(key);
    cinfer_log_line l;
    if (cinfer_log_begin(&l, st == CINFER_OK ? CINFER_LOG_INFO
                                             : CINFER_LOG_ERROR,
                         st == CINFER_OK ? "metrics tls reloaded"
                                         : "metrics tls reload failed",
                         NULL)) {
        if (st != CINFER_OK)
            cinfer_log_str(&l, "error", cinfer_last_error());
        cinfer_log_end(&l);
    }
}

/* The CUDA entry points the model group builds CUDA ranks with. */
static const cinfer_cuda_entry cuda_entry = {cinfer_comm_create_nccl,
                                             cinfer_backend_cuda_create,
                                             cinfer_cuda_device_count};

/* Whether the tensor-parallel ranks are CUDA devices: --device cuda, or
 * auto with a device for every rank of this node from the ordinal up. */
static int tp_on_cuda(const config *cfg)
{
    if (cfg->device != DEVICE_AUTO)
        return cfg->device == DEVICE_CUDA;
    long local = cfg->tensor_parallel / cfg->nnodes;
    return cinfer_cuda_device_count() >= cfg->cuda_device + local;
}

/* The tensor-parallel flags together: 0 (with the reason on stderr) when
 * they do not make a group. */
static int check_tp(const config *cfg)
{
    const char *why = NULL;
    if (cfg->node_rank >= cfg->nnodes)
        why = "--node-rank must be below --nnodes";
    else if (cfg->nnodes > 1 && !cfg->dist_init_addr)
        why = "--nnodes above 1 needs --dist-init-addr HOST:PORT (node 0's)";
    else if (cfg->tensor_parallel % cfg->nnodes)
        why = "--tensor-parallel must be a multiple of --nnodes (the same "
              "ranks on every node)";
    else if (cfg->nnodes > 1 && cfg->device == DEVICE_CPU)
        why = "ranks over several nodes are CUDA ranks (NCCL); --device cpu "
              "ranks are threads of one process";
    if (!why)
        return 1;
    fprintf(stderr,
            "cinfer-server: %s (--tensor-parallel %ld, --nnodes %ld, "
            "--node-rank %ld)\n",
            why, cfg->tensor_parallel, cfg->nnodes, cfg->node_rank);
    return 0;
}

/* The model's parameters from the flags, the same on every node (a
 * group's nodes check they agree): the shape, the KV cache, and the
 * tensor-parallel group with its CUDA ranks on devices[]. The caller
 * picks the single backend, if any. */
static void model_params(const config *cfg, const char *model_path,
                         int *devices, cinfer_model_params *mp)
{
    *mp = cinfer_model_default_params();
    mp->path = model_path;
    mp->n_threads = (int)cfg->threads;
    mp->thread_prio = cfg->compute_prio;
    mp->use_mmap = (int)cfg->use_mmap;
    mp->tensor_parallel = (int)cfg->tensor_parallel;
    mp->n_ctx = (int)cfg->ctx_size;
    mp->max_seqs = (int)cfg->max_seqs;
    /* the engine's rows per step (engine.h: min_prefill_tokens,
     * max_prefill_tokens) */
    long seqs = cfg->max_seqs < cfg->max_batched_tokens
                    ? cfg->max_seqs
                    : cfg->max_batched_tokens;
    long rows = seqs + cfg->min_prefill_tokens;
    if (rows < cfg->max_batched_tokens)
        rows = cfg->max_batched_tokens;
    if (rows < cfg->max_prefill_tokens)
        rows = cfg->max_prefill_tokens;
    mp->max_batch_rows = (int)rows;
    mp->n_kv_blocks = kv_blocks_for(model_path, cfg->kv_cache_mem,
                                    mp->block_size ? mp->block_size : 16);
    /* several nodes are always CUDA ranks (check_tp refused --device cpu) */
    if (cfg->nnodes > 1 || (cfg->tensor_parallel > 1 && tp_on_cuda(cfg))) {
        int local = (int)(cfg->tensor_parallel / cfg->nnodes);
        for (int j = 0; j < local && j < CINFER_COMM_MAX_RANKS; j++)
            devices[j] = cfg->cuda_device + j;
        mp->tp_device = CINFER_TP_CUDA;
        mp->cuda = &cuda_entry;
        mp->cuda_devices = devices;
        mp->gpu_memory_fraction = cfg->gpu_memory_fraction;
        mp->cuda_eager = !cfg->cuda_graphs;
        mp->n_nodes = (int)cfg->nnodes;
        mp->node_rank = (int)cfg->node_rank;
        mp->dist_init_addr = cfg->dist_init_addr;
        mp->dist_timeout_ms = (int)cfg->dist_timeout_ms;
        /* each device's budget sizes its ranks' cache, unless asked */
        if (!cfg->kv_cache_mem_given) {
            mp->kv_from_budget = 1;
            mp->n_kv_blocks = 0;
        }
    }
}

/* Node k > 0 of a group over several nodes: loads its ranks, meets node
 * 0, computes node 0's steps until node 0 ends, and serves nothing.
 * SIGTERM ends it (node 0's steps then fail naming this node). */
static int follow_node0(const config *cfg, const char *model_path)
{
    cinfer_model_params mp;
    int devices[CINFER_COMM_MAX_RANKS];
    model_params(cfg, model_path, devices, &mp);
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "loading model", NULL)) {
        cinfer_log_str(&l, "path", model_path);
        cinfer_log_int(&l, "node_rank", cfg->node_rank);
        cinfer_log_int(&l, "nnodes", cfg->nnodes);
        cinfer_log_str(&l, "node0", cfg->dist_init_addr);
        cinfer_log_end(&l);
    }
    cinfer_model *m = NULL;
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "model load failed",
                             NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        return 1;
    }
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "following node 0", NULL)) {
        cinfer_log_int(&l, "node_rank", cfg->node_rank);
        cinfer_log_int(&l, "ranks", cfg->tensor_parallel / cfg->nnodes);
        cinfer_log_end(&l);
    }
    cinfer_status st = cinfer_model_follow(m);
    if (st != CINFER_OK) {
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "tensor-parallel group "
                                                   "failed",
                             NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
    } else if (cinfer_log_begin(&l, CINFER_LOG_INFO, "node 0 ended the group",
                                NULL)) {
        cinfer_log_end(&l);
    }
    cinfer_model_destroy(m);
    return st == CINFER_OK ? 0 : 1;
}

/* Connections are descriptors: the soft limit goes up to the hard one
 * (gRPC core's listener stops accepting for good when they run out; the
 * watchdog then reports health NOT_SERVING). */
static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    rlim_t before = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "descriptor limit raised",
                         NULL)) {
        cinfer_log_int(&l, "from", (int64_t)before);
        cinfer_log_int(&l, "to", (int64_t)rl.rlim_cur);
        cinfer_log_end(&l);
    }
}

int cinfer_server_main(int argc, char **argv,
                       const cinfer_server_main_hooks *hooks)
{
    cinfer_server_params defaults = cinfer_server_default_params();
    const cinfer_admission_params *da = &defaults.admission;
    config cfg = {
        .listen = "127.0.0.1:50051",
        .model = NULL,
        .device = DEVICE_AUTO,
        .gpu_memory_fraction = 0.9,
        .threads = 0,
        .tensor_parallel = 1,
        .nnodes = 1,
        .compute_prio = CINFER_THREAD_PRIO_IDLE,
        .grpc_threads = 2,
        .request_threads = defaults.request_threads,
        .max_seqs = 64,
        .max_batched_tokens = 64,
        .min_prefill_tokens = 32,
        .max_prefill_tokens = 512,
        .max_queued = 0,
        .ctx_size = 0,
        .default_max_tokens = 256,
        .kv_cache_mem = 512LL << 20,
        .drain_timeout_s = 30,
        .max_receive_message_bytes = 4 << 20,
        .prefix_cache = 1,
        .grammar_cache_mb = 64,
        .spec_ngram = 0,
        .spec_ngram_min = 2,
        .spec_ngram_max = 4,
        .spec_max_seqs = 4,
        .log_level = "info",
        .resilience = 1,
        .cuda_graphs = 1,
        .emit_thread = -1,
        .max_clients = (long)da->max_clients,
        .max_queued_requests = (long)da->shedder.max_queued_requests,
        .max_queued_tokens = (long long)da->shedder.max_queued_tokens,
        .kv_shed_percent = (long)da->shedder.kv_shed_permille / 10,
        .low_priority_spread = (long)da->shedder.low_priority_spread_pct,
        .breaker_failure_rate = (long)da->breaker.failure_rate_pct,
        .breaker_min_calls = (long)da->breaker.min_calls,
        .breaker_window_ms = (long)da->breaker.window_ms,
        .breaker_wait_ms = (long)da->breaker.wait_ms,
        .breaker_max_wait_ms = (long)da->breaker.max_wait_ms,
        .breaker_half_open_probes = (long)da->breaker.half_open_probes,
        .codel_target_ms = (long)da->shedder.codel.target_ms,
        .codel_interval_ms = (long)da->shedder.codel.interval_ms,
        .max_queue_wait_ms = 0,
        .max_ttft_ms = 0,
        .max_request_time_s = (double)defaults.max_request_time_ms / 1000.0,
        .watchdog_timeout_s = (double)defaults.watchdog_ms / 1000.0,
        .unhealthy_after_faults = defaults.unhealthy_after_faults,
        .metrics_listen = "127.0.0.1:9090",
        .conn = defaults.conn,
    };

    /* Environment first, flags override. CINFER_MODEL is also what
     * cinfer_model_default_path reads, so both agree. */
    for (int i = 0; i < N_FLAGS; i++) {
        const char *v = getenv(flags[i].env);
        /* An empty CINFER_METRICS_LISTEN switches /metrics off. */
        int empty_ok = strcmp(flags[i].name, "metrics-listen") == 0;
        if (v && (v[0] || empty_ok) && !apply(&cfg, i, v, flags[i].env))
            return 2;
    }
    struct option longopts[N_FLAGS + 3];
    for (int i = 0; i < N_FLAGS; i++)
        longopts[i] = (struct option){flags[i].name, required_argument, 0,
                                      256 + i};
    longopts[N_FLAGS] = (struct option){"help", no_argument, 0, 'h'};
    longopts[N_FLAGS + 1] = (struct option){"version", no_argument, 0, 'V'};
    longopts[N_FLAGS + 2] = (struct option){0, 0, 0, 0};
    int opt;
    for (;;) {
        opt = getopt_long(argc, argv, "h", longopts, NULL);
        if (opt == -1)
            break;
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        if (opt == 'V') {
            printf("cinfer-server %s (grpc %s)\n", CINFER_VERSION,
                   grpc_version_string());
            return 0;
        }
        if (opt < 256 || opt >= 256 + N_FLAGS) {
            usage(stderr);
            return 2;
        }
        if (!apply(&cfg, opt - 256, optarg, "--"))
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "cinfer-server: unexpected argument '%s'\n",
                argv[optind]);
        return 2;
    }
    cinfer_log_set_level((cinfer_log_level)cinfer_log_level_parse(cfg.log_level));
    const char *model_path = cfg.model && cfg.model[0]
                                 ? cfg.model
                                 : cinfer_model_default_path();
    if (!model_path || !model_path[0]) {
        fprintf(stderr, "cinfer-server: no model: pass --model PATH (or "
                        "install the default with scripts/install-deps.sh)\n");
        return 2;
    }
    if (!check_tp(&cfg))
        return 2;
    if (cfg.node_rank > 0)
        return follow_node0(&cfg, model_path);

    /* Signals: blocked everywhere (threads inherit the mask), taken by
     * sigwait below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();

    int metrics_ok;
    cinfer_metrics *metrics = start_metrics(&cfg, &metrics_ok);
    if (!metrics_ok)
        return 1;
    cinfer_server_params sp = defaults;
    server_params(&cfg, &sp);
    sp.metrics = metrics;
    cinfer_server *srv = NULL;
    if (cinfer_server_create(&sp, &srv) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "cannot start", NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        cinfer_metrics_destroy(metrics);
        return 1;
    }
    {
        /* The host part of the address with the bound port, for tests and
         * scripts that asked for port 0. */
        char addr[300];
        const char *colon = strrchr(cfg.listen, ':');
        int hl = colon ? (int)(colon - cfg.listen) : (int)strlen(cfg.listen);
        snprintf(addr, sizeof addr, "%.*s:%d", hl > 250 ? 250 : hl,
                 cfg.listen, cinfer_server_port(srv));
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "listening", NULL)) {
            cinfer_log_str(&l, "address", addr);
            cinfer_log_int(&l, "port", cinfer_server_port(srv));
            cinfer_log_str(&l, "version", CINFER_VERSION);
            cinfer_log_str(&l, "emit_thread", sp.emit_thread ? "on" : "off");
            cinfer_log_str(&l, "tls",
                           !cfg.tls_cert || !cfg.tls_cert[0] ? "off"
                           : cfg.tls_client_ca && cfg.tls_client_ca[0]
                               ? "mtls"
                               : "tls");
            cinfer_log_end(&l);
        }
        if (cinfer_server_http_port(srv) &&
            cinfer_log_begin(&l, CINFER_LOG_INFO, "http listening", NULL)) {
            cinfer_log_int(&l, "port", cinfer_server_http_port(srv));
            cinfer_log_end(&l);
        }
    }

    int rc = 1;
    cinfer_model *model = NULL;
    cinfer_engine *engine = NULL;
    cinfer_backend *backend = NULL;
    cinfer_model_params mp;
    int devices[CINFER_COMM_MAX_RANKS];
    model_params(&cfg, model_path, devices, &mp);
    if (mp.tensor_parallel > 1 || mp.tp_device == CINFER_TP_CUDA) {
        /* The group makes each rank's backend. */
        if (hooks && hooks->create_backend) {
            cinfer_log_line l;
            if (cinfer_log_begin(&l, CINFER_LOG_ERROR,
                                 "tensor parallelism is not supported with "
                                 "this build's test backend",
                                 NULL)) {
                cinfer_log_int(&l, "tensor_parallel", cfg.tensor_parallel);
                cinfer_log_end(&l);
            }
            goto out;
        }
    } else if (hooks && hooks->create_backend) {
        if (hooks->create_backend(hooks->user, (int)cfg.threads, &backend) !=
            CINFER_OK) {
            cinfer_log_line l;
            if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "backend failed",
                                 NULL)) {
                cinfer_log_str(&l, "error", cinfer_last_error());
                cinfer_log_end(&l);
            }
            goto out;
        }
        mp.backend = backend;
    } else {
        if (!open_device(&cfg, &backend))
            goto out;
        mp.backend = backend;
    }
    /* A backend with a budget (CUDA) gives the KV cache what the model
     * leaves of it, unless the size was asked for. */
    size_t be_used = 0, be_budget = 0;
    int budgeted = backend &&
                   cinfer_backend_memory(backend, &be_used, &be_budget) ==
                       CINFER_OK;
    cinfer_clear_error();
    if (budgeted && !cfg.kv_cache_mem_given) {
        mp.kv_from_budget = 1;
        mp.n_kv_blocks = 0;
    }
    int last_quarter = -1;
    mp.progress = load_progress;
    mp.progress_user = &last_quarter;
    {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "loading model", NULL)) {
            cinfer_log_str(&l, "path", model_path);
            if (mp.kv_from_budget)
                cinfer_log_int(&l, "kv_from_budget", 1);
            else
                cinfer_log_int(&l, "kv_blocks", mp.n_kv_blocks);
            cinfer_log_end(&l);
        }
    }
    if (cinfer_model_create(&mp, &model) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "model load failed",
                             NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        goto out;
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = model;
    ep.thread_prio = cfg.compute_prio;
    ep.max_seqs = (int)cfg.max_seqs;
    ep.max_batched_tokens = (int)cfg.max_batched_tokens;
    ep.min_prefill_tokens = (int)cfg.min_prefill_tokens;
    ep.max_prefill_tokens = (int)cfg.max_prefill_tokens;
    ep.max_queued = (int)cfg.max_queued;
    ep.prefix_cache = (int)cfg.prefix_cache;
    ep.spec_ngram_k = (int)cfg.spec_ngram;
    ep.spec_ngram_min = (int)cfg.spec_ngram_min;
    ep.spec_ngram_max = (int)cfg.spec_ngram_max;
    ep.spec_max_seqs = (int)cfg.spec_max_seqs;
    /* holding requests back for deadlines is load management: off with
     * the rest of it */
    ep.admit_past_deadlines = !cfg.resilience;
    ep.max_queue_wait_ns = cfg.resilience ? cfg.max_queue_wait_ms * 1000000LL
                                          : 0;
    ep.max_ttft_ns = cfg.resilience ? cfg.max_ttft_ms * 1000000LL : 0;
    if (cinfer_engine_create(&ep, &engine) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "engine start failed",
                             NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        goto out;
    }
    if (cinfer_server_attach(srv, model, engine) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "attach failed", NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        goto out;
    }

    /* SIGHUP re-reads what can change without a restart; a failed
     * reload keeps the old configuration (its error is logged). */
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0 || sig == SIGHUP) {
        if (sig == SIGHUP) {
            cinfer_server_reload(srv);
            reload_metrics(&cfg, metrics);
        }
        sig = 0;
    }
    {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "signal", NULL)) {
            cinfer_log_str(&l, "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            cinfer_log_end(&l);
        }
    }
    cinfer_server_drain(srv, (int64_t)(cfg.drain_timeout_s * 1000.0));
    rc = 0;
out:
    /* The server first: it cancels what still runs in the engine and waits
     * for every call to be freed, while the engine still delivers the
     * FINISH events. */
    cinfer_server_destroy(srv);
    cinfer_engine_destroy(engine);
    cinfer_model_destroy(model);
    cinfer_backend_destroy(backend);
    cinfer_metrics_destroy(metrics);
    return rc;
}
