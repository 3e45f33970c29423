#!/usr/bin/env bash
# Render the committed H200 report (reports/h200/) from the committed measured sweep (data/measured/h200/), on any
# machine (no GPU: the measured rows are read from data/measured; the rest is modelled). The grid is the measured
# sweep's (mla_lab/sweep/measured.py) plus the B200 as modelled rows.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
rm -rf reports/h200 && mkdir -p reports/h200
# the rows go beside the report (committed with it), so the report names a file a reader has
.venv/bin/mla-lab sweep -p models "[glm-5, deepseek-v3.2]" -p tp_sizes "[4, 8]" -p archs "[h200, b200]" \
    -p max_num_batched_tokens "[8192, 16384]" -p prompt_lens "[1024, 8192]" -p device cpu \
    -p store_dir "$tmp/st" -p data_file reports/h200/padding_sweep_h200_rows.csv -p report_dir "$tmp/reports" \
    --report-name padding_sweep_h200
cp -r "$tmp/reports/padding_sweep_h200" "$tmp"/reports/padding_sweep_h200.{html,ipynb,png,svg} reports/h200/
cp "$tmp"/reports/runs/*.json reports/h200/run_metadata.json
# the browser check of the published page (1280 px: no page or table wider than the window, no clipped or
# overlapping labels, every figure loaded and not blank); the screenshot stays in the temporary folder
.venv/bin/mla-lab check-report reports/h200/padding_sweep_h200.html || { echo "check-report failed"; exit 1; }
rm -rf "$tmp"
ls reports/h200
