"""Two sweeps on one store (issue 14): per-point claim files (``ResultStore.claim``) make each point computed once,
and both sweeps finish with one row set per point.

The sweeps run as child processes (``python -c``) that pin the code version (so that edits to the package by other
people while the test runs cannot change the point keys) and wrap ``mla_lab.sweep.rows.modelled_rows`` in the child
only: every computation drops a marker file (one per computation, named by the point) and sleeps a little. Counting
the markers counts the computations.

No test depends on which process is faster (a loaded machine may start one child seconds after the other): the
overlap the tests need is made by files, not by time. ``barrier`` makes each child, once it has claimed its points
and before it computes any, wait until the other child has claimed too (so each sees the other's claims);
``hold_after=n`` makes a child stop before its (n+1)-th computation, its claims held, until the test writes the
``release`` file (or kills it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

import mla_lab.sweep.rows as rows_mod
import mla_lab.sweep.run as run_mod
from mla_lab.placement import BASELINE, expand_strategies
from mla_lab.sweep import expand_grid, run_sweep, validate_params
from mla_lab.sweep.store import ResultStore

VERSION = "claims-test"
GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[2, 4, 8], archs=["h200", "b200"],
            max_num_batched_tokens=[8192, 16384], prompt_lens=[1024, 4096], strategies=["vllm-53878"],
            device="cpu")  # 48 points
N_POINTS = 2 * 3 * 2 * 2 * 2
N_STRATEGIES = len(expand_strategies([BASELINE, *GRID["strategies"]]))
ID_COLS = ["model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "strategy"]
KEY_COLS = ["point_key", *ID_COLS, "status", "num_heads", "persistent_bytes", "ttft_ms", "ttft_change_pct"]

CHILD = textwrap.dedent("""
    import hashlib, json, os, sys, time, uuid
    from pathlib import Path
    import mla_lab.sweep.run as s, mla_lab.sweep.rows as r, mla_lab.sweep.executors as ex
    params, cfg = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    markers, go = Path(cfg["markers"]), Path(cfg["go"])
    s.code_version = lambda: {version!r}

    def wait_for(pred, what, timeout=300):
        t0 = time.time()
        while not pred():
            if time.time() - t0 > timeout:
                sys.exit(f"test child: timed out waiting for {{what}}")
            time.sleep(0.01)

    real = r.modelled_rows
    n = [0]
    def counted(pt, *a, **k):
        if cfg["hold_after"] is not None and n[0] == cfg["hold_after"]:
            Path(cfg["holding"]).write_text("holding")
            wait_for(Path(cfg["release"]).exists, "the release file")
        n[0] += 1
        name = hashlib.sha1(json.dumps(pt, sort_keys=True).encode()).hexdigest()[:16]
        (markers / f"{{name}}.{{os.getpid()}}.{{uuid.uuid4().hex[:8]}}").write_text(json.dumps(pt))
        time.sleep(cfg["delay"])
        return real(pt, *a, **k)
    r.modelled_rows = counted

    if cfg["barrier"]:  # every claim of this sweep is taken before it first calls the executor's run
        barrier, real_run, first = Path(cfg["barrier"]), ex.LocalExecutor.run, [True]
        def run_after_barrier(self, *a, **k):
            if first[0]:
                first[0] = False
                (barrier / str(os.getpid())).write_text("claimed")
                wait_for(lambda: len(list(barrier.iterdir())) >= cfg["barrier_n"], "the other sweep's claims")
            return real_run(self, *a, **k)
        ex.LocalExecutor.run = run_after_barrier
    wait_for(go.exists, "the go file")
    s.run_sweep(params, progress=True)
""").format(version=VERSION)


def _params(tmp: Path, csv: str) -> dict:
    return dict(GRID, store_dir=str(tmp / "store"), data_file=str(tmp / csv), report_dir=str(tmp / "rep"))


def _start(tmp: Path, params: dict, name: str, delay: float, go: Path, barrier: int = 0,
           hold_after: int | None = None) -> subprocess.Popen:
    """A sweep child (see the module docstring): ``barrier=n`` waits for n children's claims before computing;
    ``hold_after=n`` stops before the (n+1)-th computation until ``tmp/release`` exists (``tmp/<name>.holding``
    says it stopped)."""
    markers = tmp / "markers"
    markers.mkdir(exist_ok=True)
    cfg = {"markers": str(markers), "go": str(go), "delay": delay, "hold_after": hold_after,
           "holding": str(tmp / f"{name}.holding"), "release": str(tmp / "release"),
           "barrier": str(tmp / "barrier") if barrier else None, "barrier_n": barrier}
    if barrier:
        (tmp / "barrier").mkdir(exist_ok=True)
    with open(tmp / f"{name}.err", "w") as err:
        return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(params), json.dumps(cfg)],
                                cwd=tmp, stdout=subprocess.DEVNULL, stderr=err)


def _wait_until(pred, procs, what: str, timeout: float = 300) -> None:
    """Poll ``pred`` until true; fail (killing ``procs``) if one of them exits first or after ``timeout`` s."""
    t0 = time.time()
    while not pred():
        ended = [p for p in procs if p.poll() is not None]
        if ended or time.time() - t0 > timeout:
            for p in procs:
                p.kill()
            raise AssertionError(f"waiting for {what}: " + (f"a child ended (rc {ended[0].returncode})" if ended
                                                              else f"timed out after {timeout} s"))
        time.sleep(0.02)


def _wait(procs, timeout=300):
    t0 = time.time()
    for p in procs:
        try:
            p.wait(timeout=max(1, timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise


def _computations(tmp: Path) -> Counter:
    """Computations per point (marker files grouped by the point's hash)."""
    return Counter(p.name.split(".")[0] for p in (tmp / "markers").iterdir())


def _by_pid(tmp: Path) -> Counter:
    return Counter(p.name.split(".")[1] for p in (tmp / "markers").iterdir())


def _one_row_set_per_point(df: pd.DataFrame) -> None:
    assert df["point_key"].nunique() == N_POINTS
    assert (df.groupby("point_key").size() == N_STRATEGIES).all()
    assert not df.duplicated(ID_COLS).any()
    assert df["status"].isin(["ok", "does_not_fit", "tips_out"]).all()


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df[KEY_COLS].sort_values(["point_key", "strategy"]).reset_index(drop=True)


def _store_is_clean(tmp: Path) -> None:
    store = ResultStore(tmp / "store")
    assert len(list(store.points.glob("*.json"))) == N_POINTS
    assert list(store.points.glob("*.claim")) == [], "claims left behind"
    assert store.tmp_files() == []
    assert all(p["status"] == "ok" for p in store.load())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One sweep alone on its own store (same pinned code version)."""
    tmp = tmp_path_factory.mktemp("ref")
    mp = pytest.MonkeyPatch()
    mp.setattr(run_mod, "code_version", lambda: VERSION)
    try:
        df = run_sweep(_params(tmp, "ref.csv"), progress=False)
    finally:
        mp.undo()
    _one_row_set_per_point(df)
    return df


def test_grid_size():
    assert len(expand_grid(validate_params(GRID))) == N_POINTS


# (two sweeps into one data file: the second is refused while the first holds it, issue 32:
# tests/test_doors_concurrency.py; on one store with their own data files they share the points)
@pytest.mark.parametrize("same_csv", [False], ids=["own_data_files"])
def test_two_sweeps_started_together_compute_each_point_once(same_csv, tmp_path, reference):
    go = tmp_path / "go"
    pa, pb = _params(tmp_path, "rows.csv" if same_csv else "a.csv"), _params(tmp_path, "rows.csv" if same_csv
                                                                                else "b.csv")
    procs = [_start(tmp_path, pa, "a", 0.03, go, barrier=2), _start(tmp_path, pb, "b", 0.03, go, barrier=2)]
    go.write_text("go")  # both start claiming when ready; neither computes before both have claimed
    _wait(procs)
    errs = {n: (tmp_path / f"{n}.err").read_text() for n in "ab"}
    assert [p.returncode for p in procs] == [0, 0], errs
    per_point = _computations(tmp_path)
    assert len(per_point) == N_POINTS and set(per_point.values()) == {1}, per_point.most_common(3)
    _store_is_clean(tmp_path)
    for csv in {pa["data_file"], pb["data_file"]}:
        df = pd.read_csv(csv)
        _one_row_set_per_point(df)
        pd.testing.assert_frame_equal(_sorted(df), _sorted(reference), check_dtype=False)
    assert not list(tmp_path.glob(".*.tmp")), "a CSV temp file was left behind"
    # a sweep said it left the other's points to it (every point was claimed by one of them while the other tried)
    assert any("claimed by another sweep on this store: left to it" in e for e in errs.values()), errs


def _first_sweep_with_points(tmp_path, go, n: int = 5):
    """Start sweep ``a`` and return ``(process, store)`` once it has stored ``n`` points and stopped before the next
    one, every other point still claimed by it: it goes on when the test writes ``tmp_path/release``."""
    first = _start(tmp_path, _params(tmp_path, "a.csv"), "a", 0.01, go, hold_after=n)
    store = ResultStore(tmp_path / "store")
    _wait_until(lambda: (tmp_path / "a.holding").exists(), [first], f"the first sweep to store {n} points and stop")
    assert len(list(store.points.glob("*.json"))) == n
    return first, store


def test_a_sweep_started_later_waits_for_the_first_and_computes_nothing(tmp_path, reference):
    go = tmp_path / "go"
    go.write_text("go")
    first, store = _first_sweep_with_points(tmp_path, go)
    second = _start(tmp_path, _params(tmp_path, "b.csv"), "b", 0.01, go)
    _wait_until(lambda: "claimed by another sweep" in (tmp_path / "b.err").read_text(), [first, second],
                "the second sweep to find the first's claims")
    (tmp_path / "release").write_text("go on")
    _wait([first, second])
    assert [first.returncode, second.returncode] == [0, 0], (tmp_path / "b.err").read_text()
    assert len(_by_pid(tmp_path)) == 1 and _by_pid(tmp_path)[str(first.pid)] == N_POINTS  # all by the first
    err_b = (tmp_path / "b.err").read_text()
    assert "claimed by another sweep on this store: left to it" in err_b
    _store_is_clean(tmp_path)
    for csv in ("a.csv", "b.csv"):
        pd.testing.assert_frame_equal(_sorted(pd.read_csv(tmp_path / csv)), _sorted(reference), check_dtype=False)


def test_when_the_claiming_sweep_dies_the_waiting_one_takes_over(tmp_path, reference):
    """The first sweep is SIGKILLed (stopped before its 6th point, its claims held) while the second waits for its
    claims: the second computes the orphans (the dead one's claims are taken over), each point is computed and
    stored once."""
    go = tmp_path / "go"
    go.write_text("go")
    first, store = _first_sweep_with_points(tmp_path, go)
    second = _start(tmp_path, _params(tmp_path, "b.csv"), "b", 0.01, go)
    _wait_until(lambda: "claimed by another sweep" in (tmp_path / "b.err").read_text(), [first, second],
                "the second sweep to find the first's claims")
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    _wait([second])
    assert second.returncode == 0, (tmp_path / "b.err").read_text()
    per_point = _computations(tmp_path)
    assert len(per_point) == N_POINTS and set(per_point.values()) == {1}, per_point.most_common(3)
    assert _by_pid(tmp_path) == {str(first.pid): 5, str(second.pid): N_POINTS - 5}
    assert "claimed by a sweep that died: computing them here" in (tmp_path / "b.err").read_text()
    _store_is_clean(tmp_path)
    pd.testing.assert_frame_equal(_sorted(pd.read_csv(tmp_path / "b.csv")), _sorted(reference), check_dtype=False)


def test_a_point_stored_after_the_status_snapshot_is_not_recomputed(tmp_path, monkeypatch):
    """The race the claims must close: another sweep stores a point (and drops its claim) between this sweep's
    look at the store and its claim on the point. Modelled here by a status snapshot that sees nothing stored."""
    monkeypatch.setattr(run_mod, "code_version", lambda: VERSION)
    params = dict(_params(tmp_path, "rows.csv"), models=["glm-5"], tp_sizes=[8], max_num_batched_tokens=[16384],
                  prompt_lens=[1024])  # 2 points
    run_sweep(params, progress=False)  # "the other sweep": everything stored, claims released
    calls = []
    real = rows_mod.modelled_rows
    monkeypatch.setattr(rows_mod, "modelled_rows", lambda pt, *a, **k: calls.append(pt) or real(pt, *a, **k))
    real_status, seen = ResultStore.status, []

    def stale_status(self, key):  # the first look at each key: not stored yet
        if key not in seen:
            seen.append(key)
            return None
        return real_status(self, key)

    monkeypatch.setattr(ResultStore, "status", stale_status)
    df = run_sweep(params, progress=False)
    assert calls == [], "a point already stored by another sweep was computed again"
    assert df["point_key"].nunique() == 2 and df["status"].isin(["ok", "does_not_fit", "tips_out"]).all()


def test_claim_primitives(tmp_path):
    """A claim is visible only whole (host and pid), a live one is never taken, a dead one is taken over, a claim
    another process holds survives release, and stale claims of dead processes are cleaned."""
    store = ResultStore(tmp_path / "store")
    assert store.claim("k1") and store.claim_path("k1").read_text().split()[1] == str(os.getpid())
    assert store.claim("k1") is False and store.claim_alive("k1")  # held (by this very process): not claimed twice
    assert store.tmp_files() == []  # the claim's temporary file is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = store.claim_path("k1").read_text().split()[0]
    store.claim_path("k2").write_text(f"{host} {dead_pid}\n")  # left by a killed sweep
    store.claim_path("k3").write_text(f"{host} 1\n")  # pid 1 runs: alive, someone else's
    store.claim_path("k4").write_text("")  # an empty file (older layout, cut short): not a live claim
    store.claim_path("k5").write_text(f"other-host {dead_pid}\n")  # another host's: alive as far as we know
    assert not store.claim_alive("k2") and store.claim_alive("k3") and not store.claim_alive("k4")
    assert store.claim_alive("k5")
    assert store.claim("k2") and store.claim_path("k2").read_text().split()[1] == str(os.getpid())
    assert not store.claim("k3") and not store.claim("k5")
    store.release("k3")
    assert store.claim_path("k3").exists()  # not ours: kept
    store.release("k1")
    assert not store.claim_path("k1").exists()
    store.claim_path("k6").write_text(f"{host} {dead_pid}\n")
    removed = {p.name for p in store.clean_stale_claims()}
    assert removed == {"k4.claim", "k6.claim"}
    assert {p.name for p in store.points.glob("*.claim")} == {"k2.claim", "k3.claim", "k5.claim"}


def test_a_write_cut_short_by_a_sweep_killed_mid_run_is_cleaned_by_the_sweep_that_outlives_it(tmp_path, monkeypatch):
    """The race of the SIGKILL test made deterministic: a sweep holds every claim and dies mid-write (its temporary
    file left behind) while this sweep waits for its claims; this sweep takes the points over and leaves no
    temporary file (the start-up clean ran while the other was still alive)."""
    import threading

    monkeypatch.setattr(run_mod, "code_version", lambda: VERSION)
    params = dict(_params(tmp_path, "rows.csv"), models=["glm-5"], tp_sizes=[8], max_num_batched_tokens=[16384],
                  prompt_lens=[1024])  # 2 points
    store = ResultStore(tmp_path / "store")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert store.claim("probe")
        host = store.claim_path("probe").read_text().split()[0]
        store.release("probe")
        keys = [k for _, _, k in run_mod._tasks(validate_params(params), None)]
        for k in keys:
            store.claim_path(k).write_text(f"{host} {other.pid}\n")
        cut = store.points / f".{keys[0]}.{host}.{other.pid}.abc123.tmp"
        cut.write_text('{"key": ')  # a point write cut short by the kill
        threading.Timer(1.0, lambda: (other.kill(), other.wait())).start()  # reaped: no longer a live pid
        df = run_sweep(params, progress=False)
    finally:
        other.kill()
        other.wait()
    assert df["point_key"].nunique() == 2 and df["status"].isin(["ok", "does_not_fit", "tips_out"]).all()
    assert store.tmp_files() == [] and list(store.points.glob("*.claim")) == []
