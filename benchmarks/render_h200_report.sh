#!/usr/bin/env bash
# Render the committed H200 report (reports/h200/) from data/measured/h200/ on any machine (no GPU): one command,
# mla-lab report --measured h200 (mla_lab/cli_measure.py: the measured sweep's grid plus the B200 as modelled rows,
# published beside the rows it shows, then checked in the browser).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/mla-lab report --measured h200 --overwrite  # reports/h200/ is committed: replaced only with --overwrite
