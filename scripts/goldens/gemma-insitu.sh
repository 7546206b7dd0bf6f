#!/bin/sh
# Builds scripts/goldens/gemma_insitu.c against llama.cpp (from
# build-llama-cpp.sh) and cinfer's engine, and runs it on a real GGUF file
# (default: the Gemma 3 270M Q4_K_M model, scripts/gemma-model.sh): every
# quantized product of llama.cpp's prompt and one-token paths recomputed
# by cinfer's kernels and by the orders of ggml's repacked (Q4_K) and
# tiled (Q6_K) kernels, the first node where llama.cpp's two paths part,
# and cinfer's logits against both paths. A report only (exit 0), not
# part of the build. Takes minutes. Usage:
#   scripts/goldens/gemma-insitu.sh [MODEL] [N_TOKENS] [CINFER_BUILD_DIR] [LLAMA_BIN_DIR]
# (defaults: the Gemma model, 9 tokens, build/release, what
# build-llama-cpp.sh prints).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${1:-$("$ROOT/scripts/gemma-model.sh")}
N=${2:-9}
B=${3:-$ROOT/build/release}
BIN=${4:-$("$ROOT/scripts/goldens/build-llama-cpp.sh")}
LL=$(cd "$BIN/../.." && pwd)
cmake --build "$B" --target cinfer_kernels cinfer_engine >/dev/null
OUT=$(mktemp -d)
cc -O2 -I"$ROOT" -I"$LL/include" -I"$LL/ggml/include" "$ROOT/scripts/goldens/gemma_insitu.c" \
  "$B/engine/libcinfer_engine.a" "$B/kernels/libcinfer_kernels.a" "$B/common/libcinfer_common.a" \
  -L"$BIN" -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$BIN" \
  $(pkg-config --libs libpcre2-8 2>/dev/null) -lm -lpthread -o "$OUT/gemma_insitu"
"$OUT/gemma_insitu" "$MODEL" "$N"
rm -rf "$OUT"
