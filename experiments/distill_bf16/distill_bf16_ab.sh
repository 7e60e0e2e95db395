#!/usr/bin/env bash
# kvl distill with float32 steps and with --bf16 steps, one after the other from
# the same committed translator and on the same windows: seconds per step and
# the (float32) validation KL every 50 steps. Continues the committed
# kvl-small -> kvl-large translator at chat hand-overs, as its last stage ran.
#   experiments/distill_bf16/distill_bf16_ab.sh WORK_DIR [STEPS]     # WORK_DIR/data from kvl make-data
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
work=$1; steps=${2:-150}
out="$work/distill_bf16_ab"
mkdir -p "$out"
for mode in float32 bf16; do
  "$KVL" distill --source models/kvl-small --target models/kvl-large \
    --init models/translators/kvl-small__kvl-large.safetensors \
    --data "$work/data/train.jsonl" --valid "$work/data/valid.jsonl" \
    --out "$out/$mode.safetensors" --hand-over chat --continuation 64 --steps "$steps" \
    --lr 1e-3 --eval-every 50 --threads 2 --quiet --no-plot \
    $( [ "$mode" = bf16 ] && echo --bf16 ) | sed "s/^/$mode: /"
  /usr/bin/python3 - "$out/$mode.distill.jsonl" "$mode" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
valid = ", ".join(f"{r['step']}: {r['valid_kl']:.5f}" for r in rows if r.get("valid_kl", -1) >= 0)
train = [r["kl"] for r in rows if "kl" in r]
print(f"{sys.argv[2]}: validation KL by step {valid}; mean training KL {sum(train) / len(train):.5f}")
PY
done
