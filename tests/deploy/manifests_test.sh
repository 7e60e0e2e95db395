#!/usr/bin/env bash
# The cluster's deployment files are valid: deploy/k8s/*.yaml against the
# Kubernetes API schemas (tests/deploy/validate_k8s.mjs, kubernetes-models from
# npm), deploy/cluster/docker-compose.yml and deploy/docker-compose.yml by
# docker-compose's own schema (`config -q`). Each validator is also shown to
# refuse a broken copy, so that a pass means something.
#   tests/deploy/manifests_test.sh NODE DOCKER_COMPOSE
set -euo pipefail
cd "$(dirname "$0")/../.."
node=$1 compose=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== Kubernetes manifests"
"$node" tests/deploy/validate_k8s.mjs tools/npm deploy/k8s/*.yaml
sed 's/containerPort: 9464/containerPort: "metrics"/' deploy/k8s/kvlingo.yaml > "$tmp/bad.yaml"
if "$node" tests/deploy/validate_k8s.mjs tools/npm "$tmp/bad.yaml" > "$tmp/bad.out"; then
  echo "FAIL: the validator accepted a string containerPort" >&2
  exit 1
fi
grep -q "containerPort must be integer" "$tmp/bad.out"

echo "== Compose files"
for f in deploy/cluster/docker-compose.yml deploy/docker-compose.yml; do
  "$compose" -f "$f" config -q
  echo "$f: valid"
done
# A copy next to the original, so that its relative paths still resolve.
bad=deploy/cluster/.bad-compose-$$.yml
trap 'rm -rf "$tmp" "$bad"' EXIT
sed 's/    stop_grace_period: 40s/    stop_grace_periodd: 40s/' deploy/cluster/docker-compose.yml > "$bad"
if "$compose" -f "$bad" config -q 2> "$tmp/compose.err"; then
  echo "FAIL: docker-compose accepted an unknown option" >&2
  exit 1
fi
grep -q "stop_grace_periodd" "$tmp/compose.err"
echo "PASS"
