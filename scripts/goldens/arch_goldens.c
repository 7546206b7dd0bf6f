/*
 * arch_goldens.c - llama.cpp's goldens for the tiny models of every
 * architecture feature (tests/unit/arch_golden_models.h): each model is
 * written by cinfer's GGUF writer and run by libllama (CPU, built by
 * build-llama-cpp.sh for an AVX-512 machine, 2 threads, F16
 * KV cache, flash attention off), the prompt in one batch with the logits
 * of every position, then ARCH_GOLDEN_GREEDY greedy tokens decoded one at a
 * time from llama.cpp's own argmax, never stopping at EOS (as
 * model_goldens.py does for the default model). Built and run by
 * arch-goldens.sh. Writes into DIR:
 *   arch_golden.txt         per model: M name fnv64 n_vocab, T prompt ids,
 *                           G greedy ids, D the FNV-1a 64 of each decode
 *                           step's logits (n_vocab float32 little-endian)
 *   arch_golden_logits.f32  per model, [ARCH_GOLDEN_PROMPT, n_vocab] logits,
 *                           float32 little-endian, models in file order
 * With DUMP=DIR in the environment it also writes each model's logits of
 * every greedy decode step to DIR/<name>.decode.f32 (a diagnostic, not
 * committed: cinfer's decode can be compared step by step against them).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"
#include "engine/tinymodel.h"
#include "tests/unit/arch_golden_models.h"

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static int run(const arch_golden_model *gm, int k, FILE *txt, FILE *bin)
{
    void *buf;
    size_t size;
    if (cinfer_tinymodel_write_mem(&gm->p, &buf, &size) != CINFER_OK) {
        fprintf(stderr, "%s: %s\n", gm->name, cinfer_last_error());
        return 1;
    }
    char path[256];
    snprintf(path, sizeof path, "/tmp/cinfer-arch-golden-%s.gguf", gm->name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", gm->name, path);
        return 1;
    }
    uint64_t h = arch_golden_fnv(buf, size);
    free(buf);

    struct llama_model_params lmp = llama_model_default_params();
    struct llama_model *lm = llama_model_load_from_file(path, lmp);
    if (!lm) {
        fprintf(stderr, "%s: llama.cpp cannot load it\n", gm->name);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = cp.n_ubatch = 64;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(lm, cp);
    const int V = (int)gm->p.n_vocab, N = ARCH_GOLDEN_PROMPT;
    int32_t toks[ARCH_GOLDEN_PROMPT], greedy[ARCH_GOLDEN_GREEDY];
    uint64_t step_fnv[ARCH_GOLDEN_GREEDY];
    arch_golden_prompt(k, V, toks);
    struct llama_batch b = llama_batch_init(N, 0, 1);
    for (int i = 0; i < N; i++) {
        b.token[i] = toks[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = N;
    int tok = 0;
    if (gm->one_token) { /* one token per call: llama.cpp's decode path */
        for (int i = 0; i < N; i++) {
            b.token[0] = toks[i];
            b.pos[0] = i;
            b.logits[0] = 1;
            b.n_tokens = 1;
            if (!ctx || llama_decode(ctx, b)) {
                fprintf(stderr, "%s: llama_decode failed\n", gm->name);
                return 1;
            }
            fwrite(llama_get_logits_ith(ctx, 0), sizeof(float), (size_t)V, bin);
        }
        tok = argmax(llama_get_logits_ith(ctx, 0), V);
    } else {
        if (!ctx || llama_decode(ctx, b)) {
            fprintf(stderr, "%s: llama_decode failed\n", gm->name);
            return 1;
        }
        for (int i = 0; i < N; i++)
            fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)V, bin);
        tok = argmax(llama_get_logits_ith(ctx, N - 1), V);
    }
    /* DUMP=DIR: every decode step's logits to DIR/<name>.decode.f32 */
    FILE *dump = NULL;
    if (getenv("DUMP")) {
        char dp[512];
        snprintf(dp, sizeof dp, "%s/%s.decode.f32", getenv("DUMP"), gm->name);
        dump = fopen(dp, "wb");
    }
    for (int g = 0; g < ARCH_GOLDEN_GREEDY; g++) {
        greedy[g] = tok;
        b.token[0] = tok;
        b.pos[0] = N + g;
        b.logits[0] = 1;
        b.n_tokens = 1;
        if (llama_decode(ctx, b)) {
            fprintf(stderr, "%s: llama_decode failed\n", gm->name);
            return 1;
        }
        tok = argmax(llama_get_logits_ith(ctx, 0), V);
        step_fnv[g] = arch_golden_fnv(llama_get_logits_ith(ctx, 0),
                                      sizeof(float) * (size_t)V);
        if (dump)
            fwrite(llama_get_logits_ith(ctx, 0), sizeof(float), (size_t)V,
                   dump);
    }
    if (dump)
        fclose(dump);
    fprintf(txt, "M %s %016" PRIx64 " %d\nT", gm->name, h, V);
    for (int i = 0; i < N; i++)
        fprintf(txt, " %d", toks[i]);
    fprintf(txt, "\nG");
    for (int g = 0; g < ARCH_GOLDEN_GREEDY; g++)
        fprintf(txt, " %d", greedy[g]);
    fprintf(txt, "\nD");
    for (int g = 0; g < ARCH_GOLDEN_GREEDY; g++)
        fprintf(txt, " %016" PRIx64, step_fnv[g]);
    fprintf(txt, "\n");
    int distinct = 0;
    for (int g = 0; g < ARCH_GOLDEN_GREEDY; g++) {
        int seen = 0;
        for (int e = 0; e < g; e++)
            seen |= greedy[e] == greedy[g];
        distinct += !seen;
    }
    printf("%-10s greedy %d %d %d %d ... (%d distinct)\n", gm->name,
           greedy[0], greedy[1], greedy[2], greedy[3], distinct);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(lm);
    remove(path);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: arch_goldens DIR\n");
        return 2;
    }
    llama_backend_init();
    llama_log_set(quiet, NULL);
    char p1[1024], p2[1024];
    snprintf(p1, sizeof p1, "%s/arch_golden.txt", argv[1]);
    snprintf(p2, sizeof p2, "%s/arch_golden_logits.f32", argv[1]);
    FILE *txt = fopen(p1, "w"), *bin = fopen(p2, "wb");
    if (!txt || !bin) {
        fprintf(stderr, "cannot write into %s\n", argv[1]);
        return 1;
    }
    fprintf(txt, "# cinfer architecture goldens: made by "
                 "scripts/goldens/arch_goldens.c\n"
                 "# llama.cpp from llama-cpp-python 0.3.36 sdist (libllama, "
                 "CPU AVX-512 build, 2 threads, F16 KV, flash attention "
                 "off)\n"
                 "# M <name> <fnv64 of the gguf> <n_vocab> / T <prompt ids> / "
                 "G <greedy ids> / D <fnv64 of each decode step's "
                 "logits>; prompt logits in arch_golden_logits.f32\n");
    arch_golden_model ms[ARCH_GOLDEN_MAX];
    int n = arch_golden_models(ms), rc = 0;
    for (int k = 0; k < n && !rc; k++)
        rc = run(&ms[k], k, txt, bin);
    if (fclose(txt) != 0 || fclose(bin) != 0)
        rc = 1;
    llama_backend_free();
    return rc;
}
