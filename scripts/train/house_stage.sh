# Sourced by the training scripts (scripts/train/timed.sh first; $KVL, $THREADS and
# $TIMES set). One curriculum stage of a house model:
#   stage NAME STAGE CONFIG SEED STEPS LR TRAIN VALID OUT [INIT_DIR]
# kvl train-lm, batch 8 x 512, warm-up 50 and cosine, bf16 autocast,
# checkpoints every 200 steps. A finished stage is skipped, an interrupted one
# resumes. Environment: SAVE_DTYPE (the exported weights' dtype, default
# float32), ASSISTANT_WEIGHT (the loss weight of assistant-written tokens,
# default 1).
stage() {
  local name=$1 stage=$2 config=$3 seed=$4 steps=$5 lr=$6 train=$7 valid=$8 out=$9 init=${10:-}
  if grep -qs '"finished": true' "$out/summary.json"; then return; fi
  timed "train-lm $name $stage" "$KVL" train-lm --config "$config" --tokenizer models/tokenizer \
    --train "$train" --valid "$valid" --out "$out" --seed "$seed" --steps "$steps" --batch 8 \
    --seq-len 512 --lr "$lr" --warmup 50 --bf16 --threads "$THREADS" --eval-every 200 \
    --checkpoint-every 200 ${SAVE_DTYPE:+--save-dtype "$SAVE_DTYPE"} \
    ${ASSISTANT_WEIGHT:+--assistant-weight "$ASSISTANT_WEIGHT"} \
    ${init:+--init-from "$init"} $( [ -f "$out/train_state/state.json" ] && echo --resume )
}
