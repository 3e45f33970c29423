#!/usr/bin/env bash
# GPU round 4 on one lent H200 (docs/perf-notes.md "Round 4: the concat at the copy ceiling", issue 23):
# benchmarks/bench_concat_round3.py --set round4 in N fresh processes (N >= 5: the between-process spread), then the
# density rows (H' = 16 and 128 at T = 16384, H = 8; one process each), then the concat GPU tests with
# MLA_LAB_REQUIRE_GPU=1. Everything lands in $OUT/r4/, re-packed into $OUT/round4.tar.gz after every stage (the
# device returns at most 8 files; a stage killed at the time limit keeps the stages before it).
# Env: N (5), MLA_LAB_COMMIT (provenance for a tree without .git), GPU_TESTS (1), DENSITY (1).
set -uo pipefail
: "${OUT:?OUT must be set}"
mkdir -p "$OUT/r4"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
LOG="$OUT/r4/round4.log"
N="${N:-5}"
pack() { tar -czf "$OUT/round4.tar.gz" -C "$OUT" r4; }
{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  echo "MLA_LAB_COMMIT=${MLA_LAB_COMMIT:-unset} N=$N"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'sms', torch.cuda.get_device_properties(0).multi_processor_count)"
} 2>&1 | tee "$LOG"
for k in $(seq 1 "$N"); do
  echo "== process $k" | tee -a "$LOG"
  timeout 150 python3 benchmarks/bench_concat_round3.py --set round4 --rounds 5 --rep 50 --out "$OUT/r4/p$k" 2>&1 \
    | tee -a "$LOG" | grep -E "^T=|Error|error|host launch" 
  pack
done
if [ "${DENSITY:-1}" = 1 ]; then
  for hp in 16 128; do
    echo "== density Hp=$hp" | tee -a "$LOG"
    timeout 60 python3 benchmarks/bench_concat_round3.py --set round4 --rounds 3 --rep 50 --T 16384 --H 8 --Hp "$hp" \
      --host-calls 10 --out "$OUT/r4/hp$hp" 2>&1 | tee -a "$LOG" | grep -E "^T=|Error|error"
  done
  pack
fi
if [ "${GPU_TESTS:-1}" = 1 ]; then
  MLA_LAB_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_kernels_concat.py \
    2>&1 | tail -15 | tee -a "$LOG"
fi
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"
pack
ls -la "$OUT"
