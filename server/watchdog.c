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
 *   - the hooks the server registered run (cinfer_watchdog_add_hook):
 *     queued Generate calls re-checked against the shedder, calls still
 *     waiting for their request message ended; the watchdog knows
 *     neither;
 *   - the gRPC port is probed (plaintext): a port that stops accepting
 *     connections makes health NOT_SERVING until it accepts again;
 *   - (the server's last hook tells Health.Watch streams of a change of
 *     health.)
 *
 * The thread owns the probe's engine request: stop cancels it and waits
 * for its FINISH, so the engine never calls back into a freed server.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/log.h"
#include "server/server_impl.h"

#define WATCHDOG_TICK_MS 10
#define PROBE_INTERVAL_MS 1000

/* The listener probe: every LISTENER_PROBE_MS a connection to the server's
 * own port must be answered (its SETTINGS frame) within the same time;
 * LISTENER_MISSES misses in a row make health NOT_SERVING. */
#define LISTENER_PROBE_MS 1000
#define LISTENER_MISSES 2

#define MAX_HOOKS 6

/* The watchdog's own state: its thread, the health it watches, the probe
 * it owns, and the hooks other files registered for each tick. */
struct cinfer_watchdog {
    cinfer_server *srv;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* wakes the thread to stop; the probe's
                                    end (mu) */
    int stop;                    /* under mu */
    int probe_inflight;          /* a health probe runs in the engine (mu) */
    uint64_t probe_id;           /* its engine id (mu) */
    atomic_int probe_ok;         /* the last probe produced a token */
    atomic_int stuck;            /* the engine made no step for watchdog_ms
                                    while it had work */
    atomic_int faulted;          /* unhealthy_after_faults device faults in
                                    a row, no success since */
    atomic_int device_lost;      /* the backend hit a sticky fault; never
                                    cleared */
    atomic_int fault_run;        /* device faults in a row */
    atomic_int listener_dead;    /* the gRPC port stopped accepting */
    cinfer_watchdog_hook hooks[MAX_HOOKS];
    void *hook_user[MAX_HOOKS];
    int n_hooks;
};

cinfer_status cinfer_watchdog_create(cinfer_server *s, cinfer_watchdog **out)
{
    cinfer_watchdog *w = calloc(1, sizeof *w);
    if (!w)
        return cinfer_set_error(CINFER_E_NOMEM, "watchdog: no memory");
    w->srv = s;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    *out = w;
    return CINFER_OK;
}

void cinfer_watchdog_destroy(cinfer_watchdog *w)
{
    if (!w)
        return;
    cinfer_watchdog_stop(w);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

cinfer_status cinfer_watchdog_add_hook(cinfer_watchdog *w,
                                       cinfer_watchdog_hook fn, void *user)
{
    if (w->started || w->n_hooks == MAX_HOOKS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "watchdog: a hook is added before start, at "
                                "most %d",
                                MAX_HOOKS);
    w->hooks[w->n_hooks] = fn;
    w->hook_user[w->n_hooks] = user;
    w->n_hooks++;
    return CINFER_OK;
}

int cinfer_watchdog_healthy(const cinfer_watchdog *w)
{
    cinfer_watchdog *m = (cinfer_watchdog *)w;
    return !atomic_load(&m->stuck) && !atomic_load(&m->faulted) &&
           !atomic_load(&m->device_lost) && !atomic_load(&m->listener_dead);
}

/* ---------------------------------------------------------------------- */
/* Faults                                                                 */
/* ---------------------------------------------------------------------- */

void cinfer_watchdog_note_outcome(cinfer_watchdog *w, int fault, int ok)
{
    cinfer_watchdog *s = w;
    if (fault) {
        int run = atomic_fetch_add(&s->fault_run, 1) + 1;
        int limit = w->srv->params.unhealthy_after_faults;
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
    cinfer_watchdog *w = user;
    if (ev->kind != CINFER_EVENT_FINISH)
        return;
    int fault = ev->finish == CINFER_FINISH_ERROR &&
                ev->status == CINFER_E_DEVICE;
    int ok = ev->completion_tokens > 0 && ev->finish != CINFER_FINISH_ERROR;
    cinfer_watchdog_note_outcome(w, fault, ok);
    atomic_store(&w->probe_ok, ok);
    pthread_mutex_lock(&w->mu);
    w->probe_inflight = 0;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Submits a one-token greedy request from BOS. Watchdog thread. */
static void send_probe(cinfer_watchdog *w)
{
    cinfer_server *s = w->srv;
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
    rp.user = w;
    pthread_mutex_lock(&w->mu);
    w->probe_inflight = 1;
    pthread_mutex_unlock(&w->mu);
    uint64_t id = 0;
    if (cinfer_engine_submit(s->engine, &rp, &id) != CINFER_OK) {
        pthread_mutex_lock(&w->mu);
        w->probe_inflight = 0;
        pthread_mutex_unlock(&w->mu);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->probe_id = id;
    pthread_mutex_unlock(&w->mu);
    cinfer_log(CINFER_LOG_INFO, "health probe sent", NULL);
}

/* ---------------------------------------------------------------------- */
/* The thread                                                             */
/* ---------------------------------------------------------------------- */

void cinfer_watchdog_log_health(const cinfer_watchdog *w, int healthy)
{
    cinfer_watchdog *s = (cinfer_watchdog *)w;
    cinfer_log_line l;
    if (!cinfer_log_begin(&l, healthy ? CINFER_LOG_INFO : CINFER_LOG_WARN,
                          healthy ? "engine healthy" : "engine unhealthy",
                          NULL))
        return;
    cinfer_log_int(&l, "stuck", atomic_load(&s->stuck));
    cinfer_log_int(&l, "faulted", atomic_load(&s->faulted));
    cinfer_log_int(&l, "device_lost", atomic_load(&s->device_lost));
    cinfer_log_int(&l, "device_faults_in_a_row", atomic_load(&s->fault_run));
    cinfer_log_int(&l, "listener_dead", atomic_load(&s->listener_dead));
    cinfer_log_end(&l);
}

/* ---------------------------------------------------------------------- */
/* Listener probe                                                         */
/* ---------------------------------------------------------------------- */

/* A plaintext port that no longer accepts (gRPC core's listener gives up
 * when file descriptors run out) leaves every running call and the health
 * service looking fine. So the watchdog connects to its own port now and
 * then, sends the HTTP/2 preface and waits for the server's SETTINGS:
 * a connection that sits in the kernel's backlog gets none, and a socket
 * that cannot be made (no descriptor left) is a miss too. With TLS the
 * probe is off (a preface without a handshake would be logged as a failed
 * handshake each time). One step per tick, never blocking. */
typedef struct {
    struct sockaddr_storage addr;
    socklen_t addr_len;
    int enabled;
    int fd;              /* -1 = no probe in flight */
    int sent;            /* the preface is written */
    int64_t started_ns;
    int64_t next_ns;
    int misses;
} listener_probe;

static void probe_init(listener_probe *p, const cinfer_server *s)
{
    memset(p, 0, sizeof *p);
    p->fd = -1;
    if (s->tls || s->port <= 0)
        return;
    /* The host of --listen; a wildcard is reached over loopback. */
    char host[256];
    const char *l = s->listen;
    const char *colon = strrchr(l, ':');
    size_t hl = colon ? (size_t)(colon - l) : 0;
    if (hl >= sizeof host)
        return;
    memcpy(host, l, hl);
    host[hl] = '\0';
    char *h = host;
    if (h[0] == '[') {
        h++;
        char *e = strchr(h, ']');
        if (e)
            *e = '\0';
    }
    if (!h[0] || strcmp(h, "0.0.0.0") == 0)
        h = "127.0.0.1";
    else if (strcmp(h, "::") == 0)
        h = "::1";
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    if (getaddrinfo(h, port, &hints, &res) != 0 || !res)
        return;
    if (res->ai_addrlen <= sizeof p->addr) {
        memcpy(&p->addr, res->ai_addr, res->ai_addrlen);
        p->addr_len = res->ai_addrlen;
        p->enabled = 1;
    }
    freeaddrinfo(res);
}

static void probe_close(listener_probe *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    p->sent = 0;
}

static void probe_verdict(cinfer_watchdog *s, listener_probe *p, int ok,
                          int64_t now)
{
    probe_close(p);
    p->next_ns = now + cinfer_ms_to_ns(LISTENER_PROBE_MS);
    p->misses = ok ? 0 : p->misses + 1;
    int dead = p->misses >= LISTENER_MISSES;
    if (dead != atomic_load(&s->listener_dead)) {
        atomic_store(&s->listener_dead, dead);
        cinfer_log(dead ? CINFER_LOG_ERROR : CINFER_LOG_INFO,
                   dead ? "the gRPC port does not accept connections; "
                          "health NOT_SERVING"
                        : "the gRPC port accepts connections again",
                   NULL);
    }
}

static void probe_step(cinfer_watchdog *s, listener_probe *p, int64_t now)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                  "\0\0\0\4\0\0\0\0\0"; /* SETTINGS */
    if (!p->enabled)
        return;
    if (p->fd < 0) {
        if (now < p->next_ns)
            return;
        p->started_ns = now;
        p->fd = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK |
                                               SOCK_CLOEXEC,
                       0);
        if (p->fd < 0) {
            probe_verdict(s, p, 0, now); /* no descriptor left */
            return;
        }
        if (connect(p->fd, (struct sockaddr *)&p->addr, p->addr_len) != 0 &&
            errno != EINPROGRESS) {
            probe_verdict(s, p, 0, now);
            return;
        }
    }
    struct pollfd pf = {p->fd, (short)(p->sent ? POLLIN : POLLOUT), 0};
    if (poll(&pf, 1, 0) > 0) {
        if (!p->sent && (pf.revents & POLLOUT)) {
            ssize_t n = send(p->fd, preface, sizeof preface - 1,
                             MSG_NOSIGNAL);
            if (n != (ssize_t)(sizeof preface - 1)) {
                probe_verdict(s, p, 0, now);
                return;
            }
            p->sent = 1;
        } else if (p->sent && (pf.revents & (POLLIN | POLLHUP | POLLERR))) {
            /* Bytes (its SETTINGS), or a close: the port accepted. */
            char buf[64];
            ssize_t n = recv(p->fd, buf, sizeof buf, 0);
            probe_verdict(s, p, n >= 0, now);
            return;
        } else if (pf.revents & (POLLHUP | POLLERR)) {
            probe_verdict(s, p, 0, now); /* refused */
            return;
        }
    }
    if (now - p->started_ns >= cinfer_ms_to_ns(LISTENER_PROBE_MS))
        probe_verdict(s, p, 0, now);
}

/* One tick's look at the engine: KV usage and queue to admission, stuck,
 * lost device, the probe. */
static void watch_engine(cinfer_watchdog *w, int64_t now, int probing,
                         uint64_t *last_steps, int64_t *last_progress,
                         int64_t *last_probe)
{
    cinfer_server *s = w->srv;
    cinfer_engine_stats es;
    cinfer_engine_get_stats(s->engine, &es);
    if (s->adm && es.kv_blocks_total > 0)
        cinfer_admission_set_kv_usage(
            s->adm, (uint32_t)((int64_t)es.kv_blocks_used * 1000 /
                               es.kv_blocks_total));
    if (s->adm)
        cinfer_admission_set_engine_waiting(s->adm, es.waiting);

    /* Stuck: work and no step. */
    if (es.running + es.waiting > 0 && es.steps == *last_steps) {
        if (s->params.watchdog_ms > 0 &&
            now - *last_progress >= cinfer_ms_to_ns(s->params.watchdog_ms))
            atomic_store(&w->stuck, 1);
    } else {
        *last_steps = es.steps;
        *last_progress = now;
        atomic_store(&w->stuck, 0);
    }

    if (es.device_lost && !atomic_load(&w->device_lost)) {
        atomic_store(&w->device_lost, 1);
        cinfer_log(CINFER_LOG_ERROR,
                   "device lost: the backend reported a sticky fault; "
                   "health stays NOT_SERVING",
                   NULL);
    }

    /* Faulted: probe the engine now and then (a lost device does not come
     * back, so it is not probed). */
    if (atomic_load(&w->faulted) && !atomic_load(&w->device_lost) &&
        !probing && now - *last_probe >= cinfer_ms_to_ns(PROBE_INTERVAL_MS)) {
        *last_probe = now;
        send_probe(w);
    }
}

static void *watchdog_main(void *arg)
{
    cinfer_watchdog *w = arg;
    cinfer_server *s = w->srv;
    uint64_t last_steps = 0;
    int64_t last_progress = cinfer_server_now_ns();
    int64_t last_probe = 0;
    listener_probe lp;
    probe_init(&lp, s);
    for (;;) {
        pthread_mutex_lock(&w->mu);
        if (!w->stop) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += WATCHDOG_TICK_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            while (!w->stop &&
                   pthread_cond_timedwait(&w->cv, &w->mu, &ts) != ETIMEDOUT) {
            }
        }
        int stop = w->stop;
        int probing = w->probe_inflight;
        pthread_mutex_unlock(&w->mu);
        if (stop) {
            probe_close(&lp);
            break;
        }

        int64_t now = cinfer_server_now_ns();
        watch_engine(w, now, probing, &last_steps, &last_progress,
                     &last_probe);
        for (int i = 0; i < w->n_hooks; i++)
            w->hooks[i](w->hook_user[i], now);
        probe_step(w, &lp, now);
    }
    return NULL;
}

cinfer_status cinfer_watchdog_start(cinfer_watchdog *w)
{
    if (pthread_create(&w->thread, NULL, watchdog_main, w) != 0)
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cannot start the watchdog thread");
    w->started = 1;
    return CINFER_OK;
}

void cinfer_watchdog_stop(cinfer_watchdog *w)
{
    if (!w || !w->started)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    w->started = 0;

    /* The probe's FINISH must come before the server goes. */
    pthread_mutex_lock(&w->mu);
    int probing = w->probe_inflight;
    uint64_t id = w->probe_id;
    pthread_mutex_unlock(&w->mu);
    if (probing)
        cinfer_engine_cancel(w->srv->engine, id);
    pthread_mutex_lock(&w->mu);
    while (w->probe_inflight)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}
