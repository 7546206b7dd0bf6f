/*
 * cpu_backend.c - the CPU implementation of the backend ops table.
 *
 * This file owns the backend object: its thread pool, tensors and scratch
 * buffers. Arguments arrive checked (kernels/backend.c: dtypes, shapes,
 * aliasing, the step's indices against the tensors; the step itself is the
 * base struct's host copy) and ops.c does the arithmetic. Ops run at once
 * on the calling thread plus the pool's workers, so synchronize() has
 * nothing to wait for.
 *
 * Row counts come from the tensors: an op over activations [n, d] processes
 * all n rows.
 *
 * Tensors are 64-byte aligned heap buffers. Weight tensors borrow the
 * caller's memory (the GGUF file's) in place: it must outlive the tensor,
 * and it is never written. One exception, a departure from DESIGN.md's
 * "computed from in place": on the AVX-512 path Q8_0, Q4_0 and Q4_1
 * matrices are packed into huge-page slabs of the backend's own
 * (matmul.h's layout), since the file's blocks, 8 or 16 rows read side by
 * side, held decode at one thread to about 14 GB/s and the packed stream
 * reaches about 23 (bench/results/history/cpu-vs-llamacpp-2026-11-30-r2.md).
 * weight_borrows says which, and the model gives the file's memory under
 * a packed weight back.
 *
 * Collectives go to the rank's LOCAL communicator (kernels/comm.c) over
 * the tensors' host memory, on the rank's own thread.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend_impl.h"
#include "common/huge_pages.h"
#include "cpu_impl.h"
#include "matmul.h"

/* ---------------------------------------------------------------------- */
/* buffers                                                                 */
/* ---------------------------------------------------------------------- */

int cinfer_cpu_buf_reserve(cinfer_cpu_buf *b, size_t n_bytes)
{
    if (n_bytes <= b->cap)
        return 0;
    size_t want = b->cap + b->cap / 2;
    if (want < n_bytes)
        want = n_bytes;
    want = (want + 63) & ~(size_t)63;
    void *p = NULL;
    if (want == 0 || posix_memalign(&p, 64, want) != 0)
        return -1;
    free(b->p);
    b->p = p;
    b->cap = want;
    return 0;
}

void cinfer_cpu_buf_free(cinfer_cpu_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

cinfer_status cinfer_cpu_thread_scratch(cinfer_cpu_backend *cb,
                                        size_t n_floats)
{
    size_t stride = (n_floats + 15) & ~(size_t)15; /* 64-byte multiples */
    if (stride <= cb->thread_stride)
        return CINFER_OK;
    if (stride > SIZE_MAX / sizeof(float) / (size_t)cb->n_threads ||
        cinfer_cpu_buf_reserve(&cb->thread_buf,
                               stride * sizeof(float) *
                                   (size_t)cb->n_threads) != 0)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "cpu backend: no memory for %zu scratch "
                                "floats per thread",
                                n_floats);
    cb->thread_stride = stride;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* casts                                                                   */
/* ---------------------------------------------------------------------- */

static cinfer_cpu_backend *cpu(cinfer_backend *be)
{
    return (cinfer_cpu_backend *)be;
}

static cinfer_cpu_tensor *cpu_t(cinfer_tensor *t)
{
    return (cinfer_cpu_tensor *)t;
}

/* ---------------------------------------------------------------------- */
/* lifetime and memory                                                     */
/* ---------------------------------------------------------------------- */

static void cpu_destroy(cinfer_backend *be)
{
    cinfer_cpu_backend *cb = cpu(be);
    cinfer_threadpool_destroy(cb->pool);
    for (int i = 0; i < 4; i++)
        cinfer_cpu_buf_free(&cb->act[i]);
    cinfer_cpu_buf_free(&cb->thread_buf);
    cinfer_cpu_buf_free(&cb->bounds_buf);
    cinfer_cpu_buf_free(&cb->rope_buf);
    cinfer_cpu_buf_free(&cb->rope_ff);
    while (cb->slabs) {
        cinfer_cpu_slab *s = cb->slabs;
        cb->slabs = s->next;
        cinfer_huge_free(s->base, s->len);
        free(s);
    }
    free(cb);
}

static cinfer_status cpu_tensor_create(cinfer_backend *be,
                                       const cinfer_tensor_desc *desc,
                                       size_t nbytes, cinfer_tensor **out)
{
    cinfer_cpu_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM, "tensor_create: no memory");
    size_t alloc = (nbytes + 63) & ~(size_t)63;
    if (alloc < nbytes || posix_memalign(&t->base.data, 64, alloc) != 0) {
        free(t);
        return cinfer_set_error(CINFER_E_NOMEM,
                                "tensor_create: no memory for %zu bytes",
                                nbytes);
    }
    *out = &t->base;
    return CINFER_OK;
}

/* Slabs of at least this much address space: pages are touched (and
 * counted) only as weights fill them. */
#define SLAB_BYTES ((size_t)64 << 20)

/* n bytes, 64-byte aligned, from the newest slab or a new one; NULL when
 * out of memory. */
static void *slab_alloc(cinfer_cpu_backend *cb, size_t n, cinfer_cpu_slab **from)
{
    cinfer_cpu_slab *s = cb->slabs;
    size_t at = s ? (s->used + 63) & ~(size_t)63 : 0;
    if (!s || at > s->len || s->len - at < n) {
        s = calloc(1, sizeof *s);
        if (!s)
            return NULL;
        s->base = cinfer_huge_alloc(n > SLAB_BYTES ? n : SLAB_BYTES, &s->len);
        if (!s->base) {
            free(s);
            return NULL;
        }
        s->next = cb->slabs;
        cb->slabs = s;
        at = 0;
    }
    s->used = at + n;
    s->live++;
    *from = s;
    return s->base + at;
}

/* Drops a tensor from its slab; unmaps a slab that holds none and takes no
 * new ones (the newest keeps its memory for the next weight). */
static void slab_put(cinfer_cpu_backend *cb, cinfer_cpu_slab *s)
{
    if (--s->live > 0 || s == cb->slabs)
        return;
    for (cinfer_cpu_slab **pp = &cb->slabs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    cinfer_huge_free(s->base, s->len);
    free(s);
}

/* A weight packed in parts over the pool (a large model packs at a few
 * GB/s a thread); small ones on the caller. */
#define PACK_THREADED_BYTES ((size_t)1 << 20)

typedef struct {
    cinfer_dtype wt;
    const void *w;
    int64_t n_out, n_in;
    void *dst;
} pack_ctx;

static void pack_part(void *p, int64_t p0, int64_t p1, int thread)
{
    const pack_ctx *c = p;
    (void)thread;
    cinfer_cpu_pack_range(c->wt, c->w, c->n_out, c->n_in, c->dst, p0, p1);
}

static cinfer_status cpu_tensor_create_weight(cinfer_backend *be,
                                              const cinfer_tensor_desc *desc,
                                              size_t nbytes, const void *data,
                                              cinfer_tensor **out)
{
    cinfer_cpu_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "tensor_create_weight: no memory");
    t->base.data = (void *)data; /* never written: is_weight */
    /* Q8_0 / Q4_0 / Q4_1, K-quant and IQ4 matrices for the AVX-512
     * kernels are packed into the backend's own memory (matmul.h): Q8_0
     * decode about 1.6 times as fast at one thread, Q4_K about twice
     * (bench/results/kernels-kquant-packed.md). The caller may then free
     * `data` (weight_borrows). */
    const int gr = cinfer_cpu_pack_rows(desc->dtype);
    if (gr && desc->n_dims == 2 && desc->shape[0] >= gr &&
        cpu(be)->isa == CINFER_CPU_ISA_AVX512) {
        void *p = slab_alloc(cpu(be), nbytes, &t->slab);
        if (!p) {
            free(t);
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "tensor_create_weight: no memory for %zu "
                                    "bytes",
                                    nbytes);
        }
        pack_ctx pc = {desc->dtype, data, desc->shape[0], desc->shape[1], p};
        int64_t parts = cinfer_cpu_pack_parts(desc->dtype, desc->shape[0]);
        if (nbytes >= PACK_THREADED_BYTES)
            cinfer_threadpool_parallel_for(cpu(be)->pool, parts, pack_part, &pc);
        else
            pack_part(&pc, 0, parts, 0);
        t->base.data = p;
        t->packed = 1;
    }
    *out = &t->base;
    return CINFER_OK;
}

static void cpu_tensor_destroy(cinfer_backend *be, cinfer_tensor *t)
{
    if (!t->is_weight)
        free(t->data);
    if (cpu_t(t)->slab)
        slab_put(cpu(be), cpu_t(t)->slab);
    free(t);
}

static int cpu_weight_borrows(cinfer_backend *be, const cinfer_tensor *t)
{
    return !((const cinfer_cpu_tensor *)t)->packed;
}

static cinfer_status cpu_upload(cinfer_backend *be, cinfer_tensor *t,
                                size_t offset, const void *src, size_t n_bytes)
{
    memcpy((uint8_t *)t->data + offset, src, n_bytes);
    return CINFER_OK;
}

static cinfer_status cpu_download(cinfer_backend *be, const cinfer_tensor *t,
                                  size_t offset, void *dst, size_t n_bytes)
{
    if (!((const cinfer_cpu_tensor *)t)->packed) {
        memcpy(dst, (const uint8_t *)t->data + offset, n_bytes);
        return CINFER_OK;
    }
    /* A packed weight reads back as the bytes it was created from. */
    const cinfer_dtype wt = t->desc.dtype;
    const int64_t n_in = t->desc.shape[1];
    const size_t rb = cinfer_dtype_row_bytes(wt, n_in);
    const size_t bs = cinfer_dtype_row_bytes(wt, cinfer_dtype_block_elems(wt));
    uint8_t *d = dst;
    for (size_t at = offset; at < offset + n_bytes;) {
        const int64_t row = (int64_t)(at / rb);
        const size_t in_row = at % rb;
        const int64_t b = (int64_t)(in_row / bs);
        cinfer_block_q6_k blk; /* the largest packable block */
        cinfer_cpu_packed_row(wt, t->data, t->desc.shape[0], n_in, row, b, b + 1,
                              &blk);
        size_t from = in_row - (size_t)b * bs;
        size_t take = bs - from;
        if (take > offset + n_bytes - at)
            take = offset + n_bytes - at;
        memcpy(d, (const uint8_t *)&blk + from, take);
        d += take;
        at += take;
    }
    return CINFER_OK;
}

static cinfer_status cpu_fill_zero(cinfer_backend *be, cinfer_tensor *t)
{
    memset(t->data, 0, t->nbytes);
    return CINFER_OK;
}

static cinfer_status cpu_synchronize(cinfer_backend *be)
{
    return CINFER_OK; /* every op has completed when it returns */
}

/* ---------------------------------------------------------------------- */
/* step metadata                                                           */
/* ---------------------------------------------------------------------- */

/* The step is checked and copied into the base struct (backend.c); rope's
 * cos/sin table belongs to the old one. */
static cinfer_status cpu_set_step(cinfer_backend *be)
{
    cpu(be)->rope_valid = 0;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* ops                                                                     */
/* ---------------------------------------------------------------------- */

static cinfer_status cpu_embed(cinfer_backend *be, const cinfer_tensor *table,
                               cinfer_tensor *out)
{
    cinfer_cpu_op_embed(cpu(be), table, be->step.tokens, be->step.n_rows,
                        out->data);
    return CINFER_OK;
}

static cinfer_status cpu_rms_norm(cinfer_backend *be, const cinfer_tensor *x,
                                  const cinfer_tensor *w, float eps,
                                  cinfer_tensor *out)
{
    /* w of g elements: each row is cols / g rows of g */
    int64_t g = w->desc.shape[0];
    cinfer_cpu_op_rms_norm(cpu(be), x->data, w->data, eps, out->data,
                           cinfer_tensor_rows(x) * (cinfer_tensor_cols(x) / g),
                           g);
    return CINFER_OK;
}

static int cpu_matmul_supports(cinfer_backend *be, cinfer_dtype dtype)
{
    return cinfer_cpu_matmul_supported(dtype);
}

static cinfer_status cpu_matmul(cinfer_backend *be, int n_w,
                                const cinfer_tensor *const *w,
                                const cinfer_tensor *x,
                                cinfer_tensor *const *out)
{
    return cinfer_cpu_op_matmul(cpu(be), n_w, w, x, out);
}

static cinfer_status cpu_add_bias(cinfer_backend *be, cinfer_tensor *x,
                                  const cinfer_tensor *b)
{
    cinfer_cpu_op_add_bias(cpu(be), x->data, b->data, cinfer_tensor_rows(x),
                           cinfer_tensor_cols(x));
    return CINFER_OK;
}

static cinfer_status cpu_add(cinfer_backend *be, const cinfer_tensor *a,
                             const cinfer_tensor *b, cinfer_tensor *out)
{
    cinfer_cpu_op_add(cpu(be), a->data, b->data, out->data,
                      cinfer_tensor_desc_nelems(&a->desc));
    return CINFER_OK;
}

static cinfer_status cpu_rope(cinfer_backend *be, cinfer_tensor *x,
                              int n_heads, int head_dim, int rot_dim,
                              const cinfer_rope_params *p)
{
    return cinfer_cpu_op_rope(cpu(be), x->data, be->step.positions,
                              be->step.n_rows, n_heads, head_dim, rot_dim, p);
}

static cinfer_status cpu_kv_store(cinfer_backend *be, const cinfer_tensor *k,
                                  const cinfer_tensor *v,
                                  cinfer_tensor *k_cache,
                                  cinfer_tensor *v_cache)
{
    int64_t width = k_cache->desc.shape[2] * k_cache->desc.shape[3];
    cinfer_cpu_op_kv_store(cpu(be), k->data, v->data, be->step.slots,
                           be->step.n_rows, width, k_cache->data,
                           k_cache->desc.dtype, v_cache->data,
                           v_cache->desc.dtype);
    return CINFER_OK;
}

static cinfer_status cpu_kv_store_swa(cinfer_backend *be,
                                      const cinfer_tensor *k,
                                      const cinfer_tensor *v,
                                      cinfer_tensor *k_cache,
                                      cinfer_tensor *v_cache)
{
    int64_t width = k_cache->desc.shape[2] * k_cache->desc.shape[3];
    cinfer_cpu_op_kv_store(cpu(be), k->data, v->data, be->step.swa_slots,
                           be->step.n_rows, width, k_cache->data,
                           k_cache->desc.dtype, v_cache->data,
                           v_cache->desc.dtype);
    return CINFER_OK;
}

static cinfer_status cpu_attention_window(cinfer_backend *be,
                                          const cinfer_tensor *q,
                                          const cinfer_tensor *k_cache,
                                          const cinfer_tensor *v_cache,
                                          int n_heads, int n_kv_heads,
                                          int head_dim, float scale,
                                          int window, cinfer_tensor *out)
{
    cinfer_cpu_attn_args a;
    a.q = q->data;
    a.k_cache = k_cache->data;
    a.v_cache = v_cache->data;
    a.k_dtype = k_cache->desc.dtype;
    a.v_dtype = v_cache->desc.dtype;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.scale = scale;
    a.window = window;
    a.block_tables = window > 0 && be->step.swa_block_tables
                         ? be->step.swa_block_tables
                         : be->step.block_tables;
    a.out = out->data;
    return cinfer_cpu_op_attention(cpu(be), &a);
}

static cinfer_status cpu_attention(cinfer_backend *be, const cinfer_tensor *q,
                                   const cinfer_tensor *k_cache,
                                   const cinfer_tensor *v_cache, int n_heads,
                                   int n_kv_heads, int head_dim, float scale,
                                   cinfer_tensor *out)
{
    return cpu_attention_window(be, q, k_cache, v_cache, n_heads, n_kv_heads,
                                head_dim, scale, 0, out);
}

static cinfer_status cpu_gelu_mul(cinfer_backend *be,
                                  const cinfer_tensor *gate,
                                  const cinfer_tensor *up, cinfer_tensor *out)
{
    cinfer_cpu_op_gelu_mul(cpu(be), gate->data, up->data, out->data,
                           cinfer_tensor_desc_nelems(&gate->desc));
    return CINFER_OK;
}

static cinfer_status cpu_scale(cinfer_backend *be, cinfer_tensor *x, float s)
{
    cinfer_cpu_op_scale(cpu(be), x->data, s,
                        cinfer_tensor_desc_nelems(&x->desc));
    return CINFER_OK;
}

/* Each row's greedy choice (backend.h): the largest value and whether the
 * row holds NaN or +inf in one pass the compiler vectorizes, then the
 * first index of that value, or of the first bad entry. */
static cinfer_status cpu_greedy(cinfer_backend *be, const cinfer_tensor *x,
                                cinfer_tensor *out)
{
    (void)be;
    const int64_t rows = cinfer_tensor_rows(x), n = cinfer_tensor_cols(x);
    int32_t *o = out->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *v = (const float *)x->data + r * n;
        float m = -INFINITY;
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            bad |= !(v[i] < INFINITY);
            m = v[i] > m ? v[i] : m;
        }
        int64_t i = 0;
        if (bad) {
            while (v[i] < INFINITY)
                i++;
            o[r] = (int32_t)(-2 - (2 * i + (v[i] != v[i])));
        } else if (m == -INFINITY) {
            o[r] = -1;
        } else {
            while (v[i] != m)
                i++;
            o[r] = (int32_t)i;
        }
    }
    return CINFER_OK;
}

static cinfer_status cpu_silu_mul(cinfer_backend *be,
                                  const cinfer_tensor *gate,
                                  const cinfer_tensor *up, cinfer_tensor *out)
{
    cinfer_cpu_op_silu_mul(cpu(be), gate->data, up->data, out->data,
                           cinfer_tensor_desc_nelems(&gate->desc));
    return CINFER_OK;
}

static cinfer_status cpu_gather_rows(cinfer_backend *be,
                                     const cinfer_tensor *x,
                                     cinfer_tensor *out)
{
    cinfer_cpu_op_gather_rows(cpu(be), x->data, be->step.out_rows,
                              be->step.n_out, cinfer_tensor_cols(x),
                              out->data);
    return CINFER_OK;
}

static cinfer_status cpu_all_reduce_sum(cinfer_backend *be, cinfer_tensor *t)
{
    return cinfer_comm_all_reduce_sum(
        be->comm, t->data, (size_t)cinfer_tensor_desc_nelems(&t->desc));
}

static cinfer_status cpu_all_gather(cinfer_backend *be, const cinfer_tensor *x,
                                    cinfer_tensor *out)
{
    size_t n = (size_t)cinfer_tensor_desc_nelems(&x->desc);
    if (!be->comm) {
        memcpy(out->data, x->data, n * sizeof(float));
        return CINFER_OK;
    }
    return cinfer_comm_all_gather(be->comm, x->data, n, out->data);
}

static const struct cinfer_backend_ops cpu_ops = {
    .destroy = cpu_destroy,
    .tensor_create = cpu_tensor_create,
    .tensor_create_weight = cpu_tensor_create_weight,
    .tensor_destroy = cpu_tensor_destroy,
    .weight_borrows = cpu_weight_borrows,
    .matmul_supports = cpu_matmul_supports,
    .upload = cpu_upload,
    .download = cpu_download,
    .fill_zero = cpu_fill_zero,
    .synchronize = cpu_synchronize,
    .set_step = cpu_set_step,
    .embed = cpu_embed,
    .rms_norm = cpu_rms_norm,
    .matmul = cpu_matmul,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .gather_rows = cpu_gather_rows,
    .attention_window = cpu_attention_window,
    .kv_store_swa = cpu_kv_store_swa,
    .gelu_mul = cpu_gelu_mul,
    .scale = cpu_scale,
    .greedy = cpu_greedy,
    .all_reduce_sum = cpu_all_reduce_sum,
    .all_gather = cpu_all_gather,
};

/* ---------------------------------------------------------------------- */
/* creation                                                                */
/* ---------------------------------------------------------------------- */

cinfer_backend_cpu_params cinfer_backend_cpu_default_params(void)
{
    cinfer_backend_cpu_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    p.isa = CINFER_CPU_ISA_AUTO;
    return p;
}

cinfer_status cinfer_backend_cpu_create(const cinfer_backend_cpu_params *p,
                                        cinfer_backend **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cpu_create: out is NULL");
    *out = NULL;
    cinfer_backend_cpu_params dp = cinfer_backend_cpu_default_params();
    if (!p)
        p = &dp;
    int n_threads = p->n_threads;
    if (n_threads < 0 || n_threads > 1024)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cpu_create: n_threads %d is outside "
                                "0..1024",
                                n_threads);
    if (n_threads == 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c < 1 ? 1 : c > 1024 ? 1024 : (int)c;
    }
    cinfer_cpu_isa isa = p->isa;
    if (isa != CINFER_CPU_ISA_AUTO && isa != CINFER_CPU_ISA_PORTABLE &&
        isa != CINFER_CPU_ISA_AVX2 && isa != CINFER_CPU_ISA_AVX512)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cpu_create: isa %d is not a known "
                                "kernel family",
                                (int)isa);
    if (isa == CINFER_CPU_ISA_AUTO) {
        isa = cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX512) ? CINFER_CPU_ISA_AVX512
              : cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX2)
                  ? CINFER_CPU_ISA_AVX2
                  : CINFER_CPU_ISA_PORTABLE;
    } else if (!cinfer_cpu_isa_supported(isa)) {
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "backend_cpu_create: this processor cannot "
                                "run the %s kernels",
                                cinfer_cpu_isa_name(isa));
    }

    if (p->comm && cinfer_comm_get_kind(p->comm) != CINFER_COMM_LOCAL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cpu_create: comm is an NCCL "
                                "communicator; CPU ranks need a LOCAL one");

    cinfer_cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "backend_cpu_create: no memory");
    cinfer_threadpool_params tp = cinfer_threadpool_default_params();
    tp.n_threads = n_threads;
    tp.prio = p->thread_prio;
    cinfer_status st = cinfer_threadpool_create(&tp, &cb->pool);
    if (st != CINFER_OK)
        goto fail_cb;
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    cb->base.comm = p->comm;
    if (p->comm && cinfer_comm_size(p->comm) > 1)
        snprintf(cb->base.device_desc, sizeof cb->base.device_desc,
                 "cpu: %d thread%s, %s, rank %d of %d", n_threads,
                 n_threads == 1 ? "" : "s", cinfer_cpu_isa_name(isa),
                 cinfer_comm_rank(p->comm), cinfer_comm_size(p->comm));
    else
        snprintf(cb->base.device_desc, sizeof cb->base.device_desc,
                 "cpu: %d thread%s, %s", n_threads, n_threads == 1 ? "" : "s",
                 cinfer_cpu_isa_name(isa));
    cb->isa = isa;
    cb->n_threads = n_threads;
    cb->vec = &cinfer_cpu_vec_portable;
#ifdef CINFER_CPU_HAVE_X86
    if (isa == CINFER_CPU_ISA_AVX2)
        cb->vec = &cinfer_cpu_vec_avx2;
    else if (isa == CINFER_CPU_ISA_AVX512)
        cb->vec = &cinfer_cpu_vec_avx512;
#endif
    *out = &cb->base;
    return CINFER_OK;

fail_cb:
    free(cb);
    return st;
}

cinfer_cpu_isa cinfer_backend_cpu_isa(const cinfer_backend *be)
{
    if (!be || be->ops != &cpu_ops)
        return CINFER_CPU_ISA_AUTO; /* not a CPU backend */
    return ((const cinfer_cpu_backend *)be)->isa;
}
