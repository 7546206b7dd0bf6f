/*
 * test_tinymodel.c - tiny random GGUF models.
 *
 * Writes models of several shapes, weight types and both tokenizer kinds,
 * reads them back with the GGUF reader and checks llama.cpp's names and
 * shapes, the metadata, the tokenizer's internal consistency (unique token
 * texts, every merge made of existing tokens, score order), weight scales,
 * determinism, and that bad parameters are refused with a message naming
 * the field.
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/gguf.h"
#include "engine/tinymodel.h"
#include "harness.h"

/* Writes `p` to memory and opens it; the buffer comes back for freeing. */
static cinfer_gguf *open_model(const cinfer_tinymodel_params *p, void **buf,
                               size_t *size)
{
    *buf = NULL;
    CHECK_OK(cinfer_tinymodel_write_mem(p, buf, size));
    if (!*buf)
        return NULL;
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.data = *buf;
    gp.size = *size;
    cinfer_gguf *g = NULL;
    CHECK_OK(cinfer_gguf_create(&gp, &g));
    return g;
}

static uint32_t get_u32(const cinfer_gguf *g, const char *key)
{
    uint32_t v = 0xdeadbeef;
    CHECK_OK(cinfer_gguf_get_u32(g, key, &v));
    return v;
}

static int str_is(cinfer_gguf_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

static void check_str(const cinfer_gguf *g, const char *key, const char *want)
{
    cinfer_gguf_str s = {NULL, 0};
    CHECK_OK(cinfer_gguf_get_str(g, key, &s));
    if (!str_is(s, want)) {
        fprintf(stderr, "%s = '%.*s', want '%s'\n", key, (int)s.len,
                s.ptr ? s.ptr : "", want);
        harness_failed_checks++;
    }
}

static void check_tensor(const cinfer_gguf *g, const char *name,
                         cinfer_dtype dt, uint32_t n_dims, int64_t ne0,
                         int64_t ne1)
{
    const cinfer_gguf_tensor *t = cinfer_gguf_find_tensor(g, name);
    if (!t) {
        fprintf(stderr, "missing tensor %s\n", name);
        harness_failed_checks++;
        return;
    }
    if (t->dtype != dt || t->n_dims != n_dims || t->ne[0] != ne0 ||
        t->ne[1] != ne1) {
        fprintf(stderr, "%s: %s %u dims [%lld, %lld], want %s %u [%lld, %lld]\n",
                name, cinfer_dtype_name(t->dtype), t->n_dims,
                (long long)t->ne[0], (long long)t->ne[1],
                cinfer_dtype_name(dt), n_dims, (long long)ne0, (long long)ne1);
        harness_failed_checks++;
    }
}

/* Checks every tensor a model of params `p` must have, and no others. */
static void check_layout(const cinfer_gguf *g, const cinfer_tinymodel_params *p)
{
    const char *arch = p->arch ? p->arch : "llama";
    int bias = strcmp(arch, "qwen2") == 0;
    int qk_norm = strcmp(arch, "qwen3") == 0;
    int64_t hd = p->head_dim ? p->head_dim : p->n_embd / p->n_head;
    int64_t d = p->n_embd, d_q = hd * p->n_head, d_kv = hd * p->n_head_kv;
    int64_t ff = p->n_ff;
    const char *rs = p->rope_scaling ? p->rope_scaling : "none";
    cinfer_dtype wt = p->weight_dtype;
    char name[64];
    check_tensor(g, "token_embd.weight", p->embd_dtype, 2, d, p->n_vocab);
    for (uint32_t l = 0; l < p->n_layer; l++) {
#define N(s) (snprintf(name, sizeof name, "blk.%u.%s", l, s), name)
        check_tensor(g, N("attn_norm.weight"), CINFER_DTYPE_F32, 1, d, 1);
        check_tensor(g, N("attn_q.weight"), wt, 2, d, d_q);
        check_tensor(g, N("attn_k.weight"), wt, 2, d, d_kv);
        check_tensor(g, N("attn_v.weight"), wt, 2, d, d_kv);
        check_tensor(g, N("attn_output.weight"), wt, 2, d_q, d);
        check_tensor(g, N("ffn_norm.weight"), CINFER_DTYPE_F32, 1, d, 1);
        check_tensor(g, N("ffn_gate.weight"), wt, 2, d, ff);
        check_tensor(g, N("ffn_up.weight"), wt, 2, d, ff);
        check_tensor(g, N("ffn_down.weight"), wt, 2, ff, d);
        if (bias) {
            check_tensor(g, N("attn_q.bias"), CINFER_DTYPE_F32, 1, d_q, 1);
            check_tensor(g, N("attn_k.bias"), CINFER_DTYPE_F32, 1, d_kv, 1);
            check_tensor(g, N("attn_v.bias"), CINFER_DTYPE_F32, 1, d_kv, 1);
        } else {
            CHECK(cinfer_gguf_find_tensor(g, N("attn_q.bias")) == NULL);
        }
        if (qk_norm) {
            check_tensor(g, N("attn_q_norm.weight"), CINFER_DTYPE_F32, 1, hd, 1);
            check_tensor(g, N("attn_k_norm.weight"), CINFER_DTYPE_F32, 1, hd, 1);
        } else {
            CHECK(cinfer_gguf_find_tensor(g, N("attn_q_norm.weight")) == NULL);
        }
#undef N
    }
    check_tensor(g, "output_norm.weight", CINFER_DTYPE_F32, 1, d, 1);
    if (p->tied_output)
        CHECK(cinfer_gguf_find_tensor(g, "output.weight") == NULL);
    else
        check_tensor(g, "output.weight", wt, 2, d, p->n_vocab);
    int llama3 = strcmp(rs, "llama3") == 0;
    if (llama3)
        check_tensor(g, "rope_freqs.weight", CINFER_DTYPE_F32, 1, hd / 2, 1);
    else
        CHECK(cinfer_gguf_find_tensor(g, "rope_freqs.weight") == NULL);
    uint64_t want = 1 + (uint64_t)p->n_layer *
                            (9 + (bias ? 3 : 0) + (qk_norm ? 2 : 0)) +
                    1 + (p->tied_output ? 0 : 1) + (llama3 ? 1 : 0);
    CHECK_EQ_INT(cinfer_gguf_n_tensors(g), want);

    char key[96];
#define K(s) (snprintf(key, sizeof key, "%s.%s", arch, s), key)
    check_str(g, "general.architecture", arch);
    CHECK_EQ_INT(get_u32(g, K("block_count")), p->n_layer);
    CHECK_EQ_INT(get_u32(g, K("embedding_length")), p->n_embd);
    CHECK_EQ_INT(get_u32(g, K("feed_forward_length")), p->n_ff);
    CHECK_EQ_INT(get_u32(g, K("attention.head_count")), p->n_head);
    CHECK_EQ_INT(get_u32(g, K("attention.head_count_kv")), p->n_head_kv);
    CHECK_EQ_INT(get_u32(g, K("context_length")), p->n_ctx);
    CHECK_EQ_INT(get_u32(g, K("rope.dimension_count")), hd);
    CHECK_EQ_INT(cinfer_gguf_find_key(g, K("attention.key_length")) >= 0,
                 p->head_dim != 0);
    if (p->head_dim) {
        CHECK_EQ_INT(get_u32(g, K("attention.key_length")), p->head_dim);
        CHECK_EQ_INT(get_u32(g, K("attention.value_length")), p->head_dim);
    }
    int linear = strcmp(rs, "linear") == 0;
    CHECK_EQ_INT(cinfer_gguf_find_key(g, K("rope.scaling.type")) >= 0, linear);
    if (linear) {
        check_str(g, K("rope.scaling.type"), "linear");
        float fac = 0;
        CHECK_OK(cinfer_gguf_get_f32(g, K("rope.scaling.factor"), &fac));
        CHECK(fac == p->rope_factor);
    }
    CHECK_EQ_INT(get_u32(g, K("vocab_size")), p->n_vocab);
    float f = 0;
    CHECK_OK(cinfer_gguf_get_f32(g, K("rope.freq_base"), &f));
    CHECK(f == p->rope_theta);
    CHECK_OK(cinfer_gguf_get_f32(g, K("attention.layer_norm_rms_epsilon"), &f));
    CHECK(f == p->norm_eps);
#undef K
    cinfer_gguf_arr a;
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.tokens", &a));
    CHECK_EQ_INT(a.n, p->n_vocab);
}

static int cmp_str(const void *a, const void *b)
{
    const cinfer_gguf_str *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->ptr, y->ptr, n);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* All token texts distinct. */
static void check_unique(const cinfer_gguf_arr *tokens)
{
    cinfer_gguf_str *s = malloc(tokens->n * sizeof *s);
    for (uint64_t i = 0; i < tokens->n; i++)
        s[i] = cinfer_gguf_arr_str(tokens, i);
    qsort(s, tokens->n, sizeof *s, cmp_str);
    int dups = 0;
    for (uint64_t i = 1; i < tokens->n; i++)
        if (cmp_str(&s[i - 1], &s[i]) == 0 && dups++ < 3)
            fprintf(stderr, "duplicate token '%.*s'\n", (int)s[i].len, s[i].ptr);
    CHECK_EQ_INT(dups, 0);
    free(s);
}

/* Index of a token text, by linear search (test sizes are small). */
static int64_t token_id(const cinfer_gguf_arr *tokens, const char *s, size_t n)
{
    for (uint64_t i = 0; i < tokens->n; i++) {
        cinfer_gguf_str t = cinfer_gguf_arr_str(tokens, i);
        if (t.len == n && memcmp(t.ptr, s, n) == 0)
            return (int64_t)i;
    }
    return -1;
}

/* gpt2: merge i joins two existing tokens into token 256 + i. */
static void check_gpt2_vocab(const cinfer_gguf *g, uint32_t n_vocab)
{
    cinfer_gguf_arr tok, types, merges;
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok));
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.token_type", &types));
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.merges", &merges));
    CHECK_EQ_INT(tok.n, n_vocab);
    CHECK_EQ_INT(types.n, n_vocab);
    CHECK_EQ_INT(types.type, CINFER_GGUF_INT32);
    CHECK_EQ_INT(merges.n, n_vocab - 259);
    check_str(g, "tokenizer.ggml.model", "gpt2");
    check_str(g, "tokenizer.ggml.pre", "gpt-2");
    CHECK_EQ_INT(cinfer_gguf_find_key(g, "tokenizer.ggml.scores"), -1);

    /* Byte tokens in GPT-2's mapping. */
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 'a'), "a"));
    CHECK(str_is(cinfer_gguf_arr_str(&tok, '!'), "!"));
    CHECK(str_is(cinfer_gguf_arr_str(&tok, ' '), "\xc4\xa0"));  /* U+0120 */
    CHECK(str_is(cinfer_gguf_arr_str(&tok, '\n'), "\xc4\x8a")); /* U+010A */
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 0), "\xc4\x80"));    /* U+0100 */
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 0xff), "\xc3\xbf")); /* U+00FF */
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 0xad), "\xc5\x83")); /* U+0143 */
    const int32_t *ty = types.data;
    const char *specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++) {
        CHECK(str_is(cinfer_gguf_arr_str(&tok, n_vocab - 3 + (uint32_t)i), specials[i]));
        CHECK_EQ_INT(ty[n_vocab - 3 + (uint32_t)i], 3);
    }
    for (uint32_t i = 0; i < n_vocab - 3; i++)
        if (ty[i] != 1) {
            CHECK_EQ_INT(ty[i], 1);
            break;
        }
    CHECK_EQ_INT(get_u32(g, "tokenizer.ggml.bos_token_id"), n_vocab - 2);
    CHECK_EQ_INT(get_u32(g, "tokenizer.ggml.eos_token_id"), n_vocab - 1);
    CHECK_EQ_INT(get_u32(g, "tokenizer.ggml.unknown_token_id"), n_vocab - 3);
    int bv = -1;
    CHECK_OK(cinfer_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv));
    CHECK_EQ_INT(bv, 0);
    check_unique(&tok);

    /* Each merge "A B": A and B are tokens and A B is token 256 + i. The
     * first merges come from the text: the space-prefixed "the". */
    int bad = 0;
    for (uint64_t i = 0; i < merges.n; i++) {
        cinfer_gguf_str m = cinfer_gguf_arr_str(&merges, i);
        const char *sp = memchr(m.ptr, ' ', m.len);
        if (!sp || sp == m.ptr || sp == m.ptr + m.len - 1) {
            bad++;
            continue;
        }
        size_t la = (size_t)(sp - m.ptr), lb = m.len - la - 1;
        cinfer_gguf_str r = cinfer_gguf_arr_str(&tok, 256 + i);
        if (token_id(&tok, m.ptr, la) < 0 || token_id(&tok, sp + 1, lb) < 0 ||
            r.len != la + lb || memcmp(r.ptr, m.ptr, la) != 0 ||
            memcmp(r.ptr + la, sp + 1, lb) != 0) {
            if (bad++ < 3)
                fprintf(stderr, "bad merge %llu '%.*s' -> '%.*s'\n",
                        (unsigned long long)i, (int)m.len, m.ptr, (int)r.len, r.ptr);
        }
    }
    CHECK_EQ_INT(bad, 0);
    if (merges.n >= 10)
        CHECK(token_id(&tok, "\xc4\xa0the", 5) >= 256);
}

/* llama: specials, bytes, merged pieces by descending score, chars. */
static void check_spm_vocab(const cinfer_gguf *g, uint32_t n_vocab)
{
    cinfer_gguf_arr tok, types, scores;
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.tokens", &tok));
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.token_type", &types));
    CHECK_OK(cinfer_gguf_get_arr(g, "tokenizer.ggml.scores", &scores));
    CHECK_EQ_INT(tok.n, n_vocab);
    CHECK_EQ_INT(types.n, n_vocab);
    CHECK_EQ_INT(scores.n, n_vocab);
    CHECK_EQ_INT(scores.type, CINFER_GGUF_FLOAT32);
    check_str(g, "tokenizer.ggml.model", "llama");
    CHECK_EQ_INT(cinfer_gguf_find_key(g, "tokenizer.ggml.merges"), -1);
    CHECK_EQ_INT(cinfer_gguf_find_key(g, "tokenizer.ggml.pre"), -1);
    const int32_t *ty = types.data;
    const float *sc = scores.data;
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 0), "<unk>"));
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 1), "<s>"));
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 2), "</s>"));
    CHECK_EQ_INT(ty[0], 2);
    CHECK_EQ_INT(ty[1], 3);
    CHECK_EQ_INT(ty[2], 3);
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 3), "<0x00>"));
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 3 + 0x41), "<0x41>"));
    CHECK(str_is(cinfer_gguf_arr_str(&tok, 258), "<0xFF>"));
    for (int b = 0; b < 256; b++)
        if (ty[3 + b] != 6) {
            CHECK_EQ_INT(ty[3 + b], 6);
            break;
        }
    CHECK_EQ_INT(get_u32(g, "tokenizer.ggml.bos_token_id"), 1);
    CHECK_EQ_INT(get_u32(g, "tokenizer.ggml.eos_token_id"), 2);
    CHECK_EQ_INT(get_u32(g, "tokenizer.ggml.unknown_token_id"), 0);
    int bv = 0;
    CHECK_OK(cinfer_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv));
    CHECK_EQ_INT(bv, 1);
    CHECK_OK(cinfer_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &bv));
    CHECK_EQ_INT(bv, 1);
    CHECK(token_id(&tok, "\xe2\x96\x81", 3) >= 259);
    check_unique(&tok);

    /* Scores strictly fall from id 259 on; every piece after the first
     * char-only stretch is two earlier-scored pieces joined. */
    int bad = 0;
    for (uint32_t i = 259; i < n_vocab; i++) {
        if (ty[i] != 1)
            bad++;
        if (i > 259 && !(sc[i] < sc[i - 1]))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* Merged pieces come first (up to the first single char). */
    uint32_t n_merged = 0;
    for (uint32_t i = 259; i < n_vocab; i++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&tok, i);
        if (s.len == 1 || (s.len == 3 && memcmp(s.ptr, "\xe2\x96\x81", 3) == 0))
            break;
        n_merged++;
    }
    int64_t first_char = 259 + (int64_t)n_merged;
    for (uint32_t i = first_char; i < n_vocab; i++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&tok, i);
        if (!(s.len == 1 || (s.len == 3 && memcmp(s.ptr, "\xe2\x96\x81", 3) == 0)))
            bad++;
    }
    /* Each merged piece is two parts, each a char or a piece merged
     * earlier (higher score). */
    for (uint32_t i = 259; i < first_char; i++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&tok, i);
        int split_ok = 0;
        for (size_t k = 1; k < s.len && !split_ok; k++) {
            int64_t a = token_id(&tok, s.ptr, k);
            int64_t b = token_id(&tok, s.ptr + k, s.len - k);
            split_ok = a >= 259 && b >= 259 &&
                       (a >= first_char || sc[a] > sc[i]) &&
                       (b >= first_char || sc[b] > sc[i]);
        }
        if (!split_ok && bad++ < 3)
            fprintf(stderr, "piece %u '%.*s' is not two earlier pieces\n", i,
                    (int)s.len, s.ptr);
    }
    CHECK_EQ_INT(bad, 0);
    if (n_vocab >= 259 + 95 + 10) {
        CHECK_EQ_INT(n_merged, n_vocab - 259 - 95);
        CHECK(token_id(&tok, "\xe2\x96\x81the", 6) >= 259);
    }
}

/* ====================================================================== */
/* tests                                                                   */
/* ====================================================================== */

static void test_default(void)
{
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    CHECK_EQ_STR(p.arch, "llama");
    CHECK_EQ_STR(p.tokenizer, "gpt2");
    void *buf;
    size_t size;
    cinfer_gguf *g = open_model(&p, &buf, &size);
    if (g) {
        check_layout(g, &p);
        check_gpt2_vocab(g, p.n_vocab);
        cinfer_gguf_str s;
        CHECK_OK(cinfer_gguf_get_str(g, "tokenizer.chat_template", &s));
        CHECK(s.len > 50 && memmem(s.ptr, s.len, "<|im_start|>", 12) != NULL);
        CHECK_EQ_INT(get_u32(g, "general.file_type"), 0);
        CHECK_EQ_INT(cinfer_gguf_find_key(g, "general.quantization_version"), -1);
        CHECK_EQ_INT(cinfer_gguf_alignment(g), 32);
        cinfer_gguf_destroy(g);
    }
    free(buf);
}

static void test_shapes(void)
{
    static const struct {
        const char *arch;
        uint32_t layers, embd, heads, kv, ff, vocab;
        cinfer_dtype wt, et;
        int tied;
        const char *tok;
        uint32_t file_type;
    } cases[] = {
        {"llama", 1, 32, 2, 2, 32, 300, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 1, "gpt2", 1},
        {"llama", 3, 64, 4, 1, 96, 700, CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q8_0, 0, "gpt2", 3},
        {"qwen2", 2, 64, 8, 2, 128, 512, CINFER_DTYPE_Q8_0, CINFER_DTYPE_F32, 1, "gpt2", 7},
        {"qwen2", 1, 96, 3, 3, 64, 400, CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_0, 0, "llama", 2},
        {"llama", 2, 48, 6, 2, 80, 512, CINFER_DTYPE_BF16, CINFER_DTYPE_BF16, 0, "llama", 32},
        {"llama", 1, 128, 4, 4, 256, 1000, CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q4_1, 1, "llama", 3},
        {"llama", 2, 256, 4, 2, 512, 300, CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q6_K, 0, "gpt2", 15},
        {"qwen2", 1, 256, 2, 1, 256, 400, CINFER_DTYPE_Q6_K, CINFER_DTYPE_Q4_K, 1, "llama", 18},
        {"llama", 1, 256, 4, 4, 256, 300, CINFER_DTYPE_Q5_K, CINFER_DTYPE_Q5_K, 1, "gpt2", 17},
        {"llama", 1, 256, 4, 2, 256, 300, CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K, 0, "gpt2", 10},
        {"qwen2", 1, 256, 2, 1, 256, 300, CINFER_DTYPE_Q3_K, CINFER_DTYPE_IQ4_XS, 1, "llama", 12},
        {"llama", 1, 256, 4, 2, 256, 300, CINFER_DTYPE_IQ4_XS, CINFER_DTYPE_Q8_0, 1, "gpt2", 30},
        {"llama", 2, 64, 4, 2, 96, 300, CINFER_DTYPE_IQ4_NL, CINFER_DTYPE_IQ4_NL, 0, "llama", 25},
        {"qwen3", 2, 64, 4, 2, 96, 300, CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q8_0, 1, "gpt2", 7},
        {"qwen3", 1, 96, 6, 3, 64, 320, CINFER_DTYPE_F16, CINFER_DTYPE_F32, 0, "llama", 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.arch = cases[k].arch;
        p.n_layer = cases[k].layers;
        p.n_embd = cases[k].embd;
        p.n_head = cases[k].heads;
        p.n_head_kv = cases[k].kv;
        p.n_ff = cases[k].ff;
        p.n_vocab = cases[k].vocab;
        p.weight_dtype = cases[k].wt;
        p.embd_dtype = cases[k].et;
        p.tied_output = cases[k].tied;
        p.tokenizer = cases[k].tok;
        p.n_ctx = 128 + (uint32_t)k;
        p.rope_theta = 1000000.0f;
        p.norm_eps = 1e-6f;
        p.chat_template = (int)(k % 2);
        /* the qwen3 cases with a key_length head; every rope scaling */
        if (k + 2 >= sizeof cases / sizeof cases[0])
            p.head_dim = 32;
        static const char *const scalings[3] = {"llama3", "linear", NULL};
        p.rope_scaling = scalings[k % 3];
        p.rope_factor = 8.0f;
        void *buf;
        size_t size;
        cinfer_gguf *g = open_model(&p, &buf, &size);
        if (g) {
            check_layout(g, &p);
            if (strcmp(p.tokenizer, "gpt2") == 0)
                check_gpt2_vocab(g, p.n_vocab);
            else
                check_spm_vocab(g, p.n_vocab);
            CHECK_EQ_INT(get_u32(g, "general.file_type"), cases[k].file_type);
            CHECK_EQ_INT(cinfer_gguf_find_key(g, "tokenizer.chat_template") >= 0,
                         p.chat_template);
            int quant = cinfer_dtype_block_elems(p.weight_dtype) > 1 ||
                        cinfer_dtype_block_elems(p.embd_dtype) > 1;
            CHECK_EQ_INT(cinfer_gguf_find_key(g, "general.quantization_version") >= 0,
                         quant);
            cinfer_gguf_destroy(g);
        }
        free(buf);
    }
}

static void test_vocab_sizes(void)
{
    /* Smallest, corpus-only and synthetic-merge vocabularies. */
    const uint32_t gpt2_sizes[] = {259, 260, 3000};
    for (int k = 0; k < 3; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.n_vocab = gpt2_sizes[k];
        p.n_layer = 1;
        void *buf;
        size_t size;
        cinfer_gguf *g = open_model(&p, &buf, &size);
        if (g) {
            check_gpt2_vocab(g, p.n_vocab);
            cinfer_gguf_destroy(g);
        }
        free(buf);
    }
    const uint32_t spm_sizes[] = {260, 300, 354, 3000};
    for (int k = 0; k < 4; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.n_vocab = spm_sizes[k];
        p.n_layer = 1;
        p.tokenizer = "llama";
        void *buf;
        size_t size;
        cinfer_gguf *g = open_model(&p, &buf, &size);
        if (g) {
            check_spm_vocab(g, p.n_vocab);
            cinfer_gguf_destroy(g);
        }
        free(buf);
    }
}

static void test_determinism(void)
{
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    p.weight_dtype = CINFER_DTYPE_Q4_1;
    void *a, *b, *c;
    size_t na, nb, nc;
    CHECK_OK(cinfer_tinymodel_write_mem(&p, &a, &na));
    CHECK_OK(cinfer_tinymodel_write_mem(&p, &b, &nb));
    p.seed = 2;
    CHECK_OK(cinfer_tinymodel_write_mem(&p, &c, &nc));
    CHECK_EQ_INT(na, nb);
    CHECK(na == nb && memcmp(a, b, na) == 0);
    CHECK_EQ_INT(na, nc);

    cinfer_gguf_params gp = cinfer_gguf_default_params();
    cinfer_gguf *ga, *gc;
    gp.data = a;
    gp.size = na;
    CHECK_OK(cinfer_gguf_create(&gp, &ga));
    gp.data = c;
    gp.size = nc;
    CHECK_OK(cinfer_gguf_create(&gp, &gc));
    if (ga && gc) {
        /* Same vocabulary, different weights. */
        cinfer_gguf_arr ta, tc;
        CHECK_OK(cinfer_gguf_get_arr(ga, "tokenizer.ggml.merges", &ta));
        CHECK_OK(cinfer_gguf_get_arr(gc, "tokenizer.ggml.merges", &tc));
        CHECK_EQ_INT(ta.n, tc.n);
        int same = 1;
        for (uint64_t i = 0; i < ta.n && i < tc.n; i++) {
            cinfer_gguf_str x = cinfer_gguf_arr_str(&ta, i), y = cinfer_gguf_arr_str(&tc, i);
            same &= x.len == y.len && memcmp(x.ptr, y.ptr, x.len) == 0;
        }
        CHECK(same);
        const cinfer_gguf_tensor *qa = cinfer_gguf_find_tensor(ga, "blk.1.attn_q.weight");
        const cinfer_gguf_tensor *qc = cinfer_gguf_find_tensor(gc, "blk.1.attn_q.weight");
        CHECK(qa && qc && qa->n_bytes == qc->n_bytes &&
              memcmp(qa->data, qc->data, qa->n_bytes) != 0);
        /* Different tensors of one model differ too. */
        const cinfer_gguf_tensor *q0 = cinfer_gguf_find_tensor(ga, "blk.0.attn_q.weight");
        CHECK(q0 && qa && memcmp(q0->data, qa->data, q0->n_bytes) != 0);
    }
    cinfer_gguf_destroy(ga);
    cinfer_gguf_destroy(gc);
    free(a);
    free(b);
    free(c);
}

/* Mean and standard deviation of a tensor's dequantized elements. */
static void tensor_stats(const cinfer_gguf_tensor *t, double *mean, double *sd)
{
    int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    size_t rb = cinfer_dtype_row_bytes(t->dtype, t->ne[0]);
    float *row = malloc((size_t)t->ne[0] * sizeof *row);
    double s = 0, s2 = 0;
    for (int64_t r = 0; r < rows; r++) {
        cinfer_dequantize_row(t->dtype, (const uint8_t *)t->data + (size_t)r * rb, row, t->ne[0]);
        for (int64_t i = 0; i < t->ne[0]; i++) {
            s += row[i];
            s2 += (double)row[i] * row[i];
        }
    }
    double n = (double)(rows * t->ne[0]);
    *mean = s / n;
    *sd = sqrt(s2 / n - *mean * *mean);
    free(row);
}

static void test_weight_scales(void)
{
    const cinfer_dtype types[] = {CINFER_DTYPE_F32, CINFER_DTYPE_F16, CINFER_DTYPE_BF16,
                                  CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_1};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.n_embd = 128;
        p.n_ff = 256;
        p.weight_dtype = types[k];
        p.embd_dtype = types[k];
        p.tied_output = 0;
        p.arch = "qwen2";
        void *buf;
        size_t size;
        cinfer_gguf *g = open_model(&p, &buf, &size);
        if (!g) {
            free(buf);
            continue;
        }
        /* 4-bit types widen the spread a little (rounding noise). */
        double tol = types[k] == CINFER_DTYPE_Q4_0 || types[k] == CINFER_DTYPE_Q4_1 ? 0.12 : 0.05;
        double mean, sd;
        tensor_stats(cinfer_gguf_find_tensor(g, "blk.0.attn_q.weight"), &mean, &sd);
        CHECK_NEAR(mean, 0.0, 0.01);
        CHECK_NEAR(sd, 1.0 / sqrt(128.0), tol / sqrt(128.0));
        tensor_stats(cinfer_gguf_find_tensor(g, "blk.1.ffn_down.weight"), &mean, &sd);
        CHECK_NEAR(sd, 1.0 / sqrt(256.0), tol / sqrt(256.0));
        tensor_stats(cinfer_gguf_find_tensor(g, "token_embd.weight"), &mean, &sd);
        CHECK_NEAR(sd, 2.0 / sqrt(128.0), 2 * tol / sqrt(128.0));
        tensor_stats(cinfer_gguf_find_tensor(g, "output.weight"), &mean, &sd);
        CHECK_NEAR(sd, 2.0 / sqrt(128.0), 2 * tol / sqrt(128.0));
        tensor_stats(cinfer_gguf_find_tensor(g, "blk.1.ffn_norm.weight"), &mean, &sd);
        CHECK_NEAR(mean, 1.0, 0.02);
        CHECK(sd > 0.0 && sd < 0.1);
        tensor_stats(cinfer_gguf_find_tensor(g, "output_norm.weight"), &mean, &sd);
        CHECK_NEAR(mean, 1.0, 0.02);
        tensor_stats(cinfer_gguf_find_tensor(g, "blk.0.attn_k.bias"), &mean, &sd);
        CHECK(sd > 0.0 && sd < 0.1);
        cinfer_gguf_destroy(g);
        free(buf);
    }
}

/* K-quant weights: the round-to-nearest blocks decode to the same
 * spread as the float weights. */
static void test_weight_scales_k(void)
{
    const cinfer_dtype types[] = {CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q5_K,
                                  CINFER_DTYPE_Q6_K};
    for (size_t k = 0; k < 3; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.n_embd = 256;
        p.n_ff = 512;
        p.weight_dtype = types[k];
        p.embd_dtype = types[k];
        p.tied_output = 0;
        void *buf;
        size_t size;
        cinfer_gguf *g = open_model(&p, &buf, &size);
        if (!g) {
            free(buf);
            continue;
        }
        double tol = types[k] == CINFER_DTYPE_Q4_K ? 0.12 : 0.05;
        double mean, sd;
        tensor_stats(cinfer_gguf_find_tensor(g, "blk.0.attn_q.weight"), &mean, &sd);
        CHECK_NEAR(mean, 0.0, 0.01);
        CHECK_NEAR(sd, 1.0 / sqrt(256.0), tol / sqrt(256.0));
        tensor_stats(cinfer_gguf_find_tensor(g, "blk.1.ffn_down.weight"), &mean, &sd);
        CHECK_NEAR(sd, 1.0 / sqrt(512.0), tol / sqrt(512.0));
        tensor_stats(cinfer_gguf_find_tensor(g, "token_embd.weight"), &mean, &sd);
        CHECK_NEAR(sd, 2.0 / sqrt(256.0), 2 * tol / sqrt(256.0));
        cinfer_gguf_destroy(g);
        free(buf);
    }
}

static void test_invalid_params(void)
{
    static const struct {
        const char *field;
        const char *word;
    } cases[] = {
        {"arch", "arch 'gpt9'"},
        {"tokenizer", "tokenizer 'bert'"},
        {"n_layer", "n_layer"},
        {"n_head", "n_head"},
        {"n_embd_head", "n_embd"},
        {"head_odd", "head size"},
        {"n_head_kv", "n_head_kv"},
        {"n_ff", "n_ff"},
        {"n_vocab_gpt2", "n_vocab = 258"},
        {"n_vocab_spm", "n_vocab = 259"},
        {"n_ctx", "n_ctx"},
        {"rope_theta", "rope_theta"},
        {"norm_eps", "norm_eps"},
        {"weight_dtype", "weight_dtype"},
        {"embd_dtype", "embd_dtype"},
        {"q_embd", "multiple of 32"},
        {"q_ff", "n_ff = 80"},
        {"k_embd", "256 for K-quants"},
        {"k_weight", "weight_dtype = 15"},
        {"alignment", "alignment"},
        {"head_dim", "head_dim = 33"},
        {"q_heads", "n_head * head_dim"},
        {"rope_scaling", "rope_scaling 'yarn'"},
        {"rope_factor", "rope_factor"},
        {"rope_freq", "must differ"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        const char *f = cases[k].field;
        if (!strcmp(f, "arch")) p.arch = "gpt9";
        else if (!strcmp(f, "tokenizer")) p.tokenizer = "bert";
        else if (!strcmp(f, "n_layer")) p.n_layer = 0;
        else if (!strcmp(f, "n_head")) p.n_head = 0;
        else if (!strcmp(f, "n_embd_head")) p.n_embd = 66;
        else if (!strcmp(f, "head_odd")) { p.n_embd = 60; p.n_head = 4; }
        else if (!strcmp(f, "n_head_kv")) p.n_head_kv = 3;
        else if (!strcmp(f, "n_ff")) p.n_ff = 0;
        else if (!strcmp(f, "n_vocab_gpt2")) p.n_vocab = 258;
        else if (!strcmp(f, "n_vocab_spm")) { p.n_vocab = 259; p.tokenizer = "llama"; }
        else if (!strcmp(f, "n_ctx")) p.n_ctx = 0;
        else if (!strcmp(f, "rope_theta")) p.rope_theta = 0.0f;
        else if (!strcmp(f, "norm_eps")) p.norm_eps = -1.0f;
        else if (!strcmp(f, "weight_dtype")) p.weight_dtype = CINFER_DTYPE_I32;
        else if (!strcmp(f, "embd_dtype")) p.embd_dtype = CINFER_DTYPE_Q8_1;
        else if (!strcmp(f, "q_embd")) { p.n_embd = 48; p.n_head = 4; p.embd_dtype = CINFER_DTYPE_Q8_0; }
        else if (!strcmp(f, "q_ff")) { p.n_ff = 80; p.weight_dtype = CINFER_DTYPE_Q4_0; }
        else if (!strcmp(f, "k_embd")) { p.n_embd = 128; p.weight_dtype = CINFER_DTYPE_Q6_K; }
        else if (!strcmp(f, "k_weight")) p.weight_dtype = CINFER_DTYPE_Q8_K;
        else if (!strcmp(f, "alignment")) p.alignment = 48;
        else if (!strcmp(f, "head_dim")) p.head_dim = 33;
        else if (!strcmp(f, "q_heads")) { p.head_dim = 12; p.weight_dtype = CINFER_DTYPE_Q8_0; }
        else if (!strcmp(f, "rope_scaling")) p.rope_scaling = "yarn";
        else if (!strcmp(f, "rope_factor")) p.rope_scaling = "linear";
        else if (!strcmp(f, "rope_freq")) {
            p.rope_scaling = "llama3";
            p.rope_factor = 8.0f;
            p.rope_low_freq = p.rope_high_freq = 2.0f;
        }
        void *buf = NULL;
        size_t size = 0;
        cinfer_status st = cinfer_tinymodel_write_mem(&p, &buf, &size);
        CHECK_EQ_INT(st, CINFER_E_INVALID_ARG);
        CHECK(buf == NULL);
        if (!strstr(cinfer_last_error(), cases[k].word)) {
            fprintf(stderr, "case %s: message lacks '%s': %s\n", f, cases[k].word,
                    cinfer_last_error());
            harness_failed_checks++;
        }
        free(buf);
    }
    CHECK_EQ_INT(cinfer_tinymodel_write_mem(NULL, NULL, NULL), CINFER_E_INVALID_ARG);
}

static void test_write_file(void)
{
    char path[] = "/tmp/cinfer_test_tiny_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    close(fd);
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    p.tokenizer = "llama";
    p.alignment = 64;
    p.pre = "ignored-for-llama";
    CHECK_OK(cinfer_tinymodel_write(&p, path));
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = path;
    cinfer_gguf *g = NULL;
    CHECK_OK(cinfer_gguf_create(&gp, &g));
    if (g) {
        CHECK_EQ_INT(cinfer_gguf_alignment(g), 64);
        check_layout(g, &p);
        check_spm_vocab(g, p.n_vocab);
        cinfer_gguf_destroy(g);
    }
    unlink(path);
    CHECK_EQ_INT(cinfer_tinymodel_write(&p, "/nonexistent-dir/m.gguf"), CINFER_E_IO);

    /* A custom pre-tokenizer name for gpt2. */
    p = cinfer_tinymodel_default_params();
    p.pre = "smollm";
    void *buf;
    size_t size;
    g = open_model(&p, &buf, &size);
    if (g) {
        check_str(g, "tokenizer.ggml.pre", "smollm");
        cinfer_gguf_destroy(g);
    }
    free(buf);
}

int main(void)
{
    RUN(test_default);
    RUN(test_shapes);
    RUN(test_vocab_sizes);
    RUN(test_determinism);
    RUN(test_weight_scales);
    RUN(test_weight_scales_k);
    RUN(test_invalid_params);
    RUN(test_write_file);
    return harness_done();
}
