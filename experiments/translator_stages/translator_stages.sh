#!/usr/bin/env bash
# What each distillation stage of scripts/train/train_translators.sh buys: `kvl
# eval-translator` on the test split (64 windows, the five test suites, no
# multi-turn run) of every stage's maps of a direction, one run per direction:
# the closed form ($WORK/translators/S__T.closed-form.safetensors), stage 2 on
# windows that start anywhere ($WORK/translators/S__T.any.safetensors), stage 3
# at chat hand-overs ($WORK/translators/S__T.chat.safetensors) and the committed
# maps (models/translators/S__T.safetensors: stage 4's, or stage 3's where stage 4
# did not run). The stage files are the ones train_translators.sh leaves in its
# work folder, so this runs after it, with the same WORK; stages whose file is
# missing there are left out.
#   experiments/translator_stages/translator_stages.sh [WORK_DIR]   # default build/house
#   KVL_STAGE_PAIRS="kvl-small:kvl-small-b" experiments/translator_stages/translator_stages.sh
# Output: experiments/translator_stages/results/<S>__<T>.json and the table
# experiments/translator_stages/translator_stages.txt (made from every JSON in that folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
PY=${KVL_PYTHON:-/usr/bin/python3}
work=${1:-build/house}
dir=experiments/translator_stages/results
mkdir -p "$dir"
suites=$(for k in facts kv arith lists strings; do printf '%s,' "$work/data/suites/test_$k.jsonl"; done)
PAIRS=${KVL_STAGE_PAIRS:-kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small}
for pair in $PAIRS; do
  s=${pair%%:*}; t=${pair##*:}
  files=()
  for stage in closed-form any chat; do
    f="$work/translators/${s}__${t}.$stage.safetensors"
    [ -f "$f" ] && files+=("$f")
  done
  files+=("models/translators/${s}__${t}.safetensors")
  list=$(IFS=,; echo "${files[*]}")
  "$KVL" eval-translator --source "models/$s" --target "models/$t" --translator "$list" \
    --data "$work/data/test.jsonl" --suites "${suites%,}" \
    --threads "${KVL_TRAIN_THREADS:-2}" --quiet --json "$dir/${s}__${t}.json" > /dev/null
done
"$PY" - "$dir" "$work" <<'PY' | tee experiments/translator_stages/translator_stages.txt
import glob, json, os, sys
folder, work = sys.argv[1:]
print(f"# experiments/translator_stages/translator_stages.sh {work}: kvl eval-translator on the test split, "
      "per distillation stage")
print()
print("| direction | maps | gap (all / first 32) | recovered first 32 | accuracy all | arith | facts "
      "| kv | lists | strings |")
print("|---|---|---|---|---|---|---|---|---|---|")
order = ["kvl-small__kvl-large", "kvl-large__kvl-small", "kvl-small__kvl-small-b",
         "kvl-small-b__kvl-small"]
found = {os.path.basename(p)[:-len(".json")]: p for p in glob.glob(os.path.join(folder, "*.json"))}
for direction in [d for d in order if d in found] + sorted(set(found) - set(order)):
    r = json.load(open(found[direction]))
    name = direction.replace("__", " → ")
    rows = [("target native", None, r["accuracy"]["target_native"])]
    for tr in r["translators"]:
        stem = os.path.basename(tr["file"])[:-len(".safetensors")]
        stage = stem.split(".", 1)[1] if "." in stem else "committed"
        label = {"closed-form": "closed form", "any": "stage 2 (anywhere)",
                 "chat": "stage 3 (hand-overs)"}.get(stage, stage)
        rows.append((label, tr, r["accuracy"]["translated:" + tr["file"]]))
    for label, tr, acc in rows:
        gaps = f"{tr['gap']:.4f} / {tr['gap_first']:.4f}" if tr else ""
        rec = f"{100 * tr['recovered_first']:.1f}%" if tr else ""
        cells = " | ".join(f"{acc[k]['accuracy']:.3f}"
                           for k in ("all", "arith", "facts", "kv", "lists", "strings"))
        print(f"| {name} | {label} | {gaps} | {rec} | {cells} |")
PY
