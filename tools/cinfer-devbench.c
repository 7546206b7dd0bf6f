/*
 * cinfer-devbench - batched decode and prefill speed of a model on a
 * backend, through the model's own forward pass (engine/model.h).
 *
 * B sequences decode in lockstep from an empty context, one row each per
 * step (llama-bench's tg test, B at a time), and a prefill test runs one
 * prompt of P tokens in chunks of the model's step capacity. Tokens are
 * synthetic; logits of every decode row come back to the host each step,
 * as the engine needs them for most sampling, or, with --tokens-on-device,
 * only each row's greedy token, chosen on the backend
 * (cinfer_model_forward_choose), as the engine does for greedy steps, or,
 * with --sampled-on-device, each row's token drawn there after the
 * sampler's edits, with its logprobs: temperature 0.8, top_p 0.95, the
 * three penalties over 64 tokens a row and 5 top logprobs (what the engine
 * sends for an OpenAI-style sampled request). One JSON line per (test,
 * batch, rep) on stdout; scripts/gpu-check.sh turns them into its table.
 *
 *     cinfer-devbench -m model.gguf --device cuda --batch 1,8,64 --steps 32
 *         [--prompt 2048] [-r 3] [--gpu-memory-fraction 0.9] [-t THREADS]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: cinfer-devbench -m MODEL [--device cpu|cuda[:N]] "
               "[--batch B1,B2,...] [--steps N] [--prompt P] [-r REPS] "
               "[--gpu-memory-fraction F] [-t THREADS] [--batch-invariant] "
               "[--eager] [--tokens-on-device | --sampled-on-device]\n");
}

/* The step of B sequences at position pos, sequence s in blocks
 * s * per_seq, s * per_seq + 1, ... */
typedef struct {
    int32_t *tokens, *positions, *row_seq, *slots, *tables, *out_rows;
    cinfer_step step;
} batch_step;

static int batch_init(batch_step *b, int rows, int n_seqs, int per_seq,
                      int block_size)
{
    memset(b, 0, sizeof *b);
    b->tokens = calloc((size_t)rows, 4);
    b->positions = calloc((size_t)rows, 4);
    b->row_seq = calloc((size_t)rows, 4);
    b->slots = calloc((size_t)rows, 4);
    b->out_rows = calloc((size_t)rows, 4);
    b->tables = calloc((size_t)n_seqs * (size_t)per_seq, 4);
    if (!b->tokens || !b->positions || !b->row_seq || !b->slots ||
        !b->out_rows || !b->tables)
        return -1;
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < per_seq; i++)
            b->tables[s * per_seq + i] = s * per_seq + i;
    b->step.n_seqs = n_seqs;
    b->step.block_size = block_size;
    b->step.max_blocks = per_seq;
    b->step.tokens = b->tokens;
    b->step.positions = b->positions;
    b->step.row_seq = b->row_seq;
    b->step.slots = b->slots;
    b->step.block_tables = b->tables;
    b->step.out_rows = b->out_rows;
    return 0;
}

static void batch_free(batch_step *b)
{
    free(b->tokens);
    free(b->positions);
    free(b->row_seq);
    free(b->slots);
    free(b->out_rows);
    free(b->tables);
}

/* Rows r0..r0+n-1 of sequence seq at positions pos0.. ; outputs wanted for
 * the rows listed by want_all (every row) or the last one. */
static void fill_rows(batch_step *b, int at, int seq, int pos0, int n,
                      uint64_t *rng, int vocab)
{
    const cinfer_step *s = &b->step;
    for (int i = 0; i < n; i++) {
        int r = at + i, p = pos0 + i;
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        b->tokens[r] = (int32_t)(*rng % (uint64_t)vocab);
        b->positions[r] = p;
        b->row_seq[r] = seq;
        b->slots[r] = b->tables[seq * s->max_blocks + p / s->block_size] *
                          s->block_size +
                      p % s->block_size;
    }
}

enum { PEN_TOKENS = 64 }; /* penalized tokens a row (--sampled-on-device) */

/* What --sampled-on-device asks of the backend for `rows` rows: draws,
 * penalty edits over PEN_TOKENS tokens a row, 5 top logprobs. */
typedef struct {
    cinfer_draw *draws;
    cinfer_logit_edit *edits;
    int32_t *n_top;
    cinfer_row_logprobs *lp;
} sampled;

static int sampled_init(sampled *sp, int rows, int n_vocab)
{
    sp->draws = calloc((size_t)rows, sizeof *sp->draws);
    sp->edits = calloc((size_t)rows * PEN_TOKENS, sizeof *sp->edits);
    sp->n_top = calloc((size_t)rows, sizeof *sp->n_top);
    sp->lp = calloc((size_t)rows, sizeof *sp->lp);
    if (!sp->draws || !sp->edits || !sp->n_top || !sp->lp)
        return -1;
    for (int r = 0; r < rows; r++) {
        sp->n_top[r] = 5;
        for (int j = 0; j < PEN_TOKENS; j++) /* distinct per row */
            sp->edits[r * PEN_TOKENS + j] = (cinfer_logit_edit){
                .row = r,
                .token = (int32_t)(((int64_t)j * 7919 + r) % n_vocab),
                .flags = CINFER_EDIT_REP | CINFER_EDIT_FREQ,
                .rp = 1.1f,
                .fn = 0.2f * (float)(1 + j % 3),
                .pres = 0.1f};
    }
    return 0;
}

static void sampled_free(sampled *sp)
{
    free(sp->draws);
    free(sp->edits);
    free(sp->n_top);
    free(sp->lp);
}

static cinfer_status forward_sampled(cinfer_model *m, const cinfer_step *st,
                                     sampled *sp, int rows, uint64_t *rng,
                                     int32_t *codes)
{
    for (int r = 0; r < rows; r++) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        sp->draws[r] = (cinfer_draw){.inv_t = 1.0f / 0.8f,
                                     .min_w = 0.0f,
                                     .u = (double)(*rng >> 11) * 0x1p-53,
                                     .top_k = 0,
                                     .top_p = 0.95f};
    }
    int64_t n_edits = (int64_t)rows * PEN_TOKENS;
    if (PEN_TOKENS > cinfer_model_get_info(m)->n_vocab)
        n_edits = 0; /* a vocabulary too small for distinct tokens */
    cinfer_choice ch = {.draws = sp->draws,
                        .edits = sp->edits,
                        .n_edits = n_edits,
                        .n_top = sp->n_top,
                        .logprobs = sp->lp};
    return cinfer_model_forward_choose(m, st, &ch, codes);
}

static int run(cinfer_model *m, const char *dev, int batch, int steps,
               int prompt, int reps, int on_device)
{
    const cinfer_model_info *I = cinfer_model_get_info(m);
    int bs = I->block_size;
    int ctx = steps > prompt ? steps : prompt;
    int per_seq = (ctx + bs - 1) / bs;
    int rows = batch > I->max_batch_rows ? I->max_batch_rows : batch;
    float *logits = malloc(sizeof(float) * (size_t)I->n_vocab * (size_t)rows);
    int32_t *codes = malloc(sizeof(int32_t) * (size_t)rows);
    batch_step b;
    memset(&b, 0, sizeof b);
    sampled sp = {0};
    uint64_t rng = 88172645463325252ull;
    int rc = 1;
    if (on_device && cinfer_model_choices(m) < (on_device == 2 ? 4 : 1)) {
        fprintf(stderr, "cinfer-devbench: %s: this backend does not %s\n",
                on_device == 2 ? "--sampled-on-device" : "--tokens-on-device",
                on_device == 2 ? "draw, edit and find logprobs"
                               : "choose tokens");
        goto out;
    }
    if (!logits || !codes || batch_init(&b, rows, batch, per_seq, bs) != 0 ||
        (on_device == 2 && sampled_init(&sp, rows, I->n_vocab) != 0)) {
        fprintf(stderr, "cinfer-devbench: out of memory\n");
        goto out;
    }
    if ((int64_t)batch * per_seq > I->n_kv_blocks) {
        fprintf(stderr,
                "cinfer-devbench: batch %d x %d tokens needs %d KV blocks, "
                "the cache has %d\n",
                batch, ctx, batch * per_seq, I->n_kv_blocks);
        goto out;
    }
    for (int rep = 0; rep < reps; rep++) {
        double tg_tps = 0, pp_tps = 0;
        if (steps > 0 && batch <= rows) {
            b.step.n_rows = batch;
            b.step.n_out = batch;
            for (int r = 0; r < batch; r++)
                b.out_rows[r] = r;
            /* step 0 warms up (first launches, cuBLAS heuristics) */
            double t0 = 0;
            for (int i = 0; i <= steps; i++) {
                if (i == 1)
                    t0 = now_s();
                for (int s = 0; s < batch; s++)
                    fill_rows(&b, s, s, i % ctx, 1, &rng, I->n_vocab);
                cinfer_status fs =
                    on_device == 2
                        ? forward_sampled(m, &b.step, &sp, batch, &rng, codes)
                    : on_device
                        ? cinfer_model_forward_choose(m, &b.step, NULL, codes)
                        : cinfer_model_forward(m, &b.step, logits);
                if (fs != CINFER_OK)
                    goto fail;
            }
            tg_tps = (double)batch * steps / (now_s() - t0);
        }
        if (prompt > 0) {
            double t0 = now_s();
            for (int at = 0; at < prompt; at += rows) {
                int n = prompt - at < rows ? prompt - at : rows;
                fill_rows(&b, 0, 0, at, n, &rng, I->n_vocab);
                b.step.n_rows = n;
                b.step.n_out = 1;
                b.out_rows[0] = n - 1;
                if (cinfer_model_forward(m, &b.step, logits) != CINFER_OK)
                    goto fail;
            }
            pp_tps = prompt / (now_s() - t0);
        }
        printf("{\"device\": \"%s\", \"desc\": \"%s\", \"type\": \"%s\", "
               "\"weight_bytes\": %llu, \"batch\": %d, \"steps\": %d, "
               "\"tg_tps\": %.3f, \"prompt\": %d, \"pp_tps\": %.3f, "
               "\"tokens\": \"%s\"}\n",
               dev, cinfer_backend_device_desc(cinfer_model_backend(m)),
               I->quant, (unsigned long long)I->weight_bytes, batch, steps,
               tg_tps, prompt, pp_tps,
               on_device == 2 ? "sampled" : on_device ? "device" : "host");
        fflush(stdout);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "cinfer-devbench: %s\n", cinfer_last_error());
out:
    batch_free(&b);
    sampled_free(&sp);
    free(logits);
    free(codes);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *device = "cpu", *batches = "1";
    int steps = 32, prompt = 0, reps = 3, threads = 0;
    double fraction = 0.9;
    int invariant = 0; /* --batch-invariant */
    int eager = 0;     /* --eager: no CUDA graphs */
    int on_device = 0; /* 1: --tokens-on-device, 2: --sampled-on-device */
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},
        {"device", required_argument, 0, 'd'},
        {"batch", required_argument, 0, 'b'},
        {"steps", required_argument, 0, 's'},
        {"prompt", required_argument, 0, 'p'},
        {"reps", required_argument, 0, 'r'},
        {"threads", required_argument, 0, 't'},
        {"gpu-memory-fraction", required_argument, 0, 'f'},
        {"batch-invariant", no_argument, 0, 'i'},
        {"eager", no_argument, 0, 'e'},
        {"tokens-on-device", no_argument, 0, 'g'},
        {"sampled-on-device", no_argument, 0, 'S'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "m:d:b:s:p:r:t:f:iegSh", opts, NULL)) !=
           -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'd': device = optarg; break;
        case 'b': batches = optarg; break;
        case 's': steps = atoi(optarg); break;
        case 'p': prompt = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'f': fraction = atof(optarg); break;
        case 'i': invariant = 1; break;
        case 'e': eager = 1; break;
        case 'g': on_device = 1; break;
        case 'S': on_device = 2; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!path || steps < 0 || prompt < 0 || reps < 1) {
        usage(stderr);
        return 2;
    }
    int max_batch = 0;
    for (const char *p = batches; *p;) {
        int v = atoi(p);
        if (v < 1) {
            fprintf(stderr, "cinfer-devbench: --batch takes B1,B2,... >= 1\n");
            return 2;
        }
        max_batch = v > max_batch ? v : max_batch;
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }

    cinfer_backend *be = NULL;
    cinfer_status st;
    if (strncmp(device, "cuda", 4) == 0) {
        cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
        cp.device = device[4] == ':' ? atoi(device + 5) : 0;
        cp.memory_fraction = fraction;
        cp.batch_invariant = invariant;
        cp.eager = eager;
        st = cinfer_backend_cuda_create(&cp, &be);
    } else if (strcmp(device, "cpu") == 0) {
        cinfer_backend_cpu_params cp = cinfer_backend_cpu_default_params();
        cp.n_threads = threads;
        st = cinfer_backend_cpu_create(&cp, &be);
    } else {
        fprintf(stderr, "cinfer-devbench: --device is cpu or cuda[:N]\n");
        return 2;
    }
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-devbench: %s\n", cinfer_last_error());
        return 1;
    }
    int ctx = steps > prompt ? steps : prompt;
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = path;
    mp.backend = be;
    mp.n_ctx = ctx + 1;
    mp.max_seqs = max_batch;
    mp.max_batch_rows = max_batch > 512 ? max_batch : 512;
    cinfer_model *m = NULL;
    double t0 = now_s();
    if (cinfer_model_create(&mp, &m) != CINFER_OK) {
        fprintf(stderr, "cinfer-devbench: %s\n", cinfer_last_error());
        cinfer_backend_destroy(be);
        return 1;
    }
    fprintf(stderr, "cinfer-devbench: %s loaded in %.1f s on %s\n", path,
            now_s() - t0, cinfer_backend_device_desc(be));
    int rc = 0;
    for (const char *p = batches; *p && rc == 0;) {
        rc = run(m, device, atoi(p), steps, p == batches ? prompt : 0, reps,
                 on_device);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    cinfer_backend_graph_stats gs;
    cinfer_backend_graph_stats_get(be, &gs);
    if (cinfer_backend_has_graphs(be))
        fprintf(stderr,
                "cinfer-devbench: CUDA graphs: %lld steps recorded, %lld "
                "replayed, %lld declined\n",
                (long long)gs.captured, (long long)gs.replayed,
                (long long)gs.eager);
    cinfer_model_destroy(m);
    cinfer_backend_destroy(be);
    return rc;
}
