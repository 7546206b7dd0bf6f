/*
 * request.h - the generation request both front ends describe: its fields
 * checked, mapped onto the engine's request params, its deadline, and the
 * mapping of an engine refusal to a rejection reason.
 *
 * A front end (gRPC's Generate, the OpenAI-compatible HTTP API) decodes its
 * own wire format into a cinfer_gen_desc, which borrows the decoded
 * strings and arrays, and names its own fields in a cinfer_request_fields
 * table, so that one check says "sampling.top_p must be in (0, 1]" on gRPC
 * and "top_p must be in (0, 1]" on HTTP:
 *
 *     cinfer_gen_desc d = cinfer_gen_desc_init();
 *     d.input = CINFER_INPUT_TEXT; d.text = "Once upon a time";
 *     d.has_temperature = 1; d.temperature = 0;
 *     if (cinfer_request_validate(&d, &lim, &cinfer_request_fields_openai)
 *         != CINFER_OK) ...400 with cinfer_last_error()
 *     cinfer_request_encode(tk, &chat, &d, &ids, &n);     // the prompt
 *     cinfer_request_check_prompt(&d, n, &lim, fields);   // fits the context
 *     cinfer_request_compile_grammar(&d, fields, cache, &gram); // NULL = none
 *     cinfer_request_params rp;
 *     cinfer_request_to_engine(&d, &lim, ids, n, seed, gram, &rp);
 *     cinfer_request_deadline dl = cinfer_request_deadline_of(...);
 *
 * Pure functions (no locks, clocks or allocation except the prompt and the
 * grammar they return); thread-safe. tests/unit/test_server_request.c.
 */
#ifndef CINFER_SERVER_REQUEST_H
#define CINFER_SERVER_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/grammar_cache.h"
#include "resilience/resilience.h"
#include "server/chat.h"
#include "server/validate.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Samples of one prompt a request may ask for (n). */
#define CINFER_MAX_SAMPLES 16

typedef enum {
    CINFER_INPUT_NONE = 0,
    CINFER_INPUT_TEXT, /* text, tokenized as the model does by default */
    CINFER_INPUT_IDS,  /* token ids as given */
    CINFER_INPUT_CHAT, /* messages through the model's chat template */
} cinfer_input_kind;

/* The names a front end gives the fields, for error messages. */
typedef struct {
    const char *text, *ids, *chat;
    const char *temperature, *top_k, *top_p, *min_p, *repetition_penalty,
        *presence_penalty, *frequency_penalty;
    const char *max_tokens, *min_tokens, *stop, *stop_token_ids;
    const char *logprobs, *n, *priority, *grammar, *regex, *json_schema;
    const char *embeds, *embeds_width, *embeds_values; /* prompt_embeds */
} cinfer_request_fields;

/* Bytes of prompt embedding values a request may carry (16 MiB: 4194304
 * floats); the rows are also bounded by the context. */
#define CINFER_MAX_PROMPT_EMBEDS_BYTES (16 * 1024 * 1024)

extern const cinfer_request_fields cinfer_request_fields_grpc;
extern const cinfer_request_fields cinfer_request_fields_openai;

/* A generation request, whatever the wire. Pointers are borrowed from the
 * decoded message and must outlive the calls that take the desc. */
typedef struct {
    cinfer_input_kind input;
    const char *text;               /* CINFER_INPUT_TEXT */
    const int32_t *ids;             /* CINFER_INPUT_IDS */
    size_t n_ids;
    const Cinfer__V1__Chat *chat;   /* CINFER_INPUT_CHAT */

    int has_temperature, has_top_k, has_top_p, has_min_p,
        has_repetition_penalty, has_presence_penalty, has_frequency_penalty,
        has_seed, has_max_tokens, has_min_tokens, has_logprobs, has_n;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty,
        frequency_penalty;
    int32_t top_k;
    uint64_t seed;
    int32_t max_tokens;             /* has_max_tokens; else the default */
    int32_t min_tokens;
    int ignore_eos;
    const char *const *stop;        /* stop strings */
    size_t n_stop;
    const int32_t *stop_ids;
    size_t n_stop_ids;
    uint32_t time_limit_ms;         /* 0 = none */
    int32_t logprobs;               /* has_logprobs: alternatives per token,
                                       0 = the chosen token's only */
    int32_t n;                      /* has_n: samples */
    int32_t priority;
    const char *grammar;            /* GBNF; NULL or "" = none */
    const char *regex;              /* NULL or "" = none */
    const char *json_schema;        /* JSON schema text; NULL or "" = none */
    int json_object;                /* any JSON object (OpenAI's
                                       response_format json_object) */
    /* Prompt embeddings (engine.h prompt_embeds): rows before the input,
     * which may then be CINFER_INPUT_NONE. */
    int has_embeds;
    const float *embeds;            /* [n_embeds_values] row-major */
    size_t n_embeds_values;
    int32_t embeds_width;           /* values per row as the request says
                                       (the model's, or refused); -1 = the
                                       wire does not say (the HTTP API):
                                       the model's */
} cinfer_gen_desc;

cinfer_gen_desc cinfer_gen_desc_init(void);

/* The desc of a decoded GenerateRequest (borrowing from it). */
void cinfer_gen_desc_from_proto(const Cinfer__V1__GenerateRequest *r,
                                cinfer_gen_desc *d);

/* CINFER_OK, or CINFER_E_INVALID_ARG naming the first bad field with f's
 * names. Everything but what needs the tokenized prompt. */
cinfer_status cinfer_request_validate(const cinfer_gen_desc *d,
                                      const cinfer_request_limits *lim,
                                      const cinfer_request_fields *f);

/* The max_tokens of a valid request: the field, or the default, at most
 * n_ctx. */
int32_t cinfer_request_max_tokens(const cinfer_gen_desc *d,
                                  const cinfer_request_limits *lim);

/* Text with the defaults cinfer-run uses (the vocabulary's own BOS/EOS
 * rule when add_special, special-token strings parsed) to token ids;
 * *ids is malloc'd. */
cinfer_status cinfer_request_encode_text(const cinfer_tokenizer *tk,
                                         const char *text, int add_special,
                                         int32_t **ids, size_t *n);

/* The desc's input as prompt token ids (*ids malloc'd, free it). */
cinfer_status cinfer_request_encode(const cinfer_tokenizer *tk,
                                    const cinfer_chat_template *chat,
                                    const cinfer_gen_desc *d, int32_t **ids,
                                    size_t *n);

/* The embedding rows of a valid desc (0 without prompt embeddings). */
size_t cinfer_request_embed_rows(const cinfer_gen_desc *d,
                                 const cinfer_request_limits *lim);

/* The tokenized prompt, after the desc's embedding rows, is not empty and
 * leaves room for a generated token in the context (CINFER_E_INVALID_ARG
 * naming the input field, or prompt_embeds'). */
cinfer_status cinfer_request_check_prompt(const cinfer_gen_desc *d,
                                          size_t n_prompt,
                                          const cinfer_request_limits *lim,
                                          const cinfer_request_fields *f);

/* The desc's grammar, regex, JSON schema or JSON object, compiled through
 * the cache (engine/grammar_cache.h; one per server, keyed by kind and
 * text): *out is a reference to the entry, NULL when the desc has none.
 * A source that does not compile is CINFER_E_INVALID_ARG, the message
 * prefixed with the field's name (a schema's names the keyword and its
 * JSON pointer). The caller releases *out
 * (cinfer_grammar_entry_release) after the engine request finished. */
cinfer_status cinfer_request_compile_grammar(const cinfer_gen_desc *d,
                                             const cinfer_request_fields *f,
                                             cinfer_grammar_cache *cache,
                                             cinfer_grammar_entry **out);

/* The engine params of a valid request: prompt and prompt embeddings
 * (borrowed), sampling,
 * stopping, samples, logprobs, priority, grammar (borrowed). seed is used
 * when the desc has none. Deadline, on_event and user are left to the
 * caller. */
void cinfer_request_to_engine(const cinfer_gen_desc *d,
                              const cinfer_request_limits *lim,
                              const int32_t *prompt, size_t n_prompt,
                              uint64_t seed, const cinfer_grammar *grammar,
                              cinfer_request_params *rp);

/* A call's deadlines on the monotonic clock. */
typedef struct {
    int64_t hard_ns;   /* the call's own deadline or start +
                          max_request_time, whichever is sooner; 0 = none.
                          Passing it is DEADLINE_EXCEEDED */
    int64_t engine_ns; /* what the engine stops at: the sooner of hard_ns
                          and the time limit; 0 = none */
    int is_hard;       /* engine_ns is hard_ns (else the time limit, which
                          ends the stream normally) */
} cinfer_request_deadline;

/* start_ns: the call's arrival; call_deadline_ns: the client's deadline (0
 * = none); max_request_time_ms: the server's cap (0 = none);
 * time_limit_ms: the request's own generation limit (0 = none). Sums
 * saturate at INT64_MAX. */
cinfer_request_deadline cinfer_request_deadline_of(int64_t start_ns,
                                                   int64_t call_deadline_ns,
                                                   int64_t max_request_time_ms,
                                                   uint32_t time_limit_ms);

/* How the server answers an engine submit that failed. */
typedef struct {
    int load;               /* 1 = a refusal for load (answered with the
                               reason and pushback); 0 = an error of the
                               request or the server (status as it is) */
    cinfer_reject reason;   /* when load */
    cinfer_status status;   /* the status to answer with */
    int64_t retry_after_ms; /* pushback, >= 0 */
} cinfer_engine_refusal_map;

/* The engine refusals for its load, each under its true reason:
 * CINFER_E_TIMEOUT (its deadline foreseen to pass) shed_deadline;
 * CINFER_E_UNAVAILABLE for the queue wait (--max-queue-wait-ms)
 * shed_queue_wait, for the first token (--max-ttft-ms) shed_first_token,
 * and with neither (the engine stopping) draining; CINFER_E_EXHAUSTED
 * (its queue bound, --max-queued) shed_queue_full, the status kept
 * (RESOURCE_EXHAUSTED). retry_ns is the
 * engine's own estimate (cinfer_engine_refusal_retry_ns), turned into
 * 1..max_retry_ms; the queue bound and the drain have fixed pushbacks. */
cinfer_engine_refusal_map cinfer_request_map_refusal(cinfer_status st,
                                                     cinfer_engine_refusal kind,
                                                     int64_t retry_ns,
                                                     int64_t max_retry_ms);

/* The human text of a rejection (client: the client id of a client rate
 * limit, else NULL). */
void cinfer_request_reject_message(cinfer_reject r, int64_t retry_ms,
                                   const char *client, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_REQUEST_H */
