/*
 * comm.h - the tensor-parallel communicator: rank, size and the two
 * collectives Megatron-style sharding needs (all-reduce sum, all-gather).
 *
 * A model sharded over N ranks runs the same op sequence on every rank;
 * after a row-parallel matmul each rank holds a partial sum that the ranks
 * add up (all_reduce_sum), and the vocabulary-parallel LM head's slices are
 * concatenated (all_gather). The communicator is created once, one handle
 * per rank, and each rank's backend gets its handle at create
 * (cinfer_backend_cpu_params.comm, cinfer_backend_cuda_params.comm); the
 * model calls cinfer_backend_all_reduce_sum and never sees which kind it
 * is, so neither engine/ nor model.c includes NCCL.
 *
 * Three kinds:
 *   - LOCAL: CPU ranks, threads of one process, over a shared barrier and a
 *     table of the ranks' host buffers. Each element is summed in rank
 *     order 0, 1, ..., N-1 whatever the thread timing (each rank reduces a
 *     slice of the elements over every rank's buffer), so results are
 *     deterministic and equal a sequential sum: TP=N is reproducible run
 *     to run and batch invariance holds at every N.
 *   - NCCL, one process: ncclCommInitAll over a device list, one host
 *     thread per GPU (cinfer_comm_create_nccl with n_nodes = 1).
 *   - NCCL, several hosts: ncclCommInitRankConfig, non-blocking, with the
 *     unique id handed out by node 0 over a small TCP rendezvous
 *     (cinfer_rendezvous below), bounded by a timeout and ncclCommAbort so
 *     a peer that never comes ends in an error, never a hung server.
 *
 * Failures: a rank that does not reach a collective within the timeout
 * fails the others' calls with CINFER_E_TIMEOUT naming the missing ranks;
 * ranks whose calls disagree (count, collective) all get
 * CINFER_E_INVALID_ARG. After a timeout or an abort the communicator is
 * broken: every later collective on any rank fails at once with the same
 * message. Destroy every rank's handle and create a new one.
 *
 * Example (two CPU ranks, one thread each):
 *
 *     cinfer_comm *comms[2];
 *     cinfer_comm_local_params cp = cinfer_comm_local_default_params();
 *     cp.n_ranks = 2;
 *     cinfer_comm_create_local(&cp, comms);
 *     // thread r:
 *     cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
 *     bp.comm = comms[r];
 *     cinfer_backend_cpu_create(&bp, &be[r]);
 *     ... cinfer_backend_all_reduce_sum(be[r], partial) ...
 *     // after the backends are gone:
 *     cinfer_comm_destroy(comms[0]); cinfer_comm_destroy(comms[1]);
 *
 * Thread safety: one rank's handle is used by one thread at a time (its
 * rank thread); different ranks' handles are used concurrently, that is
 * the point. create and destroy are not concurrent with collectives on
 * the same communicator.
 */
#ifndef CINFER_COMM_H
#define CINFER_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_comm cinfer_comm;

#define CINFER_COMM_MAX_RANKS 256

typedef enum {
    CINFER_COMM_LOCAL = 1, /* CPU rank threads in one process */
    CINFER_COMM_NCCL = 2,  /* GPU ranks, one NCCL communicator each */
} cinfer_comm_kind;

/* ---- any kind ------------------------------------------------------------ */

/* This handle's rank (0..size-1), the number of ranks, and the kind. */
int cinfer_comm_rank(const cinfer_comm *c);
int cinfer_comm_size(const cinfer_comm *c);
cinfer_comm_kind cinfer_comm_get_kind(const cinfer_comm *c);

/* Marks the communicator broken, with `why` in the error text: the
 * collectives the other ranks are waiting in (LOCAL) fail now with
 * CINFER_E_CANCELLED instead of at their timeout, and so does every later
 * one. For a rank that failed before a collective and will not reach it.
 * LOCAL: callable from any thread. NCCL: the rank's communicator is
 * aborted (ncclCommAbort), from the rank's own thread only; its peers'
 * collectives then fail at their next bounded wait. */
void cinfer_comm_abort(cinfer_comm *c, const char *why);

/* LOCAL: the collectives this rank has run (size > 1) and the time it
 * spent inside them, waiting for the other ranks included; 0 and 0 for an
 * NCCL communicator (its collectives are enqueued on a stream, and their
 * time is the device's) or NULL. Read from the rank's thread or when no
 * collective runs. */
void cinfer_comm_stats(const cinfer_comm *c, uint64_t *n_collectives,
                       uint64_t *ns);

/* Frees one rank's handle (NULL is fine); the shared state goes with the
 * last rank's. The backends given the handle must be destroyed first. */
void cinfer_comm_destroy(cinfer_comm *c);

/* ---- LOCAL: CPU ranks in one process --------------------------------------- */

typedef struct {
    int n_ranks;    /* ranks (threads), 1..CINFER_COMM_MAX_RANKS; 0 = 1 */
    int timeout_ms; /* how long a collective waits for the other ranks
                       before it fails with CINFER_E_TIMEOUT; 0 = 60000 */
} cinfer_comm_local_params;

cinfer_comm_local_params cinfer_comm_local_default_params(void);

/* Creates p->n_ranks handles into comms[0..n_ranks-1], one per rank,
 * sharing one barrier and buffer table. The caller owns every handle. On
 * failure comms is untouched. Not thread-safe against itself. */
cinfer_status cinfer_comm_create_local(const cinfer_comm_local_params *p,
                                       cinfer_comm **comms);

/* All-reduce sum of n floats of host memory, in place: on return every
 * rank's buf[i] holds buf_0[i] + buf_1[i] + ... + buf_{N-1}[i], added in
 * that order in float. Every rank calls it with the same n (n = 0 is a
 * valid, empty collective); buf stays the caller's and must not be
 * touched by another thread until it returns. LOCAL only (an NCCL
 * communicator reduces device memory: cinfer_backend_all_reduce_sum). */
cinfer_status cinfer_comm_all_reduce_sum(cinfer_comm *c, float *buf,
                                         size_t n);

/* All-gather: recv[r * n .. r * n + n) = rank r's send, for every r, on
 * every rank. recv holds n * size floats; send may be recv + rank * n (in
 * place) but must not overlap recv otherwise. LOCAL only. */
cinfer_status cinfer_comm_all_gather(cinfer_comm *c, const float *send,
                                     size_t n, float *recv);

/* ---- NCCL: GPU ranks (kernels/cuda/comm_nccl.c) --------------------------- */

typedef struct cinfer_rendezvous cinfer_rendezvous;

typedef struct {
    int world_size;        /* ranks over every node (--tensor-parallel),
                              >= 1; 0 = the local devices (n_nodes 1) */
    int n_nodes;           /* processes (--nnodes), each with world_size /
                              n_nodes ranks; 0 = 1 */
    int node_rank;         /* this process (--node-rank), 0..n_nodes-1;
                              its ranks are node_rank * local + 0..local-1 */
    const int *devices;    /* [world_size / n_nodes] CUDA ordinals of this
                              process's ranks, borrowed for the call; NULL =
                              0, 1, ... */
    const char *init_addr; /* "HOST:PORT" (--dist-init-addr) where node 0
                              listens for the others; only with n_nodes > 1 */
    int timeout_ms;        /* bound on the rendezvous and on NCCL's
                              communicator set-up; 0 = 60000 */
    cinfer_rendezvous *rendezvous; /* n_nodes > 1: a rendezvous the caller
                              created (same n_nodes, node_rank and world
                              size) and has not run, used for the id and
                              left to the caller (e.g. with keep_open, as a
                              channel); NULL = one made here from
                              init_addr and closed after */
} cinfer_comm_nccl_params;

cinfer_comm_nccl_params cinfer_comm_nccl_default_params(void);

/* Creates this process's world_size / n_nodes NCCL ranks into
 * comms[0..local-1]. n_nodes = 1: ncclCommInitAll over the devices.
 * n_nodes > 1: node 0 makes the unique id (ncclGetUniqueId) and hands it
 * to the others over the rendezvous at init_addr, then every node's ranks
 * join with ncclCommInitRankConfig (non-blocking), polled until ready;
 * past timeout_ms they are aborted and the call fails with
 * CINFER_E_TIMEOUT. A peer with another world size or n_nodes, or a node
 * rank taken twice, is refused on both sides (CINFER_E_INVALID_ARG).
 * CINFER_E_UNSUPPORTED in a build without CUDA or NCCL. Blocks for up to
 * about twice timeout_ms; not thread-safe against itself. */
cinfer_status cinfer_comm_create_nccl(const cinfer_comm_nccl_params *p,
                                      cinfer_comm **comms);

/* ---- the rendezvous (kernels/rendezvous.c): plain TCP, no GPU ------------ */

/*
 * Node 0 listens on the port of init_addr (every interface of the address
 * family HOST resolves to); each other node connects (retrying while node
 * 0 is not up yet), says who it is (n_nodes, world_size, node_rank, id
 * size) and receives the id once every node has checked in. Node 0
 * refuses a peer whose n_nodes, world_size or id size differ from its
 * own, or whose node rank is out of range or taken, telling it why, and
 * then fails too, telling the peers already in; connections that do not
 * speak the protocol are dropped. Every connect, accept, read and write
 * is bounded by the deadline timeout_ms after run() starts (poll()).
 *
 *     cinfer_rendezvous *r;
 *     cinfer_rendezvous_create(&p, &r);   // node 0 binds here
 *     cinfer_rendezvous_run(r, id, sizeof id); // node 0 sends id, others fill it
 *     cinfer_rendezvous_destroy(r);
 */
typedef struct {
    const char *addr; /* "HOST:PORT" or "[IPv6]:PORT"; node 0 binds PORT
                         (0 = any free port: cinfer_rendezvous_port) */
    int n_nodes;      /* processes taking part, >= 2 */
    int node_rank;    /* this one, 0..n_nodes-1 */
    int world_size;   /* ranks over all nodes; must match on every node */
    int timeout_ms;   /* the whole exchange; 0 = 60000 */
    int keep_open;    /* 1 = after a successful run the connections stay
                         open as a channel between node 0 and each other
                         node (cinfer_rendezvous_send / _recv); 0 = closed */
} cinfer_rendezvous_params;

cinfer_rendezvous_params cinfer_rendezvous_default_params(void);

/* Checks the params; node 0 binds and listens now, so that peers that
 * connect before run() are queued. p->addr is copied. */
cinfer_status cinfer_rendezvous_create(const cinfer_rendezvous_params *p,
                                       cinfer_rendezvous **out);

/* The port node 0 listens on (the chosen one when addr's port was 0);
 * 0 on the other nodes. */
int cinfer_rendezvous_port(const cinfer_rendezvous *r);

/* Node 0: waits for every other node and sends each the id_bytes at id.
 * Others: connect, check in and receive id_bytes into id (1..1024, the
 * same on every node). Errors: CINFER_E_TIMEOUT naming the nodes that did
 * not come (node 0) or the address that did not answer (others),
 * CINFER_E_INVALID_ARG for a refused configuration, with both sides'
 * numbers in the message, CINFER_E_IO for a socket failure. Once per
 * handle. */
cinfer_status cinfer_rendezvous_run(cinfer_rendezvous *r, void *id,
                                    size_t id_bytes);

/* With keep_open, after a successful run: n bytes to or from node `peer`
 * over the kept connection (node 0: peer 1..n_nodes-1; the others: peer
 * 0), whole or not at all, within timeout_ms (< 0: no bound, for a node
 * waiting for work). CINFER_E_TIMEOUT past the bound, CINFER_E_IO when the
 * peer closed (the message says so) or the socket failed,
 * CINFER_E_INVALID_ARG without such a connection. The bytes are the
 * caller's protocol. A handle's channel to one peer is used by one thread
 * at a time. */
cinfer_status cinfer_rendezvous_send(cinfer_rendezvous *r, int peer,
                                     const void *buf, size_t n,
                                     int timeout_ms);
cinfer_status cinfer_rendezvous_recv(cinfer_rendezvous *r, int peer,
                                     void *buf, size_t n, int timeout_ms);

/* Closes the sockets and frees the handle (NULL is fine). */
void cinfer_rendezvous_destroy(cinfer_rendezvous *r);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_COMM_H */
