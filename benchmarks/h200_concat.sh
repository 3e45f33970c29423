#!/usr/bin/env bash
# The concat method sets of mla_lab/measure/experiments/concat_variants.py on one lent H200 (docs/perf-notes.md "Round 4",
# issue 23): --set $SET in N fresh processes (N >= 5: the between-process spread), then, if DENSITY_HP lists padded
# head counts, one process per H' at T = 16384, H = 8, then (GPU_TESTS=1) the concat GPU tests with
# MLA_LAB_REQUIRE_GPU=1. Rows in $OUT/c/, re-packed into $OUT/concat_$SET.tar.gz after every stage (the device
# returns at most 8 files; a stage killed at the time limit keeps the stages before it).
# Env: SET (round4 | ceiling | hints | hints_clean; default round4), N (5), HOST_CALLS (host-launch calls per
# repeat in the main processes; 1000), DENSITY_HP (e.g. "9 16 128"; none), GPU_TESTS (0), MLA_LAB_COMMIT
# (provenance for a tree without .git).
# This session's runs: SET=round4 DENSITY_HP="16 128" GPU_TESTS=1; SET=ceiling HOST_CALLS=10 DENSITY_HP="9 16 128";
# SET=hints HOST_CALLS=10; SET=hints_clean HOST_CALLS=10.
set -uo pipefail
: "${OUT:?OUT must be set}"
SET="${SET:-round4}"
N="${N:-5}"
mkdir -p "$OUT/c"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
LOG="$OUT/c/concat_$SET.log"
pack() { tar -czf "$OUT/concat_$SET.tar.gz" -C "$OUT" c; }
{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  echo "MLA_LAB_COMMIT=${MLA_LAB_COMMIT:-unset} SET=$SET N=$N"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'sms', torch.cuda.get_device_properties(0).multi_processor_count)"
} 2>&1 | tee "$LOG"
for k in $(seq 1 "$N"); do
  echo "== process $k" | tee -a "$LOG"
  timeout 150 python -m mla_lab.measure.experiments concat --param set="$SET" --param rounds=5 --param rep=50 \
    --param host_calls="${HOST_CALLS:-1000}" --out "$OUT/c/p$k" --process "$k" 2>&1 | tee -a "$LOG" | grep -E "concat|Error|error"
  pack
done
for hp in ${DENSITY_HP:-}; do
  echo "== density Hp=$hp" | tee -a "$LOG"
  timeout 60 python -m mla_lab.measure.experiments concat --param set="$SET" --param rounds=3 --param rep=50 \
    --param tokens=16384 --param heads=8 --param padded_heads="$hp" --param host_calls=10 --out "$OUT/c/hp$hp" 2>&1 \
    | tee -a "$LOG" | grep -E "concat|Error|error"
  pack
done
if [ "${GPU_TESTS:-0}" = 1 ]; then
  MLA_LAB_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_kernels_concat.py \
    2>&1 | tail -15 | tee -a "$LOG"
fi
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"
pack
