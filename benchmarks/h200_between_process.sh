#!/usr/bin/env bash
# GPU round 3 on one lent H200 (docs/perf-notes.md "GPU round 3"): benchmarks/round3.py in N fresh processes
# (N >= 5: the between-process spread), each running the parts in PARTS; then the concat benchmark
# (mla_lab/measure/experiments/concat_variants.py) in N fresh processes if it exists. Rows go to $OUT/r3/*.csv, packed into
# $OUT/round3.tar.gz (the device returns at most 8 files). Expects the flash_mla wheel in .whl/ and MLA_LAB_COMMIT.
# N (5), PARTS (all), SMOKE=1 (tiny repeats, one process), PROC_TIMEOUT (s per process).
set -uo pipefail
: "${OUT:?OUT must be set}"
mkdir -p "$OUT/r3"
if ! python3 -c "import flash_mla" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    || echo "flash_mla wheel not installed"
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
LOG="$OUT/round3.log"
N="${N:-5}"
PARTS="${PARTS:-cold,presets,subgraph,routes,moe_decode,content}"
S=""
if [ "${SMOKE:-0}" = 1 ]; then S="--smoke"; N=1; fi
{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  echo "MLA_LAB_COMMIT=${MLA_LAB_COMMIT:-unset} N=$N PARTS=$PARTS SMOKE=${SMOKE:-0}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; from mla_lab.kernels import flash_mla_info; print('torch', torch.__version__, 'triton', triton.__version__, flash_mla_info())"
} 2>&1 | tee "$LOG"
for k in $(seq 1 "$N"); do
  timeout "${PROC_TIMEOUT:-150}" python3 benchmarks/round3.py --out "$OUT/r3" --process "$k" --parts "$PARTS" $S 2>&1 | tee -a "$LOG" | grep -E "FAILED|done in|Error" 
done
if [ -f mla_lab/measure/experiments/concat_variants.py ] && [ "${CONCAT:-1}" = 1 ]; then
  for k in $(seq 1 "$N"); do
    timeout 90 python -m mla_lab.measure.experiments.concat_variants --out "$OUT/r3/concat_p$k" 2>&1 | tee -a "$LOG" | tail -12
  done
fi
if [ "${GPU_TESTS:-0}" = 1 ]; then
  MLA_LAB_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests 2>&1 | tail -15 | tee -a "$LOG"
fi
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"
tar -czf "$OUT/round3.tar.gz" -C "$OUT" r3 round3.log && rm -rf "$OUT/r3"
ls -la "$OUT"
