#!/usr/bin/env bash
# The engine_kernels experiment (mla_lab/measure/experiments/engine_kernels.py) on a lent GPU: N fresh processes (default 5), rows
# in $OUT/ek/, packed into $OUT/engine_kernels.tar.gz after every process (a run cut short keeps what it had).
# Expects the packed engine kernels in .engine/ (python -m mla_lab.kernels.engine_libs pack ...; carry it) and the
# FlashMLA provider's wheel in .whl/ (carry it). Env: N (5), ROUNDS (5), PARTS (check,prefill,decode), GPU_TESTS (0).
set -uo pipefail
: "${OUT:?OUT must be set}"
N="${N:-5}"; ROUNDS="${ROUNDS:-5}"; PARTS="${PARTS:-check,prefill,decode}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
mkdir -p "$OUT/ek"
LOG="$OUT/ek/engine_kernels.log"
pack() { tar -czf "$OUT/engine_kernels.tar.gz" -C "$OUT" ek; }
{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  echo "MLA_LAB_COMMIT=${MLA_LAB_COMMIT:-unset} N=$N ROUNDS=$ROUNDS PARTS=$PARTS"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$LOG"
for k in $(seq 1 "$N"); do
  echo "== process $k" | tee -a "$LOG"
  timeout "${PROC_TIMEOUT:-300}" python3 -m mla_lab.measure.experiments engine_kernels --engine-root .engine \
    --process "$k" --param rounds="$ROUNDS" --param parts="$PARTS" --out "$OUT/ek/p$k" 2>&1 | tee -a "$LOG" | grep -v "^p[0-9]* decode" | tail -40
  pack
done
if [ "${GPU_TESTS:-0}" = 1 ]; then
  MLA_LAB_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_gpu_kernels.py \
    tests/test_gpu_strategies.py tests/test_kernels_concat.py 2>&1 | tail -15 | tee -a "$LOG"
fi
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"
pack
