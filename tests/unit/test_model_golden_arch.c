/*
 * test_model_golden_arch.c - the architectures' tiny models against
 * llama.cpp, and the refusals of what the graph does not implement.
 *
 * tests/data/arch_golden.txt and arch_golden_logits.f32 (made by
 * scripts/goldens/arch-goldens.sh with llama.cpp) hold, for each model of
 * tests/unit/arch_golden_models.h (Llama 3 rope scaling, linear rope
 * scaling, a Mistral-shaped llama with attention.key_length, Qwen3 with its
 * per-head Q/K norms, twice, Gemma 3, twice, head sizes 16 and 32, and
 * one llama per K-quant and IQ4 type): the FNV-1a hash of the file the
 * GGUF writer made, a prompt of ARCH_GOLDEN_PROMPT ids, llama.cpp's full
 * logit vector at every prompt position (the prompt in one batch; one
 * token per call for the K-quant and IQ4 models, on both sides) and its
 * greedy
 * continuation of ARCH_GOLDEN_GREEDY tokens decoded one at a time. Checked
 * here, per model, on every CPU ISA the machine runs (portable, AVX2,
 * AVX-512):
 *   - the writer still makes the same file (else the goldens are stale:
 *     the message says how to remake them);
 *   - at every position the top-10 token sets are equal and the relative L2
 *     error of the whole vector is under REL_L2_BOUND, the bound of the
 *     default model's goldens (test_model_golden.c);
 *   - the greedy continuation is identical, token for token, and each of
 *     its decode steps' logit vectors is llama.cpp's bit for bit (FNV-1a
 *     of the floats). The goldens are llama.cpp's AVX-512 build's, whose
 *     arithmetic every cinfer ISA reproduces; its AVX2 build sums
 *     attention, softmax and SwiGLU in other orders and parts from them
 *     at llama3's decode step 55 and qwen3_3l's step 45.
 * The errors measured are printed so the bound can be reviewed. Measured:
 * 0, every prefill logit of every model bit-identical to llama.cpp's (the
 * models' weight types are ones whose llama.cpp kernels the CPU backend
 * reproduces; arch_golden_models.h).
 *
 * Refusals (a file that differs from a supported one in one key or
 * tensor): an unknown architecture, YaRN rope scaling, a mixture of
 * experts, a tensor the architecture does not use, a rope_freqs.weight of
 * the wrong size; each message names what it refuses.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arch_golden_models.h"
#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/tinymodel.h"
#include "harness.h"

#define REL_L2_BOUND 1e-4

typedef struct {
    char name[32];
    uint64_t fnv;
    int n_vocab;
    int32_t prompt[ARCH_GOLDEN_PROMPT];
    int32_t greedy[ARCH_GOLDEN_GREEDY];
    uint64_t step_fnv[ARCH_GOLDEN_GREEDY]; /* each decode step's logits */
    float *logits; /* [ARCH_GOLDEN_PROMPT, n_vocab] */
} golden;

static golden G[ARCH_GOLDEN_MAX];
static int n_golden;

static int read_ids(const char *s, int32_t *out, int n)
{
    char *end;
    for (int i = 0; i < n; i++) {
        long v = strtol(s, &end, 10);
        if (end == s)
            return -1;
        out[i] = (int32_t)v;
        s = end;
    }
    return 0;
}

static int read_hashes(const char *s, uint64_t *out, int n)
{
    char *end;
    for (int i = 0; i < n; i++) {
        out[i] = strtoull(s, &end, 16);
        if (end == s)
            return -1;
        s = end;
    }
    return 0;
}

static int load_goldens(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/arch_golden.txt", CINFER_TEST_DATA);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int cur = -1, bad = 0, n_hashed = 0;
    while (fgets(line, sizeof line, f) && !bad) {
        if (line[0] == 'M') {
            if (++cur >= ARCH_GOLDEN_MAX)
                break;
            bad = sscanf(line, "M %31s %" SCNx64 " %d", G[cur].name,
                         &G[cur].fnv, &G[cur].n_vocab) != 3;
        } else if (line[0] == 'T' && cur >= 0) {
            bad = read_ids(line + 1, G[cur].prompt, ARCH_GOLDEN_PROMPT);
        } else if (line[0] == 'G' && cur >= 0) {
            bad = read_ids(line + 1, G[cur].greedy, ARCH_GOLDEN_GREEDY);
        } else if (line[0] == 'D' && cur >= 0) {
            bad = read_hashes(line + 1, G[cur].step_fnv, ARCH_GOLDEN_GREEDY);
            n_hashed += !bad;
        }
    }
    fclose(f);
    n_golden = cur + 1;
    if (bad || n_golden < 1 || n_golden > ARCH_GOLDEN_MAX ||
        n_hashed != n_golden)
        return -1;
    snprintf(path, sizeof path, "%s/arch_golden_logits.f32", CINFER_TEST_DATA);
    f = fopen(path, "rb");
    if (!f)
        return -1;
    for (int k = 0; k < n_golden && !bad; k++) {
        size_t n = (size_t)ARCH_GOLDEN_PROMPT * (size_t)G[k].n_vocab;
        G[k].logits = malloc(n * sizeof(float));
        bad = !G[k].logits || fread(G[k].logits, sizeof(float), n, f) != n;
    }
    bad |= fgetc(f) != EOF;
    fclose(f);
    return bad ? -1 : 0;
}

static const char *tmp_path(const char *tag)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/cinfer-test-golden-arch-%d-%s.gguf",
             (int)getpid(), tag);
    return buf;
}

static void top_ids(const float *row, int n, int k, int32_t *out)
{
    for (int j = 0; j < k; j++)
        out[j] = -1;
    for (int i = 0; i < n; i++) {
        int j = k - 1;
        if (out[j] >= 0 && !(row[i] > row[out[j]]))
            continue;
        while (j > 0 && (out[j - 1] < 0 || row[i] > row[out[j - 1]])) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = i;
    }
}

static int set_equal(const int32_t *a, const int32_t *b, int k)
{
    for (int i = 0; i < k; i++) {
        int found = 0;
        for (int j = 0; j < k; j++)
            found |= a[i] == b[j];
        if (!found)
            return 0;
    }
    return 1;
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* One model against its goldens, on the CPU kernels of `isa`. */
static void check_model(const arch_golden_model *gm, const golden *g,
                        cinfer_cpu_isa isa)
{
    void *buf;
    size_t size;
    CHECK_OK(cinfer_tinymodel_write_mem(&gm->p, &buf, &size));
    uint64_t h = arch_golden_fnv(buf, size);
    if (h != g->fnv) {
        fprintf(stderr,
                "%s: the GGUF writer's file (fnv %016" PRIx64 ") is not the "
                "one the goldens were made from (%016" PRIx64 "): remake "
                "them with scripts/goldens/arch-goldens.sh\n",
                gm->name, h, g->fnv);
        CHECK(0);
        free(buf);
        return;
    }
    const char *path = tmp_path(gm->name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, size, f) == size);
    if (f)
        fclose(f);
    free(buf);

    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_ctx = 128;
    mp.n_threads = 2;
    mp.isa = isa;
    cinfer_model *m = NULL;
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        fprintf(stderr, "%s: %s\n", gm->name, cinfer_last_error());
        CHECK(0);
        remove(path);
        return;
    }
    remove(path);
    int V = cinfer_model_get_info(m)->n_vocab;
    CHECK_EQ_INT(V, g->n_vocab);
    float *lg = malloc(sizeof(float) * (size_t)ARCH_GOLDEN_PROMPT * V);
    if (gm->one_token)
        for (int i = 0; i < ARCH_GOLDEN_PROMPT; i++)
            CHECK_OK(cinfer_model_eval_single(m, g->prompt + i, 1, i, 1,
                                              lg + (size_t)i * V));
    else
        CHECK_OK(cinfer_model_eval_single(m, g->prompt, ARCH_GOLDEN_PROMPT, 0,
                                          1, lg));
    double worst = 0;
    int mismatch = 0, same_bits = 0;
    for (int pos = 0; pos < ARCH_GOLDEN_PROMPT; pos++) {
        const float *row = lg + (size_t)pos * V;
        const float *ref = g->logits + (size_t)pos * V;
        double num = 0, den = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)row[i] - ref[i];
            num += d * d;
            den += (double)ref[i] * ref[i];
            same_bits += row[i] == ref[i];
        }
        double rel = sqrt(num / den);
        worst = rel > worst ? rel : worst;
        int32_t a[10], b[10];
        top_ids(row, V, 10, a);
        top_ids(ref, V, 10, b);
        if (!set_equal(a, b, 10)) {
            mismatch++;
            fprintf(stderr, "%s pos %d: top-10 differs (ours %d %d, "
                            "llama.cpp %d %d)\n",
                    gm->name, pos, a[0], a[1], b[0], b[1]);
        }
    }

    /* greedy, one token at a time from our own argmax */
    float *last = malloc(sizeof(float) * (size_t)V);
    if (gm->one_token)
        for (int i = 0; i < ARCH_GOLDEN_PROMPT; i++)
            CHECK_OK(cinfer_model_eval_single(m, g->prompt + i, 1, i, 0,
                                              last));
    else
        CHECK_OK(cinfer_model_eval_single(m, g->prompt, ARCH_GOLDEN_PROMPT,
                                          0, 0, last));
    int32_t tok = argmax(last, V);
    int identical = 1, steps_same = 0, first_other = -1;
    for (int k = 0; k < ARCH_GOLDEN_GREEDY; k++) {
        if (tok != g->greedy[k]) {
            fprintf(stderr, "%s: greedy token %d is %d (logit %.9g), "
                            "llama.cpp %d (our logit %.9g)\n",
                    gm->name, k, tok, last[tok], g->greedy[k],
                    last[g->greedy[k]]);
            identical = 0;
            break;
        }
        if (k + 1 == ARCH_GOLDEN_GREEDY)
            break;
        CHECK_OK(cinfer_model_eval_single(m, &tok, 1, ARCH_GOLDEN_PROMPT + k,
                                          0, last));
        tok = argmax(last, V);
        if (arch_golden_fnv(last, sizeof(float) * (size_t)V) ==
            g->step_fnv[k])
            steps_same++;
        else if (first_other < 0)
            first_other = k;
    }
    fprintf(stderr,
            "%-10s %-8s %d positions: max rel L2 %.3g, %d/%d logits "
            "bit-identical, "
            "top-10 mismatches %d; greedy %s over %d tokens, %d/%d decode "
            "steps' logits bit-identical (first other: %d)\n",
            gm->name, cinfer_cpu_isa_name(isa), ARCH_GOLDEN_PROMPT, worst,
            same_bits,
            ARCH_GOLDEN_PROMPT * V, mismatch,
            identical ? "identical" : "DIFFERS", ARCH_GOLDEN_GREEDY,
            steps_same, ARCH_GOLDEN_GREEDY - 1, first_other);
    CHECK(worst < REL_L2_BOUND);
    CHECK_EQ_INT(mismatch, 0);
    CHECK(identical);
    CHECK_EQ_INT(steps_same, ARCH_GOLDEN_GREEDY - 1);
    free(last);
    free(lg);
    cinfer_model_destroy(m);
}

static void test_models_match_llama_cpp(void)
{
    arch_golden_model ms[ARCH_GOLDEN_MAX];
    int n = arch_golden_models(ms);
    CHECK_EQ_INT(n, n_golden);
    static const cinfer_cpu_isa isas[] = {CINFER_CPU_ISA_PORTABLE,
                                          CINFER_CPU_ISA_AVX2,
                                          CINFER_CPU_ISA_AVX512};
    for (int k = 0; k < n && k < n_golden; k++) {
        CHECK(strcmp(ms[k].name, G[k].name) == 0);
        for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++)
            if (cinfer_cpu_isa_supported(isas[i]))
                check_model(&ms[k], &G[k], isas[i]);
    }
}

/* ---------------------------------------------------------------------- */
/* refusals                                                               */
/* ---------------------------------------------------------------------- */

/* A writer holding every key and tensor of the tiny model `p`, for the
 * edits below. */
static cinfer_gguf_writer *copy_of(const cinfer_tinymodel_params *p,
                                   cinfer_gguf **src, void **mem)
{
    size_t size;
    cinfer_gguf_writer *w = NULL;
    if (cinfer_tinymodel_write_mem(p, mem, &size) != CINFER_OK)
        return NULL;
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.data = *mem;
    gp.size = size;
    if (cinfer_gguf_create(&gp, src) != CINFER_OK ||
        cinfer_gguf_writer_create(NULL, &w) != CINFER_OK)
        return NULL;
    const cinfer_gguf *g = *src;
    int ok = 1;
    for (uint64_t i = 0; i < cinfer_gguf_n_kv(g) && ok; i++) {
        const char *key = cinfer_gguf_kv_key(g, i);
        cinfer_gguf_type t = cinfer_gguf_kv_type(g, i);
        uint32_t u;
        float fv;
        int b;
        cinfer_gguf_str s;
        cinfer_gguf_arr a;
        if (t == CINFER_GGUF_UINT32) {
            ok = cinfer_gguf_get_u32(g, key, &u) == CINFER_OK &&
                 cinfer_gguf_writer_set_u32(w, key, u) == CINFER_OK;
        } else if (t == CINFER_GGUF_FLOAT32) {
            ok = cinfer_gguf_get_f32(g, key, &fv) == CINFER_OK &&
                 cinfer_gguf_writer_set_f32(w, key, fv) == CINFER_OK;
        } else if (t == CINFER_GGUF_BOOL) {
            ok = cinfer_gguf_get_bool(g, key, &b) == CINFER_OK &&
                 cinfer_gguf_writer_set_bool(w, key, b) == CINFER_OK;
        } else if (t == CINFER_GGUF_STRING) {
            ok = cinfer_gguf_get_str(g, key, &s) == CINFER_OK;
            char *c = ok ? strndup(s.ptr, s.len) : NULL;
            ok = c && cinfer_gguf_writer_set_str(w, key, c) == CINFER_OK;
            free(c);
        } else if (t == CINFER_GGUF_ARRAY) {
            ok = cinfer_gguf_get_arr(g, key, &a) == CINFER_OK;
            if (ok && a.type == CINFER_GGUF_STRING) {
                char **v = calloc(a.n, sizeof *v);
                for (uint64_t j = 0; v && j < a.n; j++) {
                    cinfer_gguf_str e = cinfer_gguf_arr_str(&a, j);
                    v[j] = strndup(e.ptr, e.len);
                }
                ok = v && cinfer_gguf_writer_set_arr_str(
                              w, key, (const char *const *)v, a.n) ==
                              CINFER_OK;
                for (uint64_t j = 0; v && j < a.n; j++)
                    free(v[j]);
                free(v);
            } else if (ok) {
                ok = cinfer_gguf_writer_set_arr(w, key, a.type, a.data,
                                                a.n) == CINFER_OK;
            }
        } else {
            ok = 0; /* the tiny models write no other type */
        }
    }
    for (uint64_t i = 0; i < cinfer_gguf_n_tensors(g) && ok; i++) {
        const cinfer_gguf_tensor *t = cinfer_gguf_tensor_at(g, i);
        ok = cinfer_gguf_writer_add_tensor(w, t->name, t->dtype, t->n_dims,
                                           t->ne, t->data,
                                           t->n_bytes) == CINFER_OK;
    }
    if (!ok) {
        cinfer_gguf_writer_destroy(w);
        return NULL;
    }
    return w;
}

/* Loads the edited copy and expects a refusal whose message holds
 * `needle`. */
static void expect_refusal(cinfer_gguf_writer *w, const char *needle)
{
    CHECK(w != NULL);
    if (!w)
        return;
    const char *path = tmp_path("refused");
    CHECK_OK(cinfer_gguf_writer_write_file(w, path));
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_ctx = 64;
    mp.n_threads = 1;
    cinfer_model *m = NULL;
    cinfer_status st = cinfer_model_create(&mp, &m);
    CHECK(st != CINFER_OK);
    const char *msg = cinfer_last_error();
    if (st == CINFER_OK || !strstr(msg, needle)) {
        fprintf(stderr, "expected a refusal naming '%s', got: %s\n", needle,
                st == CINFER_OK ? "(loaded)" : msg);
        CHECK(0);
    } else {
        fprintf(stderr, "refused: %s\n", msg);
    }
    cinfer_model_destroy(m);
    remove(path);
}

static void test_refusals_name_what_is_missing(void)
{
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    cinfer_gguf *src = NULL;
    void *mem = NULL;
    cinfer_gguf_writer *w;
    float f3[3] = {1, 1, 1}, bias[64] = {0};
    int64_t ne3[1] = {3}, ne64[1] = {64};

#define EDIT(expr, needle)                                                     \
    do {                                                                       \
        w = copy_of(&p, &src, &mem);                                           \
        CHECK(w != NULL);                                                      \
        if (w) {                                                               \
            CHECK_OK(expr);                                                    \
            expect_refusal(w, needle);                                         \
        }                                                                      \
        cinfer_gguf_writer_destroy(w);                                         \
        cinfer_gguf_destroy(src);                                              \
        free(mem);                                                             \
        src = NULL;                                                            \
        mem = NULL;                                                            \
    } while (0)

    EDIT(cinfer_gguf_writer_set_str(w, "general.architecture", "mamba"),
         "architecture 'mamba' is not supported");
    EDIT(cinfer_gguf_writer_set_str(w, "llama.rope.scaling.type", "yarn"),
         "'yarn'");
    EDIT(cinfer_gguf_writer_set_u32(w, "llama.expert_count", 8),
         "llama.expert_count");
    EDIT(cinfer_gguf_writer_add_tensor(w, "blk.0.attn_output.bias",
                                       CINFER_DTYPE_F32, 1, ne64, bias,
                                       sizeof bias),
         "tensor 'blk.0.attn_output.bias'");
    EDIT(cinfer_gguf_writer_add_tensor(w, "rope_freqs.weight",
                                       CINFER_DTYPE_F32, 1, ne3, f3, sizeof f3),
         "rope_freqs.weight");
    /* qwen3 has no rope_freqs: llama.cpp refuses such a file too */
    p.arch = "qwen3";
    float f8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int64_t ne8[1] = {8};
    EDIT(cinfer_gguf_writer_add_tensor(w, "rope_freqs.weight",
                                       CINFER_DTYPE_F32, 1, ne8, f8, sizeof f8),
         "tensor 'rope_freqs.weight' is not part of architecture 'qwen3'");
#undef EDIT
}

/* Llama 3's factors and linear scaling change the model's logits: a check
 * that the goldens above would notice the graph ignoring them. */
static void test_rope_scaling_changes_logits(void)
{
    const char *scalings[2] = {"llama3", "linear"};
    for (int s = 0; s < 2; s++) {
        float *out[2] = {NULL, NULL};
        int V = 0;
        for (int on = 0; on < 2; on++) {
            cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
            p.rope_theta = 500000.0f;
            if (on) {
                p.rope_scaling = scalings[s];
                p.rope_factor = 8.0f;
                p.rope_orig_ctx = 64;
            }
            const char *path = tmp_path("scaling");
            CHECK_OK(cinfer_tinymodel_write(&p, path));
            cinfer_model_params mp = cinfer_model_default_params();
            mp.path = path;
            mp.n_ctx = 64;
            mp.n_threads = 1;
            cinfer_model *m = NULL;
            CHECK_OK(cinfer_model_create(&mp, &m));
            remove(path);
            if (!m)
                return;
            V = cinfer_model_get_info(m)->n_vocab;
            int32_t toks[16];
            for (int i = 0; i < 16; i++)
                toks[i] = (int32_t)(i * 31 + 7);
            out[on] = malloc(sizeof(float) * (size_t)V);
            CHECK_OK(cinfer_model_eval_single(m, toks, 16, 0, 0, out[on]));
            cinfer_model_destroy(m);
        }
        double num = 0, den = 0;
        for (int i = 0; i < V; i++) {
            double d = (double)out[0][i] - out[1][i];
            num += d * d;
            den += (double)out[0][i] * out[0][i];
        }
        fprintf(stderr, "%s scaling moves the last logits by rel L2 %.3g\n",
                scalings[s], sqrt(num / den));
        CHECK(sqrt(num / den) > 1e-3);
        free(out[0]);
        free(out[1]);
    }
}

/* gemma3's window: a window of 8 against one past the context (the same
 * rope bases, every layer local but the 6th): positions 0..7 see the same
 * keys, so their logits are bit-identical; later ones lose the early keys
 * in the local layers and move. */
static void test_gemma_window(void)
{
    enum { N = 24, W = 8 };
    float *out[2] = {NULL, NULL};
    int V = 0;
    for (int k = 0; k < 2; k++) {
        cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
        p.arch = "gemma3";
        p.tokenizer = "llama";
        p.n_layer = 7;
        p.head_dim = 64;
        p.sliding_window = k ? W : 1000;
        p.seed = 91;
        const char *path = tmp_path("window");
        CHECK_OK(cinfer_tinymodel_write(&p, path));
        cinfer_model_params mp = cinfer_model_default_params();
        mp.path = path;
        mp.n_ctx = 64;
        mp.n_threads = 1;
        cinfer_model *m = NULL;
        CHECK_OK(cinfer_model_create(&mp, &m));
        remove(path);
        if (!m)
            return;
        V = cinfer_model_get_info(m)->n_vocab;
        int32_t toks[N];
        for (int i = 0; i < N; i++)
            toks[i] = (int32_t)(i * 37 + 11) % (V - 3);
        out[k] = malloc(sizeof(float) * (size_t)V * N);
        CHECK_OK(cinfer_model_eval_single(m, toks, N, 0, 1, out[k]));
        cinfer_model_destroy(m);
    }
    CHECK(memcmp(out[0], out[1], sizeof(float) * (size_t)V * W) == 0);
    double num = 0, den = 0;
    for (int i = V * (N - 1); i < V * N; i++) {
        double d = (double)out[0][i] - out[1][i];
        num += d * d;
        den += (double)out[0][i] * out[0][i];
    }
    fprintf(stderr, "gemma3 window %d moves position %d's logits by rel L2 "
                    "%.3g\n",
            W, N - 1, sqrt(num / den));
    CHECK(sqrt(num / den) > 1e-3);
    free(out[0]);
    free(out[1]);
}

int main(void)
{
    if (load_goldens() != 0) {
        fprintf(stderr, "cannot read the goldens in %s\n", CINFER_TEST_DATA);
        return 1;
    }
    RUN(test_models_match_llama_cpp);
    RUN(test_refusals_name_what_is_missing);
    RUN(test_rope_scaling_changes_logits);
    RUN(test_gemma_window);
    for (int k = 0; k < n_golden; k++)
        free(G[k].logits);
    return harness_done();
}
