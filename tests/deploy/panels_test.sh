#!/usr/bin/env bash
# Every query of the Grafana dashboard returns data from a real server: starts
# kvl-server (configs/server.json, the house models, with a small KV cache
# budget so that the demo evicts) and Prometheus scraping it every second, runs
# the demo conversation (scripts/demo_client.py: the cascade switches
# kvl-small -> kvl-large with translation, its twin session re-prefills), then
# sends every target expression of every panel of
# deploy/grafana/dashboards/kvlingo.json, with $model = .* and
# $__rate_interval = 5m, to Prometheus' /api/v1/query. A query fails when it
# returns no series, or only NaN (a quantile with no observations). Prometheus
# also loads deploy/prometheus/alerts.yml: every rule must evaluate without
# error on the real series. Everything listens on loopback, on free ports.
#   tests/deploy/panels_test.sh KVL_SERVER PROMETHEUS PYTHON3 PROTOC [--out FILE]
# PYTHON3 must have grpcio and protobuf (Debian's /usr/bin/python3).
# --out FILE also writes the report there (docs/results/dashboard_panels.txt).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

usage() { echo "usage: $0 KVL_SERVER PROMETHEUS PYTHON3 PROTOC [--out FILE]" >&2; exit 2; }
[[ $# -ge 4 ]] || usage
server_bin=$1 prometheus_bin=$2 python=$3 protoc=$4
shift 4
out=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) [[ $# -ge 2 ]] || usage; out=$2; shift 2 ;;
    *) usage ;;
  esac
done

fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in "$server_bin" "$prometheus_bin" "$python" "$protoc"; do
  [[ -x "$tool" ]] || fail "'$tool' is missing or not executable (scripts/setup.sh installs the tools)"
done
for m in kvl-small kvl-small-b kvl-large; do
  [[ -f "models/$m/config.json" ]] ||
    fail "models/$m is missing: train the house models first (scripts/train/train_house_models.sh)"
done
dashboard=deploy/grafana/dashboards/kvlingo.json
[[ -f "$dashboard" ]] || fail "no $dashboard"

# KV cache bytes for all sessions: less than the demo's two sessions (the main
# one and its re-prefilled twin) hold together, each with a kvl-small line
# (2 KiB/token in float32) and a kvl-large line (6 KiB/token) with capacity
# to spare, so that idle lines of the other session are evicted; more than one
# turn reserves, so that no turn is refused. The report shows the bytes held
# and the evictions.
BUDGET_BYTES=${KVL_PANELS_BUDGET_BYTES:-4194304}

tmp=$(mktemp -d)
server_pid="" prom_pid=""
stop() {  # pid: TERM, up to 10 s, then KILL
  local pid=$1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  stop "$prom_pid"
  stop "$server_pid"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }

echo "== kvl-server (cache budget $BUDGET_BYTES bytes)"
# A copy of configs/server.json: model paths made absolute (the copy is not
# next to models/), the cache budget small.
sed -e "s#\"\.\./models/#\"$ROOT/models/#g" \
    -e "s/\"memory_budget_bytes\": [0-9]*/\"memory_budget_bytes\": $BUDGET_BYTES/" \
    configs/server.json > "$tmp/server.json"
grep -q "\"memory_budget_bytes\": $BUDGET_BYTES," "$tmp/server.json" ||
  fail "configs/server.json has no sessions.memory_budget_bytes to replace"
grep -q '"\.\./models/' "$tmp/server.json" && fail "relative model paths left in the config copy"
mkdir -p "$tmp/python"
"$protoc" --proto_path=proto --python_out="$tmp/python" proto/kvlingo/v1/*.proto

"$server_bin" --config "$tmp/server.json" --listen 127.0.0.1:0 --metrics-address 127.0.0.1:0 \
  > "$tmp/server.out" 2> "$tmp/server.log" &
server_pid=$!
for _ in $(seq 1200); do  # 120 s: loading the models and translators
  grep -q "listening on" "$tmp/server.out" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log" >&2; fail "kvl-server exited"; }
  sleep 0.1
done
grep -q "listening on" "$tmp/server.out" || { tail -20 "$tmp/server.log" >&2; fail "kvl-server did not start in 120 s"; }
# "kvl-server listening on HOST:PORT, metrics on HOST:PORT"
grpc_addr=$(sed -n 's/.*listening on \([^,]*\),.*/\1/p' "$tmp/server.out")
metrics_addr=$(sed -n 's/.*metrics on \(.*\)$/\1/p' "$tmp/server.out")
echo "gRPC on $grpc_addr, metrics on $metrics_addr ($(elapsed))"

echo "== Prometheus"
prom_port=$(free_port)
prom_url="http://127.0.0.1:$prom_port"
cat > "$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $ROOT/deploy/prometheus/alerts.yml
scrape_configs:
  - job_name: kvlingo
    metrics_path: /metrics
    static_configs:
      - targets: ["$metrics_addr"]
EOF
"$prometheus_bin" --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$tmp/prometheus.log" 2>&1 &
prom_pid=$!

# Bounded waits on Prometheus, through its HTTP API.
wait_for() {  # seconds, python expression over the JSON of GET $prom_url$path, path
  local seconds=$1 cond=$2 path=$3
  "$python" - "$prom_url$path" "$cond" "$seconds" <<'PY'
import json, sys, time, urllib.request
url, cond, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
        if eval(cond, {"j": (json.loads(body) if body.startswith("{") else None), "body": body}):
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.5)
sys.exit(1)
PY
}
wait_for 60 'True' "/-/ready" || { tail -20 "$tmp/prometheus.log" >&2; fail "Prometheus not ready in 60 s"; }
# The demo's first turn must come after the first scrape, or rate() misses it.
wait_for 30 'any(s["value"][1] == "1" for s in j["data"]["result"])' \
  '/api/v1/query?query=up%7Bjob%3D%22kvlingo%22%7D' ||
  { tail -20 "$tmp/prometheus.log" >&2; fail "Prometheus did not scrape kvl-server in 30 s"; }
echo "Prometheus on $prom_url scrapes kvl-server ($(elapsed))"

echo "== the demo conversation"
timeout 150 "$python" scripts/demo_client.py "$grpc_addr" "$tmp/python" "http://$metrics_addr/metrics" \
  > "$tmp/demo.log" 2>&1 || { cat "$tmp/demo.log" >&2; tail -20 "$tmp/server.log" >&2; fail "the demo client failed"; }
grep -E '^ *turn  |^ +[0-9]+  ' "$tmp/demo.log" > "$tmp/turns.txt" || true
cat "$tmp/turns.txt"
grep -q " yes " "$tmp/demo.log" || fail "the demo made no switch"
echo "demo done ($(elapsed)); waiting for 3 more scrapes"
sleep 3

echo "== dashboard queries"
report="$tmp/report.txt"
{
  echo "# tests/deploy/panels_test.sh, $(date -u '+%F %H:%M UTC'), commit" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown), cache budget $BUDGET_BYTES bytes"
  echo "# the demo's turns (scripts/demo_client.py; TTFT ms, then its re-prefilled twin's):"
  sed 's/^/#   /' "$tmp/turns.txt"
} > "$report"
"$python" - "$prom_url" "$dashboard" deploy/prometheus/alerts.yml >> "$report" <<'PY' && ok=1 || ok=0
import json, math, sys, urllib.parse, urllib.request
prom, dashboard_path, alerts_path = sys.argv[1:4]

def get(path, **params):
    url = prom + path + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.loads(r.read().decode())
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]

def substitute(expr):
    # Grafana's variables: $model (All = .*), the interval ones.
    return (expr.replace("${model}", ".*").replace("$model", ".*")
                .replace("$__rate_interval", "5m").replace("$__interval", "15s")
                .replace("$__range", "5m"))

dashboard = json.load(open(dashboard_path))
failures = 0
checked = 0
print(f"# {dashboard_path}: every panel's queries against a server that ran scripts/demo_client.py")
print("# ($model = .*, $__rate_interval = 5m): N series (M with a value, not NaN; the largest)")

for var in dashboard.get("templating", {}).get("list", []):
    definition = var.get("definition", "")
    if not definition.startswith("label_values("):
        continue
    metric, label = [a.strip() for a in definition[len("label_values("):-1].split(",")]
    values = get(f"/api/v1/label/{label}/values", **{"match[]": metric})
    checked += 1
    status = "OK" if values else "FAIL"
    failures += not values
    print(f"{status} variable ${var['name']}: {definition} -> {', '.join(values) or 'nothing'}")

def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))  # panels inside collapsed rows

for panel in panels(dashboard["panels"]):
    for target in panel.get("targets", []):
        expr = target["expr"]
        result = get("/api/v1/query", query=substitute(expr))
        series = result["result"] if result["resultType"] == "vector" else []
        with_value = [s for s in series if not math.isnan(float(s["value"][1]))]
        checked += 1
        ok = bool(with_value)
        failures += not ok
        top = max((float(s["value"][1]) for s in with_value), default=float("nan"))
        print(f"{'OK' if ok else 'FAIL'} {panel['title']}: {expr} -> {len(series)} series"
              f" ({len(with_value)} with a value, max {top:.4g})")

# The alert rules, evaluated by this Prometheus on the real series.
groups = get("/api/v1/rules", type="alert")["groups"]
rules = [r for g in groups for r in g["rules"]]
for r in rules:
    checked += 1
    ok = r.get("health") == "ok"
    failures += not ok
    print(f"{'OK' if ok else 'FAIL'} alert rule {r['name']}: health {r.get('health')}"
          f"{', ' + r['lastError'] if r.get('lastError') else ''}, state {r.get('state')}")
if not rules:
    failures += 1
    print(f"FAIL no alert rules loaded from {alerts_path}")

print(f"{checked - failures} of {checked} checks returned data, {failures} failed")
sys.exit(1 if failures else 0)
PY
cat "$report"
if [[ -n "$out" ]]; then
  cp "$report" "$out"
  echo "report written to $out"
fi
[[ $ok == 1 ]] || fail "some dashboard queries returned no data ($(elapsed))"
echo "PASS ($(elapsed))"
