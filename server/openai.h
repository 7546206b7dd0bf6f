/*
 * openai.h - the OpenAI-compatible API's request bodies: JSON decoded into
 * the request description both front ends share (request.h), and the
 * errors the HTTP front end sends.
 *
 * A body of POST /v1/completions or /v1/chat/completions is decoded into
 * a cinfer_openai_req, whose cinfer_gen_desc borrows the JSON tree's
 * strings; request.c then checks the ranges with the OpenAI field names.
 * Fields the server does not know are ignored (as OpenAI and vLLM do);
 * a known field of the wrong type is CINFER_E_INVALID_ARG with a message
 * that starts with its name ("temperature must be a number").
 *
 *     cinfer_openai_req r;
 *     if (cinfer_openai_decode(body, len, 1, &r) != CINFER_OK)
 *         ...400, cinfer_last_error()
 *     else if (cinfer_request_validate(&r.d, &lim,
 *                                      &cinfer_request_fields_openai) ...)
 *     cinfer_openai_req_cleanup(&r);
 *
 * Pure functions; thread-safe. tests/fuzz/fuzz_openai.c drives them.
 */
#ifndef CINFER_SERVER_OPENAI_H
#define CINFER_SERVER_OPENAI_H

#include <jansson.h>
#include <stddef.h>

#include "server/request.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a request body; larger ones are 413. */
#define CINFER_OPENAI_MAX_BODY (4 * 1024 * 1024)

typedef struct {
    json_t *root;              /* the decoded body (owns the strings) */
    int chat;                  /* /v1/chat/completions */
    cinfer_gen_desc d;
    const char *model;         /* NULL = not given */
    const char *user;          /* NULL = not given */
    int stream;
    int include_usage;         /* stream_options.include_usage */
    int logprobs;              /* chosen tokens' logprobs asked */
    int top_logprobs;          /* alternatives per token */
    const char *stop[CINFER_MAX_STOP_STRINGS];
    int32_t *ids;              /* prompt ids (malloc'd) */
    float *embeds;             /* prompt_embeds' values (malloc'd) */
    int32_t *stop_ids;         /* stop_token_ids (malloc'd) */
    Cinfer__V1__Chat chat_msg; /* messages, as the chat template takes them */
    Cinfer__V1__ChatMessage *msgs;
    Cinfer__V1__ChatMessage **msgp;
    char **owned;              /* message texts joined from content parts */
    size_t n_owned;
} cinfer_openai_req;

/* Decodes a body (chat: a chat completion). On error *r is cleaned up and
 * the message names the field. */
cinfer_status cinfer_openai_decode(const char *body, size_t len, int chat,
                                   cinfer_openai_req *r);
void cinfer_openai_req_cleanup(cinfer_openai_req *r);

/* The field an error message names: its first word, without a trailing
 * ':' or an index ("stop[1] must ..." -> "stop"). Empty when the message
 * names none. */
void cinfer_openai_error_param(const char *message, char *out, size_t n);

/* OpenAI's error body: {"error": {"message", "type", "param", "code"}},
 * malloc'd. type: "invalid_request_error", "authentication_error", ... */
char *cinfer_openai_error_json(const char *message, const char *type,
                               const char *param, const char *code);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_OPENAI_H */
