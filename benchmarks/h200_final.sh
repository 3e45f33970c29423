#!/usr/bin/env bash
# One lent-H200 call (issue 29/31): the README's GPU test command with MLA_LAB_REQUIRE_GPU=1, then `mla-lab measure`
# for the engine kernels and the MoE decode rows in 5 fresh processes; everything packed into $OUT/final.tar.gz.
# Expects .whl/ (tokenspeed-flashmla) and .engine/ (python -m mla_lab.kernels.engine_libs pack ...) carried.
set -uo pipefail
: "${OUT:?OUT must be set}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
mkdir -p "$OUT/f"
pack() { tar -czf "$OUT/final.tar.gz" -C "$OUT" f; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; } > "$OUT/f/env.txt" 2>&1
MLA_LAB_REQUIRE_GPU=1 timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu tests -q -rs -p no:cacheprovider \
  > "$OUT/f/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/f/gpu_tests.log"; tail -5 "$OUT/f/gpu_tests.log"; pack
timeout "${MEASURE_TIMEOUT:-240}" python3 -m mla_lab.cli measure --experiments "${EXPERIMENTS:-engine_kernels,moe_decode}" \
  --processes 5 --engine-root .engine --out "$OUT/f/m" > "$OUT/f/measure.log" 2>&1
echo "measure rc=$?" | tee -a "$OUT/f/measure.log"; tail -8 "$OUT/f/measure.log"; pack
