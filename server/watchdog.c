/*
 * watchdog.c - the server's timer thread: health that reflects the engine,
 * queued requests re-checked against the shedder, KV pressure fed to it.
 *
 * gRPC threads never block or sleep (server_impl.h), so periodic work runs
 * here, one small thread woken every WATCHDOG_TICK_MS from attach to
 * destroy. Each tick:
 *
 *   - reads the engine's statistics: the KV-cache usage goes to the
 *     shedder (its KV-pressure signal);
 *   - stuck engine: while the engine has work (running or waiting
 *     requests) and its step counter has not moved for watchdog_ms, health
 *     is NOT_SERVING (a hung device, a deadlocked kernel); it is SERVING
 *     again as soon as a step completes;
 *   - device faults: unhealthy_after_faults requests in a row that ended
 *     with a device error (CINFER_E_DEVICE) make health NOT_SERVING.
 *     Since a NOT_SERVING replica gets no traffic to prove it recovered,
 *     the watchdog then sends the engine a one-token probe every
 *     PROBE_INTERVAL_MS; the first probe (or request) that produces a
 *     token makes it SERVING again;
 *   - a lost device: once the engine reports that the backend hit a
 *     sticky fault (cinfer_backend_healthy 0: the CUDA context is
 *     unusable), health is NOT_SERVING for good and no probes are sent;
 *     the process keeps running and answering, so the orchestrator sees
 *     the state and replaces the replica;
 *   - queued Generate calls are re-checked against the shedder (their
 *     deadline, CoDel), which may shed them (generate.c);
 *   - calls still waiting for their request message after the receive
 *     timeout (half-open streams) are ended (server.c);
 *   - a change of health is told to Health.Watch streams.
 *
 * The thread owns the probe's engine request: stop cancels it and waits
 * for its FINISH, so the engine never calls back into a freed server.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "server/log.h"
#include "server/server_impl.h"

#define WATCHDOG_TICK_MS 10
#define PROBE_INTERVAL_MS 1000

/* ---------------------------------------------------------------------- */
/* Faults                                                                 */
/* ---------------------------------------------------------------------- */

void cinfer_watchdog_note_outcome(cinfer_server *s, int fault, int ok)
{
    if (fault) {
        int run = atomic_fetch_add(&s->fault_run, 1) + 1;
        int limit = s->params.unhealthy_after_faults;
        if (limit > 0 && run >= limit)
            atomic_store(&s->faulted, 1);
    } else if (ok) {
        atomic_store(&s->fault_run, 0);
        atomic_store(&s->faulted, 0);
    }
}

/* Engine thread: the probe's events. */
static void on_probe_event(void *user, const cinfer_engine_event *ev)
{
    cinfer_server *s = user;
    if (ev->kind != CINFER_EVENT_FINISH)
        return;
    int fault = ev->finish == CINFER_FINISH_ERROR &&
                ev->status == CINFER_E_DEVICE;
    int ok = ev->completion_tokens > 0 && ev->finish != CINFER_FINISH_ERROR;
    cinfer_watchdog_note_outcome(s, fault, ok);
    atomic_store(&s->probe_ok, ok);
    pthread_mutex_lock(&s->mu);
    s->probe_inflight = 0;
    pthread_cond_broadcast(&s->wd_cv);
    pthread_mutex_unlock(&s->mu);
}

/* Submits a one-token greedy request from BOS. Watchdog thread. */
static void send_probe(cinfer_server *s)
{
    int32_t tok = cinfer_tokenizer_bos(s->tk);
    if (tok < 0 || tok >= s->limits.n_vocab)
        tok = 0;
    cinfer_request_params rp = cinfer_request_default_params();
    rp.prompt = &tok;
    rp.n_prompt = 1;
    rp.sampling = cinfer_sampler_default_params();
    rp.sampling.n_vocab = s->limits.n_vocab;
    rp.sampling.temperature = 0;
    rp.max_tokens = 1;
    rp.ignore_eos = 1;
    rp.priority = CINFER_PRIORITY_MAX;
    rp.deadline_ns = cinfer_server_now_ns() +
                     (int64_t)PROBE_INTERVAL_MS * 10 * 1000000;
    rp.on_event = on_probe_event;
    rp.user = s;
    pthread_mutex_lock(&s->mu);
    s->probe_inflight = 1;
    pthread_mutex_unlock(&s->mu);
    uint64_t id = 0;
    if (cinfer_engine_submit(s->engine, &rp, &id) != CINFER_OK) {
        pthread_mutex_lock(&s->mu);
        s->probe_inflight = 0;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->probe_id = id;
    pthread_mutex_unlock(&s->mu);
    cinfer_log(CINFER_LOG_INFO, "health probe sent", NULL);
}

/* ---------------------------------------------------------------------- */
/* The thread                                                             */
/* ---------------------------------------------------------------------- */

static void log_health_change(cinfer_server *s, int healthy)
{
    cinfer_log_line l;
    if (!cinfer_log_begin(&l, healthy ? CINFER_LOG_INFO : CINFER_LOG_WARN,
                          healthy ? "engine healthy" : "engine unhealthy",
                          NULL))
        return;
    cinfer_log_int(&l, "stuck", atomic_load(&s->stuck));
    cinfer_log_int(&l, "faulted", atomic_load(&s->faulted));
    cinfer_log_int(&l, "device_lost", atomic_load(&s->device_lost));
    cinfer_log_int(&l, "device_faults_in_a_row", atomic_load(&s->fault_run));
    cinfer_log_end(&l);
}

static void *watchdog_main(void *arg)
{
    cinfer_server *s = arg;
    uint64_t last_steps = 0;
    int64_t last_progress = cinfer_server_now_ns();
    int64_t last_probe = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (!s->watchdog_stop) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += WATCHDOG_TICK_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (!s->watchdog_stop &&
                   pthread_cond_timedwait(&s->wd_cv, &s->mu, &ts) !=
                       ETIMEDOUT) {
            }
        }
        int stop = s->watchdog_stop;
        int probing = s->probe_inflight;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;

        int64_t now = cinfer_server_now_ns();
        cinfer_engine_stats es;
        cinfer_engine_get_stats(s->engine, &es);
        if (s->adm && es.kv_blocks_total > 0)
            cinfer_admission_set_kv_usage(
                s->adm, (uint32_t)((int64_t)es.kv_blocks_used * 1000 /
                                   es.kv_blocks_total));
        if (s->adm)
            cinfer_admission_set_engine_waiting(s->adm, es.waiting);

        /* Stuck: work and no step. */
        if (es.running + es.waiting > 0 && es.steps == last_steps) {
            if (s->params.watchdog_ms > 0 &&
                now - last_progress >= cinfer_ms_to_ns(s->params.watchdog_ms))
                atomic_store(&s->stuck, 1);
        } else {
            last_steps = es.steps;
            last_progress = now;
            atomic_store(&s->stuck, 0);
        }

        if (es.device_lost && !atomic_load(&s->device_lost)) {
            atomic_store(&s->device_lost, 1);
            cinfer_log(CINFER_LOG_ERROR,
                       "device lost: the backend reported a sticky fault; "
                       "health stays NOT_SERVING",
                       NULL);
        }

        /* Faulted: probe the engine now and then (a lost device does not
         * come back, so it is not probed). */
        if (atomic_load(&s->faulted) && !atomic_load(&s->device_lost) &&
            !probing &&
            now - last_probe >= cinfer_ms_to_ns(PROBE_INTERVAL_MS)) {
            last_probe = now;
            send_probe(s);
        }

        cinfer_generate_check_queued(s, now);
        cinfer_server_expire_receives(s, now);

        int healthy = cinfer_server_healthy(s);
        if (healthy != s->health_reported) {
            s->health_reported = healthy;
            /* Outside SERVING, attach and drain tell the streams. */
            if (atomic_load(&s->state) == SERVER_SERVING) {
                log_health_change(s, healthy);
                cinfer_health_notify(s);
            }
        }
    }
    return NULL;
}

cinfer_status cinfer_watchdog_start(cinfer_server *s)
{
    s->health_reported = 1; /* attach sets SERVING next and tells */
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0)
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cannot start the watchdog thread");
    s->watchdog_started = 1;
    return CINFER_OK;
}

void cinfer_watchdog_stop(cinfer_server *s)
{
    if (!s->watchdog_started)
        return;
    pthread_mutex_lock(&s->mu);
    s->watchdog_stop = 1;
    pthread_cond_broadcast(&s->wd_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->watchdog, NULL);
    s->watchdog_started = 0;

    /* The probe's FINISH must come before the server goes. */
    pthread_mutex_lock(&s->mu);
    int probing = s->probe_inflight;
    uint64_t id = s->probe_id;
    pthread_mutex_unlock(&s->mu);
    if (probing)
        cinfer_engine_cancel(s->engine, id);
    pthread_mutex_lock(&s->mu);
    while (s->probe_inflight)
        pthread_cond_wait(&s->wd_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}
