#!/bin/sh
# Builds scripts/goldens/kquant_check.c against llama.cpp's ggml (from
# build-llama-cpp.sh) and cinfer's kernels library and runs it, then
# kquant_e2e.c against libllama and cinfer's engine (a report only: lines
# with extra_bufts, or "not run" for a type the model writer or loader
# refuses), then kquant_insitu.c (every quantized product of llama.cpp's
# decode of tiny models recomputed by cinfer's kernels). The exit status
# is 1 if kquant_check or kquant_insitu found a difference. Usage:
#   scripts/goldens/kquant-check.sh [CINFER_BUILD_DIR] [LLAMA_BIN_DIR]
# (defaults: build/release and what build-llama-cpp.sh prints).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/build/release}
BIN=${2:-$("$ROOT/scripts/goldens/build-llama-cpp.sh")}
LL=$(cd "$BIN/../.." && pwd)
cmake --build "$B" --target cinfer_kernels cinfer_engine >/dev/null
OUT=$(mktemp -d)
cc -O2 -I"$ROOT" -I"$LL/ggml/include" "$ROOT/scripts/goldens/kquant_check.c" \
  "$B/kernels/libcinfer_kernels.a" "$B/common/libcinfer_common.a" \
  -L"$BIN" -lggml-cpu -lggml-base -Wl,-rpath,"$BIN" -lm -lpthread -o "$OUT/kquant_check"
rc=0
"$OUT/kquant_check" >"$OUT/check.txt" 2>&1 || rc=1
grep -v '^repack:' "$OUT/check.txt" || true
cc -O2 -I"$ROOT" -I"$LL/include" -I"$LL/ggml/include" "$ROOT/scripts/goldens/kquant_e2e.c" \
  "$B/engine/libcinfer_engine.a" "$B/kernels/libcinfer_kernels.a" "$B/common/libcinfer_common.a" \
  -L"$BIN" -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$BIN" \
  $(pkg-config --libs libpcre2-8 2>/dev/null) -lm -lpthread -o "$OUT/kquant_e2e"
"$OUT/kquant_e2e" 2>&1 | grep -E 'extra_bufts|not run' || true
cc -O2 -I"$ROOT" -I"$LL/include" -I"$LL/ggml/include" "$ROOT/scripts/goldens/kquant_insitu.c" \
  "$B/engine/libcinfer_engine.a" "$B/kernels/libcinfer_kernels.a" "$B/common/libcinfer_common.a" \
  -L"$BIN" -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$BIN" \
  $(pkg-config --libs libpcre2-8 2>/dev/null) -lm -lpthread -o "$OUT/kquant_insitu"
"$OUT/kquant_insitu" || rc=1
rm -rf "$OUT"
exit $rc
