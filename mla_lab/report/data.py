"""Where the report's rows come from: the sweep CSV, measured rows under ``data/measured`` (re-priced with the
current model through :func:`mla_lab.sweep.rows.reprice_measured_rows`), validation tables, failed points."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ..arch import get_arch
from ..models import load_model, model_config_path
from ..paths import REPO_ROOT, cache_dir, check_measured_cells, data_dir, measured_dir, read_measured_csv
from ..sweep.rows import NOT_PRICED, reprice_measured_rows
from .stamps import config_digest, find_manifest, read_manifest, stamp_for

__all__ = ["MEASURED_NOTES", "withhold_off_route", "load_measured", "measured_sweep_frames", "check_stamped_rows", "load_measured_cached", "measured_digest", "detach_stale", "unstamped_files", "measured_for", "combine", "pick", "failed_points", "load_validation", "ok_rows"]


#: The notes a measured frame carries in ``attrs`` (the provenance banner and advise print them): rows detached
#: (another model config), files unstamped, rows withheld (:func:`withhold_off_route`).
MEASURED_NOTES = ("detached", "unstamped", "withheld")
# Columns a measured file must have to be read as sweep rows.
_SWEEP_COLUMNS = {"model", "tp", "arch", "strategy", "source", "max_num_batched_tokens", "prompt_len", "ttft_ms"}

# ----------------------------------------------------------------------------------------------------- data
def measured_sweep_frames(root: Path, pattern: str = "*.csv", include_archive: bool = False):
    """Yield ``(path, rows)`` for every ``pattern`` file under ``root`` (recursively, sorted) that has the sweep's
    columns and ``source == "measured"`` rows; ``rows`` holds those rows only. Unreadable CSVs and other CSVs (kernel
    benchmarks) are skipped, and so are folders named ``archive`` unless ``include_archive``. Used by
    :func:`load_measured` and ``mla_lab/report/stamp_measured.py`` (which stamps the archive too)."""
    import pandas as pd

    stamped = _stamped_sweep_files(root)
    for p in sorted(root.rglob(pattern)) if root.is_dir() else []:
        if not include_archive and "archive" in p.relative_to(root).parts[:-1]:
            continue  # superseded runs, kept for the record (read them by passing their folder as root)
        if p.resolve() in stamped:
            read_measured_csv(p)  # a stamped sweep file emptied or cut is refused, never skipped
        if not _SWEEP_COLUMNS <= set(_header(p)):
            continue  # another kind of CSV (kernel benchmarks), or not a CSV at all
        _check_sweep_csv(p)
        df = pd.read_csv(p)
        df = df[df["source"] == "measured"].copy()
        if len(df):
            yield p, df


def _stamped_sweep_files(root: Path) -> set:
    """The sweep CSVs the manifest stamps (its ``files``), as resolved paths; a manifest that cannot be read is
    refused in one line (it would hide lost rows)."""
    manifest = find_manifest(root) if root.is_dir() else None
    files, problem = read_manifest(manifest)
    if problem:
        raise ValueError(problem.split(": every")[0] + f"; restore it (git checkout -- {manifest})")
    return {(manifest.parent / f).resolve() for f in files} if manifest is not None else set()


def _header(p: Path) -> list[str]:
    import csv

    try:
        with open(p, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


#: Integer columns of a measured sweep row, and the column holding a JSON list of per-step ms.
_INT_COLUMNS = ("tp", "max_num_batched_tokens", "prompt_len")
_JSON_LIST_COLUMN = "attn_path_ms_steps"
#: Number columns of a measured sweep row (empty allowed; anything else is named with its file and row).
_FLOAT_COLUMNS = ("ttft_ms", "ttft_ms_max", "concat_ms", "pad_ms", "pad_copy_ms", "kernel_ms", "out_slice_ms",
                  "chunk_out_ms", "ttft_ms_ci_lo", "ttft_ms_ci_hi", "attn_path_ms_step0")


def _check_sweep_csv(p: Path) -> None:
    """A measured sweep CSV read whole or not at all: every row has the header's fields, its integer columns hold
    integers and its per-step column a JSON list of numbers; otherwise one line naming the file and the row.

    Raises:
        ValueError: ``<file>: row <n> ...`` (row 1 is the header), with how to restore the file.
    """
    import csv
    import json

    fix = f"restore it (git checkout -- {p}) or move it out of {p.parent}"
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, strict=True)
            head = next(reader)
            where = {c: head.index(c) for c in (*_INT_COLUMNS, *_FLOAT_COLUMNS, _JSON_LIST_COLUMN, "source")
                     if c in head}
            for n, row in enumerate(reader, start=2):
                if len(row) != len(head):
                    raise ValueError(f"{p}: row {n} has {len(row)} fields, the header {len(head)} (a truncated or "
                                     f"edited file: its rows would be dropped); {fix}")
                if row[where["source"]] != "measured":
                    continue
                check_measured_cells(p, head, row, n, fix)  # ranges and the row's own quartiles (issue 39)
                for c in _INT_COLUMNS:
                    if not row[where[c]].strip().lstrip("-").replace(".0", "", 1).isdigit():
                        raise ValueError(f"{p}: row {n}: {c}={row[where[c]]!r} is not an integer; {fix}")
                for c in (c for c in _FLOAT_COLUMNS if c in where):
                    v = row[where[c]].strip()
                    if v:
                        try:
                            float(v)
                        except ValueError:
                            raise ValueError(f"{p}: row {n}: {c}={v[:40]!r} is not a number; {fix}") from None
                cell = row[where[_JSON_LIST_COLUMN]].strip() if _JSON_LIST_COLUMN in where else ""
                if cell:
                    try:
                        v = json.loads(cell)
                    except ValueError:
                        v = None
                    if not isinstance(v, list) or not all(isinstance(x, (int, float)) for x in v):
                        raise ValueError(f"{p}: row {n}: {_JSON_LIST_COLUMN}={cell[:40]!r} is not a JSON list of "
                                         f"numbers; {fix}")
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{p}: not a readable CSV ({' '.join(str(e).split())[:80]}); {fix}") from None


def check_stamped_rows(df, root: str | Path | None) -> None:
    """Every measured CSV holds at least the rows its stamp in the manifest (``config_digests.json``, written by
    ``python -m mla_lab.report.stamp_measured``) counts: fewer means rows were lost (a truncated or cut file).

    Raises:
        ValueError: ``<file> holds <n> measured rows; its stamp in <manifest> counts <m> ...``.
    """
    if not len(df) or "file" not in df.columns or root is None:
        return
    manifest = find_manifest(root)
    files, problem = read_manifest(manifest)
    if problem:  # a manifest that cannot be read would hide lost rows: refused (issue 32)
        raise ValueError(problem.split(": every")[0] + f"; restore it (git checkout -- {manifest})")
    if manifest is None:
        return
    base = Path(root).resolve()
    for f, g in df.groupby("file"):
        key = (base / str(f)).resolve().relative_to(manifest.parent.resolve()).as_posix()
        entries = [e for e in files.get(key, []) or [] if isinstance(e, dict) and isinstance(e.get("rows"), int)]
        want = sum(e["rows"] for e in entries)
        if entries and len(g) < want:
            raise ValueError(f"{base / str(f)} holds {len(g)} measured rows; its stamp in {manifest} counts {want} "
                             "(rows were lost: a truncated or cut file); restore it (git checkout) or re-stamp it "
                             "(python -m mla_lab.report.stamp_measured)")


def load_measured(root: str | Path | None = None, pattern: str = "*.csv", weight_dtype: str | None = None,
                  moe_parallel: str | None = None):
    """Measured sweep rows under ``data/measured`` (recursively): every ``pattern`` file that has the sweep's
    columns (model, tp, arch, strategy, source, max_num_batched_tokens, prompt_len, ttft_ms), keeping rows whose
    ``source`` is ``measured``; a ``file`` column says where each row came from. Other CSVs there (kernel
    benchmarks) are ignored, and so are folders named ``archive`` (superseded runs). TTFT columns are re-derived with the current TTFT model around the measured attention
    path (:func:`mla_lab.sweep.rows.reprice_measured_rows`). Rows measured on another model config (its digest in
    the manifest ``config_digests.json``, :mod:`.stamps`) are left out by :func:`detach_stale`: ``attrs["detached"]``
    holds one line per detached model and TP, ``attrs["unstamped"]`` one per file the manifest does not stamp.
    Empty DataFrame if none. ``root`` defaults to env ``MLA_LAB_MEASURED``, else the
    repository's ``data/measured``."""
    import pandas as pd

    root = Path(root) if root else measured_dir()
    frames = []
    for p, df in measured_sweep_frames(root, pattern):
        df["file"] = str(p.relative_to(root))
        frames.append(df)
    if not frames:
        empty = pd.DataFrame()
        empty.attrs["detached"], empty.attrs["unstamped"] = [], []
        return empty

    rows = pd.concat(frames, ignore_index=True)
    check_stamped_rows(rows, root)
    both, detached = detach_stale(rows, root)
    # the attention path is measured; the rest of TTFT comes from the current model, so re-derive it here
    out = reprice_measured_rows(both, weight_dtype, moe_parallel) if len(both) else both
    out.attrs["detached"], out.attrs["unstamped"] = detached, unstamped_files(both, root)
    return out


def withhold_off_route(df):
    """``(kept, notes)``: the measured rows whose change applies to their deployment, and one line per deployment
    whose rows were left out (``measured_withheld`` set by :func:`mla_lab.sweep.rows.reprice_measured_rows`: the
    deployment's route for the strategy or the baseline is not the measured kernel's, or it does not fit). A
    measured number is shown only where the measured kernel runs and the deployment fits (issue 39)."""
    if "measured_withheld" not in df.columns or not len(df):
        return df, []
    off = df["measured_withheld"].fillna("").astype(str) != ""
    notes = []
    keys = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype") if c in df]
    for k, g in df[off].groupby(keys, dropna=False):
        k = k if isinstance(k, tuple) else (k,)
        where = " ".join(f"{c}={v}" for c, v in zip(keys, k))
        why = list(dict.fromkeys(g["measured_withheld"].astype(str)))
        notes.append(f"{len(g)} measured row(s) of {where} not shown: {why[0]}"
                     + (f" (and {len(why) - 1} other reason(s))" if len(why) > 1 else ""))
    kept = df[~off].copy()
    kept.attrs.update(df.attrs)
    return kept, notes


def detach_stale(df, root: str | Path | None = None):
    """Measured rows no longer measurements of the model config they name, dropped. Returns ``(kept rows, [one line
    per detached model and TP])``.

    - Rows the manifest (:mod:`.stamps`: ``config_digests.json`` in ``root`` or above, written by
      ``mla_lab/report/stamp_measured.py``) stamps for their file, GPU (``device``) and provider (``flash_mla``): kept
      when the stamped SHA-256 equals today's ``data/models/<model>/config.json`` (:func:`.stamps.config_digest`),
      detached otherwise (any edited value: heads, topk, layers...).
    - Rows it does not stamp: kept when their ``num_heads`` equals ``num_attention_heads / tp`` of today's config
      (a row measured on 8 heads per rank is not a measurement of an edited 16-head config); the files are listed
      in the frame's ``attrs["unstamped"]`` by :func:`load_measured`.
    - Rows of a model no longer known are detached.
    """
    if not len(df):
        return df, []
    manifest = find_manifest(root) if root is not None and "file" in df.columns else None
    files, _ = read_manifest(manifest)
    base = Path(root).resolve() if manifest is not None else None
    keep = [True] * len(df)
    notes = []
    for (m, tp), g in df.groupby(["model", "tp"], dropna=False):
        why_model = None
        try:
            model = load_model(str(m))
            want = model.heads_per_rank(int(tp))
            now = config_digest(model_config_path(str(m)))
        except (ValueError, TypeError) as e:
            want = now = None
            why_model = f"its model no longer loads ({' '.join(str(e).split())[:120]})"
        heads = g["num_heads"].astype(float) if "num_heads" in g.columns else None
        stale, whys = [], []
        for i in g.index:
            r = g.loc[i]
            stamped = None
            if manifest is not None:
                key = (base / str(r["file"])).resolve().relative_to(manifest.parent.resolve()).as_posix()
                stamped = stamp_for(files, key, r.get("device"), r.get("flash_mla"), m)
            if why_model is not None or (stamped is not None and stamped != now) or \
                    (stamped is None and heads is not None and heads[i] != want):
                stale.append(i)
                if stamped is not None and stamped != now:
                    whys.append((key, r.get("device"), r.get("flash_mla"), stamped))
        if not stale:
            continue
        if why_model is not None:
            why = why_model
        else:
            parts = []
            if heads is not None and (heads[stale] != want).any():
                parts.append(f"measured at {sorted(set(heads[stale].astype(int)))} heads per rank, the config now "
                             f"gives {want}")
            if whys:
                f, dev, prov, old = sorted(set(whys), key=str)[0]
                more = f" and {len(set(whys)) - 1} more" if len(set(whys)) > 1 else ""
                parts.append(f"measured with data/models/{m}/config.json sha256 {old[:12]}, it is now {now[:12]} "
                             f"({f}, {dev}, {prov}{more})")
            why = "; ".join(parts)
        notes.append(f"{len(stale)} measured row(s) of {m} TP{tp} detached: {why} (re-measure on the current config "
                     "and run mla_lab/report/stamp_measured.py to attach)")
        for i in stale:
            keep[df.index.get_loc(i)] = False
    return df[keep].copy(), notes


def unstamped_files(df, root: str | Path | None) -> list[str]:
    """One line per measured CSV of ``df`` (its ``file`` column, relative to ``root``) with rows the manifest does not
    stamp (they are checked by heads per rank only), and one for a manifest that cannot be read."""
    if not len(df) or "file" not in df.columns or root is None:
        return []
    manifest = find_manifest(root)
    files, problem = read_manifest(manifest)
    out = [problem] if problem else []
    base = Path(root).resolve()
    for f, g in df.groupby("file"):
        key = (base / str(f)).resolve()
        key = key.relative_to(manifest.parent.resolve()).as_posix() if manifest is not None else str(f)
        n = sum(stamp_for(files, key, r.get("device"), r.get("flash_mla"), r["model"]) is None
                for _, r in g.iterrows())
        if n:
            out.append(f"{n} measured row(s) of {f} carry no config digest (checked by heads per rank only; run "
                       "mla_lab/report/stamp_measured.py after a GPU run)")
    return out

#: How many cached priced frames are kept (older ones are removed when a new one is written).
CACHE_KEEP = 8


def _cache_inputs(root: Path) -> list[Path]:
    """Every file a priced measured frame depends on: the package's sources (the row builder and the TTFT model),
    the model configs, the calibration, and every file under the measured root (CSV rows, fits, cold starts)."""
    files = sorted((REPO_ROOT / "mla_lab").rglob("*.py"))
    for d in (data_dir() / "models", data_dir() / "calibration", root):
        if d.is_dir():
            files += sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    manifest = find_manifest(root) if root.is_dir() else None
    if manifest is not None and manifest not in files:
        files.append(manifest)  # a manifest in a folder above root stamps its rows too
    return files


def measured_digest(root: str | Path | None = None, pattern: str = "*.csv", weight_dtype: str | None = None,
                    moe_parallel: str | None = None) -> str:
    """SHA-256 (16 hex) of what :func:`load_measured` reads and computes with (:func:`_cache_inputs`: names and
    contents) and its arguments: the key of the cached frame. ~10 ms (a few MB hashed)."""
    import pandas as pd

    root = Path(root) if root else measured_dir()
    h = hashlib.sha256(repr((str(root), pattern, weight_dtype, moe_parallel, pd.__version__)).encode())
    for p in _cache_inputs(root):
        h.update(str(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def load_measured_cached(root: str | Path | None = None, pattern: str = "*.csv", weight_dtype: str | None = None,
                         moe_parallel: str | None = None):
    """:func:`load_measured`, priced once: the frame is kept under :func:`mla_lab.paths.cache_dir` ``/measured``
    named by :func:`measured_digest`, so a changed CSV, model config, calibration file or line of the package
    re-prices it and an unchanged one is read back (``mla-lab advise`` in ~1 s instead of ~3 s). A cache that
    cannot be written (read-only checkout) or read (a truncated file) is skipped, never an error."""
    import pandas as pd

    key = measured_digest(root, pattern, weight_dtype, moe_parallel)
    folder = cache_dir() / "measured"
    path = folder / f"{key}.pkl"
    if path.is_file():
        try:
            return pd.read_pickle(path)
        except Exception:  # a truncated or foreign file: re-price below and replace it
            pass
    df = load_measured(root, pattern, weight_dtype, moe_parallel)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".pkl")
        os.close(fd)
        df.to_pickle(tmp)
        os.replace(tmp, path)
        old = sorted(folder.glob("*.pkl"), key=lambda p: p.stat().st_mtime)[:-CACHE_KEEP]
        for p in old:
            p.unlink(missing_ok=True)
    except OSError:
        pass
    return df


def measured_for(params, root: str | Path | None = None):
    """:func:`load_measured` rows that lie on the sweep grid of ``params`` (a :class:`mla_lab.sweep.SweepParams`):
    same models, TP sizes, archs (aliases resolved), max_num_batched_tokens, prompt lengths and KV-cache dtypes."""

    m = load_measured_cached(root, weight_dtype=params.weight_dtype, moe_parallel=params.moe_parallel)  # priced once
    notes = {k: list(m.attrs.get(k, [])) for k in MEASURED_NOTES}
    if len(m) == 0:
        return m
    keep = {"model": set(params.models), "tp": set(params.tp_sizes),
            "arch": {get_arch(a).name for a in params.archs},
            "max_num_batched_tokens": set(params.max_num_batched_tokens), "prompt_len": set(params.prompt_lens),
            "kv_cache_dtype": set(params.kv_cache_dtype)}
    for k, allowed in keep.items():
        if k in m.columns:
            m = m[m[k].astype(str).isin({str(v) for v in allowed})]
    m, notes["withheld"] = withhold_off_route(m)  # measured only where the measured kernel runs and it fits
    m = m.reset_index(drop=True)
    m.attrs.update(notes)  # the notes are about the whole measured set (the banner says them)
    return m

def combine(modelled, measured=None):
    """The sweep's rows and measured rows in one frame (measured may be None or empty). A measured row that the
    sweep already holds (same point_key, strategy, source and timestamp: e.g. a committed copy of this very run) is
    kept once. The measured frame's ``attrs["detached"]`` and ``attrs["unstamped"]`` lines carry over."""
    import pandas as pd

    notes = {k: list(measured.attrs.get(k, [])) for k in MEASURED_NOTES} if measured is not None else {}
    if measured is None or len(measured) == 0:
        out = modelled.copy()
        out.attrs.update(notes)
        return out
    both = pd.concat([modelled, measured], ignore_index=True)
    key = [c for c in ("point_key", "strategy", "source", "timestamp") if c in both.columns]
    if len(key) == 4:
        both = both.drop_duplicates(subset=key, keep="first").reset_index(drop=True)
    both.attrs.update(notes)  # measured rows detached or unstamped: the provenance banner says so
    return both

def ok_rows(df):
    return df[df["status"].fillna("ok") == "ok"] if "status" in df.columns else df

def pick(values, preferred):
    """``preferred`` if it is among ``values``, else the largest value (used to choose the slice a chart shows)."""
    vals = sorted({v for v in values if v == v})
    if not vals:
        return None
    return preferred if preferred in vals else vals[-1]

def failed_points(df):
    """Rows of points that failed (status neither ok nor a not-priced status of
    :data:`mla_lab.sweep.rows.NOT_PRICED`: those are results, listed by :func:`mla_lab.report.figures.not_fitting`),
    with their reason."""
    if "status" not in df.columns:
        return df.iloc[0:0]
    cols = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "source",
                        "status", "reason") if c in df.columns]
    st = df["status"].fillna("ok")
    return df[(st != "ok") & ~st.isin(NOT_PRICED)][cols]

def _measured_root() -> Path:
    return measured_dir()

def load_validation(root: str | Path | None = None):
    """The TTFT model's predicted-vs-measured rows (every ``layer_validation.csv`` under ``root``, default env
    ``MLA_LAB_MEASURED`` or ``data/measured``; a ``run`` column names the folder). Empty DataFrame if none."""
    import pandas as pd

    root = Path(root) if root else _measured_root()
    frames = []
    for p in sorted(root.rglob("layer_validation.csv")) if root.is_dir() else []:
        v = pd.read_csv(p)
        v["run"] = str(p.parent.relative_to(root)) if p.parent != root else "."
        frames.append(v)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
