/*
 * test_server_prompt_embeds.c - prompt embeddings on the server's request
 * path (server/request.c, validate.c, openai.c): the checks of width,
 * row count, size and values, each naming the front end's own field
 * (gRPC's prompt_embeds.width / .values, HTTP's prompt_embeds), the
 * embeddings alone as a prompt, their rows counted against the context
 * with the input's tokens, the mapping onto engine params, and the HTTP
 * API's base64 of little-endian float32 (a torch.save'd tensor refused by
 * name). No server, no gRPC call.
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

#include "server/openai.h"
#include "server/request.h"

enum { W = 8 }; /* the model's embedding width here */

static const cinfer_request_limits LIM = {
    .n_vocab = 1000,
    .n_ctx = 32,
    .chat_supported = 1,
    .default_max_tokens = 4,
    .n_embd = W,
};

static float vals[64 * W];

static cinfer_gen_desc embeds_desc(size_t rows)
{
    cinfer_gen_desc d = cinfer_gen_desc_init();
    d.has_embeds = 1;
    d.embeds = vals;
    d.n_embeds_values = rows * W;
    d.embeds_width = W;
    return d;
}

/* Expects validation to fail with a message that starts with `start` and
 * holds `has` (NULL = anything). */
static void expect_bad(const cinfer_gen_desc *d,
                       const cinfer_request_limits *lim,
                       const cinfer_request_fields *f, const char *start,
                       const char *has, int line)
{
    cinfer_status st = cinfer_request_validate(d, lim, f);
    const char *m = cinfer_last_error();
    if (st != CINFER_E_INVALID_ARG || strncmp(m, start, strlen(start)) != 0 ||
        (has && !strstr(m, has))) {
        fprintf(stderr, "line %d: status %d, message \"%s\" (wanted %s...%s)\n",
                line, (int)st, m, start, has ? has : "");
        harness_failed_checks++;
    }
}
#define EXPECT_BAD(d, lim, f, start, has)                                      \
    expect_bad(&(d), (lim), (f), (start), (has), __LINE__)

static void test_checks_name_the_field(void)
{
    const cinfer_request_fields *g = &cinfer_request_fields_grpc;
    const cinfer_request_fields *o = &cinfer_request_fields_openai;
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        vals[i] = (float)i * 0.01f - 1.0f;

    /* alone, and before each kind of input */
    cinfer_gen_desc d = embeds_desc(3);
    CHECK_OK(cinfer_request_validate(&d, &LIM, g));
    CHECK_OK(cinfer_request_validate(&d, &LIM, o));
    d.input = CINFER_INPUT_TEXT;
    d.text = "";
    CHECK_OK(cinfer_request_validate(&d, &LIM, g)); /* empty text: alone */
    d.text = "hello";
    CHECK_OK(cinfer_request_validate(&d, &LIM, g));
    int32_t ids[] = {1, 2};
    d.input = CINFER_INPUT_IDS;
    d.ids = ids;
    d.n_ids = 2;
    CHECK_OK(cinfer_request_validate(&d, &LIM, g));

    /* width: both numbers */
    d = embeds_desc(3);
    d.embeds_width = 7;
    EXPECT_BAD(d, &LIM, g, "prompt_embeds.width", "width 8, got 7");
    d.embeds_width = 0;
    EXPECT_BAD(d, &LIM, g, "prompt_embeds.width", "got 0");
    d.embeds_width = -1; /* HTTP: the model's */
    CHECK_OK(cinfer_request_validate(&d, &LIM, o));
    d.n_embeds_values = 3 * W + 1;
    EXPECT_BAD(d, &LIM, o, "prompt_embeds", "25 values are not a whole number");
    d.embeds_width = W;
    EXPECT_BAD(d, &LIM, g, "prompt_embeds.values", "rows of 8");
    d.n_embeds_values = 0;
    EXPECT_BAD(d, &LIM, g, "prompt_embeds.values", "at least one row");

    /* the first value that is not finite, by index */
    d = embeds_desc(3);
    vals[13] = NAN;
    EXPECT_BAD(d, &LIM, g, "prompt_embeds.values[13]", "row 1, column 5");
    EXPECT_BAD(d, &LIM, o, "prompt_embeds[13]", "not finite");
    vals[13] = 0.5f;
    vals[20] = -INFINITY;
    EXPECT_BAD(d, &LIM, g, "prompt_embeds.values[20]", "not finite");
    vals[20] = 0.5f;
    CHECK_OK(cinfer_request_validate(&d, &LIM, g));

    /* rows: fewer than the context */
    d = embeds_desc(32);
    EXPECT_BAD(d, &LIM, o, "prompt_embeds", "32 rows; the context holds 32");
    d = embeds_desc(31);
    CHECK_OK(cinfer_request_validate(&d, &LIM, o));
    /* bytes: the bound, whatever the context */
    cinfer_request_limits wide = LIM;
    wide.n_ctx = 1 << 20;
    wide.n_embd = 4096;
    size_t nv = CINFER_MAX_PROMPT_EMBEDS_BYTES / 4 + 4096;
    float *big = calloc(nv, sizeof *big);
    d = embeds_desc(1);
    d.embeds = big;
    d.embeds_width = 4096;
    d.n_embeds_values = nv;
    EXPECT_BAD(d, &wide, g, "prompt_embeds.values", "at most 16777216");
    d.n_embeds_values = CINFER_MAX_PROMPT_EMBEDS_BYTES / 4;
    CHECK_OK(cinfer_request_validate(&d, &wide, g));
    free(big);

    /* a model that does not take them */
    cinfer_request_limits none = LIM;
    none.n_embd = 0;
    d = embeds_desc(1);
    EXPECT_BAD(d, &none, o, "prompt_embeds", "does not take");

    /* without embeddings the input is still required */
    d = cinfer_gen_desc_init();
    CHECK_EQ_INT(cinfer_request_validate(&d, &LIM, g), CINFER_E_INVALID_ARG);
    d.input = CINFER_INPUT_TEXT;
    d.text = "";
    EXPECT_BAD(d, &LIM, g, "text", "must not be empty");
}

static void test_prompt_and_engine_params(void)
{
    const cinfer_request_fields *g = &cinfer_request_fields_grpc;
    cinfer_gen_desc d = embeds_desc(20);
    d.input = CINFER_INPUT_IDS;
    int32_t ids[12] = {0};
    d.ids = ids;
    d.n_ids = 12;
    CHECK_EQ_INT(cinfer_request_embed_rows(&d, &LIM), 20);
    /* 20 rows and 12 tokens leave no room for a generated token */
    CHECK_EQ_INT(cinfer_request_check_prompt(&d, 12, &LIM, g),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "prompt_embeds: 20 rows", 22) == 0);
    CHECK(strstr(cinfer_last_error(), "32 prompt positions") != NULL);
    CHECK_OK(cinfer_request_check_prompt(&d, 11, &LIM, g));
    /* embeddings alone: no tokens is fine */
    d = embeds_desc(5);
    CHECK_OK(cinfer_request_check_prompt(&d, 0, &LIM, g));
    int32_t *p = NULL;
    size_t n = 9;
    CHECK_OK(cinfer_request_encode(NULL, NULL, &d, &p, &n));
    CHECK_EQ_INT(n, 0);
    free(p);

    cinfer_request_params rp;
    cinfer_request_to_engine(&d, &LIM, NULL, 0, 1, NULL, &rp);
    CHECK(rp.prompt_embeds == vals);
    CHECK_EQ_INT(rp.n_prompt_embeds, 5);
    CHECK_EQ_INT(rp.n_prompt, 0);
    d = cinfer_gen_desc_init();
    d.input = CINFER_INPUT_IDS;
    cinfer_request_to_engine(&d, &LIM, ids, 2, 1, NULL, &rp);
    CHECK(rp.prompt_embeds == NULL);
    CHECK_EQ_INT(rp.n_prompt_embeds, 0);
}

static void test_grpc_message(void)
{
    Cinfer__V1__GenerateRequest r = CINFER__V1__GENERATE_REQUEST__INIT;
    Cinfer__V1__PromptEmbeds pe = CINFER__V1__PROMPT_EMBEDS__INIT;
    pe.width = W;
    pe.values = vals;
    pe.n_values = 2 * W;
    /* no input: the embeddings are the prompt */
    CHECK_EQ_INT(cinfer_validate_generate(&r, &LIM), CINFER_E_INVALID_ARG);
    r.prompt_embeds = &pe;
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    r.input_case = CINFER__V1__GENERATE_REQUEST__INPUT_TEXT;
    r.text = "";
    CHECK_OK(cinfer_validate_generate(&r, &LIM));
    cinfer_gen_desc d;
    cinfer_gen_desc_from_proto(&r, &d);
    CHECK(d.has_embeds && d.embeds == vals && d.n_embeds_values == 2 * W &&
          d.embeds_width == W);
    CHECK_OK(cinfer_request_validate(&d, &LIM, &cinfer_request_fields_grpc));
    pe.width = 4;
    cinfer_gen_desc_from_proto(&r, &d);
    EXPECT_BAD(d, &LIM, &cinfer_request_fields_grpc, "prompt_embeds.width",
               "got 4");
}

/* ---- HTTP: base64 of little-endian float32 ------------------------------ */

static char *b64(const uint8_t *p, size_t n)
{
    static const char a[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(n / 3 * 4 + 8), *q = o;
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        *q++ = a[v >> 18];
        *q++ = a[(v >> 12) & 63];
        *q++ = a[(v >> 6) & 63];
        *q++ = a[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        *q++ = a[v >> 18];
        *q++ = a[(v >> 12) & 63];
        *q++ = '=';
        *q++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        *q++ = a[v >> 18];
        *q++ = a[(v >> 12) & 63];
        *q++ = a[(v >> 6) & 63];
        *q++ = '=';
    }
    *q = 0;
    return o;
}

/* Decodes a completions body with prompt_embeds = base64(bytes) and the
 * rest of the body `rest` (a JSON fragment after the embeddings). */
static cinfer_status decode(const uint8_t *bytes, size_t n, const char *rest,
                            cinfer_openai_req *q)
{
    char *e = b64(bytes, n);
    size_t len = strlen(e) + strlen(rest) + 64;
    char *body = malloc(len);
    snprintf(body, len, "{\"model\": \"m\", \"prompt_embeds\": \"%s\"%s}", e,
             rest);
    cinfer_status st = cinfer_openai_decode(body, strlen(body), 0, q);
    free(e);
    free(body);
    return st;
}

static void test_http_base64(void)
{
    const cinfer_request_fields *o = &cinfer_request_fields_openai;
    /* 2 rows of little-endian float32, whatever the host's order */
    uint8_t bytes[2 * W * 4];
    float want[2 * W];
    for (int i = 0; i < 2 * W; i++) {
        want[i] = (float)i - 7.25f;
        uint32_t u;
        memcpy(&u, &want[i], 4);
        for (int b = 0; b < 4; b++)
            bytes[4 * i + b] = (uint8_t)(u >> (8 * b));
    }
    cinfer_openai_req q;
    CHECK_OK(decode(bytes, sizeof bytes, "", &q));
    CHECK(q.d.has_embeds && q.d.n_embeds_values == 2 * W &&
          q.d.embeds_width == -1 && q.d.input == CINFER_INPUT_NONE);
    CHECK(q.d.embeds && memcmp(q.d.embeds, want, sizeof want) == 0);
    CHECK_OK(cinfer_request_validate(&q.d, &LIM, o));
    cinfer_openai_req_cleanup(&q);
    /* followed by a prompt; "" is no prompt */
    CHECK_OK(decode(bytes, sizeof bytes, ", \"prompt\": \"more\"", &q));
    CHECK(q.d.input == CINFER_INPUT_TEXT && strcmp(q.d.text, "more") == 0);
    cinfer_openai_req_cleanup(&q);
    CHECK_OK(decode(bytes, sizeof bytes, ", \"prompt\": \"\"", &q));
    CHECK(q.d.input == CINFER_INPUT_NONE);
    cinfer_openai_req_cleanup(&q);
    CHECK_OK(decode(bytes, sizeof bytes, ", \"prompt\": [1, 2]", &q));
    CHECK(q.d.input == CINFER_INPUT_IDS && q.d.n_ids == 2);
    cinfer_openai_req_cleanup(&q);

    /* a NaN by index */
    uint8_t nan_bytes[sizeof bytes];
    memcpy(nan_bytes, bytes, sizeof bytes);
    float nan = NAN;
    uint32_t u;
    memcpy(&u, &nan, 4);
    for (int b = 0; b < 4; b++)
        nan_bytes[4 * 9 + b] = (uint8_t)(u >> (8 * b));
    CHECK_OK(decode(nan_bytes, sizeof nan_bytes, "", &q));
    EXPECT_BAD(q.d, &LIM, o, "prompt_embeds[9]", "row 1, column 1");
    cinfer_openai_req_cleanup(&q);
    /* not a whole row: the width is the model's */
    CHECK_OK(decode(bytes, sizeof bytes - 4, "", &q));
    EXPECT_BAD(q.d, &LIM, o, "prompt_embeds", "15 values are not a whole");
    cinfer_openai_req_cleanup(&q);

    /* the decoder's own refusals, each naming the field */
    const char *bodies[] = {
        "{\"model\": \"m\", \"prompt_embeds\": 5}",
        "{\"model\": \"m\", \"prompt_embeds\": \"AAA*AAAA\"}",
        "{\"model\": \"m\", \"prompt_embeds\": \"AAAAAAA=\"}", /* 5 bytes */
        "{\"model\": \"m\", \"prompt_embeds\": \"A\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        CHECK_EQ_INT(cinfer_openai_decode(bodies[i], strlen(bodies[i]), 0, &q),
                     CINFER_E_INVALID_ARG);
        char param[64];
        cinfer_openai_error_param(cinfer_last_error(), param, sizeof param);
        CHECK_EQ_STR(param, "prompt_embeds");
    }
    /* torch.save's zip archive, and its legacy pickle */
    const uint8_t zip[8] = {'P', 'K', 3, 4, 0, 0, 0, 0};
    const uint8_t pickle[8] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46};
    CHECK_EQ_INT(decode(zip, sizeof zip, "", &q), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "torch.save") != NULL);
    CHECK_EQ_INT(decode(pickle, sizeof pickle, "", &q), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "torch.save") != NULL);
    /* chat completions do not take them */
    const char *chat = "{\"model\": \"m\", \"prompt_embeds\": \"AAAAAA==\", "
                       "\"messages\": [{\"role\": \"user\", "
                       "\"content\": \"x\"}]}";
    CHECK_EQ_INT(cinfer_openai_decode(chat, strlen(chat), 1, &q),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "prompt_embeds", 13) == 0);
    /* without them a prompt is still required */
    const char *none = "{\"model\": \"m\"}";
    CHECK_EQ_INT(cinfer_openai_decode(none, strlen(none), 0, &q),
                 CINFER_E_INVALID_ARG);
    CHECK(strncmp(cinfer_last_error(), "prompt is required", 18) == 0);
}

int main(void)
{
    RUN(test_checks_name_the_field);
    RUN(test_prompt_and_engine_params);
    RUN(test_grpc_message);
    RUN(test_http_base64);
    return harness_done();
}
#endif
