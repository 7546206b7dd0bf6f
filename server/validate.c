/*
 * validate.c - field-by-field validation of decoded requests (validate.h).
 *
 * Field paths in messages follow the proto's JSON-less field names
 * ("stopping.stop[2]"), so a client can find the field from the message
 * alone. Float fields are also checked for NaN: every comparison with NaN is
 * false, so each range check is written to fail for it.
 */
#include "server/validate.h"

#include <string.h>

/* ---------------------------------------------------------------------- */
/* UTF-8                                                                  */
/* ---------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 if the bytes
 * there do not start one. `*bad` is then the length of the maximal
 * ill-formed subpart (>= 1), the unit replaced by one U+FFFD. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned char c = s[0];
    *bad = 1;
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0; /* no overlongs */
        if (c == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F; /* <= U+10FFFF */
    } else {
        return 0;
    }
    for (size_t i = 1; i < len; i++) {
        if (i >= n)
            return 0;
        unsigned char b = s[i];
        unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h)
            return 0;
        *bad = i + 1;
    }
    return len;
}

size_t cinfer_utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t bad;
        size_t k = utf8_seq(p + i, len - i, &bad);
        if (k == 0)
            return i;
        i += k;
    }
    return len;
}

int cinfer_utf8_valid(const char *s, size_t len)
{
    return cinfer_utf8_valid_prefix(s, len) == len;
}

size_t cinfer_utf8_sanitize(const char *src, size_t len, char *dst)
{
    const unsigned char *p = (const unsigned char *)src;
    size_t i = 0, o = 0;
    while (i < len) {
        size_t bad;
        size_t k = utf8_seq(p + i, len - i, &bad);
        if (k) {
            memcpy(dst + o, src + i, k);
            o += k;
            i += k;
        } else {
            /* bad is the maximal ill-formed subpart: the lead byte and
             * the continuation bytes that were still acceptable. */
            size_t skip = bad;
            dst[o++] = (char)0xEF;
            dst[o++] = (char)0xBF;
            dst[o++] = (char)0xBD;
            i += skip;
        }
    }
    return o;
}

/* ---------------------------------------------------------------------- */
/* Shared pieces                                                          */
/* ---------------------------------------------------------------------- */

static cinfer_status check_ids(const int32_t *ids, size_t n,
                               const char *field,
                               const cinfer_request_limits *lim)
{
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= lim->n_vocab)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s[%zu] = %d is outside the vocabulary [0, %d)", field, i,
                (int)ids[i], (int)lim->n_vocab);
    }
    return CINFER_OK;
}

static cinfer_status check_chat(const Cinfer__V1__Chat *chat,
                                const char *field,
                                const cinfer_request_limits *lim)
{
    if (!lim->chat_supported)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "%s: the model has no chat template the server recognises "
            "(supported: ChatML, Llama 3, Llama 3.1/3.3, Qwen3, Gemma 3); "
            "send text or token_ids",
            field);
    if (chat->n_messages == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s.messages must not be empty", field);
    if (chat->n_messages > CINFER_MAX_CHAT_MESSAGES)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s.messages has %zu entries, at most %d",
                                field, chat->n_messages,
                                CINFER_MAX_CHAT_MESSAGES);
    for (size_t i = 0; i < chat->n_messages; i++) {
        const Cinfer__V1__ChatMessage *m = chat->messages[i];
        const char *role = m->role ? m->role : "";
        size_t rl = strlen(role);
        if (rl == 0)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s.messages[%zu].role must not be empty", field, i);
        if (rl > CINFER_MAX_ROLE_BYTES)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s.messages[%zu].role is %zu bytes, at most %d", field, i,
                rl, CINFER_MAX_ROLE_BYTES);
        for (size_t k = 0; k < rl; k++) {
            unsigned char c = (unsigned char)role[k];
            /* A role is one word: anything that could open or close a
             * template marker or a line is refused. */
            if (c <= 0x20 || c == 0x7f || c == '<' || c == '>' || c == '|')
                return cinfer_set_error(
                    CINFER_E_INVALID_ARG,
                    "%s.messages[%zu].role must be one word without "
                    "spaces, control characters or <|>",
                    field, i);
        }
        if (!cinfer_utf8_valid(role, rl))
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s.messages[%zu].role is not valid UTF-8", field, i);
        if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
            strcmp(role, "assistant") != 0)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s.messages[%zu].role must be system, user or assistant, "
                "got \"%s\"",
                field, i, role);
    }
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Generate                                                               */
/* ---------------------------------------------------------------------- */

int32_t cinfer_validate_max_tokens(const Cinfer__V1__GenerateRequest *r,
                                   const cinfer_request_limits *lim)
{
    int32_t mt = lim->default_max_tokens > 0 ? lim->default_max_tokens : 256;
    if (r->stopping && CINFER_PB_HAS(r->stopping, max_tokens))
        mt = r->stopping->max_tokens;
    if (mt > lim->n_ctx)
        mt = lim->n_ctx;
    return mt;
}

static cinfer_status check_sampling(const Cinfer__V1__SamplingParams *s)
{
    if (CINFER_PB_HAS(s, temperature) &&
        !(s->temperature >= 0.0f && s->temperature <= CINFER_MAX_TEMPERATURE))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.temperature must be in [0, %g], "
                                "got %.9g",
                                (double)CINFER_MAX_TEMPERATURE,
                                (double)s->temperature);
    if (CINFER_PB_HAS(s, top_k) && s->top_k < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.top_k must be >= 0 (0 = off), "
                                "got %d",
                                (int)s->top_k);
    if (CINFER_PB_HAS(s, top_p) && !(s->top_p > 0.0f && s->top_p <= 1.0f))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.top_p must be in (0, 1], got %.9g",
                                (double)s->top_p);
    if (CINFER_PB_HAS(s, min_p) && !(s->min_p >= 0.0f && s->min_p <= 1.0f))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.min_p must be in [0, 1], got %.9g",
                                (double)s->min_p);
    if (CINFER_PB_HAS(s, repetition_penalty) &&
        !(s->repetition_penalty >= CINFER_MIN_REPETITION_PENALTY &&
          s->repetition_penalty <= CINFER_MAX_REPETITION_PENALTY))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.repetition_penalty must be in "
                                "[%g, %g], got %.9g",
                                (double)CINFER_MIN_REPETITION_PENALTY,
                                (double)CINFER_MAX_REPETITION_PENALTY,
                                (double)s->repetition_penalty);
    if (CINFER_PB_HAS(s, presence_penalty) &&
        !(s->presence_penalty >= -2.0f && s->presence_penalty <= 2.0f))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.presence_penalty must be in "
                                "[-2, 2], got %.9g",
                                (double)s->presence_penalty);
    if (CINFER_PB_HAS(s, frequency_penalty) &&
        !(s->frequency_penalty >= -2.0f && s->frequency_penalty <= 2.0f))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "sampling.frequency_penalty must be in "
                                "[-2, 2], got %.9g",
                                (double)s->frequency_penalty);
    return CINFER_OK;
}

static cinfer_status check_stopping(const Cinfer__V1__StoppingCriteria *s,
                                    const cinfer_request_limits *lim,
                                    int32_t max_tokens)
{
    if (CINFER_PB_HAS(s, max_tokens) &&
        (s->max_tokens < 1 || s->max_tokens > lim->n_ctx))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stopping.max_tokens must be in [1, %d] "
                                "(the context length), got %d",
                                (int)lim->n_ctx, (int)s->max_tokens);
    if (CINFER_PB_HAS(s, min_tokens) &&
        (s->min_tokens < 0 || s->min_tokens > max_tokens))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stopping.min_tokens must be in [0, %d] "
                                "(max_tokens), got %d",
                                (int)max_tokens, (int)s->min_tokens);
    if (s->n_stop > CINFER_MAX_STOP_STRINGS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stopping.stop has %zu strings, at most %d",
                                s->n_stop, CINFER_MAX_STOP_STRINGS);
    for (size_t i = 0; i < s->n_stop; i++) {
        size_t n = s->stop[i] ? strlen(s->stop[i]) : 0;
        if (n == 0 || n > CINFER_MAX_STOP_BYTES)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "stopping.stop[%zu] must be 1..%d "
                                    "bytes, got %zu",
                                    i, CINFER_MAX_STOP_BYTES, n);
    }
    if (s->n_stop_token_ids > CINFER_MAX_STOP_TOKEN_IDS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stopping.stop_token_ids has %zu ids, at "
                                "most %d",
                                s->n_stop_token_ids,
                                CINFER_MAX_STOP_TOKEN_IDS);
    cinfer_status st = check_ids(s->stop_token_ids, s->n_stop_token_ids,
                                 "stopping.stop_token_ids", lim);
    if (st != CINFER_OK)
        return st;
    if (CINFER_PB_HAS(s, time_limit_ms) && s->time_limit_ms == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "stopping.time_limit_ms must be > 0 "
                                "(leave it unset for no limit)");
    return CINFER_OK;
}

static cinfer_status check_request_id(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n > CINFER_MAX_REQUEST_ID_BYTES)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "request_id is %zu bytes, at most %d", n,
                                CINFER_MAX_REQUEST_ID_BYTES);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)id[i];
        if (c < 0x21 || c > 0x7e)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "request_id must be printable ASCII "
                                    "without spaces (byte %zu is 0x%02x)",
                                    i, c);
    }
    return CINFER_OK;
}

int cinfer_request_id_ok(const char *id)
{
    /* Same rule as check_request_id, without touching the error text (the
     * caller may be reporting another field's error). */
    size_t n = id ? strlen(id) : 0;
    if (n > CINFER_MAX_REQUEST_ID_BYTES)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)id[i] < 0x21 || (unsigned char)id[i] > 0x7e)
            return 0;
    return 1;
}

cinfer_status cinfer_validate_generate(const Cinfer__V1__GenerateRequest *r,
                                       const cinfer_request_limits *lim)
{
    cinfer_status st = check_request_id(r->request_id);
    if (st != CINFER_OK)
        return st;
    switch (r->input_case) {
    case CINFER__V1__GENERATE_REQUEST__INPUT_TEXT:
        if ((!r->text || !r->text[0]) && !r->prompt_embeds)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "text must not be empty");
        break;
    case CINFER__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS:
        if (!r->token_ids || r->token_ids->n_ids == 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "token_ids.ids must not be empty");
        if (r->token_ids->n_ids >= (size_t)lim->n_ctx)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "token_ids.ids has %zu tokens; the context holds %d "
                "(prompt plus at least one generated token)",
                r->token_ids->n_ids, (int)lim->n_ctx);
        st = check_ids(r->token_ids->ids, r->token_ids->n_ids,
                       "token_ids.ids", lim);
        if (st != CINFER_OK)
            return st;
        break;
    case CINFER__V1__GENERATE_REQUEST__INPUT_CHAT:
        st = check_chat(r->chat, "chat", lim);
        if (st != CINFER_OK)
            return st;
        break;
    default:
        if (r->prompt_embeds)
            break; /* the embeddings are the whole prompt (request.c) */
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "input must be set (text, token_ids or "
                                "chat)");
    }
    if (r->sampling) {
        st = check_sampling(r->sampling);
        if (st != CINFER_OK)
            return st;
    }
    int32_t mt = cinfer_validate_max_tokens(r, lim);
    if (r->stopping) {
        st = check_stopping(r->stopping, lim, mt);
        if (st != CINFER_OK)
            return st;
    }
    if (CINFER_PB_HAS(r, logprobs) &&
        (r->logprobs < 0 || r->logprobs > CINFER_MAX_LOGPROBS))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "logprobs must be in [0, %d], got %d",
                                CINFER_MAX_LOGPROBS, (int)r->logprobs);
    if (r->priority < -CINFER_MAX_PRIORITY ||
        r->priority > CINFER_MAX_PRIORITY)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "priority must be in [%d, %d], got %d",
                                -CINFER_MAX_PRIORITY, CINFER_MAX_PRIORITY,
                                (int)r->priority);
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Tokenize / Detokenize                                                  */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_validate_tokenize(const Cinfer__V1__TokenizeRequest *r,
                                       const cinfer_request_limits *lim)
{
    switch (r->input_case) {
    case CINFER__V1__TOKENIZE_REQUEST__INPUT_TEXT:
        /* Empty text is fine here: it tokenizes to nothing (or BOS). */
        return CINFER_OK;
    case CINFER__V1__TOKENIZE_REQUEST__INPUT_CHAT:
        return check_chat(r->chat, "chat", lim);
    default:
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "input must be set (text or chat)");
    }
}

cinfer_status
cinfer_validate_detokenize(const Cinfer__V1__DetokenizeRequest *r,
                           const cinfer_request_limits *lim)
{
    if (r->n_token_ids > (size_t)lim->n_ctx)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "token_ids has %zu ids, at most %d (the "
                                "context length)",
                                r->n_token_ids, (int)lim->n_ctx);
    return check_ids(r->token_ids, r->n_token_ids, "token_ids", lim);
}
