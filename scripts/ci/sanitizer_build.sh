#!/usr/bin/env bash
# Configures (once) and builds targets of a sanitizer build dir:
#   scripts/ci/sanitizer_build.sh BUILD_DIR KIND NAME JOBS TARGET...
# KIND "thread": gcc, -DKVL_SANITIZE=thread (scripts/ci/tsan_check.sh).
# KIND "fuzz": clang 14, -DKVL_SANITIZE=address (ASan+UBSan) -DKVL_FUZZ=ON,
#   coverage instrumentation for libFuzzer in every TU, so that the fuzz
#   targets and the ASan tests come out of one build (scripts/ci/fuzz.sh,
#   scripts/ci/asan_check.sh).
# NAME prefixes the messages and the build log, BUILD_DIR/<NAME>_build.log; on
# failure its first errors are printed and the exit status is non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=$1 KIND=$2 NAME=$3 JOBS=$4
shift 4
case $KIND in
  thread) marker='KVL_SANITIZE:STRING=thread'
          configure=(cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
                     -DKVL_SANITIZE=thread -DKVL_BUILD_BENCH=OFF) ;;
  fuzz)   marker='KVL_FUZZ:BOOL=ON'
          configure=(env CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja
                     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-gline-tables-only
                     -DCMAKE_C_FLAGS=-gline-tables-only -DKVL_SANITIZE=address -DKVL_FUZZ=ON
                     -DKVL_BUILD_BENCH=OFF) ;;
  *) echo "sanitizer_build.sh: KIND must be thread or fuzz, got '$KIND'" >&2; exit 2 ;;
esac
# Configured means build.ninja exists (a failed configure leaves a cache but
# no build.ninja, and is run again).
if [[ ! -f "$BUILD/build.ninja" ]]; then
  mkdir -p "$BUILD"
  if ! "${configure[@]}" >"$BUILD/configure.log" 2>&1; then
    tail -30 "$BUILD/configure.log" >&2
    echo "$NAME: FAIL (configuring $BUILD; log $BUILD/configure.log)" >&2
    exit 1
  fi
elif ! grep -qx "$marker" "$BUILD/CMakeCache.txt"; then
  echo "$NAME: FAIL ($BUILD is configured without $marker; remove it or pick another directory)" >&2
  exit 2
fi
if ! ninja -C "$BUILD" -j"$JOBS" "$@" >"$BUILD/${NAME}_build.log" 2>&1; then
  grep -A30 '^FAILED' "$BUILD/${NAME}_build.log" | head -60 >&2 || tail -40 "$BUILD/${NAME}_build.log" >&2
  echo "$NAME: FAIL (building $*; log $BUILD/${NAME}_build.log)" >&2
  exit 1
fi
