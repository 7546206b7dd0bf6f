/*
 * health.c - grpc.health.v1.Health: Check (unary) and Watch (stream).
 *
 * The server's status is SERVING only between attach (model loaded) and
 * drain, and while the engine works: the watchdog (watchdog.c) turns it
 * NOT_SERVING while the engine is stuck or keeps failing with device
 * faults. Before and after, and then, it is NOT_SERVING, so load balancers
 * and Kubernetes probes route around a replica that is loading, stopping or
 * broken. Health calls pass no admission control: they answer however
 * loaded the server is.
 * Service names: "" (the whole server) and every service the server
 * exports share that status; any other name is NOT_FOUND for Check and
 * SERVICE_UNKNOWN for Watch, as the protocol asks.
 *
 * Watch streams sit on srv->watch_list. A status change (attach, drain)
 * calls cinfer_health_notify, which sends the new status on every stream
 * with no send in flight and marks the others dirty; their send completion
 * sends the latest status. A stream ends when the client cancels it or at
 * server shutdown.
 */
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "server/log.h"
#include "server/server_impl.h"

typedef struct {
    int known;      /* the watched service exists */
    int in_flight;  /* a send is in flight (c->mu) */
    int dirty;      /* the status changed while it was (c->mu) */
    int last_sent;  /* last status sent, -1 = none (c->mu) */
} watch_state;

static int service_known(const cinfer_server *s, const char *name)
{
    if (!name || !name[0])
        return 1;
    for (size_t i = 0; i < cinfer_refl_index_n_services(s->refl); i++)
        if (strcmp(cinfer_refl_index_service(s->refl, i), name) == 0)
            return 1;
    return 0;
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus
server_status(const cinfer_server *s)
{
    return cinfer_server_healthy(s)
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

static grpc_byte_buffer *pack_status(int status)
{
    Grpc__Health__V1__HealthCheckResponse resp =
        GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = status;
    return cinfer_bb_pack(&resp.base);
}

/* ---- Check ------------------------------------------------------------- */

static cinfer_status check(srv_call *c, const uint8_t *req, size_t len,
                           grpc_byte_buffer **out)
{
    cinfer_call_set_request_id(c, NULL);
    Grpc__Health__V1__HealthCheckRequest *r =
        grpc__health__v1__health_check_request__unpack(NULL, len, req);
    if (!r)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "HealthCheckRequest does not decode");
    cinfer_status st = CINFER_OK;
    if (!service_known(c->srv, r->service))
        st = cinfer_set_error(CINFER_E_NOT_FOUND, "unknown service %.200s",
                              r->service);
    grpc__health__v1__health_check_request__free_unpacked(r, NULL);
    if (st != CINFER_OK)
        return st;
    *out = pack_status(server_status(c->srv));
    if (!*out)
        return cinfer_set_error(CINFER_E_NOMEM, "health: no memory");
    return CINFER_OK;
}

static void check_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_call_unary(c, msg, check);
}

/* ---- Watch ------------------------------------------------------------- */

/* Sends the current status if it differs from the last one sent and
 * nothing is in flight. c->mu held. */
static void watch_pump(srv_call *c, watch_state *w)
{
    if (w->in_flight || c->closed)
        return;
    int status = w->known
                     ? (int)server_status(c->srv)
                     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    w->dirty = 0;
    if (status == w->last_sent)
        return;
    grpc_byte_buffer *bb = pack_status(status);
    if (!bb)
        return;
    w->in_flight = 1;
    w->last_sent = status;
    if (!cinfer_call_send_message(c, OP_SEND, bb))
        w->in_flight = 0;
}

static void watch_on_message(srv_call *c, grpc_byte_buffer *msg)
{
    cinfer_server *s = c->srv;
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
    int ok = 1;
    Grpc__Health__V1__HealthCheckRequest *r =
        ok ? grpc__health__v1__health_check_request__unpack(NULL, len, buf)
           : NULL;
    free(buf);
    watch_state *w = calloc(1, sizeof *w);
    if (!r || !w) {
        free(w);
        if (r)
            grpc__health__v1__health_check_request__free_unpacked(r, NULL);
        cinfer_call_send_status(c, OP_STEP, NULL,
                                ok && w ? CINFER_E_INVALID_ARG
                                        : CINFER_E_NOMEM,
                                "HealthCheckRequest does not decode");
        return;
    }
    w->known = service_known(s, r->service);
    w->last_sent = -1;
    grpc__health__v1__health_check_request__free_unpacked(r, NULL);
    c->rpc = w;
    c->state = CALL_STREAMING;

    pthread_mutex_lock(&s->mu);
    c->listed = 1;
    c->prev = NULL;
    c->next = s->watch_list;
    if (s->watch_list)
        s->watch_list->prev = c;
    s->watch_list = c;
    pthread_mutex_lock(&c->mu);
    watch_pump(c, w);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&s->mu);
}

static void watch_on_send(srv_call *c, int ok)
{
    watch_state *w = c->rpc;
    pthread_mutex_lock(&c->mu);
    if (c->send_buf) {
        grpc_byte_buffer_destroy(c->send_buf);
        c->send_buf = NULL;
    }
    w->in_flight = 0;
    if (ok)
        watch_pump(c, w);
    pthread_mutex_unlock(&c->mu);
}

static void watch_free(srv_call *c)
{
    free(c->rpc);
    c->rpc = NULL;
}

void cinfer_health_notify(cinfer_server *s)
{
    pthread_mutex_lock(&s->mu);
    for (srv_call *c = s->watch_list; c; c = c->next) {
        pthread_mutex_lock(&c->mu);
        watch_state *w = c->rpc;
        if (w) {
            w->dirty = 1;
            watch_pump(c, w);
        }
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&s->mu);
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "health", NULL)) {
        cinfer_log_str(&l, "status",
                       server_status(s) ==
                               GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                           ? "SERVING"
                           : "NOT_SERVING");
        cinfer_log_end(&l);
    }
}

const rpc_method cinfer_rpc_health_check = {
    .path = "/grpc.health.v1.Health/Check",
    .kind = RPC_HEALTH_CHECK,
    .on_message = check_on_message,
};

const rpc_method cinfer_rpc_health_watch = {
    .path = "/grpc.health.v1.Health/Watch",
    .kind = RPC_HEALTH_WATCH,
    .on_message = watch_on_message,
    .on_send = watch_on_send,
    .free_rpc = watch_free,
};
