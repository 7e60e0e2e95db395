# Sourced by the training scripts (scripts/train/timed.sh first; $KVL, $THREADS,
# $TIMES and, for publish_model, $WORK set). One curriculum stage of a house model:
#   stage NAME STAGE CONFIG SEED STEPS LR TRAIN VALID OUT [INIT_DIR]
# kvl train-lm, batch 8 x 512, warm-up 50 and cosine, bf16 autocast (float32
# with BF16=0), checkpoints every 200 steps. A finished stage is skipped, an interrupted one
# resumes. Environment: SAVE_DTYPE (the exported weights' dtype, default
# float32), ASSISTANT_WEIGHT (the loss weight of assistant-written tokens,
# default 1), BF16 (1: bf16 autocast, the default; 0: float32 throughout),
# ROUTER_AUX_LOSS (a mixture of experts' load-balancing loss weight, default none),
# TOKENIZER (the tokenizer's directory, default models/tokenizer).
stage() {
  local name=$1 stage=$2 config=$3 seed=$4 steps=$5 lr=$6 train=$7 valid=$8 out=$9 init=${10:-}
  if grep -qs '"finished": true' "$out/summary.json"; then return; fi
  timed "train-lm $name $stage" "$KVL" train-lm --config "$config" --tokenizer "${TOKENIZER:-models/tokenizer}" \
    --train "$train" --valid "$valid" --out "$out" --seed "$seed" --steps "$steps" --batch 8 \
    --seq-len 512 --lr "$lr" --warmup 50 $( [ "${BF16:-1}" = 1 ] && echo --bf16 ) --threads "$THREADS" --eval-every 200 \
    --checkpoint-every 200 ${SAVE_DTYPE:+--save-dtype "$SAVE_DTYPE"} \
    ${ASSISTANT_WEIGHT:+--assistant-weight "$ASSISTANT_WEIGHT"} \
    ${ROUTER_AUX_LOSS:+--router-aux-loss "$ROUTER_AUX_LOSS"} \
    ${init:+--init-from "$init"} $( [ -f "$out/train_state/state.json" ] && echo --resume )
}

# The deliverable of a trained house model:
#   publish_model NAME FINAL_STAGE_DIR [EARLIER_STAGE_DIR ...]
# the final weights in models/NAME, the tokenizer files as links to
# $TOKENIZER's (default models/tokenizer; the same bytes), the logs of every stage in
# docs/results/training/NAME (an earlier stage's summary as
# summary_<its directory's name>.json) and its test-split evaluation.
publish_model() {
  local name=$1 final=$2; shift 2
  local logs="docs/results/training/$name"
  mkdir -p "models/$name" "$logs"
  for f in config.json generation_config.json model.safetensors; do
    cp "$final/$f" "models/$name/$f"
  done
  local tok=${TOKENIZER:-models/tokenizer}
  for f in tokenizer.json tokenizer_config.json; do
    cmp -s "$final/$f" "$tok/$f" || { echo "$final/$f differs from $tok/$f" >&2; exit 1; }
    ln -sfn "../$(basename "$tok")/$f" "models/$name/$f"
  done
  for f in summary.json train_log.jsonl loss.png loss.dat loss.gp; do
    cp "$final/$f" "$logs/$f"
  done
  rm -f "$logs"/summary_*.json
  for d in "$@"; do
    cp "$d/summary.json" "$logs/summary_$(basename "$d").json"
  done
  timed "eval $name" "$KVL" eval --model "models/$name" \
    $(for t in facts kv arith lists strings; do echo --suite "$WORK/data/suites/test_$t.jsonl"; done) \
    --text "$WORK/data/test.txt" --threads "$THREADS" --json "$logs/eval_test.json"
}
