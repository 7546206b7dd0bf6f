/*
 * model_group.c - one rank model per thread, one step for all (see
 * model_group.h).
 *
 * Rank 0 runs on the caller's thread; ranks 1..N-1 each own a thread that
 * sleeps on the group's condition variable until a new step is posted
 * (gen advances), runs its forward, and counts itself done. The ranks
 * meet only inside the communicator's collectives; the logits they write
 * are disjoint columns of the caller's buffer.
 */
#include "model_group.h"

#include "common/thread_priority.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    cinfer_model_group *g;
    int rank;
    cinfer_status st;
    char err[512]; /* the rank thread's error text (thread-local there) */
} rank_slot;

struct cinfer_model_group {
    int n;
    cinfer_comm *comms[CINFER_COMM_MAX_RANKS];
    cinfer_backend **be;
    cinfer_model **models;
    rank_slot *slots;
    pthread_t *threads;
    int n_threads_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;        /* advances once per posted step */
    int n_done;          /* rank threads done with step gen */
    int quit;
    const cinfer_step *step;
    float *logits;

    int thread_prio;     /* cinfer_thread_prio of the rank threads; 0 = as
                            created */
    int broken;          /* a rank failed a step: the communicator is spent */
    char broken_why[512];
};

static void run_rank(rank_slot *s)
{
    cinfer_model_group *g = s->g;
    s->st = cinfer_model_forward(g->models[s->rank], g->step, g->logits);
    if (s->st != CINFER_OK) {
        snprintf(s->err, sizeof s->err, "rank %d: %s", s->rank,
                 cinfer_last_error());
        /* The others may be waiting for this rank in a collective it will
         * not reach: release them now rather than at the timeout. */
        cinfer_comm_abort(g->comms[s->rank], s->err);
    }
}

static void *rank_main(void *arg)
{
    rank_slot *s = arg;
    cinfer_model_group *g = s->g;
    uint64_t seen = 0;
    /* A rank thread computes as the engine thread does (rank 0), so it
     * takes the compute priority the backends' workers have. */
    if (g->thread_prio)
        cinfer_thread_set_priority((cinfer_thread_prio)g->thread_prio);
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->quit && g->gen == seen)
            pthread_cond_wait(&g->cv_go, &g->mu);
        if (g->quit)
            break;
        seen = g->gen;
        pthread_mutex_unlock(&g->mu);
        run_rank(s);
        pthread_mutex_lock(&g->mu);
        if (++g->n_done == g->n - 1)
            pthread_cond_signal(&g->cv_done);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int cinfer_model_group_size(const cinfer_model_group *g) { return g->n; }

cinfer_model *cinfer_model_group_rank(cinfer_model_group *g, int r)
{
    return g->models[r];
}

uint64_t cinfer_model_group_weights_held_max(const cinfer_model_group *g)
{
    uint64_t mx = 0;
    for (int r = 0; r < g->n; r++) {
        uint64_t b = cinfer_model_get_info(g->models[r])->weights_held_bytes;
        mx = b > mx ? b : mx;
    }
    return mx;
}

int cinfer_model_group_healthy(cinfer_model_group *g)
{
    if (g->broken)
        return 0;
    for (int r = 0; r < g->n; r++)
        if (!cinfer_backend_healthy(g->be[r]))
            return 0;
    return 1;
}

void cinfer_model_group_destroy(cinfer_model_group *g)
{
    if (!g)
        return;
    if (g->threads) {
        pthread_mutex_lock(&g->mu);
        g->quit = 1;
        pthread_cond_broadcast(&g->cv_go);
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; i < g->n_threads_started; i++)
            pthread_join(g->threads[i], NULL);
    }
    /* models before their backends, backends before the communicator */
    for (int r = 0; g->models && r < g->n; r++)
        cinfer_model_destroy(g->models[r]);
    for (int r = 0; g->be && r < g->n; r++)
        cinfer_backend_destroy(g->be[r]);
    for (int r = 0; r < g->n; r++)
        cinfer_comm_destroy(g->comms[r]);
    pthread_cond_destroy(&g->cv_go);
    pthread_cond_destroy(&g->cv_done);
    pthread_mutex_destroy(&g->mu);
    free(g->threads);
    free(g->slots);
    free(g->models);
    free(g->be);
    free(g);
}

/* Load progress of rank r of n, over the whole group's load. */
typedef struct {
    const cinfer_model_params *p;
    int r, n;
} progress_ctx;

static void rank_progress(float f, void *user)
{
    const progress_ctx *c = user;
    c->p->progress(((float)c->r + f) / (float)c->n, c->p->progress_user);
}

cinfer_status cinfer_model_group_create(const cinfer_model_params *p,
                                        cinfer_model_group **out)
{
    *out = NULL;
    int n = p->tensor_parallel;
    if (n < 2 || n > CINFER_COMM_MAX_RANKS || p->backend)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: needs tensor_parallel 2..%d "
                                "and no backend (got %d%s)",
                                CINFER_COMM_MAX_RANKS, n,
                                p->backend ? ", a backend" : "");
    cinfer_model_group *g = calloc(1, sizeof *g);
    if (!g)
        return cinfer_set_error(CINFER_E_NOMEM, "model_group: out of memory");
    g->n = n;
    g->thread_prio = p->thread_prio;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv_go, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    g->be = calloc((size_t)n, sizeof *g->be);
    g->models = calloc((size_t)n, sizeof *g->models);
    g->slots = calloc((size_t)n, sizeof *g->slots);
    g->threads = calloc((size_t)n, sizeof *g->threads);
    cinfer_status st;
    if (!g->be || !g->models || !g->slots || !g->threads) {
        st = cinfer_set_error(CINFER_E_NOMEM, "model_group: out of memory");
        goto fail;
    }
    cinfer_comm_local_params cp = cinfer_comm_local_default_params();
    cp.n_ranks = n;
    if ((st = cinfer_comm_create_local(&cp, g->comms)) != CINFER_OK)
        goto fail;

    /* The cores are shared out: each rank's pool gets its part. */
    int threads = p->n_threads;
    if (threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : c > 1024 ? 1024 : (int)c;
    }
    int per_rank = threads / n > 0 ? threads / n : 1;

    /* Ranks load one after another: the file is read once at a time, and
     * each rank gives back what it does not keep before the next reads. */
    for (int r = 0; r < n; r++) {
        cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
        bp.n_threads = per_rank;
        bp.isa = p->isa;
        bp.thread_prio = p->thread_prio;
        bp.comm = g->comms[r];
        if ((st = cinfer_backend_cpu_create(&bp, &g->be[r])) != CINFER_OK)
            goto fail;
        cinfer_model_params mp = *p;
        mp.backend = g->be[r];
        mp.tp_rank = r;
        progress_ctx pc = {p, r, n};
        if (p->progress) {
            mp.progress = rank_progress;
            mp.progress_user = &pc;
        }
        if ((st = cinfer_model_create(&mp, &g->models[r])) != CINFER_OK)
            goto fail;
    }

    for (int r = 0; r < n; r++) {
        g->slots[r].g = g;
        g->slots[r].rank = r;
    }
    for (int r = 1; r < n; r++) {
        if (pthread_create(&g->threads[r - 1], NULL, rank_main,
                           &g->slots[r]) != 0) {
            st = cinfer_set_error(CINFER_E_INTERNAL,
                                  "model_group: cannot start the thread of "
                                  "rank %d",
                                  r);
            goto fail;
        }
        g->n_threads_started++;
    }
    *out = g;
    return CINFER_OK;

fail:
    /* keep the first error's message: destroy sets none */
    cinfer_model_group_destroy(g);
    return st;
}

cinfer_status cinfer_model_group_forward(cinfer_model_group *g,
                                         const cinfer_step *step,
                                         float *logits)
{
    if (g->broken)
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "model_group: the tensor-parallel group is "
                                "broken since a failed step (%s); restart "
                                "the model",
                                g->broken_why);
    pthread_mutex_lock(&g->mu);
    g->step = step;
    g->logits = logits;
    g->n_done = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv_go);
    pthread_mutex_unlock(&g->mu);

    run_rank(&g->slots[0]);

    pthread_mutex_lock(&g->mu);
    while (g->n_done < g->n - 1)
        pthread_cond_wait(&g->cv_done, &g->mu);
    pthread_mutex_unlock(&g->mu);

    /* The first rank in order that failed names the step's error; a rank
     * that only saw the abort comes after the one that caused it. */
    const rank_slot *bad = NULL;
    for (int r = 0; r < g->n; r++) {
        const rank_slot *s = &g->slots[r];
        if (s->st == CINFER_OK)
            continue;
        if (!bad || (bad->st == CINFER_E_CANCELLED &&
                     s->st != CINFER_E_CANCELLED))
            bad = s;
    }
    if (!bad)
        return CINFER_OK;
    g->broken = 1;
    snprintf(g->broken_why, sizeof g->broken_why, "%s", bad->err);
    return cinfer_set_error(bad->st, "model_group: %s", bad->err);
}
