"""Every registered experiment end to end on a GPU in smoke mode (tiny shapes, one fresh process each:
``python -m mla_lab.measure.experiments NAME --smoke``, or the experiment's own smoke command line): it exits 0 and
writes at least one of its files, each with the registry's columns, every row ``source=measured``. On CPU every case
skips with the reason; on the GPU machine (``MLA_LAB_REQUIRE_GPU=1``) a skip is a failure."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mla_lab.measure.experiments import EXPERIMENTS

REPO = Path(__file__).resolve().parent.parent
ENGINE_ROOT = REPO / ".engine"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_experiment_runs_in_smoke_mode(name, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda.is_available() is False: no CUDA GPU on this machine")
    e = EXPERIMENTS[name]
    if "engine kernels packed" in e.needs and not ENGINE_ROOT.is_dir():
        pytest.skip(f"{ENGINE_ROOT} missing: pack it with python -m mla_lab.kernels.engine_libs pack VLLM_WHEEL "
                    "SGLANG_WHEEL .engine")
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, *e.command(out, 1, str(ENGINE_ROOT), smoke=True)], cwd=REPO,
                       capture_output=True, text=True, timeout=e.timeout_s,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    written = {f: out / f for f in e.outputs() if (out / f).is_file()}
    assert written, (name, sorted(p.name for p in out.iterdir()))
    for f, path in written.items():
        rows = list(csv.DictReader(path.open()))
        assert rows, (name, f)
        assert set(e.outputs()[f]) - {"process"} <= set(rows[0]), (name, f)
        assert {row["source"] for row in rows} == {"measured"}, (name, f)
