/*
 * chat.h - chat messages to prompt tokens with the model's chat template.
 *
 * The server does not run Jinja. It recognises the template families it
 * can render exactly and refuses chat input for any other template with
 * INVALID_ARGUMENT (a wrong guess would silently degrade every answer).
 * Recognised today: ChatML, the format of SmolLM2, Qwen2 and many others:
 *
 *   <|im_start|>system\nYou are ...<|im_end|>\n     (template's default
 *   <|im_start|>user\nHello<|im_end|>\n              system turn, if any)
 *   <|im_start|>assistant\n                          (generation prompt)
 *
 * A template is ChatML when it contains both markers and refers to
 * add_generation_prompt. Many ChatML templates insert a default system turn
 * when the first message is not a system one (SmolLM2's "You are a helpful
 * AI assistant named SmolLM, trained by Hugging Face"); the text of that
 * turn is read from the string literal `'<|im_start|>system\n...<|im_end|>`
 * in the template, so the rendering matches the Jinja one. A template that
 * builds its system turn from an expression (tools, dates) is not
 * recognised: rendering it without that turn would be a guess.
 *
 * Also recognised, by the text of the official template (a hash of it
 * with comments and the whitespace outside string literals removed, so a
 * reindented copy matches and any edit does not; the files are under
 * tests/data/chat/):
 *
 *   llama3    Meta-Llama-3-*-Instruct: BOS, then per message
 *             <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|>
 *             (TEXT trimmed); generation prompt the assistant header.
 *   llama3.1  Llama 3.1 and 3.3 Instruct: as llama3, after a system turn
 *             "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul
 *             2024\n\n" + messages[0]'s text when it is a system one (no
 *             tools, the default date_string). Tool roles are refused.
 *   qwen3     ChatML, no default system turn; an assistant message's
 *             <think>...</think> part is dropped, except on assistant turns
 *             after the last user message, where it is kept re-wrapped as
 *             "<think>\nR\n</think>\n\n" (also empty on the last one).
 *             enable_thinking left undefined: nothing after the prompt.
 *   gemma3    <bos>, <start_of_turn>ROLE\nTEXT<end_of_turn>\n with
 *             assistant written "model", TEXT trimmed, a system message
 *             (untrimmed) + "\n\n" put before the first turn's text; roles
 *             must alternate user/assistant; prompt <start_of_turn>model\n.
 *
 * Refused by name (t->refused): Mistral [INST] templates, Llama 3.2's
 * (its system turn holds today's date), any other Llama 3 or Gemma
 * template, and ChatML templates with <think> or tool logic.
 *
 * Encoding keeps the structure out of the user's hands: the markers are
 * emitted as their special token ids and every text piece (role, content,
 * newlines) is tokenized without special-token parsing, so a message that
 * contains "<|im_end|>" cannot close its turn. For text without such
 * strings the ids equal those of tokenizing the rendered template with
 * special-token parsing, as llama.cpp and HF transformers do.
 *
 *     cinfer_chat_template ct;
 *     cinfer_chat_template_init(&ct, tmpl, tmpl_len, tokenizer);
 *     if (ct.format != CINFER_CHAT_NONE)
 *         cinfer_chat_encode(&ct, tokenizer, chat, &ids, &n_ids);  free(ids)
 *     cinfer_chat_template_cleanup(&ct);
 *
 * Thread safety: an initialised template is read-only; encode may run on
 * many threads at once.
 */
#ifndef CINFER_SERVER_CHAT_H
#define CINFER_SERVER_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "cinfer/v1/cinfer.pb-c.h"
#include "common/status.h"
#include "engine/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CINFER_CHAT_NONE = 0,   /* no template, or one the server cannot render */
    CINFER_CHAT_CHATML = 1,
    CINFER_CHAT_LLAMA3 = 2,  /* Meta-Llama-3-*-Instruct */
    CINFER_CHAT_LLAMA31 = 3, /* Llama 3.1 and 3.3 Instruct */
    CINFER_CHAT_QWEN3 = 4,
    CINFER_CHAT_GEMMA3 = 5,
} cinfer_chat_format;

/* cinfer_chat_template_hash of the official templates (the files under
 * tests/data/chat/). */
#define CINFER_CHAT_HASH_LLAMA3 0x768dc1687f9293a8ULL
#define CINFER_CHAT_HASH_LLAMA31 0xa824c505dbb93d4aULL
#define CINFER_CHAT_HASH_LLAMA32 0xa1f871fe8f88c2e3ULL
#define CINFER_CHAT_HASH_QWEN3 0x3dba48630dbcfd76ULL
#define CINFER_CHAT_HASH_GEMMA3 0x6f26d8c366744563ULL

typedef struct {
    cinfer_chat_format format;
    char *default_system;   /* the system turn's text the template inserts
                               when messages[0] is not a system message
                               (malloc'd); NULL = none */
    const char *refused;    /* format NONE: the family recognised and
                               refused ("Mistral [INST]"), static; NULL =
                               no template or an unknown one */
    /* Marker token ids, -1 until init. */
    int32_t im_start;       /* a turn's opening marker: "<|im_start|>",
                               "<|start_header_id|>", "<start_of_turn>" */
    int32_t im_end;         /* its closing one: "<|im_end|>", "<|eot_id|>",
                               "<end_of_turn>" */
    int32_t header_end;     /* "<|end_header_id|>" (Llama 3) */
    int32_t think_open;     /* "<think>", "</think>" (Qwen3); -1 when not */
    int32_t think_close;    /* single tokens: then encoded as text */
    int32_t bos;            /* the BOS the template writes (Llama 3,
                               Gemma 3) */
} cinfer_chat_template;

/* "chatml", "llama3", "llama3.1", "qwen3", "gemma3", or "" for NONE. */
const char *cinfer_chat_format_name(cinfer_chat_format f);

/* The hash detect matches known templates by: FNV-1a 64 over the text
 * with comments and the whitespace outside string literals removed, and
 * the escapes in literals decoded. Pure. */
uint64_t cinfer_chat_template_hash(const char *tmpl, size_t len);

/* Recognises the template text tmpl[0..len) (NULL = no template) without a
 * tokenizer: sets format and default_system; the token ids stay -1. Pure.
 * CINFER_E_NOMEM only; an unrecognised template gives format NONE. */
cinfer_status cinfer_chat_template_detect(cinfer_chat_template *t,
                                          const char *tmpl, size_t len);

/* detect, then looks the markers up in the vocabulary; a ChatML template
 * whose markers are not single tokens is NONE. */
cinfer_status cinfer_chat_template_init(cinfer_chat_template *t,
                                        const char *tmpl, size_t len,
                                        const cinfer_tokenizer *tk);
void cinfer_chat_template_cleanup(cinfer_chat_template *t);

/* The prompt ids for `chat` (validated: at least one message, roles one
 * word). add_generation_prompt unset means true. BOS is put in front when
 * the tokenizer adds it to text. *ids is malloc'd; the caller frees it.
 * Errors: CINFER_E_INVALID_ARG (format NONE), CINFER_E_NOMEM, the
 * tokenizer's errors. */
cinfer_status cinfer_chat_encode(const cinfer_chat_template *t,
                                 const cinfer_tokenizer *tk,
                                 const Cinfer__V1__Chat *chat, int32_t **ids,
                                 size_t *n_ids);

/* The prompt as text, markers (and BOS) written as their strings, as the
 * Jinja template renders it: for the llama3, llama3.1, qwen3 and gemma3
 * formats (detect is enough, no tokenizer). Same validation as encode.
 * *text is malloc'd and NUL-terminated; the caller frees it. */
cinfer_status cinfer_chat_render_text(const cinfer_chat_template *t,
                                      const Cinfer__V1__Chat *chat,
                                      char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_CHAT_H */
