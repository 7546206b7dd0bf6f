/*
 * kquant_insitu.c - the quantized products llama.cpp computes inside a real
 * model graph, recomputed by cinfer's kernels from llama.cpp's own inputs
 * (built and run by kquant-check.sh; not part of the build).
 *
 * For each K-quant and IQ4 type, a tiny model from cinfer's GGUF writer is
 * run by libllama (CPU, 1 thread; plain weight buffers, use_extra_bufts
 * off, except for Q4_K, IQ4_NL and Q2_K, whose repacked buffers (q4_K_8x8,
 * iq4_nl_8x8, q2_K_8x8; rows % 8 == 0) hold the order cinfer follows:
 * ggml_gemv_q4_K_8x8_q8_K, _iq4_nl_8x8_q8_0, _q2_K_8x8_q8_K); an eval
 * callback takes every MUL_MAT node with quantized weights (their bytes
 * from the file, as a repacked buffer holds another layout),
 * quantizes its F32 input with cinfer_cpu_matmul_prepare and multiplies
 * with cinfer_cpu_matmul_compute on every ISA this processor has, and
 * compares the bits with llama.cpp's output.
 *   - decode, one token per call (the vec_dot path): any difference fails;
 *   - a 24-token prompt: reported only (llama.cpp may take its tiled or
 *     tinyBLAS kernels there, another float order).
 * A type the writer refuses prints "not run" with the reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "engine/tinymodel.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"

typedef struct {
    int nodes, bad_nodes;
    int show; /* print the first differing nodes */
    struct ggml_context *file; /* the model's tensors, read from the file */
} tally;

static int quantized(enum ggml_type t)
{
    return t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16;
}

static bool on_node(struct ggml_tensor *t, bool ask, void *ud)
{
    if (ask)
        return t->op == GGML_OP_MUL_MAT;
    if (t->op != GGML_OP_MUL_MAT)
        return true;
    tally *ty = ud;
    const struct ggml_tensor *w = t->src[0], *x = t->src[1];
    if (!quantized(w->type) || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
        ggml_n_dims(w) != 2 || x->ne[2] != 1 || x->ne[3] != 1)
        return true;
    const int n_in = (int)w->ne[0], n_out = (int)w->ne[1], n = (int)x->ne[1];
    const cinfer_dtype wt = (cinfer_dtype)w->type, at = cinfer_cpu_matmul_act_type(wt);
    const size_t arb = cinfer_dtype_row_bytes(at, n_in);
    float *xf = malloc(sizeof(float) * n * n_in), *ref = malloc(sizeof(float) * n * n_out);
    float *out = malloc(sizeof(float) * n * n_out);
    const struct ggml_tensor *fw = ggml_get_tensor(ty->file, w->name);
    if (!fw || ggml_nbytes(fw) != ggml_nbytes(w)) {
        printf("  %s: weight not in the file\n", w->name);
        ty->nodes++;
        ty->bad_nodes++;
        return true;
    }
    void *act = malloc(arb * n), *wd = malloc(ggml_nbytes(w));
    ggml_backend_tensor_get(x, xf, 0, sizeof(float) * n * n_in);
    ggml_backend_tensor_get(t, ref, 0, sizeof(float) * n * n_out);
    memcpy(wd, fw->data, ggml_nbytes(w));
    int differ = 0;
    for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512; isa++) {
        if (!cinfer_cpu_isa_supported((cinfer_cpu_isa)isa))
            continue;
        cinfer_cpu_matmul_prepare((cinfer_cpu_isa)isa, at, xf, n_in, 0, n, act);
        cinfer_cpu_matmul_compute((cinfer_cpu_isa)isa, wt, wd, w->nb[1], act, n, n_in, out, n_out,
                                  0, n_out);
        int d = 0;
        for (int i = 0; i < n * n_out; i++)
            d += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
        if (d && ty->show && ty->bad_nodes < 3)
            printf("  %s (%s, %d x %d, %d rows, isa %s): %d/%d differ\n", t->name,
                   ggml_type_name(w->type), n_out, n_in, n, cinfer_cpu_isa_name((cinfer_cpu_isa)isa),
                   d, n * n_out);
        differ |= d != 0;
    }
    ty->nodes++;
    ty->bad_nodes += differ;
    free(xf);
    free(ref);
    free(out);
    free(act);
    free(wd);
    return true;
}

/* Runs the model at `path` one token per call (steps tokens) or as one
 * prompt of `steps` tokens; returns the tally. */
static tally run(const char *path, int steps, int one_by_one, int repack)
{
    tally ty = {0, 0, one_by_one, NULL};
    struct gguf_init_params gp = {false, &ty.file};
    struct gguf_context *gg = gguf_init_from_file(path, gp);
    if (!gg) {
        ty.bad_nodes = -1;
        return ty;
    }
    struct llama_model_params lmp = llama_model_default_params();
    lmp.use_extra_bufts = repack;
    struct llama_model *lm = llama_model_load_from_file(path, lmp);
    if (!lm) {
        gguf_free(gg);
        ggml_free(ty.file);
        ty.bad_nodes = -1;
        return ty;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = cp.n_ubatch = 64;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = on_node;
    cp.cb_eval_user_data = &ty;
    struct llama_context *ctx = llama_init_from_model(lm, cp);
    struct llama_batch b = llama_batch_init(steps, 0, 1);
    for (int i = 0; i < steps; i++) {
        int k = one_by_one ? 0 : i;
        b.token[k] = (i * 7919 + 13) % 500;
        b.pos[k] = i;
        b.n_seq_id[k] = 1;
        b.seq_id[k][0] = 0;
        b.logits[k] = 1;
        b.n_tokens = k + 1;
        if (one_by_one || i == steps - 1)
            llama_decode(ctx, b);
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(lm);
    gguf_free(gg);
    ggml_free(ty.file);
    return ty;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)level, (void)text, (void)ud;
}

int main(void)
{
    llama_backend_init();
    llama_log_set(quiet, NULL);
    const cinfer_dtype ts[] = {CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K,   CINFER_DTYPE_Q4_K,
                               CINFER_DTYPE_Q5_K, CINFER_DTYPE_Q6_K,   CINFER_DTYPE_IQ4_XS,
                               CINFER_DTYPE_IQ4_NL};
    const char *path = "/tmp/cinfer-kquant-insitu.gguf";
    int fails = 0;
    for (int i = 0; i < (int)(sizeof ts / sizeof ts[0]); i++) {
        cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
        tp.n_layer = 2;
        tp.n_embd = 256;
        tp.n_head = 4;
        tp.n_head_kv = 2;
        tp.n_ff = 512;
        tp.n_vocab = 512;
        tp.weight_dtype = tp.embd_dtype = ts[i];
        tp.tied_output = 0;
        tp.seed = 5;
        if (cinfer_tinymodel_write(&tp, path) != CINFER_OK) {
            printf("in situ %s: not run: write: %s\n", cinfer_dtype_name(ts[i]), cinfer_last_error());
            continue;
        }
        const int rp = ts[i] == CINFER_DTYPE_Q4_K || ts[i] == CINFER_DTYPE_IQ4_NL ||
                       ts[i] == CINFER_DTYPE_Q2_K;
        tally d = run(path, 8, 1, rp), p = run(path, 24, 0, rp);
        remove(path);
        if (d.bad_nodes < 0 || p.bad_nodes < 0) {
            printf("in situ %s: not run: llama.cpp could not load the model\n",
                   cinfer_dtype_name(ts[i]));
            fails++;
            continue;
        }
        printf("in situ %s: decode 8 x 1 token: %d/%d quantized mul_mat nodes differ; "
               "prompt of 24: %d/%d differ (reported only)\n",
               cinfer_dtype_name(ts[i]), d.bad_nodes, d.nodes, p.bad_nodes, p.nodes);
        fails += d.bad_nodes != 0 || d.nodes == 0;
    }
    return fails != 0;
}
