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
if [ ! -x "$LL/build/bin/llama-bench" ] || [ ! -x "$LL/build/bin/llama-server" ]; then
  cmake -S "$LL" -B "$LL/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build "$LL/build" -j "$(nproc)" --target llama llama-bench llama-server llama-quantize >/dev/null
fi
python3 -m pip show diskcache >/dev/null 2>&1 || python3 -m pip install -q diskcache jinja2 typing-extensions numpy
echo "$LL/build/bin"
