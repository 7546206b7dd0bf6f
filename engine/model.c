/*
 * model.c - Llama-family model: load from GGUF, forward pass over the
 * backend ops table.
 *
 * One forward step runs every row of a cinfer_step (any mix of prefill
 * chunks and decodes of any sequences) through the layers:
 *
 *   x = embed(tokens)                      (gemma3: * sqrt(n_embd))
 *   for each layer:
 *       h = rms_norm(x) ; q,k,v = h Wq, h Wk, h Wv (+ bias for qwen2)
 *       (qwen3, gemma3: q, k = per-head rms_norm(q), rms_norm(k))
 *       rope(q), rope(k) at each row's position ; kv_store(k, v)
 *       a = attention(q, paged K/V) ; x += a Wo
 *                                           (gemma3: x += rms_norm(a Wo))
 *       h = rms_norm(x) ; x += (silu(h Wg) * h Wu) Wd
 *                      (gemma3: x += rms_norm((gelu(h Wg) * h Wu) Wd))
 *   logits = rms_norm(x[out_rows]) Wout
 *
 * The architectures differ in a few switches (arch_desc below): the rope
 * mode, Q/K/V biases, per-head Q/K norms, Llama 3's rope frequency
 * factors, Gemma 3's extra norms, GeGLU, scaled embeddings and local
 * layers (sliding-window attention with their own rope base, see
 * read_gemma). Gemma's RMSNorm multiplies by 1 + w; llama.cpp's converter
 * stores 1 + w in the file, so its norms are plain rms_norm here. Rope scaling follows llama.cpp's reading of the metadata:
 * "rope.scaling.type" absent or linear with "rope.scaling.factor" f scales
 * every angle by 1/f; none does not scale; YaRN and LongRoPE are refused.
 * A file with a tensor the architecture does not use is refused, as
 * llama.cpp refuses it, so a feature cinfer lacks (an expert router, an
 * extra bias) never goes silently unused.
 *
 * In the last layer only the rows whose logits are wanted go through the
 * feed-forward block (their K/V for later steps is already stored), which
 * saves a layer's FFN on every prefill row but the last.
 *
 * Activation buffers are allocated once for max_batch_rows rows and resized
 * per step with tensor_set_rows, so a step of a given shape issues the same
 * op sequence every time.
 *
 * Tensor parallelism (model.h) is the slicing at load (load_tensor's
 * split), the per-rank head and feed-forward counts, an all-reduce after
 * the two row-parallel matmuls and the logits written to the rank's
 * vocabulary columns (or, with tp_gather_logits, all-gathered on the
 * device and written by rank 0 alone); a model built as a group's face
 * (no backend, tp > 1 or CUDA ranks) hands forward to model_group.c.
 */
#include "model.h"
#include "model_group.h"

#include "common/huge_pages.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CINFER_DEFAULT_MODEL
#define CINFER_DEFAULT_MODEL ""
#endif

/* What an architecture's graph switches on. */
typedef struct {
    const char *name;      /* general.architecture */
    cinfer_rope_mode rope; /* pair layout of the rotation */
    int qkv_bias;          /* blk.N.attn_{q,k,v}.bias (qwen2) */
    int qk_norm;           /* blk.N.attn_{q,k}_norm.weight, per head (qwen3) */
    int rope_freqs;        /* an optional rope_freqs.weight (llama 3) */
    int gemma;             /* gemma3: GeGLU, post-attention and post-FFN
                              norms, embeddings times sqrt(n_embd), local
                              sliding-window layers between global ones */
} arch_desc;

static const arch_desc ARCHS[] = {
    {"llama", CINFER_ROPE_NORM, 0, 0, 1, 0},
    {"qwen2", CINFER_ROPE_NEOX, 1, 0, 0, 0},
    {"qwen3", CINFER_ROPE_NEOX, 0, 1, 0, 0},
    {"gemma3", CINFER_ROPE_NEOX, 0, 1, 0, 1},
};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])
#define ARCH_LIST "llama, qwen2, qwen3, gemma3"

typedef struct {
    cinfer_tensor *attn_norm, *ffn_norm;
    cinfer_tensor *wq, *wk, *wv, *wo;
    cinfer_tensor *bq, *bk, *bv; /* qwen2 only */
    cinfer_tensor *q_norm, *k_norm; /* qwen3, gemma3: [head_dim] */
    cinfer_tensor *attn_post_norm, *ffn_post_norm; /* gemma3 only */
    int window;             /* gemma3's local layers: positions seen; 0 =
                               the whole context */
    cinfer_tensor *w_gate, *w_up, *w_down;
    cinfer_tensor *k_cache, *v_cache;
} layer;

struct cinfer_model {
    cinfer_model_info info;
    cinfer_gguf *gguf;
    cinfer_tokenizer *tok;
    cinfer_backend *be;
    int owns_backend;
    const arch_desc *arch;
    cinfer_rope_mode rope_mode;
    int rot_dim;
    float rope_freq_scale;  /* 1 / rope.scaling.factor (linear); 1 = none */
    float *rope_factors;    /* [rot_dim / 2] rope_freqs.weight, or NULL */
    float rope_theta_swa;   /* gemma3: local layers' rope base */
    float attn_scale;       /* scores' scale */
    int q_prescale;         /* gemma3: attn_scale multiplies Q in F32
                               before attention (which then scales by 1),
                               as llama.cpp's graph does; it differs where
                               F16 rounds the scaled Q below its normal
                               range */
    float embd_scale;       /* embeddings' scale (gemma3: sqrt(n_embd)) */
    int gemma_window;       /* gemma3: attention.sliding_window; 0 = none */
    int gemma_pattern;      /* gemma3: every pattern-th layer is global */
    int n_swa;              /* blocks of the local layers' own KV pool
                               (info.n_swa_blocks; its block n_swa is the
                               zeroed null block); 0 = none */
    int max_rows;

    cinfer_tensor *tok_embd, *out_norm, *output;
    layer *layers;

    /* activations, capacity max_rows rows */
    cinfer_tensor *x, *h, *q, *k, *v, *att, *gate, *up;
    cinfer_tensor *xo, *ho;   /* out rows of the last layer */
    cinfer_tensor *logits;    /* [max_rows, n_vocab] */
    cinfer_tensor *greedy;    /* [max_rows] I32, each out row's token
                                 chosen on the backend, where it can
                                 (cinfer_model_choices) */
    cinfer_tensor *lp;        /* [max_rows, CINFER_ROW_LOGPROBS_WORDS] I32,
                                 their logprobs' parts (choices 4) */

    /* eval_single scratch */
    int32_t *single_tables;

    /* Graphs (cinfer_backend_graph_begin): a decode step of n rows runs as
     * one of graph_rows' buckets (powers of two up to it), padded with
     * rows of sequences of their own whose K/V go to n_dump blocks past
     * the engine's (from block info.n_kv_blocks), and its tables laid out
     * at a stride rounded up to a power of two, so that one recording
     * serves every step of its bucket and stride class. 0 = off. */
    int graph_rows;
    int32_t n_dump;
    int32_t *pad_buf;       /* the padded step's arrays */
    size_t pad_cap;         /* its ints */

    /* Tensor parallelism: this rank's share (a whole model: tp 1). */
    int tp, rank;
    int n_head_r, n_kv_r;   /* query and KV heads on this rank */
    int64_t ff_r;           /* feed-forward rows on this rank */
    int64_t v0, v1;         /* LM head vocabulary rows [v0, v1) */
    uint64_t held_bytes;    /* weight bytes this rank created */
    int gather;             /* tp_gather_logits: the slices meet on the
                               device, rank 0 writes all the logits */
    cinfer_tensor *logits_all; /* gather: [tp * max_rows, v1 - v0] */
    float *stage;           /* gather, rank 0: host copy of logits_all */
    size_t stage_cap;       /* its floats */
    /* Slice buffers the backend reads in place (weight_borrows), freed at
     * destroy; len 0 = aligned_alloc'd, else cinfer_huge_alloc'd. */
    struct slice_buf {
        void *p;
        size_t len;
    } *slices;
    int n_slices, cap_slices;
    cinfer_model_group *group; /* set: this model is a group's face */
};

cinfer_model_params cinfer_model_default_params(void)
{
    cinfer_model_params p;
    memset(&p, 0, sizeof p);
    return p;
}

const char *cinfer_model_default_path(void)
{
    const char *env = getenv("CINFER_MODEL");
    if (env && *env)
        return env;
    return CINFER_DEFAULT_MODEL;
}

/* ---------------------------------------------------------------------- */
/* loading                                                                */
/* ---------------------------------------------------------------------- */

static cinfer_status get_u32_arch(const cinfer_gguf *g, const char *arch,
                                  const char *suffix, int required,
                                  uint32_t def, int *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    cinfer_status st = cinfer_gguf_get_u32(g, key, &v);
    if (st == CINFER_E_NOT_FOUND && !required) {
        *out = (int)def;
        return CINFER_OK;
    }
    if (st != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT, "model: metadata '%s': %s",
                                key, st == CINFER_E_NOT_FOUND
                                         ? "missing"
                                         : cinfer_last_error());
    if (v > (1u << 30))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: metadata '%s' = %u is out of range",
                                key, v);
    *out = (int)v;
    return CINFER_OK;
}

static cinfer_status get_f32_arch(const cinfer_gguf *g, const char *arch,
                                  const char *suffix, float def, float *out)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    cinfer_status st = cinfer_gguf_get_f32(g, key, out);
    if (st == CINFER_E_NOT_FOUND) {
        *out = def;
        return CINFER_OK;
    }
    if (st != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT, "model: metadata '%s': %s",
                                key, cinfer_last_error());
    if (!isfinite(*out) || *out <= 0.0f)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: metadata '%s' = %g is out of range",
                                key, (double)*out);
    return CINFER_OK;
}

static int weight_dtype_ok(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_F32:
    case CINFER_DTYPE_F16:
    case CINFER_DTYPE_BF16:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_NL:
    case CINFER_DTYPE_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

typedef struct {
    cinfer_model *m;
    uint64_t bytes_done, bytes_total;
    cinfer_model_params p;
    int conv_kept; /* load_tensor_as: the backend reads the converted
                      copy in place, so it must live on */
    /* the file's tensors the model has taken, to refuse the others */
    const cinfer_gguf_tensor **used;
    size_t n_used, cap_used;
} load_ctx;

static cinfer_status mark_used(load_ctx *lc, const cinfer_gguf_tensor *t)
{
    if (lc->n_used == lc->cap_used) {
        size_t cap = lc->cap_used ? 2 * lc->cap_used : 256;
        const cinfer_gguf_tensor **u =
            realloc(lc->used, sizeof *u * cap);
        if (!u)
            return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
        lc->used = u;
        lc->cap_used = cap;
    }
    lc->used[lc->n_used++] = t;
    return CINFER_OK;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (const void *const *)a;
    uintptr_t y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Every tensor of the file must have been taken: one the architecture
 * does not know is a feature this graph would silently skip. */
static cinfer_status check_all_used(load_ctx *lc)
{
    const cinfer_gguf *g = lc->m->gguf;
    if (lc->n_used)
        qsort(lc->used, lc->n_used, sizeof *lc->used, cmp_ptr);
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(g); i++) {
        const cinfer_gguf_tensor *t = cinfer_gguf_tensor_at(g, i);
        if (!lc->n_used || !bsearch(&t, lc->used, lc->n_used,
                                    sizeof *lc->used, cmp_ptr))
            return cinfer_set_error(
                CINFER_E_UNSUPPORTED,
                "model: tensor '%s' is not part of architecture '%s' as "
                "cinfer implements it (a feature it does not support)",
                t->name, lc->m->info.arch);
    }
    return CINFER_OK;
}

/* How a rank keeps a tensor: whole, or its share of the output features
 * (rows of a matrix, elements of a bias) or of the input features
 * (columns). */
typedef enum { WHOLE, BY_OUT, BY_IN } split_kind;

/* Rank r's share [lo, hi) of n features: equal shares when N divides n,
 * else shares that differ by one (the vocabulary). */
static void share(const cinfer_model *m, int64_t n, int64_t *lo, int64_t *hi)
{
    *lo = n * m->rank / m->tp;
    *hi = n * (m->rank + 1) / m->tp;
}

static void slice_free(struct slice_buf b)
{
    if (b.len)
        cinfer_huge_free(b.p, b.len);
    else
        free(b.p);
}

/* Copies rank's share of tensor t (full shape [rows, cols]; rows 0 = 1-D)
 * into a new buffer: rows [r0, r1), and of each row the blocks of columns
 * [c0, c1). *desc gets the slice's shape. */
static cinfer_status cut_slice(load_ctx *lc, const cinfer_gguf_tensor *t,
                               const char *name, int64_t rows, int64_t cols,
                               split_kind split, cinfer_tensor_desc *desc,
                               struct slice_buf *out)
{
    cinfer_model *m = lc->m;
    int64_t r0 = 0, r1 = rows ? rows : 1, c0 = 0, c1 = cols;
    if (split == BY_OUT && rows)
        share(m, rows, &r0, &r1);
    else
        share(m, cols, &c0, &c1);
    int be = cinfer_dtype_block_elems(t->dtype);
    size_t bb = cinfer_dtype_block_bytes(t->dtype);
    /* A row keeps whole blocks: a column slice that cuts one cannot be
     * expressed in the file's type. */
    if (c0 % be || c1 % be)
        return cinfer_set_error(
            CINFER_E_UNSUPPORTED,
            "model: tensor_parallel %d: rank %d's columns %lld..%lld of "
            "tensor '%s' (%lld wide, %s) are not whole %d-element blocks",
            m->tp, m->rank, (long long)c0, (long long)c1 - 1, name,
            (long long)cols, cinfer_dtype_name(t->dtype), be);
    size_t row_full = cinfer_dtype_row_bytes(t->dtype, cols);
    size_t row_part = (size_t)((c1 - c0) / be) * bb;
    size_t n = row_part * (size_t)(r1 - r0);
    struct slice_buf b = {0};
    /* Large slices in huge pages, as the file would be (decode reads them
     * every step); small ones on the heap, where 2 MiB each would waste. */
    if (n >= CINFER_HUGE_PAGE_BYTES)
        b.p = cinfer_huge_alloc(n, &b.len);
    else
        b.p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!b.p)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "model: out of memory for a %zu-byte slice "
                                "of '%s'",
                                n, name);
    const uint8_t *src = t->data;
    for (int64_t r = r0; r < r1; r++)
        memcpy((uint8_t *)b.p + (size_t)(r - r0) * row_part,
               src + (size_t)r * row_full + (size_t)(c0 / be) * bb, row_part);
    if (rows) {
        int64_t shape[2] = {r1 - r0, c1 - c0};
        *desc = cinfer_tensor_desc_make(t->dtype, 2, shape);
    } else {
        int64_t shape[1] = {c1 - c0};
        *desc = cinfer_tensor_desc_make(t->dtype, 1, shape);
    }
    *out = b;
    return CINFER_OK;
}

/* Keeps a slice buffer the backend reads in place until destroy. */
static cinfer_status keep_slice(cinfer_model *m, struct slice_buf b)
{
    if (m->n_slices == m->cap_slices) {
        int cap = m->cap_slices ? 2 * m->cap_slices : 64;
        struct slice_buf *ns = realloc(m->slices, sizeof *ns * (size_t)cap);
        if (!ns)
            return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
        m->slices = ns;
        m->cap_slices = cap;
    }
    m->slices[m->n_slices++] = b;
    return CINFER_OK;
}

/* A Q5_0 tensor as Q8_0 (cinfer_dtype_q5_0_to_q8_0: the same scales and
 * integers, so the Q8_0 kernels compute what GGML's Q5_0 ones do): *conv
 * describes the copy in *buf. */
static cinfer_status q5_0_as_q8_0(const cinfer_gguf_tensor *t,
                                  const char *name, cinfer_gguf_tensor *conv,
                                  struct slice_buf *buf)
{
    size_t nb = t->n_bytes / sizeof(cinfer_block_q5_0);
    size_t n = nb * sizeof(cinfer_block_q8_0);
    struct slice_buf b = {0};
    if (n >= CINFER_HUGE_PAGE_BYTES)
        b.p = cinfer_huge_alloc(n, &b.len);
    else
        b.p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!b.p)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "model: out of memory for the Q8_0 copy of "
                                "Q5_0 tensor '%s' (%zu bytes)",
                                name, n);
    cinfer_dtype_q5_0_to_q8_0(t->data, b.p, (int64_t)nb);
    *conv = *t;
    conv->dtype = CINFER_DTYPE_Q8_0;
    conv->data = b.p;
    conv->n_bytes = n;
    *buf = b;
    return CINFER_OK;
}

static cinfer_status load_tensor_as(load_ctx *lc, cinfer_tensor **out,
                                    const cinfer_gguf_tensor *t,
                                    int64_t rows, int64_t cols,
                                    int float_only, split_kind split, int keep,
                                    const char *name, int converted);

/* Finds tensor `name` (a printf format with the layer), checks its shape
 * ([rows, cols] here, i.e. GGUF ne = {cols, rows}; rows 0 for a 1-D
 * tensor) and creates the backend weight: whole, or on a rank of a
 * tensor-parallel model the rank's share (split). `keep` = the file's data
 * is read again later (a tied LM head's slice, loaded before the
 * embeddings), so its memory is not given back yet. */
static cinfer_status load_tensor(load_ctx *lc, cinfer_tensor **out,
                                 int required, int64_t rows, int64_t cols,
                                 int float_only, split_kind split, int keep,
                                 const char *fmt, int il)
{
    char name[96];
    snprintf(name, sizeof name, fmt, il);
    const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(lc->m->gguf, name);
    *out = NULL;
    if (!t) {
        if (!required)
            return CINFER_OK;
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: tensor '%s' is missing", name);
    }
    cinfer_status st = mark_used(lc, t);
    if (st != CINFER_OK)
        return st;
    /* A Q5_0 weight (Gemma 3's Q4_K_M files hold them) becomes Q8_0 */
    cinfer_gguf_tensor conv;
    struct slice_buf cbuf = {0};
    if (t->dtype != CINFER_DTYPE_Q5_0 || float_only)
        return load_tensor_as(lc, out, t, rows, cols, float_only, split, keep,
                              name, 0);
    if ((st = q5_0_as_q8_0(t, name, &conv, &cbuf)) != CINFER_OK)
        return st;
    lc->conv_kept = 0;
    st = load_tensor_as(lc, out, &conv, rows, cols, float_only, split, keep,
                        name, 1);
    /* the file's pages under the Q5_0 data are not read again; the Q8_0
     * copy lives on while the backend reads it in place */
    if (!keep)
        cinfer_pages_release(t->data, t->n_bytes);
    if (st == CINFER_OK && lc->conv_kept &&
        (st = keep_slice(lc->m, cbuf)) != CINFER_OK) {
        cinfer_backend_tensor_destroy(lc->m->be, *out);
        *out = NULL;
    }
    if (st != CINFER_OK || !lc->conv_kept)
        slice_free(cbuf);
    return st;
}

/* The rest of load_tensor for tensor t (the file's, or a converted copy
 * when `converted`: its memory is the caller's, never released here). */
static cinfer_status load_tensor_as(load_ctx *lc, cinfer_tensor **out,
                                    const cinfer_gguf_tensor *t,
                                    int64_t rows, int64_t cols,
                                    int float_only, split_kind split, int keep,
                                    const char *name, int converted)
{
    cinfer_status st;
    int want_dims = rows ? 2 : 1;
    int64_t want0 = cols, want1 = rows ? rows : 1;
    if ((int)t->n_dims != want_dims || t->ne[0] != want0 ||
        t->ne[1] != want1)
        return cinfer_set_error(
            CINFER_E_FORMAT,
            "model: tensor '%s' has shape [%lld, %lld] (%u dims), expected "
            "[%lld, %lld]",
            name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
            (long long)want0, (long long)want1);
    if (float_only ? t->dtype != CINFER_DTYPE_F32 : !weight_dtype_ok(t->dtype))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: tensor '%s' has unsupported type %s",
                                name, cinfer_dtype_name(t->dtype));
    cinfer_tensor_desc d;
    cinfer_backend *be = lc->m->be;
    int borrowed;
    /* a matrix the backend cannot multiply is refused now, not at the
     * first step */
    if (rows && !float_only && !cinfer_backend_matmul_supports(be, t->dtype))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: tensor '%s' is %s, which the %s "
                                "backend has no matmul kernel for",
                                name, cinfer_dtype_name(t->dtype),
                                cinfer_backend_name(be));
    if (split != WHOLE && lc->m->tp > 1) {
        /* The rank's share goes through a buffer of its own; the file's
         * memory under the whole tensor is given back, and the buffer too
         * unless the backend reads it in place. */
        struct slice_buf b;
        if ((st = cut_slice(lc, t, name, rows, cols, split, &d, &b)) !=
            CINFER_OK)
            return st;
        st = cinfer_backend_tensor_create_weight(be, &d, b.p, out);
        if (st == CINFER_OK && cinfer_backend_weight_borrows(be, *out)) {
            if ((st = keep_slice(lc->m, b)) != CINFER_OK) {
                cinfer_backend_tensor_destroy(be, *out);
                *out = NULL;
                slice_free(b);
            }
        } else {
            slice_free(b);
        }
        if (st != CINFER_OK)
            return st;
        if (!keep && !converted)
            cinfer_pages_release(t->data, t->n_bytes);
        borrowed = 0; /* the file's pages are not read by this weight */
    } else {
        if (rows) {
            int64_t shape[2] = {rows, cols};
            d = cinfer_tensor_desc_make(t->dtype, 2, shape);
        } else {
            int64_t shape[1] = {cols};
            d = cinfer_tensor_desc_make(t->dtype, 1, shape);
        }
        st = cinfer_backend_tensor_create_weight(be, &d, t->data, out);
        if (st != CINFER_OK)
            return st;

        /* A weight the backend copied (packed, or on a device) gives the
         * file's memory under it back at once, so the model is never held
         * twice; each tensor is loaded once (a kept one's other use comes
         * first), so nothing reads it again. */
        borrowed = cinfer_backend_weight_borrows(be, *out);
        if (!borrowed && !keep && !converted)
            cinfer_pages_release(t->data, t->n_bytes);
        lc->conv_kept = converted && borrowed;
    }
    lc->m->held_bytes += cinfer_tensor_desc_nbytes(&d);

    /* Fault a mapped file's pages in now, so the first request does not
     * pay for the disk reads and the progress bar shows the real load (a
     * file read into memory, or a copied weight, is resident already). */
    if (lc->p.progress) {
        if (borrowed && lc->p.use_mmap) {
            const volatile uint8_t *b = t->data;
            size_t page = 4096;
            uint8_t acc = 0;
            for (size_t off = 0; off < t->n_bytes; off += page)
                acc ^= b[off];
            (void)acc;
        }
        /* a tied LM head's slice reads token_embd twice: cap at 1 */
        lc->bytes_done += t->n_bytes;
        if (lc->bytes_done > lc->bytes_total)
            lc->bytes_done = lc->bytes_total;
        lc->p.progress(lc->bytes_total
                           ? (float)lc->bytes_done / (float)lc->bytes_total
                           : 1.0f,
                       lc->p.progress_user);
    }
    return CINFER_OK;
}

static cinfer_status make_act(cinfer_model *m, cinfer_tensor **out,
                              int64_t rows, int64_t cols)
{
    int64_t shape[2] = {rows, cols};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, shape);
    return cinfer_backend_tensor_create(m->be, &d, out);
}

/* Rope scaling as llama.cpp reads it: "rope.scaling.type" defaults to
 * linear, whose "rope.scaling.factor" (or the older "rope.scale_linear")
 * f gives freq_scale 1/f (no factor: 1); none never scales. */
static cinfer_status read_rope_scaling(cinfer_model *m)
{
    const cinfer_gguf *g = m->gguf;
    const char *a = m->info.arch;
    char key[128];
    cinfer_gguf_str type = {"linear", 6};
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (cinfer_gguf_find_key(g, key) >= 0 &&
        cinfer_gguf_get_str(g, key, &type) != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: metadata '%s' is not a string", key);
    int none = type.len == 4 && memcmp(type.ptr, "none", 4) == 0;
    int linear = type.len == 6 && memcmp(type.ptr, "linear", 6) == 0;
    if (!none && !linear)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: metadata '%s' = '%.*s' is not "
                                "supported (supported: none, linear; Llama "
                                "3's rope_freqs tensor)",
                                key, (int)(type.len > 64 ? 64 : type.len),
                                type.ptr);
    float factor = 0.0f;
    const char *fkey = "rope.scaling.factor";
    snprintf(key, sizeof key, "%s.%s", a, fkey);
    if (cinfer_gguf_find_key(g, key) < 0) {
        fkey = "rope.scale_linear";
        snprintf(key, sizeof key, "%s.%s", a, fkey);
    }
    if (cinfer_gguf_find_key(g, key) >= 0 &&
        (cinfer_gguf_get_f32(g, key, &factor) != CINFER_OK ||
         !isfinite(factor) || factor < 0.0f))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: metadata '%s' must be a finite "
                                "float >= 0",
                                key);
    m->rope_freq_scale = none || factor == 0.0f ? 1.0f : 1.0f / factor;
    float attn = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", a);
    if (cinfer_gguf_find_key(g, key) >= 0 &&
        (cinfer_gguf_get_f32(g, key, &attn) != CINFER_OK || attn != 1.0f))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: metadata '%s' other than 1 is not "
                                "supported",
                                key);
    return CINFER_OK;
}

/* Mixture-of-experts files (Mixtral is `llama` with experts) need a
 * router this graph does not have. */
static cinfer_status refuse_experts(cinfer_model *m)
{
    char key[128];
    uint32_t n = 0;
    snprintf(key, sizeof key, "%s.expert_count", m->info.arch);
    if (cinfer_gguf_find_key(m->gguf, key) >= 0 &&
        cinfer_gguf_get_u32(m->gguf, key, &n) == CINFER_OK && n > 0)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: metadata '%s' = %u: mixture-of-experts "
                                "models are not supported",
                                key, n);
    return CINFER_OK;
}

/* Whether layer il of a gemma3 model is a local (sliding-window) one. */
static int gemma_local(const cinfer_model *m, int il)
{
    int pat = m->gemma_pattern;
    return m->gemma_window > 0 && (pat == 0 || il % pat < pat - 1);
}

/* Gemma 3 as llama.cpp reads it: "attention.sliding_window" n > 0 makes
 * every layer local (window n, rope base "rope.freq_base_swa", default
 * 10000, unscaled) but every "attention.sliding_window_pattern"-th (6),
 * which is global (rope.freq_base and the file's rope scaling); the
 * scores' scale is 1/sqrt(key_length), 1/sqrt(n_embd / n_head) for the
 * 62-layer 27B; a final logit softcap is refused (Gemma 3 has none). */
static cinfer_status read_gemma(cinfer_model *m)
{
    const cinfer_gguf *g = m->gguf;
    cinfer_model_info *I = &m->info;
    const char *a = I->arch;
    char key[128];
    cinfer_status st;
    int window = 0, pattern = 6;
    if ((st = get_u32_arch(g, a, "attention.sliding_window", 0, 0, &window)))
        return st;
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    if (cinfer_gguf_find_key(g, key) >= 0) {
        uint32_t v;
        if (cinfer_gguf_get_u32(g, key, &v) != CINFER_OK)
            return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                    "model: metadata '%s' is not a u32 (a "
                                    "per-layer array is not supported)",
                                    key);
        if (v > (1u << 20))
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "model: metadata '%s' = %u is out of "
                                    "range",
                                    key, v);
        pattern = (int)v;
    }
    if ((st = get_f32_arch(g, a, "rope.freq_base_swa", 10000.0f,
                           &m->rope_theta_swa)))
        return st;
    float cap = 0.0f;
    snprintf(key, sizeof key, "%s.final_logit_softcapping", a);
    if (cinfer_gguf_find_key(g, key) >= 0 &&
        (cinfer_gguf_get_f32(g, key, &cap) != CINFER_OK || cap != 0.0f))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: metadata '%s': final logit "
                                "softcapping is not supported",
                                key);
    m->gemma_window = window;
    m->gemma_pattern = pattern;
    m->embd_scale = sqrtf((float)I->n_embd);
    m->q_prescale = 1;
    if (I->n_layer == 62)
        m->attn_scale = 1.0f / sqrtf((float)(I->n_embd / I->n_head));
    return CINFER_OK;
}

static cinfer_status read_hparams(cinfer_model *m)
{
    const cinfer_gguf *g = m->gguf;
    cinfer_model_info *I = &m->info;
    cinfer_gguf_str s;
    cinfer_status st = cinfer_gguf_get_str(g, "general.architecture", &s);
    if (st != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: metadata 'general.architecture' is "
                                "missing or not a string");
    if (s.len >= sizeof I->arch)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: architecture name too long");
    memcpy(I->arch, s.ptr, s.len);
    I->arch[s.len] = '\0';
    for (size_t i = 0; i < N_ARCHS && !m->arch; i++)
        if (strcmp(I->arch, ARCHS[i].name) == 0)
            m->arch = &ARCHS[i];
    if (!m->arch)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: architecture '%s' is not supported "
                                "(supported: " ARCH_LIST ")",
                                I->arch);
    m->rope_mode = m->arch->rope;
    if (cinfer_gguf_get_str(g, "general.name", &s) == CINFER_OK) {
        size_t n = s.len < sizeof I->name - 1 ? s.len : sizeof I->name - 1;
        memcpy(I->name, s.ptr, n);
        I->name[n] = '\0';
    }
    const char *a = I->arch;
    if ((st = get_u32_arch(g, a, "block_count", 1, 0, &I->n_layer)) ||
        (st = get_u32_arch(g, a, "embedding_length", 1, 0, &I->n_embd)) ||
        (st = get_u32_arch(g, a, "attention.head_count", 1, 0, &I->n_head)) ||
        (st = get_u32_arch(g, a, "feed_forward_length", 1, 0, &I->n_ff)) ||
        (st = get_u32_arch(g, a, "context_length", 0, 2048,
                           &I->n_ctx_train)))
        return st;
    if ((st = get_u32_arch(g, a, "attention.head_count_kv", 0,
                           (uint32_t)I->n_head, &I->n_head_kv)))
        return st;
    if ((st = get_f32_arch(g, a, "rope.freq_base", 10000.0f, &I->rope_theta)) ||
        (st = get_f32_arch(g, a, "attention.layer_norm_rms_epsilon", 1e-5f,
                           &I->norm_eps)))
        return st;
    if (I->n_layer < 1 || I->n_embd < 1 || I->n_head < 1 || I->n_ff < 1 ||
        I->n_head_kv < 1)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: layer, width, head and feed-forward "
                                "counts must be >= 1");
    if (I->n_head % I->n_head_kv != 0)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: head_count %d is not a multiple of "
                                "head_count_kv %d",
                                I->n_head, I->n_head_kv);
    /* The head size is attention.key_length where the file gives it (Qwen3,
     * Mistral Nemo: not embedding_length / head_count), as in llama.cpp. */
    int key_len = 0, val_len = 0;
    if ((st = get_u32_arch(g, a, "attention.key_length", 0, 0, &key_len)) ||
        (st = get_u32_arch(g, a, "attention.value_length", 0,
                           (uint32_t)key_len, &val_len)))
        return st;
    if (!key_len && I->n_embd % I->n_head != 0)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: embedding_length %d is not a multiple "
                                "of head_count %d (and no "
                                "attention.key_length)",
                                I->n_embd, I->n_head);
    I->head_dim = key_len ? key_len : I->n_embd / I->n_head;
    if (!key_len)
        val_len = val_len ? val_len : I->head_dim;
    if (val_len != I->head_dim)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model: attention.value_length %d differs "
                                "from the key length %d",
                                val_len, I->head_dim);
    if (I->head_dim < 2 || I->head_dim > 1024)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: head size %d is outside 2..1024",
                                I->head_dim);
    if ((st = get_u32_arch(g, a, "rope.dimension_count", 0,
                           (uint32_t)I->head_dim, &m->rot_dim)))
        return st;
    if (m->rot_dim < 2 || m->rot_dim > I->head_dim || m->rot_dim % 2)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: rope.dimension_count %d is invalid "
                                "for head size %d",
                                m->rot_dim, I->head_dim);
    if ((st = read_rope_scaling(m)) != CINFER_OK ||
        (st = refuse_experts(m)) != CINFER_OK)
        return st;
    m->attn_scale = 1.0f / sqrtf((float)I->head_dim);
    m->embd_scale = 1.0f;
    if (m->arch->gemma && (st = read_gemma(m)) != CINFER_OK)
        return st;
    if (I->n_ctx_train < 1)
        I->n_ctx_train = 2048;
    I->has_chat_template =
        cinfer_gguf_find_key(g, "tokenizer.chat_template") >= 0;
    return CINFER_OK;
}

/* Parameter count, weight bytes and dominant type, from the file (before
 * loading, so that memory planning knows the weights' size up front). */
static void weight_stats(cinfer_model *m)
{
    cinfer_model_info *I = &m->info;
    uint64_t by_type[64] = {0};
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(m->gguf); i++) {
        const cinfer_gguf_tensor *t = cinfer_gguf_tensor_at(m->gguf, i);
        int64_t n = 1;
        for (uint32_t j = 0; j < t->n_dims; j++)
            n *= t->ne[j];
        I->n_params += n;
        I->weight_bytes += t->n_bytes;
        if ((unsigned)t->dtype < 64 && t->n_dims >= 2)
            by_type[t->dtype] += t->n_bytes;
    }
    int best = 0;
    for (int i = 0; i < 64; i++)
        if (by_type[i] > by_type[best])
            best = i;
    snprintf(I->quant, sizeof I->quant, "%s",
             cinfer_dtype_name((cinfer_dtype)best));
}

/* Llama 3's rope frequency factors: rope_freqs.weight, F32 [rot_dim / 2],
 * one for every layer, kept on the host (rope reads them from there). */
static cinfer_status load_rope_factors(load_ctx *lc)
{
    cinfer_model *m = lc->m;
    const cinfer_gguf_tensor *t =
        cinfer_gguf_find_tensor(m->gguf, "rope_freqs.weight");
    if (!t || !m->arch->rope_freqs)
        return CINFER_OK; /* absent; or refused as unused */
    int n = m->rot_dim / 2;
    if (t->n_dims != 1 || t->ne[0] != n || t->dtype != CINFER_DTYPE_F32)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "model: tensor 'rope_freqs.weight' must be "
                                "F32 [%d] (rope.dimension_count / 2), got %s "
                                "[%lld] (%u dims)",
                                n, cinfer_dtype_name(t->dtype),
                                (long long)t->ne[0], t->n_dims);
    m->rope_factors = malloc(sizeof(float) * (size_t)n);
    if (!m->rope_factors)
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
    memcpy(m->rope_factors, t->data, sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++)
        if (!(m->rope_factors[i] > 0.0f) || isinf(m->rope_factors[i]))
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "model: rope_freqs.weight[%d] = %g is "
                                    "not a finite value > 0",
                                    i, (double)m->rope_factors[i]);
    return mark_used(lc, t);
}

static cinfer_status load_all(load_ctx *lc)
{
    cinfer_model *m = lc->m;
    cinfer_model_info *I = &m->info;
    int64_t d = I->n_embd, ff = I->n_ff, V = I->n_vocab;
    int64_t dq = (int64_t)I->n_head * I->head_dim;
    int64_t dkv = (int64_t)I->n_head_kv * I->head_dim;
    int bias = m->arch->qkv_bias, qk_norm = m->arch->qk_norm;
    int64_t hd = I->head_dim;
    cinfer_status st;

    if ((st = load_rope_factors(lc)) != CINFER_OK)
        return st;

    /* Tied output on a rank of several: the LM head is the rank's rows of
     * token_embd, loaded first (keep) since the embeddings read it all. */
    int tied = !cinfer_gguf_find_tensor(m->gguf, "output.weight");
    if (m->tp > 1 && tied &&
        (st = load_tensor(lc, &m->output, 1, V, d, 0, BY_OUT, 1,
                          "token_embd.weight", 0)))
        return st;
    if ((st = load_tensor(lc, &m->tok_embd, 1, V, d, 0, WHOLE, 0,
                          "token_embd.weight", 0)) ||
        (st = load_tensor(lc, &m->out_norm, 1, 0, d, 1, WHOLE, 0,
                          "output_norm.weight", 0)) ||
        (!tied && (st = load_tensor(lc, &m->output, 1, V, d, 0, BY_OUT, 0,
                                    "output.weight", 0))))
        return st;

    m->layers = calloc((size_t)I->n_layer, sizeof(layer));
    if (!m->layers)
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
    for (int il = 0; il < I->n_layer; il++) {
        layer *L = &m->layers[il];
        if ((st = load_tensor(lc, &L->attn_norm, 1, 0, d, 1, WHOLE, 0,
                              "blk.%d.attn_norm.weight", il)) ||
            (st = load_tensor(lc, &L->wq, 1, dq, d, 0, BY_OUT, 0,
                              "blk.%d.attn_q.weight", il)) ||
            (st = load_tensor(lc, &L->wk, 1, dkv, d, 0, BY_OUT, 0,
                              "blk.%d.attn_k.weight", il)) ||
            (st = load_tensor(lc, &L->wv, 1, dkv, d, 0, BY_OUT, 0,
                              "blk.%d.attn_v.weight", il)) ||
            (st = load_tensor(lc, &L->wo, 1, d, dq, 0, BY_IN, 0,
                              "blk.%d.attn_output.weight", il)) ||
            (st = load_tensor(lc, &L->ffn_norm, 1, 0, d, 1, WHOLE, 0,
                              "blk.%d.ffn_norm.weight", il)) ||
            (st = load_tensor(lc, &L->w_gate, 1, ff, d, 0, BY_OUT, 0,
                              "blk.%d.ffn_gate.weight", il)) ||
            (st = load_tensor(lc, &L->w_up, 1, ff, d, 0, BY_OUT, 0,
                              "blk.%d.ffn_up.weight", il)) ||
            (st = load_tensor(lc, &L->w_down, 1, d, ff, 0, BY_IN, 0,
                              "blk.%d.ffn_down.weight", il)))
            return st;
        if (bias &&
            ((st = load_tensor(lc, &L->bq, 1, 0, dq, 1, BY_OUT, 0,
                               "blk.%d.attn_q.bias", il)) ||
             (st = load_tensor(lc, &L->bk, 1, 0, dkv, 1, BY_OUT, 0,
                               "blk.%d.attn_k.bias", il)) ||
             (st = load_tensor(lc, &L->bv, 1, 0, dkv, 1, BY_OUT, 0,
                               "blk.%d.attn_v.bias", il))))
            return st;
        if (m->arch->gemma) {
            if ((st = load_tensor(lc, &L->attn_post_norm, 1, 0, d, 1, WHOLE,
                                  0, "blk.%d.post_attention_norm.weight",
                                  il)) ||
                (st = load_tensor(lc, &L->ffn_post_norm, 1, 0, d, 1, WHOLE, 0,
                                  "blk.%d.post_ffw_norm.weight", il)))
                return st;
            L->window = gemma_local(m, il) ? m->gemma_window : 0;
        }
        /* per-head norms: one [head_dim] weight for every head, whole on
         * every rank */
        if (qk_norm &&
            ((st = load_tensor(lc, &L->q_norm, 1, 0, hd, 1, WHOLE, 0,
                               "blk.%d.attn_q_norm.weight", il)) ||
             (st = load_tensor(lc, &L->k_norm, 1, 0, hd, 1, WHOLE, 0,
                               "blk.%d.attn_k_norm.weight", il))))
            return st;
    }
    return CINFER_OK;
}

static cinfer_status load_weights(cinfer_model *m, const cinfer_model_params *p)
{
    load_ctx lc = {.m = m, .p = *p};
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(m->gguf); i++)
        lc.bytes_total += cinfer_gguf_tensor_at(m->gguf, i)->n_bytes;
    cinfer_status st = load_all(&lc);
    if (st == CINFER_OK)
        st = check_all_used(&lc);
    free(lc.used);
    return st;
}

/* The activation buffers, max_rows rows each: their widths, for
 * allocation and for planning (act_bytes). */
static int act_widths(cinfer_model *m, cinfer_tensor ***ts, int64_t *widths)
{
    const cinfer_model_info *I = &m->info;
    int64_t d = I->n_embd, ff = m->ff_r;
    int64_t dq = (int64_t)m->n_head_r * I->head_dim;
    int64_t dkv = (int64_t)m->n_kv_r * I->head_dim;
    cinfer_tensor **t[] = {&m->x,  &m->h,   &m->q,    &m->k,
                           &m->v,  &m->att, &m->gate, &m->up,
                           &m->xo, &m->ho,  &m->logits};
    int64_t w[] = {d, d, dq, dkv, dkv, dq, ff, ff, d, d, m->v1 - m->v0};
    int n = (int)(sizeof w / sizeof w[0]);
    for (int i = 0; i < n; i++) {
        if (ts)
            ts[i] = t[i];
        widths[i] = w[i];
    }
    return n;
}

#define N_ACTS 11

/* Which choices of the out rows' tokens the backend makes (model.h's
 * cinfer_model_choices): only where one backend holds the whole
 * vocabulary's logits (no tensor parallelism). */
static int choices(const cinfer_model *m)
{
    if (m->tp != 1 || m->gather || !m->be)
        return 0;
    if (cinfer_backend_has_choose(m->be) &&
        m->info.n_vocab <= CINFER_CHOOSE_MAX_N) {
        if (!cinfer_backend_has_edit_logits(m->be))
            return 2;
        return cinfer_backend_has_logprobs(m->be) ? 4 : 3;
    }
    return cinfer_backend_has_greedy(m->be) ? 1 : 0;
}

static int has_greedy_op(const cinfer_model *m) { return choices(m) > 0; }

static uint64_t act_bytes(cinfer_model *m)
{
    int64_t w[N_ACTS];
    int n = act_widths(m, NULL, w);
    uint64_t b = 0;
    for (int i = 0; i < n; i++)
        b += (uint64_t)m->max_rows * (uint64_t)w[i] * sizeof(float);
    if (m->gather) /* logits_all */
        b += (uint64_t)m->tp * (uint64_t)m->max_rows *
             (uint64_t)(m->v1 - m->v0) * sizeof(float);
    if (has_greedy_op(m))
        b += (uint64_t)m->max_rows * sizeof(int32_t);
    if (choices(m) >= 4)
        b += (uint64_t)m->max_rows * sizeof(cinfer_row_logprobs);
    return b;
}

static cinfer_status alloc_acts(cinfer_model *m)
{
    cinfer_tensor **ts[N_ACTS];
    int64_t w[N_ACTS];
    int n = act_widths(m, ts, w);
    for (int i = 0; i < n; i++) {
        cinfer_status st = make_act(m, ts[i], m->max_rows, w[i]);
        if (st != CINFER_OK)
            return st;
    }
    if (m->gather) {
        cinfer_status st = make_act(m, &m->logits_all,
                                    (int64_t)m->tp * m->max_rows,
                                    m->v1 - m->v0);
        if (st != CINFER_OK)
            return st;
    }
    if (has_greedy_op(m)) {
        int64_t shape[1] = {m->max_rows};
        cinfer_tensor_desc d =
            cinfer_tensor_desc_make(CINFER_DTYPE_I32, 1, shape);
        cinfer_status st = cinfer_backend_tensor_create(m->be, &d, &m->greedy);
        if (st != CINFER_OK)
            return st;
    }
    if (choices(m) >= 4) {
        int64_t shape[2] = {m->max_rows, CINFER_ROW_LOGPROBS_WORDS};
        cinfer_tensor_desc d =
            cinfer_tensor_desc_make(CINFER_DTYPE_I32, 2, shape);
        cinfer_status st = cinfer_backend_tensor_create(m->be, &d, &m->lp);
        if (st != CINFER_OK)
            return st;
    }
    m->info.activation_bytes = act_bytes(m);
    return CINFER_OK;
}

static cinfer_tensor_desc kv_desc(const cinfer_model *m, int64_t n_blocks,
                                  int kv_f32)
{
    const cinfer_model_info *I = &m->info;
    int64_t kv_shape[4] = {n_blocks, I->block_size, m->n_kv_r, I->head_dim};
    return cinfer_tensor_desc_make(
        kv_f32 ? CINFER_DTYPE_F32 : CINFER_DTYPE_F16, 4, kv_shape);
}

/* Bytes of one KV block over the layers whose K/V is in the global
 * blocks (all of them without a window pool), K and V. */
static uint64_t kv_block_bytes(const cinfer_model *m, int kv_f32)
{
    cinfer_tensor_desc d = kv_desc(m, 1, kv_f32);
    int n = m->info.n_layer;
    for (int il = 0; m->n_swa && il < m->info.n_layer; il++)
        n -= gemma_local(m, il);
    return 2 * (uint64_t)n * cinfer_tensor_desc_nbytes(&d);
}

/* The local layers' own pool (model.h, swa_kv_blocks). A decoding
 * sequence holds at most (window - 1) / block_size + 2 of its blocks, a
 * prefill chunk of R rows (R - 1) / block_size + 1 more: the default is
 * one block more than that for each of max_seqs sequences plus a chunk of
 * max_batch_rows, and never more than the global pool (a sequence's local
 * blocks are some of its global ones', so that is always enough). */
static cinfer_status plan_swa(cinfer_model *m, const cinfer_model_params *p,
                              int max_seqs, int budgeted)
{
    cinfer_model_info *I = &m->info;
    const int bs = I->block_size, W = m->gemma_window;
    I->swa_window = m->arch->gemma ? W : 0;
    m->n_swa = 0;
    if (!m->arch->gemma || W <= 0 || W >= I->n_ctx || budgeted ||
        p->swa_kv_blocks < 0)
        return CINFER_OK;
    int64_t per_seq = (W - 1) / bs + 2;
    int64_t n = p->swa_kv_blocks;
    if (n == 0) {
        n = (int64_t)max_seqs * (per_seq + 1) +
            (m->max_rows + bs - 1) / bs;
        if (n > I->n_kv_blocks)
            n = I->n_kv_blocks;
    }
    if (n < per_seq && n < I->n_kv_blocks)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: swa_kv_blocks %lld is below the %lld "
                                "blocks one sequence's window of %d "
                                "positions needs",
                                (long long)n, (long long)per_seq, W);
    if (n > (1 << 24))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: swa_kv_blocks %lld is too large",
                                (long long)n);
    m->n_swa = (int)n;
    I->n_swa_blocks = m->n_swa;
    return CINFER_OK;
}

static cinfer_status alloc_kv(cinfer_model *m, const cinfer_model_params *p)
{
    cinfer_model_info *I = &m->info;
    cinfer_status st;
    cinfer_tensor_desc kd = kv_desc(m, I->n_kv_blocks + m->n_dump, p->kv_f32);
    cinfer_tensor_desc sd = kv_desc(m, m->n_swa + 1, p->kv_f32);
    I->kv_bytes = 0;
    for (int il = 0; il < I->n_layer; il++) {
        layer *L = &m->layers[il];
        const cinfer_tensor_desc *d = m->n_swa && L->window ? &sd : &kd;
        if ((st = cinfer_backend_tensor_create(m->be, d, &L->k_cache)) ||
            (st = cinfer_backend_tensor_create(m->be, d, &L->v_cache)))
            return st;
        /* Zeroed so that stale slots never hold NaN bit patterns (and the
         * window pool's null block stays 0). */
        if ((st = cinfer_backend_fill_zero(m->be, L->k_cache)) ||
            (st = cinfer_backend_fill_zero(m->be, L->v_cache)))
            return st;
        I->kv_bytes += 2 * cinfer_tensor_desc_nbytes(d);
    }
    int max_blocks = (I->n_ctx + I->block_size - 1) / I->block_size;
    m->single_tables = malloc(sizeof(int32_t) * (size_t)max_blocks);
    if (!m->single_tables)
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
    for (int i = 0; i < max_blocks; i++)
        m->single_tables[i] = i < I->n_kv_blocks ? i : 0;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* memory planning on a backend with a budget                             */
/* ---------------------------------------------------------------------- */

/* What planning knows so far. Sizes not yet measured are estimates:
 * weights from the file until they are loaded, scratch 0 until it is
 * reserved. */
typedef struct {
    size_t used0;      /* backend bytes in use before the model */
    size_t budget;     /* the backend's budget */
    uint64_t kv_need;  /* KV bytes the plan needs at least */
    int kv_min_blocks; /* blocks of one full-context sequence */
} mem_plan;

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* The refusal of a model that does not fit: every size in MiB. `cause`,
 * if not empty, is the backend's own message (copied first: set_error
 * rewrites the buffer it lives in). */
static cinfer_status refuse_fit(cinfer_model *m, const mem_plan *mp,
                                const char *why, const char *cause)
{
    const cinfer_model_info *I = &m->info;
    char c[256];
    snprintf(c, sizeof c, "%s", cause ? cause : "");
    uint64_t w = I->weights_held_bytes ? I->weights_held_bytes
                                       : I->weight_bytes;
    uint64_t a = act_bytes(m); /* what alloc_acts asks for, exactly */
    return cinfer_set_error(
        CINFER_E_NOMEM,
        "model: does not fit the %s memory budget (%s): weights %.1f MiB + "
        "activations %.1f MiB + scratch %.1f MiB + KV %.1f MiB (%d blocks, "
        "one %d-token sequence) > budget %.1f MiB (%.1f MiB held before); "
        "give the backend a larger share of the device, or lower the "
        "context size, sequences or batch rows%s%s%s",
        cinfer_backend_name(m->be), why, mib(w), mib(a),
        mib(I->scratch_bytes), mib(mp->kv_need), mp->kv_min_blocks, I->n_ctx,
        mib(mp->budget), mib(mp->used0), c[0] ? " [" : "", c,
        c[0] ? "]" : "");
}

/* A failed allocation while planning: out of budget is a refusal with the
 * sizes; anything else (a device fault) passes through. */
static cinfer_status plan_failed(cinfer_model *m, const mem_plan *mp,
                                 cinfer_status st, const char *why)
{
    if (st != CINFER_E_NOMEM)
        return st;
    return refuse_fit(m, mp, why, cinfer_last_error());
}

static size_t backend_used(cinfer_model *m)
{
    size_t used = 0, budget = 0;
    cinfer_backend_memory(m->be, &used, &budget);
    return used;
}

/* Before anything is loaded: can weights, activations and one sequence's
 * KV fit at all? Refusing here spares a load that would fail. */
static cinfer_status plan_precheck(cinfer_model *m, mem_plan *mp)
{
    const cinfer_model_info *I = &m->info;
    uint64_t need = I->weight_bytes + act_bytes(m) + mp->kv_need;
    if (mp->used0 > mp->budget || need > mp->budget - mp->used0)
        return refuse_fit(m, mp, "weights, activations and one sequence's "
                                 "KV alone exceed it", NULL);
    return CINFER_OK;
}

/* After weights and activations: reserves the largest step's scratch,
 * then gives the KV cache what is left (or checks the blocks asked for). */
static cinfer_status plan_scratch_and_kv(cinfer_model *m,
                                         const cinfer_model_params *p,
                                         mem_plan *mp)
{
    cinfer_model_info *I = &m->info;
    size_t before = backend_used(m);
    int64_t max_k = I->n_embd > m->ff_r ? I->n_embd : m->ff_r;
    int64_t dq = (int64_t)m->n_head_r * I->head_dim;
    cinfer_backend_scratch_plan sp = {
        .max_rows = m->max_rows,
        .max_k = max_k > dq ? max_k : dq,
        .n_heads = m->n_head_r,
        .head_dim = I->head_dim,
        .max_context = I->n_ctx,
    };
    cinfer_status st = cinfer_backend_reserve_scratch(m->be, &sp);
    size_t used = backend_used(m);
    I->scratch_bytes = used > before ? used - before : 0;
    if (st != CINFER_OK)
        return plan_failed(m, mp, st, "the scratch of the largest step "
                                      "does not fit");

    uint64_t per_block = kv_block_bytes(m, p->kv_f32);
    uint64_t left = used < mp->budget ? mp->budget - used : 0;
    uint64_t fit = per_block ? left / per_block : 0;
    fit = fit > (uint64_t)m->n_dump ? fit - (uint64_t)m->n_dump : 0;
    if (p->kv_from_budget) {
        int max_seqs = p->max_seqs ? p->max_seqs : 1;
        uint64_t cap = (uint64_t)mp->kv_min_blocks * (uint64_t)max_seqs;
        if (cap > (1u << 24))
            cap = 1u << 24;
        if (fit < (uint64_t)mp->kv_min_blocks)
            return refuse_fit(m, mp, "the KV cache has no room for one "
                                     "full-context sequence", NULL);
        I->n_kv_blocks = (int)(fit < cap ? fit : cap);
    } else if ((uint64_t)I->n_kv_blocks > fit) {
        mp->kv_need = (uint64_t)I->n_kv_blocks * per_block;
        return refuse_fit(m, mp, "the KV cache asked for does not fit",
                          NULL);
    }
    return CINFER_OK;
}

/* This model's rank and its share of heads, feed-forward rows and
 * vocabulary. A count that does not divide by the ranks is refused here,
 * before any weight is read. */
static cinfer_status set_rank(cinfer_model *m, const cinfer_model_params *p,
                              int tp)
{
    cinfer_model_info *I = &m->info;
    m->tp = tp;
    m->rank = tp > 1 ? p->tp_rank : 0;
    I->tensor_parallel = tp;
    I->tp_rank = m->rank;
    if (tp > 1) {
        cinfer_comm *c = cinfer_backend_comm(p->backend);
        if (!c || cinfer_comm_size(c) != tp || cinfer_comm_rank(c) != m->rank)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "model: rank %d of tensor_parallel %d needs a backend whose "
                "communicator has %d ranks and is rank %d (it has %d, rank "
                "%d)",
                m->rank, tp, tp, m->rank, c ? cinfer_comm_size(c) : 1,
                c ? cinfer_comm_rank(c) : 0);
    }
    if (I->n_head % tp || I->n_head_kv % tp)
        return cinfer_set_error(
            CINFER_E_UNSUPPORTED,
            "model: tensor_parallel %d does not divide the model's heads: "
            "head_count %d, head_count_kv %d (both must be multiples of the "
            "ranks)",
            tp, I->n_head, I->n_head_kv);
    m->n_head_r = I->n_head / tp;
    m->n_kv_r = I->n_head_kv / tp;
    int64_t lo, hi;
    share(m, I->n_ff, &lo, &hi);
    m->ff_r = hi - lo;
    /* the vocabulary is known once the tokenizer is read */
    return CINFER_OK;
}

/* The face of a tensor-parallel group: a model whose forward fans out to
 * the group's rank models (model_group.c); info, tokenizer and gguf are
 * rank 0's, the memory figures the largest rank's. */
static cinfer_status create_group(const cinfer_model_params *p,
                                  cinfer_model **out)
{
    cinfer_model *m = calloc(1, sizeof *m);
    if (!m)
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
    cinfer_status st = cinfer_model_group_create(p, &m->group);
    if (st != CINFER_OK) {
        free(m);
        return st;
    }
    cinfer_model *r0 = cinfer_model_group_rank(m->group, 0);
    m->info = r0->info;
    m->info.weights_held_bytes = cinfer_model_group_weights_held_max(m->group);
    m->info.tp_rank = 0;
    /* the blocks every rank holds (over several nodes, the fewest) */
    int kv = cinfer_model_group_kv_blocks(m->group);
    if (kv < m->info.n_kv_blocks) {
        m->info.kv_bytes = m->info.kv_bytes / (uint64_t)m->info.n_kv_blocks *
                           (uint64_t)kv;
        m->info.n_kv_blocks = kv;
    }
    m->max_rows = r0->max_rows;
    m->tp = r0->tp;
    int max_blocks = (m->info.n_ctx + m->info.block_size - 1) /
                     m->info.block_size;
    m->single_tables = malloc(sizeof(int32_t) * (size_t)max_blocks);
    if (!m->single_tables) {
        cinfer_model_destroy(m);
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
    }
    memcpy(m->single_tables, r0->single_tables,
           sizeof(int32_t) * (size_t)max_blocks);
    *out = m;
    return CINFER_OK;
}

cinfer_status cinfer_model_create(const cinfer_model_params *p,
                                  cinfer_model **out)
{
    cinfer_status st;
    *out = NULL;
    if (!p)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "model: params is NULL");
    if (p->n_ctx < 0 || p->block_size < 0 || p->n_kv_blocks < 0 ||
        p->max_seqs < 0 || p->max_batch_rows < 0 || p->n_threads < 0 ||
        p->tensor_parallel < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: negative size in params");
    int tp = p->tensor_parallel ? p->tensor_parallel : 1;
    if (tp > CINFER_COMM_MAX_RANKS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: tensor_parallel %d is above %d", tp,
                                CINFER_COMM_MAX_RANKS);
    if (!p->backend && (tp > 1 || p->tp_device == CINFER_TP_CUDA))
        return create_group(p, out);
    if (tp > 1 && (p->tp_rank < 0 || p->tp_rank >= tp))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: tp_rank %d outside 0..%d", p->tp_rank,
                                tp - 1);
    const char *path = p->path ? p->path : cinfer_model_default_path();
    if (!path || !*path)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: no model path given and no default "
                                "model installed (run "
                                "scripts/install-deps.sh)");

    cinfer_model *m = calloc(1, sizeof *m);
    if (!m)
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");

    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = path;
    gp.in_memory = !p->use_mmap;
    if ((st = cinfer_gguf_create(&gp, &m->gguf)) != CINFER_OK)
        goto fail;
    if ((st = read_hparams(m)) != CINFER_OK)
        goto fail;
    if ((st = set_rank(m, p, tp)) != CINFER_OK)
        goto fail;

    cinfer_tokenizer_params tkp = cinfer_tokenizer_default_params();
    tkp.gguf = m->gguf;
    if ((st = cinfer_tokenizer_create(&tkp, &m->tok)) != CINFER_OK)
        goto fail;
    cinfer_model_info *I = &m->info;
    I->n_vocab = cinfer_tokenizer_n_vocab(m->tok);
    share(m, I->n_vocab, &m->v0, &m->v1);
    m->gather = tp > 1 && p->tp_gather_logits;
    if (m->gather && I->n_vocab % tp) {
        st = cinfer_set_error(CINFER_E_UNSUPPORTED,
                              "model: tensor_parallel %d over several "
                              "processes gathers equal vocabulary slices, "
                              "and the vocabulary of %d tokens does not "
                              "divide by %d",
                              tp, I->n_vocab, tp);
        goto fail;
    }
    const cinfer_gguf_tensor *te =
        cinfer_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (te && te->n_dims == 2 && te->ne[1] != I->n_vocab) {
        st = cinfer_set_error(CINFER_E_FORMAT,
                              "model: token_embd.weight has %lld rows but "
                              "the vocabulary has %d tokens",
                              (long long)te->ne[1], I->n_vocab);
        goto fail;
    }

    I->n_ctx = p->n_ctx ? p->n_ctx : I->n_ctx_train;
    if (!p->n_ctx && I->n_ctx > 8192)
        I->n_ctx = 8192;
    I->block_size = p->block_size ? p->block_size : 16;
    int max_seqs = p->max_seqs ? p->max_seqs : 1;
    int blocks_per_seq = (I->n_ctx + I->block_size - 1) / I->block_size;
    I->n_kv_blocks = p->n_kv_blocks ? p->n_kv_blocks
                                    : blocks_per_seq * max_seqs;
    m->max_rows = p->max_batch_rows ? p->max_batch_rows : 512;
    I->max_batch_rows = m->max_rows;
    if (I->n_ctx > (1 << 24) || I->block_size > 4096 ||
        I->n_kv_blocks > (1 << 24) || m->max_rows > 65536) {
        st = cinfer_set_error(CINFER_E_INVALID_ARG,
                              "model: n_ctx, block_size, n_kv_blocks or "
                              "max_batch_rows is too large");
        goto fail;
    }

    if (p->backend) {
        m->be = p->backend;
    } else {
        cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
        bp.n_threads = p->n_threads;
        bp.isa = p->isa;
        bp.thread_prio = p->thread_prio;
        if ((st = cinfer_backend_cpu_create(&bp, &m->be)) != CINFER_OK)
            goto fail;
        m->owns_backend = 1;
    }
    if (m->arch->gemma && !cinfer_backend_has_gemma_ops(m->be)) {
        st = cinfer_set_error(CINFER_E_UNSUPPORTED,
                              "model: architecture 'gemma3' needs "
                              "sliding-window attention, GELU and scale "
                              "ops, which the %s backend does not implement",
                              cinfer_backend_name(m->be));
        goto fail;
    }
    weight_stats(m);
    mem_plan plan = {0};
    int budgeted = cinfer_backend_memory(m->be, &plan.used0, &plan.budget) ==
                   CINFER_OK;
    if (!budgeted)
        cinfer_clear_error(); /* no budget (the CPU) is not a failure */
    /* (a backend with a budget has no gemma3 ops today: no window pool) */
    if ((st = plan_swa(m, p, max_seqs, budgeted)) != CINFER_OK)
        goto fail;
    /* Graphs on a backend that records them, for one rank, without a
     * window pool (its slots are another table). A group's ranks stay
     * eager: NCCL takes whether a collective is captured, and which
     * recording a replay launches, as collective properties that every
     * rank must share, so the ranks would have to agree on each record,
     * replay and drop (across nodes too) before a step. A pad row is one
     * of fewer than half its bucket. */
    if (cinfer_backend_has_graphs(m->be) && m->tp == 1 && !m->n_swa) {
        m->graph_rows = m->max_rows < 256 ? m->max_rows : 256;
        m->n_dump = (m->graph_rows / 2 + I->block_size - 1) / I->block_size;
    }
    plan.kv_min_blocks = blocks_per_seq;
    plan.kv_need = (uint64_t)blocks_per_seq * kv_block_bytes(m, p->kv_f32);
    I->budget_bytes = budgeted ? plan.budget : 0;
    if (budgeted && (st = plan_precheck(m, &plan)) != CINFER_OK)
        goto fail;
    st = load_weights(m, p);
    if (budgeted && st != CINFER_OK)
        st = plan_failed(m, &plan, st, "the weights do not fit");
    if (st != CINFER_OK)
        goto fail;
    /* A whole model on the CPU holds the file's bytes; a rank what it
     * created (its shards and the replicated tensors). */
    I->weights_held_bytes = budgeted     ? backend_used(m) - plan.used0
                            : m->tp > 1 ? m->held_bytes
                                        : I->weight_bytes;
    st = alloc_acts(m);
    if (budgeted && st != CINFER_OK)
        st = plan_failed(m, &plan, st, "the activations do not fit");
    if (st != CINFER_OK)
        goto fail;
    if (budgeted && (st = plan_scratch_and_kv(m, p, &plan)) != CINFER_OK)
        goto fail;
    if ((st = alloc_kv(m, p)) != CINFER_OK) {
        if (budgeted)
            st = plan_failed(m, &plan, st, "the KV cache does not fit");
        goto fail;
    }
    *out = m;
    return CINFER_OK;

fail:
    /* keep the first error's message: destroy sets none */
    cinfer_model_destroy(m);
    return st;
}

void cinfer_model_destroy(cinfer_model *m)
{
    if (!m)
        return;
    cinfer_model_group_destroy(m->group);
    cinfer_backend *be = m->be;
    if (be) {
        cinfer_tensor **acts[] = {&m->x,   &m->h,    &m->q,  &m->k,
                                  &m->v,   &m->att,  &m->gate, &m->up,
                                  &m->xo,  &m->ho,   &m->logits,
                                  &m->logits_all, &m->greedy, &m->lp,
                                  &m->tok_embd, &m->out_norm, &m->output};
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++)
            cinfer_backend_tensor_destroy(be, *acts[i]);
        if (m->layers) {
            for (int il = 0; il < m->info.n_layer; il++) {
                layer *L = &m->layers[il];
                cinfer_tensor *ts[] = {L->attn_norm, L->ffn_norm, L->wq,
                                       L->wk,        L->wv,       L->wo,
                                       L->bq,        L->bk,       L->bv,
                                       L->q_norm,    L->k_norm,
                                       L->attn_post_norm, L->ffn_post_norm,
                                       L->w_gate,    L->w_up,     L->w_down,
                                       L->k_cache,   L->v_cache};
                for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
                    cinfer_backend_tensor_destroy(be, ts[i]);
            }
        }
        if (m->owns_backend)
            cinfer_backend_destroy(be);
    }
    for (int i = 0; i < m->n_slices; i++)
        slice_free(m->slices[i]);
    free(m->slices);
    free(m->layers);
    free(m->rope_factors);
    free(m->single_tables);
    free(m->pad_buf);
    free(m->stage);
    cinfer_tokenizer_destroy(m->tok);
    cinfer_gguf_destroy(m->gguf);
    free(m);
}

const cinfer_model_info *cinfer_model_get_info(const cinfer_model *m)
{
    return &m->info;
}

/* A group's face has no tokenizer, gguf or backend of its own: rank 0's. */
static const cinfer_model *rank0(const cinfer_model *m)
{
    return m->group ? cinfer_model_group_rank(m->group, 0) : m;
}

const cinfer_tokenizer *cinfer_model_tokenizer(const cinfer_model *m)
{
    return rank0(m)->tok;
}

const cinfer_gguf *cinfer_model_gguf(const cinfer_model *m)
{
    return rank0(m)->gguf;
}

cinfer_backend *cinfer_model_backend(cinfer_model *m)
{
    return rank0(m)->be;
}

int cinfer_model_input_embeds(const cinfer_model *m)
{
    return !m->group || cinfer_model_group_size(m->group) ==
                            cinfer_model_group_local_size(m->group);
}

int cinfer_model_healthy(cinfer_model *m)
{
    if (m->group)
        return cinfer_model_group_healthy(m->group);
    return cinfer_backend_healthy(m->be);
}

void cinfer_model_graph_stats(const cinfer_model *m,
                              cinfer_backend_graph_stats *out)
{
    memset(out, 0, sizeof *out);
    if (m && m->group)
        cinfer_model_group_graph_stats(m->group, out);
    else if (m && m->be)
        cinfer_backend_graph_stats_get(m->be, out);
}

/* ---------------------------------------------------------------------- */
/* forward                                                                */
/* ---------------------------------------------------------------------- */

static cinfer_status set_rows(cinfer_model *m, int64_t rows,
                              cinfer_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++) {
        cinfer_status st = cinfer_backend_tensor_set_rows(m->be, ts[i], rows);
        if (st != CINFER_OK)
            return st;
    }
    return CINFER_OK;
}

#define TRY(expr)                                                              \
    do {                                                                       \
        cinfer_status st_ = (expr);                                            \
        if (st_ != CINFER_OK)                                                  \
            return st_;                                                        \
    } while (0)

/* Prompt embeddings: the rows with an input of their own
 * (cinfer_step.row_embd) take it over what embed wrote, one upload per run
 * of rows whose inputs follow each other in memory (a sequence's chunk). */
static cinfer_status put_row_embds(cinfer_model *m, const cinfer_step *step)
{
    const size_t d = (size_t)m->info.n_embd, row = d * sizeof(float);
    for (int32_t r = 0; r < step->n_rows;) {
        const float *src = step->row_embd[r];
        int32_t e = r + 1;
        if (!src) {
            r = e;
            continue;
        }
        while (e < step->n_rows &&
               step->row_embd[e] == src + (size_t)(e - r) * d)
            e++;
        TRY(cinfer_backend_upload(m->be, m->x, (size_t)r * row, src,
                                  (size_t)(e - r) * row));
        r = e;
    }
    return CINFER_OK;
}

/* The model's own checks of a step (the backend checks the rest). */
static cinfer_status check_step(const cinfer_model *m, const cinfer_step *step)
{
    const cinfer_model_info *I = &m->info;
    if (!step || step->n_rows < 1 || step->n_rows > m->max_rows)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: step has %d rows (allowed 1..%d)",
                                step ? step->n_rows : 0, m->max_rows);
    if (step->n_out < 1 || step->n_out > step->n_rows)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: step n_out %d outside 1..%d",
                                step->n_out, step->n_rows);
    if (step->block_size != I->block_size)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model: step block_size %d != cache's %d",
                                step->block_size, I->block_size);
    if (!I->n_swa_blocks != !step->swa_block_tables)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                I->n_swa_blocks
                                    ? "model: the step has no "
                                      "swa_block_tables for the local "
                                      "layers' own KV pool"
                                    : "model: the step has swa_block_tables "
                                      "but the model has no window pool");
    for (int32_t r = 0; r < step->n_rows; r++) {
        if (step->positions[r] < 0 || step->positions[r] >= I->n_ctx)
            return cinfer_set_error(CINFER_E_RANGE,
                                    "model: row %d position %d outside the "
                                    "context (0..%d)",
                                    r, step->positions[r], I->n_ctx - 1);
        if (step->tokens[r] < 0 || step->tokens[r] >= I->n_vocab)
            return cinfer_set_error(CINFER_E_RANGE,
                                    "model: row %d token id %d outside the "
                                    "vocabulary (0..%d)",
                                    r, step->tokens[r], I->n_vocab - 1);
    }
    return CINFER_OK;
}

/* The rank's logits [n_out, v1 - v0] into its columns of the full rows:
 * the host-side gather of a vocabulary-parallel LM head. */
/* Ranks in several processes: the slices are all-gathered into
 * logits_all (rank k's rows at k * n_out), and rank 0 copies them out in
 * one download and puts each in its columns. */
static cinfer_status gather_logits(cinfer_model *m, int64_t n_out,
                                   float *logits)
{
    size_t V = (size_t)m->info.n_vocab, w = (size_t)(m->v1 - m->v0);
    size_t tp = (size_t)m->tp, n = (size_t)n_out;
    TRY(cinfer_backend_tensor_set_rows(m->be, m->logits_all,
                                       (int64_t)(tp * n)));
    TRY(cinfer_backend_all_gather(m->be, m->logits, m->logits_all));
    if (m->rank != 0)
        return CINFER_OK;
    if (n * V > m->stage_cap) {
        float *s = realloc(m->stage, sizeof(float) * n * V);
        if (!s)
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "model: out of memory for %zu gathered "
                                    "logits",
                                    n * V);
        m->stage = s;
        m->stage_cap = n * V;
    }
    TRY(cinfer_backend_download(m->be, m->logits_all, 0, m->stage,
                                sizeof(float) * n * V));
    for (size_t k = 0; k < tp; k++)
        for (size_t j = 0; j < n; j++)
            memcpy(logits + j * V + k * w, m->stage + (k * n + j) * w,
                   sizeof(float) * w);
    return CINFER_OK;
}

static cinfer_status download_logits(cinfer_model *m, int64_t n_out,
                                     float *logits)
{
    size_t V = (size_t)m->info.n_vocab, w = (size_t)(m->v1 - m->v0);
    if (m->gather)
        return gather_logits(m, n_out, logits);
    if (m->tp == 1)
        return cinfer_backend_download(m->be, m->logits, 0, logits,
                                       sizeof(float) * (size_t)n_out * V);
    for (int64_t j = 0; j < n_out; j++)
        TRY(cinfer_backend_download(m->be, m->logits,
                                    sizeof(float) * (size_t)j * w,
                                    logits + (size_t)j * V + (size_t)m->v0,
                                    sizeof(float) * w));
    return CINFER_OK;
}

/* The graphs' row bucket of a step, or 0 for a step run eagerly. Only
 * decode steps are recorded: one row per sequence, each an out row (no
 * two adjacent rows of a sequence at consecutive positions: the rows
 * attention tiles), without prompt embeddings or a window pool, whose
 * padding fits the dump blocks. */
static int32_t graph_bucket(const cinfer_model *m, const cinfer_step *s)
{
    const int32_t n = s->n_rows;
    if (!m->graph_rows || n > m->graph_rows || s->n_seqs != n ||
        s->n_out != n || s->row_embd || s->swa_slots)
        return 0;
    for (int32_t r = 1; r < n; r++)
        if (s->row_seq[r] == s->row_seq[r - 1] &&
            s->positions[r] == s->positions[r - 1] + 1)
            return 0;
    int32_t b = 1;
    while (b < n)
        b *= 2;
    if (b > m->graph_rows)
        b = m->graph_rows;
    return b - n <= m->n_dump * s->block_size ? b : 0;
}

/* The block-table stride a bucket's step is laid out at: the step's
 * rounded up to a power of two (at least 8), at most a full context's. */
static int32_t graph_stride(const cinfer_model *m, const cinfer_step *s)
{
    const int32_t full = (m->info.n_ctx + s->block_size - 1) / s->block_size;
    int32_t w = 8;
    while (w < s->max_blocks)
        w *= 2;
    w = w < full ? w : full;
    return w > s->max_blocks ? w : s->max_blocks;
}

/* s as a step of b rows and table stride w, in m->pad_buf: pad row n + i
 * is the only row of its own sequence n_seqs + i, at position i % bs in
 * dump block dump + i / bs (every entry of its table), and an out row.
 * Pad rows read and write the dump blocks only, and a row's result
 * depends on its own inputs alone, so the real rows' bits are those of
 * the unpadded step. */
static cinfer_status pad_step(cinfer_model *m, const cinfer_step *s,
                              int32_t b, int32_t w, cinfer_step *out)
{
    const int32_t n = s->n_rows, bs = s->block_size;
    const int32_t dump = m->info.n_kv_blocks;
    const size_t need = 5 * (size_t)b + (size_t)b * (size_t)w + (size_t)b;
    if (need > m->pad_cap) {
        int32_t *p = realloc(m->pad_buf, sizeof(int32_t) * need);
        if (!p)
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "model: out of memory for a padded "
                                    "step of %d rows",
                                    b);
        m->pad_buf = p;
        m->pad_cap = need;
    }
    int32_t *tok = m->pad_buf, *pos = tok + b, *seq = pos + b,
            *slot = seq + b, *outr = slot + b, *tab = outr + b;
    uint8_t *gen = (uint8_t *)(tab + (size_t)b * w);
    memcpy(tok, s->tokens, sizeof(int32_t) * (size_t)n);
    memcpy(pos, s->positions, sizeof(int32_t) * (size_t)n);
    memcpy(seq, s->row_seq, sizeof(int32_t) * (size_t)n);
    memcpy(slot, s->slots, sizeof(int32_t) * (size_t)n);
    for (int32_t q = 0; q < n; q++) {
        memcpy(tab + (size_t)q * w, s->block_tables + (size_t)q * s->max_blocks,
               sizeof(int32_t) * (size_t)s->max_blocks);
        for (int32_t k = s->max_blocks; k < w; k++)
            tab[(size_t)q * w + k] = 0;
    }
    for (int32_t r = 0; r < b; r++) {
        outr[r] = r;
        gen[r] = r >= n || (s->row_gen && s->row_gen[r]);
    }
    for (int32_t i = 0; i < b - n; i++) {
        const int32_t blk = dump + i / bs;
        tok[n + i] = 0;
        pos[n + i] = i % bs;
        seq[n + i] = n + i;
        slot[n + i] = blk * bs + i % bs;
        for (int32_t k = 0; k < w; k++)
            tab[(size_t)(n + i) * w + k] = blk;
    }
    *out = *s;
    out->n_rows = out->n_seqs = out->n_out = b;
    out->max_blocks = w;
    out->tokens = tok;
    out->positions = pos;
    out->row_seq = seq;
    out->slots = slot;
    out->out_rows = outr;
    out->block_tables = tab;
    out->row_gen = gen;
    return CINFER_OK;
}

/* The layers: the step's embeddings through to the logits of its out
 * rows, enqueued (or recorded: the same calls whichever). */
static cinfer_status layers(cinfer_model *m, const cinfer_step *step)
{
    const cinfer_model_info *I = &m->info;
    cinfer_backend *be = m->be;
    /* a rank of several: its partial sums meet the others' here */
    int tp = m->tp > 1;
    int64_t n_out = step->n_out;
    int last = I->n_layer - 1;
    const float scale = m->attn_scale;
    const cinfer_rope_params rope_global = {.theta = I->rope_theta,
                                            .freq_scale = m->rope_freq_scale,
                                            .freq_factors = m->rope_factors,
                                            .mode = m->rope_mode};
    /* gemma3's local layers: their own base, never scaled */
    const cinfer_rope_params rope_local = {.theta = m->rope_theta_swa,
                                           .freq_scale = 1.0f,
                                           .mode = m->rope_mode};
    TRY(cinfer_backend_embed(be, m->tok_embd, m->x));
    if (step->row_embd)
        TRY(put_row_embds(m, step));
    if (m->embd_scale != 1.0f)
        TRY(cinfer_backend_scale(be, m->x, m->embd_scale));
    /* Each residual add and the norm after it go through add_rms_norm (one
     * launch on CUDA); the first layer's attention norm has no add before
     * it, and the last add is followed by the output norm of the rows kept. */
    TRY(cinfer_backend_rms_norm(be, m->x, m->layers[0].attn_norm,
                                I->norm_eps, m->h));
    for (int il = 0; il <= last; il++) {
        layer *L = &m->layers[il];
        const cinfer_tensor *wqkv[3] = {L->wq, L->wk, L->wv};
        cinfer_tensor *oqkv[3] = {m->q, m->k, m->v};
        TRY(cinfer_backend_matmul(be, 3, wqkv, m->h, oqkv));
        if (L->bq) {
            TRY(cinfer_backend_add_bias(be, m->q, L->bq));
            TRY(cinfer_backend_add_bias(be, m->k, L->bk));
            TRY(cinfer_backend_add_bias(be, m->v, L->bv));
        }
        if (L->q_norm) { /* per head: the weights are [head_dim] */
            TRY(cinfer_backend_rms_norm(be, m->q, L->q_norm, I->norm_eps, m->q));
            TRY(cinfer_backend_rms_norm(be, m->k, L->k_norm, I->norm_eps, m->k));
        }
        const cinfer_rope_params *rope = L->window ? &rope_local
                                                   : &rope_global;
        if (m->n_swa && L->window) { /* the window pool (swa tables) */
            TRY(cinfer_backend_rope_ext(be, m->q, m->n_head_r, I->head_dim,
                                        m->rot_dim, rope));
            TRY(cinfer_backend_rope_ext(be, m->k, m->n_kv_r, I->head_dim,
                                        m->rot_dim, rope));
            TRY(cinfer_backend_kv_store_swa(be, m->k, m->v, L->k_cache,
                                            L->v_cache));
        } else {
            TRY(cinfer_backend_rope_kv_store(be, m->q, m->n_head_r, m->k,
                                             m->n_kv_r, m->v, I->head_dim,
                                             m->rot_dim, rope, L->k_cache,
                                             L->v_cache));
        }
        if (m->q_prescale)
            TRY(cinfer_backend_scale(be, m->q, scale));
        TRY(cinfer_backend_attention_window(be, m->q, L->k_cache, L->v_cache,
                                            m->n_head_r, m->n_kv_r,
                                            I->head_dim,
                                            m->q_prescale ? 1.0f : scale,
                                            L->window,
                                            m->att));
        const cinfer_tensor *wo[1] = {L->wo};
        cinfer_tensor *oo[1] = {m->h};
        TRY(cinfer_backend_matmul(be, 1, wo, m->att, oo));
        if (tp)
            TRY(cinfer_backend_all_reduce_sum(be, m->h));
        if (L->attn_post_norm)
            TRY(cinfer_backend_rms_norm(be, m->h, L->attn_post_norm,
                                        I->norm_eps, m->h));

        /* In the last layer only the wanted rows continue. */
        cinfer_tensor *x = m->x, *h = m->h;
        if (il == last) {
            TRY(cinfer_backend_gather_rows(be, m->x, m->xo));
            TRY(cinfer_backend_gather_rows(be, m->h, m->ho));
            cinfer_tensor *ffn[] = {m->gate, m->up, m->h};
            TRY(set_rows(m, n_out, ffn, 3));
            x = m->xo;
            h = m->ho;
        }
        TRY(cinfer_backend_add_rms_norm(be, x, h, L->ffn_norm, I->norm_eps, h));
        if (m->arch->gemma) {
            const cinfer_tensor *wgu[2] = {L->w_gate, L->w_up};
            cinfer_tensor *ogu[2] = {m->gate, m->up};
            TRY(cinfer_backend_matmul(be, 2, wgu, h, ogu));
            TRY(cinfer_backend_gelu_mul(be, m->gate, m->up, m->gate));
        } else {
            TRY(cinfer_backend_matmul_silu_mul(be, L->w_gate, L->w_up, h,
                                               m->gate, m->up));
        }
        const cinfer_tensor *wd[1] = {L->w_down};
        cinfer_tensor *od[1] = {h};
        TRY(cinfer_backend_matmul(be, 1, wd, m->gate, od));
        if (tp)
            TRY(cinfer_backend_all_reduce_sum(be, h));
        if (L->ffn_post_norm)
            TRY(cinfer_backend_rms_norm(be, h, L->ffn_post_norm, I->norm_eps,
                                        h));
        if (il < last) /* x = m->x, h = m->h */
            TRY(cinfer_backend_add_rms_norm(be, x, h,
                                            m->layers[il + 1].attn_norm,
                                            I->norm_eps, h));
        else
            TRY(cinfer_backend_add(be, x, h, x));
    }
    TRY(cinfer_backend_rms_norm(be, m->xo, m->out_norm, I->norm_eps, m->xo));
    const cinfer_tensor *wout[1] = {m->output ? m->output : m->tok_embd};
    cinfer_tensor *olog[1] = {m->logits};
    TRY(cinfer_backend_matmul(be, 1, wout, m->xo, olog));
    return CINFER_OK;
}

/* The step through the model; then the logits of its out rows into
 * `logits`, or (codes not NULL) their tokens chosen on the backend into
 * `codes` as `ch` says (model_forward_choose). A decode step runs as its
 * row bucket's graph (graph_bucket), recorded on its first use. */
static cinfer_status forward(cinfer_model *m, const cinfer_step *step,
                             float *logits, const cinfer_choice *ch,
                             int32_t *codes)
{
    cinfer_backend *be = m->be;
    TRY(check_step(m, step));
    if (m->group)
        return cinfer_model_group_forward(m->group, step, logits);

    int64_t n_out = step->n_out;
    const cinfer_step *run = step;
    cinfer_step padded;
    const int32_t bucket = graph_bucket(m, step);
    int32_t stride = step->max_blocks;
    if (bucket) {
        stride = graph_stride(m, step);
        if (bucket > step->n_rows || stride != step->max_blocks) {
            TRY(pad_step(m, step, bucket, stride, &padded));
            run = &padded;
        }
    }
    cinfer_tensor *full[] = {m->x, m->h, m->q, m->k, m->v, m->att,
                             m->gate, m->up};
    cinfer_tensor *outs[] = {m->xo, m->ho, m->logits};
    TRY(cinfer_backend_set_step(be, run));
    TRY(set_rows(m, run->n_rows, full, 8));
    TRY(set_rows(m, run->n_out, outs, 3));
    if (bucket) {
        cinfer_graph_mode gm;
        TRY(cinfer_backend_graph_begin(be,
                                       (uint64_t)bucket |
                                           (uint64_t)stride << 16,
                                       &gm));
        cinfer_status st = gm == CINFER_GRAPH_REPLAY ? CINFER_OK
                                                      : layers(m, run);
        TRY(cinfer_backend_graph_end(be, st));
        /* the pad rows' logits are not the caller's */
        TRY(cinfer_backend_tensor_set_rows(be, m->logits, n_out));
    } else {
        TRY(layers(m, run));
    }
    if (codes) {
        if (ch->n_edits > 0)
            TRY(cinfer_backend_edit_logits(be, m->logits, ch->edits,
                                           ch->n_edits));
        TRY(cinfer_backend_tensor_set_rows(be, m->greedy, n_out));
        if (ch->draws)
            TRY(cinfer_backend_choose(be, m->logits, ch->draws, m->greedy));
        else
            TRY(cinfer_backend_greedy(be, m->logits, m->greedy));
        if (ch->n_top) {
            /* logprobs are of the raw rows */
            if (ch->n_edits > 0)
                TRY(cinfer_backend_unedit_logits(be, m->logits));
            TRY(cinfer_backend_tensor_set_rows(be, m->lp, n_out));
            TRY(cinfer_backend_logprobs(be, m->logits, m->greedy, ch->n_top,
                                        m->lp));
            TRY(cinfer_backend_download(be, m->lp, 0, ch->logprobs,
                                        sizeof(cinfer_row_logprobs) *
                                            (size_t)n_out));
        }
        TRY(cinfer_backend_download(be, m->greedy, 0, codes,
                                    sizeof(int32_t) * (size_t)n_out));
    } else {
        TRY(download_logits(m, n_out, logits));
    }
    TRY(cinfer_backend_synchronize(be));
    return CINFER_OK;
}

cinfer_status cinfer_model_forward(cinfer_model *m, const cinfer_step *step,
                                   float *logits)
{
    return forward(m, step, logits, NULL, NULL);
}

int cinfer_model_choices(const cinfer_model *m)
{
    return m && !m->group && m->greedy ? choices(m) : 0;
}

cinfer_status cinfer_model_forward_choose(cinfer_model *m,
                                          const cinfer_step *step,
                                          const cinfer_choice *ch,
                                          int32_t *codes)
{
    static const cinfer_choice greedy_only;
    if (!ch)
        ch = &greedy_only;
    int have = cinfer_model_choices(m);
    const char *what = ch->n_top       ? "logprobs"
                       : ch->n_edits > 0 ? "edited logits"
                       : ch->draws     ? "drawn tokens"
                                       : "greedy tokens";
    if (have == 0 || (ch->draws && have < 2) || (ch->n_edits > 0 && have < 3) ||
        (ch->n_top && have < 4))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "model_forward_choose: %s are not made on "
                                "this model's backend",
                                what);
    if (!codes || (ch->n_top && !ch->logprobs))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_forward_choose: %s is NULL",
                                !codes ? "codes" : "logprobs");
    return forward(m, step, NULL, ch, codes);
}

cinfer_status cinfer_model_follow(cinfer_model *m)
{
    if (!m || !m->group)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "model_follow: the model is not a node of a "
                                "tensor-parallel group");
    return cinfer_model_group_follow(m->group);
}

cinfer_status cinfer_model_eval_single(cinfer_model *m, const int32_t *tokens,
                                       int n, int pos0, int all_logits,
                                       float *logits)
{
    const cinfer_model_info *I = &m->info;
    if (n < 1 || pos0 < 0 || (int64_t)pos0 + n > I->n_ctx)
        return cinfer_set_error(CINFER_E_RANGE,
                                "model: positions %d..%lld exceed the "
                                "context of %d tokens",
                                pos0, (long long)pos0 + n - 1, I->n_ctx);
    if ((int64_t)(pos0 + n + I->block_size - 1) / I->block_size >
        I->n_kv_blocks)
        return cinfer_set_error(CINFER_E_EXHAUSTED,
                                "model: %d tokens do not fit in %d KV blocks",
                                pos0 + n, I->n_kv_blocks);
    int R = m->max_rows;
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)R * 4);
    /* One token after position 0 is the decode of a generated token: its
     * row is marked so attention takes the single-token arithmetic (see
     * cinfer_step.row_gen), as the engine marks generated tokens' rows. */
    uint8_t gen_row = n == 1 && pos0 > 0;
    if (!buf)
        return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
    int32_t *pos = buf, *rs = buf + R, *slots = buf + 2 * R, *outr = buf + 3 * R;
    int32_t seq_table_len = (I->n_ctx + I->block_size - 1) / I->block_size;
    const int32_t bs = I->block_size, W = I->swa_window;
    int32_t *swa_slots = NULL, *swa_tables = NULL;
    if (I->n_swa_blocks) {
        swa_slots = malloc(sizeof(int32_t) * ((size_t)R + (size_t)seq_table_len));
        if (!swa_slots) {
            free(buf);
            return cinfer_set_error(CINFER_E_NOMEM, "model: out of memory");
        }
        swa_tables = swa_slots + R;
    }
    cinfer_status st = CINFER_OK;
    for (int done = 0; done < n;) {
        int c = n - done < R ? n - done : R;
        int32_t start = pos0 + done;
        if (swa_tables) {
            /* Logical block i of the window pool is its block i %
             * n_swa_blocks: the chunk ends where the ring would wrap onto
             * the window of its first row. Blocks before that window are
             * the null block. */
            int32_t lo = start - W + 1 > 0 ? (start - W + 1) / bs : 0;
            int64_t room = (int64_t)(lo + I->n_swa_blocks) * bs - start;
            if (room < c)
                c = (int)room;
            for (int32_t i = 0; i < seq_table_len; i++)
                swa_tables[i] = i < lo ? I->n_swa_blocks
                                       : i % I->n_swa_blocks;
        }
        for (int i = 0; i < c; i++) {
            pos[i] = start + i;
            rs[i] = 0;
            slots[i] = pos[i]; /* block b holds positions b*bs.. */
            if (swa_slots)
                swa_slots[i] = swa_tables[pos[i] / bs] * bs + pos[i] % bs;
            outr[i] = i;
        }
        cinfer_step s = {
            .n_rows = c,
            .n_seqs = 1,
            .block_size = I->block_size,
            .max_blocks = seq_table_len,
            .tokens = tokens + done,
            .positions = pos,
            .row_seq = rs,
            .slots = slots,
            .block_tables = m->single_tables,
            .row_gen = gen_row ? &gen_row : NULL,
            .swa_slots = swa_slots,
            .swa_block_tables = swa_tables,
        };
        float *dst;
        if (all_logits) {
            s.n_out = c;
            s.out_rows = outr;
            dst = logits + (size_t)done * (size_t)I->n_vocab;
        } else {
            s.n_out = 1;
            s.out_rows = &outr[c - 1];
            dst = logits; /* earlier chunks' logits are overwritten */
        }
        st = cinfer_model_forward(m, &s, dst);
        if (st != CINFER_OK)
            break;
        done += c;
    }
    free(swa_slots);
    free(buf);
    return st;
}
