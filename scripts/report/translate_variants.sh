#!/usr/bin/env bash
# The committed (distilled) house translators under two deployment choices,
# with `kvl eval-translator` on the test split (continuation log-perplexity,
# suite accuracy and the 8-switch multi-turn run), all four directions:
#   --translate-dtype float32 | bfloat16 (the products' arithmetic; the
#   server's translators[].compute_dtype);
#   --native-tail 0 | 4 | 16 | 32 | 64 | 128 (the target prefills the last W
#   prefix tokens itself, on top of the translation of the rest; the server's
#   routing.native_tail_tokens), in float32.
# KVL_VARIANT_TAILS="64 128" runs only those tails, KVL_VARIANT_BF16=0 skips
# the bfloat16 run (both set empty / 0: only the table is remade).
# Needs the corpus of scripts/train/train_house_models.sh.
#   scripts/report/translate_variants.sh [WORK_DIR]   # default build/house; needs WORK_DIR/data
#   KVL_VARIANT_PAIRS="kvl-small:kvl-small-b" scripts/report/translate_variants.sh build/house2
#     reruns only those directions (the table is made from every JSON in the folder).
# Output: one JSON per run in docs/results/translate_variants/<S>__<T>.<dtype>.tail<W>.json
# and the summary table docs/results/translate_variants.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
KVL=${KVL_BIN:-build/tools/kvl}
PY=${KVL_PYTHON:-/usr/bin/python3}
work=${1:-build/house}
dir=docs/results/translate_variants
mkdir -p "$dir"
suites=$(for k in facts kv arith lists strings; do printf '%s,' "$work/data/suites/test_$k.jsonl"; done)
run() {  # source target dtype tail
  "$KVL" eval-translator --source "models/$1" --target "models/$2" \
    --translator "models/translators/${1}__${2}.safetensors" --data "$work/data/test.jsonl" \
    --suites "${suites%,}" --translate-dtype "$3" --native-tail "$4" \
    --multi-turn "models/translators/${1}__${2}.safetensors,models/translators/${2}__${1}.safetensors" \
    --threads "${KVL_TRAIN_THREADS:-2}" --quiet --json "$dir/${1}__${2}.$3.tail$4.json" > /dev/null
}
for pair in ${KVL_VARIANT_PAIRS:-kvl-small:kvl-large kvl-large:kvl-small kvl-small:kvl-small-b kvl-small-b:kvl-small}; do
  s=${pair%%:*}; t=${pair##*:}
  for tail in ${KVL_VARIANT_TAILS-0 4 16 32 64 128}; do run "$s" "$t" float32 "$tail"; done
  [ "${KVL_VARIANT_BF16:-1}" = 0 ] || run "$s" "$t" bfloat16 0
done
"$PY" - "$dir" <<'PY' | tee docs/results/translate_variants.txt
import glob, json, os, sys
d = sys.argv[1]
print("# scripts/report/translate_variants.sh: distilled translators, test split "
      "(64 windows, prefix 255, continuation 128; 5 suites x 50 items)")
print()
print("| direction | dtype | native tail | gap | gap first 32 | recovered first 32 | "
      "translated accuracy | target's own | source's own | tasks translated >= source's own | "
      "multi-turn span-wise - re-prefill |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
rows = []
for f in glob.glob(os.path.join(d, "*.json")):
    j = json.load(open(f))
    t = j["translators"][0]
    acc = j["accuracy"]
    translated = [k for k in acc if k.startswith("translated:")][0]
    name = os.path.basename(f).split(".")[0].replace("__", " -> ")
    tasks = [k for k in acc["source_native"] if k != "all"]
    wins = sum(acc[translated][k]["correct"] >= acc["source_native"][k]["correct"] for k in tasks)
    turns = j["multi_turn"]["turns"]
    multi = round(sum(x["span_wise"] - x["reprefill"] for x in turns) / len(turns), 4) + 0.0
    rows.append((name, j["translate_dtype"], j["native_tail"], t["gap"], t["gap_first"],
                 t["recovered_first"], acc[translated]["all"]["accuracy"],
                 acc["target_native"]["all"]["accuracy"], acc["source_native"]["all"]["accuracy"],
                 f"{wins} of {len(tasks)}", multi))
order = ["kvl-small -> kvl-large", "kvl-large -> kvl-small", "kvl-small -> kvl-small-b",
         "kvl-small-b -> kvl-small"]
rows.sort(key=lambda r: (order.index(r[0]), r[1] != "float32", r[2]))
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.4f} | {r[4]:.4f} | {100 * r[5]:.1f}% | "
          f"{r[6]:.3f} | {r[7]:.3f} | {r[8]:.3f} | {r[9]} | {r[10]:+.4f} |")
print()
print("gap: translated - native log-perplexity over the 128 continuation tokens (nats/token); "
      "multi-turn: mean over 8 alternating switches of the per-turn NLL difference, "
      "16 runs of 9 turns x 64 tokens (a native tail as long as a turn, 64 or more, leaves "
      "nothing to translate there: span-wise equals re-prefill).")
PY
