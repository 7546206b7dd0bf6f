/*
 * model_group.h - one model per tensor-parallel rank, driven as one.
 *
 * A group of N ranks: N backends over one communicator (kernels/comm.h),
 * one rank model on each (model.h: each keeps its shard of every matrix),
 * and a thread per rank beyond the first; the calling thread is rank 0.
 * The ranks are CPU backends over a LOCAL communicator, or CUDA backends,
 * one device each, over NCCL (ncclCommInitAll in one process; N = 1 is
 * one rank through NCCL). forward hands the same step to every rank, runs
 * them concurrently (their all-reduces meet in the communicator) and
 * gathers each rank's vocabulary columns into the one logits buffer. A
 * rank that fails fails the step on all ranks: it aborts the communicator
 * so the others stop waiting, and the error names the rank; the group is
 * then broken (healthy 0: the communicator cannot be reused) and every
 * later step fails at once.
 *
 * CUDA ranks may span processes (n_nodes > 1, one per host, each with
 * N / n_nodes ranks): the nodes meet at node 0's rendezvous (NCCL's id,
 * ncclCommInitRankConfig), check they loaded the same model and agree on
 * the KV blocks, and keep the rendezvous connection as the channel over
 * which node 0's forward sends each step to the others
 * (cinfer_model_group_follow runs them there); the vocabulary slices are
 * all-gathered on the devices so node 0 writes the whole logits. Every
 * wait for another node is bounded by dist_timeout_ms except a follower's
 * wait for the next step (an idle server sends none); a node that goes
 * away ends the others' steps with an error naming it.

 * The engine does not use this header: cinfer_model_create with
 * tensor_parallel > 1 and no backend builds a group and wraps it in a
 * cinfer_model (model.c), so the engine drives it as any model.
 *
 *     cinfer_model_params p = cinfer_model_default_params();
 *     p.tensor_parallel = 3;
 *     cinfer_model_group *g;
 *     if (cinfer_model_group_create(&p, &g) != CINFER_OK) ...
 *     cinfer_model_group_forward(g, &step, logits);  // [n_out, n_vocab]
 *     cinfer_model_group_destroy(g);
 *
 * Thread safety: one thread at a time per group (it becomes rank 0).
 */
#ifndef CINFER_MODEL_GROUP_H
#define CINFER_MODEL_GROUP_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_model_group cinfer_model_group;

/* Creates this process's ranks of the model p describes (tensor_parallel
 * over n_nodes; p->backend must be NULL): CPU ranks (tensor_parallel >=
 * 2), one CPU backend each with p->n_threads / N threads, at least 1 (0 =
 * all cores shared out); or CUDA ranks (tp_device, p->cuda), one device
 * each. Every rank holds the KV blocks the first local rank got; over
 * several nodes the group takes the smallest any node got. Fails with the
 * rank model's error, "rank R: ..." (e.g. head counts that do not divide,
 * a rank whose device has no room), another node's ("node K ..."), or
 * CINFER_E_NOMEM; a thread that cannot start is CINFER_E_INTERNAL. */
cinfer_status cinfer_model_group_create(const cinfer_model_params *p,
                                        cinfer_model_group **out);
void cinfer_model_group_destroy(cinfer_model_group *g);

/* Runs one step on every rank (cinfer_model_forward's contract) and
 * writes the full logits [step->n_out, n_vocab]. On failure the message
 * is the first failing rank's, "rank R: ...". */
cinfer_status cinfer_model_group_forward(cinfer_model_group *g,
                                         const cinfer_step *step,
                                         float *logits);

/* Ranks over every node, and those of this process. */
int cinfer_model_group_size(const cinfer_model_group *g);
int cinfer_model_group_local_size(const cinfer_model_group *g);
/* The KV blocks every rank can hold (the smallest of any rank's): the
 * group's n_kv_blocks. */
int cinfer_model_group_kv_blocks(const cinfer_model_group *g);
/* This process's rank r's model (owned by the group). */
cinfer_model *cinfer_model_group_rank(cinfer_model_group *g, int r);
/* Node k > 0: runs node 0's steps (cinfer_model_follow). */
cinfer_status cinfer_model_group_follow(cinfer_model_group *g);
/* 1 while every rank's backend is healthy and no step has failed. */
int cinfer_model_group_healthy(cinfer_model_group *g);

/* The graph counts of this process's first rank's backend (each rank
 * records and replays the same steps). */
void cinfer_model_group_graph_stats(const cinfer_model_group *g,
                                    cinfer_backend_graph_stats *out);
/* The largest rank's weight bytes held (the memory per rank). */
uint64_t cinfer_model_group_weights_held_max(const cinfer_model_group *g);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_MODEL_GROUP_H */
