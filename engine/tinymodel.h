/*
 * tinymodel.h - tiny random Llama-family models written as GGUF files.
 *
 * Tests need models that load in milliseconds, cover every weight type and
 * both tokenizer kinds, and can also be opened by llama.cpp for parity
 * checks. This module writes such files with the project's GGUF writer:
 * tensor names, shapes and metadata keys follow llama.cpp's `llama`,
 * `qwen2` and `qwen3` files exactly (token_embd.weight,
 * blk.N.attn_q.weight, ..., llama.block_count, tokenizer.ggml.tokens, ...),
 * and the weights are
 * random with scales that keep activations near unit size (projections
 * uniform with std 1/sqrt(fan_in), norms near 1, logits of std about 2).
 *
 * The tokenizer is real, so tokenization tests mean something:
 *   - "gpt2": byte-level BPE. 256 byte tokens in GPT-2's byte-to-unicode
 *     mapping (ids 0..255 = bytes 0..255), then merges learned on a small
 *     built-in English text (GPT-2-style pre-tokenization), then, when the
 *     text runs out of pairs, synthetic merges (token + letter); last the
 *     control tokens <|endoftext|>, <|im_start|>, <|im_end|> (ids
 *     n_vocab-3..n_vocab-1). bos = <|im_start|>, eos = pad = <|im_end|>,
 *     unk = <|endoftext|>, no BOS added, as in SmolLM2-Instruct.
 *   - "llama": SentencePiece-style BPE with byte fallback. <unk> (0, type
 *     2), <s> (1), </s> (2) (type 3), <0x00>..<0xFF> (type 6), the merged
 *     pieces with scores -1, -2, ... in merge order (so score order is merge
 *     order), then the single characters ("▁" for space and printable
 *     ASCII) with lower scores. BOS added, space prefix added.
 * The vocabulary depends only on the tokenizer kind and n_vocab, not on the
 * seed; the weights depend on the seed and each tensor's name.
 *
 * RoPE: `llama` files are read by llama.cpp with normal (adjacent-pair)
 * rotation, `qwen2` and `qwen3` with NEOX (half-split) rotation, as for
 * real files. Rope scaling is written as llama.cpp's converter writes it:
 * linear as rope.scaling.type / rope.scaling.factor, Llama 3's as the
 * rope_freqs.weight tensor of per-pair frequency factors, computed from
 * the factor, low/high frequency factors and original context as
 * convert_hf_to_gguf.py computes them from a config's rope_scaling.
 *
 *     cinfer_tinymodel_params p = cinfer_tinymodel_default_params();
 *     p.weight_dtype = CINFER_DTYPE_Q4_1;
 *     if (cinfer_tinymodel_write(&p, "/tmp/tiny.gguf") != CINFER_OK)
 *         fprintf(stderr, "%s\n", cinfer_last_error());
 *
 * Thread safety: the functions keep no state; any thread may call them.
 */
#ifndef CINFER_TINYMODEL_H
#define CINFER_TINYMODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "../kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *arch;          /* "llama", "qwen2" (adds Q/K/V biases),
                                  "qwen3" (adds per-head Q/K norms) or
                                  "gemma3" (Q/K norms, post-attention and
                                  post-FFN norms); NULL = "llama" */
    uint32_t sliding_window;   /* gemma3: attention.sliding_window (every
                                  6th layer global); 0 = not written */
    uint32_t n_layer;          /* transformer blocks, >= 1 */
    uint32_t n_embd;           /* model width; a multiple of n_head (unless
                                  head_dim is given), and of 32 when a
                                  weight type is quantized */
    uint32_t n_head;           /* query heads; head size n_embd/n_head must
                                  be even */
    uint32_t head_dim;         /* head size written as attention.key_length
                                  and value_length (Qwen3, Mistral Nemo:
                                  not n_embd / n_head), even; n_head *
                                  head_dim a multiple of 32 when quantized;
                                  0 = n_embd / n_head, keys not written */
    uint32_t n_head_kv;        /* key/value heads, divides n_head */
    uint32_t n_ff;             /* feed-forward width; a multiple of 32 when
                                  weight_dtype is quantized (256 for the
                                  K-quants) */
    uint32_t n_vocab;          /* vocabulary size, >= 259 (gpt2) or 260
                                  (llama: specials, bytes, >= 1 char) */
    uint32_t n_ctx;            /* trained context length written to the file */
    float rope_theta;          /* RoPE base frequency, > 0 */
    const char *rope_scaling;  /* NULL or "none" = nothing written;
                                  "linear" = rope.scaling.type linear and
                                  rope.scaling.factor rope_factor;
                                  "llama3" = rope_freqs.weight from the
                                  four fields below */
    float rope_factor;         /* linear, llama3: the factor, > 0 */
    float rope_low_freq;       /* llama3: low_freq_factor; 0 = 1 */
    float rope_high_freq;      /* llama3: high_freq_factor; 0 = 4 */
    uint32_t rope_orig_ctx;    /* llama3: original_max_position_embeddings;
                                  0 = 8192 */
    float norm_eps;            /* RMSNorm epsilon, > 0 */
    cinfer_dtype weight_dtype; /* 2-D projection weights (attn_q/k/v/output,
                                  ffn_gate/up/down, output): F32, F16, BF16,
                                  Q8_0, Q4_0, Q4_1, Q5_0 (GGML's reference
                                  quantizer), Q2_K, Q3_K, Q4_K, Q5_K,
                                  Q6_K, IQ4_NL or IQ4_XS (K-quant and IQ4
                                  blocks from cinfer_quantize_row's
                                  round-to-nearest) */
    cinfer_dtype embd_dtype;   /* token_embd.weight, same choices */
    int tied_output;           /* 1 = no output.weight (logits use
                                  token_embd), 0 = separate output.weight */
    uint64_t seed;             /* weight random seed */
    const char *tokenizer;     /* "gpt2" or "llama"; NULL = "gpt2" */
    const char *pre;           /* tokenizer.ggml.pre for gpt2 (llama.cpp's
                                  pre-tokenizer name); NULL = "gpt-2" */
    int chat_template;         /* 1 = write SmolLM2's ChatML template as
                                  tokenizer.chat_template, 0 = none */
    uint32_t alignment;        /* GGUF data alignment; 0 = 32 */
} cinfer_tinymodel_params;

/* 2 layers, width 64, 4 heads, 2 KV heads, ff 128, vocab 512, context 256,
 * theta 10000, eps 1e-5, F32 weights and embeddings, tied output, seed 1,
 * gpt2 tokenizer with the chat template. */
cinfer_tinymodel_params cinfer_tinymodel_default_params(void);

/* Writes the model to `path`. Errors: CINFER_E_INVALID_ARG (a field out of
 * range, named in the message), CINFER_E_NOMEM, CINFER_E_IO. */
cinfer_status cinfer_tinymodel_write(const cinfer_tinymodel_params *p,
                                     const char *path);

/* Same, into a malloc'd buffer the caller frees (for in-memory loading). */
cinfer_status cinfer_tinymodel_write_mem(const cinfer_tinymodel_params *p,
                                         void **buf, size_t *size);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_TINYMODEL_H */
