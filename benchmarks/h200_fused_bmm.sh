#!/usr/bin/env bash
# mla_lab/measure/experiments/fused_bmm.py in N fresh processes on one lent H200 (docs/perf-notes.md "Round 4"): rows in
# $OUT/fb/p<k>/fused_bmm.csv, packed into $OUT/fused_bmm.tar.gz after every process.
set -uo pipefail
: "${OUT:?OUT must be set}"
mkdir -p "$OUT/fb"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
N="${N:-5}"
for k in $(seq 1 "$N"); do
  echo "== process $k"
  timeout 90 python -m mla_lab.measure.experiments fused_bmm --out "$OUT/fb/p$k" --process "$k" 2>&1 | tee "$OUT/fb/p$k.log"
  tar -czf "$OUT/fused_bmm.tar.gz" -C "$OUT" fb
done
