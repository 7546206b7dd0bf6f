/*
 * ops.c - the arithmetic of the CPU backend's ops.
 *
 * Arguments arrive checked (cpu_backend.c). Each op splits its independent
 * outputs (rows, (row, head) pairs, output columns) over the thread pool and
 * computes every output with a fixed sequence of float operations, so a
 * row's result does not depend on the batch it is in or on the thread count.
 * Small ops run on the calling thread alone: waking the pool costs more than
 * a decode-sized row.
 *
 * Numerics are GGML's CPU ops', as llama.cpp runs them on an AVX-512
 * machine, so that logits agree with llama.cpp's bit for bit:
 *   rms_norm  sum of squares in double, in element order; scale in float.
 *   rope      theta_i = pos * base^(-2i/rot_dim) by repeated float products,
 *             the angle freq_scale * (theta_i / freq_factor_i), cosf / sinf
 *             (one table per step, shared by every layer);
 *             x0 cos - x1 sin as fma(x0, cos, -(x1 sin)) and x0 sin + x1 cos
 *             as fma(x0, sin, x1 cos), the contraction GGML's build makes.
 *   silu      x / (1 + ggml_v_expf(-x)).
 *   attention see cpu_impl.h: 16-lane dot products with GCC's reduction
 *             tree, q and the probabilities rounded to F16 against an F16
 *             cache, GGML's vector exp, probabilities normalised before V.
 * Every ISA reproduces the portable arithmetic exactly (the tests check it),
 * so results do not depend on the machine either.
 *
 * This file is compiled for baseline x86-64 (SSE2); the inner loops of
 * attention, exp and the F16 conversions also exist for AVX2 and AVX-512 in
 * ops_avx2.c and ops_avx512.c.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_impl.h"
#include "kernels/dtype.h"
#include "matmul.h"
#include "matmul_impl.h"

/* Below this many elements (or multiply-adds) an op runs on the caller. */
#define INLINE_WORK 16384

static void run(cinfer_cpu_backend *cb, int64_t n_tasks, int64_t work,
                cinfer_parallel_fn fn, void *ctx)
{
    if (n_tasks <= 0)
        return;
    if (work < INLINE_WORK || cb->n_threads == 1)
        fn(ctx, 0, n_tasks, 0);
    else
        cinfer_threadpool_parallel_for(cb->pool, n_tasks, fn, ctx);
}

static float *thread_scratch(cinfer_cpu_backend *cb, int thread)
{
    return (float *)cb->thread_buf.p + (size_t)thread * cb->thread_stride;
}

/* ---------------------------------------------------------------------- */
/* embed                                                                   */
/* ---------------------------------------------------------------------- */

typedef struct {
    cinfer_dtype dt;
    const uint8_t *table;
    size_t row_bytes;
    int64_t vocab;
    int packed;
    const int32_t *tokens;
    int64_t d;
    float *out;
} embed_ctx;

static void embed_rows(void *p, int64_t r0, int64_t r1, int thread)
{
    const embed_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        if (!c->packed) {
            cinfer_dequantize_row(c->dt,
                                  c->table + (size_t)c->tokens[r] * c->row_bytes,
                                  c->out + r * c->d, c->d);
            continue;
        }
        /* A packed table (matmul.h): unpack the row a run of blocks at a
         * time. */
        _Alignas(64) uint8_t blk[4096]; /* a run of blocks (at most 210 bytes each) */
        const int64_t be = cinfer_dtype_block_elems(c->dt);
        const int64_t nb = c->d / be;
        const int64_t step = (int64_t)sizeof blk / (int64_t)cinfer_dtype_row_bytes(c->dt, be);
        for (int64_t b = 0; b < nb; b += step) {
            int64_t e = b + step < nb ? b + step : nb;
            cinfer_cpu_packed_row(c->dt, c->table, c->vocab, c->d, c->tokens[r],
                                  b, e, blk);
            cinfer_dequantize_row(c->dt, blk, c->out + r * c->d + b * be, (e - b) * be);
        }
    }
}

void cinfer_cpu_op_embed(cinfer_cpu_backend *cb, const cinfer_tensor *table,
                         const int32_t *tokens, int64_t n, float *out)
{
    const int64_t d = table->desc.shape[1];
    embed_ctx c = {table->desc.dtype,
                   table->data,
                   cinfer_dtype_row_bytes(table->desc.dtype, d),
                   table->desc.shape[0],
                   cinfer_cpu_packed(table),
                   tokens,
                   d,
                   out};
    run(cb, n, n * d, embed_rows, &c);
}

/* ---------------------------------------------------------------------- */
/* rms_norm                                                                */
/* ---------------------------------------------------------------------- */

typedef struct {
    const float *x, *w;
    float eps;
    float *out;
    int64_t d;
} norm_ctx;

static void norm_rows(void *p, int64_t r0, int64_t r1, int thread)
{
    const norm_ctx *c = p;
    int64_t d = c->d;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * d;
        float *y = c->out + r * d;
        double sum = 0.0;
        for (int64_t i = 0; i < d; i++)
            sum += (double)(x[i] * x[i]);
        const float mean = (float)(sum / (double)d);
        const float scale = 1.0f / sqrtf(mean + c->eps);
        for (int64_t i = 0; i < d; i++)
            y[i] = x[i] * scale * c->w[i];
    }
}

void cinfer_cpu_op_rms_norm(cinfer_cpu_backend *cb, const float *x,
                            const float *w, float eps, float *out, int64_t n,
                            int64_t d)
{
    norm_ctx c = {x, w, eps, out, d};
    run(cb, n, n * d, norm_rows, &c);
}

/* ---------------------------------------------------------------------- */
/* elementwise: add, add_bias, silu_mul                                    */
/* ---------------------------------------------------------------------- */

/* Flat elementwise ops run in chunks of this many elements. */
#define CHUNK 4096

typedef struct {
    const float *a, *b;
    float *out;
    int64_t n;
} ew_ctx;

static void add_chunks(void *p, int64_t t0, int64_t t1, int thread)
{
    const ew_ctx *c = p;
    int64_t i1 = t1 * CHUNK < c->n ? t1 * CHUNK : c->n;
    for (int64_t i = t0 * CHUNK; i < i1; i++)
        c->out[i] = c->a[i] + c->b[i];
}

void cinfer_cpu_op_add(cinfer_cpu_backend *cb, const float *a, const float *b,
                       float *out, int64_t n_elems)
{
    ew_ctx c = {a, b, out, n_elems};
    run(cb, (n_elems + CHUNK - 1) / CHUNK, n_elems, add_chunks, &c);
}

typedef struct {
    const cinfer_cpu_vec_kernels *vk;
    const float *gate, *up;
    float *out;
    int64_t n;
} silu_ctx;

static void silu_chunks(void *p, int64_t t0, int64_t t1, int thread)
{
    const silu_ctx *c = p;
    int64_t i1 = t1 * CHUNK < c->n ? t1 * CHUNK : c->n;
    c->vk->silu_mul(c->gate + t0 * CHUNK, c->up + t0 * CHUNK,
                    c->out + t0 * CHUNK, i1 - t0 * CHUNK);
}

void cinfer_cpu_op_silu_mul(cinfer_cpu_backend *cb, const float *gate,
                            const float *up, float *out, int64_t n_elems)
{
    silu_ctx c = {cb->vec, gate, up, out, n_elems};
    /* exp makes each element cost like several adds */
    run(cb, (n_elems + CHUNK - 1) / CHUNK, n_elems * 4, silu_chunks, &c);
}

/* GGML's ggml_vec_geglu_f32 with GGML_GELU_FP16: the gate through its F16
 * table (gelu of the F16 value, rounded to F16), so each element matches
 * llama.cpp's CPU backend bit for bit. The table is built, as ggml's is,
 * by ggml_gelu_f32 compiled with FMA (as llama.cpp is on every x86-64 with
 * AVX2), where the compiler contracts 1 + a*x*x into one fma: the one
 * entry of (-10, 10) that the uncontracted formula rounds otherwise
 * (gate -1.99902344) was found on Gemma 3 270M, and all 37,376 entries
 * agree with ggml's table this way. Built once (64K entries, 128 KiB),
 * since tanhf per element was a quarter of Gemma's prompt time. */
static uint16_t gelu_table[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void)
{
    const float a = 0.044715f, k = 0.79788456080286535587989211986876f;
    for (uint32_t i = 0; i < (1u << 16); i++) {
        float h = cinfer_fp16_to_fp32((uint16_t)i);
        float g = 0.5f * h * (1.0f + tanhf(k * h * fmaf(a * h, h, 1.0f)));
        gelu_table[i] = cinfer_fp32_to_fp16(g);
    }
}

static float gelu_f16(float x)
{
    if (x <= -10.0f)
        return 0.0f;
    return cinfer_fp16_to_fp32(gelu_table[cinfer_fp32_to_fp16(x)]);
}

static void gelu_chunks(void *p, int64_t t0, int64_t t1, int thread)
{
    const silu_ctx *c = p;
    (void)thread;
    int64_t i1 = t1 * CHUNK < c->n ? t1 * CHUNK : c->n;
    for (int64_t i = t0 * CHUNK; i < i1; i++) {
        float x = c->gate[i];
        c->out[i] = x >= 10.0f ? x * c->up[i] : gelu_f16(x) * c->up[i];
    }
}

void cinfer_cpu_op_gelu_mul(cinfer_cpu_backend *cb, const float *gate,
                            const float *up, float *out, int64_t n_elems)
{
    pthread_once(&gelu_once, gelu_table_init);
    silu_ctx c = {cb->vec, gate, up, out, n_elems};
    run(cb, (n_elems + CHUNK - 1) / CHUNK, n_elems * 4, gelu_chunks, &c);
}

typedef struct {
    float *x;
    float s;
    int64_t n;
} scale_ctx;

static void scale_chunks(void *p, int64_t t0, int64_t t1, int thread)
{
    const scale_ctx *c = p;
    (void)thread;
    int64_t i1 = t1 * CHUNK < c->n ? t1 * CHUNK : c->n;
    for (int64_t i = t0 * CHUNK; i < i1; i++)
        c->x[i] *= c->s;
}

void cinfer_cpu_op_scale(cinfer_cpu_backend *cb, float *x, float s,
                         int64_t n_elems)
{
    scale_ctx c = {x, s, n_elems};
    run(cb, (n_elems + CHUNK - 1) / CHUNK, n_elems, scale_chunks, &c);
}

typedef struct {
    float *x;
    const float *b;
    int64_t d;
} bias_ctx;

static void bias_rows(void *p, int64_t r0, int64_t r1, int thread)
{
    const bias_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        float *x = c->x + r * c->d;
        for (int64_t i = 0; i < c->d; i++)
            x[i] += c->b[i];
    }
}

void cinfer_cpu_op_add_bias(cinfer_cpu_backend *cb, float *x, const float *b,
                            int64_t n, int64_t d)
{
    bias_ctx c = {x, b, d};
    run(cb, n, n * d, bias_rows, &c);
}

/* ---------------------------------------------------------------------- */
/* gather_rows                                                             */
/* ---------------------------------------------------------------------- */

typedef struct {
    const float *x;
    const int32_t *rows;
    int64_t d;
    float *out;
} gather_ctx;

static void gather_part(void *p, int64_t j0, int64_t j1, int thread)
{
    const gather_ctx *c = p;
    for (int64_t j = j0; j < j1; j++)
        memcpy(c->out + j * c->d, c->x + (int64_t)c->rows[j] * c->d,
               (size_t)c->d * sizeof(float));
}

void cinfer_cpu_op_gather_rows(cinfer_cpu_backend *cb, const float *x,
                               const int32_t *rows, int64_t n_out, int64_t d,
                               float *out)
{
    gather_ctx c = {x, rows, d, out};
    run(cb, n_out, n_out * d, gather_part, &c);
}

/* ---------------------------------------------------------------------- */
/* rope                                                                    */
/* ---------------------------------------------------------------------- */

/* The cos/sin table of a step (row r: rot_dim floats, cos and sin of each
 * pair) depends only on the positions, theta and rot_dim, so it is built by
 * the first rope of a step and reused by the others (two per layer). */

typedef struct {
    float *x;
    float *table;
    const int32_t *positions;
    int n_heads, head_dim, rot_dim;
    float theta_scale;
    float freq_scale;
    const float *ff; /* [rot_dim / 2] or NULL */
    cinfer_rope_mode mode;
    int fill; /* build the table rows first */
} rope_ctx;

static void rope_rows(void *p, int64_t r0, int64_t r1, int thread)
{
    const rope_ctx *c = p;
    const int n_pairs = c->rot_dim / 2;
    const int64_t width = (int64_t)c->n_heads * c->head_dim;
    /* NORM pairs (x[2i], x[2i+1]); NEOX pairs (x[i], x[i + n/2]) */
    const int stride = c->mode == CINFER_ROPE_NORM ? 2 : 1;
    const int offset = c->mode == CINFER_ROPE_NORM ? 1 : n_pairs;
    for (int64_t r = r0; r < r1; r++) {
        float *cs = c->table + r * c->rot_dim;
        if (c->fill) {
            float theta = (float)c->positions[r];
            for (int i = 0; i < n_pairs; i++) {
                /* GGML's rope_yarn at ext_factor 0: the factor divides,
                 * then freq_scale multiplies (both exact when 1) */
                const float ff = c->ff ? c->ff[i] : 1.0f;
                const float a = c->freq_scale * (theta / ff);
                cs[2 * i] = cosf(a);
                cs[2 * i + 1] = sinf(a);
                theta *= c->theta_scale;
            }
        }
        for (int h = 0; h < c->n_heads; h++) {
            float *x = c->x + r * width + (int64_t)h * c->head_dim;
            for (int i = 0; i < n_pairs; i++) {
                float *e = x + i * stride;
                const float cos_t = cs[2 * i], sin_t = cs[2 * i + 1];
                const float x0 = e[0], x1 = e[offset];
                /* the contraction GGML's compiled rope performs */
                e[0] = fmaf(x0, cos_t, -(x1 * sin_t));
                e[offset] = fmaf(x0, sin_t, x1 * cos_t);
            }
        }
    }
}

/* 1 if the step's table was built for these angles. */
static int rope_table_fits(const cinfer_cpu_backend *cb, int rot_dim,
                           const cinfer_rope_params *p)
{
    if (!cb->rope_valid || cb->rope_theta != p->theta ||
        cb->rope_scale != p->freq_scale || cb->rope_dim != rot_dim ||
        cb->rope_has_ff != (p->freq_factors != NULL))
        return 0;
    return !p->freq_factors ||
           memcmp(cb->rope_ff.p, p->freq_factors,
                  sizeof(float) * (size_t)(rot_dim / 2)) == 0;
}

cinfer_status cinfer_cpu_op_rope(cinfer_cpu_backend *cb, float *x,
                                 const int32_t *positions, int64_t n,
                                 int n_heads, int head_dim, int rot_dim,
                                 const cinfer_rope_params *p)
{
    int fill = !rope_table_fits(cb, rot_dim, p);
    if (fill) {
        cb->rope_valid = 0;
        if (cinfer_cpu_buf_reserve(&cb->rope_buf, sizeof(float) * (size_t)n *
                                                      (size_t)rot_dim) != 0 ||
            (p->freq_factors &&
             cinfer_cpu_buf_reserve(&cb->rope_ff, sizeof(float) *
                                                      (size_t)(rot_dim / 2)) !=
                 0))
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "rope: no memory for the cos/sin table");
        if (p->freq_factors)
            memcpy(cb->rope_ff.p, p->freq_factors,
                   sizeof(float) * (size_t)(rot_dim / 2));
    }
    rope_ctx c = {x,
                  cb->rope_buf.p,
                  positions,
                  n_heads,
                  head_dim,
                  rot_dim,
                  powf(p->theta, -2.0f / (float)rot_dim),
                  p->freq_scale,
                  p->freq_factors,
                  p->mode,
                  fill};
    run(cb, n, n * (int64_t)n_heads * rot_dim * (fill ? 2 : 1), rope_rows, &c);
    cb->rope_valid = 1;
    cb->rope_theta = p->theta;
    cb->rope_scale = p->freq_scale;
    cb->rope_dim = rot_dim;
    cb->rope_has_ff = p->freq_factors != NULL;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* kv_store                                                                */
/* ---------------------------------------------------------------------- */

typedef struct {
    const cinfer_cpu_vec_kernels *vk;
    const float *k, *v;
    const int32_t *slots;
    int64_t width;
    void *kc, *vc;
    cinfer_dtype kdt, vdt;
} kv_ctx;

static void store_row(const kv_ctx *c, const float *src, void *cache,
                      cinfer_dtype dt, int64_t slot)
{
    if (dt == CINFER_DTYPE_F32)
        memcpy((float *)cache + slot * c->width, src, (size_t)c->width * 4);
    else
        c->vk->to_f16(src, (uint16_t *)cache + slot * c->width, c->width);
}

static void kv_rows(void *p, int64_t r0, int64_t r1, int thread)
{
    const kv_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        store_row(c, c->k + r * c->width, c->kc, c->kdt, c->slots[r]);
        store_row(c, c->v + r * c->width, c->vc, c->vdt, c->slots[r]);
    }
}

void cinfer_cpu_op_kv_store(cinfer_cpu_backend *cb, const float *k,
                            const float *v, const int32_t *slots, int64_t n,
                            int64_t width, void *k_cache, cinfer_dtype kdt,
                            void *v_cache, cinfer_dtype vdt)
{
    kv_ctx c = {cb->vec, k, v, slots, width, k_cache, v_cache, kdt, vdt};
    run(cb, n, n * width * 2, kv_rows, &c);
}

/* ---------------------------------------------------------------------- */
/* attention                                                               */
/* ---------------------------------------------------------------------- */

/* Portable inner loops: the reference arithmetic every ISA reproduces
 * (cpu_impl.h). */

/* The lane tree of GCC's _mm512_reduce_add_ps. */
static float tree16(const float *v)
{
    float t8[8], t4[4];
    for (int i = 0; i < 8; i++)
        t8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++)
        t4[i] = t8[i] + t8[i + 4];
    return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

/* 2^e as a float, e in [-126, 127]. */
static float pow2i(int e)
{
    uint32_t u = (uint32_t)(e + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* GGML's ggml_v_expf, one lane: exp(x) from a degree-5 polynomial on
 * x - n ln2 scaled by 2^n. The scaling by 2^n is done as two exact-power
 * multiplies, the first exact, so it rounds once as vscalefps does. */
float cinfer_cpu_ggml_expf(float x)
{
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                              fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                         u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (isnan(n))
        return j; /* NaN in, NaN out */
    if (fabsf(n) > 192.0f)
        return n <= 0.0f ? 0.0f : INFINITY;
    int ni = (int)n, n1 = ni >> 1;
    return (j * pow2i(n1)) * pow2i(ni - n1);
}

static void qk_f32_portable(const float *q, const float *k, int64_t stride,
                            int n, int head_dim, float scale, float *scores)
{
    for (int j = 0; j < n; j++) {
        const float *kj = k + j * stride;
        float lane[16] = {0};
        for (int d = 0; d < head_dim; d++)
            lane[d & 15] = fmaf(kj[d], q[d], lane[d & 15]);
        scores[j] = tree16(lane) * scale;
    }
}

static void qk_f16_portable(const float *q, const uint16_t *k, int64_t stride,
                            int n, int head_dim, float scale, float *scores)
{
    for (int j = 0; j < n; j++) {
        const uint16_t *kj = k + j * stride;
        float lane[16] = {0};
        for (int d = 0; d < head_dim; d++)
            lane[d & 15] =
                fmaf(cinfer_fp16_to_fp32(kj[d]), q[d], lane[d & 15]);
        scores[j] = tree16(lane) * scale;
    }
}

/* The 64-lane fold of the "dot" arithmetic: (r0 + r2) + (r1 + r3). */
static float fold64(const float *v)
{
    float t[16];
    for (int l = 0; l < 16; l++)
        t[l] = (v[l] + v[l + 32]) + (v[l + 16] + v[l + 48]);
    return tree16(t);
}

static void qk_dot_f32_portable(const float *q, const float *k, int64_t stride,
                                int n, int head_dim, float scale,
                                float *scores)
{
    const int d64 = head_dim & ~63;
    for (int j = 0; j < n; j++) {
        const float *kj = k + j * stride;
        float lane[64] = {0};
        for (int d = 0; d < d64; d++)
            lane[d & 63] = fmaf(kj[d], q[d], lane[d & 63]);
        double sum = (double)fold64(lane);
        for (int d = d64; d < head_dim; d++)
            sum += (double)(kj[d] * q[d]);
        scores[j] = (float)sum * scale;
    }
}

static void qk_dot_f16_portable(const float *q, const uint16_t *k,
                                int64_t stride, int n, int head_dim,
                                float scale, float *scores)
{
    const int d64 = head_dim & ~63;
    for (int j = 0; j < n; j++) {
        const uint16_t *kj = k + j * stride;
        float lane[64] = {0};
        for (int d = 0; d < d64; d++)
            lane[d & 63] =
                fmaf(cinfer_fp16_to_fp32(kj[d]), q[d], lane[d & 63]);
        double sum = (double)fold64(lane);
        for (int d = d64; d < head_dim; d++)
            sum += (double)(cinfer_fp16_to_fp32(kj[d]) * q[d]);
        scores[j] = (float)sum * scale;
    }
}

static double softmax_exp_portable(float *s, int n, float max)
{
    double sum = 0.0;
    for (int j0 = 0; j0 < n; j0 += 16) {
        float e[16] = {0};
        for (int l = 0; l < 16 && j0 + l < n; l++) {
            e[l] = cinfer_cpu_ggml_expf(s[j0 + l] - max);
            s[j0 + l] = e[l];
        }
        sum += (double)tree16(e);
    }
    return sum;
}

static void pv_f32_portable(float *lanes, int n_lanes, int j0, const float *p,
                            const float *v, int64_t stride, int n,
                            int head_dim)
{
    for (int j = 0; j < n; j++) {
        float *l = lanes + (size_t)((j0 + j) & (n_lanes - 1)) * (size_t)head_dim;
        const float *vj = v + j * stride;
        for (int d = 0; d < head_dim; d++)
            l[d] = fmaf(vj[d], p[j], l[d]);
    }
}

static void pv_f16_portable(float *lanes, int n_lanes, int j0, const float *p,
                            const uint16_t *v, int64_t stride, int n,
                            int head_dim)
{
    for (int j = 0; j < n; j++) {
        float *l = lanes + (size_t)((j0 + j) & (n_lanes - 1)) * (size_t)head_dim;
        const uint16_t *vj = v + j * stride;
        for (int d = 0; d < head_dim; d++)
            l[d] = fmaf(cinfer_fp16_to_fp32(vj[d]), p[j], l[d]);
    }
}

static void lanes_sum_portable(const float *lanes, int head_dim, float *out)
{
    for (int d = 0; d < head_dim; d++) {
        float v[16];
        for (int l = 0; l < 16; l++)
            v[l] = lanes[l * head_dim + d];
        out[d] = tree16(v);
    }
}

static void silu_mul_portable(const float *gate, const float *up, float *out,
                              int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + cinfer_cpu_ggml_expf(0.0f - g)) * up[i];
    }
}

static void to_f16_portable(const float *src, uint16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = cinfer_fp32_to_fp16(src[i]);
}

static void round_f16_portable(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = cinfer_fp16_to_fp32(cinfer_fp32_to_fp16(x[i]));
}

static void scale_rows_portable(float *x, int64_t n, float s, int f16)
{
    for (int64_t i = 0; i < n; i++)
        x[i] *= s;
    if (f16)
        round_f16_portable(x, n);
}

const cinfer_cpu_vec_kernels cinfer_cpu_vec_portable = {
    qk_f32_portable,     qk_f16_portable,      qk_dot_f32_portable,
    qk_dot_f16_portable, softmax_exp_portable, pv_f32_portable,
    pv_f16_portable,     lanes_sum_portable,   silu_mul_portable,
    to_f16_portable,     round_f16_portable,   scale_rows_portable,
    NULL,                NULL,                 NULL,
    NULL,
};

/*
 * Attention. The unit of work is a (row, query head) pair; a thread takes a
 * contiguous run of them (KV head first, then row, then the heads of the
 * group) and handles the heads of a run that share a KV head together,
 * and, where the ISA has qk_tile / pv_tile, consecutive prompt rows of one
 * sequence too. Per pair the arithmetic is fixed (cpu_impl.h): it does not
 * depend on the grouping, the thread, or the batch.
 */

/* Work of one (row, head) pair: its context length plus a fixed overhead. */
#define ATTN_PAIR_OVERHEAD 8

typedef struct {
    cinfer_cpu_backend *cb;
    const cinfer_cpu_attn_args *a;
    const cinfer_step *s;
    const int64_t *bounds; /* [n_parts + 1] flat (row, head) indices */
    int group;             /* query heads per KV head */
    size_t ctx_stride;     /* floats per head of scores */
    int tile;              /* qk_tile / pv_tile serve runs of rows */
    size_t kt_offset;      /* floats from a thread's scratch to its kt */
} attn_ctx;

/* A thread's reordered K rows (qk_tile's kt) for one sequence's KV head
 * in one attention call: the tiles of a prefill chunk share them. */
typedef struct {
    float *kt;
    int32_t seq, g, done;
} attn_kt;

/* Query heads [h0, h1) of row r, all of KV head h0 / group. */
static void attend(const attn_ctx *c, int64_t r, int h0, int h1, float *ws)
{
    const cinfer_cpu_attn_args *a = c->a;
    const cinfer_step *s = c->s;
    const cinfer_cpu_vec_kernels *vk = c->cb->vec;
    const int hd = a->head_dim, bs = s->block_size, nq = h1 - h0;
    const int32_t len = s->positions[r] + 1;
    const int32_t lo = a->window > 0 && len > a->window ? len - a->window : 0;
    const int32_t *bt = a->block_tables + (int64_t)s->row_seq[r] * s->max_blocks;
    const int g = h0 / c->group;
    const int64_t kv_stride = (int64_t)a->n_kv_heads * hd;
    const int64_t block_elems = (int64_t)bs * kv_stride;
    const size_t cs = c->ctx_stride;
    const int k16 = a->k_dtype == CINFER_DTYPE_F16;
    const int v16 = a->v_dtype == CINFER_DTYPE_F16;
    /* a generated token's row: GGML's single-token ("dot") arithmetic */
    const int dot = s->row_gen && s->row_gen[r];
    const int n_lanes = dot ? 64 : 16;
    /* the context's K and V rows, gathered for the kernels that take them */
    const void **krows = (const void **)(void *)ws; /* [ctx_stride] */
    const void **vrows = krows + cs;                /* [ctx_stride] */
    float *scores = ws + 4 * cs;               /* [group][ctx_stride] */
    float *lanes = scores + (size_t)c->group * cs; /* [64][hd] */
    float *qr = lanes + (size_t)64 * hd;       /* [hd] */
    const int qk_rows = dot && vk->qk_dot_rows && hd % 64 == 0;
    const int pv_rows = vk->pv_rows && hd % 16 == 0;
    if (qk_rows || pv_rows) {
        const size_t ke = k16 ? 2 : 4, ve = v16 ? 2 : 4;
        for (int32_t j = 0; j < len; j++) {
            int64_t at = (int64_t)bt[j / bs] * block_elems + (int64_t)g * hd +
                         (int64_t)(j % bs) * kv_stride;
            krows[j] = (const char *)a->k_cache + (size_t)at * ke;
            vrows[j] = (const char *)a->v_cache + (size_t)at * ve;
        }
    }

    for (int i = 0; i < nq; i++) {
        const float *q = a->q + (r * a->n_heads + h0 + i) * (int64_t)hd;
        float *sc = scores + i * cs;
        /* GGML multiplies F16 K by q converted to F16 */
        if (k16) {
            memcpy(qr, q, sizeof(float) * (size_t)hd);
            vk->round_f16(qr, hd);
        }
        if (qk_rows)
            vk->qk_dot_rows(k16 ? qr : q, krows, k16, len, hd, a->scale, sc);
        for (int32_t j0 = 0, bi = 0; j0 < len && !qk_rows; j0 += bs, bi++) {
            int n = len - j0 < bs ? len - j0 : bs;
            int64_t base = (int64_t)bt[bi] * block_elems + (int64_t)g * hd;
            if (k16)
                (dot ? vk->qk_dot_f16 : vk->qk_f16)(
                    qr, (const uint16_t *)a->k_cache + base, kv_stride, n, hd,
                    a->scale, sc + j0);
            else
                (dot ? vk->qk_dot_f32 : vk->qk_f32)(
                    q, (const float *)a->k_cache + base, kv_stride, n, hd,
                    a->scale, sc + j0);
        }
        /* a sliding window hides the keys p1 - p0 >= window before the
         * softmax, as GGML's -INF mask does (their exp is exactly 0) */
        for (int32_t j = 0; j < lo; j++)
            sc[j] = -INFINITY;
        float max = -INFINITY;
        for (int32_t j = lo; j < len; j++)
            max = sc[j] > max ? sc[j] : max;
        double sum = vk->softmax_exp(sc, len, max);
        /* GGML multiplies F16 V by the probabilities in F16 */
        vk->scale_rows(sc, len, (float)(1.0 / sum), v16);

        if (pv_rows) {
            vk->pv_rows(vrows, v16, sc, len, n_lanes, hd, lanes);
            vk->lanes_sum(lanes, hd,
                          a->out + (r * a->n_heads + h0 + i) * (int64_t)hd);
            continue;
        }
        memset(lanes, 0, sizeof(float) * (size_t)n_lanes * (size_t)hd);
        for (int32_t j0 = 0, bi = 0; j0 < len; j0 += bs, bi++) {
            int n = len - j0 < bs ? len - j0 : bs;
            int64_t base = (int64_t)bt[bi] * block_elems + (int64_t)g * hd;
            if (v16)
                vk->pv_f16(lanes, n_lanes, j0, sc + j0,
                           (const uint16_t *)a->v_cache + base, kv_stride, n,
                           hd);
            else
                vk->pv_f32(lanes, n_lanes, j0, sc + j0,
                           (const float *)a->v_cache + base, kv_stride, n, hd);
        }
        if (dot) /* fold 64 lanes to 16: (r0 + r2) + (r1 + r3) */
            for (size_t e = 0; e < (size_t)16 * hd; e++)
                lanes[e] = (lanes[e] + lanes[e + 32 * (size_t)hd]) +
                           (lanes[e + 16 * (size_t)hd] +
                            lanes[e + 48 * (size_t)hd]);
        vk->lanes_sum(lanes, hd,
                      a->out + (r * a->n_heads + h0 + i) * (int64_t)hd);
    }
}

/* Rows r0 .. r0 + nr - 1 of one sequence (none generated), all query
 * heads of KV head g, through qk_tile / pv_tile: every K and V row of the
 * context is read once for the nr * group queries. Each query's
 * arithmetic is attend's (the batched form), so its bits do not change. */
static void attend_tile(const attn_ctx *c, int64_t r0, int nr, int g, float *ws,
                        attn_kt *kc)
{
    const cinfer_cpu_attn_args *a = c->a;
    const cinfer_step *s = c->s;
    const cinfer_cpu_vec_kernels *vk = c->cb->vec;
    const int hd = a->head_dim, bs = s->block_size, grp = c->group;
    const int nq = nr * grp;
    const int32_t *bt = a->block_tables + (int64_t)s->row_seq[r0] * s->max_blocks;
    const int64_t kv_stride = (int64_t)a->n_kv_heads * hd;
    const int64_t block_elems = (int64_t)bs * kv_stride;
    const size_t cs = c->ctx_stride;
    const int k16 = a->k_dtype == CINFER_DTYPE_F16;
    const int v16 = a->v_dtype == CINFER_DTYPE_F16;
    const void **krows = (const void **)(void *)ws; /* [ctx_stride] */
    const void **vrows = krows + cs;                /* [ctx_stride] */
    float *scores = ws + 4 * cs;                    /* [nq][ctx_stride] */
    float *lanes = scores + (size_t)nq * cs;        /* [nq][16][hd] */
    float *qr = lanes + (size_t)nq * 16 * hd;       /* [nq][hd] */
    int32_t n[CINFER_CPU_ATTN_TILE] = {0}, lo[CINFER_CPU_ATTN_TILE] = {0};
    const float *qp[CINFER_CPU_ATTN_TILE] = {0}, *pp[CINFER_CPU_ATTN_TILE] = {0};
    int32_t len = 0;
    for (int t = 0; t < nr; t++) {
        const int32_t lt = s->positions[r0 + t] + 1;
        len = lt > len ? lt : len;
        for (int i = 0; i < grp; i++) {
            const int qi = t * grp + i;
            n[qi] = lt;
            lo[qi] = a->window > 0 && lt > a->window ? lt - a->window : 0;
            const float *q = a->q + ((r0 + t) * a->n_heads + g * grp + i) * (int64_t)hd;
            if (k16) { /* GGML multiplies F16 K by q converted to F16 */
                memcpy(qr + (size_t)qi * hd, q, sizeof(float) * (size_t)hd);
                vk->round_f16(qr + (size_t)qi * hd, hd);
                q = qr + (size_t)qi * hd;
            }
            qp[qi] = q;
            pp[qi] = scores + (size_t)qi * cs;
        }
    }
    const size_t ke = k16 ? 2 : 4, ve = v16 ? 2 : 4;
    for (int32_t j0 = 0, bi = 0; j0 < len; j0 += bs, bi++) {
        const int32_t m = len - j0 < bs ? len - j0 : bs;
        const int64_t base = (int64_t)bt[bi] * block_elems + (int64_t)g * hd;
        for (int32_t o = 0; o < m; o++) {
            const int64_t at = base + (int64_t)o * kv_stride;
            krows[j0 + o] = (const char *)a->k_cache + (size_t)at * ke;
            vrows[j0 + o] = (const char *)a->v_cache + (size_t)at * ve;
        }
    }
    float maxes[CINFER_CPU_ATTN_TILE];
    if (kc->seq != s->row_seq[r0] || kc->g != g) {
        kc->seq = s->row_seq[r0];
        kc->g = g;
        kc->done = 0;
    }
    vk->qk_tile(qp, nq, krows, k16, n, lo, hd, a->scale, scores, cs, maxes,
                kc->kt, &kc->done);
    for (int qi = 0; qi < nq; qi++) {
        float *sc = scores + (size_t)qi * cs;
        double sum = vk->softmax_exp(sc, n[qi], maxes[qi]);
        vk->scale_rows(sc, n[qi], (float)(1.0 / sum), v16);
    }
    vk->pv_tile(vrows, v16, pp, n, nq, hd, lanes);
    for (int t = 0; t < nr; t++)
        for (int i = 0; i < grp; i++)
            vk->lanes_sum(lanes + (size_t)(t * grp + i) * 16 * hd, hd,
                          a->out + ((r0 + t) * a->n_heads + g * grp + i) * (int64_t)hd);
}

/* The work is flattened KV head first, (g, row, head in the group), so a
 * thread's run holds consecutive rows of each KV head: rows of one
 * sequence's prefill chunk then go through attend_tile together. */
static void attn_parts(void *p, int64_t t0, int64_t t1, int thread)
{
    const attn_ctx *c = p;
    const cinfer_step *s = c->s;
    float *ws = thread_scratch(c->cb, thread);
    attn_kt kc = {(float *)(((uintptr_t)(ws + c->kt_offset) + 63) & ~(uintptr_t)63),
                  -1, -1, 0};
    const int grp = c->group;
    const int64_t per_g = (int64_t)s->n_rows * grp;
    const int max_rows = c->tile ? CINFER_CPU_ATTN_TILE / grp : 0;
    for (int64_t t = t0; t < t1; t++) {
        int64_t f = c->bounds[t], end = c->bounds[t + 1];
        while (f < end) {
            const int g = (int)(f / per_g);
            const int64_t r = f % per_g / grp;
            const int i0 = (int)(f % grp);
            int nr = 0;
            if (i0 == 0 && max_rows > 0 && !(s->row_gen && s->row_gen[r]))
                while (nr < max_rows && r + nr < s->n_rows &&
                       f + (int64_t)(nr + 1) * grp <= end &&
                       s->row_seq[r + nr] == s->row_seq[r] &&
                       !(s->row_gen && s->row_gen[r + nr]))
                    nr++;
            if (nr > 0) {
                attend_tile(c, r, nr, g, ws, &kc);
                f += (int64_t)nr * grp;
                continue;
            }
            int i1 = grp;
            if (i1 - i0 > end - f)
                i1 = i0 + (int)(end - f);
            attend(c, r, g * grp + i0, g * grp + i1, ws);
            f += i1 - i0;
        }
    }
}

cinfer_status cinfer_cpu_op_attention(cinfer_cpu_backend *cb,
                                      const cinfer_cpu_attn_args *a)
{
    const cinfer_step *s = &cb->base.step;
    int group = a->n_heads / a->n_kv_heads;
    size_t ctx = ((size_t)cb->base.max_position + 1 + 15) & ~(size_t)15;
    size_t hd = (size_t)a->head_dim;
    /* the tiled form: a whole group fits, and head_dim suits its kernels */
    const int tile = cb->vec->qk_tile && cb->vec->pv_tile &&
                     group <= CINFER_CPU_ATTN_TILE && hd % 16 == 0 && hd <= 256;
    const size_t nq = tile ? CINFER_CPU_ATTN_TILE : 0;
    size_t per_ctx = (size_t)group > nq ? (size_t)group : nq;
    size_t per_hd = 65 > 17 * nq ? 65 : 17 * nq;
    const size_t kt_offset = (per_ctx + 4) * ctx + per_hd * hd;
    /* the tiles' kt: every context position's K row, 64-byte aligned */
    cinfer_status st = cinfer_cpu_thread_scratch(
        cb, kt_offset + (tile ? ctx * hd + 16 : 0));
    if (st != CINFER_OK)
        return st;
    int n_parts = cb->n_threads;
    if (cinfer_cpu_buf_reserve(&cb->bounds_buf,
                               (size_t)(n_parts + 1) * sizeof(int64_t)) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "attention: no memory");
    int64_t *bounds = cb->bounds_buf.p;

    /* Split the (KV head, row, head) units, in that order, into n_parts
     * runs of about equal work: rows late in a prefill chunk see longer
     * contexts. */
    const int64_t nkv = a->n_kv_heads;
    int64_t per_g = 0;
    for (int32_t r = 0; r < s->n_rows; r++)
        per_g += (s->positions[r] + 1 + ATTN_PAIR_OVERHEAD) * group;
    const int64_t total = per_g * nkv;
    bounds[0] = 0;
    int part = 1;
    int64_t before = 0; /* work of the units before (g, r) */
    for (int64_t u = 0; u < nkv * s->n_rows && part < n_parts; u++) {
        const int32_t r = (int32_t)(u % s->n_rows);
        int64_t cost = s->positions[r] + 1 + ATTN_PAIR_OVERHEAD;
        while (part < n_parts) {
            int64_t target = total * part / n_parts;
            if (target > before + cost * group)
                break;
            int64_t h = (target - before + cost - 1) / cost;
            bounds[part++] = u * group + h;
        }
        before += cost * group;
    }
    for (; part <= n_parts; part++)
        bounds[part] = nkv * s->n_rows * group;

    attn_ctx c = {cb, a, s, bounds, group, ctx, tile, kt_offset};
    run(cb, n_parts, total * a->head_dim, attn_parts, &c);
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* matmul                                                                  */
/* ---------------------------------------------------------------------- */

/* Output columns are split in units of this many (kernels tile by 16). */
#define MM_UNIT 16

typedef struct {
    cinfer_cpu_backend *cb;
    int n_w;
    const float *x;
    int64_t n, n_in;
    int n_act;                   /* distinct activation formats to prepare */
    cinfer_dtype act_type[4];    /* per distinct format */
    void *act_buf[4];
    const void *w_act[4];        /* per weight: its prepared activations */
    cinfer_dtype wt[4];
    const void *w_data[4];
    int w_packed[4];             /* packed (matmul.h) */
    size_t w_row_bytes[4];
    float *out[4];
    int64_t n_out[4];
    int64_t unit0[5];            /* first unit of each weight */
} mm_ctx;

static void mm_prepare(void *p, int64_t r0, int64_t r1, int thread)
{
    const mm_ctx *c = p;
    for (int k = 0; k < c->n_act; k++)
        cinfer_cpu_matmul_prepare(c->cb->isa, c->act_type[k], c->x, c->n_in,
                                  r0, r1, c->act_buf[k]);
}

static void mm_compute(void *p, int64_t u0, int64_t u1, int thread)
{
    const mm_ctx *c = p;
    for (int i = 0; i < c->n_w; i++) {
        int64_t a = u0 > c->unit0[i] ? u0 : c->unit0[i];
        int64_t b = u1 < c->unit0[i + 1] ? u1 : c->unit0[i + 1];
        if (a >= b)
            continue;
        int64_t o0 = (a - c->unit0[i]) * MM_UNIT;
        int64_t o1 = (b - c->unit0[i]) * MM_UNIT;
        if (o1 > c->n_out[i])
            o1 = c->n_out[i];
#ifdef CINFER_MATMUL_HAVE_AVX512
        if (c->w_packed[i]) {
            cinfer_cpu_matmul_compute_packed_avx512(c->wt[i], c->w_data[i], c->n_out[i],
                                                 c->w_act[i], c->n, c->n_in,
                                                 c->out[i], c->n_out[i], o0, o1);
            continue;
        }
#endif
        cinfer_cpu_matmul_compute(c->cb->isa, c->wt[i], c->w_data[i],
                                  c->w_row_bytes[i], c->w_act[i], c->n,
                                  c->n_in, c->out[i], c->n_out[i], o0, o1);
    }
}

/* Output units are handed out in chunks from a shared counter rather than
 * split statically: a thread that loses its core for a while (a shared
 * machine) then delays the op by one chunk, not by its whole share. Which
 * thread computes a column does not change its bits. */
typedef struct {
    mm_ctx *c;
    _Atomic int64_t next;
    int64_t total, chunk;
} mm_dyn_ctx;

static void mm_dynamic(void *p, int64_t t0, int64_t t1, int thread)
{
    mm_dyn_ctx *d = p;
    (void)t0;
    (void)t1;
    for (;;) {
        int64_t u0 = atomic_fetch_add_explicit(&d->next, d->chunk,
                                               memory_order_relaxed);
        if (u0 >= d->total)
            break;
        int64_t u1 = u0 + d->chunk < d->total ? u0 + d->chunk : d->total;
        mm_compute(d->c, u0, u1, thread);
    }
}

cinfer_status cinfer_cpu_op_matmul(cinfer_cpu_backend *cb, int n_w,
                                   const cinfer_tensor *const *w,
                                   const cinfer_tensor *x,
                                   cinfer_tensor *const *out)
{
    mm_ctx c;
    memset(&c, 0, sizeof c);
    c.cb = cb;
    c.n_w = n_w;
    c.x = x->data;
    c.n = x->desc.shape[0];
    c.n_in = x->desc.shape[1];

    int64_t macs = 0;
    for (int i = 0; i < n_w; i++) {
        cinfer_dtype wt = w[i]->desc.dtype;
        cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
        size_t act_row = cinfer_dtype_row_bytes(at, c.n_in);
        if (act_row == 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "matmul: n_in %lld is not a whole number "
                                    "of %s blocks",
                                    (long long)c.n_in, cinfer_dtype_name(at));
        c.wt[i] = wt;
        c.w_data[i] = w[i]->data;
        c.w_packed[i] = cinfer_cpu_packed(w[i]);
        c.w_row_bytes[i] = cinfer_dtype_row_bytes(wt, c.n_in);
        c.out[i] = out[i]->data;
        c.n_out[i] = w[i]->desc.shape[0];
        c.unit0[i + 1] = c.unit0[i] + (c.n_out[i] + MM_UNIT - 1) / MM_UNIT;
        macs += c.n * c.n_in * c.n_out[i];

        if (at == CINFER_DTYPE_F32) {
            c.w_act[i] = c.x; /* the F32 format is x itself */
            continue;
        }
        int k = 0;
        while (k < c.n_act && c.act_type[k] != at)
            k++;
        if (k == c.n_act) {
            if (cinfer_cpu_buf_reserve(&cb->act[k], act_row * (size_t)c.n) != 0)
                return cinfer_set_error(CINFER_E_NOMEM,
                                        "matmul: no memory for %lld prepared "
                                        "rows",
                                        (long long)c.n);
            c.act_type[k] = at;
            c.act_buf[k] = cb->act[k].p;
            c.n_act++;
        }
        c.w_act[i] = c.act_buf[k];
    }
    if (c.n_act > 0)
        run(cb, c.n, c.n * c.n_in * c.n_act, mm_prepare, &c);
    mm_dyn_ctx d = {&c, 0, c.unit0[n_w], 1};
    /* A few rows (decode) stream the weights once and are bound by
     * memory: every chunk restarts the kernels' weight prefetch, and fine
     * chunks made them up to a quarter slower, so one chunk on one thread,
     * two per thread otherwise. More rows are bound by compute: about
     * eight chunks per thread keep the threads balanced. */
    if (c.n <= 4)
        d.chunk = cb->n_threads == 1 ? d.total
                                     : d.total / ((int64_t)cb->n_threads * 2);
    else
        d.chunk = d.total / ((int64_t)cb->n_threads * 8);
    if (d.chunk < 1)
        d.chunk = 1;
    run(cb, cb->n_threads, macs, mm_dynamic, &d);
    return CINFER_OK;
}
