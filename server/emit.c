/*
 * emit.c - the emission thread (server_impl.h): Generate streams whose
 * next Chunk or status is ready, sent from here rather than from the
 * engine's thread. Packing a Chunk and grpc_call_start_batch (which may
 * run the transport's write, syscalls included, on the calling thread)
 * then happen while the engine schedules and launches its next step: on
 * a GPU backend that time would otherwise be the device's idle time
 * between steps. A FIFO of calls linked through the calls themselves
 * (srv_call.emit_next), each queued at most once (the sink's emit_posted),
 * so queueing never allocates.
 */
#include <stdlib.h>

#include "server/server_impl.h"

struct srv_emitter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_call *head, *tail; /* under mu */
    int stop;              /* under mu */
    int started;
    pthread_t thread;
};

static void *emit_main(void *arg)
{
    srv_emitter *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && !e->head)
            pthread_cond_wait(&e->cv, &e->mu);
        srv_call *c = e->head;
        if (!c)
            break; /* stopping and drained */
        e->head = c->emit_next;
        if (!e->head)
            e->tail = NULL;
        c->emit_next = NULL;
        pthread_mutex_unlock(&e->mu);
        cinfer_generate_emit(c);
        cinfer_call_unref(c);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

cinfer_status cinfer_emitter_create(srv_emitter **out)
{
    *out = NULL;
    srv_emitter *e = calloc(1, sizeof *e);
    if (!e)
        return cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->thread, NULL, emit_main, e) != 0) {
        cinfer_emitter_destroy(e);
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cannot start the emission thread");
    }
    e->started = 1;
    *out = e;
    return CINFER_OK;
}

int cinfer_emitter_post(srv_emitter *e, srv_call *c)
{
    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        return 0;
    }
    cinfer_call_ref(c);
    c->emit_next = NULL;
    if (e->tail)
        e->tail->emit_next = c;
    else
        e->head = c;
    e->tail = c;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 1;
}

void cinfer_emitter_destroy(srv_emitter *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->started)
        pthread_join(e->thread, NULL);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}
