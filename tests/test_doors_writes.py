"""Issue 32, doors and writes: nothing committed is rewritten by a documented command without ``--overwrite``, a
sweep never replaces rows it does not write again, the main report of one grid is not replaced by another grid's
sweep (a named report instead, said in one line), and ``--fit-only`` writes only where its out flags point.

Committed files are made in a temporary git repository (``git init`` + ``git commit`` in ``tmp_path``), so no test
touches the checkout's own files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mla_lab import cli
from mla_lab.paths import REPO_ROOT
from mla_lab.sweep import run_sweep

MEASURED = REPO_ROOT / "data" / "measured" / "h200"
ONE_POINT = dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384], prompt_lens=[1024],
                 strategies=["vllm-53878"], device="cpu", check_equivalence=False)

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git (committed files are made with it)")


def _digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and ".git" not in p.parts}


def _git_repo(root: Path, files: dict[str, Path]) -> Path:
    """A git repository at ``root`` holding copies of ``files`` (``{relative path: source}``), committed."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / rel)
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "-A"], [*env, "commit", "-q", "-m", "committed"]):
        subprocess.run(["git", "-C", str(root), *cmd], check=True, capture_output=True)
    return root


def _main(argv, cwd: Path, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(list(argv))
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def _one_line_refusal(rc: int, err: str, pattern: str) -> None:
    import re

    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err)
    assert re.search(pattern, lines[0]), lines[0]


# ------------------------------------------------------------------------------------------- bench_layer --fit-only
def _fit_only(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mla_lab.measure.validate", "--fit-only", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO_ROOT)})


@pytest.fixture
def measured_repo(tmp_path):
    """A git repo with the committed H200 layer measurements and their validation CSV."""
    names = ("layer_ops.csv", "layer_e2e.csv", "layer_extras.csv", "layer_validation.csv")
    return _git_repo(tmp_path / "repo", {f"measured/{n}": MEASURED / n for n in names})


def test_fit_only_writes_only_where_cal_out_points(measured_repo, tmp_path):
    """docs/ttft-model.md's ``--fit-only data/measured/h200 --cal-out /tmp/x.csv`` rewrote the committed
    ``layer_validation.csv`` in the folder it read: now the folder read is left byte-identical."""
    before = _digest(measured_repo / "measured")
    r = _fit_only(str(measured_repo / "measured"), "--cal-out", str(tmp_path / "out" / "x.csv"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _digest(measured_repo / "measured") == before
    assert (tmp_path / "out" / "x.csv").is_file() and (tmp_path / "out" / "layer_validation.csv").is_file()


def test_fit_only_refuses_a_committed_target_without_overwrite(measured_repo, tmp_path):
    target = measured_repo / "measured" / "layer_validation.csv"
    before = target.read_bytes()
    r = _fit_only(str(measured_repo / "measured"), "--cal-out", str(tmp_path / "x.csv"), "--validation-out",
                  str(target), cwd=tmp_path)
    assert r.returncode == 2 and "is a committed file" in r.stderr and "--overwrite" in r.stderr, r.stderr
    assert target.read_bytes() == before and not (tmp_path / "x.csv").exists()
    r = _fit_only(str(measured_repo / "measured"), "--cal-out", str(tmp_path / "x.csv"), "--validation-out",
                  str(target), "--overwrite", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "x.csv").is_file()


def test_fit_only_needs_cal_out(measured_repo, tmp_path):
    before = _digest(measured_repo / "measured")
    r = _fit_only(str(measured_repo / "measured"), cwd=tmp_path)
    assert r.returncode == 2 and "needs --cal-out" in r.stderr, r.stderr
    assert _digest(measured_repo / "measured") == before


# ------------------------------------------------------------------------------------------------ sweep data_file
def test_sweep_refuses_a_committed_measured_csv(tmp_path, monkeypatch):
    """``-p data_file data/measured/h200/padding_sweep.csv`` replaced 464 committed rows (224 H200 measurements)
    with a few modelled rows: the "not written by mla_lab" guard let every measured CSV through."""
    repo = _git_repo(tmp_path / "repo", {"data/measured/h200/padding_sweep.csv": MEASURED / "padding_sweep.csv"})
    target = repo / "data" / "measured" / "h200" / "padding_sweep.csv"
    before = target.read_bytes()
    params = dict(ONE_POINT, store_dir=str(tmp_path / "st"), data_file=str(target))
    with pytest.raises(ValueError, match=r"data_file=.* is a committed file \(tracked by git\).*--overwrite"):
        run_sweep(params, progress=False)
    assert target.read_bytes() == before
    assert not list((tmp_path / "st").glob("points/*.json")), "a point was computed before the refusal"
    rc, _, err = _main(["sweep", "--dry-run", "-p", "data_file", str(target), "-p", "store_dir", str(tmp_path / "st")],
                       tmp_path, monkeypatch)
    _one_line_refusal(rc, err, r"data_file=.* is a committed file")
    assert target.read_bytes() == before


def test_sweep_does_not_drop_rows_of_another_grid(tmp_path):
    """A lab CSV holding points this sweep does not write again is refused without overwrite (its rows would be
    lost), and replaced with it."""
    data = tmp_path / "sweep.csv"
    first = run_sweep(dict(ONE_POINT, store_dir=str(tmp_path / "st"), data_file=str(data)), progress=False)
    before = data.read_bytes()
    other = dict(ONE_POINT, prompt_lens=[2048], store_dir=str(tmp_path / "st"), data_file=str(data))
    with pytest.raises(ValueError, match=rf"holds {len(first)} of {len(first)} rows this sweep does not write .*"
                                         r"first: row 2: glm-5 8 h200 16384 1024 .*--overwrite"):
        run_sweep(other, progress=False)
    assert data.read_bytes() == before
    again = run_sweep(dict(ONE_POINT, store_dir=str(tmp_path / "st"), data_file=str(data)), progress=False)
    assert len(again) == len(first)  # the same grid replaces its own CSV
    run_sweep(dict(other, overwrite=True), progress=False)
    assert set(__import__("pandas").read_csv(data)["prompt_len"]) == {2048}


def test_default_outputs_of_another_grid_give_a_named_report(tmp_path, monkeypatch):
    """The README's sweep examples replaced ``reports/padding_sweep.html`` and ``data/padding_sweep.csv`` (1,344 ->
    504 rows) without a word: now the plan names another report and CSV and says why in one line each."""
    monkeypatch.chdir(tmp_path)
    run_sweep(dict(ONE_POINT, store_dir="data/sweeps/padding_sweep", data_file="data/padding_sweep.csv"),
              progress=False)
    (tmp_path / "reports" / "runs").mkdir(parents=True)
    (tmp_path / "reports" / "padding_sweep.html").write_text("<html>the main report</html>")
    # published as the lab publishes it (a run record naming it): --overwrite replaces only the lab's own report
    (tmp_path / "reports" / "runs" / "r0.html").write_text("<html>run r0</html>")
    (tmp_path / "reports" / "runs" / "r0.json").write_text(json.dumps(
        {"run_id": "r0", "html": "runs/r0.html", "report_name": "padding_sweep", "params": {}}))
    before = _digest(tmp_path)
    argv = ["sweep", "--dry-run", *sum((["-p", k, json.dumps(v)] for k, v in ONE_POINT.items()
                                        if k != "prompt_lens"), []), "-p", "prompt_lens", "[2048]"]
    rc, out, err = _main(argv, tmp_path, monkeypatch)
    assert rc == 0, err
    plan = json.loads(out)
    assert plan["report_name"].startswith("padding_sweep-") and plan["report_name"] != "padding_sweep"
    assert plan["data_file"].endswith(f"data/{plan['report_name']}.csv")
    assert any("reports/padding_sweep.html is another sweep's report: kept" in n for n in plan["notes"]), plan
    assert _digest(tmp_path) == before
    rc, out, err = _main([*argv, "--overwrite"], tmp_path, monkeypatch)
    assert rc == 0 and json.loads(out)["report_name"] == "padding_sweep", err
