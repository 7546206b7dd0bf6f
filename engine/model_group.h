/*
 * model_group.h - one model per tensor-parallel rank, driven as one.
 *
 * A group of N CPU ranks: N CPU backends sharing one LOCAL communicator
 * (kernels/comm.h), one rank model on each (model.h: each keeps its shard
 * of every matrix), and N - 1 rank threads; the calling thread is rank 0.
 * forward hands the same step to every rank, runs them concurrently (their
 * all-reduces meet in the communicator) and gathers each rank's vocabulary
 * columns into the one logits buffer. A rank that fails fails the step on
 * all ranks: it aborts the communicator so the others stop waiting, and
 * the error names the rank; the group is then broken (healthy 0: the
 * communicator cannot be reused) and every later step fails at once.
 *
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

/* Creates p->tensor_parallel (>= 2) ranks of the model p describes;
 * p->backend must be NULL (the group makes one CPU backend per rank, each
 * with p->n_threads / N threads, at least 1; 0 = all cores shared out).
 * Fails with the rank model's error (e.g. head counts that do not divide)
 * or CINFER_E_NOMEM; a thread that cannot start is CINFER_E_INTERNAL. */
cinfer_status cinfer_model_group_create(const cinfer_model_params *p,
                                        cinfer_model_group **out);
void cinfer_model_group_destroy(cinfer_model_group *g);

/* Runs one step on every rank (cinfer_model_forward's contract) and
 * writes the full logits [step->n_out, n_vocab]. On failure the message
 * is the first failing rank's, "rank R: ...". */
cinfer_status cinfer_model_group_forward(cinfer_model_group *g,
                                         const cinfer_step *step,
                                         float *logits);

int cinfer_model_group_size(const cinfer_model_group *g);
/* Rank r's model (owned by the group). */
cinfer_model *cinfer_model_group_rank(cinfer_model_group *g, int r);
/* 1 while every rank's backend is healthy and no step has failed. */
int cinfer_model_group_healthy(cinfer_model_group *g);
/* The largest rank's weight bytes held (the memory per rank). */
uint64_t cinfer_model_group_weights_held_max(const cinfer_model_group *g);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_MODEL_GROUP_H */
