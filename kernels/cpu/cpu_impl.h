/*
 * cpu_impl.h - internals of the CPU backend shared by its source files.
 *
 * cpu_backend.c owns the object: lifecycle, tensors, the step metadata and
 * the argument checks of every op. ops.c holds the arithmetic, run over the
 * thread pool once the arguments are known to be good; the hot inner loops
 * (attention dot products and V sums, exp, half conversions) have one
 * implementation per instruction set (ops.c: portable, ops_avx2.c,
 * ops_avx512.c) behind cinfer_cpu_vec_kernels.
 *
 * Batch invariance: every op splits work only across independent outputs
 * (rows, heads, output columns), and each output is computed by the same
 * sequence of operations whatever the batch, the row's place in it, and the
 * thread count.
 */
#ifndef CINFER_CPU_IMPL_H
#define CINFER_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "../backend_impl.h"
#include "threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CPU tensor: base.data is 64-byte aligned unless a borrowed weight. */
typedef struct {
    struct cinfer_tensor base;    /* first: backend.c reads it */
    int packed;                   /* a weight packed (matmul.h) */
    struct cinfer_cpu_slab *slab; /* where a packed weight's data lives */
} cinfer_cpu_tensor;

/* Whether a CPU tensor is a packed weight. */
static inline int cinfer_cpu_packed(const cinfer_tensor *t)
{
    return ((const cinfer_cpu_tensor *)t)->packed;
}

/* Huge-page memory that packed weights are carved from (cpu_backend.c):
 * the weights of a model are many tensors of a few hundred KiB, which
 * would each waste most of a 2 MiB page on their own. */
typedef struct cinfer_cpu_slab {
    struct cinfer_cpu_slab *next;
    uint8_t *base;
    size_t len, used;
    int live; /* tensors in it */
} cinfer_cpu_slab;

/* Inner loops with one implementation per instruction set. Every ISA
 * computes every output with the same float operations in the same order,
 * so the ISAs agree bit for bit (and the callers may chunk work freely).
 *
 * The arithmetic is GGML's CPU path on an AVX-512 machine (the one
 * llama.cpp takes for this model family with flash attention off), so that
 * logits agree with llama.cpp's bit for bit:
 *   - QK: 16 lanes, lane l accumulating fma(k[d], q[d]) for d = l, l + 16,
 *     ... (q rounded to F16 first when K is F16), then the lanes added in
 *     the tree of GCC's _mm512_reduce_add_ps: (l + l+8), (+ l+4), (+ l+2),
 *     (+ l+1); times scale.
 *   - softmax: max; e = ggml_v_expf(s - max); the sum in double of each
 *     16-position chunk's tree sum; p = e * (float)(1 / sum), rounded to F16
 *     when V is F16.
 *   - PV: 16 lane accumulators per output dimension, position j going to
 *     lane j % 16 with fma(v, p), then the same tree.
 *   - silu(x) = x / (1 + ggml_v_expf(0 - x)).
 * That is GGML's batched path (tinyBLAS). For a single token GGML takes
 * ggml_vec_dot_f16 instead, and rows the step marks as generated use its
 * arithmetic ("dot" below): 64 lanes (four 16-lane registers), element i
 * going to lane i % 64, chained over i / 64; the lanes folded as
 * (r0 + r2) + (r1 + r3) and then the 16-lane tree; elements past the last
 * whole 64 added in double after it. PV uses the same 64-lane scheme over
 * positions.
 */
typedef struct {
    /* scores[j] = tree16(lanes) * scale, lanes as above, j < n; K rows are
     * `stride` elements apart. q already rounded as the caller wants. */
    void (*qk_f32)(const float *q, const float *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores);
    void (*qk_f16)(const float *q, const uint16_t *k, int64_t stride, int n,
                   int head_dim, float scale, float *scores);
    /* The same in the "dot" arithmetic. */
    void (*qk_dot_f32)(const float *q, const float *k, int64_t stride, int n,
                       int head_dim, float scale, float *scores);
    void (*qk_dot_f16)(const float *q, const uint16_t *k, int64_t stride,
                       int n, int head_dim, float scale, float *scores);
    /* s[j] = ggml_v_expf(s[j] - max) for j < n; returns the sum over
     * 16-position chunks (from j = 0) of (double)tree16(chunk). */
    double (*softmax_exp)(float *s, int n, float max);
    /* lanes[((j0 + j) % n_lanes) * head_dim + d] =
     *     fma(v[j * stride + d], p[j], same) for j = 0..n-1 in order;
     * n_lanes is 16 or 64. */
    void (*pv_f32)(float *lanes, int n_lanes, int j0, const float *p,
                   const float *v, int64_t stride, int n, int head_dim);
    void (*pv_f16)(float *lanes, int n_lanes, int j0, const float *p,
                   const uint16_t *v, int64_t stride, int n, int head_dim);
    /* out[d] = tree16(lanes[l * head_dim + d] for l = 0..15) */
    void (*lanes_sum)(const float *lanes, int head_dim, float *out);
    /* out[i] = silu(gate[i]) * up[i] */
    void (*silu_mul)(const float *gate, const float *up, float *out,
                     int64_t n);
    /* dst[i] = f16 of src[i], rounded to nearest even */
    void (*to_f16)(const float *src, uint16_t *dst, int64_t n);
    /* x[i] = the float value of x[i]'s f16 (rounded to nearest even) */
    void (*round_f16)(float *x, int64_t n);
    /* x[i] *= s (one float multiply), then, where `f16` is set, rounded
     * as round_f16 does: a softmax's normalisation */
    void (*scale_rows)(float *x, int64_t n, float s, int f16);
    /* Optional (NULL: the per-block forms above serve). The same arithmetic
     * over a gathered context: K or V row j is rows[j], F16 where `f16` is
     * set, else F32.
     * qk_dot_rows: qk_dot_* for n rows; head_dim a multiple of 64.
     * pv_rows: pv_* over j = 0..n-1 from all-zero lanes, then, for 64
     * lanes, the fold (r0 + r2) + (r1 + r3); writes the 16 resulting lane
     * rows to lanes16 ([16][head_dim]); head_dim a multiple of 16. */
    void (*qk_dot_rows)(const float *q, const void *const *rows, int f16,
                        int n, int head_dim, float scale, float *scores);
    void (*pv_rows)(const void *const *rows, int f16, const float *p, int n,
                    int n_lanes, int head_dim, float *lanes16);
    /* Optional: several queries of one KV head at once (the heads of a
     * group, for one or more rows of one sequence), each with its own
     * context length n[i] <= the rows gathered, in the 16-lane (batched)
     * arithmetic; every query's bits are those of the per-query forms.
     * Each K or V row is loaded (and widened) once for all of them.
     * head_dim a multiple of 16; nq <= CINFER_CPU_ATTN_TILE.
     * qk_tile: scores[i * cs + j] for j < n[i], as qk_*, then -INFINITY
     * for j < lo[i]; max[i] = the largest of scores lo[i] .. n[i] - 1.
     * head_dim <= 256. kt, where not NULL, holds the K rows as the
     * kernel widens and reorders them, head_dim * 16 floats per sixteen
     * positions (rows[0] .. rows[n_max - 1] rounded up to 16): the first
     * *kt_done positions (a multiple of 16) are already there from an
     * earlier call with the same rows, and *kt_done grows to the whole
     * blocks this call wrote, so calls for more queries of one context
     * reorder each K row once.
     * pv_tile: pv_rows with 16 lanes for each p[i] (n[i] positions),
     * into lanes16 + i * 16 * head_dim. */
    void (*qk_tile)(const float *const *q, int nq, const void *const *rows,
                    int f16, const int32_t *n, const int32_t *lo,
                    int head_dim, float scale, float *scores, size_t cs,
                    float *max, float *kt, int32_t *kt_done);
    void (*pv_tile)(const void *const *rows, int f16, const float *const *p,
                    const int32_t *n, int nq, int head_dim, float *lanes16);
} cinfer_cpu_vec_kernels;

/* The most queries qk_tile and pv_tile take at once. */
#define CINFER_CPU_ATTN_TILE 24

extern const cinfer_cpu_vec_kernels cinfer_cpu_vec_portable;

/* GGML's ggml_v_expf for one value (the reference the vector versions
 * reproduce). */
float cinfer_cpu_ggml_expf(float x);
#if defined(__x86_64__) || defined(__i386__)
extern const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx2;
extern const cinfer_cpu_vec_kernels cinfer_cpu_vec_avx512;
#define CINFER_CPU_HAVE_X86 1
#endif

/* A growable 64-byte aligned buffer. */
typedef struct {
    void *p;
    size_t cap;
} cinfer_cpu_buf;

/* Makes b hold at least n_bytes: 0 on success, -1 if out of memory (then b
 * is unchanged). Growing does not keep the contents; it is scratch. */
int cinfer_cpu_buf_reserve(cinfer_cpu_buf *b, size_t n_bytes);
void cinfer_cpu_buf_free(cinfer_cpu_buf *b);

typedef struct {
    cinfer_backend base;
    cinfer_cpu_isa isa;
    int n_threads;
    cinfer_threadpool *pool;
    const cinfer_cpu_vec_kernels *vec;

    /* The step: base.step, checked and copied by backend.c. */

    /* rope's cos/sin table for the current step ([n_rows, rot_dim]); valid
     * until the next set_step. */
    cinfer_cpu_buf rope_buf;
    int rope_valid;
    float rope_theta;
    float rope_scale;
    int rope_dim;
    int rope_has_ff;            /* the table was built with factors: */
    cinfer_cpu_buf rope_ff;     /* a copy of them ([rot_dim / 2]) */

    /* Scratch, grown on demand and reused. */
    cinfer_cpu_buf act[4];       /* prepared matmul activations */
    cinfer_cpu_buf thread_buf;   /* per-thread floats, thread_stride apart */
    size_t thread_stride;        /* floats */
    cinfer_cpu_buf bounds_buf;   /* per-thread work boundaries */

    cinfer_cpu_slab *slabs;      /* newest first; the first takes new weights */
} cinfer_cpu_backend;

/* Makes thread_buf hold n_floats per thread. */
cinfer_status cinfer_cpu_thread_scratch(cinfer_cpu_backend *cb,
                                        size_t n_floats);

/* ---- ops (ops.c): arguments already checked ------------------------- */

void cinfer_cpu_op_embed(cinfer_cpu_backend *cb, const cinfer_tensor *table,
                         const int32_t *tokens, int64_t n, float *out);
void cinfer_cpu_op_rms_norm(cinfer_cpu_backend *cb, const float *x,
                            const float *w, float eps, float *out, int64_t n,
                            int64_t d);
void cinfer_cpu_op_add(cinfer_cpu_backend *cb, const float *a, const float *b,
                       float *out, int64_t n_elems);
void cinfer_cpu_op_add_bias(cinfer_cpu_backend *cb, float *x, const float *b,
                            int64_t n, int64_t d);
void cinfer_cpu_op_silu_mul(cinfer_cpu_backend *cb, const float *gate,
                            const float *up, float *out, int64_t n_elems);
/* out = gelu(gate) * up, GGML's F16-rounded tanh GELU (backend.h). */
void cinfer_cpu_op_gelu_mul(cinfer_cpu_backend *cb, const float *gate,
                            const float *up, float *out, int64_t n_elems);
void cinfer_cpu_op_scale(cinfer_cpu_backend *cb, float *x, float s,
                         int64_t n_elems);
void cinfer_cpu_op_gather_rows(cinfer_cpu_backend *cb, const float *x,
                               const int32_t *rows, int64_t n_out, int64_t d,
                               float *out);
cinfer_status cinfer_cpu_op_rope(cinfer_cpu_backend *cb, float *x,
                                 const int32_t *positions, int64_t n,
                                 int n_heads, int head_dim, int rot_dim,
                                 const cinfer_rope_params *p);
/* Row r of k and v (width floats) goes to cache row slots[r]. */
void cinfer_cpu_op_kv_store(cinfer_cpu_backend *cb, const float *k,
                            const float *v, const int32_t *slots, int64_t n,
                            int64_t width, void *k_cache, cinfer_dtype kdt,
                            void *v_cache, cinfer_dtype vdt);

typedef struct {
    const float *q;      /* [n_rows, n_heads * head_dim] */
    const void *k_cache; /* [n_blocks, block_size, n_kv_heads, head_dim] */
    const void *v_cache;
    cinfer_dtype k_dtype, v_dtype; /* F16 or F32 */
    int n_heads, n_kv_heads, head_dim;
    float scale;
    int window;          /* positions a row sees (SWA); 0 = all */
    const int32_t *block_tables; /* [n_seqs, max_blocks] the step's tables
                                    for this cache (block_tables or
                                    swa_block_tables) */
    float *out;          /* [n_rows, n_heads * head_dim] */
} cinfer_cpu_attn_args;

/* Uses the backend's step for rows and positions, a->block_tables for
 * the blocks. */
cinfer_status cinfer_cpu_op_attention(cinfer_cpu_backend *cb,
                                      const cinfer_cpu_attn_args *a);

/* out[i] = x * w[i]^T for the checked tensors. */
cinfer_status cinfer_cpu_op_matmul(cinfer_cpu_backend *cb, int n_w,
                                   const cinfer_tensor *const *w,
                                   const cinfer_tensor *x,
                                   cinfer_tensor *const *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_CPU_IMPL_H */
