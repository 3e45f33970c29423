#!/usr/bin/env bash
# One call on the lent single H200 (no multi-GPU machine lent): the TP harness's GPU tests with
# MLA_LAB_REQUIRE_GPU=1 (the NCCL test, which needs >= 2 GPUs, deselected and said so), then the one-GPU simulation
# of a TP-8 and a TP-4 share (python -m mla_lab.measure.experiments tp_block --param runs=sim, moe block through torch._grouped_mm) and, for the
# comparison, the TP-8 moe share through the per-expert loop. Everything under $OUT. Expects .whl/ (carried).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
echo "deselected: tests/test_measure_tp.py::test_gpu_tp_run_equals_the_unsharded_blocks (needs >= 2 GPUs)" | tee "$OUT/tp_tests.log"
MLA_LAB_REQUIRE_GPU=1 timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_measure_tp.py \
  --deselect tests/test_measure_tp.py::test_gpu_tp_run_equals_the_unsharded_blocks 2>&1 | tail -8 | tee -a "$OUT/tp_tests.log"
for tp in 8 4; do
  timeout 170 python -m mla_lab.measure.experiments tp_block --tp "$tp" --param runs=sim --param moe_impl=grouped_mm --out "$OUT/tp$tp" 2>&1 \
    | tee "$OUT/tp${tp}.log" | tail -4
done
timeout 90 python -m mla_lab.measure.experiments tp_block --tp 8 --param runs=sim --param blocks=moe --param moe_impl=loop \
  --out "$OUT/tp8_loop" 2>&1 \
  | tee "$OUT/tp8_loop.log" | tail -4
ls -laR "$OUT"
