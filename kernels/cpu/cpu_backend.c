/*
 * cpu_backend.c - the CPU implementation of the backend ops table.
 *
 * This file owns the backend object: its thread pool, tensors, the copied
 * step metadata and scratch buffers, and it checks every op's arguments
 * (dtype, shape, aliasing, the step's indices against the tensors) before
 * ops.c does the arithmetic. Ops run at once on the calling thread plus the
 * pool's workers, so synchronize() has nothing to wait for.
 *
 * Row counts come from the tensors: an op over activations [n, d] processes
 * all n rows. Ops that read the step (embed, rope, kv_store, attention,
 * gather_rows) require their row-indexed tensors to have exactly
 * step.n_rows rows (gather_rows' output: step.n_out). tensor_set_rows
 * changes a tensor's row count in place, within what it was created with,
 * so activation buffers sized for the largest step serve every step.
 *
 * Tensors are 64-byte aligned heap buffers. Weight tensors borrow the
 * caller's memory (the GGUF file's) in place: it must outlive the tensor,
 * and it is never written. One exception, a departure from DESIGN.md's
 * "computed from in place": on the AVX-512 path Q8_0, Q4_0 and Q4_1
 * matrices are packed into huge-page slabs of the backend's own
 * (matmul.h's layout), since the file's blocks, 8 or 16 rows read side by
 * side, held decode at one thread to about 14 GB/s and the packed stream
 * reaches about 23 (bench/results/cpu-vs-llamacpp-2026-11-30-r2.md).
 * weight_borrows says which, and the model gives the file's memory under
 * a packed weight back.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../backend.h"
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
/* argument checks                                                         */
/* ---------------------------------------------------------------------- */

static cinfer_cpu_backend *cpu(cinfer_backend *be)
{
    return (cinfer_cpu_backend *)be;
}

/* "F32[7, 769]" */
static const char *desc_str(const cinfer_tensor_desc *d, char *buf,
                            size_t size)
{
    int off = snprintf(buf, size, "%s[", cinfer_dtype_name(d->dtype));
    int nd = d->n_dims < 0 ? 0 : d->n_dims > 4 ? 4 : d->n_dims;
    for (int i = 0; i < nd && off > 0 && (size_t)off < size; i++)
        off += snprintf(buf + off, size - (size_t)off, "%s%lld",
                        i ? ", " : "", (long long)d->shape[i]);
    if (off > 0 && (size_t)off < size)
        snprintf(buf + off, size - (size_t)off, "]");
    return buf;
}

static int64_t t_rows(const cinfer_tensor *t) { return t->desc.shape[0]; }

/* Elements per row: the product of all dimensions but the first. */
static int64_t t_cols(const cinfer_tensor *t)
{
    int64_t c = 1;
    for (int i = 1; i < t->desc.n_dims; i++)
        c *= t->desc.shape[i];
    return c;
}

static cinfer_status need_tensor(const char *op, const char *arg,
                                 const cinfer_tensor *t)
{
    if (!t)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s: %s is NULL", op,
                                arg);
    return CINFER_OK;
}

static cinfer_status need_writable(const char *op, const char *arg,
                                   const cinfer_tensor *t)
{
    if (t->is_weight)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s is a read-only weight tensor", op,
                                arg);
    return CINFER_OK;
}

/* An F32 matrix [rows, cols] (rows < 0 or cols < 0: any). At least 2 dims;
 * cols is the product of the inner ones. */
static cinfer_status need_f32_matrix(const char *op, const char *arg,
                                     const cinfer_tensor *t, int64_t rows,
                                     int64_t cols)
{
    cinfer_status st = need_tensor(op, arg, t);
    if (st != CINFER_OK)
        return st;
    if (t->desc.dtype != CINFER_DTYPE_F32 || t->desc.n_dims < 2 ||
        (rows >= 0 && t_rows(t) != rows) || (cols >= 0 && t_cols(t) != cols)) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s must be F32 [%lld, %lld], got %s", op,
                                arg, (long long)rows, (long long)cols,
                                desc_str(&t->desc, buf, sizeof buf));
    }
    return CINFER_OK;
}

/* An F32 vector [n]. */
static cinfer_status need_f32_vector(const char *op, const char *arg,
                                     const cinfer_tensor *t, int64_t n)
{
    cinfer_status st = need_tensor(op, arg, t);
    if (st != CINFER_OK)
        return st;
    if (t->desc.dtype != CINFER_DTYPE_F32 || t->desc.n_dims != 1 ||
        t->desc.shape[0] != n) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s must be F32 [%lld], got %s", op, arg,
                                (long long)n,
                                desc_str(&t->desc, buf, sizeof buf));
    }
    return CINFER_OK;
}

static int same_shape(const cinfer_tensor_desc *a, const cinfer_tensor_desc *b)
{
    if (a->n_dims != b->n_dims)
        return 0;
    for (int i = 0; i < a->n_dims; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

static cinfer_status need_same_shape(const char *op, const char *arg,
                                     const cinfer_tensor *t,
                                     const char *ref_arg,
                                     const cinfer_tensor *ref)
{
    cinfer_status st = need_tensor(op, arg, t);
    if (st != CINFER_OK)
        return st;
    if (t->desc.dtype != CINFER_DTYPE_F32 || !same_shape(&t->desc, &ref->desc)) {
        char b1[96], b2[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s must be F32 shaped like %s (%s), got "
                                "%s",
                                op, arg, ref_arg,
                                desc_str(&ref->desc, b1, sizeof b1),
                                desc_str(&t->desc, b2, sizeof b2));
    }
    return CINFER_OK;
}

static cinfer_status need_step(const char *op, const cinfer_cpu_backend *cb)
{
    if (!cb->has_step)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: no step set (call set_step first)", op);
    return CINFER_OK;
}

/* A KV cache [n_blocks, step.block_size, n_kv_heads, head_dim], F16/F32. */
static cinfer_status need_cache(const char *op, const char *arg,
                                const cinfer_cpu_backend *cb,
                                const cinfer_tensor *t)
{
    cinfer_status st = need_tensor(op, arg, t);
    if (st != CINFER_OK)
        return st;
    const cinfer_tensor_desc *d = &t->desc;
    if ((d->dtype != CINFER_DTYPE_F16 && d->dtype != CINFER_DTYPE_F32) ||
        d->n_dims != 4 || d->shape[1] != cb->step.block_size) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s must be F16 or F32 [n_blocks, "
                                "block_size = %d, n_kv_heads, head_dim], got "
                                "%s",
                                op, arg, (int)cb->step.block_size,
                                desc_str(d, buf, sizeof buf));
    }
    return CINFER_OK;
}

#define TRY(expr)                                                              \
    do {                                                                       \
        cinfer_status st_ = (expr);                                            \
        if (st_ != CINFER_OK)                                                  \
            return st_;                                                        \
    } while (0)

/* ---------------------------------------------------------------------- */
/* lifetime and memory                                                     */
/* ---------------------------------------------------------------------- */

static void cpu_destroy(cinfer_backend *be)
{
    cinfer_cpu_backend *cb = cpu(be);
    cinfer_threadpool_destroy(cb->pool);
    cinfer_cpu_buf_free(&cb->step_buf);
    cinfer_cpu_buf_free(&cb->sort_buf);
    for (int i = 0; i < 4; i++)
        cinfer_cpu_buf_free(&cb->act[i]);
    cinfer_cpu_buf_free(&cb->thread_buf);
    cinfer_cpu_buf_free(&cb->bounds_buf);
    cinfer_cpu_buf_free(&cb->rope_buf);
    while (cb->slabs) {
        cinfer_cpu_slab *s = cb->slabs;
        cb->slabs = s->next;
        cinfer_huge_free(s->base, s->len);
        free(s);
    }
    free(cb);
}

static cinfer_status check_desc(const char *op, const cinfer_tensor_desc *d,
                                size_t *nbytes)
{
    if (!d)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s: desc is NULL", op);
    if (!cinfer_dtype_valid((uint32_t)d->dtype))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: desc.dtype %d is not a known type", op,
                                (int)d->dtype);
    if (d->n_dims < 1 || d->n_dims > CINFER_MAX_DIMS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: desc.n_dims %d is outside 1..%d", op,
                                d->n_dims, CINFER_MAX_DIMS);
    for (int i = 0; i < d->n_dims; i++)
        if (d->shape[i] < 1)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s: desc.shape[%d] = %lld is not >= 1",
                                    op, i, (long long)d->shape[i]);
    size_t n = cinfer_tensor_desc_nbytes(d);
    if (n == 0) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s is not a whole number of %s blocks or "
                                "is too large",
                                op, desc_str(d, buf, sizeof buf),
                                cinfer_dtype_name(d->dtype));
    }
    *nbytes = n;
    return CINFER_OK;
}

static cinfer_status cpu_tensor_create(cinfer_backend *be,
                                       const cinfer_tensor_desc *desc,
                                       cinfer_tensor **out)
{
    size_t nbytes = 0;
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_create: out is NULL");
    *out = NULL;
    TRY(check_desc("tensor_create", desc, &nbytes));
    cinfer_tensor *t = malloc(sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM, "tensor_create: no memory");
    size_t alloc = (nbytes + 63) & ~(size_t)63;
    if (alloc < nbytes || posix_memalign(&t->data, 64, alloc) != 0) {
        free(t);
        return cinfer_set_error(CINFER_E_NOMEM,
                                "tensor_create: no memory for %zu bytes",
                                nbytes);
    }
    t->desc = *desc;
    t->nbytes = nbytes;
    t->cap_bytes = nbytes;
    t->is_weight = 0;
    t->packed = 0;
    t->slab = NULL;
    *out = t;
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
                                              const void *data,
                                              cinfer_tensor **out)
{
    size_t nbytes = 0;
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_create_weight: out is NULL");
    *out = NULL;
    TRY(check_desc("tensor_create_weight", desc, &nbytes));
    if (!data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_create_weight: data is NULL");
    cinfer_tensor *t = malloc(sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "tensor_create_weight: no memory");
    t->desc = *desc;
    t->data = (void *)data; /* never written: is_weight */
    t->nbytes = nbytes;
    t->cap_bytes = nbytes;
    t->is_weight = 1;
    t->packed = 0;
    t->slab = NULL;
    /* Q8_0 / Q4_0 / Q4_1 matrices for the AVX-512 kernels are packed into
     * the backend's own memory (matmul.h): Q8_0 decode about 1.6 times as
     * fast at one thread. The caller may then free `data`
     * (weight_borrows). */
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
        t->data = p;
        t->packed = 1;
    }
    *out = t;
    return CINFER_OK;
}

/* The allocation (cap_bytes) keeps the row count the tensor was created
 * with, so a tensor shrunk by set_rows can grow back up to it. Rows keep
 * their byte offsets: the data is not moved. */
static cinfer_status cpu_tensor_set_rows(cinfer_backend *be, cinfer_tensor *t,
                                         int64_t rows)
{
    TRY(need_tensor("tensor_set_rows", "t", t));
    TRY(need_writable("tensor_set_rows", "t", t));
    cinfer_tensor_desc one = t->desc;
    one.shape[0] = 1;
    size_t row_bytes = cinfer_tensor_desc_nbytes(&one);
    size_t cap_rows = row_bytes ? t->cap_bytes / row_bytes : 0;
    if (rows < 1 || (uint64_t)rows > cap_rows)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_set_rows: rows %lld is outside 1..%zu "
                                "(the rows it was created with)",
                                (long long)rows, cap_rows);
    t->desc.shape[0] = rows;
    t->nbytes = (size_t)rows * row_bytes;
    return CINFER_OK;
}

static void cpu_tensor_destroy(cinfer_backend *be, cinfer_tensor *t)
{
    if (!t)
        return;
    if (!t->is_weight)
        free(t->data);
    if (t->slab)
        slab_put(cpu(be), t->slab);
    free(t);
}

static cinfer_status check_range(const char *op, const cinfer_tensor *t,
                                 size_t offset, const void *p, size_t n_bytes)
{
    TRY(need_tensor(op, "t", t));
    if (offset > t->nbytes || n_bytes > t->nbytes - offset)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: bytes [%zu, %zu + %zu) lie outside the "
                                "tensor's %zu bytes",
                                op, offset, offset, n_bytes, t->nbytes);
    if (!p && n_bytes > 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: host pointer is NULL", op);
    return CINFER_OK;
}

static int cpu_weight_borrows(cinfer_backend *be, const cinfer_tensor *t)
{
    return t && t->is_weight && !t->packed;
}

static cinfer_status cpu_upload(cinfer_backend *be, cinfer_tensor *t,
                                size_t offset, const void *src, size_t n_bytes)
{
    TRY(check_range("upload", t, offset, src, n_bytes));
    TRY(need_writable("upload", "t", t));
    if (n_bytes > 0)
        memcpy((uint8_t *)t->data + offset, src, n_bytes);
    return CINFER_OK;
}

static cinfer_status cpu_download(cinfer_backend *be, const cinfer_tensor *t,
                                  size_t offset, void *dst, size_t n_bytes)
{
    TRY(check_range("download", t, offset, dst, n_bytes));
    if (n_bytes == 0)
        return CINFER_OK;
    if (!t->packed) {
        memcpy(dst, (const uint8_t *)t->data + offset, n_bytes);
        return CINFER_OK;
    }
    /* A packed weight reads back as the bytes it was created from. */
    const cinfer_dtype wt = t->desc.dtype;
    const int64_t n_in = t->desc.shape[1];
    const size_t rb = cinfer_dtype_row_bytes(wt, n_in);
    const size_t bs = cinfer_dtype_row_bytes(wt, CINFER_QK);
    uint8_t *d = dst;
    for (size_t at = offset; at < offset + n_bytes;) {
        const int64_t row = (int64_t)(at / rb);
        const size_t in_row = at % rb;
        const int64_t b = (int64_t)(in_row / bs);
        cinfer_block_q8_0 blk; /* the largest packable block */
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
    TRY(need_tensor("fill_zero", "t", t));
    TRY(need_writable("fill_zero", "t", t));
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

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static cinfer_status cpu_set_step(cinfer_backend *be, const cinfer_step *s)
{
    cinfer_cpu_backend *cb = cpu(be);
    if (!s)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "set_step: step is NULL");
    if (s->n_rows < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: n_rows %d is not >= 1",
                                (int)s->n_rows);
    if (s->n_seqs < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: n_seqs %d is not >= 1",
                                (int)s->n_seqs);
    if (s->block_size < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: block_size %d is not >= 1",
                                (int)s->block_size);
    if (s->max_blocks < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: max_blocks %d is not >= 1",
                                (int)s->max_blocks);
    if (s->n_out < 0 || s->n_out > s->n_rows)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: n_out %d is outside 0..n_rows (%d)",
                                (int)s->n_out, (int)s->n_rows);
    if (!s->tokens || !s->positions || !s->row_seq || !s->slots ||
        !s->block_tables || (s->n_out > 0 && !s->out_rows))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: tokens, positions, row_seq, slots, "
                                "block_tables and out_rows must not be NULL");
    int64_t n = s->n_rows, n_seqs = s->n_seqs, n_out = s->n_out;
    int64_t n_table = n_seqs * (int64_t)s->max_blocks;
    if (n_table > INT32_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: n_seqs * max_blocks = %lld is too "
                                "large",
                                (long long)n_table);
    int32_t max_pos = 0, max_slot = 0;
    for (int64_t r = 0; r < n; r++) {
        if (s->tokens[r] < 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: tokens[%lld] = %d is negative",
                                    (long long)r, (int)s->tokens[r]);
        if (s->positions[r] < 0 ||
            s->positions[r] / s->block_size >= s->max_blocks)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: positions[%lld] = %d is outside "
                                    "0..max_blocks * block_size - 1 (%lld)",
                                    (long long)r, (int)s->positions[r],
                                    (long long)s->max_blocks * s->block_size -
                                        1);
        if (s->row_seq[r] < 0 || s->row_seq[r] >= s->n_seqs)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: row_seq[%lld] = %d is outside "
                                    "0..n_seqs - 1 (%d)",
                                    (long long)r, (int)s->row_seq[r],
                                    (int)s->n_seqs - 1);
        if (s->slots[r] < 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: slots[%lld] = %d is negative",
                                    (long long)r, (int)s->slots[r]);
        max_pos = s->positions[r] > max_pos ? s->positions[r] : max_pos;
        max_slot = s->slots[r] > max_slot ? s->slots[r] : max_slot;
    }
    for (int64_t j = 0; j < n_out; j++) {
        if (s->out_rows[j] < 0 || s->out_rows[j] >= s->n_rows)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: out_rows[%lld] = %d is outside "
                                    "0..n_rows - 1 (%d)",
                                    (long long)j, (int)s->out_rows[j],
                                    (int)s->n_rows - 1);
        if (j > 0 && s->out_rows[j] <= s->out_rows[j - 1])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: out_rows[%lld] = %d does not "
                                    "ascend (previous %d)",
                                    (long long)j, (int)s->out_rows[j],
                                    (int)s->out_rows[j - 1]);
    }

    /* Scratch: sorted slots [n], then the last position per sequence. */
    size_t scratch = (size_t)(n + n_seqs) * sizeof(int32_t);
    if (cinfer_cpu_buf_reserve(&cb->sort_buf, scratch) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "set_step: no memory");
    int32_t *sorted = cb->sort_buf.p;
    int32_t *seq_last = sorted + n;
    memcpy(sorted, s->slots, (size_t)n * sizeof(int32_t));
    qsort(sorted, (size_t)n, sizeof(int32_t), cmp_i32);
    for (int64_t r = 1; r < n; r++)
        if (sorted[r] == sorted[r - 1])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: slot %d is used by two rows",
                                    (int)sorted[r]);

    /* The block ids rows will read: blocks 0..last/block_size of each
     * sequence that has rows. Range-checked against the cache later. */
    for (int64_t q = 0; q < n_seqs; q++)
        seq_last[q] = -1;
    for (int64_t r = 0; r < n; r++)
        if (s->positions[r] > seq_last[s->row_seq[r]])
            seq_last[s->row_seq[r]] = s->positions[r];
    int32_t min_block = INT32_MAX, max_block = INT32_MIN;
    int32_t min_seq = 0, min_idx = 0, max_seq = 0, max_idx = 0;
    for (int64_t q = 0; q < n_seqs; q++) {
        if (seq_last[q] < 0)
            continue;
        const int32_t *bt = s->block_tables + q * s->max_blocks;
        for (int32_t i = 0; i <= seq_last[q] / s->block_size; i++) {
            if (bt[i] < min_block) {
                min_block = bt[i];
                min_seq = (int32_t)q;
                min_idx = i;
            }
            if (bt[i] > max_block) {
                max_block = bt[i];
                max_seq = (int32_t)q;
                max_idx = i;
            }
        }
    }

    /* Copy: tokens, positions, row_seq, slots, out_rows, block_tables,
     * row_gen. */
    size_t total = (size_t)(5 * n + n_out + n_table) * sizeof(int32_t);
    if (cinfer_cpu_buf_reserve(&cb->step_buf, total) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "set_step: no memory");
    int32_t *p = cb->step_buf.p;
    cinfer_step *c = &cb->step;
    *c = *s;
    memcpy(p, s->tokens, (size_t)n * 4);
    c->tokens = p;
    p += n;
    memcpy(p, s->positions, (size_t)n * 4);
    c->positions = p;
    p += n;
    memcpy(p, s->row_seq, (size_t)n * 4);
    c->row_seq = p;
    p += n;
    memcpy(p, s->slots, (size_t)n * 4);
    c->slots = p;
    p += n;
    if (n_out > 0)
        memcpy(p, s->out_rows, (size_t)n_out * 4);
    c->out_rows = p;
    p += n_out;
    memcpy(p, s->block_tables, (size_t)n_table * 4);
    c->block_tables = p;
    p += n_table;
    if (s->row_gen) {
        uint8_t *g = (uint8_t *)p;
        for (int64_t r = 0; r < n; r++)
            g[r] = s->row_gen[r] ? 1 : 0;
        c->row_gen = g;
    }

    cb->max_slot = max_slot;
    cb->max_position = max_pos;
    cb->min_block = min_block;
    cb->max_block = max_block;
    cb->min_block_seq = min_seq;
    cb->min_block_idx = min_idx;
    cb->max_block_seq = max_seq;
    cb->max_block_idx = max_idx;
    cb->has_step = 1;
    cb->rope_valid = 0;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* ops                                                                     */
/* ---------------------------------------------------------------------- */

static cinfer_status cpu_embed(cinfer_backend *be, const cinfer_tensor *table,
                               cinfer_tensor *out)
{
    cinfer_cpu_backend *cb = cpu(be);
    const char *op = "embed";
    TRY(need_step(op, cb));
    TRY(need_tensor(op, "table", table));
    const cinfer_tensor_desc *td = &table->desc;
    if (td->n_dims != 2 || td->dtype == CINFER_DTYPE_I32) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "embed: table must be [vocab, d] of a float "
                                "or quantized type, got %s",
                                desc_str(td, buf, sizeof buf));
    }
    int64_t vocab = td->shape[0], d = td->shape[1];
    TRY(need_f32_matrix(op, "out", out, cb->step.n_rows, d));
    TRY(need_writable(op, "out", out));
    if (out == table)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "embed: out aliases table");
    for (int32_t r = 0; r < cb->step.n_rows; r++)
        if (cb->step.tokens[r] >= vocab)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "embed: step.tokens[%d] = %d is outside "
                                    "the table's %lld rows",
                                    (int)r, (int)cb->step.tokens[r],
                                    (long long)vocab);
    cinfer_cpu_op_embed(cb, table, cb->step.tokens, cb->step.n_rows,
                        out->data);
    return CINFER_OK;
}

static cinfer_status cpu_rms_norm(cinfer_backend *be, const cinfer_tensor *x,
                                  const cinfer_tensor *w, float eps,
                                  cinfer_tensor *out)
{
    const char *op = "rms_norm";
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    TRY(need_f32_vector(op, "w", w, t_cols(x)));
    TRY(need_same_shape(op, "out", out, "x", x));
    TRY(need_writable(op, "out", out));
    if (!(eps >= 0.0f) || isinf(eps))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rms_norm: eps %g is not a finite value >= 0",
                                (double)eps);
    cinfer_cpu_op_rms_norm(cpu(be), x->data, w->data, eps, out->data,
                           t_rows(x), t_cols(x));
    return CINFER_OK;
}

static cinfer_status cpu_matmul(cinfer_backend *be, int n_w,
                                const cinfer_tensor *const *w,
                                const cinfer_tensor *x,
                                cinfer_tensor *const *out)
{
    const char *op = "matmul";
    if (n_w < 1 || n_w > 4)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "matmul: n_w %d is outside 1..4", n_w);
    if (!w || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "matmul: w and out must not be NULL");
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    if (x->desc.n_dims != 2) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "matmul: x must be F32 [n, n_in], got %s",
                                desc_str(&x->desc, buf, sizeof buf));
    }
    int64_t n = t_rows(x), n_in = t_cols(x);
    for (int i = 0; i < n_w; i++) {
        char name[24], buf[96];
        snprintf(name, sizeof name, "w[%d]", i);
        TRY(need_tensor(op, name, w[i]));
        const cinfer_tensor_desc *wd = &w[i]->desc;
        if (wd->n_dims != 2 || wd->shape[1] != n_in)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "matmul: w[%d] must be [n_out, n_in = "
                                    "%lld], got %s",
                                    i, (long long)n_in,
                                    desc_str(wd, buf, sizeof buf));
        if (!cinfer_cpu_matmul_supported(wd->dtype))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "matmul: w[%d] has type %s, which has no "
                                    "CPU matmul kernel",
                                    i, cinfer_dtype_name(wd->dtype));
        snprintf(name, sizeof name, "out[%d]", i);
        TRY(need_f32_matrix(op, name, out[i], n, wd->shape[0]));
        if (out[i]->desc.n_dims != 2)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "matmul: out[%d] must be 2-D [n, n_out]",
                                    i);
        TRY(need_writable(op, name, out[i]));
        if (out[i] == x)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "matmul: out[%d] aliases x", i);
        for (int j = 0; j < n_w; j++)
            if (out[i] == w[j])
                return cinfer_set_error(CINFER_E_INVALID_ARG,
                                        "matmul: out[%d] aliases w[%d]", i, j);
        for (int j = 0; j < i; j++)
            if (out[j] == out[i])
                return cinfer_set_error(CINFER_E_INVALID_ARG,
                                        "matmul: out[%d] and out[%d] are the "
                                        "same tensor",
                                        j, i);
    }
    return cinfer_cpu_op_matmul(cpu(be), n_w, w, x, out);
}

static cinfer_status cpu_add_bias(cinfer_backend *be, cinfer_tensor *x,
                                  const cinfer_tensor *b)
{
    const char *op = "add_bias";
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    TRY(need_writable(op, "x", x));
    TRY(need_f32_vector(op, "b", b, t_cols(x)));
    cinfer_cpu_op_add_bias(cpu(be), x->data, b->data, t_rows(x), t_cols(x));
    return CINFER_OK;
}

static cinfer_status cpu_add(cinfer_backend *be, const cinfer_tensor *a,
                             const cinfer_tensor *b, cinfer_tensor *out)
{
    const char *op = "add";
    TRY(need_tensor(op, "a", a));
    if (a->desc.dtype != CINFER_DTYPE_F32) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "add: a must be F32, got %s",
                                desc_str(&a->desc, buf, sizeof buf));
    }
    TRY(need_same_shape(op, "b", b, "a", a));
    TRY(need_same_shape(op, "out", out, "a", a));
    TRY(need_writable(op, "out", out));
    cinfer_cpu_op_add(cpu(be), a->data, b->data, out->data,
                      cinfer_tensor_desc_nelems(&a->desc));
    return CINFER_OK;
}

static cinfer_status cpu_rope(cinfer_backend *be, cinfer_tensor *x,
                              int n_heads, int head_dim, int rot_dim,
                              float theta, cinfer_rope_mode mode)
{
    cinfer_cpu_backend *cb = cpu(be);
    const char *op = "rope";
    TRY(need_step(op, cb));
    if (n_heads < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: n_heads %d is not >= 1", n_heads);
    if (head_dim < 2)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: head_dim %d is not >= 2", head_dim);
    if (rot_dim < 2 || rot_dim > head_dim || rot_dim % 2 != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: rot_dim %d must be even and in "
                                "2..head_dim (%d)",
                                rot_dim, head_dim);
    if (!(theta > 0.0f) || isinf(theta))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: theta %g is not a finite value > 0",
                                (double)theta);
    if (mode != CINFER_ROPE_NORM && mode != CINFER_ROPE_NEOX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: mode %d is neither NORM (0) nor NEOX "
                                "(2)",
                                (int)mode);
    TRY(need_f32_matrix(op, "x", x, cb->step.n_rows,
                        (int64_t)n_heads * head_dim));
    TRY(need_writable(op, "x", x));
    return cinfer_cpu_op_rope(cb, x->data, cb->step.positions, cb->step.n_rows,
                              n_heads, head_dim, rot_dim, theta, mode);
}

static cinfer_status cpu_kv_store(cinfer_backend *be, const cinfer_tensor *k,
                                  const cinfer_tensor *v,
                                  cinfer_tensor *k_cache,
                                  cinfer_tensor *v_cache)
{
    cinfer_cpu_backend *cb = cpu(be);
    const char *op = "kv_store";
    TRY(need_step(op, cb));
    TRY(need_cache(op, "k_cache", cb, k_cache));
    TRY(need_cache(op, "v_cache", cb, v_cache));
    TRY(need_writable(op, "k_cache", k_cache));
    TRY(need_writable(op, "v_cache", v_cache));
    if (k_cache == v_cache)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_store: k_cache and v_cache are the same "
                                "tensor");
    if (!same_shape(&k_cache->desc, &v_cache->desc)) {
        char b1[96], b2[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_store: v_cache %s is not shaped like "
                                "k_cache %s",
                                desc_str(&v_cache->desc, b1, sizeof b1),
                                desc_str(&k_cache->desc, b2, sizeof b2));
    }
    int64_t width = k_cache->desc.shape[2] * k_cache->desc.shape[3];
    TRY(need_f32_matrix(op, "k", k, cb->step.n_rows, width));
    TRY(need_f32_matrix(op, "v", v, cb->step.n_rows, width));
    int64_t n_slots = k_cache->desc.shape[0] * k_cache->desc.shape[1];
    if (cb->max_slot >= n_slots)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_store: step slot %d is outside the "
                                "cache's %lld slots",
                                (int)cb->max_slot, (long long)n_slots);
    cinfer_cpu_op_kv_store(cb, k->data, v->data, cb->step.slots,
                           cb->step.n_rows, width, k_cache->data,
                           k_cache->desc.dtype, v_cache->data,
                           v_cache->desc.dtype);
    return CINFER_OK;
}

static cinfer_status cpu_attention(cinfer_backend *be, const cinfer_tensor *q,
                                   const cinfer_tensor *k_cache,
                                   const cinfer_tensor *v_cache, int n_heads,
                                   int n_kv_heads, int head_dim, float scale,
                                   cinfer_tensor *out)
{
    cinfer_cpu_backend *cb = cpu(be);
    const char *op = "attention";
    TRY(need_step(op, cb));
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: n_heads %d must be a positive "
                                "multiple of n_kv_heads %d",
                                n_heads, n_kv_heads);
    if (head_dim < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: head_dim %d is not >= 1",
                                head_dim);
    if (!isfinite(scale))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: scale is not finite");
    TRY(need_cache(op, "k_cache", cb, k_cache));
    TRY(need_cache(op, "v_cache", cb, v_cache));
    const char *bad = NULL;
    if (k_cache->desc.shape[2] != n_kv_heads ||
        k_cache->desc.shape[3] != head_dim)
        bad = "k_cache";
    else if (!same_shape(&k_cache->desc, &v_cache->desc))
        bad = "v_cache";
    if (bad) {
        char buf[96];
        const cinfer_tensor *t = bad[0] == 'k' ? k_cache : v_cache;
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: %s must be [n_blocks, %d, "
                                "n_kv_heads = %d, head_dim = %d], got %s",
                                bad, (int)cb->step.block_size, n_kv_heads,
                                head_dim, desc_str(&t->desc, buf, sizeof buf));
    }
    int64_t width = (int64_t)n_heads * head_dim;
    TRY(need_f32_matrix(op, "q", q, cb->step.n_rows, width));
    TRY(need_f32_matrix(op, "out", out, cb->step.n_rows, width));
    TRY(need_writable(op, "out", out));
    if (out == q)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: out aliases q");
    int64_t n_blocks = k_cache->desc.shape[0];
    if (cb->min_block < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: step.block_tables[%d][%d] = %d is "
                                "negative",
                                (int)cb->min_block_seq, (int)cb->min_block_idx,
                                (int)cb->min_block);
    if (cb->max_block >= n_blocks)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: step.block_tables[%d][%d] = %d is "
                                "outside the cache's %lld blocks",
                                (int)cb->max_block_seq, (int)cb->max_block_idx,
                                (int)cb->max_block, (long long)n_blocks);
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
    a.out = out->data;
    return cinfer_cpu_op_attention(cb, &a);
}

static cinfer_status cpu_silu_mul(cinfer_backend *be,
                                  const cinfer_tensor *gate,
                                  const cinfer_tensor *up, cinfer_tensor *out)
{
    const char *op = "silu_mul";
    TRY(need_f32_matrix(op, "gate", gate, -1, -1));
    TRY(need_same_shape(op, "up", up, "gate", gate));
    TRY(need_same_shape(op, "out", out, "gate", gate));
    TRY(need_writable(op, "out", out));
    cinfer_cpu_op_silu_mul(cpu(be), gate->data, up->data, out->data,
                           cinfer_tensor_desc_nelems(&gate->desc));
    return CINFER_OK;
}

static cinfer_status cpu_gather_rows(cinfer_backend *be,
                                     const cinfer_tensor *x,
                                     cinfer_tensor *out)
{
    cinfer_cpu_backend *cb = cpu(be);
    const char *op = "gather_rows";
    TRY(need_step(op, cb));
    TRY(need_f32_matrix(op, "x", x, cb->step.n_rows, -1));
    TRY(need_f32_matrix(op, "out", out, cb->step.n_out, t_cols(x)));
    TRY(need_writable(op, "out", out));
    if (out == x)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gather_rows: out aliases x");
    cinfer_cpu_op_gather_rows(cb, x->data, cb->step.out_rows, cb->step.n_out,
                              t_cols(x), out->data);
    return CINFER_OK;
}

static const struct cinfer_backend_ops cpu_ops = {
    .destroy = cpu_destroy,
    .tensor_create = cpu_tensor_create,
    .tensor_create_weight = cpu_tensor_create_weight,
    .tensor_set_rows = cpu_tensor_set_rows,
    .tensor_destroy = cpu_tensor_destroy,
    .weight_borrows = cpu_weight_borrows,
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
    .all_reduce_sum = NULL, /* one rank */
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
