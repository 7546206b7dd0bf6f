/*
 * request.c - the generation request both front ends describe
 * (request.h).
 *
 * Every range check is written so that NaN fails it (each comparison with
 * NaN is false).
 */
#include "server/request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "server/json_schema.h"

const cinfer_request_fields cinfer_request_fields_grpc = {
    .text = "text",
    .ids = "token_ids.ids",
    .chat = "chat",
    .temperature = "sampling.temperature",
    .top_k = "sampling.top_k",
    .top_p = "sampling.top_p",
    .min_p = "sampling.min_p",
    .repetition_penalty = "sampling.repetition_penalty",
    .presence_penalty = "sampling.presence_penalty",
    .frequency_penalty = "sampling.frequency_penalty",
    .max_tokens = "stopping.max_tokens",
    .min_tokens = "stopping.min_tokens",
    .stop = "stopping.stop",
    .stop_token_ids = "stopping.stop_token_ids",
    .logprobs = "logprobs",
    .n = "n",
    .priority = "priority",
    .grammar = "grammar",
    .regex = "regex",
    .json_schema = "json_schema",
    .embeds = "prompt_embeds",
    .embeds_width = "prompt_embeds.width",
    .embeds_values = "prompt_embeds.values",
};

const cinfer_request_fields cinfer_request_fields_openai = {
    .text = "prompt",
    .ids = "prompt",
    .chat = "messages",
    .temperature = "temperature",
    .top_k = "top_k",
    .top_p = "top_p",
    .min_p = "min_p",
    .repetition_penalty = "repetition_penalty",
    .presence_penalty = "presence_penalty",
    .frequency_penalty = "frequency_penalty",
    .max_tokens = "max_tokens",
    .min_tokens = "min_tokens",
    .stop = "stop",
    .stop_token_ids = "stop_token_ids",
    .logprobs = "top_logprobs",
    .n = "n",
    .priority = "priority",
    .grammar = "grammar",
    .regex = "regex",
    .json_schema = "response_format.json_schema",
    .embeds = "prompt_embeds",
    .embeds_width = "prompt_embeds",
    .embeds_values = "prompt_embeds",
};

cinfer_gen_desc cinfer_gen_desc_init(void)
{
    cinfer_gen_desc d;
    memset(&d, 0, sizeof d);
    return d;
}

void cinfer_gen_desc_from_proto(const Cinfer__V1__GenerateRequest *r,
                                cinfer_gen_desc *d)
{
    *d = cinfer_gen_desc_init();
    switch (r->input_case) {
    case CINFER__V1__GENERATE_REQUEST__INPUT_TEXT:
        d->input = CINFER_INPUT_TEXT;
        d->text = r->text;
        break;
    case CINFER__V1__GENERATE_REQUEST__INPUT_TOKEN_IDS:
        d->input = CINFER_INPUT_IDS;
        d->ids = r->token_ids ? r->token_ids->ids : NULL;
        d->n_ids = r->token_ids ? r->token_ids->n_ids : 0;
        break;
    case CINFER__V1__GENERATE_REQUEST__INPUT_CHAT:
        d->input = CINFER_INPUT_CHAT;
        d->chat = r->chat;
        break;
    default:
        break;
    }
    const Cinfer__V1__SamplingParams *sp = r->sampling;
    if (sp) {
#define TAKE(f)                                                                \
    do {                                                                       \
        if (CINFER_PB_HAS(sp, f)) {                                            \
            d->has_##f = 1;                                                    \
            d->f = sp->f;                                                      \
        }                                                                      \
    } while (0)
        TAKE(temperature);
        TAKE(top_k);
        TAKE(top_p);
        TAKE(min_p);
        TAKE(repetition_penalty);
        TAKE(presence_penalty);
        TAKE(frequency_penalty);
        TAKE(seed);
#undef TAKE
    }
    const Cinfer__V1__StoppingCriteria *sc = r->stopping;
    if (sc) {
        if (CINFER_PB_HAS(sc, max_tokens)) {
            d->has_max_tokens = 1;
            d->max_tokens = sc->max_tokens;
        }
        if (CINFER_PB_HAS(sc, min_tokens)) {
            d->has_min_tokens = 1;
            d->min_tokens = sc->min_tokens;
        }
        if (CINFER_PB_HAS(sc, ignore_eos))
            d->ignore_eos = sc->ignore_eos;
        d->stop = (const char *const *)sc->stop;
        d->n_stop = sc->n_stop;
        d->stop_ids = sc->stop_token_ids;
        d->n_stop_ids = sc->n_stop_token_ids;
        if (CINFER_PB_HAS(sc, time_limit_ms))
            d->time_limit_ms = sc->time_limit_ms;
    }
    if (CINFER_PB_HAS(r, logprobs)) {
        d->has_logprobs = 1;
        d->logprobs = r->logprobs;
    }
    if (CINFER_PB_HAS(r, n)) {
        d->has_n = 1;
        d->n = r->n;
    }
    d->priority = r->priority;
    d->grammar = r->grammar;
    d->regex = r->regex;
    d->json_schema = r->json_schema;
    if (r->prompt_embeds) {
        d->has_embeds = 1;
        d->embeds = r->prompt_embeds->values;
        d->n_embeds_values = r->prompt_embeds->n_values;
        d->embeds_width = r->prompt_embeds->width;
    }
}

/* ---------------------------------------------------------------------- */
/* Validation                                                             */
/* ---------------------------------------------------------------------- */

int32_t cinfer_request_max_tokens(const cinfer_gen_desc *d,
                                  const cinfer_request_limits *lim)
{
    int32_t mt = lim->default_max_tokens > 0 ? lim->default_max_tokens : 256;
    if (d->has_max_tokens)
        mt = d->max_tokens;
    if (mt > lim->n_ctx)
        mt = lim->n_ctx;
    return mt;
}

static cinfer_status bad_range(const char *field, const char *range, double v)
{
    return cinfer_set_error(CINFER_E_INVALID_ARG, "%s must be in %s, got %.9g",
                            field, range, v);
}

static cinfer_status check_sampling(const cinfer_gen_desc *d,
                                    const cinfer_request_fields *f)
{
    char range[64];
    if (d->has_temperature &&
        !(d->temperature >= 0.0f && d->temperature <= CINFER_MAX_TEMPERATURE)) {
        snprintf(range, sizeof range, "[0, %g]",
                 (double)CINFER_MAX_TEMPERATURE);
        return bad_range(f->temperature, range, (double)d->temperature);
    }
    if (d->has_top_k && d->top_k < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be >= 0 (0 = off), got %d", f->top_k,
                                (int)d->top_k);
    if (d->has_top_p && !(d->top_p > 0.0f && d->top_p <= 1.0f))
        return bad_range(f->top_p, "(0, 1]", (double)d->top_p);
    if (d->has_min_p && !(d->min_p >= 0.0f && d->min_p <= 1.0f))
        return bad_range(f->min_p, "[0, 1]", (double)d->min_p);
    if (d->has_repetition_penalty &&
        !(d->repetition_penalty >= CINFER_MIN_REPETITION_PENALTY &&
          d->repetition_penalty <= CINFER_MAX_REPETITION_PENALTY)) {
        snprintf(range, sizeof range, "[%g, %g]",
                 (double)CINFER_MIN_REPETITION_PENALTY,
                 (double)CINFER_MAX_REPETITION_PENALTY);
        return bad_range(f->repetition_penalty, range,
                         (double)d->repetition_penalty);
    }
    if (d->has_presence_penalty &&
        !(d->presence_penalty >= -2.0f && d->presence_penalty <= 2.0f))
        return bad_range(f->presence_penalty, "[-2, 2]",
                         (double)d->presence_penalty);
    if (d->has_frequency_penalty &&
        !(d->frequency_penalty >= -2.0f && d->frequency_penalty <= 2.0f))
        return bad_range(f->frequency_penalty, "[-2, 2]",
                         (double)d->frequency_penalty);
    return CINFER_OK;
}

static cinfer_status check_ids(const int32_t *ids, size_t n, const char *field,
                               const cinfer_request_limits *lim)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= lim->n_vocab)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s[%zu] = %d is outside the vocabulary [0, %d)", field, i,
                (int)ids[i], (int)lim->n_vocab);
    return CINFER_OK;
}

static cinfer_status check_stopping(const cinfer_gen_desc *d,
                                    const cinfer_request_limits *lim,
                                    const cinfer_request_fields *f)
{
    if (d->has_max_tokens && (d->max_tokens < 1 || d->max_tokens > lim->n_ctx))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be in [1, %d] (the context length), "
                                "got %d",
                                f->max_tokens, (int)lim->n_ctx,
                                (int)d->max_tokens);
    int32_t mt = cinfer_request_max_tokens(d, lim);
    if (d->has_min_tokens && (d->min_tokens < 0 || d->min_tokens > mt))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be in [0, %d] (max_tokens), got %d",
                                f->min_tokens, (int)mt, (int)d->min_tokens);
    if (d->n_stop > CINFER_MAX_STOP_STRINGS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s has %zu strings, at most %d", f->stop,
                                d->n_stop, CINFER_MAX_STOP_STRINGS);
    for (size_t i = 0; i < d->n_stop; i++) {
        size_t n = d->stop[i] ? strlen(d->stop[i]) : 0;
        if (n == 0 || n > CINFER_MAX_STOP_BYTES)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s[%zu] must be 1..%d bytes, got %zu",
                                    f->stop, i, CINFER_MAX_STOP_BYTES, n);
    }
    if (d->n_stop_ids > CINFER_MAX_STOP_TOKEN_IDS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s has %zu ids, at most %d",
                                f->stop_token_ids, d->n_stop_ids,
                                CINFER_MAX_STOP_TOKEN_IDS);
    return check_ids(d->stop_ids, d->n_stop_ids, f->stop_token_ids, lim);
}

/* Prompt embeddings: the model takes them, the width, a whole number of
 * rows within the bounds, every value finite. */
static cinfer_status check_embeds(const cinfer_gen_desc *d,
                                  const cinfer_request_limits *lim,
                                  const cinfer_request_fields *f)
{
    if (!d->has_embeds)
        return CINFER_OK;
    const int32_t w = lim->n_embd;
    if (w <= 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: the served model does not take prompt "
                                "embeddings (its ranks span several "
                                "processes)",
                                f->embeds);
    if (d->embeds_width >= 0 && d->embeds_width != w)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be the model's embedding width %d, "
                                "got %d",
                                f->embeds_width, (int)w, (int)d->embeds_width);
    size_t n = d->n_embeds_values;
    if (n == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must hold at least one row of %d values",
                                f->embeds_values, (int)w);
    if (n % (size_t)w)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %zu values are not a whole number of "
                                "rows of %d (the model's embedding width)",
                                f->embeds_values, n, (int)w);
    if (n > CINFER_MAX_PROMPT_EMBEDS_BYTES / sizeof(float))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: %zu values are %zu bytes, at most %d",
                                f->embeds_values, n, n * sizeof(float),
                                CINFER_MAX_PROMPT_EMBEDS_BYTES);
    if (n / (size_t)w >= (size_t)lim->n_ctx)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s has %zu rows; the context holds %d "
                                "(prompt plus at least one generated token)",
                                f->embeds, n / (size_t)w, (int)lim->n_ctx);
    if (!d->embeds)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "%s has no values",
                                f->embeds_values);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(d->embeds[i]))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s[%zu] is not finite (%g; row %zu, "
                                    "column %zu)",
                                    f->embeds_values, i, (double)d->embeds[i],
                                    i / (size_t)w, i % (size_t)w);
    return CINFER_OK;
}

size_t cinfer_request_embed_rows(const cinfer_gen_desc *d,
                                 const cinfer_request_limits *lim)
{
    if (!d->has_embeds || lim->n_embd <= 0)
        return 0;
    return d->n_embeds_values / (size_t)lim->n_embd;
}

static cinfer_status check_input(const cinfer_gen_desc *d,
                                 const cinfer_request_limits *lim,
                                 const cinfer_request_fields *f)
{
    cinfer_status st = check_embeds(d, lim, f);
    if (st != CINFER_OK)
        return st;
    switch (d->input) {
    case CINFER_INPUT_TEXT:
        if ((!d->text || !d->text[0]) && d->has_embeds)
            return CINFER_OK; /* the embeddings are the whole prompt */
        if (!d->text || !d->text[0])
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s must not be empty", f->text);
        if (!cinfer_utf8_valid(d->text, strlen(d->text)))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s is not valid UTF-8", f->text);
        return CINFER_OK;
    case CINFER_INPUT_IDS:
        if (d->n_ids == 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s must not be empty", f->ids);
        if (d->n_ids >= (size_t)lim->n_ctx)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s has %zu tokens; the context holds %d (prompt plus at "
                "least one generated token)",
                f->ids, d->n_ids, (int)lim->n_ctx);
        return check_ids(d->ids, d->n_ids, f->ids, lim);
    case CINFER_INPUT_CHAT:
        if (!lim->chat_supported)
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "%s: the model has no chat template the server recognises "
                "(supported: ChatML, Llama 3, Llama 3.1/3.3, Qwen3, Gemma 3)",
                f->chat);
        if (!d->chat || d->chat->n_messages == 0)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s must not be empty", f->chat);
        if (d->chat->n_messages > CINFER_MAX_CHAT_MESSAGES)
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "%s has %zu entries, at most %d", f->chat,
                                    d->chat->n_messages,
                                    CINFER_MAX_CHAT_MESSAGES);
        return CINFER_OK;
    default:
        if (d->has_embeds)
            return CINFER_OK; /* the embeddings are the whole prompt */
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "input must be set (%s or %s)", f->text,
                                f->chat);
    }
}

cinfer_status cinfer_request_validate(const cinfer_gen_desc *d,
                                      const cinfer_request_limits *lim,
                                      const cinfer_request_fields *f)
{
    cinfer_status st = check_input(d, lim, f);
    if (st == CINFER_OK)
        st = check_sampling(d, f);
    if (st == CINFER_OK)
        st = check_stopping(d, lim, f);
    if (st != CINFER_OK)
        return st;
    if (d->has_logprobs &&
        (d->logprobs < 0 || d->logprobs > CINFER_MAX_LOGPROBS))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be in [0, %d], got %d", f->logprobs,
                                CINFER_MAX_LOGPROBS, (int)d->logprobs);
    if (d->has_n && (d->n < 1 || d->n > CINFER_MAX_SAMPLES))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be in [1, %d], got %d", f->n,
                                CINFER_MAX_SAMPLES, (int)d->n);
    if (d->priority < -CINFER_MAX_PRIORITY || d->priority > CINFER_MAX_PRIORITY)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s must be in [%d, %d], got %d", f->priority,
                                -CINFER_MAX_PRIORITY, CINFER_MAX_PRIORITY,
                                (int)d->priority);
    int has_g = d->grammar && d->grammar[0];
    int has_r = d->regex && d->regex[0];
    int has_j = d->json_schema && d->json_schema[0];
    if (has_g + has_r + has_j + (d->json_object != 0) > 1)
        /* named: the second one set, as a field name leads every error */
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: set at most one of %s, %s and %s",
                                has_g && has_r ? f->regex : f->json_schema,
                                f->grammar, f->regex, f->json_schema);
    if (has_g && strlen(d->grammar) > CINFER_GRAMMAR_MAX_SOURCE)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s is %zu bytes, at most %d", f->grammar,
                                strlen(d->grammar), CINFER_GRAMMAR_MAX_SOURCE);
    if (has_r && strlen(d->regex) > CINFER_GRAMMAR_MAX_SOURCE)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s is %zu bytes, at most %d", f->regex,
                                strlen(d->regex), CINFER_GRAMMAR_MAX_SOURCE);
    if (has_j && strlen(d->json_schema) > CINFER_GRAMMAR_MAX_SOURCE)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s is %zu bytes, at most %d", f->json_schema,
                                strlen(d->json_schema),
                                CINFER_GRAMMAR_MAX_SOURCE);
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Prompt, grammar, engine params                                         */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_request_encode_text(const cinfer_tokenizer *tk,
                                         const char *text, int add_special,
                                         int32_t **ids, size_t *n)
{
    size_t len = strlen(text);
    size_t cap = len + 4;
    int32_t *buf = malloc(cap * sizeof *buf);
    if (!buf)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenize: no memory");
    size_t got = 0;
    cinfer_status st =
        cinfer_tokenizer_encode(tk, text, len, add_special, 1, buf, cap, &got);
    if (st == CINFER_E_RANGE && got > cap) {
        int32_t *b2 = realloc(buf, got * sizeof *buf);
        if (!b2) {
            free(buf);
            return cinfer_set_error(CINFER_E_NOMEM, "tokenize: no memory");
        }
        buf = b2;
        cap = got;
        st = cinfer_tokenizer_encode(tk, text, len, add_special, 1, buf, cap,
                                     &got);
    }
    if (st != CINFER_OK) {
        free(buf);
        return st;
    }
    *ids = buf;
    *n = got;
    return CINFER_OK;
}

cinfer_status cinfer_request_encode(const cinfer_tokenizer *tk,
                                    const cinfer_chat_template *chat,
                                    const cinfer_gen_desc *d, int32_t **ids,
                                    size_t *n)
{
    switch (d->input) {
    case CINFER_INPUT_TEXT:
        /* after embeddings the text does not start the prompt: no BOS */
        return cinfer_request_encode_text(tk, d->text ? d->text : "",
                                          !d->has_embeds, ids, n);
    case CINFER_INPUT_CHAT:
        return cinfer_chat_encode(chat, tk, d->chat, ids, n);
    case CINFER_INPUT_IDS: {
        int32_t *p = malloc((d->n_ids ? d->n_ids : 1) * sizeof *p);
        if (!p)
            return cinfer_set_error(CINFER_E_NOMEM, "no memory");
        if (d->n_ids)
            memcpy(p, d->ids, d->n_ids * sizeof *p);
        *ids = p;
        *n = d->n_ids;
        return CINFER_OK;
    }
    case CINFER_INPUT_NONE:
        if (d->has_embeds) { /* no tokens after the embeddings */
            *ids = malloc(sizeof **ids);
            *n = 0;
            return *ids ? CINFER_OK
                        : cinfer_set_error(CINFER_E_NOMEM, "no memory");
        }
        return cinfer_set_error(CINFER_E_INVALID_ARG, "input must be set");
    default:
        return cinfer_set_error(CINFER_E_INVALID_ARG, "input must be set");
    }
}

cinfer_status cinfer_request_check_prompt(const cinfer_gen_desc *d,
                                          size_t n_prompt,
                                          const cinfer_request_limits *lim,
                                          const cinfer_request_fields *f)
{
    const char *field = d->input == CINFER_INPUT_CHAT  ? f->chat
                        : d->input == CINFER_INPUT_IDS ? f->ids
                                                       : f->text;
    size_t rows = cinfer_request_embed_rows(d, lim);
    if (rows && rows + n_prompt >= (size_t)lim->n_ctx)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "%s: %zu rows and the %s's %zu tokens are %zu prompt positions; "
            "the context holds %d (prompt plus at least one generated "
            "token)",
            f->embeds, rows, d->input == CINFER_INPUT_NONE ? "input" : field,
            n_prompt, rows + n_prompt, (int)lim->n_ctx);
    if (rows)
        return CINFER_OK; /* text after embeddings may tokenize to nothing */
    if (n_prompt == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "%s: tokenizes to no tokens", field);
    if (n_prompt >= (size_t)lim->n_ctx)
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "%s: the prompt is %zu tokens; the context holds %d (prompt plus "
            "at least one generated token)",
            field, n_prompt, (int)lim->n_ctx);
    return CINFER_OK;
}

cinfer_status cinfer_request_compile_grammar(const cinfer_gen_desc *d,
                                             const cinfer_request_fields *f,
                                             cinfer_grammar_cache *cache,
                                             cinfer_grammar_entry **out)
{
    *out = NULL;
    const char *field = NULL, *text = NULL;
    int kind = 0;
    cinfer_grammar_compile_fn fn = NULL;
    if (d->grammar && d->grammar[0]) {
        field = f->grammar;
        kind = CINFER_GRAMMAR_KIND_GBNF;
        text = d->grammar;
    } else if (d->regex && d->regex[0]) {
        field = f->regex;
        kind = CINFER_GRAMMAR_KIND_REGEX;
        text = d->regex;
    } else if (d->json_schema && d->json_schema[0]) {
        field = f->json_schema;
        kind = CINFER_GRAMMAR_KIND_JSON_SCHEMA;
        text = d->json_schema;
        fn = cinfer_json_schema_compile;
    } else if (d->json_object) {
        field = f->json_schema;
        kind = CINFER_GRAMMAR_KIND_GBNF;
        text = cinfer_json_object_gbnf();
    } else {
        return CINFER_OK;
    }
    cinfer_status st =
        cinfer_grammar_cache_get(cache, kind, text, strlen(text), fn, NULL, out);
    if (st == CINFER_OK)
        return CINFER_OK;
    *out = NULL;
    if (st == CINFER_E_NOMEM)
        return st;
    /* Whatever the compiler refused (syntax, a bound) is the client's. */
    char msg[512];
    const char *e = cinfer_last_error();
    static const char pre[] = "json_schema: ";
    if (kind == CINFER_GRAMMAR_KIND_JSON_SCHEMA &&
        strncmp(e, pre, sizeof pre - 1) == 0)
        e += sizeof pre - 1;
    snprintf(msg, sizeof msg, "%s", e);
    return cinfer_set_error(CINFER_E_INVALID_ARG, "%s: %s", field, msg);
}

void cinfer_request_to_engine(const cinfer_gen_desc *d,
                              const cinfer_request_limits *lim,
                              const int32_t *prompt, size_t n_prompt,
                              uint64_t seed, const cinfer_grammar *grammar,
                              cinfer_request_params *rp)
{
    *rp = cinfer_request_default_params();
    rp->prompt = prompt;
    rp->n_prompt = n_prompt;
    rp->n_prompt_embeds = cinfer_request_embed_rows(d, lim);
    rp->prompt_embeds = rp->n_prompt_embeds ? d->embeds : NULL;
    rp->sampling = cinfer_sampler_default_params();
    rp->sampling.n_vocab = lim->n_vocab;
    rp->sampling.seed = d->has_seed ? d->seed : seed;
    if (d->has_temperature)
        rp->sampling.temperature = d->temperature;
    if (d->has_top_k)
        rp->sampling.top_k = d->top_k;
    if (d->has_top_p)
        rp->sampling.top_p = d->top_p;
    if (d->has_min_p)
        rp->sampling.min_p = d->min_p;
    if (d->has_repetition_penalty)
        rp->sampling.repetition_penalty = d->repetition_penalty;
    if (d->has_presence_penalty)
        rp->sampling.presence_penalty = d->presence_penalty;
    if (d->has_frequency_penalty)
        rp->sampling.frequency_penalty = d->frequency_penalty;
    rp->logprobs = d->has_logprobs;
    rp->sampling.n_logprobs = d->has_logprobs ? d->logprobs : 0;
    rp->max_tokens = cinfer_request_max_tokens(d, lim);
    if (d->has_min_tokens)
        rp->min_tokens = d->min_tokens;
    rp->ignore_eos = d->ignore_eos;
    rp->stop = d->stop;
    rp->n_stop = d->n_stop;
    rp->stop_ids = d->stop_ids;
    rp->n_stop_ids = d->n_stop_ids;
    rp->n_samples = d->has_n ? d->n : 1;
    rp->priority = d->priority;
    rp->grammar = grammar;
}

/* ---------------------------------------------------------------------- */
/* Deadlines and refusals                                                 */
/* ---------------------------------------------------------------------- */

static int64_t add_sat(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b)
        return INT64_MAX;
    return a + b;
}

static int64_t ms_to_ns_sat(int64_t ms)
{
    if (ms > INT64_MAX / 1000000)
        return INT64_MAX;
    return ms * 1000000;
}

cinfer_request_deadline cinfer_request_deadline_of(int64_t start_ns,
                                                   int64_t call_deadline_ns,
                                                   int64_t max_request_time_ms,
                                                   uint32_t time_limit_ms)
{
    cinfer_request_deadline dl = {0, 0, 0};
    dl.hard_ns = call_deadline_ns > 0 ? call_deadline_ns : 0;
    if (max_request_time_ms > 0) {
        int64_t cap = add_sat(start_ns, ms_to_ns_sat(max_request_time_ms));
        if (!dl.hard_ns || cap < dl.hard_ns)
            dl.hard_ns = cap;
    }
    int64_t limit =
        time_limit_ms ? add_sat(start_ns, ms_to_ns_sat(time_limit_ms)) : 0;
    dl.engine_ns = limit;
    if (dl.hard_ns && (!limit || dl.hard_ns <= limit)) {
        dl.engine_ns = dl.hard_ns;
        dl.is_hard = 1;
    }
    return dl;
}

/* Pushback of the engine's fixed bounds (its queue bound, its stop). */
#define FIXED_PUSHBACK_MS 1000

cinfer_engine_refusal_map cinfer_request_map_refusal(cinfer_status st,
                                                     cinfer_engine_refusal kind,
                                                     int64_t retry_ns,
                                                     int64_t max_retry_ms)
{
    cinfer_engine_refusal_map m = {0, CINFER_REJECT_NONE, st, 0};
    if (max_retry_ms < 1)
        max_retry_ms = 1;
    int64_t ms = retry_ns > INT64_MAX - 999999 ? INT64_MAX / 1000000
                                              : (retry_ns + 999999) / 1000000;
    if (ms < 1)
        ms = 1;
    if (ms > max_retry_ms)
        ms = max_retry_ms;
    switch (st) {
    case CINFER_E_TIMEOUT:
        m.load = 1;
        m.reason = CINFER_REJECT_SHED_DEADLINE;
        m.retry_after_ms = ms;
        break;
    case CINFER_E_UNAVAILABLE:
        m.load = 1;
        if (kind == CINFER_ENGINE_REFUSAL_QUEUE_WAIT) {
            m.reason = CINFER_REJECT_SHED_QUEUE_WAIT;
            m.retry_after_ms = ms;
        } else if (kind == CINFER_ENGINE_REFUSAL_FIRST_TOKEN) {
            m.reason = CINFER_REJECT_SHED_FIRST_TOKEN;
            m.retry_after_ms = ms;
        } else {
            m.reason = CINFER_REJECT_DRAINING;
            m.retry_after_ms = FIXED_PUSHBACK_MS;
        }
        break;
    case CINFER_E_EXHAUSTED:
        m.load = 1;
        m.reason = CINFER_REJECT_SHED_QUEUE_FULL;
        m.retry_after_ms = FIXED_PUSHBACK_MS;
        break;
    default:
        break;
    }
    return m;
}

void cinfer_request_reject_message(cinfer_reject r, int64_t retry_ms,
                                   const char *client, char *buf, size_t n)
{
    const char *what = "overloaded";
    switch (r) {
    case CINFER_REJECT_RATE_LIMITED_GLOBAL:
        what = "rate limited: the server's request rate limit is exceeded";
        break;
    case CINFER_REJECT_RATE_LIMITED_CLIENT:
        snprintf(buf, n,
                 "rate limited: client %.128s exceeds its request rate "
                 "limit; retry in %lld ms",
                 client ? client : "?", (long long)retry_ms);
        return;
    case CINFER_REJECT_BREAKER_OPEN:
        what = "the server is failing: circuit breaker open";
        break;
    case CINFER_REJECT_SHED_QUEUE_FULL:
        what = "overloaded: the request queue is full";
        break;
    case CINFER_REJECT_SHED_TOKENS:
        what = "overloaded: the queued tokens exceed the limit";
        break;
    case CINFER_REJECT_SHED_DEADLINE:
        what = "deadline exceeded: the request can not start before its "
               "deadline";
        break;
    case CINFER_REJECT_SHED_CODEL:
        what = "overloaded: requests wait longer than the queue target";
        break;
    case CINFER_REJECT_SHED_KV_PRESSURE:
        what = "overloaded: the KV cache is full";
        break;
    case CINFER_REJECT_SHED_FIRST_TOKEN:
        what = "overloaded: the first token would come too late";
        break;
    case CINFER_REJECT_SHED_QUEUE_WAIT:
        what = "overloaded: the wait for a turn would be too long";
        break;
    case CINFER_REJECT_DRAINING:
        what = "the server is shutting down";
        break;
    default:
        break;
    }
    snprintf(buf, n, "%s; retry in %lld ms", what, (long long)retry_ms);
}
