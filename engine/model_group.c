/*
 * model_group.c - one rank model per thread, one step for all (see
 * model_group.h).
 *
 * Local rank 0 runs on the caller's thread; local ranks 1..n-1 each own a
 * thread that sleeps on the group's condition variable until a new step is
 * posted (gen advances), runs its forward, and counts itself done. The
 * ranks meet only inside the communicator's collectives; the logits they
 * write are disjoint columns of the caller's buffer (or, over several
 * processes, global rank 0 writes them all after an all-gather).
 *
 * Several processes (n_nodes > 1, CUDA ranks): the rendezvous that hands
 * out NCCL's unique id stays open as a channel between node 0 and each
 * other node (comm.h: keep_open). Over it, after every node has loaded
 * its ranks:
 *
 *   node k -> 0  READY   magic "CINFGRP1", u32 order mark 0x01020304,
 *                        status, n_kv_blocks, n_vocab, n_layer, n_embd,
 *                        max_batch_rows, n_ctx, block_size, u64
 *                        weight_bytes, u32 len, message[len]
 *   node 0 -> k  CONFIG  magic, status, n_kv_blocks (the group's: the
 *                        smallest of any rank's), len, message[len]
 *   node 0 -> k  STEP    magic, op 1, n_rows, n_seqs, block_size,
 *                        max_blocks, n_out, has_gen, then the step's
 *                        arrays (tokens, positions, row_seq, slots,
 *                        block_tables, out_rows, row_gen if has_gen)
 *   node k -> 0  DONE    status, len, message[len]
 *   node 0 -> k  QUIT    magic, op 2, six zero words
 *
 * Words are u32/i32 in the hosts' own byte order, which READY's order mark
 * checks is the same on every node. Node 0 sends a step to every node
 * before its own ranks start (the collectives need all ranks), then waits
 * for each DONE, bounded by dist_timeout_ms; a node's failure names its
 * rank and breaks the group everywhere, as a local rank's does.
 */
#include "model_group.h"

#include "common/thread_priority.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GROUP_MAGIC "CINFGRP1"
#define ORDER_MARK 0x01020304u
#define DEFAULT_TIMEOUT_MS 60000
#define MAX_MSG 511
/* Bounds a follower puts on a step's header before allocating for it. */
#define MAX_STEP_ROWS 65536
#define MAX_STEP_TABLE (1 << 26)

enum { OP_STEP = 1, OP_QUIT = 2 };

typedef struct {
    cinfer_model_group *g;
    int local; /* index among this process's ranks */
    cinfer_status st;
    char err[MAX_MSG + 1]; /* the rank thread's error text (thread-local
                              there) */
} rank_slot;

struct cinfer_model_group {
    int n;          /* ranks in this process */
    int world;      /* ranks over every node */
    int first_rank; /* global rank of local rank 0 */
    int n_nodes, node_rank;
    int timeout_ms; /* each wait for another node */
    int kv_blocks;  /* the group's: the smallest of any rank's */
    cinfer_rendezvous *rv; /* n_nodes > 1: the channel */
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
    char broken_why[4 * (MAX_MSG + 1)];

    /* a follower's copy of the step it runs */
    int32_t *step_buf;
    size_t step_cap; /* int32 words */
};

static void run_rank(rank_slot *s)
{
    cinfer_model_group *g = s->g;
    s->st = cinfer_model_forward(g->models[s->local], g->step, g->logits);
    if (s->st != CINFER_OK) {
        snprintf(s->err, sizeof s->err, "rank %d: %s",
                 g->first_rank + s->local, cinfer_last_error());
        /* The others may be waiting for this rank in a collective it will
         * not reach: release them now rather than at the timeout. */
        cinfer_comm_abort(g->comms[s->local], s->err);
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

int cinfer_model_group_size(const cinfer_model_group *g) { return g->world; }

int cinfer_model_group_local_size(const cinfer_model_group *g) { return g->n; }

int cinfer_model_group_kv_blocks(const cinfer_model_group *g)
{
    return g->kv_blocks;
}

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

void cinfer_model_group_graph_stats(const cinfer_model_group *g,
                                    cinfer_backend_graph_stats *out)
{
    /* every rank runs every step, so the first's counts are the group's */
    cinfer_backend_graph_stats_get(g->be[0], out);
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

/* ---------------------------------------------------------------------- */
/* the channel between nodes                                               */
/* ---------------------------------------------------------------------- */

/* A status word and a message: DONE, and the tail of READY and CONFIG. */
static cinfer_status send_status(cinfer_model_group *g, int peer,
                                 cinfer_status st, const char *msg)
{
    size_t len = msg ? strlen(msg) : 0;
    if (len > MAX_MSG)
        len = MAX_MSG;
    uint32_t w[2] = {(uint32_t)st, (uint32_t)len};
    cinfer_status e =
        cinfer_rendezvous_send(g->rv, peer, w, sizeof w, g->timeout_ms);
    if (e == CINFER_OK && len)
        e = cinfer_rendezvous_send(g->rv, peer, msg, len, g->timeout_ms);
    return e;
}

static cinfer_status recv_status(cinfer_model_group *g, int peer,
                                 cinfer_status *st, char *msg)
{
    uint32_t w[2];
    msg[0] = '\0';
    cinfer_status e =
        cinfer_rendezvous_recv(g->rv, peer, w, sizeof w, g->timeout_ms);
    if (e != CINFER_OK)
        return e;
    if (w[1] > MAX_MSG)
        return cinfer_set_error(CINFER_E_IO,
                                "model_group: node %d sent a %u-byte message "
                                "(at most %d)",
                                peer, w[1], MAX_MSG);
    if (w[1] && (e = cinfer_rendezvous_recv(g->rv, peer, msg, w[1],
                                            g->timeout_ms)) != CINFER_OK)
        return e;
    msg[w[1]] = '\0';
    *st = (cinfer_status)w[0];
    return CINFER_OK;
}

/* READY's fixed part: what node 0 checks every node loaded alike. */
typedef struct {
    char magic[8];
    uint32_t order, n_kv_blocks, n_vocab, n_layer, n_embd, max_rows, n_ctx,
        block_size;
    uint64_t weight_bytes;
} ready_msg;

static ready_msg ready_of(const cinfer_model *m)
{
    const cinfer_model_info *I = cinfer_model_get_info(m);
    ready_msg r;
    memset(&r, 0, sizeof r);
    memcpy(r.magic, GROUP_MAGIC, 8);
    r.order = ORDER_MARK;
    r.n_kv_blocks = (uint32_t)I->n_kv_blocks;
    r.n_vocab = (uint32_t)I->n_vocab;
    r.n_layer = (uint32_t)I->n_layer;
    r.n_embd = (uint32_t)I->n_embd;
    r.max_rows = (uint32_t)I->max_batch_rows;
    r.n_ctx = (uint32_t)I->n_ctx;
    r.block_size = (uint32_t)I->block_size;
    r.weight_bytes = I->weight_bytes;
    return r;
}

/* Node k > 0 after its load (st: how it went): READY, then node 0's
 * CONFIG. On success the group takes CONFIG's KV block count. */
static cinfer_status follower_handshake(cinfer_model_group *g,
                                        cinfer_status st)
{
    char why[4 * (MAX_MSG + 1)];
    snprintf(why, sizeof why, "%s", st == CINFER_OK ? "" : cinfer_last_error());
    ready_msg r;
    if (st == CINFER_OK) {
        r = ready_of(g->models[0]);
    } else {
        memset(&r, 0, sizeof r);
        memcpy(r.magic, GROUP_MAGIC, 8);
        r.order = ORDER_MARK;
    }
    cinfer_status e =
        cinfer_rendezvous_send(g->rv, 0, &r, sizeof r, g->timeout_ms);
    if (e == CINFER_OK)
        e = send_status(g, 0, st, why);
    if (st != CINFER_OK) {
        /* The load's error is the one to report. */
        return cinfer_set_error(st, "%s", why);
    }
    if (e != CINFER_OK)
        return e;
    char cmagic[8];
    uint32_t kv = 0;
    cinfer_status cst = CINFER_OK;
    char msg[MAX_MSG + 1];
    if ((e = cinfer_rendezvous_recv(g->rv, 0, cmagic, 8, g->timeout_ms)) !=
            CINFER_OK ||
        (e = cinfer_rendezvous_recv(g->rv, 0, &kv, 4, g->timeout_ms)) !=
            CINFER_OK ||
        (e = recv_status(g, 0, &cst, msg)) != CINFER_OK)
        return e;
    if (memcmp(cmagic, GROUP_MAGIC, 8) != 0)
        return cinfer_set_error(CINFER_E_IO,
                                "model_group: node 0 did not answer as a "
                                "cinfer group");
    if (cst != CINFER_OK)
        return cinfer_set_error(cst, "model_group: node 0: %s", msg);
    g->kv_blocks = (int)kv;
    return CINFER_OK;
}

/* CONFIG to every other node, best effort (a node that is gone fails its
 * own wait). */
static void send_config(cinfer_model_group *g, int kv, cinfer_status st,
                        const char *why)
{
    uint32_t w = (uint32_t)kv;
    for (int k = 1; k < g->n_nodes; k++)
        if (cinfer_rendezvous_send(g->rv, k, GROUP_MAGIC, 8, g->timeout_ms) ==
                CINFER_OK &&
            cinfer_rendezvous_send(g->rv, k, &w, 4, g->timeout_ms) ==
                CINFER_OK)
            (void)send_status(g, k, st, why);
}

/* Node 0 after its load: every node's READY, checked against its own;
 * then CONFIG to each (the group's KV blocks, or why it failed). */
static cinfer_status leader_handshake(cinfer_model_group *g)
{
    ready_msg mine = ready_of(g->models[0]);
    cinfer_status st = CINFER_OK;
    char why[4 * (MAX_MSG + 1)] = "";
    int kv = (int)mine.n_kv_blocks;
    for (int k = 1; k < g->n_nodes && st == CINFER_OK; k++) {
        ready_msg r;
        char msg[MAX_MSG + 1];
        cinfer_status pst = CINFER_OK;
        cinfer_status e =
            cinfer_rendezvous_recv(g->rv, k, &r, sizeof r, g->timeout_ms);
        if (e == CINFER_OK)
            e = recv_status(g, k, &pst, msg);
        if (e != CINFER_OK) {
            st = e;
            snprintf(why, sizeof why, "node %d did not report its load: %s",
                     k, cinfer_last_error());
        } else if (memcmp(r.magic, GROUP_MAGIC, 8) != 0 ||
                   r.order != ORDER_MARK) {
            st = CINFER_E_UNSUPPORTED;
            snprintf(why, sizeof why,
                     "node %d is not a cinfer group node of the same byte "
                     "order",
                     k);
        } else if (pst != CINFER_OK) {
            st = pst;
            snprintf(why, sizeof why, "node %d failed to load: %s", k, msg);
        } else if (r.n_vocab != mine.n_vocab || r.n_layer != mine.n_layer ||
                   r.n_embd != mine.n_embd ||
                   r.weight_bytes != mine.weight_bytes ||
                   r.max_rows != mine.max_rows || r.n_ctx != mine.n_ctx ||
                   r.block_size != mine.block_size) {
            st = CINFER_E_INVALID_ARG;
            snprintf(why, sizeof why,
                     "node %d loaded another model or shape: n_vocab %u, "
                     "n_layer %u, n_embd %u, %llu weight bytes, "
                     "max_batch_rows %u, n_ctx %u, block_size %u (node 0: "
                     "%u, %u, %u, %llu, %u, %u, %u)",
                     k, r.n_vocab, r.n_layer, r.n_embd,
                     (unsigned long long)r.weight_bytes, r.max_rows, r.n_ctx,
                     r.block_size, mine.n_vocab, mine.n_layer, mine.n_embd,
                     (unsigned long long)mine.weight_bytes, mine.max_rows,
                     mine.n_ctx, mine.block_size);
        } else if ((int)r.n_kv_blocks < kv) {
            kv = (int)r.n_kv_blocks;
        }
    }
    send_config(g, kv, st, why);
    if (st != CINFER_OK)
        return cinfer_set_error(st, "model_group: %s", why);
    g->kv_blocks = kv;
    return CINFER_OK;
}

/* Node 0's own load failed: each node's CONFIG says so (best effort;
 * the load's error stays the one reported). */
static void leader_failed(cinfer_model_group *g, cinfer_status st)
{
    char orig[MAX_MSG + 1], why[2 * (MAX_MSG + 1)];
    snprintf(orig, sizeof orig, "%s", cinfer_last_error());
    snprintf(why, sizeof why, "node 0 failed to load: %s", orig);
    send_config(g, 0, st, why);
    cinfer_set_error(st, "%s", orig);
}

/* STEP to node k. */
static cinfer_status send_step(cinfer_model_group *g, int k,
                               const cinfer_step *s)
{
    int32_t h[8];
    memcpy(h, GROUP_MAGIC, 8);
    h[2] = OP_STEP;
    h[3] = s->n_rows;
    h[4] = s->n_seqs;
    h[5] = s->block_size;
    h[6] = s->max_blocks;
    h[7] = s->n_out;
    int32_t gen = s->row_gen != NULL;
    size_t R = (size_t)s->n_rows;
    struct {
        const void *p;
        size_t n;
    } parts[] = {
        {h, sizeof h},
        {&gen, sizeof gen},
        {s->tokens, R * 4},
        {s->positions, R * 4},
        {s->row_seq, R * 4},
        {s->slots, R * 4},
        {s->block_tables, (size_t)s->n_seqs * (size_t)s->max_blocks * 4},
        {s->out_rows, (size_t)s->n_out * 4},
        {s->row_gen, gen ? R : 0},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!parts[i].n)
            continue;
        cinfer_status e = cinfer_rendezvous_send(g->rv, k, parts[i].p,
                                                 parts[i].n, g->timeout_ms);
        if (e != CINFER_OK)
            return e;
    }
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* lifetime                                                                */
/* ---------------------------------------------------------------------- */

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
    /* Node 0 lets the other nodes go (they may be gone already). */
    if (g->rv && g->node_rank == 0 && g->kv_blocks > 0) {
        int32_t h[9] = {0};
        memcpy(h, GROUP_MAGIC, 8);
        h[2] = OP_QUIT;
        for (int k = 1; k < g->n_nodes; k++)
            (void)cinfer_rendezvous_send(g->rv, k, h, sizeof h, 1000);
    }
    /* models before their backends, backends before the communicator */
    for (int r = 0; g->models && r < g->n; r++)
        cinfer_model_destroy(g->models[r]);
    for (int r = 0; g->be && r < g->n; r++)
        cinfer_backend_destroy(g->be[r]);
    for (int r = 0; r < g->n; r++)
        cinfer_comm_destroy(g->comms[r]);
    cinfer_rendezvous_destroy(g->rv);
    pthread_cond_destroy(&g->cv_go);
    pthread_cond_destroy(&g->cv_done);
    pthread_mutex_destroy(&g->mu);
    free(g->step_buf);
    free(g->threads);
    free(g->slots);
    free(g->models);
    free(g->be);
    free(g);
}

/* Load progress of local rank r of n, over the whole group's load. */
typedef struct {
    const cinfer_model_params *p;
    int r, n;
} progress_ctx;

static void rank_progress(float f, void *user)
{
    const progress_ctx *c = user;
    c->p->progress(((float)c->r + f) / (float)c->n, c->p->progress_user);
}

/* The shape of the group p asks for: ranks over all nodes and here. */
static cinfer_status check_shape(const cinfer_model_params *p, int *world,
                                 int *n_nodes, int *local)
{
    int cuda = p->tp_device == CINFER_TP_CUDA;
    *world = p->tensor_parallel ? p->tensor_parallel : 1;
    *n_nodes = p->n_nodes ? p->n_nodes : 1;
    if (p->backend)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: the group makes its ranks' "
                                "backends; give no backend");
    if (p->tp_device != CINFER_TP_CPU && !cuda)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: tp_device %d is neither CPU nor "
                                "CUDA",
                                (int)p->tp_device);
    if (cuda && (!p->cuda || !p->cuda->comm_create_nccl ||
                 !p->cuda->backend_create || !p->cuda->device_count))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: CUDA ranks need the CUDA entry "
                                "points (cinfer_model_params.cuda)");
    if (*world < (cuda ? 1 : 2) || *world > CINFER_COMM_MAX_RANKS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: needs tensor_parallel %d..%d "
                                "(got %d)",
                                cuda ? 1 : 2, CINFER_COMM_MAX_RANKS, *world);
    if (*n_nodes < 1 || (*n_nodes > 1 && !cuda))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: %d nodes: ranks over several "
                                "processes are CUDA ranks (NCCL)",
                                *n_nodes);
    if (*world % *n_nodes)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: tensor_parallel %d does not "
                                "divide over %d nodes",
                                *world, *n_nodes);
    if (p->node_rank < 0 || p->node_rank >= *n_nodes)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: node rank %d is outside 0..%d",
                                p->node_rank, *n_nodes - 1);
    if (*n_nodes > 1 && (!p->dist_init_addr || !p->dist_init_addr[0]))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: %d nodes need the address of "
                                "node 0 (dist_init_addr, HOST:PORT)",
                                *n_nodes);
    if (p->dist_timeout_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: dist_timeout_ms %d is negative",
                                p->dist_timeout_ms);
    *local = *world / *n_nodes;
    if (cuda) {
        /* NCCL's own error for a missing device is about CUDA in general */
        int have = p->cuda->device_count(), need = 0;
        for (int j = 0; j < *local; j++) {
            int d = p->cuda_devices ? p->cuda_devices[j] : j;
            need = d + 1 > need ? d + 1 : need;
        }
        if (have < need)
            return cinfer_set_error(CINFER_E_NOT_FOUND,
                                    "model_group: this process's %d CUDA "
                                    "rank(s) use devices up to cuda:%d, and "
                                    "it sees %d CUDA device(s)",
                                    *local, need - 1, have);
    }
    return CINFER_OK;
}

/* The communicators of this process's ranks. */
static cinfer_status make_comms(cinfer_model_group *g,
                                const cinfer_model_params *p)
{
    if (p->tp_device == CINFER_TP_CPU) {
        cinfer_comm_local_params cp = cinfer_comm_local_default_params();
        cp.n_ranks = g->n;
        return cinfer_comm_create_local(&cp, g->comms);
    }
    cinfer_comm_nccl_params np = cinfer_comm_nccl_default_params();
    np.world_size = g->world;
    np.n_nodes = g->n_nodes;
    np.node_rank = g->node_rank;
    np.devices = p->cuda_devices;
    np.init_addr = p->dist_init_addr;
    np.timeout_ms = g->timeout_ms;
    if (g->n_nodes > 1) {
        cinfer_rendezvous_params rp = cinfer_rendezvous_default_params();
        rp.addr = p->dist_init_addr;
        rp.n_nodes = g->n_nodes;
        rp.node_rank = g->node_rank;
        rp.world_size = g->world;
        rp.timeout_ms = g->timeout_ms;
        rp.keep_open = 1;
        cinfer_status st = cinfer_rendezvous_create(&rp, &g->rv);
        if (st != CINFER_OK)
            return st;
        np.rendezvous = g->rv;
    }
    return p->cuda->comm_create_nccl(&np, g->comms);
}

/* Local rank j's backend. */
static cinfer_status make_backend(cinfer_model_group *g,
                                  const cinfer_model_params *p, int j,
                                  int threads_per_rank)
{
    if (p->tp_device == CINFER_TP_CPU) {
        cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
        bp.n_threads = threads_per_rank;
        bp.isa = p->isa;
        bp.thread_prio = p->thread_prio;
        bp.comm = g->comms[j];
        return cinfer_backend_cpu_create(&bp, &g->be[j]);
    }
    /* Its defaults are zeros (cinfer_backend_cuda_default_params lives in
     * the device library, which engine/ does not link). */
    cinfer_backend_cuda_params cp;
    memset(&cp, 0, sizeof cp);
    cp.device = p->cuda_devices ? p->cuda_devices[j] : j;
    cp.memory_fraction = p->gpu_memory_fraction;
    cp.batch_invariant = p->cuda_batch_invariant;
    cp.eager = p->cuda_eager;
    cp.comm = g->comms[j];
    return p->cuda->backend_create(&cp, &g->be[j]);
}

/* Loads this process's ranks, one after another: the file is read once at
 * a time, and each rank gives back what it does not keep before the next
 * reads. Every rank holds the KV blocks the first one got (on a budget,
 * what its device left); one that cannot fails with its sizes. */
static cinfer_status load_ranks(cinfer_model_group *g,
                                const cinfer_model_params *p)
{
    int threads = p->n_threads;
    if (threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : c > 1024 ? 1024 : (int)c;
    }
    int per_rank = threads / g->n > 0 ? threads / g->n : 1;
    cinfer_status st;
    for (int j = 0; j < g->n; j++) {
        if ((st = make_backend(g, p, j, per_rank)) != CINFER_OK)
            return st;
        cinfer_model_params mp = *p;
        mp.backend = g->be[j];
        mp.tensor_parallel = g->world;
        mp.tp_rank = g->first_rank + j;
        mp.tp_gather_logits = g->n_nodes > 1;
        mp.tp_device = CINFER_TP_CPU;
        mp.cuda = NULL;
        mp.n_nodes = 0;
        mp.node_rank = 0;
        if (j > 0) {
            mp.n_kv_blocks = cinfer_model_get_info(g->models[0])->n_kv_blocks;
            mp.kv_from_budget = 0;
        }
        progress_ctx pc = {p, j, g->n};
        if (p->progress) {
            mp.progress = rank_progress;
            mp.progress_user = &pc;
        }
        if ((st = cinfer_model_create(&mp, &g->models[j])) != CINFER_OK) {
            if (g->world == 1)
                return st;
            /* the message is formatted from a copy: the error buffer is
             * the one being written */
            char why[MAX_MSG + 1];
            snprintf(why, sizeof why, "%s", cinfer_last_error());
            return cinfer_set_error(st, "rank %d: %s", g->first_rank + j,
                                    why);
        }
    }
    return CINFER_OK;
}

cinfer_status cinfer_model_group_create(const cinfer_model_params *p,
                                        cinfer_model_group **out)
{
    *out = NULL;
    int world = 0, n_nodes = 0, local = 0;
    cinfer_status st = check_shape(p, &world, &n_nodes, &local);
    if (st != CINFER_OK)
        return st;
    cinfer_model_group *g = calloc(1, sizeof *g);
    if (!g)
        return cinfer_set_error(CINFER_E_NOMEM, "model_group: out of memory");
    g->n = local;
    g->world = world;
    g->n_nodes = n_nodes;
    g->node_rank = p->node_rank;
    g->first_rank = p->node_rank * local;
    g->timeout_ms = p->dist_timeout_ms ? p->dist_timeout_ms
                                       : DEFAULT_TIMEOUT_MS;
    g->thread_prio = p->thread_prio;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv_go, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    g->be = calloc((size_t)local, sizeof *g->be);
    g->models = calloc((size_t)local, sizeof *g->models);
    g->slots = calloc((size_t)local, sizeof *g->slots);
    g->threads = calloc((size_t)local, sizeof *g->threads);
    if (!g->be || !g->models || !g->slots || !g->threads) {
        st = cinfer_set_error(CINFER_E_NOMEM, "model_group: out of memory");
        goto fail;
    }
    if ((st = make_comms(g, p)) != CINFER_OK)
        goto fail;
    st = load_ranks(g, p);
    if (n_nodes > 1 && g->node_rank > 0)
        st = follower_handshake(g, st);
    else if (st != CINFER_OK && n_nodes > 1)
        leader_failed(g, st);
    else if (n_nodes > 1)
        st = leader_handshake(g);
    else if (st == CINFER_OK)
        g->kv_blocks = cinfer_model_get_info(g->models[0])->n_kv_blocks;
    if (st != CINFER_OK)
        goto fail;

    for (int j = 0; j < local; j++) {
        g->slots[j].g = g;
        g->slots[j].local = j;
    }
    for (int j = 1; j < local; j++) {
        if (pthread_create(&g->threads[j - 1], NULL, rank_main,
                           &g->slots[j]) != 0) {
            st = cinfer_set_error(CINFER_E_INTERNAL,
                                  "model_group: cannot start the thread of "
                                  "rank %d",
                                  g->first_rank + j);
            goto fail;
        }
        g->n_threads_started++;
    }
    *out = g;
    return CINFER_OK;

fail:
    /* keep the first error's message: destroy sets none */
    g->kv_blocks = 0; /* no QUIT: the other nodes failed with us */
    cinfer_model_group_destroy(g);
    return st;
}

/* ---------------------------------------------------------------------- */
/* steps                                                                   */
/* ---------------------------------------------------------------------- */

/* Runs the posted step on every local rank; the first failure (a rank
 * that only saw the abort comes after the one that caused it), or NULL. */
static const rank_slot *run_local(cinfer_model_group *g,
                                  const cinfer_step *step, float *logits)
{
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

    const rank_slot *bad = NULL;
    for (int r = 0; r < g->n; r++) {
        const rank_slot *s = &g->slots[r];
        if (s->st == CINFER_OK)
            continue;
        if (!bad || (bad->st == CINFER_E_CANCELLED &&
                     s->st != CINFER_E_CANCELLED))
            bad = s;
    }
    return bad;
}

static cinfer_status broken_error(const cinfer_model_group *g)
{
    return cinfer_set_error(CINFER_E_INTERNAL,
                            "model_group: the tensor-parallel group is "
                            "broken since a failed step (%s); restart the "
                            "model",
                            g->broken_why);
}

static cinfer_status fail_step(cinfer_model_group *g, cinfer_status st,
                               const char *why)
{
    g->broken = 1;
    snprintf(g->broken_why, sizeof g->broken_why, "%s", why);
    return cinfer_set_error(st, "model_group: %s", why);
}

cinfer_status cinfer_model_group_forward(cinfer_model_group *g,
                                         const cinfer_step *step,
                                         float *logits)
{
    if (g->broken)
        return broken_error(g);
    if (g->node_rank > 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_group: node %d of %d follows node 0's "
                                "steps (cinfer_model_follow)",
                                g->node_rank, g->n_nodes);
    /* Steps cross processes as token ids only (cinfer_model_input_embeds
     * says so before a request gets here); refused before any node starts,
     * so the group stays whole. */
    for (int32_t r = 0; g->n_nodes > 1 && step->row_embd && r < step->n_rows;
         r++)
        if (step->row_embd[r])
            return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                    "model_group: input embeddings do not "
                                    "cross to the other %d nodes",
                                    g->n_nodes - 1);
    /* Every node's ranks must enter the step's collectives. */
    for (int k = 1; k < g->n_nodes; k++)
        if (send_step(g, k, step) != CINFER_OK) {
            char why[4 * (MAX_MSG + 1)];
            snprintf(why, sizeof why, "node %d: %s", k, cinfer_last_error());
            /* The nodes already sent to would wait in a collective. */
            for (int r = 0; r < g->n; r++)
                cinfer_comm_abort(g->comms[r], why);
            return fail_step(g, CINFER_E_IO, why);
        }
    const rank_slot *bad = run_local(g, step, logits);
    cinfer_status st = bad ? bad->st : CINFER_OK;
    char why[4 * (MAX_MSG + 1)] = "";
    if (bad)
        snprintf(why, sizeof why, "%s", bad->err);
    /* Every node's failure goes in the message: which one caused the
     * others (an abort, a collective that timed out) is not always
     * knowable from here. The status is the first that is not a
     * cancellation. */
    for (int k = 1; k < g->n_nodes; k++) {
        cinfer_status pst = CINFER_OK;
        char msg[MAX_MSG + 1];
        cinfer_status e = recv_status(g, k, &pst, msg);
        if (e != CINFER_OK) {
            pst = e;
            snprintf(msg, sizeof msg, "%s", cinfer_last_error());
        }
        if (pst == CINFER_OK)
            continue;
        if (st == CINFER_OK || st == CINFER_E_CANCELLED)
            st = pst;
        size_t len = strlen(why);
        snprintf(why + len, sizeof why - len, "%snode %d: %s",
                 len ? "; " : "", k, msg);
    }
    if (st == CINFER_OK)
        return CINFER_OK;
    return fail_step(g, st, why);
}

/* A follower's copy of a STEP's arrays, checked before anything is
 * allocated for them. */
static cinfer_status recv_step(cinfer_model_group *g, const int32_t *h,
                               cinfer_step *s, uint8_t **row_gen)
{
    int32_t n_rows = h[3], n_seqs = h[4], max_blocks = h[6], n_out = h[7];
    int32_t gen = 0;
    cinfer_status e =
        cinfer_rendezvous_recv(g->rv, 0, &gen, sizeof gen, g->timeout_ms);
    if (e != CINFER_OK)
        return e;
    if (n_rows < 1 || n_rows > MAX_STEP_ROWS || n_seqs < 1 ||
        n_seqs > n_rows || max_blocks < 1 || n_out < 0 || n_out > n_rows ||
        (int64_t)n_seqs * max_blocks > MAX_STEP_TABLE)
        return cinfer_set_error(CINFER_E_IO,
                                "model_group: node 0 sent a step of %d rows, "
                                "%d sequences, %d blocks each, %d outputs",
                                n_rows, n_seqs, max_blocks, n_out);
    size_t R = (size_t)n_rows, T = (size_t)n_seqs * (size_t)max_blocks;
    size_t words = 4 * R + T + (size_t)n_out + (gen ? (R + 3) / 4 : 0);
    if (words > g->step_cap) {
        int32_t *b = realloc(g->step_buf, words * sizeof *b);
        if (!b)
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "model_group: out of memory for a step");
        g->step_buf = b;
        g->step_cap = words;
    }
    int32_t *w = g->step_buf;
    size_t bytes = (4 * R + T + (size_t)n_out) * 4 + (gen ? R : 0);
    if ((e = cinfer_rendezvous_recv(g->rv, 0, w, bytes, g->timeout_ms)) !=
        CINFER_OK)
        return e;
    memset(s, 0, sizeof *s);
    s->n_rows = n_rows;
    s->n_seqs = n_seqs;
    s->block_size = h[5];
    s->max_blocks = max_blocks;
    s->tokens = w;
    s->positions = w + R;
    s->row_seq = w + 2 * R;
    s->slots = w + 3 * R;
    s->block_tables = w + 4 * R;
    s->n_out = n_out;
    s->out_rows = w + 4 * R + T;
    *row_gen = gen ? (uint8_t *)(w + 4 * R + T + n_out) : NULL;
    s->row_gen = *row_gen;
    return CINFER_OK;
}

cinfer_status cinfer_model_group_follow(cinfer_model_group *g)
{
    if (g->node_rank == 0 || !g->rv)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_follow: only node k > 0 of a group "
                                "over several processes follows");
    for (;;) {
        if (g->broken)
            return broken_error(g);
        int32_t h[8];
        cinfer_status e = cinfer_rendezvous_recv(g->rv, 0, h, sizeof h, -1);
        if (e != CINFER_OK)
            return fail_step(g, e, cinfer_last_error());
        if (memcmp(h, GROUP_MAGIC, 8) != 0 ||
            (h[2] != OP_STEP && h[2] != OP_QUIT))
            return fail_step(g, CINFER_E_IO,
                             "node 0 sent something that is not a step");
        if (h[2] == OP_QUIT) {
            int32_t pad;
            (void)cinfer_rendezvous_recv(g->rv, 0, &pad, sizeof pad, 1000);
            return CINFER_OK;
        }
        cinfer_step s;
        uint8_t *gen = NULL;
        if ((e = recv_step(g, h, &s, &gen)) != CINFER_OK) {
            char why[4 * (MAX_MSG + 1)];
            snprintf(why, sizeof why, "%s", cinfer_last_error());
            for (int r = 0; r < g->n; r++)
                cinfer_comm_abort(g->comms[r], why);
            return fail_step(g, e, why);
        }
        const rank_slot *bad = run_local(g, &s, NULL);
        cinfer_status st = bad ? bad->st : CINFER_OK;
        e = send_status(g, 0, st, bad ? bad->err : NULL);
        if (st != CINFER_OK)
            return fail_step(g, st, bad->err);
        if (e != CINFER_OK)
            return fail_step(g, e, cinfer_last_error());
    }
}
