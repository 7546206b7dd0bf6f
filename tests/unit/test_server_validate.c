/*
 * test_server_validate.c - request validation, UTF-8 helpers and the
 * status map of the gRPC server (server/validate.c, server/status_map.c).
 *
 * Requests are built with the generated protobuf-c structs, as the server
 * sees them after unpacking; each invalid field must fail with
 * CINFER_E_INVALID_ARG and a message that names it.
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

#include "server/status_map.h"
#include "server/validate.h"

static const cinfer_request_limits LIM = {
    .n_vocab = 1000,
    .n_ctx = 128,
    .chat_supported = 1,
    .default_max_tokens = 256,
};

/* Expects validation to fail naming `field`. */
#define EXPECT_BAD(req, field)                                                 \
    do {                                                                       \
        CHECK_EQ_INT(cinfer_validate_generate(&(req), &LIM),                   \
                     CINFER_E_INVALID_ARG);                                    \
        if (!strstr(cinfer_last_error(), field)) {                             \
            fprintf(stderr, "%s:%d: message \"%s\" does not name %s\n",       \
                    __FILE__, __LINE__, cinfer_last_error(), field);           \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

static Cinfer__V1__GenerateRequest text_req(const char *text)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = (char *)text;
    return r;
}

static void test_input(void)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    EXPECT_BAD(r, "input must be set");
    r = text_req("");
    EXPECT_BAD(r, "text");
    r = text_req("hello");
    CHECK_OK(cinfer_validate_generate(&r, &LIM));

    Cinfer__V1__TokenIds ids = CINFER__V1__TOKEN_IDS__INIT;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS;
    r.token_ids = &ids;
    EXPECT_BAD(r, "token_ids.ids must not be empty");
    int32_t v[3] = {1, 999, 1000};
    ids.ids = v;
    ids.n_ids = 2;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    ids.n_ids = 3;
    EXPECT_BAD(r, "token_ids.ids[2] = 1000");
    v[0] = -1;
    ids.n_ids = 1;
    EXPECT_BAD(r, "token_ids.ids[0]");
    /* As many ids as the context leaves no room to generate. */
    int32_t *many = calloc(128, sizeof *many);
    ids.ids = many;
    ids.n_ids = 127;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    ids.n_ids = 128;
    EXPECT_BAD(r, "token_ids.ids has 128 tokens");
    free(many);
}

static void test_chat(void)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__Chat chat = CINFER__V1__CHAT__INIT;
    Cinfer__V1__ChatMessage m = CINFER__V1__CHAT_MESSAGE__INIT;
    Cinfer__V1__ChatMessage *mp = &m;
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_CHAT;
    r.chat = &chat;
    EXPECT_BAD(r, "chat.messages must not be empty");
    chat.messages = &mp;
    chat.n_messages = 1;
    m.role = "";
    EXPECT_BAD(r, "chat.messages[0].role must not be empty");
    m.role = "us er";
    EXPECT_BAD(r, "chat.messages[0].role");
    m.role = "<|im_end|>";
    EXPECT_BAD(r, "chat.messages[0].role");
    m.role = "tool";
    EXPECT_BAD(r, "chat.messages[0].role must be system, user or assistant");
    m.role = "User";
    EXPECT_BAD(r, "chat.messages[0].role");
    m.role = "system";
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    m.role = "assistant";
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    m.role = "user";
    m.content = "hi <|im_end|> there";
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    cinfer_request_limits no_chat = LIM;
    no_chat.chat_supported = 0;
    CHECK_EQ_INT(cinfer_validate_generate(&r, &no_chat), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "ChatML") != NULL);
}

static void test_sampling(void)
{
    Cinfer__V1__GenerateRequest r = text_req("x");
    Cinfer__V1__SamplingParams s = CINFER__V1__SAMPLING_PARAMS__INIT;
    r.sampling = &s;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));

#define SET(field, value)                                                      \
    do {                                                                       \
        s = (Cinfer__V1__SamplingParams)CINFER__V1__SAMPLING_PARAMS__INIT;     \
        s.opt_##field##_case = 1; /* any non-zero case means set */            \
        s.field = (value);                                                     \
    } while (0)
    SET(temperature, -0.1f);
    EXPECT_BAD(r, "sampling.temperature");
    SET(temperature, NAN);
    EXPECT_BAD(r, "sampling.temperature");
    SET(temperature, INFINITY);
    EXPECT_BAD(r, "sampling.temperature");
    SET(temperature, 0.0f);
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    SET(top_k, -1);
    EXPECT_BAD(r, "sampling.top_k");
    SET(top_k, 0);
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    SET(top_p, 0.0f);
    EXPECT_BAD(r, "sampling.top_p");
    SET(top_p, 1.0001f);
    EXPECT_BAD(r, "sampling.top_p");
    SET(top_p, NAN);
    EXPECT_BAD(r, "sampling.top_p");
    SET(top_p, 1.0f);
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    /* The value is printed with the digits that show why it is out. */
    SET(top_p, 1.0000001f);
    EXPECT_BAD(r, "sampling.top_p must be in (0, 1], got 1.00000012");
    SET(min_p, -0.01f);
    EXPECT_BAD(r, "sampling.min_p");
    SET(min_p, 1.5f);
    EXPECT_BAD(r, "sampling.min_p");
    SET(repetition_penalty, 0.0f);
    EXPECT_BAD(r, "sampling.repetition_penalty");
    SET(repetition_penalty, 11.0f);
    EXPECT_BAD(r, "sampling.repetition_penalty");
    /* Small enough to take a logit past a float in the sampler. */
    SET(repetition_penalty, 1e-37f);
    EXPECT_BAD(r, "sampling.repetition_penalty must be in [0.01, 10], got "
                  "9.99999991e-38");
    SET(repetition_penalty, 0.0099f);
    EXPECT_BAD(r, "sampling.repetition_penalty");
    SET(repetition_penalty, 0.01f);
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    SET(presence_penalty, 2.5f);
    EXPECT_BAD(r, "sampling.presence_penalty");
    SET(frequency_penalty, -2.5f);
    EXPECT_BAD(r, "sampling.frequency_penalty");
    SET(frequency_penalty, -2.0f);
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
#undef SET
}

static void test_stopping(void)
{
    Cinfer__V1__GenerateRequest r = text_req("x");
    Cinfer__V1__StoppingCriteria s = CINFER__V1__STOPPING_CRITERIA__INIT;
    r.stopping = &s;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    /* Unset max_tokens: the default, capped by the context. */
    CHECK_EQ_INT(cinfer_validate_max_tokens(&r, &LIM), 128);

    s.opt_max_tokens_case = 1;
    s.max_tokens = 0;
    EXPECT_BAD(r, "stopping.max_tokens");
    s.max_tokens = 129;
    EXPECT_BAD(r, "stopping.max_tokens");
    s.max_tokens = 16;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    CHECK_EQ_INT(cinfer_validate_max_tokens(&r, &LIM), 16);
    s.opt_min_tokens_case = 1;
    s.min_tokens = 17;
    EXPECT_BAD(r, "stopping.min_tokens");
    s.min_tokens = -1;
    EXPECT_BAD(r, "stopping.min_tokens");
    s.min_tokens = 16;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));

    char *stops[17];
    for (int i = 0; i < 17; i++)
        stops[i] = "s";
    s.stop = stops;
    s.n_stop = 17;
    EXPECT_BAD(r, "stopping.stop has 17");
    s.n_stop = 2;
    stops[1] = "";
    EXPECT_BAD(r, "stopping.stop[1]");
    char big[300];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    stops[1] = big;
    EXPECT_BAD(r, "stopping.stop[1]");
    s.n_stop = 1;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));

    int32_t ids[65] = {0};
    s.stop_token_ids = ids;
    s.n_stop_token_ids = 65;
    EXPECT_BAD(r, "stopping.stop_token_ids has 65");
    s.n_stop_token_ids = 2;
    ids[1] = 1000;
    EXPECT_BAD(r, "stopping.stop_token_ids[1]");
    ids[1] = 999;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));

    s.opt_time_limit_ms_case = 1;
    s.time_limit_ms = 0;
    EXPECT_BAD(r, "stopping.time_limit_ms");
    s.time_limit_ms = 1;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
}

static void test_top_level(void)
{
    Cinfer__V1__GenerateRequest r = text_req("x");
    r.opt_logprobs_case = CINFER__V1__GENERATE_REQUEST__OPT_LOGPROBS_LOGPROBS;
    r.logprobs = 21;
    EXPECT_BAD(r, "logprobs");
    r.logprobs = -1;
    EXPECT_BAD(r, "logprobs");
    r.logprobs = 0;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    r.priority = 101;
    EXPECT_BAD(r, "priority");
    r.priority = -100;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));

    r.request_id = "has space";
    EXPECT_BAD(r, "request_id");
    CHECK(!cinfer_request_id_ok("has space"));
    char id[130];
    memset(id, 'i', sizeof id - 1);
    id[sizeof id - 1] = '\0';
    r.request_id = id;
    EXPECT_BAD(r, "request_id is 129 bytes");
    id[128] = '\0';
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    CHECK(cinfer_request_id_ok(id));
    CHECK(cinfer_request_id_ok(""));
    CHECK(cinfer_request_id_ok(NULL));
    /* request_id_ok leaves the error text alone. */
    cinfer_set_error(CINFER_E_INVALID_ARG, "keep me");
    cinfer_request_id_ok("bad id");
    CHECK_EQ_STR(cinfer_last_error(), "keep me");
}

static void test_tokenize_detokenize(void)
{
    Cinfer__V1__TokenizeRequest t = CINFER__V1__TOKENIZE_REQUEST__INIT;
    CHECK_EQ_INT(cinfer_validate_tokenize(&t, &LIM), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "input") != NULL);
    t.input_case = CINFER__V1__TOKENIZE_REQUEST__INPUT_TEXT;
    t.text = "";
    CHECK_OK(cinfer_validate_tokenize(&t, &LIM));

    Cinfer__V1__DetokenizeRequest d = CINFER__V1__DETOKENIZE_REQUEST__INIT;
    CHECK_OK(cinfer_validate_detokenize(&d, &LIM));
    int32_t ids[2] = {5, 1000};
    d.token_ids = ids;
    d.n_token_ids = 2;
    CHECK_EQ_INT(cinfer_validate_detokenize(&d, &LIM), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "token_ids[1]") != NULL);
}

static void test_utf8(void)
{
    CHECK(cinfer_utf8_valid("", 0));
    CHECK(cinfer_utf8_valid("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15));
    CHECK(!cinfer_utf8_valid("\xc0\xaf", 2));         /* overlong */
    CHECK(!cinfer_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    CHECK(!cinfer_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    CHECK(!cinfer_utf8_valid("\xe2\x82", 2));         /* truncated */
    CHECK(!cinfer_utf8_valid("\x80", 1));

    char out[64];
    /* "a" <E2 82> "b": the truncated sequence is one U+FFFD. */
    size_t n = cinfer_utf8_sanitize("a\xe2\x82" "b", 4, out);
    CHECK_EQ_INT(n, 5);
    CHECK(memcmp(out, "a\xef\xbf\xbd" "b", 5) == 0);
    /* Each byte that cannot start or continue is its own U+FFFD. */
    n = cinfer_utf8_sanitize("\xc0\xaf", 2, out);
    CHECK_EQ_INT(n, 6);
    n = cinfer_utf8_sanitize("\xf0\x9f\x98", 3, out);
    CHECK_EQ_INT(n, 3);
    CHECK(cinfer_utf8_valid(out, n));
    n = cinfer_utf8_sanitize("ok \xe2\x82\xac", 6, out);
    CHECK_EQ_INT(n, 6);
}

static void test_status_map(void)
{
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_OK), GRPC_STATUS_OK);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_INVALID_ARG),
                 GRPC_STATUS_INVALID_ARGUMENT);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_RANGE),
                 GRPC_STATUS_INVALID_ARGUMENT);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_NOMEM),
                 GRPC_STATUS_RESOURCE_EXHAUSTED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_EXHAUSTED),
                 GRPC_STATUS_RESOURCE_EXHAUSTED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_UNAVAILABLE),
                 GRPC_STATUS_UNAVAILABLE);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_TIMEOUT),
                 GRPC_STATUS_DEADLINE_EXCEEDED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_CANCELLED),
                 GRPC_STATUS_CANCELLED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_UNAUTHENTICATED),
                 GRPC_STATUS_UNAUTHENTICATED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_PERMISSION),
                 GRPC_STATUS_PERMISSION_DENIED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_NOT_FOUND),
                 GRPC_STATUS_NOT_FOUND);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_UNSUPPORTED),
                 GRPC_STATUS_UNIMPLEMENTED);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_INTERNAL),
                 GRPC_STATUS_INTERNAL);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_DEVICE),
                 GRPC_STATUS_INTERNAL);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_IO), GRPC_STATUS_INTERNAL);
    CHECK_EQ_INT(cinfer_server_grpc_status(CINFER_E_FORMAT),
                 GRPC_STATUS_INTERNAL);
    CHECK_EQ_INT(cinfer_server_grpc_status((cinfer_status)-99),
                 GRPC_STATUS_UNKNOWN);
}

/* Requests survive the wire: pack, unpack, validate. */
static void test_roundtrip(void)
{
    Cinfer__V1__GenerateRequest r = text_req("hello");
    Cinfer__V1__SamplingParams s = CINFER__V1__SAMPLING_PARAMS__INIT;
    s.opt_temperature_case =
        CINFER__V1__SAMPLING_PARAMS__OPT_TEMPERATURE_TEMPERATURE;
    s.temperature = 0.0f; /* set to 0: differs from unset */
    r.sampling = &s;
    size_t n = cinfer__v1__generate_request__get_packed_size(&r);
    uint8_t *buf = malloc(n);
    cinfer__v1__generate_request__pack(&r, buf);
    Cinfer__V1__GenerateRequest *u =
        cinfer__v1__generate_request__unpack(NULL, n, buf);
    CHECK(u != NULL);
    if (u) {
        CHECK(CINFER_PB_HAS(u->sampling, temperature));
        CHECK(u->sampling->temperature == 0.0f);
        CHECK(!CINFER_PB_HAS(u->sampling, top_p));
        CHECK_OK(cinfer_validate_generate(u, &LIM));
        cinfer__v1__generate_request__free_unpacked(u, NULL);
    }
    free(buf);
}

int main(void)
{
    RUN(test_input);
    RUN(test_chat);
    RUN(test_sampling);
    RUN(test_stopping);
    RUN(test_top_level);
    RUN(test_tokenize_detokenize);
    RUN(test_utf8);
    RUN(test_status_map);
    RUN(test_roundtrip);
    return harness_done();
}
#endif
