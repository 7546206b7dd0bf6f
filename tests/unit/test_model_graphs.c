/*
 * test_model_graphs.c - CUDA graphs (cinfer_backend_graph_begin): decode
 * steps recorded per row bucket and replayed give the bits of the same
 * steps launched op by op.
 *
 * Two CUDA backends run the same model file, one created eager
 * (cinfer_backend_cuda_params.eager), one recording graphs. The same
 * steps go to both: prefills (never recorded: attention tiles them),
 * then decode steps of 1 to 40 rows whose contexts grow step by step,
 * with and without sequences of 3 and 4 of attention's 512-token
 * partitions (one recording serves both: 40 rows with 3 are recorded,
 * 40 with 4 replay it),
 * the block-table stride changing as the engine's does. Every out row's
 * logits must be equal bit for bit, the graph backend must have recorded
 * one graph per (row bucket, stride class, partition class) it met and
 * replayed it for every other step, and the eager one none. A replay sees
 * the new step only through the fixed metadata buffers, so a wrong offset
 * or a value baked into a recording shows as different logits.
 *
 * Also: the seam's rules (no upload, download, synchronize or set_step
 * inside a graph; graph_end without begin; a failed recording dropped),
 * a fault at a device call while recording fails that step only, and a
 * model loaded again on the same backend is not served a recording of the
 * tensors of the one before it.
 *
 * Weights: Q4_0 (mmvq and mmq, invariant by construction) and F16
 * (cuBLAS; under the harness its reference GEMM, on a device in
 * batch-invariant mode, since a padded step is a larger batch and cuBLAS
 * picks its algorithm by the batch's shape).
 *
 * Built twice: over the CUDA harness (test_model_graphs_cudasim) and as the
 * device variant, which skips without a GPU.
 */
#include "engine/model.h"
#include "engine/tinymodel.h"
#include "harness.h"

#ifdef CINFER_TEST_CUDASIM
#include "tests/cudasim/cudasim_ctl.h"
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701 /* not sticky */
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BS 16       /* KV block size */
#define MAXB 100    /* blocks per sequence: contexts up to 1600 */
#define NSEQ 41     /* sequences in the cache */
#define MAXROWS 64  /* rows of a step */
#define LONG 1030   /* sequence 0's context: 3 of attention's 512-token
                       partitions, */
#define LONGEST 1540 /* sequence NSEQ - 1's: 4; recordings of 4 serve both */

static cinfer_backend *open_cuda(int eager, int invariant)
{
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    cp.memory_fraction = 0.5;
    cp.eager = eager;
    cp.batch_invariant = invariant;
    cinfer_backend *be = NULL;
    CHECK_OK(cinfer_backend_cuda_create(&cp, &be));
    return be;
}

static cinfer_model *open_model(const char *path, cinfer_backend *be)
{
    cinfer_model_params p = cinfer_model_default_params();
    p.path = path;
    p.backend = be;
    p.n_ctx = MAXB * BS;
    p.block_size = BS;
    p.n_kv_blocks = NSEQ * MAXB;
    p.max_seqs = NSEQ;
    p.max_batch_rows = MAXROWS;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&p, &m));
    return m;
}

/* A step under construction, the engine's way: sequence s owns blocks
 * s * MAXB.., and the tables' stride is the most blocks any of the step's
 * sequences holds. */
typedef struct {
    int32_t tok[MAXROWS], pos[MAXROWS], seq[MAXROWS], slot[MAXROWS],
        out[MAXROWS];
    int32_t tables[NSEQ * MAXB];
    int32_t cache_seq[NSEQ], last[NSEQ];
    int n, n_out, n_seqs;
} step_b;

static void sb_init(step_b *b)
{
    memset(b, 0, sizeof *b);
}

/* Rows of cache sequence s at positions p0..p0+n-1, the last an out row. */
static void sb_rows(step_b *b, int s, const int32_t *toks, int p0, int n)
{
    int si = b->n_seqs++;
    b->cache_seq[si] = s;
    b->last[si] = p0 + n - 1;
    for (int i = 0; i < n; i++) {
        int r = b->n++;
        b->tok[r] = toks[i];
        b->pos[r] = p0 + i;
        b->seq[r] = si;
        b->slot[r] = s * MAXB * BS + p0 + i;
    }
    b->out[b->n_out++] = b->n - 1;
}

static cinfer_status sb_run(cinfer_model *m, step_b *b, float *logits)
{
    int stride = 1;
    for (int q = 0; q < b->n_seqs; q++)
        if (b->last[q] / BS + 1 > stride)
            stride = b->last[q] / BS + 1;
    for (int q = 0; q < b->n_seqs; q++)
        for (int k = 0; k < stride; k++)
            b->tables[q * stride + k] =
                k <= b->last[q] / BS ? b->cache_seq[q] * MAXB + k : 0;
    cinfer_step s = {
        .n_rows = b->n, .n_seqs = b->n_seqs, .block_size = BS,
        .max_blocks = stride, .tokens = b->tok, .positions = b->pos,
        .row_seq = b->seq, .slots = b->slot, .block_tables = b->tables,
        .n_out = b->n_out, .out_rows = b->out,
    };
    return cinfer_model_forward(m, &s, logits);
}

static int32_t filler(int i, int V)
{
    return (int32_t)((i * 37 + 11) % V);
}

/* Prefills: the sequences' first 3..22 tokens packed into steps, 64 for
 * sequences 0 and NSEQ - 1; then those two jump to contexts of LONG and
 * LONGEST tokens (3 and 4 of attention's partitions: one class), the
 * positions skipped holding the cache's zeros, which is as good an input
 * as any for comparing two backends and spares the harness a long
 * prefill. len[] gets each sequence's length. */
static void prefill(cinfer_model *m, int *len, float *scratch)
{
    int V = cinfer_model_get_info(m)->n_vocab;
    int32_t toks[MAXROWS];
    step_b b;
    for (int s = 0; s < NSEQ;) {
        sb_init(&b);
        for (;;) {
            int n = s == 0 || s == NSEQ - 1 ? MAXROWS : 3 + (s * 7) % 20;
            if (s >= NSEQ || b.n + n > MAXROWS)
                break;
            len[s] = n;
            for (int i = 0; i < n; i++)
                toks[i] = filler(s + i, V);
            sb_rows(&b, s, toks, 0, n);
            s++;
        }
        CHECK_OK(sb_run(m, &b, scratch));
    }
    len[0] = LONG;
    len[NSEQ - 1] = LONGEST;
}

/* One decode step of sequences first..first+n-1 (each one row), both
 * models; their logits compared bit for bit. Returns 1 if equal. */
static int decode_both(cinfer_model *ma, cinfer_model *mb, int *len, int first,
                       int n, int round, float *la, float *lb)
{
    int V = cinfer_model_get_info(ma)->n_vocab;
    step_b b;
    sb_init(&b);
    for (int s = first; s < first + n; s++) {
        int32_t t = filler(round * 13 + s, V);
        sb_rows(&b, s, &t, len[s], 1);
    }
    CHECK_OK(sb_run(ma, &b, la));
    CHECK_OK(sb_run(mb, &b, lb));
    for (int s = first; s < first + n; s++)
        len[s]++;
    return memcmp(la, lb, sizeof(float) * (size_t)V * (size_t)n) == 0;
}

static int bucket_of(int n)
{
    int b = 1;
    while (b < n)
        b *= 2;
    return b < MAXROWS ? b : MAXROWS;
}

static int stride_class(int blocks)
{
    int w = 8;
    while (w < blocks)
        w *= 2;
    return w < MAXB ? w : MAXB;
}

/* Partitions rounded up to a power of two, at most a full context's. */
static int parts_class(int parts)
{
    int p = 1, cap = (MAXB * BS + 511) / 512;
    while (p < parts)
        p *= 2;
    return p < cap ? p : cap;
}

/* The graph keys seen so far: (bucket, stride class, partitions). */
typedef struct {
    int key[256][3];
    int n;
} key_set;

static void key_add(key_set *k, int bucket, int stride, int parts)
{
    for (int i = 0; i < k->n; i++)
        if (k->key[i][0] == bucket && k->key[i][1] == stride &&
            k->key[i][2] == parts)
            return;
    k->key[k->n][0] = bucket;
    k->key[k->n][1] = stride;
    k->key[k->n][2] = parts;
    k->n++;
}

static void write_model(const char *path, cinfer_dtype wt)
{
    cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
    tp.n_layer = 2;
    tp.n_embd = 64;
    tp.n_head = 4;
    tp.n_head_kv = 2;
    tp.n_ff = 128;
    tp.n_ctx = MAXB * BS;
    tp.weight_dtype = wt;
    tp.embd_dtype = wt;
    tp.seed = 5;
    CHECK_OK(cinfer_tinymodel_write(&tp, path));
}

/* The model file on an eager backend (e) and on one that records (g),
 * both prefilled the same way, with a step's worth of logits each. */
typedef struct {
    char path[128];
    cinfer_backend *be_e, *be_g;
    cinfer_model *me, *mg;
    float *la, *lb;
    int V;
    int len[NSEQ]; /* the sequences' lengths, the same on both */
} pair;

static int pair_open(pair *p, cinfer_dtype wt, const char *tag, int invariant)
{
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "/tmp/cinfer-test-graphs-%d-%s.gguf",
             (int)getpid(), tag);
    write_model(p->path, wt);
    p->be_e = open_cuda(1, invariant);
    p->be_g = open_cuda(0, invariant);
    p->me = p->be_e ? open_model(p->path, p->be_e) : NULL;
    p->mg = p->be_g ? open_model(p->path, p->be_g) : NULL;
    CHECK(p->me && p->mg);
    if (!p->me || !p->mg)
        return 0;
    p->V = cinfer_model_get_info(p->me)->n_vocab;
    p->la = malloc(sizeof(float) * MAXROWS * (size_t)p->V);
    p->lb = malloc(sizeof(float) * MAXROWS * (size_t)p->V);
    int len_e[NSEQ];
    prefill(p->me, len_e, p->la);
    prefill(p->mg, p->len, p->lb);
    return 1;
}

static void pair_close(pair *p)
{
    free(p->la);
    free(p->lb);
    cinfer_model_destroy(p->me);
    cinfer_model_destroy(p->mg);
    cinfer_backend_destroy(p->be_e);
    cinfer_backend_destroy(p->be_g);
    unlink(p->path);
}

static void check_type(cinfer_dtype wt, const char *name)
{
#ifdef CINFER_TEST_CUDASIM
    const int invariant = 0; /* the harness's GEMM is invariant anyway */
#else
    const int invariant = wt != CINFER_DTYPE_Q4_0;
#endif
    pair pp;
    if (pair_open(&pp, wt, name, invariant)) {
        pair *p = &pp;
        cinfer_backend_graph_stats g0;
        cinfer_backend_graph_stats_get(p->be_g, &g0);
        /* Decode: batch sizes across the buckets, each for 3 steps, from
         * sequence 0 (a context of 3 partitions) or from 1 (all short);
         * under ASan fewer sizes. */
        static const int sizes[] = {1, 2, 3, 5, 8, 13, 16, 24, 33, 40};
        const int n_sizes = UNDER_ASAN ? 6 : 10;
        key_set keys = {.n = 0};
        int steps = 0, diffs = 0, round = 0;
        for (int i = 0; i < n_sizes; i++)
            for (int from = 0; from < 2; from++)
                for (int k = 0; k < 3; k++, round++) {
                    int n = sizes[i] < NSEQ - from ? sizes[i] : NSEQ - from;
                    int blocks = 1, ctx = 0;
                    for (int s = from; s < from + n; s++) {
                        if (p->len[s] / BS + 1 > blocks)
                            blocks = p->len[s] / BS + 1;
                        if (p->len[s] + 1 > ctx)
                            ctx = p->len[s] + 1;
                    }
                    int parts = parts_class((ctx + 511) / 512);
                    key_add(&keys, bucket_of(n), stride_class(blocks), parts);
                    if (!decode_both(p->me, p->mg, p->len, from, n, round,
                                     p->la, p->lb)) {
                        fprintf(stderr, "  %s: %d rows from sequence %d, "
                                        "step %d: logits differ\n",
                                name, n, from, k);
                        diffs++;
                    }
                    steps++;
                }
        CHECK_EQ_INT(diffs, 0);
        cinfer_backend_graph_stats gs, es;
        cinfer_backend_graph_stats_get(p->be_g, &gs);
        cinfer_backend_graph_stats_get(p->be_e, &es);
        fprintf(stderr,
                "  %s: %d decode steps bit-identical with graphs and "
                "without: %lld recorded (%d keys), %lld replayed\n",
                name, steps, (long long)(gs.captured - g0.captured), keys.n,
                (long long)(gs.replayed - g0.replayed));
        CHECK_EQ_INT((int)(gs.captured - g0.captured), keys.n);
        CHECK_EQ_INT((int)(gs.replayed - g0.replayed), steps - keys.n);
        CHECK_EQ_INT((int)es.captured, 0);
        CHECK_EQ_INT((int)es.replayed, 0);

        /* Both models again on their backends (the eager one's caches
         * hold other contents by now): the recording backend's tensors
         * are new, so its steps are recorded afresh, not replayed from
         * the old ones. */
        cinfer_model_destroy(p->mg);
        cinfer_model_destroy(p->me);
        p->mg = open_model(p->path, p->be_g);
        p->me = open_model(p->path, p->be_e);
        CHECK(p->mg && p->me);
        if (p->mg && p->me) {
            int len_e[NSEQ];
            prefill(p->mg, p->len, p->lb);
            prefill(p->me, len_e, p->la);
            cinfer_backend_graph_stats_get(p->be_g, &g0);
            CHECK(decode_both(p->me, p->mg, p->len, 1, 5, 0, p->la, p->lb));
            cinfer_backend_graph_stats_get(p->be_g, &gs);
            CHECK_EQ_INT((int)(gs.captured - g0.captured), 1);
            CHECK_EQ_INT((int)(gs.replayed - g0.replayed), 0);
        }
    }
    pair_close(&pp);
}

static void test_graphs_match_eager(void)
{
    check_type(CINFER_DTYPE_Q4_0, "q4_0");
    if (!UNDER_ASAN) /* 4 minutes more there */
        check_type(CINFER_DTYPE_F16, "f16");
}

/* The seam's rules, on the backend directly. */
static void test_graph_seam(void)
{
    cinfer_backend *be = open_cuda(0, 0);
    if (!be)
        return;
    CHECK(cinfer_backend_has_graphs(be));
    int64_t shape[2] = {4, 8};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, shape);
    cinfer_tensor *t = NULL;
    CHECK_OK(cinfer_backend_tensor_create(be, &d, &t));
    float host[32] = {0};
    int32_t zero[4] = {0, 0, 0, 0}, rows[4] = {0, 1, 2, 3},
            slots[4] = {0, 1, 2, 3}, tables[4] = {0, 1, 2, 3};
    cinfer_step s = {.n_rows = 4, .n_seqs = 4, .block_size = 4,
                     .max_blocks = 1, .tokens = zero, .positions = zero,
                     .row_seq = rows, .slots = slots,
                     .block_tables = tables, .n_out = 4, .out_rows = rows};
    cinfer_graph_mode gm;
    /* before any step */
    CHECK_EQ_INT(cinfer_backend_graph_begin(be, 1, &gm), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_graph_end(be, CINFER_OK), CINFER_E_INVALID_ARG);
    CHECK_OK(cinfer_backend_set_step(be, &s));
    /* no reserved scratch: declined */
    CHECK_OK(cinfer_backend_graph_begin(be, 1, &gm));
    CHECK_EQ_INT(gm, CINFER_GRAPH_EAGER);
    CHECK_OK(cinfer_backend_graph_end(be, CINFER_OK));
    cinfer_backend_scratch_plan sp = {.max_rows = 4, .max_k = 8,
                                      .n_heads = 1, .head_dim = 8,
                                      .max_context = 16};
    CHECK_OK(cinfer_backend_reserve_scratch(be, &sp));
    CHECK_OK(cinfer_backend_graph_begin(be, 1, &gm));
    CHECK_EQ_INT(gm, CINFER_GRAPH_CAPTURE);
    /* inside: the calls that would break a recording are refused */
    CHECK_EQ_INT(cinfer_backend_upload(be, t, 0, host, sizeof host),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_download(be, t, 0, host, sizeof host),
                 CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_synchronize(be), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_set_step(be, &s), CINFER_E_INVALID_ARG);
    cinfer_tensor *t3 = NULL;
    CHECK_EQ_INT(cinfer_backend_tensor_create(be, &d, &t3), CINFER_E_INVALID_ARG);
    CHECK(t3 == NULL);
    CHECK_EQ_INT(cinfer_backend_graph_begin(be, 2, &gm), CINFER_E_INVALID_ARG);
    CHECK_OK(cinfer_backend_fill_zero(be, t)); /* an op: recorded */
    /* a recording whose ops failed is dropped, and their status returned */
    CHECK_EQ_INT(cinfer_backend_graph_end(be, CINFER_E_DEVICE), CINFER_E_DEVICE);
    cinfer_backend_graph_stats gs;
    cinfer_backend_graph_stats_get(be, &gs);
    CHECK_EQ_INT((int)gs.held, 0);
    CHECK_EQ_INT((int)gs.captured, 0);
    /* the stream is usable after it; a good recording is kept and run */
    CHECK_OK(cinfer_backend_upload(be, t, 0, (float[32]){1, 2, 3}, sizeof host));
    CHECK_OK(cinfer_backend_graph_begin(be, 1, &gm));
    CHECK_EQ_INT(gm, CINFER_GRAPH_CAPTURE);
    CHECK_OK(cinfer_backend_fill_zero(be, t));
    CHECK_OK(cinfer_backend_graph_end(be, CINFER_OK));
    float back[32];
    CHECK_OK(cinfer_backend_download(be, t, 0, back, sizeof back));
    CHECK(back[0] == 0 && back[1] == 0 && back[2] == 0); /* it ran */
    CHECK_OK(cinfer_backend_upload(be, t, 0, (float[32]){4, 5}, sizeof host));
    CHECK_OK(cinfer_backend_set_step(be, &s));
    CHECK_OK(cinfer_backend_graph_begin(be, 1, &gm));
    CHECK_EQ_INT(gm, CINFER_GRAPH_REPLAY);
    CHECK_OK(cinfer_backend_graph_end(be, CINFER_OK));
    CHECK_OK(cinfer_backend_download(be, t, 0, back, sizeof back));
    CHECK(back[0] == 0 && back[1] == 0); /* the replay ran it again */
    cinfer_backend_graph_stats_get(be, &gs);
    CHECK_EQ_INT((int)gs.captured, 1);
    CHECK_EQ_INT((int)gs.replayed, 1);
    CHECK_EQ_INT((int)gs.held, 1);
    /* a destroyed tensor retires the recordings: recorded afresh */
    cinfer_tensor *t2 = NULL;
    CHECK_OK(cinfer_backend_tensor_create(be, &d, &t2));
    cinfer_backend_tensor_destroy(be, t2);
    CHECK_OK(cinfer_backend_graph_begin(be, 1, &gm));
    CHECK_EQ_INT(gm, CINFER_GRAPH_CAPTURE);
    CHECK_OK(cinfer_backend_fill_zero(be, t));
    CHECK_OK(cinfer_backend_graph_end(be, CINFER_OK));
    cinfer_backend_tensor_destroy(be, t);
    cinfer_backend_destroy(be);

    /* the CPU backend runs every step eagerly */
    cinfer_backend *cpu = NULL;
    cinfer_backend_cpu_params cp = cinfer_backend_cpu_default_params();
    cp.n_threads = 1;
    CHECK_OK(cinfer_backend_cpu_create(&cp, &cpu));
    CHECK(!cinfer_backend_has_graphs(cpu));
    CHECK_OK(cinfer_backend_set_step(cpu, &s));
    CHECK_OK(cinfer_backend_graph_begin(cpu, 1, &gm));
    CHECK_EQ_INT(gm, CINFER_GRAPH_EAGER);
    CHECK_EQ_INT(cinfer_backend_synchronize(cpu), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_graph_end(cpu, CINFER_E_RANGE), CINFER_E_RANGE);
    CHECK_OK(cinfer_backend_synchronize(cpu));
    cinfer_backend_destroy(cpu);
}

#ifdef CINFER_TEST_CUDASIM
/* A fault at a device call while a step is recorded fails that step
 * (CINFER_E_DEVICE) and keeps no recording; the same step run again is
 * recorded and gives the eager backend's logits. Each try uses a bucket
 * not recorded yet. */
static void test_fault_while_recording(void)
{
    pair pp;
    if (pair_open(&pp, CINFER_DTYPE_Q4_0, "fault", 0)) {
        pair *p = &pp;
        /* rows 1, 2, 3, 5, 9, 17, 33: buckets 1 .. 64, one try each, the
         * fault at a later call each time */
        static const int rows[] = {1, 2, 3, 5, 9, 17, 33};
        int failed = 0;
        for (int i = 0; i < 7; i++) {
            step_b b;
            sb_init(&b);
            for (int s = 1; s <= rows[i]; s++) {
                int32_t t = filler(s + i, p->V);
                sb_rows(&b, s, &t, p->len[s], 1);
            }
            cinfer_backend_graph_stats g0, g1;
            cinfer_backend_graph_stats_get(p->be_g, &g0);
            cudasim_inject_fault(10 + 3 * i, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                                 0);
            cinfer_status st = sb_run(p->mg, &b, p->lb);
            cudasim_inject_fault(-1, 0, 0);
            cinfer_backend_graph_stats_get(p->be_g, &g1);
            if (st != CINFER_OK) {
                failed++;
                CHECK_EQ_INT(st, CINFER_E_DEVICE);
                CHECK_EQ_INT((int)(g1.held - g0.held), 0);
                CHECK_EQ_INT(cinfer_backend_healthy(p->be_g), 1);
            }
            CHECK_OK(sb_run(p->mg, &b, p->lb));
            CHECK_OK(sb_run(p->me, &b, p->la));
            CHECK(memcmp(p->la, p->lb, sizeof(float) * (size_t)p->V *
                                           (size_t)rows[i]) == 0);
            for (int s = 1; s <= rows[i]; s++)
                p->len[s]++;
        }
        fprintf(stderr, "  %d of 7 steps failed by a fault while recorded; "
                        "each run again matched the eager backend\n",
                failed);
        CHECK(failed >= 5);
    }
    pair_close(&pp);
}
#endif

int main(void)
{
#ifndef CINFER_TEST_CUDASIM
    if (cinfer_cuda_device_count() == 0)
        return harness_skip("no CUDA device");
#endif
    RUN(test_graph_seam);
    RUN(test_graphs_match_eager);
#ifdef CINFER_TEST_CUDASIM
    RUN(test_fault_while_recording);
#endif
    return harness_done();
}
