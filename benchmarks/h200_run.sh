#!/usr/bin/env bash
# One batched GPU session on the lent H200 (docs/perf-notes.md): the GPU tests with MLA_LAB_REQUIRE_GPU=1 (no skip
# passes), then the measured sweep (every real strategy, interleaved repeats) written to $OUT. Expects the FlashMLA
# provider's wheel in .whl/ (carry it), MLA_LAB_COMMIT set by the caller, and $OUT. The report is rendered from the
# CSV afterwards on any machine.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; from mla_lab.kernels import flash_mla_info; print(torch.__version__, triton.__version__, flash_mla_info())" | tee -a "$OUT/gpu.txt"
# the GPU tests (pytest -m gpu collects only the files holding GPU tests: the GPU image lacks the lab extra)
MLA_LAB_REQUIRE_GPU=1 timeout 240 python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests 2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
timeout 420 python -m mla_lab.sweep.measured --out "$OUT/padding_sweep.csv" 2>&1 | grep -v "^\[mla-lab\] [0-9]*/" | tee "$OUT/measured_sweep.log" | tail -60
ls -la "$OUT"
