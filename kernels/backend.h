/*
 * backend.h - the ops table between the model and the hardware.
 *
 * The model (engine/model.c) is written once against these calls; the CPU
 * backend (kernels/cpu/) and the CUDA backend (kernels/cuda/) implement
 * them behind a private ops table (backend_impl.h), as ggml-backend does:
 * the backend and tensor structs are opaque here, and the cinfer_backend_*
 * wrappers in backend.c hold every shape, dtype and step check, so a
 * backend implements arithmetic only. The seam is shaped for a GPU:
 *
 *   - Tensors are backend-owned buffers behind opaque handles with a dtype
 *     and a shape. The model never dereferences activation or KV memory;
 *     data crosses the seam only through upload/download.
 *   - Ops are asynchronous: enqueued in order, complete at synchronize().
 *     The CPU backend runs each op at once; the CUDA backend enqueues them
 *     on its stream.
 *   - Ops are batch-level: one call per layer op for all rows of all
 *     sequences in the step. The step's metadata (tokens, positions, KV slots,
 *     block tables, rows whose outputs are wanted) is handed over once per
 *     step with set_step() and the ops read it from there, so a decode step
 *     of a given shape is always the same op sequence (graph-capturable).
 *
 * Shapes are written outermost first: a [rows, cols] tensor is row-major with
 * cols contiguous. GGUF lists dimensions innermost first, so a GGUF weight
 * with ne = {n_in, n_out} is a [n_out, n_in] tensor here.
 *
 * Paged KV cache: per layer one K and one V tensor of shape
 * [n_blocks, block_size, n_kv_heads, head_dim] (F16 or F32). Token position p
 * of sequence s lives in block block_tables[s * max_blocks + p / block_size]
 * at offset p % block_size; its "slot" is block * block_size + offset.
 *
 * Example (one layer's attention block, CPU backend):
 *
 *     cinfer_backend *be;
 *     cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
 *     cinfer_backend_cpu_create(&bp, &be);
 *     cinfer_backend_set_step(be, &step);
 *     cinfer_backend_rms_norm(be, x, attn_norm, eps, h);
 *     const cinfer_tensor *w[3] = {wq, wk, wv};
 *     cinfer_tensor *o[3] = {q, k, v};
 *     cinfer_backend_matmul(be, 3, w, h, o);
 *     ...
 *     cinfer_backend_synchronize(be);
 *
 * Thread safety: a backend instance is used by one thread at a time (the
 * engine thread); distinct instances are independent.
 */
#ifndef CINFER_BACKEND_H
#define CINFER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "comm.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_backend cinfer_backend;
typedef struct cinfer_tensor cinfer_tensor;

#define CINFER_MAX_DIMS 4

/* Dtype and shape of a tensor. shape[0] is outermost; shape[n_dims - 1] is
 * contiguous. Unused trailing entries are ignored. */
typedef struct {
    cinfer_dtype dtype;
    int n_dims;                         /* 1..CINFER_MAX_DIMS */
    int64_t shape[CINFER_MAX_DIMS];     /* elements per dimension, >= 1 */
} cinfer_tensor_desc;

/* Metadata of one forward step. Every pointer is host memory that
 * set_step() copies (or uploads); it need not outlive the call. */
typedef struct {
    int32_t n_rows;              /* rows (tokens) in the step, >= 1 */
    int32_t n_seqs;              /* sequences the rows belong to, >= 1 */
    int32_t block_size;          /* KV block size in tokens */
    int32_t max_blocks;          /* row stride of block_tables */
    const int32_t *tokens;       /* [n_rows] token id per row */
    const int32_t *positions;    /* [n_rows] position of the row in its seq */
    const int32_t *row_seq;      /* [n_rows] sequence index, 0..n_seqs-1 */
    const int32_t *slots;        /* [n_rows] KV slot the row's K/V goes to */
    const int32_t *block_tables; /* [n_seqs, max_blocks] KV block ids */
    int32_t n_out;               /* rows whose outputs are wanted */
    const int32_t *out_rows;     /* [n_out] indices into the rows, ascending */
    const uint8_t *row_gen;      /* [n_rows] 1 = the row's token was generated
                                    (sampled), 0 = given (prompt); NULL = all
                                    0. Attention computes generated rows with
                                    llama.cpp's single-token arithmetic and
                                    given rows with its batched arithmetic,
                                    so a stream matches llama.cpp's token for
                                    token; either way a row's result depends
                                    on nothing else in the batch. */
    /* Sliding-window layers with a KV pool of their own (Gemma 3's local
     * layers, whose blocks out of every window are released): both set or
     * both NULL. NULL = those layers use slots and block_tables. */
    const int32_t *swa_slots;        /* [n_rows] slot of the row's K/V in
                                        the window pool (kv_store_swa) */
    const int32_t *swa_block_tables; /* [n_seqs, max_blocks] window-pool
                                        block ids (attention_window with
                                        window > 0); a block wholly out of
                                        the row's window is never weighed
                                        but may be read, so it names a
                                        valid block: a zeroed one no row
                                        writes keeps it exactly 0 */
    /* Prompt embeddings: read by the model, not by set_step. */
    const float *const *row_embd; /* [n_rows] the row's input ([n_embd]
                                     F32 host memory, read during
                                     cinfer_model_forward) in place of its
                                     token's row of the embedding table
                                     (the token id is then ignored), or
                                     NULL for the token's; NULL = every
                                     row its token's */
} cinfer_step;

typedef enum {
    CINFER_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): llama */
    CINFER_ROPE_NEOX = 2, /* rotate halves (x[i], x[i + d/2]): qwen2, neox */
} cinfer_rope_mode;

/* How rope turns a position into angles (llama.cpp's ggml_rope_ext with
 * ext_factor 0 and attn_factor 1): pair i of a row at position p turns by
 *     freq_scale * (p * theta^(-2i/rot_dim) / freq_factors[i]).
 * Linear scaling ("rope.scaling.type" linear) is freq_scale = 1 / factor;
 * Llama 3's frequency factors are the file's rope_freqs.weight. */
typedef struct {
    float theta;               /* base frequency, finite and > 0 */
    float freq_scale;          /* every angle times this, finite and > 0;
                                  1 = unscaled */
    const float *freq_factors; /* [rot_dim / 2] host memory, each finite
                                  and > 0, read during the call only;
                                  NULL = all 1 */
    cinfer_rope_mode mode;
} cinfer_rope_params;

/*
 * The ops. Every op returns CINFER_OK or an error status with
 * cinfer_set_error() filled; an op that fails changes none of its outputs'
 * meaning beyond "undefined" and leaves the backend usable. These wrappers
 * hold every dtype, shape, aliasing and step check (backend.c); a backend
 * implements only the arithmetic, behind the private ops table
 * (backend_impl.h). Ops may be asynchronous (a device backend enqueues
 * them); synchronize() waits for them and reports a device fault that
 * happened meanwhile.
 */

/* ---- lifetime and memory ------------------------------------------------ */

/* A new tensor with undefined contents. */
cinfer_status cinfer_backend_tensor_create(cinfer_backend *be,
                                           const cinfer_tensor_desc *desc,
                                           cinfer_tensor **out);

/* A read-only tensor holding `data` (host memory laid out as the desc says:
 * whole quantized blocks per row). The CPU backend may use `data` in place
 * (then it must outlive the tensor, as mmapped weights do) or repack it; a
 * device backend copies it. cinfer_backend_weight_borrows says which. */
cinfer_status cinfer_backend_tensor_create_weight(cinfer_backend *be,
                                                  const cinfer_tensor_desc *desc,
                                                  const void *data,
                                                  cinfer_tensor **out);

/* Sets shape[0] of a tensor to `rows`, 1 <= rows <= shape[0] at creation,
 * keeping the layout of the first rows: one set of activation buffers
 * serves steps of any row count up to the capacity. */
cinfer_status cinfer_backend_tensor_set_rows(cinfer_backend *be,
                                             cinfer_tensor *t, int64_t rows);

/* Frees a tensor (NULL is fine). */
void cinfer_backend_tensor_destroy(cinfer_backend *be, cinfer_tensor *t);

/* 1 if weight t still reads the `data` it was created from (which must
 * then outlive it); 0 if it holds its own copy, so the caller may free that
 * memory. */
int cinfer_backend_weight_borrows(cinfer_backend *be, const cinfer_tensor *t);

/* Copies bytes between host memory and a tensor. Offsets and sizes are in
 * bytes and must lie inside the tensor. Both complete before they return
 * (the host buffer may be reused at once); download waits for the ops
 * enqueued before it. */
cinfer_status cinfer_backend_upload(cinfer_backend *be, cinfer_tensor *t,
                                    size_t offset, const void *src,
                                    size_t n_bytes);
cinfer_status cinfer_backend_download(cinfer_backend *be,
                                      const cinfer_tensor *t, size_t offset,
                                      void *dst, size_t n_bytes);

/* Sets every byte of a tensor to zero. */
cinfer_status cinfer_backend_fill_zero(cinfer_backend *be, cinfer_tensor *t);

/* Waits until every enqueued op has completed. */
cinfer_status cinfer_backend_synchronize(cinfer_backend *be);

/* 1 while the backend can run ops; 0 once it hit a fault it cannot recover
 * from (a sticky device error: illegal address, uncorrectable ECC). */
int cinfer_backend_healthy(cinfer_backend *be);

/* ---- step metadata --------------------------------------------------------- */

/* Hands over the step's metadata; the ops below read it. Checked here:
 * counts, indices in range, slots unique, out_rows ascending. */
cinfer_status cinfer_backend_set_step(cinfer_backend *be,
                                      const cinfer_step *step);

/* ---- ops (activations are F32 unless said otherwise) ----------------------- */

/* out[r] = table[step.tokens[r]].  table: [vocab, d] any dtype;
 * out: [n_rows, d]. A token outside the table is an error. */
cinfer_status cinfer_backend_embed(cinfer_backend *be,
                                   const cinfer_tensor *table,
                                   cinfer_tensor *out);

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w.  x, out: [n, d];
 * w: [d] F32, or [g] F32 with g dividing d: then each run of g elements of
 * a row is normalised on its own (a per-head norm, Qwen3's Q and K norms,
 * with g = head_dim). out may alias x. */
cinfer_status cinfer_backend_rms_norm(cinfer_backend *be,
                                      const cinfer_tensor *x,
                                      const cinfer_tensor *w, float eps,
                                      cinfer_tensor *out);

/* For i in 0..n_w-1: out[i] = x * w[i]^T, i.e. out[i][r][o] =
 * dot(x[r], w[i][o]).  w[i]: [n_out_i, n_in] any weight dtype the backend
 * has a kernel for; x: [n, n_in]; out[i]: [n, n_out_i]. Weights sharing
 * one input are passed together so the input is prepared (quantized) once.
 * 1 <= n_w <= 4. On the CPU each output element's reduction order is fixed
 * by n_in alone, so results do not depend on n or on a row's place in the
 * batch (batch invariance). */
cinfer_status cinfer_backend_matmul(cinfer_backend *be, int n_w,
                                    const cinfer_tensor *const *w,
                                    const cinfer_tensor *x,
                                    cinfer_tensor *const *out);

/* The feed-forward block's gate and up products and SwiGLU:
 * cinfer_backend_matmul of w_gate and w_up into gate and up, then
 * cinfer_backend_silu_mul(gate, up, gate), the same bits; a backend may run
 * them as one kernel (CUDA does for decode rows of a quantized type), and
 * then leaves up unwritten: after the call gate holds the result and up
 * nothing the caller may read. w_gate, w_up: [n_ff, n_in] of one shape. */
cinfer_status cinfer_backend_matmul_silu_mul(cinfer_backend *be,
                                             const cinfer_tensor *w_gate,
                                             const cinfer_tensor *w_up,
                                             const cinfer_tensor *x,
                                             cinfer_tensor *gate,
                                             cinfer_tensor *up);

/* x[r] += b.  x: [n, d]; b: [d] F32. */
cinfer_status cinfer_backend_add_bias(cinfer_backend *be, cinfer_tensor *x,
                                      const cinfer_tensor *b);

/* out = a + b, elementwise, same shapes. out may alias a or b. */
cinfer_status cinfer_backend_add(cinfer_backend *be, const cinfer_tensor *a,
                                 const cinfer_tensor *b, cinfer_tensor *out);

/* The residual add and the norm after it: x = x + d, then out =
 * rms_norm(x, w, eps), with the bits of cinfer_backend_add(x, d, x)
 * followed by cinfer_backend_rms_norm(x, w, eps, out); a backend may run
 * them as one kernel (CUDA does for a whole-row w). x, d, out: [n, k] F32,
 * w as rms_norm's. out may alias d but not x (x keeps the sum). */
cinfer_status cinfer_backend_add_rms_norm(cinfer_backend *be, cinfer_tensor *x,
                                          const cinfer_tensor *d,
                                          const cinfer_tensor *w, float eps,
                                          cinfer_tensor *out);

/* Rotary embedding in place at each row's step position.
 * x: [n, n_heads * head_dim]; the first rot_dim dims of each head are
 * rotated with frequency theta^(-2i/rot_dim). */
cinfer_status cinfer_backend_rope(cinfer_backend *be, cinfer_tensor *x,
                                  int n_heads, int head_dim, int rot_dim,
                                  float theta, cinfer_rope_mode mode);
/* The same with the angles of cinfer_rope_params (p is read during the
 * call only). */
cinfer_status cinfer_backend_rope_ext(cinfer_backend *be, cinfer_tensor *x,
                                      int n_heads, int head_dim, int rot_dim,
                                      const cinfer_rope_params *p);

/* Writes each row's K and V into the cache at its step slot.
 * k, v: [n, n_kv_heads * head_dim]; k_cache, v_cache:
 * [n_blocks, block_size, n_kv_heads, head_dim] F16 or F32. */
cinfer_status cinfer_backend_kv_store(cinfer_backend *be,
                                      const cinfer_tensor *k,
                                      const cinfer_tensor *v,
                                      cinfer_tensor *k_cache,
                                      cinfer_tensor *v_cache);

/* The rotary embedding of q (n_heads) and k (n_kv_heads), both in place,
 * then kv_store of the roped k and of v: the bits of rope_ext(q),
 * rope_ext(k) and kv_store; a backend may run them as one kernel (CUDA
 * does). q, k and v are three tensors. */
cinfer_status cinfer_backend_rope_kv_store(
    cinfer_backend *be, cinfer_tensor *q, int n_heads, cinfer_tensor *k,
    int n_kv_heads, const cinfer_tensor *v, int head_dim, int rot_dim,
    const cinfer_rope_params *p, cinfer_tensor *k_cache,
    cinfer_tensor *v_cache);

/* kv_store into the sliding-window layers' own pool, at the step's
 * swa_slots (which must be set). Optional: CINFER_E_UNSUPPORTED where a
 * backend lacks it. */
cinfer_status cinfer_backend_kv_store_swa(cinfer_backend *be,
                                          const cinfer_tensor *k,
                                          const cinfer_tensor *v,
                                          cinfer_tensor *k_cache,
                                          cinfer_tensor *v_cache);

/* Causal paged attention: row r of sequence s = step.row_seq[r] attends to
 * positions 0..step.positions[r] of s, read through s's block table (so
 * kv_store for the step must come first). Grouped-query: query head h uses
 * KV head h / (n_heads / n_kv_heads).  q, out: [n, n_heads * head_dim]. */
cinfer_status cinfer_backend_attention(cinfer_backend *be,
                                       const cinfer_tensor *q,
                                       const cinfer_tensor *k_cache,
                                       const cinfer_tensor *v_cache,
                                       int n_heads, int n_kv_heads,
                                       int head_dim, float scale,
                                       cinfer_tensor *out);

/* The same over a sliding window (Gemma 3's local layers): row r attends
 * to positions max(0, p - window + 1)..p of its sequence, p =
 * step.positions[r] (llama.cpp's standard SWA mask: key p0 is hidden from
 * query p1 when p1 - p0 >= window). window 0 = the whole causal context,
 * as cinfer_backend_attention. With window > 0 and step.swa_block_tables
 * set, the blocks are read through those tables (k_cache and v_cache are
 * then the window pool's). A backend without the optional slot answers
 * CINFER_E_UNSUPPORTED for window > 0. */
cinfer_status cinfer_backend_attention_window(cinfer_backend *be,
                                              const cinfer_tensor *q,
                                              const cinfer_tensor *k_cache,
                                              const cinfer_tensor *v_cache,
                                              int n_heads, int n_kv_heads,
                                              int head_dim, float scale,
                                              int window, cinfer_tensor *out);

/* out = silu(gate) * up.  gate, up, out: [n, f]. out may alias gate. */
cinfer_status cinfer_backend_silu_mul(cinfer_backend *be,
                                      const cinfer_tensor *gate,
                                      const cinfer_tensor *up,
                                      cinfer_tensor *out);

/* out = gelu(gate) * up, GELU's tanh form as GGML's CPU backend computes
 * it (gate rounded to F16, gelu of that rounded to F16; 0 below -10 and
 * the identity above 10): Gemma's GeGLU. gate, up, out: [n, f]; out may
 * alias gate. Optional: CINFER_E_UNSUPPORTED where a backend lacks it. */
cinfer_status cinfer_backend_gelu_mul(cinfer_backend *be,
                                      const cinfer_tensor *gate,
                                      const cinfer_tensor *up,
                                      cinfer_tensor *out);

/* x *= s, in place (Gemma's embeddings times sqrt(n_embd)). x: F32, any
 * shape; s finite. Optional: CINFER_E_UNSUPPORTED where a backend lacks
 * it. */
cinfer_status cinfer_backend_scale(cinfer_backend *be, cinfer_tensor *x,
                                   float s);

/* The greedy choice of every row, where it is made (only token ids then
 * cross the seam, not rows of logits): out[r] = the index of the largest
 * of x[r][0..n), the lowest on ties (-0.0 equals +0.0), as
 * cinfer_sampler_argmax and a sampler with nothing to apply choose
 * (engine/sampler.h); -1 when every entry of the row is -INFINITY; and
 * -2 - (2 i + nan) when x[r][i] is the row's first NaN (nan = 1) or
 * +INFINITY (nan = 0). x: [rows, n] F32, 1 <= n <= 2^28; out: [rows] I32.
 * Optional: CINFER_E_UNSUPPORTED where cinfer_backend_has_greedy says 0. */
cinfer_status cinfer_backend_greedy(cinfer_backend *be, const cinfer_tensor *x,
                                    cinfer_tensor *out);
int cinfer_backend_has_greedy(const cinfer_backend *be);

/* What cinfer_backend_choose draws for one row (engine/sampler.h's
 * cinfer_sampler_draw_params gives it). */
typedef struct {
    float inv_t;   /* 1 / temperature; 0 = the greedy choice */
    float min_w;   /* min_p: weights below it count as 0 */
    double u;      /* the draw's uniform, in [0, 1) */
    int32_t top_k; /* keep the k largest, 1..CINFER_CHOOSE_MAX_K; 0 = all */
    float top_p;   /* in (0, 1]; 1 = off */
} cinfer_draw;

/* Most entries a row of cinfer_backend_choose may have (256 chunks of
 * 1024), and the largest top_k it takes. */
#define CINFER_CHOOSE_MAX_N (256 * 1024)
#define CINFER_CHOOSE_MAX_K 1024

/* Each row's token drawn where the logits are, as engine/sampler.c draws
 * from a row it has nothing (more) to apply to, the same bits:
 *   - top_k 0, top_p 1 (its scan plan): w[i] = its e^((x[i] - max) *
 *     inv_t) (no libm), 0 below min_w; sums of 1024-entry chunks in
 *     double; target = u * their sum; the first entry whose running sum
 *     in index order passes it;
 *   - top_k k, top_p 1 (its candidate plan): the k largest (ties to the
 *     lower index) in index order, their weights, those >= min_w and > 0
 *     kept, summed and walked in that order;
 *   - top_p p < 1 (candidates too): of the row (top_k 0) or of its k
 *     largest, the entries of the histogram buckets (8 a nat below max)
 *     whose mass reaches p times the weights' sum (all k up to 256 of
 *     them), sorted (larger first, ties to the lower index); the shortest
 *     prefix whose running sum reaches that target; of it those >= min_w
 *     and > 0, summed and walked in sorted order.
 * out[r] is that token, or, for inv_t 0, the greedy choice; or
 * cinfer_backend_greedy's codes for a bad row (-1: all -inf; -2 - (2 i +
 * nan): a NaN or +inf at i). x: [rows, n] F32, 1 <= n <=
 * CINFER_CHOOSE_MAX_N; draws: [rows] host memory, read during the call;
 * out: [rows] I32. Optional: CINFER_E_UNSUPPORTED where
 * cinfer_backend_has_choose says 0. */
cinfer_status cinfer_backend_choose(cinfer_backend *be, const cinfer_tensor *x,
                                    const cinfer_draw *draws,
                                    cinfer_tensor *out);
int cinfer_backend_has_choose(const cinfer_backend *be);

/* One entry of cinfer_backend_edit_logits: what engine/sampler.c's stages
 * 1-3 do to one token of one row, in their order (cinfer_sampler_edits
 * gives them). */
enum {
    CINFER_EDIT_BIAS = 1, /* v = v + bias (logit_bias) */
    CINFER_EDIT_MASK = 2, /* v = -INFINITY (min_tokens' end-of-generation) */
    CINFER_EDIT_REP = 4,  /* v = v > 0 ? v / rp : v * rp */
    CINFER_EDIT_FREQ = 8  /* v = v - fn; v = v - pres */
};
typedef struct {
    int32_t row;    /* of x */
    int32_t token;  /* the entry of that row */
    uint32_t flags; /* CINFER_EDIT_*, applied in the order above */
    float bias;     /* BIAS: finite or -INFINITY */
    float rp;       /* REP: repetition_penalty, > 0 and finite */
    float fn;       /* FREQ: frequency_penalty * count, rounded to float */
    float pres;     /* FREQ: presence_penalty */
} cinfer_logit_edit;

/* Most entries one cinfer_backend_edit_logits call takes. */
#define CINFER_EDIT_MAX ((int64_t)1 << 30)

/* Applies `edits` to x in place, each entry with single-precision IEEE
 * operations rounded to nearest and not fused (the host sampler's bits):
 * v = x[row][token], the flags' operations in the enum's order, x[row]
 * [token] = v; an entry whose value is NaN or +INFINITY beforehand is left
 * as it is, so that cinfer_backend_greedy and _choose then name it as
 * the sampler would have. At most one entry per (row, token): entries run
 * in any order and at once. x: [rows, n] F32; edits: [n_edits] host
 * memory, read during the call, 0 <= n_edits <= CINFER_EDIT_MAX. A bad
 * entry is CINFER_E_INVALID_ARG, named, before anything is applied.
 * Optional: CINFER_E_UNSUPPORTED where cinfer_backend_has_edit_logits
 * says 0. */
cinfer_status cinfer_backend_edit_logits(cinfer_backend *be, cinfer_tensor *x,
                                         const cinfer_logit_edit *edits,
                                         int64_t n_edits);
int cinfer_backend_has_edit_logits(const cinfer_backend *be);

/* Puts back in x the values the last cinfer_backend_edit_logits call on
 * this backend replaced there, bit for bit (the raw rows, for
 * cinfer_backend_logprobs after a choice from the edited ones). x: the
 * tensor that call edited, not written since; CINFER_E_INVALID_ARG if the
 * last call edited another tensor or failed. A call with no entries
 * leaves nothing to put back. Optional, with edit_logits:
 * CINFER_E_UNSUPPORTED where the backend has no edit_logits op. */
cinfer_status cinfer_backend_unedit_logits(cinfer_backend *be,
                                           cinfer_tensor *x);

/* Most top entries cinfer_backend_logprobs reports for a row
 * (engine/sampler.h's CINFER_SAMPLER_MAX_LOGPROBS). */
#define CINFER_LOGPROBS_MAX_TOP 20

/* What cinfer_backend_logprobs finds in one row x[0..n) for its token t:
 * the parts of engine/sampler.c's log-softmax that need the whole row, so
 * that the host finishes it (a log and two subtractions) with the
 * sampler's own bits. */
typedef struct {
    double sum;     /* the sampler's weights at inv_t 1 (e^(x[i] - max),
                       no libm), summed as its 1024-entry chunks in chunk
                       order */
    int64_t better; /* entries i with x[i] > x[t], or x[i] == x[t], i < t */
    float max;      /* the row's largest entry */
    float logit;    /* x[t] */
    int32_t n_top;  /* min(the row's n_top, n) */
    int32_t top_id[CINFER_LOGPROBS_MAX_TOP]; /* the n_top largest entries,
                                                largest first, ties to the
                                                lower index */
    float top_logit[CINFER_LOGPROBS_MAX_TOP]; /* their values */
} cinfer_row_logprobs;

/* 32-bit words of a cinfer_row_logprobs: the row width of
 * cinfer_backend_logprobs' out. */
#define CINFER_ROW_LOGPROBS_WORDS ((int64_t)(sizeof(cinfer_row_logprobs) / 4))

/* For each row r of x whose token tokens[r] is >= 0 (a code of
 * cinfer_backend_greedy or _choose: a chosen token) and whose n_top[r] is
 * >= 0: out row r = that row's cinfer_row_logprobs, as bytes; other rows
 * are left as they are. x: [rows, n] F32 with no NaN or +inf in those rows
 * (as a chosen token implies), 1 <= n <= CINFER_CHOOSE_MAX_N; tokens:
 * [rows] I32 on the backend; n_top: [rows] host memory, read during the
 * call, each -1 (none) to CINFER_LOGPROBS_MAX_TOP; out: [rows,
 * CINFER_ROW_LOGPROBS_WORDS] I32. Optional: CINFER_E_UNSUPPORTED where
 * cinfer_backend_has_logprobs says 0. */
cinfer_status cinfer_backend_logprobs(cinfer_backend *be,
                                      const cinfer_tensor *x,
                                      const cinfer_tensor *tokens,
                                      const int32_t *n_top,
                                      cinfer_tensor *out);
int cinfer_backend_has_logprobs(const cinfer_backend *be);

/* 1 if the backend has the optional slots Gemma 3's graph needs
 * (attention_window, kv_store_swa, gelu_mul, scale), so a model can refuse
 * at load. */
int cinfer_backend_has_gemma_ops(const cinfer_backend *be);

/* out[j] = x[step.out_rows[j]].  x: [n_rows, d]; out: [n_out, d]. */
cinfer_status cinfer_backend_gather_rows(cinfer_backend *be,
                                         const cinfer_tensor *x,
                                         cinfer_tensor *out);

/* ---- collectives (tensor parallelism, comm.h) ------------------------------ */

/* Sums t over the ranks of the backend's communicator, in place: after it
 * every rank's t holds the elementwise sum of all ranks' t (on the CPU in
 * rank order 0..N-1, so bit-identical run to run). t: F32, any shape, the
 * same on every rank; every rank calls the same collectives in the same
 * order. A no-op when the backend has no communicator or one rank. A rank
 * that does not come fails the others with CINFER_E_TIMEOUT (the CPU at
 * the communicator's timeout; NCCL at synchronize). */
cinfer_status cinfer_backend_all_reduce_sum(cinfer_backend *be,
                                            cinfer_tensor *t);

/* Gathers x from every rank, rank-major: out's rows k * n .. k * n + n - 1
 * are rank k's x.  x: [n, c] F32; out: [size * n, c] F32 (size = the
 * communicator's ranks, 1 without one: then out is a copy of x). For the
 * vocabulary-parallel LM head: rank k's logits are out[k * n + r][j] =
 * column k * c + j of row r of the full logits. */
cinfer_status cinfer_backend_all_gather(cinfer_backend *be,
                                        const cinfer_tensor *x,
                                        cinfer_tensor *out);

/* ---- graphs (CUDA graphs) ------------------------------------------------- */

/* How the ops between graph_begin and graph_end run. */
typedef enum {
    CINFER_GRAPH_EAGER = 0,   /* enqueued one by one, as outside a graph */
    CINFER_GRAPH_CAPTURE = 1, /* recorded under the key, not yet run:
                                 graph_end runs them */
    CINFER_GRAPH_REPLAY = 2,  /* what was recorded under the key has been
                                 launched with this step's metadata: the
                                 caller skips the ops */
} cinfer_graph_mode;

/* A step's ops as one graph, recorded the first time a shape is seen and
 * replayed after (CUDA graphs: one launch for the whole step instead of
 * one per op). Call after set_step; *mode says how the ops run. The caller
 * promises that every step begun under one key makes the same op calls
 * on the same tensors with the same scalar arguments, and sets steps with
 * the same n_rows, n_seqs, max_blocks and n_out (engine/model.c: a decode
 * step padded to its row bucket); whatever the backend derives from the
 * step itself (attention's partition count) it adds to the key. A
 * recording stays valid until a tensor is destroyed or the backend's
 * metadata or scratch buffers move.
 *
 * Between begin and end only ops and tensor_set_rows are allowed (no
 * upload, download, synchronize, set_step, tensor create or destroy:
 * CINFER_E_INVALID_ARG). Every begin that succeeded is matched by
 * graph_end(be, st), st being the status of the ops (CINFER_OK when
 * replayed or when the caller ran none): a recording whose ops failed is
 * dropped and st returned; a good one is kept and launched. A backend
 * without graphs (the CPU), or one that declines the step (several
 * ranks, no reserve_scratch yet, rows that are not all decode rows, a
 * backend created eager), answers CINFER_GRAPH_EAGER. */
cinfer_status cinfer_backend_graph_begin(cinfer_backend *be, uint64_t key,
                                         cinfer_graph_mode *mode);
cinfer_status cinfer_backend_graph_end(cinfer_backend *be, cinfer_status st);

/* 1 if the backend records graphs (it may still decline a step). */
int cinfer_backend_has_graphs(const cinfer_backend *be);

/* Counts since the backend was created: steps recorded, replayed, run
 * eagerly by graph_begin's answer, and recordings held now. */
typedef struct {
    int64_t captured, replayed, eager, held;
} cinfer_backend_graph_stats;

/* Zeros for a backend without graphs. */
void cinfer_backend_graph_stats_get(const cinfer_backend *be,
                                    cinfer_backend_graph_stats *out);

/* 1 when matmul takes weights of this type on this backend (a model
 * refuses at load a weight its backend cannot multiply). */
int cinfer_backend_matmul_supports(cinfer_backend *be, cinfer_dtype dt);

/* The backend's communicator (NULL: one rank) as given at create. */
cinfer_comm *cinfer_backend_comm(const cinfer_backend *be);

/* The backend's name ("cpu", "cuda") and a human-readable description of
 * its device; both live as long as the backend. */
const char *cinfer_backend_name(const cinfer_backend *be);
const char *cinfer_backend_device_desc(const cinfer_backend *be);

/* Descriptor of an existing tensor (valid while the tensor lives). */
const cinfer_tensor_desc *cinfer_tensor_get_desc(const cinfer_tensor *t);

/* Elements and bytes of a descriptor (0 bytes if the last dimension is not
 * a whole number of blocks). */
int64_t cinfer_tensor_desc_nelems(const cinfer_tensor_desc *d);
size_t cinfer_tensor_desc_nbytes(const cinfer_tensor_desc *d);

/* Convenience: a descriptor of n_dims with the given shape. */
cinfer_tensor_desc cinfer_tensor_desc_make(cinfer_dtype dtype, int n_dims,
                                           const int64_t *shape);

/* ---------------------------------------------------------------------- */
/* CPU backend                                                            */
/* ---------------------------------------------------------------------- */

typedef enum {
    CINFER_CPU_ISA_AUTO = 0,  /* best the processor supports */
    CINFER_CPU_ISA_PORTABLE,  /* plain C, any processor */
    CINFER_CPU_ISA_AVX2,      /* AVX2 + FMA + F16C */
    CINFER_CPU_ISA_AVX512,    /* AVX-512 F/BW/VL + VNNI + BF16 */
} cinfer_cpu_isa;

typedef struct {
    int n_threads;      /* worker threads incl. the caller; 0 = all cores */
    cinfer_cpu_isa isa; /* kernel family; AUTO picks the best available */
    int thread_prio;    /* the workers' cinfer_thread_prio
                           (common/thread_priority.h; the thread that calls
                           the ops sets its own); 0 = unchanged */
    cinfer_comm *comm;  /* this rank's tensor-parallel communicator, a
                           LOCAL one (comm.h); borrowed: it must outlive
                           the backend. NULL = one rank */
} cinfer_backend_cpu_params;

cinfer_backend_cpu_params cinfer_backend_cpu_default_params(void);

/* Creates a CPU backend. Fails with CINFER_E_UNSUPPORTED if a forced ISA is
 * not available on this processor. */
cinfer_status cinfer_backend_cpu_create(const cinfer_backend_cpu_params *p,
                                        cinfer_backend **out);

/* The ISA a CPU backend runs (never AUTO), and whether `isa` is usable on
 * this processor. */
cinfer_cpu_isa cinfer_backend_cpu_isa(const cinfer_backend *be);
int cinfer_cpu_isa_supported(cinfer_cpu_isa isa);
const char *cinfer_cpu_isa_name(cinfer_cpu_isa isa);

/* ---------------------------------------------------------------------- */
/* CUDA backend (kernels/cuda/, built when nvcc is found: CINFER_CUDA)     */
/* ---------------------------------------------------------------------- */

typedef struct {
    int device;             /* CUDA device ordinal; 0 = the first */
    double memory_fraction; /* share of the device's memory the backend may
                               hold (weights, activations, scratch, then the
                               KV cache in what is left); 0 = 0.9 */
    cinfer_comm *comm;      /* this rank's tensor-parallel communicator, an
                               NCCL one on `device` (comm.h); borrowed: it
                               must outlive the backend. NULL = one rank */
    int batch_invariant;    /* 1 = every op's bits for a row are fixed by
                               the row alone, as on the CPU: F32 / F16 /
                               BF16 weights go through a fixed-order kernel
                               instead of cuBLAS (the quantized ones are
                               invariant anyway); 0 = cuBLAS, whose choice
                               of algorithm follows the batch's shape */
    int eager;              /* 1 = never record CUDA graphs (every op is
                               launched on its own); 0 = decode steps are
                               recorded per row bucket and replayed
                               (cinfer_backend_graph_begin) */
} cinfer_backend_cuda_params;

cinfer_backend_cuda_params cinfer_backend_cuda_default_params(void);

/* Creates a CUDA backend on p->device. Fails with CINFER_E_UNSUPPORTED in a
 * build without the CUDA backend, CINFER_E_NOT_FOUND when the device does
 * not exist, CINFER_E_DEVICE when the runtime refuses it. */
cinfer_status cinfer_backend_cuda_create(const cinfer_backend_cuda_params *p,
                                         cinfer_backend **out);

/* CUDA devices this process can use: 0 without a device or driver, and in
 * a build without the CUDA backend. */
int cinfer_cuda_device_count(void);

/* ---------------------------------------------------------------------- */
/* any backend                                                             */
/* ---------------------------------------------------------------------- */

/* Device memory: bytes the backend holds now, and the most it may hold
 * (its budget). A backend without a fixed budget (the CPU) reports 0 for
 * both and returns CINFER_E_UNSUPPORTED. */
cinfer_status cinfer_backend_memory(cinfer_backend *be, size_t *used_bytes,
                                    size_t *budget_bytes);

/* The largest step a model will run, for cinfer_backend_reserve_scratch. */
typedef struct {
    int32_t max_rows;    /* rows of the largest step */
    int64_t max_k;       /* widest matmul input (elements) */
    int n_heads;         /* attention query heads */
    int head_dim;        /* attention head size */
    int32_t max_context; /* longest context a row attends to (tokens) */
} cinfer_backend_scratch_plan;

/* Allocates now the scratch memory the largest step needs, so that memory
 * planning (the KV cache takes what is left of the budget) accounts for
 * it and no step allocates. A no-op for backends whose scratch is host
 * memory (the CPU). */
cinfer_status cinfer_backend_reserve_scratch(
    cinfer_backend *be, const cinfer_backend_scratch_plan *p);

/* Destroys any backend (NULL is fine). */
void cinfer_backend_destroy(cinfer_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_BACKEND_H */
