#!/bin/sh
# The one call that checks cinfer's CUDA backend on a machine with an
# NVIDIA GPU (the CI machines have none: there the same tests run under
# the CPU harness, tests/cudasim/). It needs only what such a machine has:
# the CUDA toolkit, CMake, a C compiler and Python with PyTorch; no
# network and none of the project's Debian -dev packages.
#
#   scripts/gpu-check.sh [OUT_DIR]     (default bench/results/gpu-check-DATE)
#
# Steps, each bounded in time, with one table at the end:
#   1. build the CUDA-only configuration (CMake CINFER_GPU_CHECK=ON: common,
#      kernels, the CUDA backend, the engine without PCRE2, the GPU tests
#      and tools) for this GPU's architecture;
#   2. the backend tests on the device against the CPU backend and the
#      float64 references (test_backend_ops, its CUDA factory; with it the
#      fused kernels bit for bit against the ops they replace, and the
#      int8 and f16 / bf16 mma and ldmatrix wrappers of
#      kernels/cuda/mma.cuh against the PTX ISA's semantics, which checks
#      the harness's emulation, the batch-invariant float product on
#      tensor cores (dense.cu) against float64 and row by row, and the
#      tiled quantized product on mma against its dp4a kernel and mmvq bit
#      for bit, and the greedy choice and the draw (top_k, top_p, min_p),
#      the sampler's edits (bias, penalties, min_tokens) and the logprobs
#      on the device against the host sampler, bit for bit), the model
#      tests (test_model_cuda: tiny random models, CUDA vs CPU logits and
#      greedy tokens; test_model_tp_cuda: tensor parallelism through NCCL,
#      here TP=1, the one NCCL check one GPU allows, bit for bit against
#      the plain backend, and TP=2/3 where there are GPUs enough;
#      test_model_invariant: batch-invariant mode, a sequence's logits
#      alone and in decode batches of 2 to 200 rows bit for bit;
#      test_model_graphs: decode steps replayed from CUDA graphs against
#      the same steps launched op by op, bit for bit), then
#      compute-sanitizer
#      memcheck and racecheck over the backend tests where the tool runs;
#   3. ceilings: device copy bandwidth and the cuBLAS BF16 GEMM rate,
#      measured with PyTorch (bench/gpu_ceilings.py);
#   4. decode tokens/s at batch 1, 8 and 64 (and a 2,048-token prefill) on
#      random-weight models of TinyLlama-1.1B and Llama-3-8B shape in BF16,
#      Q8_0 and Q4_0, made here by the project's GGUF writer
#      (cinfer-mkmodel), each beside its bandwidth floor (weight bytes over
#      the measured copy bandwidth); BF16 again in batch-invariant mode, at
#      batch 1 and 64, for what the mode costs; BF16 and Q4_0 at batch 1
#      and 64 with every kernel launched on its own (--eager), for what
#      the graphs give; Q4_0 again at batch 1 and
#      64 with greedy tokens chosen on the device (--tokens-on-device), and
#      at batch 64 with the tiled product on dp4a (CINFER_CUDA_MMQ=dp4a),
#      and its 2,048-token prefill with attention on CUDA cores
#      (CINFER_CUDA_PREFILL=cores), for what each gives.
# Budget: about 8 minutes on one H200 (GPU_CHECK_BUDGET_S caps the
# benchmarks; models that do not start in time are listed as skipped).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-bench/results/gpu-check-$(date +%Y-%m-%d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/log.txt"
: >"$LOG"
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-420}
JOBS=$(nproc)
BUILD=${GPU_CHECK_BUILD:-build/gpu-check}
TMP=${GPU_CHECK_TMP:-/dev/shm}
[ -d "$TMP" ] && [ -w "$TMP" ] || TMP=${TMPDIR:-/tmp}
TMP=$(mktemp -d "$TMP/cinfer-gpu.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export PATH="$PATH:/usr/local/cuda/bin"

say() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
row() { printf '%s\n' "$*" >>"$OUT/table.md"; }

printf '| check | result |\n|---|---|\n' >"$OUT/table.md"
say "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  2>&1 | tee -a "$LOG" | sed 's/^/gpu: /'
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
case "$CC" in
  90) ARCH=90a ;;
  "") ARCH="80;89;90a" ;;
  *) ARCH=$CC ;;
esac
row "| device | ${GPU:-none found} (sm_${CC:-?}) |"

# ---- 1. build ------------------------------------------------------------
say "== build (CINFER_GPU_CHECK=ON, CUDA architectures $ARCH)"
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCINFER_GPU_CHECK=ON \
     -DCINFER_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" >>"$LOG" 2>&1 &&
   cmake --build "$BUILD" -j "$JOBS" >>"$LOG" 2>&1; then
  row "| build | ok ($(elapsed) s) |"
else
  tail -40 "$LOG"
  row "| build | FAILED (see log.txt) |"
  cat "$OUT/table.md"
  exit 1
fi
BIN="$ROOT/$BUILD"

# ---- 4a. models, made while the tests run ----------------------------------
# name layers embd heads kv_heads ff vocab ctx theta
SHAPES=${GPU_CHECK_SHAPES:-"tinyllama-1.1b 22 2048 32 4 5632 32000 4096 10000
llama3-8b 32 4096 32 8 14336 128256 8192 500000"}
TYPES=${GPU_CHECK_TYPES:-"bf16 q8_0 q4_0"}
make_models() {
  echo "$SHAPES" | while read -r name L E H KV FF V C T; do
    for t in $TYPES; do
      timeout 300 "$BIN/tools/cinfer-mkmodel" -o "$TMP/$name-$t.gguf.part" \
        --layers "$L" --embd "$E" --heads "$H" --kv-heads "$KV" --ff "$FF" \
        --vocab "$V" --ctx "$C" --rope-theta "$T" --dtype "$t" \
        --embd-dtype "$t" --untied --tokenizer llama --seed 1 \
        >>"$TMP/mkmodel.log" 2>&1 &&
        mv "$TMP/$name-$t.gguf.part" "$TMP/$name-$t.gguf"
      # one model ahead of the benchmark is enough memory
      while [ -e "$TMP/$name-$t.gguf" ] && [ "$(ls "$TMP"/*.gguf 2>/dev/null | wc -l)" -ge 2 ]; do
        sleep 1
      done
    done
  done
  touch "$TMP/models.done"
}
make_models &

# ---- 2. tests on the device ------------------------------------------------
run_test() { # name timeout command...
  n=$1 to=$2
  shift 2
  say "== $n"
  timeout "$to" "$@" >"$OUT/$n.txt" 2>&1
  rc=$?
  case $rc in
    0) r=ok ;;
    77) r="skipped ($(tail -1 "$OUT/$n.txt"))" ;;
    *) r="FAILED (rc $rc)" ;;
  esac
  tail -3 "$OUT/$n.txt" | tee -a "$LOG"
  row "| $n | $r: $(grep -E '[0-9]+ passed' "$OUT/$n.txt" | tail -1) |"
}
run_test test_backend_ops 180 "$BIN/tests/test_backend_ops"
run_test test_model_cuda 180 "$BIN/tests/test_model_cuda"
run_test test_model_tp_cuda 120 "$BIN/tests/test_model_tp_cuda"
run_test test_model_invariant 120 "$BIN/tests/test_model_invariant"
run_test test_model_graphs 120 "$BIN/tests/test_model_graphs"
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do
    run_test "sanitizer-$tool" 120 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$BIN/tests/test_backend_ops"
  done
else
  row "| compute-sanitizer | not found |"
fi

# ---- 3. ceilings -----------------------------------------------------------
say "== ceilings (PyTorch)"
BW=0
if timeout 120 python3 bench/gpu_ceilings.py >"$OUT/ceilings.json" 2>>"$LOG"; then
  cat "$OUT/ceilings.json" | tee -a "$LOG"
  BW=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['copy_gb_s'])" "$OUT/ceilings.json")
  GEMM=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['bf16_gemm_tflops'])" "$OUT/ceilings.json")
  row "| device copy bandwidth | $BW GB/s |"
  row "| cuBLAS BF16 GEMM (8192^3) | $GEMM TFLOP/s |"
else
  row "| ceilings | FAILED (see log.txt) |"
fi

# ---- 4b. decode benchmarks ---------------------------------------------------
say "== decode benchmarks"
printf '\n| model | type | batch | decode tok/s | floor tok/s | of floor | prefill 2048 tok/s |\n|---|---|---|---|---|---|---|\n' >"$OUT/bench.md"
echo "$SHAPES" | while read -r name L E H KV FF V C T; do
  for t in $TYPES; do
    f="$TMP/$name-$t.gguf"
    while [ ! -e "$f" ] && [ ! -e "$TMP/models.done" ] && [ "$(left)" -gt 0 ]; do
      sleep 1
    done
    if [ ! -e "$f" ] || [ "$(left)" -le 30 ]; then
      printf '| %s | %s | - | skipped (time or model) | | | |\n' "$name" "$t" >>"$OUT/bench.md"
      rm -f "$f"
      continue
    fi
    timeout "$(left)" "$BIN/tools/cinfer-devbench" -m "$f" --device cuda \
      --batch 1,8,64 --steps 32 --prompt 2048 -r 3 \
      >"$OUT/devbench-$name-$t.jsonl" 2>>"$LOG"
    python3 bench/gpu_table.py "$OUT/devbench-$name-$t.jsonl" "$name" "$t" "$BW" \
      >>"$OUT/bench.md" 2>>"$LOG"
    # what batch-invariant mode costs: float weights off cuBLAS
    if [ "$t" = bf16 ] && [ "$(left)" -gt 60 ]; then
      timeout "$(left)" "$BIN/tools/cinfer-devbench" -m "$f" --device cuda \
        --batch 1,64 --steps 32 --prompt 2048 -r 3 --batch-invariant \
        >"$OUT/devbench-$name-$t-invariant.jsonl" 2>>"$LOG"
      python3 bench/gpu_table.py "$OUT/devbench-$name-$t-invariant.jsonl" \
        "$name" "$t batch-invariant" "$BW" >>"$OUT/bench.md" 2>>"$LOG"
    fi
    # every kernel launched on its own (--eager), against the decode
    # steps above, which replay one recorded graph a step
    if [ "$t" != q8_0 ] && [ "$(left)" -gt 60 ]; then
      timeout "$(left)" "$BIN/tools/cinfer-devbench" -m "$f" --device cuda \
        --batch 1,64 --steps 32 -r 3 --eager \
        >"$OUT/devbench-$name-$t-eager.jsonl" 2>>"$LOG"
      python3 bench/gpu_table.py "$OUT/devbench-$name-$t-eager.jsonl" \
        "$name" "$t eager (no graphs)" "$BW" >>"$OUT/bench.md" 2>>"$LOG"
    fi
    # greedy tokens chosen on the device: only ids come back (what the
    # engine does for greedy steps), against the rows of logits above
    if [ "$t" = q4_0 ] && [ "$(left)" -gt 60 ]; then
      timeout "$(left)" "$BIN/tools/cinfer-devbench" -m "$f" --device cuda \
        --batch 1,64 --steps 32 -r 3 --tokens-on-device \
        >"$OUT/devbench-$name-$t-ondevice.jsonl" 2>>"$LOG"
      python3 bench/gpu_table.py "$OUT/devbench-$name-$t-ondevice.jsonl" \
        "$name" "$t tokens on device" "$BW" >>"$OUT/bench.md" 2>>"$LOG"
    fi
    # sampled on the device: top_p draws after penalty edits, 5 logprobs
    # (what an OpenAI-style sampled request costs a step)
    if [ "$t" = q4_0 ] && [ "$(left)" -gt 60 ]; then
      timeout "$(left)" "$BIN/tools/cinfer-devbench" -m "$f" --device cuda \
        --batch 1,64 --steps 32 -r 3 --sampled-on-device \
        >"$OUT/devbench-$name-$t-sampled.jsonl" 2>>"$LOG"
      python3 bench/gpu_table.py "$OUT/devbench-$name-$t-sampled.jsonl" \
        "$name" "$t sampled on device" "$BW" >>"$OUT/bench.md" 2>>"$LOG"
    fi
    # prefill attention on CUDA cores instead of tensor cores
    if [ "$t" = q4_0 ] && [ "$(left)" -gt 60 ]; then
      CINFER_CUDA_PREFILL=cores timeout "$(left)" "$BIN/tools/cinfer-devbench" \
        -m "$f" --device cuda --batch 1 --steps 0 --prompt 2048 -r 3 \
        >"$OUT/devbench-$name-$t-prefill-cores.jsonl" 2>>"$LOG"
      python3 bench/gpu_table.py "$OUT/devbench-$name-$t-prefill-cores.jsonl" \
        "$name" "$t prefill attention on cores" "$BW" >>"$OUT/bench.md" 2>>"$LOG"
    fi
    # the tiled quantized product on dp4a instead of int8 mma (same bits)
    if [ "$t" = q4_0 ] && [ "$(left)" -gt 60 ]; then
      CINFER_CUDA_MMQ=dp4a timeout "$(left)" "$BIN/tools/cinfer-devbench" \
        -m "$f" --device cuda --batch 64 --steps 32 --prompt 2048 -r 3 \
        >"$OUT/devbench-$name-$t-dp4a.jsonl" 2>>"$LOG"
      python3 bench/gpu_table.py "$OUT/devbench-$name-$t-dp4a.jsonl" \
        "$name" "$t mmq on dp4a" "$BW" >>"$OUT/bench.md" 2>>"$LOG"
    fi
    rm -f "$f"
  done
done
wait

say "== done in $(elapsed) s"
cat "$OUT/table.md" "$OUT/bench.md" | tee "$OUT/summary.md"
