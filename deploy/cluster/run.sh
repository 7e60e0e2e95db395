#!/usr/bin/env bash
# A local kvlingo cluster on loopback: one Redis (the session store, with an
# append-only file synced before each answer, so that an acknowledged turn
# survives a crash of Redis too), N kvl-server replicas on it, and nginx in front as the gRPC
# load balancer (consistent hashing on the x-kvl-session-id header, passive
# health checks, a dead replica's calls retried on the next one).
#
#   deploy/cluster/run.sh up --replicas 2 --dir /tmp/kvl-cluster [--config FILE]
#   deploy/cluster/run.sh down --dir /tmp/kvl-cluster
#
# `up` picks free ports, starts everything in the background, waits until each
# replica listens, and writes DIR/cluster.env:
#   GRPC_ADDR=host:port          nginx: what gRPC clients use
#   HTTP_ADDR=host:port          nginx: the replicas' OpenAI API (docs/openai-api.md),
#                                by the X-Kvl-Affinity header's consistent hash
#   REDIS_ADDR=host:port  REDIS_PID=
#   REPLICA_<i>_ADDR=  REPLICA_<i>_PID=  METRICS_<i>_ADDR=   i = 1..N
#   NGINX_PID=  REPLICAS=N
# Logs: DIR/redis.log, DIR/replica-<i>.log, DIR/nginx-error.log. `down` stops
# what `up` started (replicas with SIGTERM, so they drain), by the pids in
# cluster.env. The config defaults to configs/server.json (the house models);
# the replicas override its addresses and session store.
# Environment: KVL_BUILD_DIR (build), KVL_SERVER_BIN (its kvl-server).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

usage() {
  echo "usage: $0 up --replicas N --dir DIR [--config FILE] | down --dir DIR" >&2
  exit 2
}

cmd=${1:-}
[[ -n "$cmd" ]] || usage
shift
replicas=2 dir="" config="$ROOT/configs/server.json"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --replicas) replicas=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n "$dir" ]] || usage

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Whether pid runs. Everything `up` starts outlives it, and so is an orphan
# that only init reaps: a process that exited stays a zombie (state Z), which
# kill -0 still finds, until init gets to it (seconds, on some machines).
running() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $state != Z* ]]
}

stop_pid() {  # pid signal seconds
  local pid=$1 sig=$2 wait_s=$3
  [[ -n "$pid" ]] && running "$pid" || return 0
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq $((wait_s * 10))); do
    running "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

down() {
  local env="$dir/cluster.env"
  [[ -f "$env" ]] || { echo "cluster: no $env (nothing started there)" >&2; exit 1; }
  # shellcheck disable=SC1090
  source "$env"
  stop_pid "${NGINX_PID:-}" QUIT 10
  for i in $(seq "${REPLICAS:-0}"); do
    local var="REPLICA_${i}_PID"
    stop_pid "${!var:-}" TERM 40
  done
  stop_pid "${REDIS_PID:-}" TERM 10
  rm -f "$env"
  echo "cluster: stopped (nginx, ${REPLICAS:-0} replica(s), redis) in $dir"
}

up() {
  [[ "$replicas" =~ ^[1-9][0-9]*$ ]] || { echo "cluster: --replicas must be a positive integer" >&2; exit 2; }
  [[ -f "$config" ]] || { echo "cluster: no config file $config" >&2; exit 2; }
  local bin=${KVL_SERVER_BIN:-$ROOT/${KVL_BUILD_DIR:-build}/server/kvl-server}
  [[ -x "$bin" ]] || { echo "cluster: no kvl-server at $bin (build it: scripts/setup.sh)" >&2; exit 2; }
  local redis_server nginx
  redis_server=$(command -v redis-server || echo /usr/bin/redis-server)
  nginx=$(command -v nginx || echo /usr/sbin/nginx)
  for tool in "$redis_server" "$nginx"; do
    [[ -x "$tool" ]] ||
      { echo "cluster: $(basename "$tool") is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
  done
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [[ -f "$dir/cluster.env" ]] && grep -q . "$dir/cluster.env"; then
    echo "cluster: $dir/cluster.env exists: run '$0 down --dir $dir' first" >&2
    exit 1
  fi
  local env="$dir/cluster.env"
  : > "$env"
  # Anything already started is stopped if a later step fails.
  trap 'echo "cluster: start-up failed; stopping what started" >&2; down >/dev/null 2>&1 || true; rm -f "$env"' ERR

  local redis_port
  redis_port=$(free_port)
  # A reused directory keeps its data (appendonly.aof), not its logs or pids.
  rm -f "$dir/redis.log" "$dir/redis.pid" "$dir/nginx.pid" "$dir/nginx-error.log"
  "$redis_server" --port "$redis_port" --bind 127.0.0.1 --dir "$dir" --appendonly yes \
    --appendfsync always --save "" --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 100); do [[ -s "$dir/redis.pid" ]] && break; sleep 0.1; done
  {
    echo "REDIS_ADDR=127.0.0.1:$redis_port"
    echo "REDIS_PID=$(cat "$dir/redis.pid" 2>/dev/null)"
    echo "REPLICAS=$replicas"
  } >> "$env"
  # Ready once it has loaded its append-only file.
  for _ in $(seq 300); do
    grep -q "Ready to accept connections" "$dir/redis.log" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "Ready to accept connections" "$dir/redis.log" ||
    { cat "$dir/redis.log" >&2; echo "cluster: redis did not start" >&2; false; }

  local upstreams="" http_upstreams=""
  for i in $(seq "$replicas"); do
    local port http_port log="$dir/replica-$i.log"
    port=$(free_port)
    http_port=$(free_port)
    OMP_WAIT_POLICY=PASSIVE setsid "$bin" --config "$config" --listen "127.0.0.1:$port" \
      --metrics-address 127.0.0.1:0 --http-address "127.0.0.1:$http_port" \
      --redis "127.0.0.1:$redis_port" > "$dir/replica-$i.out" 2> "$log" &
    local pid=$!
    echo "REPLICA_${i}_PID=$pid" >> "$env"
    for _ in $(seq 600); do
      grep -q "listening on" "$dir/replica-$i.out" 2>/dev/null && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    local line
    line=$(grep "listening on" "$dir/replica-$i.out" || true)
    if [[ -z "$line" ]]; then
      # Say how it ended: still starting after 60 s, or its exit status (a
      # signal shows as 128 + its number), with both of its outputs.
      local how="still not listening after 60 s"
      if ! kill -0 "$pid" 2>/dev/null; then
        local rc=0
        wait "$pid" || rc=$?
        how="exited with status $rc"
      fi
      tail -n 20 "$dir/replica-$i.out" "$log" >&2
      echo "cluster: replica $i did not start ($how)" >&2
      false
    fi
    echo "REPLICA_${i}_ADDR=127.0.0.1:$port" >> "$env"
    echo "METRICS_${i}_ADDR=${line##*metrics on }" >> "$env"
    upstreams+="    server 127.0.0.1:$port max_fails=1 fail_timeout=10s;"$'\n'
    http_upstreams+="    server 127.0.0.1:$http_port max_fails=1 fail_timeout=10s;"$'\n'
  done

  local grpc_port front_http_port
  grpc_port=$(free_port)
  front_http_port=$(free_port)
  mkdir -p "$dir/nginx-temp"
  cat > "$dir/nginx.conf" <<EOF
# Written by deploy/cluster/run.sh: the gRPC front of a local kvlingo cluster.
daemon on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/nginx-error.log warn;
$( [[ $(id -u) = 0 ]] && echo "user root;" || true )
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/nginx-temp/body;
  proxy_temp_path $dir/nginx-temp/proxy;
  fastcgi_temp_path $dir/nginx-temp/fastcgi;
  uwsgi_temp_path $dir/nginx-temp/uwsgi;
  scgi_temp_path $dir/nginx-temp/scgi;
  upstream kvl_replicas {
    # A session's calls go to one replica (its KV cache lives there); when that
    # replica fails, to the next one on the ring, which restores the session
    # from Redis.
    hash \$http_x_kvl_session_id consistent;
$upstreams  }
  server {
    listen 127.0.0.1:$grpc_port http2;
    location / {
      grpc_pass grpc://kvl_replicas;
      # A replica that refuses the connection or fails before answering is
      # skipped for 10 s and the call goes to the next one. Chat calls are
      # safe to retry: kvlingo commits a turn once per request id.
      grpc_next_upstream error timeout non_idempotent;
      grpc_next_upstream_tries 2;
      grpc_connect_timeout 2s;
      grpc_read_timeout 600s;
      grpc_send_timeout 600s;
      # When no replica answers, a gRPC status instead of nginx's HTML page.
      error_page 502 503 504 = /kvl-unavailable;
    }
    location = /kvl-unavailable {
      internal;
      default_type application/grpc;
      add_header grpc-status 14 always;
      add_header grpc-message "no kvl-server replica answered (deploy/cluster nginx)" always;
      return 204;
    }
  }
  # The OpenAI API. Stateless clients carry no session id: a client that
  # sends X-Kvl-Affinity (a conversation or user id) keeps its conversations
  # on one replica, where the prefix cache holds them; without it, requests
  # spread over the replicas (and may prefill).
  map \$http_x_kvl_affinity \$kvl_affinity {
    "" \$request_id;
    default \$http_x_kvl_affinity;
  }
  upstream kvl_http {
    hash \$kvl_affinity consistent;
$http_upstreams  }
  server {
    listen 127.0.0.1:$front_http_port;
    location / {
      proxy_pass http://kvl_http;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # Server-sent events pass as they come.
      proxy_buffering off;
      proxy_read_timeout 600s;
      # A replica that refuses the connection is skipped; a request a replica
      # has taken is not sent twice.
      proxy_next_upstream error timeout;
      proxy_connect_timeout 2s;
    }
  }
}
EOF
  "$nginx" -p "$dir" -c "$dir/nginx.conf" -e "$dir/nginx-error.log"
  for _ in $(seq 50); do [[ -s "$dir/nginx.pid" ]] && break; sleep 0.1; done
  [[ -s "$dir/nginx.pid" ]] || { cat "$dir/nginx-error.log" >&2; echo "cluster: nginx did not start" >&2; false; }
  {
    echo "NGINX_PID=$(cat "$dir/nginx.pid")"
    echo "GRPC_ADDR=127.0.0.1:$grpc_port"
    echo "HTTP_ADDR=127.0.0.1:$front_http_port"
  } >> "$env"
  trap - ERR
  echo "cluster: up in $dir: nginx on 127.0.0.1:$grpc_port (gRPC) and 127.0.0.1:$front_http_port (OpenAI API), $replicas replica(s), redis on 127.0.0.1:$redis_port"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) usage ;;
esac
