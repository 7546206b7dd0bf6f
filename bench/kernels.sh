#!/bin/sh
# bench/kernels.sh - runs the CPU kernel micro-benchmark (tools/cinfer-kbench)
# and records its output in bench/results/kernels.txt (the run before moves
# to bench/results/history/), with the host,
# the CPU model and OPENBLAS_CORETYPE noted at the top.
#
#     bench/kernels.sh                      # build/ (configured if needed), all kernels
#     bench/kernels.sh build-rel --types q4_1,q8_0 --threads 2
#
# The machine should be otherwise idle: the floors and kernels share its
# memory bandwidth and cores, and the numbers are best-of-N wall times.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    build=$1
    shift
fi
case $build in /*) ;; *) build=$root/$build ;; esac
bin=$build/tools/cinfer-kbench
if [ ! -x "$bin" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j2 --target cinfer-kbench
fi
# One current file; the run before moves to history/ under its own date.
res=$root/bench/results
mkdir -p "$res/history"
out=$res/kernels.txt
if [ -f "$out" ]; then
    old=$res/history/kernels-$(date -r "$out" +%Y-%m-%d)
    k=2
    name=$old
    while [ -e "$name.txt" ]; do name=$old-r$k; k=$((k + 1)); done
    mv "$out" "$name.txt"
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
{
    echo "# bench/kernels.sh $*"
    echo "# host: $(uname -srm), cpu: ${cpu:-unknown}, $(nproc) cores"
    echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)}"
    echo "# commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$bin" "$@"
} | tee "$out"
echo "recorded in $out" >&2
