#!/usr/bin/env bash
# GPU round 6 (docs/perf-notes.md "Round 4", issue 23): load/store cache hints on v2 into the padded workspace
# (benchmarks/bench_concat_round3.py --set $SET, default hints; SET=hints_clean drops evict_last) in N fresh processes.
# Rows in $OUT/r6/, packed into $OUT/round6.tar.gz after every stage.
set -uo pipefail
: "${OUT:?OUT must be set}"
mkdir -p "$OUT/r6"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
LOG="$OUT/r6/round6.log"
N="${N:-5}"
pack() { tar -czf "$OUT/round6.tar.gz" -C "$OUT" r6; }
{ date -u +"start %Y-%m-%dT%H:%M:%SZ"; echo "MLA_LAB_COMMIT=${MLA_LAB_COMMIT:-unset} N=$N"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv; } 2>&1 | tee "$LOG"
for k in $(seq 1 "$N"); do
  echo "== process $k" | tee -a "$LOG"
  timeout 100 python3 benchmarks/bench_concat_round3.py --set "${SET:-hints}" --rounds 5 --rep 50 --host-calls 10 \
    --out "$OUT/r6/p$k" 2>&1 | tee -a "$LOG" | grep -E "^T=|Error|error"
  pack
done
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"
pack
