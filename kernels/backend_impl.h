/*
 * backend_impl.h - what a backend implements: the private ops table and the
 * structs every backend's objects start with.
 *
 * The public calls (backend.h) check their arguments in backend.c and then
 * call a slot of the table here, so a backend implements arithmetic, never
 * validation (ggml-backend-impl.h's split). Slots marked (optional) may be
 * NULL; backend.c supplies the fallback.
 *
 * A backend's backend struct starts with struct cinfer_backend and its
 * tensor struct with struct cinfer_tensor:
 *
 *     typedef struct { struct cinfer_tensor base; int packed; } my_tensor;
 *     typedef struct { struct cinfer_backend base; void *stream; } my_be;
 *     static const struct cinfer_backend_ops my_ops = {.destroy = ...};
 *     my_be *b = calloc(1, sizeof *b);
 *     b->base.ops = &my_ops;
 *
 * The base struct must start zeroed (calloc): backend.c keeps the checked
 * step in it and frees its buffers in cinfer_backend_destroy before the
 * destroy slot runs.
 */
#ifndef CINFER_BACKEND_IMPL_H
#define CINFER_BACKEND_IMPL_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The part of every tensor that backend.c reads and writes. */
struct cinfer_tensor {
    cinfer_tensor_desc desc; /* current shape (set_rows changes shape[0]) */
    void *data;              /* the backend's memory: host for the CPU,
                                device for CUDA */
    size_t nbytes;           /* bytes of the current shape */
    size_t cap_bytes;        /* bytes of the shape at creation */
    int is_weight;           /* read-only: created by tensor_create_weight */
};

/* The part of every backend that backend.c reads and writes. */
struct cinfer_backend {
    const struct cinfer_backend_ops *ops;
    const char *name;      /* "cpu", "cuda" */
    char device_desc[128]; /* human-readable device description */
    cinfer_comm *comm;     /* tensor-parallel communicator, borrowed; NULL
                              = one rank (the backend's create sets it) */

    /* The step as cinfer_backend_set_step checked and copied it: host
     * memory, valid until the next set_step. */
    int has_step;
    cinfer_step step;
    void *step_buf;             /* backing store of step's arrays */
    size_t step_cap;
    void *sort_buf;             /* set_step's scratch (duplicate slots) */
    size_t sort_cap;
    int32_t max_slot;           /* largest step slot */
    int32_t max_position;       /* largest step position */
    int32_t min_block;          /* smallest / largest block id a row reads */
    int32_t max_block;
    int32_t min_block_seq, min_block_idx; /* where they are in the table */
    int32_t max_block_seq, max_block_idx;
    /* the same for step.swa_slots and swa_block_tables (when set) */
    int32_t swa_max_slot;
    int32_t swa_min_block, swa_max_block;
    int32_t swa_min_block_seq, swa_min_block_idx;
    int32_t swa_max_block_seq, swa_max_block_idx;

    /* Between graph_begin and graph_end (backend.c refuses the calls that
     * would break a recording), and the mode begin answered. */
    int in_graph;
    cinfer_graph_mode graph_mode;
    int graphs_off;  /* set by a backend with the graph slots that was
                        created not to use them: has_graphs says 0 */
};

/*
 * The ops table. Arguments arrive checked: tensors non-NULL with the
 * dtypes, shapes and aliasing the op's comment in backend.h allows, the
 * step set and its indices within the tensors. A slot returns CINFER_OK or
 * an error status with cinfer_set_error() filled (a device fault:
 * CINFER_E_DEVICE); it fires no callback and leaves the backend usable
 * unless the fault was sticky.
 */
struct cinfer_backend_ops {
    /* Frees the backend struct and everything it owns. */
    void (*destroy)(cinfer_backend *be);

    /* A tensor struct of the backend's own (starting with struct
     * cinfer_tensor) with nbytes of memory at data; backend.c fills the
     * common fields after. desc is valid; nbytes its size. */
    cinfer_status (*tensor_create)(cinfer_backend *be,
                                   const cinfer_tensor_desc *desc,
                                   size_t nbytes, cinfer_tensor **out);
    /* The same holding `data` (nbytes of host memory), read-only. */
    cinfer_status (*tensor_create_weight)(cinfer_backend *be,
                                          const cinfer_tensor_desc *desc,
                                          size_t nbytes, const void *data,
                                          cinfer_tensor **out);
    void (*tensor_destroy)(cinfer_backend *be, cinfer_tensor *t);
    /* (optional) see cinfer_backend_weight_borrows; NULL: always 1. */
    int (*weight_borrows)(cinfer_backend *be, const cinfer_tensor *t);
    /* (optional) 1 if matmul has a kernel for weights of dtype; NULL: the
     * float types and Q8_0, Q4_0, Q4_1. */
    int (*matmul_supports)(cinfer_backend *be, cinfer_dtype dtype);

    /* Ranges lie inside the tensor; upload's tensor is not a weight. */
    cinfer_status (*upload)(cinfer_backend *be, cinfer_tensor *t,
                            size_t offset, const void *src, size_t n_bytes);
    cinfer_status (*download)(cinfer_backend *be, const cinfer_tensor *t,
                              size_t offset, void *dst, size_t n_bytes);
    cinfer_status (*fill_zero)(cinfer_backend *be, cinfer_tensor *t);
    cinfer_status (*synchronize)(cinfer_backend *be);
    /* (optional) 0 once the backend is unusable; NULL: always 1. */
    int (*healthy)(cinfer_backend *be);
    /* (optional) see cinfer_backend_memory; NULL: unsupported. */
    cinfer_status (*memory)(cinfer_backend *be, size_t *used_bytes,
                            size_t *budget_bytes);

    /* (optional) see cinfer_backend_reserve_scratch; NULL: nothing to
     * reserve (scratch comes from host memory as needed). */
    cinfer_status (*reserve_scratch)(cinfer_backend *be,
                                     const cinfer_backend_scratch_plan *p);

    /* (optional) be->step holds the new, checked step: a device backend
     * uploads what its kernels read. NULL: nothing to do. */
    cinfer_status (*set_step)(cinfer_backend *be);

    /* The ops, with backend.h's meanings; rows come from the tensors. */
    cinfer_status (*embed)(cinfer_backend *be, const cinfer_tensor *table,
                           cinfer_tensor *out);
    cinfer_status (*rms_norm)(cinfer_backend *be, const cinfer_tensor *x,
                              const cinfer_tensor *w, float eps,
                              cinfer_tensor *out);
    cinfer_status (*matmul)(cinfer_backend *be, int n_w,
                            const cinfer_tensor *const *w,
                            const cinfer_tensor *x, cinfer_tensor *const *out);
    cinfer_status (*add_bias)(cinfer_backend *be, cinfer_tensor *x,
                              const cinfer_tensor *b);
    cinfer_status (*add)(cinfer_backend *be, const cinfer_tensor *a,
                         const cinfer_tensor *b, cinfer_tensor *out);
    cinfer_status (*rope)(cinfer_backend *be, cinfer_tensor *x, int n_heads,
                          int head_dim, int rot_dim,
                          const cinfer_rope_params *p);
    cinfer_status (*kv_store)(cinfer_backend *be, const cinfer_tensor *k,
                              const cinfer_tensor *v, cinfer_tensor *k_cache,
                              cinfer_tensor *v_cache);
    cinfer_status (*attention)(cinfer_backend *be, const cinfer_tensor *q,
                               const cinfer_tensor *k_cache,
                               const cinfer_tensor *v_cache, int n_heads,
                               int n_kv_heads, int head_dim, float scale,
                               cinfer_tensor *out);
    cinfer_status (*silu_mul)(cinfer_backend *be, const cinfer_tensor *gate,
                              const cinfer_tensor *up, cinfer_tensor *out);
    cinfer_status (*gather_rows)(cinfer_backend *be, const cinfer_tensor *x,
                                 cinfer_tensor *out);
    /* (optional) attention over a window of window >= 1 positions; NULL:
     * CINFER_E_UNSUPPORTED for a windowed layer. */
    cinfer_status (*attention_window)(cinfer_backend *be,
                                      const cinfer_tensor *q,
                                      const cinfer_tensor *k_cache,
                                      const cinfer_tensor *v_cache,
                                      int n_heads, int n_kv_heads,
                                      int head_dim, float scale, int window,
                                      cinfer_tensor *out);
    /* (optional) kv_store at step.swa_slots; NULL: CINFER_E_UNSUPPORTED. */
    cinfer_status (*kv_store_swa)(cinfer_backend *be, const cinfer_tensor *k,
                                  const cinfer_tensor *v,
                                  cinfer_tensor *k_cache,
                                  cinfer_tensor *v_cache);
    /* (optional) NULL: CINFER_E_UNSUPPORTED. */
    cinfer_status (*gelu_mul)(cinfer_backend *be, const cinfer_tensor *gate,
                              const cinfer_tensor *up, cinfer_tensor *out);
    /* (optional) NULL: CINFER_E_UNSUPPORTED. */
    cinfer_status (*scale)(cinfer_backend *be, cinfer_tensor *x, float s);
    /* (optional) matmul of gate and up, then silu_mul, the same bits
     * (backend.h); NULL: backend.c runs the two ops. */
    cinfer_status (*matmul_silu_mul)(cinfer_backend *be,
                                     const cinfer_tensor *w_gate,
                                     const cinfer_tensor *w_up,
                                     const cinfer_tensor *x,
                                     cinfer_tensor *gate, cinfer_tensor *up);
    /* (optional) rope of q and k, then kv_store of k and v, the same bits
     * as the three ops; NULL: backend.c runs them. */
    cinfer_status (*rope_kv_store)(cinfer_backend *be, cinfer_tensor *q,
                                   int n_heads, cinfer_tensor *k,
                                   int n_kv_heads, const cinfer_tensor *v,
                                   int head_dim, int rot_dim,
                                   const cinfer_rope_params *p,
                                   cinfer_tensor *k_cache,
                                   cinfer_tensor *v_cache);
    /* (optional) add then rms_norm in one pass, the same bits as the two
     * ops; NULL: backend.c runs add, then rms_norm. */
    cinfer_status (*add_rms_norm)(cinfer_backend *be, cinfer_tensor *x,
                                  const cinfer_tensor *d,
                                  const cinfer_tensor *w, float eps,
                                  cinfer_tensor *out);

    /* (optional) each row's greedy choice (backend.h); NULL:
     * CINFER_E_UNSUPPORTED. */
    cinfer_status (*greedy)(cinfer_backend *be, const cinfer_tensor *x,
                            cinfer_tensor *out);

    /* (optional) each row's drawn token (backend.h); NULL:
     * CINFER_E_UNSUPPORTED. */
    cinfer_status (*choose)(cinfer_backend *be, const cinfer_tensor *x,
                            const cinfer_draw *draws, cinfer_tensor *out);

    /* (optional) stages 1-3 of the sampler applied to rows of logits
     * (backend.h), the entries checked (n_edits may be 0); NULL:
     * CINFER_E_UNSUPPORTED. */
    cinfer_status (*edit_logits)(cinfer_backend *be, cinfer_tensor *x,
                                 const cinfer_logit_edit *edits,
                                 int64_t n_edits);
    /* (optional, with edit_logits) the last call's values put back;
     * NULL: CINFER_E_UNSUPPORTED. */
    cinfer_status (*unedit_logits)(cinfer_backend *be, cinfer_tensor *x);

    /* (optional) rows' log-softmax parts for their tokens (backend.h),
     * shapes and n_top checked; NULL: CINFER_E_UNSUPPORTED. */
    cinfer_status (*logprobs)(cinfer_backend *be, const cinfer_tensor *x,
                              const cinfer_tensor *tokens,
                              const int32_t *n_top, cinfer_tensor *out);

    /* (optional) The collectives over be->comm. all_reduce_sum is called
     * only with more than one rank (backend.c makes it a no-op
     * otherwise); all_gather also with one rank or none (a copy). NULL:
     * CINFER_E_UNSUPPORTED where a collective is needed. */
    cinfer_status (*all_reduce_sum)(cinfer_backend *be, cinfer_tensor *t);
    cinfer_status (*all_gather)(cinfer_backend *be, const cinfer_tensor *x,
                                cinfer_tensor *out);

    /* (optional, all three) graphs (backend.h): begin after a checked
     * set_step, end with the ops' status when begin answered CAPTURE or
     * REPLAY; NULL: every step is EAGER. */
    cinfer_status (*graph_begin)(cinfer_backend *be, uint64_t key,
                                 cinfer_graph_mode *mode);
    cinfer_status (*graph_end)(cinfer_backend *be, cinfer_status st);
    void (*graph_stats)(const cinfer_backend *be,
                        cinfer_backend_graph_stats *out);
};

/* Rows and elements per row (the product of all dimensions but the first)
 * of a tensor. */
static inline int64_t cinfer_tensor_rows(const cinfer_tensor *t)
{
    return t->desc.shape[0];
}
static inline int64_t cinfer_tensor_cols(const cinfer_tensor *t)
{
    int64_t c = 1;
    for (int i = 1; i < t->desc.n_dims; i++)
        c *= t->desc.shape[i];
    return c;
}

#ifdef __cplusplus
}
#endif
#endif /* CINFER_BACKEND_IMPL_H */
