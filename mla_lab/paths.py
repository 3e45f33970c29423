"""Where the lab's files live, the checks on the measured files it reads and on the output folders it writes.
Environment overrides, read on every call: ``MLA_LAB_DATA`` (``data/``), ``MLA_LAB_MEASURED`` (the measured rows the
views show; never a modelled number: :func:`calibration_measurements_dir`), ``MLA_LAB_CACHE`` (derived data)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
from pathlib import Path

__all__ = ["REPO_ROOT", "data_dir", "models_dir", "calibration_dir", "measured_dir", "calibration_measurements_dir",
           "notebooks_dir", "cache_dir", "resolve", "is_committed", "MANIFEST_NAME", "find_manifest",
           "read_measured_csv", "OUTPUT_MANIFEST", "special_filesystem", "committed_data_folder", "sha256_file",
           "write_output_manifest", "lab_files", "replaceable_files", "remove_lab_files", "MEASURED_RANGES",
           "SPREAD_FACTOR", "measured_row_problem", "check_measured_cells", "command_output"]

#: The repository this package sits in (``mla_lab/..``).
REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """``data/`` of the repository, or env ``MLA_LAB_DATA``."""
    return Path(os.environ.get("MLA_LAB_DATA") or REPO_ROOT / "data")


def models_dir() -> Path:
    """``<data>/models``: one folder per model holding an HF ``config.json``."""
    return data_dir() / "models"


def calibration_dir() -> Path:
    """``<data>/calibration``: the fitted calibration CSVs."""
    return data_dir() / "calibration"


def measured_dir(gpu: str | None = None) -> Path:
    """``<data>/measured`` (env ``MLA_LAB_MEASURED`` overrides), or its ``gpu`` subfolder."""
    base = Path(os.environ.get("MLA_LAB_MEASURED") or data_dir() / "measured")
    return base / gpu if gpu else base


def calibration_measurements_dir(gpu: str | None = None) -> Path:
    """The repository's ``data/measured`` (or its ``gpu`` subfolder): the committed files the model is fitted on
    (:func:`mla_lab.model.route_ops.padded_kernel_rows`, :func:`mla_lab.model.route_ops.route_rows`). No variable
    moves it (issue 32: an empty measured folder moved the modelled ``fa3_sparse`` from -9.08 % to -2.89 %)."""
    base = REPO_ROOT / "data" / "measured"
    return base / gpu if gpu else base


def cache_dir() -> Path:
    """``<data>/sweeps/.cache`` (env ``MLA_LAB_CACHE``): derived data named by its inputs' digest (safe to delete)."""
    return Path(os.environ.get("MLA_LAB_CACHE") or data_dir() / "sweeps" / ".cache")


def notebooks_dir() -> Path:
    """``notebooks/`` of the repository."""
    return REPO_ROOT / "notebooks"


def resolve(p: str | Path) -> Path:
    """A user-given path: absolute as given, relative to the current directory otherwise."""
    path = Path(p)
    return path if path.is_absolute() else Path.cwd() / path


def command_output(*cmd: str, cwd=None) -> str | None:
    """stdout of a command, stripped, or None when it fails, is missing or runs over 30 s."""
    try:
        r = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, errors="replace", timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def is_committed(p: str | Path) -> bool:
    """True when ``p`` is a file git tracks (``git ls-files --error-unmatch``), which no lab command replaces without
    ``--overwrite``; False outside a repository, untracked or ignored, or without git."""
    path = Path(p).expanduser().absolute()
    return path.is_file() and command_output("git", "-C", str(path.parent), "ls-files", "--error-unmatch", "--",
                                             path.name) is not None


#: The measured root's manifest (written by ``python -m mla_lab.report.stamp_measured``): config digests of the
#: measured sweep rows and the row count of every measured CSV (``csv_rows``).
MANIFEST_NAME = "config_digests.json"


def find_manifest(root: str | Path) -> Path | None:
    """The nearest ``config_digests.json`` in ``root`` or a folder above it, or None."""
    r = Path(root).resolve()
    return next((d / MANIFEST_NAME for d in (r, *r.parents) if (d / MANIFEST_NAME).is_file()), None)


# ---------------------------------------------------------------- measured values: range and provenance (issue 39)
_MS_WHY = ("a GPU time in ms: > 0 and under a minute (the longest call the suite times, one layer step, is ~10 ms on "
           "an H200; data/measured/h200 spans 0.017-20.9 ms)")
#: Plausible range of every measured column the lab reads: ``column: (low, high, low excluded, why)``. Bounds come
#: from what the column is (a time is > 0; bytes fit a GPU), not from the committed values.
MEASURED_RANGES = {
    **{c: (0.0, 60_000.0, True, _MS_WHY) for c in ("ms", "median_ms", "attn_path_ms_step0", "attn_path_q1_step0",
                                                  "attn_path_q3_step0")},
    **{c: (0.0, 60_000.0, False, "a part of a step's time in ms: >= 0 (0 where the strategy has no such op) and "
                                 "under a minute") for c in ("concat_ms", "kernel_ms")},
    **{c: (0.0, 3.6e6, True, "a TTFT in ms: > 0 and under an hour") for c in ("ttft_ms", "ttft_ms_max")},
    **{c: (0.0, 2.0 ** 38, False, "bytes on one GPU: >= 0 and under 256 GiB, more than any GPU's HBM (B200: 192 GB, "
                                  "NVIDIA's datasheet)") for c in ("workspace_bytes", "peak_bytes", "bytes")},
    "process": (1.0, 64.0, False, "the fresh process's number: 1..64 (mla-lab measure --processes)"),
    "max_abs_err": (0.0, 1e4, False, "an absolute error of bf16 attention outputs: >= 0 and finite"),
}
#: Columns that must hold a number in every row of a file (by file name): a repeated timing has no empty cell.
MEASURED_REQUIRED = {"strategies.csv": ("ms", "median_ms"), "presets.csv": ("ms", "median_ms")}
#: How far one repeat may lie from its group's median, either way. The committed files' widest spread is 3.1x (a 21 us
#: kernel of data/measured/h200/runs/2026-12-02T0719_measure/between_process/engine_kernels.csv; presets.csv 1.24x,
#: strategies.csv 1.10x, a sweep row's q3/q1 1.18x): 5x leaves ~1.6x margin, and a cell off by 10x is refused.
SPREAD_FACTOR = 5.0
#: Files of repeated timings (by name) and the columns that name one measured quantity in them; ``median_ms`` is
#: checked against its process's ``ms`` cells where the file has both.
MEASURED_GROUPS = {"strategies.csv": ("shape", "strategy"), "presets.csv": ("shape", "strategy"),
                   "engine_kernels.csv": ("experiment", "shape", "kernel", "kernel_backend", "T", "H", "h_q", "topk",
                                          "ctx_len", "num_splits")}


def _range_problem(col: str, text: str) -> str | None:
    """Why a measured cell ``text`` of ``col`` is not plausible (:data:`MEASURED_RANGES`), or None."""
    try:
        v = float(text)
    except ValueError:
        return f"{col}={text[:40]!r} is not a number"
    if not math.isfinite(v):
        return f"{col}={text[:40]!r} is not a finite number"
    lo, hi, open_lo, why = MEASURED_RANGES[col]
    if v > hi or v < lo or (open_lo and v == lo):
        return f"{col}={v:g} is outside its plausible range ({why})"
    return None


def _num(v) -> float | None:
    """A cell as a finite float, or None (empty, None, text, NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def measured_row_problem(row: dict) -> str | None:
    """Why a ``source == "measured"`` row (CSV text or a stored point's) is not plausible, or None: each column of
    :data:`MEASURED_RANGES` it holds in range (empty: not measured); TTFT within its own interval (as in all 224
    committed measured sweep rows), the attention-path median within its quartiles, q3/q1 and every per-step value
    (``attn_path_ms_steps``) within :data:`SPREAD_FACTOR` of step 0's (sparse attention reads topk keys each step)."""
    if row.get("source") != "measured":
        return None
    vals = {c: row[c] for c in MEASURED_RANGES if row.get(c) is not None and str(row[c]).strip()}  # empty: unmeasured
    for c, v in vals.items():
        why = _range_problem(c, str(v).strip())
        if why:
            return why
    vals = {c: float(v) for c, v in vals.items()}
    return _interval_problem(row, vals) or _steps_problem(row.get("attn_path_ms_steps"), vals.get("attn_path_ms_step0"))


def _interval_problem(row: dict, vals: dict) -> str | None:
    """A measured row's TTFT outside its own interval, or its attention-path median outside its own quartiles or
    those quartiles over :data:`SPREAD_FACTOR` apart; None when they agree (or are not all there)."""
    t, lo, hi = (_num(row.get(c)) for c in ("ttft_ms", "ttft_ms_ci_lo", "ttft_ms_ci_hi"))
    m, q1, q3 = (vals.get(c) for c in ("attn_path_ms_step0", "attn_path_q1_step0", "attn_path_q3_step0"))
    for col, v, a, b, what in (("ttft_ms", t, lo, hi, "interval"), ("attn_path_ms_step0", m, q1, q3, "quartiles")):
        if None not in (v, a, b) and not a * (1 - 1e-9) <= v <= b * (1 + 1e-9):
            return f"{col}={v:g} lies outside its own {what} [{a:g}, {b:g}] (an edited cell)"
    if None not in (m, q1, q3) and q3 > SPREAD_FACTOR * q1:
        return f"attn_path_q3_step0={q3:g} is over {SPREAD_FACTOR:g}x attn_path_q1_step0={q1:g} (an edited cell)"
    return None


def _steps_problem(steps, m: float | None) -> str | None:
    """``attn_path_ms_steps`` (a JSON list, as text or parsed) not a list of finite times > 0, or one over
    :data:`SPREAD_FACTOR` away from step 0's ``m``; None when it is fine or absent."""
    if isinstance(steps, str) and steps.strip():
        try:
            steps = json.loads(steps)
        except ValueError:
            return f"attn_path_ms_steps={steps[:40]!r} is not a JSON list of numbers"
    if steps is None or (isinstance(steps, float) and math.isnan(steps)) or steps == "":
        return None
    if not isinstance(steps, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and
                                               math.isfinite(x) and x > 0 for x in steps):
        return f"attn_path_ms_steps={str(steps)[:40]!r} is not a list of finite times > 0"
    if m is not None and any(not m / SPREAD_FACTOR <= x <= m * SPREAD_FACTOR for x in steps):
        return (f"attn_path_ms_steps holds {max(steps, key=lambda x: max(x / m, m / x)):g}, over {SPREAD_FACTOR:g}x "
                f"away from step 0's {m:g} (an edited cell)")
    return None


def check_measured_cells(p: Path, head: list[str], row: list[str], n: int, fix: str) -> None:
    """One CSV row's measured cells (:data:`MEASURED_RANGES`, :data:`MEASURED_REQUIRED`, :func:`measured_row_problem`).
    Raises ValueError: ``<file>: row <n>: <column>=<value> ...`` (row 1 is the header)."""
    rec = {"source": "measured", **dict(zip(head, row))}  # a file under data/measured without the column: measured
    if rec["source"] != "measured":
        return
    for c in MEASURED_REQUIRED.get(p.name, ()):
        if c in rec and not rec[c].strip():
            raise ValueError(f"{p}: row {n}: {c} is empty (every row of {p.name} holds a measurement); {fix}")
    why = measured_row_problem(rec)
    if why:
        raise ValueError(f"{p}: row {n}: {why}; {fix}")


def _check_measured_spread(p: Path, df, fix: str) -> None:
    """Repeats of one measurement (:data:`MEASURED_GROUPS`) within :data:`SPREAD_FACTOR` of their median, and
    ``median_ms`` the median of its process's ``ms`` (a derived column agrees with what it is derived from).
    Raises ValueError: ``<file>: row <n>: ...`` naming the column and the group's median."""
    if "ms" not in df.columns or not len(df) or p.name not in MEASURED_GROUPS:
        return
    d = df[df["source"] == "measured"] if "source" in df.columns else df
    d = d[d["ms"].notna()]
    keys = [c for c in MEASURED_GROUPS[p.name] if c in d.columns]
    if not len(d) or not keys:
        return
    med = d.groupby(keys, dropna=False)["ms"].transform("median")
    bad = d[(d["ms"] > med * SPREAD_FACTOR) | (d["ms"] < med / SPREAD_FACTOR)]
    if len(bad):
        i = bad.index[0]
        raise ValueError(f"{p}: row {i + 2}: ms={d.at[i, 'ms']:g} is over {SPREAD_FACTOR:g}x away from the median "
                         f"{med[i]:g} of its repeats ({', '.join(keys)} alike; an edited or broken cell); {fix}")
    if "median_ms" in d.columns and "process" in d.columns:
        pm = d.groupby(["process", *keys], dropna=False)["ms"].transform("median")
        off = d[(d["median_ms"] - pm).abs() > 1e-6 * pm.abs() + 1e-9]
        if len(off):
            i = off.index[0]
            raise ValueError(f"{p}: row {i + 2}: median_ms={d.at[i, 'median_ms']:g} is not the median {pm[i]:g} of "
                             f"its process's ms cells (an edited cell); {fix}")


def _check_stamp(p: Path, n: int, fix: str) -> None:
    """``p``'s ``n`` rows against the count its manifest (:func:`find_manifest`, ``csv_rows``) stamps, if any.
    Raises ValueError: fewer rows, or a manifest that cannot be read (it would hide lost rows)."""
    manifest = find_manifest(p.parent)
    if manifest is None:
        return
    try:
        counts = json.loads(manifest.read_text()).get("csv_rows", {})
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{manifest} cannot be read ({' '.join(str(e).split())[:80]}): it guards the measured "
                         f"rows against loss; restore it (git checkout -- {manifest})") from None
    try:
        key = p.resolve().relative_to(manifest.parent.resolve()).as_posix()
    except ValueError:
        return
    want = counts.get(key) if isinstance(counts, dict) else None
    if isinstance(want, int) and n < want:
        raise ValueError(f"{p} holds {n} rows; its stamp in {manifest} counts {want} (rows were lost: a truncated "
                         f"or cut file); {fix}")


def read_measured_csv(p: str | Path):
    """A measured CSV as a pandas DataFrame, every row checked (fields, :func:`check_measured_cells`, the stamped
    row count of ``python -m mla_lab.report.stamp_measured``, the spread of repeats).

    Raises:
        ValueError: ``<file>: ...`` (a short row, a bad cell, fewer rows than stamped, not a CSV) or ``<manifest>
            cannot be read``.
    """
    import csv

    import pandas as pd

    p = Path(p)
    fix = f"restore it (git checkout -- {p}) or re-stamp the folder (python -m mla_lab.report.stamp_measured)"
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, strict=True)
            head = next(reader, None)
            if not head:
                raise ValueError(f"{p}: empty (no header); {fix}")
            n = 0
            for n, row in enumerate(reader, start=1):
                if len(row) != len(head):
                    raise ValueError(f"{p}: row {n + 1} has {len(row)} fields, the header {len(head)} (a truncated "
                                     f"or edited file); {fix}")
                check_measured_cells(p, head, row, n + 1, fix)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{p}: not a readable CSV ({' '.join(str(e).split())[:80]}); {fix}") from None
    _check_stamp(p, n, fix)
    df = pd.read_csv(p)
    _check_measured_spread(p, df, fix)
    return df


# ------------------------------------------------------------------------------------------ output folders (issue 39)
#: The file the lab writes into every output folder it fills (``mla-lab report --report-dir``): the files it wrote
#: there, each with its sha256. ``--overwrite`` removes or replaces only those files.
OUTPUT_MANIFEST = ".mla_lab_manifest.json"

#: Filesystems that hold no files a run may write (kernel views and devices): a path on one is refused at the door.
SPECIAL_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                        "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "hugetlbfs", "autofs",
                        "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs"})
_SPECIAL_ROOTS = ("/proc", "/sys", "/dev")


def special_filesystem(p: str | Path) -> str | None:
    """The special filesystem (:data:`SPECIAL_FS`) ``p`` lies on, from the longest mount point above it in
    ``/proc/self/mounts`` (``/proc``, ``/sys``, ``/dev`` by name where that file says nothing), or None. ``p`` need
    not exist."""
    s = os.path.realpath(Path(p).expanduser())

    def under(root: str) -> bool:
        return s == root or s.startswith(root.rstrip("/") + "/")

    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [(m.replace("\\040", " "), fs) for m, fs in (r.split()[1:3] for r in f if len(r.split()) > 2)]
    except OSError:
        mounts = []
    hits = [(m, fs) for m, fs in mounts if under(m)]
    fs = max(hits, key=lambda h: len(h[0]))[1] if hits else None
    if fs:
        return fs if fs in SPECIAL_FS else None
    return next((root.strip("/") for root in _SPECIAL_ROOTS if under(root)), None)


def committed_data_folder(p: str | Path, direct: bool = False) -> Path | None:
    """``p`` (resolved) when it is ``data/`` or a folder under it in which git tracks a file (``direct``: directly in
    it), which no lab command takes as an output folder; None otherwise (or without git)."""
    q = Path(os.path.realpath(Path(p).expanduser().absolute()))
    data = Path(os.path.realpath(REPO_ROOT / "data"))
    if not q.is_relative_to(data) or not q.is_dir():
        return None
    out = command_output("git", "-C", str(REPO_ROOT), "ls-files", "--", str(q)) or ""
    tracked = [Path(x) for x in out.splitlines() if x]
    if direct:
        tracked = [t for t in tracked if Path(os.path.realpath(REPO_ROOT / t)).parent == q]
    return q if tracked else None


def sha256_file(p: str | Path) -> str:
    """The hex sha256 of a file's bytes."""
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_output_manifest(folder: str | Path, files, writer: str) -> Path:
    """Write :data:`OUTPUT_MANIFEST` in ``folder``: ``{"writer": writer, "files": {relative path: sha256}}`` for
    ``files`` (paths under ``folder``). Returns its path."""
    folder = Path(folder)
    entries = {Path(f).relative_to(folder).as_posix(): sha256_file(f) for f in sorted(map(Path, files))}
    path = folder / OUTPUT_MANIFEST
    path.write_text(json.dumps({"writer": writer, "files": entries}, indent=1) + "\n")
    return path


def _files_under(folder: Path) -> list[Path]:
    """Every entry under ``folder`` that is not a folder (files, links, pipes ...), sorted; links not followed."""
    return sorted(p for p in folder.rglob("*") if p.is_symlink() or not p.is_dir())


def lab_files(folder: str | Path, legacy=None) -> tuple[dict[str, str | None], str]:
    """The files of ``folder`` the lab wrote, ``{relative path: sha256 or None}``, and how they are known: from
    :data:`OUTPUT_MANIFEST`, else ``legacy(folder)`` (the relative paths a writer knows by its stamp), else none.
    Raises ValueError: a manifest that cannot be read (one line naming it)."""
    folder = Path(folder)
    m = folder / OUTPUT_MANIFEST
    if m.is_file():
        try:
            files = json.loads(m.read_text(encoding="utf-8"))["files"]
            if not isinstance(files, dict) or not all(isinstance(k, str) for k in files):
                raise TypeError("files is not a mapping of paths")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{m}: not a manifest the lab wrote ({' '.join(str(e).split())[:80]}); allowed: remove "
                             "the folder's files by hand, or another folder") from None
        return dict(files), f"its {OUTPUT_MANIFEST}"
    found = legacy(folder) if legacy is not None else []
    if found:
        return {k: None for k in found}, "its own stamp (no manifest yet)"
    return {}, f"no {OUTPUT_MANIFEST} there"


def replaceable_files(folder: str | Path, flag: str, overwrite: bool, legacy=None) -> list[Path]:
    """The files ``--overwrite`` may remove from output folder ``folder``: those the lab wrote there
    (:func:`lab_files`), unchanged since; [] for an empty or missing folder.

    Raises:
        ValueError: one line naming ``flag``, the folder and what is allowed: a special filesystem, a committed data
            folder, a file the lab did not write (named) or one changed since, or the lab's files without ``overwrite``.
    """
    folder = Path(folder)
    fs = special_filesystem(folder)
    if fs:
        raise ValueError(f"{flag}={str(folder)!r} is on the {fs} filesystem (kernel or device files, not a folder "
                         "for results); allowed: a folder on an ordinary disk")
    if committed_data_folder(folder):
        raise ValueError(f"{flag}={str(folder)!r} is a committed data folder (git tracks files under it); the lab "
                         "never writes its outputs there, --overwrite or not; allowed: another folder, e.g. "
                         "reports/<gpu>")
    present = _files_under(folder)  # [] for a missing folder
    if not present:
        return []
    known, how = lab_files(folder, legacy)
    ours = []
    for p in present:
        rel = p.relative_to(folder).as_posix()
        if rel == OUTPUT_MANIFEST and how.startswith("its"):
            pass
        elif rel not in known or p.is_symlink() or not p.is_file():
            raise ValueError(f"{flag}={str(folder)!r} holds {rel}, a file the lab did not write there (the lab's "
                             f"files known by {how}); the lab replaces only its own files; allowed: an empty or new "
                             "folder, or one the lab wrote")
        elif known[rel] is not None and sha256_file(p) != known[rel]:
            raise ValueError(f"{flag}={str(folder)!r}: {rel} changed since the lab wrote it (sha256 differs from "
                             f"{OUTPUT_MANIFEST}); allowed: restore or move it, or another folder")
        ours.append(p)
    if not overwrite:
        raise ValueError(f"{flag}={str(folder)!r} holds output the lab wrote ({len(ours)} files, known by {how}); "
                         "allowed: --overwrite to replace those files, or another folder")
    return ours


def remove_lab_files(folder: str | Path, files: list[Path]) -> None:
    """Remove ``files`` (from :func:`replaceable_files`) and the folders under ``folder`` they leave empty."""
    folder = Path(folder)
    for p in files:
        p.unlink(missing_ok=True)
    for p in sorted({q.parent for q in files}, key=lambda q: len(q.parts), reverse=True):
        while p != folder and p.is_relative_to(folder) and p.is_dir() and not any(p.iterdir()):
            p.rmdir()
            p = p.parent
