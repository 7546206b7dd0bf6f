/*
 * cinfer-maskbench - what a grammar's token mask (engine/grammar.h) costs
 * per generated token over a real vocabulary.
 *
 * The grammar is the one server/json_schema.c compiles for a schema with
 * strings, numbers, an array and an optional field (or --grammar FILE);
 * the output is a fixed document of that schema, tokenized by the model's
 * tokenizer. Each step masks the vocabulary and accepts the document's
 * next token, as the engine does:
 *   - batch 1: one state walks the document; the time of every mask is
 *     recorded (median, mean, 90th percentile, worst);
 *   - batch 64: 64 states over the document, each starting at another
 *     token (so they sit in different places, as a batch's sequences do);
 *     a step masks all 64, and its time is what the engine thread spends
 *     on masks in a decode step of 64 rows.
 * Cold figures compile the grammar afresh for each round (the first
 * requests with a schema; the grammar's mask tables start empty), warm
 * ones keep one grammar for all rounds (requests whose schema the
 * grammar cache holds). Rounds (--rounds, default 5) repeat each from
 * fresh states and the figures are medians over the rounds: the machine
 * is shared and noisy.
 *
 * --engine N: also generate with the model through the engine, N tokens
 * per request at batch 1 and at --batch, each with and without the
 * grammar (sampling at temperature 0.8, a seed per request, ignoring
 * end-of-generation where the grammar allows it), and print ms per step
 * and tokens/s: what a schema costs a whole decode step.
 *
 *     cinfer-maskbench                       the default model's vocabulary
 *     cinfer-maskbench --model m.gguf --grammar g.gbnf --doc out.json
 *     cinfer-maskbench --engine 32 --rounds 2
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/grammar.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

/* cinfer_json_schema_to_gbnf of bench_schema (server/json_schema.h). */
static const char *bench_schema =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\"}, "
    "\"age\": {\"type\": \"integer\"}, "
    "\"score\": {\"type\": \"number\"}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, "
    "\"maxItems\": 8}, "
    "\"nick\": {\"type\": \"string\"}}, "
    "\"required\": [\"name\", \"age\", \"score\", \"tags\"], "
    "\"additionalProperties\": false}";

static const char *bench_gbnf =
#include "cinfer-maskbench.gbnf.inc"
    ;

static const char *bench_doc =
    "{\"name\": \"Ada Lovelace, Countess of Lovelace (n\\u00e9e Byron)\", "
    "\"age\": 36, \"score\": -1234.5678e-3, "
    "\"tags\": [\"mathematician\", \"writer\", \"Analytical Engine\", "
    "\"first program\", \"poetical science\"], "
    "\"nick\": \"The Enchantress of Numbers \xe2\x80\x94 so Babbage "
    "wrote\"}";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        *len = (size_t)n;
    }
    return b;
}

/* ---- whole decode steps through the engine (--engine) ------------------ */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, errors;
    long tokens;
} eng_sink;

static void on_event(void *user, const cinfer_engine_event *ev)
{
    eng_sink *k = user;
    pthread_mutex_lock(&k->mu);
    if (ev->kind == CINFER_EVENT_TOKENS) {
        k->tokens += (long)ev->n_ids;
    } else {
        k->done++;
        k->errors += ev->finish == CINFER_FINISH_ERROR;
        pthread_cond_signal(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
}

/* One batch of requests to the end: ms per engine step and tokens/s. */
static int engine_batch(cinfer_engine *e, const int32_t *prompt,
                        size_t n_prompt, const cinfer_grammar *g, int batch,
                        int n_gen, int round, double *ms_step, double *tps)
{
    eng_sink k;
    memset(&k, 0, sizeof k);
    pthread_mutex_init(&k.mu, NULL);
    pthread_cond_init(&k.cv, NULL);
    cinfer_engine_stats before, after;
    cinfer_engine_get_stats(e, &before);
    double t0 = now_s();
    int submitted = 0;
    for (int i = 0; i < batch; i++) {
        cinfer_request_params rp = cinfer_request_default_params();
        rp.prompt = prompt;
        rp.n_prompt = n_prompt;
        rp.sampling.temperature = 0.8f;
        rp.sampling.seed = (uint64_t)(round * 1000 + i);
        rp.max_tokens = n_gen;
        rp.ignore_eos = 1;
        rp.grammar = g;
        rp.on_event = on_event;
        rp.user = &k;
        if (cinfer_engine_submit(e, &rp, NULL) != CINFER_OK) {
            fprintf(stderr, "submit: %s\n", cinfer_last_error());
            break;
        }
        submitted++;
    }
    pthread_mutex_lock(&k.mu);
    while (k.done < submitted)
        pthread_cond_wait(&k.cv, &k.mu);
    pthread_mutex_unlock(&k.mu);
    double dt = now_s() - t0;
    cinfer_engine_get_stats(e, &after);
    uint64_t steps = after.steps - before.steps;
    *ms_step = steps ? dt * 1e3 / (double)steps : 0;
    *tps = (double)k.tokens / dt;
    fprintf(stderr, "  batch %d%s: %ld tokens, %llu steps, %.2f s\n", batch,
            g ? " with the schema" : "", k.tokens, (unsigned long long)steps,
            dt);
    pthread_cond_destroy(&k.cv);
    pthread_mutex_destroy(&k.mu);
    if (k.errors)
        fprintf(stderr, "%d requests ended in an error\n", k.errors);
    return submitted == batch && !k.errors ? 0 : 1;
}

static int engine_bench(const char *path, const char *gtext, size_t glen,
                        int batch, int n_gen, int rounds)
{
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.n_ctx = 512;
    mp.max_seqs = batch;
    cinfer_model *m = NULL;
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        fprintf(stderr, "%s\n", cinfer_last_error());
        return 1;
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = m;
    ep.max_seqs = batch;
    ep.admit_past_deadlines = 1;
    cinfer_engine *e = NULL;
    cinfer_grammar *g = NULL;
    if (cinfer_engine_create(&ep, &e) != CINFER_OK ||
        cinfer_grammar_compile(gtext, glen, NULL, &g) != CINFER_OK) {
        fprintf(stderr, "%s\n", cinfer_last_error());
        return 1;
    }
    static const char *text = "Describe a scientist as JSON with name, "
                              "age, score, tags and a nickname:\n";
    int32_t prompt[128];
    size_t n_prompt = 0;
    cinfer_tokenizer_encode(cinfer_model_tokenizer(m), text, strlen(text), 1,
                            0, prompt, 128, &n_prompt);
    int rc = 0;
    int sizes[2] = {1, batch};
    /* the runs with and without the schema alternate, so a neighbour's
     * load on the shared machine falls on both alike */
    for (int b = 0; b < 2 && !rc; b++) {
        double ms[2][16], tps[2][16];
        int R = rounds < 16 ? rounds : 16;
        for (int r = 0; r < R && !rc; r++)
            for (int with = 0; with < 2 && !rc; with++)
                rc = engine_batch(e, prompt, n_prompt, with ? g : NULL,
                                  sizes[b], n_gen, r, &ms[with][r],
                                  &tps[with][r]);
        for (int with = 0; with < 2 && !rc; with++)
            printf("engine batch %d, %s: %.2f ms per step, %.1f tokens/s "
                   "(medians of %d)\n",
                   sizes[b], with ? "with the schema" : "no schema      ",
                   pct(ms[with], (size_t)R, 0.5),
                   pct(tps[with], (size_t)R, 0.5), R);
        fflush(stdout);
    }
    cinfer_engine_destroy(e);
    cinfer_grammar_destroy(g);
    cinfer_model_destroy(m);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model = cinfer_model_default_path(), *gpath = NULL,
               *dpath = NULL;
    int rounds = 5, batch = 64, engine_tokens = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--grammar") && i + 1 < argc)
            gpath = argv[++i];
        else if (!strcmp(argv[i], "--doc") && i + 1 < argc)
            dpath = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--engine") && i + 1 < argc)
            engine_tokens = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--model GGUF] [--grammar GBNF] [--doc TEXT] "
                    "[--rounds N] [--batch N] [--engine TOKENS]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || batch < 1) {
        fprintf(stderr, "--rounds and --batch must be at least 1\n");
        return 2;
    }
    size_t glen = strlen(bench_gbnf), dlen = strlen(bench_doc);
    char *gtext = (char *)bench_gbnf, *dtext = (char *)bench_doc;
    if (gpath && !(gtext = read_file(gpath, &glen))) {
        fprintf(stderr, "cannot read %s\n", gpath);
        return 1;
    }
    if (dpath && !(dtext = read_file(dpath, &dlen))) {
        fprintf(stderr, "cannot read %s\n", dpath);
        return 1;
    }
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = model;
    cinfer_gguf *gf = NULL;
    cinfer_tokenizer *tk = NULL;
    cinfer_grammar *g = NULL;
    if (cinfer_gguf_create(&gp, &gf) != CINFER_OK) {
        fprintf(stderr, "%s: %s\n", model, cinfer_last_error());
        return 1;
    }
    cinfer_tokenizer_params tp = cinfer_tokenizer_default_params();
    tp.gguf = gf;
    if (cinfer_tokenizer_create(&tp, &tk) != CINFER_OK ||
        cinfer_grammar_compile(gtext, glen, NULL, &g) != CINFER_OK) {
        fprintf(stderr, "%s\n", cinfer_last_error());
        return 1;
    }
    /* the vocabulary as the engine gives it: end-of-generation tokens have
     * no bytes */
    int32_t V = cinfer_tokenizer_n_vocab(tk);
    uint32_t *off = malloc(((size_t)V + 1) * sizeof *off);
    size_t cap = 1 << 20, used = 0;
    char *bytes = malloc(cap);
    for (int32_t t = 0; t < V; t++) {
        const char *b;
        size_t l;
        if (cinfer_tokenizer_token_piece(tk, t, &b, &l) != CINFER_OK)
            l = 0;
        if (cinfer_tokenizer_is_eog(tk, t))
            l = 0;
        if (used + l > cap) {
            cap = 2 * (used + l);
            bytes = realloc(bytes, cap);
        }
        memcpy(bytes + used, b, l);
        off[t] = (uint32_t)used;
        used += l;
    }
    off[V] = (uint32_t)used;
    cinfer_grammar_vocab *v = NULL;
    if (cinfer_grammar_vocab_create(bytes, off, V, &v) != CINFER_OK) {
        fprintf(stderr, "%s\n", cinfer_last_error());
        return 1;
    }
    int32_t *ids = malloc((dlen + 8) * sizeof *ids);
    size_t n_ids = 0;
    if (cinfer_tokenizer_encode(tk, dtext, dlen, 0, 0, ids, dlen + 8,
                                &n_ids) != CINFER_OK) {
        fprintf(stderr, "%s\n", cinfer_last_error());
        return 1;
    }
    uint8_t *mask = malloc((size_t)V);
    double *t1 = malloc(n_ids * sizeof *t1);
    double *tb = malloc(n_ids * sizeof *tb);
    double *fig[2][6]; /* [cold, warm][median, mean, p90, max, batch, bmax] */
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < 6; k++)
            fig[w][k] = malloc((size_t)rounds * sizeof(double));
    cinfer_grammar_state **st = calloc((size_t)batch, sizeof *st);
    size_t *pos = calloc((size_t)batch, sizeof *pos);
    int64_t allowed_sum = 0;
    cinfer_grammar *warm_g = NULL;
    if (cinfer_grammar_compile(gtext, glen, NULL, &warm_g) != CINFER_OK)
        return 1;
    /* cold: each round on a grammar just compiled, as the first requests
     * with a schema meet it; warm: one grammar for every round, as
     * requests with a cached schema do */
    for (int w = 0; w < 2; w++)
        for (int r = -w; r < rounds; r++) { /* warm: one round to warm up */
            cinfer_grammar *rg = warm_g;
            if (!w && cinfer_grammar_compile(gtext, glen, NULL, &rg) !=
                          CINFER_OK)
                return 1;
            /* batch 1 */
            cinfer_grammar_state *s = NULL;
            cinfer_grammar_state_create(rg, &s);
            double sum = 0;
            for (size_t i = 0; i < n_ids; i++) {
                double a = now_s();
                int64_t n = cinfer_grammar_mask(s, v, mask);
                t1[i] = (now_s() - a) * 1e3;
                sum += t1[i];
                if (n < 0 || !mask[ids[i]]) {
                    fprintf(stderr, "token %zu (%d) not allowed: %s\n", i,
                            ids[i], n < 0 ? cinfer_last_error() : "masked");
                    return 1;
                }
                allowed_sum += n;
                const char *b;
                size_t l;
                cinfer_tokenizer_token_piece(tk, ids[i], &b, &l);
                if (cinfer_grammar_accept(s, b, l) != CINFER_OK) {
                    fprintf(stderr, "accept: %s\n", cinfer_last_error());
                    return 1;
                }
            }
            if (!cinfer_grammar_complete(s)) {
                fprintf(stderr, "the document is not a whole sentence\n");
                return 1;
            }
            cinfer_grammar_state_destroy(s);
            if (!w) { /* the batch's cold grammar is another new one */
                cinfer_grammar_destroy(rg);
                if (cinfer_grammar_compile(gtext, glen, NULL, &rg) !=
                    CINFER_OK)
                    return 1;
            }
            /* batch: each state starts at its own token, wraps around */
            for (int b = 0; b < batch; b++) {
                cinfer_grammar_state_create(rg, &st[b]);
                pos[b] = 0;
                size_t skip = (size_t)b * n_ids / (size_t)batch;
                for (size_t i = 0; i < skip; i++) {
                    const char *p;
                    size_t l;
                    cinfer_tokenizer_token_piece(tk, ids[i], &p, &l);
                    cinfer_grammar_accept(st[b], p, l);
                    pos[b]++;
                }
            }
            for (size_t i = 0; i < n_ids; i++) {
                double a = now_s();
                for (int b = 0; b < batch; b++) {
                    if (pos[b] == n_ids) { /* a new sequence in the slot */
                        cinfer_grammar_state_destroy(st[b]);
                        cinfer_grammar_state_create(rg, &st[b]);
                        pos[b] = 0;
                    }
                    cinfer_grammar_mask(st[b], v, mask);
                    const char *p;
                    size_t l;
                    cinfer_tokenizer_token_piece(tk, ids[pos[b]], &p, &l);
                    cinfer_grammar_accept(st[b], p, l);
                    pos[b]++;
                }
                tb[i] = (now_s() - a) * 1e3;
            }
            for (int b = 0; b < batch; b++)
                cinfer_grammar_state_destroy(st[b]);
            if (!w)
                cinfer_grammar_destroy(rg);
            if (r < 0)
                continue;
            fig[w][1][r] = sum / (double)n_ids;
            fig[w][3][r] = pct(t1, n_ids, 1.0);
            fig[w][2][r] = pct(t1, n_ids, 0.9);
            fig[w][0][r] = pct(t1, n_ids, 0.5);
            fig[w][5][r] = pct(tb, n_ids, 1.0);
            fig[w][4][r] = pct(tb, n_ids, 0.5);
        }
    printf("vocabulary %d tokens; document %zu bytes, %zu tokens; %lld "
           "allowed per mask on average; %d rounds (medians of rounds)\n",
           V, dlen, n_ids,
           (long long)(allowed_sum / ((int64_t)(2 * rounds + 1) *
                                      (int64_t)n_ids)),
           rounds);
    for (int w = 0; w < 2; w++) {
        size_t R = (size_t)rounds;
        printf("%s batch 1:  mask per token  median %.3f ms  mean %.3f ms  "
               "p90 %.3f ms  max %.3f ms\n",
               w ? "warm" : "cold", pct(fig[w][0], R, 0.5),
               pct(fig[w][1], R, 0.5), pct(fig[w][2], R, 0.5),
               pct(fig[w][3], R, 0.5));
        printf("%s batch %d: masks per step  median %.3f ms  max %.3f ms  "
               "(%.3f ms per sequence)\n",
               w ? "warm" : "cold", batch, pct(fig[w][4], R, 0.5),
               pct(fig[w][5], R, 0.5), pct(fig[w][4], R, 0.5) / batch);
    }
    cinfer_grammar_destroy(warm_g);
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < 6; k++)
            free(fig[w][k]);
    (void)bench_schema;
    free(st);
    free(pos);
    free(tb);
    free(t1);
    free(mask);
    free(ids);
    free(bytes);
    free(off);
    if (dtext != bench_doc)
        free(dtext);
    int rc = engine_tokens > 0
                 ? engine_bench(model, gtext, glen, batch, engine_tokens, rounds)
                 : 0;
    if (gtext != bench_gbnf)
        free(gtext);
    cinfer_grammar_vocab_destroy(v);
    cinfer_grammar_destroy(g);
    cinfer_tokenizer_destroy(tk);
    cinfer_gguf_destroy(gf);
    return rc;
}
