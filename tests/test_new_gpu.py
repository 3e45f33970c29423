"""A GPU is one record: adding ``mla_lab/arch/<name>.py`` and nothing else puts a new GPU in ``advise``, ``serve``,
``engines`` and the sweep (issue 38). The test copies the package into a scratch tree beside links to the
repository's data, adds one module there (a test-only GPU, not a real product) and runs the command line on it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

X90 = '''"""Test-only GPU (not a real product): an sm90 card whose figures differ from every real record."""

from .record import FLASHMLA_TILE_SOURCE, GPUArch

GPU = GPUArch(
    name="x90", product="Test X90", family="hopper", sm="sm90", capability=(9, 0), sm_count=100,
    prefill_padding=64, hbm_gb=120, hbm_gbps=4000, bf16_tflops=800, nvlink_gbps=900,
    torch_total_bytes=125_000_000_000, torch_total_status="assumed", torch_total_source="test-only figure",
    source="test-only record; tile: " + FLASHMLA_TILE_SOURCE,
)
'''


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The repository with its package copied (links for everything else) and ``mla_lab/arch/x90.py`` added."""
    t = tmp_path_factory.mktemp("newgpu")
    repo = t / "repo"
    repo.mkdir()
    for p in ROOT.iterdir():
        if p.name not in ("mla_lab", ".git"):
            (repo / p.name).symlink_to(p)
    shutil.copytree(ROOT / "mla_lab", repo / "mla_lab", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "mla_lab" / "arch" / "x90.py").write_text(X90)
    return repo


def _run(repo: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(repo), "MLA_LAB_CACHE": str(repo.parent / "cache")}
    return subprocess.run([sys.executable, *argv], env=env, cwd=repo, capture_output=True, text=True, timeout=600)


def test_the_module_is_the_only_change(tree):
    """The scratch package differs from the repository's by the one added file."""
    new = {p.relative_to(tree / "mla_lab") for p in (tree / "mla_lab").rglob("*.py")}
    old = {p.relative_to(ROOT / "mla_lab") for p in (ROOT / "mla_lab").rglob("*.py")}
    assert new - old == {Path("arch/x90.py")} and old <= new


def test_advise_serve_engines_take_the_new_gpu(tree):
    a = _run(tree, "-m", "mla_lab.cli", "advise", "--arch", "x90", "--json")
    assert a.returncode == 0, a.stderr
    adv = json.loads(a.stdout)
    assert adv["deployment"]["arch"] == "x90"
    assert "125,000,000,000" in json.dumps(adv) or "125000000000" in json.dumps(adv)  # its torch total is the KV input
    s = _run(tree, "-m", "mla_lab.cli", "serve", "--arch", "x90", "--strategies", "vllm-53878", "--json")
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["deployment"]["arch"] == "x90"
    e = _run(tree, "-m", "mla_lab.cli", "engines", "--arch", "x90")
    assert e.returncode == 0, e.stderr
    assert "X90 (sm90)" in e.stdout
    # without the module, the same call is refused in one line naming the argument and the allowed names
    r = subprocess.run([sys.executable, "-m", "mla_lab.cli", "advise", "--arch", "x90"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "x90" in r.stderr and "h200" in r.stderr


def test_the_sweep_takes_the_new_gpu(tree):
    out = tree.parent / "sweep"
    code = ("import json; from mla_lab.sweep.run import run_sweep\n"
            f"df = run_sweep(dict(models=['glm-5'], tp_sizes=[8], archs=['x90', 'h200'], max_num_batched_tokens=[16384], "
            f"prompt_lens=[1024], strategies=['vllm-53878'], device='cpu', store_dir={str(out / 'st')!r}, "
            f"data_file={str(out / 's.csv')!r}, report_dir={str(out / 'rep')!r}), progress=False)\n"
            "print(json.dumps(df[['arch', 'family', 'prefill_padding', 'strategy', 'status', 'ttft_ms']]"
            ".to_dict('records')))")
    r = _run(tree, "-c", code)
    assert r.returncode == 0, r.stderr
    rows = {(x["arch"], x["strategy"]): x for x in json.loads(r.stdout)}
    x90 = {s: v for (a, s), v in rows.items() if a == "x90"}
    assert len(x90) == 2 and all(v["status"] == "ok" and v["family"] == "hopper" and v["prefill_padding"] == 64
                                 for v in x90.values())
    # its own record prices it: the H200's datasheet bandwidth and bf16 rate are higher, so its TTFT is lower
    for s, v in x90.items():
        assert v["ttft_ms"] > rows[("h200", s)]["ttft_ms"] > 0


def test_a_record_is_checked_where_it_is_written():
    """The family key follows the capability (vLLM's is_device_capability_family) and the torch total has a source;
    the SM count and tile rows are record fields with no default (no fallback to another GPU's)."""
    from dataclasses import MISSING, fields

    from mla_lab.arch import ARCHS, GPUArch

    h200 = ARCHS["h200"]
    kw = {f.name: getattr(h200, f.name) for f in fields(GPUArch)}
    with pytest.raises(ValueError, match=r"sm='sm100' does not match capability=\(9, 0\)"):
        GPUArch(**{**kw, "sm": "sm100"})
    with pytest.raises(ValueError, match=r"torch_total_status='guessed' needs a source"):
        GPUArch(**{**kw, "torch_total_status": "guessed"})
    required = {f.name for f in fields(GPUArch) if f.default is MISSING}
    assert {"sm", "sm_count", "prefill_padding", "torch_total_bytes", "hbm_gbps", "nvlink_gbps"} <= required
    assert {a.name: (a.sm, a.sm_count, a.prefill_padding) for a in ARCHS.values()} == {
        "h100": ("sm90", 132, 64), "h200": ("sm90", 132, 64), "h800": ("sm90", 132, 64), "h20": ("sm90", 78, 64),
        "b200": ("sm100", 148, 128)}
