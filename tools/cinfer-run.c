/*
 * cinfer-run - local generation with the engine, no server.
 *
 *   cinfer-run [-m MODEL] -p "prompt" [-n 64] [--temperature 0] [--top-k K]
 *              [--top-p P] [--min-p P] [--seed S] [-t THREADS]
 *              [--chat [--chat-template FILE]]
 *              [--device auto|cpu|cuda[:N]] [--gpu-memory-fraction F]
 *              [--spec-ngram K [--spec-ngram-range MIN,MAX]] [-r REPS]
 *
 * Streams the generated text to stdout as it is sampled and ends with the
 * prompt and decode speeds on stderr. With no -m it uses the default model.
 * After loading, one stderr line gives the memory the model holds
 * (weights, activations, scratch, KV cache, and the device budget); on
 * CUDA the KV cache takes what the budget leaves (engine/model.h).
 * While a model loads, a progress bar is drawn when stderr is a terminal.
 *
 * With `--spec-ngram K` the generation goes through the serving engine
 * (engine.h) with prompt-lookup speculative decoding of up to K draft
 * tokens per step (K = 0: the engine without it, for comparison); the
 * output is the same either way, and the last stderr line adds the
 * drafts verified and taken. With -r REPS the request runs REPS times (the
 * text is printed once) and each run prints a JSON line on stderr with
 * its prompt and decode tokens/s.
 *
 * `--chat` sends the prompt as one user message through the model's chat
 * template (tokenizer.chat_template), rendered by the server's own code
 * (server/chat.h: Llama 3, Llama 3.1/3.3, Qwen3, Gemma 3, ChatML), with
 * the generation prompt after it; a model whose template is not one of
 * those is refused with the family's name where it is known, as the
 * server refuses chat input. `--chat-template FILE` takes the template
 * from a file instead (a model file without one: Gemma 3 270M's).
 *
 * Benchmark mode (`--bench PP,TG [-r REPS]`) evaluates a synthetic prompt of
 * PP tokens, then decodes TG tokens greedily (never stopping), REPS times,
 * and prints one JSON line per repetition with prompt and decode tokens/s:
 * the figures bench/ compares against llama.cpp's llama-bench.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#ifdef CINFER_RUN_CHAT
#include "server/chat.h"
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress_bar(float f, void *user)
{
    int *last = user;
    int pct = (int)(f * 100.0f + 0.5f);
    if (pct == *last)
        return;
    *last = pct;
    int width = 40, fill = pct * width / 100;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\rloading [%s] %3d%%", bar, pct);
    if (pct >= 100)
        fputc('\n', stderr);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cinfer-run [options] -p PROMPT\n"
            "  -m, --model PATH        GGUF model (default: %s)\n"
            "  -p, --prompt TEXT       prompt text ('-' reads standard input)\n"
            "  -n, --max-tokens N      tokens to generate (default 64)\n"
            "  -t, --threads N         CPU threads of the CPU backend (default:\n"
            "                          all cores)\n"
            "      --device D          auto|cpu|cuda[:N]: cuda:N = CUDA device N\n"
            "                          (cuda = cuda:0); auto = cuda:0 when a CUDA\n"
            "                          device is present, else the CPU (default\n"
            "                          auto)\n"
            "      --gpu-memory-fraction F  share of the CUDA device's memory to\n"
            "                          hold, in (0, 1]; the KV cache takes what\n"
            "                          the model leaves (default 0.9)\n"
            "      --tensor-parallel N split the model over N ranks: on --device\n"
            "                          cuda[:K] CUDA devices K..K+N-1 over NCCL\n"
            "                          (given, even 1 goes through NCCL); else\n"
            "                          CPU threads with a shared-memory\n"
            "                          all-reduce, the --threads shared out\n"
            "                          (default 1)\n"
            "      --batch-invariant   on CUDA, float weights through a fixed-\n"
            "                          order kernel instead of cuBLAS, so a\n"
            "                          row's bits do not depend on its batch\n"
            "                          (as on the CPU)\n"
            "      --chat              send the prompt as a user message through\n"
            "                          the model's chat template (as the server)\n"
            "      --chat-template FILE  with --chat: this Jinja template instead\n"
            "                          of the model's (a family cinfer renders)\n"
            "      --temperature T     0 = greedy (default 0)\n"
            "      --top-k K           0 = off\n"
            "      --top-p P           1 = off\n"
            "      --min-p P           0 = off\n"
            "      --repeat-penalty R  1 = off\n"
            "      --presence-penalty X, --frequency-penalty X   0 = off\n"
            "      --seed S            sampling seed (default 0)\n"
            "      --ignore-eos        keep generating past end-of-text\n"
            "      --no-special        do not parse special tokens in the prompt\n"
            "      --isa NAME          portable|avx2|avx512 (default: best)\n"
            "      --ctx N             context per sequence (default 4096)\n"
            "      --mmap              use the weights from a mapping of the file\n"
            "                          (default: read into memory, in huge pages)\n"
            "      --spec-ngram K      generate through the engine with prompt-\n"
            "                          lookup speculative decoding of up to K\n"
            "                          draft tokens a step (0 = the engine\n"
            "                          without drafts); output is unchanged\n"
            "      --spec-ngram-range MIN,MAX  n-gram sizes matched (default 2,4)\n"
            "      --bench PP,TG       benchmark: PP prompt tokens, TG decoded\n"
            "  -r, --reps N            benchmark repetitions (default 3); with\n"
            "                          --spec-ngram, runs of the request (default\n"
            "                          1), one JSON line each on stderr\n"
            "  -h, --help\n",
            cinfer_model_default_path()[0] ? cinfer_model_default_path()
                                           : "(none installed)");
}

enum {
    OPT_CHAT = 256, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REP, OPT_PRES,
    OPT_FREQ, OPT_SEED, OPT_IGNORE_EOS, OPT_ISA, OPT_BENCH, OPT_NOSPECIAL,
    OPT_CTX, OPT_MMAP, OPT_DEVICE, OPT_GPU_FRACTION, OPT_TP, OPT_INVARIANT,
    OPT_SPEC, OPT_SPEC_RANGE, OPT_CHAT_TMPL
};

/* --device: "auto", "cpu", "cuda", "cuda:N". *cuda is -1 for the CPU,
 * -2 for auto, else the CUDA ordinal. */
static int parse_device(const char *s, int *cuda)
{
    if (strcmp(s, "auto") == 0) {
        *cuda = -2;
        return 0;
    }
    if (strcmp(s, "cpu") == 0) {
        *cuda = -1;
        return 0;
    }
    char *end;
    long n = 0;
    if (strcmp(s, "cuda") == 0) {
        *cuda = 0;
        return 0;
    }
    if (strncmp(s, "cuda:", 5) == 0) {
        errno = 0;
        n = strtol(s + 5, &end, 10);
        if (!errno && end != s + 5 && !*end && n >= 0 && n <= 1023) {
            *cuda = (int)n;
            return 0;
        }
    }
    fprintf(stderr, "cinfer-run: --device must be auto, cpu, cuda or cuda:N, "
                    "got '%s'\n", s);
    return -1;
}

/* The backend --device asks for; NULL (and 0) for the CPU, which the model
 * then creates itself with --threads and --isa. */
static int open_device(int cuda, double fraction, int invariant,
                       cinfer_backend **out)
{
    *out = NULL;
    if (cuda == -1 || (cuda == -2 && cinfer_cuda_device_count() <= 0))
        return 0;
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    cp.device = cuda < 0 ? 0 : cuda;
    cp.memory_fraction = fraction;
    cp.batch_invariant = invariant;
    if (cinfer_backend_cuda_create(&cp, out) != CINFER_OK) {
        fprintf(stderr, "cinfer-run: --device cuda:%d: %s\n", cp.device,
                cinfer_last_error());
        return -1;
    }
    return 0;
}

static void print_memory(const cinfer_model *m)
{
    const cinfer_model_info *I = cinfer_model_get_info(m);
    const double mib = 1024.0 * 1024.0;
    fprintf(stderr,
            "memory: weights %.1f MiB, activations %.1f MiB, scratch %.1f "
            "MiB, KV cache %.1f MiB (%d blocks of %d tokens)%s",
            (double)I->weights_held_bytes / mib,
            (double)I->activation_bytes / mib, (double)I->scratch_bytes / mib,
            (double)I->kv_bytes / mib, I->n_kv_blocks, I->block_size,
            I->tensor_parallel > 1 ? " per rank" : "");
    if (I->tensor_parallel > 1)
        fprintf(stderr, " of %d ranks", I->tensor_parallel);
    if (I->budget_bytes)
        fprintf(stderr, "; budget %.1f MiB\n", (double)I->budget_bytes / mib);
    else
        fprintf(stderr, "; no budget\n");
}

static int parse_int(const char *s, const char *name, long lo, long hi,
                     long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "cinfer-run: %s must be an integer in [%ld, %ld], "
                        "got '%s'\n", name, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *s, const char *name, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s) {
        fprintf(stderr, "cinfer-run: %s must be a number, got '%s'\n", name, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* The whole stream, NUL-terminated (malloc'd); *len its bytes if len. */
static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* --chat: the prompt's ids as one user message in the model's chat
 * template, with the generation prompt; *ids malloc'd. Prints why and
 * returns -1 when the model has no template the server renders. */
static int chat_prompt(const cinfer_model *m, const char *prompt,
                       const char *tmpl_path, int32_t **ids, size_t *n_ids)
{
#ifdef CINFER_RUN_CHAT
    cinfer_gguf_str tmpl = {NULL, 0};
    char *owned = NULL;
    const cinfer_gguf *g = cinfer_model_gguf(m);
    if (tmpl_path) {
        FILE *f = fopen(tmpl_path, "rb");
        size_t len = 0;
        owned = f ? read_all(f, &len) : NULL;
        if (f)
            fclose(f);
        if (!owned) {
            fprintf(stderr, "cinfer-run: --chat-template: cannot read %s\n",
                    tmpl_path);
            return -1;
        }
        tmpl.ptr = owned;
        tmpl.len = (uint64_t)len;
    } else if (!g || cinfer_gguf_get_str(g, "tokenizer.chat_template",
                                         &tmpl) != CINFER_OK) {
        cinfer_clear_error();
        tmpl.ptr = NULL;
        tmpl.len = 0;
    }
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(m);
    cinfer_chat_template ct;
    cinfer_status st = cinfer_chat_template_init(&ct, tmpl.ptr,
                                                 (size_t)tmpl.len, tk);
    free(owned); /* init copied what it keeps */
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
        return -1;
    }
    int rc = 0;
    if (ct.format == CINFER_CHAT_NONE) {
        if (!tmpl.ptr)
            fprintf(stderr, "cinfer-run: --chat: the model has no chat "
                            "template\n");
        else if (ct.refused)
            fprintf(stderr, "cinfer-run: --chat: the chat template (%s) "
                            "is not supported\n", ct.refused);
        else
            fprintf(stderr, "cinfer-run: --chat: the chat template is not "
                            "one cinfer renders (llama3, llama3.1, qwen3, "
                            "gemma3, chatml)\n");
        rc = -1;
    } else {
        Cinfer__V1__ChatMessage msg = CINFER__V1__CHAT_MESSAGE__INIT;
        msg.role = (char *)"user";
        msg.content = (char *)prompt;
        Cinfer__V1__ChatMessage *msgs[1] = {&msg};
        Cinfer__V1__Chat chat = CINFER__V1__CHAT__INIT;
        chat.n_messages = 1;
        chat.messages = msgs;
        if (cinfer_chat_encode(&ct, tk, &chat, ids, n_ids) != CINFER_OK) {
            fprintf(stderr, "cinfer-run: --chat: %s\n", cinfer_last_error());
            rc = -1;
        }
    }
    cinfer_chat_template_cleanup(&ct);
    return rc;
#else
    (void)m;
    (void)prompt;
    (void)tmpl_path;
    (void)ids;
    (void)n_ids;
    fprintf(stderr, "cinfer-run: --chat needs the chat templates "
                    "(server/chat.c), which this build lacks (no "
                    "protobuf-c)\n");
    return -1;
#endif
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* Synthetic prompt tokens and greedy decoding, as llama-bench measures:
 * the prompt (pp) and the decode steps (tg) are separate tests, and the
 * decode starts from an empty context (positions 0..tg-1), as llama-bench's
 * tg test does. */
static int run_bench(cinfer_model *m, int pp, int tg, int reps, int threads)
{
    const cinfer_model_info *I = cinfer_model_get_info(m);
    if ((pp > tg ? pp : tg) > I->n_ctx) {
        fprintf(stderr, "cinfer-run: --bench %d,%d exceeds the context %d\n",
                pp, tg, I->n_ctx);
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(pp > 0 ? pp : 1));
    float *logits = malloc(sizeof(float) * (size_t)I->n_vocab);
    if (!ids || !logits) {
        free(ids);
        free(logits);
        return 1;
    }
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < pp; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ids[i] = (int32_t)(s % (uint64_t)I->n_vocab);
    }
    /* warm-up: one token through every weight */
    int32_t t0 = 0;
    if (cinfer_model_eval_single(m, &t0, 1, 0, 0, logits) != CINFER_OK)
        goto fail;
    /* Tensor parallelism on CPU ranks: rank 0's time inside the
     * collectives (waiting for the other ranks included). */
    const cinfer_comm *comm = cinfer_backend_comm(cinfer_model_backend(m));
    uint64_t n0, ns0, n1, ns1;
    for (int r = 0; r < reps; r++) {
        double pp_tps = 0, tg_tps = 0, pp_coll_ms = 0, tg_coll_ms = 0;
        const int pos = 0; /* the decode test's own context */
        if (pp > 0) {
            cinfer_comm_stats(comm, &n0, &ns0);
            double a = now_s();
            if (cinfer_model_eval_single(m, ids, pp, 0, 0, logits) != CINFER_OK)
                goto fail;
            pp_tps = pp / (now_s() - a);
            cinfer_comm_stats(comm, &n1, &ns1);
            pp_coll_ms = (double)(ns1 - ns0) * 1e-6;
        }
        if (tg > 0) {
            int32_t tok = pp > 0 ? argmax(logits, I->n_vocab) : 1;
            cinfer_comm_stats(comm, &n0, &ns0);
            double a = now_s();
            for (int i = 0; i < tg; i++) {
                if (cinfer_model_eval_single(m, &tok, 1, pos + i, 0, logits) !=
                    CINFER_OK)
                    goto fail;
                tok = argmax(logits, I->n_vocab);
            }
            tg_tps = tg / (now_s() - a);
            cinfer_comm_stats(comm, &n1, &ns1);
            tg_coll_ms = (double)(ns1 - ns0) * 1e-6 / tg;
        }
        printf("{\"n_prompt\": %d, \"n_gen\": %d, \"threads\": %d, "
               "\"isa\": \"%s\", \"type\": \"%s\", \"pp_tps\": %.3f, "
               "\"tg_tps\": %.3f, \"tensor_parallel\": %d, "
               "\"pp_collective_ms\": %.3f, "
               "\"tg_collective_ms_per_token\": %.4f}\n",
               pp, tg, threads, cinfer_backend_device_desc(cinfer_model_backend(m)),
               I->quant, pp_tps, tg_tps, I->tensor_parallel, pp_coll_ms,
               tg_coll_ms);
        fflush(stdout);
    }
    free(ids);
    free(logits);
    return 0;
fail:
    fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
    free(ids);
    free(logits);
    return 1;
}

/* ---- generation through the engine (--spec-ngram) ---------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int print;      /* stream the text to stdout */
    int done;
    int n_ids;
    double t_first; /* first token's arrival */
    double t_end;
    cinfer_finish_reason why;
    char message[256];
} run_sink;

static void on_engine_event(void *user, const cinfer_engine_event *ev)
{
    run_sink *k = user;
    double t = now_s();
    pthread_mutex_lock(&k->mu);
    if (ev->kind == CINFER_EVENT_TOKENS) {
        if (ev->n_ids && k->n_ids == 0)
            k->t_first = t;
        k->n_ids += (int)ev->n_ids;
        if (k->print && ev->text_len) {
            fwrite(ev->text, 1, ev->text_len, stdout);
            fflush(stdout);
        }
    } else {
        k->done = 1;
        k->t_end = t;
        k->why = ev->finish;
        snprintf(k->message, sizeof k->message, "%s", ev->message);
        pthread_cond_signal(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
}

static int run_engine(cinfer_model *m, const int32_t *ids, size_t n_ids,
                      const cinfer_sampler_params *sp, int n_gen,
                      int ignore_eos, int spec_k, int spec_min, int spec_max,
                      int reps, double t_load)
{
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.max_seqs = 1;
    ep.admit_past_deadlines = 1;
    ep.spec_ngram_k = spec_k;
    ep.spec_ngram_min = spec_min;
    ep.spec_ngram_max = spec_max;
    cinfer_engine *e = NULL;
    if (cinfer_engine_create(&ep, &e) != CINFER_OK) {
        fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
        return 1;
    }
    int rc = 0;
    cinfer_engine_stats before, after;
    for (int r = 0; r < reps && rc == 0; r++) {
        run_sink k;
        memset(&k, 0, sizeof k);
        pthread_mutex_init(&k.mu, NULL);
        pthread_cond_init(&k.cv, NULL);
        k.print = r == 0;
        cinfer_request_params rp = cinfer_request_default_params();
        rp.prompt = ids;
        rp.n_prompt = n_ids;
        rp.sampling = *sp;
        rp.max_tokens = n_gen;
        rp.ignore_eos = ignore_eos;
        rp.on_event = on_engine_event;
        rp.user = &k;
        cinfer_engine_get_stats(e, &before);
        double t0 = now_s();
        if (cinfer_engine_submit(e, &rp, NULL) != CINFER_OK) {
            fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
            rc = 1;
        } else {
            pthread_mutex_lock(&k.mu);
            while (!k.done)
                pthread_cond_wait(&k.cv, &k.mu);
            pthread_mutex_unlock(&k.mu);
            cinfer_engine_get_stats(e, &after);
            if (k.why == CINFER_FINISH_ERROR) {
                fprintf(stderr, "\ncinfer-run: %s\n", k.message);
                rc = 1;
            }
            /* the first token comes with the prompt's step; the decode
             * rate counts the tokens after it */
            double pp_s = k.n_ids ? k.t_first - t0 : k.t_end - t0;
            double tg_s = k.t_end - k.t_first;
            double tg_tps = k.n_ids > 1 && tg_s > 0 ? (k.n_ids - 1) / tg_s
                                                     : 0.0;
            unsigned long long drafted = after.spec_drafted -
                                         before.spec_drafted,
                               accepted = after.spec_accepted -
                                          before.spec_accepted;
            if (r == 0) {
                printf("\n");
                fflush(stdout);
            }
            if (reps > 1 || r == reps - 1)
                fprintf(stderr,
                        "{\"rep\": %d, \"n_prompt\": %zu, \"n_gen\": %d, "
                        "\"pp_tps\": %.3f, \"tg_tps\": %.3f, "
                        "\"spec_k\": %d, \"spec_drafted\": %llu, "
                        "\"spec_accepted\": %llu, \"steps\": %llu}\n",
                        r, n_ids, k.n_ids, pp_s > 0 ? n_ids / pp_s : 0.0,
                        tg_tps, spec_k, drafted, accepted,
                        (unsigned long long)(after.steps - before.steps));
            if (r == reps - 1)
                fprintf(stderr,
                        "load %.2f s | prompt %zu tokens, %.1f tokens/s | "
                        "decode %d tokens, %.1f tokens/s | spec k %d: "
                        "drafted %llu, accepted %llu | %s\n",
                        t_load, n_ids, pp_s > 0 ? n_ids / pp_s : 0.0, k.n_ids,
                        tg_tps, spec_k, drafted, accepted,
                        cinfer_backend_device_desc(cinfer_model_backend(m)));
        }
        pthread_cond_destroy(&k.cv);
        pthread_mutex_destroy(&k.mu);
    }
    cinfer_engine_destroy(e);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL;
    const char *chat_tmpl = NULL; /* --chat-template FILE */
    long n_gen = 64, threads = 0, seed = 0, reps = 3, ctx = 4096, tp = 1;
    int tp_given = 0; /* --tensor-parallel given: CUDA ranks via NCCL */
    int invariant = 0; /* --batch-invariant */
    int chat = 0, ignore_eos = 0, parse_special = 1, use_mmap = 0;
    int bench_pp = -1, bench_tg = -1;
    int cuda = -2; /* --device auto */
    int spec_k = -1, spec_min = 0, spec_max = 0; /* --spec-ngram: -1 = not
                                                    through the engine */
    int reps_given = 0;
    double gpu_fraction = 0.9;
    cinfer_cpu_isa isa = CINFER_CPU_ISA_AUTO;
    cinfer_sampler_params sp = cinfer_sampler_default_params();
    sp.temperature = 0.0f;

    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"max-tokens", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'},
        {"reps", required_argument, 0, 'r'},
        {"help", no_argument, 0, 'h'},
        {"chat", no_argument, 0, OPT_CHAT},
        {"chat-template", required_argument, 0, OPT_CHAT_TMPL},
        {"temperature", required_argument, 0, OPT_TEMP},
        {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REP},
        {"presence-penalty", required_argument, 0, OPT_PRES},
        {"frequency-penalty", required_argument, 0, OPT_FREQ},
        {"seed", required_argument, 0, OPT_SEED},
        {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"no-special", no_argument, 0, OPT_NOSPECIAL},
        {"isa", required_argument, 0, OPT_ISA},
        {"ctx", required_argument, 0, OPT_CTX},
        {"bench", required_argument, 0, OPT_BENCH},
        {"mmap", no_argument, 0, OPT_MMAP},
        {"device", required_argument, 0, OPT_DEVICE},
        {"gpu-memory-fraction", required_argument, 0, OPT_GPU_FRACTION},
        {"tensor-parallel", required_argument, 0, OPT_TP},
        {"batch-invariant", no_argument, 0, OPT_INVARIANT},
        {"spec-ngram", required_argument, 0, OPT_SPEC},
        {"spec-ngram-range", required_argument, 0, OPT_SPEC_RANGE},
        {0, 0, 0, 0},
    };
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "m:p:n:t:r:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n':
            if (parse_int(optarg, "--max-tokens", 0, 1 << 20, &n_gen)) return 2;
            break;
        case 't':
            if (parse_int(optarg, "--threads", 0, 1024, &threads)) return 2;
            break;
        case 'r':
            if (parse_int(optarg, "--reps", 1, 1000, &reps)) return 2;
            reps_given = 1;
            break;
        case OPT_SPEC:
            if (parse_int(optarg, "--spec-ngram", 0, CINFER_ENGINE_SPEC_MAX_K,
                          &v))
                return 2;
            spec_k = (int)v;
            break;
        case OPT_SPEC_RANGE:
            if (sscanf(optarg, "%d,%d", &spec_min, &spec_max) != 2 ||
                spec_min < 1 || spec_max < spec_min || spec_max > 64) {
                fprintf(stderr, "cinfer-run: --spec-ngram-range takes MIN,MAX "
                                "with 1 <= MIN <= MAX <= 64 (e.g. 2,4)\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        case OPT_CHAT: chat = 1; break;
        case OPT_CHAT_TMPL: chat_tmpl = optarg; break;
        case OPT_TEMP:
            if (parse_float(optarg, "--temperature", &sp.temperature)) return 2;
            break;
        case OPT_TOPK:
            if (parse_int(optarg, "--top-k", 0, 1 << 30, &v)) return 2;
            sp.top_k = (int32_t)v;
            break;
        case OPT_TOPP:
            if (parse_float(optarg, "--top-p", &sp.top_p)) return 2;
            break;
        case OPT_MINP:
            if (parse_float(optarg, "--min-p", &sp.min_p)) return 2;
            break;
        case OPT_REP:
            if (parse_float(optarg, "--repeat-penalty", &sp.repetition_penalty)) return 2;
            break;
        case OPT_PRES:
            if (parse_float(optarg, "--presence-penalty", &sp.presence_penalty)) return 2;
            break;
        case OPT_FREQ:
            if (parse_float(optarg, "--frequency-penalty", &sp.frequency_penalty)) return 2;
            break;
        case OPT_SEED:
            if (parse_int(optarg, "--seed", 0, __LONG_MAX__, &seed)) return 2;
            sp.seed = (uint64_t)seed;
            break;
        case OPT_IGNORE_EOS: ignore_eos = 1; break;
        case OPT_NOSPECIAL: parse_special = 0; break;
        case OPT_MMAP: use_mmap = 1; break;
        case OPT_DEVICE:
            if (parse_device(optarg, &cuda)) return 2;
            break;
        case OPT_GPU_FRACTION: {
            char *end;
            errno = 0;
            gpu_fraction = strtod(optarg, &end);
            if (errno || end == optarg || *end ||
                !(gpu_fraction > 0 && gpu_fraction <= 1)) {
                fprintf(stderr, "cinfer-run: --gpu-memory-fraction must be "
                                "a share in (0, 1], got '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case OPT_INVARIANT:
            invariant = 1;
            break;
        case OPT_TP:
            if (parse_int(optarg, "--tensor-parallel", 1, 256, &tp))
                return 2;
            tp_given = 1;
            break;
        case OPT_CTX:
            if (parse_int(optarg, "--ctx", 16, 1 << 20, &ctx)) return 2;
            break;
        case OPT_ISA:
            if (strcmp(optarg, "portable") == 0) isa = CINFER_CPU_ISA_PORTABLE;
            else if (strcmp(optarg, "avx2") == 0) isa = CINFER_CPU_ISA_AVX2;
            else if (strcmp(optarg, "avx512") == 0) isa = CINFER_CPU_ISA_AVX512;
            else {
                fprintf(stderr, "cinfer-run: --isa must be portable, avx2 or "
                                "avx512\n");
                return 2;
            }
            break;
        case OPT_BENCH:
            if (sscanf(optarg, "%d,%d", &bench_pp, &bench_tg) != 2 ||
                bench_pp < 0 || bench_tg < 0 || bench_pp + bench_tg < 1) {
                fprintf(stderr, "cinfer-run: --bench takes PP,TG (e.g. "
                                "128,128)\n");
                return 2;
            }
            break;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "cinfer-run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!prompt && bench_pp < 0) {
        usage(stderr);
        return 2;
    }
    if (chat_tmpl && !chat) {
        fprintf(stderr, "cinfer-run: --chat-template needs --chat\n");
        return 2;
    }

    char *owned_prompt = NULL;
    if (prompt && strcmp(prompt, "-") == 0) {
        owned_prompt = read_all(stdin, NULL);
        if (!owned_prompt) {
            fprintf(stderr, "cinfer-run: cannot read standard input\n");
            return 1;
        }
        prompt = owned_prompt;
    }

    /* Tensor-parallel ranks: CUDA devices from the ordinal up (auto: when
     * there are enough), each over NCCL, made by the model group; else
     * CPU threads. */
    int first = cuda < 0 ? 0 : cuda;
    int tp_cuda = tp_given && (cuda >= 0 || (cuda == -2 &&
                                             cinfer_cuda_device_count() >=
                                                 first + tp));
    int devices[256];
    for (int j = 0; j < tp && j < 256; j++)
        devices[j] = first + j;
    if (tp > 1 && !tp_cuda)
        cuda = -1; /* CPU ranks */
    cinfer_backend *backend = NULL;
    if (!tp_cuda && open_device(cuda, gpu_fraction, invariant, &backend)) {
        free(owned_prompt);
        return 1;
    }
    int last_pct = -1;
    cinfer_model_params mp = cinfer_model_default_params();
    mp.backend = backend;
    /* A device with a budget: the KV cache takes what the model leaves,
     * at most one full-context sequence (max_seqs 1). */
    mp.kv_from_budget = 1;
    mp.path = model_path;
    mp.n_threads = (int)threads;
    mp.isa = isa;
    mp.n_ctx = (int)ctx;
    mp.use_mmap = use_mmap;
    mp.tensor_parallel = (int)tp;
    if (tp_cuda) {
        static const cinfer_cuda_entry entry = {cinfer_comm_create_nccl,
                                                cinfer_backend_cuda_create,
                                             cinfer_cuda_device_count};
        mp.tp_device = CINFER_TP_CUDA;
        mp.cuda = &entry;
        mp.cuda_devices = devices;
        mp.gpu_memory_fraction = gpu_fraction;
        mp.cuda_batch_invariant = invariant;
    }
    if (isatty(2)) {
        mp.progress = progress_bar;
        mp.progress_user = &last_pct;
    }
    cinfer_model *m = NULL;
    double t_load = now_s();
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
        cinfer_backend_destroy(backend);
        free(owned_prompt);
        return 1;
    }
    t_load = now_s() - t_load;
    const cinfer_model_info *I = cinfer_model_get_info(m);
    print_memory(m);

    if (bench_pp >= 0) {
        int rc = run_bench(m, bench_pp, bench_tg, (int)reps, (int)threads);
        cinfer_model_destroy(m);
        cinfer_backend_destroy(backend);
        free(owned_prompt);
        return rc;
    }

    int rc = 1;
    const cinfer_tokenizer *tk = cinfer_model_tokenizer(m);
    char *text = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    cinfer_sampler *smp = NULL;

    size_t n_ids = 0;
    logits = malloc(sizeof(float) * (size_t)I->n_vocab);
    if (!logits)
        goto out;
    if (chat) {
        int32_t *cids = NULL;
        if (chat_prompt(m, prompt, chat_tmpl, &cids, &n_ids) != 0)
            goto out;
        ids = malloc(sizeof(int32_t) * (n_ids + (size_t)n_gen + 1));
        if (ids)
            memcpy(ids, cids, sizeof(int32_t) * n_ids);
        free(cids);
        if (!ids)
            goto out;
    } else {
        text = strdup(prompt);
        if (!text)
            goto out;
        size_t len = strlen(text), cap = len + 8;
        ids = malloc(sizeof(int32_t) * (cap + (size_t)n_gen + 1));
        if (!ids)
            goto out;
        if (cinfer_tokenizer_encode(tk, text, len, 1, parse_special, ids, cap,
                                    &n_ids) != CINFER_OK) {
            fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
            goto out;
        }
    }
    if (n_ids == 0) {
        fprintf(stderr, "cinfer-run: the prompt is empty\n");
        goto out;
    }
    if ((long)n_ids + n_gen > I->n_ctx) {
        fprintf(stderr, "cinfer-run: prompt (%zu tokens) + %ld new tokens "
                        "exceed the context of %d\n", n_ids, n_gen, I->n_ctx);
        goto out;
    }
    if (spec_k >= 0) {
        rc = run_engine(m, ids, n_ids, &sp, (int)n_gen, ignore_eos, spec_k,
                        spec_min, spec_max, reps_given ? (int)reps : 1,
                        t_load);
        goto out;
    }
    sp.n_vocab = I->n_vocab;
    if (cinfer_sampler_create(&sp, &smp) != CINFER_OK) {
        fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
        goto out;
    }

    double t0 = now_s();
    if (cinfer_model_eval_single(m, ids, (int)n_ids, 0, 0, logits) !=
        CINFER_OK) {
        fprintf(stderr, "cinfer-run: %s\n", cinfer_last_error());
        goto out;
    }
    double t_prompt = now_s() - t0;

    cinfer_detok dt;
    cinfer_detok_init(&dt);
    char piece[1024];
    size_t piece_len;
    int n_done = 0, n_forward = 0;
    double t1 = now_s();
    while (n_done < n_gen) {
        int32_t tok;
        if (cinfer_sampler_sample(smp, logits, &tok, NULL) != CINFER_OK) {
            fprintf(stderr, "\ncinfer-run: %s\n", cinfer_last_error());
            goto out;
        }
        cinfer_sampler_accept(smp, tok);
        if (!ignore_eos && cinfer_tokenizer_is_eog(tk, tok))
            break;
        n_done++;
        if (cinfer_detok_push(tk, &dt, tok, piece, sizeof piece, &piece_len) ==
                CINFER_OK &&
            piece_len) {
            fwrite(piece, 1, piece_len, stdout);
            fflush(stdout);
        }
        if (n_done == n_gen)
            break; /* the last token needs no forward pass */
        if (cinfer_model_eval_single(m, &tok, 1, (int)n_ids + n_done - 1, 0,
                                     logits) != CINFER_OK) {
            fprintf(stderr, "\ncinfer-run: %s\n", cinfer_last_error());
            goto out;
        }
        n_forward++;
    }
    if (cinfer_detok_flush(&dt, piece, sizeof piece, &piece_len) ==
            CINFER_OK &&
        piece_len)
        fwrite(piece, 1, piece_len, stdout);
    double t_gen = now_s() - t1;
    printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "load %.2f s | prompt %zu tokens, %.1f tokens/s | decode %d "
            "tokens, %.1f tokens/s | %s\n",
            t_load, n_ids, (double)n_ids / t_prompt, n_done,
            n_forward > 0 ? (double)n_forward / t_gen : 0.0,
            cinfer_backend_device_desc(cinfer_model_backend(m)));
    rc = 0;
out:
    cinfer_sampler_destroy(smp);
    free(logits);
    free(ids);
    free(text);
    free(owned_prompt);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(backend); /* after the model that borrows it */
    return rc;
}
