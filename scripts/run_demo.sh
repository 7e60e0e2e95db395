#!/usr/bin/env bash
# The README's main command: installs and builds (scripts/setup.sh), starts
# kvl-server on configs/server.json, and drives it through the real gRPC API
# with a Python client, then stops it with SIGTERM.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${KVL_BUILD_DIR:-build}
CONFIG=${KVL_CONFIG:-configs/server.json}
LISTEN=${KVL_LISTEN:-127.0.0.1:50051}
METRICS=${KVL_METRICS:-127.0.0.1:9464}

# Python message classes for the demo client (Debian's protobuf runtime).
mkdir -p "$BUILD_DIR/python"
protoc --proto_path=proto --python_out="$BUILD_DIR/python" proto/kvlingo/v1/*.proto

log=$(mktemp)
"$BUILD_DIR/server/kvl-server" --config "$CONFIG" --listen "$LISTEN" \
  --metrics-address "$METRICS" >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
  grep -q "listening on" "$log" && break
  if ! kill -0 "$server_pid" 2>/dev/null; then cat "$log"; echo "kvl-server failed to start" >&2; exit 1; fi
  sleep 0.1
done
cat "$log"
/usr/bin/python3 scripts/demo_client.py "$LISTEN" "$BUILD_DIR/python" "http://$METRICS/metrics"
kill -TERM "$server_pid"
wait "$server_pid" && status=0 || status=$?
echo "kvl-server exited with status $status after SIGTERM"
trap - EXIT; rm -f "$log"
exit "$status"
