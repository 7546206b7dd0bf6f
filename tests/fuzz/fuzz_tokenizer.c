/*
 * fuzz_tokenizer.c - libFuzzer target for the tokenizer.
 *
 * Input: one flags byte, then the text.
 *   bit 0  parse_special      bit 1  add_special
 *   bit 2  use the SentencePiece vocabulary (tests/data/spm_tiny.gguf)
 *          instead of the byte-level BPE one
 *   bit 3  render control tokens when decoding
 *
 * The byte-level BPE vocabulary is the default model's when it is present,
 * else a small one built in memory with the GGUF writer. For every input:
 *   - encode succeeds, or fails with CINFER_E_RANGE only when the id buffer
 *     is too small, and a retry with the reported size fits;
 *   - every id is in the vocabulary and decodes;
 *   - byte-level BPE without add_special: decoding gives back the input
 *     (minus bytes the vocabulary has no token for, which llama.cpp drops
 *     too), control tokens rendered when they were parsed;
 *   - incremental decoding, token by token, gives the same text as one push
 *     of the whole decoded bytes, every chunk whole UTF-8.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../engine/tokenizer.h"

#ifndef CINFER_DEFAULT_MODEL
#define CINFER_DEFAULT_MODEL ""
#endif

#define FUZZ_CHECK(cond)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__,        \
                    __LINE__, #cond, cinfer_last_error());                     \
            abort();                                                           \
        }                                                                      \
    } while (0)

typedef struct {
    cinfer_tokenizer *t;
    int has_token[256]; /* the byte alone encodes to a token */
} vocab;

static vocab bpe, spm;
static int ready;

static cinfer_tokenizer *from_gguf(const cinfer_gguf_params *gp)
{
    cinfer_gguf *g;
    if (cinfer_gguf_create(gp, &g) != CINFER_OK)
        return NULL;
    cinfer_tokenizer_params p = cinfer_tokenizer_default_params();
    p.gguf = g;
    cinfer_tokenizer *t = NULL;
    if (cinfer_tokenizer_create(&p, &t) != CINFER_OK)
        t = NULL;
    cinfer_gguf_destroy(g);
    return t;
}

/* GPT-2's printable form of byte b, as UTF-8. */
static void byte_char(unsigned b, char *out)
{
    unsigned cp = b;
    if (!((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
          (b >= 0xAE && b <= 0xFF))) {
        unsigned n = 0;
        for (unsigned c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) ||
                  (c >= 0xAE && c <= 0xFF)))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A small byte-level BPE vocabulary: the 256 byte tokens, a few merges and
 * the chat control tokens. */
static cinfer_tokenizer *small_bpe(void)
{
    static const char *merge_pairs[][2] = {
        {"t", "h"}, {"th", "e"}, {"\xc4\xa0", "t"}, {"\xc4\xa0t", "he"},
        {"i", "n"}, {"in", "g"}, {"\xc4\xa0", "a"}, {"e", "r"},
        {"\xc4\xa0", "\xc4\xa0"}, {"\xc4\x8a", "\xc4\x8a"}, {"o", "n"},
        {"\xc3\xa4", "\xc2\xbd"}, {"\xc3\xa4\xc2\xbd", "\xc5\x82"},
    };
    size_t n_merges = sizeof merge_pairs / sizeof merge_pairs[0];
    size_t n_tok = 256 + n_merges + 3;
    char **toks = calloc(n_tok, sizeof(char *));
    char **merges = calloc(n_merges, sizeof(char *));
    int32_t *types = calloc(n_tok, sizeof(int32_t));
    for (unsigned b = 0; b < 256; b++) {
        toks[b] = malloc(4);
        byte_char(b, toks[b]);
        types[b] = 1;
    }
    for (size_t i = 0; i < n_merges; i++) {
        size_t l0 = strlen(merge_pairs[i][0]), l1 = strlen(merge_pairs[i][1]);
        merges[i] = malloc(l0 + l1 + 2);
        snprintf(merges[i], l0 + l1 + 2, "%s %s", merge_pairs[i][0],
                 merge_pairs[i][1]);
        toks[256 + i] = malloc(l0 + l1 + 1);
        snprintf(toks[256 + i], l0 + l1 + 1, "%s%s", merge_pairs[i][0],
                 merge_pairs[i][1]);
        types[256 + i] = 1;
    }
    const char *ctl[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++) {
        toks[256 + n_merges + (size_t)i] = strdup(ctl[i]);
        types[256 + n_merges + (size_t)i] = 3;
    }
    cinfer_gguf_writer_params wp = cinfer_gguf_writer_default_params();
    cinfer_gguf_writer *w = NULL;
    cinfer_tokenizer *t = NULL;
    void *buf = NULL;
    size_t size = 0;
    if (cinfer_gguf_writer_create(&wp, &w) == CINFER_OK &&
        cinfer_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2") == 0 &&
        cinfer_gguf_writer_set_str(w, "tokenizer.ggml.pre", "smollm") == 0 &&
        cinfer_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                       (const char *const *)toks, n_tok) == 0 &&
        cinfer_gguf_writer_set_arr(w, "tokenizer.ggml.token_type",
                                   CINFER_GGUF_INT32, types, n_tok) == 0 &&
        cinfer_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges",
                                       (const char *const *)merges,
                                       n_merges) == 0 &&
        cinfer_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id",
                                   (uint32_t)(n_tok - 1)) == 0 &&
        cinfer_gguf_writer_write_mem(w, &buf, &size) == 0) {
        cinfer_gguf_params gp = cinfer_gguf_default_params();
        gp.data = buf;
        gp.size = size;
        t = from_gguf(&gp);
    }
    cinfer_gguf_writer_destroy(w);
    free(buf);
    for (size_t i = 0; i < n_tok; i++)
        free(toks[i]);
    for (size_t i = 0; i < n_merges; i++)
        free(merges[i]);
    free(toks);
    free(merges);
    free(types);
    return t;
}

static void fill_has_token(vocab *v)
{
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id;
        size_t n;
        v->has_token[b] = cinfer_tokenizer_encode(v->t, &c, 1, 0, 0, &id, 1,
                                                  &n) == CINFER_OK &&
                          n == 1;
    }
}

static void init(void)
{
    const char *mp = getenv("CINFER_MODEL");
    if (!mp || !*mp)
        mp = CINFER_DEFAULT_MODEL;
    struct stat st;
    if (*mp && stat(mp, &st) == 0) {
        cinfer_gguf_params gp = cinfer_gguf_default_params();
        gp.path = mp;
        bpe.t = from_gguf(&gp);
    }
    if (!bpe.t)
        bpe.t = small_bpe();
    FUZZ_CHECK(bpe.t != NULL);
    fill_has_token(&bpe);

    /* tests/data/spm_tiny.gguf, next to this file's folder */
    char path[4096];
    const char *file = __FILE__;
    const char *slash = strrchr(file, '/');
    int dir_len = slash ? (int)(slash - file) : 1;
    snprintf(path, sizeof path, "%.*s/../data/spm_tiny.gguf", dir_len,
             slash ? file : ".");
    if (stat(path, &st) == 0) {
        cinfer_gguf_params gp = cinfer_gguf_default_params();
        gp.path = path;
        spm.t = from_gguf(&gp);
        if (spm.t)
            fill_has_token(&spm);
    }
    ready = 1;
}

static int utf8_whole(const char *s, size_t n)
{
    cinfer_detok d;
    cinfer_detok_init(&d);
    /* valid UTF-8 passes through a fresh detok unchanged */
    char *out = malloc(3 * (n + 3) + 1);
    size_t k, k2;
    int ok = cinfer_detok_push_bytes(&d, s, n, out, 3 * (n + 3), &k) == 0 &&
             d.n_pend == 0 && k == n && memcmp(out, s, n) == 0 &&
             cinfer_detok_flush(&d, out, 3, &k2) == 0 && k2 == 0;
    free(out);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ready)
        init();
    if (size < 1)
        return 0;
    int flags = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int parse = flags & 1, add = (flags >> 1) & 1, special = (flags >> 3) & 1;
    vocab *v = (flags & 4) && spm.t ? &spm : &bpe;
    const cinfer_tokenizer *t = v->t;

    /* encode, with a buffer that is usually too small at first */
    size_t cap = len / 4 + 1, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    cinfer_status st =
        cinfer_tokenizer_encode(t, text, len, add, parse, ids, cap, &n);
    if (st == CINFER_E_RANGE) {
        FUZZ_CHECK(n > cap);
        cap = n;
        ids = realloc(ids, sizeof(int32_t) * cap);
        size_t n2;
        st = cinfer_tokenizer_encode(t, text, len, add, parse, ids, cap, &n2);
        FUZZ_CHECK(st == CINFER_OK && n2 == n);
    }
    FUZZ_CHECK(st == CINFER_OK);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < cinfer_tokenizer_n_vocab(t));

    /* full decode */
    size_t need;
    st = cinfer_tokenizer_decode(t, ids, n, special, NULL, 0, &need);
    FUZZ_CHECK(st == CINFER_OK || st == CINFER_E_RANGE);
    char *full = malloc(need + 1);
    size_t full_len;
    FUZZ_CHECK(cinfer_tokenizer_decode(t, ids, n, special, full, need,
                                       &full_len) == CINFER_OK);
    FUZZ_CHECK(full_len == need);

    /* byte-level BPE round trip */
    if (v == &bpe && !add && (special || !parse)) {
        char *want = malloc(len + 1);
        size_t wl = 0;
        for (size_t i = 0; i < len; i++)
            if (v->has_token[(unsigned char)text[i]])
                want[wl++] = text[i];
        FUZZ_CHECK(full_len == wl && memcmp(full, want, wl) == 0);
        free(want);
    }

    /* incremental == one push of the whole, chunks whole UTF-8 */
    size_t out_max = cinfer_detok_out_max(t);
    char *chunk = malloc(out_max);
    char *inc = malloc(3 * (full_len + 3) + 4);
    size_t inc_len = 0, k;
    cinfer_detok d;
    cinfer_detok_init(&d);
    d.special = special;
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(cinfer_detok_push(t, &d, ids[i], chunk, out_max, &k) ==
                   CINFER_OK);
        FUZZ_CHECK(utf8_whole(chunk, k));
        FUZZ_CHECK(inc_len + k <= 3 * (full_len + 3));
        memcpy(inc + inc_len, chunk, k);
        inc_len += k;
    }
    FUZZ_CHECK(cinfer_detok_flush(&d, chunk, out_max, &k) == CINFER_OK);
    memcpy(inc + inc_len, chunk, k);
    inc_len += k;

    char *whole = malloc(3 * (full_len + 3) + 4);
    size_t whole_len, k2;
    cinfer_detok d2;
    cinfer_detok_init(&d2);
    FUZZ_CHECK(cinfer_detok_push_bytes(&d2, full, full_len, whole,
                                       3 * (full_len + 3), &whole_len) ==
               CINFER_OK);
    FUZZ_CHECK(cinfer_detok_flush(&d2, whole + whole_len, 3, &k2) ==
               CINFER_OK);
    whole_len += k2;
    FUZZ_CHECK(inc_len == whole_len && memcmp(inc, whole, inc_len) == 0);
    if (utf8_whole(full, full_len))
        FUZZ_CHECK(whole_len == full_len && memcmp(whole, full, full_len) == 0);

    free(whole);
    free(inc);
    free(chunk);
    free(full);
    free(ids);
    return 0;
}
