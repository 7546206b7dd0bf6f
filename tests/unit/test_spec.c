/*
 * test_spec.c - prompt-lookup speculative decoding in the engine
 * (engine.h spec_ngram_k; scheduler.c drafts; engine.c verification).
 *
 * The property: speculation changes nothing but speed. On tiny random
 * models, every request gives exactly the same tokens, text, logprobs and
 * finish (reason and token count) with drafts as without, greedy and
 * seeded over many seeds and temperatures, with penalties, stop strings,
 * stop ids, min_tokens, max_tokens, grammars, the prefix cache and
 * preemption; and drafts are really taken (the engine's spec_* stats),
 * the n-gram lookup finds what it should, the scheduler drafts nothing
 * while more than spec_max_seqs sequences run, and every KV block is free
 * at the end.
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

#define MAXT 128 /* tokens per request recorded */

/* ---------------------------------------------------------------------- */
/* model and events                                                       */
/* ---------------------------------------------------------------------- */

static char tiny_path[256];

static const char *tiny_file(void)
{
    if (!tiny_path[0]) {
        snprintf(tiny_path, sizeof tiny_path, "/tmp/cinfer_test_spec_%d.gguf",
                 (int)getpid());
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.n_ctx = 1024;
        p.seed = 11;
        CHECK_OK(cinfer_tinymodel_write(&p, tiny_path));
    }
    return tiny_path;
}

static cinfer_model *tiny_model(int n_kv_blocks, int block_size)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = tiny_file();
    mp.n_threads = 1;
    mp.n_ctx = 512;
    mp.block_size = block_size;
    mp.n_kv_blocks = n_kv_blocks;
    mp.max_batch_rows = 256;
    mp.max_seqs = 8;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    return m;
}

typedef struct {
    int32_t ids[MAXT];
    int n_ids;
    float lps[MAXT];
    int32_t top0[MAXT];
    int n_lps;
    char text[4096];
    size_t text_len;
    int finished;
    int after_finish;
    cinfer_finish_reason why;
    int32_t completion;
    uint64_t id;
} rec;

static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static int ev_finished;

/* user: the request's recs, one per sample */
static void on_event(void *user, const cinfer_engine_event *ev)
{
    rec *r = (rec *)user + ev->sample_index;
    pthread_mutex_lock(&ev_mu);
    if (r->finished) {
        r->after_finish++;
    } else if (ev->kind == CINFER_EVENT_TOKENS) {
        for (size_t i = 0; i < ev->n_ids; i++) {
            if (r->n_ids < MAXT)
                r->ids[r->n_ids] = ev->ids[i];
            r->n_ids++;
            if (ev->logprobs && r->n_lps < MAXT) {
                r->lps[r->n_lps] = ev->logprobs[i];
                r->top0[r->n_lps] =
                    ev->n_top ? ev->top[i * (size_t)ev->n_top].id : -1;
                r->n_lps++;
            }
        }
        if (r->text_len + ev->text_len < sizeof r->text) {
            memcpy(r->text + r->text_len, ev->text, ev->text_len);
            r->text_len += ev->text_len;
            r->text[r->text_len] = 0;
        }
    } else {
        r->finished = 1;
        r->why = ev->finish;
        r->completion = ev->completion_tokens;
        ev_finished++;
        pthread_cond_broadcast(&ev_cv);
    }
    pthread_mutex_unlock(&ev_mu);
}

static int wait_finished(int n)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 300;
    int ok = 1;
    pthread_mutex_lock(&ev_mu);
    while (ev_finished < n && ok)
        ok = pthread_cond_timedwait(&ev_cv, &ev_mu, &dl) != ETIMEDOUT;
    pthread_mutex_unlock(&ev_mu);
    CHECK(ok);
    return ok;
}

static cinfer_engine *make_engine(cinfer_model *m, int k, int max_seqs,
                                  int max_batched, int prefix)
{
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.admit_past_deadlines = 1;
    ep.max_seqs = max_seqs;
    ep.max_batched_tokens = max_batched;
    ep.prefix_cache = prefix;
    ep.spec_ngram_k = k;
    cinfer_engine *e = NULL;
    CHECK_OK(cinfer_engine_create(&ep, &e));
    return e;
}

/* Runs n requests: one at a time, or (together) released into one batch
 * from a paused engine. rps[i].on_event/user are set here. */
static void run_reqs(cinfer_engine *e, cinfer_request_params *rps, rec *recs,
                     int n, int together)
{
    pthread_mutex_lock(&ev_mu);
    ev_finished = 0;
    pthread_mutex_unlock(&ev_mu);
    if (together)
        cinfer_engine_pause(e, 1);
    for (int i = 0; i < n; i++) {
        memset(&recs[i], 0, sizeof recs[i]);
        rps[i].on_event = on_event;
        rps[i].user = &recs[i];
        pthread_mutex_lock(&ev_mu);
        CHECK_OK(cinfer_engine_submit(e, &rps[i], &recs[i].id));
        pthread_mutex_unlock(&ev_mu);
        if (!together)
            wait_finished(i + 1);
    }
    if (together) {
        cinfer_engine_pause(e, 0);
        wait_finished(n);
    }
}

static void check_idle(cinfer_engine *e)
{
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.waiting, 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK(cinfer_engine_check_kv(e));
}

/* Same tokens, text, logprobs (bit for bit) and finish. */
static int same_rec(const rec *a, const rec *b)
{
    int n = a->n_ids < MAXT ? a->n_ids : MAXT;
    return a->finished && b->finished && !a->after_finish &&
           !b->after_finish && a->n_ids == b->n_ids &&
           memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)n) == 0 &&
           a->text_len == b->text_len &&
           memcmp(a->text, b->text, a->text_len) == 0 && a->why == b->why &&
           a->completion == b->completion && a->n_lps == b->n_lps &&
           memcmp(a->lps, b->lps, sizeof(float) * (size_t)a->n_lps) == 0 &&
           memcmp(a->top0, b->top0, sizeof(int32_t) * (size_t)a->n_lps) == 0;
}

static int compare(const rec *a, const rec *b, int n, const char *what)
{
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (!same_rec(&a[i], &b[i]) && bad++ < 3)
            fprintf(stderr, "  %s: request %d differs (%d vs %d tokens)\n",
                    what, i, a[i].n_ids, b[i].n_ids);
    }
    CHECK_EQ_INT(bad, 0);
    return bad == 0;
}

/* ---------------------------------------------------------------------- */
/* prompts                                                                */
/* ---------------------------------------------------------------------- */

enum { NP = 24, PLEN = 64 };

typedef struct {
    int32_t t[PLEN * 2]; /* the default model's prompts may be longer */
    int n;
} prompt;

/* Kind 0: random tokens (drafts rarely match); 1: a short pattern
 * repeated; 2: a random passage given twice (copying); 3: a repeated
 * pattern with a few tokens changed. */
static void make_prompts(prompt *ps, int n, int V, uint64_t seed)
{
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) {
        prompt *p = &ps[i];
        int kind = i % 4;
        p->n = 24 + (int)(harness_rand(&rng) % (PLEN - 24));
        int period = 2 + (int)(harness_rand(&rng) % 9);
        if (kind == 2)
            period = p->n / 2;
        for (int j = 0; j < p->n; j++) {
            if (kind == 0 || j < period)
                p->t[j] = (int32_t)(harness_rand(&rng) % (uint64_t)(V - 3));
            else
                p->t[j] = p->t[j - period];
        }
        if (kind == 3)
            for (int c = 0; c < 3; c++)
                p->t[harness_rand(&rng) % (uint64_t)p->n] =
                    (int32_t)(harness_rand(&rng) % (uint64_t)(V - 3));
    }
}

static cinfer_request_params base_params(const prompt *p, int max_tokens)
{
    cinfer_request_params rp = cinfer_request_default_params();
    rp.prompt = p->t;
    rp.n_prompt = (size_t)p->n;
    rp.max_tokens = max_tokens;
    rp.sampling.temperature = 0.0f;
    rp.ignore_eos = 1;
    return rp;
}

/* ---------------------------------------------------------------------- */
/* tests                                                                  */
/* ---------------------------------------------------------------------- */

static void test_ngram_lookup(void)
{
    int32_t out[8];
    /* the longest n-gram wins, at its most recent earlier occurrence */
    const int32_t a[] = {1, 2, 3, 9, 8, 2, 3, 7, 6, 5, 1, 2, 3};
    CHECK_EQ_INT(sched_ngram_draft(a, 13, 2, 3, 3, out), 3);
    CHECK_EQ_INT(out[0], 9); /* "1 2 3" at 0, not "2 3" at 5 */
    CHECK_EQ_INT(out[1], 8);
    CHECK_EQ_INT(out[2], 2);
    CHECK_EQ_INT(sched_ngram_draft(a, 13, 2, 2, 2, out), 2);
    CHECK_EQ_INT(out[0], 7); /* "2 3" most recently at 5 */
    CHECK_EQ_INT(out[1], 6);
    /* a loop: the continuation runs into the suffix and repeats */
    const int32_t b[] = {4, 5, 6, 4, 5, 6, 4, 5};
    CHECK_EQ_INT(sched_ngram_draft(b, 8, 2, 4, 7, out), 7);
    const int32_t want[] = {6, 4, 5, 6, 4, 5, 6};
    CHECK(memcmp(out, want, sizeof want) == 0);
    /* a single token repeated */
    const int32_t c[] = {3, 7, 7, 7};
    CHECK_EQ_INT(sched_ngram_draft(c, 4, 2, 3, 5, out), 5);
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(out[i], 7);
    /* no match, too short, k 0, nmin above what matches */
    const int32_t d[] = {1, 2, 3, 4, 5, 6};
    CHECK_EQ_INT(sched_ngram_draft(d, 6, 1, 3, 4, out), 0);
    CHECK_EQ_INT(sched_ngram_draft(d, 1, 1, 3, 4, out), 0);
    CHECK_EQ_INT(sched_ngram_draft(c, 4, 2, 3, 0, out), 0);
    const int32_t f[] = {1, 2, 9, 5, 2};
    CHECK_EQ_INT(sched_ngram_draft(f, 5, 2, 3, 2, out), 0);
    CHECK_EQ_INT(sched_ngram_draft(f, 5, 1, 3, 2, out), 2);
    CHECK_EQ_INT(out[0], 9);
    /* in place, after the tokens (as the scheduler calls it) */
    int32_t g[16] = {8, 9, 8, 9, 8};
    CHECK_EQ_INT(sched_ngram_draft(g, 5, 2, 2, 4, g + 5), 4);
    CHECK_EQ_INT(g[5], 9);
    CHECK_EQ_INT(g[6], 8);
    CHECK_EQ_INT(g[8], 8);
}

static void test_params_refused(void)
{
    cinfer_model *m = tiny_model(0, 16);
    if (!m)
        return;
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    cinfer_engine *e = NULL;
    ep.spec_ngram_k = CINFER_ENGINE_SPEC_MAX_K + 1;
    CHECK_EQ_INT(cinfer_engine_create(&ep, &e), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "spec_ngram_k") != NULL);
    ep.spec_ngram_k = -1;
    CHECK_EQ_INT(cinfer_engine_create(&ep, &e), CINFER_E_INVALID_ARG);
    ep.spec_ngram_k = 4;
    ep.spec_ngram_min = 3;
    ep.spec_ngram_max = 2;
    CHECK_EQ_INT(cinfer_engine_create(&ep, &e), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "spec_ngram_max") != NULL);
    ep.spec_ngram_max = 0;
    ep.spec_max_seqs = -1;
    CHECK_EQ_INT(cinfer_engine_create(&ep, &e), CINFER_E_INVALID_ARG);
    CHECK(e == NULL);
    cinfer_model_destroy(m);
}

/* Greedy: NP prompts of four kinds, alone and four at a time, k = 0
 * (reference), 3 and 8. */
static void test_greedy_identical(void)
{
    static prompt ps[NP];
    static rec ref[NP], got[NP];
    static cinfer_request_params rps[NP];
    cinfer_model *m = tiny_model(0, 16);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    make_prompts(ps, NP, V, 5);
    for (int i = 0; i < NP; i++)
        rps[i] = base_params(&ps[i], 40 + i % 7);
    cinfer_engine *e0 = make_engine(m, 0, 8, 0, 0);
    run_reqs(e0, rps, ref, NP, 0);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e0, &st);
    CHECK_EQ_INT(st.spec_drafted, 0);
    cinfer_engine_destroy(e0);

    const int ks[2] = {3, 8};
    for (int ki = 0; ki < 2; ki++) {
        for (int together = 0; together < 2; together++) {
            cinfer_engine *e = make_engine(m, ks[ki], 8, 0, 0);
            if (!together) {
                run_reqs(e, rps, got, NP, 0);
            } else {
                for (int i = 0; i < NP; i += 4)
                    run_reqs(e, rps + i, got + i, 4, 1);
            }
            compare(ref, got, NP, together ? "greedy, 4 together" : "greedy");
            cinfer_engine_get_stats(e, &st);
            fprintf(stderr,
                    "  k %d%s: %llu drafted, %llu accepted in %llu "
                    "sequence-steps, %llu steps for %llu tokens\n",
                    ks[ki], together ? " (4 together)" : "",
                    (unsigned long long)st.spec_drafted,
                    (unsigned long long)st.spec_accepted,
                    (unsigned long long)st.spec_steps,
                    (unsigned long long)st.steps,
                    (unsigned long long)st.generated_tokens);
            CHECK(st.spec_accepted > 0);
            CHECK(st.spec_accepted <= st.spec_drafted);
            /* fewer steps than tokens: drafts saved steps */
            CHECK(st.steps + st.spec_accepted <=
                  st.generated_tokens + (uint64_t)NP + 1);
            check_idle(e);
            cinfer_engine_destroy(e);
        }
    }
    cinfer_model_destroy(m);
}

/* Seeded sampling over seeds, temperatures and filters, with penalties
 * (which count every token before a position) and logprobs. */
static void test_seeded_identical(void)
{
    enum { N = 48 };
    static prompt ps[N];
    static rec ref[N], got[N];
    static cinfer_request_params rps[N];
    cinfer_model *m = tiny_model(0, 16);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    make_prompts(ps, N, V, 17);
    const float temps[4] = {0.3f, 0.7f, 1.0f, 1.4f};
    for (int i = 0; i < N; i++) {
        rps[i] = base_params(&ps[i], 36);
        cinfer_sampler_params *sp = &rps[i].sampling;
        sp->temperature = temps[i % 4];
        sp->seed = 1000 + (uint64_t)i * 7919;
        if (i % 3 == 1) {
            sp->top_p = 0.9f;
            sp->top_k = 40;
        }
        if (i % 3 == 2) {
            sp->min_p = 0.05f;
            sp->repetition_penalty = 1.1f;
            sp->frequency_penalty = 0.2f;
            sp->presence_penalty = 0.1f;
        }
        if (i % 5 == 0) {
            rps[i].logprobs = 1;
            sp->n_logprobs = 3;
        }
    }
    cinfer_engine *e0 = make_engine(m, 0, 8, 0, 0);
    run_reqs(e0, rps, ref, N, 0);
    cinfer_engine_destroy(e0);
    cinfer_engine *e = make_engine(m, 6, 8, 0, 0);
    run_reqs(e, rps, got, N, 0);
    compare(ref, got, N, "seeded");
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "  seeded: %llu drafted, %llu accepted\n",
            (unsigned long long)st.spec_drafted,
            (unsigned long long)st.spec_accepted);
    CHECK(st.spec_accepted > 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    /* n = 2 samples per request (seeds seed and seed + 1) share the
     * prompt's blocks; each drafts into its own */
    e0 = make_engine(m, 0, 8, 0, 0);
    e = make_engine(m, 6, 8, 0, 0);
    static rec two[2][16];
    for (int pass = 0; pass < 2; pass++) {
        cinfer_engine *en = pass ? e : e0;
        pthread_mutex_lock(&ev_mu);
        ev_finished = 0;
        pthread_mutex_unlock(&ev_mu);
        for (int i = 0; i < 8; i++) {
            cinfer_request_params rp = rps[i];
            rp.n_samples = 2;
            rp.on_event = on_event;
            rp.user = &two[pass][2 * i];
            memset(&two[pass][2 * i], 0, 2 * sizeof(rec));
            pthread_mutex_lock(&ev_mu);
            CHECK_OK(cinfer_engine_submit(en, &rp, &two[pass][2 * i].id));
            pthread_mutex_unlock(&ev_mu);
            wait_finished(2 * (i + 1));
        }
    }
    compare(two[0], two[1], 16, "n = 2");
    for (int i = 0; i < 8; i++)
        CHECK(same_rec(&two[0][2 * i], &ref[i])); /* sample 0 is n = 1's */
    check_idle(e);
    cinfer_engine_destroy(e0);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

/* Stop strings (taken from the reference text, so they match), stop
 * ids, min_tokens and max_tokens end every request at the same token. */
static void test_stop_conditions_exact(void)
{
    static prompt ps[NP];
    static rec plain[NP], ref[NP], got[NP];
    static cinfer_request_params rps[NP];
    static char stops[NP][16];
    static const char *stop_list[NP][1];
    static int32_t stop_ids[NP][1];
    cinfer_model *m = tiny_model(0, 16);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    make_prompts(ps, NP, V, 23);
    for (int i = 0; i < NP; i++)
        rps[i] = base_params(&ps[i], 48);
    cinfer_engine *e0 = make_engine(m, 0, 8, 0, 0);
    run_reqs(e0, rps, plain, NP, 0);
    int n_stop = 0;
    uint64_t rng = 3;
    for (int i = 0; i < NP; i++) {
        const rec *r = &plain[i];
        int kind = i % 3;
        if (kind == 0 && r->text_len > 12) {
            /* a stop string from the middle of the text */
            size_t at = 4 + harness_rand(&rng) % (r->text_len - 10);
            size_t len = 1 + harness_rand(&rng) % 4;
            memcpy(stops[i], r->text + at, len);
            stops[i][len] = 0;
            stop_list[i][0] = stops[i];
            rps[i].stop = stop_list[i];
            rps[i].n_stop = 1;
            n_stop++;
        } else if (kind == 1 && r->n_ids > 10) {
            /* a stop id that occurs, with min_tokens past its first
             * occurrence at times */
            stop_ids[i][0] = r->ids[5 + harness_rand(&rng) % 5];
            rps[i].stop_ids = stop_ids[i];
            rps[i].n_stop_ids = 1;
            rps[i].min_tokens = (int32_t)(harness_rand(&rng) % 8);
        } else {
            rps[i].max_tokens = 1 + (int32_t)(harness_rand(&rng) % 12);
        }
    }
    CHECK(n_stop >= NP / 4);
    run_reqs(e0, rps, ref, NP, 0);
    cinfer_engine_destroy(e0);
    int stopped = 0;
    for (int i = 0; i < NP; i++)
        stopped += ref[i].why == CINFER_FINISH_STOP_SEQUENCE ||
                   ref[i].why == CINFER_FINISH_STOP_TOKEN;
    CHECK(stopped >= NP / 3);
    for (int k = 1; k <= 8; k *= 2) {
        cinfer_engine *e = make_engine(m, k, 8, 0, 0);
        run_reqs(e, rps, got, NP, 0);
        compare(ref, got, NP, "stops");
        for (int i = 0; i < NP; i++)
            CHECK(got[i].n_ids <= rps[i].max_tokens);
        check_idle(e);
        cinfer_engine_destroy(e);
    }
    cinfer_model_destroy(m);
}

/* A grammar: a draft the mask forbids is rejected, and the grammar state
 * advances over taken tokens only. */
static void test_grammar_identical(void)
{
    enum { N = 12 };
    static prompt ps[N];
    static rec ref[N], got[N];
    static cinfer_request_params rps[N];
    cinfer_model *m = tiny_model(0, 16);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    static const char gbnf[] =
        "root ::= (\"ab\" | \"abc\" | \"b\" | \"c \" | [a-e]{1,3} \",\")+\n";
    cinfer_grammar *g = NULL;
    CHECK_OK(cinfer_grammar_compile(gbnf, strlen(gbnf), NULL, &g));
    if (!g) {
        cinfer_model_destroy(m);
        return;
    }
    make_prompts(ps, N, V, 29);
    for (int i = 0; i < N; i++) {
        rps[i] = base_params(&ps[i], 40);
        rps[i].grammar = g;
        if (i % 2) {
            rps[i].sampling.temperature = 0.9f;
            rps[i].sampling.seed = 40 + (uint64_t)i;
        }
    }
    cinfer_engine *e0 = make_engine(m, 0, 8, 0, 0);
    run_reqs(e0, rps, ref, N, 0);
    cinfer_engine_destroy(e0);
    cinfer_engine *e = make_engine(m, 5, 8, 0, 0);
    run_reqs(e, rps, got, N, 0);
    compare(ref, got, N, "grammar");
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "  grammar: %llu drafted, %llu accepted\n",
            (unsigned long long)st.spec_drafted,
            (unsigned long long)st.spec_accepted);
    CHECK(st.spec_drafted > 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_grammar_destroy(g);
    cinfer_model_destroy(m);
}

/* The prefix cache sees only verified blocks: requests that share the
 * prefixes earlier ones generated (with drafts) give the same output as
 * on an engine without the cache; and a KV cache too small for the batch
 * (preemption, drafts limited to free blocks) changes nothing either. */
static void test_cache_and_preemption(void)
{
    static prompt ps[NP];
    static rec ref[NP], got[NP], again[NP];
    static cinfer_request_params rps[NP];
    cinfer_model *big = tiny_model(0, 4);
    cinfer_model *small = tiny_model(40, 4);
    if (!big || !small)
        goto out;
    int V = cinfer_model_get_info(big)->n_vocab;
    make_prompts(ps, NP, V, 31);
    for (int i = 0; i < NP; i++)
        rps[i] = base_params(&ps[i], 44);
    cinfer_engine *e0 = make_engine(big, 0, 8, 0, 0);
    run_reqs(e0, rps, ref, NP, 0);
    cinfer_engine_destroy(e0);

    /* prefix cache on, block size 4: drafts cross block boundaries */
    cinfer_engine *e = make_engine(big, 6, 8, 0, 1);
    run_reqs(e, rps, got, NP, 0);
    compare(ref, got, NP, "prefix cache, first run");
    /* the same prompts again: their prompt blocks come from the cache */
    run_reqs(e, rps, again, NP, 0);
    compare(ref, again, NP, "prefix cache, second run");
    /* prompts extended by their own output: the generated blocks that
     * were registered must hold the verified tokens' K/V */
    static prompt ext[NP];
    static cinfer_request_params rx[NP];
    static rec ext_ref[NP], ext_got[NP];
    for (int i = 0; i < NP; i++) {
        ext[i] = ps[i];
        int add = got[i].n_ids < PLEN - ps[i].n ? got[i].n_ids
                                                  : PLEN - ps[i].n;
        memcpy(ext[i].t + ps[i].n, got[i].ids, sizeof(int32_t) * (size_t)add);
        ext[i].n = ps[i].n + add;
        rx[i] = base_params(&ext[i], 12);
    }
    run_reqs(e, rx, ext_got, NP, 0);
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK(st.cached_tokens > 0);
    CHECK(st.spec_accepted > 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    e0 = make_engine(big, 0, 8, 0, 0);
    run_reqs(e0, rx, ext_ref, NP, 0);
    compare(ext_ref, ext_got, NP, "extended prompts from the cache");
    cinfer_engine_destroy(e0);

    /* 40 blocks of 4 tokens for 8 sequences of up to ~27 blocks */
    e = make_engine(small, 6, 8, 0, 1);
    run_reqs(e, rps, got, 8, 1);
    compare(ref, got, 8, "preemption");
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "  small cache: %llu preemptions, %llu accepted\n",
            (unsigned long long)st.preemptions,
            (unsigned long long)st.spec_accepted);
    CHECK(st.preemptions > 0);
    check_idle(e);
    cinfer_engine_destroy(e);
out:
    cinfer_model_destroy(big);
    cinfer_model_destroy(small);
}

/* Under load no drafts: 8 sequences that run together to the end, with
 * spec_max_seqs 4, never carry one; a budget the decode fills leaves none
 * either. */
static void test_off_under_load(void)
{
    enum { N = 8 };
    static prompt ps[N];
    static rec ref[N], got[N];
    static cinfer_request_params rps[N];
    cinfer_model *m = tiny_model(0, 16);
    if (!m)
        return;
    int V = cinfer_model_get_info(m)->n_vocab;
    make_prompts(ps, N, V, 37);
    for (int i = 0; i < N; i++)
        rps[i] = base_params(&ps[i], 30);
    cinfer_engine *e0 = make_engine(m, 0, 8, 0, 0);
    run_reqs(e0, rps, ref, N, 0);
    cinfer_engine_destroy(e0);
    cinfer_engine *e = make_engine(m, 8, 8, 0, 0);
    run_reqs(e, rps, got, N, 1);
    compare(ref, got, N, "8 together");
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_drafted, 0);
    cinfer_engine_destroy(e);
    /* a budget of 1 row: the decode fills it */
    e = make_engine(m, 8, 1, 1, 0);
    run_reqs(e, rps, got, 2, 1);
    compare(ref, got, 2, "budget full");
    cinfer_engine_get_stats(e, &st);
    CHECK_EQ_INT(st.spec_drafted, 0);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

/* The default model (skipped when absent), where drafts are real text:
 * a passage to repeat and a count (greedy), code to copy with a change
 * and an open question (seeded); k 0 against k 8. */
static void test_default_model(void)
{
    const char *path = getenv("CINFER_MODEL");
    if (!path || !*path)
        path = CINFER_DEFAULT_MODEL;
    if (!path[0] || access(path, R_OK) != 0) {
        fprintf(stderr, "  (default model absent: skipped)\n");
        return;
    }
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_ctx = 512;
    mp.max_seqs = 4;
    mp.max_batch_rows = 128;
    cinfer_model *m = NULL;
    CHECK_OK(cinfer_model_create(&mp, &m));
    if (!m)
        return;
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(m);
    static const char *texts[4] = {
        "<|im_start|>user\nRepeat this text exactly: The committee met on "
        "Tuesday to review the budget. The members agreed to repair the "
        "roof of the town hall before the winter.<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|im_start|>user\nRename total to sum in this code and return "
        "it:\ndef f(xs):\n    total = 0\n    for x in xs:\n        total "
        "+= x\n    return total\n<|im_end|>\n<|im_start|>assistant\n",
        "1, 2, 3, 4, 5, 6, 7,",
        "Why is the sky blue?",
    };
    /* small: the sanitizer build runs it too */
    enum { N = 4 };
    static prompt ps[N];
    static rec ref[N], got[N];
    static cinfer_request_params rps[N];
    for (int i = 0; i < N; i++) {
        size_t n = 0;
        const char *t = texts[i];
        CHECK_OK(cinfer_tokenizer_encode(tk, t, strlen(t), 1, 1, ps[i].t,
                                         PLEN * 2, &n));
        ps[i].n = (int)n;
        rps[i] = base_params(&ps[i], 28);
        rps[i].ignore_eos = 0;
        if (i % 2) {
            rps[i].sampling.temperature = 0.8f;
            rps[i].sampling.top_p = 0.95f;
            rps[i].sampling.seed = 77 + (uint64_t)i;
        }
    }
    cinfer_engine *e0 = make_engine(m, 0, 4, 0, 0);
    run_reqs(e0, rps, ref, N, 0);
    cinfer_engine_destroy(e0);
    cinfer_engine *e = make_engine(m, 8, 4, 0, 0);
    run_reqs(e, rps, got, N, 0);
    compare(ref, got, N, "default model");
    cinfer_engine_stats st;
    cinfer_engine_get_stats(e, &st);
    fprintf(stderr, "  default model: %llu of %llu drafts taken, %llu steps "
            "for %llu tokens\n",
            (unsigned long long)st.spec_accepted,
            (unsigned long long)st.spec_drafted,
            (unsigned long long)st.steps,
            (unsigned long long)st.generated_tokens);
    CHECK(st.spec_accepted > 10);
    fprintf(stderr, "  e.g. %s\n", got[0].text);
    check_idle(e);
    cinfer_engine_destroy(e);
    cinfer_model_destroy(m);
}

int main(void)
{
    RUN(test_ngram_lookup);
    RUN(test_params_refused);
    RUN(test_greedy_identical);
    RUN(test_seeded_identical);
    RUN(test_stop_conditions_exact);
    RUN(test_grammar_identical);
    RUN(test_cache_and_preemption);
    RUN(test_off_under_load);
    RUN(test_default_model);
    unlink(tiny_file());
    return harness_done();
}
