/*
 * comm_nccl.c - the NCCL kind of communicator (comm.h): GPU ranks, one
 * ncclComm_t per rank handle.
 *
 * One process (n_nodes 1): ncclCommInitAll over the device list. Several
 * processes: node 0 draws the unique id (ncclGetUniqueId) and the
 * rendezvous (kernels/rendezvous.c) hands it to the others; then each
 * process's ranks join in one group with ncclCommInitRankConfig and
 * config.blocking = 0, and ncclCommGetAsyncError is polled until every
 * one is ready, for at most timeout_ms: a peer that never joins ends in
 * ncclCommAbort and CINFER_E_TIMEOUT, not in a process stuck in
 * ncclCommInitRank. The communicators stay non-blocking, so a collective
 * may answer ncclInProgress; it is polled the same way. Once enqueued, a
 * collective whose peer never comes would hold cudaStreamSynchronize
 * forever: the backend waits through cinfer_comm_nccl_wait instead, which
 * polls the stream and aborts past the timeout.
 *
 * Every NCCL call goes through CINFER_NCCL_TRY (or NCCL_TRY_ASYNC below,
 * the same with ncclInProgress accepted), so a failure is CINFER_E_DEVICE
 * with the statement, file and line.
 *
 * Linked against the toolkit's libnccl for a device, and against the CUDA
 * harness's nccl.cc (tests/cudasim/) in the test builds, which answers
 * ncclCommInitRankConfig non-blocking too. The symbol is weak: an NCCL
 * older than 2.14 has none, and then a process with one rank per node
 * joins with the blocking ncclCommInitRank. Built without NCCL headers
 * (CINFER_NO_NCCL), creation fails with CINFER_E_UNSUPPORTED.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../comm_impl.h"
#include "comm_nccl.h"
#include "cuda_check.h"

#ifdef CINFER_NO_NCCL

cinfer_status cinfer_comm_create_nccl(const cinfer_comm_nccl_params *p,
                                      cinfer_comm **comms)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED,
                            "comm_create_nccl: this build of cinfer found no "
                            "NCCL (nccl.h, libnccl)");
}

cinfer_status cinfer_comm_nccl_all_reduce_sum(cinfer_comm *c, float *d_buf,
                                              size_t n, cudaStream_t stream)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED, "built without NCCL");
}

cinfer_status cinfer_comm_nccl_all_gather(cinfer_comm *c, const float *d_send,
                                          size_t n, float *d_recv,
                                          cudaStream_t stream)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED, "built without NCCL");
}

cinfer_status cinfer_comm_nccl_wait(cinfer_comm *c, cudaStream_t stream)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED, "built without NCCL");
}

#else /* NCCL */

#include <nccl.h>

/* Absent from NCCL before 2.14. */
#pragma weak ncclCommInitRankConfig

#define DEFAULT_TIMEOUT_MS 60000
#define POLL_NS 100000 /* 0.1 ms between polls of an async state */

/* CINFER_NCCL_TRY for a non-blocking communicator's calls: ncclInProgress
 * is not a failure; the caller polls the communicator afterwards. */
#define NCCL_TRY_ASYNC(stmt)                                                   \
    do {                                                                       \
        int cinfer_r_ = (int)(stmt);                                           \
        if (cinfer_r_ != ncclSuccess && cinfer_r_ != ncclInProgress)           \
            return cinfer_nccl_fail(cinfer_r_, #stmt, __FILE__, __LINE__);     \
    } while (0)

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pause_briefly(void)
{
    struct timespec ts = {0, POLL_NS};
    nanosleep(&ts, NULL);
}

static ncclComm_t raw(const cinfer_comm *c)
{
    return (ncclComm_t)c->nccl;
}

/* Polls a communicator until its pending work (init, finalize, an
 * enqueue) is done: CINFER_OK, the NCCL error, or CINFER_E_TIMEOUT at the
 * deadline. */
static cinfer_status wait_ready(ncclComm_t comm, long long deadline,
                                const char *what, int rank, int timeout_ms)
{
    for (;;) {
        ncclResult_t async = ncclSuccess;
        CINFER_NCCL_TRY(ncclCommGetAsyncError(comm, &async));
        if (async == ncclSuccess)
            return CINFER_OK;
        if (async != ncclInProgress)
            return cinfer_nccl_fail((int)async, what, __FILE__, __LINE__);
        if (now_ms() >= deadline)
            return cinfer_set_error(CINFER_E_TIMEOUT,
                                    "comm nccl rank %d: %s did not finish "
                                    "within %d ms (a peer that never joined "
                                    "or hangs); the communicator is aborted",
                                    rank, what, timeout_ms);
        pause_briefly();
    }
}

/* ---------------------------------------------------------------------- */
/* the handle                                                              */
/* ---------------------------------------------------------------------- */

static cinfer_status abort_raw(ncclComm_t comm)
{
    CINFER_NCCL_TRY(ncclCommAbort(comm));
    return CINFER_OK;
}

static void nccl_abort(cinfer_comm *c, const char *why)
{
    (void)why; /* NCCL keeps no reason; the waiting ranks see the abort */
    if (c->nccl)
        (void)abort_raw(raw(c));
    c->nccl = NULL;
}

/* Finalize (flushes pending work), bounded, then destroy; abort if either
 * fails. */
static cinfer_status close_raw(cinfer_comm *c)
{
    ncclComm_t comm = raw(c);
    NCCL_TRY_ASYNC(ncclCommFinalize(comm));
    cinfer_status st = wait_ready(comm, now_ms() + c->timeout_ms,
                                  "ncclCommFinalize", c->rank, c->timeout_ms);
    if (st != CINFER_OK)
        return st;
    CINFER_NCCL_TRY(ncclCommDestroy(comm));
    return CINFER_OK;
}

static void nccl_destroy(cinfer_comm *c)
{
    if (c->nccl && close_raw(c) != CINFER_OK)
        (void)abort_raw(raw(c));
    free(c);
}

static cinfer_comm *wrap(ncclComm_t comm, int rank, int size, int device,
                         int timeout_ms)
{
    cinfer_comm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = CINFER_COMM_NCCL;
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms;
    c->nccl = comm;
    c->device = device;
    c->destroy = nccl_destroy;
    c->abort = nccl_abort;
    return c;
}

/* ---------------------------------------------------------------------- */
/* creation                                                                */
/* ---------------------------------------------------------------------- */

/* Initializes this node's ranks from the id: one group of non-blocking
 * ncclCommInitRankConfig, then each polled until ready. raws[j] is set
 * (possibly to a half-made communicator the caller aborts) or NULL. */
static cinfer_status init_ranks(const cinfer_comm_nccl_params *p, int local,
                                const int *devs, ncclUniqueId id,
                                int timeout_ms, ncclComm_t *raws)
{
    int world = p->world_size, first = p->node_rank * local;
    if (!ncclCommInitRankConfig) {
        if (local != 1)
            return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                    "comm_create_nccl: this NCCL has no "
                                    "ncclCommInitRankConfig, so a node can "
                                    "join with one rank only (asked %d)",
                                    local);
        CINFER_CUDA_TRY(cudaSetDevice(devs[0]));
        CINFER_NCCL_TRY(ncclCommInitRank(&raws[0], world, id, first));
        return CINFER_OK;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    cinfer_status st = CINFER_OK;
    CINFER_NCCL_TRY(ncclGroupStart());
    for (int j = 0; j < local && st == CINFER_OK; j++) {
        cudaError_t e = cudaSetDevice(devs[j]);
        if (e != cudaSuccess) {
            st = cinfer_cuda_fail((int)e, "cudaSetDevice(devs[j])", __FILE__,
                                  __LINE__);
            break;
        }
        ncclResult_t r =
            ncclCommInitRankConfig(&raws[j], world, id, first + j, &config);
        if (r != ncclSuccess && r != ncclInProgress)
            st = cinfer_nccl_fail((int)r,
                                  "ncclCommInitRankConfig(&raws[j], world, "
                                  "id, first + j, &config)",
                                  __FILE__, __LINE__);
    }
    NCCL_TRY_ASYNC(ncclGroupEnd());
    if (st != CINFER_OK)
        return st;
    long long deadline = now_ms() + timeout_ms;
    for (int j = 0; j < local; j++) {
        char what[64];
        snprintf(what, sizeof what, "ncclCommInitRankConfig (rank %d of %d)",
                 first + j, world);
        st = wait_ready(raws[j], deadline, what, first + j, timeout_ms);
        if (st != CINFER_OK)
            return st;
    }
    return CINFER_OK;
}

/* Node 0 draws the id, the others receive it; then the ranks join. */
static cinfer_status create_multi(const cinfer_comm_nccl_params *p, int local,
                                  const int *devs, int timeout_ms,
                                  ncclComm_t *raws)
{
    cinfer_rendezvous *rv = p->rendezvous; /* the caller's, or ours */
    cinfer_status st = CINFER_OK;
    if (!rv) {
        cinfer_rendezvous_params rp = cinfer_rendezvous_default_params();
        rp.addr = p->init_addr;
        rp.n_nodes = p->n_nodes;
        rp.node_rank = p->node_rank;
        rp.world_size = p->world_size;
        rp.timeout_ms = timeout_ms;
        if ((st = cinfer_rendezvous_create(&rp, &rv)) != CINFER_OK)
            return st;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (p->node_rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            st = cinfer_nccl_fail((int)r, "ncclGetUniqueId(&id)", __FILE__,
                                  __LINE__);
            if (rv != p->rendezvous)
                cinfer_rendezvous_destroy(rv);
            return st;
        }
    }
    st = cinfer_rendezvous_run(rv, &id, sizeof id);
    if (rv != p->rendezvous)
        cinfer_rendezvous_destroy(rv);
    if (st != CINFER_OK)
        return st;
    return init_ranks(p, local, devs, id, timeout_ms, raws);
}

static cinfer_status check_params(const cinfer_comm_nccl_params *p,
                                  int *n_nodes, int *local)
{
    *n_nodes = p->n_nodes == 0 ? 1 : p->n_nodes;
    int world = p->world_size;
    if (world == 0 && *n_nodes == 1) {
        int n = 0;
        CINFER_CUDA_TRY(cudaGetDeviceCount(&n));
        world = n;
    }
    if (*n_nodes < 1 || *n_nodes > CINFER_COMM_MAX_RANKS || world < 1 ||
        world > CINFER_COMM_MAX_RANKS || world % *n_nodes != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_nccl: world size %d is not a "
                                "positive multiple of n_nodes %d (at most %d)",
                                world, *n_nodes, CINFER_COMM_MAX_RANKS);
    if (p->node_rank < 0 || p->node_rank >= *n_nodes)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_nccl: node rank %d is outside "
                                "0..%d",
                                p->node_rank, *n_nodes - 1);
    if (*n_nodes > 1 && !p->init_addr && !p->rendezvous)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_nccl: %d nodes need init_addr "
                                "(HOST:PORT of node 0)",
                                *n_nodes);
    if (p->timeout_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_nccl: timeout_ms %d is negative",
                                p->timeout_ms);
    *local = world / *n_nodes;
    return CINFER_OK;
}

cinfer_status cinfer_comm_create_nccl(const cinfer_comm_nccl_params *p,
                                      cinfer_comm **comms)
{
    if (!p || !comms)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "comm_create_nccl: p and comms must not be "
                                "NULL");
    int n_nodes = 1, local = 0, prev_dev = 0;
    cinfer_status st = check_params(p, &n_nodes, &local);
    if (st != CINFER_OK)
        return st;
    int world = local * n_nodes;
    int timeout_ms = p->timeout_ms ? p->timeout_ms : DEFAULT_TIMEOUT_MS;
    int *devs = calloc((size_t)local, sizeof *devs);
    ncclComm_t *raws = calloc((size_t)local, sizeof *raws);
    cinfer_comm **made = calloc((size_t)local, sizeof *made);
    if (!devs || !raws || !made) {
        st = cinfer_set_error(CINFER_E_NOMEM, "comm_create_nccl: no memory");
        goto fail_alloc;
    }
    for (int j = 0; j < local; j++)
        devs[j] = p->devices ? p->devices[j] : j;
    /* Restored after: the rank threads set their own. Neither can fail in a
     * way that matters here (a bad device fails the init itself). */
    (void)cudaGetDevice(&prev_dev);

    if (n_nodes == 1) {
        ncclResult_t r = ncclCommInitAll(raws, local, devs);
        if (r != ncclSuccess)
            st = cinfer_nccl_fail((int)r, "ncclCommInitAll(raws, local, devs)",
                                  __FILE__, __LINE__);
    } else {
        cinfer_comm_nccl_params q = *p;
        q.world_size = world;
        st = create_multi(&q, local, devs, timeout_ms, raws);
    }
    (void)cudaSetDevice(prev_dev);
    if (st != CINFER_OK)
        goto fail_raws;
    for (int j = 0; j < local; j++) {
        made[j] = wrap(raws[j], p->node_rank * local + j, world, devs[j],
                       timeout_ms);
        if (!made[j]) {
            st = cinfer_set_error(CINFER_E_NOMEM,
                                  "comm_create_nccl: no memory");
            goto fail_raws;
        }
    }
    memcpy(comms, made, (size_t)local * sizeof *made);
    free(made);
    free(raws);
    free(devs);
    return CINFER_OK;

fail_raws:
    for (int j = 0; j < local; j++) {
        free(made[j]);
        if (raws[j])
            (void)abort_raw(raws[j]);
    }
fail_alloc:
    free(made);
    free(raws);
    free(devs);
    return st;
}

/* ---------------------------------------------------------------------- */
/* the collectives the CUDA backend enqueues                               */
/* ---------------------------------------------------------------------- */

static cinfer_status need_comm(const cinfer_comm *c)
{
    if (!c->nccl)
        return cinfer_set_error(CINFER_E_UNAVAILABLE,
                                "comm nccl rank %d: the communicator was "
                                "aborted",
                                c->rank);
    return CINFER_OK;
}

/* After an enqueue on a non-blocking communicator: wait until NCCL has
 * taken it (ncclInProgress). */
static cinfer_status enqueued(cinfer_comm *c, const char *what)
{
    cinfer_status st = wait_ready(raw(c), now_ms() + c->timeout_ms, what,
                                  c->rank, c->timeout_ms);
    if (st != CINFER_OK)
        nccl_abort(c, what);
    return st;
}

cinfer_status cinfer_comm_nccl_all_reduce_sum(cinfer_comm *c, float *d_buf,
                                              size_t n, cudaStream_t stream)
{
    cinfer_status st = need_comm(c);
    if (st != CINFER_OK)
        return st;
    NCCL_TRY_ASYNC(ncclAllReduce(d_buf, d_buf, n, ncclFloat32, ncclSum,
                                 raw(c), stream));
    return enqueued(c, "ncclAllReduce");
}

cinfer_status cinfer_comm_nccl_all_gather(cinfer_comm *c, const float *d_send,
                                          size_t n, float *d_recv,
                                          cudaStream_t stream)
{
    cinfer_status st = need_comm(c);
    if (st != CINFER_OK)
        return st;
    NCCL_TRY_ASYNC(ncclAllGather(d_send, d_recv, n, ncclFloat32, raw(c),
                                 stream));
    return enqueued(c, "ncclAllGather");
}

static cinfer_status drain(cinfer_comm *c, cudaStream_t stream)
{
    long long deadline = now_ms() + c->timeout_ms;
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess)
            return CINFER_OK;
        if (e != cudaErrorNotReady)
            return cinfer_cuda_fail((int)e, "cudaStreamQuery(stream)",
                                    __FILE__, __LINE__);
        ncclResult_t async = ncclSuccess;
        CINFER_NCCL_TRY(ncclCommGetAsyncError(raw(c), &async));
        if (async != ncclSuccess && async != ncclInProgress)
            return cinfer_nccl_fail((int)async,
                                    "a collective (ncclCommGetAsyncError)",
                                    __FILE__, __LINE__);
        if (now_ms() >= deadline)
            return cinfer_set_error(CINFER_E_TIMEOUT,
                                    "comm nccl rank %d of %d: the stream did "
                                    "not drain within %d ms (a peer missing "
                                    "from a collective?); the communicator "
                                    "is aborted",
                                    c->rank, c->size, c->timeout_ms);
        pause_briefly();
    }
}

cinfer_status cinfer_comm_nccl_wait(cinfer_comm *c, cudaStream_t stream)
{
    cinfer_status st = need_comm(c);
    if (st != CINFER_OK)
        return st;
    st = drain(c, stream);
    if (st != CINFER_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", cinfer_last_error());
        nccl_abort(c, msg);
        cinfer_set_error(st, "%s", msg);
    }
    return st;
}

#endif /* NCCL */
