#!/usr/bin/env python3
"""Golden logits and greedy continuations of the default model, from llama.cpp.

How the goldens were made (re-run to regenerate):

    BIN=$(scripts/goldens/build-llama-cpp.sh)          # llama.cpp 0.3.36 sdist
    PYTHONPATH=/tmp/llcpp/llama_cpp_python-0.3.36 LLAMA_CPP_LIB_PATH=$BIN \
        python3 scripts/goldens/model_goldens.py MODEL.gguf tests/data
        ... model_goldens.py $(scripts/gemma-model.sh) tests/data gemma one-token

With "gemma" the model is Gemma 3 270M and the prompts are PROMPTS_GEMMA
(Gemma's <bos> and turn markers written out, one prompt longer than the
512-token sliding window of its local layers); the files are
model_golden_gemma.txt and model_golden_gemma_last.f16.

llama.cpp runs on the CPU (2 threads, F16 KV cache, flash attention off,
n_batch 512), the whole prompt in one batch with the logits of every position.
With "one-token" (the Gemma files) the prompt goes in one token per
llama_decode call (n_batch = n_ubatch = 1), the path llama.cpp computes every
generated token on: its batched path sums a repacked Q4_K weight's rows in
gemm or gemv order by their place in the batch (and Q6_K in a tiled kernel
from 8 rows), which a batch-invariant engine cannot follow. The KV cache is also cleared
before each prompt (llama_memory_clear), so every prompt starts at cell 0.
Greedy continuations decode one token at a time, taking the argmax of
llama.cpp's logits, for 64 tokens, never stopping at EOS.

Written (small, committed):
  model_golden.txt       per prompt: its token ids (llama.cpp's tokenizer),
                         at every position the top-256 logits (id:value,
                         descending), and the 64 greedy token ids
  model_golden_last.f16  per prompt, the full logit vector of the last prompt
                         position, float16 little-endian (8 x n_vocab)
"""
import hashlib
import json
import sys

import numpy as np
import llama_cpp

PROMPTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water in Celsius?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
    "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 5, 8, 13, 21,",
    "Photosynthesis is the process by which plants",
    "<|im_start|>user\nTranslate to French: I like to read books in the evening.<|im_end|>\n<|im_start|>assistant\n",
]
# Gemma 3: <bos> starts every prompt (the file adds it); the chat turns
# are <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n.
_LONG = ("The history of the lighthouse begins with fires lit on hills to "
         "guide ships home. ") * 40
PROMPTS_GEMMA = [
    "<bos>The capital of France is",
    "<bos><start_of_turn>user\nWhat is the boiling point of water in Celsius?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<bos>Once upon a time, in a small village by the sea, there lived",
    "<bos><start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n<start_of_turn>model\n",
    "<bos>1, 2, 3, 5, 8, 13, 21,",
    "<bos>Überall auf der Welt: 日本語のテキスト, emojis 🎉🚀 and    spaces\n\tend",
    "<bos>" + _LONG + "Summarise the text above in one sentence:",
]
TOPK = 256
N_GREEDY = 64


def main():
    model, outdir = sys.argv[1], sys.argv[2]
    gemma = "gemma" in sys.argv[3:]
    one_token = "one-token" in sys.argv[3:]
    prompts = PROMPTS_GEMMA if gemma else PROMPTS
    stem = "model_golden_gemma" if gemma else "model_golden"
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    llm = llama_cpp.Llama(model_path=model, n_ctx=1024,
                          n_batch=1 if one_token else 1024,
                          n_ubatch=1 if one_token else 512, n_threads=2,
                          logits_all=True,
                          flash_attn=False, verbose=False)
    n_vocab = llm.n_vocab()
    lines = [
        "# cinfer model goldens: made by scripts/goldens/model_goldens.py",
        f"# llama.cpp from llama-cpp-python 0.3.36 sdist; model sha256 {sha}",
        "# prompt " + ("one token per llama_decode" if one_token else "in one batch"),
        "# P <prompt json> / T <ids> / L <pos> <id:logit>... / G <ids>",
        f"V {n_vocab} {len(prompts)} {TOPK} {N_GREEDY}",
    ]
    last = []
    for text in prompts:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        if one_token:
            # an empty cache from cell 0, as cinfer's test starts: after
            # reset() alone the next prompt's cells follow the last one's,
            # and the padded KV length changes the attention's sum order
            llm._ctx.kv_cache_clear()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
        lines.append("P " + json.dumps(text))
        lines.append("T " + " ".join(map(str, ids)))
        for p in range(len(ids)):
            row = scores[p]
            top = np.argsort(-row, kind="stable")[:TOPK]
            lines.append(f"L {p} " + " ".join(f"{int(i)}:{row[i]:.6g}" for i in top))
        last.append(scores[len(ids) - 1].astype(np.float16))
        out = []
        tok = int(np.argmax(scores[len(ids) - 1]))
        for _ in range(N_GREEDY):
            out.append(tok)
            llm.eval([tok])
            tok = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)))
        lines.append("G " + " ".join(map(str, out)))
        print(repr(text[:40]), len(ids), "tokens ->",
              repr(llm.detokenize(out).decode(errors="replace")[:60]))
    open(f"{outdir}/{stem}.txt", "w").write("\n".join(lines) + "\n")
    np.stack(last).astype("<f2").tofile(f"{outdir}/{stem}_last.f16")


if __name__ == "__main__":
    main()
