#!/usr/bin/env bash
# Split vs joint map inputs (kvl fit --inputs), and whitened distillation
# steps (kvl distill --whiten), on the house models.
#   experiments/map_inputs/map_inputs_ab.sh WORK_DIR [closed-form|distill|cross|cross-plain|cross-eval|all]
# WORK_DIR/data from kvl make-data (the recipe's corpus). Writes under
# WORK_DIR/map_inputs_ab/ and prints the tables of experiments/map_inputs/map_inputs_ab.txt:
#  closed-form: both inputs fitted as scripts/train/train_translators.sh fits them
#    (256 training chats of up to 512 tokens, every source layer), for all
#    four directions, then kvl eval-translator on the test split (64 windows);
#  distill: kvl-small -> kvl-small-b from each closed form, 2400 steps on
#    windows that start anywhere at lr 3e-4 -> 1e-4 (the stage-2 probe of
#    docs/translators.md), split or joint, with or without --whiten, two at a
#    time, then the test split (log-perplexity only);
#  cross: kvl-large -> kvl-small, joint and --whiten, the same 2400 steps,
#    against the committed split translator's stage 2 (4800 steps at lr 1e-3);
#  cross-plain: the same without --whiten (validation KL only);
#  cross-eval: task accuracy and the multi-turn run (with the committed
#    kvl-small -> kvl-large translator back) for the committed kvl-large ->
#    kvl-small translator and cross's joint, whitened one.
# The "committed" kvl-large -> kvl-small translator of cross and cross-eval was
# the split four-stage one when experiments/map_inputs/map_inputs_ab.txt was made; since
# 2026-12-02's retrain it is joint itself (git history has the split files), so
# a rerun of those two modes compares other maps.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1; what=${2:-all}
D="$work/data"
out="$work/map_inputs_ab"
mkdir -p "$out"

# The stage-2 probe: S -> T from its INPUTS closed form to $out/S__T.NAME.safetensors,
# 2400 steps on windows that start anywhere, lr 3e-4 -> 1e-4, EXTRA flags.
stage2() {
  local s=$1 t=$2 name=$3 inputs=$4 extra=$5
  [ -f "$out/${s}__${t}.$inputs.closed-form.safetensors" ] || { echo "run closed-form first" >&2; exit 2; }
  # shellcheck disable=SC2086
  "$KVL" distill --source "models/$s" --target "models/$t" \
    --init "$out/${s}__${t}.$inputs.closed-form.safetensors" \
    --data "$D/train.jsonl" --valid "$D/valid.jsonl" --out "$out/${s}__${t}.$name.safetensors" \
    --steps 2400 --lr 3e-4 --min-lr 1e-4 --seed 0 --eval-every 100 --bf16 --threads 1 \
    --quiet --no-plot $extra | sed "s/^/$name: /"
}

if [ "$what" = closed-form ] || [ "$what" = all ]; then
  for pair in kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small; do
    s=${pair%%:*}; t=${pair##*:}
    files=()
    for inputs in split joint; do
      f="$out/${s}__${t}.$inputs.closed-form.safetensors"
      "$KVL" fit --source "models/$s" --target "models/$t" --data "$D/train.jsonl" --out "$f" \
        --seq-len 512 --max-sequences 256 --assignment relative_depth --band all \
        --inputs "$inputs" --threads 2 --quiet | sed -n "s/^mean/$s -> $t $inputs: mean R² keys \/ values/p"
      files+=("$f")
    done
    echo "$s -> $t, closed form, test split:"
    "$KVL" eval-translator --source "models/$s" --target "models/$t" \
      --translator "$(IFS=,; echo "${files[*]}")" --data "$D/test.jsonl" --threads 2 --quiet |
      sed -n '/^condition/,$p'
  done
fi

if [ "$what" = distill ] || [ "$what" = all ]; then
  s=kvl-small; t=kvl-small-b
  # name:inputs:extra flags
  variants=("split:split:" "joint:joint:" "split-whiten:split:--whiten"
            "joint-whiten:joint:--whiten")
  [ -f "$out/${s}__${t}.split.closed-form.safetensors" ] || { echo "run closed-form first" >&2; exit 2; }
  for ((i = 0; i < ${#variants[@]}; i += 2)); do
    for v in "${variants[@]:i:2}"; do
      IFS=: read -r name inputs extra <<< "$v"
      stage2 "$s" "$t" "$name" "$inputs" "$extra" &
    done
    wait
  done
  files=()
  for v in "${variants[@]}"; do files+=("$out/${s}__${t}.${v%%:*}.safetensors"); done
  echo "$s -> $t, distilled 2400 steps, test split:"
  "$KVL" eval-translator --source "models/$s" --target "models/$t" \
    --translator "$(IFS=,; echo "${files[*]}")" --data "$D/test.jsonl" --threads 2 --quiet |
    sed -n '/^condition/,$p'
fi

if [ "$what" = cross ] || [ "$what" = all ]; then
  s=kvl-large; t=kvl-small
  stage2 "$s" "$t" joint-whiten joint --whiten
  /usr/bin/python3 - "docs/results/training/${s}__${t}/${s}__${t}.any.distill.jsonl" \
    "$out/${s}__${t}.joint-whiten.distill.jsonl" <<'PY'
import json, sys
for name, path in zip(["committed split stage 2 (lr 1e-3, 4800 steps)", "joint --whiten (lr 3e-4, 2400 steps)"], sys.argv[1:]):
    rows = [json.loads(line) for line in open(path)]
    valid = {r["step"]: r["valid_kl"] for r in rows if r.get("valid_kl", -1) >= 0}
    marks = ", ".join(f"{k}: {valid[k]:.4f}" for k in (0, 100, 400, 800, 1600, 2400, 4800) if k in valid)
    best = min(valid.items(), key=lambda kv: kv[1])
    print(f"{name}: validation KL by step {marks}; best {best[1]:.5f} at step {best[0]}")
PY
  echo "$s -> $t, test split:"
  "$KVL" eval-translator --source "models/$s" --target "models/$t" \
    --translator "models/translators/${s}__${t}.safetensors,$out/${s}__${t}.joint-whiten.safetensors" \
    --data "$D/test.jsonl" --threads 2 --quiet | sed -n '/^condition/,$p'
fi

if [ "$what" = cross-plain ] || [ "$what" = all ]; then
  s=kvl-large; t=kvl-small
  stage2 "$s" "$t" joint joint ""
  /usr/bin/python3 - "$out/${s}__${t}.joint.distill.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
valid = {r["step"]: r["valid_kl"] for r in rows if r.get("valid_kl", -1) >= 0}
print("joint, not whitened (lr 3e-4, 2400 steps): validation KL by step",
      ", ".join(f"{k}: {v:.4f}" for k, v in sorted(valid.items()) if k % 400 == 0 or k in (100, 200)))
PY
fi

if [ "$what" = cross-eval ] || [ "$what" = all ]; then
  s=kvl-large; t=kvl-small
  suites=$(for k in facts kv arith lists strings; do printf '%s,' "$D/suites/test_$k.jsonl"; done)
  for f in "models/translators/${s}__${t}.safetensors" "$out/${s}__${t}.joint-whiten.safetensors"; do
    echo "$s -> $t with $f (multi-turn back: models/translators/${t}__${s}.safetensors):"
    "$KVL" eval-translator --source "models/$s" --target "models/$t" --translator "$f" \
      --data "$D/test.jsonl" --suites "${suites%,}" \
      --multi-turn "$f,models/translators/${t}__${s}.safetensors" --threads 2 --quiet |
      sed -n '/^condition/,$p'
  done
fi
