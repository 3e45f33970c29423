#!/usr/bin/env bash
# One batched session on an 8-GPU H200 machine (nvidia-h200-x8): the TP harness's GPU tests with
# MLA_LAB_REQUIRE_GPU=1 (no skip passes), then the tp_block experiment (python -m mla_lab.measure.experiments tp_block) at TP=8, TP=4 (GPUs 0-3) and TP=2 (GPUs 0-1),
# both blocks (attention, moe under EP = TP), each with its sim run and the all-reduce rows. Everything lands under
# $OUT (tpN/tp_block.csv, tpN/allreduce.csv, a log per run); copy the CSVs into data/measured/h200x<N>/ afterwards.
# Expects the FlashMLA provider's wheel in .whl/ (carry it), MLA_LAB_COMMIT set by the caller, and $OUT.
# Arguments: the TP sizes to run (default "8 4 2"). The lent machine allows 600 s per call: run one TP per call
# (`bash benchmarks/h200x8_run.sh 8`, then 4, then 2) unless the first shows all three fit; tests run with the first.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1: set
# here and again by mla_lab.measure.tp in every worker).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,power.limit --format=csv | tee "$OUT/gpu.txt"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/gpu.txt"
python3 -c "import torch, triton; from mla_lab.kernels import flash_mla_info; print(torch.__version__, triton.__version__, torch.cuda.device_count(), flash_mla_info())" | tee -a "$OUT/gpu.txt"
TPS="${*:-8 4 2}"
[ "${SKIP_TESTS:-0}" = 1 ] || MLA_LAB_REQUIRE_GPU=1 timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/test_measure_tp.py 2>&1 | tail -25 | tee "$OUT/tp_tests.log"
for tp in $TPS; do
  mkdir -p "$OUT/tp$tp"
  timeout 450 python -m mla_lab.measure.experiments tp_block --tp "$tp" --param runs=tp,sim --out "$OUT/tp$tp" 2>&1 | tee "$OUT/tp$tp/tp_block.log" | tail -40
done
ls -laR "$OUT"
