/*
 * cinfer-bench - serving load generator for cinfer-server (and, with the
 * same workload, llama.cpp's llama-server), in the spirit of vLLM's
 * `bench serve`.
 *
 *   cinfer-bench [--server HOST:PORT] [--concurrency N] [--rate R]
 *                [--num-requests N] [--input-len N] [--output-len N] ...
 *
 * Load: closed loop (--concurrency N: N requests in flight, a new one as
 * soon as one ends) or open loop (--rate R: Poisson arrivals at R per
 * second, --burstiness for gamma-distributed gaps), or both (arrivals at
 * R/s, at most N in flight, as vLLM's --max-concurrency). Prompts are
 * synthetic token ids (the vocabulary size comes from the server) or lines
 * of --prompts-file. One thread runs every stream on one event loop, so
 * the client's own cost stays small and its timestamps mean what they say.
 *
 * Reports request and token throughput, TTFT, TPOT, ITL and end-to-end
 * latency (mean, median, p90, p99), goodput under --goodput SLOs, and
 * failures by status name; --json writes vLLM's result keys. See
 * bench_stats.c for the definitions.
 *
 * --retries N (gRPC) gives Generate a retry policy in the channel's service
 * config, so gRPC core itself retries requests the server refuses with
 * UNAVAILABLE or RESOURCE_EXHAUSTED (waiting its grpc-retry-pushback-ms);
 * a retried request's times run from its first attempt.
 *
 * Exit status: 0 when every request completed, 1 when some failed, 2 when
 * the server could not be asked about its model (or the run broke), 64 for
 * usage errors.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

#define EXIT_SOME_FAILED 1
#define EXIT_BROKEN 2
#define EXIT_USAGE 64

typedef struct {
    const char *server;
    const char *protocol;      /* "grpc", "openai" or "llamacpp" */
    int concurrency;           /* 0 = no cap */
    double rate;               /* 0 = inf */
    double burstiness;
    int num_requests;
    int input_len, output_len;
    double range_ratio;
    const char *prompts_file;
    int vocab_size;            /* 0 = ask the server */
    unsigned long long seed;
    int ignore_eos;
    double temperature;
    double timeout_s;
    int retries;               /* 0 = none */
    int retry_backoff_ms;
    int warmups;
    cinfer_bench_slo slo;
    int has_slo;
    const char *json;
    int detailed;
    int dry_run;
    int quiet;
} options;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: cinfer-bench [options]\n"
        "\n"
        "Drives a server with many concurrent streams and reports throughput\n"
        "and latency the way vLLM's bench serve does.\n"
        "\n"
        "server:\n"
        "  --server HOST:PORT       server (default $CINFER_SERVER or 127.0.0.1:50051;\n"
        "                           openai: 127.0.0.1:8000; llamacpp:\n"
        "                           127.0.0.1:8080)\n"
        "  --protocol P             grpc (cinfer-server, default), openai (an\n"
        "                           OpenAI-compatible server: cinfer-server's\n"
        "                           --http-listen, /v1/completions) or llamacpp\n"
        "                           (llama-server's /completion, streamed)\n"
        "\n"
        "load:\n"
        "  --concurrency N          at most N requests in flight (closed loop when\n"
        "                           --rate is unset); 0 = no cap (default 0)\n"
        "  --rate R                 requests per second, Poisson arrivals; 0 or inf\n"
        "                           = all at once (default)\n"
        "  --burstiness B           gamma shape of arrival gaps: 1 Poisson (default),\n"
        "                           < 1 burstier, > 1 more regular\n"
        "  --num-requests N         requests in the run (default 100)\n"
        "  --warmups N              requests run first and left out of the results\n"
        "                           (default 0)\n"
        "\n"
        "requests:\n"
        "  --input-len N            synthetic prompt tokens (default 128)\n"
        "  --output-len N           tokens to generate (alias --max-tokens; default 128)\n"
        "  --range-ratio R          lengths uniform in [len*(1-R), len*(1+R)], R in\n"
        "                           [0, 1) (alias --random-range-ratio; default 0)\n"
        "  --prompts-file FILE      one prompt per line instead of synthetic ids\n"
        "  --vocab-size N           synthetic ids in [0, N) (default: the server's)\n"
        "  --seed S                 seed of lengths, prompts, arrivals, sampling (default 0)\n"
        "  --ignore-eos             generate all --output-len tokens (default)\n"
        "  --no-ignore-eos          stop at end-of-generation\n"
        "  --temperature T          sampling temperature (default 0: greedy)\n"
        "  --timeout S              per-request deadline in seconds, all attempts\n"
        "                           together (default none)\n"
        "  --retries N              grpc: gRPC's own retries of a request the server\n"
        "                           refuses with UNAVAILABLE or RESOURCE_EXHAUSTED, up\n"
        "                           to N more attempts, N in 1..4 (gRPC allows 5 in\n"
        "                           all); the server's grpc-retry-pushback-ms is\n"
        "                           honoured; latencies include the retries\n"
        "                           (default 0: none)\n"
        "  --retry-backoff-ms MS    first retry's backoff, doubling up to 10x, when\n"
        "                           the server sends no pushback (default 100)\n"
        "\n"
        "results:\n"
        "  --goodput KEY:MS ...     SLO for goodput; KEY is ttft, tpot or e2el\n"
        "                           (e.g. --goodput ttft:500 tpot:50)\n"
        "  --json FILE              write the results as JSON (vLLM's key names)\n"
        "  --save-detailed          JSON: also per-request lengths, TTFTs, ITLs\n"
        "  --dry-run                print the workload (JSON lines), contact no server\n"
        "  -q, --quiet              no progress line, no report on stdout\n"
        "  -h, --help               this text\n"
        "\n"
        "exit status: 0 all requests completed; 1 some failed; 2 the server could\n"
        "not be reached or the run broke; 64 usage error\n");
}

enum {
    O_SERVER = 256, O_PROTOCOL, O_CONCURRENCY, O_RATE, O_BURSTINESS,
    O_NUM_REQUESTS, O_WARMUPS, O_INPUT_LEN, O_OUTPUT_LEN, O_RANGE_RATIO,
    O_PROMPTS_FILE, O_VOCAB_SIZE, O_SEED, O_IGNORE_EOS, O_NO_IGNORE_EOS,
    O_TEMPERATURE, O_TIMEOUT, O_GOODPUT, O_JSON, O_SAVE_DETAILED, O_DRY_RUN,
    O_RETRIES, O_RETRY_BACKOFF_MS,
};

static int num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isnan(v))
        return 0;
    *out = v;
    return 1;
}

static int inum(const char *s, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > 1000000000L)
        return 0;
    *out = (int)v;
    return 1;
}

/* "ttft:500" (several may be joined with commas). */
static int parse_slo(const char *s, cinfer_bench_slo *slo)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    int any = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        double v;
        if (!colon || !num(colon + 1, &v) || !(v > 0) || isinf(v))
            return 0;
        *colon = '\0';
        if (strcmp(tok, "ttft") == 0)
            slo->ttft_ms = v;
        else if (strcmp(tok, "tpot") == 0)
            slo->tpot_ms = v;
        else if (strcmp(tok, "e2el") == 0)
            slo->e2el_ms = v;
        else
            return 0;
        any = 1;
    }
    return any;
}

/* ---------------------------------------------------------------------- */
/* The run                                                                */
/* ---------------------------------------------------------------------- */

static void progress(const cinfer_bench_req *reqs, int n, int started,
                     int done, double elapsed_s)
{
    long long out = 0;
    int failed = 0;
    for (int i = 0; i < started; i++) {
        out += reqs[i].output_tokens;
        failed += reqs[i].done && !reqs[i].ok;
    }
    fprintf(stderr,
            "\r%d/%d done, %d in flight, %d failed, %lld tokens, %.0f tok/s, "
            "%.1f s\033[K",
            done, n, started - done, failed, out,
            elapsed_s > 0 ? (double)out / elapsed_s : 0.0, elapsed_s);
    fflush(stderr);
}

/* Runs the workload's n requests; reqs (n, caller-owned) get the records,
 * their times relative to the run's start; *duration_s the run's length. */
static cinfer_status run(cinfer_bench_driver *d,
                         const cinfer_bench_workload *w, const options *o,
                         int show_progress, cinfer_bench_req *reqs,
                         double *duration_s)
{
    int n = cinfer_bench_workload_count(w);
    for (int i = 0; i < n; i++)
        cinfer_bench_req_init(&reqs[i], i, cinfer_bench_workload_item(w, i),
                              o->seed + (unsigned long long)i);
    const double progress_every_s = 0.25;
    double t0 = cinfer_bench_now_s(), last_progress = t0;
    int next = 0, in_flight = 0, done = 0;
    cinfer_status st = CINFER_OK;
    while (done < n) {
        double now = cinfer_bench_now_s();
        while (next < n &&
               (o->concurrency == 0 || in_flight < o->concurrency) &&
               reqs[next].item->arrival_s <= now - t0) {
            cinfer_bench_req *r = &reqs[next++];
            st = d->ops->start(d, r);
            if (st != CINFER_OK)
                goto out;
            in_flight++;
            if (r->done) {
                in_flight--;
                done++;
            }
            now = cinfer_bench_now_s();
        }
        if (done == n)
            break;
        double timeout = progress_every_s;
        if (next < n && (o->concurrency == 0 || in_flight < o->concurrency)) {
            double wait = reqs[next].item->arrival_s - (now - t0);
            if (wait < timeout)
                timeout = wait > 0 ? wait : 0;
        }
        int finished = 0;
        st = d->ops->poll(d, timeout, &finished);
        if (st != CINFER_OK)
            goto out;
        done += finished;
        in_flight -= finished;
        now = cinfer_bench_now_s();
        if (show_progress && now - last_progress >= progress_every_s) {
            progress(reqs, n, next, done, now - t0);
            last_progress = now;
        }
    }
out:;
    double t_end = cinfer_bench_now_s();
    *duration_s = t_end - t0;
    if (show_progress) {
        progress(reqs, n, next, done, t_end - t0);
        fputc('\n', stderr);
    }
    for (int i = 0; i < n; i++) {
        cinfer_bench_req *r = &reqs[i];
        if (i >= next)
            continue;
        r->t_send_s -= t0;
        if (r->output_tokens > 0) {
            r->t_first_s -= t0;
            r->t_last_s -= t0;
        }
        r->t_end_s -= t0;
    }
    return st;
}

static void print_dry_run(const cinfer_bench_workload *w)
{
    int n = cinfer_bench_workload_count(w);
    for (int i = 0; i < n; i++) {
        const cinfer_bench_item *it = cinfer_bench_workload_item(w, i);
        /* FNV-1a of the prompt, so runs can be compared for equality. */
        uint64_t h = 0xcbf29ce484222325ull;
        if (it->prompt_ids) {
            for (int k = 0; k < it->input_len; k++) {
                uint32_t v = (uint32_t)it->prompt_ids[k];
                for (int b = 0; b < 4; b++) {
                    h ^= (v >> (8 * b)) & 0xff;
                    h *= 0x100000001b3ull;
                }
            }
        } else {
            for (const char *p = it->prompt_text; *p; p++) {
                h ^= (unsigned char)*p;
                h *= 0x100000001b3ull;
            }
        }
        int min_id = 0, max_id = 0;
        for (int k = 0; it->prompt_ids && k < it->input_len; k++) {
            if (k == 0 || it->prompt_ids[k] < min_id)
                min_id = it->prompt_ids[k];
            if (k == 0 || it->prompt_ids[k] > max_id)
                max_id = it->prompt_ids[k];
        }
        printf("{\"index\": %d, \"arrival_s\": %.9f, \"input_len\": %d, "
               "\"output_len\": %d, \"min_id\": %d, \"max_id\": %d, "
               "\"prompt_hash\": \"%016llx\"}\n",
               i, it->arrival_s, it->input_len, it->output_len, min_id,
               max_id, (unsigned long long)h);
    }
}

int main(int argc, char **argv)
{
    options o;
    memset(&o, 0, sizeof o);
    o.server = NULL;
    o.protocol = "grpc";
    o.burstiness = 1;
    o.num_requests = 100;
    o.input_len = 128;
    o.output_len = 128;
    o.ignore_eos = 1;
    o.retry_backoff_ms = 100;

    static const struct option longopts[] = {
        {"server", required_argument, 0, O_SERVER},
        {"protocol", required_argument, 0, O_PROTOCOL},
        {"concurrency", required_argument, 0, O_CONCURRENCY},
        {"max-concurrency", required_argument, 0, O_CONCURRENCY},
        {"rate", required_argument, 0, O_RATE},
        {"request-rate", required_argument, 0, O_RATE},
        {"burstiness", required_argument, 0, O_BURSTINESS},
        {"num-requests", required_argument, 0, O_NUM_REQUESTS},
        {"num-prompts", required_argument, 0, O_NUM_REQUESTS},
        {"warmups", required_argument, 0, O_WARMUPS},
        {"input-len", required_argument, 0, O_INPUT_LEN},
        {"output-len", required_argument, 0, O_OUTPUT_LEN},
        {"max-tokens", required_argument, 0, O_OUTPUT_LEN},
        {"range-ratio", required_argument, 0, O_RANGE_RATIO},
        {"random-range-ratio", required_argument, 0, O_RANGE_RATIO},
        {"prompts-file", required_argument, 0, O_PROMPTS_FILE},
        {"vocab-size", required_argument, 0, O_VOCAB_SIZE},
        {"seed", required_argument, 0, O_SEED},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"no-ignore-eos", no_argument, 0, O_NO_IGNORE_EOS},
        {"temperature", required_argument, 0, O_TEMPERATURE},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"retries", required_argument, 0, O_RETRIES},
        {"retry-backoff-ms", required_argument, 0, O_RETRY_BACKOFF_MS},
        {"goodput", required_argument, 0, O_GOODPUT},
        {"json", required_argument, 0, O_JSON},
        {"save-detailed", no_argument, 0, O_SAVE_DETAILED},
        {"dry-run", no_argument, 0, O_DRY_RUN},
        {"quiet", no_argument, 0, 'q'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    for (;;) {
        int opt = getopt_long(argc, argv, "hq", longopts, NULL);
        if (opt == -1)
            break;
        int ok = 1;
        switch (opt) {
        case 'h': usage(stdout); return 0;
        case 'q': o.quiet = 1; break;
        case O_SERVER: o.server = optarg; break;
        case O_PROTOCOL:
            o.protocol = optarg;
            ok = strcmp(optarg, "grpc") == 0 ||
                 strcmp(optarg, "openai") == 0 ||
                 strcmp(optarg, "llamacpp") == 0;
            break;
        case O_CONCURRENCY: ok = inum(optarg, 0, &o.concurrency); break;
        case O_RATE:
            ok = num(optarg, &o.rate) && o.rate >= 0;
            if (isinf(o.rate))
                o.rate = 0;
            break;
        case O_BURSTINESS:
            ok = num(optarg, &o.burstiness) && o.burstiness > 0 &&
                 !isinf(o.burstiness);
            break;
        case O_NUM_REQUESTS: ok = inum(optarg, 1, &o.num_requests); break;
        case O_WARMUPS: ok = inum(optarg, 0, &o.warmups); break;
        case O_INPUT_LEN: ok = inum(optarg, 1, &o.input_len); break;
        case O_OUTPUT_LEN: ok = inum(optarg, 1, &o.output_len); break;
        case O_RANGE_RATIO:
            ok = num(optarg, &o.range_ratio) && o.range_ratio >= 0 &&
                 o.range_ratio < 1;
            break;
        case O_PROMPTS_FILE: o.prompts_file = optarg; break;
        case O_VOCAB_SIZE: ok = inum(optarg, 1, &o.vocab_size); break;
        case O_SEED: {
            char *end;
            errno = 0;
            o.seed = strtoull(optarg, &end, 10);
            ok = !errno && end != optarg && !*end && optarg[0] != '-';
            break;
        }
        case O_IGNORE_EOS: o.ignore_eos = 1; break;
        case O_NO_IGNORE_EOS: o.ignore_eos = 0; break;
        case O_TEMPERATURE:
            ok = num(optarg, &o.temperature) && o.temperature >= 0 &&
                 !isinf(o.temperature);
            break;
        case O_TIMEOUT:
            ok = num(optarg, &o.timeout_s) && o.timeout_s >= 0 &&
                 !isinf(o.timeout_s);
            break;
        case O_RETRIES:
            ok = inum(optarg, 0, &o.retries) &&
                 o.retries < CINFER_BENCH_MAX_ATTEMPTS;
            if (!ok) {
                fprintf(stderr, "cinfer-bench: --retries %s: N must be in "
                                "0..%d (gRPC makes at most %d attempts)\n",
                        optarg, CINFER_BENCH_MAX_ATTEMPTS - 1,
                        CINFER_BENCH_MAX_ATTEMPTS);
                return EXIT_USAGE;
            }
            break;
        case O_RETRY_BACKOFF_MS:
            ok = inum(optarg, 1, &o.retry_backoff_ms) &&
                 o.retry_backoff_ms <= 60000;
            break;
        case O_GOODPUT: ok = parse_slo(optarg, &o.slo); o.has_slo = 1; break;
        case O_JSON: o.json = optarg; break;
        case O_SAVE_DETAILED: o.detailed = 1; break;
        case O_DRY_RUN: o.dry_run = 1; break;
        default: usage(stderr); return EXIT_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "cinfer-bench: bad value '%s'\n", optarg);
            return EXIT_USAGE;
        }
    }
    /* vLLM's `--goodput ttft:500 tpot:50`: the pairs after the first. */
    for (; optind < argc; optind++) {
        if (!o.has_slo || !parse_slo(argv[optind], &o.slo)) {
            fprintf(stderr, "cinfer-bench: stray argument '%s'\n",
                    argv[optind]);
            return EXIT_USAGE;
        }
    }
    int openai = strcmp(o.protocol, "openai") == 0;
    int llama = strcmp(o.protocol, "llamacpp") == 0 || openai;
    if (llama && o.retries > 0) {
        fprintf(stderr, "cinfer-bench: --retries is gRPC's retry policy; "
                        "--protocol %s has no retries\n", o.protocol);
        return EXIT_USAGE;
    }
    if (!o.server) {
        const char *env = getenv("CINFER_SERVER");
        o.server = openai  ? "127.0.0.1:8000"
                   : llama ? "127.0.0.1:8080"
                           : (env && env[0] ? env : "127.0.0.1:50051");
    }

    cinfer_bench_workload_params wp = cinfer_bench_workload_default_params();
    wp.num_requests = o.num_requests;
    wp.input_len = o.input_len;
    wp.output_len = o.output_len;
    wp.range_ratio = o.range_ratio;
    wp.prompts_file = o.prompts_file;
    wp.rate_per_s = o.rate;
    wp.burstiness = o.burstiness;
    wp.seed = o.seed;
    wp.vocab_size = o.vocab_size;

    if (o.dry_run) {
        if (!wp.vocab_size)
            wp.vocab_size = 32000;
        cinfer_bench_workload *w;
        if (cinfer_bench_workload_create(&wp, &w) != CINFER_OK) {
            fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
            return EXIT_USAGE;
        }
        print_dry_run(w);
        cinfer_bench_workload_destroy(w);
        return 0;
    }

    int rc = EXIT_BROKEN;
    cinfer_bench_driver_params dp = cinfer_bench_driver_default_params();
    dp.server = o.server;
    dp.ignore_eos = o.ignore_eos;
    dp.temperature = o.temperature;
    dp.timeout_s = o.timeout_s;
    dp.max_attempts = 1 + o.retries;
    dp.retry_backoff_ms = o.retry_backoff_ms;
    dp.openai = openai;
    cinfer_bench_driver *d = NULL;
    cinfer_status st = llama ? cinfer_bench_http_create(&dp, &d)
                             : cinfer_bench_grpc_create(&dp, &d);
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
        return EXIT_BROKEN;
    }
    cinfer_bench_model_info mi;
    st = llama ? cinfer_bench_http_model_info(d, 30, &mi)
               : cinfer_bench_grpc_model_info(d, 30, &mi);
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
        goto fail_driver;
    }
    if (!wp.vocab_size)
        wp.vocab_size = mi.vocab_size;
    if (!o.prompts_file && wp.vocab_size < 1) {
        fprintf(stderr, "cinfer-bench: the server did not report its "
                        "vocabulary size; give --vocab-size\n");
        goto fail_driver;
    }
    int max_in = (int)ceil(o.input_len * (1 + o.range_ratio));
    int max_out = (int)ceil(o.output_len * (1 + o.range_ratio));
    if (!o.prompts_file && mi.context_length > 0 &&
        max_in + max_out > mi.context_length) {
        fprintf(stderr, "cinfer-bench: prompts of up to %d tokens plus %d "
                        "output tokens exceed the server's context of %d\n",
                max_in, max_out, mi.context_length);
        rc = EXIT_USAGE;
        goto fail_driver;
    }

    cinfer_bench_workload *w = NULL;
    st = cinfer_bench_workload_create(&wp, &w);
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
        rc = EXIT_USAGE;
        goto fail_driver;
    }
    int show_progress = !o.quiet && isatty(STDERR_FILENO);
    if (!o.quiet) {
        char conc[32], rate[64];
        if (o.concurrency)
            snprintf(conc, sizeof conc, "%d", o.concurrency);
        else
            snprintf(conc, sizeof conc, "unlimited");
        if (o.rate > 0)
            snprintf(rate, sizeof rate, "%g/s (burstiness %g)", o.rate,
                     o.burstiness);
        else
            snprintf(rate, sizeof rate, "inf");
        char retries[64] = "";
        if (o.retries > 0)
            snprintf(retries, sizeof retries,
                     ", up to %d retries (%d ms backoff)", o.retries,
                     o.retry_backoff_ms);
        fprintf(stderr,
                "cinfer-bench: %s %s (%s), %d requests, %d+%d tokens, "
                "concurrency %s, rate %s%s\n",
                o.protocol, o.server, mi.model,
                o.num_requests, o.input_len, o.output_len, conc, rate,
                retries);
    }

    if (o.warmups > 0) {
        cinfer_bench_workload_params ww = wp;
        ww.num_requests = o.warmups;
        ww.rate_per_s = 0;
        ww.seed = wp.seed ^ 0x7761726d7570ull;
        cinfer_bench_workload *wu = NULL;
        cinfer_bench_req *wr = calloc((size_t)o.warmups, sizeof *wr);
        double wd = 0;
        st = wr ? cinfer_bench_workload_create(&ww, &wu)
                : cinfer_set_error(CINFER_E_NOMEM, "out of memory");
        if (st == CINFER_OK)
            st = run(d, wu, &o, 0, wr, &wd);
        int wfail = 0;
        for (int i = 0; wr && i < o.warmups; i++) {
            wfail += wr[i].done && !wr[i].ok;
            cinfer_bench_req_cleanup(&wr[i]);
        }
        free(wr);
        cinfer_bench_workload_destroy(wu);
        if (st != CINFER_OK) {
            fprintf(stderr, "cinfer-bench: warmup: %s\n", cinfer_last_error());
            goto fail_workload;
        }
        if (!o.quiet)
            fprintf(stderr, "cinfer-bench: %d warmup requests in %.1f s (%d "
                            "failed)\n",
                    o.warmups, wd, wfail);
    }

    int n = cinfer_bench_workload_count(w);
    cinfer_bench_req *reqs = calloc((size_t)n, sizeof *reqs);
    if (!reqs) {
        fprintf(stderr, "cinfer-bench: out of memory\n");
        goto fail_workload;
    }
    double duration = 0;
    st = run(d, w, &o, show_progress, reqs, &duration);
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
        goto fail_reqs;
    }

    /* The first failure's message helps more than a count alone. */
    for (int i = 0; i < n; i++) {
        if (reqs[i].done && !reqs[i].ok) {
            fprintf(stderr, "cinfer-bench: request %d failed: %s%s%s\n", i,
                    reqs[i].status, reqs[i].detail ? ": " : "",
                    reqs[i].detail ? reqs[i].detail : "");
            break;
        }
    }
    cinfer_bench_summary sum;
    st = cinfer_bench_summarize(reqs, n, duration,
                                o.has_slo ? &o.slo : NULL, &sum);
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
        goto fail_reqs;
    }
    if (!o.quiet)
        cinfer_bench_print_report(stdout, &sum, "Serving Benchmark Result");
    if (o.json) {
        cinfer_bench_run_info info = {
            openai ? "cinfer-openai" : llama ? "llamacpp" : "cinfer",
            o.server, mi.model, o.rate,
            o.burstiness, o.concurrency, o.input_len, o.output_len,
            o.range_ratio, o.seed, o.ignore_eos, o.temperature,
            o.has_slo ? &o.slo : NULL, o.detailed, 1 + o.retries};
        FILE *f = fopen(o.json, "w");
        if (!f) {
            fprintf(stderr, "cinfer-bench: %s: %s\n", o.json,
                    strerror(errno));
            cinfer_bench_summary_cleanup(&sum);
            goto fail_reqs;
        }
        st = cinfer_bench_write_json(f, &sum, &info, reqs, n);
        if (fclose(f) != 0 && st == CINFER_OK)
            st = cinfer_set_error(CINFER_E_IO, "%s: %s", o.json,
                                  strerror(errno));
        if (st != CINFER_OK) {
            fprintf(stderr, "cinfer-bench: %s\n", cinfer_last_error());
            cinfer_bench_summary_cleanup(&sum);
            goto fail_reqs;
        }
    }
    rc = sum.failed ? EXIT_SOME_FAILED : 0;
    cinfer_bench_summary_cleanup(&sum);

fail_reqs:
    for (int i = 0; i < n; i++)
        cinfer_bench_req_cleanup(&reqs[i]);
    free(reqs);
fail_workload:
    cinfer_bench_workload_destroy(w);
fail_driver:
    cinfer_bench_driver_destroy(d);
    return rc;
}
