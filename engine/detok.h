/*
 * detok.h - a sample's output text: incremental detokenization plus stop
 * strings.
 *
 * The engine feeds each sampled token to a cinfer_textstream and streams the
 * text that comes back. The stream sits on the tokenizer's cinfer_detok
 * (which releases only whole UTF-8 characters and turns bytes that can never
 * form one into U+FFFD) and adds stop strings:
 *
 *   - Text that could be the start of a stop string is withheld until the
 *     following bytes either complete the stop string or rule it out, so a
 *     client never receives part of a stop string.
 *   - A stop string matches the moment its last byte arrives: the text is
 *     cut just before it and the stream stops. When several stop strings
 *     complete at the same byte, the longest (earliest-starting) one is cut.
 *     The result is the same however the text is split into tokens: the
 *     output is the text up to the first position where any stop string
 *     ends, minus that stop string.
 *   - Emitted text always ends on a UTF-8 character boundary.
 *
 * check_stop = 0 on a push (the engine's min_tokens) means no stop string
 * may end inside that token's bytes; its text is still withheld as usual,
 * so a stop string may begin there and end in a later token.
 *
 *     cinfer_textstream_params p = cinfer_textstream_default_params();
 *     const char *stops[] = {"\n\n", "User:"};
 *     p.tokenizer = tk; p.stop = stops; p.n_stop = 2;
 *     cinfer_textstream *ts;
 *     cinfer_textstream_create(&p, &ts);
 *     const char *text; size_t len; int stopped;
 *     cinfer_textstream_push(ts, id, 1, 0, &text, &len, &stopped);
 *     ...
 *     cinfer_textstream_finish(ts, &text, &len);   // the withheld rest
 *     cinfer_textstream_destroy(ts);
 *
 * Thread safety: one stream per sample, used by one thread at a time.
 */
#ifndef CINFER_DETOK_H
#define CINFER_DETOK_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_textstream cinfer_textstream;

typedef struct {
    const cinfer_tokenizer *tokenizer; /* borrowed, must outlive the stream;
                                          NULL = only push_bytes is usable */
    const char *const *stop;           /* stop strings (copied); each
                                          non-empty, NUL-terminated */
    size_t n_stop;                     /* entries in stop */
    int special;                       /* 1 = render control tokens as
                                          their text; 0 = they give none */
} cinfer_textstream_params;

cinfer_textstream_params cinfer_textstream_default_params(void);

/* Errors: CINFER_E_INVALID_ARG for an empty or NULL stop string (naming its
 * index), CINFER_E_NOMEM. */
cinfer_status cinfer_textstream_create(const cinfer_textstream_params *p,
                                       cinfer_textstream **out);
/* NULL is fine. */
void cinfer_textstream_destroy(cinfer_textstream *ts);

/* Appends token `id`. *text / *len: the text that became final (valid until
 * the next call on the stream). *stopped = 1 when a stop string completed
 * (the text ends right before it); later pushes then give no text.
 * check_stop: see above. final = 1 also ends the stream as finish() does,
 * appending the withheld rest to *text (unless a stop string matched).
 * Errors: CINFER_E_RANGE for an id outside the vocabulary (nothing
 * changes), CINFER_E_INVALID_ARG without a tokenizer. */
cinfer_status cinfer_textstream_push(cinfer_textstream *ts, int32_t id,
                                     int check_stop, int final,
                                     const char **text, size_t *len,
                                     int *stopped);

/* As push, for raw bytes (any length) instead of a token's piece. */
cinfer_status cinfer_textstream_push_bytes(cinfer_textstream *ts,
                                           const char *bytes, size_t n,
                                           int check_stop, int final,
                                           const char **text, size_t *len,
                                           int *stopped);

/* Ends the stream: the withheld text (an incomplete character as U+FFFD)
 * comes out. Nothing after a stop-string match or a previous finish. */
cinfer_status cinfer_textstream_finish(cinfer_textstream *ts,
                                       const char **text, size_t *len);

/* 1 once a stop string matched. */
int cinfer_textstream_stopped(const cinfer_textstream *ts);

/* Index (in the params' order) of the stop string that matched, or -1. */
int cinfer_textstream_stop_index(const cinfer_textstream *ts);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_DETOK_H */
