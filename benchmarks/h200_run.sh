#!/usr/bin/env bash
# One batched GPU session on the lent H200 (see docs/perf-notes.md): measured attention path, measured sweep
# through the papermill notebook, rendered report. Expects wheels in .whl/ (flash_mla provider) and .whl/lab/
# (papermill, nbconvert, ipykernel and what the image lacks), MLA_LAB_COMMIT set by the caller, and $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/tokenspeed_flashmla*.whl .whl/lab/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MPLBACKEND=Agg JUPYTER_PATH=/tmp/site/share/jupyter  # nbconvert templates of the --target install
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton, flash_mla; print(torch.__version__, triton.__version__, flash_mla.__file__)"
python3 -c "from mla_lab.kernels import flash_mla_info; print(flash_mla_info())"
mkdir -p $OUT
if [ "${SKIP_ATTN:-0}" != 1 ]; then
  python3 benchmarks/bench_attention.py --out $OUT/attention_path.csv 2>&1 | tee $OUT/bench_attention.log | tail -80
fi
python3 -m mla_lab.cli sweep -p device cuda -p store_dir /tmp/st -p data_file $OUT/padding_sweep.csv \
    -p report_dir /tmp/rep --report-name padding_sweep_h200 --timeout 900 2>&1 | tail -30
tar -C /tmp -czf $OUT/rep.tgz rep
ls -la $OUT
