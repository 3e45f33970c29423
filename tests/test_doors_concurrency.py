"""Issue 32: concurrent sweeps into one data file never attach one run's rows to another run (the second is refused
in one line while the first holds the data file), and ``--executor ray`` starts no Ray when nothing is to compute."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import subprocess
import sys
import textwrap
import time

import pytest

from mla_lab import cli
from mla_lab.paths import REPO_ROOT
from mla_lab.sweep import run_sweep

ONE_POINT = dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384], prompt_lens=[1024],
                 strategies=["vllm-53878"], device="cpu", check_equivalence=False)

HOLDER = textwrap.dedent("""
    import sys, time
    from mla_lab.sweep import run_sweep
    import mla_lab.sweep.run as run

    slow = run.compute_rows
    def compute(pt, mode):  # a sweep still computing when the other one starts
        time.sleep(float(sys.argv[3]))
        return slow(pt, mode)
    run_sweep(dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384],
                   prompt_lens=[int(sys.argv[4])], strategies=["vllm-53878"], device="cpu", check_equivalence=False,
                   store_dir=sys.argv[1], data_file=sys.argv[2]), progress=False, compute_fn=compute)
""")


def test_a_second_sweep_into_the_same_data_file_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    data = tmp_path / "sweep.csv"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "st"), str(data), "6", "1024"], env=env,
                             stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)  # the first sweep is computing its point
        assert first.poll() is None
        with pytest.raises(ValueError, match=r"data_file=.*sweep\.csv' is being written by another sweep \(.*pid="
                                             rf"{first.pid}\); allowed: wait"):
            run_sweep(dict(ONE_POINT, store_dir=str(tmp_path / "st2"), data_file=str(data)), progress=False)
        monkeypatch.chdir(tmp_path)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main(["sweep", "--dry-run", "-p", "data_file", str(data), "-p", "tp_sizes", "[8]"])
        assert rc == 2 and "is being written by another sweep" in err.getvalue(), err.getvalue()
    finally:
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
    import pandas as pd

    assert set(pd.read_csv(data)["prompt_len"]) == {1024}  # only the first run's rows
    run_sweep(dict(ONE_POINT, store_dir=str(tmp_path / "st"), data_file=str(data)), progress=False)  # free again


def test_the_cli_hands_its_lock_to_the_kernel_and_refuses_others(tmp_path):
    """The CLI holds the data file's lock from the kernel's sweep to its copy under runs/: the sweep in the kernel
    runs under it (the token it was handed), any other process is refused."""
    from mla_lab.sweep.run import LOCK_ENV, data_file_lock

    data = tmp_path / "sweep.csv"
    with data_file_lock(data, token="tok123") as lock:
        os.environ[LOCK_ENV] = f"{lock}|tok123"
        try:
            df = run_sweep(dict(ONE_POINT, store_dir=str(tmp_path / "st"), data_file=str(data)), progress=False)
        finally:
            os.environ.pop(LOCK_ENV)
        assert len(df) and data.is_file()
        with open(lock) as f, pytest.raises(BlockingIOError):  # still held by the CLI's lock
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("ray") is None, reason="needs the optional ray package")
def test_ray_is_not_started_when_every_point_is_stored(tmp_path, monkeypatch):
    """``--executor ray`` started a Ray cluster even when every point was stored (54 s vs 15 s for the same no-op)."""
    import ray

    params = dict(ONE_POINT, store_dir=str(tmp_path / "st"), data_file=str(tmp_path / "x.csv"))
    first = run_sweep(params, progress=False)
    started = []
    real_init = ray.init
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(a) or real_init(*a, **k))
    t0 = time.perf_counter()
    again = run_sweep(dict(params, executor="ray"), progress=False)
    assert not started, "Ray was started for a sweep with nothing to compute"
    assert len(again) == len(first) and time.perf_counter() - t0 < 10
