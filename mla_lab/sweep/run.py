"""Run (or resume) a sweep: expand the grid, skip what is stored, compute the rest on an executor, write the CSV.

The notebook ``notebooks/padding_sweep.ipynb`` is the front door; everything it does lives in this package.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from pathlib import Path

from ..arch import get_arch
from ..paths import is_committed, resolve
from ..placement import BASELINE
from .executors import PointTask, make_executor
from .params import SweepParams, expand_grid, validate_params
from .rows import compute_rows, point_inputs
from .store import ResultStore, atomic_write, code_version, inputs_digest, point_key

#: Columns whose presence in a CSV's header says the lab wrote it (so it may be replaced).
LAB_CSV_MARK = ("point_key", "strategy", "code_version")


class _PointError(Exception):
    """A point's own error as the executor reported it (``"<ExceptionType>: <message>"``)."""


#: The columns that say which point and strategy a sweep CSV row is (:func:`grid_row_ids`).
ROW_ID_COLUMNS = ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype")


def _id_cell(v) -> str:
    s = str(v).strip()
    try:
        f = float(s)
        return str(int(f)) if f.is_integer() else s
    except ValueError:
        return s


def grid_row_ids(params: SweepParams, may_measure: bool) -> tuple[set, set]:
    """``(points, rows)`` a sweep of ``params`` writes: point ids (:data:`ROW_ID_COLUMNS` as strings) and row ids
    (point id + strategy + source; the baseline included; ``measured`` rows only when ``may_measure``)."""
    points, rows = set(), set()
    sources = ("modelled", "measured") if may_measure else ("modelled",)
    for pt in expand_grid(params):
        pid = tuple(_id_cell(pt[c]) for c in ROW_ID_COLUMNS)
        points.add(pid)
        rows |= {(*pid, s, src) for s in [BASELINE, *pt["strategies"]] for src in sources}
    return points, rows


def may_measure(device: str) -> bool:
    """Whether a sweep on ``device`` may add measured rows here: ``cuda``, or ``auto`` where an NVIDIA device node
    is visible (``/dev/nvidia<N>``; checked without importing torch, so the dry run and the run agree)."""
    return device != "cpu" and (device == "cuda" or any(Path("/dev").glob("nvidia[0-9]*")))


def _rows_not_covered(out: Path, params: SweepParams, measure: bool) -> tuple[int, int, str]:
    """``(rows not written again, rows, first such row)`` of the lab CSV ``out`` against this grid."""
    import csv

    points, rows = grid_row_ids(params, measure)
    lost, n, first = 0, 0, ""
    with open(out, newline="", errors="replace") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            n += 1
            pid = tuple(_id_cell(r.get(c, "")) for c in ROW_ID_COLUMNS)
            strategy = (r.get("strategy") or "").strip()
            src = (r.get("source") or "modelled").strip() or "modelled"
            ok = pid in points if not strategy else (*pid, strategy, src) in rows
            if not ok:
                lost += 1
                first = first or (f"row {i}: {' '.join(pid)} {strategy or '(failed point)'} {src}")
    return lost, n, first


def check_output_file(path: str | Path, overwrite: bool = False, params: SweepParams | None = None,
                      device: str | None = None, create: bool = True) -> Path:
    """The absolute path of an output CSV the lab may write, checked before any point is computed: without ``overwrite``
    only a lab CSV (:data:`LAB_CSV_MARK`), not committed, whose every row this sweep writes again (:func:`grid_row_ids`,
    :func:`may_measure` of ``device``) is replaced. ``create``: make the folder (False: the dry run). ValueError: one
    line naming the path and the fix.
    """
    out = resolve(path)
    if out.is_dir():
        raise ValueError(f"data_file={str(path)!r} is a directory; give a file path such as "
                         f"{str(Path(path) / 'padding_sweep.csv')!r}")
    if out.exists() and not out.is_file():
        raise ValueError(f"data_file={str(path)!r} is not a regular file (a device, a pipe or a socket); allowed: a "
                         "regular file or a new path in a writable folder")
    if out.exists() and not overwrite:
        _check_replaceable(out, path, params, device)
    if out.exists() and not os.access(out, os.W_OK):
        raise ValueError(f"data_file={str(path)!r} is not writable; allowed: a writable file or a new path in a "
                         "writable folder")
    _check_folder(out, path, create)
    return out


def _check_replaceable(out: Path, path, params: SweepParams | None, device: str | None) -> None:
    """A CSV the lab may replace without ``overwrite``: not committed, written by the lab, every row written again."""
    if is_committed(out):
        raise ValueError(f"data_file={str(path)!r} is a committed file (tracked by git); a sweep replaces it "
                         "only with --overwrite (-p overwrite true); allowed: another path")
    try:
        with open(out, errors="replace") as f:
            header = f.readline()
    except OSError as e:
        raise ValueError(f"data_file={str(path)!r} cannot be read ({e.strerror}); choose another path") from None
    if not all(c in header.strip().split(",") for c in LAB_CSV_MARK):
        raise ValueError(f"data_file={str(path)!r} exists and was not written by mla_lab; choose another path "
                         "or pass --overwrite")
    lost, n, first = _rows_not_covered(out, params, may_measure(device or params.device)) if params else (0, 0, "")
    if lost:
        raise ValueError(f"data_file={str(path)!r} holds {lost} of {n} rows this sweep does not write "
                         f"(another grid's or measured rows, first: {first}); replacing it would drop them; "
                         "allowed: another path, or --overwrite (-p overwrite true)")


def _check_folder(out: Path, path, create: bool) -> None:
    """The data file's folder is writable, and made when ``create``."""
    folder = next((q for q in [out.parent, *out.parent.parents] if q.exists()), None)
    if folder is not None and folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"data_file={str(path)!r}: its folder {folder} is not writable; allowed: a path in a "
                         "writable folder")
    if not create:
        if folder is not None and not folder.is_dir():
            raise ValueError(f"data_file={str(path)!r}: its folder cannot be created ({folder} is a file, not a "
                             "folder); choose a writable path")
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((q for q in [out.parent, *out.parent.parents] if q.is_file()), None)
        why = f"{blocker} is a file, not a folder" if blocker else e.strerror
        raise ValueError(f"data_file={str(path)!r}: its folder cannot be created ({why}); choose a writable "
                         "path") from None


#: The environment variable through which ``mla-lab sweep`` hands its lock on the data file to the notebook's kernel
#: (``<lock path>|<token>``): the sweep in the kernel runs under the CLI's lock instead of waiting for it.
LOCK_ENV = "MLA_LAB_DATA_FILE_LOCK"


@contextlib.contextmanager
def data_file_lock(out: str | Path, token: str | None = None):
    """Hold the data file's lock (``fcntl.flock``, exclusive, not waiting) while a sweep writes it: a second sweep is
    refused (ValueError naming its host and pid). Removed on exit (released by the OS when a process dies). A lock the
    parent holds (``LOCK_ENV``: path and the ``token`` written in the lock file) is taken as held.
    """
    import fcntl

    out = resolve(out)
    lp = out.with_name(f".{out.name}.lock")  # the lock file: .<name>.lock beside the data file
    handed = os.environ.get(LOCK_ENV, "")
    if handed and handed.rsplit("|", 1)[0] == str(lp):
        try:
            mine = lp.read_text().split()[-1:] == [handed.rsplit("|", 1)[1]]
        except OSError:
            mine = False  # only reading the lock file may fail here: an error of the work below is not caught
        if mine:
            yield lp
            return
    lp.parent.mkdir(parents=True, exist_ok=True)
    while True:
        f = open(lp, "a+")  # noqa: SIM115 - closed below, after the unlink
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            err = _held(out, f.read())
            f.close()
            raise err from None
        try:
            same = os.stat(lp).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # the holder before us removed the file we locked: lock the new one
    try:
        f.seek(0)
        f.truncate()
        f.write(f"{socket.gethostname()} pid={os.getpid()} {token or ''}\n")
        f.flush()
        yield lp
    finally:
        lp.unlink(missing_ok=True)  # only while it holds the lock: the file exists while a sweep writes
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _held(out, lock_text: str) -> ValueError:
    who = " ".join(lock_text.split()[:2]) or "another process"
    return ValueError(f"data_file={str(out)!r} is being written by another sweep ({who}); allowed: wait for it to "
                      "finish, or another data_file")


def check_not_locked(out: str | Path) -> None:
    """The dry run's check: ValueError as :func:`data_file_lock` when another sweep holds ``out``'s lock."""
    import fcntl

    lp = resolve(out).with_name(f".{resolve(out).name}.lock")
    if not lp.is_file():
        return
    with open(lp) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _held(out, f.read()) from None
        fcntl.flock(f, fcntl.LOCK_UN)


def _tasks(params: SweepParams, gpu: dict | None) -> list[tuple[dict, str, str]]:
    version = code_version()
    out = []
    for pt in expand_grid(params):
        digest = inputs_digest(point_inputs(pt))
        modes = ["modelled"]
        if gpu and gpu["arch"] and get_arch(pt["arch"]).family == get_arch(gpu["arch"]).family:
            modes.append("measured")
        for mode in modes:
            out.append((pt, mode, point_key({**pt, "mode": mode}, f"{version}|{digest}")))
    return out


def plan_sweep(params: SweepParams | dict) -> dict:
    """What a sweep would do, running nothing (``mla-lab sweep --dry-run``): the grid, the point count, how many are
    already stored for this code and these inputs, and where outputs go."""
    if isinstance(params, dict):
        params = validate_params(params)
    store = ResultStore(resolve(params.store_dir))
    todo = _tasks(params, None)
    stored = sum(1 for _, _, k in todo if store.completed(k))
    return {"points": len(todo), "stored": stored, "to_compute": len(todo) - stored,
            "grid": {k: getattr(params, k) for k in ("models", "tp_sizes", "archs", "max_num_batched_tokens",
                                                        "prompt_lens", "kv_cache_dtype", "strategies")},
            "store_dir": str(store.root), "data_file": str(resolve(params.data_file)),
            "note": "modelled points only; measured points are added on a GPU of the grid's family"}


def run_sweep(params: SweepParams | dict, progress: bool = True, compute_fn=None, executor=None,
              claim_wait_s: float = 3600.0):
    """Run (or resume) the sweep; returns a DataFrame of every stored row of this grid. Each point is written
    atomically; points stored ``ok`` for this code and these inputs (:func:`mla_lab.sweep.rows.point_inputs`) are
    skipped unless ``force``; a failing point is stored ``failed`` with its reason; a point another live sweep claimed
    is waited for (``claim_wait_s``). ``compute_fn``: default :func:`mla_lab.sweep.rows.compute_rows`. ValueError: bad
    parameters or an output path the lab may not write (:func:`check_output_file`), before any point runs.
    """
    if isinstance(params, dict):
        params = validate_params(params)
    out = check_output_file(params.data_file, params.overwrite, params)
    with data_file_lock(out):  # one sweep at a time writes a data file: the second is refused, never mixed in
        store = ResultStore(resolve(params.store_dir))
        own = executor is None
        ex = make_executor(params.executor, address=params.ray_address) if own else executor
        try:
            return _run_points(params, store, ex, progress, compute_fn or compute_rows, out, claim_wait_s)
        finally:
            if own:
                ex.close()


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[mla-lab] {msg}", file=sys.stderr, flush=True)


def _stored(store, todo, force: bool) -> tuple[set, int]:
    """``(keys to skip, points failed before)``; a broken point file is named, then computed again."""
    status = {k: store.status(k) for _, _, k in todo}
    for k, st in status.items():
        why = store.broken(k) if st is None else None
        if why:  # never silently: named, then computed again and replaced
            _log(True, f"{why}: computing the point again")
    skip = {k for k, st in status.items() if st == "ok" and not force}
    return skip, sum(1 for st in status.values() if st == "failed" and not force)


def _claim(store, todo, skip: set, force: bool) -> tuple[list, list]:
    """``(mine, theirs)``: the points this sweep claimed, and those another live sweep holds (``skip`` grows)."""
    mine, theirs = [], []
    for pt, mode, key in todo:
        if key in skip:
            continue
        if not store.claim(key):
            theirs.append(PointTask(pt, mode, key))
        elif not force and store.completed(key):  # stored by another sweep since the look above
            store.release(key)
            skip.add(key)
        else:
            mine.append(PointTask(pt, mode, key))
    return mine, theirs


def _run_points(params, store, ex, progress, compute_fn, out: Path, claim_wait_s: float):
    import pandas as pd

    device = ex.resolve_device(params.device)
    version, todo = code_version(), _tasks(params, ex.detect_gpu() if device == "cuda" else None)
    store.clean_stale_tmp()  # writes cut short by a killed sweep (never visible as points)
    store.clean_stale_claims()  # claims of a killed sweep
    skip, n_failed = _stored(store, todo, params.force)
    extra = f", {n_failed} failed before (retried)" if n_failed else ""
    _log(progress, f"{len(todo)} point(s), {len(skip)} already stored{extra}, code {version}, device {device}")
    if ex.name != "local":
        _log(progress, f"executor {ex.describe()}")
    mine, theirs = _claim(store, todo, skip, params.force)
    if theirs:
        _log(progress, f"{len(theirs)} point(s) claimed by another sweep on this store: left to it")
    t0 = time.time()
    try:
        for done, res in enumerate(ex.run(mine, compute_fn, driver_version=version), start=1):
            _store_result(store, res, version, progress)
            el = time.time() - t0
            _log(progress, f"{len(skip) + done}/{len(todo)} points  elapsed {el:.1f}s  "
                           f"ETA {el / done * (len(mine) - done):.1f}s")
    finally:
        for t in mine:
            store.release(t.key)
    _wait_for_claims(store, theirs, ex, compute_fn, version, progress, claim_wait_s)
    df = pd.DataFrame(store.rows([key for _, _, key in todo]))
    atomic_write(out, lambda f: df.to_csv(f, index=False), f".{out.name}.", newline="", chmod=True)
    return df


def _store_result(store, res, version, progress) -> None:
    pt, mode, key = res.task.point, res.task.mode, res.task.key
    try:
        if res.error is not None:
            raise _PointError(res.error)
        for r in res.rows:
            r.update(point_key=key, code_version=version)
        store.write(key, {**pt, "mode": mode}, res.rows)
    except Exception as e:  # recorded, not fatal: the sweep goes on
        reason = str(e) if isinstance(e, _PointError) else f"{type(e).__name__}: {e}"
        store.write(key, {**pt, "mode": mode, "source": mode, "code_version": version}, [], status="failed",
                    reason=reason)
        _log(progress, f"point failed ({reason})")


def _wait_for_claims(store, tasks, ex, compute_fn, version, progress, wait_s) -> None:
    """Wait until points claimed by other sweeps are stored; compute those whose claimer died."""
    deadline = time.time() + wait_s
    left = list(tasks)
    while left and time.time() < deadline:
        orphans = []
        for t in left:
            if store.has(t.key) or store.claim_alive(t.key) or not store.claim(t.key):
                continue
            if store.has(t.key):  # stored (and released) between the look and the claim
                store.release(t.key)
                continue
            orphans.append(t)
        if orphans:
            _log(progress, f"{len(orphans)} point(s) claimed by a sweep that died: computing them here")
        try:
            for res in ex.run(orphans, compute_fn, driver_version=version):
                _store_result(store, res, version, progress)
                store.release(res.task.key)
        finally:
            for t in orphans:
                store.release(t.key)
        left = [t for t in left if not store.has(t.key)]
        if left:
            time.sleep(0.2)
    store.clean_stale_tmp()  # a sweep killed while this one ran may have died mid-write
    store.clean_stale_claims()
