/*
 * fuzz_request.c - libFuzzer target for the server's request decoding and
 * validation (server/wire.c's checks and merges before protobuf-c unpacks,
 * then server/validate.c), the reflection codec and the chat template
 * recogniser.
 *
 * Input: one selector byte, then the message bytes.
 *   0  GenerateRequest    unpack; validate; a valid request's numbers are
 *                         in range (max_tokens in [1, n_ctx], every id in
 *                         the vocabulary, sampling fields in their ranges)
 *   1  TokenizeRequest    unpack; validate
 *   2  DetokenizeRequest  unpack; validate; valid ids are in the vocabulary
 *   3  ServerReflectionRequest
 *                         answered from the real descriptor set; the
 *                         answer decodes as a ServerReflectionResponse
 *   4  chat template text recognised; a default system text is only
 *                         found in a ChatML template and never holds a
 *                         quote, brace or backslash
 *   5  UTF-8 sanitising: the output is valid UTF-8 and valid input passes
 *                         unchanged
 * Every failure is a status with a message, never a crash (ASan and UBSan
 * watch), and every message names a field when validation fails.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CINFER_HAVE_SERVER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)data;
    (void)size;
    return 0;
}
#else

#include "grpc/reflection/v1/reflection.pb-c.h"
#include "proto/descriptor_set.h"
#include "server/chat.h"
#include "server/reflection_index.h"
#include "server/validate.h"
#include "server/wire.h"

#define FUZZ_ASSERT(c)                                                         \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_request: %s failed (%s:%d)\n", #c,         \
                    __FILE__, __LINE__);                                       \
            abort();                                                           \
        }                                                                      \
    } while (0)

static const cinfer_request_limits LIM = {
    .n_vocab = 49152,
    .n_ctx = 8192,
    .chat_supported = 1,
    .default_max_tokens = 256,
};

static void check_message(cinfer_status st)
{
    if (st != CINFER_OK) {
        FUZZ_ASSERT(st == CINFER_E_INVALID_ARG);
        FUZZ_ASSERT(cinfer_last_error()[0] != '\0');
    }
}

/* The server's own decoding (server/wire.c): refused with a message, or
 * unpacked; a message protobuf-c alone takes is never refused unless a
 * string holds NUL or bad UTF-8 (wire.c is stricter, never looser). */
static ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc,
                                     const uint8_t *d, size_t n)
{
    ProtobufCMessage *m = NULL;
    cinfer_status st = cinfer_wire_unpack(desc, d, n, &m);
    if (st != CINFER_OK) {
        FUZZ_ASSERT(m == NULL);
        FUZZ_ASSERT(st == CINFER_E_INVALID_ARG || st == CINFER_E_NOMEM);
        FUZZ_ASSERT(cinfer_last_error()[0] != '\0');
        ProtobufCMessage *plain = protobuf_c_message_unpack(desc, NULL, n, d);
        if (plain) {
            FUZZ_ASSERT(strstr(cinfer_last_error(), "NUL") ||
                        strstr(cinfer_last_error(), "UTF-8") ||
                        strstr(cinfer_last_error(), "does not decode"));
            protobuf_c_message_free_unpacked(plain, NULL);
        }
    }
    return m;
}

static void fuzz_generate(const uint8_t *d, size_t n)
{
    Cinfer__V1__GenerateRequest *r = (Cinfer__V1__GenerateRequest *)wire_unpack(
        &cinfer__v1__generate_request__descriptor, d, n);
    if (!r)
        return;
    cinfer_request_limits lim = LIM;
    for (int chat = 0; chat < 2; chat++) {
        lim.chat_supported = chat;
        cinfer_status st = cinfer_validate_generate(r, &lim);
        check_message(st);
        if (st != CINFER_OK)
            continue;
        int32_t mt = cinfer_validate_max_tokens(r, &lim);
        FUZZ_ASSERT(mt >= 1 && mt <= lim.n_ctx);
        /* no input only with prompt embeddings, the whole prompt then */
        FUZZ_ASSERT(r->input_case !=
                        CINFER__V1__GENERATE_REQUEST__INPUT__NOT_SET ||
                    r->prompt_embeds);
        if (r->input_case == CINFER__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS) {
            FUZZ_ASSERT(r->token_ids->n_ids >= 1);
            FUZZ_ASSERT(r->token_ids->n_ids < (size_t)lim.n_ctx);
            for (size_t i = 0; i < r->token_ids->n_ids; i++)
                FUZZ_ASSERT(r->token_ids->ids[i] >= 0 &&
                            r->token_ids->ids[i] < lim.n_vocab);
        }
        if (r->input_case == CINFER__V1__GENERATE_REQUEST__INPUT_CHAT)
            FUZZ_ASSERT(chat && r->chat->n_messages >= 1);
        if (r->sampling) {
            const Cinfer__V1__SamplingParams *s = r->sampling;
            if (CINFER_PB_HAS(s, temperature))
                FUZZ_ASSERT(s->temperature >= 0.0f &&
                            s->temperature <= CINFER_MAX_TEMPERATURE);
            if (CINFER_PB_HAS(s, top_p))
                FUZZ_ASSERT(s->top_p > 0.0f && s->top_p <= 1.0f);
            if (CINFER_PB_HAS(s, min_p))
                FUZZ_ASSERT(s->min_p >= 0.0f && s->min_p <= 1.0f);
            if (CINFER_PB_HAS(s, top_k))
                FUZZ_ASSERT(s->top_k >= 0);
            if (CINFER_PB_HAS(s, repetition_penalty))
                FUZZ_ASSERT(s->repetition_penalty >=
                                CINFER_MIN_REPETITION_PENALTY &&
                            s->repetition_penalty <=
                                CINFER_MAX_REPETITION_PENALTY);
        }
        if (r->stopping) {
            FUZZ_ASSERT(r->stopping->n_stop <= CINFER_MAX_STOP_STRINGS);
            for (size_t i = 0; i < r->stopping->n_stop_token_ids; i++)
                FUZZ_ASSERT(r->stopping->stop_token_ids[i] >= 0 &&
                            r->stopping->stop_token_ids[i] < lim.n_vocab);
        }
        FUZZ_ASSERT(cinfer_request_id_ok(r->request_id));
    }
    cinfer__v1__generate_request__free_unpacked(r, NULL);
}

static void fuzz_tokenize(const uint8_t *d, size_t n)
{
    Cinfer__V1__TokenizeRequest *r = (Cinfer__V1__TokenizeRequest *)wire_unpack(
        &cinfer__v1__tokenize_request__descriptor, d, n);
    if (!r)
        return;
    check_message(cinfer_validate_tokenize(r, &LIM));
    cinfer__v1__tokenize_request__free_unpacked(r, NULL);
}

static void fuzz_detokenize(const uint8_t *d, size_t n)
{
    Cinfer__V1__DetokenizeRequest *r =
        cinfer__v1__detokenize_request__unpack(NULL, n, d);
    if (!r)
        return;
    cinfer_status st = cinfer_validate_detokenize(r, &LIM);
    check_message(st);
    if (st == CINFER_OK)
        for (size_t i = 0; i < r->n_token_ids; i++)
            FUZZ_ASSERT(r->token_ids[i] >= 0 && r->token_ids[i] < LIM.n_vocab);
    cinfer__v1__detokenize_request__free_unpacked(r, NULL);
}

static void fuzz_reflection(const uint8_t *d, size_t n)
{
    static cinfer_refl_index *ix;
    if (!ix)
        FUZZ_ASSERT(cinfer_refl_index_create(cinfer_proto_descriptor_set,
                                             cinfer_proto_descriptor_set_len,
                                             &ix) == CINFER_OK);
    uint8_t *out = NULL;
    size_t out_len = 0;
    cinfer_status st = cinfer_refl_answer(ix, d, n, &out, &out_len);
    if (st != CINFER_OK) {
        FUZZ_ASSERT(st == CINFER_E_INVALID_ARG && out == NULL);
        return;
    }
    Grpc__Reflection__V1__ServerReflectionResponse *r =
        grpc__reflection__v1__server_reflection_response__unpack(NULL, out_len,
                                                                 out);
    FUZZ_ASSERT(r != NULL);
    FUZZ_ASSERT(r->message_response_case !=
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE__NOT_SET);
    grpc__reflection__v1__server_reflection_response__free_unpacked(r, NULL);
    free(out);
}

static void fuzz_template(const uint8_t *d, size_t n)
{
    cinfer_chat_template t;
    FUZZ_ASSERT(cinfer_chat_template_detect(&t, (const char *)d, n) ==
                CINFER_OK);
    if (t.default_system) {
        FUZZ_ASSERT(t.format == CINFER_CHAT_CHATML);
        FUZZ_ASSERT(strpbrk(t.default_system, "'\"{}\\") == NULL);
    }
    cinfer_chat_template_cleanup(&t);
}

static void fuzz_utf8(const uint8_t *d, size_t n)
{
    char *out = malloc(3 * n + 1);
    FUZZ_ASSERT(out != NULL);
    size_t k = cinfer_utf8_sanitize((const char *)d, n, out);
    FUZZ_ASSERT(k <= 3 * n);
    FUZZ_ASSERT(cinfer_utf8_valid(out, k));
    if (cinfer_utf8_valid((const char *)d, n))
        FUZZ_ASSERT(k == n && memcmp(out, d, n) == 0);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    switch (data[0] % 6) {
    case 0: fuzz_generate(d, n); break;
    case 1: fuzz_tokenize(d, n); break;
    case 2: fuzz_detokenize(d, n); break;
    case 3: fuzz_reflection(d, n); break;
    case 4: fuzz_template(d, n); break;
    case 5: fuzz_utf8(d, n); break;
    }
    cinfer_clear_error();
    return 0;
}
#endif
