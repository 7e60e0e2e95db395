#!/usr/bin/env bash
# Does a translated cache lose the kv lookup (docs/translators.md: translated
# kv is 0 of 50 in every direction) because the translators never trained on
# kv hand-overs? Continues the committed kvl-small -> kvl-large translator for
# STEPS (default 400) steps of `kvl distill` on the 16,082 level-1-2 kv
# conversations of scripts/train/make_kv_corpora.sh (WORK/kvextra/kv12.jsonl, held-out
# documents removed; the last 200 for validation), prefixes of 383 tokens
# ending at the reply, only the answer's positions scored, lr 1e-3, bf16;
# then `kvl eval-translator` on the test split (64 windows, kv and facts
# suites, 100 items each) with the committed translator and the probe's
# side by side. Nothing under models/ changes.
#   experiments/kv_handover_distill/kv_handover_probe.sh WORK [STEPS]
# Output: WORK/kvhandover/ (data, translator and its .distill.jsonl, distill.log,
# eval.json, eval.txt); experiments/kv_handover_distill/kv_handover_probe.txt has a run.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
[ $# -ge 1 ] || { sed -n '2,/^set /p' "$0" | grep '^#'; exit 2; }
work=$1 steps=${2:-400}
d="$work/kvhandover"
mkdir -p "$d"
scripts/train/make_kv_corpora.sh "$work"
head -n -200 "$work/kvextra/kv12.jsonl" > "$d/train.jsonl"
tail -n 200 "$work/kvextra/kv12.jsonl" > "$d/valid.jsonl"
t=models/translators/kvl-small__kvl-large.safetensors
"$KVL" distill --source models/kvl-small --target models/kvl-large --init "$t" \
  --data "$d/train.jsonl" --valid "$d/valid.jsonl" --out "$d/kvl-small__kvl-large.safetensors" \
  --prefix 383 --continuation 16 --hand-over reply --score assistant --steps "$steps" --lr 1e-3 \
  --eval-every 100 --bf16 --threads "${KVL_TRAIN_THREADS:-1}" --quiet --no-plot | tee "$d/distill.log"
"$KVL" eval-translator --source models/kvl-small --target models/kvl-large \
  --translator "$t,$d/kvl-small__kvl-large.safetensors" --data "$work/data/test.jsonl" \
  --suites "$work/data/suites/test_kv.jsonl,$work/data/suites/test_facts.jsonl" --limit 100 \
  --threads "${KVL_TRAIN_THREADS:-1}" --quiet --json "$d/eval.json" | tee "$d/eval.txt"
