/*
 * kquant_e2e.c - tiny K-quant and IQ4 models from cinfer's GGUF writer, run by
 * cinfer and by llama.cpp (libllama, CPU, 2 threads, F16 KV cache, flash
 * attention off); prints per model how many logits of 24 positions are
 * bit-identical, whether the argmax agrees, and the worst relative L2
 * error of a position. Built and run by kquant-check.sh; a diagnostic,
 * not a test: it never fails. PERPOS=1 prints each differing position.
 *
 * Two llama.cpp paths are compared: a 24-row prompt (llama.cpp takes its
 * tiled K-quant matmul at 8 rows or more) and one token per call (the
 * vec_dot path, or CPU_REPACK for Q4_K and IQ4_NL when extra_bufts = 1).
 * Q8_0 is the control: its logits are identical in every mode; Q4_1
 * likewise, and Q4_0 only with extra_bufts = 0 (llama.cpp repacks it,
 * q4_0_8x8, where cinfer keeps vec_dot's order). A type the
 * writer or the model refuses prints "not run" with the reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "llama.h"
#include "engine/model.h"
#include "engine/tinymodel.h"

static int run(cinfer_dtype wt, const char *arch, int extra_bufts, int one_by_one)
{
    char path[128];
    snprintf(path, sizeof path, "/tmp/cinfer-kquant-e2e-%s-%s.gguf", cinfer_dtype_name(wt), arch);
    cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
    tp.arch = arch; tp.n_layer = 2; tp.n_embd = 256; tp.n_head = 4; tp.n_head_kv = 2;
    tp.n_ff = 512; tp.n_vocab = 512; tp.n_ctx = 256; tp.weight_dtype = wt; tp.embd_dtype = wt;
    tp.tied_output = 0; tp.seed = 5;
    if (cinfer_tinymodel_write(&tp, path) != CINFER_OK) {
        printf("%s %s: not run: write: %s\n", cinfer_dtype_name(wt), arch, cinfer_last_error());
        return 1;
    }
    enum { N = 24 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 7919 + 13) % 500);
    /* cinfer */
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path; mp.n_threads = 2; mp.n_ctx = 64;
    cinfer_model *m = NULL;
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        printf("%s %s: not run: cinfer: %s\n", cinfer_dtype_name(wt), arch, cinfer_last_error());
        remove(path);
        return 1;
    }
    int V = cinfer_model_get_info(m)->n_vocab;
    float *ours = malloc(sizeof(float) * N * V);
    if (!one_by_one) {
        if (cinfer_model_eval_single(m, toks, N, 0, 1, ours) != CINFER_OK) { printf("%s: not run: eval: %s\n", cinfer_dtype_name(wt), cinfer_last_error()); return 1; }
    } else {
        for (int i = 0; i < N; i++)
            if (cinfer_model_eval_single(m, &toks[i], 1, i, 0, ours + i * V) != CINFER_OK) { printf("%s: not run: eval: %s\n", cinfer_dtype_name(wt), cinfer_last_error()); return 1; }
    }
    /* llama.cpp */
    struct llama_model_params lmp = llama_model_default_params();
    lmp.use_extra_bufts = extra_bufts;
    struct llama_model *lm = llama_model_load_from_file(path, lmp);
    if (!lm) { printf("%s: not run: llama: load failed\n", cinfer_dtype_name(wt)); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context *ctx = llama_init_from_model(lm, cp);
    struct llama_batch b = llama_batch_init(N, 0, 1);
    float *theirs = malloc(sizeof(float) * N * V);
    if (one_by_one) {
        for (int i = 0; i < N; i++) {
            b.token[0] = toks[i]; b.pos[0] = i; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1; b.n_tokens = 1;
            if (llama_decode(ctx, b)) { printf("%s: not run: llama decode failed\n", cinfer_dtype_name(wt)); return 1; }
            memcpy(theirs + i * V, llama_get_logits_ith(ctx, 0), sizeof(float) * V);
        }
    } else {
        for (int i = 0; i < N; i++) { b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1; }
        b.n_tokens = N;
        if (llama_decode(ctx, b)) { printf("%s: not run: llama decode failed\n", cinfer_dtype_name(wt)); return 1; }
        for (int i = 0; i < N; i++) memcpy(theirs + i * V, llama_get_logits_ith(ctx, i), sizeof(float) * V);
    }
    int same = 0; double worst = 0; int argmax_same = 0;
    for (int t = 0; t < N; t++) {
        const float *lg = theirs + t * V;
        double num = 0, den = 0; int a1 = 0, a2 = 0;
        for (int i = 0; i < V; i++) {
            same += lg[i] == ours[t * V + i];
            double d = lg[i] - ours[t * V + i]; num += d * d; den += (double)lg[i] * lg[i];
            if (lg[i] > lg[a1]) a1 = i;
            if (ours[t * V + i] > ours[t * V + a2]) a2 = i;
        }
        argmax_same += a1 == a2;
        double rel = sqrt(num / den); worst = rel > worst ? rel : worst;
        if (getenv("PERPOS") && rel > 0) printf("  t=%d rel %.3g\n", t, rel);
    }
    printf("%s %s %s extra_bufts=%d: %d/%d logits bit-identical, argmax same %d/%d, max rel L2 %.3g\n",
           cinfer_dtype_name(wt), arch, one_by_one ? "decode 1-by-1" : "prefill 24", extra_bufts, same, N * V, argmax_same, N, worst);
    llama_batch_free(b); llama_free(ctx); llama_model_free(lm); cinfer_model_destroy(m); free(ours); free(theirs);
    remove(path);
    return 0;
}

int main(void)
{
    llama_backend_init();
    llama_log_set(NULL, NULL);
    const cinfer_dtype ts[] = {CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q5_K,  CINFER_DTYPE_Q6_K,
                               CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K,  CINFER_DTYPE_IQ4_XS,
                               CINFER_DTYPE_IQ4_NL, CINFER_DTYPE_Q8_0,  CINFER_DTYPE_Q4_0,
                               CINFER_DTYPE_Q4_1};
    for (int i = 0; i < (int)(sizeof ts / sizeof ts[0]); i++)
        for (int o = 0; o < 2; o++)
            for (int e = 0; e < 2; e++)
                if (run(ts[i], "llama", e, o) != 0)
                    o = e = 2; /* refused: once is enough */
    return 0;
}
