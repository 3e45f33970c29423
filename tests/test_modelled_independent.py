"""Modelled columns depend only on the model and its calibration files; measured rows only fill the measured
column (issue 32: ``MLA_LAB_MEASURED=<empty dir> mla-lab advise`` moved the modelled ``fa3_sparse`` from -9.08 %
to -2.89 %, because the padded-kernel and route fits read their rows from the measured folder).

Each check runs the door in a fresh process twice, once with the repository's measured folder and once with an
empty one (``MLA_LAB_MEASURED``), and compares every modelled number."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], measured: Path | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MLA_LAB_MEASURED"}
    env["PYTHONPATH"] = str(ROOT)
    if measured is not None:
        env["MLA_LAB_MEASURED"] = str(measured)
    out = subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _modelled(obj, path=""):
    """Every number of ``obj`` (nested dicts/lists) whose key is not a measured one, as {path: value}."""
    out = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if str(k).startswith("measured") or k in ("note", "comm_source"):
                continue
            out.update(_modelled(v, f"{path}/{k}"))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            key = v.get("strategy", i) if isinstance(v, dict) else i
            out.update(_modelled(v, f"{path}[{key}]"))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[path] = obj
    return out


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    moved = {k: (a[k], b[k]) for k in a if not (a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])))}
    assert not moved, f"modelled numbers moved with an empty measured folder: {dict(list(moved.items())[:8])}"


@pytest.mark.parametrize("model", ["glm-5", "deepseek-v3.2"])
def test_advise_modelled_numbers_do_not_depend_on_the_measured_folder(tmp_path, model):
    args = ["-m", "mla_lab.cli", "advise", "--model", model, "--json"]
    full = json.loads(_run(args, None))
    empty = json.loads(_run(args, tmp_path))
    a, b = _modelled(full), _modelled(empty)
    assert any("fa3_sparse" in k and k.endswith("ttft_change_pct") for k in a)
    _same(a, b)


def test_serve_modelled_numbers_do_not_depend_on_the_measured_folder(tmp_path):
    args = ["-m", "mla_lab.cli", "serve", "--strategies", "vllm-53878", "vllm-fa3-sparse", "sglang",
            "kernel-native", "--json"]
    _same(_modelled(json.loads(_run(args, None))), _modelled(json.loads(_run(args, tmp_path))))


def test_a_sweep_row_does_not_depend_on_the_measured_folder(tmp_path):
    code = ("import json; from mla_lab.deployment import Deployment; from mla_lab.sweep.rows import modelled_rows\n"
            "out = []\n"
            "for m, L in (('glm-5', 1024), ('deepseek-v3.2', 1024), ('glm-5', 8192)):\n"
            "    d = Deployment.seed(model=m, prompt_len=L)\n"
            "    p = d.to_point(strategies=['private_workspace', 'fa3_sparse', 'kernel_native', "
            "'per_call_zeros@sglang-dense'], shared_workspace_bytes=None, num_runs=7)\n"
            "    out += [{k: v for k, v in r.items() if isinstance(v, (int, float))} | {'strategy': r['strategy']}"
            " for r in modelled_rows(p)]\n"
            "print(json.dumps(out))")
    _same(_modelled(json.loads(_run(["-c", code], None))), _modelled(json.loads(_run(["-c", code], tmp_path))))
