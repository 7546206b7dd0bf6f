/*
 * chat.c - chat template recognition and ChatML encoding (chat.h).
 */
#include "server/chat.h"

#include <stdlib.h>
#include <string.h>

static const char IM_START[] = "<|im_start|>";
static const char IM_END[] = "<|im_end|>";

const char *cinfer_chat_format_name(cinfer_chat_format f)
{
    return f == CINFER_CHAT_CHATML ? "chatml" : "";
}

/* memmem over [s, s+n) for a NUL-terminated needle. */
static const char *find(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    if (k == 0 || k > n)
        return NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0)
            return s + i;
    return NULL;
}

/* The default system turn: a string literal in the template that holds
 * "<|im_start|>system\n" TEXT "<|im_end|>", with TEXT free of quotes,
 * backslashes and template syntax (so it is a constant, not an
 * expression). Returns 1 and a malloc'd *text (NULL when the template has
 * no such literal), 0 when a system turn is built some way this module
 * cannot reproduce (an expression, several different texts): the template
 * is then not recognised, rather than rendered without its system turn.
 * *nomem is set on allocation failure. */
static int default_system(const char *s, size_t n, char **text, int *nomem)
{
    static const char head[] = "<|im_start|>system\n";
    size_t hl = sizeof head - 1;
    *text = NULL;
    *nomem = 0;
    for (size_t off = 0; off < n;) {
        const char *h = find(s + off, n - off, head);
        if (!h)
            return 1;
        off = (size_t)(h - s) + hl;
        if (h == s || (h[-1] != '\'' && h[-1] != '"'))
            continue; /* not the start of a literal */
        const char *t = h + hl;
        const char *end = find(t, n - (size_t)(t - s), IM_END);
        if (!end)
            goto unsupported;
        for (const char *p = t; p < end; p++)
            if (*p == '\'' || *p == '"' || *p == '{' || *p == '}' ||
                *p == '\\')
                goto unsupported;
        size_t len = (size_t)(end - t);
        if (*text) {
            if (strlen(*text) != len || memcmp(*text, t, len) != 0)
                goto unsupported;
            continue;
        }
        *text = malloc(len + 1);
        if (!*text) {
            *nomem = 1;
            return 0;
        }
        memcpy(*text, t, len);
        (*text)[len] = '\0';
    }
    return 1;
unsupported:
    free(*text);
    *text = NULL;
    return 0;
}

cinfer_status cinfer_chat_template_detect(cinfer_chat_template *t,
                                          const char *tmpl, size_t len)
{
    memset(t, 0, sizeof *t);
    t->format = CINFER_CHAT_NONE;
    t->im_start = -1;
    t->im_end = -1;
    if (!tmpl || len == 0)
        return CINFER_OK;
    if (!find(tmpl, len, IM_START) || !find(tmpl, len, IM_END) ||
        !find(tmpl, len, "add_generation_prompt"))
        return CINFER_OK;
    int nomem;
    int ok = default_system(tmpl, len, &t->default_system, &nomem);
    if (nomem)
        return cinfer_set_error(CINFER_E_NOMEM, "chat template: no memory");
    if (ok)
        t->format = CINFER_CHAT_CHATML;
    return CINFER_OK;
}

cinfer_status cinfer_chat_template_init(cinfer_chat_template *t,
                                        const char *tmpl, size_t len,
                                        const cinfer_tokenizer *tk)
{
    cinfer_status st = cinfer_chat_template_detect(t, tmpl, len);
    if (st != CINFER_OK || t->format == CINFER_CHAT_NONE)
        return st;
    t->im_start = cinfer_tokenizer_token_id(tk, IM_START, sizeof IM_START - 1);
    t->im_end = cinfer_tokenizer_token_id(tk, IM_END, sizeof IM_END - 1);
    if (t->im_start < 0 || t->im_end < 0) {
        cinfer_chat_template_cleanup(t);
        cinfer_chat_template_detect(t, NULL, 0);
    }
    return CINFER_OK;
}

void cinfer_chat_template_cleanup(cinfer_chat_template *t)
{
    free(t->default_system);
    t->default_system = NULL;
}

/* ---------------------------------------------------------------------- */
/* Encoding                                                               */
/* ---------------------------------------------------------------------- */

typedef struct {
    int32_t *ids;
    size_t n, cap;
    const cinfer_tokenizer *tk;
} id_buf;

static cinfer_status reserve(id_buf *b, size_t more)
{
    if (b->n + more <= b->cap)
        return CINFER_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more)
        cap *= 2;
    int32_t *p = realloc(b->ids, cap * sizeof *p);
    if (!p)
        return cinfer_set_error(CINFER_E_NOMEM, "chat: no memory");
    b->ids = p;
    b->cap = cap;
    return CINFER_OK;
}

static cinfer_status push_id(id_buf *b, int32_t id)
{
    cinfer_status st = reserve(b, 1);
    if (st != CINFER_OK)
        return st;
    b->ids[b->n++] = id;
    return CINFER_OK;
}

/* Tokenizes text as plain text (no BOS, no special-token parsing). */
static cinfer_status push_text(id_buf *b, const char *text, size_t len)
{
    if (len == 0)
        return CINFER_OK;
    /* A byte never yields more than one token, plus BOS/EOS slack. */
    cinfer_status st = reserve(b, len + 2);
    if (st != CINFER_OK)
        return st;
    size_t got = 0;
    st = cinfer_tokenizer_encode(b->tk, text, len, 0, 0, b->ids + b->n,
                                 b->cap - b->n, &got);
    if (st == CINFER_E_RANGE) {
        st = reserve(b, got);
        if (st != CINFER_OK)
            return st;
        st = cinfer_tokenizer_encode(b->tk, text, len, 0, 0, b->ids + b->n,
                                     b->cap - b->n, &got);
    }
    if (st != CINFER_OK)
        return st;
    b->n += got;
    return CINFER_OK;
}

/* One turn: <|im_start|> role "\n" content <|im_end|> "\n". role and
 * content are one text piece, as in the rendered string. */
static cinfer_status push_turn(id_buf *b, const cinfer_chat_template *t,
                               const char *role, const char *content)
{
    size_t rl = strlen(role), cl = strlen(content);
    char *piece = malloc(rl + 1 + cl + 1);
    if (!piece)
        return cinfer_set_error(CINFER_E_NOMEM, "chat: no memory");
    memcpy(piece, role, rl);
    piece[rl] = '\n';
    memcpy(piece + rl + 1, content, cl);
    cinfer_status st = push_id(b, t->im_start);
    if (st == CINFER_OK)
        st = push_text(b, piece, rl + 1 + cl);
    if (st == CINFER_OK)
        st = push_id(b, t->im_end);
    if (st == CINFER_OK)
        st = push_text(b, "\n", 1);
    free(piece);
    return st;
}

cinfer_status cinfer_chat_encode(const cinfer_chat_template *t,
                                 const cinfer_tokenizer *tk,
                                 const Cinfer__V1__Chat *chat, int32_t **ids,
                                 size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    if (t->format != CINFER_CHAT_CHATML)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "chat: the model has no chat template the "
                                "server recognises (ChatML is supported)");
    id_buf b = {NULL, 0, 0, tk};
    cinfer_status st = CINFER_OK;
    int32_t bos = cinfer_tokenizer_bos(tk);
    if (cinfer_tokenizer_add_bos(tk) && bos >= 0)
        st = push_id(&b, bos);
    if (st == CINFER_OK && t->default_system && chat->n_messages > 0 &&
        strcmp(chat->messages[0]->role, "system") != 0)
        st = push_turn(&b, t, "system", t->default_system);
    for (size_t i = 0; st == CINFER_OK && i < chat->n_messages; i++)
        st = push_turn(&b, t, chat->messages[i]->role,
                       chat->messages[i]->content ? chat->messages[i]->content
                                                  : "");
    int add_gen = chat->opt_add_generation_prompt_case != 0 ? chat->add_generation_prompt
                                               : 1;
    if (st == CINFER_OK && add_gen) {
        st = push_id(&b, t->im_start);
        if (st == CINFER_OK)
            st = push_text(&b, "assistant\n", 10);
    }
    if (st != CINFER_OK) {
        free(b.ids);
        return st;
    }
    *ids = b.ids;
    *n_ids = b.n;
    return CINFER_OK;
}
