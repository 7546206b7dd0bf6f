/*
 * attention.cuh - causal paged attention on CUDA: the backend's attention
 * slot (kernels/backend.h) over the paged KV cache.
 *
 * Row r of sequence s = row_seq[r] attends to positions 0..positions[r] of
 * s, read through s's block table; query head h uses KV head
 * h / (n_heads / n_kv_heads). The step's rows are split, on the host, into
 * two kinds of work (the plan):
 *
 *   - prefill tiles: runs of consecutive rows of one sequence at
 *     consecutive positions (2..CINFER_CUDA_ATTN_TILE_ROWS rows). A block
 *     takes a tile's rows times the query heads of one KV group and walks
 *     the context in KV tiles gathered through the block table into shared
 *     memory, with an online softmax in fp32 (flash-attention 2's loop).
 *     With F16 caches and head_dim a multiple of 8 up to 128 the scores
 *     and P V run on tensor cores (mma.sync m16n8k16, f32 accumulators,
 *     the weights rounded to F16 for P V), else on CUDA cores. The causal
 *     mask is per row: the row at position p sees keys <= p. A tile's
 *     context is not split: one block walks all of it (a chunk of many
 *     rows already gives many blocks), and a row's bits never depend on
 *     the other rows of its tile.
 *   - decode rows: every row that is a run of one. Its context is split
 *     into partitions of CINFER_CUDA_ATTN_PART_TOKENS tokens, one block per
 *     (row, KV head, partition) with the group's query heads together
 *     (vLLM's paged_attention_v2). A row with one partition is finished by
 *     that block; a row with more leaves per-partition results in scratch
 *     and a reduce kernel combines them.
 *
 * Softmax and accumulation are fp32. Against an F16 K cache the query is
 * rounded to F16 first (GGML's arithmetic, which the CPU backend and the
 * tests' reference follow). Slots past a row's position are never read.
 * head_dim: a multiple of 4 up to 256; others are CINFER_E_UNSUPPORTED.
 *
 *     // set_step, on the host copy of the step:
 *     size_t n = cinfer_cuda_attention_plan_ints(&step);   // <= 2 * n_rows
 *     cinfer_cuda_attn_plan_info info;
 *     cinfer_cuda_attention_plan(&step, host_meta + plan_off, n, &info);
 *     // ... upload host_meta in one copy ...
 *     // attention:
 *     cinfer_cuda_attn_args a = {stream, q, kc, vc, CINFER_DTYPE_F16,
 *                                CINFER_DTYPE_F16, out, d_positions,
 *                                d_row_seq, d_block_tables, d_plan, ...};
 *     a.plan = info;
 *     cinfer_status st = cinfer_cuda_attention(&a);
 *
 * Thread safety: the functions keep no state; a launch is ordered on its
 * stream like any other.
 */
#ifndef CINFER_CUDA_ATTENTION_CUH
#define CINFER_CUDA_ATTENTION_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most rows in one prefill tile of the plan. */
#define CINFER_CUDA_ATTN_TILE_ROWS 32
/* Context tokens per decode partition. */
#define CINFER_CUDA_ATTN_PART_TOKENS 512
/* Largest head_dim (head_dim must also be a multiple of 4). */
#define CINFER_CUDA_ATTN_MAX_HEAD_DIM 256

/* What the launcher needs to know about a plan, besides the plan itself. */
typedef struct {
    int32_t n_tiles;     /* prefill tiles: plan[2t] = first row, plan[2t+1]
                            = rows (2..CINFER_CUDA_ATTN_TILE_ROWS) */
    int32_t n_decode;    /* decode rows: plan[2 * n_tiles + i] = row index */
    int32_t max_parts;   /* most partitions of a decode row's context
                            (0 = no decode rows). The launcher may be given
                            a larger value (a fixed bound for graph
                            capture): blocks past a row's partitions exit */
    int32_t max_context; /* longest context of any row (positions[r] + 1) */
} cinfer_cuda_attn_plan_info;

/* Ints cinfer_cuda_attention_plan() writes at most for the step:
 * 2 * n_rows. Thread-safe. */
size_t cinfer_cuda_attention_plan_ints(const cinfer_step *s);

/* Writes the plan of step s into plan[0..n_ints) (host memory, at least
 * cinfer_cuda_attention_plan_ints(s) ints) and its counts into *info.
 * The step is the one set_step validated (positions >= 0, row_seq in
 * range). CINFER_E_INVALID_ARG if n_ints is too small. Thread-safe. */
cinfer_status cinfer_cuda_attention_plan(const cinfer_step *s, int32_t *plan,
                                         size_t n_ints,
                                         cinfer_cuda_attn_plan_info *info);

/* Scratch bytes an attention call needs for up to n_rows decode rows of
 * n_heads heads of head_dim with contexts up to max_context tokens
 * (0 when no row can have more than one partition). Thread-safe. */
size_t cinfer_cuda_attention_scratch_bytes(int32_t n_rows, int n_heads,
                                           int head_dim, int32_t max_context);

/* One attention call. Every pointer is device memory the caller owns; it
 * must stay valid until the stream has run the launch. */
typedef struct {
    cudaStream_t stream;
    const float *q;              /* [n_rows, n_heads * head_dim] */
    const void *k_cache;         /* [n_blocks, block_size, n_kv_heads,
                                    head_dim] of k_dtype */
    const void *v_cache;         /* the same shape, of v_dtype */
    cinfer_dtype k_dtype;        /* CINFER_DTYPE_F16 or CINFER_DTYPE_F32 */
    cinfer_dtype v_dtype;        /* CINFER_DTYPE_F16 or CINFER_DTYPE_F32 */
    float *out;                  /* [n_rows, n_heads * head_dim]; not q */
    const int32_t *positions;    /* [n_rows] the step's positions */
    const int32_t *row_seq;      /* [n_rows] the step's row_seq */
    const int32_t *block_tables; /* [n_seqs, max_blocks] the step's tables;
                                    the block ids rows read are < n_blocks */
    const int32_t *plan_ints;    /* the plan cinfer_cuda_attention_plan()
                                    wrote, uploaded */
    int32_t n_rows;              /* rows of the step, >= 1 */
    int32_t n_seqs;              /* sequences of the step, >= 1 */
    int32_t max_blocks;          /* row stride of block_tables, >= 1 */
    int32_t block_size;          /* tokens per KV block, >= 1 */
    int n_heads;                 /* query heads, a multiple of n_kv_heads */
    int n_kv_heads;              /* KV heads, >= 1 */
    int head_dim;                /* a multiple of 4, <= 256 */
    float scale;                 /* score scale, usually 1/sqrt(head_dim) */
    cinfer_cuda_attn_plan_info plan; /* the counts the plan call returned */
    void *scratch;               /* device scratch (decode partitions) */
    size_t scratch_bytes;        /* its size: at least
                                    cinfer_cuda_attention_scratch_bytes(
                                    plan.n_decode, n_heads, head_dim,
                                    plan.max_parts * PART_TOKENS) */
} cinfer_cuda_attn_args;

/* The kernel prefill tiles take from now on, process-wide: 0 = the
 * default (tensor cores where they apply: F16 K and V caches, head_dim a
 * multiple of 8 up to 128; else the CUDA-core kernel), 1 = always the
 * CUDA-core kernel, 2 = tensor cores where they apply. The environment's
 * CINFER_CUDA_PREFILL=cores or =mma sets it at the first call. For
 * comparisons (tests, benchmarks). */
void cinfer_cuda_attention_force_prefill(int kind);

/* Checks the arguments and launches the step's attention on a->stream:
 * CINFER_E_INVALID_ARG for a bad argument (including too little scratch),
 * CINFER_E_UNSUPPORTED for a head_dim or dtype without a kernel,
 * CINFER_E_DEVICE if a launch fails. Thread-safe (no state). */
cinfer_status cinfer_cuda_attention(const cinfer_cuda_attn_args *a);

#ifdef __cplusplus
}
#endif

#endif /* CINFER_CUDA_ATTENTION_CUH */
