"""Issue 32, doors that check what the run needs: every bound ``mla-lab serve`` applies holds inside the sweep, the
grid is bounded by what its report can draw, every size from a config is bounded before use, a dry run refuses
what the run would refuse (unwritable folders included), and SGLang's route never takes dense MHA past top-k.

Each refusal: exit 2, one line on stderr naming the parameter, nothing created, well under a second or two.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from mla_lab import cli, cli_sweep
from mla_lab.models import load_model, models_dir
from mla_lab.routes import route_for


def _main(argv, cwd: Path) -> tuple[int, str, str, float]:
    old = os.getcwd()
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(argv))
            except SystemExit as e:
                rc = e.code
    finally:
        os.chdir(old)
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def _tree(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


REFUSED = [
    # the sweep's serving section ran for hours on what `mla-lab serve` refuses in 0.1 s
    ("sweep_output_len_200000", ["-p", "output_len", "200000"],
     r"output_len=200000\) x \d+ strategies is [\d,]+ request-steps for the report's serving simulation; allowed: "
     r"at most 200,000"),
    ("sweep_num_prompts_20000", ["-p", "num_prompts", "20000", "-p", "prompt_lens", "[1024]", "-p",
                                 "max_num_batched_tokens", "[16384]"],
     r"num_prompts=20000 x .* request-steps for the report's serving simulation; allowed: at most 200,000"),
    # the largest grid the old doors took computed, then its report ran 8 min and failed on a label check
    ("sweep_grid_too_large_for_the_report", ["-p", "prompt_lens", json.dumps([512 * i for i in range(1, 17)]),
                                             "-p", "tp_sizes", "[4, 8]", "-p", "archs", "[h200, b200, h100, h20]"],
     r"the grid spans 512 points .*allowed: at most 256 per sweep"),
    ("sweep_tp_bars_overlap", ["-p", "tp_sizes", "[1, 2, 4, 8, 16]"],
     r"models x tp_sizes = 2 x 5 = 10 bars per row of the report's TP chart; allowed: at most 9"),
]


@pytest.mark.parametrize("case_id,extra,pattern", REFUSED, ids=[c[0] for c in REFUSED])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "run"])
def test_sweep_refuses_in_one_line_before_anything_runs(case_id, extra, pattern, dry_run, tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cli_sweep, "publish", lambda *a, **k: pytest.fail("the doors let this through to the run"))
    rc, _, err, dt = _main(["sweep", *(["--dry-run"] if dry_run else []), *extra], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err)
    assert re.search(pattern, lines[0]), lines[0]
    assert not _tree(tmp_path), _tree(tmp_path)
    assert dt < 8


def test_config_sizes_are_bounded_before_use(tmp_path):
    """A config.json with 10**9 layers loaded and then looped over every layer: now it is refused on load."""
    raw = json.loads((models_dir() / "glm-5" / "config.json").read_text())
    for field, value in (("num_hidden_layers", 10**9), ("vocab_size", 2**40), ("num_attention_heads", 2**20)):
        (tmp_path / "config.json").write_text(json.dumps({**raw, field: value}))
        with pytest.raises(ValueError, match=rf"field '{field}'={value} is out of range; allowed: at most "):
            load_model("big", path=tmp_path / "config.json")


# ------------------------------------------------------------------------------------ unwritable output folders
needs_non_root = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")


@pytest.mark.parametrize("param", ["data_file", "store_dir", "report_dir"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "run"])
def test_unwritable_output_folder_is_refused_before_any_point(param, dry_run, tmp_path, monkeypatch):
    """An unwritable data_file folder was found only after every point was computed: now the dry run and the run
    refuse it in one line first. (As root, a folder without write permission is still writable: the check looks
    at what the process can do, so it is made with os.access patched to say no for that folder.)"""
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == ro and mode & os.W_OK
                        else real(p, mode, *a, **k))
    monkeypatch.setattr(cli_sweep, "publish", lambda *a, **k: pytest.fail("the doors let this through to the run"))
    value = str(ro / ("x.csv" if param == "data_file" else "sub"))
    rc, _, err, _ = _main(["sweep", *(["--dry-run"] if dry_run else []), "-p", param, value,
                           "-p", "tp_sizes", "[8]"], tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err)
    assert re.search(rf"{param}=.*not writable", lines[0]), lines[0]
    assert not list(ro.iterdir())


# ------------------------------------------------------------------------------- SGLang: no dense MHA past top-k
def test_sglang_route_never_dense_past_topk_beside_a_decode():
    """A chunk of a 2048-token prompt beside a decode at seq_len 2049 (max_num_batched_tokens 2048): the dense MHA
    route priced both rows and refused the decode's; the step now takes the sparse backend's route."""
    glm = load_model("glm-5")
    choice = route_for("sglang-dense", glm, glm.topk, "prefill", [2049, 2047], [1, 2047])
    assert choice.route == "sparse-mqa" and "decode" in choice.reason
    # a batch of prefills at or under top-k still takes dense MHA (the rule unchanged where it was exact)
    assert route_for("sglang-dense", glm, glm.topk, "prefill", [2048, 2047], [2048, 2047]).route == "mha-dense"


@pytest.mark.parametrize("mbt,prompt", [(2048, 2048), (1024, 4096)])
def test_serve_sglang_with_small_chunks_prices_instead_of_failing(mbt, prompt, tmp_path):
    """``serve --strategies sglang`` with max_num_batched_tokens <= 2048 and prompts >= 2048 exited 2 as if the
    input were bad."""
    rc, out, err, _ = _main(["serve", "--strategies", "sglang", "--max-num-batched-tokens", str(mbt),
                             "--random-input-len", str(prompt), "--num-prompts", "8", "--json"], tmp_path)
    assert rc == 0, err
    res = json.loads(out)
    assert res["strategies"] and all(r["metrics"]["completed"] == 8 for r in res["strategies"].values())
