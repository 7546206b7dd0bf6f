#!/bin/sh
# The main job: install dependencies (Debian packages, the default model),
# build, start cinfer-server with the default model on loopback, stream a
# chat completion with cinfer-cli, then stop the server (SIGTERM drain).
#   scripts/run.sh ["prompt"]
# CINFER_LISTEN (default 127.0.0.1:50051) picks the address.
set -eu
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j "$(nproc)" >/dev/null
PROMPT=${1:-"What is the boiling point of water in Celsius?"}
LISTEN=${CINFER_LISTEN:-127.0.0.1:50051}
LOG=build/release/cinfer-server.log

build/release/server/cinfer-server --listen "$LISTEN" 2>"$LOG" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT INT TERM
# wait until health reports SERVING (the model loads in well under a second)
i=0
until build/release/clients/cinfer-cli --server "$LISTEN" health >/dev/null 2>&1; do
  i=$((i + 1))
  if [ $i -gt 300 ] || ! kill -0 $pid 2>/dev/null; then
    echo "cinfer-server did not become ready; its log:" >&2
    cat "$LOG" >&2
    exit 1
  fi
  sleep 0.1
done
echo "cinfer-server on $LISTEN (log: $LOG); streaming a completion:" >&2
build/release/clients/cinfer-cli --server "$LISTEN" generate --chat -p "$PROMPT" \
  --max-tokens 64 --temperature 0
