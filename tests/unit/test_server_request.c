/*
 * test_server_request.c - the request path both front ends share
 * (server/request.c): a request description checked naming each front
 * end's field, mapped onto engine params, its deadline (saturating), its
 * grammar, and the engine's refusals mapped to their true reasons. No
 * server, no gRPC call.
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

#include "server/request.h"

static const cinfer_request_limits LIM = {
    .n_vocab = 1000,
    .n_ctx = 128,
    .chat_supported = 1,
    .default_max_tokens = 64,
};

static cinfer_gen_desc text_desc(void)
{
    cinfer_gen_desc d = cinfer_gen_desc_init();
    d.input = CINFER_INPUT_TEXT;
    d.text = "hello";
    return d;
}

/* Expects validation to fail with the message naming `field`. */
#define EXPECT_BAD(d, f, field)                                                \
    do {                                                                       \
        CHECK_EQ_INT(cinfer_request_validate(&(d), &LIM, (f)),                 \
                     CINFER_E_INVALID_ARG);                                    \
        if (strncmp(cinfer_last_error(), field, strlen(field)) != 0) {         \
            fprintf(stderr, "%s:%d: message \"%s\" does not start with %s\n", \
                    __FILE__, __LINE__, cinfer_last_error(), field);           \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

static void test_fields_named_per_front_end(void)
{
    const cinfer_request_fields *g = &cinfer_request_fields_grpc;
    const cinfer_request_fields *o = &cinfer_request_fields_openai;
    cinfer_gen_desc d = text_desc();
    CHECK_OK(cinfer_request_validate(&d, &LIM, o));

    d.has_top_p = 1;
    d.top_p = 1.5f;
    EXPECT_BAD(d, g, "sampling.top_p");
    EXPECT_BAD(d, o, "top_p");
    d.top_p = NAN;
    EXPECT_BAD(d, o, "top_p");
    d = text_desc();
    d.has_temperature = 1;
    d.temperature = -0.5f;
    EXPECT_BAD(d, o, "temperature");
    d = text_desc();
    d.has_max_tokens = 1;
    d.max_tokens = 0;
    EXPECT_BAD(d, g, "stopping.max_tokens");
    EXPECT_BAD(d, o, "max_tokens");
    d.max_tokens = 129;
    EXPECT_BAD(d, o, "max_tokens");
    d = text_desc();
    d.has_n = 1;
    d.n = 0;
    EXPECT_BAD(d, o, "n must be in [1, 16]");
    d.n = CINFER_MAX_SAMPLES + 1;
    EXPECT_BAD(d, g, "n");
    d.n = CINFER_MAX_SAMPLES;
    CHECK_OK(cinfer_request_validate(&d, &LIM, g));
    d = text_desc();
    d.has_logprobs = 1;
    d.logprobs = 21;
    EXPECT_BAD(d, o, "top_logprobs");
    d = text_desc();
    d.priority = 101;
    EXPECT_BAD(d, o, "priority");
    d = text_desc();
    d.text = "";
    EXPECT_BAD(d, o, "prompt");
    d.text = "\xff\xfe";
    EXPECT_BAD(d, o, "prompt is not valid UTF-8");
    d = cinfer_gen_desc_init();
    EXPECT_BAD(d, o, "input must be set");
    d.input = CINFER_INPUT_CHAT;
    EXPECT_BAD(d, o, "messages");
    d = text_desc();
    const char *stops[] = {"a", ""};
    d.stop = stops;
    d.n_stop = 2;
    EXPECT_BAD(d, o, "stop[1]");
    d = text_desc();
    int32_t ids[] = {3, 1000};
    d.stop_ids = ids;
    d.n_stop_ids = 2;
    EXPECT_BAD(d, o, "stop_token_ids[1]");
    d = text_desc();
    d.grammar = "root ::= \"a\"";
    d.regex = "a+";
    /* named by the second one set, so a field name leads the message */
    EXPECT_BAD(d, o, "regex: set at most one of grammar, regex and "
                     "response_format.json_schema");
    d.regex = NULL;
    d.json_schema = "{\"type\":\"integer\"}";
    EXPECT_BAD(d, g, "json_schema: set at most one of grammar, regex and "
                     "json_schema");
    d.grammar = NULL;
    d.json_object = 1;
    EXPECT_BAD(d, o, "response_format.json_schema: set at most one of "
                     "grammar, regex and response_format.json_schema");
    d.json_object = 0;
    CHECK_OK(cinfer_request_validate(&d, &LIM, g));
}

static void test_from_proto_and_to_engine(void)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__SamplingParams sp = CINFER__V1__SAMPLING_PARAMS__INIT;
    Cinfer__V1__StoppingCriteria sc = CINFER__V1__STOPPING_CRITERIA__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = "hi";
    r.sampling = &sp;
    r.stopping = &sc;
    sp.opt_temperature_case =
        CINFER__V1__SAMPLING_PARAMS__OPT_TEMPERATURE_TEMPERATURE;
    sp.temperature = 0.0f;
    sp.opt_seed_case = CINFER__V1__SAMPLING_PARAMS__OPT_SEED_SEED;
    sp.seed = 42;
    sc.opt_max_tokens_case =
        CINFER__V1__STOPPING_CRITERIA__OPT_MAX_TOKENS_MAX_TOKENS;
    sc.max_tokens = 7;
    r.opt_n_case = CINFER__V1__GENERATE_REQUEST__OPT_N_N;
    r.n = 3;
    r.opt_logprobs_case = CINFER__V1__GENERATE_REQUEST__OPT_LOGPROBS_LOGPROBS;
    r.logprobs = 2;
    r.priority = -4;

    cinfer_gen_desc d;
    cinfer_gen_desc_from_proto(&r, &d);
    CHECK_EQ_INT(d.input, CINFER_INPUT_TEXT);
    CHECK_EQ_INT(d.has_temperature, 1);
    CHECK_EQ_INT(d.has_top_p, 0);
    CHECK_OK(cinfer_request_validate(&d, &LIM, &cinfer_request_fields_grpc));

    int32_t prompt[] = {5, 6};
    cinfer_request_params rp;
    cinfer_request_to_engine(&d, &LIM, prompt, 2, 99, NULL, &rp);
    CHECK(rp.prompt == prompt);
    CHECK_EQ_INT(rp.n_prompt, 2);
    CHECK_EQ_INT(rp.max_tokens, 7);
    CHECK_EQ_INT(rp.n_samples, 3);
    CHECK_EQ_INT(rp.logprobs, 1);
    CHECK_EQ_INT(rp.sampling.n_logprobs, 2);
    CHECK_EQ_INT(rp.priority, -4);
    CHECK_EQ_INT((int)rp.sampling.seed, 42);
    CHECK_EQ_INT(rp.sampling.n_vocab, 1000);
    CHECK_NEAR(rp.sampling.temperature, 0.0, 0.0);
    CHECK_NEAR(rp.sampling.top_p, cinfer_sampler_default_params().top_p, 0.0);

    /* Unset: the default max_tokens, one sample, the caller's seed. */
    d = text_desc();
    cinfer_request_to_engine(&d, &LIM, prompt, 2, 99, NULL, &rp);
    CHECK_EQ_INT(rp.max_tokens, 64);
    CHECK_EQ_INT(rp.n_samples, 1);
    CHECK_EQ_INT((int)rp.sampling.seed, 99);
    CHECK_EQ_INT(rp.logprobs, 0);
    cinfer_request_limits small = LIM;
    small.default_max_tokens = 500;
    CHECK_EQ_INT(cinfer_request_max_tokens(&d, &small), 128);
}

static void test_prompt_checks(void)
{
    cinfer_gen_desc d = text_desc();
    const cinfer_request_fields *o = &cinfer_request_fields_openai;
    CHECK_EQ_INT(cinfer_request_check_prompt(&d, 0, &LIM, o),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "prompt: tokenizes to no tokens"));
    CHECK_EQ_INT(cinfer_request_check_prompt(&d, 128, &LIM, o),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "context holds 128"));
    CHECK_OK(cinfer_request_check_prompt(&d, 127, &LIM, o));
    d.input = CINFER_INPUT_CHAT;
    CHECK_EQ_INT(cinfer_request_check_prompt(&d, 200, &LIM, o),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "messages:", 9) == 0);

    /* Ids are copied as given. */
    int32_t ids[] = {1, 2, 3};
    d = cinfer_gen_desc_init();
    d.input = CINFER_INPUT_IDS;
    d.ids = ids;
    d.n_ids = 3;
    int32_t *out = NULL;
    size_t n = 0;
    CHECK_OK(cinfer_request_encode(NULL, NULL, &d, &out, &n));
    CHECK_EQ_INT(n, 3);
    CHECK(out && out[2] == 3 && out != ids);
    free(out);
}

static void test_grammar(void)
{
    const cinfer_request_fields *o = &cinfer_request_fields_openai;
    const cinfer_request_fields *gf = &cinfer_request_fields_grpc;
    cinfer_grammar_cache_params cp = cinfer_grammar_cache_default_params();
    cinfer_grammar_cache *cache = NULL;
    CHECK_OK(cinfer_grammar_cache_create(&cp, &cache));
    cinfer_gen_desc d = text_desc();
    cinfer_grammar_entry *e = (cinfer_grammar_entry *)1;
    CHECK_OK(cinfer_request_compile_grammar(&d, o, cache, &e));
    CHECK(e == NULL);
    d.grammar = "root ::= \"yes\" | \"no\"";
    CHECK_OK(cinfer_request_compile_grammar(&d, o, cache, &e));
    CHECK(e != NULL);
    int32_t p[] = {1};
    cinfer_request_params rp;
    cinfer_request_to_engine(&d, &LIM, p, 1, 0, cinfer_grammar_entry_grammar(e),
                             &rp);
    CHECK(rp.grammar == cinfer_grammar_entry_grammar(e));
    /* The same text again is the kept grammar. */
    cinfer_grammar_entry *e2 = NULL;
    CHECK_OK(cinfer_request_compile_grammar(&d, o, cache, &e2));
    CHECK(e2 && cinfer_grammar_entry_grammar(e2) ==
                    cinfer_grammar_entry_grammar(e));
    cinfer_grammar_entry_release(e2);
    cinfer_grammar_entry_release(e);
    cinfer_grammar_cache_stats st;
    cinfer_grammar_cache_stats_get(cache, &st);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.misses, 1);
    CHECK_EQ_INT(st.entries, 1);
    CHECK(st.bytes > 0);

    d.grammar = "root ::= (";
    CHECK_EQ_INT(cinfer_request_compile_grammar(&d, o, cache, &e),
                 CINFER_E_INVALID_ARG);
    CHECK(e == NULL);
    CHECK(strncmp(cinfer_last_error(), "grammar: ", 9) == 0);
    d.grammar = "root ::= undefined_rule";
    CHECK_EQ_INT(cinfer_request_compile_grammar(&d, o, cache, &e),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "grammar: ", 9) == 0);

    d.grammar = NULL;
    d.regex = "[0-9]{3}";
    CHECK_OK(cinfer_request_compile_grammar(&d, o, cache, &e));
    CHECK(e != NULL);
    cinfer_grammar_entry_release(e);
    d.regex = "(ab";
    CHECK_EQ_INT(cinfer_request_compile_grammar(&d, o, cache, &e),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "regex: ", 7) == 0);

    /* A JSON schema, and its refusals named once with the field. */
    d.regex = NULL;
    d.json_schema = "{\"type\":\"object\",\"properties\":{\"a\":"
                    "{\"type\":\"integer\"}},\"required\":[\"a\"]}";
    CHECK_OK(cinfer_request_compile_grammar(&d, gf, cache, &e));
    CHECK(e != NULL);
    cinfer_grammar_entry_release(e);
    d.json_schema = "{\"type\":\"string\",\"format\":\"email\"}";
    CHECK_EQ_INT(cinfer_request_compile_grammar(&d, gf, cache, &e),
                 CINFER_E_INVALID_ARG);
    CHECK(e == NULL);
    CHECK(strncmp(cinfer_last_error(), "json_schema: #", 14) == 0);
    CHECK(strstr(cinfer_last_error(), "format") != NULL);
    CHECK_EQ_INT(cinfer_request_compile_grammar(&d, o, cache, &e),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "response_format.json_schema: #",
                  30) == 0);
    d.json_schema = "{not json";
    CHECK_EQ_INT(cinfer_request_compile_grammar(&d, gf, cache, &e),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "json_schema: ", 13) == 0);
    /* response_format json_object. */
    d.json_schema = NULL;
    d.json_object = 1;
    CHECK_OK(cinfer_request_compile_grammar(&d, o, cache, &e));
    CHECK(e != NULL);
    cinfer_grammar_entry_release(e);
    cinfer_grammar_cache_stats_get(cache, &st);
    CHECK_EQ_INT(st.entries, 4);
    cinfer_grammar_cache_destroy(cache);
}

static void test_deadline(void)
{
    const int64_t MS = 1000000;
    /* Nothing: no deadline. */
    cinfer_request_deadline dl = cinfer_request_deadline_of(1000, 0, 0, 0);
    CHECK_EQ_INT(dl.hard_ns, 0);
    CHECK_EQ_INT(dl.engine_ns, 0);
    CHECK_EQ_INT(dl.is_hard, 0);
    /* The client's deadline. */
    dl = cinfer_request_deadline_of(1000, 5000 * MS, 0, 0);
    CHECK(dl.hard_ns == 5000 * MS && dl.engine_ns == 5000 * MS && dl.is_hard);
    /* max_request_time sooner than the client's. */
    dl = cinfer_request_deadline_of(1000, 5000 * MS, 100, 0);
    CHECK(dl.hard_ns == 1000 + 100 * MS && dl.is_hard);
    /* A time limit sooner than the hard deadline ends normally. */
    dl = cinfer_request_deadline_of(1000, 5000 * MS, 0, 10);
    CHECK(dl.hard_ns == 5000 * MS);
    CHECK(dl.engine_ns == 1000 + 10 * MS);
    CHECK_EQ_INT(dl.is_hard, 0);
    /* Equal: the hard one wins. */
    dl = cinfer_request_deadline_of(0, 10 * MS, 0, 10);
    CHECK_EQ_INT(dl.is_hard, 1);
    /* Saturation: a start near the end of the clock and huge limits. */
    int64_t late = INT64_MAX - 5;
    dl = cinfer_request_deadline_of(late, 0, INT64_MAX, 0);
    CHECK(dl.hard_ns == INT64_MAX && dl.is_hard);
    dl = cinfer_request_deadline_of(late, 0, 0, UINT32_MAX);
    CHECK(dl.engine_ns == INT64_MAX && !dl.is_hard && dl.hard_ns == 0);
    dl = cinfer_request_deadline_of(late, 0, INT64_MAX / 2, UINT32_MAX);
    CHECK(dl.engine_ns == INT64_MAX && dl.is_hard);
}

static void test_refusals(void)
{
    const int64_t MS = 1000000;
    cinfer_engine_refusal_map m = cinfer_request_map_refusal(
        CINFER_E_TIMEOUT, CINFER_ENGINE_REFUSAL_DEADLINE, 250 * MS, 1000);
    CHECK(m.load && m.reason == CINFER_REJECT_SHED_DEADLINE);
    CHECK_EQ_INT(m.status, CINFER_E_TIMEOUT);
    CHECK_EQ_INT(m.retry_after_ms, 250);
    m = cinfer_request_map_refusal(CINFER_E_UNAVAILABLE,
                                   CINFER_ENGINE_REFUSAL_QUEUE_WAIT, 1, 1000);
    CHECK(m.load && m.reason == CINFER_REJECT_SHED_QUEUE_WAIT);
    CHECK_EQ_INT(m.retry_after_ms, 1); /* rounded up, at least 1 */
    m = cinfer_request_map_refusal(CINFER_E_UNAVAILABLE,
                                   CINFER_ENGINE_REFUSAL_FIRST_TOKEN,
                                   INT64_MAX, 1000);
    CHECK(m.load && m.reason == CINFER_REJECT_SHED_FIRST_TOKEN);
    CHECK_EQ_INT(m.retry_after_ms, 1000); /* capped, no overflow */
    /* Unavailable for no load bound: the engine is stopping. */
    m = cinfer_request_map_refusal(CINFER_E_UNAVAILABLE,
                                   CINFER_ENGINE_REFUSAL_NONE, 0, 1000);
    CHECK(m.load && m.reason == CINFER_REJECT_DRAINING);
    /* Its own queue bound: counted, the status kept. */
    m = cinfer_request_map_refusal(CINFER_E_EXHAUSTED,
                                   CINFER_ENGINE_REFUSAL_NONE, 0, 1000);
    CHECK(m.load && m.reason == CINFER_REJECT_SHED_QUEUE_FULL);
    CHECK_EQ_INT(m.status, CINFER_E_EXHAUSTED);
    CHECK(m.retry_after_ms > 0);
    /* Not a refusal for load: the error as it is. */
    m = cinfer_request_map_refusal(CINFER_E_INVALID_ARG,
                                   CINFER_ENGINE_REFUSAL_NONE, 0, 1000);
    CHECK(!m.load && m.reason == CINFER_REJECT_NONE);
    CHECK_EQ_INT(m.status, CINFER_E_INVALID_ARG);

    /* Every reason has its own text. */
    char a[200], b[200];
    for (int r = 1; r < CINFER_REJECT_COUNT; r++) {
        cinfer_request_reject_message((cinfer_reject)r, 5, "c1", a, sizeof a);
        CHECK(strstr(a, "5 ms") != NULL);
        for (int q = 1; q < r; q++) {
            cinfer_request_reject_message((cinfer_reject)q, 5, "c1", b,
                                          sizeof b);
            CHECK(strcmp(a, b) != 0);
        }
    }
}

int main(void)
{
    RUN(test_fields_named_per_front_end);
    RUN(test_from_proto_and_to_engine);
    RUN(test_prompt_checks);
    RUN(test_grammar);
    RUN(test_deadline);
    RUN(test_refusals);
    return harness_done();
}
#endif
