#!/bin/sh
# Builds llama.cpp from the source that the PyPI package llama-cpp-python
# ships (sdist 0.3.36, vendor/llama.cpp), for the golden-data scripts and the
# benchmarks. Nothing of it is committed. Usage:
#   scripts/goldens/build-llama-cpp.sh [DIR]      (default /tmp/llcpp)
# Prints the directory of the built binaries and shared libraries.
set -eu
DIR=${1:-/tmp/llcpp}
VER=0.3.36
SRC="$DIR/llama_cpp_python-$VER"
mkdir -p "$DIR"
if [ ! -d "$SRC" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$DIR"
  tar -C "$DIR" -xzf "$DIR/llama_cpp_python-$VER.tar.gz"
fi
LL="$SRC/vendor/llama.cpp"
# GGML_NATIVE=ON asks the compiler for -march=native, which on a VM can name
# instruction sets the hypervisor does not grant (SIGILL at run time). Take
# them from what the kernel reports instead.
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
ISA="-DGGML_NATIVE=OFF -DGGML_SSE42=$(has sse4_2) -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2)
  -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c) -DGGML_BMI2=$(has bmi2)
  -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi)
  -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)
  -DGGML_AVX_VNNI=$(has avx_vnni)"
if [ ! -x "$LL/build/bin/llama-bench" ] || [ ! -x "$LL/build/bin/llama-server" ]; then
  cmake -S "$LL" -B "$LL/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF $ISA -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build "$LL/build" -j "$(nproc)" --target llama llama-bench llama-server llama-quantize >/dev/null
fi
python3 -m pip show diskcache >/dev/null 2>&1 || python3 -m pip install -q diskcache jinja2 typing-extensions numpy
echo "$LL/build/bin"
