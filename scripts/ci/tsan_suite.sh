#!/usr/bin/env bash
# The whole test suite under ThreadSanitizer, in the gcc TSan build dir of
# scripts/ci/tsan_check.sh (build-tsan/, git-ignored), with every process's
# reports collected (scripts/ci/sanitizer_suite.sh does the work).
#   scripts/ci/tsan_suite.sh                  # build, then the whole suite
#   scripts/ci/tsan_suite.sh -R RouterE2e     # extra arguments go to ctest
# Suppressions (tests/tsan.supp) name third-party libraries only, each with its
# reason. Our code synchronises with the standard library, which TSan sees;
# what Debian's uninstrumented Abseil and gRPC do to order their threads
# (absl::Mutex, gRPC's completion tags) base/tsan/hidden_sync.cc shows TSan
# (docs/testing.md, "ThreadSanitizer").
# Left out, each for its reason (docs/testing.md):
#   the Docker test: it packs the build dir's binaries into an image whose
#     commands do not carry the sanitizer's options or report directory;
#   the soak test: its RSS bound does not count TSan's shadow memory (5-8x
#     the application's).
# Not a CI step (CI runs scripts/ci/tsan_check.sh): the build alone takes about
# 35 minutes on 2 cores.
exec "$(dirname "$0")/sanitizer_suite.sh" thread "$@"
