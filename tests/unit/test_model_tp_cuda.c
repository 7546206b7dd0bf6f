/*
 * test_model_tp_cuda.c - tensor parallelism on CUDA ranks over NCCL
 * (model_group.c with tp_device CUDA) against the whole model on one
 * CUDA backend.
 *
 * Built twice: over the CUDA harness (tests/cudasim/, three simulated
 * devices, NCCL answered in-process; test_model_tp_cuda_cudasim) and as the
 * device variant (cinfer_device; skips without a GPU). The checks:
 *   - TP=2 and TP=3 on CUDA ranks give TP=1's greedy tokens over STEPS
 *     steps, logits within TINY_BOUND (relative L2 of a step; TP=N sums the
 *     row-parallel products in N parts, so the last bits differ; the
 *     measured worst is printed);
 *   - a group's graphs follow cuda_eager: TP=1 through NCCL records and
 *     replays its decode steps, bit-identical to its eager run; TP=2's
 *     ranks stay eager;
 *   - TP=1 through NCCL (a group of one rank) equals the plain backend bit
 *     for bit: the only NCCL check one GPU allows, which scripts/gpu-check.sh
 *     runs on the device;
 *   - two nodes (two groups in one process, node 1 following node 0 over
 *     the loopback rendezvous; two simulated devices) equal TP=1, and when
 *     node 0 goes, node 1's follow ends cleanly; a node that loaded another
 *     model is refused by name; a step with prompt embeddings, which do
 *     not cross processes, is refused without breaking the group.
 * The multi-device cases need as many devices as ranks (NCCL refuses two
 * ranks on one GPU) and skip with a line where there are fewer.
 */
#include "engine/model.h"
#include "engine/tinymodel.h"
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 12
/* Worst relative L2 of a step's logits, TP=N vs TP=1 on CUDA (measured
 * under the harness, 2026-12-02; the test prints it): Q8_0 and Q4_1 0
 * (bit-equal: the row-parallel splits fall on whole blocks), F32 1.1e-5
 * (float's reordering of the row-parallel sums). A quantized model can
 * also re-round a Q8_1 activation block an ulp apart further on (seen at
 * 5.8e-3 on a wider model; test_model_cuda's quantized bound for CUDA
 * against the CPU, for that reason, is 6e-2). A wrong shard gives errors
 * of order 1. */
#define TINY_BOUND 2e-3
#define QUANT_BOUND 2e-2

static const cinfer_cuda_entry cuda_entry = {cinfer_comm_create_nccl,
                                             cinfer_backend_cuda_create,
                                             cinfer_cuda_device_count};

static const char *tmp_path(const char *tag)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/cinfer-test-model-tp-cuda-%d-%s.gguf",
             (int)getpid(), tag);
    return buf;
}

static cinfer_model_params base(const char *path)
{
    cinfer_model_params p = cinfer_model_default_params();
    p.path = path;
    p.n_ctx = 128;
    p.max_seqs = 1;
    p.max_batch_rows = 64;
    p.gpu_memory_fraction = 0.5;
    return p;
}

/* The whole model on one CUDA backend (device 0); *be is its backend. */
static cinfer_model *open_whole(const char *path, cinfer_backend **be)
{
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    cp.memory_fraction = 0.5;
    *be = NULL;
    CHECK_OK(cinfer_backend_cuda_create(&cp, be));
    if (!*be)
        return NULL;
    cinfer_model_params p = base(path);
    p.backend = *be;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&p, &m));
    return m;
}

/* A group of tp CUDA ranks on devices 0..tp-1. */
/* eager: the ranks' backends without CUDA graphs */
static cinfer_model *open_group_as(const char *path, int tp, int eager)
{
    cinfer_model_params p = base(path);
    p.tensor_parallel = tp;
    p.tp_device = CINFER_TP_CUDA;
    p.cuda = &cuda_entry;
    p.cuda_eager = eager;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&p, &m));
    return m;
}

static cinfer_model *open_group(const char *path, int tp)
{
    return open_group_as(path, tp, 0);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Greedy decode of STEPS tokens: tokens and each step's logits out. */
static void greedy(cinfer_model *m, const int32_t *prompt, int n_prompt,
                   int32_t *toks, float *logits)
{
    int V = cinfer_model_get_info(m)->n_vocab;
    CHECK_OK(cinfer_model_eval_single(m, prompt, n_prompt, 0, 0, logits));
    for (int i = 0; i < STEPS; i++) {
        float *row = logits + (size_t)i * (size_t)V;
        toks[i] = argmax(row, V);
        if (i + 1 < STEPS)
            CHECK_OK(cinfer_model_eval_single(m, &toks[i], 1, n_prompt + i, 0,
                                              row + V));
    }
}

static double worst_rel_l2(const float *a, const float *b, int V)
{
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
        double d = 0, n = 0;
        for (int j = 0; j < V; j++) {
            double x = a[(size_t)s * V + j], y = b[(size_t)s * V + j];
            d += (x - y) * (x - y);
            n += x * x;
        }
        double r = n > 0 ? sqrt(d / n) : sqrt(d);
        worst = r > worst ? r : worst;
    }
    return worst;
}

static const int32_t prompt[] = {5, 77, 300, 12, 9, 401, 33};
#define N_PROMPT ((int)(sizeof prompt / sizeof prompt[0]))

/* 6 query and 6 KV heads of 32, n_ff 192: splits at 2 and 3 (the
 * attention output's and the down projection's 96 or 64 columns per rank
 * are whole blocks); 512 tokens
 * (512 / 3 does not divide: an uneven LM head split in one process).
 * Small, because the harness runs every device thread on the CPU, under
 * the sanitizers too. */
static const char *write_tiny(const char *tag, cinfer_dtype wt, int n_vocab)
{
    cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
    tp.n_layer = 2;
    tp.n_embd = 192;
    tp.n_head = 6;
    tp.n_head_kv = 6;
    tp.n_ff = 192;
    tp.n_vocab = (uint32_t)n_vocab;
    tp.weight_dtype = wt;
    tp.embd_dtype = wt;
    tp.seed = 7;
    const char *path = tmp_path(tag);
    CHECK_OK(cinfer_tinymodel_write(&tp, path));
    return path;
}

/* TP=1's greedy run on the whole model. */
typedef struct {
    int V;
    int32_t toks[STEPS];
    float *logits;
} run;

/* TP=1 per model file, computed once: the whole model's run is what every
 * case compares with, and the harness is slow. */
static struct {
    char path[256];
    run r;
} g_refs[4];

static int reference(const char *path, run *r)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(g_refs[i].path, path) == 0 && g_refs[i].r.logits) {
            *r = g_refs[i].r;
            r->logits = malloc(sizeof(float) * (size_t)STEPS * (size_t)r->V);
            memcpy(r->logits, g_refs[i].r.logits,
                   sizeof(float) * (size_t)STEPS * (size_t)r->V);
            return 1;
        }
    cinfer_backend *be = NULL;
    cinfer_model *m = open_whole(path, &be);
    if (!m) {
        cinfer_backend_destroy(be);
        return 0;
    }
    r->V = cinfer_model_get_info(m)->n_vocab;
    r->logits = malloc(sizeof(float) * (size_t)STEPS * (size_t)r->V);
    greedy(m, prompt, N_PROMPT, r->toks, r->logits);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
    for (int i = 0; i < 4; i++)
        if (!g_refs[i].r.logits) {
            snprintf(g_refs[i].path, sizeof g_refs[i].path, "%s", path);
            g_refs[i].r = *r;
            g_refs[i].r.logits = malloc(sizeof(float) * (size_t)STEPS *
                                        (size_t)r->V);
            memcpy(g_refs[i].r.logits, r->logits,
                   sizeof(float) * (size_t)STEPS * (size_t)r->V);
            break;
        }
    return 1;
}

static void compare(const run *ref, const run *got, const char *what,
                    double bound)
{
    int first_diff = -1;
    for (int i = 0; i < STEPS && first_diff < 0; i++)
        if (ref->toks[i] != got->toks[i])
            first_diff = i;
    CHECK_EQ_INT(first_diff, -1);
    double w = worst_rel_l2(ref->logits, got->logits, ref->V);
    fprintf(stderr,
            "  %s: %d greedy tokens equal TP=1's, worst rel L2 of logits "
            "%.3g\n",
            what, first_diff < 0 ? STEPS : first_diff, w);
    CHECK(w <= bound);
}

static void group_run(cinfer_model *m, run *r)
{
    r->V = cinfer_model_get_info(m)->n_vocab;
    r->logits = malloc(sizeof(float) * (size_t)STEPS * (size_t)r->V);
    greedy(m, prompt, N_PROMPT, r->toks, r->logits);
}

static void test_tp1_through_nccl_is_the_plain_backend(void)
{
    const char *path = write_tiny("Q8_0", CINFER_DTYPE_Q8_0, 512);
    run ref = {0}, got = {0};
    if (reference(path, &ref)) {
        cinfer_model *m = open_group(path, 1);
        if (m) {
            CHECK_EQ_INT(cinfer_model_get_info(m)->tensor_parallel, 1);
            group_run(m, &got);
            for (int i = 0; i < STEPS; i++)
                CHECK_EQ_INT(got.toks[i], ref.toks[i]);
            CHECK(memcmp(got.logits, ref.logits,
                         sizeof(float) * (size_t)STEPS * (size_t)ref.V) == 0);
            fprintf(stderr, "  TP=1 through NCCL: %d steps bit-identical to "
                            "the plain backend\n",
                    STEPS);
            cinfer_model_destroy(m);
        }
    }
    free(ref.logits);
    free(got.logits);
    unlink(path);
}

static void test_tp2_tp3_equal_tp1(void)
{
    int devices = cinfer_cuda_device_count();
    if (devices < 2) {
        fprintf(stderr, "  skipped: %d CUDA device(s), TP=2 needs 2\n",
                devices);
        return;
    }
    /* each type at the split that exercises it: Q8_0 at 2 and 3 (bit-equal
     * sums), Q4_1 at 2 (re-rounded Q8_1 blocks), F32 at 3 (float
     * reordering; the uneven LM head split) */
    static const struct {
        cinfer_dtype t;
        const char *name;
        int tp;
        double bound;
    } cases[] = {
        {CINFER_DTYPE_Q8_0, "Q8_0", 2, TINY_BOUND},
        {CINFER_DTYPE_Q8_0, "Q8_0", 3, TINY_BOUND},
        {CINFER_DTYPE_Q4_1, "Q4_1", 2, QUANT_BOUND},
        {CINFER_DTYPE_F32, "F32", 3, TINY_BOUND},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (cases[c].tp > devices) {
            fprintf(stderr, "  skipped: TP=%d needs %d CUDA devices\n",
                    cases[c].tp, cases[c].tp);
            continue;
        }
        const char *path = write_tiny(cases[c].name, cases[c].t, 512);
        run ref = {0};
        if (reference(path, &ref)) {
            cinfer_model *m = open_group(path, cases[c].tp);
            if (m) {
                CHECK_EQ_INT(cinfer_model_get_info(m)->tensor_parallel,
                             cases[c].tp);
                run got = {0};
                group_run(m, &got);
                char what[64];
                snprintf(what, sizeof what, "tiny %s TP=%d on CUDA ranks",
                         cases[c].name, cases[c].tp);
                compare(&ref, &got, what, cases[c].bound);
                free(got.logits);
                cinfer_model_destroy(m);
            }
        }
        free(ref.logits);
    }
}

/* --cuda-graphs off reaches a group's ranks (cuda_eager), and the group
 * reports its first rank's graph counts: TP=1 through NCCL records its
 * decode steps and replays them, bit-identical to its eager run; at TP=2
 * the ranks' steps run eagerly whatever is asked (engine/model.c: NCCL's
 * capture rules), with the same bits. */
static void test_group_graphs(void)
{
    const char *path = write_tiny("graphs", CINFER_DTYPE_Q4_1, 512);
    int devices = cinfer_cuda_device_count();
    for (int tp = 1; tp <= 2; tp++) {
        if (tp > devices) {
            fprintf(stderr, "  skipped: TP=%d needs %d CUDA devices\n", tp,
                    tp);
            continue;
        }
        cinfer_model *eager = open_group_as(path, tp, 1);
        cinfer_model *graphs = open_group_as(path, tp, 0);
        if (eager && graphs) {
            run a = {0}, b = {0};
            group_run(eager, &a);
            group_run(graphs, &b);
            for (int i = 0; i < STEPS; i++)
                CHECK_EQ_INT(b.toks[i], a.toks[i]);
            CHECK(memcmp(a.logits, b.logits,
                         sizeof(float) * (size_t)STEPS * (size_t)a.V) == 0);
            cinfer_backend_graph_stats ge, gg;
            cinfer_model_graph_stats(eager, &ge);
            cinfer_model_graph_stats(graphs, &gg);
            fprintf(stderr,
                    "  TP=%d: %d steps bit-identical with graphs off and on "
                    "(on: %lld recorded, %lld replayed)\n",
                    tp, STEPS, (long long)gg.captured,
                    (long long)gg.replayed);
            CHECK_EQ_INT(ge.captured + ge.replayed, 0);
            /* the prompt runs eagerly; its STEPS - 1 decode steps share a
             * bucket: recorded once, then replayed */
            CHECK_EQ_INT(gg.captured, tp == 1 ? 1 : 0);
            CHECK_EQ_INT(gg.replayed, tp == 1 ? STEPS - 2 : 0);
            free(a.logits);
            free(b.logits);
        }
        cinfer_model_destroy(graphs);
        cinfer_model_destroy(eager);
    }
    unlink(path);
}

/* Node 1 of two, on its own thread: creates its group (device 1) and
 * follows until node 0 lets it go. */
typedef struct {
    const char *path;
    char addr[64];
    int device;
    cinfer_status create_st, follow_st;
    char err[512];
} node1_ctx;

static void *node1_main(void *arg)
{
    node1_ctx *c = arg;
    cinfer_model_params p = base(c->path);
    p.tensor_parallel = 2;
    p.tp_device = CINFER_TP_CUDA;
    p.cuda = &cuda_entry;
    p.cuda_devices = &c->device;
    p.n_nodes = 2;
    p.node_rank = 1;
    p.dist_init_addr = c->addr;
    p.dist_timeout_ms = 20000;
    cinfer_model *m = NULL;
    c->create_st = cinfer_model_create(&p, &m);
    c->follow_st = CINFER_E_INTERNAL;
    if (c->create_st != CINFER_OK) {
        snprintf(c->err, sizeof c->err, "%s", cinfer_last_error());
        return NULL;
    }
    c->follow_st = cinfer_model_follow(m);
    if (c->follow_st != CINFER_OK)
        snprintf(c->err, sizeof c->err, "%s", cinfer_last_error());
    cinfer_model_destroy(m);
    return NULL;
}

/* A free TCP port on loopback for node 0's rendezvous. */
static int free_port(void)
{
    cinfer_rendezvous_params rp = cinfer_rendezvous_default_params();
    rp.addr = "127.0.0.1:0";
    rp.n_nodes = 2;
    rp.world_size = 2;
    cinfer_rendezvous *r = NULL;
    if (cinfer_rendezvous_create(&rp, &r) != CINFER_OK)
        return 0;
    int port = cinfer_rendezvous_port(r);
    cinfer_rendezvous_destroy(r);
    return port;
}

static cinfer_model *open_node0(const char *path, const char *addr)
{
    cinfer_model_params p = base(path);
    p.tensor_parallel = 2;
    p.tp_device = CINFER_TP_CUDA;
    p.cuda = &cuda_entry;
    p.n_nodes = 2;
    p.node_rank = 0;
    p.dist_init_addr = addr;
    p.dist_timeout_ms = 20000;
    cinfer_model *m = NULL;
    cinfer_status st = cinfer_model_create(&p, &m);
    if (st != CINFER_OK)
        fprintf(stderr, "  node 0: %s\n", cinfer_last_error());
    return m;
}

/* One row whose input is an embedding (prompt embeddings, model.h): the
 * forward's status. */
static cinfer_status embeds_step(cinfer_model *m)
{
    const cinfer_model_info *I = cinfer_model_get_info(m);
    float *row = calloc((size_t)I->n_embd, sizeof *row);
    float *logits = malloc(sizeof(float) * (size_t)I->n_vocab);
    const float *re[1] = {row};
    int32_t tok = 0, pos = 0, seq = 0, slot = 0, out = 0, tab = 0;
    cinfer_step s = {.n_rows = 1, .n_seqs = 1, .block_size = I->block_size,
                     .max_blocks = 1, .tokens = &tok, .positions = &pos,
                     .row_seq = &seq, .slots = &slot, .block_tables = &tab,
                     .n_out = 1, .out_rows = &out, .row_embd = re};
    cinfer_status st = cinfer_model_forward(m, &s, logits);
    free(row);
    free(logits);
    return st;
}

static void test_two_nodes_equal_tp1(void)
{
    if (cinfer_cuda_device_count() < 2) {
        fprintf(stderr, "  skipped: two nodes need two CUDA devices here\n");
        return;
    }
    const char *path = write_tiny("Q8_0", CINFER_DTYPE_Q8_0, 512);
    run ref = {0};
    if (!reference(path, &ref)) {
        unlink(path);
        return;
    }
    node1_ctx c = {.path = path, .device = 1};
    snprintf(c.addr, sizeof c.addr, "127.0.0.1:%d", free_port());
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, node1_main, &c), 0);
    cinfer_model *m = open_node0(path, c.addr);
    if (m) {
        const cinfer_model_info *I = cinfer_model_get_info(m);
        CHECK_EQ_INT(I->tensor_parallel, 2);
        /* node 0 is not a follower, and forward on it runs both nodes */
        CHECK_EQ_INT(cinfer_model_follow(m), CINFER_E_INVALID_ARG);
        /* prompt embeddings do not cross processes: refused before any
         * node starts the step, so the group stays whole (the run below) */
        CHECK(!cinfer_model_input_embeds(m));
        CHECK_EQ_INT(embeds_step(m), CINFER_E_UNSUPPORTED);
        run got = {0};
        group_run(m, &got);
        compare(&ref, &got, "tiny Q8_0 TP=2 over two nodes", TINY_BOUND);
        free(got.logits);
        cinfer_model_destroy(m); /* lets node 1 go */
    }
    pthread_join(th, NULL);
    CHECK_EQ_INT(c.create_st, CINFER_OK);
    CHECK_EQ_INT(c.follow_st, CINFER_OK);
    if (c.follow_st != CINFER_OK)
        fprintf(stderr, "  node 1: %s\n", c.err);
    free(ref.logits);
    unlink(path);
}

/* Node 1 loaded another model (a different vocabulary): node 0 refuses
 * the group naming node 1 and both numbers; node 1 hears why. */
static void test_node_with_another_model_is_refused(void)
{
    if (cinfer_cuda_device_count() < 2) {
        fprintf(stderr, "  skipped: two nodes need two CUDA devices here\n");
        return;
    }
    /* write_tiny's path is a static buffer: copy each */
    char path0[256], path1[256];
    snprintf(path0, sizeof path0, "%s", write_tiny("Q8_0", CINFER_DTYPE_Q8_0,
                                                   512));
    snprintf(path1, sizeof path1, "%s", write_tiny("other", CINFER_DTYPE_Q8_0,
                                                   640));
    node1_ctx c = {.path = path1, .device = 1};
    snprintf(c.addr, sizeof c.addr, "127.0.0.1:%d", free_port());
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, node1_main, &c), 0);
    cinfer_model_params p = base(path0);
    p.tensor_parallel = 2;
    p.tp_device = CINFER_TP_CUDA;
    p.cuda = &cuda_entry;
    p.n_nodes = 2;
    p.dist_init_addr = c.addr;
    p.dist_timeout_ms = 20000;
    cinfer_model *m = NULL;
    CHECK_EQ_INT(cinfer_model_create(&p, &m), CINFER_E_INVALID_ARG);
    CHECK(!m);
    cinfer_model_destroy(m); /* should the refusal fail: lets node 1 go */
    CHECK(strstr(cinfer_last_error(), "node 1 loaded another model"));
    CHECK(strstr(cinfer_last_error(), "n_vocab 640"));
    fprintf(stderr, "  refused: %s\n", cinfer_last_error());
    pthread_join(th, NULL);
    CHECK(c.create_st != CINFER_OK);
    CHECK(strstr(c.err, "node 1 loaded another model"));
    unlink(path0);
    unlink(path1);
}

int main(void)
{
#ifndef CINFER_TEST_CUDASIM
    if (cinfer_cuda_device_count() == 0)
        return harness_skip("no CUDA device");
#endif
    RUN(test_tp1_through_nccl_is_the_plain_backend);
    RUN(test_tp2_tp3_equal_tp1);
    RUN(test_group_graphs);
    RUN(test_two_nodes_equal_tp1);
    RUN(test_node_with_another_model_is_refused);
    return harness_done();
}
