#!/bin/sh
# Builds scripts/goldens/kquant_check.c against llama.cpp's ggml (from
# build-llama-cpp.sh) and cinfer's kernels library, and runs it. Usage:
#   scripts/goldens/kquant-check.sh [CINFER_BUILD_DIR] [LLAMA_BIN_DIR]
# (defaults: build/release and what build-llama-cpp.sh prints).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/build/release}
BIN=${2:-$("$ROOT/scripts/goldens/build-llama-cpp.sh")}
LL=$(cd "$BIN/../.." && pwd)
cmake --build "$B" --target cinfer_kernels >/dev/null
OUT=$(mktemp -d)
cc -O2 -I"$ROOT" -I"$LL/ggml/include" "$ROOT/scripts/goldens/kquant_check.c" \
  "$B/kernels/libcinfer_kernels.a" "$B/common/libcinfer_common.a" \
  -L"$BIN" -lggml-cpu -lggml-base -Wl,-rpath,"$BIN" -lm -lpthread -o "$OUT/kquant_check"
"$OUT/kquant_check"
rc=$?
rm -rf "$OUT"
exit $rc
