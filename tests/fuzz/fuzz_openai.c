/*
 * fuzz_openai.c - libFuzzer target for the OpenAI-compatible API's request
 * decoding and validation (server/openai.c, then server/request.c with the
 * OpenAI field names) and its error bodies.
 *
 * Input: one selector byte (bit 0: a chat completion rather than a
 * completion), then the body. A body either decodes or fails with
 * CINFER_E_INVALID_ARG and a message; a decoded one either validates or
 * fails with a message whose param (the field it names) is one the API
 * has; a valid one maps onto engine params in range (max_tokens in
 * [1, n_ctx], samples in [1, 16], logprobs in [0, 20], every stop id in
 * the vocabulary). Every error message makes an error body that parses
 * back. Never a crash (ASan and UBSan watch), never a leak.
 */
#include <math.h>
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

#include "server/openai.h"
#include "server/request.h"

#define FUZZ_ASSERT(c)                                                         \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_openai: %s failed (%s:%d)\n", #c,          \
                    __FILE__, __LINE__);                                       \
            abort();                                                           \
        }                                                                      \
    } while (0)

static const cinfer_request_limits LIM = {
    .n_vocab = 49152,
    .n_ctx = 8192,
    .chat_supported = 1,
    .default_max_tokens = 256,
    .n_embd = 8, /* prompt_embeds' rows: 8 values */
};

/* The fields an error may name. */
static const char *const PARAMS[] = {
    "",           "model",          "prompt",       "messages",
    "temperature", "top_p",         "top_k",        "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty",
    "seed",       "max_tokens",     "max_completion_tokens", "min_tokens",
    "stop",       "stop_token_ids", "logprobs",     "top_logprobs",
    "n",          "priority",       "user",         "stream",
    "stream_options.include_usage", "stream_options", "ignore_eos",
    "grammar",    "regex",          "messages[0].role",
    "prompt_embeds",
};

static void check_message(const char *msg)
{
    char param[64];
    cinfer_openai_error_param(msg, param, sizeof param);
    int known = 0;
    for (size_t i = 0; i < sizeof PARAMS / sizeof *PARAMS; i++)
        known |= strcmp(param, PARAMS[i]) == 0 ||
                 strncmp(param, "messages", 8) == 0;
    if (!known)
        fprintf(stderr, "fuzz_openai: unknown param \"%s\" in \"%s\"\n",
                param, msg);
    FUZZ_ASSERT(known);
    char *body = cinfer_openai_error_json(msg, "invalid_request_error", param,
                                          NULL);
    /* jansson refuses a message that is not UTF-8; none of ours is. */
    FUZZ_ASSERT(body != NULL);
    json_t *j = json_loads(body, 0, NULL);
    FUZZ_ASSERT(j && json_is_object(json_object_get(j, "error")));
    json_decref(j);
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int chat = data[0] & 1;
    cinfer_openai_req r;
    cinfer_status st =
        cinfer_openai_decode((const char *)data + 1, size - 1, chat, &r);
    if (st != CINFER_OK) {
        FUZZ_ASSERT(st == CINFER_E_INVALID_ARG || st == CINFER_E_NOMEM);
        FUZZ_ASSERT(r.root == NULL);
        if (st == CINFER_E_INVALID_ARG)
            check_message(cinfer_last_error());
        return 0;
    }
    st = cinfer_request_validate(&r.d, &LIM, &cinfer_request_fields_openai);
    if (st != CINFER_OK) {
        FUZZ_ASSERT(st == CINFER_E_INVALID_ARG);
        check_message(cinfer_last_error());
    } else {
        int32_t prompt[1] = {1};
        cinfer_request_params rp;
        cinfer_request_to_engine(&r.d, &LIM, prompt, 1, 0, NULL, &rp);
        FUZZ_ASSERT(rp.max_tokens >= 1 && rp.max_tokens <= LIM.n_ctx);
        FUZZ_ASSERT(rp.n_samples >= 1 && rp.n_samples <= CINFER_MAX_SAMPLES);
        FUZZ_ASSERT(rp.sampling.n_logprobs >= 0 &&
                    rp.sampling.n_logprobs <= CINFER_MAX_LOGPROBS);
        for (size_t i = 0; i < rp.n_stop_ids; i++)
            FUZZ_ASSERT(rp.stop_ids[i] >= 0 && rp.stop_ids[i] < LIM.n_vocab);
        for (size_t i = 0; i < rp.n_stop; i++)
            FUZZ_ASSERT(rp.stop[i] && rp.stop[i][0]);
        if (r.d.input == CINFER_INPUT_CHAT)
            FUZZ_ASSERT(r.d.chat && r.d.chat->n_messages >= 1);
        /* whole rows, fewer than the context, all finite */
        FUZZ_ASSERT(rp.n_prompt_embeds * (size_t)LIM.n_embd ==
                    (r.d.has_embeds ? r.d.n_embeds_values : 0));
        FUZZ_ASSERT(rp.n_prompt_embeds < (size_t)LIM.n_ctx);
        for (size_t i = 0; i < rp.n_prompt_embeds * (size_t)LIM.n_embd; i++)
            FUZZ_ASSERT(isfinite(rp.prompt_embeds[i]));
    }
    cinfer_openai_req_cleanup(&r);
    return 0;
}
#endif
