#!/bin/sh
# The main job: install dependencies (Debian packages, the default model),
# build, and generate a completion with the default model.
#   scripts/run.sh ["prompt"]
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)" >/dev/null
PROMPT=${1:-"What is the capital of France?"}
exec build/release/tools/cinfer-run --chat -p "$PROMPT" -n 64
