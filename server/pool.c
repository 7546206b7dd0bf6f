/*
 * pool.c - the request threads (server_impl.h): two FIFOs of calls whose
 * message a request thread handles, linked through the calls themselves
 * (srv_call.pool_next), so queueing never allocates. Small messages (a
 * usual Generate) have their own lane, served first, and one more thread
 * of normal priority that serves only that lane, so that they never wait
 * behind 4 MB Tokenize calls, queued or running.
 */
#include <stdlib.h>

#include "common/thread_priority.h"
#include "server/server_impl.h"

/* Messages up to this size take the small lane. */
#define SMALL_MESSAGE_BYTES 65536

typedef struct {
    srv_call *head, *tail;
} lane;

struct srv_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lane lanes[2];           /* [0] small, [1] large; under mu */
    int queued;              /* under mu */
    int queue_max;
    int stop;                /* under mu */
    int n_threads;           /* started, the small lane's one included */
    pthread_t *threads;
};

static void run_pool(srv_pool *p, int small_only)
{
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && (small_only ? !p->lanes[0].head : !p->queued))
            pthread_cond_wait(&p->cv, &p->mu);
        lane *l = p->lanes[0].head || small_only ? &p->lanes[0]
                                                 : &p->lanes[1];
        srv_call *c = l->head;
        if (!c)
            break; /* stopping and drained */
        l->head = c->pool_next;
        if (!l->head)
            l->tail = NULL;
        p->queued--;
        pthread_mutex_unlock(&p->mu);
        grpc_byte_buffer *msg = c->pool_msg;
        c->pool_msg = NULL;
        c->pool_next = NULL;
        c->method->on_message(c, msg);
        cinfer_call_unref(c);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
}

static void *small_main(void *arg)
{
    run_pool(arg, 1);
    return NULL;
}

static void *pool_main(void *arg)
{
    cinfer_thread_set_priority(CINFER_THREAD_PRIO_LOW);
    run_pool(arg, 0);
    return NULL;
}

cinfer_status cinfer_pool_create(int n_threads, int queue_max,
                                 srv_pool **out)
{
    *out = NULL;
    srv_pool *p = calloc(1, sizeof *p);
    if (!p)
        return cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
    p->threads = calloc((size_t)n_threads + 1, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->queue_max = queue_max;
    for (int i = 0; i <= n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL,
                           i == n_threads ? small_main : pool_main, p) != 0) {
            cinfer_pool_destroy(p);
            return cinfer_set_error(CINFER_E_INTERNAL,
                                    "cannot start a request thread");
        }
        p->n_threads++;
    }
    *out = p;
    return CINFER_OK;
}

int cinfer_pool_push(srv_pool *p, srv_call *c, grpc_byte_buffer *msg)
{
    pthread_mutex_lock(&p->mu);
    if (p->stop || p->queued >= p->queue_max) {
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    cinfer_call_ref(c);
    c->pool_msg = msg;
    c->pool_next = NULL;
    lane *l = &p->lanes[msg && grpc_byte_buffer_length(msg) >
                                   SMALL_MESSAGE_BYTES];
    if (l->tail)
        l->tail->pool_next = c;
    else
        l->head = c;
    l->tail = c;
    p->queued++;
    /* Both kinds of thread wait on cv: wake them all, the ones with
     * nothing for them sleep again. */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 1;
}

void cinfer_pool_destroy(srv_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}
