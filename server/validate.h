/*
 * validate.h - field-by-field validation of decoded requests.
 *
 * Every field of GenerateRequest, TokenizeRequest and DetokenizeRequest is
 * checked against the limits of the served model before anything is
 * tokenized or queued. A bad field fails with CINFER_E_INVALID_ARG and a
 * message naming it with its path in the request, e.g.
 * "sampling.top_p must be in (0, 1], got 1.5"; the server sends that message
 * as the INVALID_ARGUMENT status detail.
 *
 * Checks that need the tokenized prompt (its length against the context)
 * happen after tokenization, in generate.c.
 *
 *     cinfer_request_limits lim = {.n_vocab = 49152, .n_ctx = 8192,
 *                                  .chat_supported = 1};
 *     Cinfer__V1__GenerateRequest *r =
 *         cinfer__v1__generate_request__unpack(NULL, len, buf);
 *     if (!r) ...INVALID_ARGUMENT "request does not decode"
 *     if (cinfer_validate_generate(r, &lim) != CINFER_OK)
 *         ...INVALID_ARGUMENT cinfer_last_error()
 *
 * Pure functions: no allocation, no shared state; thread-safe. The fuzz
 * target tests/fuzz/fuzz_request.c drives them with arbitrary bytes.
 */
#ifndef CINFER_SERVER_VALIDATE_H
#define CINFER_SERVER_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "cinfer/v1/cinfer.pb-c.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether a proto3 `optional` field is set. protoc-c sees each one as the
 * one-member oneof `opt_<name>` (proto/cmake/optional_to_oneof.cmake). */
#define CINFER_PB_HAS(msg, field) ((msg)->opt_##field##_case != 0)

/* Limits of the request fields (documented in cinfer.proto). */
#define CINFER_MAX_REQUEST_ID_BYTES 128
#define CINFER_MAX_STOP_STRINGS 16
#define CINFER_MAX_STOP_BYTES 256
#define CINFER_MAX_STOP_TOKEN_IDS 64
#define CINFER_MAX_LOGPROBS 20
#define CINFER_MAX_PRIORITY 100
#define CINFER_MAX_CHAT_MESSAGES 1024
#define CINFER_MAX_ROLE_BYTES 64
#define CINFER_MAX_TEMPERATURE 100.0f
#define CINFER_MAX_REPETITION_PENALTY 10.0f
/* Dividing a logit by less would take it past what a float holds (a
 * logit of 1e4 divided by 0.01 is 1e6, far inside it). */
#define CINFER_MIN_REPETITION_PENALTY 0.01f

typedef struct {
    int32_t n_vocab;        /* token ids must be in [0, n_vocab) */
    int32_t n_ctx;          /* tokens per sequence; bounds max_tokens and
                               the number of input ids */
    int chat_supported;     /* 1 = chat input can be rendered (the model's
                               template is recognised); 0 = chat input is
                               INVALID_ARGUMENT */
    int32_t default_max_tokens; /* max_tokens when unset (capped at n_ctx) */
    int32_t n_embd;         /* prompt embeddings' row width (the model's
                               embedding width); 0 = prompt embeddings are
                               INVALID_ARGUMENT (a model that does not take
                               them) */
} cinfer_request_limits;

/* CINFER_OK, or CINFER_E_INVALID_ARG naming the first bad field. */
cinfer_status cinfer_validate_generate(const Cinfer__V1__GenerateRequest *r,
                                       const cinfer_request_limits *lim);
cinfer_status cinfer_validate_tokenize(const Cinfer__V1__TokenizeRequest *r,
                                       const cinfer_request_limits *lim);
cinfer_status
cinfer_validate_detokenize(const Cinfer__V1__DetokenizeRequest *r,
                           const cinfer_request_limits *lim);

/* 1 if a client request id is acceptable (printable ASCII without spaces,
 * at most CINFER_MAX_REQUEST_ID_BYTES; "" and NULL are acceptable: the
 * server then assigns one). */
int cinfer_request_id_ok(const char *id);

/* The max_tokens a valid request asks for: the field, or the default, at
 * most n_ctx. */
int32_t cinfer_validate_max_tokens(const Cinfer__V1__GenerateRequest *r,
                                   const cinfer_request_limits *lim);

/* 1 if s[0..len) is well-formed UTF-8 (no overlongs, no surrogates, at most
 * U+10FFFF). */
int cinfer_utf8_valid(const char *s, size_t len);

/* The length of the longest well-formed UTF-8 prefix of s[0..len): len
 * when all of it is, else the offset of the first ill-formed sequence. */
size_t cinfer_utf8_valid_prefix(const char *s, size_t len);

/* Copies src[0..len) to dst replacing each maximal ill-formed subsequence
 * by U+FFFD (3 bytes), as the Unicode standard recommends. dst needs room
 * for 3 * len bytes. Returns the bytes written. */
size_t cinfer_utf8_sanitize(const char *src, size_t len, char *dst);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_VALIDATE_H */
