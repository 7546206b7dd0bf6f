/*
 * backend.c - the backend seam: every check, then the backend's slot.
 *
 * The cinfer_backend_* calls of backend.h validate their arguments here,
 * once for every backend (dtype, shape, aliasing, read-only weights, the
 * step's counts and indices against the tensors), with error messages that
 * name the op and the argument, and then call the backend's slot in the
 * ops table (backend_impl.h), which does arithmetic only. set_step keeps a
 * host copy of the checked step in the backend's base struct, with what
 * the later checks need (largest slot, position and block id); a device
 * backend's slot then uploads it. The fallbacks of optional slots live
 * here too.
 */
#include "backend_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr)                                                              \
    do {                                                                       \
        cinfer_status st_ = (expr);                                            \
        if (st_ != CINFER_OK)                                                  \
            return st_;                                                        \
    } while (0)

/* ---------------------------------------------------------------------- */
/* descriptors                                                             */
/* ---------------------------------------------------------------------- */

const cinfer_tensor_desc *cinfer_tensor_get_desc(const cinfer_tensor *t)
{
    return (const cinfer_tensor_desc *)(const void *)t;
}

int64_t cinfer_tensor_desc_nelems(const cinfer_tensor_desc *d)
{
    if (d->n_dims < 1 || d->n_dims > CINFER_MAX_DIMS)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < d->n_dims; i++) {
        if (d->shape[i] < 1 || n > INT64_MAX / d->shape[i])
            return 0;
        n *= d->shape[i];
    }
    return n;
}

size_t cinfer_tensor_desc_nbytes(const cinfer_tensor_desc *d)
{
    int64_t n = cinfer_tensor_desc_nelems(d);
    if (n == 0)
        return 0;
    int64_t last = d->shape[d->n_dims - 1];
    size_t row = cinfer_dtype_row_bytes(d->dtype, last);
    if (row == 0)
        return 0;
    size_t rows = (size_t)(n / last);
    if (rows > SIZE_MAX / row)
        return 0;
    return rows * row;
}

cinfer_tensor_desc cinfer_tensor_desc_make(cinfer_dtype dtype, int n_dims,
                                           const int64_t *shape)
{
    cinfer_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dtype;
    d.n_dims = n_dims;
    for (int i = 0; i < CINFER_MAX_DIMS; i++)
        d.shape[i] = (i < n_dims && shape) ? shape[i] : 1;
    return d;
}

/* ---------------------------------------------------------------------- */
/* argument checks                                                         */
/* ---------------------------------------------------------------------- */

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

#define t_rows cinfer_tensor_rows
#define t_cols cinfer_tensor_cols

static cinfer_status need_tensor(const char *op, const char *arg,
                                 const cinfer_tensor *t)
{
    if (!t)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s: %s is NULL", op,
                                arg);
    return CINFER_OK;
}

/* The calls a recording cannot hold (backend.h, graphs). */
static cinfer_status outside_graph(const char *op, const cinfer_backend *be)
{
    if (be->in_graph)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: called between graph_begin and "
                                "graph_end",
                                op);
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

static cinfer_status need_step(const char *op, const cinfer_backend *cb)
{
    if (!cb->has_step)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: no step set (call set_step first)", op);
    return CINFER_OK;
}

/* A KV cache [n_blocks, step.block_size, n_kv_heads, head_dim], F16/F32. */
static cinfer_status need_cache(const char *op, const char *arg,
                                const cinfer_backend *cb,
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


/* Makes *p hold at least n bytes (contents not kept): 0, or -1 without
 * memory (then *p is unchanged). */
static int reserve(void **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    size_t want = *cap + *cap / 2 > n ? *cap + *cap / 2 : n;
    void *q = malloc(want);
    if (!q)
        return -1;
    free(*p);
    *p = q;
    *cap = want;
    return 0;
}

/* ---------------------------------------------------------------------- */
/* lifetime and memory                                                     */
/* ---------------------------------------------------------------------- */

/* The common fields of a tensor a slot created. */
static void tensor_init(cinfer_tensor *t, const cinfer_tensor_desc *d,
                        size_t nbytes, int is_weight)
{
    t->desc = *d;
    t->nbytes = nbytes;
    t->cap_bytes = nbytes;
    t->is_weight = is_weight;
}

cinfer_status cinfer_backend_tensor_create(cinfer_backend *be,
                                           const cinfer_tensor_desc *desc,
                                           cinfer_tensor **out)
{
    size_t nbytes = 0;
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_create: out is NULL");
    *out = NULL;
    TRY(outside_graph("tensor_create", be));
    TRY(check_desc("tensor_create", desc, &nbytes));
    TRY(be->ops->tensor_create(be, desc, nbytes, out));
    tensor_init(*out, desc, nbytes, 0);
    return CINFER_OK;
}

cinfer_status cinfer_backend_tensor_create_weight(cinfer_backend *be,
                                                  const cinfer_tensor_desc *desc,
                                                  const void *data,
                                                  cinfer_tensor **out)
{
    size_t nbytes = 0;
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_create_weight: out is NULL");
    *out = NULL;
    TRY(outside_graph("tensor_create_weight", be));
    TRY(check_desc("tensor_create_weight", desc, &nbytes));
    if (!data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tensor_create_weight: data is NULL");
    TRY(be->ops->tensor_create_weight(be, desc, nbytes, data, out));
    tensor_init(*out, desc, nbytes, 1);
    return CINFER_OK;
}

/* The allocation (cap_bytes) keeps the row count the tensor was created
 * with, so a tensor shrunk by set_rows can grow back up to it. Rows keep
 * their byte offsets: the data is not moved. */
cinfer_status cinfer_backend_tensor_set_rows(cinfer_backend *be,
                                             cinfer_tensor *t, int64_t rows)
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

void cinfer_backend_tensor_destroy(cinfer_backend *be, cinfer_tensor *t)
{
    if (t)
        be->ops->tensor_destroy(be, t);
}

int cinfer_backend_weight_borrows(cinfer_backend *be, const cinfer_tensor *t)
{
    if (!t || !t->is_weight)
        return 0;
    return be->ops->weight_borrows ? be->ops->weight_borrows(be, t) : 1;
}

static int matmul_supports(cinfer_backend *be, cinfer_dtype dt)
{
    if (be->ops->matmul_supports)
        return be->ops->matmul_supports(be, dt);
    return dt == CINFER_DTYPE_F32 || dt == CINFER_DTYPE_F16 ||
           dt == CINFER_DTYPE_BF16 || dt == CINFER_DTYPE_Q8_0 ||
           dt == CINFER_DTYPE_Q4_0 || dt == CINFER_DTYPE_Q4_1;
}

int cinfer_backend_matmul_supports(cinfer_backend *be, cinfer_dtype dt)
{
    return be && matmul_supports(be, dt);
}

cinfer_status cinfer_backend_upload(cinfer_backend *be, cinfer_tensor *t,
                                    size_t offset, const void *src,
                                    size_t n_bytes)
{
    TRY(outside_graph("upload", be));
    TRY(check_range("upload", t, offset, src, n_bytes));
    TRY(need_writable("upload", "t", t));
    if (n_bytes == 0)
        return CINFER_OK;
    return be->ops->upload(be, t, offset, src, n_bytes);
}

cinfer_status cinfer_backend_download(cinfer_backend *be,
                                      const cinfer_tensor *t, size_t offset,
                                      void *dst, size_t n_bytes)
{
    TRY(outside_graph("download", be));
    TRY(check_range("download", t, offset, dst, n_bytes));
    if (n_bytes == 0)
        return CINFER_OK;
    return be->ops->download(be, t, offset, dst, n_bytes);
}

cinfer_status cinfer_backend_fill_zero(cinfer_backend *be, cinfer_tensor *t)
{
    TRY(need_tensor("fill_zero", "t", t));
    TRY(need_writable("fill_zero", "t", t));
    return be->ops->fill_zero(be, t);
}

cinfer_status cinfer_backend_synchronize(cinfer_backend *be)
{
    TRY(outside_graph("synchronize", be));
    return be->ops->synchronize(be);
}

int cinfer_backend_healthy(cinfer_backend *be)
{
    return be->ops->healthy ? be->ops->healthy(be) : 1;
}

cinfer_status cinfer_backend_memory(cinfer_backend *be, size_t *used_bytes,
                                    size_t *budget_bytes)
{
    *used_bytes = 0;
    *budget_bytes = 0;
    if (!be->ops->memory)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "%s backend: no device memory budget",
                                be->name);
    return be->ops->memory(be, used_bytes, budget_bytes);
}

cinfer_status cinfer_backend_reserve_scratch(
    cinfer_backend *be, const cinfer_backend_scratch_plan *p)
{
    if (!p || p->max_rows < 1 || p->max_k < 1 || p->n_heads < 1 ||
        p->head_dim < 1 || p->max_context < 1)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "reserve_scratch: every count of the plan "
                                "must be >= 1");
    TRY(outside_graph("reserve_scratch", be));
    return be->ops->reserve_scratch ? be->ops->reserve_scratch(be, p)
                                    : CINFER_OK;
}

const char *cinfer_backend_name(const cinfer_backend *be)
{
    return be->name;
}

const char *cinfer_backend_device_desc(const cinfer_backend *be)
{
    return be->device_desc;
}

void cinfer_backend_destroy(cinfer_backend *be)
{
    if (!be)
        return;
    free(be->step_buf);
    free(be->sort_buf);
    be->step_buf = be->sort_buf = NULL;
    be->ops->destroy(be);
}

/* ---------------------------------------------------------------------- */
/* step metadata                                                           */
/* ---------------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The smallest and largest block id rows read through `tables`: blocks
 * 0..last/block_size of each sequence with rows (seq_last[q] = its last
 * position, -1 = no rows), and where they are. */
typedef struct {
    int32_t min, max, min_seq, min_idx, max_seq, max_idx;
} table_range;

static table_range tables_range(const cinfer_step *s, const int32_t *tables,
                                const int32_t *seq_last)
{
    table_range t = {INT32_MAX, INT32_MIN, 0, 0, 0, 0};
    for (int64_t q = 0; q < s->n_seqs; q++) {
        if (seq_last[q] < 0)
            continue;
        const int32_t *bt = tables + q * s->max_blocks;
        for (int32_t i = 0; i <= seq_last[q] / s->block_size; i++) {
            if (bt[i] < t.min) {
                t.min = bt[i];
                t.min_seq = (int32_t)q;
                t.min_idx = i;
            }
            if (bt[i] > t.max) {
                t.max = bt[i];
                t.max_seq = (int32_t)q;
                t.max_idx = i;
            }
        }
    }
    return t;
}

/* Slots are >= 0 and no two rows share one; *max_slot = the largest. */
static cinfer_status check_slots(const char *what, const int32_t *slots,
                                 int64_t n, int32_t *sorted,
                                 int32_t *max_slot)
{
    *max_slot = 0;
    for (int64_t r = 0; r < n; r++) {
        if (slots[r] < 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: %s[%lld] = %d is negative",
                                    what, (long long)r, (int)slots[r]);
        *max_slot = slots[r] > *max_slot ? slots[r] : *max_slot;
    }
    memcpy(sorted, slots, (size_t)n * sizeof(int32_t));
    qsort(sorted, (size_t)n, sizeof(int32_t), cmp_i32);
    for (int64_t r = 1; r < n; r++)
        if (sorted[r] == sorted[r - 1])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "set_step: %s: slot %d is used by two rows",
                                    what, (int)sorted[r]);
    return CINFER_OK;
}

cinfer_status cinfer_backend_set_step(cinfer_backend *be, const cinfer_step *s)
{
    cinfer_backend *cb = be;
    if (!s)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "set_step: step is NULL");
    TRY(outside_graph("set_step", be));
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
    if (!s->swa_slots != !s->swa_block_tables)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "set_step: swa_slots and swa_block_tables "
                                "must be both set or both NULL");
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
        max_pos = s->positions[r] > max_pos ? s->positions[r] : max_pos;
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
    if (reserve(&cb->sort_buf, &cb->sort_cap, scratch) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "set_step: no memory");
    int32_t *sorted = cb->sort_buf;
    int32_t *seq_last = sorted + n;
    int32_t swa_max_slot = 0;
    TRY(check_slots("slots", s->slots, n, sorted, &max_slot));
    if (s->swa_slots)
        TRY(check_slots("swa_slots", s->swa_slots, n, sorted, &swa_max_slot));

    /* The block ids rows will read: blocks 0..last/block_size of each
     * sequence that has rows. Range-checked against the cache later. */
    for (int64_t q = 0; q < n_seqs; q++)
        seq_last[q] = -1;
    for (int64_t r = 0; r < n; r++)
        if (s->positions[r] > seq_last[s->row_seq[r]])
            seq_last[s->row_seq[r]] = s->positions[r];
    table_range tr = tables_range(s, s->block_tables, seq_last);
    table_range sr = {0, 0, 0, 0, 0, 0};
    if (s->swa_block_tables)
        sr = tables_range(s, s->swa_block_tables, seq_last);

    /* Copy: tokens, positions, row_seq, slots, out_rows, block_tables,
     * row_gen, then swa_slots and swa_block_tables. */
    int64_t n_swa = s->swa_slots ? n + n_table : 0;
    size_t total = (size_t)(5 * n + n_out + n_table + n_swa) * sizeof(int32_t);
    if (reserve(&cb->step_buf, &cb->step_cap, total) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "set_step: no memory");
    int32_t *p = cb->step_buf;
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
    if (s->swa_slots) {
        memcpy(p, s->swa_slots, (size_t)n * 4);
        c->swa_slots = p;
        p += n;
        memcpy(p, s->swa_block_tables, (size_t)n_table * 4);
        c->swa_block_tables = p;
        p += n_table;
    }
    if (s->row_gen) {
        uint8_t *g = (uint8_t *)p;
        for (int64_t r = 0; r < n; r++)
            g[r] = s->row_gen[r] ? 1 : 0;
        c->row_gen = g;
    }

    cb->max_slot = max_slot;
    cb->max_position = max_pos;
    cb->min_block = tr.min;
    cb->max_block = tr.max;
    cb->min_block_seq = tr.min_seq;
    cb->min_block_idx = tr.min_idx;
    cb->max_block_seq = tr.max_seq;
    cb->max_block_idx = tr.max_idx;
    cb->swa_max_slot = swa_max_slot;
    cb->swa_min_block = sr.min;
    cb->swa_max_block = sr.max;
    cb->swa_min_block_seq = sr.min_seq;
    cb->swa_min_block_idx = sr.min_idx;
    cb->swa_max_block_seq = sr.max_seq;
    cb->swa_max_block_idx = sr.max_idx;
    if (be->ops->set_step) {
        cinfer_status st = be->ops->set_step(be);
        if (st != CINFER_OK) {
            cb->has_step = 0;
            return st;
        }
    }
    cb->has_step = 1;
    return CINFER_OK;
}


/* ---------------------------------------------------------------------- */
/* ops                                                                     */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_backend_embed(cinfer_backend *be, const cinfer_tensor *table,
                               cinfer_tensor *out)
{
    const cinfer_backend *cb = be;
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
    return be->ops->embed(be, table, out);
}

/* rms_norm's checks. */
static cinfer_status check_rms_norm(const char *op, const cinfer_tensor *x,
                                    const cinfer_tensor *w, float eps,
                                    const cinfer_tensor *out)
{
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    TRY(need_tensor(op, "w", w));
    /* w covers the row, or a group of elements that divides it */
    int64_t g = w->desc.n_dims == 1 ? w->desc.shape[0] : 0;
    TRY(need_f32_vector(op, "w", w,
                        g >= 1 && t_cols(x) % g == 0 ? g : t_cols(x)));
    TRY(need_same_shape(op, "out", out, "x", x));
    TRY(need_writable(op, "out", out));
    if (!(eps >= 0.0f) || isinf(eps))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: eps %g is not a finite value >= 0", op,
                                (double)eps);
    return CINFER_OK;
}

cinfer_status cinfer_backend_rms_norm(cinfer_backend *be, const cinfer_tensor *x,
                                  const cinfer_tensor *w, float eps,
                                  cinfer_tensor *out)
{
    TRY(check_rms_norm("rms_norm", x, w, eps, out));
    return be->ops->rms_norm(be, x, w, eps, out);
}

/* matmul's checks. */
static cinfer_status check_matmul(cinfer_backend *be, int n_w,
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
        if (!matmul_supports(be, wd->dtype))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "matmul: w[%d] has type %s, which has no "
                                    "%s matmul kernel",
                                    i, cinfer_dtype_name(wd->dtype), be->name);
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
    return CINFER_OK;
}

cinfer_status cinfer_backend_matmul(cinfer_backend *be, int n_w,
                                const cinfer_tensor *const *w,
                                const cinfer_tensor *x,
                                cinfer_tensor *const *out)
{
    TRY(check_matmul(be, n_w, w, x, out));
    return be->ops->matmul(be, n_w, w, x, out);
}

cinfer_status cinfer_backend_matmul_silu_mul(cinfer_backend *be,
                                             const cinfer_tensor *w_gate,
                                             const cinfer_tensor *w_up,
                                             const cinfer_tensor *x,
                                             cinfer_tensor *gate,
                                             cinfer_tensor *up)
{
    const cinfer_tensor *w[2] = {w_gate, w_up};
    cinfer_tensor *out[2] = {gate, up};
    TRY(check_matmul(be, 2, w, x, out));
    if (w_gate->desc.shape[0] != w_up->desc.shape[0])
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "matmul_silu_mul: w_gate has %lld rows and "
                                "w_up %lld",
                                (long long)w_gate->desc.shape[0],
                                (long long)w_up->desc.shape[0]);
    if (be->ops->matmul_silu_mul)
        return be->ops->matmul_silu_mul(be, w_gate, w_up, x, gate, up);
    TRY(be->ops->matmul(be, 2, w, x, out));
    return be->ops->silu_mul(be, gate, up, gate);
}

cinfer_status cinfer_backend_add_bias(cinfer_backend *be, cinfer_tensor *x,
                                  const cinfer_tensor *b)
{
    const char *op = "add_bias";
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    TRY(need_writable(op, "x", x));
    TRY(need_f32_vector(op, "b", b, t_cols(x)));
    return be->ops->add_bias(be, x, b);
}

cinfer_status cinfer_backend_add(cinfer_backend *be, const cinfer_tensor *a,
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
    return be->ops->add(be, a, b, out);
}

cinfer_status cinfer_backend_add_rms_norm(cinfer_backend *be, cinfer_tensor *x,
                                          const cinfer_tensor *d,
                                          const cinfer_tensor *w, float eps,
                                          cinfer_tensor *out)
{
    const char *op = "add_rms_norm";
    TRY(check_rms_norm(op, x, w, eps, out));
    TRY(need_same_shape(op, "d", d, "x", x));
    TRY(need_writable(op, "x", x));
    if (out == x || out->data == x->data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "add_rms_norm: out must not alias x (x "
                                "keeps the sum)");
    if (be->ops->add_rms_norm)
        return be->ops->add_rms_norm(be, x, d, w, eps, out);
    TRY(be->ops->add(be, x, d, x));
    return be->ops->rms_norm(be, x, w, eps, out);
}

cinfer_status cinfer_backend_rope(cinfer_backend *be, cinfer_tensor *x,
                              int n_heads, int head_dim, int rot_dim,
                              float theta, cinfer_rope_mode mode)
{
    cinfer_rope_params p = {.theta = theta, .freq_scale = 1.0f,
                            .freq_factors = NULL, .mode = mode};
    return cinfer_backend_rope_ext(be, x, n_heads, head_dim, rot_dim, &p);
}

/* rope_ext's checks. */
static cinfer_status check_rope(const char *op, const cinfer_backend *cb,
                                const char *arg, const cinfer_tensor *x,
                                int n_heads, int head_dim, int rot_dim,
                                const cinfer_rope_params *p)
{
    TRY(need_step(op, cb));
    if (!p)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "rope: params is NULL");
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
    if (!(p->theta > 0.0f) || isinf(p->theta))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: theta %g is not a finite value > 0",
                                (double)p->theta);
    if (!(p->freq_scale > 0.0f) || isinf(p->freq_scale))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: freq_scale %g is not a finite value "
                                "> 0",
                                (double)p->freq_scale);
    for (int i = 0; p->freq_factors && i < rot_dim / 2; i++)
        if (!(p->freq_factors[i] > 0.0f) || isinf(p->freq_factors[i]))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "rope: freq_factors[%d] = %g is not a "
                                    "finite value > 0",
                                    i, (double)p->freq_factors[i]);
    if (p->mode != CINFER_ROPE_NORM && p->mode != CINFER_ROPE_NEOX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope: mode %d is neither NORM (0) nor NEOX "
                                "(2)",
                                (int)p->mode);
    TRY(need_f32_matrix(op, arg, x, cb->step.n_rows,
                        (int64_t)n_heads * head_dim));
    return need_writable(op, arg, x);
}

cinfer_status cinfer_backend_rope_ext(cinfer_backend *be, cinfer_tensor *x,
                                      int n_heads, int head_dim, int rot_dim,
                                      const cinfer_rope_params *p)
{
    TRY(check_rope("rope", be, "x", x, n_heads, head_dim, rot_dim, p));
    return be->ops->rope(be, x, n_heads, head_dim, rot_dim, p);
}

/* kv_store's checks, against the largest slot of the table it writes. */
static cinfer_status check_kv_store(const char *op, const cinfer_backend *cb,
                                    const cinfer_tensor *k,
                                    const cinfer_tensor *v,
                                    const cinfer_tensor *k_cache,
                                    const cinfer_tensor *v_cache,
                                    int32_t max_slot)
{
    TRY(need_step(op, cb));
    TRY(need_cache(op, "k_cache", cb, k_cache));
    TRY(need_cache(op, "v_cache", cb, v_cache));
    TRY(need_writable(op, "k_cache", k_cache));
    TRY(need_writable(op, "v_cache", v_cache));
    if (k_cache == v_cache)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: k_cache and v_cache are the same "
                                "tensor", op);
    if (!same_shape(&k_cache->desc, &v_cache->desc)) {
        char b1[96], b2[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: v_cache %s is not shaped like "
                                "k_cache %s", op,
                                desc_str(&v_cache->desc, b1, sizeof b1),
                                desc_str(&k_cache->desc, b2, sizeof b2));
    }
    int64_t width = k_cache->desc.shape[2] * k_cache->desc.shape[3];
    TRY(need_f32_matrix(op, "k", k, cb->step.n_rows, width));
    TRY(need_f32_matrix(op, "v", v, cb->step.n_rows, width));
    int64_t n_slots = k_cache->desc.shape[0] * k_cache->desc.shape[1];
    if (max_slot >= n_slots)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: step slot %d is outside the "
                                "cache's %lld slots", op,
                                (int)max_slot, (long long)n_slots);
    return CINFER_OK;
}

cinfer_status cinfer_backend_kv_store(cinfer_backend *be, const cinfer_tensor *k,
                                  const cinfer_tensor *v,
                                  cinfer_tensor *k_cache,
                                  cinfer_tensor *v_cache)
{
    TRY(check_kv_store("kv_store", be, k, v, k_cache, v_cache, be->max_slot));
    return be->ops->kv_store(be, k, v, k_cache, v_cache);
}

cinfer_status cinfer_backend_rope_kv_store(
    cinfer_backend *be, cinfer_tensor *q, int n_heads, cinfer_tensor *k,
    int n_kv_heads, const cinfer_tensor *v, int head_dim, int rot_dim,
    const cinfer_rope_params *p, cinfer_tensor *k_cache,
    cinfer_tensor *v_cache)
{
    const char *op = "rope_kv_store";
    TRY(check_rope(op, be, "q", q, n_heads, head_dim, rot_dim, p));
    TRY(check_rope(op, be, "k", k, n_kv_heads, head_dim, rot_dim, p));
    TRY(check_kv_store(op, be, k, v, k_cache, v_cache, be->max_slot));
    if (q == k || q->data == k->data || k == v || k->data == v->data ||
        q->data == v->data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rope_kv_store: q, k and v must be three "
                                "tensors");
    if (be->ops->rope_kv_store)
        return be->ops->rope_kv_store(be, q, n_heads, k, n_kv_heads, v,
                                      head_dim, rot_dim, p, k_cache, v_cache);
    TRY(be->ops->rope(be, q, n_heads, head_dim, rot_dim, p));
    TRY(be->ops->rope(be, k, n_kv_heads, head_dim, rot_dim, p));
    return be->ops->kv_store(be, k, v, k_cache, v_cache);
}

cinfer_status cinfer_backend_kv_store_swa(cinfer_backend *be,
                                          const cinfer_tensor *k,
                                          const cinfer_tensor *v,
                                          cinfer_tensor *k_cache,
                                          cinfer_tensor *v_cache)
{
    const char *op = "kv_store_swa";
    TRY(need_step(op, be));
    if (!be->ops->kv_store_swa)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "kv_store_swa: the %s backend has no "
                                "sliding-window KV pool",
                                cinfer_backend_name(be));
    if (!be->step.swa_slots)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_store_swa: the step has no swa_slots");
    TRY(check_kv_store(op, be, k, v, k_cache, v_cache, be->swa_max_slot));
    return be->ops->kv_store_swa(be, k, v, k_cache, v_cache);
}

cinfer_status cinfer_backend_attention(cinfer_backend *be, const cinfer_tensor *q,
                                   const cinfer_tensor *k_cache,
                                   const cinfer_tensor *v_cache, int n_heads,
                                   int n_kv_heads, int head_dim, float scale,
                                   cinfer_tensor *out)
{
    return cinfer_backend_attention_window(be, q, k_cache, v_cache, n_heads,
                                           n_kv_heads, head_dim, scale, 0,
                                           out);
}

cinfer_status cinfer_backend_attention_window(cinfer_backend *be,
                                              const cinfer_tensor *q,
                                              const cinfer_tensor *k_cache,
                                              const cinfer_tensor *v_cache,
                                              int n_heads, int n_kv_heads,
                                              int head_dim, float scale,
                                              int window, cinfer_tensor *out)
{
    const cinfer_backend *cb = be;
    const char *op = "attention";
    TRY(need_step(op, cb));
    if (window < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: window %d is negative", window);
    if (window > 0 && !be->ops->attention_window)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "attention: the %s backend has no "
                                "sliding-window attention",
                                cinfer_backend_name(be));
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
    /* a windowed layer reads the window pool's tables when the step has
     * them */
    const int swa = window > 0 && cb->step.swa_block_tables;
    const char *tab = swa ? "swa_block_tables" : "block_tables";
    int32_t lo = swa ? cb->swa_min_block : cb->min_block;
    int32_t hi = swa ? cb->swa_max_block : cb->max_block;
    if (lo < 0)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "attention: step.%s[%d][%d] = %d is negative", tab,
            (int)(swa ? cb->swa_min_block_seq : cb->min_block_seq),
            (int)(swa ? cb->swa_min_block_idx : cb->min_block_idx), (int)lo);
    if (hi >= n_blocks)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "attention: step.%s[%d][%d] = %d is outside the cache's %lld "
            "blocks", tab,
            (int)(swa ? cb->swa_max_block_seq : cb->max_block_seq),
            (int)(swa ? cb->swa_max_block_idx : cb->max_block_idx), (int)hi,
            (long long)n_blocks);
    if (window > 0)
        return be->ops->attention_window(be, q, k_cache, v_cache, n_heads,
                                         n_kv_heads, head_dim, scale, window,
                                         out);
    return be->ops->attention(be, q, k_cache, v_cache, n_heads, n_kv_heads,
                              head_dim, scale, out);
}

cinfer_status cinfer_backend_silu_mul(cinfer_backend *be,
                                  const cinfer_tensor *gate,
                                  const cinfer_tensor *up, cinfer_tensor *out)
{
    const char *op = "silu_mul";
    TRY(need_f32_matrix(op, "gate", gate, -1, -1));
    TRY(need_same_shape(op, "up", up, "gate", gate));
    TRY(need_same_shape(op, "out", out, "gate", gate));
    TRY(need_writable(op, "out", out));
    return be->ops->silu_mul(be, gate, up, out);
}

cinfer_status cinfer_backend_gelu_mul(cinfer_backend *be,
                                      const cinfer_tensor *gate,
                                      const cinfer_tensor *up,
                                      cinfer_tensor *out)
{
    const char *op = "gelu_mul";
    TRY(need_f32_matrix(op, "gate", gate, -1, -1));
    TRY(need_same_shape(op, "up", up, "gate", gate));
    TRY(need_same_shape(op, "out", out, "gate", gate));
    TRY(need_writable(op, "out", out));
    if (!be->ops->gelu_mul)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "gelu_mul: the %s backend has no GELU",
                                cinfer_backend_name(be));
    return be->ops->gelu_mul(be, gate, up, out);
}

cinfer_status cinfer_backend_scale(cinfer_backend *be, cinfer_tensor *x,
                                   float s)
{
    const char *op = "scale";
    TRY(need_tensor(op, "x", x));
    TRY(need_writable(op, "x", x));
    if (x->desc.dtype != CINFER_DTYPE_F32)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "scale: x must be F32, got %s",
                                cinfer_dtype_name(x->desc.dtype));
    if (!isfinite(s))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "scale: s is not finite");
    if (!be->ops->scale)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "scale: the %s backend has no scale op",
                                cinfer_backend_name(be));
    return be->ops->scale(be, x, s);
}

/* x [rows, n] F32 and `arg` v [rows] I32, n <= max_n: the shapes of
 * greedy, choose and logprobs. */
static cinfer_status check_choice(const char *op, const cinfer_tensor *x,
                                  const char *arg, const cinfer_tensor *v,
                                  int64_t max_n)
{
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    TRY(need_tensor(op, arg, v));
    if (v->desc.dtype != CINFER_DTYPE_I32 || v->desc.n_dims != 1 ||
        v->desc.shape[0] != t_rows(x)) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %s must be I32 [%lld], got %s", op, arg,
                                (long long)t_rows(x),
                                desc_str(&v->desc, buf, sizeof buf));
    }
    if (t_cols(x) > max_n)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: rows of %lld entries (at most %lld)", op,
                                (long long)t_cols(x), (long long)max_n);
    return CINFER_OK;
}

cinfer_status cinfer_backend_greedy(cinfer_backend *be, const cinfer_tensor *x,
                                    cinfer_tensor *out)
{
    TRY(check_choice("greedy", x, "out", out, (int64_t)1 << 28));
    TRY(need_writable("greedy", "out", out));
    if (!be->ops->greedy)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "greedy: the %s backend has no greedy op",
                                cinfer_backend_name(be));
    return be->ops->greedy(be, x, out);
}

cinfer_status cinfer_backend_choose(cinfer_backend *be, const cinfer_tensor *x,
                                    const cinfer_draw *draws,
                                    cinfer_tensor *out)
{
    TRY(check_choice("choose", x, "out", out, CINFER_CHOOSE_MAX_N));
    TRY(need_writable("choose", "out", out));
    if (!draws)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "choose: draws is NULL");
    for (int64_t r = 0; r < t_rows(x); r++) {
        const cinfer_draw *d = &draws[r];
        if (!(d->inv_t >= 0.0f && d->inv_t < INFINITY) ||
            !(d->min_w >= 0.0f && d->min_w <= 1.0f) ||
            !(d->u >= 0.0 && d->u < 1.0) || d->top_k < 0 ||
            d->top_k > CINFER_CHOOSE_MAX_K || d->top_k >= t_cols(x) ||
            !(d->top_p > 0.0f && d->top_p <= 1.0f))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "choose: draws[%lld] = {inv_t %g, min_w "
                                    "%g, u %g, top_k %d, top_p %.9g}: need "
                                    "inv_t finite and >= 0, min_w in [0, 1], "
                                    "u in [0, 1), top_k in 0..%d and below "
                                    "the row's %lld, top_p in (0, 1]",
                                    (long long)r, (double)d->inv_t,
                                    (double)d->min_w, d->u, (int)d->top_k,
                                    (double)d->top_p, CINFER_CHOOSE_MAX_K,
                                    (long long)t_cols(x));
    }
    if (!be->ops->choose)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "choose: the %s backend has no choose op",
                                cinfer_backend_name(be));
    return be->ops->choose(be, x, draws, out);
}

int cinfer_backend_has_choose(const cinfer_backend *be)
{
    return be && be->ops->choose != NULL;
}

cinfer_status cinfer_backend_edit_logits(cinfer_backend *be, cinfer_tensor *x,
                                         const cinfer_logit_edit *edits,
                                         int64_t n_edits)
{
    TRY(need_f32_matrix("edit_logits", "x", x, -1, -1));
    TRY(need_writable("edit_logits", "x", x));
    if (n_edits < 0 || n_edits > CINFER_EDIT_MAX || (n_edits > 0 && !edits))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "edit_logits: n_edits %lld (need 0..%lld, "
                                "edits not NULL)",
                                (long long)n_edits, (long long)CINFER_EDIT_MAX);
    const uint32_t known = CINFER_EDIT_BIAS | CINFER_EDIT_MASK |
                           CINFER_EDIT_REP | CINFER_EDIT_FREQ;
    for (int64_t i = 0; i < n_edits; i++) {
        const cinfer_logit_edit *d = &edits[i];
        const char *bad =
            d->row < 0 || d->row >= t_rows(x)         ? "row"
            : d->token < 0 || d->token >= t_cols(x)   ? "token"
            : (d->flags & ~known) != 0                ? "flags"
            : (d->flags & CINFER_EDIT_BIAS) &&
                    !(d->bias < INFINITY)             ? "bias"
            : (d->flags & CINFER_EDIT_REP) &&
                    !(d->rp > 0.0f && d->rp < INFINITY) ? "rp"
            : (d->flags & CINFER_EDIT_FREQ) &&
                    !(isfinite(d->fn) && isfinite(d->pres)) ? "fn/pres"
                                                      : NULL;
        if (bad)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "edit_logits: edits[%lld] = {row %d, token %d, flags %#x, "
                "bias %g, rp %g, fn %g, pres %g}: bad %s for x [%lld, %lld]",
                (long long)i, (int)d->row, (int)d->token,
                (unsigned)d->flags, (double)d->bias, (double)d->rp,
                (double)d->fn, (double)d->pres, bad, (long long)t_rows(x),
                (long long)t_cols(x));
    }
    if (!be->ops->edit_logits)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "edit_logits: the %s backend has no "
                                "edit_logits op",
                                cinfer_backend_name(be));
    return be->ops->edit_logits(be, x, edits, n_edits);
}

int cinfer_backend_has_edit_logits(const cinfer_backend *be)
{
    return be && be->ops->edit_logits != NULL;
}

cinfer_status cinfer_backend_unedit_logits(cinfer_backend *be,
                                           cinfer_tensor *x)
{
    TRY(need_f32_matrix("unedit_logits", "x", x, -1, -1));
    TRY(need_writable("unedit_logits", "x", x));
    if (!be->ops->unedit_logits)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "unedit_logits: the %s backend has no "
                                "unedit_logits op",
                                cinfer_backend_name(be));
    return be->ops->unedit_logits(be, x);
}

cinfer_status cinfer_backend_logprobs(cinfer_backend *be,
                                      const cinfer_tensor *x,
                                      const cinfer_tensor *tokens,
                                      const int32_t *n_top,
                                      cinfer_tensor *out)
{
    TRY(check_choice("logprobs", x, "tokens", tokens, CINFER_CHOOSE_MAX_N));
    TRY(need_tensor("logprobs", "out", out));
    TRY(need_writable("logprobs", "out", out));
    if (out->desc.dtype != CINFER_DTYPE_I32 || out->desc.n_dims != 2 ||
        out->desc.shape[0] != t_rows(x) ||
        out->desc.shape[1] != CINFER_ROW_LOGPROBS_WORDS) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "logprobs: out must be I32 [%lld, %lld], got "
                                "%s",
                                (long long)t_rows(x),
                                (long long)CINFER_ROW_LOGPROBS_WORDS,
                                desc_str(&out->desc, buf, sizeof buf));
    }
    if (t_rows(x) > 0 && !n_top)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "logprobs: n_top is NULL");
    for (int64_t r = 0; r < t_rows(x); r++)
        if (n_top[r] < -1 || n_top[r] > CINFER_LOGPROBS_MAX_TOP)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "logprobs: n_top[%lld] = %d (need -1 "
                                    "to %d)",
                                    (long long)r, (int)n_top[r],
                                    CINFER_LOGPROBS_MAX_TOP);
    if (!be->ops->logprobs)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "logprobs: the %s backend has no logprobs op",
                                cinfer_backend_name(be));
    if (t_rows(x) == 0)
        return CINFER_OK;
    return be->ops->logprobs(be, x, tokens, n_top, out);
}

int cinfer_backend_has_logprobs(const cinfer_backend *be)
{
    return be && be->ops->logprobs != NULL;
}

int cinfer_backend_has_greedy(const cinfer_backend *be)
{
    return be && be->ops->greedy != NULL;
}

int cinfer_backend_has_gemma_ops(const cinfer_backend *be)
{
    return be->ops->attention_window && be->ops->kv_store_swa &&
           be->ops->gelu_mul && be->ops->scale;
}

/* ---- graphs ------------------------------------------------------------ */

cinfer_status cinfer_backend_graph_begin(cinfer_backend *be, uint64_t key,
                                         cinfer_graph_mode *mode)
{
    if (!mode)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "graph_begin: mode is NULL");
    *mode = CINFER_GRAPH_EAGER;
    TRY(outside_graph("graph_begin", be));
    if (!be->has_step)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "graph_begin: no step was set");
    if (be->ops->graph_begin)
        TRY(be->ops->graph_begin(be, key, mode));
    be->in_graph = 1;
    be->graph_mode = *mode;
    return CINFER_OK;
}

cinfer_status cinfer_backend_graph_end(cinfer_backend *be, cinfer_status st)
{
    if (!be->in_graph)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "graph_end: no graph_begin before it");
    be->in_graph = 0;
    if (be->graph_mode == CINFER_GRAPH_EAGER)
        return st;
    return be->ops->graph_end(be, st);
}

int cinfer_backend_has_graphs(const cinfer_backend *be)
{
    return be && be->ops->graph_begin != NULL && !be->graphs_off;
}

void cinfer_backend_graph_stats_get(const cinfer_backend *be,
                                    cinfer_backend_graph_stats *out)
{
    memset(out, 0, sizeof *out);
    if (be && be->ops->graph_stats)
        be->ops->graph_stats(be, out);
}

cinfer_status cinfer_backend_gather_rows(cinfer_backend *be,
                                     const cinfer_tensor *x,
                                     cinfer_tensor *out)
{
    const cinfer_backend *cb = be;
    const char *op = "gather_rows";
    TRY(need_step(op, cb));
    TRY(need_f32_matrix(op, "x", x, cb->step.n_rows, -1));
    TRY(need_f32_matrix(op, "out", out, cb->step.n_out, t_cols(x)));
    TRY(need_writable(op, "out", out));
    if (out == x)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "gather_rows: out aliases x");
    return be->ops->gather_rows(be, x, out);
}


/* ---------------------------------------------------------------------- */
/* collectives                                                             */
/* ---------------------------------------------------------------------- */

cinfer_comm *cinfer_backend_comm(const cinfer_backend *be)
{
    return be->comm;
}

cinfer_status cinfer_backend_all_reduce_sum(cinfer_backend *be,
                                            cinfer_tensor *t)
{
    const char *op = "all_reduce_sum";
    TRY(need_tensor(op, "t", t));
    if (t->desc.dtype != CINFER_DTYPE_F32) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "all_reduce_sum: t must be F32, got %s",
                                desc_str(&t->desc, buf, sizeof buf));
    }
    TRY(need_writable(op, "t", t));
    if (cinfer_comm_size(be->comm) <= 1)
        return CINFER_OK;
    if (!be->ops->all_reduce_sum)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "all_reduce_sum: the %s backend has no "
                                "collectives",
                                be->name);
    return be->ops->all_reduce_sum(be, t);
}

cinfer_status cinfer_backend_all_gather(cinfer_backend *be,
                                        const cinfer_tensor *x,
                                        cinfer_tensor *out)
{
    const char *op = "all_gather";
    TRY(need_f32_matrix(op, "x", x, -1, -1));
    int64_t size = cinfer_comm_size(be->comm);
    if (x->desc.n_dims != 2) {
        char buf[96];
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "all_gather: x must be F32 [n, c], got %s",
                                desc_str(&x->desc, buf, sizeof buf));
    }
    TRY(need_f32_matrix(op, "out", out, size * t_rows(x), t_cols(x)));
    if (out->desc.n_dims != 2)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "all_gather: out must be 2-D [size * n, c]");
    TRY(need_writable(op, "out", out));
    if (out == x)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "all_gather: out aliases x");
    if (!be->ops->all_gather)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "all_gather: the %s backend has no "
                                "collectives",
                                be->name);
    return be->ops->all_gather(be, x, out);
}
