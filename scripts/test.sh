#!/usr/bin/env bash
# The README's test command: installs everything (scripts/setup.sh), builds,
# and runs the whole test suite with ctest. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${KVL_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" --timeout 900 "$@"
# The batch scheduler's concurrency test under ThreadSanitizer (its own build
# dir, build-tsan/; experiments/tsan_scheduler/README.md).
scripts/ci/tsan_check.sh
# The parser tests under ASan+UBSan, then every fuzz target for 30 s from its
# seeds (one clang build dir, build-fuzz/; docs/testing.md).
scripts/ci/asan_check.sh
scripts/ci/fuzz.sh --seconds 30
