/*
 * tinymodel.c - tiny random llama/qwen2/qwen3 GGUF models with real
 * tokenizers.
 *
 * Three parts: the vocabulary (BPE merges learned on a built-in text, then
 * synthetic merges once the text runs out of repeated pairs), the metadata
 * (llama.cpp's key names), and the weights (seeded per tensor name, so a
 * tensor's values do not depend on which other tensors exist).
 *
 * BPE training is the textbook loop: count adjacent symbol pairs over the
 * unique words weighted by frequency, merge the most frequent pair (ties go
 * to the lower ids, so the result is deterministic), repeat. A pair whose
 * concatenation is already a token is skipped, so every token text is
 * unique. The text is a few KB, so the quadratic loop costs milliseconds.
 */
#include "tinymodel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

/* ====================================================================== */
/* built-in training text                                                  */
/* ====================================================================== */

static const char corpus[] =
    "The river ran slowly past the old mill, and the children walked along "
    "the bank to watch the water turn the wheel. Their mother had told them "
    "to be home before the evening bell, but the light was still warm and "
    "the day felt long. A heron stood in the shallows, patient as a stone, "
    "waiting for a fish to come close.\n"
    "In the morning the market opened at seven. Farmers brought apples, "
    "pears, cabbages and bread, and the baker sold warm rolls for two coins "
    "each. People talked about the weather, the harvest, the price of "
    "flour, and the new bridge that the town would build in the spring. "
    "Everyone had an opinion, and nobody agreed on the cost.\n"
    "A server that answers many requests at once must share its time "
    "fairly. When the queue grows, it should tell new clients to wait and "
    "try again later, rather than accept more work than it can finish. "
    "Each request carries a deadline; when the deadline passes, the work "
    "is cancelled and the memory is given back. Good systems fail in ways "
    "that are easy to understand.\n"
    "The model reads a prompt, turns the words into numbers, and predicts "
    "the next word one step at a time. Every step looks at all the words "
    "that came before, so the cache of keys and values grows with the "
    "length of the text. Small models are fast and simple to test; large "
    "models are slower but they know much more about the world.\n"
    "She opened the window and the cold air filled the room. On the table "
    "there was a letter with a red stamp, and she knew at once who had "
    "written it. Her brother had been away for three years, working on "
    "ships that sailed between the northern islands. He wrote that he "
    "would return in the summer, and that he had a story to tell.\n"
    "To make a simple soup, cut two onions, three carrots and a few "
    "potatoes into small pieces. Cook the onions in a little oil until they "
    "are soft, then add the other vegetables and enough water to cover "
    "them. Let it simmer for thirty minutes, add salt and pepper, and serve "
    "it hot with fresh bread.\n"
    "Numbers appear everywhere: 1, 2, 3, 10, 42, 100, 2024, 3.14 and 0.5. "
    "A list might read: first, second, third; then the total is 60. What "
    "is the answer? It is not always clear! Questions, answers, and notes "
    "(with brackets) are part of ordinary writing.\n"
    "The teacher asked the class to write a short poem about the sea. Some "
    "wrote about storms and waves, others about quiet beaches and shells. "
    "One student wrote about the sound of the tide at night, and the "
    "teacher read it aloud because it was beautiful and true.\n"
    "When you are lost in a new city, look for the main street and follow "
    "it to the center. There is usually a square with a church, a town "
    "hall, and a place to eat. Ask someone for directions; most people are "
    "happy to help a traveller who is polite and patient.\n"
    "The function returns an error when the input is invalid, and the "
    "caller prints the message. Tests check that every error names the "
    "field that was wrong, so that people who read the logs can find the "
    "problem quickly and fix it without guessing.\n";

/* SmolLM2's ChatML template. */
static const char chatml_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] "
    "!= 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant "
    "named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|"
    "im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>"
    "' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
    "assistant\n' }}{% endif %}";

/* ====================================================================== */
/* vocabulary builder                                                      */
/* ====================================================================== */

/* Token texts (raw bytes) with a hash index for uniqueness checks. */
typedef struct {
    char **text;
    uint32_t *len;
    uint32_t n, cap;
    uint32_t *slots; /* id + 1, 0 = empty */
    uint32_t n_slots;
} vocab;

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void vocab_free(vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

static int64_t vocab_find(const vocab *v, const char *s, size_t n)
{
    if (!v->slots)
        return -1;
    uint32_t mask = v->n_slots - 1;
    uint32_t h = (uint32_t)fnv(s, n) & mask;
    for (;;) {
        uint32_t id = v->slots[h];
        if (id == 0)
            return -1;
        id--;
        if (v->len[id] == n && memcmp(v->text[id], s, n) == 0)
            return id;
        h = (h + 1) & mask;
    }
}

static void slot_insert(vocab *v, uint32_t id)
{
    uint32_t mask = v->n_slots - 1;
    uint32_t h = (uint32_t)fnv(v->text[id], v->len[id]) & mask;
    while (v->slots[h] != 0)
        h = (h + 1) & mask;
    v->slots[h] = id + 1;
}

/* Appends a token text (copied); returns its id or -1 on no memory. The
 * caller makes sure the text is new. */
static int64_t vocab_add(vocab *v, const char *s, size_t n)
{
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 512;
        char **t = realloc(v->text, nc * sizeof *t);
        if (!t)
            return -1;
        v->text = t;
        uint32_t *l = realloc(v->len, nc * sizeof *l);
        if (!l)
            return -1;
        v->len = l;
        v->cap = nc;
    }
    if ((uint64_t)(v->n + 1) * 2 > v->n_slots) {
        uint32_t ns = v->n_slots ? v->n_slots * 2 : 1024;
        uint32_t *sl = calloc(ns, sizeof *sl);
        if (!sl)
            return -1;
        free(v->slots);
        v->slots = sl;
        v->n_slots = ns;
        for (uint32_t i = 0; i < v->n; i++)
            slot_insert(v, i);
    }
    char *c = malloc(n + 1);
    if (!c)
        return -1;
    memcpy(c, s, n);
    c[n] = '\0';
    v->text[v->n] = c;
    v->len[v->n] = (uint32_t)n;
    slot_insert(v, v->n);
    return v->n++;
}

typedef struct {
    uint32_t *sym;
    uint32_t n;
    uint32_t count;
} word;

typedef struct {
    word *w;
    size_t n, cap;
} word_list;

static void words_free(word_list *wl)
{
    for (size_t i = 0; i < wl->n; i++)
        free(wl->w[i].sym);
    free(wl->w);
    memset(wl, 0, sizeof *wl);
}

/* Adds one occurrence of a symbol sequence (merging equal words). */
static int words_add(word_list *wl, const uint32_t *sym, uint32_t n)
{
    if (n == 0)
        return 1;
    for (size_t i = 0; i < wl->n; i++) {
        if (wl->w[i].n == n && memcmp(wl->w[i].sym, sym, n * sizeof *sym) == 0) {
            wl->w[i].count++;
            return 1;
        }
    }
    if (wl->n == wl->cap) {
        size_t nc = wl->cap ? wl->cap * 2 : 256;
        word *p = realloc(wl->w, nc * sizeof *p);
        if (!p)
            return 0;
        wl->w = p;
        wl->cap = nc;
    }
    uint32_t *s = malloc(n * sizeof *s);
    if (!s)
        return 0;
    memcpy(s, sym, n * sizeof *s);
    wl->w[wl->n].sym = s;
    wl->w[wl->n].n = n;
    wl->w[wl->n].count = 1;
    wl->n++;
    return 1;
}

enum { CLS_SPACE, CLS_LETTER, CLS_DIGIT, CLS_OTHER };

static int char_class(char c)
{
    if (c == ' ' || c == '\n' || c == '\t')
        return CLS_SPACE;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return CLS_LETTER;
    if (c >= '0' && c <= '9')
        return CLS_DIGIT;
    return CLS_OTHER;
}

/* Splits the corpus GPT-2 style: an optional leading space plus a run of
 * letters, digits or other characters; whitespace runs on their own.
 * Calls `emit(start, len)` for each piece. */
typedef int (*piece_fn)(void *ctx, const char *s, size_t n);

static int pretokenize(const char *t, size_t n, piece_fn emit, void *ctx)
{
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        if (t[i] == ' ' && i + 1 < n && char_class(t[i + 1]) != CLS_SPACE)
            i++;
        int cls = char_class(t[i]);
        while (i < n && char_class(t[i]) == cls)
            i++;
        if (!emit(ctx, t + start, i - start))
            return 0;
    }
    return 1;
}

/* Pair-count table for one training step. */
typedef struct {
    uint64_t *key; /* (a << 32 | b) + 1, 0 = empty */
    uint64_t *count;
    size_t n_slots;
} pair_table;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void pairs_add(pair_table *pt, uint64_t key, uint64_t c)
{
    size_t mask = pt->n_slots - 1;
    size_t h = (size_t)mix64(key) & mask;
    while (pt->key[h] != 0 && pt->key[h] != key + 1)
        h = (h + 1) & mask;
    pt->key[h] = key + 1;
    pt->count[h] += c;
}

/* Concatenation of tokens a and b into buf (which must hold both). */
static size_t concat(const vocab *v, uint32_t a, uint32_t b, char *buf)
{
    memcpy(buf, v->text[a], v->len[a]);
    memcpy(buf + v->len[a], v->text[b], v->len[b]);
    return v->len[a] + v->len[b];
}

/* Records merge (a, b) as a new token; updates `merges`. */
static int add_merge(vocab *v, uint32_t a, uint32_t b, uint32_t (*merges)[2],
                     uint32_t *n_merges, char **buf, size_t *buf_cap)
{
    size_t need = (size_t)v->len[a] + v->len[b];
    if (need > *buf_cap) {
        char *nb = realloc(*buf, need * 2);
        if (!nb)
            return 0;
        *buf = nb;
        *buf_cap = need * 2;
    }
    size_t n = concat(v, a, b, *buf);
    if (vocab_add(v, *buf, n) < 0)
        return 0;
    merges[*n_merges][0] = a;
    merges[*n_merges][1] = b;
    (*n_merges)++;
    return 1;
}

/* Learns up to `target` merges on `words`, then fills the rest with
 * synthetic merges (existing token + letter). `letters` lists the ids of
 * the letter tokens in the order used for synthetic merges. */
static cinfer_status train(vocab *v, word_list *wl, uint32_t target,
                 const uint32_t *letters, uint32_t n_letters,
                 uint32_t (*merges)[2])
{
    uint32_t n_merges = 0;
    size_t total = 0;
    cinfer_status st = CINFER_E_NOMEM;
    char *buf = NULL;
    size_t buf_cap = 0;
    for (size_t i = 0; i < wl->n; i++)
        total += wl->w[i].n;
    pair_table pt = {NULL, NULL, 16};
    while (pt.n_slots < 2 * total + 16)
        pt.n_slots *= 2;
    pt.key = malloc(pt.n_slots * sizeof *pt.key);
    pt.count = malloc(pt.n_slots * sizeof *pt.count);
    if (!pt.key || !pt.count)
        goto done;

    while (n_merges < target) {
        memset(pt.key, 0, pt.n_slots * sizeof *pt.key);
        memset(pt.count, 0, pt.n_slots * sizeof *pt.count);
        for (size_t i = 0; i < wl->n; i++) {
            const word *w = &wl->w[i];
            for (uint32_t j = 0; j + 1 < w->n; j++)
                pairs_add(&pt, ((uint64_t)w->sym[j] << 32) | w->sym[j + 1],
                          w->count);
        }
        uint64_t best = 0, best_count = 0;
        for (size_t h = 0; h < pt.n_slots; h++) {
            if (pt.key[h] == 0 || pt.count[h] < 2)
                continue;
            uint64_t k = pt.key[h] - 1;
            if (pt.count[h] < best_count ||
                (pt.count[h] == best_count && k > best))
                continue;
            uint32_t a = (uint32_t)(k >> 32), b = (uint32_t)k;
            size_t need = (size_t)v->len[a] + v->len[b];
            if (need > buf_cap) {
                char *nb = realloc(buf, need * 2);
                if (!nb)
                    goto done;
                buf = nb;
                buf_cap = need * 2;
            }
            size_t n = concat(v, a, b, buf);
            if (vocab_find(v, buf, n) >= 0)
                continue; /* would duplicate a token text */
            best = k;
            best_count = pt.count[h];
        }
        if (best_count == 0)
            break;
        uint32_t a = (uint32_t)(best >> 32), b = (uint32_t)best;
        uint32_t id = v->n;
        if (!add_merge(v, a, b, merges, &n_merges, &buf, &buf_cap))
            goto done;
        for (size_t i = 0; i < wl->n; i++) {
            word *w = &wl->w[i];
            uint32_t o = 0;
            for (uint32_t j = 0; j < w->n; j++) {
                if (j + 1 < w->n && w->sym[j] == a && w->sym[j + 1] == b) {
                    w->sym[o++] = id;
                    j++;
                } else {
                    w->sym[o++] = w->sym[j];
                }
            }
            w->n = o;
        }
    }

    /* Synthetic merges: walk the letters, then every merged token in
     * order, appending each letter. */
    uint32_t first_merged = v->n - n_merges;
    uint64_t xi = 0;
    while (n_merges < target && n_letters > 0) {
        uint32_t x = xi < n_letters ? letters[xi]
                                    : first_merged + (uint32_t)(xi - n_letters);
        if (x >= v->n)
            break; /* cannot happen while letters exist */
        for (uint32_t li = 0; li < n_letters && n_merges < target; li++) {
            uint32_t y = letters[li];
            size_t need = (size_t)v->len[x] + v->len[y];
            if (need > buf_cap) {
                char *nb = realloc(buf, need * 2);
                if (!nb)
                    goto done;
                buf = nb;
                buf_cap = need * 2;
            }
            size_t n = concat(v, x, y, buf);
            if (vocab_find(v, buf, n) >= 0)
                continue;
            if (!add_merge(v, x, y, merges, &n_merges, &buf, &buf_cap))
                goto done;
        }
        xi++;
    }
    if (n_merges == target)
        st = CINFER_OK;
    else
        st = cinfer_set_error(CINFER_E_INTERNAL,
                              "tinymodel: made %u of %u merges", n_merges,
                              target);

done:
    free(buf);
    free(pt.key);
    free(pt.count);
    if (st == CINFER_E_NOMEM)
        cinfer_set_error(st, "tinymodel: out of memory while learning merges");
    return st;
}

/* Letters in rough English frequency order, for synthetic merges. */
static const char letter_order[] = "etaoinshrdlucmfwypvbgkjqxz";

/* ---- gpt2 ---------------------------------------------------------------- */

static int gpt2_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

/* GPT-2's byte-to-unicode table: byte -> code point. */
static void gpt2_byte_table(uint32_t cp[256])
{
    uint32_t next = 256;
    for (int b = 0; b < 256; b++)
        cp[b] = gpt2_printable(b) ? (uint32_t)b : next++;
}

/* Encodes raw bytes as GPT-2 byte-level text (UTF-8, NUL-terminated);
 * out must hold 2 * n + 1 bytes. */
static void gpt2_encode(const uint32_t cp[256], const char *s, size_t n,
                        char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[(uint8_t)s[i]];
        if (c < 0x80) {
            out[o++] = (char)c;
        } else {
            out[o++] = (char)(0xc0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3f));
        }
    }
    out[o] = '\0';
}

typedef struct {
    word_list *wl;
    const int32_t *sym_of_byte; /* byte -> symbol id, -1 = split here */
    int spm;                    /* leading space -> "▁" symbol */
    uint32_t space_sym;
} split_ctx;

static int emit_word(void *vctx, const char *s, size_t n)
{
    split_ctx *c = vctx;
    uint32_t sym[256];
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id;
        if (c->spm && s[i] == ' ')
            id = (int32_t)c->space_sym;
        else
            id = c->sym_of_byte[(uint8_t)s[i]];
        if (id < 0 || k == sizeof sym / sizeof sym[0]) {
            if (!words_add(c->wl, sym, k))
                return 0;
            k = 0;
            if (id < 0)
                continue;
        }
        sym[k++] = (uint32_t)id;
    }
    return words_add(c->wl, sym, k);
}

/* The built tokenizer, ready for the writer. */
typedef struct {
    char **tokens;      /* n_vocab NUL-terminated texts */
    int32_t *types;
    float *scores;      /* llama only */
    char **merges;      /* gpt2 only */
    uint32_t n_vocab, n_merges;
    uint32_t bos, eos, unk, pad;
} tok_out;

static void tok_out_free(tok_out *t)
{
    if (t->tokens)
        for (uint32_t i = 0; i < t->n_vocab; i++)
            free(t->tokens[i]);
    if (t->merges)
        for (uint32_t i = 0; i < t->n_merges; i++)
            free(t->merges[i]);
    free(t->tokens);
    free(t->types);
    free(t->scores);
    free(t->merges);
    memset(t, 0, sizeof *t);
}

static cinfer_status nomem(void)
{
    return cinfer_set_error(CINFER_E_NOMEM, "tinymodel: out of memory");
}

static cinfer_status build_gpt2(uint32_t n_vocab, tok_out *out)
{
    cinfer_status st = CINFER_OK;
    vocab v = {0};
    word_list wl = {0};
    uint32_t (*merges)[2] = NULL;
    uint32_t cp[256];
    int32_t sym_of_byte[256];
    uint32_t letters[26];
    const uint32_t n_special = 3;
    uint32_t n_merges = n_vocab - 256 - n_special;

    gpt2_byte_table(cp);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if (vocab_add(&v, &c, 1) < 0)
            goto fail_nomem;
        sym_of_byte[b] = b;
    }
    for (int i = 0; i < 26; i++)
        letters[i] = (uint8_t)letter_order[i];
    split_ctx sc = {&wl, sym_of_byte, 0, 0};
    if (!pretokenize(corpus, sizeof corpus - 1, emit_word, &sc))
        goto fail_nomem;
    merges = malloc((n_merges ? n_merges : 1) * sizeof *merges);
    if (!merges)
        goto fail_nomem;
    st = train(&v, &wl, n_merges, letters, 26, merges);
    if (st != CINFER_OK)
        goto fail;

    out->n_vocab = n_vocab;
    out->n_merges = n_merges;
    out->tokens = calloc(n_vocab, sizeof *out->tokens);
    out->types = malloc(n_vocab * sizeof *out->types);
    out->merges = calloc(n_merges ? n_merges : 1, sizeof *out->merges);
    if (!out->tokens || !out->types || !out->merges)
        goto fail_nomem;
    for (uint32_t i = 0; i < v.n; i++) {
        out->tokens[i] = malloc(2 * (size_t)v.len[i] + 1);
        if (!out->tokens[i])
            goto fail_nomem;
        gpt2_encode(cp, v.text[i], v.len[i], out->tokens[i]);
        out->types[i] = 1;
    }
    static const char *const specials[3] = {"<|endoftext|>", "<|im_start|>",
                                            "<|im_end|>"};
    for (uint32_t i = 0; i < n_special; i++) {
        out->tokens[v.n + i] = strdup(specials[i]);
        if (!out->tokens[v.n + i])
            goto fail_nomem;
        out->types[v.n + i] = 3;
    }
    for (uint32_t i = 0; i < n_merges; i++) {
        const char *a = out->tokens[merges[i][0]];
        const char *b = out->tokens[merges[i][1]];
        size_t la = strlen(a), lb = strlen(b);
        char *m = malloc(la + lb + 2);
        if (!m)
            goto fail_nomem;
        memcpy(m, a, la);
        m[la] = ' ';
        memcpy(m + la + 1, b, lb + 1);
        out->merges[i] = m;
    }
    out->unk = n_vocab - 3;
    out->bos = n_vocab - 2;
    out->eos = n_vocab - 1;
    out->pad = n_vocab - 1;
    goto done;

fail_nomem:
    st = nomem();
fail:
    tok_out_free(out);
done:
    free(merges);
    words_free(&wl);
    vocab_free(&v);
    return st;
}

/* ---- llama (SentencePiece) ---------------------------------------------- */

static cinfer_status build_spm(uint32_t n_vocab, tok_out *out)
{
    cinfer_status st = CINFER_OK;
    vocab v = {0};
    word_list wl = {0};
    uint32_t (*merges)[2] = NULL;
    int32_t sym_of_byte[256];
    uint32_t letters[26];
    const uint32_t n_fixed = 3 + 256;
    static const char space_piece[] = "\xe2\x96\x81"; /* U+2581 */

    /* Alphabet: the space marker, letters by frequency, then the rest of
     * printable ASCII; truncated when the vocabulary is too small. */
    char alpha[96];
    uint32_t n_alpha = 0;
    for (int i = 0; i < 26; i++)
        alpha[n_alpha++] = letter_order[i];
    for (int c = 0x21; c <= 0x7e; c++)
        if (!(c >= 'a' && c <= 'z'))
            alpha[n_alpha++] = (char)c;
    uint32_t room = n_vocab - n_fixed;
    uint32_t n_chars = 1 + n_alpha; /* + the space marker */
    if (n_chars > room)
        n_chars = room;
    uint32_t n_merges = room - n_chars;

    for (int b = 0; b < 256; b++)
        sym_of_byte[b] = -1;
    if (vocab_add(&v, space_piece, 3) < 0)
        goto fail_nomem;
    for (uint32_t i = 0; i + 1 < n_chars; i++) {
        if (vocab_add(&v, &alpha[i], 1) < 0)
            goto fail_nomem;
        sym_of_byte[(uint8_t)alpha[i]] = (int32_t)(i + 1);
    }
    uint32_t n_letters = 0;
    for (int i = 0; i < 26; i++)
        if (sym_of_byte[(uint8_t)letter_order[i]] >= 0)
            letters[n_letters++] = (uint32_t)sym_of_byte[(uint8_t)letter_order[i]];

    split_ctx sc = {&wl, sym_of_byte, 1, 0};
    if (!pretokenize(corpus, sizeof corpus - 1, emit_word, &sc))
        goto fail_nomem;
    merges = malloc((n_merges ? n_merges : 1) * sizeof *merges);
    if (!merges)
        goto fail_nomem;
    st = train(&v, &wl, n_merges, letters, n_letters, merges);
    if (st != CINFER_OK)
        goto fail;

    out->n_vocab = n_vocab;
    out->tokens = calloc(n_vocab, sizeof *out->tokens);
    out->types = malloc(n_vocab * sizeof *out->types);
    out->scores = malloc(n_vocab * sizeof *out->scores);
    if (!out->tokens || !out->types || !out->scores)
        goto fail_nomem;
    static const char *const specials[3] = {"<unk>", "<s>", "</s>"};
    static const int32_t special_types[3] = {2, 3, 3};
    for (uint32_t i = 0; i < 3; i++) {
        out->tokens[i] = strdup(specials[i]);
        if (!out->tokens[i])
            goto fail_nomem;
        out->types[i] = special_types[i];
        out->scores[i] = 0.0f;
    }
    for (uint32_t b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        out->tokens[3 + b] = strdup(name);
        if (!out->tokens[3 + b])
            goto fail_nomem;
        out->types[3 + b] = 6;
        out->scores[3 + b] = 0.0f;
    }
    /* Builder ids: chars 0..n_chars-1, merged pieces after them. Output:
     * merged pieces first (score -1, -2, ...), then the chars. */
    for (uint32_t i = 0; i < v.n; i++) {
        uint32_t id;
        float score;
        if (i < n_chars) {
            id = n_fixed + n_merges + i;
            score = -(float)(n_merges + 1 + i);
        } else {
            id = n_fixed + (i - n_chars);
            score = -(float)(i - n_chars + 1);
        }
        out->tokens[id] = strdup(v.text[i]);
        if (!out->tokens[id])
            goto fail_nomem;
        out->types[id] = 1;
        out->scores[id] = score;
    }
    out->unk = 0;
    out->bos = 1;
    out->eos = 2;
    out->pad = 0;
    goto done;

fail_nomem:
    st = nomem();
fail:
    tok_out_free(out);
done:
    free(merges);
    words_free(&wl);
    vocab_free(&v);
    return st;
}

/* ====================================================================== */
/* weights                                                                 */
/* ====================================================================== */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Adds tensor `name` [ne0, ne1] (ne1 = 0: 1-D) of type `dt`, elements
 * uniform with mean `mean` and standard deviation `std`. */
static cinfer_status add_random(cinfer_gguf_writer *w, const char *name,
                                cinfer_dtype dt, int64_t ne0, int64_t ne1,
                                float mean, float std, uint64_t seed)
{
    int64_t rows = ne1 > 0 ? ne1 : 1;
    size_t row_bytes = cinfer_dtype_row_bytes(dt, ne0);
    size_t n_bytes = row_bytes * (size_t)rows;
    uint8_t *data = malloc(n_bytes);
    float *row = malloc((size_t)ne0 * sizeof *row);
    cinfer_status st;
    if (!data || !row) {
        st = nomem();
        goto out;
    }
    uint64_t s = seed ^ fnv(name, strlen(name));
    float half = std * 1.7320508f; /* uniform [-a, a] has std a/sqrt(3) */
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < ne0; i++) {
            float u = (float)((splitmix(&s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
            row[i] = mean + half * u;
        }
        cinfer_quantize_row(dt, row, data + (size_t)r * row_bytes, ne0);
    }
    int64_t ne[2] = {ne0, rows};
    st = cinfer_gguf_writer_add_tensor(w, name, dt, ne1 > 0 ? 2 : 1, ne, data,
                                       n_bytes);
out:
    free(row);
    free(data);
    return st;
}

/* ====================================================================== */
/* the model                                                               */
/* ====================================================================== */

static uint32_t head_size(const cinfer_tinymodel_params *p);
static float llama3_low(const cinfer_tinymodel_params *p);
static float llama3_high(const cinfer_tinymodel_params *p);

/* Llama 3's rope_freqs.weight, as convert_hf_to_gguf.py computes it from a
 * config's rope_scaling (rope_type llama3): pair i's frequency
 * base^(-2i/dim) (float32), its wavelength 2 pi / freq; short wavelengths
 * (< orig / high) keep factor 1, long ones (> orig / low) get `factor`,
 * those between a smooth blend. */
static cinfer_status add_llama3_factors(cinfer_gguf_writer *w,
                                        const cinfer_tinymodel_params *p)
{
    int dim = (int)head_size(p), n = dim / 2;
    float *f = malloc(sizeof(float) * (size_t)n);
    if (!f)
        return nomem();
    double factor = p->rope_factor, low = llama3_low(p), high = llama3_high(p);
    double orig = p->rope_orig_ctx ? p->rope_orig_ctx : 8192;
    double low_wavelen = orig / low, high_wavelen = orig / high;
    for (int i = 0; i < n; i++) {
        float freq = 1.0f / powf(p->rope_theta, (float)(2 * i) / (float)dim);
        double wavelen = 2.0 * M_PI / freq;
        if (wavelen < high_wavelen) {
            f[i] = 1.0f;
        } else if (wavelen > low_wavelen) {
            f[i] = (float)factor;
        } else {
            double smooth = (orig / wavelen - low) / (high - low);
            f[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
    int64_t ne[1] = {n};
    cinfer_status st = cinfer_gguf_writer_add_tensor(
        w, "rope_freqs.weight", CINFER_DTYPE_F32, 1, ne, f,
        sizeof(float) * (size_t)n);
    free(f);
    return st;
}

cinfer_tinymodel_params cinfer_tinymodel_default_params(void)
{
    cinfer_tinymodel_params p;
    memset(&p, 0, sizeof p);
    p.arch = "llama";
    p.n_layer = 2;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 128;
    p.n_vocab = 512;
    p.n_ctx = 256;
    p.rope_theta = 10000.0f;
    p.norm_eps = 1e-5f;
    p.weight_dtype = CINFER_DTYPE_F32;
    p.embd_dtype = CINFER_DTYPE_F32;
    p.tied_output = 1;
    p.seed = 1;
    p.tokenizer = "gpt2";
    p.pre = NULL;
    p.chat_template = 1;
    p.alignment = 0;
    return p;
}

static int weight_type_ok(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_F32:
    case CINFER_DTYPE_F16:
    case CINFER_DTYPE_BF16:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
    case CINFER_DTYPE_Q5_0:
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_NL:
    case CINFER_DTYPE_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

/* llama.cpp's general.file_type for a weight type. */
static uint32_t file_type(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_F16: return 1;
    case CINFER_DTYPE_Q4_0: return 2;
    case CINFER_DTYPE_Q4_1: return 3;
    case CINFER_DTYPE_Q8_0: return 7;
    case CINFER_DTYPE_Q5_0: return 8;
    case CINFER_DTYPE_Q4_K: return 15; /* MOSTLY_Q4_K_M */
    case CINFER_DTYPE_Q5_K: return 17; /* MOSTLY_Q5_K_M */
    case CINFER_DTYPE_Q6_K: return 18;
    case CINFER_DTYPE_Q2_K: return 10;
    case CINFER_DTYPE_Q3_K: return 12; /* MOSTLY_Q3_K_M */
    case CINFER_DTYPE_IQ4_NL: return 25;
    case CINFER_DTYPE_IQ4_XS: return 30;
    case CINFER_DTYPE_BF16: return 32;
    default: return 0;
    }
}

static uint32_t head_size(const cinfer_tinymodel_params *p)
{
    return p->head_dim ? p->head_dim : p->n_embd / p->n_head;
}

static float llama3_low(const cinfer_tinymodel_params *p)
{
    return p->rope_low_freq > 0.0f ? p->rope_low_freq : 1.0f;
}

static float llama3_high(const cinfer_tinymodel_params *p)
{
    return p->rope_high_freq > 0.0f ? p->rope_high_freq : 4.0f;
}

static cinfer_status bad(const char *field, const char *why, long long v)
{
    return cinfer_set_error(CINFER_E_INVALID_ARG, "tinymodel: %s = %lld %s",
                            field, v, why);
}

static cinfer_status validate(const cinfer_tinymodel_params *p,
                              const char *arch, const char *tok)
{
    if (strcmp(arch, "llama") != 0 && strcmp(arch, "qwen2") != 0 &&
        strcmp(arch, "qwen3") != 0 && strcmp(arch, "gemma3") != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: arch '%s' (expected llama, qwen2, "
                                "qwen3 or gemma3)",
                                arch);
    if (p->sliding_window && strcmp(arch, "gemma3") != 0)
        return bad("sliding_window", "(only gemma3 has one)",
                   p->sliding_window);
    int spm = strcmp(tok, "llama") == 0;
    if (!spm && strcmp(tok, "gpt2") != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: tokenizer '%s' (expected gpt2 or "
                                "llama)",
                                tok);
    if (p->n_layer < 1 || p->n_layer > 1024)
        return bad("n_layer", "(must be 1..1024)", p->n_layer);
    if (p->n_head < 1)
        return bad("n_head", "(must be >= 1)", p->n_head);
    if (p->n_embd < 1 || p->n_embd > 65536 ||
        (!p->head_dim && p->n_embd % p->n_head != 0))
        return bad("n_embd", "(must be 1..65536 and a multiple of n_head)",
                   p->n_embd);
    if (p->head_dim > 1024 || p->head_dim % 2 != 0)
        return bad("head_dim", "(must be 0, or even and <= 1024)",
                   p->head_dim);
    if ((head_size(p)) % 2 != 0 || head_size(p) < 2)
        return bad("n_embd / n_head", "(head size must be even for RoPE)",
                   head_size(p));
    if (p->n_head_kv < 1 || p->n_head % p->n_head_kv != 0)
        return bad("n_head_kv", "(must be >= 1 and divide n_head)",
                   p->n_head_kv);
    if (p->n_ff < 1 || p->n_ff > 262144)
        return bad("n_ff", "(must be 1..262144)", p->n_ff);
    uint32_t min_vocab = spm ? 260 : 259;
    if (p->n_vocab < min_vocab || p->n_vocab > 1000000)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: n_vocab = %u (must be %u..1000000 "
                                "for the %s tokenizer)",
                                p->n_vocab, min_vocab, tok);
    if (p->n_ctx < 1)
        return bad("n_ctx", "(must be >= 1)", p->n_ctx);
    if (!(p->rope_theta > 0.0f) || !isfinite(p->rope_theta))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: rope_theta = %g (must be > 0)",
                                (double)p->rope_theta);
    if (!(p->norm_eps > 0.0f) || !isfinite(p->norm_eps))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: norm_eps = %g (must be > 0)",
                                (double)p->norm_eps);
    if (!weight_type_ok(p->weight_dtype))
        return bad("weight_dtype", "(must be F32, F16, BF16, Q8_0, Q4_0, "
                                   "Q4_1, Q5_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                                   "IQ4_NL or IQ4_XS)",
                   p->weight_dtype);
    if (!weight_type_ok(p->embd_dtype))
        return bad("embd_dtype", "(must be F32, F16, BF16, Q8_0, Q4_0, "
                                 "Q4_1, Q5_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
                                 "IQ4_NL or IQ4_XS)",
                   p->embd_dtype);
    int wq = cinfer_dtype_block_elems(p->weight_dtype);
    int eq = cinfer_dtype_block_elems(p->embd_dtype);
    if (p->n_embd % wq != 0 || p->n_embd % eq != 0)
        return bad("n_embd", "(must be a multiple of 32 for quantized types, "
                             "256 for K-quants)",
                   p->n_embd);
    if (p->n_ff % wq != 0)
        return bad("n_ff", "(must be a multiple of 32 for quantized types, "
                           "256 for K-quants)",
                   p->n_ff);
    if (((int64_t)p->n_head * head_size(p)) % wq != 0)
        return bad("n_head * head_dim", "(must be a multiple of 32 for "
                                        "quantized types, 256 for K-quants)",
                   (long long)p->n_head * head_size(p));
    const char *rs = p->rope_scaling;
    if (rs && strcmp(rs, "none") != 0 && strcmp(rs, "linear") != 0 &&
        strcmp(rs, "llama3") != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: rope_scaling '%s' (expected none, "
                                "linear or llama3)",
                                rs);
    if (rs && strcmp(rs, "none") != 0 &&
        (!(p->rope_factor > 0.0f) || !isfinite(p->rope_factor)))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: rope_factor = %g (must be > 0 "
                                "with rope_scaling %s)",
                                (double)p->rope_factor, rs);
    if (!(p->rope_low_freq >= 0.0f) || !(p->rope_high_freq >= 0.0f) ||
        !isfinite(p->rope_low_freq) || !isfinite(p->rope_high_freq))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: rope_low_freq / rope_high_freq "
                                "must be finite and >= 0");
    if (rs && strcmp(rs, "llama3") == 0 &&
        llama3_low(p) == llama3_high(p))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: rope_low_freq and rope_high_freq "
                                "must differ");
    if (p->alignment != 0 && (p->alignment & (p->alignment - 1)) != 0)
        return bad("alignment", "(must be 0 or a power of two)", p->alignment);
    return CINFER_OK;
}

/* Shorthand: stop at the first failing writer call. */
#define TRY(expr)                                                              \
    do {                                                                       \
        st = (expr);                                                           \
        if (st != CINFER_OK)                                                   \
            goto fail;                                                         \
    } while (0)

static cinfer_status write_metadata(cinfer_gguf_writer *w,
                                    const cinfer_tinymodel_params *p,
                                    const char *arch, const char *tok)
{
    cinfer_status st;
    char key[128];
    int quant = cinfer_dtype_block_elems(p->weight_dtype) > 1 ||
                cinfer_dtype_block_elems(p->embd_dtype) > 1;
#define AKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    TRY(cinfer_gguf_writer_set_str(w, "general.architecture", arch));
    TRY(cinfer_gguf_writer_set_str(w, "general.type", "model"));
    TRY(cinfer_gguf_writer_set_str(w, "general.name", "cinfer tiny random"));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("block_count"), p->n_layer));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("context_length"), p->n_ctx));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("embedding_length"), p->n_embd));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("feed_forward_length"), p->n_ff));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("attention.head_count"),
                                   p->n_head));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("attention.head_count_kv"),
                                   p->n_head_kv));
    TRY(cinfer_gguf_writer_set_f32(w, AKEY("rope.freq_base"), p->rope_theta));
    TRY(cinfer_gguf_writer_set_f32(w, AKEY("attention.layer_norm_rms_epsilon"),
                                   p->norm_eps));
    TRY(cinfer_gguf_writer_set_u32(w, "general.file_type",
                                   file_type(p->weight_dtype)));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("vocab_size"), p->n_vocab));
    if (p->sliding_window)
        TRY(cinfer_gguf_writer_set_u32(w, AKEY("attention.sliding_window"),
                                       p->sliding_window));
    TRY(cinfer_gguf_writer_set_u32(w, AKEY("rope.dimension_count"),
                                   head_size(p)));
    if (p->head_dim) {
        TRY(cinfer_gguf_writer_set_u32(w, AKEY("attention.key_length"),
                                       p->head_dim));
        TRY(cinfer_gguf_writer_set_u32(w, AKEY("attention.value_length"),
                                       p->head_dim));
    }
    if (p->rope_scaling && strcmp(p->rope_scaling, "linear") == 0) {
        TRY(cinfer_gguf_writer_set_str(w, AKEY("rope.scaling.type"),
                                       "linear"));
        TRY(cinfer_gguf_writer_set_f32(w, AKEY("rope.scaling.factor"),
                                       p->rope_factor));
    }
    if (quant)
        TRY(cinfer_gguf_writer_set_u32(w, "general.quantization_version", 2));
#undef AKEY
    return CINFER_OK;
fail:
    return st;
}

static cinfer_status write_tokenizer(cinfer_gguf_writer *w,
                                     const cinfer_tinymodel_params *p,
                                     const char *tok)
{
    cinfer_status st;
    tok_out t;
    memset(&t, 0, sizeof t);
    int spm = strcmp(tok, "llama") == 0;
    st = spm ? build_spm(p->n_vocab, &t) : build_gpt2(p->n_vocab, &t);
    if (st != CINFER_OK)
        return st;
    TRY(cinfer_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix",
                                    spm));
    TRY(cinfer_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", spm));
    TRY(cinfer_gguf_writer_set_str(w, "tokenizer.ggml.model", tok));
    if (!spm)
        TRY(cinfer_gguf_writer_set_str(w, "tokenizer.ggml.pre",
                                       p->pre ? p->pre : "gpt-2"));
    TRY(cinfer_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                       (const char *const *)t.tokens,
                                       t.n_vocab));
    if (spm)
        TRY(cinfer_gguf_writer_set_arr(w, "tokenizer.ggml.scores",
                                       CINFER_GGUF_FLOAT32, t.scores,
                                       t.n_vocab));
    TRY(cinfer_gguf_writer_set_arr(w, "tokenizer.ggml.token_type",
                                   CINFER_GGUF_INT32, t.types, t.n_vocab));
    if (!spm)
        TRY(cinfer_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges",
                                           (const char *const *)t.merges,
                                           t.n_merges));
    TRY(cinfer_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", t.bos));
    TRY(cinfer_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", t.eos));
    TRY(cinfer_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id",
                                   t.unk));
    TRY(cinfer_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id",
                                   t.pad));
    if (p->chat_template)
        TRY(cinfer_gguf_writer_set_str(w, "tokenizer.chat_template",
                                       chatml_template));
fail:
    tok_out_free(&t);
    return st;
}

static cinfer_status write_tensors(cinfer_gguf_writer *w,
                                   const cinfer_tinymodel_params *p,
                                   const char *arch)
{
    cinfer_status st;
    char name[64];
    int64_t d = p->n_embd;
    int64_t hd = head_size(p);
    int64_t d_q = hd * p->n_head;
    int64_t d_kv = hd * p->n_head_kv;
    int64_t ff = p->n_ff;
    cinfer_dtype wt = p->weight_dtype;
    uint64_t seed = p->seed;
    float embd_std = 2.0f / sqrtf((float)d); /* logits of std ~2 */
    int bias = strcmp(arch, "qwen2") == 0;
    int gemma = strcmp(arch, "gemma3") == 0;
    int qk_norm = strcmp(arch, "qwen3") == 0 || gemma;

    TRY(add_random(w, "token_embd.weight", p->embd_dtype, d, p->n_vocab, 0.0f,
                   embd_std, seed));
    if (p->rope_scaling && strcmp(p->rope_scaling, "llama3") == 0)
        TRY(add_llama3_factors(w, p));
    for (uint32_t l = 0; l < p->n_layer; l++) {
#define BLK(suffix) (snprintf(name, sizeof name, "blk.%u.%s", l, suffix), name)
        TRY(add_random(w, BLK("attn_norm.weight"), CINFER_DTYPE_F32, d, 0,
                       1.0f, 0.05f, seed));
        TRY(add_random(w, BLK("attn_q.weight"), wt, d, d_q, 0.0f,
                       1.0f / sqrtf((float)d), seed));
        TRY(add_random(w, BLK("attn_k.weight"), wt, d, d_kv, 0.0f,
                       1.0f / sqrtf((float)d), seed));
        TRY(add_random(w, BLK("attn_v.weight"), wt, d, d_kv, 0.0f,
                       1.0f / sqrtf((float)d), seed));
        if (bias) {
            TRY(add_random(w, BLK("attn_q.bias"), CINFER_DTYPE_F32, d_q, 0,
                           0.0f, 0.05f, seed));
            TRY(add_random(w, BLK("attn_k.bias"), CINFER_DTYPE_F32, d_kv, 0,
                           0.0f, 0.05f, seed));
            TRY(add_random(w, BLK("attn_v.bias"), CINFER_DTYPE_F32, d_kv, 0,
                           0.0f, 0.05f, seed));
        }
        if (qk_norm) {
            /* spread wider than the layer norms, so that each head's
             * weights matter */
            TRY(add_random(w, BLK("attn_q_norm.weight"), CINFER_DTYPE_F32,
                           hd, 0, 1.0f, 0.3f, seed));
            TRY(add_random(w, BLK("attn_k_norm.weight"), CINFER_DTYPE_F32,
                           hd, 0, 1.0f, 0.3f, seed));
        }
        TRY(add_random(w, BLK("attn_output.weight"), wt, d_q, d, 0.0f,
                       1.0f / sqrtf((float)d_q), seed));
        TRY(add_random(w, BLK("ffn_norm.weight"), CINFER_DTYPE_F32, d, 0,
                       1.0f, 0.05f, seed));
        TRY(add_random(w, BLK("ffn_gate.weight"), wt, d, ff, 0.0f,
                       1.0f / sqrtf((float)d), seed));
        TRY(add_random(w, BLK("ffn_up.weight"), wt, d, ff, 0.0f,
                       1.0f / sqrtf((float)d), seed));
        TRY(add_random(w, BLK("ffn_down.weight"), wt, ff, d, 0.0f,
                       1.0f / sqrtf((float)ff), seed));
        if (gemma) {
            /* the file holds 1 + w, as llama.cpp's converter writes it */
            TRY(add_random(w, BLK("post_attention_norm.weight"),
                           CINFER_DTYPE_F32, d, 0, 1.0f, 0.05f, seed));
            TRY(add_random(w, BLK("post_ffw_norm.weight"), CINFER_DTYPE_F32,
                           d, 0, 1.0f, 0.05f, seed));
        }
#undef BLK
    }
    TRY(add_random(w, "output_norm.weight", CINFER_DTYPE_F32, d, 0, 1.0f,
                   0.05f, seed));
    if (!p->tied_output)
        TRY(add_random(w, "output.weight", wt, d, p->n_vocab, 0.0f, embd_std,
                       seed));
    return CINFER_OK;
fail:
    return st;
}

/* Builds the whole model in a writer. */
static cinfer_status build(const cinfer_tinymodel_params *p,
                           cinfer_gguf_writer **out)
{
    cinfer_status st;
    if (!p)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tinymodel: params must not be NULL");
    const char *arch = p->arch ? p->arch : "llama";
    const char *tok = p->tokenizer ? p->tokenizer : "gpt2";
    st = validate(p, arch, tok);
    if (st != CINFER_OK)
        return st;
    cinfer_gguf_writer_params wp = cinfer_gguf_writer_default_params();
    wp.alignment = p->alignment;
    cinfer_gguf_writer *w;
    st = cinfer_gguf_writer_create(&wp, &w);
    if (st != CINFER_OK)
        return st;
    TRY(write_metadata(w, p, arch, tok));
    TRY(write_tokenizer(w, p, tok));
    TRY(write_tensors(w, p, arch));
    *out = w;
    return CINFER_OK;
fail:
    cinfer_gguf_writer_destroy(w);
    return st;
}

cinfer_status cinfer_tinymodel_write(const cinfer_tinymodel_params *p,
                                     const char *path)
{
    cinfer_gguf_writer *w;
    cinfer_status st = build(p, &w);
    if (st != CINFER_OK)
        return st;
    st = cinfer_gguf_writer_write_file(w, path);
    cinfer_gguf_writer_destroy(w);
    return st;
}

cinfer_status cinfer_tinymodel_write_mem(const cinfer_tinymodel_params *p,
                                         void **buf, size_t *size)
{
    cinfer_gguf_writer *w;
    cinfer_status st = build(p, &w);
    if (st != CINFER_OK)
        return st;
    st = cinfer_gguf_writer_write_mem(w, buf, size);
    cinfer_gguf_writer_destroy(w);
    return st;
}
