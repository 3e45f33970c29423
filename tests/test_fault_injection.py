"""Fault injection (issue 14): a 2000-point sweep SIGKILLed at random moments, resumed each time, ends with exactly
the rows of an uninterrupted run.

The sweep runs in a child process (``python -c``). To keep 2000 points cheap, the child passes
:data:`FAKE_SRC`'s ``fake_rows`` as ``compute_fn`` to :func:`mla_lab.sweep.run_sweep`: a deterministic function of the
point (two rows, the baseline and vllm-53878's strategy, with values hashed from the point) that sleeps
``FAKE_DELAY_S``. The reference is an uninterrupted run of the same function. What is under test is the store and
the run loop: atomic point files, temp-file clean-up, claims of a killed sweep taken over, the CSV replaced
atomically. The code version is pinned in the child and here (edits to the package by other people while the test
runs must not change the point keys).

Kill moments are random (seeded; the seed is printed on failure): each kill waits until a random number of points
is stored (or, once, until every point is stored, so the kill lands in the claim release / CSV write), then a
random few milliseconds more, so kills land mid-write, between points and while claiming.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

import mla_lab.sweep.run as run_mod
from mla_lab.sweep import expand_grid, run_sweep, validate_params
from mla_lab.sweep.store import ResultStore

VERSION = "fault-injection-test"
GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[1, 2, 4, 8, 16], archs=["h200", "b200", "h20", "h100", "h800"],
            max_num_batched_tokens=[2048, 4096, 8192, 16384],
            prompt_lens=[256, 512, 1024, 2048, 3072, 4096, 8192, 16384, 32768, 65536],
            strategies=["vllm-53878"], device="cpu")  # 2 x 5 x 5 x 4 x 10 = 2000 points
N_POINTS = 2000
N_KILLS = 6
FAKE_DELAY_S = 0.0005
KEY_COLS = ["point_key", "model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "strategy",
            "status", "ttft_ms", "persistent_bytes", "code_version"]

FAKE_SRC = textwrap.dedent("""
    import hashlib, json, time

    def fake_rows(point, mode, delay=0.0):
        time.sleep(delay)
        h = int(hashlib.sha1(json.dumps(point, sort_keys=True).encode()).hexdigest()[:12], 16)
        base = {k: point[k] for k in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype")}
        return [dict(base, strategy=s, status="ok", reason="", source=mode, ttft_ms=(h % 1000003) / 7.0 + i,
                     persistent_bytes=(h >> (4 * i)) % (1 << 30))
                for i, s in enumerate(("per_call_empty:zeros", "private_workspace"))]
""")

# The child stops (blocks) before its (max_compute + 1)-th point when max_compute >= 0: a run meant to be killed
# mid-run never finishes on its own however late the parent, on a loaded machine, looks at the store.
CHILD = textwrap.dedent("""
    import json, sys, time
    import mla_lab.sweep.run as s
    s.code_version = lambda: {version!r}
    exec({fake!r})
    params, delay, max_compute = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    n = [0]
    def compute(pt, mode):
        if n[0] == max_compute:
            time.sleep(600)  # killed here
        n[0] += 1
        return fake_rows(pt, mode, delay)
    s.run_sweep(params, progress=True, compute_fn=compute)
""").format(version=VERSION, fake=FAKE_SRC)
#: A run killed mid-run stops at most this many points past its kill target (if the parent has not killed it yet).
STOP_AFTER_TARGET = 50


def _fake():
    ns: dict = {}
    exec(FAKE_SRC, ns)
    return ns["fake_rows"]


def _params(tmp: Path, name: str) -> dict:
    return dict(GRID, store_dir=str(tmp / name), data_file=str(tmp / f"{name}.csv"), report_dir=str(tmp / "rep"))


def _n_stored(points: Path) -> int:
    with os.scandir(points) as it:
        return sum(1 for e in it if e.name.endswith(".json"))


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df[KEY_COLS].sort_values(["point_key", "strategy"]).reset_index(drop=True)


def test_grid_has_2000_points():
    assert len(expand_grid(validate_params(GRID))) == N_POINTS


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    seed = int(os.environ.get("MLA_LAB_FAULT_SEED", random.SystemRandom().randrange(1 << 30)))
    rng = random.Random(seed)
    params = _params(tmp_path, "st")
    points = Path(params["store_dir"]) / "points"
    # targets: stored-point counts at which to kill (one at "all stored": the claim release / CSV write phase)
    targets = sorted(rng.sample(range(1, N_POINTS), N_KILLS - 1)) + [N_POINTS]
    kills, log = [], []
    t_start = time.time()
    for i, target in enumerate(targets):
        err = tmp_path / f"run{i}.err"
        before = _n_stored(points) if points.is_dir() else 0
        # stop at most STOP_AFTER_TARGET points past the target, and before the last point (the last run: never)
        max_compute = -1 if target == N_POINTS else min(target + STOP_AFTER_TARGET, N_POINTS - 1) - before
        with open(err, "w") as f:
            proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(params), str(FAKE_DELAY_S),
                                     str(max_compute)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=f)
        try:
            t0 = time.time()
            while proc.poll() is None and (not points.is_dir() or _n_stored(points) < target):
                assert time.time() - t0 < 300, f"seed {seed}: run {i} made no progress to {target} points"
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.02))
            killed = proc.poll() is None
            if killed:
                os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)
        n = _n_stored(points) if points.is_dir() else 0
        log.append(f"run {i}: target {target}, killed={killed}, rc={proc.returncode}, stored {n}")
        if killed:
            assert proc.returncode == -signal.SIGKILL, log
            kills.append(n)
        else:
            assert proc.returncode == 0, (log, err.read_text()[-2000:])
        # after every kill: only whole points are visible
        store = ResultStore(params["store_dir"])
        payloads = store.load()
        assert store.corrupt == [], (seed, log)
        assert all(p["status"] == "ok" and len(p["rows"]) == 2 for p in payloads), (seed, log)
    mid_run = [n for n in kills if n < N_POINTS]
    assert len(mid_run) >= 5, f"seed {seed}: only {len(mid_run)} kills landed mid-run: {log}"

    # the last resume, left to finish (in this process, same pinned code version)
    monkeypatch.setattr(run_mod, "code_version", lambda: VERSION)
    df = run_sweep(params, progress=False, compute_fn=lambda pt, mode: _fake()(pt, mode))
    elapsed = time.time() - t_start
    store = ResultStore(params["store_dir"])
    assert _n_stored(points) == N_POINTS
    assert store.tmp_files() == [], f"seed {seed}: temp files left: {store.tmp_files()[:3]}"
    assert list(points.glob("*.claim")) == [], f"seed {seed}: claims left"
    assert not list(tmp_path.glob(".st.csv.*")), "CSV temp file left"

    # an uninterrupted run of the same function on a store of its own
    ref = run_sweep(_params(tmp_path, "ref"), progress=False, compute_fn=lambda pt, mode: _fake()(pt, mode))
    assert ref["point_key"].nunique() == N_POINTS and len(ref) == 2 * N_POINTS
    assert df["point_key"].nunique() == N_POINTS and len(df) == 2 * N_POINTS
    pd.testing.assert_frame_equal(_sorted(df), _sorted(ref))
    csv = pd.read_csv(params["data_file"])
    pd.testing.assert_frame_equal(_sorted(csv), _sorted(pd.read_csv(_params(tmp_path, "ref")["data_file"])))
    print(f"fault injection: seed {seed}, {len(kills)} kills at stored counts {kills}, kill/resume phase "
          f"{elapsed:.1f} s; " + "; ".join(log))
