#!/bin/sh
# Makes tests/data/arch_golden.txt and arch_golden_logits.f32: builds
# scripts/goldens/arch_goldens.c against libllama (from build-llama-cpp.sh)
# and cinfer's engine (its GGUF writer) and runs it. Usage:
#   scripts/goldens/arch-goldens.sh [CINFER_BUILD_DIR] [LLAMA_BIN_DIR] [OUT_DIR]
# (defaults: build/release, what build-llama-cpp.sh prints, tests/data).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/build/release}
BIN=${2:-$("$ROOT/scripts/goldens/build-llama-cpp.sh")}
OUT=${3:-$ROOT/tests/data}
LL=$(cd "$BIN/../.." && pwd)
cmake --build "$B" --target cinfer_engine >/dev/null
TMP=$(mktemp -d)
cc -O2 -I"$ROOT" -I"$LL/include" -I"$LL/ggml/include" "$ROOT/scripts/goldens/arch_goldens.c" \
  "$B/engine/libcinfer_engine.a" "$B/kernels/libcinfer_kernels.a" "$B/common/libcinfer_common.a" \
  -L"$BIN" -lllama -lggml -lggml-cpu -lggml-base -Wl,-rpath,"$BIN" \
  $(pkg-config --libs libpcre2-8 2>/dev/null) -lm -lpthread -o "$TMP/arch_goldens"
rc=0
"$TMP/arch_goldens" "$OUT" || rc=$?
rm -rf "$TMP"
exit $rc
