#!/usr/bin/env bash
# How precise the translator targets' verdicts are: `kvl eval-translator` on
# more test windows than the results table's 64 (default 512, the first of
# the same test stream), continuation log-perplexity only (no suites, no
# multi-turn), for the closed-form and the committed distilled translators
# with no native tail, and for the distilled ones with the server's default
# native tail. Each gap and share comes with its standard error over the windows.
# Needs the corpus of scripts/train/train_house_models.sh and the closed forms of
# scripts/train/train_translators.sh (refitted here when missing, as that script does).
#   scripts/report/translator_precision.sh [WORK_DIR]   # default build/house
#   KVL_PRECISION_WINDOWS=1024 KVL_TRAIN_THREADS=2 scripts/report/translator_precision.sh
# Output: docs/results/translator_precision/<S>__<T>.tail<W>.json (read by
# scripts/report/translator_report.py) and the table docs/results/translator_precision.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
PY=${KVL_PYTHON:-/usr/bin/python3}
work=${1:-build/house}
windows=${KVL_PRECISION_WINDOWS:-512}
threads=${KVL_TRAIN_THREADS:-1}
dir=docs/results/translator_precision
mkdir -p "$dir" "$work/translators"
tail=$(sed -n 's/.*kDefaultNativeTailTokens = \([0-9]*\);.*/\1/p' server/config.h)
[ -n "$tail" ] || { echo "no kDefaultNativeTailTokens in server/config.h" >&2; exit 1; }
for pair in ${KVL_PRECISION_PAIRS:-kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small}; do
  s=${pair%%:*}; t=${pair##*:}
  cf="$work/translators/${s}__${t}.closed-form.safetensors"
  if [ ! -f "$cf" ]; then
    # As scripts/train/train_translators.sh fits it (its map inputs: joint but for
    # kvl-small -> kvl-large; token anchors over 8 tokens).
    inputs=joint; [ "$s:$t" = kvl-small:kvl-large ] && inputs=split
    "$KVL" fit --source "models/$s" --target "models/$t" --data "$work/data/train.jsonl" \
      --out "$cf" --seq-len 512 --max-sequences 256 --assignment relative_depth --band all \
      --inputs "$inputs" --anchor-window 8 --threads "$threads" --quiet > /dev/null
  fi
  "$KVL" eval-translator --source "models/$s" --target "models/$t" \
    --translator "$cf,models/translators/${s}__${t}.safetensors" --data "$work/data/test.jsonl" \
    --max-windows "$windows" --threads "$threads" --quiet --json "$dir/${s}__${t}.tail0.json" > /dev/null
  "$KVL" eval-translator --source "models/$s" --target "models/$t" \
    --translator "models/translators/${s}__${t}.safetensors" --data "$work/data/test.jsonl" \
    --max-windows "$windows" --native-tail "$tail" --threads "$threads" --quiet \
    --json "$dir/${s}__${t}.tail$tail.json" > /dev/null
done
"$PY" - "$dir" <<'PY' | tee docs/results/translator_precision.txt
import glob, json, os, sys
d = sys.argv[1]
runs = sorted(glob.glob(os.path.join(d, "*.json")))
first = json.load(open(runs[0]))
print(f"# scripts/report/translator_precision.sh: {first['windows']} test windows (prefix "
      f"{first['prefix']}, continuation {first['continuation']}), +- one standard error")
print("# over the windows; gap = translated - native (nats/token), recovered = share of")
print("# the prefix benefit, over the whole continuation and its first "
      f"{first['first_k']} tokens")
print()
print("| direction | translator | native tail | windows | gap | gap first 32 | recovered | "
      "recovered first 32 |")
print("|---|---|---|---|---|---|---|---|")
for f in runs:
    j = json.load(open(f))
    name = os.path.basename(f).split(".")[0].replace("__", " -> ")
    for t in j["translators"]:
        pm = lambda k, s=1, fmt=".4f", u="": f"{s * t[k]:{fmt}}{u} +- {s * t[k + '_se']:{fmt}}{u}"
        print(f"| {name} | {t['method']} | {j['native_tail']} | {j['windows']} | {pm('gap')} | "
              f"{pm('gap_first')} | {pm('recovered', 100, '.1f', '%')} | "
              f"{pm('recovered_first', 100, '.1f', '%')} |")
PY
