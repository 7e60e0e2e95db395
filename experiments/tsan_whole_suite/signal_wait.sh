#!/usr/bin/env bash
# Builds signal_wait.cc with -fsanitize=thread and sends each way of waiting a
# SIGTERM; writes signal_wait.txt here. Usage: experiments/tsan_whole_suite/signal_wait.sh
set -euo pipefail
cd "$(dirname "$0")"
bin=$(mktemp)
g++ -std=c++17 -O1 -g -fsanitize=thread signal_wait.cc -o "$bin" -pthread
{
  echo "# experiments/tsan_whole_suite/signal_wait.sh, $(g++ --version | head -1), $(date -u +%F)"
  for wait in read poll; do
    "$bin" "$wait" >"$bin.out" 2>&1 &
    pid=$!
    sleep 1
    kill -TERM "$pid"
    sleep 3
    if kill -0 "$pid" 2>/dev/null; then
      echo "$wait: still waiting 3 s after SIGTERM (handler not run)"
      kill -KILL "$pid"
    else
      echo "$wait: $(cat "$bin.out")"
    fi
    wait "$pid" 2>/dev/null || true
  done
} >signal_wait.txt
rm -f "$bin" "$bin.out"
cat signal_wait.txt
