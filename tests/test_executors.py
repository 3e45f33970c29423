"""Sweep executors (issue 7): the Ray executor on a local Ray instance (CPU only) gives the same rows as the local
executor, into the same store (same keys, no duplicates, failures recorded per point), and ray stays optional.

Ray starts once for the module (``ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)``: 14-21 s on an idle
2-core machine). ``num_gpus=1`` declares a *fake* GPU resource so that the routing of measured points (one GPU each,
a fresh worker each) can be checked without a GPU; measured rows there come from a stand-in ``measure_fn``. The
papermill test connects the notebook's executor to that same instance (``--address``), so Ray starts once.

Ray 2.60 gives a starting node 30 s (hard-coded in ``ray._private.node.Node``: "The current node timed out during
startup") to register with its GCS; a loaded machine can take longer. The fixture lets the start take up to
:data:`RAY_START_S` seconds (``MLA_LAB_RAY_START_S``) by waiting inside the lookup that loop retries, and skips the
Ray tests with Ray's own error only when Ray cannot start within that.

Skipped when ray is not importable *and* not in CI; with ``CI=true`` a missing ray is a failure (``make test``
installs it through the ``dev`` extra).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from mla_lab.provenance import PROVENANCE_COLUMNS
from mla_lab.sweep import expand_grid, run_sweep, validate_params
from mla_lab.sweep.executors import LocalExecutor, RayExecutor, make_executor, ray_available
from mla_lab.sweep.store import ResultStore

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"
# 2 models x 3 TP (tp=3 fails for both: a failing point per model) x 2 archs x 2 prompt lengths = 24 points
# strategies: the PR and the bound; with the baseline, which is always priced, 3 rows per point
GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[3, 4, 8], archs=["h200", "b200"],
            max_num_batched_tokens=[16384], prompt_lens=[1024, 8192], device="cpu",
            strategies=["fused", "kernel_native"])


def _need_ray():
    if ray_available():
        return
    if IN_CI:
        pytest.fail("ray is not importable but CI=true: `make test` must install it (dev extra lists ray)")
    pytest.skip("ray is not installed (pip install 'mla_lab[ray]'); outside CI this test is skipped")


#: Seconds a local Ray instance may take to start (Ray's own limit for the node to register is 30 s).
RAY_START_S = float(os.environ.get("MLA_LAB_RAY_START_S", "300"))


def _init_local_ray(ray, timeout_s: float = RAY_START_S, **kw) -> None:
    """``ray.init(**kw)`` for a local instance that may take up to ``timeout_s`` to start on a loaded machine.

    Ray's start-up loop calls ``ray._private.services.get_node`` until the new node is registered and gives up after
    30 s; here each call of it retries for the rest of ``timeout_s`` (the loop's first call then returns once the
    node is there). Skips (Ray's error as the reason) only when Ray cannot start within ``timeout_s``."""
    import ray._private.services as services

    real_get_node = services.get_node
    deadline = time.monotonic() + timeout_s

    def patient_get_node(*a, **k):
        while True:
            try:
                return real_get_node(*a, **k)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    services.get_node = patient_get_node
    t0 = time.monotonic()
    try:
        ray.init(**kw)
    except Exception as e:  # any start failure: reported as the skip's reason
        ray.shutdown()
        pytest.skip(f"a local Ray instance could not start within {timeout_s:g} s "
                    f"({time.monotonic() - t0:.0f} s spent): {type(e).__name__}: {e}")
    finally:
        services.get_node = real_get_node


@pytest.fixture(scope="module")
def ray_session():
    _need_ray()
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stand-in measure_fn below ships by value
    started = not ray.is_initialized()
    if started:
        _init_local_ray(ray, num_cpus=2, num_gpus=1, include_dashboard=False, logging_level="warning")
    yield ray
    if started:
        ray.shutdown()


def _params(tmp: Path, name: str, **over) -> dict:
    return dict(GRID, store_dir=str(tmp / name), data_file=str(tmp / f"{name}.csv"), **over)


def _non_provenance(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in df.columns if c not in PROVENANCE_COLUMNS]
    return df[cols].sort_values(["point_key", "strategy"], na_position="first").reset_index(drop=True)


@pytest.mark.slow
def test_ray_rows_equal_local_rows(ray_session, tmp_path, capsys):
    local = run_sweep(_params(tmp_path, "local"), progress=False)
    with RayExecutor() as ex:
        remote = run_sweep(_params(tmp_path, "ray", executor="ray"), progress=True, executor=ex)
    err = capsys.readouterr().err
    n = len(expand_grid(validate_params(GRID)))
    assert "[mla-lab] executor ray (local: 2 CPU, 1 GPU)" in err
    assert f"{n}/{n} points" in err
    # same columns, same rows on everything but provenance (timestamps differ)
    assert list(remote.columns) == list(local.columns)
    pd.testing.assert_frame_equal(_non_provenance(remote), _non_provenance(local))
    # same store: one file per key, the same keys, the same statuses
    ls, rs = ResultStore(tmp_path / "local"), ResultStore(tmp_path / "ray")
    lk = sorted(p.stem for p in ls.points.glob("*.json"))
    rk = sorted(p.stem for p in rs.points.glob("*.json"))
    assert lk == rk and len(rk) == n
    assert {k: ls.status(k) for k in lk} == {k: rs.status(k) for k in rk}
    assert rs.tmp_files() == []
    # the failing points (tp=3) are recorded under Ray too, with the local reason
    bad = remote[remote["status"] == "failed"]
    assert len(bad) == 2 * 2 * 2 and set(bad["tp"]) == {3}
    assert bad["reason"].str.startswith("ValueError: tp=3 does not divide num_attention_heads").all()
    assert not remote.duplicated(["point_key", "strategy"]).any()
    assert pd.read_csv(tmp_path / "ray.csv").shape[0] == len(remote)


@pytest.mark.slow
def test_ray_resumes_a_local_store_and_retries_failures(ray_session, tmp_path, capsys):
    params = _params(tmp_path, "st", models=["glm-5"], prompt_lens=[1024])  # 6 points, 2 failing
    run_sweep(params, progress=False)
    files = sorted((tmp_path / "st" / "points").glob("*.json"))
    mtimes = {p.name: p.stat().st_mtime_ns for p in files}
    with RayExecutor() as ex:
        df = run_sweep(dict(params, executor="ray"), progress=True, executor=ex)
    err = capsys.readouterr().err
    assert "6 point(s), 4 already stored, 2 failed before (retried)" in err
    ok_files = [p for p in files if ResultStore(tmp_path / "st").status(p.stem) == "ok"]
    assert all(p.stat().st_mtime_ns == mtimes[p.name] for p in ok_files)  # ok points not recomputed
    assert len(df) == 4 * 3 + 2 and len(sorted((tmp_path / "st" / "points").glob("*.json"))) == 6


# ------------------------------------------------------------------------------------------------ measured routing

class _FakeH200Ray(RayExecutor):
    """A Ray executor that labels the cluster's (fake) GPU an H200: detect_arch still runs in a num_gpus task."""

    def detect_gpu(self, timeout_s: float = 120):
        info = super().detect_gpu(timeout_s)
        assert info["device"] == "cpu"  # no real GPU behind the fake resource
        return {**info, "arch": "h200", "prefill_padding": 64}


def _fake_measure(point, mode="measured"):
    """Stand-in for the measured rows (mla_lab.sweep.rows.measured_rows): where did it run, with which GPU ids?
    Modelled points go to the real row builder."""
    if mode == "modelled":
        from mla_lab.sweep.rows import compute_rows

        return compute_rows(point, mode)
    import os

    import ray

    if point["tp"] == 4 and point["arch"] == "h200" and point["prompt_len"] == 8192:
        raise RuntimeError("CUDA error: injected failure of a measured point")
    return [{"model": point["model"], "tp": point["tp"], "arch": point["arch"], "prompt_len": point["prompt_len"],
             "strategy": s, "source": "measured", "status": "ok", "reason": "", "gpu_ids": str(ray.get_gpu_ids()),
             "pid": os.getpid()} for s in ("unfused", "fused")]


@pytest.mark.slow
def test_measured_points_hold_one_gpu_each_and_failures_are_recorded(ray_session, tmp_path):
    params = _params(tmp_path, "m", models=["glm-5"], tp_sizes=[4, 8], device="cuda")
    with _FakeH200Ray() as ex:
        assert ex.resolve_device("auto") == "cuda"  # the cluster declares a GPU
        df = run_sweep(params, progress=False, compute_fn=_fake_measure, executor=ex)
    meas = df[df["source"] == "measured"]
    # hopper-family archs only (h200), 2 TP x 2 prompt lengths = 4 measured points, one failed
    assert set(meas["arch"]) == {"h200"}
    ok = meas[meas["status"] == "ok"]
    assert len(ok) == 3 * 2 and set(ok["gpu_ids"]) == {"[0]"}
    assert ok.groupby("point_key")["pid"].nunique().eq(1).all()
    assert ok["pid"].nunique() == 3  # a fresh worker per measured point (max_calls=1)
    bad = df[df["status"] == "failed"]
    assert len(bad) == 1 and bad.iloc[0]["reason"] == "RuntimeError: CUDA error: injected failure of a measured point"
    mod = df[df["source"] == "modelled"]
    assert len(mod) == 2 * 2 * 2 * 3 and mod["status"].isin(["ok", "does_not_fit", "tips_out"]).all()


def _die(point, mode="measured"):
    if mode == "modelled":
        from mla_lab.sweep.rows import compute_rows

        return compute_rows(point, mode)
    os._exit(3)


@pytest.mark.slow
def test_lost_task_is_recorded_not_fatal(ray_session, tmp_path):
    params = _params(tmp_path, "d", models=["glm-5"], tp_sizes=[8], archs=["h200"], prompt_lens=[1024],
                     device="cuda")
    with _FakeH200Ray(max_retries=0) as ex:
        df = run_sweep(params, progress=False, compute_fn=_die, executor=ex)
    bad = df[df["status"] == "failed"]
    assert len(bad) == 1 and "Error" in bad.iloc[0]["reason"].split(":")[0]  # Ray's own error type, e.g. WorkerCrashedError
    assert (df[df["status"] == "ok"]["source"] == "modelled").all()


# ------------------------------------------------------------------------------------------------ optional ray

def test_importing_mla_lab_never_imports_ray():
    code = ("import sys, mla_lab, mla_lab.sweep, mla_lab.sweep.executors, mla_lab.cli; "
            "mla_lab.sweep.validate_params({}); assert 'ray' not in sys.modules, 'ray imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]


def test_missing_ray_gives_clear_errors(monkeypatch):
    import mla_lab.sweep.executors as ex_mod

    monkeypatch.setattr(ex_mod, "ray_available", lambda: False)
    with pytest.raises(ValueError, match=r"executor='ray' needs the optional ray package.*mla_lab\[ray\]"):
        validate_params({"executor": "ray"})
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match=r"executor='ray' needs the optional ray package.*mla_lab\[ray\]"):
        make_executor("ray")


@pytest.mark.parametrize("raw,match", [
    ({"executor": "dask"}, r"executor='dask' is not allowed; allowed: \['local', 'ray'\]"),
    ({"ray_address": "auto"}, r"ray_address='auto' is only used with executor='ray'"),
    ({"executor": "ray", "ray_address": 6379}, r"ray_address=6379 must be a Ray address string"),
])
def test_executor_params_errors(raw, match, monkeypatch):
    import mla_lab.sweep.executors as ex_mod

    monkeypatch.setattr(ex_mod, "ray_available", lambda: True)
    with pytest.raises(ValueError, match=match):
        validate_params(raw)


def test_local_executor_is_the_default():
    p = validate_params({})
    assert p.executor == "local" and p.ray_address is None
    assert isinstance(make_executor(p.executor), LocalExecutor)
    with pytest.raises(ValueError, match="executor='local' takes no address"):
        make_executor("local", address="auto")


# ------------------------------------------------------------------------------------------------ papermill front door

def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "mla_lab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_cli_notebook_fans_out_on_ray(ray_session, tmp_path):
    """The notebook's sweep on Ray, joining this module's local instance by its address (a second local start in
    the notebook's kernel would meet Ray's 30 s start-up limit on a loaded machine)."""
    address = ray_session.get_runtime_context().gcs_address
    r = _cli("sweep", "--executor", "ray", "--address", address, "-p", "models", "[glm-5]", "-p", "tp_sizes", "[4, 8]", "-p", "archs",
             "[h200]", "-p", "prompt_lens", "[1024]", "-p", "max_num_batched_tokens", "[16384]", "-p", "device", "cpu",
             "-p", "check_equivalence", "false", "-p", "strategies", "[fused, kernel_native]",
             "-p", "store_dir", str(tmp_path / "st"), "-p", "data_file",
             str(tmp_path / "s.csv"), "-p", "report_dir", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_csv(tmp_path / "s.csv")
    assert len(df) == 2 * 3 and df["status"].isin(["ok", "does_not_fit", "tips_out"]).all()
    executed = next((tmp_path / "rep" / "runs").glob("*.ipynb")).read_text()
    assert f"[mla-lab] executor ray ({address}: 2 CPU, 1 GPU)" in executed  # the notebook's sweep ran on this Ray
    assert "executor = \\\"ray\\\"" in executed  # injected by papermill


def test_cli_address_without_ray_executor_is_refused(tmp_path):
    r = _cli("sweep", "--address", "auto", "-p", "report_dir", str(tmp_path))
    assert r.returncode == 2 and "ray_address='auto' is only used with executor='ray'" in r.stderr
