/*
 * orca.h - ORCA load reports (xds.data.orca.v3.OrcaLoadReport), so gRPC's
 * weighted_round_robin policy and Envoy's client-side weighted round robin
 * balance on the replica's real load.
 *
 * Two ways out, as the ORCA design has them:
 *   per call     the trailer `endpoint-load-metrics-bin` (the serialized
 *                report) on every cinfer.v1.Inference response, rejections
 *                included
 *   out of band  xds.service.orca.v3.OpenRcaService/StreamCoreMetrics: a
 *                server stream with one report at once and then one every
 *                report_interval (raised to CINFER_ORCA_MIN_INTERVAL_MS;
 *                above CINFER_ORCA_MAX_INTERVAL_S, negative or with nanos
 *                outside [0, 1e9) it is INVALID_ARGUMENT naming
 *                report_interval)
 *
 * What a report holds:
 *   cpu_utilization          process CPU time over wall time, per CPU the
 *                            process may use (affinity, and the cgroup v2
 *                            cpu.max quota a Kubernetes CPU limit sets),
 *                            measured over at least 1 s
 *   application_utilization  max(kv_cache_usage, running / max_seqs): what
 *                            limits an LLM server is its KV cache and its
 *                            batch, not its host CPU
 *   rps_fractional, eps      Inference calls ended per second, and those
 *                            that ended with a non-OK status, over the last
 *                            CINFER_ORCA_RATE_BUCKETS seconds
 *   named_metrics            kv_cache_usage, num_requests_running,
 *                            num_requests_waiting: the numbers /metrics
 *                            serves as cinfer:kv_cache_usage_perc,
 *                            cinfer:num_requests_running and
 *                            cinfer:num_requests_waiting
 *
 * The value types below (rate window, CPU sampler) take the time as an
 * argument and hold no locks, so tests drive them with made-up clocks; the
 * server's cinfer_orca object wraps them with a mutex and runs one thread
 * that sends the out-of-band reports.
 */
#ifndef CINFER_SERVER_ORCA_H
#define CINFER_SERVER_ORCA_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CINFER_ORCA_RATE_BUCKETS 10      /* seconds in the rate window */
#define CINFER_ORCA_MIN_INTERVAL_MS 100  /* shortest out-of-band interval */
#define CINFER_ORCA_MAX_INTERVAL_S 3600  /* longest one accepted */
#define CINFER_ORCA_CPU_SAMPLE_NS 1000000000LL /* CPU measured over >= 1 s */

/* ---- rate window (value type) ------------------------------------------ */

/* Calls and errors per one-second bucket; bucket i holds second sec[i]. */
typedef struct {
    int64_t start_ns;                 /* first time seen */
    int64_t last_ns;                  /* latest time seen (the clock never
                                         goes back inside the window) */
    int64_t sec[CINFER_ORCA_RATE_BUCKETS];
    uint32_t calls[CINFER_ORCA_RATE_BUCKETS];
    uint32_t errors[CINFER_ORCA_RATE_BUCKETS];
} cinfer_orca_rate;

void cinfer_orca_rate_init(cinfer_orca_rate *r, int64_t now_ns);
/* One call ended at now_ns (error = not OK). A time earlier than the
 * latest seen counts as the latest. */
void cinfer_orca_rate_add(cinfer_orca_rate *r, int64_t now_ns, int error);
/* Calls and errors per second over the window's seconds up to now_ns (at
 * most CINFER_ORCA_RATE_BUCKETS s, at least 1 s, never before start). */
void cinfer_orca_rate_get(const cinfer_orca_rate *r, int64_t now_ns,
                          double *rps, double *eps);

/* ---- CPU utilization (value type) -------------------------------------- */

typedef struct {
    int64_t wall_ns, cpu_ns;  /* the sample the next measure starts from */
    double util;              /* latest measured utilization */
    int measured;             /* util comes from a full sample */
} cinfer_orca_cpu;

void cinfer_orca_cpu_init(cinfer_orca_cpu *c, int64_t wall_ns, int64_t cpu_ns);
/* The utilization at (wall_ns, cpu_ns) for n_cpus CPUs: re-measured when
 * CINFER_ORCA_CPU_SAMPLE_NS passed since the last sample, else the last measure
 * (or, before the first, the partial one). Clocks that go back yield the
 * last value. */
double cinfer_orca_cpu_update(cinfer_orca_cpu *c, int64_t wall_ns,
                              int64_t cpu_ns, double n_cpus);

/* CPUs the process may use: its affinity set, capped by the cgroup v2
 * quota in `cpu_max` (the text of /sys/fs/cgroup/cpu.max, "max 100000" or
 * "200000 100000"; NULL = none). At least a fraction > 0. */
double cinfer_orca_cpus(int affinity_cpus, const char *cpu_max);

/* ---- the report ---------------------------------------------------------- */

typedef struct {
    double cpu_utilization;
    double application_utilization;
    double rps, eps;
    double kv_cache_usage;
    int running, waiting;
} cinfer_orca_numbers;

/* Serializes the numbers as an OrcaLoadReport into a malloc'd buffer
 * (*out, *len; free it). CINFER_E_NOMEM when out of memory. */
cinfer_status cinfer_orca_pack(const cinfer_orca_numbers *n, uint8_t **out,
                               size_t *len);

/* Validates an OrcaLoadReportRequest's report_interval (has = it is set)
 * and gives the interval used. CINFER_E_INVALID_ARG with the field named
 * when it is negative, its nanos are outside [0, 1e9) or it is longer than
 * CINFER_ORCA_MAX_INTERVAL_S. */
cinfer_status cinfer_orca_interval(int has, int64_t seconds, int32_t nanos,
                                   int64_t *interval_ns);

/* ---- the server's reporter (needs the server internals) ----------------- */

struct cinfer_server;
struct rpc_method;
typedef struct cinfer_orca cinfer_orca;

/* The reporter of server s (borrowed; it outlives the reporter) and its
 * out-of-band thread. CINFER_E_NOMEM or CINFER_E_INTERNAL (no thread). */
cinfer_status cinfer_orca_create(struct cinfer_server *s, cinfer_orca **out);
/* Stops the out-of-band thread (streams get no more reports); before the
 * server lets its engine go. NULL is fine. */
void cinfer_orca_stop(cinfer_orca *o);
/* After every call is freed. NULL is fine. */
void cinfer_orca_destroy(cinfer_orca *o);

/* An Inference call ended at now_ns; error = its status is not OK.
 * Thread-safe. */
void cinfer_orca_note_call(cinfer_orca *o, int64_t now_ns, int error);

/* The numbers of the report at now_ns. Thread-safe. */
void cinfer_orca_numbers_get(cinfer_orca *o, int64_t now_ns,
                             cinfer_orca_numbers *out);

/* The per-call trailer: key endpoint-load-metrics-bin, the report packed
 * (slices owned by the caller: unref both). Returns 0 when out of memory
 * (no trailer). Thread-safe. */
int cinfer_orca_trailer(cinfer_orca *o, int64_t now_ns, grpc_metadata *out);

/* xds.service.orca.v3.OpenRcaService/StreamCoreMetrics (orca.c). */
extern const struct rpc_method cinfer_rpc_orca_stream;

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_ORCA_H */
