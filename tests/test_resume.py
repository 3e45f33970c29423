"""Resumable, fault-tolerant sweeps (issue 6): a sweep SIGKILLed mid-run loses nothing and a re-run completes it with
exactly one row set per point; ``force`` recomputes; a failing point is recorded and the sweep goes on; progress
(points done / total, ETA) goes to stderr.

The sweep runs in a child process (``python -c``) whose hooks are monkeypatched in the child only, never in the
library: a per-point delay in ``price_point``, and (mode ``mid_write``) a ``json.dump`` that writes half of one
point's payload to the store's temporary file and then hangs, so the SIGKILL lands while a half-written file exists.

The code version is pinned to a constant in the child and here, so that edits to the package by other people while
the test runs cannot change the point keys between the killed run and the re-run (the keys' dependence on the code
version is tested in tests/test_sweep.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

import mla_lab.sweep.rows as rows_mod
import mla_lab.sweep.run as sweep_mod
from mla_lab.placement import BASELINE, expand_strategies
from mla_lab.report.data import failed_points
from mla_lab.sweep import expand_grid, run_sweep, validate_params
from mla_lab.sweep.store import ResultStore

REPO = Path(__file__).resolve().parent.parent
VERSION = "resume-test"
GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[1, 2, 4, 8], archs=["h200", "b200"],
            max_num_batched_tokens=[8192, 16384], prompt_lens=[1024], device="cpu",
            strategies=["vllm-53878", "sglang"])  # 32 points
N_POINTS = 2 * 4 * 2 * 2
N_STRATEGIES = len(expand_strategies([BASELINE, *GRID["strategies"]]))  # the baseline is always priced
KEY_COLS = ["point_key", "model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "strategy",
            "status", "num_heads", "q_concat_heads", "persistent_bytes", "step_transient_bytes", "extra_persistent_bytes",
            "ttft_ms", "ttft_change_pct", "code_version"]

CHILD = textwrap.dedent("""
    import json, sys, time
    import mla_lab.sweep.run as s, mla_lab.sweep.rows as r
    params, delay, hang_after = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    s.code_version = lambda: {version!r}
    real_price = r.modelled_rows
    def slow_price(pt, *a, **k):
        time.sleep(delay)
        return real_price(pt, *a, **k)
    r.modelled_rows = slow_price
    if hang_after >= 0:
        real_dump, n = json.dump, [0]
        def half_dump(obj, f, **kw):
            n[0] += 1
            if n[0] <= hang_after:
                return real_dump(obj, f, **kw)
            text = json.dumps(obj, **kw)
            f.write(text[: len(text) // 2])
            f.flush()
            sys.stderr.write("HANGING_IN_WRITE\\n")
            sys.stderr.flush()
            time.sleep(600)  # killed here, a half-written temporary file on disk
        json.dump = half_dump
    s.run_sweep(params, progress=True)
""").format(version=VERSION)


def _params(tmp: Path, name: str, **over) -> dict:
    return dict(GRID, store_dir=str(tmp / name), data_file=str(tmp / f"{name}.csv"), report_dir=str(tmp / "rep"),
                **over)


def _points(store_dir: str) -> list[Path]:
    return sorted((Path(store_dir) / "points").glob("*.json"))


def _wait_for(pred, proc, timeout=60.0, what=""):
    t0 = time.time()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"child exited (rc={proc.returncode}) before {what}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _check_one_row_set_per_point(df: pd.DataFrame) -> None:
    assert df["point_key"].nunique() == N_POINTS
    assert (df.groupby("point_key").size() == N_STRATEGIES).all()
    assert not df.duplicated(["model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype",
                              "strategy"]).any()
    assert df["status"].isin(["ok", "does_not_fit", "tips_out"]).all()  # computed: priced or listed as not loading


def _sorted_keys(df: pd.DataFrame) -> pd.DataFrame:
    return df[KEY_COLS].sort_values(["point_key", "strategy"]).reset_index(drop=True)


@pytest.fixture
def pinned(monkeypatch):
    monkeypatch.setattr(sweep_mod, "code_version", lambda: VERSION)
    calls = []
    real = rows_mod.modelled_rows

    def counting(pt, *a, **k):
        calls.append(pt)
        return real(pt, *a, **k)

    monkeypatch.setattr(rows_mod, "modelled_rows", counting)
    return calls


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Rows of an uninterrupted run of the same grid (same pinned code version)."""
    tmp = tmp_path_factory.mktemp("ref")
    mp = pytest.MonkeyPatch()
    mp.setattr(sweep_mod, "code_version", lambda: VERSION)
    try:
        df = run_sweep(_params(tmp, "ref"), progress=False)
    finally:
        mp.undo()
    _check_one_row_set_per_point(df)
    return df


@pytest.mark.parametrize("mode", ["mid_write", "between_points"])
def test_sigkill_mid_run_then_resume_loses_nothing(mode, tmp_path, pinned, reference, capsys):
    params = _params(tmp_path, "st")
    k_done = 5
    hang_after = k_done if mode == "mid_write" else -1
    delay = 0.0 if mode == "mid_write" else 0.15
    err_path = tmp_path / "child.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(params), str(delay), str(hang_after)],
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    store = ResultStore(params["store_dir"])
    try:
        if mode == "mid_write":
            # k points stored, the next one half-written, the child hanging inside the write
            _wait_for(lambda: "HANGING_IN_WRITE" in err_path.read_text(), proc, what="the child hanging in a write")
        else:
            _wait_for(lambda: len(_points(params["store_dir"])) >= k_done, proc, what=f"{k_done} points")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # --- after the kill: only whole points are visible; no temp file is read as a point
    stored = _points(params["store_dir"])
    n_stored = len(stored)
    assert k_done <= n_stored < N_POINTS  # killed mid-run
    payloads = ResultStore(params["store_dir"]).load()
    assert len(payloads) == n_stored and ResultStore(params["store_dir"]).corrupt == []
    assert all(p["status"] == "ok" and len(p["rows"]) == N_STRATEGIES for p in payloads)
    tmps = store.tmp_files()
    if mode == "mid_write":
        assert n_stored == k_done and len(tmps) == 1
        with pytest.raises(json.JSONDecodeError):  # really half-written ...
            json.loads(tmps[0].read_text())
        assert not tmps[0].name.endswith(".json")  # ... and never globbed as a point
    # progress reached the terminal (stderr) before the kill: points done / total with an ETA
    child_err = err_path.read_text()
    assert re.search(rf"\[mla-lab\] {N_POINTS} point\(s\), 0 already stored", child_err)
    # (the line of point i is printed after point i is stored, so the last stored point's line may be missing)
    assert re.search(rf"\[mla-lab\] {n_stored - 1}/{N_POINTS} points  elapsed \d+\.\ds  ETA \d+\.\ds", child_err)
    mtimes = {p.name: p.stat().st_mtime_ns for p in stored}

    # --- re-run: computes only the missing points, keeps the stored ones, cleans the dead child's temp file
    capsys.readouterr()
    df = run_sweep(params, progress=True)
    err = capsys.readouterr().err
    assert f"{N_POINTS} point(s), {n_stored} already stored" in err
    assert len(pinned) == N_POINTS - n_stored
    assert {p.name: p.stat().st_mtime_ns for p in stored} == mtimes  # not rewritten
    assert store.tmp_files() == []
    assert len(_points(params["store_dir"])) == N_POINTS
    _check_one_row_set_per_point(df)
    pd.testing.assert_frame_equal(_sorted_keys(df), _sorted_keys(reference))
    assert len(pd.read_csv(params["data_file"])) == N_POINTS * N_STRATEGIES

    # --- a second re-run computes nothing and adds no rows
    pinned.clear()
    df2 = run_sweep(params, progress=False)
    assert pinned == [] and len(df2) == N_POINTS * N_STRATEGIES

    # --- force=True recomputes every point, still one row set per point
    df3 = run_sweep(dict(params, force=True), progress=False)
    assert len(pinned) == N_POINTS
    assert all(p.stat().st_mtime_ns != mtimes[p.name] for p in stored)
    _check_one_row_set_per_point(df3)
    pd.testing.assert_frame_equal(_sorted_keys(df3), _sorted_keys(reference))


def test_injected_failure_is_recorded_others_complete_and_retry_fixes_it(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(sweep_mod, "code_version", lambda: VERSION)
    params = _params(tmp_path, "st", models=["glm-5"], max_num_batched_tokens=[16384])  # 8 points
    n = len(expand_grid(validate_params(params)))
    real = rows_mod.modelled_rows
    calls = []

    def flaky(pt, *a, **k):
        calls.append(pt)
        if pt["tp"] == 2 and pt["arch"] == "b200":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (injected)")
        return real(pt, *a, **k)

    monkeypatch.setattr(rows_mod, "modelled_rows", flaky)
    df = run_sweep(params, progress=True)
    err = capsys.readouterr().err
    assert len(calls) == n
    assert "point failed (OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB (injected))" in err
    assert f"{n}/{n} points" in err  # the sweep went on to the end
    # computed points: priced (ok) or listed as not loading (does_not_fit / tips_out: a result, not a failure)
    ok, bad = df[df["status"].isin(["ok", "does_not_fit", "tips_out"])], df[df["status"] == "failed"]
    assert len(ok) == (n - 1) * N_STRATEGIES and ok["point_key"].nunique() == n - 1
    assert len(bad) == 1
    fp = failed_points(df)
    assert len(fp) == 1
    row = fp.iloc[0]
    assert (row["model"], row["tp"], row["arch"], row["status"]) == ("glm-5", 2, "b200", "failed")
    assert row["reason"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB (injected)"
    # the CSV written for the report holds the failed point too, not silently dropped
    csv = pd.read_csv(params["data_file"])
    assert len(failed_points(csv)) == 1 and len(csv) == len(df)

    # re-run without the fault: only the failed point is retried (an OOM on a shared GPU may not recur)
    counted = []
    monkeypatch.setattr(rows_mod, "modelled_rows", lambda pt, *a, **k: counted.append(pt) or real(pt, *a, **k))
    df2 = run_sweep(params, progress=True)
    err2 = capsys.readouterr().err
    assert f"{n - 1} already stored, 1 failed before (retried)" in err2
    assert [(p["tp"], p["arch"]) for p in counted] == [(2, "b200")]
    assert df2["status"].isin(["ok", "does_not_fit", "tips_out"]).all() and len(df2) == n * N_STRATEGIES
    assert len(failed_points(df2)) == 0


def test_progress_shows_done_total_and_eta(tmp_path, capsys):
    params = _params(tmp_path, "st", models=["glm-5"], tp_sizes=[4, 8], archs=["h200"],
                     max_num_batched_tokens=[16384])  # 2 points
    run_sweep(params, progress=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[mla-lab]")]
    assert re.fullmatch(r"\[mla-lab\] 2 point\(s\), 0 already stored, code \w+, device cpu", lines[0])
    prog = [re.fullmatch(r"\[mla-lab\] (\d+)/(\d+) points  elapsed (\d+\.\d)s  ETA (\d+\.\d)s", ln) for ln in lines[1:]]
    assert all(prog) and [(int(m[1]), int(m[2])) for m in prog] == [(1, 2), (2, 2)]
    assert float(prog[-1][4]) == 0.0  # nothing left
    # resumed: nothing to compute, the header says so
    run_sweep(params, progress=True)
    err = capsys.readouterr().err
    assert "2 point(s), 2 already stored" in err and "/2 points" not in err


def _data_copy(tmp: Path) -> Path:
    """A copy of data/models and data/calibration (what a point reads) for MLA_LAB_DATA."""
    data = tmp / "data"
    shutil.copytree(REPO / "data" / "models", data / "models")
    if (REPO / "data" / "calibration").is_dir():
        shutil.copytree(REPO / "data" / "calibration", data / "calibration")
    return data


def test_editing_an_input_file_changes_the_point_key_and_the_rerun_recomputes(tmp_path, pinned, monkeypatch,
                                                                                capsys):
    """Issue 14, stale results: edit the model's config.json (64 -> 128 heads) and re-run: the point is recomputed
    (not "1 already stored") and the CSV says 16 heads per rank; editing a calibration CSV does the same; an
    unchanged re-run computes nothing."""
    data = _data_copy(tmp_path)
    monkeypatch.setenv("MLA_LAB_DATA", str(data))
    params = _params(tmp_path, "st", models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384])
    df1 = run_sweep(params, progress=False)
    assert len(pinned) == 1 and set(df1["num_heads"]) == {8}
    key1 = set(df1["point_key"])

    pinned.clear()
    run_sweep(params, progress=True)
    assert pinned == [] and "1 point(s), 1 already stored" in capsys.readouterr().err

    cfg_path = data / "models" / "glm-5" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_attention_heads"] = 128
    cfg_path.write_text(json.dumps(cfg, indent=2))
    df2 = run_sweep(params, progress=True)
    assert "1 point(s), 0 already stored" in capsys.readouterr().err
    assert len(pinned) == 1
    assert set(df2["num_heads"]) == {16} and set(df2["point_key"]).isdisjoint(key1)
    csv = pd.read_csv(params["data_file"])
    assert set(csv["num_heads"]) == {16}  # the CSV of this grid holds the current config's rows only

    cal = sorted((data / "calibration").glob("*.csv"))
    if not cal:
        pytest.skip("no calibration CSV in data/ to edit")
    pinned.clear()
    with open(cal[0], "a") as f:
        f.write("\n")  # any byte of a file the point reads
    df3 = run_sweep(params, progress=False)
    assert len(pinned) == 1 and set(df3["point_key"]).isdisjoint(set(df2["point_key"]))
