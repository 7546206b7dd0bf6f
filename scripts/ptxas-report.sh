#!/bin/sh
# Registers, spills and shared memory of every CUDA kernel at sm_90a, as
# ptxas reports them (nvcc -Xptxas -v), into bench/results/ptxas-sm90a.txt.
# Fails if any kernel spills. Needs nvcc only (no GPU).
#
#   scripts/ptxas-report.sh [OUT]
set -u
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/ptxas-sm90a.txt}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  echo "# ptxas -v, sm_90a, $("$NVCC" --version | tail -1), $(date -u +%Y-%m-%d)"
  for f in kernels/cuda/*.cu; do
    echo "## $f"
    "$NVCC" -std=c++17 -O3 -I. -arch=sm_90a -Xptxas -v -c "$f" \
      -o "$tmp/k.o" 2>&1 | c++filt | grep -E "Function properties|Compiling entry|Used|spill" |
      sed -e "s/ptxas info *: //"
  done
} >"$OUT"
spills=$(grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$OUT" | wc -l)
kernels=$(grep -c "Compiling entry" "$OUT")
echo "$kernels kernels, $spills with spills" | tee -a "$OUT"
[ "$spills" -eq 0 ]
