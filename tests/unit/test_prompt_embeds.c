/*
 * test_prompt_embeds.c - prompt embeddings (soft prompts): float rows that
 * stand in for token embeddings at the start of a prompt (engine.h
 * prompt_embeds; cinfer_step.row_embd, uploaded by model.c over the embed
 * op's rows; the scheduler keeps them out of the prefix cache).
 *
 * The property: a row equal to a token's dequantized row of token_embd
 * gives that token's output bit for bit. Checked on tiny random models:
 *   - the forward pass: a step whose first rows carry the dequantized rows
 *     of their tokens (and a wrong token id, which must be ignored) writes
 *     the same logits, every row, as the step of the tokens; a row of
 *     another token changes them (the check can fail). Q8_0, F16 and Q4_1
 *     embeddings; a gemma3 model (the rows are taken before its
 *     sqrt(n_embd) scale); a CPU tensor-parallel group of 2 ranks.
 *   - the engine, with the prefix cache on: greedy and seeded (n = 2)
 *     outputs of embeddings alone and of embeddings followed by tokens are
 *     those of the tokens (ids, text, logprobs, finish); such a request
 *     registers no block in the prefix cache and matches none a token
 *     request registered, while its second sample still shares the first
 *     one's prompt blocks; usage counts the rows as prompt tokens; every
 *     block is free and consistent at the end. Also on a gemma3 model
 *     with a sliding window, whose local layers' blocks the engine
 *     releases as the window moves.
 *   - the engine's own checks: a value that is not finite, rows past the
 *     context, values missing.
 *
 * Built twice (tests/CMakeLists.txt): test_prompt_embeds on the CPU
 * backend, and test_prompt_embeds_cudasim (CINFER_TEST_CUDASIM) with the
 * CUDA backend under the harness (tests/cudasim/), where the same
 * forward and engine checks run on the CUDA backend (Q8_0 and F16
 * embeddings, whose dequantization is one exact product or conversion
 * on either backend; no gemma3 and no CPU group there).
 */
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tinymodel.h"
#include "harness.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXT 64 /* tokens per sample recorded */

/* ---------------------------------------------------------------------- */
/* models and rows                                                        */
/* ---------------------------------------------------------------------- */

static char paths[6][256];
static int n_paths;

/* window: gemma3's sliding window (its local layers then keep their K/V
 * in a pool of their own, whose blocks the engine releases); 0 = none */
static const char *write_model(const char *arch, cinfer_dtype embd,
                               cinfer_dtype wt, uint64_t seed, int window)
{
    char *path = paths[n_paths++];
    snprintf(path, sizeof paths[0], "/tmp/cinfer_test_embeds_%d_%d.gguf",
             (int)getpid(), n_paths);
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    p.arch = arch;
    p.embd_dtype = embd;
    p.weight_dtype = wt;
    p.tied_output = 0;
    p.seed = seed;
    p.n_ctx = 256;
    p.sliding_window = (uint32_t)window;
    CHECK_OK(cinfer_tinymodel_write(&p, path));
    return path;
}

static cinfer_backend *cuda_be; /* the harness's device, or NULL (CPU) */

static cinfer_model *load(const char *path, int tp)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.backend = tp > 1 ? NULL : cuda_be;
    mp.n_threads = 2;
    mp.n_ctx = 128;
    mp.block_size = 16;
    mp.max_seqs = 4;
    mp.max_batch_rows = 128;
    mp.tensor_parallel = tp;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    return m;
}

/* The dequantized rows of token_embd for tokens[0..n), read from the file
 * itself (the model's own copy may be packed or on a device). */
static float *embd_rows(const char *path, const int32_t *tokens, int n)
{
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = path;
    cinfer_gguf *g = NULL;
    CHECK_OK(cinfer_gguf_create(&gp, &g));
    if (!g)
        return NULL;
    const cinfer_gguf_tensor *t =
        cinfer_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t != NULL);
    float *rows = NULL;
    if (t) {
        int64_t d = t->ne[0];
        size_t rb = cinfer_dtype_row_bytes(t->dtype, d);
        rows = malloc(sizeof(float) * (size_t)(n * d + 1));
        for (int i = 0; i < n; i++)
            cinfer_dequantize_row(t->dtype,
                                  (const uint8_t *)t->data +
                                      (size_t)tokens[i] * rb,
                                  rows + (size_t)i * (size_t)d, d);
    }
    cinfer_gguf_destroy(g);
    return rows;
}

static void random_tokens(int32_t *t, int n, int V, uint64_t seed)
{
    uint64_t rng = seed;
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(harness_rand(&rng) % (uint64_t)(V - 3));
}

/* ---------------------------------------------------------------------- */
/* the forward pass                                                       */
/* ---------------------------------------------------------------------- */

/* One sequence's rows 0..n-1 in one step over blocks 0, 1, ..., every
 * row's logits out; rows [0, k) take rows[] (when rows is not NULL). */
static cinfer_status forward(cinfer_model *m, const int32_t *tokens, int n,
                             const float *rows, int k, float *logits)
{
    const cinfer_model_info *I = cinfer_model_get_info(m);
    int32_t pos[128], rs[128], slots[128], outr[128], tab[16];
    const float *re[128];
    CHECK(n <= 128);
    for (int i = 0; i < n; i++) {
        pos[i] = slots[i] = outr[i] = i;
        rs[i] = 0;
        re[i] = rows && i < k ? rows + (size_t)i * (size_t)I->n_embd : NULL;
    }
    for (int b = 0; b < 16; b++)
        tab[b] = b;
    cinfer_step s = {
        .n_rows = n,
        .n_seqs = 1,
        .block_size = I->block_size,
        .max_blocks = 16,
        .tokens = tokens,
        .positions = pos,
        .row_seq = rs,
        .slots = slots,
        .block_tables = tab,
        .n_out = n,
        .out_rows = outr,
        .row_embd = rows ? re : NULL,
    };
    return cinfer_model_forward(m, &s, logits);
}

/* Tokens against their rows: rows [0, k) as embeddings (their token ids
 * replaced by a wrong one), for k = n, a prefix, one row; then a row of
 * another token, which must change the logits. */
static void check_forward(const char *path, int tp, const char *what)
{
    cinfer_model *m = load(path, tp);
    if (!m)
        return;
    CHECK(cinfer_model_input_embeds(m));
    const cinfer_model_info *I = cinfer_model_get_info(m);
    enum { N = 21 };
    int32_t tok[N], wrong[N];
    random_tokens(tok, N, I->n_vocab, 7);
    float *rows = embd_rows(path, tok, N);
    size_t V = (size_t)I->n_vocab;
    float *ref = malloc(sizeof(float) * N * V);
    float *got = malloc(sizeof(float) * N * V);
    CHECK_OK(forward(m, tok, N, NULL, 0, ref));
    const int ks[] = {N, 9, 1};
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
        memcpy(wrong, tok, sizeof tok);
        for (int i = 0; i < ks[j]; i++)
            wrong[i] = (tok[i] + 1) % (I->n_vocab - 3);
        memset(got, 0xff, sizeof(float) * N * V);
        CHECK_OK(forward(m, wrong, N, rows, ks[j], got));
        if (memcmp(ref, got, sizeof(float) * N * V) != 0) {
            fprintf(stderr, "  %s: %d embedding rows: logits differ\n", what,
                    ks[j]);
            harness_failed_checks++;
        }
    }
    /* row 0 of another token: every row's logits move */
    float *other = embd_rows(path, &wrong[0], 1);
    memcpy(rows, other, sizeof(float) * (size_t)I->n_embd);
    CHECK_OK(forward(m, tok, N, rows, 1, got));
    CHECK(memcmp(ref + (N - 1) * V, got + (N - 1) * V, sizeof(float) * V) != 0);
    free(other);
    free(rows);
    free(ref);
    free(got);
    cinfer_model_destroy(m);
}

static void test_forward_rows_equal_tokens(void)
{
    check_forward(
        write_model("llama", CINFER_DTYPE_Q8_0, CINFER_DTYPE_F16, 3, 0), 1,
        "llama q8_0");
    check_forward(
        write_model("qwen2", CINFER_DTYPE_F16, CINFER_DTYPE_Q8_0, 4, 0), 1,
        "qwen2 f16");
#ifndef CINFER_TEST_CUDASIM
    check_forward(
        write_model("llama", CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q4_1, 5, 0), 1,
        "llama q4_1");
    check_forward(
        write_model("gemma3", CINFER_DTYPE_F16, CINFER_DTYPE_F32, 6, 0), 1,
        "gemma3");
    check_forward(paths[0], 2, "llama q8_0, tp 2");
#endif
}

/* ---------------------------------------------------------------------- */
/* the engine                                                             */
/* ---------------------------------------------------------------------- */

typedef struct {
    int32_t ids[MAXT];
    int n_ids;
    float lps[MAXT];
    char text[2048];
    size_t text_len;
    int finished;
    cinfer_finish_reason why;
    int32_t prompt_tokens, completion, cached;
} rec;

static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static int ev_finished;

static void on_event(void *user, const cinfer_engine_event *ev)
{
    rec *r = (rec *)user + ev->sample_index;
    pthread_mutex_lock(&ev_mu);
    if (ev->kind == CINFER_EVENT_TOKENS) {
        for (size_t i = 0; i < ev->n_ids && r->n_ids < MAXT; i++) {
            r->ids[r->n_ids] = ev->ids[i];
            r->lps[r->n_ids] = ev->logprobs ? ev->logprobs[i] : 0.0f;
            r->n_ids++;
        }
        if (r->text_len + ev->text_len < sizeof r->text) {
            memcpy(r->text + r->text_len, ev->text, ev->text_len);
            r->text_len += ev->text_len;
        }
    } else {
        r->finished = 1;
        r->why = ev->finish;
        r->prompt_tokens = ev->prompt_tokens;
        r->completion = ev->completion_tokens;
        r->cached = ev->cached_tokens;
        ev_finished++;
        pthread_cond_broadcast(&ev_cv);
    }
    pthread_mutex_unlock(&ev_mu);
}

/* Submits rp with recs[n_samples] and waits for every sample's end. */
static void run(cinfer_engine *e, cinfer_request_params rp, rec *recs)
{
    int n = rp.n_samples ? rp.n_samples : 1;
    memset(recs, 0, sizeof *recs * (size_t)n);
    pthread_mutex_lock(&ev_mu);
    ev_finished = 0;
    pthread_mutex_unlock(&ev_mu);
    rp.on_event = on_event;
    rp.user = recs;
    CHECK_OK(cinfer_engine_submit(e, &rp, NULL));
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 600;
    int ok = 1;
    pthread_mutex_lock(&ev_mu);
    while (ev_finished < n && ok)
        ok = pthread_cond_timedwait(&ev_cv, &ev_mu, &dl) != ETIMEDOUT;
    pthread_mutex_unlock(&ev_mu);
    CHECK(ok);
}

static void check_same(const rec *a, const rec *b, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        int same = a[i].finished && b[i].finished && a[i].n_ids == b[i].n_ids &&
                   memcmp(a[i].ids, b[i].ids,
                          sizeof(int32_t) * (size_t)a[i].n_ids) == 0 &&
                   memcmp(a[i].lps, b[i].lps,
                          sizeof(float) * (size_t)a[i].n_ids) == 0 &&
                   a[i].text_len == b[i].text_len &&
                   memcmp(a[i].text, b[i].text, a[i].text_len) == 0 &&
                   a[i].why == b[i].why && a[i].completion == b[i].completion &&
                   a[i].prompt_tokens == b[i].prompt_tokens;
        if (!same) {
            fprintf(stderr, "  %s: sample %d differs (%d vs %d tokens)\n",
                    what, i, a[i].n_ids, b[i].n_ids);
            harness_failed_checks++;
        }
    }
}

static int blocks_cached(cinfer_engine *e)
{
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    return st.kv_blocks_cached;
}

enum { PN = 40 }; /* prompt tokens: two full blocks of 16, and 8 */

/* The prompt tok[0..PN) with its first `from` tokens given as their
 * rows. */
static cinfer_request_params params(const int32_t *tok, int from,
                                    const float *rows)
{
    cinfer_request_params rp = cinfer_request_default_params();
    rp.prompt = tok + from;
    rp.n_prompt = (size_t)(PN - from);
    rp.prompt_embeds = from ? rows : NULL;
    rp.n_prompt_embeds = (size_t)from;
    rp.max_tokens = 16;
    rp.ignore_eos = 1;
    rp.logprobs = 1;
    rp.sampling.temperature = 0.0f;
    return rp;
}

/* share: the second sample takes the first one's prompt blocks (not on
 * a window pool, whose sample 0 has released the blocks behind its window
 * by the time sample 1 is admitted; without the prefix cache a token
 * request's samples share no more there) */
static void check_engine(const char *path, int share, const char *what)
{
    fprintf(stderr, "  %s\n", what);
    cinfer_model *m = load(path, 1);
    if (!m)
        return;
    const cinfer_model_info *I = cinfer_model_get_info(m);
    int32_t tok[PN];
    random_tokens(tok, PN, I->n_vocab, 11);
    float *rows = embd_rows(path, tok, PN);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.admit_past_deadlines = 1;
    ep.max_seqs = 4;
    ep.prefix_cache = 1;
    cinfer_engine *e = NULL;
    CHECK_OK(cinfer_engine_create(&ep, &e));
    if (!e) {
        cinfer_model_destroy(m);
        free(rows);
        return;
    }
    rec ref[2], got[2];

    /* embeddings first, on an empty cache: they register nothing */
    run(e, params(tok, PN, rows), got);
    CHECK_EQ_INT(got[0].prompt_tokens, PN);
    CHECK_EQ_INT(got[0].cached, 0);
    CHECK_EQ_INT(blocks_cached(e), 0);
    rec only = got[0];
    run(e, params(tok, 20, rows), got);
    CHECK_EQ_INT(got[0].cached, 0);
    CHECK_EQ_INT(blocks_cached(e), 0);
    rec mixed = got[0];

    /* the tokens: nothing cached for them to match; then their full
     * blocks are (the prompt's and the first generated tokens') */
    run(e, params(tok, 0, rows), ref);
    CHECK_EQ_INT(ref[0].cached, 0);
    CHECK_EQ_INT(ref[0].prompt_tokens, PN);
    CHECK_EQ_INT(blocks_cached(e), (PN + 16 - 1) / 16);
    check_same(ref, &only, 1, "embeddings only, greedy");
    check_same(ref, &mixed, 1, "20 rows then 20 tokens, greedy");

    /* an embeddings request matches none of the tokens' cached blocks */
    run(e, params(tok, 33, rows), got);
    CHECK_EQ_INT(got[0].cached, 0);
    check_same(ref, got, 1, "33 rows then 7 tokens, after the tokens");

    /* seeded, two samples: each as the tokens' */
    cinfer_request_params rp = params(tok, 0, rows);
    rp.sampling.temperature = 0.9f;
    rp.sampling.top_p = 0.95f;
    rp.sampling.seed = 1234;
    rp.n_samples = 2;
    run(e, rp, ref);
    int cached_before = blocks_cached(e);
    rp = params(tok, 24, rows);
    rp.sampling.temperature = 0.9f;
    rp.sampling.top_p = 0.95f;
    rp.sampling.seed = 1234;
    rp.n_samples = 2;
    run(e, rp, got);
    check_same(ref, got, 2, "seeded, n = 2, 24 rows then 16 tokens");
    CHECK(ref[0].n_ids != ref[1].n_ids ||
          memcmp(ref[0].ids, ref[1].ids, sizeof(int32_t) * MAXT) != 0);
    /* not from the cache, but the second sample shares the first's
     * prompt blocks */
    CHECK_EQ_INT(got[0].cached, 0);
    CHECK_EQ_INT(got[1].cached, share ? (PN / 16) * 16 : 0);
    CHECK_EQ_INT(blocks_cached(e), cached_before);

    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK(cinfer_engine_check_kv(e));
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
    free(rows);
}

static void test_engine_output_equals_tokens(void)
{
    check_engine(paths[0], 1, "llama, Q8_0 embeddings");
#ifndef CINFER_TEST_CUDASIM
    /* a window of 8: the local layers' blocks are released as the window
     * moves */
    check_engine(write_model("gemma3", CINFER_DTYPE_F16, CINFER_DTYPE_F32, 8,
                             8),
                 0, "gemma3, a window pool");
#endif
}

static void test_engine_refuses_bad_embeddings(void)
{
    cinfer_model *m = load(paths[0], 1);
    if (!m)
        return;
    const cinfer_model_info *I = cinfer_model_get_info(m);
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    cinfer_engine *e = NULL;
    CHECK_OK(cinfer_engine_create(&ep, &e));
    if (!e) {
        cinfer_model_destroy(m);
        return;
    }
    size_t d = (size_t)I->n_embd, n = (size_t)I->n_ctx + 1;
    float *rows = calloc(n * d, sizeof *rows);
    rec r[1];
    cinfer_request_params rp = cinfer_request_default_params();
    rp.on_event = on_event;
    rp.user = r;
    rp.prompt_embeds = rows;
    rp.n_prompt_embeds = 3;
    rows[2 * d + 5] = NAN;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, NULL), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "prompt_embeds[") != NULL);
    rows[2 * d + 5] = INFINITY;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, NULL), CINFER_E_INVALID_ARG);
    rows[2 * d + 5] = 0.0f;
    rp.n_prompt_embeds = n;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, NULL), CINFER_E_RANGE);
    int32_t one = 5;
    rp.prompt = &one;
    rp.n_prompt = 1;
    rp.n_prompt_embeds = n - 1; /* n_ctx rows and a token */
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, NULL), CINFER_E_RANGE);
    rp.prompt_embeds = NULL;
    rp.n_prompt_embeds = 2;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, NULL), CINFER_E_INVALID_ARG);
    free(rows);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

int main(void)
{
#ifdef CINFER_TEST_CUDASIM
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    if (cinfer_backend_cuda_create(&cp, &cuda_be) != CINFER_OK) {
        fprintf(stderr, "cuda backend: %s\n", cinfer_last_error());
        return 1;
    }
#endif
    RUN(test_forward_rows_equal_tokens);
    RUN(test_engine_output_equals_tokens);
    RUN(test_engine_refuses_bad_embeddings);
    for (int i = 0; i < n_paths; i++)
        unlink(paths[i]);
    cinfer_backend_destroy(cuda_be);
    return harness_done();
}
