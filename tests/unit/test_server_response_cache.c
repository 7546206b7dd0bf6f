/*
 * test_server_response_cache.c - the exact response cache
 * (server/response_cache.c): which requests are cacheable, a key that
 * every output-affecting field changes (one check per field) and no
 * other field does, the byte-bounded LRU under eviction, what is never
 * stored, the collision compare, and a replay equal to the recorded
 * stream. The engine's events are driven by hand; no engine, no server.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/response_cache.h"

/* ---- a sink that copies the events it is given ------------------------ */

typedef struct {
    cinfer_event_kind kind;
    int sample;
    int32_t ids[8];
    size_t n_ids;
    char text[32];
    size_t text_len;
    int has_lp;
    float lp[8];
    int n_top;
    cinfer_token_logprob top[16];
    cinfer_finish_reason finish;
    int32_t prompt_tokens, completion_tokens, cached_tokens;
    uint64_t request_id;
} seen_ev;

typedef struct {
    seen_ev ev[64];
    int n;
} sink;

static void on_event(void *user, const cinfer_engine_event *ev)
{
    sink *s = user;
    if (s->n >= 64)
        return;
    seen_ev *x = &s->ev[s->n++];
    memset(x, 0, sizeof *x);
    x->kind = ev->kind;
    x->sample = ev->sample_index;
    x->request_id = ev->request_id;
    x->n_ids = ev->n_ids < 8 ? ev->n_ids : 8;
    if (x->n_ids)
        memcpy(x->ids, ev->ids, x->n_ids * sizeof *x->ids);
    x->text_len = ev->text_len < 31 ? ev->text_len : 31;
    if (x->text_len)
        memcpy(x->text, ev->text, x->text_len);
    x->has_lp = ev->logprobs != NULL;
    if (ev->logprobs && x->n_ids)
        memcpy(x->lp, ev->logprobs, x->n_ids * sizeof *x->lp);
    x->n_top = ev->top ? ev->n_top : 0;
    if (ev->top && x->n_ids && x->n_ids * (size_t)ev->n_top <= 16)
        memcpy(x->top, ev->top,
               x->n_ids * (size_t)ev->n_top * sizeof *x->top);
    x->finish = ev->finish;
    x->prompt_tokens = ev->prompt_tokens;
    x->completion_tokens = ev->completion_tokens;
    x->cached_tokens = ev->cached_tokens;
}

static int64_t fake_now(void)
{
    static int64_t t = 1000;
    return t += 7;
}

/* ---- requests ---------------------------------------------------------- */

static const int32_t PROMPT[] = {1, 15, 27, 99};

static cinfer_gen_desc seeded_desc(void)
{
    cinfer_gen_desc d = cinfer_gen_desc_init();
    d.input = CINFER_INPUT_IDS;
    d.ids = PROMPT;
    d.n_ids = 4;
    d.has_seed = 1;
    d.seed = 42;
    return d;
}

/* A sampled request with a seed and every sampler field away from its
 * default, so that a field set back to the default is a change too. */
static cinfer_request_params seeded_params(void)
{
    cinfer_request_params rp = cinfer_request_default_params();
    rp.prompt = PROMPT;
    rp.n_prompt = 4;
    rp.max_tokens = 16;
    rp.n_samples = 1;
    rp.sampling = cinfer_sampler_default_params();
    rp.sampling.n_vocab = 1000;
    rp.sampling.temperature = 0.7f;
    rp.sampling.top_k = 40;
    rp.sampling.top_p = 0.9f;
    rp.sampling.min_p = 0.05f;
    rp.sampling.seed = 42;
    return rp;
}

static cinfer_rcache_key *key_of(const cinfer_gen_desc *d,
                                 const cinfer_request_params *rp)
{
    cinfer_rcache_key *k = NULL;
    CHECK_OK(cinfer_rcache_key_make(d, rp, &k));
    return k;
}

static int same_key(const cinfer_rcache_key *a, const cinfer_rcache_key *b)
{
    size_t na, nb;
    const uint8_t *pa = cinfer_rcache_key_bytes(a, &na);
    const uint8_t *pb = cinfer_rcache_key_bytes(b, &nb);
    int bytes = na == nb && memcmp(pa, pb, na) == 0;
    int digest = memcmp(cinfer_rcache_key_digest(a),
                        cinfer_rcache_key_digest(b), 32) == 0;
    /* Equal bytes and equal digests go together. */
    CHECK_EQ_INT(bytes, digest);
    return bytes;
}

/* ---- the cases --------------------------------------------------------- */

static void test_cacheable(void)
{
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params rp = seeded_params();
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 1); /* seeded */
    d.has_seed = 0; /* the server's random seed: never cached */
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 0);
    rp.sampling.temperature = 0; /* greedy, no seed needed */
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 1);
    rp.sampling.temperature = CINFER_SAMPLER_GREEDY_EPS * 0.5f;
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 1);
    rp.sampling.temperature = CINFER_SAMPLER_GREEDY_EPS;
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 0);
    /* A grammar the desc does not name by its text. */
    rp.sampling.temperature = 0;
    rp.grammar = (const cinfer_grammar *)(uintptr_t)0x1000;
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 0);
    d.regex = "[a-z]+";
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 1);
    /* Prompt embeddings: never cached. */
    static const float rows[4] = {0.5f, -1, 2, 0};
    rp.prompt_embeds = rows;
    rp.n_prompt_embeds = 1;
    CHECK_EQ_INT(cinfer_rcache_cacheable(&d, &rp), 0);
}

/* One change of one field; expect whether the key changes. */
typedef void (*mutate_fn)(cinfer_gen_desc *d, cinfer_request_params *rp);

static const int32_t PROMPT2[] = {1, 15, 27, 98};
static const int32_t PROMPT3[] = {1, 15, 27};
static const char *const STOP1[] = {"ab"};
static const char *const STOP2[] = {"ac"};
static const char *const STOP_SPLIT_A[] = {"ab", "c"};
static const char *const STOP_SPLIT_B[] = {"a", "bc"};
static const int32_t STOP_IDS[] = {7};
static const int32_t EOG[] = {2};
static const cinfer_logit_bias BIAS[] = {{5, -1.0f}};

static void m_prompt_id(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->prompt = PROMPT2; }
static void m_prompt_len(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->prompt = PROMPT3; rp->n_prompt = 3; }
static void m_max_tokens(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->max_tokens = 17; }
static void m_min_tokens(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->min_tokens = 3; }
static void m_ignore_eos(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->ignore_eos = 1; }
static void m_stop(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->stop = STOP1; rp->n_stop = 1; }
static void m_stop_text(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->stop = STOP2; rp->n_stop = 1; }
static void m_stop_ids(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->stop_ids = STOP_IDS; rp->n_stop_ids = 1; }
static void m_n(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->n_samples = 2; }
static void m_logprobs(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->logprobs = 1; }
static void m_n_logprobs(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->logprobs = 1; rp->sampling.n_logprobs = 3; }
static void m_temperature(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.temperature = 0.8f; }
static void m_greedy(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.temperature = 0; }
static void m_top_k(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.top_k = 0; }
static void m_top_p(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.top_p = 1.0f; }
static void m_min_p(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.min_p = 0; }
static void m_seed(cinfer_gen_desc *d, cinfer_request_params *rp)
{ d->seed = 43; rp->sampling.seed = 43; }
static void m_repetition(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.repetition_penalty = 1.1f; }
static void m_presence(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.presence_penalty = 0.5f; }
static void m_frequency(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.frequency_penalty = -0.5f; }
static void m_penalty_last_n(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.penalty_last_n = 64; }
static void m_penalty_prompt(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.penalty_prompt = CINFER_PENALTY_PROMPT_ALL; }
static void m_sampler_min_tokens(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.min_tokens = 2; }
static void m_eog(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.eog_tokens = EOG; rp->sampling.n_eog_tokens = 1; }
static void m_logit_bias(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.logit_bias = BIAS; rp->sampling.n_logit_bias = 1; }
static void m_n_vocab(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->sampling.n_vocab = 1001; }
static void m_grammar(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)rp; d->grammar = "root ::= \"a\""; }
static void m_regex(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)rp; d->regex = "a+"; }
static void m_json_schema(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)rp; d->json_schema = "{\"type\":\"object\"}"; }
static void m_json_object(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)rp; d->json_object = 1; }
/* Fields that must not change it. */
static void m_priority(cinfer_gen_desc *d, cinfer_request_params *rp)
{ d->priority = 5; rp->priority = 5; }
static void m_deadline(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->deadline_ns = 123456789; }
static void m_time_limit(cinfer_gen_desc *d, cinfer_request_params *rp)
{ d->time_limit_ms = 500; (void)rp; }
static void m_sink(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)d; rp->on_event = on_event; rp->user = rp; }
static void m_input_kind(cinfer_gen_desc *d, cinfer_request_params *rp)
{ (void)rp; d->input = CINFER_INPUT_TEXT; d->text = "same ids anyway"; }

typedef struct {
    const char *name;
    mutate_fn fn;
    int changes;
} field_case;

static void check_fields(const field_case *cs, size_t n, int greedy)
{
    cinfer_gen_desc d0 = seeded_desc();
    cinfer_request_params rp0 = seeded_params();
    if (greedy) {
        rp0.sampling.temperature = 0;
        d0.has_seed = 0;
    }
    cinfer_rcache_key *k0 = key_of(&d0, &rp0);
    for (size_t i = 0; i < n; i++) {
        cinfer_gen_desc d = d0;
        cinfer_request_params rp = rp0;
        cs[i].fn(&d, &rp);
        cinfer_rcache_key *k = key_of(&d, &rp);
        if (k0 && k && same_key(k0, k) == cs[i].changes) {
            fprintf(stderr, "field %s (%s): the key %s\n", cs[i].name,
                    greedy ? "greedy" : "seeded",
                    cs[i].changes ? "did not change" : "changed");
            harness_failed_checks++;
        }
        cinfer_rcache_key_free(k);
    }
    cinfer_rcache_key_free(k0);
}

static void test_key_fields(void)
{
    static const field_case seeded[] = {
        {"prompt id", m_prompt_id, 1},
        {"prompt length", m_prompt_len, 1},
        {"max_tokens", m_max_tokens, 1},
        {"min_tokens", m_min_tokens, 1},
        {"ignore_eos", m_ignore_eos, 1},
        {"stop", m_stop, 1},
        {"stop text", m_stop_text, 1},
        {"stop_token_ids", m_stop_ids, 1},
        {"n", m_n, 1},
        {"logprobs", m_logprobs, 1},
        {"top logprobs", m_n_logprobs, 1},
        {"temperature", m_temperature, 1},
        {"temperature to greedy", m_greedy, 1},
        {"top_k", m_top_k, 1},
        {"top_p", m_top_p, 1},
        {"min_p", m_min_p, 1},
        {"seed", m_seed, 1},
        {"repetition_penalty", m_repetition, 1},
        {"presence_penalty", m_presence, 1},
        {"frequency_penalty", m_frequency, 1},
        {"penalty_last_n", m_penalty_last_n, 1},
        {"penalty_prompt", m_penalty_prompt, 1},
        {"sampler min_tokens", m_sampler_min_tokens, 1},
        {"eog tokens", m_eog, 1},
        {"logit_bias", m_logit_bias, 1},
        {"n_vocab", m_n_vocab, 1},
        {"grammar", m_grammar, 1},
        {"regex", m_regex, 1},
        {"json_schema", m_json_schema, 1},
        {"json_object", m_json_object, 1},
        {"priority", m_priority, 0},
        {"deadline", m_deadline, 0},
        {"time_limit_ms", m_time_limit, 0},
        {"on_event/user", m_sink, 0},
        {"input kind (same ids)", m_input_kind, 0},
    };
    check_fields(seeded, sizeof seeded / sizeof *seeded, 0);
    /* Greedy: the argmax after penalties; what only sampling reads does
     * not enter the key (so a greedy request without a seed, which gets
     * a random one, still hits). */
    static const field_case greedy[] = {
        {"prompt id", m_prompt_id, 1},
        {"max_tokens", m_max_tokens, 1},
        {"stop", m_stop, 1},
        {"repetition_penalty", m_repetition, 1},
        {"presence_penalty", m_presence, 1},
        {"frequency_penalty", m_frequency, 1},
        {"logprobs", m_logprobs, 1},
        {"n", m_n, 1},
        {"grammar", m_grammar, 1},
        {"seed", m_seed, 0},
        {"top_k", m_top_k, 0},
        {"top_p", m_top_p, 0},
        {"min_p", m_min_p, 0},
    };
    check_fields(greedy, sizeof greedy / sizeof *greedy, 1);
}

static void test_key_stop_boundaries(void)
{
    /* ["ab", "c"] and ["a", "bc"]: the same characters, other stops. */
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params a = seeded_params(), b = seeded_params();
    a.stop = STOP_SPLIT_A;
    a.n_stop = 2;
    b.stop = STOP_SPLIT_B;
    b.n_stop = 2;
    cinfer_rcache_key *ka = key_of(&d, &a), *kb = key_of(&d, &b);
    CHECK(ka && kb && !same_key(ka, kb));
    cinfer_rcache_key_free(ka);
    cinfer_rcache_key_free(kb);
    /* A grammar's text moved to the regex field is another request. */
    cinfer_gen_desc g = seeded_desc(), r = seeded_desc();
    cinfer_request_params p = seeded_params();
    g.grammar = "x";
    r.regex = "x";
    cinfer_rcache_key *kg = key_of(&g, &p), *kr = key_of(&r, &p);
    CHECK(kg && kr && !same_key(kg, kr));
    cinfer_rcache_key_free(kg);
    cinfer_rcache_key_free(kr);
}

/* The structs the key reads: a field added to one of them must be
 * judged (in the key, or a reason not to cache) in
 * cinfer_rcache_key_make and cinfer_rcache_cacheable, and then here. */
static void test_key_covers_structs(void)
{
#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
    CHECK_EQ_INT(sizeof(cinfer_sampler_params), 88);
    CHECK_EQ_INT(sizeof(cinfer_request_params), 216);
    CHECK_EQ_INT(sizeof(cinfer_gen_desc), 248);
#endif
}

/* ---- recording, storing, replay ----------------------------------------- */

static cinfer_engine_event tokens_ev(int sample, const int32_t *ids,
                                     size_t n, const char *text,
                                     const float *lp,
                                     const cinfer_token_logprob *top,
                                     int n_top)
{
    cinfer_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = CINFER_EVENT_TOKENS;
    ev.request_id = 77;
    ev.sample_index = sample;
    ev.ids = ids;
    ev.n_ids = n;
    ev.text = text;
    ev.text_len = strlen(text);
    ev.logprobs = lp;
    ev.top = top;
    ev.n_top = n_top;
    ev.queue_ns = 5;
    return ev;
}

static cinfer_engine_event finish_ev(int sample, cinfer_finish_reason f,
                                     int32_t completion)
{
    cinfer_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = CINFER_EVENT_FINISH;
    ev.request_id = 77;
    ev.sample_index = sample;
    ev.finish = f;
    ev.prompt_tokens = 4;
    ev.completion_tokens = completion;
    ev.cached_tokens = 3;
    ev.queue_ns = 5;
    ev.ttft_ns = 10;
    ev.total_ns = 20;
    ev.message = "";
    return ev;
}

/* Records a one-sample stream of `len` tokens ending with f under a key
 * made from `prompt_id`; returns the sink the events were passed to. */
static void record(cinfer_rcache *rc, int32_t prompt_id, int len,
                   cinfer_finish_reason f, sink *out)
{
    int32_t prompt[2] = {1, prompt_id};
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params rp = seeded_params();
    rp.prompt = prompt;
    rp.n_prompt = 2;
    rp.on_event = on_event;
    rp.user = out;
    memset(out, 0, sizeof *out);
    cinfer_rcache_rec *r = NULL;
    CHECK_OK(cinfer_rcache_rec_create(rc, key_of(&d, &rp), &rp, &r));
    CHECK(rp.on_event != on_event); /* hooked */
    for (int i = 0; i < len; i++) {
        int32_t id = 100 + i;
        cinfer_engine_event ev = tokens_ev(0, &id, 1, "x", NULL, NULL, 0);
        rp.on_event(rp.user, &ev);
    }
    cinfer_engine_event fin = finish_ev(0, f, len);
    rp.on_event(rp.user, &fin); /* frees the recorder */
}

static cinfer_rcache_entry *lookup_id(cinfer_rcache *rc, int32_t prompt_id)
{
    int32_t prompt[2] = {1, prompt_id};
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params rp = seeded_params();
    rp.prompt = prompt;
    rp.n_prompt = 2;
    cinfer_rcache_key *k = key_of(&d, &rp);
    cinfer_rcache_entry *e = cinfer_rcache_lookup(rc, k);
    cinfer_rcache_key_free(k);
    return e;
}

static void test_record_and_replay(void)
{
    cinfer_rcache_params p = cinfer_rcache_default_params();
    p.max_bytes = 1 << 20;
    cinfer_rcache *rc = NULL;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    if (!rc)
        return;
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params rp = seeded_params();
    rp.n_samples = 2;
    rp.logprobs = 1;
    rp.sampling.n_logprobs = 2;
    sink first;
    memset(&first, 0, sizeof first);
    rp.on_event = on_event;
    rp.user = &first;
    cinfer_rcache_key *k0 = key_of(&d, &rp);
    CHECK(cinfer_rcache_lookup(rc, k0) == NULL); /* the miss */
    cinfer_rcache_key_free(k0);
    cinfer_rcache_rec *r = NULL;
    CHECK_OK(cinfer_rcache_rec_create(rc, key_of(&d, &rp), &rp, &r));
    int32_t a[] = {10, 11}, b[] = {20};
    float la[] = {-0.5f, -1.25f}, lb[] = {-2.0f};
    cinfer_token_logprob ta[] = {{10, -0.5f}, {3, -0.9f}, {11, -1.25f},
                                 {4, -2.0f}};
    cinfer_token_logprob tb[] = {{20, -2.0f}, {21, -2.5f}};
    cinfer_engine_event evs[] = {
        tokens_ev(0, a, 2, "he", la, ta, 2),
        tokens_ev(1, b, 1, "\xc3\xa9", lb, tb, 2),
        finish_ev(1, CINFER_FINISH_STOP_SEQUENCE, 1),
        tokens_ev(0, a, 1, "", la, ta, 2), /* text withheld */
        finish_ev(0, CINFER_FINISH_LENGTH, 3),
    };
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
        rp.on_event(rp.user, &evs[i]);
    CHECK_EQ_INT(first.n, 5); /* every event passed on */

    cinfer_rcache_stats st;
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.insertions, 1);
    CHECK_EQ_INT(st.entries, 1);
    cinfer_rcache_key *k = key_of(&d, &rp);
    cinfer_rcache_entry *e = cinfer_rcache_lookup(rc, k);
    CHECK(e != NULL);
    if (e) {
        CHECK_EQ_INT(cinfer_rcache_entry_samples(e), 2);
        CHECK_EQ_INT(cinfer_rcache_entry_events(e), 5);
        CHECK_EQ_INT(st.bytes, cinfer_rcache_entry_bytes(e));
        sink again;
        memset(&again, 0, sizeof again);
        cinfer_rcache_replay(e, on_event, &again, fake_now, 0);
        CHECK_EQ_INT(again.n, first.n);
        for (int i = 0; i < first.n && i < again.n; i++) {
            seen_ev *x = &first.ev[i], *y = &again.ev[i];
            CHECK_EQ_INT(y->kind, x->kind);
            CHECK_EQ_INT(y->sample, x->sample);
            CHECK_EQ_INT(y->n_ids, x->n_ids);
            CHECK(memcmp(y->ids, x->ids, x->n_ids * sizeof *x->ids) == 0);
            CHECK_EQ_INT(y->text_len, x->text_len);
            CHECK_EQ_STR(y->text, x->text);
            CHECK_EQ_INT(y->has_lp, x->has_lp);
            CHECK(memcmp(y->lp, x->lp, sizeof x->lp) == 0);
            CHECK_EQ_INT(y->n_top, x->n_top);
            CHECK(memcmp(y->top, x->top, sizeof x->top) == 0);
            CHECK_EQ_INT(y->finish, x->finish);
            CHECK_EQ_INT(y->prompt_tokens, x->prompt_tokens);
            CHECK_EQ_INT(y->completion_tokens, x->completion_tokens);
            /* No prefix cache served a replay; its id is the caller's. */
            CHECK_EQ_INT(y->cached_tokens, 0);
            CHECK_EQ_INT(y->request_id, 0);
        }
        cinfer_rcache_entry_release(e);
    }
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.misses, 1);
    cinfer_rcache_key_free(k);
    cinfer_rcache_destroy(rc);
}

static void test_not_stored(void)
{
    cinfer_rcache_params p = {.max_bytes = 1 << 20};
    cinfer_rcache *rc = NULL;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    if (!rc)
        return;
    sink s;
    static const cinfer_finish_reason never[] = {
        CINFER_FINISH_CANCELLED, CINFER_FINISH_TIME_LIMIT,
        CINFER_FINISH_ERROR, CINFER_FINISH_NONE};
    for (int i = 0; i < 4; i++) {
        record(rc, 50 + i, 2, never[i], &s);
        CHECK_EQ_INT(s.n, 3); /* still passed on */
        CHECK(lookup_id(rc, 50 + i) == NULL);
    }
    static const cinfer_finish_reason kept[] = {
        CINFER_FINISH_LENGTH, CINFER_FINISH_EOS, CINFER_FINISH_STOP_SEQUENCE,
        CINFER_FINISH_STOP_TOKEN};
    for (int i = 0; i < 4; i++) {
        record(rc, 60 + i, 2, kept[i], &s);
        cinfer_rcache_entry *e = lookup_id(rc, 60 + i);
        CHECK(e != NULL);
        cinfer_rcache_entry_release(e);
    }
    /* n = 2 with one sample cancelled: nothing of it is stored. */
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params rp = seeded_params();
    rp.n_samples = 2;
    rp.on_event = on_event;
    rp.user = &s;
    cinfer_rcache_rec *r = NULL;
    CHECK_OK(cinfer_rcache_rec_create(rc, key_of(&d, &rp), &rp, &r));
    int32_t id = 9;
    cinfer_engine_event ev = tokens_ev(0, &id, 1, "a", NULL, NULL, 0);
    rp.on_event(rp.user, &ev);
    ev = finish_ev(0, CINFER_FINISH_LENGTH, 1);
    rp.on_event(rp.user, &ev);
    ev = finish_ev(1, CINFER_FINISH_CANCELLED, 0);
    rp.on_event(rp.user, &ev);
    cinfer_rcache_key *k = key_of(&d, &rp);
    CHECK(cinfer_rcache_lookup(rc, k) == NULL);
    cinfer_rcache_key_free(k);
    /* A request the engine refused: the recorder is destroyed unused. */
    cinfer_request_params rq = seeded_params();
    CHECK_OK(cinfer_rcache_rec_create(rc, key_of(&d, &rq), &rq, &r));
    cinfer_rcache_rec_destroy(r);
    cinfer_rcache_stats st;
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.insertions, 4);
    cinfer_rcache_destroy(rc);
}

static void test_lru_bound(void)
{
    /* Measure one entry of 8 tokens, then bound the cache at 3.5 of
     * them. */
    cinfer_rcache_params p = {.max_bytes = 1 << 20};
    cinfer_rcache *rc = NULL;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    if (!rc)
        return;
    sink s;
    record(rc, 1, 8, CINFER_FINISH_LENGTH, &s);
    cinfer_rcache_stats st;
    cinfer_rcache_stats_get(rc, &st);
    size_t one = (size_t)st.bytes;
    CHECK(one > 8 * sizeof(int32_t));
    cinfer_rcache_destroy(rc);

    p.max_bytes = one * 7 / 2;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    if (!rc)
        return;
    for (int i = 1; i <= 3; i++)
        record(rc, i, 8, CINFER_FINISH_LENGTH, &s);
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.entries, 3);
    CHECK_EQ_INT(st.bytes, 3 * one);
    /* Using 1 makes 2 the least recent: the 4th evicts 2. */
    cinfer_rcache_entry *e1 = lookup_id(rc, 1);
    CHECK(e1 != NULL);
    record(rc, 4, 8, CINFER_FINISH_LENGTH, &s);
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK(st.bytes <= p.max_bytes);
    cinfer_rcache_entry *e2 = lookup_id(rc, 2);
    CHECK(e2 == NULL);
    cinfer_rcache_entry_release(e2);
    cinfer_rcache_entry *e3 = lookup_id(rc, 3);
    CHECK(e3 != NULL);
    cinfer_rcache_entry_release(e3);
    /* Many more: the bound holds after every insertion, and an entry
     * held by a replay outlives its eviction (e1, read after). */
    for (int i = 5; i < 40; i++) {
        record(rc, i, 1 + i % 9, CINFER_FINISH_EOS, &s);
        cinfer_rcache_stats_get(rc, &st);
        CHECK(st.bytes <= p.max_bytes);
        CHECK(st.entries >= 1);
    }
    CHECK(lookup_id(rc, 1) == NULL); /* evicted meanwhile */
    if (e1) {
        sink r;
        memset(&r, 0, sizeof r);
        cinfer_rcache_replay(e1, on_event, &r, fake_now, 0);
        CHECK_EQ_INT(r.n, 9);
        CHECK_EQ_INT(r.ev[7].ids[0], 107);
        cinfer_rcache_entry_release(e1);
    }
    /* A stream larger than the whole bound is not kept. */
    uint64_t ins = st.insertions;
    record(rc, 99, 60, CINFER_FINISH_LENGTH, &s);
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.insertions, ins);
    CHECK(lookup_id(rc, 99) == NULL);
    /* Stats add up: bytes are the entries' own. */
    CHECK(st.entries * one / 2 <= st.bytes);
    cinfer_rcache_destroy(rc);

    /* A bound of 0 keeps nothing. */
    p.max_bytes = 0;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    record(rc, 1, 1, CINFER_FINISH_LENGTH, &s);
    CHECK(lookup_id(rc, 1) == NULL);
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.entries, 0);
    CHECK_EQ_INT(st.bytes, 0);
    cinfer_rcache_destroy(rc);
}

static void test_collision_compare(void)
{
    cinfer_rcache_params p = {.max_bytes = 1 << 20};
    cinfer_rcache *rc = NULL;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    if (!rc)
        return;
    sink s;
    record(rc, 5, 2, CINFER_FINISH_LENGTH, &s);
    int32_t prompt[2] = {1, 5};
    cinfer_gen_desc d = seeded_desc();
    cinfer_request_params rp = seeded_params();
    rp.prompt = prompt;
    rp.n_prompt = 2;
    cinfer_rcache_key *k = key_of(&d, &rp);
    size_t n;
    const uint8_t *bytes = cinfer_rcache_key_bytes(k, &n);
    uint8_t *other = malloc(n);
    memcpy(other, bytes, n);
    other[n - 1] ^= 1;
    /* The stored key's digest over other bytes: a forged collision. */
    cinfer_rcache_key *forged = NULL;
    CHECK_OK(cinfer_rcache_key_from_bytes(other, n,
                                          cinfer_rcache_key_digest(k),
                                          &forged));
    CHECK(cinfer_rcache_lookup(rc, forged) == NULL);
    /* Same bytes, another digest: not found either (the table looks in
     * the digest's bucket; the compare is of both). */
    uint8_t dg[32];
    memcpy(dg, cinfer_rcache_key_digest(k), 32);
    dg[31] ^= 0x80;
    cinfer_rcache_key *odd = NULL;
    CHECK_OK(cinfer_rcache_key_from_bytes(bytes, n, dg, &odd));
    CHECK(cinfer_rcache_lookup(rc, odd) == NULL);
    cinfer_rcache_entry *e = cinfer_rcache_lookup(rc, k);
    CHECK(e != NULL);
    cinfer_rcache_entry_release(e);
    CHECK(cinfer_rcache_lookup(rc, NULL) == NULL);
    cinfer_rcache_stats st;
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.misses, 2);
    free(other);
    cinfer_rcache_key_free(forged);
    cinfer_rcache_key_free(odd);
    cinfer_rcache_key_free(k);
    cinfer_rcache_destroy(rc);
}

static void test_many_entries_table_grows(void)
{
    cinfer_rcache_params p = {.max_bytes = 64 << 20};
    cinfer_rcache *rc = NULL;
    CHECK_OK(cinfer_rcache_create(&p, &rc));
    if (!rc)
        return;
    sink s;
    for (int i = 0; i < 300; i++)
        record(rc, 1000 + i, 1, CINFER_FINISH_EOS, &s);
    int found = 0;
    for (int i = 0; i < 300; i++) {
        cinfer_rcache_entry *e = lookup_id(rc, 1000 + i);
        found += e != NULL;
        cinfer_rcache_entry_release(e);
    }
    CHECK_EQ_INT(found, 300);
    cinfer_rcache_stats st;
    cinfer_rcache_stats_get(rc, &st);
    CHECK_EQ_INT(st.entries, 300);
    CHECK_EQ_INT(st.evictions, 0);
    cinfer_rcache_destroy(rc);
}

int main(void)
{
    RUN(test_cacheable);
    RUN(test_key_fields);
    RUN(test_key_stop_boundaries);
    RUN(test_key_covers_structs);
    RUN(test_record_and_replay);
    RUN(test_not_stored);
    RUN(test_lru_bound);
    RUN(test_collision_compare);
    RUN(test_many_entries_table_grows);
    return harness_done();
}
#endif
