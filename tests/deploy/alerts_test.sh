#!/usr/bin/env bash
# The alert rules are valid and do what they say: `promtool check rules` on
# deploy/prometheus/alerts.yml, `promtool check config` on prometheus.yml
# (which must load alerts.yml through rule_files), and `promtool test rules`
# on alerts_test.yml (every alert firing on one synthetic series and not on
# another). The unit tests are also shown to catch a changed threshold, so
# that a pass means something.
#   tests/deploy/alerts_test.sh PROMTOOL
set -euo pipefail
cd "$(dirname "$0")/../.."
promtool=${1:?usage: $0 PROMTOOL}
[[ -x "$promtool" ]] || { echo "FAIL: promtool not found at '$promtool' (scripts/setup.sh installs it)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== promtool check rules"
"$promtool" check rules deploy/prometheus/alerts.yml

echo "== promtool check config"
"$promtool" check config deploy/prometheus/prometheus.yml | tee "$tmp/config.out"
# rule_files are globs: a wrong path matches nothing and still passes.
grep -q "SUCCESS: 1 rule files found" "$tmp/config.out" ||
  { echo "FAIL: prometheus.yml does not load alerts.yml" >&2; exit 1; }

echo "== promtool test rules"
"$promtool" test rules deploy/prometheus/alerts_test.yml

echo "== the unit tests catch a changed threshold"
cp deploy/prometheus/alerts_test.yml "$tmp/"
sed 's/    > 0.05$/    > 0.1/' deploy/prometheus/alerts.yml > "$tmp/alerts.yml"
! cmp -s deploy/prometheus/alerts.yml "$tmp/alerts.yml" ||
  { echo "FAIL: the error-ratio threshold was not found to change" >&2; exit 1; }
if "$promtool" test rules "$tmp/alerts_test.yml" > "$tmp/mutant.out" 2>&1; then
  echo "FAIL: promtool test rules passed with the error ratio threshold at 10%" >&2
  exit 1
fi
grep -q "alertname: KvlingoHighErrorRatio" "$tmp/mutant.out"
echo "PASS"
