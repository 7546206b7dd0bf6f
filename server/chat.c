/*
 * chat.c - chat template recognition and ChatML encoding (chat.h).
 */
#include "server/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char IM_START[] = "<|im_start|>";
static const char IM_END[] = "<|im_end|>";

const char *cinfer_chat_format_name(cinfer_chat_format f)
{
    switch (f) {
    case CINFER_CHAT_CHATML:
        return "chatml";
    case CINFER_CHAT_LLAMA3:
        return "llama3";
    case CINFER_CHAT_LLAMA31:
        return "llama3.1";
    case CINFER_CHAT_QWEN3:
        return "qwen3";
    case CINFER_CHAT_GEMMA3:
        return "gemma3";
    default:
        return "";
    }
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
static int default_system_head(const char *s, size_t n, const char *head,
                               char **text, int *nomem)
{
    size_t hl = strlen(head);
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

/* The head written with a newline, or with the escape "\n" (as templates
 * from JSON configs that escaped it twice hold it). */
static int default_system(const char *s, size_t n, char **text, int *nomem)
{
    *text = NULL;
    *nomem = 0;
    return default_system_head(s, n, "<|im_start|>system\n", text, nomem) &&
           !*nomem &&
           default_system_head(s, n, "<|im_start|>system\\n", text, nomem);
}


/* ---------------------------------------------------------------------- */
/* Known templates by their text                                          */
/* ---------------------------------------------------------------------- */

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f';
}

/* FNV-1a, 64 bits. */
static uint64_t fnv_byte(uint64_t h, unsigned char c)
{
    return (h ^ c) * 0x100000001b3ULL;
}

/* The template's text with its layout taken out, hashed: comments
 * ({# ... #}) dropped, whitespace outside string literals dropped, and the
 * escapes inside literals inside tags ('\n', '\\', '\'') decoded, so a
 * template reindented, or with "\n" written as a real newline, hashes as
 * the official one, while any change to a literal, an expression or the
 * whitespace control ("{%-") does not. Pure. */
uint64_t cinfer_chat_template_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    int in_tag = 0; /* inside {{ }} or {% %} */
    char quote = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (quote) {
            if (c == '\\' && i + 1 < n) {
                char e = s[++i];
                c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
                h = fnv_byte(h, (unsigned char)c);
                continue;
            }
            if (c == quote)
                quote = 0;
            h = fnv_byte(h, (unsigned char)c);
            continue;
        }
        if (!in_tag && c == '{' && i + 1 < n && s[i + 1] == '#') {
            size_t j = i + 2;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}'))
                j++;
            i = j + 1;
            continue;
        }
        if (is_ws(c))
            continue;
        if (i + 1 < n &&
            ((!in_tag && c == '{' && (s[i + 1] == '{' || s[i + 1] == '%')) ||
             (in_tag && (c == '}' || c == '%') && s[i + 1] == '}'))) {
            in_tag = !in_tag;
            h = fnv_byte(h, (unsigned char)c);
            c = s[++i];
        } else if (in_tag && (c == '\'' || c == '"')) {
            quote = c;
        }
        h = fnv_byte(h, (unsigned char)c);
    }
    return h;
}

typedef struct {
    uint64_t hash;
    cinfer_chat_format format; /* NONE = known, refused: see `refused` */
    const char *refused;
} known_template;

/* The official templates (tests/data/chat/, hashed by test_server_chat):
 * Meta-Llama-3-8B-Instruct; Llama 3.1 8B/70B/405B and 3.3 70B Instruct
 * (one text); Qwen3 (0.6B-32B, one text); Gemma 3 instruction-tuned.
 * Llama 3.2's template puts today's date (strftime_now) in its system
 * turn, which a faithful rendering cannot fix in advance: refused. */
static const known_template KNOWN[] = {
    {CINFER_CHAT_HASH_LLAMA3, CINFER_CHAT_LLAMA3, NULL},
    {CINFER_CHAT_HASH_LLAMA31, CINFER_CHAT_LLAMA31, NULL},
    {CINFER_CHAT_HASH_QWEN3, CINFER_CHAT_QWEN3, NULL},
    {CINFER_CHAT_HASH_GEMMA3, CINFER_CHAT_GEMMA3, NULL},
    {CINFER_CHAT_HASH_LLAMA32, CINFER_CHAT_NONE,
     "Llama 3.2 (its system turn holds the current date)"},
};

cinfer_status cinfer_chat_template_detect(cinfer_chat_template *t,
                                          const char *tmpl, size_t len)
{
    memset(t, 0, sizeof *t);
    t->format = CINFER_CHAT_NONE;
    t->im_start = t->im_end = t->header_end = -1;
    t->think_open = t->think_close = t->bos = -1;
    if (!tmpl || len == 0)
        return CINFER_OK;
    uint64_t h = cinfer_chat_template_hash(tmpl, len);
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++) {
        if (KNOWN[i].hash == h) {
            t->format = KNOWN[i].format;
            t->refused = KNOWN[i].refused;
            return CINFER_OK;
        }
    }
    if (find(tmpl, len, "[INST]")) {
        t->refused = "Mistral [INST]";
        return CINFER_OK;
    }
    if (find(tmpl, len, "<|start_header_id|>")) {
        t->refused = "a Llama 3 variant";
        return CINFER_OK;
    }
    if (find(tmpl, len, "<start_of_turn>")) {
        t->refused = "a Gemma variant";
        return CINFER_OK;
    }
    if (!find(tmpl, len, IM_START) || !find(tmpl, len, IM_END) ||
        !find(tmpl, len, "add_generation_prompt"))
        return CINFER_OK;
    if (find(tmpl, len, "<think>") || find(tmpl, len, "tool_call")) {
        /* Reasoning or tool logic that rewrites turns: not plain ChatML. */
        t->refused = "a ChatML variant with reasoning or tool logic";
        return CINFER_OK;
    }
    int nomem;
    int ok = default_system(tmpl, len, &t->default_system, &nomem);
    if (nomem)
        return cinfer_set_error(CINFER_E_NOMEM, "chat template: no memory");
    if (ok)
        t->format = CINFER_CHAT_CHATML;
    return CINFER_OK;
}

static int32_t marker(const cinfer_tokenizer *tk, const char *text)
{
    return cinfer_tokenizer_token_id(tk, text, strlen(text));
}

cinfer_status cinfer_chat_template_init(cinfer_chat_template *t,
                                        const char *tmpl, size_t len,
                                        const cinfer_tokenizer *tk)
{
    cinfer_status st = cinfer_chat_template_detect(t, tmpl, len);
    if (st != CINFER_OK || t->format == CINFER_CHAT_NONE)
        return st;
    switch (t->format) {
    case CINFER_CHAT_LLAMA3:
    case CINFER_CHAT_LLAMA31:
        t->im_start = marker(tk, "<|start_header_id|>");
        t->header_end = marker(tk, "<|end_header_id|>");
        t->im_end = marker(tk, "<|eot_id|>");
        t->bos = cinfer_tokenizer_bos(tk);
        if (t->header_end < 0 || t->bos < 0)
            t->im_start = -1;
        break;
    case CINFER_CHAT_GEMMA3:
        t->im_start = marker(tk, "<start_of_turn>");
        t->im_end = marker(tk, "<end_of_turn>");
        t->bos = cinfer_tokenizer_bos(tk);
        if (t->bos < 0)
            t->im_start = -1;
        break;
    default: /* ChatML, Qwen3 */
        t->im_start = marker(tk, IM_START);
        t->im_end = marker(tk, IM_END);
        t->think_open = marker(tk, "<think>");
        t->think_close = marker(tk, "</think>");
        if (t->think_open < 0 || t->think_close < 0)
            t->think_open = t->think_close = -1;
        break;
    }
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

/* The rendered text as ids: text accumulates in `text` and is tokenized
 * as one piece when a marker id follows, or at the end, so pieces split
 * where the rendered string's special tokens split it. */
typedef struct {
    id_buf b;
    char *text;
    size_t len, cap;
    cinfer_status st;
    int as_text; /* render the text: markers as their strings */
} emitter;

static void emit_text(emitter *e, const char *s, size_t n)
{
    if (e->st != CINFER_OK || n == 0)
        return;
    if (e->len + n + 1 > e->cap) {
        size_t cap = e->cap ? e->cap : 256;
        while (cap < e->len + n + 1)
            cap *= 2;
        char *p = realloc(e->text, cap);
        if (!p) {
            e->st = cinfer_set_error(CINFER_E_NOMEM, "chat: no memory");
            return;
        }
        e->text = p;
        e->cap = cap;
    }
    memcpy(e->text + e->len, s, n);
    e->len += n;
}

static void emit_str(emitter *e, const char *s)
{
    emit_text(e, s, strlen(s));
}

static void emit_flush(emitter *e)
{
    if (e->as_text)
        return;
    if (e->st == CINFER_OK && e->len > 0)
        e->st = push_text(&e->b, e->text, e->len);
    e->len = 0;
}

/* A marker: its id, or its text where the vocabulary has no such token. */
static void emit_id(emitter *e, int32_t id, const char *text)
{
    if (id < 0 || e->as_text) {
        emit_str(e, text);
        return;
    }
    emit_flush(e);
    if (e->st == CINFER_OK)
        e->st = push_id(&e->b, id);
}

/* Python's str.isspace() for the UTF-8 character at s[0..n): its length
 * in bytes, 0 when it is not whitespace. */
static size_t space_len(const unsigned char *s, size_t n)
{
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) ||
                   (s[0] >= 0x1c && s[0] <= 0x20)))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n >= 3 && s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80)
        return 3; /* U+1680 */
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x80 &&
        (s[2] <= 0x8a || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return s[2] >= 0x80 ? 3 : 0; /* U+2000-200A, 2028, 2029, 202F */
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f)
        return 3; /* U+205F */
    if (n >= 3 && s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80)
        return 3; /* U+3000 */
    return 0;
}

/* Jinja's `trim` (str.strip()): [*s, *s + *n) without leading and
 * trailing whitespace. */
static void trim(const char **s, size_t *n)
{
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, k;
    while (len > 0 && (k = space_len(p, len)) > 0) {
        p += k;
        len -= k;
    }
    for (;;) {
        size_t cut = 0;
        for (size_t back = 1; back <= 3 && back <= len; back++) {
            if (space_len(p + len - back, back) == back) {
                cut = back;
                break;
            }
        }
        if (!cut)
            break;
        len -= cut;
    }
    *s = (const char *)p;
    *n = len;
}

static void emit_trimmed(emitter *e, const char *s)
{
    size_t n = strlen(s);
    trim(&s, &n);
    emit_text(e, s, n);
}

static const char *content_of(const Cinfer__V1__ChatMessage *m)
{
    return m->content ? m->content : "";
}

static cinfer_status bad_role(const cinfer_chat_template *t, size_t i,
                              const char *role, const char *allowed)
{
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "chat: messages[%zu].role \"%s\" is not one the "
                            "model's %s template renders (%s)",
                            i, role, cinfer_chat_format_name(t->format),
                            allowed);
}

/* <|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|> */
static void llama_header(emitter *e, const cinfer_chat_template *t,
                         const char *role)
{
    emit_id(e, t->im_start, "<|start_header_id|>");
    emit_str(e, role);
    emit_id(e, t->header_end, "<|end_header_id|>");
    emit_str(e, "\n\n");
}

static cinfer_status render_llama3(emitter *e, const cinfer_chat_template *t,
                                   const Cinfer__V1__Chat *chat, int add_gen)
{
    size_t first = 0;
    emit_id(e, t->bos, "<|begin_of_text|>");
    if (t->format == CINFER_CHAT_LLAMA31) {
        /* The default system turn, with no tools and the default
         * date_string; messages[0]'s text (trimmed) when it is a system
         * message. */
        llama_header(e, t, "system");
        emit_str(e, "Cutting Knowledge Date: December 2023\n"
                    "Today Date: 26 Jul 2024\n\n");
        if (strcmp(chat->messages[0]->role, "system") == 0) {
            emit_trimmed(e, content_of(chat->messages[0]));
            first = 1;
        }
        emit_id(e, t->im_end, "<|eot_id|>");
    }
    for (size_t i = first; i < chat->n_messages; i++) {
        const char *role = chat->messages[i]->role;
        if (t->format == CINFER_CHAT_LLAMA31 &&
            (strcmp(role, "ipython") == 0 || strcmp(role, "tool") == 0))
            return bad_role(t, i, role, "no tool messages");
        llama_header(e, t, role);
        emit_trimmed(e, content_of(chat->messages[i]));
        emit_id(e, t->im_end, "<|eot_id|>");
    }
    if (add_gen)
        llama_header(e, t, "assistant");
    return CINFER_OK;
}

static cinfer_status render_gemma3(emitter *e, const cinfer_chat_template *t,
                                   const Cinfer__V1__Chat *chat, int add_gen)
{
    size_t first = 0;
    const char *prefix = NULL;
    emit_id(e, t->bos, "<bos>");
    if (strcmp(chat->messages[0]->role, "system") == 0) {
        prefix = content_of(chat->messages[0]);
        first = 1;
    }
    for (size_t i = first; i < chat->n_messages; i++) {
        const char *role = chat->messages[i]->role;
        int user = strcmp(role, "user") == 0;
        if (user != ((i - first) % 2 == 0))
            return cinfer_set_error(
                CINFER_E_INVALID_ARG,
                "chat: messages[%zu].role \"%s\": the model's gemma3 "
                "template needs roles to alternate user/assistant (after "
                "one optional system message)",
                i, role);
        emit_id(e, t->im_start, "<start_of_turn>");
        emit_str(e, strcmp(role, "assistant") == 0 ? "model" : role);
        emit_str(e, "\n");
        if (i == first && prefix) {
            emit_str(e, prefix);
            emit_str(e, "\n\n");
        }
        emit_trimmed(e, content_of(chat->messages[i]));
        emit_id(e, t->im_end, "<end_of_turn>");
        emit_str(e, "\n");
    }
    if (add_gen) {
        emit_id(e, t->im_start, "<start_of_turn>");
        emit_str(e, "model\n");
    }
    return CINFER_OK;
}

static int starts_with(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

static int ends_with(const char *s, const char *p)
{
    size_t n = strlen(s), k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* Last occurrence of needle in [s, s+n), or NULL. */
static const char *find_last(const char *s, size_t n, const char *needle)
{
    const char *last = NULL;
    for (const char *p = s; (p = find(p, n - (size_t)(p - s), needle));
         p++)
        last = p;
    return last;
}

static void chatml_open(emitter *e, const cinfer_chat_template *t,
                        const char *role)
{
    emit_id(e, t->im_start, IM_START);
    emit_str(e, role);
    emit_str(e, "\n");
}

static void chatml_close(emitter *e, const cinfer_chat_template *t)
{
    emit_id(e, t->im_end, IM_END);
    emit_str(e, "\n");
}

/* Qwen3's template with no tools and no reasoning_content fields: an
 * assistant message's "<think>...</think>" part is split off as its
 * reasoning, kept (re-wrapped) only on assistant turns after the last
 * user query. */
static cinfer_status render_qwen3(emitter *e, const cinfer_chat_template *t,
                                  const Cinfer__V1__Chat *chat, int add_gen)
{
    size_t n = chat->n_messages;
    for (size_t i = 0; i < n; i++) {
        const char *role = chat->messages[i]->role;
        if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
            strcmp(role, "assistant") != 0)
            return bad_role(t, i, role, "system, user, assistant");
    }
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        const char *c = content_of(chat->messages[k]);
        if (strcmp(chat->messages[k]->role, "user") == 0 &&
            !(starts_with(c, "<tool_response>") &&
              ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *role = chat->messages[i]->role;
        const char *c = content_of(chat->messages[i]);
        if (strcmp(role, "assistant") != 0) {
            chatml_open(e, t, role);
            emit_str(e, c);
            chatml_close(e, t);
            continue;
        }
        size_t cl = strlen(c);
        const char *body = c, *reason = "";
        size_t bl = cl, rl = 0;
        const char *close_last = find_last(c, cl, "</think>");
        if (close_last) {
            body = close_last + 8;
            bl = cl - (size_t)(body - c);
            while (bl > 0 && *body == '\n') {
                body++;
                bl--;
            }
            const char *close_first = find(c, cl, "</think>");
            size_t before = (size_t)(close_first - c);
            while (before > 0 && c[before - 1] == '\n')
                before--;
            const char *open = find_last(c, before, "<think>");
            reason = open ? open + 7 : c;
            rl = before - (size_t)(reason - c);
            while (rl > 0 && *reason == '\n') {
                reason++;
                rl--;
            }
        }
        chatml_open(e, t, role);
        if (i > last_query && (i == n - 1 || rl > 0)) {
            /* reasoning.strip('\n'), content.lstrip('\n') */
            while (rl > 0 && reason[rl - 1] == '\n')
                rl--;
            while (bl > 0 && *body == '\n') {
                body++;
                bl--;
            }
            emit_id(e, t->think_open, "<think>");
            emit_str(e, "\n");
            emit_text(e, reason, rl);
            emit_str(e, "\n");
            emit_id(e, t->think_close, "</think>");
            emit_str(e, "\n\n");
        }
        emit_text(e, body, bl);
        chatml_close(e, t);
    }
    if (add_gen)
        chatml_open(e, t, "assistant");
    return CINFER_OK;
}

static cinfer_status render(emitter *e, const cinfer_chat_template *t,
                            const Cinfer__V1__Chat *chat, int add_gen)
{
    if (t->format == CINFER_CHAT_GEMMA3)
        return render_gemma3(e, t, chat, add_gen);
    if (t->format == CINFER_CHAT_QWEN3)
        return render_qwen3(e, t, chat, add_gen);
    return render_llama3(e, t, chat, add_gen);
}

cinfer_status cinfer_chat_render_text(const cinfer_chat_template *t,
                                      const Cinfer__V1__Chat *chat,
                                      char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    if (t->format != CINFER_CHAT_LLAMA3 && t->format != CINFER_CHAT_LLAMA31 &&
        t->format != CINFER_CHAT_QWEN3 && t->format != CINFER_CHAT_GEMMA3)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "chat: no text rendering for this template");
    if (chat->n_messages == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "chat: messages is empty");
    int add_gen = chat->opt_add_generation_prompt_case != 0
                      ? chat->add_generation_prompt
                      : 1;
    emitter e = {{NULL, 0, 0, NULL}, NULL, 0, 0, CINFER_OK, 1};
    cinfer_status st = render(&e, t, chat, add_gen);
    if (st == CINFER_OK)
        st = e.st;
    if (st != CINFER_OK) {
        free(e.text);
        return st;
    }
    if (!e.text) {
        e.text = malloc(1);
        if (!e.text)
            return cinfer_set_error(CINFER_E_NOMEM, "chat: no memory");
    }
    e.text[e.len] = '\0';
    *text = e.text;
    *len = e.len;
    return CINFER_OK;
}

static cinfer_status encode_rendered(const cinfer_chat_template *t,
                                     const cinfer_tokenizer *tk,
                                     const Cinfer__V1__Chat *chat,
                                     int add_gen, int32_t **ids,
                                     size_t *n_ids)
{
    emitter e = {{NULL, 0, 0, tk}, NULL, 0, 0, CINFER_OK, 0};
    cinfer_status st;
    st = render(&e, t, chat, add_gen);
    emit_flush(&e);
    if (st == CINFER_OK)
        st = e.st;
    free(e.text);
    if (st != CINFER_OK) {
        free(e.b.ids);
        return st;
    }
    *ids = e.b.ids;
    *n_ids = e.b.n;
    return CINFER_OK;
}

cinfer_status cinfer_chat_encode(const cinfer_chat_template *t,
                                 const cinfer_tokenizer *tk,
                                 const Cinfer__V1__Chat *chat, int32_t **ids,
                                 size_t *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    if (t->format == CINFER_CHAT_NONE && t->refused)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "chat: the model's chat template (%s) is not "
                                "one the server renders (supported: ChatML, "
                                "Llama 3, Llama 3.1/3.3, Qwen3, Gemma 3)",
                                t->refused);
    if (t->format == CINFER_CHAT_NONE)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "chat: the model has no chat template the "
                                "server recognises (supported: ChatML, "
                                "Llama 3, Llama 3.1/3.3, Qwen3, Gemma 3)");
    if (chat->n_messages == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "chat: messages is empty");
    int add_gen = chat->opt_add_generation_prompt_case != 0
                      ? chat->add_generation_prompt
                      : 1;
    if (t->format != CINFER_CHAT_CHATML)
        return encode_rendered(t, tk, chat, add_gen, ids, n_ids);
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
