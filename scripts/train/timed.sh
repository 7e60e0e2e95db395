# Sourced by the training scripts. timed NAME CMD...: runs CMD and appends
# "NAME<TAB>wall seconds" to the file named by $TIMES.
timed() {
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@"
  local t1; t1=$(date +%s.%N)
  printf '%s\t%.1f\n' "$name" "$(echo "$t1 - $t0" | bc)" >> "$TIMES"
}
