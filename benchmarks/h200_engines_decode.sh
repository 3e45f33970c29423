#!/usr/bin/env bash
# The engines and decode_layer experiments on one lent H200 (docs/perf-notes.md, "GPU round 2"): engines (content factor, engine
# presets, sub-chunking, NaN check) then decode_layer (decode / mixed layer, attention path, per-op), CSVs and
# one log straight into $OUT (7 files; the scripts append rows as they measure, so a kill keeps what was measured).
# Expects the flash_mla wheel in .whl/ (installed here if the caller did not), MLA_LAB_COMMIT set by the caller.
# SMOKE=1: tiny shapes only.
set -uo pipefail
: "${OUT:?OUT must be set}"
mkdir -p "$OUT"
if ! python3 -c "import flash_mla" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    || echo "flash_mla wheel not installed (CPU smoke: reference kernel)"
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
LOG="$OUT/engines_decode.log"
{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  echo "MLA_LAB_COMMIT=${MLA_LAB_COMMIT:-unset}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode --format=csv
  python3 -c "import torch, triton, flash_mla; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'flash_mla', flash_mla.__file__)"
  python3 -c "from mla_lab.kernels import flash_mla_info; print(flash_mla_info())"
  python3 -c "import pynvml; pynvml.nvmlInit(); print('nvml ok', pynvml.nvmlSystemGetDriverVersion())"
} 2>&1 | tee "$LOG"
S=""
if [ "${SMOKE:-0}" = 1 ]; then S="--smoke"; fi
python -m mla_lab.measure.experiments engines --out "$OUT" $S --param repeats=6 --param window_ms=250 2>&1 | tee -a "$LOG"
python -m mla_lab.measure.experiments decode_layer --out "$OUT" $S 2>&1 | tee -a "$LOG"
{
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
  date -u +"end %Y-%m-%dT%H:%M:%SZ"
  ls -la "$OUT"
} 2>&1 | tee -a "$LOG"
