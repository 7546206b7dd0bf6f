/*
 * cinfer-mkmodel - writes a tiny random llama/qwen2 GGUF model.
 *
 * A command line over engine/tinymodel.h, for making test models by hand
 * and from scripts (golden-data makers, llama.cpp parity checks):
 *
 *     cinfer-mkmodel -o tiny.gguf --layers 2 --embd 64 --heads 4 \
 *         --kv-heads 2 --ff 128 --vocab 512 --dtype q4_1 --tokenizer gpt2 \
 *         --seed 1 [--arch qwen2] [--untied]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "engine/tinymodel.h"

static void usage(FILE *f)
{
    cinfer_tinymodel_params d = cinfer_tinymodel_default_params();
    fprintf(f,
            "usage: cinfer-mkmodel -o FILE [options]\n"
            "\n"
            "Writes a tiny llama-family GGUF model with random weights and a\n"
            "real tokenizer (see engine/tinymodel.h).\n"
            "\n"
            "  -o, --output FILE     output path (required)\n"
            "  --arch NAME           llama or qwen2 (default %s)\n"
            "  --layers N            transformer blocks (default %u)\n"
            "  --embd N              model width (default %u)\n"
            "  --heads N             query heads (default %u)\n"
            "  --kv-heads N          key/value heads (default %u)\n"
            "  --ff N                feed-forward width (default %u)\n"
            "  --vocab N             vocabulary size (default %u)\n"
            "  --ctx N               context length (default %u)\n"
            "  --rope-theta X        RoPE base (default %g)\n"
            "  --eps X               RMSNorm epsilon (default %g)\n"
            "  --dtype T             projection weights: f32 f16 bf16 q8_0\n"
            "                        q4_0 q4_1 (default f32)\n"
            "  --embd-dtype T        token embedding type (default f32)\n"
            "  --untied              write a separate output.weight\n"
            "  --tokenizer K         gpt2 or llama (default gpt2)\n"
            "  --pre NAME            tokenizer.ggml.pre for gpt2 (default "
            "gpt-2)\n"
            "  --no-chat-template    omit tokenizer.chat_template\n"
            "  --seed N              weight seed (default %llu)\n"
            "  --alignment N         GGUF data alignment (default 32)\n"
            "  -h, --help            this text\n",
            d.arch, d.n_layer, d.n_embd, d.n_head, d.n_head_kv, d.n_ff,
            d.n_vocab, d.n_ctx, (double)d.rope_theta, (double)d.norm_eps,
            (unsigned long long)d.seed);
}

static int parse_dtype(const char *s, cinfer_dtype *out)
{
    static const struct {
        const char *name;
        cinfer_dtype t;
    } map[] = {
        {"f32", CINFER_DTYPE_F32},   {"f16", CINFER_DTYPE_F16},
        {"bf16", CINFER_DTYPE_BF16}, {"q8_0", CINFER_DTYPE_Q8_0},
        {"q4_0", CINFER_DTYPE_Q4_0}, {"q4_1", CINFER_DTYPE_Q4_1},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcasecmp(s, map[i].name) == 0) {
            *out = map[i].t;
            return 1;
        }
    }
    return 0;
}

static int parse_u32(const char *opt, const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *end != '\0' || *s == '-' || v > 0xffffffffull) {
        fprintf(stderr, "cinfer-mkmodel: %s: '%s' is not a number\n", opt, s);
        return 0;
    }
    *out = (uint32_t)v;
    return 1;
}

static int parse_float(const char *opt, const char *s, float *out)
{
    char *end;
    float v = strtof(s, &end);
    if (*s == '\0' || *end != '\0') {
        fprintf(stderr, "cinfer-mkmodel: %s: '%s' is not a number\n", opt, s);
        return 0;
    }
    *out = v;
    return 1;
}

enum {
    OPT_ARCH = 256,
    OPT_LAYERS,
    OPT_EMBD,
    OPT_HEADS,
    OPT_KV_HEADS,
    OPT_FF,
    OPT_VOCAB,
    OPT_CTX,
    OPT_THETA,
    OPT_EPS,
    OPT_DTYPE,
    OPT_EMBD_DTYPE,
    OPT_UNTIED,
    OPT_TOKENIZER,
    OPT_PRE,
    OPT_NO_TEMPLATE,
    OPT_SEED,
    OPT_ALIGNMENT,
};

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"arch", required_argument, NULL, OPT_ARCH},
        {"layers", required_argument, NULL, OPT_LAYERS},
        {"embd", required_argument, NULL, OPT_EMBD},
        {"heads", required_argument, NULL, OPT_HEADS},
        {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
        {"ff", required_argument, NULL, OPT_FF},
        {"vocab", required_argument, NULL, OPT_VOCAB},
        {"ctx", required_argument, NULL, OPT_CTX},
        {"rope-theta", required_argument, NULL, OPT_THETA},
        {"eps", required_argument, NULL, OPT_EPS},
        {"dtype", required_argument, NULL, OPT_DTYPE},
        {"embd-dtype", required_argument, NULL, OPT_EMBD_DTYPE},
        {"untied", no_argument, NULL, OPT_UNTIED},
        {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
        {"pre", required_argument, NULL, OPT_PRE},
        {"no-chat-template", no_argument, NULL, OPT_NO_TEMPLATE},
        {"seed", required_argument, NULL, OPT_SEED},
        {"alignment", required_argument, NULL, OPT_ALIGNMENT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
    const char *out = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        int ok = 1;
        switch (c) {
        case 'o': out = optarg; break;
        case OPT_ARCH: p.arch = optarg; break;
        case OPT_LAYERS: ok = parse_u32("--layers", optarg, &p.n_layer); break;
        case OPT_EMBD: ok = parse_u32("--embd", optarg, &p.n_embd); break;
        case OPT_HEADS: ok = parse_u32("--heads", optarg, &p.n_head); break;
        case OPT_KV_HEADS:
            ok = parse_u32("--kv-heads", optarg, &p.n_head_kv);
            break;
        case OPT_FF: ok = parse_u32("--ff", optarg, &p.n_ff); break;
        case OPT_VOCAB: ok = parse_u32("--vocab", optarg, &p.n_vocab); break;
        case OPT_CTX: ok = parse_u32("--ctx", optarg, &p.n_ctx); break;
        case OPT_THETA:
            ok = parse_float("--rope-theta", optarg, &p.rope_theta);
            break;
        case OPT_EPS: ok = parse_float("--eps", optarg, &p.norm_eps); break;
        case OPT_DTYPE:
        case OPT_EMBD_DTYPE: {
            cinfer_dtype *dst = c == OPT_DTYPE ? &p.weight_dtype : &p.embd_dtype;
            ok = parse_dtype(optarg, dst);
            if (!ok)
                fprintf(stderr,
                        "cinfer-mkmodel: %s: unknown type '%s' (f32 f16 bf16 "
                        "q8_0 q4_0 q4_1)\n",
                        c == OPT_DTYPE ? "--dtype" : "--embd-dtype", optarg);
            break;
        }
        case OPT_UNTIED: p.tied_output = 0; break;
        case OPT_TOKENIZER: p.tokenizer = optarg; break;
        case OPT_PRE: p.pre = optarg; break;
        case OPT_NO_TEMPLATE: p.chat_template = 0; break;
        case OPT_SEED: {
            char *end;
            p.seed = strtoull(optarg, &end, 0);
            ok = *optarg != '\0' && *end == '\0';
            if (!ok)
                fprintf(stderr, "cinfer-mkmodel: --seed: '%s' is not a "
                                "number\n",
                        optarg);
            break;
        }
        case OPT_ALIGNMENT:
            ok = parse_u32("--alignment", optarg, &p.alignment);
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "cinfer-mkmodel: unexpected argument '%s'\n",
                argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!out) {
        fprintf(stderr, "cinfer-mkmodel: -o FILE is required\n");
        usage(stderr);
        return 2;
    }
    cinfer_status st = cinfer_tinymodel_write(&p, out);
    if (st != CINFER_OK) {
        fprintf(stderr, "cinfer-mkmodel: %s\n", cinfer_last_error());
        return 1;
    }
    return 0;
}
