/*
 * model.h - a Llama-family model loaded from GGUF and its forward pass.
 *
 * The forward pass is written once over the backend ops table
 * (kernels/backend.h). It takes a batch of rows (sequence, position, token)
 * with per-sequence KV block tables, so the scheduler on top decides which
 * sequences run together and where their KV lives; the model only computes.
 *
 * Supported: architectures `llama` (Llama 2 and 3, Mistral; Llama 3's
 * rope frequency factors, rope_freqs.weight), `qwen2` (Q/K/V bias, NEOX
 * rope), `qwen3` (per-head RMSNorm of Q and K before rope, NEOX rope)
 * and `gemma3` (Q/K norms, post-attention and post-FFN norms, GeGLU,
 * embeddings times sqrt(n_embd), sliding-window local layers with their
 * own rope base between global ones; on backends with the attention_window,
 * gelu_mul and scale ops, the CPU today);
 * linear rope scaling; a head size from attention.key_length that differs
 * from embedding_length / head_count; weight types F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0 (converted to Q8_0 at load), Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_NL, IQ4_XS (the K- and IQ4 types on the CPU backend); tied or
 * separate output. Refused at load, with a message naming what: any other
 * architecture, YaRN and LongRoPE scaling, mixtures of experts, a final
 * logit softcap, gemma3 on a backend without its ops, and a file with a
 * tensor the architecture does not use.
 * Weights are read into memory in huge pages, or mapped (use_mmap); the
 * CPU backend computes from that memory in place where it can and packs
 * the int8-block types for its AVX-512 kernels, and a device backend copies
 * them to its memory; either way the file's memory under a copied weight
 * is given back (cinfer_backend_weight_borrows).
 *
 *     cinfer_model_params p = cinfer_model_default_params();
 *     p.path = "SmolLM2-135M-Instruct.Q4_1.gguf";
 *     cinfer_model *m;
 *     if (cinfer_model_create(&p, &m) != CINFER_OK) ...cinfer_last_error()
 *     float *logits = malloc(sizeof(float) * cinfer_model_get_info(m)->n_vocab);
 *     cinfer_model_eval_single(m, ids, n_ids, 0, 0, logits);
 *     cinfer_model_destroy(m);
 *
 * Sliding windows (gemma3): the local layers' K/V lives in a pool of its
 * own (swa_kv_blocks), with a second block table per sequence in the step
 * (cinfer_step.swa_block_tables), so the engine can release a sequence's
 * local blocks once they fall out of the window while the global layers
 * keep every block. Block id n_swa_blocks of that pool is zeroed and
 * never written: tables name it for the blocks a sequence released.
 *
 * Tensor parallelism (tensor_parallel = N > 1), Megatron-style: rank r
 * keeps query heads [r*H/N, (r+1)*H/N) and KV heads likewise (Q, K, V and
 * their biases split by output features), n_ff/N rows of gate and up, the
 * matching input columns of the attention output and down projections
 * (each followed by cinfer_backend_all_reduce_sum of the partial output)
 * and rows [r*V/N, (r+1)*V/N) of the LM head; embeddings and norms are
 * whole on every rank. H and H_kv must divide by N, and the column slices
 * must be whole quantization blocks, else create refuses with the counts.
 *   - With p->backend NULL, cinfer_model_create builds the whole group
 *     (model_group.h: N CPU backends over one LOCAL communicator, or N
 *     CUDA devices over NCCL with tp_device CUDA, possibly over several
 *     processes; a thread per rank) and the returned model is the group:
 *     forward fans the step out to every rank and gathers the full logits,
 *     so callers (the engine) cannot tell it from a whole model. On nodes
 *     other than node 0 the model only follows (cinfer_model_follow).
 *   - With p->backend given (its communicator has N ranks, this one
 *     p->tp_rank), the model is that one rank: forward writes only its
 *     vocabulary columns [r*V/N, (r+1)*V/N) of each logits row, and must
 *     run concurrently with the other ranks' forwards of the same step.
 *
 * Thread safety: one thread at a time per model (the engine thread).
 */
#ifndef CINFER_MODEL_H
#define CINFER_MODEL_H

#include <stdint.h>

#include "../common/status.h"
#include "../kernels/backend.h"
#include "gguf.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_model cinfer_model;

/* Where the ranks of a tensor-parallel group that the model builds run. */
typedef enum {
    CINFER_TP_CPU = 0,  /* CPU backends, threads over a LOCAL communicator */
    CINFER_TP_CUDA = 1, /* one CUDA device per rank, over NCCL */
} cinfer_tp_device;

/* The CUDA entry points a group of CUDA ranks is built with. engine/ links
 * no device code: the program passes the ones it links (cinfer_device's,
 * or the CUDA harness's in tests):
 *     static const cinfer_cuda_entry cuda = {cinfer_comm_create_nccl,
 *                                            cinfer_backend_cuda_create,
 *                                            cinfer_cuda_device_count};
 */
typedef struct {
    cinfer_status (*comm_create_nccl)(const cinfer_comm_nccl_params *p,
                                      cinfer_comm **comms);
    cinfer_status (*backend_create)(const cinfer_backend_cuda_params *p,
                                    cinfer_backend **out);
    int (*device_count)(void);
} cinfer_cuda_entry;

typedef struct {
    const char *path;          /* GGUF file; NULL = the default model */
    cinfer_backend *backend;   /* borrowed, must outlive the model; NULL =
                                  the model creates and owns a CPU backend */
    int n_threads;             /* CPU backend threads; 0 = all cores (a
                                  group shares them out: n_threads /
                                  tensor_parallel per rank, at least 1) */
    cinfer_cpu_isa isa;        /* CPU kernel family; 0 = best available */
    int thread_prio;           /* the CPU backend's workers'
                                  cinfer_thread_prio; 0 = unchanged */
    int n_ctx;                 /* max tokens per sequence; 0 = the model's
                                  trained context, capped at 8192 */
    int block_size;            /* KV block size in tokens; 0 = 16 */
    int n_kv_blocks;           /* KV blocks in the cache; 0 = enough for
                                  max_seqs full sequences */
    int kv_from_budget;        /* 1 = on a backend with a memory budget
                                  (cinfer_backend_memory), the KV cache
                                  takes what weights, activations and
                                  scratch leave of it, at most enough for
                                  max_seqs full sequences (n_kv_blocks is
                                  then ignored); 0 = n_kv_blocks as given
                                  (checked against the budget if any) */
    int max_seqs;              /* sequences the cache is sized for; 0 = 1 */
    int max_batch_rows;        /* most rows one step may carry; 0 = 512 */
    int kv_f32;                /* 1 = F32 KV cache; 0 = F16 */
    int swa_kv_blocks;         /* gemma3's sliding-window (local) layers:
                                  blocks of their own KV pool, in which
                                  the engine releases the blocks out of
                                  every window (info.n_swa_blocks); 0 =
                                  enough for max_seqs windows and a
                                  max_batch_rows chunk, at most
                                  n_kv_blocks; -1 = no pool: those layers
                                  keep K/V of every position in the
                                  global blocks and attention masks the
                                  window (the same outputs, bit for bit).
                                  No pool either on a backend with a
                                  memory budget, or when the window
                                  covers the context */
    int use_mmap;              /* 1 = weights used from a mapping of the
                                  file; 0 = read into memory in huge pages
                                  (gguf.h: in_memory), which decodes
                                  faster */
    int tensor_parallel;       /* ranks the model is split over
                                  (Megatron-style, see below); 0 = 1 */
    int tp_rank;               /* with `backend` given and
                                  tensor_parallel > 1: the rank this model
                                  is, 0..tensor_parallel-1, which must be
                                  the backend communicator's rank; without
                                  a backend, ignored (the model builds the
                                  whole group) */
    int tp_gather_logits;      /* with `backend` given and tensor_parallel
                                  > 1: 1 = the ranks' vocabulary slices are
                                  all-gathered on the device and only rank
                                  0 writes the logits (ranks in several
                                  processes; the vocabulary must divide by
                                  the ranks); 0 = each rank writes its
                                  columns */
    /* Without `backend`: the group of ranks the model builds. */
    cinfer_tp_device tp_device; /* CPU ranks (tensor_parallel > 1), or
                                  CUDA ranks over NCCL, also at
                                  tensor_parallel 1 (one rank through
                                  NCCL) */
    const cinfer_cuda_entry *cuda; /* CUDA ranks: the entry points, borrowed
                                  for create; required */
    const int *cuda_devices;   /* CUDA: [this process's ranks] device
                                  ordinals, borrowed for create; NULL = 0,
                                  1, ... */
    double gpu_memory_fraction; /* CUDA: each rank's share of its device;
                                  0 = the backend's default */
    int cuda_batch_invariant;  /* CUDA: each rank's backend in batch-
                                  invariant mode (backend.h) */
    int cuda_eager;            /* CUDA: each rank's backend without graphs
                                  (cinfer_backend_cuda_params.eager) */
    int n_nodes;               /* CUDA: processes the ranks span, each with
                                  tensor_parallel / n_nodes of them; 0 = 1 */
    int node_rank;             /* this process, 0..n_nodes-1; node 0 runs
                                  the engine, the others follow
                                  (cinfer_model_follow) */
    const char *dist_init_addr; /* n_nodes > 1: node 0's HOST:PORT */
    int dist_timeout_ms;       /* n_nodes > 1 (and NCCL set-up): the bound
                                  on each wait for another node (the
                                  rendezvous, its model load, a step);
                                  0 = 60000 */
    /* Load progress in [0, 1] (optional). */
    void (*progress)(float fraction, void *user);
    void *progress_user;
} cinfer_model_params;

cinfer_model_params cinfer_model_default_params(void);

typedef struct {
    char arch[32];          /* "llama", "qwen2", "qwen3", "gemma3" */
    char name[128];         /* general.name, or "" */
    int n_layer;
    int n_embd;
    int n_head;
    int n_head_kv;
    int head_dim;           /* attention.key_length, else n_embd /
                               n_head */
    int n_ff;
    int n_vocab;
    int n_ctx_train;        /* context length the model was trained for */
    int n_ctx;              /* max tokens per sequence in this instance */
    float rope_theta;
    float norm_eps;
    int64_t n_params;       /* weight elements */
    uint64_t weight_bytes;  /* bytes of weights in the file */
    char quant[16];         /* dominant weight type, e.g. "Q4_1" */
    int has_chat_template;
    int block_size;         /* KV block size in tokens */
    int n_kv_blocks;        /* KV blocks in the cache */
    uint64_t kv_bytes;      /* bytes of the whole KV cache (both
                               pools) */
    int swa_window;         /* gemma3: positions a local layer sees; 0 =
                               no sliding-window layers */
    int n_swa_blocks;       /* blocks of the local layers' own pool (each
                               holds block_size positions of every local
                               layer; n_kv_blocks then of the global
                               layers only); 0 = no such pool, every
                               layer in the n_kv_blocks */
    int max_batch_rows;     /* most rows one forward step may carry */
    /* Memory as the backend holds it. On a backend with a budget the
     * weights are measured there (they may differ from weight_bytes);
     * on the CPU weights_held_bytes = weight_bytes and scratch is 0
     * (host memory taken as needed). */
    uint64_t weights_held_bytes;  /* weights in the backend's memory */
    uint64_t activation_bytes;    /* activation buffers (max_batch_rows) */
    uint64_t scratch_bytes;       /* reserved scratch of the largest step */
    uint64_t budget_bytes;        /* the backend's memory budget; 0 = none */
    /* Tensor parallelism: the memory fields above are one rank's (of a
     * group, the largest rank's). */
    int tensor_parallel;    /* ranks the model is split over; 1 = whole */
    int tp_rank;            /* this rank (0 for a group or a whole model) */
} cinfer_model_info;

/* Loads a model: maps the file, checks every tensor the architecture needs
 * (name, shape, type), builds the tokenizer, allocates the KV cache.
 *
 * On a backend with a memory budget (a GPU), memory is planned here, at
 * start: weights, then activations, then the scratch of the largest step
 * (cinfer_backend_reserve_scratch), then the KV cache. A model that does
 * not fit (the first three over the budget, or room for fewer KV blocks
 * than one full-context sequence needs) fails with CINFER_E_NOMEM and a
 * message with each size in MiB; no step allocates later. */
cinfer_status cinfer_model_create(const cinfer_model_params *p,
                                  cinfer_model **out);
void cinfer_model_destroy(cinfer_model *m);

const cinfer_model_info *cinfer_model_get_info(const cinfer_model *m);
/* Owned by the model. The gguf's metadata stays readable; the data of a
 * weight that the backend copied (weight_borrows: packed or on a device)
 * is given back to the system after loading, so read tensor data from a
 * gguf of one's own. */
const cinfer_tokenizer *cinfer_model_tokenizer(const cinfer_model *m);
const cinfer_gguf *cinfer_model_gguf(const cinfer_model *m);
/* The backend (of a group: rank 0's). */
cinfer_backend *cinfer_model_backend(cinfer_model *m);

/* 1 when forward takes rows' input embeddings (cinfer_step.row_embd,
 * prompt embeddings): a whole model or a group in this process; 0 for a
 * group over several processes, whose steps carry token ids only. */
int cinfer_model_input_embeds(const cinfer_model *m);

/* 1 while the model can run steps: its backend is healthy (a group: every
 * rank's, and no rank has failed a step, which leaves the communicator
 * broken). */
int cinfer_model_healthy(cinfer_model *m);

/* Its backend's graph counts (cinfer_backend_graph_stats_get): decode
 * steps recorded and replayed as CUDA graphs; zeros for a group or a
 * backend without graphs. Call on the thread that runs the steps. */
void cinfer_model_graph_stats(const cinfer_model *m,
                              cinfer_backend_graph_stats *out);

/* The default model's path (from the build, or CINFER_MODEL in the
 * environment); "" if unknown. */
const char *cinfer_model_default_path(void);

/* A model created as node k > 0 of a group over several processes
 * (n_nodes > 1, node_rank > 0) computes only the steps node 0 sends: this
 * runs them until node 0 destroys its model (CINFER_OK) or a step or the
 * channel to node 0 fails (that error; the group is then broken on every
 * node). forward on such a model is refused; CINFER_E_INVALID_ARG on any
 * other model. */
cinfer_status cinfer_model_follow(cinfer_model *m);

/* Runs one step: every row of `step` goes through the model, K/V of every
 * row is written to its slot, and the logits of the step's out_rows are
 * written to `logits` ([step->n_out, n_vocab], row-major). Block ids must be
 * < n_kv_blocks and n_rows <= max_batch_rows. A row with an input
 * embedding (step->row_embd[r], n_embd floats) takes it where its token's
 * row of token_embd would be, before anything the architecture does to
 * that row (gemma3's sqrt(n_embd) scale): the dequantized row of a token
 * gives that token's output bit for bit. */
cinfer_status cinfer_model_forward(cinfer_model *m, const cinfer_step *step,
                                   float *logits);

/* What cinfer_model_forward_choose does with the logits where they are
 * (kernels/backend.h), row j = out row j. */
typedef struct {
    /* [n_out], or NULL: every row's greedy choice (cinfer_backend_greedy);
     * else draws[j] says row j's draw (cinfer_backend_choose; inv_t 0 for
     * a greedy row). */
    const cinfer_draw *draws;
    /* n_edits entries applied to the rows first (cinfer_backend_edit_logits:
     * the samplers' stages 1-3, cinfer_sampler_edits). */
    const cinfer_logit_edit *edits;
    int64_t n_edits;
    /* [n_out], or NULL: no logprobs; else after the choice, for each row
     * with n_top[j] >= 0, its token's logprobs' parts in the raw row (the
     * edits put back: cinfer_backend_unedit_logits) into logprobs[j]
     * ([n_out]; cinfer_backend_logprobs, cinfer_sampler_take_logprobs). */
    const int32_t *n_top;
    cinfer_row_logprobs *logprobs;
} cinfer_choice;

/* cinfer_model_forward whose out rows' tokens are chosen where the logits
 * are, as `ch` says (NULL: every row greedy): only codes[j]
 * ([step->n_out] int32) come back, and the logprobs asked for, not the
 * logits. A code is the token, or -1 for a row of -inf, or below that its
 * first NaN or +inf: cinfer_sampler_take_code turns it into the token or
 * the sampler's error. For samplers a backend can choose for
 * (engine/sampler.h, cinfer_sampler_backend_choice). CINFER_E_UNSUPPORTED
 * beyond cinfer_model_choices. */
cinfer_status cinfer_model_forward_choose(cinfer_model *m,
                                          const cinfer_step *step,
                                          const cinfer_choice *ch,
                                          int32_t *codes);

/* What cinfer_model_forward_choose can do here: 0 nothing (tensor
 * parallelism: no backend holds every logit), 1 greedy rows (the CPU
 * backend), 2 greedy rows and draws, 3 those after edits, 4 and logprobs
 * too (CUDA, a vocabulary of at most CINFER_CHOOSE_MAX_N). */
int cinfer_model_choices(const cinfer_model *m);

/* Convenience for one sequence whose KV occupies blocks 0, 1, 2, ...
 * (and, with a window pool, block i % n_swa_blocks of it, so the chunks
 * are cut to what that ring holds besides the window):
 * evaluates tokens at positions pos0 .. pos0+n-1 (in chunks of at most
 * max_batch_rows) and writes the logits of every row (all_logits = 1,
 * [n, n_vocab]) or of the last row only ([n_vocab]). A call with one token
 * at a position > 0 is taken for the decode of a generated token
 * (cinfer_step.row_gen); any other call for prompt tokens. */
cinfer_status cinfer_model_eval_single(cinfer_model *m, const int32_t *tokens,
                                       int n, int pos0, int all_logits,
                                       float *logits);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_MODEL_H */
