/*
 * arch_golden_models.h - the tiny models of tests/data/arch_golden.txt:
 * one per architecture feature that llama.cpp's goldens check, written
 * by the project's GGUF writer (engine/tinymodel.h). Shared by the
 * golden maker (scripts/goldens/arch_goldens.c, run with llama.cpp) and
 * the test that replays them (tests/unit/test_model_golden_arch.c), so
 * both use the same files: the goldens carry each file's FNV-1a hash,
 * and the test refuses to compare against a file the writer no longer
 * produces.
 *
 *   llama3      llama, Llama 3 rope scaling (rope_freqs.weight from factor
 *               8, low 1, high 4, original context 64, theta 500000: pairs
 *               in all three of the converter's bands), GQA 4/1 (Llama 3
 *               8B's ratio), Q8_0
 *   linear      llama, rope.scaling.type linear, factor 4, Q4_1
 *   mistral     llama as Mistral's files are: SentencePiece vocabulary,
 *               theta 1e6, GQA 8/2 (Mistral 7B's ratio 4), the head size
 *               from attention.key_length as in Mistral Nemo's files (64,
 *               where n_embd 96 / 8 heads would be 12), Q8_0
 *   qwen3       qwen3: per-head Q/K RMSNorm, no biases, head size 64 from
 *               key_length (64 / 4 = 16), GQA 4/2, tied output, Q8_0
 *   qwen3_3l    qwen3, 3 layers, GQA 6/2, head size 64, Q4_1
 *   gemma3      gemma3: GeGLU, post-attention and post-FFN norms, Q/K
 *               norms, embeddings times sqrt(64), sliding window 16 on
 *               layers 0-4 and 6 (layer 5 global, rope base 1e6; local
 *               10000), so the 24 + 64 positions cross the window; GQA
 *               4/1 (Gemma 3 270M's ratio), head size 64, SentencePiece
 *               vocabulary, Q8_0
 *   gemma3_q5   gemma3, 2 layers, Q5_0 projections (the real file's
 *               type for most of them), Q8_0 embeddings
 *   llama_hd16  llama, head size 16 from key_length, GQA 4/2, Q8_0
 *   qwen3_hd32  qwen3, head size 32 from key_length, GQA 4/2, Q8_0
 *   q2_k .. iq4_xs  llama, 2 layers, n_embd 256, GQA 4/2, one per K-quant
 *               and IQ4 type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
 *               IQ4_XS), weights and embeddings of that type; the prompt
 *               one token per call (one_token), as llama.cpp computes
 *               generated tokens
 * Every model but qwen3 has a separate output (a tied one makes a random
 * model repeat its input token). The head sizes are 64, as real models'
 * are (64..256), but for llama_hd16 and qwen3_hd32, whose attention dot
 * products are shorter than one of ggml_vec_dot_f16's AVX-512 steps (64
 * halves). The goldens are from llama.cpp's AVX-512 build, which every
 * cinfer ISA reproduces bit for bit (its AVX2 build sums in another
 * order and parts from them in a few decode steps). The weight types are
 * ones whose llama.cpp kernels cinfer reproduces bit for bit here
 * (llama.cpp's F16 and F32 prefill goes through its tiled GEMM and repacks Q4_0, in other summation orders:
 * 1e-4 apart, which would blur what these check).
 *
 *     arch_golden_model ms[ARCH_GOLDEN_MAX];
 *     int n = arch_golden_models(ms);
 *     cinfer_tinymodel_write(&ms[0].p, path);
 */
#ifndef CINFER_ARCH_GOLDEN_MODELS_H
#define CINFER_ARCH_GOLDEN_MODELS_H

#include <stdint.h>
#include <stdlib.h>

#include "engine/tinymodel.h"

#define ARCH_GOLDEN_MAX 17
#define ARCH_GOLDEN_PROMPT 24 /* prompt tokens, logits at every position */
#define ARCH_GOLDEN_GREEDY 64 /* greedy tokens decoded one at a time */

typedef struct {
    const char *name;
    cinfer_tinymodel_params p;
    int one_token; /* the prompt fed one token per call, on both sides */
} arch_golden_model;

static inline int arch_golden_models(arch_golden_model *ms)
{
    cinfer_tinymodel_params d = cinfer_tinymodel_default_params();
    d.n_vocab = 320;
    d.n_ctx = 256;
    d.chat_template = 0;
    int n = 0;

    cinfer_tinymodel_params p = d;
    p.arch = "llama";
    p.n_embd = 256;
    p.n_head = 4;
    p.n_head_kv = 1;
    p.n_ff = 256;
    p.rope_theta = 500000.0f;
    p.rope_scaling = "llama3";
    p.rope_factor = 8.0f;
    p.rope_low_freq = 1.0f;
    p.rope_high_freq = 4.0f;
    p.rope_orig_ctx = 64;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q8_0;
    p.seed = 31;
    ms[n++] = (arch_golden_model){"llama3", p, 0};

    p = d;
    p.arch = "llama";
    p.n_embd = 128;
    p.n_head = 2;
    p.n_head_kv = 2;
    p.n_ff = 160;
    p.rope_scaling = "linear";
    p.rope_factor = 4.0f;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q4_1;
    p.seed = 32;
    ms[n++] = (arch_golden_model){"linear", p, 0};

    p = d;
    p.arch = "llama";
    p.tokenizer = "llama";
    p.n_embd = 96;
    p.n_head = 8;
    p.n_head_kv = 2;
    p.head_dim = 64;
    p.n_ff = 192;
    p.rope_theta = 1000000.0f;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q8_0;
    p.seed = 33;
    ms[n++] = (arch_golden_model){"mistral", p, 0};

    p = d;
    p.arch = "qwen3";
    p.pre = "qwen2";
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 64;
    p.n_ff = 192;
    p.rope_theta = 1000000.0f;
    p.norm_eps = 1e-6f;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q8_0;
    p.seed = 34;
    ms[n++] = (arch_golden_model){"qwen3", p, 0};

    p = d;
    p.arch = "qwen3";
    p.pre = "qwen2";
    p.n_layer = 3;
    p.n_embd = 96;
    p.n_head = 6;
    p.n_head_kv = 2;
    p.head_dim = 64;
    p.n_ff = 128;
    p.rope_theta = 1000000.0f;
    p.norm_eps = 1e-6f;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q4_1;
    p.seed = 35;
    ms[n++] = (arch_golden_model){"qwen3_3l", p, 0};

    p = d;
    p.arch = "gemma3";
    p.tokenizer = "llama";
    p.n_layer = 7;
    p.n_embd = 64;
    p.n_head = 4;
    p.n_head_kv = 1;
    p.head_dim = 64;
    p.n_ff = 192;
    p.rope_theta = 1000000.0f;
    p.sliding_window = 16;
    p.norm_eps = 1e-6f;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q8_0;
    p.seed = 36;
    ms[n++] = (arch_golden_model){"gemma3", p, 0};

    /* Gemma 3's Q4_K_M files hold Q5_0 projections: loaded as Q8_0 */
    p.weight_dtype = CINFER_DTYPE_Q5_0;
    p.n_layer = 2;
    p.seed = 37;
    ms[n++] = (arch_golden_model){"gemma3_q5", p, 0};

    /* head sizes under 64: KQ dot products shorter than one AVX-512
     * ggml_vec_dot_f16 step (64 halves), summed in double */
    p = d;
    p.arch = "llama";
    p.n_embd = 128;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 16;
    p.n_ff = 192;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q8_0;
    p.seed = 38;
    ms[n++] = (arch_golden_model){"llama_hd16", p, 0};

    p = d;
    p.arch = "qwen3";
    p.pre = "qwen2";
    p.n_embd = 128;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = 32;
    p.n_ff = 192;
    p.rope_theta = 1000000.0f;
    p.norm_eps = 1e-6f;
    p.tied_output = 0;
    p.weight_dtype = p.embd_dtype = CINFER_DTYPE_Q8_0;
    p.seed = 39;
    ms[n++] = (arch_golden_model){"qwen3_hd32", p, 0};

    /* one per K-quant and IQ4 type: their llama.cpp prompt kernels (tiled,
     * tinyBLAS, repacked gemm) sum in other orders than its one-token
     * path, which cinfer follows, so both sides feed the prompt one token
     * per call; every weight's rows are a multiple of 8 (llama.cpp's
     * repack condition for Q4_K, Q2_K and IQ4_NL) */
    static const struct {
        const char *name;
        cinfer_dtype t;
    } kq[] = {{"q2_k", CINFER_DTYPE_Q2_K},     {"q3_k", CINFER_DTYPE_Q3_K},
              {"q4_k", CINFER_DTYPE_Q4_K},     {"q5_k", CINFER_DTYPE_Q5_K},
              {"q6_k", CINFER_DTYPE_Q6_K},     {"iq4_nl", CINFER_DTYPE_IQ4_NL},
              {"iq4_xs", CINFER_DTYPE_IQ4_XS}};
    for (int i = 0; i < (int)(sizeof kq / sizeof kq[0]); i++) {
        p = d;
        p.arch = "llama";
        p.n_layer = 2;
        p.n_embd = 256;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 512;
        p.tied_output = 0;
        p.weight_dtype = p.embd_dtype = kq[i].t;
        p.seed = 40 + (uint64_t)i;
        ms[n++] = (arch_golden_model){kq[i].name, p, 1};
    }
    return n;
}

/* The prompt of model k: ids spread over the vocabulary, short of its
 * last 3 (the gpt2 vocabulary's control tokens). */
static inline void arch_golden_prompt(int k, int n_vocab, int32_t *toks)
{
    for (int i = 0; i < ARCH_GOLDEN_PROMPT; i++)
        toks[i] = (int32_t)(((int64_t)i * 7919 + 13 + 101 * k) %
                            (n_vocab - 3));
}

/* FNV-1a 64 of a file's bytes. */
static inline uint64_t arch_golden_fnv(const void *data, size_t n)
{
    const unsigned char *b = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#endif /* CINFER_ARCH_GOLDEN_MODELS_H */
