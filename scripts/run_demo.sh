#!/usr/bin/env bash
# The README's main command: installs and builds (scripts/setup.sh), starts
# kvl-server on configs/server.json (the house models and translators), and
# runs a scripted multi-turn chat through the real gRPC API in which the
# cascade policy escalates mid-conversation; per turn it prints the model, the
# cache path and the TTFT next to what re-prefill costs for the same switch
# (a twin session with strategy reprefill), and the twin's answer where it
# differs from the translated session's. Then a stateless client of the
# OpenAI API (scripts/demo_openai.py) alternates the models over one
# conversation, each switch served by translation. Then stops the server with
# SIGTERM. KVL_SKIP_SETUP=1 skips scripts/setup.sh; KVL_BUILD_DIR, KVL_CONFIG,
# KVL_LISTEN, KVL_METRICS and KVL_HTTP override the defaults below
# (tests/tools/demo_test.cc).
#   scripts/run_demo.sh              # the Qwen3 house models (configs/server.json)
#   scripts/run_demo.sh --families   # three architectures: kvl-small (Qwen3),
#                                    # kvl-gemma (Gemma-3), kvl-moe (Qwen3-MoE),
#                                    # every turn switching (configs/families.json)
#   scripts/run_demo.sh --tokenizers # two tokenizers: kvl-small and kvl-small-t2,
#                                    # every turn switching (configs/tokenizers.json)
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT_CONFIG=configs/server.json
HOUSE_MODELS="kvl-small kvl-small-b kvl-large"
OPENAI_MODELS=kvl-small,kvl-large,kvl-small,kvl-large
POLICY=cascade
case "${1:-}" in
  "") ;;
  --families)
    DEFAULT_CONFIG=configs/families.json
    HOUSE_MODELS="kvl-small kvl-gemma kvl-moe"
    OPENAI_MODELS=kvl-small,kvl-gemma,kvl-moe,kvl-small
    POLICY=alternate ;;
  --tokenizers)
    DEFAULT_CONFIG=configs/tokenizers.json
    HOUSE_MODELS="kvl-small kvl-small-t2"
    OPENAI_MODELS=kvl-small,kvl-small-t2,kvl-small,kvl-small-t2
    POLICY=alternate ;;
  *) echo "usage: scripts/run_demo.sh [--families | --tokenizers]" >&2; exit 2 ;;
esac
[ "${KVL_SKIP_SETUP:-0}" = 1 ] || scripts/setup.sh
BUILD_DIR=${KVL_BUILD_DIR:-build}
CONFIG=${KVL_CONFIG:-$DEFAULT_CONFIG}
LISTEN=${KVL_LISTEN:-127.0.0.1:50051}
METRICS=${KVL_METRICS:-127.0.0.1:9464}
HTTP=${KVL_HTTP:-127.0.0.1:8000}

# The default configurations serve the house models; they are trained by
# scripts/train/train_house_models.sh and train_family_models.sh (and the
# translators by scripts/train/train_translators.sh).
for m in $HOUSE_MODELS; do
  if [ ! -f "models/$m/config.json" ] && [ "$CONFIG" = "$DEFAULT_CONFIG" ]; then
    echo "models/$m is missing: train the house models first (scripts/train/train_house_models.sh," >&2
    echo "train_family_models.sh), fit the translators listed in $CONFIG, or set KVL_CONFIG." >&2
    exit 1
  fi
done

# Python message classes for the demo client (Debian's protobuf runtime).
mkdir -p "$BUILD_DIR/python"
protoc --proto_path=proto --python_out="$BUILD_DIR/python" proto/kvlingo/v1/*.proto

log=$(mktemp)
"$BUILD_DIR/server/kvl-server" --config "$CONFIG" --listen "$LISTEN" \
  --metrics-address "$METRICS" --http-address "$HTTP" >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
  grep -q "listening on" "$log" && break
  if ! kill -0 "$server_pid" 2>/dev/null; then cat "$log"; echo "kvl-server failed to start" >&2; exit 1; fi
  sleep 0.1
done
cat "$log"
/usr/bin/python3 scripts/demo_client.py "$LISTEN" "$BUILD_DIR/python" "http://$METRICS/metrics" "$POLICY"
/usr/bin/python3 scripts/demo_openai.py "$HTTP" "$OPENAI_MODELS"
kill -TERM "$server_pid"
wait "$server_pid" && status=0 || status=$?
echo "kvl-server exited with status $status after SIGTERM"
trap - EXIT; rm -f "$log"
exit "$status"
