#!/usr/bin/env bash
# A private Docker daemon for kvlingo's container tests, offline, and the base
# image they build on, made without any registry.
#   scripts/ci/docker_daemon.sh start DIR    starts dockerd (socket DIR/docker.sock) unless
#                                         one already answers there; prints the DOCKER_HOST
#   scripts/ci/docker_daemon.sh base DIR     imports local/debian:12 (debootstrap --variant=minbase
#                                         bookworm from the machine's Debian mirror; the
#                                         tarball is cached as DIR/debian-12-minbase.tar)
#   scripts/ci/docker_daemon.sh stop DIR     stops the daemon this script started there
# The daemon runs as root with --iptables=false --bridge=none: containers use
# the host's network (docker build/run --network=host). Images and layers are
# kept in DIR/data between runs.
set -euo pipefail
cmd=${1:?usage: docker_daemon.sh start|base|stop DIR}
dir=${2:?usage: docker_daemon.sh start|base|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sock="$dir/docker.sock"
# containerd's shim sockets live under the exec root, and a socket path has a
# 108-byte limit: the exec root gets a short path of its own.
exec_root="/run/kvl-docker-$(printf '%s' "$dir" | md5sum | cut -c1-8)"
export DOCKER_HOST="unix://$sock"
docker_cli=/usr/bin/docker   # Debian's CLI, the daemon's own version

answers() { "$docker_cli" info >/dev/null 2>&1; }

case "$cmd" in
  start)
    if answers; then echo "$DOCKER_HOST"; exit 0; fi
    command -v dockerd >/dev/null || { echo "docker_daemon: dockerd not found (scripts/setup.sh installs docker.io)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "docker_daemon: dockerd must run as root" >&2; exit 1; }
    driver=overlay2
    for attempt in 1 2; do
      rm -f "$sock"
      dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver="$driver" \
        --data-root "$dir/data-$driver" --exec-root "$exec_root" --pidfile "$dir/dockerd.pid" \
        -H "$DOCKER_HOST" >"$dir/dockerd.log" 2>&1 &
      for _ in $(seq 1 60); do
        answers && { echo "$DOCKER_HOST"; exit 0; }
        kill -0 $! 2>/dev/null || break
        sleep 0.5
      done
      kill $! 2>/dev/null || true
      wait $! 2>/dev/null || true
      echo "docker_daemon: dockerd with $driver did not start (tail of $dir/dockerd.log):" >&2
      tail -5 "$dir/dockerd.log" >&2
      driver=vfs   # no overlay mounts inside some sandboxes
    done
    exit 1
    ;;
  base)
    answers || { echo "docker_daemon: no daemon at $DOCKER_HOST (start it first)" >&2; exit 1; }
    if "$docker_cli" image inspect local/debian:12 >/dev/null 2>&1; then exit 0; fi
    tarball="$dir/debian-12-minbase.tar"
    if [ ! -s "$tarball" ]; then
      # The Debian archive among the sources apt reads (not third-party
      # repositories, nor files apt ignores such as *.disabled).
      sources=()
      for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && sources+=("$f")
      done
      mirror=""
      if [ ${#sources[@]} -gt 0 ]; then
        mirror=$(grep -hoE '^(deb|URIs:) +(\[[^]]*\] +)?https?://[^ ]+' "${sources[@]}" 2>/dev/null |
                   grep -oE 'https?://[^ ]+' | grep -E '/debian/?$' | head -1 || true)
      fi
      mirror=${mirror:-http://deb.debian.org/debian}
      rootfs="$dir/rootfs"
      rm -rf "$rootfs"
      echo "docker_daemon: debootstrap bookworm from $mirror (about a minute)" >&2
      debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1 ||
        { tail -5 "$dir/debootstrap.log" >&2; exit 1; }
      tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
      rm -rf "$rootfs"
    fi
    "$docker_cli" import "$tarball" local/debian:12 >/dev/null
    ;;
  stop)
    [ -f "$dir/dockerd.pid" ] || exit 0
    pid=$(cat "$dir/dockerd.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    umount "$exec_root/netns/default" 2>/dev/null || true
    rm -f "$dir/dockerd.pid"
    ;;
  *) echo "usage: docker_daemon.sh start|base|stop DIR" >&2; exit 2 ;;
esac
