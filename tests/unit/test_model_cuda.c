/*
 * test_model_cuda.c - the model's forward pass on the CUDA backend against
 * the CPU backend, on tiny random models and on the default model.
 *
 * Built twice (tests/CMakeLists.txt):
 *   test_model_cuda          linked with cinfer_device: a real GPU; skips
 *                            (77) when cinfer_cuda_device_count() is 0
 *                            (scripts/gpu-check.sh runs it on a device).
 *   test_model_cuda_cudasim  CINFER_TEST_CUDASIM, linked with
 *                            cinfer_cuda_sim: the same CUDA backend with its
 *                            kernels run on the CPU by tests/cudasim/; adds
 *                            the device-fault checks, which need the
 *                            harness's fault injection.
 *
 * Each tiny model is loaded twice from one file, once per backend. A prompt
 * of 20 tokens is prefilled on both (logits of every prompt row compared),
 * then each backend decodes 32 greedy tokens, feeding back its own argmax:
 * the logits are compared at every step and the token streams must be
 * equal, but for at most one near-tie in eight steps (compare_run: where
 * the CPU's own top-two gap is below twice the backends' discrepancy, and
 * CUDA picks the runner-up, both go on with the CPU's token). Covered: GQA ratios 1, 2, 3 and 4 (4/4, 4/2, 6/2, 8/2, 4/1), both
 * rope modes (llama = NORM; qwen2 = NEOX with Q/K/V biases), Llama 3's rope
 * frequency factors and linear rope scaling, qwen3's per-head Q/K norms
 * with a head size from attention.key_length, every weight type
 * (F32, F16, BF16, Q8_0, Q4_0, Q4_1, embeddings of the same type, tied and
 * separate output), head_dim 64 and the odd widths 40 and 20 (the attention
 * kernels take multiples of 4 up to 256), F16 and F32 KV caches. Prefill
 * runs the batched paths (cuBLAS GEMM, tiled mmq, prefill attention tiles),
 * decode the single-row ones (mmvq, partitioned decode attention).
 *
 * The bounds are relative L2 errors over the vocabulary, |cuda - cpu| /
 * |cpu|, worst over every compared row (bound_for below). Given the same
 * inputs every op of these models agrees with the CPU's to < 1e-6 (checked
 * op by op while writing this test, each op fed the CPU's inputs): both
 * backends round activations the same way (F16 / BF16 copies for the float
 * weights, the CPU's Q8_1 bytes for the quantized ones) and differ only in
 * the order of float additions. What grows through the model is that
 * noise, crossing a rounding step: a value an ulp apart rounds to a
 * different F16 (KV cache, F16 activations), BF16 or int8 (a Q8_1 block's
 * scale moves and its 32 values re-round), and the step after sees an
 * error of that format's precision, not of float's. So the bound depends on
 * the coarsest rounding on the way (worst seen over the shapes below in 2
 * runs of the whole file, identical as the harness's forward schedule is
 * deterministic, cudasim -> bound):
 *   F32 weights, F32 KV cache   1.3e-6 -> 1e-5 (no rounding but float's)
 *   F32 weights, F16 KV cache   4.2e-4 -> 2e-3
 *   F16 weights                 1.3e-3 -> 5e-3
 *   BF16 weights                6.2e-3 -> 2.5e-2
 *   Q8_0 / Q4_0 / Q4_1          2.2e-2 -> 6e-2 (one re-rounded Q8_1 block
 *                               of the attention output at one position
 *                               of a 2-layer model moves the rest of the
 *                               run by 1e-2: traced op by op)
 * A wrong index, scale or missing term gives errors of order 1 (the
 * logits of a random model have std ~2 and the wrong ones are unrelated),
 * and the greedy tokens, which must all be equal, diverge. The F32 + F32
 * KV case keeps a tight bound so that an arithmetic change shows there.
 *
 * The default model (SmolLM2-135M Q4_1, 30 layers; its test says SKIP when
 * the file is absent) runs the same comparison on 1 prompt with
 * DEFAULT_STEPS greedy tokens, with an F32 KV cache (the F16 cache's
 * attention differs, below). Every op agrees with the CPU's to < 1e-5 on
 * identical inputs there too, but 30 layers of Q8_1 re-rounding grow the
 * float noise to 4.7e-2 (prefill) and 7.0e-2 (decode) at the logits (7.4e-2
 * with the F16 cache): bound DEFAULT_BOUND = 0.2, and the greedy tokens must
 * be equal. Then 32 greedy steps (DEFAULT_FORCED_STEPS) teacher-forced:
 * the CPU decodes 32 tokens, the CUDA model evaluates the prompt and the
 * first 31 in one batched pass, and its argmax at every step must be the
 * CPU's next token (so a free-running CUDA decode would give the same 32
 * tokens; the decode kernels themselves are what the 2 free steps and the
 * tiny models' 32 exercise), except at most DEFAULT_MAX_TIES near-ties:
 * steps where the CPU's own top-two gap is smaller than twice the two
 * backends' discrepancy on the leading logits and CUDA picks the CPU's
 * runner-up. Prompt 0 has three, at steps 5, 23 and 26, where the CPU's
 * gaps are 0.034, 0.015 and 0.026 against discrepancies of 0.28-0.51 (its
 * continuation repeats itself there, and the model is undecided between
 * two tokens); DEFAULT_MAX_TIES allows one in eight steps. Its forward pass through the harness, release build, 2 harness
 * threads on a shared 2-core machine: 19 s for the 5-token prompt and 7.8 s
 * per decode step at a load average of ~3 (63-79 s and 15-20 s at ~10; the
 * CPU backend: 0.035 s per step), which is why it runs 1 prompt and 2
 * tokens; the whole file then takes 40 s. Under ASan + UBSan (clang) the
 * default model is left out (the harness runs -O2 there too, but the
 * model's load and CPU pass are instrumented); the rest takes ~30 s.
 *
 * Attention over an F16 KV cache: the CPU backend (kernels/cpu/ops.c)
 * normalises the probabilities and rounds them to F16 before the V
 * product (GGML's arithmetic); kernels/cuda/attention.cu keeps them in
 * fp32 (online softmax) and rounds only the query. On identical inputs
 * the op then differs by 1-2e-4 (relative L2; every row but a sequence's
 * first), in the prefill tiles and the decode partitions alike, where with
 * an F32 cache it agrees to < 1e-6. The F16-cache bounds above include it.
 *
 * Fault checks (the harness build only): a device call that fails in the
 * middle of a decode step (every counted call of the step in turn, with
 * graphs off and on) fails that step with CINFER_E_DEVICE, leaves the
 * backend healthy, and the same step run again gives the fault-free
 * logits bit for bit; after a sticky fault (cudaErrorIllegalAddress) the
 * backend reports itself unhealthy and later steps fail without crashing;
 * either way destroying the model and the backend frees every device
 * allocation (cudasim_live_allocations).
 * The sticky check runs last: cuda_check.c keeps a process-wide "a sticky
 * error was seen" flag, as a real process would after such a fault.
 *
 * Launch count (the harness build only): the kernel launches of one decode
 * step at 2 and 3 layers, printed, and the per-layer count held to
 * DECODE_LAUNCHES_PER_LAYER.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/model.h"
#include "engine/tinymodel.h"
#include "harness.h"

#ifdef CINFER_TEST_CUDASIM
#include "tests/cudasim/cudasim_ctl.h"
#endif

/* Relative L2 bound of CUDA vs CPU logits: the coarsest rounding the
 * activations cross (header comment). */
static double bound_for(cinfer_dtype wt, int kv_f32)
{
    switch (wt) {
    case CINFER_DTYPE_F32:
        return kv_f32 ? 1e-5 : 2e-3;
    case CINFER_DTYPE_F16:
        return 5e-3;
    case CINFER_DTYPE_BF16:
        return 2.5e-2;
    default: /* Q8_0, Q4_0, Q4_1: Q8_1 activations */
        return 6e-2;
    }
}

#define PROMPT_LEN 20
#define GREEDY_STEPS 32
#define DEFAULT_PROMPTS (UNDER_ASAN ? 0 : 1)
#define DEFAULT_STEPS 2
#define DEFAULT_FORCED_STEPS 32
#define DEFAULT_MAX_TIES 4 /* near-ties allowed in those 32 steps */
#define DEFAULT_BOUND 0.2

/* CUDA error codes (driver_types.h) the fault checks inject; spelled out so
 * the test needs no CUDA header. */
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701 /* not sticky */
#define CUDA_ERROR_ILLEGAL_ADDRESS 700         /* sticky */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------- */
/* the two models                                                         */
/* ---------------------------------------------------------------------- */

typedef struct {
    const char *arch;
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab;
    cinfer_dtype wt;
    int tied;
    int kv_f32;
    int head_dim;             /* 0 = n_embd / n_head, else key_length */
    const char *rope_scaling; /* NULL, "linear" (factor 4) or "llama3"
                                 (factor 8, original context 64) */
} shape;

typedef struct {
    cinfer_backend *cuda; /* owned here; the CUDA model borrows it */
    cinfer_model *cpu_m, *cuda_m;
} model_pair;

static const char *tmp_path(const char *tag)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/cinfer-test-model-cuda-%d-%s.gguf",
             (int)getpid(), tag);
    return buf;
}

/* eager: CUDA graphs off (every kernel of a decode step its own counted
 * device call, where a replayed step is one graph launch). */
static cinfer_status open_cuda(cinfer_backend **out, int eager)
{
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    cp.eager = eager;
    cinfer_status st = cinfer_backend_cuda_create(&cp, out);
    if (st != CINFER_OK)
        fprintf(stderr, "cuda backend: %s\n", cinfer_last_error());
    return st;
}

static cinfer_model *load(const char *path, cinfer_backend *be, int kv_f32,
                          int n_ctx)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.backend = be;
    mp.n_threads = 2;
    mp.n_ctx = n_ctx;
    mp.kv_f32 = kv_f32;
    mp.max_seqs = 1;
    mp.block_size = 16; /* the server's; a 52-token sequence spans 4 blocks */
    mp.max_batch_rows = 64;
    cinfer_model *m = NULL;
    if (cinfer_model_create(&mp, &m) != CINFER_OK)
        fprintf(stderr, "model (%s): %s\n", be ? "cuda" : "cpu",
                cinfer_last_error());
    return m;
}

/* Both models of one file; 0 on success. */
static int pair_open(model_pair *p, const char *path, int kv_f32, int n_ctx)
{
    memset(p, 0, sizeof *p);
    if (open_cuda(&p->cuda, 0) != CINFER_OK)
        return -1;
    p->cpu_m = load(path, NULL, kv_f32, n_ctx);
    p->cuda_m = load(path, p->cuda, kv_f32, n_ctx);
    return p->cpu_m && p->cuda_m ? 0 : -1;
}

static void pair_close(model_pair *p)
{
    cinfer_model_destroy(p->cuda_m);
    cinfer_model_destroy(p->cpu_m);
    cinfer_backend_destroy(p->cuda);
    memset(p, 0, sizeof *p);
}

static int write_tiny(const shape *s, const char *path)
{
    cinfer_tinymodel_params tp = cinfer_tinymodel_default_params();
    tp.arch = s->arch;
    tp.n_layer = (uint32_t)s->n_layer;
    tp.n_embd = (uint32_t)s->n_embd;
    tp.n_head = (uint32_t)s->n_head;
    tp.n_head_kv = (uint32_t)s->n_head_kv;
    tp.n_ff = (uint32_t)s->n_ff;
    tp.n_vocab = (uint32_t)s->n_vocab;
    tp.n_ctx = 256;
    tp.weight_dtype = s->wt;
    tp.embd_dtype = s->wt;
    tp.tied_output = s->tied;
    tp.head_dim = (uint32_t)s->head_dim;
    if (s->rope_scaling) {
        tp.rope_scaling = s->rope_scaling;
        tp.rope_theta = 500000.0f;
        tp.rope_factor = strcmp(s->rope_scaling, "linear") == 0 ? 4.0f : 8.0f;
        tp.rope_orig_ctx = 64;
    }
    /* SentencePiece needs no regex library, so the GPU-check build
     * (CINFER_GPU_CHECK, no PCRE2) loads these files too. */
    tp.tokenizer = "llama";
    tp.seed = (uint64_t)(s->n_embd * 7 + s->n_head * 3 + s->n_vocab + s->wt);
    if (cinfer_tinymodel_write(&tp, path) != CINFER_OK) {
        fprintf(stderr, "tinymodel: %s\n", cinfer_last_error());
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* comparison                                                             */
/* ---------------------------------------------------------------------- */

static double rel_l2(const float *got, const float *want, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

typedef struct {
    double worst_prefill, worst_decode;
    int steps_equal;     /* greedy steps whose tokens agreed or tied */
    int ties;            /* of them, near-ties (lead_error below) */
    int first_diff_step; /* -1 = none */
    double cuda_prefill_s, cuda_decode_s; /* CUDA forward time, per call */
    double cpu_decode_s;
} run_result;

static double lead_error(const float *g, const float *c, int V);

/* Prefills `prompt` on both models (logits of every row compared), then
 * decodes n_steps greedy tokens on each backend from its own argmax. Where
 * the two pick different tokens at a near-tie (the CPU's top-two gap below
 * twice the backends' discrepancy on the leading logits, and CUDA's pick
 * the CPU's runner-up: float rounding grown through Q8_1 or F16
 * re-rounding, where either choice is right), the step counts as a tie
 * and both go on with the CPU's token; any other difference ends the run. */
static void compare_run(model_pair *p, const int32_t *prompt, int n_prompt,
                        int n_steps, run_result *r)
{
    int V = cinfer_model_get_info(p->cpu_m)->n_vocab;
    memset(r, 0, sizeof *r);
    r->first_diff_step = -1;
    float *lc = malloc(sizeof(float) * (size_t)n_prompt * V);
    float *lg = malloc(sizeof(float) * (size_t)n_prompt * V);
    CHECK_OK(cinfer_model_eval_single(p->cpu_m, prompt, n_prompt, 0, 1, lc));
    double t0 = now_s();
    cinfer_status st =
        cinfer_model_eval_single(p->cuda_m, prompt, n_prompt, 0, 1, lg);
    r->cuda_prefill_s = now_s() - t0;
    CHECK_OK(st);
    for (int t = 0; t < n_prompt; t++) {
        double e = rel_l2(lg + (size_t)t * V, lc + (size_t)t * V, V);
        r->worst_prefill = e > r->worst_prefill ? e : r->worst_prefill;
    }
    int32_t tok_c = argmax(lc + (size_t)(n_prompt - 1) * V, V);
    int32_t tok_g = argmax(lg + (size_t)(n_prompt - 1) * V, V);
    double cuda_s = 0, cpu_s = 0;
    for (int i = 0; i < n_steps && st == CINFER_OK; i++) {
        if (tok_c != tok_g) {
            double gap = (double)lc[tok_c] - lc[tok_g],
                   noise = lead_error(lg, lc, V);
            int runner_up = 1;
            for (int v = 0; v < V; v++)
                if (v != tok_c && lc[v] > lc[tok_g])
                    runner_up = 0;
            const int tie = gap < 2 * noise && runner_up;
            fprintf(stderr, "  greedy token %d: cpu %d, cuda %d: cpu gap "
                            "%.4f, backends differ by %.4f on the leading "
                            "logits%s\n",
                    i, tok_c, tok_g, gap, noise, tie ? ": a near-tie" : "");
            if (!tie) {
                r->first_diff_step = i;
                break;
            }
            r->ties++;
            tok_g = tok_c;
        }
        r->steps_equal++;
        if (i == n_steps - 1)
            break; /* the last token is compared, not decoded */
        double a = now_s();
        CHECK_OK(cinfer_model_eval_single(p->cpu_m, &tok_c, 1, n_prompt + i,
                                          0, lc));
        double b = now_s();
        st = cinfer_model_eval_single(p->cuda_m, &tok_g, 1, n_prompt + i, 0,
                                      lg);
        cuda_s += now_s() - b;
        cpu_s += b - a;
        CHECK_OK(st);
        double e = rel_l2(lg, lc, V);
        r->worst_decode = e > r->worst_decode ? e : r->worst_decode;
        tok_c = argmax(lc, V);
        tok_g = argmax(lg, V);
    }
    if (n_steps > 1) {
        r->cuda_decode_s = cuda_s / (n_steps - 1);
        r->cpu_decode_s = cpu_s / (n_steps - 1);
    }
    free(lc);
    free(lg);
}

/* Largest |g - c| over the CPU's 10 largest logits: the discrepancy of the
 * two backends where the greedy choice is made. */
static double lead_error(const float *g, const float *c, int V)
{
    int top[10];
    int n = 0;
    for (int v = 0; v < V; v++) {
        int k;
        if (n < 10)
            k = n++;
        else if (c[v] <= c[top[9]])
            continue;
        else
            k = 9;
        top[k] = v;
        for (; k > 0 && c[top[k]] > c[top[k - 1]]; k--) {
            int t = top[k];
            top[k] = top[k - 1];
            top[k - 1] = t;
        }
    }
    double e = 0;
    for (int k = 0; k < n; k++) {
        double d = fabs((double)g[top[k]] - c[top[k]]);
        e = d > e ? d : e;
    }
    return e;
}

/* The CPU decodes n_steps greedy tokens after `prompt` (its own argmax fed
 * back, decode rows); then the CUDA model evaluates prompt + the first
 * n_steps - 1 of them in one batched pass, and at every step its argmax
 * given that same history must be the CPU's next token (so a free-running
 * CUDA decode would give the CPU's tokens), except at a near-tie: the two
 * backends' logits differ by float rounding grown through 30 layers of
 * Q8_1 re-quantization (up to ~0.3 at logits of ~15 here), so where the
 * CPU's own top-two gap is below twice the backends' discrepancy on the
 * leading logits at that step, either choice is right; such a step is
 * counted in *ties (and CUDA's pick must be the CPU's runner-up). Returns
 * the steps that agreed or tied; *worst gets their relative L2. */
static int teacher_forced_greedy(model_pair *p, const int32_t *prompt,
                                 int n_prompt, int n_steps, double *worst,
                                 int *ties, double *cuda_s)
{
    int V = cinfer_model_get_info(p->cpu_m)->n_vocab;
    int n = n_prompt + n_steps - 1;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)n);
    float *lc = malloc(sizeof(float) * (size_t)V * (size_t)n_steps);
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    int agreed = 0;
    *worst = 0;
    *ties = 0;
    CINFER_ASSERT(seq && lc && lg);
    memcpy(seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    CHECK_OK(cinfer_model_eval_single(p->cpu_m, prompt, n_prompt, 0, 0, lc));
    for (int i = 0;; i++) {
        int32_t tok = argmax(lc + (size_t)i * V, V);
        if (i == n_steps - 1)
            break;
        seq[n_prompt + i] = tok;
        CHECK_OK(cinfer_model_eval_single(p->cpu_m, &tok, 1, n_prompt + i, 0,
                                          lc + (size_t)(i + 1) * V));
    }
    double t0 = now_s();
    CHECK_OK(cinfer_model_eval_single(p->cuda_m, seq, n, 0, 1, lg));
    *cuda_s = now_s() - t0;
    for (int i = 0; i < n_steps; i++) {
        const float *g = lg + (size_t)(n_prompt - 1 + i) * V;
        const float *c = lc + (size_t)i * V;
        double e = rel_l2(g, c, V);
        *worst = e > *worst ? e : *worst;
        int32_t tc = argmax(c, V), tg = argmax(g, V);
        if (tc != tg) {
            double gap = (double)c[tc] - c[tg], noise = lead_error(g, c, V);
            int runner_up = 1;
            for (int v = 0; v < V; v++)
                if (v != tc && c[v] > c[tg])
                    runner_up = 0;
            fprintf(stderr,
                    "  teacher-forced step %d: cpu %d (%.4f; %.4f on cuda), "
                    "cuda %d (%.4f; %.4f on cpu): cpu gap %.4f, backends "
                    "differ by %.4f on the leading logits%s\n",
                    i, tc, c[tc], g[tc], tg, g[tg], c[tg], gap, noise,
                    gap < 2 * noise && runner_up ? ": a near-tie" : "");
            if (!(gap < 2 * noise && runner_up))
                break;
            (*ties)++;
        }
        agreed++;
    }
    free(seq);
    free(lc);
    free(lg);
    return agreed;
}

static void random_prompt(int32_t *toks, int n, int n_vocab, uint64_t seed)
{
    for (int i = 0; i < n; i++)
        toks[i] = (int32_t)(harness_rand(&seed) % (uint64_t)n_vocab);
}

/* ---------------------------------------------------------------------- */
/* tiny models                                                            */
/* ---------------------------------------------------------------------- */

static void check_shape(const shape *s)
{
    const char *path = tmp_path("tiny");
    CHECK(write_tiny(s, path) == 0);
    model_pair p;
    int ok = pair_open(&p, path, s->kv_f32, 128) == 0;
    CHECK(ok);
    if (ok) {
        int32_t prompt[PROMPT_LEN];
        random_prompt(prompt, PROMPT_LEN, s->n_vocab,
                      77 + (uint64_t)s->n_vocab + (uint64_t)s->wt);
        double bound = bound_for(s->wt, s->kv_f32);
        run_result r;
        compare_run(&p, prompt, PROMPT_LEN, GREEDY_STEPS, &r);
        fprintf(stderr,
                "  %s%s%s L%d D%d H%d/%d hd%d F%d V%d %s%s kv %s: rel L2 "
                "prefill %.2e decode %.2e (bound %.1e), %d/%d greedy "
                "tokens equal (%d near-ties); cuda %.0f ms prefill, %.0f "
                "ms/step\n",
                s->arch, s->rope_scaling ? " rope " : "",
                s->rope_scaling ? s->rope_scaling : "", s->n_layer,
                s->n_embd, s->n_head, s->n_head_kv,
                s->head_dim ? s->head_dim : s->n_embd / s->n_head, s->n_ff,
                s->n_vocab,
                cinfer_dtype_name(s->wt), s->tied ? " tied" : "",
                s->kv_f32 ? "f32" : "f16", r.worst_prefill, r.worst_decode,
                bound, r.steps_equal, GREEDY_STEPS, r.ties,
                r.cuda_prefill_s * 1e3, r.cuda_decode_s * 1e3);
        CHECK(r.worst_prefill <= bound);
        CHECK(r.worst_decode <= bound);
        CHECK_EQ_INT(r.steps_equal, GREEDY_STEPS);
        CHECK(r.ties <= GREEDY_STEPS / 8);
    }
    pair_close(&p);
    remove(path);
}

static void test_tiny_models_match_cpu(void)
{
    static const shape shapes[] = {
        /* arch     L  D    H  KV  F    V    type              tied kv32 */
        {"llama", 2, 256, 4, 4, 192, 384, CINFER_DTYPE_F32, 1, 0, 0, NULL},  /* MHA, hd 64 */
        {"llama", 2, 256, 4, 2, 256, 512, CINFER_DTYPE_F16, 0, 0, 0, NULL},  /* GQA 2 */
        {"qwen2", 2, 320, 8, 2, 256, 448, CINFER_DTYPE_BF16, 1, 0, 0, NULL}, /* GQA 4, hd 40, NEOX+bias */
        {"llama", 2, 384, 6, 2, 256, 512, CINFER_DTYPE_Q8_0, 0, 0, 0, NULL}, /* GQA 3, hd 64 */
        {"qwen2", 2, 256, 4, 2, 192, 384, CINFER_DTYPE_Q4_0, 0, 1, 0, NULL}, /* NEOX+bias, F32 KV */
        {"llama", 2, 160, 8, 2, 224, 320, CINFER_DTYPE_Q4_1, 1, 0, 0, NULL}, /* GQA 4, hd 20 */
        {"qwen2", 1, 256, 4, 4, 192, 384, CINFER_DTYPE_Q4_1, 1, 0, 0, NULL}, /* NEOX MHA, Q4_1 */
        {"llama", 1, 256, 4, 2, 192, 384, CINFER_DTYPE_F32, 0, 1, 0, NULL},  /* NORM, F32 KV */
        /* Llama 3 rope factors, MQA, F32 all through (the tight bound) */
        {"llama", 2, 256, 4, 1, 192, 384, CINFER_DTYPE_F32, 0, 1, 0, "llama3"},
        /* qwen3: per-head Q/K norms, head 64 from key_length (128 / 4 =
         * 32), F32 all through */
        {"qwen3", 2, 128, 4, 2, 192, 384, CINFER_DTYPE_F32, 1, 1, 64, NULL},
        /* qwen3, linear rope scaling, head 48, GQA 4, Q8_0 */
        {"qwen3", 2, 256, 8, 2, 256, 448, CINFER_DTYPE_Q8_0, 0, 0, 48, "linear"},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(&shapes[i]);
}

/* ---------------------------------------------------------------------- */
/* the default model                                                      */
/* ---------------------------------------------------------------------- */

static void test_default_model_matches_cpu(void)
{
    const char *path = cinfer_model_default_path();
    if (!path || !*path || access(path, R_OK) != 0) {
        fprintf(stderr, "  SKIP: the default model is not installed\n");
        return;
    }
    model_pair p;
    /* F32 KV cache: see the header for the F16 cache's attention. */
    if (pair_open(&p, path, 1, 256) != 0) {
        /* The GPU-check build has no PCRE2, which SmolLM2's byte-level
         * BPE pre-tokenizer needs: the file cannot be loaded there. */
        if (cinfer_last_error() && strstr(cinfer_last_error(), "PCRE2")) {
            fprintf(stderr, "  SKIP: %s\n", cinfer_last_error());
        } else {
            CHECK(!"the default model loads on both backends");
        }
        pair_close(&p);
        return;
    }
    static const char *prompts[] = {
        "The capital of France is",
        "def fibonacci(n):\n    ",
        "Once upon a time, in a small village by the sea,",
    };
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(p.cpu_m);
    /* 30 layers of Q8_1 re-rounding (header comment). */
    double bound = DEFAULT_BOUND;
    for (int i = 0; i < DEFAULT_PROMPTS; i++) {
        int32_t ids[64];
        size_t n_ids = 0;
        CHECK_OK(cinfer_tokenizer_encode(tk, prompts[i], strlen(prompts[i]),
                                         1, 0, ids, 64, &n_ids));
        int n = (int)n_ids;
        CHECK(n > 0);
        if (n <= 0)
            continue;
        run_result r;
        compare_run(&p, ids, n, DEFAULT_STEPS, &r);
        fprintf(stderr,
                "  default model, prompt %d (%d tokens): rel L2 prefill %.2e "
                "decode %.2e (bound %.1e), %d/%d greedy tokens equal; cuda "
                "forward %.2f s prefill, %.2f s/decode step (cpu %.3f "
                "s/step)\n",
                i, n, r.worst_prefill, r.worst_decode, bound,
                r.steps_equal, DEFAULT_STEPS, r.cuda_prefill_s,
                r.cuda_decode_s, r.cpu_decode_s);
        CHECK(r.worst_prefill <= bound);
        CHECK(r.worst_decode <= bound);
        CHECK_EQ_INT(r.steps_equal, DEFAULT_STEPS);
        /* 32 greedy steps, teacher-forced (one batched CUDA pass instead
         * of 32 decode steps of ~8 s each through the harness). */
        double worst = 0, cuda_s = 0;
        int ties = 0;
        int agreed = teacher_forced_greedy(&p, ids, n, DEFAULT_FORCED_STEPS,
                                           &worst, &ties, &cuda_s);
        fprintf(stderr,
                "  default model, prompt %d: %d/%d teacher-forced greedy "
                "tokens equal (%d of them near-ties), rel L2 %.2e (bound "
                "%.1e); cuda forward of %d rows %.1f s\n",
                i, agreed, DEFAULT_FORCED_STEPS, ties, worst, bound,
                n + DEFAULT_FORCED_STEPS - 1, cuda_s);
        CHECK_EQ_INT(agreed, DEFAULT_FORCED_STEPS);
        CHECK(ties <= DEFAULT_MAX_TIES);
        CHECK(worst <= bound);
    }
    pair_close(&p);
}

/* ---------------------------------------------------------------------- */
/* device faults (harness only)                                           */
/* ---------------------------------------------------------------------- */

#ifdef CINFER_TEST_CUDASIM
static const shape fault_shape = {"llama", 1, 128, 4, 2, 128, 300,
                                  CINFER_DTYPE_Q4_1, 0, 0, 0, NULL};

/* One CUDA model of fault_shape with a 6-token prompt prefilled. */
static cinfer_model *fault_model(const char *path, cinfer_backend **be,
                                 int eager, float *logits)
{
    *be = NULL;
    if (open_cuda(be, eager) != CINFER_OK)
        return NULL;
    cinfer_model *m = load(path, *be, 0, 64);
    if (!m)
        return NULL;
    int32_t prompt[6] = {11, 42, 7, 200, 3, 99};
    CHECK_OK(cinfer_model_eval_single(m, prompt, 6, 0, 0, logits));
    return m;
}

/* A fault at each counted device call of a decode step in turn: the step
 * fails with CINFER_E_DEVICE, the backend stays healthy, and the step run
 * again gives the fault-free logits bit for bit. Then everything is freed.
 * Run twice: eagerly, where the step's dozens of kernels are each a counted
 * call (under ASan every third, for the time budget), and with graphs,
 * where the step is recorded once and then replayed as one graph launch
 * among its few copies, so every call is tried. */
static void fault_each_call(int eager, int stride, int min_failed)
{
    const char *path = tmp_path("fault");
    CHECK(write_tiny(&fault_shape, path) == 0);
    long live0 = cudasim_live_allocations();
    long reports0 = cudasim_report_count();
    int V = fault_shape.n_vocab;
    float *clean = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    cinfer_backend *be;
    cinfer_model *m = fault_model(path, &be, eager, clean);
    CHECK(m != NULL);
    if (m) {
        int32_t tok = 5;
        CHECK_OK(cinfer_model_eval_single(m, &tok, 1, 6, 0, clean));
        int failed = 0, nth;
        for (nth = 0; nth < 2000; nth += stride) {
            cudasim_inject_fault(nth, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 0);
            cinfer_status st = cinfer_model_eval_single(m, &tok, 1, 6, 0, got);
            if (st == CINFER_OK) {
                cudasim_inject_fault(-1, 0, 0); /* past the step's calls */
                CHECK(memcmp(got, clean, sizeof(float) * V) == 0);
                break;
            }
            failed++;
            if (st != CINFER_E_DEVICE ||
                !strstr(cinfer_last_error(), "cudaError")) {
                fprintf(stderr, "  call %d: status %d: %s\n", nth, st,
                        cinfer_last_error());
                CHECK_EQ_INT(st, CINFER_E_DEVICE);
            }
            CHECK_EQ_INT(cinfer_backend_healthy(be), 1);
            /* The next attempt of the same step succeeds, as the engine's
             * next step would. */
            CHECK_OK(cinfer_model_eval_single(m, &tok, 1, 6, 0, got));
            if (memcmp(got, clean, sizeof(float) * V) != 0) {
                fprintf(stderr, "  after a fault at call %d: rel L2 %.2e\n",
                        nth, rel_l2(got, clean, V));
                CHECK(!"a step after a fault gives the fault-free logits");
            }
        }
        fprintf(stderr,
                "  %s: a fault at each of %d device calls of a decode step "
                "(every %d%s) failed it; the step after each recovered\n",
                eager ? "eager" : "graphs", failed, stride,
                stride == 1 ? "" : " calls");
        CHECK(failed >= min_failed);
    }
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
    CHECK_EQ_INT(cudasim_live_allocations(), live0);
    CHECK_EQ_INT(cudasim_report_count(), reports0);
    free(clean);
    free(got);
    remove(path);
}

static void test_transient_fault_fails_the_step_only(void)
{
    /* Eager: dozens of kernels per step (>= 10 tried even at stride 3). */
    fault_each_call(1, UNDER_ASAN ? 3 : 1, 10);
    /* Graphs: the replay launch and the step's copies around it. */
    fault_each_call(0, 1, 5);
}

/* Kernel launches of one decode step (the harness counts them), for the
 * fault shape at 2 and 3 layers: the difference is one layer's, the rest
 * the step's work outside the layers (embedding, output norm and head,
 * the step's metadata). Printed for the record; the per-layer count is
 * held to what the fused ops give (DECODE_LAUNCHES_PER_LAYER), so a change
 * that adds launches to every layer shows here. A layer at a context of
 * one attention partition: add_rms_norm; quantize, Q/K/V (one mmvq
 * launch); rope_kv_store; attention; quantize, output projection;
 * add_rms_norm; quantize, gate and up with SwiGLU (one launch); quantize,
 * down projection (20 before the fusions). */
#define DECODE_LAUNCHES_PER_LAYER 12
static void test_decode_launches_per_layer(void)
{
    long long step[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        shape s = fault_shape;
        s.n_layer = 2 + i;
        char tag[16];
        snprintf(tag, sizeof tag, "launch%d", s.n_layer);
        const char *path = tmp_path(tag);
        CHECK(write_tiny(&s, path) == 0);
        cinfer_backend *be = NULL;
        CHECK_OK(open_cuda(&be, 0));
        cinfer_model *m = be ? load(path, be, 0, 64) : NULL;
        CHECK(m != NULL);
        if (m) {
            float *logits = malloc(sizeof(float) * (size_t)s.n_vocab);
            int32_t prompt[6] = {11, 42, 7, 200, 3, 99}, tok = 5;
            CHECK_OK(cinfer_model_eval_single(m, prompt, 6, 0, 0, logits));
            long long before = cudasim_get_stats().launches;
            CHECK_OK(cinfer_model_eval_single(m, &tok, 1, 6, 0, logits));
            step[i] = cudasim_get_stats().launches - before;
            free(logits);
        }
        cinfer_model_destroy(m);
        cinfer_backend_destroy(be);
        remove(path);
    }
    const long long per_layer = step[1] - step[0];
    fprintf(stderr,
            "  decode step: %lld kernel launches at 2 layers, %lld at 3: "
            "%lld a layer, %lld outside the layers\n",
            step[0], step[1], per_layer, step[0] - 2 * per_layer);
    CHECK(per_layer > 0);
    CHECK(per_layer <= DECODE_LAUNCHES_PER_LAYER);
}

/* A sticky fault: the step fails, the backend says it is unhealthy, later
 * steps fail with CINFER_E_DEVICE (no crash, no abort), and destroy still
 * frees every allocation. Last: the sticky flag stays set. */
static void test_sticky_fault_marks_backend_unhealthy(void)
{
    const char *path = tmp_path("sticky");
    CHECK(write_tiny(&fault_shape, path) == 0);
    long live0 = cudasim_live_allocations();
    float *logits = malloc(sizeof(float) * fault_shape.n_vocab);
    cinfer_backend *be;
    cinfer_model *m = fault_model(path, &be, 0, logits);
    CHECK(m != NULL);
    if (m) {
        CHECK_EQ_INT(cinfer_backend_healthy(be), 1);
        int32_t tok = 5;
        cudasim_inject_fault(3, CUDA_ERROR_ILLEGAL_ADDRESS, 1);
        CHECK_EQ_INT(cinfer_model_eval_single(m, &tok, 1, 6, 0, logits),
                     CINFER_E_DEVICE);
        CHECK(strstr(cinfer_last_error(), "cudaErrorIllegalAddress") != NULL);
        CHECK_EQ_INT(cinfer_backend_healthy(be), 0);
        for (int i = 0; i < 2; i++)
            CHECK_EQ_INT(cinfer_model_eval_single(m, &tok, 1, 6, 0, logits),
                         CINFER_E_DEVICE);
        CHECK_EQ_INT(cinfer_backend_healthy(be), 0);
    }
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
    CHECK_EQ_INT(cudasim_live_allocations(), live0);
    free(logits);
    remove(path);
}
#endif

int main(void)
{
#ifndef CINFER_TEST_CUDASIM
    if (cinfer_cuda_device_count() == 0)
        return harness_skip("no CUDA device");
#endif
    RUN(test_tiny_models_match_cpu);
    RUN(test_default_model_matches_cpu);
#ifdef CINFER_TEST_CUDASIM
    RUN(test_transient_fault_fails_the_step_only);
    RUN(test_decode_launches_per_layer);
    RUN(test_sticky_fault_marks_backend_unhealthy); /* last: see above */
#endif
    return harness_done();
}
