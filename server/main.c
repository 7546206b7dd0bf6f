/*
 * main.c - cinfer-server: flags and environment, model loading, signals.
 *
 *   cinfer-server [--listen 127.0.0.1:50051] [--model PATH] [--threads N] ...
 *
 * Every flag can also come from an environment variable (CINFER_LISTEN,
 * CINFER_MODEL, ...; see --help), as container deployments expect; a flag on
 * the command line wins over the environment.
 *
 * Order of events: the port is bound first and health reports NOT_SERVING
 * while the model loads; then the engine starts and health turns SERVING.
 * SIGTERM or SIGINT drains: health NOT_SERVING, new calls UNAVAILABLE,
 * running streams get --drain-timeout seconds to finish, then the process
 * exits 0. The signals are blocked in every thread and taken synchronously
 * by the main thread with sigwait, so no handler runs inside gRPC or the
 * engine.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <grpc/grpc.h>

#include "engine/engine.h"
#include "server/log.h"
#include "server/server.h"

#ifndef CINFER_VERSION
#define CINFER_VERSION "0.1.0"
#endif

typedef struct {
    const char *listen;
    const char *model;
    long threads;
    long grpc_threads;
    long max_seqs;
    long max_batched_tokens;
    long max_queued;
    long ctx_size;
    long default_max_tokens;
    long long kv_cache_mem;
    double drain_timeout_s;
    long max_receive_message_bytes;
    long prefix_cache;
    const char *log_level;
} config;

/* One row per flag: its name, environment variable, argument and help. */
typedef struct {
    const char *name;
    const char *env;
    const char *arg;
    const char *help;
} flag_doc;

static const flag_doc flags[] = {
    {"listen", "CINFER_LISTEN", "HOST:PORT",
     "address to serve on (default 127.0.0.1:50051; 0.0.0.0:PORT in "
     "containers; port 0 picks a free one)"},
    {"model", "CINFER_MODEL", "PATH", "GGUF model (default: %s)"},
    {"threads", "CINFER_THREADS", "N", "CPU threads for the model (default: all cores)"},
    {"grpc-threads", "CINFER_GRPC_THREADS", "N",
     "completion-queue threads (default 2)"},
    {"max-seqs", "CINFER_MAX_SEQS", "N",
     "sequences decoded together (default 64)"},
    {"max-batched-tokens", "CINFER_MAX_BATCHED_TOKENS", "N",
     "tokens per engine step, prefill chunks included (default 512)"},
    {"max-queued", "CINFER_MAX_QUEUED", "N",
     "waiting requests before new ones get RESOURCE_EXHAUSTED (default 0 = "
     "no limit)"},
    {"ctx-size", "CINFER_CTX_SIZE", "N",
     "tokens per sequence (default: the model's, at most 8192)"},
    {"kv-cache-mem", "CINFER_KV_CACHE_MEM", "BYTES",
     "KV cache size, with K/M/G suffix (default 512M)"},
    {"default-max-tokens", "CINFER_DEFAULT_MAX_TOKENS", "N",
     "max_tokens of requests that leave it unset (default 256)"},
    {"drain-timeout", "CINFER_DRAIN_TIMEOUT", "SECONDS",
     "on SIGTERM, how long running streams may take to finish (default 30)"},
    {"max-receive-message-bytes", "CINFER_MAX_RECEIVE_MESSAGE_BYTES", "N",
     "largest request message (default 4194304)"},
    {"prefix-cache", "CINFER_PREFIX_CACHE", "0|1",
     "reuse the KV cache of shared prompt prefixes (default 1)"},
    {"log-level", "CINFER_LOG_LEVEL", "LEVEL",
     "debug, info, warn, error or off (default info)"},
};
#define N_FLAGS (int)(sizeof flags / sizeof flags[0])

static void usage(FILE *f)
{
    const char *dm = cinfer_model_default_path();
    fprintf(f, "usage: cinfer-server [options]\n\n"
               "Serves a GGUF model over gRPC: cinfer.v1.Inference (Generate, "
               "Tokenize,\nDetokenize, GetModelInfo), grpc.health.v1.Health "
               "and server reflection.\nLogs are JSON lines on stderr.\n\n"
               "options (each also read from the environment variable "
               "shown):\n");
    for (int i = 0; i < N_FLAGS; i++) {
        char left[64];
        snprintf(left, sizeof left, "--%s %s", flags[i].name, flags[i].arg);
        fprintf(f, "  %-36s ", left);
        fprintf(f, flags[i].help, dm && dm[0] ? dm : "(none installed)");
        fprintf(f, "\n  %-36s [%s]\n", "", flags[i].env);
    }
    fprintf(f, "  %-36s print this help\n", "-h, --help");
    fprintf(f, "  %-36s print the version\n", "--version");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* "512M", "1G", "1GiB", "4096" -> bytes. */
static int parse_bytes(const char *s, long long *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return 0;
    double mul = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; break;
        case 'm': case 'M': mul = 1024.0 * 1024; break;
        case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
        case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
        default: return 0;
        }
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
        if (*end)
            return 0;
    }
    double b = v * mul;
    if (b > 9e18)
        return 0;
    *out = (long long)b;
    return 1;
}

/* Applies one option value (from a flag or the environment) to cfg.
 * Returns 0 and prints the problem if the value is bad. */
static int apply(config *cfg, int i, const char *v, const char *from)
{
    const char *name = flags[i].name;
    int ok = 1;
    if (strcmp(name, "listen") == 0) {
        cfg->listen = v;
        ok = v[0] != '\0';
    } else if (strcmp(name, "model") == 0) {
        cfg->model = v;
    } else if (strcmp(name, "threads") == 0) {
        ok = parse_long(v, 0, 1024, &cfg->threads);
    } else if (strcmp(name, "grpc-threads") == 0) {
        ok = parse_long(v, 1, 256, &cfg->grpc_threads);
    } else if (strcmp(name, "max-seqs") == 0) {
        ok = parse_long(v, 1, 4096, &cfg->max_seqs);
    } else if (strcmp(name, "max-batched-tokens") == 0) {
        ok = parse_long(v, 1, 1 << 20, &cfg->max_batched_tokens);
    } else if (strcmp(name, "max-queued") == 0) {
        ok = parse_long(v, 0, 1 << 24, &cfg->max_queued);
    } else if (strcmp(name, "ctx-size") == 0) {
        ok = parse_long(v, 0, 1 << 20, &cfg->ctx_size);
    } else if (strcmp(name, "kv-cache-mem") == 0) {
        ok = parse_bytes(v, &cfg->kv_cache_mem);
    } else if (strcmp(name, "default-max-tokens") == 0) {
        ok = parse_long(v, 1, 1 << 20, &cfg->default_max_tokens);
    } else if (strcmp(name, "drain-timeout") == 0) {
        char *end;
        errno = 0;
        cfg->drain_timeout_s = strtod(v, &end);
        ok = !errno && end != v && !*end && cfg->drain_timeout_s >= 0 &&
             cfg->drain_timeout_s < 1e7;
    } else if (strcmp(name, "max-receive-message-bytes") == 0) {
        ok = parse_long(v, 1024, 1L << 30, &cfg->max_receive_message_bytes);
    } else if (strcmp(name, "prefix-cache") == 0) {
        ok = parse_long(v, 0, 1, &cfg->prefix_cache);
    } else if (strcmp(name, "log-level") == 0) {
        cfg->log_level = v;
        ok = cinfer_log_level_parse(v) >= 0;
    }
    if (!ok)
        fprintf(stderr, "cinfer-server: bad value '%s' for %s%s\n", v, from,
                from[0] == '-' ? name : "");
    return ok;
}

/* KV blocks that fit in `bytes`, from the model file's shape (read without
 * loading the model). 0 when the file cannot be read (the model load then
 * reports the problem). */
static int kv_blocks_for(const char *path, long long bytes, int block_size)
{
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.path = path;
    cinfer_gguf *g;
    if (cinfer_gguf_create(&gp, &g) != CINFER_OK)
        return 0;
    int blocks = 0;
    cinfer_gguf_str arch;
    if (cinfer_gguf_get_str(g, "general.architecture", &arch) == CINFER_OK &&
        arch.len < 64) {
        char key[128];
        uint32_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, hd = 0;
#define KEY(suffix) (snprintf(key, sizeof key, "%.*s." suffix, (int)arch.len, arch.ptr), key)
        cinfer_gguf_get_u32(g, KEY("block_count"), &n_layer);
        cinfer_gguf_get_u32(g, KEY("embedding_length"), &n_embd);
        cinfer_gguf_get_u32(g, KEY("attention.head_count"), &n_head);
        if (cinfer_gguf_get_u32(g, KEY("attention.head_count_kv"),
                                &n_head_kv) != CINFER_OK)
            n_head_kv = n_head;
        if (cinfer_gguf_get_u32(g, KEY("attention.key_length"), &hd) !=
                CINFER_OK &&
            n_head)
            hd = n_embd / n_head;
#undef KEY
        /* K and V, F16. */
        double per_block = 2.0 * n_layer * n_head_kv * hd * block_size * 2.0;
        if (per_block > 0) {
            double b = (double)bytes / per_block;
            blocks = b > 1e7 ? 10000000 : (int)b;
        }
    }
    cinfer_clear_error();
    cinfer_gguf_destroy(g);
    return blocks;
}

static void load_progress(float f, void *user)
{
    int *last = user;
    int q = (int)(f * 4.0f);
    if (q <= *last)
        return;
    *last = q;
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_DEBUG, "loading", NULL)) {
        cinfer_log_int(&l, "percent", q * 25);
        cinfer_log_end(&l);
    }
}

int main(int argc, char **argv)
{
    config cfg = {
        .listen = "127.0.0.1:50051",
        .model = NULL,
        .threads = 0,
        .grpc_threads = 2,
        .max_seqs = 64,
        .max_batched_tokens = 512,
        .max_queued = 0,
        .ctx_size = 0,
        .default_max_tokens = 256,
        .kv_cache_mem = 512LL << 20,
        .drain_timeout_s = 30,
        .max_receive_message_bytes = 4 << 20,
        .prefix_cache = 1,
        .log_level = "info",
    };

    /* Environment first, flags override. CINFER_MODEL is also what
     * cinfer_model_default_path reads, so both agree. */
    for (int i = 0; i < N_FLAGS; i++) {
        const char *v = getenv(flags[i].env);
        if (v && v[0] && !apply(&cfg, i, v, flags[i].env))
            return 2;
    }
    struct option longopts[N_FLAGS + 3];
    for (int i = 0; i < N_FLAGS; i++)
        longopts[i] = (struct option){flags[i].name, required_argument, 0,
                                      256 + i};
    longopts[N_FLAGS] = (struct option){"help", no_argument, 0, 'h'};
    longopts[N_FLAGS + 1] = (struct option){"version", no_argument, 0, 'V'};
    longopts[N_FLAGS + 2] = (struct option){0, 0, 0, 0};
    int opt;
    for (;;) {
        opt = getopt_long(argc, argv, "h", longopts, NULL);
        if (opt == -1)
            break;
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        if (opt == 'V') {
            printf("cinfer-server %s (grpc %s)\n", CINFER_VERSION,
                   grpc_version_string());
            return 0;
        }
        if (opt < 256 || opt >= 256 + N_FLAGS) {
            usage(stderr);
            return 2;
        }
        if (!apply(&cfg, opt - 256, optarg, "--"))
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "cinfer-server: unexpected argument '%s'\n",
                argv[optind]);
        return 2;
    }
    cinfer_log_set_level((cinfer_log_level)cinfer_log_level_parse(cfg.log_level));
    const char *model_path = cfg.model && cfg.model[0]
                                 ? cfg.model
                                 : cinfer_model_default_path();
    if (!model_path || !model_path[0]) {
        fprintf(stderr, "cinfer-server: no model: pass --model PATH (or "
                        "install the default with scripts/install-deps.sh)\n");
        return 2;
    }

    /* Signals: blocked everywhere (threads inherit the mask), taken by
     * sigwait below. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    cinfer_server_params sp = cinfer_server_default_params();
    sp.listen = cfg.listen;
    sp.grpc_threads = (int)cfg.grpc_threads;
    sp.max_receive_message_bytes = (int)cfg.max_receive_message_bytes;
    sp.default_max_tokens = (int)cfg.default_max_tokens;
    sp.max_seqs = (int)cfg.max_seqs;
    sp.max_batched_tokens = (int)cfg.max_batched_tokens;
    cinfer_server *srv = NULL;
    if (cinfer_server_create(&sp, &srv) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "cannot start", NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        return 1;
    }
    {
        /* The host part of the address with the bound port, for tests and
         * scripts that asked for port 0. */
        char addr[300];
        const char *colon = strrchr(cfg.listen, ':');
        int hl = colon ? (int)(colon - cfg.listen) : (int)strlen(cfg.listen);
        snprintf(addr, sizeof addr, "%.*s:%d", hl > 250 ? 250 : hl,
                 cfg.listen, cinfer_server_port(srv));
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "listening", NULL)) {
            cinfer_log_str(&l, "address", addr);
            cinfer_log_int(&l, "port", cinfer_server_port(srv));
            cinfer_log_str(&l, "version", CINFER_VERSION);
            cinfer_log_end(&l);
        }
    }

    int rc = 1;
    cinfer_model *model = NULL;
    cinfer_engine *engine = NULL;
    cinfer_model_params mp = cinfer_model_default_params();
    mp.path = model_path;
    mp.n_threads = (int)cfg.threads;
    mp.n_ctx = (int)cfg.ctx_size;
    mp.max_seqs = (int)cfg.max_seqs;
    mp.max_batch_rows = (int)cfg.max_batched_tokens;
    mp.n_kv_blocks = kv_blocks_for(model_path, cfg.kv_cache_mem,
                                   mp.block_size ? mp.block_size : 16);
    int last_quarter = -1;
    mp.progress = load_progress;
    mp.progress_user = &last_quarter;
    {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "loading model", NULL)) {
            cinfer_log_str(&l, "path", model_path);
            cinfer_log_int(&l, "kv_blocks", mp.n_kv_blocks);
            cinfer_log_end(&l);
        }
    }
    if (cinfer_model_create(&mp, &model) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "model load failed",
                             NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        goto out;
    }
    cinfer_engine_params ep = cinfer_engine_default_params();
    ep.model = model;
    ep.max_seqs = (int)cfg.max_seqs;
    ep.max_batched_tokens = (int)cfg.max_batched_tokens;
    ep.max_queued = (int)cfg.max_queued;
    ep.prefix_cache = (int)cfg.prefix_cache;
    if (cinfer_engine_create(&ep, &engine) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "engine start failed",
                             NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        goto out;
    }
    if (cinfer_server_attach(srv, model, engine) != CINFER_OK) {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "attach failed", NULL)) {
            cinfer_log_str(&l, "error", cinfer_last_error());
            cinfer_log_end(&l);
        }
        goto out;
    }

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    {
        cinfer_log_line l;
        if (cinfer_log_begin(&l, CINFER_LOG_INFO, "signal", NULL)) {
            cinfer_log_str(&l, "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            cinfer_log_end(&l);
        }
    }
    cinfer_server_drain(srv, (int64_t)(cfg.drain_timeout_s * 1000.0));
    rc = 0;
out:
    /* The server first: it cancels what still runs in the engine and waits
     * for every call to be freed, while the engine still delivers the
     * FINISH events. */
    cinfer_server_destroy(srv);
    cinfer_engine_destroy(engine);
    cinfer_model_destroy(model);
    return rc;
}
