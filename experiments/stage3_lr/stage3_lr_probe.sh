#!/usr/bin/env bash
# The learning rate of scripts/train/train_translators.sh's stage 3 (chat
# hand-overs) for a direction with joint maps: stage 3 again from the same
# stage-2 maps at other peak lrs (each decaying to a tenth, as the recipe's
# 1e-4 -> 1e-5), the recipe's other flags unchanged, then `kvl eval-translator`
# on the test split (64 windows, the five test suites) of every variant beside
# the recipe's own stage-3 maps. Stage 4 is not run: the question is which
# start it gets.
#   experiments/stage3_lr/stage3_lr_probe.sh WORK_DIR [S:T] [LRS]
#   default S:T kvl-small:kvl-small-b, LRS "3e-4 3e-5"
# Needs WORK_DIR/data (kvl make-data, the recipe's corpus) and the stage-2 and
# stage-3 maps train_translators.sh leaves in WORK_DIR/translators
# (S__T.any.safetensors, S__T.chat.safetensors; e.g.
# KVL_TRANSLATOR_PAIRS=S:T KVL_SKIP_EVAL=1 KVL_HOUSE_WORK=WORK_DIR
# scripts/train/train_translators.sh, which also rewrites the committed S__T files
# in models/translators and docs/results/training: `git checkout models/translators
# docs/results/training` to keep them). Writes WORK_DIR/stage3_lr/S__T.lrX.* and
# experiments/stage3_lr/results/S__T.json with each variant's distillation log
# (S__T.lrX.distill.json); prints each distillation's summary and
# last the table (from its "# experiments/stage3_lr/stage3_lr_probe.sh" line on), which is
# experiments/stage3_lr/stage3_lr.txt. KVL_TRAIN_THREADS (default 1) per run.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
PY=${KVL_PYTHON:-/usr/bin/python3}
work=${1:?usage: experiments/stage3_lr/stage3_lr_probe.sh WORK_DIR [S:T] [LRS]}
pair=${2:-kvl-small:kvl-small-b}
lrs=${3:-3e-4 3e-5}
threads=${KVL_TRAIN_THREADS:-1}
s=${pair%%:*}; t=${pair##*:}
any="$work/translators/${s}__${t}.any.safetensors"
chat="$work/translators/${s}__${t}.chat.safetensors"
# Joint-map directions only: the flags below are their stage 3's.
if [ "$pair" = kvl-small:kvl-large ]; then
  echo "stage3_lr_probe: $pair has split maps; this probe runs the joint maps' stage 3" >&2
  exit 2
fi
for f in "$any" "$chat"; do
  [ -f "$f" ] || { echo "stage3_lr_probe: $f is missing (run train_translators.sh first)" >&2; exit 2; }
done
for k in train valid test suites/test_facts suites/test_kv suites/test_arith suites/test_lists \
    suites/test_strings; do
  [ -f "$work/data/$k.jsonl" ] || { echo "stage3_lr_probe: $work/data/$k.jsonl is missing (kvl make-data)" >&2; exit 2; }
done
out="$work/stage3_lr"
mkdir -p "$out" experiments/stage3_lr/results
files=("$chat")
for lr in $lrs; do
  min=$("$PY" -c 'import sys; print(f"{float(sys.argv[1]) / 10:g}")' "$lr")
  f="$out/${s}__${t}.lr$lr.safetensors"
  # train_translators.sh's stage 3 for joint maps, but for the lr.
  "$KVL" distill --source "models/$s" --target "models/$t" --init "$any" \
    --data "$work/data/train.jsonl" --valid "$work/data/valid.jsonl" --out "$f" \
    --hand-over chat --continuation 64 --steps 600 --lr "$lr" --min-lr "$min" \
    --eval-every 100 --threads "$threads" --quiet --bf16 --whiten
  cp "${f%.safetensors}.distill.json" experiments/stage3_lr/results/
  files+=("$f")
done
suites=$(for k in facts kv arith lists strings; do printf '%s,' "$work/data/suites/test_$k.jsonl"; done)
json="experiments/stage3_lr/results/${s}__${t}.json"
"$KVL" eval-translator --source "models/$s" --target "models/$t" \
  --translator "$(IFS=,; echo "${files[*]}")" --data "$work/data/test.jsonl" \
  --suites "${suites%,}" --threads "$threads" --quiet --json "$json" > /dev/null
"$PY" - "$json" "$pair" "$lrs" "$out" <<'PY'
import json, os, sys
path, pair, lrs, out = sys.argv[1:]
r = json.load(open(path))
print(f"# experiments/stage3_lr/stage3_lr_probe.sh WORK {pair} \"{lrs}\": stage 3 from the same stage-2 maps, "
      "600 steps at chat hand-overs, peak lr -> a tenth; kvl eval-translator on the test split")
print()
print("| stage-3 peak lr | best valid KL (step) | gap (all / first 32) | recovered first 32 "
      "| accuracy all | arith | facts | kv | lists | strings |")
print("|---|---|---|---|---|---|---|---|---|---|")
for tr in r["translators"]:
    f = tr["file"]
    stem = os.path.basename(f)[:-len(".safetensors")]
    lr = stem.rsplit(".lr", 1)[1] if ".lr" in stem else "1e-4 (the recipe's, rerun)"
    log = json.load(open(f[:-len(".safetensors")] + ".distill.json"))
    acc = r["accuracy"]["translated:" + f]
    cells = " | ".join(f"{acc[k]['accuracy']:.3f}"
                       for k in ("all", "arith", "facts", "kv", "lists", "strings"))
    print(f"| {lr} | {log['best_valid_kl']:.4f} ({log['best_step']}) | {tr['gap']:.4f} / "
          f"{tr['gap_first']:.4f} | {100 * tr['recovered_first']:.1f}% | {cells} |")
PY
