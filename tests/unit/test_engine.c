/*
 * test_engine.c - the serving engine on tiny random models (and, in one
 * test, the default model).
 *
 * The central property: with greedy sampling a request's tokens do not
 * depend on what else runs. Requests submitted together (released from a
 * paused engine into one batch) must give exactly the tokens each gives
 * alone, with chunked prefill (a tiny token budget) and with preemption (a
 * KV cache far too small for the batch). The rest: agreement with a plain
 * single-sequence decode, the prefix cache (cached_tokens, same tokens),
 * n > 1 samples, stop conditions, logprobs, cancellation and deadlines on
 * the injected clock, validation, shutdown, and a randomized run of 2000
 * requests after which every block is free.
 */
#define _GNU_SOURCE /* memmem */
#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tinymodel.h"
#include "harness.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MAXT 256   /* tokens per sample we record */
#define MAXS 4     /* samples per request we record */

/* ---------------------------------------------------------------------- */
/* models                                                                 */
/* ---------------------------------------------------------------------- */

static char tiny_path[256];

static const char *tiny_file(void)
{
    if (!tiny_path[0]) {
        snprintf(tiny_path, sizeof tiny_path, "/tmp/cinfer_test_engine_%d.gguf",
                 (int)getpid());
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.n_ctx = 1024;
        p.seed = 7;
        CHECK_OK(cinfer_tinymodel_write(&p, tiny_path));
    }
    return tiny_path;
}

static cinfer_model *tiny_model(int n_kv_blocks, int block_size, int n_ctx)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = tiny_file();
    mp.n_threads = 1;
    mp.n_ctx = n_ctx;
    mp.block_size = block_size;
    mp.n_kv_blocks = n_kv_blocks;
    mp.max_batch_rows = 512;
    mp.max_seqs = 4;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    return m;
}

/* ---------------------------------------------------------------------- */
/* clock                                                                  */
/* ---------------------------------------------------------------------- */

/* A manual clock: the test sets it; every read also moves it on by
 * `tick` ns, so time passes with engine iterations when tick > 0. */
typedef struct {
    _Atomic int64_t t;
    int64_t tick;
} test_clock;

static int64_t clock_read(void *user)
{
    test_clock *c = user;
    return atomic_fetch_add(&c->t, c->tick) + c->tick;
}

/* ---------------------------------------------------------------------- */
/* event collection                                                       */
/* ---------------------------------------------------------------------- */

typedef struct {
    int32_t ids[MAXT];
    int n_ids;
    float lps[MAXT];
    int32_t top0[MAXT];
    int n_lps;
    char text[8192];
    size_t text_len;
    int finished;
    int after_finish; /* events seen after FINISH: must stay 0 */
    int finish_order; /* 1 = first sample to finish since reset_events */
    cinfer_engine_event fin;
} sample_rec;

typedef struct {
    sample_rec s[MAXS];
    cinfer_engine *e;
    uint64_t id;
    int cancel_after; /* cancel from the callback after this many ids */
    int cancel_sent;
    int pause_after;  /* pause the engine from the callback after this many
                         ids: a starved test thread then cannot let the
                         engine run on past them */
    int n_samples; /* set by the random test's submitter */
} req_rec;

static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static int ev_finished;
static int ev_bad; /* malformed events */

static void on_event(void *user, const cinfer_engine_event *ev)
{
    req_rec *rr = user;
    int cancel = 0, pause = 0;
    pthread_mutex_lock(&ev_mu);
    if (ev->request_id != rr->id && rr->id)
        ev_bad++;
    if (ev->sample_index < 0 || ev->sample_index >= MAXS) {
        ev_bad++;
        pthread_mutex_unlock(&ev_mu);
        return;
    }
    sample_rec *s = &rr->s[ev->sample_index];
    if (s->finished) {
        s->after_finish++;
    } else if (ev->kind == CINFER_EVENT_TOKENS) {
        for (size_t i = 0; i < ev->n_ids; i++) {
            if (s->n_ids < MAXT)
                s->ids[s->n_ids] = ev->ids[i];
            s->n_ids++;
            if (ev->logprobs && s->n_lps < MAXT) {
                s->lps[s->n_lps] = ev->logprobs[i];
                s->top0[s->n_lps] =
                    ev->n_top ? ev->top[i * (size_t)ev->n_top].id : -1;
                s->n_lps++;
            }
        }
        if (s->text_len + ev->text_len < sizeof s->text) {
            memcpy(s->text + s->text_len, ev->text, ev->text_len);
            s->text_len += ev->text_len;
            s->text[s->text_len] = 0;
        }
        if (rr->cancel_after && !rr->cancel_sent &&
            s->n_ids >= rr->cancel_after) {
            rr->cancel_sent = 1;
            cancel = 1;
        }
        if (rr->pause_after && s->n_ids >= rr->pause_after) {
            rr->pause_after = 0;
            pause = 1;
        }
    } else if (ev->kind == CINFER_EVENT_FINISH) {
        s->finished = 1;
        s->fin = *ev;
        s->fin.ids = NULL;
        s->fin.text = NULL;
        s->fin.message = NULL;
        ev_finished++;
        s->finish_order = ev_finished;
        pthread_cond_broadcast(&ev_cv);
    } else {
        ev_bad++;
    }
    pthread_mutex_unlock(&ev_mu);
    if (cancel)
        cinfer_engine_cancel(rr->e, ev->request_id);
    if (pause)
        cinfer_engine_pause(rr->e, 1);
}

static void reset_events(void)
{
    pthread_mutex_lock(&ev_mu);
    ev_finished = 0;
    ev_bad = 0;
    pthread_mutex_unlock(&ev_mu);
}

/* Waits until n samples finished (fails the test after a generous bound,
 * which only a hung engine reaches). */
static int wait_finished(int n)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 300;
    int ok = 1;
    pthread_mutex_lock(&ev_mu);
    while (ev_finished < n) {
        if (pthread_cond_timedwait(&ev_cv, &ev_mu, &dl) == ETIMEDOUT) {
            fprintf(stderr, "timed out: %d of %d samples finished\n",
                    ev_finished, n);
            ok = 0;
            break;
        }
    }
    pthread_mutex_unlock(&ev_mu);
    CHECK(ok);
    return ok;
}

static cinfer_engine *make_engine_hold(cinfer_model *m, int max_seqs,
                                       int max_batched, int prefix,
                                       test_clock *clk, int hold)
{
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.admit_past_deadlines = !hold;
    ep.max_seqs = max_seqs;
    ep.max_batched_tokens = max_batched;
    ep.prefix_cache = prefix;
    if (clk) {
        ep.now_ns = clock_read;
        ep.now_user = clk;
    }
    cinfer_engine *e = NULL;
    CHECK_OK(cinfer_engine_create(&ep, &e));
    return e;
}

/* The tests below but one check the engine's mechanics with deadlines
 * that only expire: nothing is held back or refused for them. */
static cinfer_engine *make_engine(cinfer_model *m, int max_seqs,
                                  int max_batched, int prefix,
                                  test_clock *clk)
{
    return make_engine_hold(m, max_seqs, max_batched, prefix, clk, 0);
}

/* Every block free (or cached) and the allocator consistent. */
static void check_idle(cinfer_engine *e)
{
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.waiting, 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK(cinfer_engine_check_kv(e));
}

/* ---------------------------------------------------------------------- */
/* workloads                                                              */
/* ---------------------------------------------------------------------- */

typedef struct {
    int32_t prompt[600];
    int n_prompt;
    int max_tokens;
    int priority;
} job;

static void make_jobs(job *jobs, int n, int max_prompt, int max_gen,
                      int n_vocab, uint64_t seed)
{
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        /* mixed lengths: a few long prompts, many short */
        int len = 1 + (int)(harness_rand(&rng) % (uint64_t)max_prompt);
        if (i % 4 == 0)
            len = max_prompt - (int)(harness_rand(&rng) % 8);
        j->n_prompt = len;
        for (int k = 0; k < 600; k++)
            j->prompt[k] =
                (int32_t)(harness_rand(&rng) % (uint64_t)(n_vocab - 3));
        j->max_tokens = 1 + (int)(harness_rand(&rng) % (uint64_t)max_gen);
        j->priority = (int)(harness_rand(&rng) % 3);
    }
}

/* Submits with the event lock held, so that rr->id is set before its
 * first event reaches the callback. */
static void submit_ok(cinfer_engine *e, const cinfer_request_params *rp,
                      req_rec *rr)
{
    pthread_mutex_lock(&ev_mu);
    CHECK_OK(cinfer_engine_submit(e, rp, &rr->id));
    pthread_mutex_unlock(&ev_mu);
}

/* Waits until rr's first sample has n tokens. */
static void wait_tokens(const req_rec *rr, int n)
{
    for (int got = 0; got < n;) {
        pthread_mutex_lock(&ev_mu);
        got = rr->s[0].n_ids;
        pthread_mutex_unlock(&ev_mu);
        sched_yield();
    }
}

static cinfer_request_params greedy_params(const job *j, req_rec *rr)
{
    cinfer_request_params rp = cinfer_request_default_params();
    rp.prompt = j->prompt;
    rp.n_prompt = (size_t)j->n_prompt;
    rp.max_tokens = j->max_tokens;
    rp.sampling.temperature = 0.0f;
    rp.ignore_eos = 1;
    rp.priority = j->priority;
    rp.on_event = on_event;
    rp.user = rr;
    return rp;
}

/* Runs jobs one at a time. */
static void run_alone(cinfer_engine *e, const job *jobs, int n, req_rec *recs)
{
    for (int i = 0; i < n; i++) {
        memset(&recs[i], 0, sizeof recs[i]);
        recs[i].e = e;
        reset_events();
        cinfer_request_params rp = greedy_params(&jobs[i], &recs[i]);
        submit_ok(e, &rp, &recs[i]);
        wait_finished(1);
    }
}

/* Submits every job to a paused engine, then lets it run them together. */
static void run_together(cinfer_engine *e, const job *jobs, int n,
                         req_rec *recs)
{
    reset_events();
    cinfer_engine_pause(e, 1);
    for (int i = 0; i < n; i++) {
        memset(&recs[i], 0, sizeof recs[i]);
        recs[i].e = e;
        cinfer_request_params rp = greedy_params(&jobs[i], &recs[i]);
        pthread_mutex_lock(&ev_mu); /* id set before any event is read */
        CHECK_OK(cinfer_engine_submit(e, &rp, &recs[i].id));
        pthread_mutex_unlock(&ev_mu);
    }
    cinfer_engine_pause(e, 0);
    wait_finished(n);
}

static int same_tokens(const sample_rec *a, const sample_rec *b)
{
    if (a->n_ids != b->n_ids)
        return 0;
    int n = a->n_ids < MAXT ? a->n_ids : MAXT;
    return memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)n) == 0 &&
           a->text_len == b->text_len &&
           memcmp(a->text, b->text, a->text_len) == 0;
}

static void compare_runs(const req_rec *alone, const req_rec *tog,
                         const job *jobs, int n)
{
    int mismatches = 0;
    for (int i = 0; i < n; i++) {
        const sample_rec *a = &alone[i].s[0], *b = &tog[i].s[0];
        CHECK(a->finished && b->finished);
        CHECK_EQ_INT(b->fin.finish, CINFER_FINISH_LENGTH);
        CHECK_EQ_INT(b->n_ids, jobs[i].max_tokens);
        CHECK_EQ_INT(b->fin.completion_tokens, b->n_ids);
        CHECK_EQ_INT(b->after_finish, 0);
        if (!same_tokens(a, b)) {
            if (mismatches++ < 3)
                fprintf(stderr, "job %d (prompt %d): tokens differ\n", i,
                        jobs[i].n_prompt);
        }
    }
    CHECK_EQ_INT(mismatches, 0);
}

/* ---------------------------------------------------------------------- */
/* tests                                                                  */
/* ---------------------------------------------------------------------- */

/* Runs one request (n_samples samples) to its end. */
static void run_one(cinfer_engine *e, cinfer_request_params *rp, req_rec *rr,
                    int n_samples)
{
    int cancel_after = rr->cancel_after;
    memset(rr, 0, sizeof *rr);
    rr->e = e;
    rr->cancel_after = cancel_after;
    rp->on_event = on_event;
    rp->user = rr;
    reset_events();
    pthread_mutex_lock(&ev_mu);
    cinfer_status st = cinfer_engine_submit(e, rp, &rr->id);
    pthread_mutex_unlock(&ev_mu);
    CHECK_OK(st);
    if (st == CINFER_OK)
        wait_finished(n_samples);
}

static void test_matches_single_decode(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    cinfer_model *ref = tiny_model(0, 16, 256);
    if (!m || !ref)
        goto out;
    int V = cinfer_model_get_info(m)->n_vocab;
    job j;
    make_jobs(&j, 1, 40, 20, V, 5);
    j.max_tokens = 20;
    /* reference: prefill then one token at a time, greedy */
    int32_t toks[64];
    float *logits = malloc(sizeof(float) * (size_t)V);
    memcpy(toks, j.prompt, sizeof(int32_t) * (size_t)j.n_prompt);
    int n = j.n_prompt;
    CHECK_OK(cinfer_model_eval_single(ref, toks, n, 0, 0, logits));
    for (int g = 0; g < j.max_tokens; g++) {
        toks[n] = cinfer_sampler_argmax(logits, V);
        CHECK_OK(cinfer_model_eval_single(ref, &toks[n], 1, n, 0, logits));
        n++;
    }
    free(logits);

    cinfer_engine *e = make_engine(m, 4, 0, 0, NULL);
    req_rec rr;
    run_alone(e, &j, 1, &rr);
    CHECK_EQ_INT(rr.s[0].n_ids, j.max_tokens);
    CHECK(memcmp(rr.s[0].ids, toks + j.n_prompt,
                 sizeof(int32_t) * (size_t)j.max_tokens) == 0);
    CHECK_EQ_INT(rr.s[0].fin.prompt_tokens, j.n_prompt);
    CHECK_EQ_INT(rr.s[0].fin.cached_tokens, 0);
    CHECK_EQ_INT(rr.s[0].fin.status, CINFER_OK);
    CHECK(rr.s[0].fin.total_ns >= rr.s[0].fin.ttft_ns);
    CHECK(rr.s[0].fin.ttft_ns >= rr.s[0].fin.queue_ns);
    /* plain greedy: the backend chose every token (only ids came back) */
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK(st.steps > 0);
    CHECK_EQ_INT(st.greedy_steps, st.steps);
    check_idle(e);
    cinfer_engine_destroy(e);

    /* A bias of +0 leaves the logits as they are but is a stage to apply,
     * so the rows come back and the host samples: the same tokens. */
    e = make_engine(m, 4, 0, 0, NULL);
    const cinfer_logit_bias zero[1] = {{1, 0.0f}};
    static req_rec rb;
    cinfer_request_params rp = greedy_params(&j, &rb);
    rp.sampling.logit_bias = zero;
    rp.sampling.n_logit_bias = 1;
    run_one(e, &rp, &rb, 1);
    CHECK_EQ_INT(rb.s[0].n_ids, j.max_tokens);
    CHECK(memcmp(rb.s[0].ids, toks + j.n_prompt,
                 sizeof(int32_t) * (size_t)j.max_tokens) == 0);
    cinfer_engine_get_stats(e, &st);
    CHECK(st.steps > 0);
    CHECK_EQ_INT(st.greedy_steps, 0);
    check_idle(e);
    cinfer_engine_destroy(e);

    /* A temperature: the CPU backend chooses greedy tokens only, so the
     * logits come back and the host draws. */
    e = make_engine(m, 4, 0, 0, NULL);
    rp = greedy_params(&j, &rb);
    rp.sampling.temperature = 0.8f;
    rp.sampling.seed = 5;
    run_one(e, &rp, &rb, 1);
    CHECK_EQ_INT(rb.s[0].n_ids, j.max_tokens);
    cinfer_engine_get_stats(e, &st);
    CHECK(st.steps > 0);
    CHECK_EQ_INT(st.greedy_steps, 0);
    CHECK_EQ_INT(st.drawn_steps, 0);
    check_idle(e);
    cinfer_engine_destroy(e);
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(ref);
}

/* 32 requests of mixed prompt lengths: alone vs together, in three
 * configurations of the same engine geometry. */
static void batch_vs_alone(int max_batched, int n_kv_blocks, int block_size,
                           int expect_preempt)
{
    enum { N = 32 };
    static job jobs[N];
    static req_rec alone[N], tog[N];
    cinfer_model *big = tiny_model(0, block_size, 256);
    cinfer_model *m = tiny_model(n_kv_blocks, block_size, 256);
    if (!big || !m)
        goto out;
    int V = cinfer_model_get_info(m)->n_vocab;
    make_jobs(jobs, N, 120, 24, V, 42 + (uint64_t)max_batched);

    cinfer_engine *e1 = make_engine(big, 4, 0, 0, NULL);
    run_alone(e1, jobs, N, alone);
    cinfer_engine_destroy(e1);

    cinfer_engine *e = make_engine(m, 32, max_batched, 0, NULL);
    run_together(e, jobs, N, tog);
    compare_runs(alone, tog, jobs, N);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    int total = 0;
    for (int i = 0; i < N; i++)
        total += jobs[i].max_tokens;
    CHECK_EQ_INT(st.generated_tokens, (uint64_t)total);
    CHECK_EQ_INT(st.requests_finished, N);
    if (max_batched >= 512)
        CHECK(st.steps < (uint64_t)total / 4); /* it really batched */
    if (expect_preempt)
        CHECK(st.preemptions > 0);
    else
        CHECK_EQ_INT(st.preemptions, 0);
    check_idle(e);
    cinfer_engine_destroy(e);
out:
    cinfer_model_destroy(big);
    cinfer_model_destroy(m);
}

/* 400 blocks of 16 hold all 32 requests at once */
static void test_batch_equals_alone(void) { batch_vs_alone(512, 400, 16, 0); }
static void test_batch_chunked_prefill(void) { batch_vs_alone(7, 400, 16, 0); }
static void test_batch_preemption(void)
{
    /* 40 blocks of 4 tokens: at most ~1 long request fits at once */
    batch_vs_alone(64, 40, 4, 1);
}

/* Sampled (not greedy) outputs survive preemption unchanged: each
 * sequence keeps its sampler state and its K/V is recomputed exactly. */
static void test_sampling_survives_preemption(void)
{
    enum { N = 12 };
    static job jobs[N];
    static req_rec r1[N], r2[N];
    cinfer_model *big = tiny_model(0, 4, 256);
    cinfer_model *small = tiny_model(24, 4, 256);
    if (!big || !small)
        goto out;
    make_jobs(jobs, N, 50, 30, cinfer_model_get_info(big)->n_vocab, 3);
    uint64_t preempt = 0;
    for (int pass = 0; pass < 2; pass++) {
        req_rec *recs = pass ? r2 : r1;
        cinfer_engine *e = make_engine(pass ? small : big, 16, 32, 0, NULL);
        reset_events();
        cinfer_engine_pause(e, 1);
        for (int i = 0; i < N; i++) {
            memset(&recs[i], 0, sizeof recs[i]);
            recs[i].e = e;
            cinfer_request_params rp = greedy_params(&jobs[i], &recs[i]);
            rp.sampling.temperature = 0.9f;
            rp.sampling.top_p = 0.95f;
            rp.sampling.repetition_penalty = 1.1f;
            rp.sampling.seed = 1000 + (uint64_t)i;
            submit_ok(e, &rp, &recs[i]);
        }
        cinfer_engine_pause(e, 0);
        wait_finished(N);
        cinfer_engine_stats st;
        cinfer_engine_get_stats(e, &st);
        if (pass)
            preempt = st.preemptions;
        check_idle(e);
        cinfer_engine_destroy(e);
    }
    CHECK(preempt > 0);
    for (int i = 0; i < N; i++)
        CHECK(same_tokens(&r1[i].s[0], &r2[i].s[0]));
out:
    cinfer_model_destroy(big);
    cinfer_model_destroy(small);
}

static void test_prefix_cache(void)
{
    cinfer_model *m = tiny_model(0, 16, 1024);
    cinfer_model *m2 = tiny_model(0, 16, 1024);
    if (!m || !m2)
        goto out;
    int V = cinfer_model_get_info(m)->n_vocab;
    static int32_t p1[600], p2[600];
    uint64_t rng = 77;
    for (int i = 0; i < 512; i++)
        p1[i] = p2[i] = (int32_t)(harness_rand(&rng) % (uint64_t)(V - 3));
    for (int i = 512; i < 540; i++) {
        p1[i] = (int32_t)(harness_rand(&rng) % (uint64_t)(V - 3));
        p2[i] = (int32_t)(harness_rand(&rng) % (uint64_t)(V - 3));
    }
    cinfer_engine *e = make_engine(m, 8, 0, 1, NULL);
    cinfer_engine *ref = make_engine(m2, 8, 0, 0, NULL);
    static req_rec a, b, c, b_ref, c_ref;
    job j = {.n_prompt = 540, .max_tokens = 12};
    memcpy(j.prompt, p1, sizeof(int32_t) * 540);
    cinfer_request_params rp = greedy_params(&j, &a);
    run_one(e, &rp, &a, 1);
    CHECK_EQ_INT(a.s[0].fin.cached_tokens, 0);

    /* shares the 512-token prefix */
    rp.prompt = p2;
    run_one(e, &rp, &b, 1);
    CHECK_EQ_INT(b.s[0].fin.cached_tokens, 512);
    run_one(ref, &rp, &b_ref, 1);
    CHECK_EQ_INT(b_ref.s[0].fin.cached_tokens, 0);
    CHECK(same_tokens(&b.s[0], &b_ref.s[0]));

    /* fully cached prompt (a multiple of the block size): the last block
     * is recomputed so the last token's logits come out */
    rp.prompt = p1;
    rp.n_prompt = 512;
    run_one(e, &rp, &c, 1);
    CHECK_EQ_INT(c.s[0].fin.cached_tokens, 496);
    run_one(ref, &rp, &c_ref, 1);
    CHECK(same_tokens(&c.s[0], &c_ref.s[0]));

    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.cached_tokens, 512 + 496);
    CHECK(st.kv_blocks_cached > 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_engine_destroy(ref);
out:
    cinfer_model_destroy(m);
    cinfer_model_destroy(m2);
}

/* n = 3 samples equal three n = 1 requests seeded seed, seed+1, seed+2,
 * and the prompt is computed once (with and without the prefix cache). */
static void test_n_samples(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    job j;
    make_jobs(&j, 1, 100, 10, V, 11);
    j.n_prompt = 100;
    j.max_tokens = 15;
    for (int prefix = 0; prefix < 2; prefix++) {
        cinfer_engine *e = make_engine(m, 8, 0, prefix, NULL);
        static req_rec multi, single[3];
        cinfer_request_params rp = greedy_params(&j, &multi);
        rp.sampling.temperature = 1.0f;
        rp.sampling.seed = 500;
        rp.n_samples = 3;
        run_one(e, &rp, &multi, 3);
        cinfer_engine_stats st;
        cinfer_engine_get_stats(e, &st);
        /* one prompt prefill (100) + two tails of 100 - 96 = 4 */
        CHECK_EQ_INT(st.prompt_tokens, 100 + 2 * 4);
        CHECK_EQ_INT(st.requests_finished, 1);
        CHECK_EQ_INT(multi.s[1].fin.cached_tokens, 96);
        int differ = 0;
        for (int k = 0; k < 3; k++) {
            rp.n_samples = 1;
            rp.sampling.seed = 500 + (uint64_t)k;
            run_one(e, &rp, &single[k], 1);
            CHECK(multi.s[k].finished);
            CHECK(same_tokens(&multi.s[k], &single[k].s[0]));
            if (k && !same_tokens(&multi.s[k], &multi.s[0]))
                differ = 1;
        }
        CHECK(differ); /* different seeds, different samples */
        check_idle(e);
        cinfer_engine_destroy(e);
    }
    cinfer_model_destroy(m);
}

/* A grammar constrains sampled output: over 12 seeds at temperature 1
 * (random weights: unconstrained output would be noise), each of 3
 * samples of a request is a whole sentence of the grammar and ends with
 * end-of-generation where the grammar allowed it; a grammar the model's
 * vocabulary cannot continue ends the sample with FINISH_ERROR, the
 * reason named. */
static void test_grammar_constrains_output(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    static const char gbnf[] =
        "root ::= \"{\\\"n\\\": \" num \", \\\"ok\\\": \" "
        "(\"true\" | \"false\") \"}\"\n"
        "num  ::= \"-\"? [1-9] [0-9]{0,3}\n";
    cinfer_grammar *g = NULL;
    CHECK_OK(cinfer_grammar_compile(gbnf, strlen(gbnf), NULL, &g));
    job j;
    make_jobs(&j, 1, 8, 10, V, 5);
    j.max_tokens = 64;
    cinfer_engine *e = make_engine(m, 8, 0, 1, NULL);
    int sentences = 0;
    for (int seed = 0; g && seed < 12; seed++) {
        static req_rec rr;
        cinfer_request_params rp = greedy_params(&j, &rr);
        rp.sampling.temperature = 1.0f;
        rp.sampling.seed = (uint64_t)seed;
        rp.n_samples = 3;
        rp.grammar = g;
        run_one(e, &rp, &rr, 3);
        for (int k = 0; k < 3; k++) {
            sample_rec *sr = &rr.s[k];
            CHECK(sr->finished);
            CHECK_EQ_INT(sr->fin.finish, CINFER_FINISH_EOS);
            cinfer_grammar_state *gs = NULL;
            CHECK_OK(cinfer_grammar_state_create(g, &gs));
            if (!gs)
                continue;
            int ok = cinfer_grammar_accept(gs, sr->text, sr->text_len) ==
                         CINFER_OK &&
                     cinfer_grammar_complete(gs);
            if (!ok)
                fprintf(stderr, "  not a sentence: %s\n", sr->text);
            CHECK(ok);
            sentences += ok;
            cinfer_grammar_state_destroy(gs);
        }
        if (seed == 0)
            fprintf(stderr, "  e.g. %s\n", rr.s[0].text);
    }
    CHECK_EQ_INT(sentences, 36);
    cinfer_grammar_destroy(g);
    /* A grammar that is done forces end-of-generation; one that is done
     * before min_tokens leaves no token to take: FINISH_ERROR, named. */
    static const char ab[] = "root ::= \"ab\"\n";
    CHECK_OK(cinfer_grammar_compile(ab, strlen(ab), NULL, &g));
    for (int min = 0; g && min <= 5; min += 5) {
        static req_rec rr;
        cinfer_request_params rp = greedy_params(&j, &rr);
        rp.grammar = g;
        rp.min_tokens = min;
        run_one(e, &rp, &rr, 1);
        CHECK_EQ_INT(strcmp(rr.s[0].text, "ab"), 0);
        if (min == 0) {
            CHECK_EQ_INT(rr.s[0].fin.finish, CINFER_FINISH_EOS);
        } else {
            CHECK_EQ_INT(rr.s[0].fin.finish, CINFER_FINISH_ERROR);
            CHECK_EQ_INT(rr.s[0].fin.status, CINFER_E_UNSUPPORTED);
        }
    }
    cinfer_grammar_destroy(g);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

static void test_stop_conditions(void)
{
    cinfer_model *m = tiny_model(0, 16, 64);
    if (!m)
        return;
    const cinfer_model_info *I = cinfer_model_get_info(m);
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(m);
    int32_t eos = cinfer_tokenizer_eos(tk);
    cinfer_engine *e = make_engine(m, 8, 0, 0, NULL);
    job j;
    make_jobs(&j, 1, 10, 10, I->n_vocab, 21);
    j.n_prompt = 10;
    j.max_tokens = 30;
    static req_rec base, r;
    cinfer_request_params rp = greedy_params(&j, &base);
    run_one(e, &rp, &base, 1);
    CHECK_EQ_INT(base.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(base.s[0].n_ids, 30);
    CHECK(base.s[0].text_len > 10);

    /* stop token: ends at its first occurrence, the id included */
    int32_t sid = base.s[0].ids[7];
    int first = 0;
    while (base.s[0].ids[first] != sid)
        first++;
    rp = greedy_params(&j, &r);
    rp.stop_ids = &sid;
    rp.n_stop_ids = 1;
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].fin.finish, CINFER_FINISH_STOP_TOKEN);
    CHECK_EQ_INT(r.s[0].n_ids, first + 1);
    CHECK(memcmp(r.s[0].ids, base.s[0].ids,
                 sizeof(int32_t) * (size_t)(first + 1)) == 0);

    /* stop string: two bytes of the text starting on a character; the
     * output is cut before their first occurrence */
    char stop[4] = {0};
    const sample_rec *bs0 = &base.s[0];
    size_t at = bs0->text_len / 2;
    while (at + 2 < bs0->text_len &&
           (((unsigned char)bs0->text[at] & 0xC0) == 0x80 || !bs0->text[at] ||
            !bs0->text[at + 1]))
        at++;
    CHECK(at + 2 < bs0->text_len);
    memcpy(stop, bs0->text + at, 2);
    const char *found = memmem(bs0->text, bs0->text_len, stop, 2);
    size_t cut = (size_t)(found - bs0->text);
    const char *stops[] = {stop};
    rp = greedy_params(&j, &r);
    rp.stop = stops;
    rp.n_stop = 1;
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].fin.finish, CINFER_FINISH_STOP_SEQUENCE);
    CHECK_EQ_INT(r.s[0].text_len, cut);
    CHECK(memcmp(r.s[0].text, bs0->text, cut) == 0);
    CHECK(r.s[0].n_ids <= 30);

    /* EOS made certain with a logit bias: stops at once, no text */
    cinfer_logit_bias bias = {eos, 1000.0f};
    rp = greedy_params(&j, &r);
    rp.ignore_eos = 0;
    rp.sampling.logit_bias = &bias;
    rp.sampling.n_logit_bias = 1;
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].fin.finish, CINFER_FINISH_EOS);
    CHECK_EQ_INT(r.s[0].n_ids, 1);
    CHECK_EQ_INT(r.s[0].ids[0], eos);
    CHECK_EQ_INT(r.s[0].text_len, 0);
    /* min_tokens masks it for 4 tokens */
    rp.min_tokens = 4;
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].fin.finish, CINFER_FINISH_EOS);
    CHECK_EQ_INT(r.s[0].n_ids, 5);
    CHECK_EQ_INT(r.s[0].ids[4], eos);
    /* ignore_eos runs to max_tokens */
    rp.min_tokens = 0;
    rp.ignore_eos = 1;
    rp.max_tokens = 6;
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(r.s[0].n_ids, 6);

    /* the context end (64): a 60-token prompt gets 4 tokens */
    static job jl;
    make_jobs(&jl, 1, 60, 10, I->n_vocab, 23);
    jl.n_prompt = 60;
    jl.max_tokens = 50;
    rp = greedy_params(&jl, &r);
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(r.s[0].n_ids, 4);
    jl.n_prompt = 64; /* a full prompt still yields one token */
    rp = greedy_params(&jl, &r);
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].n_ids, 1);

    /* logprobs: greedy picks the top entry; logprobs are <= 0 */
    rp = greedy_params(&j, &r);
    rp.logprobs = 1;
    rp.sampling.n_logprobs = 3;
    rp.max_tokens = 8;
    run_one(e, &rp, &r, 1);
    CHECK_EQ_INT(r.s[0].n_lps, 8);
    for (int i = 0; i < r.s[0].n_lps; i++) {
        CHECK(r.s[0].lps[i] <= 0.0f);
        CHECK_EQ_INT(r.s[0].top0[i], r.s[0].ids[i]);
    }
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

static void test_cancel_and_deadline(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    if (!m)
        return;
    test_clock clk = {.t = 1000000, .tick = 0};
    cinfer_engine *e = make_engine(m, 8, 0, 0, &clk);
    job j;
    make_jobs(&j, 1, 20, 10, cinfer_model_get_info(m)->n_vocab, 31);
    j.max_tokens = 200;
    static req_rec a, b, c;

    /* cancelled while waiting, and expired while waiting */
    reset_events();
    cinfer_engine_pause(e, 1);
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    cinfer_request_params rp = greedy_params(&j, &a);
    pthread_mutex_lock(&ev_mu);
    CHECK_OK(cinfer_engine_submit(e, &rp, &a.id));
    rp.user = &b;
    rp.deadline_ns = 2000000;
    CHECK_OK(cinfer_engine_submit(e, &rp, &b.id));
    pthread_mutex_unlock(&ev_mu);
    cinfer_engine_cancel(e, a.id);
    cinfer_engine_cancel(e, 999999); /* unknown: ignored */
    atomic_store(&clk.t, 3000000);
    cinfer_engine_pause(e, 0);
    wait_finished(2);
    CHECK_EQ_INT(a.s[0].fin.finish, CINFER_FINISH_CANCELLED);
    CHECK_EQ_INT(a.s[0].n_ids, 0);
    CHECK_EQ_INT(b.s[0].fin.finish, CINFER_FINISH_TIME_LIMIT);
    CHECK_EQ_INT(b.s[0].fin.completion_tokens, 0);
    CHECK_EQ_INT(b.s[0].fin.total_ns, 3000000 - 1000000);

    /* cancelled mid-stream (from its own callback after 5 tokens) */
    rp = greedy_params(&j, &c);
    memset(&c, 0, sizeof c);
    c.cancel_after = 5;
    run_one(e, &rp, &c, 1);
    CHECK_EQ_INT(c.s[0].fin.finish, CINFER_FINISH_CANCELLED);
    CHECK(c.s[0].n_ids >= 5 && c.s[0].n_ids < 200);
    CHECK_EQ_INT(c.s[0].fin.completion_tokens, c.s[0].n_ids);
    CHECK_EQ_INT(c.s[0].after_finish, 0);

    /* deadline passing mid-stream: the clock ticks with each read */
    c.cancel_after = 0;
    clk.tick = 1000;
    rp = greedy_params(&j, &c);
    rp.deadline_ns = atomic_load(&clk.t) + 50000;
    run_one(e, &rp, &c, 1);
    CHECK_EQ_INT(c.s[0].fin.finish, CINFER_FINISH_TIME_LIMIT);
    CHECK(c.s[0].n_ids > 0 && c.s[0].n_ids < 200);

    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.requests_finished, 4);
    CHECK_EQ_INT(st.requests_cancelled, 2);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

/* With the deadline hold on, a request that would finish after its
 * deadline at the current load is refused at submit (CINFER_E_TIMEOUT, no
 * event); one with time enough, or none, is taken. */
static void test_refuses_hopeless_deadline(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    if (!m)
        return;
    test_clock clk = {.t = 1000000, .tick = 1000};
    cinfer_engine *e = make_engine_hold(m, 1, 0, 0, &clk, 1);
    const int n_vocab = cinfer_model_get_info(m)->n_vocab;
    job ja, jb;
    make_jobs(&ja, 1, 20, 10, n_vocab, 31);
    make_jobs(&jb, 1, 20, 10, n_vocab, 32);
    ja.max_tokens = 200;
    jb.max_tokens = 10;
    static req_rec a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    a.e = b.e = c.e = e;
    reset_events();
    cinfer_request_params rp = greedy_params(&ja, &a);
    a.pause_after = 20;
    submit_ok(e, &rp, &a);
    /* a holds the only slot; let the step model see 20 steps */
    wait_tokens(&a, 20);
    /* b would wait for a's 180 remaining steps: refused */
    rp = greedy_params(&jb, &b);
    rp.deadline_ns = atomic_load(&clk.t) + 20000;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &b.id), CINFER_E_TIMEOUT);
    CHECK(strstr(cinfer_last_error(), "deadline") != NULL);
    /* with a bound on the wait, time enough is not enough (set before the
     * submissions that read it, which hold the engine lock) */
    e->max_queue_wait_ns = 50000;
    rp = greedy_params(&jb, &c);
    rp.deadline_ns = atomic_load(&clk.t) + (int64_t)1000000000000000;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &c.id), CINFER_E_UNAVAILABLE);
    CHECK(strstr(cinfer_last_error(), "wait") != NULL);
    /* without a deadline it waits its turn */
    static req_rec d;
    memset(&d, 0, sizeof d);
    d.e = e;
    rp = greedy_params(&jb, &d);
    submit_ok(e, &rp, &d);
    e->max_queue_wait_ns = 0;
    /* c has all the time it needs */
    rp = greedy_params(&jb, &c);
    rp.deadline_ns = atomic_load(&clk.t) + (int64_t)1000000000000000;
    submit_ok(e, &rp, &c);
    cinfer_engine_cancel(e, a.id);
    cinfer_engine_pause(e, 0);
    wait_finished(3);
    CHECK_EQ_INT(d.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(a.s[0].fin.finish, CINFER_FINISH_CANCELLED);
    CHECK_EQ_INT(c.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(c.s[0].n_ids, 10);
    CHECK_EQ_INT(b.s[0].finished, 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

/* With a first-token bound, a request with a deadline whose prompt the
 * running batch would slow past the bound is refused at submit
 * (CINFER_E_UNAVAILABLE) with a retry delay of the time it would be late;
 * one without a deadline runs, and so does one on an idle engine, where it
 * takes as long as it must. */
static void test_refuses_late_first_token(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    if (!m)
        return;
    test_clock clk = {.t = 1000000, .tick = 1000};
    /* 8 rows a step: a 16-token prompt takes 2 steps alone, 3 beside a
     * running decode */
    cinfer_engine *e = make_engine_hold(m, 4, 8, 0, &clk, 1);
    const int n_vocab = cinfer_model_get_info(m)->n_vocab;
    job ja, jb;
    make_jobs(&ja, 1, 8, 8, n_vocab, 41);
    make_jobs(&jb, 1, 16, 16, n_vocab, 42);
    jb.n_prompt = 16;
    ja.max_tokens = 200;
    jb.max_tokens = 4;
    static req_rec a, b, b2, c, d;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&b2, 0, sizeof b2);
    memset(&c, 0, sizeof c);
    memset(&d, 0, sizeof d);
    a.e = b.e = b2.e = c.e = d.e = e;
    reset_events();
    cinfer_request_params rp = greedy_params(&ja, &a);
    a.pause_after = 20;
    submit_ok(e, &rp, &a);
    CHECK_EQ_INT(cinfer_engine_refusal_retry_ns(), 0);
    wait_tokens(&a, 20);
    const int64_t far = (int64_t)1000000000000000;
    e->max_ttft_ns = 1;
    /* a slot is free, but a's decode makes b's prompt take a third step */
    rp = greedy_params(&jb, &b);
    rp.deadline_ns = atomic_load(&clk.t) + far;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &b.id), CINFER_E_UNAVAILABLE);
    CHECK(strstr(cinfer_last_error(), "first token") != NULL);
    CHECK(cinfer_engine_refusal_retry_ns() > 0);
    /* without a deadline it is not latency-bound: taken */
    rp = greedy_params(&jb, &d);
    submit_ok(e, &rp, &d);
    CHECK_EQ_INT(cinfer_engine_refusal_retry_ns(), 0);
    /* with a bound the prediction meets, taken */
    e->max_ttft_ns = far;
    rp = greedy_params(&jb, &b2);
    rp.deadline_ns = atomic_load(&clk.t) + far;
    submit_ok(e, &rp, &b2);
    cinfer_engine_cancel(e, a.id);
    cinfer_engine_pause(e, 0);
    wait_finished(3);
    CHECK_EQ_INT(a.s[0].fin.finish, CINFER_FINISH_CANCELLED);
    CHECK_EQ_INT(d.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(b2.s[0].fin.finish, CINFER_FINISH_LENGTH);
    CHECK_EQ_INT(b2.s[0].n_ids, 4);
    CHECK_EQ_INT(b.s[0].finished, 0);
    /* idle: the same prompt takes its two steps whatever the bound */
    for (cinfer_engine_stats st = {.running = 1}; st.running || st.waiting;) {
        cinfer_engine_get_stats(e, &st);
        sched_yield();
    }
    e->max_ttft_ns = 1;
    rp = greedy_params(&jb, &c);
    rp.deadline_ns = atomic_load(&clk.t) + far;
    submit_ok(e, &rp, &c);
    wait_finished(4);
    CHECK_EQ_INT(c.s[0].fin.finish, CINFER_FINISH_LENGTH);
    e->max_ttft_ns = 0;
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

/* One sequence at a time: requests run by priority, then arrival. */
static void test_priority_order(void)
{
    cinfer_model *m = tiny_model(0, 16, 256);
    if (!m)
        return;
    cinfer_engine *e = make_engine(m, 1, 0, 0, NULL);
    enum { N = 6 };
    static job jobs[N];
    static req_rec recs[N];
    make_jobs(jobs, N, 20, 4, cinfer_model_get_info(m)->n_vocab, 8);
    static const int prio[N] = {0, 2, -1, 2, 0, 5};
    static const int order[N] = {4, 2, 6, 3, 5, 1}; /* expected finish */
    reset_events();
    cinfer_engine_pause(e, 1);
    for (int i = 0; i < N; i++) {
        memset(&recs[i], 0, sizeof recs[i]);
        recs[i].e = e;
        jobs[i].priority = prio[i];
        cinfer_request_params rp = greedy_params(&jobs[i], &recs[i]);
        submit_ok(e, &rp, &recs[i]);
    }
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.waiting, N);
    cinfer_engine_pause(e, 0);
    wait_finished(N);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(recs[i].s[0].finish_order, order[i]);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

static void test_validation(void)
{
    cinfer_model *m = tiny_model(0, 16, 64);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.max_queued = 2;
    cinfer_engine *e = NULL;
    CHECK_OK(cinfer_engine_create(&ep, &e));
    if (!e) {
        cinfer_model_destroy(m);
        return;
    }
    static req_rec r, r2;
    int32_t prompt[80] = {1, 2, 3};
    uint64_t id = 0;
    cinfer_request_params rp = cinfer_request_default_params();
    rp.on_event = on_event;
    rp.user = &r;
    rp.prompt = prompt;

    rp.n_prompt = 0;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "prompt") != NULL);
    rp.n_prompt = 65;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_RANGE);
    rp.n_prompt = 3;
    prompt[1] = V;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_RANGE);
    CHECK(strstr(cinfer_last_error(), "prompt[1]") != NULL);
    prompt[1] = 2;
    rp.max_tokens = 0;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "max_tokens") != NULL);
    rp.max_tokens = 4;
    const char *stops[] = {"x", ""};
    rp.stop = stops;
    rp.n_stop = 2;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "stop[1]") != NULL);
    rp.n_stop = 1;
    int32_t bad_id = -1;
    rp.stop_ids = &bad_id;
    rp.n_stop_ids = 1;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_RANGE);
    rp.n_stop_ids = 0;
    rp.sampling.top_p = 2.0f;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "top_p") != NULL);
    rp.sampling.top_p = 1.0f;
    rp.on_event = NULL;
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_INVALID_ARG);
    rp.on_event = on_event;

    /* max_queued: the third waiting request is refused */
    reset_events();
    memset(&r, 0, sizeof r);
    cinfer_engine_pause(e, 1);
    memset(&r2, 0, sizeof r2);
    CHECK_OK(cinfer_engine_submit(e, &rp, &id));
    rp.user = &r2;
    CHECK_OK(cinfer_engine_submit(e, &rp, &id));
    CHECK_EQ_INT(cinfer_engine_submit(e, &rp, &id), CINFER_E_EXHAUSTED);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.waiting, 2);
    /* destroy cancels what is queued: each gets its FINISH */
    cinfer_engine_destroy(e);
    CHECK_EQ_INT(ev_finished, 2);
    CHECK_EQ_INT(ev_bad, 0);
    cinfer_model_destroy(m);

    ep.model = NULL;
    CHECK_EQ_INT(cinfer_engine_create(&ep, &e), CINFER_E_INVALID_ARG);
    cinfer_engine_destroy(NULL);
}

/* ---------------------------------------------------------------------- */
/* randomized invariants                                                  */
/* ---------------------------------------------------------------------- */

enum { RN = 2000 };

typedef struct {
    cinfer_engine *e;
    req_rec *recs;
    test_clock *clk;
    int n_vocab;
    int n; /* requests to submit, <= RN */
} rand_ctx;

static void *rand_submitter(void *arg)
{
    rand_ctx *c = arg;
    uint64_t rng = 2024;
    int32_t prompt[64];
    static const char *stops[] = {"e", "th", "\n"};
    for (int i = 0; i < c->n; i++) {
        req_rec *rr = &c->recs[i];
        rr->e = c->e;
        int n = 1 + (int)(harness_rand(&rng) % 48);
        for (int k = 0; k < n; k++)
            prompt[k] = (int32_t)(harness_rand(&rng) % (uint64_t)c->n_vocab);
        cinfer_request_params rp = cinfer_request_default_params();
        rp.prompt = prompt;
        rp.n_prompt = (size_t)n;
        rp.max_tokens = 1 + (int)(harness_rand(&rng) % 24);
        rp.priority = (int)(harness_rand(&rng) % 3) - 1;
        rp.n_samples = harness_rand(&rng) % 8 == 0 ? 2 : 1;
        rp.sampling.temperature = harness_rand(&rng) % 2 ? 0.0f : 0.8f;
        rp.sampling.seed = (uint64_t)i;
        rp.ignore_eos = (int)(harness_rand(&rng) % 2);
        rp.min_tokens = (int)(harness_rand(&rng) % 3);
        if (harness_rand(&rng) % 4 == 0) {
            rp.stop = stops;
            rp.n_stop = 1 + harness_rand(&rng) % 3;
        }
        if (harness_rand(&rng) % 5 == 0)
            rp.deadline_ns = atomic_load(&c->clk->t) +
                             (int64_t)(harness_rand(&rng) % 400000);
        if (harness_rand(&rng) % 10 == 0)
            rr->cancel_after = 1 + (int)(harness_rand(&rng) % 8);
        rp.on_event = on_event;
        rp.user = rr;
        rr->n_samples = rp.n_samples;
        pthread_mutex_lock(&ev_mu);
        cinfer_status st = cinfer_engine_submit(c->e, &rp, &rr->id);
        pthread_mutex_unlock(&ev_mu);
        CHECK_OK(st);
        /* cancel an earlier request now and then (maybe finished) */
        if (i > 10 && harness_rand(&rng) % 10 == 0) {
            int back = 1 + (int)(harness_rand(&rng) % 10);
            cinfer_engine_cancel(c->e, c->recs[i - back].id);
        }
        /* let the queue build up and drain in bursts */
        if (i % 100 == 99)
            sched_yield();
    }
    return NULL;
}

static void random_invariants(int n_req, int prefix)
{
    cinfer_model_params mp = cinfer_model_default_params();
    char path[300];
    snprintf(path, sizeof path, "%s.small", tiny_file());
    cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
    tp.n_layer = 1;
    tp.n_embd = 32;
    tp.n_head = 2;
    tp.n_head_kv = 1;
    tp.n_ff = 64;
    tp.n_vocab = 300;
    tp.seed = 9;
    CHECK_OK(cinfer_tinymodel_write(&tp, path));
    mp.path = path;
    mp.n_threads = 1;
    mp.n_ctx = 128;
    mp.block_size = 4;
    mp.n_kv_blocks = 48; /* small: preemption under load */
    mp.max_batch_rows = 64;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    if (!m) {
        unlink(path);
        return;
    }
    static req_rec recs[RN];
    memset(recs, 0, sizeof recs);
    test_clock clk = {.t = 1, .tick = 50};
    cinfer_engine *e = make_engine(m, 16, 64, prefix, &clk);
    reset_events();
    rand_ctx c = {e, recs, &clk, cinfer_model_get_info(m)->n_vocab, n_req};
    pthread_t th;
    pthread_create(&th, NULL, rand_submitter, &c);
    pthread_join(th, NULL);
    int samples = 0, submitted = 0;
    for (int i = 0; i < n_req; i++) {
        samples += recs[i].n_samples;
        submitted += recs[i].id != 0;
    }
    CHECK_EQ_INT(submitted, n_req);
    wait_finished(samples);
    cinfer_engine_stats st;
    int counts[CINFER_FINISH_ERROR + 1] = {0};
    int bad = 0;
    for (int i = 0; i < n_req; i++) {
        for (int k = 0; k < MAXS; k++) {
            sample_rec *s = &recs[i].s[k];
            if (k >= recs[i].n_samples) {
                bad |= s->finished || s->n_ids != 0;
                continue;
            }
            bad |= !s->finished;
            counts[s->fin.finish]++;
            bad |= s->after_finish != 0;
            bad |= s->fin.completion_tokens != s->n_ids;
            bad |= s->fin.status != CINFER_OK;
            bad |= s->fin.total_ns < 0 || s->fin.queue_ns < 0;
            if (bad) {
                fprintf(stderr, "request %d sample %d: finish %s, %d ids, "
                        "completion %d\n", i, k,
                        cinfer_finish_reason_name(s->fin.finish), s->n_ids,
                        s->fin.completion_tokens);
                break;
            }
        }
        if (bad)
            break;
    }
    CHECK(!bad);
    CHECK_EQ_INT(ev_bad, 0);
    for (int r = 0; r <= CINFER_FINISH_ERROR; r++)
        if (counts[r])
            fprintf(stderr, "  %-14s %d\n",
                    cinfer_finish_reason_name((cinfer_finish_reason)r),
                    counts[r]);
    CHECK(counts[CINFER_FINISH_LENGTH] > 0);
    CHECK(counts[CINFER_FINISH_CANCELLED] > 0);
    CHECK(counts[CINFER_FINISH_TIME_LIMIT] > 0);
    CHECK_EQ_INT(counts[CINFER_FINISH_ERROR], 0);
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "  steps %llu, preemptions %llu, cached tokens %llu\n",
            (unsigned long long)st.steps, (unsigned long long)st.preemptions,
            (unsigned long long)st.cached_tokens);
    CHECK(st.preemptions > 0);
    CHECK_EQ_INT(st.requests_finished, n_req);
    check_idle(e);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
    unlink(path);
}

static void test_random_invariants(void) { random_invariants(RN, 1); }
static void test_random_invariants_no_prefix_cache(void)
{
    random_invariants(RN / 2, 0);
}

/* ---------------------------------------------------------------------- */
/* the default model                                                      */
/* ---------------------------------------------------------------------- */

static int test_default_model(void)
{
    const char *path = getenv("CINFER_MODEL");
    if (!path || !*path)
        path = CINFER_DEFAULT_MODEL;
    if (!path[0] || access(path, R_OK) != 0)
        return 0;
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_ctx = 256;
    mp.max_seqs = 8;
    mp.max_batch_rows = 64;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    if (!m)
        return 1;
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(m);
    static const char *texts[8] = {
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
        "List three colors:",
        "The quick brown fox jumps over the lazy dog. Then the dog",
        "1, 2, 3, 4,",
        "Water boils at",
        "In a galaxy far, far away, a small robot named",
    };
    enum { N = 8 };
    static job jobs[N];
    static req_rec alone[N], tog[N];
    for (int i = 0; i < N; i++) {
        size_t n = 0;
        CHECK_OK(cinfer_tokenizer_encode(tk, texts[i], strlen(texts[i]), 1, 0,
                                         jobs[i].prompt, 600, &n));
        jobs[i].n_prompt = (int)n;
        jobs[i].max_tokens = 16;
        jobs[i].priority = 0;
    }
    /* max_batched 24: the longer prompts are prefilled in chunks */
    cinfer_engine *e = make_engine(m, 8, 24, 0, NULL);
    run_alone(e, jobs, N, alone);
    run_together(e, jobs, N, tog);
    compare_runs(alone, tog, jobs, N);
    CHECK(strstr(alone[0].s[0].text, "Paris") != NULL);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);

    /* A KV cache of 10 blocks of 16 tokens for 8 sequences of up to 3
     * blocks: requests are preempted and recomputed (their generated tokens
     * as rows marked generated), and every one still gives the tokens it
     * gave alone. */
    mp.n_kv_blocks = 10;
    m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    if (!m)
        return 1;
    static req_rec pre[N];
    e = make_engine(m, 8, 24, 0, NULL);
    run_together(e, jobs, N, pre);
    compare_runs(alone, pre, jobs, N);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "  default model, 10 KV blocks: %llu preemptions\n",
            (unsigned long long)st.preemptions);
    CHECK(st.preemptions > 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
    return 1;
}

static void test_default_model_batch(void)
{
    if (!test_default_model())
        fprintf(stderr, "  (default model absent: skipped)\n");
}

int main(void)
{
    RUN(test_matches_single_decode);
    RUN(test_batch_equals_alone);
    RUN(test_batch_chunked_prefill);
    RUN(test_batch_preemption);
    RUN(test_sampling_survives_preemption);
    RUN(test_prefix_cache);
    RUN(test_n_samples);
    RUN(test_stop_conditions);
    RUN(test_grammar_constrains_output);
    RUN(test_cancel_and_deadline);
    RUN(test_refuses_hopeless_deadline);
    RUN(test_refuses_late_first_token);
    RUN(test_priority_order);
    RUN(test_validation);
    RUN(test_random_invariants);
    RUN(test_random_invariants_no_prefix_cache);
    RUN(test_default_model_batch);
    unlink(tiny_file());
    return harness_done();
}
