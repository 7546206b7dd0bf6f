/*
 * tokenizer.h - text <-> token ids, read from GGUF metadata.
 *
 * Two vocabulary kinds, chosen by `tokenizer.ggml.model`:
 *
 *   "gpt2"   byte-level BPE. The text is split into pieces by the
 *            pre-tokenizer regexes named by `tokenizer.ggml.pre` (run with
 *            PCRE2 in UTF+UCP mode), each piece is mapped byte by byte onto
 *            the GPT-2 byte alphabet and merged by the ranked
 *            `tokenizer.ggml.merges` ("a b", earlier = higher priority).
 *            Decoding gives back the input bytes, except bytes the
 *            vocabulary has no token for, which are dropped as llama.cpp
 *            drops them (SmolLM2 lacks 21 of the 256, e.g. 0x04 and 0xFF).
 *   "llama"  SentencePiece-style BPE: spaces become U+2581 ("▁"), a space
 *            is put in front of the text (`add_space_prefix`, and after
 *            each special token, as llama.cpp does), symbols merge by the
 *            highest `tokenizer.ggml.scores`, and characters with no token
 *            fall back to the byte tokens <0xNN> (<unk> if even that is
 *            missing).
 *
 * Pre-tokenizers (tokenizer.ggml.pre): "default" (also when the key is
 * absent), "gpt-2" and kin, "smollm"/"starcoder"/"refact" and kin,
 * "llama3"/"llama-bpe" and kin, "qwen2" and kin, "dbrx", "smaug-bpe";
 * any other name is refused with CINFER_E_UNSUPPORTED, as llama.cpp refuses
 * names it does not know.
 *
 * The results match llama.cpp's tokenizer (llama-vocab.cpp, as in the
 * llama-cpp-python 0.3.36 sdist) token for token; tests/data holds goldens
 * made with it. llama.cpp's pre-tokenizer regexes are run with the semantics
 * it gives them (its hand-written splitters and its per-regex segment
 * splitting), its whitespace set, and its detection of end-of-generation
 * tokens by name. Deliberate differences: bytes that are not valid UTF-8
 * are kept as they are (each one its own piece) where llama.cpp replaces
 * them by U+FFFD, so any bytes round-trip (the server refuses ill-formed
 * UTF-8 in a request's strings before they get here, server/wire.c); the
 * EOT id, when the file names
 * none, is the first of llama.cpp's candidate names in its list order
 * (llama.cpp takes whichever its hash map yields first: for SmolLM2 it
 * reports <|endoftext|>, this module <|im_end|>; both end generation);
 * decoding does not apply clean_up_tokenization_spaces (llama.cpp's
 * detokenize does for some BPE vocabularies; its token_to_piece, which
 * servers stream, does not); and model-name special cases (phi-3's
 * right-stripping special tokens) are not reproduced.
 *
 * Special tokens: tokens of type CONTROL, USER_DEFINED and UNKNOWN. When
 * encoding with parse_special, the text is first split on their exact
 * strings, longest token first (llama.cpp's tokenizer_st_partition); without
 * it, only USER_DEFINED tokens are split out and control strings such as
 * "<|im_end|>" are tokenized as plain text.
 *
 *     cinfer_tokenizer_params p = cinfer_tokenizer_default_params();
 *     p.gguf = g;
 *     cinfer_tokenizer *t;
 *     if (cinfer_tokenizer_create(&p, &t) != CINFER_OK) ...cinfer_last_error()
 *     int32_t ids[256];
 *     size_t n;
 *     cinfer_tokenizer_encode(t, "Hello", 5, 1, 1, ids, 256, &n);
 *
 *     cinfer_detok d;                      // streaming text out
 *     cinfer_detok_init(&d);
 *     char *buf = malloc(cinfer_detok_out_max(t));
 *     cinfer_detok_push(t, &d, id, buf, cinfer_detok_out_max(t), &n);
 *     ...                                  // buf[0..n): whole characters
 *     cinfer_detok_flush(&d, buf, 3, &n);  // at the end of the stream
 *     cinfer_tokenizer_destroy(t);
 *
 * Ownership: create copies everything it needs out of the GGUF handle, which
 * may be destroyed afterwards. Pointers the tokenizer hands out (pieces,
 * texts, the EOG list) live as long as the tokenizer.
 *
 * Thread safety: a tokenizer is immutable after create; every function
 * taking a const tokenizer may be called from any number of threads at once.
 * A cinfer_detok is a plain value owned by one caller (one per stream).
 */
#ifndef CINFER_TOKENIZER_H
#define CINFER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_tokenizer cinfer_tokenizer;

typedef struct {
    const cinfer_gguf *gguf; /* borrowed; read only during create */
} cinfer_tokenizer_params;

typedef enum {
    CINFER_TOKENIZER_BPE = 1, /* "gpt2": byte-level BPE with merges */
    CINFER_TOKENIZER_SPM = 2, /* "llama": SentencePiece BPE with scores */
} cinfer_tokenizer_kind;

cinfer_tokenizer_params cinfer_tokenizer_default_params(void);

/* Reads the vocabulary from p->gguf. Errors: CINFER_E_INVALID_ARG (no gguf),
 * CINFER_E_FORMAT (a tokenizer key missing or of the wrong type, arrays of
 * different lengths; the message names the key), CINFER_E_UNSUPPORTED
 * (a tokenizer.ggml.model or tokenizer.ggml.pre this module does not know,
 * named in the message), CINFER_E_NOMEM. */
cinfer_status cinfer_tokenizer_create(const cinfer_tokenizer_params *p,
                                      cinfer_tokenizer **out);
void cinfer_tokenizer_destroy(cinfer_tokenizer *t);

int32_t cinfer_tokenizer_n_vocab(const cinfer_tokenizer *t);
cinfer_tokenizer_kind cinfer_tokenizer_kind_of(const cinfer_tokenizer *t);
/* The pre-tokenizer name as read ("smollm", "llama-bpe"; "default" when the
 * file names none; "" for SPM). NUL-terminated, owned by the tokenizer. */
const char *cinfer_tokenizer_pre(const cinfer_tokenizer *t);

/* Special token ids, -1 when the vocabulary has none. For SPM vocabularies
 * without the keys, bos/eos/unk default to 1/2/0 as SentencePiece (and
 * llama.cpp) do; byte-level BPE ones get -1 (llama.cpp's 11 is not a
 * convention). eot is read from tokenizer.ggml.eot_token_id, else found by
 * name ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
 * "<|endoftext|>", ...). */
int32_t cinfer_tokenizer_bos(const cinfer_tokenizer *t);
int32_t cinfer_tokenizer_eos(const cinfer_tokenizer *t);
int32_t cinfer_tokenizer_eot(const cinfer_tokenizer *t);
int32_t cinfer_tokenizer_eom(const cinfer_tokenizer *t);
int32_t cinfer_tokenizer_unk(const cinfer_tokenizer *t);
int32_t cinfer_tokenizer_pad(const cinfer_tokenizer *t);
int32_t cinfer_tokenizer_sep(const cinfer_tokenizer *t);

/* Whether encode with add_special puts BOS in front / EOS at the end
 * (tokenizer.ggml.add_bos_token / add_eos_token; without the keys SPM and
 * the llama3 pre-tokenizers add BOS, as in llama.cpp). */
int cinfer_tokenizer_add_bos(const cinfer_tokenizer *t);
int cinfer_tokenizer_add_eos(const cinfer_tokenizer *t);

/* 1 if `id` ends generation (EOS, EOT, EOM and the tokens llama.cpp treats
 * as end-of-generation by name, e.g. <|im_end|>, <|endoftext|>), else 0
 * (also for ids out of range). */
int cinfer_tokenizer_is_eog(const cinfer_tokenizer *t, int32_t id);
/* The end-of-generation ids, ascending; *ids lives as long as t. */
void cinfer_tokenizer_eog_ids(const cinfer_tokenizer *t, const int32_t **ids,
                              size_t *n);
/* 1 if `id` is a control token (type CONTROL, or made one because its name
 * marks end of turn), else 0 (also for ids out of range). Control tokens
 * decode to nothing unless `special` output is asked for. */
int cinfer_tokenizer_is_control(const cinfer_tokenizer *t, int32_t id);

/* Tokenizes text[0..len) (any bytes; NUL bytes are ordinary text).
 * add_special: put BOS/EOS as the vocabulary asks (add_bos/add_eos).
 * parse_special: turn the strings of control tokens into their ids.
 * Writes up to `cap` ids and sets *n_ids to the number of ids. If cap is too
 * small, returns CINFER_E_RANGE with *n_ids = the number needed (ids[] then
 * holds the first `cap` of them), so the caller can retry. Other errors:
 * CINFER_E_INVALID_ARG, CINFER_E_NOMEM, CINFER_E_INTERNAL (regex failure). */
cinfer_status cinfer_tokenizer_encode(const cinfer_tokenizer *t,
                                      const char *text, size_t len,
                                      int add_special, int parse_special,
                                      int32_t *ids, size_t cap,
                                      size_t *n_ids);

/* The bytes token `id` stands for in output text: byte-level decoded (BPE),
 * "▁" turned into a space (SPM), <0xNN> into that byte. Control and unknown
 * tokens give 0 bytes here (llama.cpp's token_to_piece with special=false);
 * user-defined tokens give their text. *bytes is not NUL-terminated and
 * lives as long as t. CINFER_E_RANGE (naming the id) for an id out of range.
 */
cinfer_status cinfer_tokenizer_token_piece(const cinfer_tokenizer *t,
                                           int32_t id, const char **bytes,
                                           size_t *len);
/* As token_piece, but control and unknown tokens give their text
 * ("<|im_end|>"): llama.cpp's token_to_piece with special=true. */
cinfer_status cinfer_tokenizer_token_piece_special(const cinfer_tokenizer *t,
                                                   int32_t id,
                                                   const char **bytes,
                                                   size_t *len);
/* The token's string exactly as stored in the vocabulary ("Ġthe", "▁the",
 * "<0x0A>", "<|im_end|>"); not NUL-terminated, lives as long as t. */
cinfer_status cinfer_tokenizer_token_text(const cinfer_tokenizer *t,
                                          int32_t id, const char **bytes,
                                          size_t *len);
/* The id of the vocabulary entry whose string is exactly text[0..len)
 * (as stored: "<|im_end|>", "Ġthe"), or -1. */
int32_t cinfer_tokenizer_token_id(const cinfer_tokenizer *t, const char *text,
                                  size_t len);
/* The longest piece of any token, in bytes (special rendering included). */
size_t cinfer_tokenizer_max_piece(const cinfer_tokenizer *t);

/* Concatenates the pieces of ids[0..n) into out (raw bytes, not
 * NUL-terminated, possibly not valid UTF-8 if the ids split a character).
 * special: render control tokens as their text. On vocabularies with
 * add_space_prefix (SPM ones, usually), one leading space of the first
 * token is dropped, as llama.cpp's detokenize does. If cap is too small: CINFER_E_RANGE with
 * *n_out = the bytes needed. CINFER_E_RANGE also for an id out of range
 * (the message names it; *n_out is then 0). */
cinfer_status cinfer_tokenizer_decode(const cinfer_tokenizer *t,
                                      const int32_t *ids, size_t n,
                                      int special, char *out, size_t cap,
                                      size_t *n_out);

/* ---- incremental decoding ---------------------------------------------- */

/* Streaming detokenizer state: a value the caller embeds, one per output
 * stream. It emits only whole UTF-8 characters: a trailing incomplete
 * sequence is held back until the next token completes it, and bytes that
 * can never form a character are emitted as U+FFFD (one per maximal invalid
 * subpart, as the Unicode standard recommends). Concatenating every push and
 * the final flush gives the same text as decoding all ids at once and then
 * replacing invalid sequences by U+FFFD. */
typedef struct {
    unsigned char pend[4]; /* held-back bytes of an incomplete character */
    unsigned n_pend;       /* number of bytes in pend (0..3) */
    int at_start;          /* 1 after init: the first token loses a leading
                              space on vocabularies with add_space_prefix
                              (as decode does); set 0 when continuing text */
    int special;           /* 1 = render control tokens as their text;
                              0 after init */
} cinfer_detok;

/* Bytes of output one push can produce at most, for any token of t. */
size_t cinfer_detok_out_max(const cinfer_tokenizer *t);

void cinfer_detok_init(cinfer_detok *d);
/* Appends token `id`; writes the text that is now complete to out and sets
 * *n_out. If cap is too small: CINFER_E_RANGE with *n_out = bytes needed and
 * d unchanged (cinfer_detok_out_max(t) always suffices). An id out of range:
 * CINFER_E_RANGE naming it, *n_out = 0, d unchanged. */
cinfer_status cinfer_detok_push(const cinfer_tokenizer *t, cinfer_detok *d,
                                int32_t id, char *out, size_t cap,
                                size_t *n_out);
/* As push, for raw bytes instead of a token (no leading-space handling).
 * Output can be up to 3 * (n + 3) bytes. */
cinfer_status cinfer_detok_push_bytes(cinfer_detok *d, const char *bytes,
                                      size_t n, char *out, size_t cap,
                                      size_t *n_out);
/* Ends the stream: a held-back incomplete character becomes U+FFFD (needs
 * at most 3 bytes of out; CINFER_E_RANGE and d unchanged if out is
 * smaller). Only the held-back bytes are cleared; at_start and special stay
 * as they are, so d can go on with more text. */
cinfer_status cinfer_detok_flush(cinfer_detok *d, char *out, size_t cap,
                                 size_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_TOKENIZER_H */
