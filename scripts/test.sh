#!/bin/sh
# The test command: installs dependencies, then builds and tests twice:
#   build/release  gcc, -Werror, optimized, with the CUDA backend compiled
#                  by nvcc where it is found (sm_80, sm_89, sm_90a): unit
#                  and integration tests, the CUDA ones under the CPU
#                  harness (tests/cudasim/); tests that need a GPU skip
#   build/asan     clang, ASan + UBSan + libFuzzer targets: unit and
#                  integration tests (the CUDA backend under the harness
#                  again; nvcc's device build is the release build's), and
#                  each fuzz target for CINFER_FUZZ_SECONDS (default 30)
# and compiles the configuration scripts/gpu-check.sh builds on a GPU
# machine (build/gpu-check, CINFER_GPU_CHECK=ON), so it cannot rot.
# The output ends with ctest's summary of the sanitizer run; the exit code is
# non-zero if either run failed.
set -u
cd "$(dirname "$0")/.."
sh scripts/install-deps.sh || exit 1

JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${CINFER_FUZZ_SECONDS:-30}
rc=0

echo "== release build (gcc, -Werror)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release -DCINFER_WERROR=ON >/dev/null &&
  cmake --build build/release -j "$JOBS" >build/release-build.log 2>&1 || {
    tail -50 build/release-build.log; echo "release build failed"; exit 1; }
(cd build/release && ctest -j "$JOBS" -L "unit|integration" --output-on-failure) || rc=1

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== gpu-check configuration (compile only: no GPU here)"
  cmake -S . -B build/gpu-check -DCMAKE_BUILD_TYPE=Release -DCINFER_GPU_CHECK=ON \
    -DCINFER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null &&
    cmake --build build/gpu-check -j "$JOBS" >build/gpu-check-build.log 2>&1 || {
      tail -50 build/gpu-check-build.log; echo "gpu-check build failed"; rc=1; }
fi

echo "== sanitizer build (clang, ASan + UBSan, fuzz targets)"
CC=clang CXX=clang++ cmake -S . -B build/asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCINFER_SANITIZE=ON -DCINFER_FUZZ=ON -DCINFER_FUZZ_SECONDS="$FUZZ_SECONDS" \
  -DCINFER_WERROR=ON -DCINFER_CUDA=OFF >/dev/null &&
  cmake --build build/asan -j "$JOBS" >build/asan-build.log 2>&1 || {
    tail -50 build/asan-build.log; echo "sanitizer build failed"; exit 1; }
if [ $rc -ne 0 ]; then echo "release tests failed (see above)"; fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build/asan && ctest -j "$JOBS" -L "unit|integration|fuzz" --output-on-failure) || rc=1
exit $rc
