/*
 * orca.c - ORCA load reports: the rate window and CPU sampler, the report,
 * the per-call trailer and the out-of-band StreamCoreMetrics stream (see
 * orca.h).
 *
 * Out-of-band streams sit on the reporter's own list, each holding a
 * reference on its call from the moment it is listed until its
 * RECV_CLOSE_ON_SERVER completes. The reporter's thread sleeps until the
 * earliest stream is due, builds one report for every due stream and
 * starts its send (OP_SEND) unless the previous one is still in flight; a
 * slow client so gets fewer reports, never a queue of them. Lock order:
 * o->mu, then the engine's own (stats); no call or server lock is taken
 * under o->mu.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "server/orca.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "google/protobuf/duration.pb-c.h"
#include "server/log.h"
#include "server/server_impl.h"
#include "xds/data/orca/v3/orca_load_report.pb-c.h"
#include "xds/service/orca/v3/orca.pb-c.h"

#define NS_PER_S 1000000000LL

/* ---------------------------------------------------------------------- */
/* Rate window                                                            */
/* ---------------------------------------------------------------------- */

void cinfer_orca_rate_init(cinfer_orca_rate *r, int64_t now_ns)
{
    memset(r, 0, sizeof *r);
    r->start_ns = now_ns;
    r->last_ns = now_ns;
    for (int i = 0; i < CINFER_ORCA_RATE_BUCKETS; i++)
        r->sec[i] = INT64_MIN;
}

static int64_t sec_of(int64_t ns)
{
    /* Floor division: the monotonic clock is >= 0, but tests may start
     * anywhere. */
    return ns >= 0 ? ns / NS_PER_S : -((-ns + NS_PER_S - 1) / NS_PER_S);
}

static int bucket_of(int64_t sec)
{
    int64_t m = sec % CINFER_ORCA_RATE_BUCKETS;
    return (int)(m < 0 ? m + CINFER_ORCA_RATE_BUCKETS : m);
}

void cinfer_orca_rate_add(cinfer_orca_rate *r, int64_t now_ns, int error)
{
    if (now_ns < r->last_ns)
        now_ns = r->last_ns;
    r->last_ns = now_ns;
    int64_t sec = sec_of(now_ns);
    int b = bucket_of(sec);
    if (r->sec[b] != sec) {
        r->sec[b] = sec;
        r->calls[b] = 0;
        r->errors[b] = 0;
    }
    if (r->calls[b] < UINT32_MAX)
        r->calls[b]++;
    if (error && r->errors[b] < UINT32_MAX)
        r->errors[b]++;
}

void cinfer_orca_rate_get(const cinfer_orca_rate *r, int64_t now_ns,
                          double *rps, double *eps)
{
    if (now_ns < r->last_ns)
        now_ns = r->last_ns;
    int64_t cur = sec_of(now_ns);
    int64_t first = cur - (CINFER_ORCA_RATE_BUCKETS - 1);
    uint64_t calls = 0, errors = 0;
    for (int i = 0; i < CINFER_ORCA_RATE_BUCKETS; i++) {
        if (r->sec[i] >= first && r->sec[i] <= cur) {
            calls += r->calls[i];
            errors += r->errors[i];
        }
    }
    /* The window runs from the start of its oldest second (or from the
     * first time seen, if later) to now. */
    int64_t from = first * NS_PER_S;
    if (from < r->start_ns)
        from = r->start_ns;
    int64_t span = now_ns - from;
    if (span < NS_PER_S)
        span = NS_PER_S;
    *rps = (double)calls * (double)NS_PER_S / (double)span;
    *eps = (double)errors * (double)NS_PER_S / (double)span;
}

/* ---------------------------------------------------------------------- */
/* CPU                                                                    */
/* ---------------------------------------------------------------------- */

void cinfer_orca_cpu_init(cinfer_orca_cpu *c, int64_t wall_ns, int64_t cpu_ns)
{
    memset(c, 0, sizeof *c);
    c->wall_ns = wall_ns;
    c->cpu_ns = cpu_ns;
}

double cinfer_orca_cpu_update(cinfer_orca_cpu *c, int64_t wall_ns,
                              int64_t cpu_ns, double n_cpus)
{
    int64_t dwall = wall_ns - c->wall_ns;
    int64_t dcpu = cpu_ns - c->cpu_ns;
    if (dwall <= 0 || n_cpus <= 0)
        return c->util;
    if (dcpu < 0)
        dcpu = 0;
    double u = (double)dcpu / ((double)dwall * n_cpus);
    if (dwall >= CINFER_ORCA_CPU_SAMPLE_NS) {
        c->util = u;
        c->measured = 1;
        c->wall_ns = wall_ns;
        c->cpu_ns = cpu_ns;
    } else if (!c->measured) {
        c->util = u;
    }
    return c->util;
}

double cinfer_orca_cpus(int affinity_cpus, const char *cpu_max)
{
    double n = affinity_cpus > 0 ? (double)affinity_cpus : 1.0;
    long long quota, period;
    if (cpu_max && sscanf(cpu_max, "%lld %lld", &quota, &period) == 2 &&
        quota > 0 && period > 0) {
        double q = (double)quota / (double)period;
        if (q < n)
            n = q;
    }
    return n;
}

/* ---------------------------------------------------------------------- */
/* Report and interval                                                    */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_orca_pack(const cinfer_orca_numbers *n, uint8_t **out,
                               size_t *len)
{
    /* The initializer sets the deprecated `rps` field (to 0; it is never
     * sent), which clang reports. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    Xds__Data__Orca__V3__OrcaLoadReport r =
        XDS__DATA__ORCA__V3__ORCA_LOAD_REPORT__INIT;
#pragma GCC diagnostic pop
    Xds__Data__Orca__V3__OrcaLoadReport__NamedMetricsEntry e[3];
    Xds__Data__Orca__V3__OrcaLoadReport__NamedMetricsEntry *ep[3];
    static const char *const names[3] = {"kv_cache_usage",
                                         "num_requests_running",
                                         "num_requests_waiting"};
    double vals[3] = {n->kv_cache_usage, (double)n->running,
                      (double)n->waiting};
    for (int i = 0; i < 3; i++) {
        Xds__Data__Orca__V3__OrcaLoadReport__NamedMetricsEntry init =
            XDS__DATA__ORCA__V3__ORCA_LOAD_REPORT__NAMED_METRICS_ENTRY__INIT;
        e[i] = init;
        e[i].key = (char *)names[i];
        e[i].value = vals[i];
        ep[i] = &e[i];
    }
    r.cpu_utilization = n->cpu_utilization;
    r.application_utilization = n->application_utilization;
    r.rps_fractional = n->rps;
    r.eps = n->eps;
    r.n_named_metrics = 3;
    r.named_metrics = ep;
    size_t sz = protobuf_c_message_get_packed_size(&r.base);
    uint8_t *buf = malloc(sz ? sz : 1);
    if (!buf)
        return cinfer_set_error(CINFER_E_NOMEM, "orca: no memory");
    protobuf_c_message_pack(&r.base, buf);
    *out = buf;
    *len = sz;
    return CINFER_OK;
}

cinfer_status cinfer_orca_interval(int has, int64_t seconds, int32_t nanos,
                                   int64_t *interval_ns)
{
    if (has) {
        if (nanos < 0 || nanos >= NS_PER_S)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "report_interval: nanos must be in "
                                    "[0, 999999999], got %d",
                                    (int)nanos);
        if (seconds < 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "report_interval must not be negative, "
                                    "got %llds",
                                    (long long)seconds);
        if (seconds > CINFER_ORCA_MAX_INTERVAL_S ||
            (seconds == CINFER_ORCA_MAX_INTERVAL_S && nanos > 0))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "report_interval must be at most %ds, "
                                    "got %llds",
                                    CINFER_ORCA_MAX_INTERVAL_S,
                                    (long long)seconds);
    }
    int64_t ns = has ? seconds * NS_PER_S + nanos : 0;
    /* Unset or shorter than the minimum: the minimum, as gRPC's own ORCA
     * service does. */
    if (ns < (int64_t)CINFER_ORCA_MIN_INTERVAL_MS * 1000000)
        ns = (int64_t)CINFER_ORCA_MIN_INTERVAL_MS * 1000000;
    *interval_ns = ns;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* The server's reporter                                                  */
/* ---------------------------------------------------------------------- */

typedef struct oob_stream oob_stream;
struct oob_stream {
    srv_call *call;
    int64_t interval_ns;
    int64_t next_ns;     /* when the next report is due */
    int in_flight;       /* a send is in flight (o->mu) */
    int listed;          /* on o->streams, holding a call reference */
    oob_stream *next, *prev;
};

struct cinfer_orca {
    cinfer_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started;
    int stop;
    cinfer_orca_rate rate;
    cinfer_orca_cpu cpu;
    double n_cpus;
    oob_stream *streams;
};

static int64_t process_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static double detect_cpus(void)
{
    cpu_set_t set;
    int aff = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        aff = CPU_COUNT(&set);
    char buf[64] = {0};
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f))
            buf[0] = '\0';
        fclose(f);
    }
    return cinfer_orca_cpus(aff, f ? buf : NULL);
}

void cinfer_orca_numbers_get(cinfer_orca *o, int64_t now_ns,
                             cinfer_orca_numbers *out)
{
    cinfer_server *s = o->srv;
    memset(out, 0, sizeof *out);
    /* The engine is published by attach before SERVING (as for /metrics). */
    if (atomic_load(&s->state) != SERVER_LOADING && s->engine) {
        cinfer_engine_stats es;
        cinfer_engine_get_stats(s->engine, &es);
        out->running = es.running;
        out->waiting = es.waiting;
        out->kv_cache_usage = es.kv_blocks_total > 0
                                  ? (double)es.kv_blocks_used /
                                        (double)es.kv_blocks_total
                                  : 0.0;
    }
    double batch = s->params.max_seqs > 0
                       ? (double)out->running / (double)s->params.max_seqs
                       : 0.0;
    out->application_utilization =
        out->kv_cache_usage > batch ? out->kv_cache_usage : batch;
    int64_t cpu = process_cpu_ns();
    pthread_mutex_lock(&o->mu);
    out->cpu_utilization = cinfer_orca_cpu_update(&o->cpu, now_ns, cpu,
                                                  o->n_cpus);
    cinfer_orca_rate_get(&o->rate, now_ns, &out->rps, &out->eps);
    pthread_mutex_unlock(&o->mu);
}

void cinfer_orca_note_call(cinfer_orca *o, int64_t now_ns, int error)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    cinfer_orca_rate_add(&o->rate, now_ns, error);
    pthread_mutex_unlock(&o->mu);
}

static grpc_byte_buffer *pack_report(const cinfer_orca_numbers *n)
{
    uint8_t *buf;
    size_t len;
    if (cinfer_orca_pack(n, &buf, &len) != CINFER_OK)
        return NULL;
    return cinfer_bb_wrap(buf, len);
}

int cinfer_orca_trailer(cinfer_orca *o, int64_t now_ns, grpc_metadata *out)
{
    cinfer_orca_numbers n;
    cinfer_orca_numbers_get(o, now_ns, &n);
    uint8_t *buf;
    size_t len;
    if (cinfer_orca_pack(&n, &buf, &len) != CINFER_OK)
        return 0;
    memset(out, 0, sizeof *out);
    out->key = grpc_slice_from_static_string("endpoint-load-metrics-bin");
    out->value = grpc_slice_from_copied_buffer((const char *)buf, len);
    free(buf);
    return 1;
}

/* The earliest time a stream with no send in flight is due (INT64_MAX =
 * none). o->mu held. */
static int64_t earliest_due(const cinfer_orca *o)
{
    int64_t t = INT64_MAX;
    for (const oob_stream *st = o->streams; st; st = st->next)
        if (!st->in_flight && st->next_ns < t)
            t = st->next_ns;
    return t;
}

/* Starts a send of the report on every due stream with no send in flight.
 * o->mu held. */
static void send_due(cinfer_orca *o, int64_t now, const cinfer_orca_numbers *n)
{
    for (oob_stream *st = o->streams; st; st = st->next) {
        if (st->in_flight || st->next_ns > now)
            continue;
        grpc_byte_buffer *bb = pack_report(n);
        if (!bb)
            return; /* out of memory: retried at the next wake */
        st->in_flight = 1;
        /* The next one an interval after this one, without catching up
         * on reports a slow client missed. */
        st->next_ns += st->interval_ns;
        if (st->next_ns < now)
            st->next_ns = now + st->interval_ns;
        if (!cinfer_call_send_message(st->call, OP_SEND, bb)) {
            st->in_flight = 0;
            st->next_ns = INT64_MAX; /* the call is gone */
        }
    }
}

static void *reporter_main(void *arg)
{
    cinfer_orca *o = arg;
    pthread_mutex_lock(&o->mu);
    while (!o->stop) {
        int64_t now = cinfer_server_now_ns();
        int64_t due = earliest_due(o);
        if (due <= now) {
            pthread_mutex_unlock(&o->mu);
            cinfer_orca_numbers n;
            cinfer_orca_numbers_get(o, now, &n);
            pthread_mutex_lock(&o->mu);
            if (!o->stop)
                send_due(o, now, &n);
            continue;
        }
        if (due == INT64_MAX) {
            pthread_cond_wait(&o->cv, &o->mu);
            continue;
        }
        struct timespec ts = {(time_t)(due / NS_PER_S),
                              (long)(due % NS_PER_S)};
        pthread_cond_timedwait(&o->cv, &o->mu, &ts);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

cinfer_status cinfer_orca_create(cinfer_server *s, cinfer_orca **out)
{
    *out = NULL;
    cinfer_orca *o = calloc(1, sizeof *o);
    if (!o)
        return cinfer_set_error(CINFER_E_NOMEM, "orca: no memory");
    o->srv = s;
    pthread_mutex_init(&o->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&o->cv, &ca);
    pthread_condattr_destroy(&ca);
    int64_t now = cinfer_server_now_ns();
    cinfer_orca_rate_init(&o->rate, now);
    cinfer_orca_cpu_init(&o->cpu, now, process_cpu_ns());
    o->n_cpus = detect_cpus();
    if (pthread_create(&o->thread, NULL, reporter_main, o) != 0) {
        cinfer_orca_destroy(o);
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cannot start the load report thread");
    }
    o->started = 1;
    *out = o;
    return CINFER_OK;
}

void cinfer_orca_stop(cinfer_orca *o)
{
    if (!o || !o->started)
        return;
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    o->started = 0;
}

void cinfer_orca_destroy(cinfer_orca *o)
{
    if (!o)
        return;
    cinfer_orca_stop(o);
    CINFER_ASSERT(o->streams == NULL);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

/* ---------------------------------------------------------------------- */
/* StreamCoreMetrics                                                      */
/* ---------------------------------------------------------------------- */

static void orca_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_orca *o = c->srv->orca;
    cinfer_call_set_request_id(c, NULL);
    if (!msg) {
        cinfer_call_send_status(c, OP_STEP, NULL, CINFER_E_INVALID_ARG,
                                "the request message is missing");
        return;
    }
    uint8_t *buf;
    size_t len;
    cinfer_status rst = cinfer_call_read(c, msg, &buf, &len);
    grpc_byte_buffer_destroy(msg);
    if (rst != CINFER_OK) {
        cinfer_call_send_status(c, OP_STEP, NULL, rst, cinfer_last_error());
        return;
    }
    Xds__Service__Orca__V3__OrcaLoadReportRequest *r =
        xds__service__orca__v3__orca_load_report_request__unpack(NULL, len,
                                                                 buf);
    free(buf);
    if (!r) {
        cinfer_call_send_status(c, OP_STEP, NULL, CINFER_E_INVALID_ARG,
                                "OrcaLoadReportRequest does not decode");
        return;
    }
    int64_t interval_ns = 0;
    cinfer_clear_error();
    cinfer_status st = cinfer_orca_interval(
        r->report_interval != NULL,
        r->report_interval ? r->report_interval->seconds : 0,
        r->report_interval ? r->report_interval->nanos : 0, &interval_ns);
    xds__service__orca__v3__orca_load_report_request__free_unpacked(r, NULL);
    if (st != CINFER_OK) {
        cinfer_call_send_status(c, OP_STEP, NULL, st, cinfer_last_error());
        return;
    }
    oob_stream *os = calloc(1, sizeof *os);
    if (!os) {
        cinfer_call_send_status(c, OP_STEP, NULL, CINFER_E_NOMEM,
                                "orca: no memory");
        return;
    }
    os->call = c;
    os->interval_ns = interval_ns;
    os->next_ns = cinfer_server_now_ns(); /* the first report at once */
    c->rpc = os;
    c->state = CALL_STREAMING;

    /* A call already closed (same thread: its close ran before) is never
     * listed, so its reference cannot leak. */
    pthread_mutex_lock(&c->mu);
    int closed = c->closed;
    pthread_mutex_unlock(&c->mu);
    if (closed)
        return;
    cinfer_call_ref(c);
    pthread_mutex_lock(&o->mu);
    os->listed = 1;
    os->next = o->streams;
    if (o->streams)
        o->streams->prev = os;
    o->streams = os;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);

    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "orca stream", c->request_id)) {
        cinfer_log_int(&l, "interval_ms", interval_ns / 1000000);
        cinfer_log_end(&l);
    }
}

static void orca_on_send(srv_call *c, int ok)
{
    cinfer_orca *o = c->srv->orca;
    oob_stream *os = c->rpc;
    pthread_mutex_lock(&o->mu);
    if (c->send_buf) {
        grpc_byte_buffer_destroy(c->send_buf);
        c->send_buf = NULL;
    }
    os->in_flight = 0;
    if (!ok)
        os->next_ns = INT64_MAX; /* the stream is broken: no more sends */
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void orca_on_close(srv_call *c)
{
    cinfer_orca *o = c->srv->orca;
    oob_stream *os = c->rpc;
    if (!os)
        return;
    pthread_mutex_lock(&o->mu);
    int listed = os->listed;
    if (listed) {
        if (os->prev)
            os->prev->next = os->next;
        else
            o->streams = os->next;
        if (os->next)
            os->next->prev = os->prev;
        os->listed = 0;
    }
    pthread_mutex_unlock(&o->mu);
    if (listed)
        cinfer_call_unref(c);
}

static void orca_free(srv_call *c)
{
    free(c->rpc);
    c->rpc = NULL;
}

const rpc_method cinfer_rpc_orca_stream = {
    .path = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics",
    .kind = RPC_ORCA_STREAM,
    .on_message = orca_on_message,
    .on_send = orca_on_send,
    .on_close = orca_on_close,
    .free_rpc = orca_free,
};
