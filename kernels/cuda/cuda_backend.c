/*
 * cuda_backend.c - the CUDA implementation of the backend ops table.
 *
 * This file owns the backend object: the device, one stream, a cuBLAS
 * handle, tensors in device memory, the step's metadata on the device and
 * one scratch buffer. Arguments arrive checked (kernels/backend.c); the
 * arithmetic is the launchers of the .cu files beside this one, each
 * enqueued on the stream. Nothing waits for the device except download,
 * upload (so the caller's host buffer is free when it returns),
 * synchronize and set_step (before it reuses its pinned staging buffer).
 *
 * Memory is planned, not discovered: the backend may hold
 * memory_fraction of the device's memory (its budget). Weights (copied:
 * they keep their file type, F16/BF16 for cuBLAS, Q8_0/Q4_x for the
 * quantized kernels), activations and the scratch of the largest step
 * (reserve_scratch) are allocated first; the model then gives the KV cache
 * what is left (cinfer_backend_memory). An allocation past the budget
 * fails with CINFER_E_NOMEM naming the sizes.
 *
 * The step's metadata (tokens, positions, row_seq, slots, out_rows, block
 * tables, and attention's plan) is packed into one pinned host buffer and
 * sent in one copy; the ops read it from fixed offsets of one device
 * buffer.
 *
 * Faults: every CUDA and cuBLAS call goes through the check macros
 * (cuda_check.h), so a failure returns CINFER_E_DEVICE with the statement,
 * file and line, and the engine fails that step's requests. A sticky error
 * (the context is unusable) marks the backend unhealthy: healthy() turns
 * 0 and the server reports NOT_SERVING.
 *
 * Collectives go to the rank's NCCL communicator (comm_nccl.c) on the
 * backend's stream. With more than one rank, every wait for the stream
 * (synchronize, download, upload) polls it through cinfer_comm_nccl_wait,
 * bounded by the communicator's timeout, so a peer that never reaches a
 * collective fails the step (the communicator aborted) instead of hanging
 * cudaStreamSynchronize.
 *
 * The same file links against the CUDA runtime and cuBLAS for a device,
 * and against tests/cudasim/ (the CPU harness) in the test builds.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend_impl.h"
#include "../comm_impl.h"
#include "attention.cuh"
#include "comm_nccl.h"
#include "cuda_check.h"
#include "elementwise.cuh"
#include "embed.cuh"
#include "gather.cuh"
#include "kv_store.cuh"
#include "matmul.cuh"
#include "norm.cuh"
#include "rope.cuh"
#include "sample.cuh"

/* Host memory an op's kernel reads: staged in pinned memory, copied to the
 * device on the stream ahead of the launch. */
typedef struct {
    void *h, *d;
    size_t cap;          /* bytes of each */
    cudaEvent_t copied;  /* the last copy out of h is done */
    const char *what;
} staged;

/* One recorded step (graph_begin): the caller's key and the partition
 * count of attention's decode launch, which the step's contexts set. */
typedef struct {
    uint64_t key;
    int32_t parts;
    unsigned gen;
    uint64_t used; /* the tick of its last replay */
    cudaGraphExec_t exec;
} cuda_graph;

/* Recordings held at most: 9 row buckets times the partition classes of
 * a long context, with room. Past it the least recently used goes. */
#define CUDA_GRAPHS_MAX 96

typedef struct {
    struct cinfer_backend base; /* first: backend.c reads it */
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    int unhealthy;           /* a sticky error was seen */
    int invariant;           /* batch_invariant (dense.cuh for floats) */

    size_t budget; /* bytes the backend may hold */
    size_t used;   /* bytes it holds */

    /* The step: packed on the host (pinned), copied in one go. */
    staged meta;
    const int32_t *d_tokens, *d_positions, *d_row_seq, *d_slots, *d_out_rows,
        *d_tables, *d_plan;
    cinfer_cuda_attn_plan_info plan;

    /* choose's draws and edit_logits' entries: staged (pinned), copied
     * before their launches. */
    staged draws, edits, n_top;
    /* The last edit_logits call: the values it replaced, where. */
    float *d_raw;
    size_t raw_cap;        /* floats */
    const void *edited;    /* its tensor's data */
    int64_t n_edited;

    void *scratch; /* device scratch of matmul and attention */
    size_t scratch_bytes;
    void *blas_ws; /* cuBLAS's workspace, ours so that graphs may hold it */
    size_t blas_ws_bytes;

    /* Graphs (graph_begin). A recording holds the device addresses of the
     * step's metadata, the scratch and the tensors it touched: gen counts
     * the moves and frees of those, and a recording of an older gen is
     * dropped. */
    int eager;               /* created eager: never record */
    int32_t parts_cap;       /* attention partitions the reserved scratch
                                holds (0 = reserve_scratch not called) */
    unsigned gen;
    cuda_graph graphs[CUDA_GRAPHS_MAX];
    int n_graphs;
    uint64_t tick;           /* last-use clock of the recordings */
    int capturing;           /* between a CAPTURE begin and its end */
    uint64_t cap_key;        /* that recording's key and partitions */
    int32_t cap_parts;
    unsigned cap_gen;
    cinfer_backend_graph_stats gstats;
} cuda_backend;

static cuda_backend *cu(cinfer_backend *be) { return (cuda_backend *)be; }

/* Every status from a launcher or a check passes through here, so a sticky
 * fault is noticed whichever op hit it. A failed runtime call also leaves
 * its error as the thread's last error, which the next launch check
 * (cudaGetLastError after a launch) would report as its own: the next step
 * would fail too. It is cleared here (a sticky error stays: every call
 * returns it), and a sticky one marks the backend unhealthy. */
static cinfer_status seen(cuda_backend *cb, cinfer_status st)
{
    if (st == CINFER_E_DEVICE) {
        /* A cuBLAS call reports a fault as its own status; the context's
         * sticky error, if any, is in the last error. */
        cudaError_t last = cudaGetLastError();
        if (cinfer_cuda_sticky_seen() ||
            cinfer_cuda_error_is_sticky((int)last))
            cb->unhealthy = 1;
    }
    return st;
}

/* ---------------------------------------------------------------------- */
/* device memory within the budget                                         */
/* ---------------------------------------------------------------------- */

static cinfer_status dev_alloc(cuda_backend *cb, size_t n, const char *what,
                               void **out)
{
    *out = NULL;
    if (n > cb->budget || cb->used > cb->budget - n)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "cuda: %s needs %zu bytes but %zu of the "
                                "budget of %zu bytes (device %d) are in use",
                                what, n, cb->used, cb->budget, cb->device);
    CINFER_CUDA_TRY(cudaMalloc(out, n ? n : 1));
    cb->used += n;
    return CINFER_OK;
}

static void dev_free(cuda_backend *cb, void *p, size_t n)
{
    if (!p)
        return;
    cudaFree(p); /* an error here has nothing left to fail */
    cb->used -= n;
}

static void staged_free(cuda_backend *cb, staged *b)
{
    dev_free(cb, b->d, b->cap);
    if (b->h)
        cudaFreeHost(b->h);
    if (b->copied)
        cudaEventDestroy(b->copied);
}

/* Makes b hold n bytes (both copies grown on demand, contents lost) once
 * the last copy out of b->h is done, so that the caller may write there. */
static cinfer_status staged_reserve(cuda_backend *cb, staged *b, size_t n)
{
    CINFER_CUDA_TRY(cudaEventSynchronize(b->copied));
    if (n <= b->cap)
        return CINFER_OK;
    cb->gen++; /* the device copy moves */
    size_t cap = n < 4096 ? 4096 : n + n / 2;
    if (b->h)
        CINFER_CUDA_TRY(cudaFreeHost(b->h));
    b->h = NULL;
    dev_free(cb, b->d, b->cap);
    b->d = NULL;
    b->cap = 0;
    CINFER_CUDA_TRY(cudaMallocHost(&b->h, cap));
    cinfer_status st = dev_alloc(cb, cap, b->what, &b->d);
    if (st != CINFER_OK)
        return st;
    b->cap = cap;
    return CINFER_OK;
}

/* The first n bytes of b->h to b->d, on the stream. */
static cinfer_status staged_send(cuda_backend *cb, staged *b, size_t n)
{
    CINFER_CUDA_TRY(cudaMemcpyAsync(b->d, b->h, n, cudaMemcpyHostToDevice,
                                    cb->stream));
    CINFER_CUDA_TRY(cudaEventRecord(b->copied, cb->stream));
    return CINFER_OK;
}

/* n bytes (> 0) from src to the device copy of b, on the stream. */
static cinfer_status put_staged(cuda_backend *cb, staged *b, const void *src,
                                size_t n)
{
    cinfer_status st = staged_reserve(cb, b, n);
    if (st != CINFER_OK)
        return st;
    memcpy(b->h, src, n);
    return staged_send(cb, b, n);
}

/* Makes the scratch buffer at least n bytes. */
static cinfer_status need_scratch(cuda_backend *cb, size_t n)
{
    if (n <= cb->scratch_bytes)
        return CINFER_OK;
    /* graph_begin records only steps the reserved scratch holds */
    if (cb->capturing)
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "cuda: a recorded step needs %zu bytes of "
                                "scratch, %zu are reserved",
                                n, cb->scratch_bytes);
    cb->gen++;
    dev_free(cb, cb->scratch, cb->scratch_bytes);
    cb->scratch = NULL;
    cb->scratch_bytes = 0;
    cinfer_status st = dev_alloc(cb, n, "scratch", &cb->scratch);
    if (st == CINFER_OK)
        cb->scratch_bytes = n;
    return st;
}

/* ---------------------------------------------------------------------- */
/* lifetime and memory                                                     */
/* ---------------------------------------------------------------------- */

static cinfer_status stream_wait(cuda_backend *cb);

/* Makes the backend's device the calling thread's current one. The entry
 * points that allocate, copy or start a step call it: a tensor-parallel
 * group creates every rank's tensors from one thread, and rank 0's steps
 * run on the engine thread, whose current device the other ranks' set-up
 * moved. Within a step (set_step to synchronize) the ops run on the
 * thread that started it. */
static cinfer_status use_device(cuda_backend *cb)
{
    int cur = -1;
    CINFER_CUDA_TRY(cudaGetDevice(&cur));
    if (cur != cb->device)
        CINFER_CUDA_TRY(cudaSetDevice(cb->device));
    return CINFER_OK;
}

static void cuda_destroy(cinfer_backend *be)
{
    cuda_backend *cb = cu(be);
    (void)use_device(cb);
    /* Bounded with peers; past a failure there the communicator is
     * aborted, which ends its kernels, and the rest drains. */
    if (cb->stream && stream_wait(cb) != CINFER_OK)
        cudaStreamSynchronize(cb->stream);
    for (int i = 0; i < cb->n_graphs; i++)
        cudaGraphExecDestroy(cb->graphs[i].exec);
    dev_free(cb, cb->scratch, cb->scratch_bytes);
    dev_free(cb, cb->blas_ws, cb->blas_ws_bytes);
    staged_free(cb, &cb->meta);
    staged_free(cb, &cb->draws);
    staged_free(cb, &cb->edits);
    staged_free(cb, &cb->n_top);
    dev_free(cb, cb->d_raw, cb->raw_cap * sizeof(float));
    if (cb->cublas)
        cublasDestroy(cb->cublas);
    if (cb->stream)
        cudaStreamDestroy(cb->stream);
    free(cb);
}

static cinfer_status cuda_tensor_create(cinfer_backend *be,
                                        const cinfer_tensor_desc *desc,
                                        size_t nbytes, cinfer_tensor **out)
{
    cuda_backend *cb = cu(be);
    cinfer_status st = seen(cb, use_device(cb));
    if (st != CINFER_OK)
        return st;
    cinfer_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM, "tensor_create: no memory");
    st = seen(cb, dev_alloc(cb, nbytes, "a tensor", &t->data));
    if (st != CINFER_OK) {
        free(t);
        return st;
    }
    t->cap_bytes = nbytes; /* dev_free reads it if the caller frees now */
    *out = t;
    return CINFER_OK;
}

static void cuda_tensor_destroy(cinfer_backend *be, cinfer_tensor *t)
{
    (void)use_device(cu(be));
    cu(be)->gen++; /* a recording may name it */
    dev_free(cu(be), t->data, t->cap_bytes);
    free(t);
}

/* Waits for the stream; with peers, bounded (comm_nccl.h). */
static cinfer_status stream_wait(cuda_backend *cb)
{
    if (cinfer_comm_size(cb->base.comm) > 1) {
        cinfer_status st = cinfer_comm_nccl_wait(cb->base.comm, cb->stream);
        if (st != CINFER_OK)
            return st;
    }
    CINFER_CUDA_TRY(cudaStreamSynchronize(cb->stream));
    return CINFER_OK;
}

static cinfer_status copy_in(cuda_backend *cb, void *dst, const void *src,
                             size_t n)
{
    cinfer_status st = use_device(cb);
    if (st != CINFER_OK)
        return st;
    CINFER_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice,
                                    cb->stream));
    /* The caller may reuse src at once. */
    return stream_wait(cb);
}

static cinfer_status cuda_tensor_create_weight(cinfer_backend *be,
                                               const cinfer_tensor_desc *desc,
                                               size_t nbytes,
                                               const void *data,
                                               cinfer_tensor **out)
{
    cuda_backend *cb = cu(be);
    cinfer_status st = cuda_tensor_create(be, desc, nbytes, out);
    if (st != CINFER_OK)
        return st;
    st = seen(cb, copy_in(cb, (*out)->data, data, nbytes));
    if (st != CINFER_OK) {
        cuda_tensor_destroy(be, *out);
        *out = NULL;
    }
    return st;
}

static int cuda_weight_borrows(cinfer_backend *be, const cinfer_tensor *t)
{
    return 0; /* weights are copied to the device */
}

static int cuda_matmul_supports(cinfer_backend *be, cinfer_dtype dt)
{
    return dt == CINFER_DTYPE_F32 || dt == CINFER_DTYPE_F16 ||
           dt == CINFER_DTYPE_BF16 || dt == CINFER_DTYPE_Q8_0 ||
           dt == CINFER_DTYPE_Q4_0 || dt == CINFER_DTYPE_Q4_1;
}

static cinfer_status cuda_upload(cinfer_backend *be, cinfer_tensor *t,
                                 size_t offset, const void *src, size_t n)
{
    cuda_backend *cb = cu(be);
    return seen(cb, copy_in(cb, (char *)t->data + offset, src, n));
}

static cinfer_status download(cuda_backend *cb, const cinfer_tensor *t,
                              size_t offset, void *dst, size_t n)
{
    cinfer_status st = use_device(cb);
    if (st != CINFER_OK)
        return st;
    CINFER_CUDA_TRY(cudaMemcpyAsync(dst, (const char *)t->data + offset, n,
                                    cudaMemcpyDeviceToHost, cb->stream));
    return stream_wait(cb);
}

static cinfer_status cuda_download(cinfer_backend *be, const cinfer_tensor *t,
                                   size_t offset, void *dst, size_t n)
{
    return seen(cu(be), download(cu(be), t, offset, dst, n));
}

static cinfer_status fill_zero(cuda_backend *cb, cinfer_tensor *t)
{
    cinfer_status st = use_device(cb);
    if (st != CINFER_OK)
        return st;
    CINFER_CUDA_TRY(cudaMemsetAsync(t->data, 0, t->nbytes, cb->stream));
    return CINFER_OK;
}

static cinfer_status cuda_fill_zero(cinfer_backend *be, cinfer_tensor *t)
{
    return seen(cu(be), fill_zero(cu(be), t));
}

static cinfer_status synchronize(cuda_backend *cb)
{
    cinfer_status st = use_device(cb);
    if (st != CINFER_OK)
        return st;
    return stream_wait(cb);
}

static cinfer_status cuda_synchronize(cinfer_backend *be)
{
    return seen(cu(be), synchronize(cu(be)));
}

static int cuda_healthy(cinfer_backend *be)
{
    return !cu(be)->unhealthy && !cinfer_cuda_sticky_seen();
}

static cinfer_status cuda_memory(cinfer_backend *be, size_t *used,
                                 size_t *budget)
{
    *used = cu(be)->used;
    *budget = cu(be)->budget;
    return CINFER_OK;
}

static size_t scratch_for(const cinfer_backend_scratch_plan *p)
{
    size_t mm = cinfer_cuda_matmul_scratch_bytes(p->max_rows, p->max_k);
    size_t at = cinfer_cuda_attention_scratch_bytes(p->max_rows, p->n_heads,
                                                    p->head_dim,
                                                    p->max_context);
    return mm > at ? mm : at;
}

static cinfer_status cuda_reserve_scratch(cinfer_backend *be,
                                          const cinfer_backend_scratch_plan *p)
{
    cuda_backend *cb = cu(be);
    cinfer_status st = seen(cb, use_device(cb));
    if (st == CINFER_OK)
        st = seen(cb, need_scratch(cb, scratch_for(p)));
    if (st == CINFER_OK) /* what attention's share of it holds */
        cb->parts_cap = (int32_t)((p->max_context +
                                   CINFER_CUDA_ATTN_PART_TOKENS - 1) /
                                  CINFER_CUDA_ATTN_PART_TOKENS);
    return st;
}

/* ---------------------------------------------------------------------- */
/* step metadata                                                           */
/* ---------------------------------------------------------------------- */

static cinfer_status upload_step(cuda_backend *cb)
{
    const cinfer_step *s = &cb->base.step;
    size_t n = (size_t)s->n_rows, n_table = (size_t)s->n_seqs * s->max_blocks;
    size_t n_plan = cinfer_cuda_attention_plan_ints(s);
    size_t total = 4 * n + (size_t)s->n_out + n_table + n_plan;
    /* The previous step's copy must be done before the staging buffer is
     * rewritten (it is, unless the caller enqueued ops and never waited).
     * With peers the wait is bounded: a collective may be ahead of it. */
    if (cinfer_comm_size(cb->base.comm) > 1) {
        cinfer_status st = stream_wait(cb);
        if (st != CINFER_OK)
            return st;
    }
    cinfer_status st = staged_reserve(cb, &cb->meta, total * sizeof(int32_t));
    if (st != CINFER_OK)
        return st;
    int32_t *h = cb->meta.h;
    const int32_t *d = cb->meta.d;
#define PUT(src, count, dptr)                                                  \
    do {                                                                       \
        if ((count) > 0)                                                       \
            memcpy(h, (src), (count) * sizeof(int32_t));                       \
        dptr = d;                                                              \
        h += (count);                                                          \
        d += (count);                                                          \
    } while (0)
    PUT(s->tokens, n, cb->d_tokens);
    PUT(s->positions, n, cb->d_positions);
    PUT(s->row_seq, n, cb->d_row_seq);
    PUT(s->slots, n, cb->d_slots);
    PUT(s->out_rows, (size_t)s->n_out, cb->d_out_rows);
    PUT(s->block_tables, n_table, cb->d_tables);
#undef PUT
    st = cinfer_cuda_attention_plan(s, h, n_plan, &cb->plan);
    if (st != CINFER_OK)
        return st;
    cb->d_plan = d;
    return staged_send(cb, &cb->meta, total * sizeof(int32_t));
}

static cinfer_status cuda_set_step(cinfer_backend *be)
{
    cinfer_status st = seen(cu(be), use_device(cu(be)));
    if (st != CINFER_OK)
        return st;
    return seen(cu(be), upload_step(cu(be)));
}

/* ---------------------------------------------------------------------- */
/* ops                                                                     */
/* ---------------------------------------------------------------------- */

static cinfer_status cuda_embed(cinfer_backend *be, const cinfer_tensor *table,
                                cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_embed(cb->stream, table->desc.dtype,
                                      table->data, table->desc.shape[0],
                                      table->desc.shape[1], cb->d_tokens,
                                      be->step.n_rows, out->data));
}

static cinfer_status cuda_rms_norm(cinfer_backend *be, const cinfer_tensor *x,
                                   const cinfer_tensor *w, float eps,
                                   cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    /* w of g elements: each row is cols / g rows of g (a per-head norm) */
    int64_t g = w->desc.shape[0];
    return seen(cb, cinfer_cuda_rms_norm(cb->stream, x->data, w->data, eps,
                                         out->data,
                                         cinfer_tensor_rows(x) *
                                             (cinfer_tensor_cols(x) / g),
                                         g));
}

/* One launch for a whole-row weight; a per-group one takes the two ops. */
static cinfer_status cuda_add_rms_norm(cinfer_backend *be, cinfer_tensor *x,
                                       const cinfer_tensor *d,
                                       const cinfer_tensor *w, float eps,
                                       cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    const int64_t g = w->desc.shape[0], cols = cinfer_tensor_cols(x);
    if (g != cols) {
        cinfer_status st = seen(
            cb, cinfer_cuda_add(cb->stream, x->data, d->data, x->data,
                                cinfer_tensor_desc_nelems(&x->desc)));
        return st != CINFER_OK ? st : cuda_rms_norm(be, x, w, eps, out);
    }
    return seen(cb, cinfer_cuda_add_rms_norm(cb->stream, x->data, d->data,
                                             w->data, eps, out->data,
                                             cinfer_tensor_rows(x), cols));
}

/* The scratch of a matmul of x, and its weights as the kernels take them
 * (mw[n_w]). */
static cinfer_status mm_prepare(cuda_backend *cb, int n_w,
                                const cinfer_tensor *const *w,
                                const cinfer_tensor *x,
                                cinfer_tensor *const *out,
                                cinfer_cuda_mm_weight *mw)
{
    int32_t n = (int32_t)cinfer_tensor_rows(x);
    int64_t k = cinfer_tensor_cols(x);
    cinfer_status st = seen(cb, need_scratch(cb, cinfer_cuda_matmul_scratch_bytes(n, k)));
    for (int i = 0; st == CINFER_OK && i < n_w; i++) {
        mw[i].dtype = w[i]->desc.dtype;
        mw[i].data = w[i]->data;
        mw[i].n_out = w[i]->desc.shape[0];
        mw[i].out = out[i]->data;
    }
    return st;
}

static cinfer_status cuda_matmul(cinfer_backend *be, int n_w,
                                 const cinfer_tensor *const *w,
                                 const cinfer_tensor *x,
                                 cinfer_tensor *const *out)
{
    cuda_backend *cb = cu(be);
    cinfer_cuda_mm_weight mw[4];
    cinfer_status st = mm_prepare(cb, n_w, w, x, out, mw);
    if (st != CINFER_OK)
        return st;
    return seen(cb, cinfer_cuda_matmul(cb->stream, cb->cublas, n_w, mw,
                                       x->data, (int32_t)cinfer_tensor_rows(x),
                                       cinfer_tensor_cols(x), cb->scratch,
                                       cb->scratch_bytes, cb->invariant));
}

static cinfer_status cuda_matmul_silu_mul(cinfer_backend *be,
                                          const cinfer_tensor *w_gate,
                                          const cinfer_tensor *w_up,
                                          const cinfer_tensor *x,
                                          cinfer_tensor *gate,
                                          cinfer_tensor *up)
{
    cuda_backend *cb = cu(be);
    const cinfer_tensor *w[2] = {w_gate, w_up};
    cinfer_tensor *out[2] = {gate, up};
    cinfer_cuda_mm_weight mw[2];
    cinfer_status st = mm_prepare(cb, 2, w, x, out, mw);
    if (st != CINFER_OK)
        return st;
    int32_t n = (int32_t)cinfer_tensor_rows(x);
    int64_t k = cinfer_tensor_cols(x);
    return seen(cb, cinfer_cuda_matmul_silu_mul(cb->stream, cb->cublas, mw,
                                                x->data, n, k, cb->scratch,
                                                cb->scratch_bytes,
                                                cb->invariant));
}

static cinfer_status cuda_add_bias(cinfer_backend *be, cinfer_tensor *x,
                                   const cinfer_tensor *b)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_add_bias(cb->stream, x->data, b->data,
                                         cinfer_tensor_rows(x),
                                         cinfer_tensor_cols(x)));
}

static cinfer_status cuda_add(cinfer_backend *be, const cinfer_tensor *a,
                              const cinfer_tensor *b, cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_add(cb->stream, a->data, b->data, out->data,
                                    cinfer_tensor_desc_nelems(&a->desc)));
}

static cinfer_status cuda_rope(cinfer_backend *be, cinfer_tensor *x,
                               int n_heads, int head_dim, int rot_dim,
                               const cinfer_rope_params *p)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_rope(cb->stream, x->data, cb->d_positions,
                                     be->step.n_rows, n_heads, head_dim,
                                     rot_dim, p->theta, p->freq_scale,
                                     p->freq_factors, (int)p->mode));
}

static cinfer_status cuda_kv_store(cinfer_backend *be, const cinfer_tensor *k,
                                   const cinfer_tensor *v,
                                   cinfer_tensor *k_cache,
                                   cinfer_tensor *v_cache)
{
    cuda_backend *cb = cu(be);
    int64_t width = k_cache->desc.shape[2] * k_cache->desc.shape[3];
    return seen(cb, cinfer_cuda_kv_store(cb->stream, k->data, v->data,
                                         cb->d_slots, be->step.n_rows, width,
                                         k_cache->data, k_cache->desc.dtype,
                                         v_cache->data,
                                         v_cache->desc.dtype));
}

static cinfer_status cuda_rope_kv_store(cinfer_backend *be, cinfer_tensor *q,
                                        int n_heads, cinfer_tensor *k,
                                        int n_kv_heads, const cinfer_tensor *v,
                                        int head_dim, int rot_dim,
                                        const cinfer_rope_params *p,
                                        cinfer_tensor *k_cache,
                                        cinfer_tensor *v_cache)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_rope_kv_store(
                        cb->stream, q->data, k->data, v->data,
                        cb->d_positions, cb->d_slots, be->step.n_rows,
                        n_heads, n_kv_heads, head_dim, rot_dim, p->theta,
                        p->freq_scale, p->freq_factors, (int)p->mode,
                        k_cache->data, k_cache->desc.dtype, v_cache->data,
                        v_cache->desc.dtype));
}

static cinfer_status cuda_attention(cinfer_backend *be, const cinfer_tensor *q,
                                    const cinfer_tensor *k_cache,
                                    const cinfer_tensor *v_cache, int n_heads,
                                    int n_kv_heads, int head_dim, float scale,
                                    cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    const cinfer_step *s = &be->step;
    size_t need = cinfer_cuda_attention_scratch_bytes(
        cb->plan.n_decode, n_heads, head_dim,
        cb->plan.max_parts * CINFER_CUDA_ATTN_PART_TOKENS);
    cinfer_status st = seen(cb, need_scratch(cb, need));
    if (st != CINFER_OK)
        return st;
    cinfer_cuda_attn_args a;
    memset(&a, 0, sizeof a);
    a.stream = cb->stream;
    a.q = q->data;
    a.k_cache = k_cache->data;
    a.v_cache = v_cache->data;
    a.k_dtype = k_cache->desc.dtype;
    a.v_dtype = v_cache->desc.dtype;
    a.out = out->data;
    a.positions = cb->d_positions;
    a.row_seq = cb->d_row_seq;
    a.block_tables = cb->d_tables;
    a.plan_ints = cb->d_plan;
    a.n_rows = s->n_rows;
    a.n_seqs = s->n_seqs;
    a.max_blocks = s->max_blocks;
    a.block_size = s->block_size;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.scale = scale;
    a.plan = cb->plan;
    a.scratch = cb->scratch;
    a.scratch_bytes = cb->scratch_bytes;
    return seen(cb, cinfer_cuda_attention(&a));
}

static cinfer_status cuda_silu_mul(cinfer_backend *be,
                                   const cinfer_tensor *gate,
                                   const cinfer_tensor *up, cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_silu_mul(cb->stream, gate->data, up->data,
                                         out->data,
                                         cinfer_tensor_desc_nelems(&gate->desc)));
}

static cinfer_status cuda_gather_rows(cinfer_backend *be,
                                      const cinfer_tensor *x,
                                      cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_gather_rows(cb->stream, x->data,
                                            cb->d_out_rows, be->step.n_out,
                                            cinfer_tensor_cols(x), out->data));
}

static cinfer_status cuda_greedy(cinfer_backend *be, const cinfer_tensor *x,
                                 cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_cuda_greedy(cb->stream, x->data,
                                       cinfer_tensor_rows(x),
                                       cinfer_tensor_cols(x), out->data));
}

static cinfer_status cuda_choose(cinfer_backend *be, const cinfer_tensor *x,
                                 const cinfer_draw *draws, cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    const int64_t rows = cinfer_tensor_rows(x);
    if (rows == 0)
        return CINFER_OK;
    cinfer_status st = seen(
        cb, put_staged(cb, &cb->draws, draws, (size_t)rows * sizeof *draws));
    if (st != CINFER_OK)
        return st;
    return seen(cb, cinfer_cuda_choose(cb->stream, x->data, rows,
                                       cinfer_tensor_cols(x), cb->draws.d,
                                       out->data));
}

static cinfer_status cuda_logprobs(cinfer_backend *be, const cinfer_tensor *x,
                                   const cinfer_tensor *tokens,
                                   const int32_t *n_top, cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    const int64_t rows = cinfer_tensor_rows(x);
    cinfer_status st = seen(cb, put_staged(cb, &cb->n_top, n_top,
                                           (size_t)rows * sizeof *n_top));
    if (st != CINFER_OK)
        return st;
    return seen(cb, cinfer_cuda_logprobs(cb->stream, x->data, rows,
                                         cinfer_tensor_cols(x), tokens->data,
                                         cb->n_top.d, out->data));
}

static cinfer_status cuda_edit_logits(cinfer_backend *be, cinfer_tensor *x,
                                      const cinfer_logit_edit *edits,
                                      int64_t n_edits)
{
    cuda_backend *cb = cu(be);
    cb->edited = NULL;
    if (n_edits == 0) {
        cb->edited = x->data; /* nothing to put back */
        cb->n_edited = 0;
        return CINFER_OK;
    }
    if ((size_t)n_edits > cb->raw_cap) {
        dev_free(cb, cb->d_raw, cb->raw_cap * sizeof(float));
        cb->d_raw = NULL;
        cb->raw_cap = 0;
        size_t cap = (size_t)n_edits + (size_t)n_edits / 2;
        void *d;
        cinfer_status st = dev_alloc(cb, cap * sizeof(float),
                                     "the edited logits' values", &d);
        if (st != CINFER_OK)
            return st;
        cb->d_raw = d;
        cb->raw_cap = cap;
    }
    cinfer_status st = seen(cb, put_staged(cb, &cb->edits, edits,
                                           (size_t)n_edits * sizeof *edits));
    if (st != CINFER_OK)
        return st;
    st = seen(cb, cinfer_cuda_edit_logits(cb->stream, x->data,
                                          cinfer_tensor_rows(x),
                                          cinfer_tensor_cols(x), cb->edits.d,
                                          n_edits, cb->d_raw, 0));
    if (st == CINFER_OK) {
        cb->edited = x->data;
        cb->n_edited = n_edits;
    }
    return st;
}

static cinfer_status cuda_unedit_logits(cinfer_backend *be, cinfer_tensor *x)
{
    cuda_backend *cb = cu(be);
    if (cb->edited != x->data)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "unedit_logits: the last edit_logits call "
                                "edited another tensor, or none");
    return seen(cb, cinfer_cuda_edit_logits(cb->stream, x->data,
                                            cinfer_tensor_rows(x),
                                            cinfer_tensor_cols(x), cb->edits.d,
                                            cb->n_edited, cb->d_raw, 1));
}

/* ---------------------------------------------------------------------- */
/* graphs                                                                  */
/* ---------------------------------------------------------------------- */

static int find_graph(const cuda_backend *cb, uint64_t key, int32_t parts)
{
    for (int i = 0; i < cb->n_graphs; i++)
        if (cb->graphs[i].key == key && cb->graphs[i].parts == parts)
            return i;
    return -1;
}

static void drop_graph(cuda_backend *cb, int i)
{
    cudaGraphExecDestroy(cb->graphs[i].exec); /* in flight: freed after */
    cb->graphs[i] = cb->graphs[--cb->n_graphs];
}

/* A decode step's partition count rounded up to a power of two (at most
 * what the reserved scratch holds), so that a recording serves every
 * context of its class: the decode launch's extra blocks return at once,
 * and a row's arithmetic depends on its own partitions only, so its bits
 * do not change with the class. */
static int32_t parts_class(const cuda_backend *cb)
{
    int32_t p = 1;
    while (p < cb->plan.max_parts)
        p *= 2;
    return p < cb->parts_cap ? p : cb->parts_cap;
}

static cinfer_status launch_graph(cuda_backend *cb, cudaGraphExec_t x)
{
    CINFER_CUDA_TRY(cudaGraphLaunch(x, cb->stream));
    return CINFER_OK;
}

/* Thread-local mode: another thread's unsafe calls (a second backend's
 * cudaMalloc) do not spoil this recording; this thread's do. */
static cinfer_status begin_capture(cuda_backend *cb)
{
    CINFER_CUDA_TRY(
        cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
    return CINFER_OK;
}

static cinfer_status cuda_graph_begin(cinfer_backend *be, uint64_t key,
                                      cinfer_graph_mode *mode)
{
    cuda_backend *cb = cu(be);
    *mode = CINFER_GRAPH_EAGER;
    /* Steps with prefill tiles, peers (NCCL calls stay eager) or no
     * reserved scratch (a step could need to allocate) run eagerly. */
    if (cb->eager || cb->unhealthy || cb->parts_cap < 1 ||
        cinfer_comm_size(be->comm) > 1 || cb->plan.n_tiles > 0 ||
        cb->plan.max_parts > cb->parts_cap) {
        cb->gstats.eager++;
        return CINFER_OK;
    }
    cinfer_status st = seen(cb, use_device(cb));
    if (st != CINFER_OK)
        return st;
    const int32_t parts = parts_class(cb);
    int i = find_graph(cb, key, parts);
    if (i >= 0 && cb->graphs[i].gen != cb->gen) {
        drop_graph(cb, i);
        i = -1;
    }
    cb->plan.max_parts = parts;
    if (i >= 0) {
        cb->graphs[i].used = ++cb->tick;
        st = seen(cb, launch_graph(cb, cb->graphs[i].exec));
        if (st != CINFER_OK)
            return st;
        cb->gstats.replayed++;
        *mode = CINFER_GRAPH_REPLAY;
        return CINFER_OK;
    }
    st = seen(cb, begin_capture(cb));
    if (st != CINFER_OK)
        return st;
    cb->capturing = 1;
    cb->cap_key = key;
    cb->cap_parts = parts;
    cb->cap_gen = cb->gen;
    *mode = CINFER_GRAPH_CAPTURE;
    return CINFER_OK;
}

/* Ends a recording: kept and launched if its ops went well, else
 * dropped (the capture is ended either way, so the stream is usable). */
static cinfer_status end_capture(cuda_backend *cb, cinfer_status st)
{
    cb->capturing = 0;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &g);
    if (st != CINFER_OK) {
        if (g)
            cudaGraphDestroy(g);
        (void)cudaGetLastError(); /* the ops' error is the one to report */
        return st;
    }
    CINFER_CUDA_TRY(e);
    if (cb->gen != cb->cap_gen) {
        cudaGraphDestroy(g);
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda: a tensor or buffer the recorded step "
                                "uses was freed or moved while recording");
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    CINFER_CUDA_TRY(e);
    if (cb->n_graphs == CUDA_GRAPHS_MAX) {
        int lru = 0;
        for (int i = 1; i < cb->n_graphs; i++)
            if (cb->graphs[i].used < cb->graphs[lru].used)
                lru = i;
        drop_graph(cb, lru);
    }
    cuda_graph *r = &cb->graphs[cb->n_graphs++];
    r->key = cb->cap_key;
    r->parts = cb->cap_parts;
    r->gen = cb->gen;
    r->used = ++cb->tick;
    r->exec = x;
    cinfer_status ls = launch_graph(cb, x);
    if (ls != CINFER_OK)
        return ls;
    cb->gstats.captured++;
    return CINFER_OK;
}

static cinfer_status cuda_graph_end(cinfer_backend *be, cinfer_status st)
{
    cuda_backend *cb = cu(be);
    if (!cb->capturing)
        return st; /* replayed */
    return seen(cb, end_capture(cb, st));
}

static void cuda_graph_stats(const cinfer_backend *be,
                             cinfer_backend_graph_stats *out)
{
    const cuda_backend *cb = (const cuda_backend *)be;
    *out = cb->gstats;
    out->held = cb->n_graphs;
}

static cinfer_status cuda_all_reduce_sum(cinfer_backend *be, cinfer_tensor *t)
{
    cuda_backend *cb = cu(be);
    return seen(cb, cinfer_comm_nccl_all_reduce_sum(
                        be->comm, t->data,
                        (size_t)cinfer_tensor_desc_nelems(&t->desc),
                        cb->stream));
}

static cinfer_status gather_copy(cuda_backend *cb, const cinfer_tensor *x,
                                 cinfer_tensor *out)
{
    CINFER_CUDA_TRY(cudaMemcpyAsync(out->data, x->data, x->nbytes,
                                    cudaMemcpyDeviceToDevice, cb->stream));
    return CINFER_OK;
}

static cinfer_status cuda_all_gather(cinfer_backend *be, const cinfer_tensor *x,
                                     cinfer_tensor *out)
{
    cuda_backend *cb = cu(be);
    if (cinfer_comm_size(be->comm) <= 1)
        return seen(cb, gather_copy(cb, x, out));
    return seen(cb, cinfer_comm_nccl_all_gather(
                        be->comm, x->data,
                        (size_t)cinfer_tensor_desc_nelems(&x->desc), out->data,
                        cb->stream));
}

static const struct cinfer_backend_ops cuda_ops = {
    .destroy = cuda_destroy,
    .tensor_create = cuda_tensor_create,
    .tensor_create_weight = cuda_tensor_create_weight,
    .tensor_destroy = cuda_tensor_destroy,
    .weight_borrows = cuda_weight_borrows,
    .matmul_supports = cuda_matmul_supports,
    .upload = cuda_upload,
    .download = cuda_download,
    .fill_zero = cuda_fill_zero,
    .synchronize = cuda_synchronize,
    .healthy = cuda_healthy,
    .memory = cuda_memory,
    .reserve_scratch = cuda_reserve_scratch,
    .set_step = cuda_set_step,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_stats = cuda_graph_stats,
    .embed = cuda_embed,
    .rms_norm = cuda_rms_norm,
    .matmul = cuda_matmul,
    .add_bias = cuda_add_bias,
    .add = cuda_add,
    .matmul_silu_mul = cuda_matmul_silu_mul,
    .add_rms_norm = cuda_add_rms_norm,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .rope_kv_store = cuda_rope_kv_store,
    .attention = cuda_attention,
    .silu_mul = cuda_silu_mul,
    .gather_rows = cuda_gather_rows,
    .greedy = cuda_greedy,
    .choose = cuda_choose,
    .edit_logits = cuda_edit_logits,
    .unedit_logits = cuda_unedit_logits,
    .logprobs = cuda_logprobs,
    .all_reduce_sum = cuda_all_reduce_sum,
    .all_gather = cuda_all_gather,
};

/* ---------------------------------------------------------------------- */
/* creation                                                                */
/* ---------------------------------------------------------------------- */

cinfer_backend_cuda_params cinfer_backend_cuda_default_params(void)
{
    cinfer_backend_cuda_params p;
    memset(&p, 0, sizeof p);
    p.device = 0;
    p.memory_fraction = 0.9;
    return p;
}

int cinfer_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0; /* no driver or no device: not an error here */
    return n;
}

static cinfer_status open_device(cuda_backend *cb, double fraction)
{
    CINFER_CUDA_TRY(cudaSetDevice(cb->device));
    struct cudaDeviceProp prop;
    CINFER_CUDA_TRY(cudaGetDeviceProperties(&prop, cb->device));
    size_t free_b = 0, total_b = 0;
    CINFER_CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
    size_t budget = (size_t)((double)total_b * fraction);
    /* Another process may hold part of the device already. */
    cb->budget = budget < free_b ? budget : free_b;
    CINFER_CUDA_TRY(
        cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    CINFER_CUDA_TRY(
        cudaEventCreateWithFlags(&cb->meta.copied, cudaEventDisableTiming));
    CINFER_CUDA_TRY(
        cudaEventCreateWithFlags(&cb->draws.copied, cudaEventDisableTiming));
    CINFER_CUDA_TRY(
        cudaEventCreateWithFlags(&cb->edits.copied, cudaEventDisableTiming));
    CINFER_CUDA_TRY(
        cudaEventCreateWithFlags(&cb->n_top.copied, cudaEventDisableTiming));
    CINFER_CUBLAS_TRY(cublasCreate(&cb->cublas));
    CINFER_CUBLAS_TRY(cublasSetStream(cb->cublas, cb->stream));
    /* cuBLAS's workspace, allocated here (the size its guide recommends:
     * 32 MiB on Hopper and later, 4 MiB before), so that no call
     * allocates inside a recorded graph and the budget counts it. */
    size_t ws = prop.major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
    cinfer_status st = dev_alloc(cb, ws, "cuBLAS workspace", &cb->blas_ws);
    if (st != CINFER_OK)
        return st;
    cb->blas_ws_bytes = ws;
    CINFER_CUBLAS_TRY(cublasSetWorkspace(cb->cublas, cb->blas_ws, ws));
    snprintf(cb->base.device_desc, sizeof cb->base.device_desc,
             "cuda:%d: %.60s, sm_%d%d, %.1f of %.1f GiB", cb->device,
             prop.name, prop.major, prop.minor,
             (double)cb->budget / (1 << 30), (double)total_b / (1 << 30));
    return CINFER_OK;
}

cinfer_status cinfer_backend_cuda_create(const cinfer_backend_cuda_params *p,
                                         cinfer_backend **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cuda_create: out is NULL");
    *out = NULL;
    cinfer_backend_cuda_params dp = cinfer_backend_cuda_default_params();
    if (!p)
        p = &dp;
    double fraction = p->memory_fraction == 0 ? 0.9 : p->memory_fraction;
    if (!(fraction > 0 && fraction <= 1))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cuda_create: memory_fraction %g is "
                                "outside (0, 1]",
                                p->memory_fraction);
    int n = cinfer_cuda_device_count();
    if (p->device < 0 || p->device >= n)
        return cinfer_set_error(CINFER_E_NOT_FOUND,
                                "backend_cuda_create: device %d does not "
                                "exist (%d CUDA device%s)",
                                p->device, n, n == 1 ? "" : "s");
    if (p->comm && cinfer_comm_get_kind(p->comm) != CINFER_COMM_NCCL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cuda_create: comm is a LOCAL (CPU) "
                                "communicator; GPU ranks need an NCCL one");
    if (p->comm && ((const struct cinfer_comm *)p->comm)->device != p->device)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "backend_cuda_create: comm's rank %d is on "
                                "device %d, the backend on device %d",
                                cinfer_comm_rank(p->comm),
                                ((const struct cinfer_comm *)p->comm)->device,
                                p->device);
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb)
        return cinfer_set_error(CINFER_E_NOMEM,
                                "backend_cuda_create: no memory");
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    cb->base.comm = p->comm;
    cb->invariant = p->batch_invariant != 0;
    cb->eager = p->eager != 0;
    cb->base.graphs_off = cb->eager; /* the model then pads no step */
    cb->device = p->device;
    cb->meta.what = "step metadata";
    cb->draws.what = "draws";
    cb->edits.what = "logit edits";
    cb->n_top.what = "logprobs' n_top";
    cinfer_status st = open_device(cb, fraction);
    if (st != CINFER_OK) {
        cuda_destroy(&cb->base);
        return st;
    }
    *out = &cb->base;
    return CINFER_OK;
}
