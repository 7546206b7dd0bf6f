#!/bin/sh
# Installs what the benchmarks under bench/ need beyond the build and the
# tests (scripts/install-deps.sh, run first): gnuplot for their plots and
# llama.cpp, the peer they run beside cinfer, built for the instruction
# sets this machine's kernel grants (scripts/goldens/build-llama-cpp.sh).
# Idempotent. Run as root (or with sudo available).
set -eu
HERE=$(dirname "$0")
sh "$HERE/install-deps.sh"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "install-bench-deps: installing gnuplot-nox"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gnuplot-nox >/dev/null
fi
echo "install-bench-deps: llama.cpp in $(sh "$HERE/goldens/build-llama-cpp.sh" | tail -1)"
