#!/bin/bash
# vLLM 0.24.0's bundled FlashMLA (June 2026) beside vLLM 0.33.0's, decode + prefill shapes, 5 fresh processes each,
# alternating builds. FA3 and concat are 0.33.0's in both roots.
set -e
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLA_LAB_COMMIT=$1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv > $OUT/env.txt
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $OUT/env.txt
cat $OUT/env.txt
cp -r .engine /tmp/e033
cp -r .engine /tmp/era
rm -f /tmp/era/vllm/_flashmla_C.abi3.so /tmp/era/vllm/_flashmla_C.abi3.so.xz
cp .engine_era/vllm/_flashmla_C.abi3.so.xz /tmp/era/vllm/
cp .engine_era/vllm/third_party/flashmla/flash_mla_interface.py /tmp/era/vllm/third_party/flashmla/
cp .engine_era/SOURCES_ERA.json $OUT/
mkdir -p $OUT/era $OUT/e033
start=$(date +%s)
for p in 1 2 3 4 5; do
  if [ $((p % 2)) -eq 1 ]; then order="era e033"; else order="e033 era"; fi
  for b in $order; do
    echo "== $b process $p ($(( $(date +%s) - start )) s)"
    ERA=$([ $b = era ] && echo 1 || echo 0) python .scratch/era_run.py --engine-root /tmp/$b --out $OUT/$b/p$p.csv --process $p --rounds 5 --parts check,prefill,decode 2>&1 | tee -a $OUT/$b.log | grep -v "^p.* decode" | tail -4
  done
done
echo "total $(( $(date +%s) - start )) s"
cd $OUT && tar czf rows.tgz era e033 && rm -rf era e033
