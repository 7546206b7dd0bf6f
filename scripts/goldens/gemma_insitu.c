/*
 * gemma_insitu.c - where cinfer and llama.cpp part on a real GGUF file
 * (built and run by gemma-insitu.sh; not part of the build).
 *
 * llama.cpp runs the model as the goldens do (model_goldens.py: CPU, 2
 * threads, default weight buffers, so Q4_K is repacked; F16 KV cache,
 * flash attention off) over one prompt twice: as one batch (the prompt
 * path) and one token per call (the decode path). An eval callback sees
 * every node:
 *   - each MUL_MAT with quantized weights is recomputed by cinfer's
 *     kernels (cinfer_cpu_matmul_prepare + _compute on every ISA this
 *     processor has) from llama.cpp's own input, and the bits compared;
 *   - every node whose rows are the batch's tokens is kept, so the two
 *     paths can be compared row by row: the first node (in graph order)
 *     whose bits differ between llama.cpp's own two paths is printed.
 * Usage: gemma_insitu MODEL.gguf [prompt-token-count]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "engine/model.h"
#include "kernels/backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"

#define MAX_NODES 4096

typedef struct {
    char name[GGML_MAX_NAME];
    int64_t width, rows;
    float *data; /* [rows][width] */
} kept;

typedef struct {
    struct ggml_context *wctx; /* the file's weights, unrepacked */
    int batched;               /* 1: the prompt in one call */
    int token;                 /* one-token path: the position */
    kept nodes[MAX_NODES];     /* the prompt path's nodes, in order */
    int n_nodes;
    int seen; /* one-token path: node index within the call */
    /* per weight type: nodes recomputed, nodes differing, outputs differing */
    int mm_nodes[GGML_TYPE_COUNT], mm_bad[GGML_TYPE_COUNT];
    long mm_out[GGML_TYPE_COUNT], mm_out_bad[GGML_TYPE_COUNT];
    long mm_other_same[GGML_TYPE_COUNT]; /* Q4_K repack / Q6_K tiled order */
    /* one-token path: per kept node, rows whose bits differ */
    int row_bad[MAX_NODES];
    double row_rel[MAX_NODES];
    float *tok_logits; /* one-token path: [n_tok][n_vocab] */
    int64_t n_vocab;
} state;

static int quantized(enum ggml_type t)
{
    return t != GGML_TYPE_F32 && t != GGML_TYPE_F16 && t != GGML_TYPE_BF16;
}

/* ---- the two orders llama.cpp's other K-quant paths sum in ------------ */

static void scale_min_k4(int j, const uint8_t *q, int *d, int *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K as ggml's repacked q4_K_8x8 kernels (x86) sum it, per output:
 * integer sums per pair of 32-element sub-blocks p = 0..3 of a super-block
 * (isum_p = sc[2p] * dot(2p) + sc[2p+1] * dot(2p+1), imin_p = m[2p] *
 * bsum(2p) + m[2p+1] * bsum(2p+1), all exact); dd = f(dw) * da, dm =
 * f(dmin) * da;
 *   gemv (one row, and a batch's last rows % 4):  per super-block
 *     acc = fma((float)sum_p isum_p, dd, acc); accm = fma((float)sum_p imin_p, dm, accm)
 *   gemm (a batch's first rows - rows % 4): per pair p
 *     acc = fma((float)isum_p, dd, acc); accm = fma((float)imin_p, dm, accm)
 *   out = acc - accm. */
static float q4k_repack(const cinfer_block_q4_k *x, const cinfer_block_q8_k *y, int nb, int gemm)
{
    float acc = 0, accm = 0;
    for (int b = 0; b < nb; b++) {
        const float dd = cinfer_fp16_to_fp32(x[b].d) * y[b].d;
        const float dm = cinfer_fp16_to_fp32(x[b].dmin) * y[b].d;
        int32_t isum = 0, imin = 0;
        for (int c = 0; c < 4; c++) {
            int32_t ip = 0, mp = 0;
            for (int h = 0; h < 2; h++) {
                int sc, m;
                scale_min_k4(2 * c + h, x[b].scales, &sc, &m);
                int32_t s = 0;
                for (int l = 0; l < 32; l++) {
                    int q = h ? x[b].qs[32 * c + l] >> 4 : x[b].qs[32 * c + l] & 0xF;
                    s += q * y[b].qs[64 * c + 32 * h + l];
                }
                ip += sc * s;
                int sb = 2 * c + h;
                mp += m * (y[b].bsums[2 * sb] + y[b].bsums[2 * sb + 1]);
            }
            if (gemm) {
                acc = fmaf((float)ip, dd, acc);
                accm = fmaf((float)mp, dm, accm);
            }
            isum += ip;
            imin += mp;
        }
        if (!gemm) {
            acc = fmaf((float)isum, dd, acc);
            accm = fmaf((float)imin, dm, accm);
        }
    }
    return acc - accm;
}

/* Q6_K as ggml's tiled kernel (AVX-512 VNNI, 8 rows or more) sums it: one
 * exact integer per super-block, acc = fma((float)isum * f(dw), da, acc)
 * (the source writes acc + t * da; GCC contracts it, as -ffp-contract=fast
 * allows: every output of a 9-token Gemma prompt matched the fused form). */
static float q6k_tiled(const cinfer_block_q6_k *x, const cinfer_block_q8_k *y, int nb)
{
    float acc = 0;
    for (int b = 0; b < nb; b++) {
        int32_t isum = 0;
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        for (int n = 0; n < 2; n++, ql += 64, qh += 32)
            for (int l = 0; l < 32; l++) {
                int e = 128 * n + l;
                int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                isum += x[b].scales[e / 16] * q1 * y[b].qs[e];
                isum += x[b].scales[(e + 32) / 16] * q2 * y[b].qs[e + 32];
                isum += x[b].scales[(e + 64) / 16] * q3 * y[b].qs[e + 64];
                isum += x[b].scales[(e + 96) / 16] * q4 * y[b].qs[e + 96];
            }
        float t = (float)isum * cinfer_fp16_to_fp32(x[b].d);
        acc = fmaf(t, y[b].d, acc);
    }
    return acc;
}

static const char *t_name(const struct ggml_tensor *w) { return w->name; }

/* Outputs of t that the order above reproduces bit for bit (-1: none). */
static long other_order(const struct ggml_tensor *w, const void *wd, size_t wrb, const void *act,
                        size_t arb, const float *ref, int n, int n_in, int n_out)
{
    if (w->type != GGML_TYPE_Q4_K && w->type != GGML_TYPE_Q6_K)
        return -1;
    long same = 0;
    static int shown[GGML_TYPE_COUNT];
    int show = n > 1 && !shown[w->type]++;
    for (int r = 0; r < n; r++) {
        long row_same = 0;
        for (int o = 0; o < n_out; o++) {
            const void *wr = (const char *)wd + (size_t)o * wrb;
            const cinfer_block_q8_k *ar = (const void *)((const char *)act + (size_t)r * arb);
            /* the rows llama.cpp's repack gives its gemm (one ubatch here) */
            int gemm = n > 3 && r < n - n % 4;
            float v = w->type == GGML_TYPE_Q4_K ? q4k_repack(wr, ar, n_in / 256, gemm)
                                                : q6k_tiled(wr, ar, n_in / 256);
            row_same += memcmp(&v, &ref[(size_t)r * n_out + o], 4) == 0;
        }
        if (show)
            printf("  %s row %d: %ld/%d equal\n", t_name(w), r, row_same, n_out);
        same += row_same;
    }
    return same;
}

static void check_matmul(state *s, struct ggml_tensor *t)
{
    const struct ggml_tensor *w = t->src[0], *x = t->src[1];
    if (!quantized(w->type) || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) ||
        ggml_n_dims(w) != 2 || x->ne[2] != 1 || x->ne[3] != 1)
        return;
    struct ggml_tensor *wf = ggml_get_tensor(s->wctx, w->name);
    if (!wf || strcmp(w->name, "token_embd.weight") == 0) /* the head: too slow */
        return;
    const int n_in = (int)w->ne[0], n_out = (int)w->ne[1], n = (int)x->ne[1];
    cinfer_dtype wt = (cinfer_dtype)w->type;
    const void *wd = wf->data;
    void *conv = NULL;
    size_t wrb = wf->nb[1];
    if (w->type == GGML_TYPE_Q5_0) { /* cinfer loads Q5_0 as Q8_0 */
        wt = CINFER_DTYPE_Q8_0;
        wrb = cinfer_dtype_row_bytes(wt, n_in);
        conv = malloc(wrb * n_out);
        cinfer_dtype_q5_0_to_q8_0(wd, conv, (int64_t)n_out * n_in / 32);
        wd = conv;
    }
    const cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
    const size_t arb = cinfer_dtype_row_bytes(at, n_in);
    float *xf = malloc(sizeof(float) * n * n_in), *ref = malloc(sizeof(float) * n * n_out);
    float *out = malloc(sizeof(float) * n * n_out);
    void *act = malloc(arb * n);
    ggml_backend_tensor_get(x, xf, 0, sizeof(float) * n * n_in);
    ggml_backend_tensor_get(t, ref, 0, sizeof(float) * n * n_out);
    int worst = 0;
    int isa_used = -1;
    /* the ISA the backend picks (the kernel tests hold the others to it) */
    for (int isa = CINFER_CPU_ISA_AVX512; isa >= CINFER_CPU_ISA_PORTABLE; isa--) {
        if (!cinfer_cpu_isa_supported((cinfer_cpu_isa)isa))
            continue;
        cinfer_cpu_matmul_prepare((cinfer_cpu_isa)isa, at, xf, n_in, 0, n, act);
        cinfer_cpu_matmul_compute((cinfer_cpu_isa)isa, wt, wd, wrb, act, n, n_in, out, n_out, 0,
                                  n_out);
        int d = 0;
        for (int i = 0; i < n * n_out; i++)
            d += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
        worst = d > worst ? d : worst;
        isa_used = isa;
        break;
    }
    (void)isa_used;
    long same = other_order(w, wd, wrb, act, arb, ref, n, n_in, n_out);
    if (same >= 0)
        s->mm_other_same[w->type] += same;
    s->mm_nodes[w->type]++;
    s->mm_bad[w->type] += worst != 0;
    s->mm_out[w->type] += (long)n * n_out;
    s->mm_out_bad[w->type] += worst;
    free(xf);
    free(ref);
    free(out);
    free(act);
    free(conv);
}

/* A node whose ne[1] is the call's token count and whose rows are plain. */
static int row_node(const struct ggml_tensor *t, int64_t n_tok)
{
    return t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[1] == n_tok &&
           t->ne[2] == 1 && t->ne[3] == 1 && t->name[0];
}

static bool on_node(struct ggml_tensor *t, bool ask, void *ud)
{
    if (ask)
        return true;
    state *s = ud;
    if (t->op == GGML_OP_MUL_MAT)
        check_matmul(s, t);
    if (s->batched) {
        if (!row_node(t, t->ne[1] > 1 ? t->ne[1] : 1) || s->n_nodes >= MAX_NODES)
            return true;
        kept *k = &s->nodes[s->n_nodes++];
        snprintf(k->name, sizeof k->name, "%s", t->name);
        k->width = t->ne[0];
        k->rows = t->ne[1];
        k->data = malloc(ggml_nbytes(t));
        ggml_backend_tensor_get(t, k->data, 0, ggml_nbytes(t));
        return true;
    }
    if (!row_node(t, 1))
        return true;
    if (strcmp(t->name, "result_output") == 0 && t->ne[0] == s->n_vocab)
        ggml_backend_tensor_get(t, s->tok_logits + (size_t)s->token * s->n_vocab, 0,
                                ggml_nbytes(t));
    /* the same name, in order, among the prompt path's nodes */
    for (int i = s->seen; i < s->n_nodes; i++) {
        kept *k = &s->nodes[i];
        if (strcmp(k->name, t->name) || k->width != t->ne[0] || s->token >= k->rows)
            continue;
        float *row = malloc(ggml_nbytes(t));
        ggml_backend_tensor_get(t, row, 0, ggml_nbytes(t));
        const float *ref = k->data + (size_t)s->token * k->width;
        double num = 0, den = 0;
        int differ = 0;
        for (int64_t j = 0; j < k->width; j++) {
            differ |= memcmp(&row[j], &ref[j], 4) != 0;
            double d = (double)row[j] - ref[j];
            num += d * d;
            den += (double)ref[j] * ref[j];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        s->row_bad[i] += differ;
        if (rel > s->row_rel[i])
            s->row_rel[i] = rel;
        free(row);
        s->seen = i + 1;
        break;
    }
    return true;
}

/* Bits and rel L2 of cinfer's logits rows against llama.cpp's. */
static void compare_logits(const char *what, const float *ours, const float *ref, int n,
                           int64_t V)
{
    int same = 0;
    double worst = 0;
    for (int r = 0; r < n; r++) {
        const float *a = ours + (size_t)r * V, *b = ref + (size_t)r * V;
        double num = 0, den = 0;
        for (int64_t i = 0; i < V; i++) {
            double d = (double)a[i] - b[i];
            num += d * d;
            den += (double)b[i] * b[i];
        }
        same += memcmp(a, b, sizeof(float) * (size_t)V) == 0;
        double rel = sqrt(num / den);
        worst = rel > worst ? rel : worst;
    }
    printf("cinfer vs %s: %d/%d logit rows bit-identical, max rel L2 %.3g\n", what, same, n,
           worst);
}

/* cinfer on the same tokens: one per call (each a decode row after the
 * first), and the whole prompt in one call. */
static void run_cinfer(const char *path, const int32_t *toks, int n, const state *s,
                       const float *prompt_logits)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_ctx = 1024;
    cinfer_model *m;
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        printf("cinfer: %s\n", cinfer_last_error());
        return;
    }
    const int64_t V = s->n_vocab;
    float *out = malloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < n; i++)
        if (cinfer_model_eval_single(m, toks + i, 1, i, 0, out + (size_t)i * V) != CINFER_OK)
            printf("cinfer: %s\n", cinfer_last_error());
    compare_logits("llama.cpp's one-token path", out, s->tok_logits, n, V);
    if (cinfer_model_eval_single(m, toks, n, 0, 1, out) != CINFER_OK)
        printf("cinfer: %s\n", cinfer_last_error());
    if (prompt_logits)
        compare_logits("llama.cpp's prompt path", out, prompt_logits, n, V);
    free(out);
    cinfer_model_destroy(m);
}

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)level, (void)text, (void)ud;
}

static void report_mm(const state *s, const char *what)
{
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (s->mm_nodes[t])
            printf("%s: %s products: %d/%d nodes, %ld/%ld outputs differ from cinfer's; "
                   "%ld equal to the %s order\n", what, ggml_type_name((enum ggml_type)t),
                   s->mm_bad[t], s->mm_nodes[t], s->mm_out_bad[t], s->mm_out[t],
                   s->mm_other_same[t],
                   t == GGML_TYPE_Q4_K ? "repack" : t == GGML_TYPE_Q6_K ? "tiled" : "(none)");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_tokens]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    int n_tok = argc > 2 ? atoi(argv[2]) : 19;
    llama_backend_init();
    llama_log_set(quiet, NULL);
    static state s;
    struct gguf_init_params gp = {.no_alloc = false, .ctx = &s.wctx};
    struct gguf_context *g = gguf_init_from_file(path, gp);
    if (!g) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    struct llama_model_params lmp = llama_model_default_params();
    struct llama_model *lm = llama_model_load_from_file(path, lmp);
    if (!lm)
        return 1;
    const struct llama_vocab *voc = llama_model_get_vocab(lm);
    const char *text = "The capital of France is Paris, and the capital of Germany is Berlin; "
                       "the capital of Italy is Rome and of Spain, Madrid.";
    int32_t toks[256];
    int nt = llama_tokenize(voc, text, (int32_t)strlen(text), toks, 256, true, true);
    if (nt < n_tok)
        n_tok = nt;
    s.n_vocab = llama_vocab_n_tokens(voc);
    s.tok_logits = calloc((size_t)n_tok * s.n_vocab, sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 1024;
        cp.n_ubatch = 512;
        cp.n_threads = cp.n_threads_batch = 2;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.cb_eval = on_node;
        cp.cb_eval_user_data = &s;
        s.batched = pass == 0;
        memset(s.mm_nodes, 0, sizeof s.mm_nodes);
        memset(s.mm_bad, 0, sizeof s.mm_bad);
        memset(s.mm_out, 0, sizeof s.mm_out);
        memset(s.mm_out_bad, 0, sizeof s.mm_out_bad);
        memset(s.mm_other_same, 0, sizeof s.mm_other_same);
        struct llama_context *ctx = llama_init_from_model(lm, cp);
        struct llama_batch b = llama_batch_init(n_tok, 0, 1);
        for (int i = 0; i < n_tok; i++) {
            int k = s.batched ? i : 0;
            b.token[k] = toks[i];
            b.pos[k] = i;
            b.n_seq_id[k] = 1;
            b.seq_id[k][0] = 0;
            b.logits[k] = 1;
            b.n_tokens = k + 1;
            if (!s.batched) {
                s.token = i;
                s.seen = 0;
                llama_decode(ctx, b);
            } else if (i == n_tok - 1) {
                llama_decode(ctx, b);
            }
        }
        report_mm(&s, s.batched ? "prompt path" : "one-token path");
        llama_batch_free(b);
        llama_free(ctx);
    }
    printf("llama.cpp's one-token path vs its prompt path, %d tokens (nodes in graph "
           "order; rows whose bits differ, max rel L2 of a row):\n", n_tok);
    int first = -1;
    for (int i = 0; i < s.n_nodes; i++) {
        if (s.row_bad[i] && first < 0)
            first = i;
        if (i < 40 || s.row_bad[i] || i == s.n_nodes - 1)
            if (i < 40 || first == i || i == s.n_nodes - 1 || i % 25 == 0)
                printf("  %4d %-24s %3d/%lld rows differ, max rel %.3g\n", i, s.nodes[i].name,
                       s.row_bad[i], (long long)s.nodes[i].rows, s.row_rel[i]);
    }
    if (first >= 0)
        printf("first differing node: %s (#%d)\n", s.nodes[first].name, first);
    const float *prompt_logits = NULL;
    for (int i = 0; i < s.n_nodes; i++)
        if (strcmp(s.nodes[i].name, "result_output") == 0 && s.nodes[i].width == s.n_vocab &&
            s.nodes[i].rows == n_tok)
            prompt_logits = s.nodes[i].data;
    run_cinfer(path, toks, n_tok, &s, prompt_logits);
    gguf_free(g);
    llama_model_free(lm);
    return 0;
}
