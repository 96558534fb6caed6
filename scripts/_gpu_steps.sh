# Sourced by the scripts/gpu_issue*.sh that log one step per file:
# step NAME TIMEOUT_S COMMAND...: runs it, logs to $OUT/NAME.log, prints its rc and the
# pytest count line to $OUT/summary.txt
step() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc: $(grep -E '[0-9]+ (passed|failed|skipped|error)' "$OUT/$name.log" | tail -1)" \
    | tee -a "$OUT/summary.txt"
}
