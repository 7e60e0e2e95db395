#!/usr/bin/env bash
# The CPU image and the compose stack, built and run (issue 37):
#   tests/deploy/docker_test.sh BUILD_DIR [--from-source] [--out FILE]
# 1. a private Docker daemon and the base image local/debian:12 made by
#    debootstrap (scripts/ci/docker_daemon.sh; nothing is pulled from a registry);
# 2. deploy/Dockerfile.cpu's runtime stage with the binaries BUILD_DIR holds
#    (deploy/Dockerfile.cpu's runtime-base stage, then the binaries copied in):
#    non-root, no build or test tools inside, OpenBLAS;
#    with --from-source, the whole multi-stage build instead (the build stage
#    compiles kvl-server and kvl from the repository: ~30 min on 2 cores, so CI
#    runs the other form; docs/results/docker_from_source.txt is the last
#    run of this one);
# 3. the container with the repository's models/ mounted at /models: healthy
#    through `kvl health`, a chat turn with a translated switch answered on its
#    port, /metrics scraped, SIGTERM drains and it exits 0;
# 4. a container without models exits 2 naming the missing directory, and one
#    on a port in use exits 1 saying so;
# 5. deploy/docker-compose.yml (kvl-server and Prometheus, the latter built
#    from the same base with Debian's prometheus) brought up by docker-compose
#    with host networking, Prometheus scraping the server.
# Containers use the host's network (the daemon runs without iptables or a
# bridge), on free loopback ports. Everything started is removed on exit; the
# daemon is stopped if this script started it. KVL_DOCKER_DIR (default
# /var/tmp/kvl-docker) keeps the daemon's images between runs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=$(cd "${1:?usage: docker_test.sh BUILD_DIR [--from-source] [--out FILE]}" && pwd)
shift
out="" from_source=0
while [ $# -gt 0 ]; do
  case "$1" in
    --from-source) from_source=1; shift ;;
    --out) out=${2:?--out FILE}; shift 2 ;;
    *) echo "docker_test: unknown argument $1" >&2; exit 2 ;;
  esac
done
docker_dir=${KVL_DOCKER_DIR:-/var/tmp/kvl-docker}
docker=/usr/bin/docker
compose=$(command -v docker-compose) || { echo "FAIL: docker-compose not found (scripts/setup.sh installs it)" >&2; exit 1; }
export DOCKER_BUILDKIT=0 COMPOSE_DOCKER_CLI_BUILD=0   # the classic builder: Debian's daemon has no buildx
tag=kvlingo:test
start=$(date +%s)
log() { printf '[%4ds] %s\n' $(( $(date +%s) - start )) "$*" | tee -a "$work/summary.txt"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

work=$(mktemp -d)
started_daemon=0
containers=()
compose_project=""
cleanup() {
  set +e
  for c in "${containers[@]}"; do "$docker" rm -f "$c" >/dev/null 2>&1; done
  [ -n "$compose_project" ] && compose_cmd down --volumes >/dev/null 2>&1
  [ "$started_daemon" = 1 ] && "$repo/scripts/ci/docker_daemon.sh" stop "$docker_dir"
  rm -rf "$work"
}
trap cleanup EXIT

# 1. Daemon and base image.
[ -S "$docker_dir/docker.sock" ] && DOCKER_HOST="unix://$docker_dir/docker.sock" "$docker" info >/dev/null 2>&1 || started_daemon=1
export DOCKER_HOST
DOCKER_HOST=$("$repo/scripts/ci/docker_daemon.sh" start "$docker_dir") || fail "the Docker daemon did not start"
"$repo/scripts/ci/docker_daemon.sh" base "$docker_dir" || fail "no base image"
log "daemon at $DOCKER_HOST, base image local/debian:12"

# 2. The runtime image: this build's binaries in the runtime stage, or the
# whole multi-stage build.
if [ "$from_source" = 1 ]; then
  tag=kvlingo:cpu-from-source
  "$docker" build --force-rm --network=host --build-arg BASE_IMAGE=local/debian:12 \
    -t "$tag" -f "$repo/deploy/Dockerfile.cpu" "$repo" >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; fail "docker build (from source)"; }
  log "image $tag built from the sources (all stages)"
else
  ctx="$work/context"
  mkdir -p "$ctx/bin" "$ctx/deploy/docker"
  cp "$build_dir/server/kvl-server" "$build_dir/tools/kvl" "$ctx/bin/"
  strip "$ctx/bin/kvl-server" "$ctx/bin/kvl"
  cp "$repo/deploy/docker/server.json" "$ctx/deploy/docker/"
  "$docker" build -q --force-rm --network=host --build-arg BASE_IMAGE=local/debian:12 \
    --target runtime-base -t kvlingo-runtime-base:test -f "$repo/deploy/Dockerfile.cpu" "$ctx" \
    >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; fail "docker build (runtime-base)"; }
  printf 'FROM kvlingo-runtime-base:test\nCOPY bin/kvl-server bin/kvl /usr/local/bin/\n' |
    "$docker" build -q --force-rm -t "$tag" -f - "$ctx" >>"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log"; fail "docker build (binaries)"; }
fi
user=$("$docker" image inspect -f '{{.Config.User}}' "$tag")
[ "$user" = kvlingo ] || fail "the image runs as '$user', not kvlingo"
"$docker" run --rm --network=host --entrypoint sh "$tag" -c '
  for tool in node npm gnuplot cmake g++ gcc ninja protoc curl python3; do
    command -v "$tool" >/dev/null && { echo "$tool is in the runtime image"; exit 1; }
  done
  case "$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3)" in *openblas*) ;; *) echo "BLAS is not OpenBLAS"; exit 1;; esac
  /usr/local/bin/kvl-server --help >/dev/null' || fail "runtime image contents"
size=$("$docker" image inspect -f '{{.Size}}' "$tag")
log "image $tag built: user kvlingo, $((size / 1024 / 1024)) MiB, no build or test tools, OpenBLAS"

# 3. A container serving the house models.
grpc_port=$(free_port); metrics_port=$(free_port)
name="kvl-test-$$"
containers+=("$name")
"$docker" run -d --name "$name" --init --network=host -v "$repo/models:/models:ro" \
  -e KVL_HEALTH_SERVER="127.0.0.1:$grpc_port" --health-interval 1s --health-start-period 60s \
  "$tag" --listen "127.0.0.1:$grpc_port" \
  --metrics-address "127.0.0.1:$metrics_port" >/dev/null
health=""
for _ in $(seq 1 120); do
  health=$("$docker" inspect -f '{{.State.Health.Status}}' "$name" 2>/dev/null || echo gone)
  [ "$health" = healthy ] && break
  [ "$("$docker" inspect -f '{{.State.Running}}' "$name")" = true ] || break
  sleep 1
done
[ "$health" = healthy ] || { "$docker" logs "$name" 2>&1 | tail -20; fail "the container is $health, not healthy"; }
log "container healthy (kvl health through grpc.health.v1 on 127.0.0.1:$grpc_port)"

# The first turn is longer than routing.native_tail_tokens (32), so that the
# switch translates the tokens before the tail.
printf '/model kvl-small\nMy name is Ada. I live in Lisbon, I work as a baker, my sister is Eva, she lives in Porto, and our cat is called Miso. Please remember all of this.\n/model kvl-large\nWhere do I live?\n/quit\n' |
  timeout 120 "$build_dir/tools/kvl" chat --server "127.0.0.1:$grpc_port" --max-tokens 12 \
    >"$work/chat.out" 2>"$work/chat.err" || { cat "$work/chat.err"; fail "kvl chat"; }
grep -q "translated cache" "$work/chat.err" || { cat "$work/chat.err"; fail "no translated switch"; }
log "chat through the container: $(grep -o '\[kvl-large[^]]*\]' "$work/chat.err" | head -1)"
metrics=$(curl -fsS "http://127.0.0.1:$metrics_port/metrics") || fail "GET /metrics"
grep -q '^kvlingo_up 1' <<<"$metrics" || fail "kvlingo_up is not 1"
grep -E '^kvlingo_switches_total\{.*strategy="translate".*\} [1-9]' <<<"$metrics" >/dev/null ||
  fail "no translated switch counted in /metrics"
log "/metrics: kvlingo_up 1, $(grep -c '^kvlingo_' <<<"$metrics") kvlingo series, translated switch counted"

"$docker" stop --time 40 "$name" >/dev/null
code=$("$docker" inspect -f '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { "$docker" logs "$name" 2>&1 | tail -20; fail "exit code $code after SIGTERM"; }
# The log driver copies the container's output after the process is gone; the
# last lines can reach `docker logs` a moment after `docker stop` returns.
drained=0
for _ in $(seq 1 20); do
  "$docker" logs "$name" 2>&1 | grep -qi "draining" && { drained=1; break; }
  sleep 0.5
done
[ "$drained" = 1 ] || { "$docker" logs "$name" 2>&1 | tail -20; fail "no shutdown in the container's log"; }
log "SIGTERM: drained, exit code 0"

# 4. Bad deployment input.
set +e
"$docker" run --rm --network=host "$tag" --listen "127.0.0.1:$(free_port)" \
  --metrics-address "127.0.0.1:$(free_port)" >"$work/nomodels.log" 2>&1
code=$?
set -e
[ "$code" = 2 ] && grep -q "/models/kvl-small" "$work/nomodels.log" ||
  { cat "$work/nomodels.log"; fail "without models: exit $code"; }
log "without /models: exit 2: $(grep -m1 '/models/kvl-small' "$work/nomodels.log" | cut -c1-160)"
busy_port=$(free_port)
/usr/bin/python3 -c 'import socket,sys,time; s=socket.socket(); s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen(); time.sleep(120)' "$busy_port" &
holder=$!
sleep 0.5
set +e
"$docker" run --rm --network=host -v "$repo/models:/models:ro" "$tag" --listen "127.0.0.1:$busy_port" \
  --metrics-address "127.0.0.1:$(free_port)" >"$work/busy.log" 2>&1
code=$?
set -e
kill "$holder" 2>/dev/null || true
[ "$code" = 1 ] && grep -q "cannot listen on 127.0.0.1:$busy_port (address in use?)" "$work/busy.log" ||
  { tail -5 "$work/busy.log"; fail "port in use: exit $code"; }
log "port in use: exit 1: $(grep -m1 '^kvl-server: cannot listen' "$work/busy.log")"

# 5. The compose stack as shipped (its network, Prometheus' scrape of
# kvl-server:9464, the alert rules), with this run's image, on free ports.
# Grafana is pulled from a registry, which these machines cannot reach.
compose_project="kvltest$$"
export KVL_BASE_IMAGE=local/debian:12 KVL_GRPC_PORT=$(free_port) KVL_METRICS_PORT=$(free_port) \
  KVL_PROMETHEUS_PORT=$(free_port)
cat >"$work/compose.test.yml" <<YAML
services:
  kvl-server:
    image: $tag
  prometheus:
    image: kvlingo-prometheus:test
    build:
      network: host   # apt-get inside the build; this daemon's bridge has no route out
YAML
compose_cmd() { (cd "$work" && "$compose" -p "$compose_project" -f "$repo/deploy/docker-compose.yml" -f compose.test.yml "$@"); }
compose_cmd build --force-rm prometheus >"$work/compose-build.log" 2>&1 || { tail -20 "$work/compose-build.log"; fail "compose build"; }
compose_cmd up -d --no-build kvl-server prometheus >"$work/compose-up.log" 2>&1 ||
  { tail -20 "$work/compose-up.log"; fail "compose up"; }
query() {  # the first value of an instant query, "" when none
  curl -fsS "http://127.0.0.1:$KVL_PROMETHEUS_PORT/api/v1/query" --data-urlencode "query=$1" 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null || true
}
up=""
for _ in $(seq 1 120); do
  up=$(query 'kvlingo_up{job="kvlingo"}')
  [ "$up" = 1 ] && break
  sleep 1
done
[ "$up" = 1 ] || { compose_cmd logs --tail 20; fail "Prometheus did not scrape kvlingo_up 1 from kvl-server:9464"; }
rules=$(curl -fsS "http://127.0.0.1:$KVL_PROMETHEUS_PORT/api/v1/rules" |
        /usr/bin/python3 -c 'import json,sys; print(sum(len(g["rules"]) for g in json.load(sys.stdin)["data"]["groups"]))')
[ "$rules" -gt 0 ] || fail "Prometheus loaded no alert rules"
health=""
for _ in $(seq 1 60); do
  health=$("$docker" inspect -f '{{.State.Health.Status}}' "${compose_project}_kvl-server_1" 2>/dev/null || true)
  [ "$health" = healthy ] && break
  sleep 1
done
[ "$health" = healthy ] || fail "the compose kvl-server is '$health', not healthy"
printf 'Hello!\n/quit\n' | timeout 60 "$build_dir/tools/kvl" chat --server "127.0.0.1:$KVL_GRPC_PORT" \
  --max-tokens 4 >/dev/null 2>"$work/compose-chat.err" || { cat "$work/compose-chat.err"; fail "chat through the compose port"; }
log "compose: kvl-server healthy and answering on its published port; Prometheus scraped kvl-server:9464 (kvlingo_up 1) and loaded $rules alert rules"

summary="docker_test: PASS in $(( $(date +%s) - start )) s (image $((size / 1024 / 1024)) MiB)"
echo "$summary"
if [ -n "$out" ]; then
  { echo "# bash tests/deploy/docker_test.sh build$([ "$from_source" = 1 ] && echo ' --from-source') --out $out ($(date -u +%Y-%m-%dT%H:%MZ))"
    cat "$work/summary.txt"; echo "$summary"; } >"$out"
fi
