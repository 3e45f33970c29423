#!/usr/bin/env bash
# The whole between-process suite through `mla-lab measure` on a lent GPU, in calls cut by a per-call limit:
#   first call:  BUDGET=480 bash benchmarks/measure_suite.sh            (a new run folder under $OUT/m)
#   next calls:  RESUME=<run folder carried back (unpack run.tar.gz into an ignored folder, carry it)> bash ...
# (the run comes back as one run.tar.gz: a lent machine returns a limited number of files, no deep folders)
# then GPU_TESTS=1 adds the README's GPU test command (MLA_LAB_REQUIRE_GPU=1). Expects .whl/ (tokenspeed-flashmla)
# and .engine/ (python -m mla_lab.kernels.engine_libs pack ...) carried; MLA_LAB_COMMIT set to the tree's commit.
set -uo pipefail
: "${OUT:?OUT must be set}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
EXPERIMENTS="${EXPERIMENTS:-cold_start,presets,subgraph,routes,moe_decode,content_step,attention_strategies,engine_kernels}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; } > "$OUT/env.txt" 2>&1
if [ -n "${RESUME:-}" ]; then
  python3 -m mla_lab.cli measure --resume "$RESUME" --processes 5 --engine-root .engine --budget-s "${BUDGET:-480}" \
    > "$OUT/measure.log" 2>&1
  echo "measure rc=$?" | tee -a "$OUT/measure.log"; tar -czf "$OUT/run.tar.gz" -C "$(dirname "$RESUME")" "$(basename "$RESUME")"
else
  python3 -m mla_lab.cli measure --experiments "$EXPERIMENTS" --processes 5 --engine-root .engine --out "$OUT/m" \
    --budget-s "${BUDGET:-480}" > "$OUT/measure.log" 2>&1
  echo "measure rc=$?" | tee -a "$OUT/measure.log"; tar -czf "$OUT/run.tar.gz" -C "$OUT" m && rm -rf "$OUT/m"
fi
grep "exit\|rows from\|budget" "$OUT/measure.log" | tail -30
if [ -n "${GPU_TESTS:-}" ]; then
  MLA_LAB_REQUIRE_GPU=1 timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu tests -q -rs -p no:cacheprovider \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$?" | tee -a "$OUT/gpu_tests.log"; tail -4 "$OUT/gpu_tests.log"
fi
