#!/usr/bin/env bash
# The between-process experiments on one lent H200 (docs/perf-notes.md "GPU round 3"): `mla-lab measure` runs each
# of EXPERIMENTS (default: the registry's between-process set, mla_lab/measure/experiments/__init__.py) in N fresh
# processes and merges the rows (process column) into $OUT/between_process/, with provenance.json; packed into
# $OUT/between_process.tar.gz (the device returns at most 8 files). Expects the flash_mla wheel in .whl/.
# N (5), EXPERIMENTS (the default set), GPU_TESTS=1 (then the GPU tests with MLA_LAB_REQUIRE_GPU=1).
set -uo pipefail
: "${OUT:?OUT must be set}"
if ! python3 -c "import flash_mla" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    || echo "flash_mla wheel not installed"
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
LOG="$OUT/between_process.log"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu \
  --format=csv 2>&1 | tee "$LOG"
python3 -m mla_lab.cli measure --processes "${N:-5}" --out "$OUT" ${EXPERIMENTS:+--experiments "$EXPERIMENTS"} 2>&1 \
  | tee -a "$LOG" | grep -E "exit|rows from|FAILED|Error"
if [ "${GPU_TESTS:-0}" = 1 ]; then
  MLA_LAB_REQUIRE_GPU=1 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests 2>&1 | tail -15 | tee -a "$LOG"
fi
tar -czf "$OUT/between_process.tar.gz" -C "$OUT" between_process provenance.json "$(basename "$LOG")"
ls -la "$OUT"
