#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer, in
# the clang build dir of scripts/ci/fuzz.sh (build-fuzz/, git-ignored), with every
# process's reports collected (scripts/ci/sanitizer_suite.sh does the work).
#   scripts/ci/asan_suite.sh                  # build, then the whole suite
#   scripts/ci/asan_suite.sh -R RouterE2e     # extra arguments go to ctest
# Left out, each for its reason (docs/testing.md):
#   the Docker test: it builds an image from the build dir's binaries, and
#     the image's health checks and commands do not carry the sanitizer's
#     options or its report directory (the same binaries run here);
#   the soak test: its RSS bound is start-up RSS + cache budget + 192 MiB,
#     and ASan's shadow memory and quarantine are not in that budget.
# Not a CI step: the build and the run take about an hour on 2 cores.
exec "$(dirname "$0")/sanitizer_suite.sh" address "$@"
