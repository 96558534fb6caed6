# Sourced by the scripts/gpu_*.sh:
# step NAME TIMEOUT_S COMMAND...: runs it, logs to $OUT/NAME.log, prints its rc and the
# pytest count line to $OUT/summary.txt
# budget_step NAME LIMIT_S COMMAND...: runs it in the foreground for at most LIMIT_S and
# at most what is left of $BUDGET seconds (bash's SECONDS counts from the script's start),
# skipped when 10 s or less are left
step() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc: $(grep -E '[0-9]+ (passed|failed|skipped|error)' "$OUT/$name.log" | tail -1)" \
    | tee -a "$OUT/summary.txt"
}

left() {  # seconds for a step: at most $1, at most what the budget has left
  local rest=$((BUDGET - SECONDS))
  ((rest < $1)) && echo "$rest" || echo "$1"
}

budget_step() {
  local name=$1 limit; limit=$(left "$2"); shift 2
  if ((limit <= 10)); then echo "== $name: skipped (budget spent)"; return; fi
  echo "== $name (limit ${limit} s)"
  timeout "$limit" "$@"
  echo "== $name: rc=$? after ${SECONDS} s"
}
