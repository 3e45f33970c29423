"""Where the report's rows come from: the sweep CSV, measured rows under ``data/measured`` (re-priced with the
current model through :func:`mla_lab.sweep.rows.reprice_measured_rows`), validation tables, failed points.

Which model config each measured row was measured with: the manifest ``config_digests.json`` (docs/cli.md; per file
relative to its folder, GPU and provider, the SHA-256 of each model's canonical config JSON,
:func:`config_digest_of_bytes`: re-indenting keeps the rows, any edited value detaches them)."""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from pathlib import Path

import pandas as pd

from ..arch import get_arch
from ..models import load_model, model_config_path
from ..paths import check_measured_cells, find_manifest, measured_dir, read_measured_csv
from ..sweep.rows import NOT_PRICED, reprice_measured_rows
from .cache import cached_under, inputs_digest

__all__ = ["MEASURED_NOTES", "withhold_off_route", "load_measured", "measured_sweep_frames", "check_stamped_rows",
           "load_measured_cached", "detach_stale", "unstamped_files", "measured_for", "combine", "pick",
           "failed_points", "load_validation", "ok_rows", "config_digest_of_bytes", "config_digest", "read_manifest",
           "stamp_for"]

#: The columns naming a deployment point of the sweep rows.
DEPLOYMENT_KEYS = ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype")
#: The notes a measured frame carries in ``attrs`` (the provenance banner and advise print them): rows detached
#: (another model config), files unstamped, rows withheld (:func:`withhold_off_route`).
MEASURED_NOTES = ("detached", "unstamped", "withheld")
# Columns a measured file must have to be read as sweep rows.
_SWEEP_COLUMNS = {"model", "tp", "arch", "strategy", "source", "max_num_batched_tokens", "prompt_len", "ttft_ms"}
#: Integer columns of a measured sweep row, and the column holding a JSON list of per-step ms.
_INT_COLUMNS = ("tp", "max_num_batched_tokens", "prompt_len")
_JSON_LIST_COLUMN = "attn_path_ms_steps"
#: Number columns of a measured sweep row (empty allowed; anything else is named with its file and row).
_FLOAT_COLUMNS = ("ttft_ms", "ttft_ms_max", "concat_ms", "pad_ms", "pad_copy_ms", "kernel_ms", "out_slice_ms",
                  "chunk_out_ms", "ttft_ms_ci_lo", "ttft_ms_ci_hi", "attn_path_ms_step0")


def config_digest_of_bytes(raw: bytes) -> str:
    """SHA-256 (64 hex) of a config.json's canonical JSON. Raises ValueError: ``raw`` is not a JSON object."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"config.json is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(obj).__name__}")
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=64)
def _digest_cached(path: str, mtime_ns: int, size: int) -> str:
    return config_digest_of_bytes(Path(path).read_bytes())


def config_digest(path: str | Path) -> str:
    """:func:`config_digest_of_bytes` of the file at ``path``, once per (path, mtime, size). Raises ValueError: the
    file does not exist or is not a JSON object."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise ValueError(f"config.json path={str(p)!r} does not exist") from None
    return _digest_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


def read_manifest(path: Path | None) -> tuple[dict, str]:
    """``(files mapping, problem)``: the manifest's ``files`` (``{}`` when ``path`` is None) and ``""``, or ``{}`` and
    one line saying why a manifest that exists cannot be read (then every row counts as unstamped)."""
    if path is None:
        return {}, ""
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
        return files, ""
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {}, f"{path} cannot be read ({' '.join(str(e).split())[:120]}): every measured row counts as unstamped"


def _s(v) -> str:
    """A provenance cell as text: a missing one (None, NaN) is ``""``, as the stamp script writes it."""
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def stamp_for(files: dict, file: str, device, flash_mla, model) -> str | None:
    """The digest the manifest records for ``model`` in rows of ``file`` measured on ``device`` with ``flash_mla``,
    or None when it records none (an entry whose device or provider differs is another run's stamp)."""
    got = [(e.get("models") or {}).get(str(model)) for e in files.get(str(file), []) or []
           if isinstance(e, dict) and _s(e.get("device")) == _s(device) and _s(e.get("flash_mla")) == _s(flash_mla)]
    return next((g for g in got if isinstance(g, str)), None)


def measured_sweep_frames(root: Path, include_archive: bool = False):
    """Yield ``(path, rows)`` for every ``*.csv`` file under ``root`` (recursively, sorted) that has the sweep's
    columns, ``rows`` its ``source == "measured"`` rows (none: skipped). Other CSVs are skipped, and so are folders
    named ``archive`` unless ``include_archive``. Raises ValueError as :func:`_check_sweep_csv`."""
    manifest, files = _manifest(root) if root.is_dir() else (None, {})
    stamped = {(manifest.parent / f).resolve() for f in files} if manifest is not None else set()
    for p in sorted(root.rglob("*.csv")) if root.is_dir() else []:
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


def _manifest(root) -> tuple[Path | None, dict]:
    """``(manifest path or None, its files)``; a manifest that cannot be read is refused in one line (it would hide
    lost rows, issue 32)."""
    manifest = find_manifest(root)
    files, problem = read_manifest(manifest)
    if problem:
        raise ValueError(problem.split(": every")[0] + f"; restore it (git checkout -- {manifest})")
    return manifest, files


def _header(p: Path) -> list[str]:
    try:
        with open(p, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


def _check_sweep_csv(p: Path) -> None:
    """A measured sweep CSV read whole or not at all (:func:`_check_row` for every row). Raises ValueError:
    ``<file>: row <n> ...`` (row 1 is the header), with how to restore the file."""
    fix = f"restore it (git checkout -- {p}) or move it out of {p.parent}"
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, strict=True)
            head = next(reader)
            for n, row in enumerate(reader, start=2):
                if len(row) != len(head):
                    raise ValueError(f"{p}: row {n} has {len(row)} fields, the header {len(head)} (a truncated or "
                                     f"edited file: its rows would be dropped); {fix}")
                _check_row(p, head, row, n, fix)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{p}: not a readable CSV ({' '.join(str(e).split())[:80]}); {fix}") from None


def _check_row(p: Path, head: list[str], row: list[str], n: int, fix: str) -> None:
    """A measured row's cells: in range (:func:`mla_lab.paths.check_measured_cells`), its integer columns
    integers, its number columns numbers or empty, its per-step column a JSON list of numbers."""
    rec = dict(zip(head, row))
    if rec["source"] != "measured":
        return
    check_measured_cells(p, head, row, n, fix)  # ranges and the row's own quartiles (issue 39)
    for c in _INT_COLUMNS:
        if not rec[c].strip().lstrip("-").replace(".0", "", 1).isdigit():
            raise ValueError(f"{p}: row {n}: {c}={rec[c]!r} is not an integer; {fix}")
    for c in (c for c in _FLOAT_COLUMNS if rec.get(c, "").strip()):
        try:
            float(rec[c])
        except ValueError:
            raise ValueError(f"{p}: row {n}: {c}={rec[c].strip()[:40]!r} is not a number; {fix}") from None
    cell = rec.get(_JSON_LIST_COLUMN, "").strip()
    try:
        v = json.loads(cell) if cell else []
    except ValueError:
        v = None
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) for x in v):
        raise ValueError(f"{p}: row {n}: {_JSON_LIST_COLUMN}={cell[:40]!r} is not a JSON list of numbers; {fix}")


def _manifest_key(root, file, manifest: Path) -> str:
    return (Path(root).resolve() / str(file)).resolve().relative_to(manifest.parent.resolve()).as_posix()


def check_stamped_rows(df, root: str | Path | None) -> None:
    """Every measured CSV holds at least the rows its stamp in the manifest counts. Raises ValueError: ``<file>
    holds <n> measured rows; its stamp in <manifest> counts <m> ...`` (rows were lost)."""
    if not len(df) or "file" not in df.columns or root is None:
        return
    manifest, files = _manifest(root)
    if manifest is None:
        return
    for f, g in df.groupby("file"):
        entries = [e for e in files.get(_manifest_key(root, f, manifest), []) or []
                   if isinstance(e, dict) and isinstance(e.get("rows"), int)]
        want = sum(e["rows"] for e in entries)
        if entries and len(g) < want:
            raise ValueError(f"{Path(root).resolve() / str(f)} holds {len(g)} measured rows; its stamp in {manifest} "
                             f"counts {want} (rows were lost: a truncated or cut file); restore it (git checkout) or "
                             "re-stamp it (python -m mla_lab.report.stamp_measured)")


def load_measured(root: str | Path | None = None, weight_dtype: str | None = None, moe_parallel: str | None = None):
    """Measured sweep rows under ``root`` (default env ``MLA_LAB_MEASURED``, else ``data/measured``) with a ``file``
    column, checked against their stamps (:func:`check_stamped_rows`), rows of another model config detached
    (:func:`detach_stale`; ``attrs["detached"]``, ``attrs["unstamped"]``), TTFT re-priced with the current model
    (:func:`mla_lab.sweep.rows.reprice_measured_rows`). Empty DataFrame if none."""
    root = Path(root) if root else measured_dir()
    frames = [df.assign(file=str(p.relative_to(root))) for p, df in measured_sweep_frames(root)]
    out = pd.DataFrame()
    out.attrs["detached"], out.attrs["unstamped"] = [], []
    if frames:
        rows = pd.concat(frames, ignore_index=True)
        check_stamped_rows(rows, root)
        both, detached = detach_stale(rows, root)
        out = reprice_measured_rows(both, weight_dtype, moe_parallel) if len(both) else both
        out.attrs["detached"], out.attrs["unstamped"] = detached, unstamped_files(both, root)
    return out


def withhold_off_route(df):
    """``(kept, notes)``: the measured rows whose change applies to their deployment, and one line per deployment
    whose rows were left out (``measured_withheld`` set by :func:`mla_lab.sweep.rows.reprice_measured_rows`: the
    measured kernel is not on the deployment's route, or it does not fit; issue 39)."""
    if "measured_withheld" not in df.columns or not len(df):
        return df, []
    off = df["measured_withheld"].fillna("").astype(str) != ""
    notes = []
    keys = [c for c in DEPLOYMENT_KEYS if c in df]
    for k, g in df[off].groupby(keys, dropna=False):
        where = " ".join(f"{c}={v}" for c, v in zip(keys, k if isinstance(k, tuple) else (k,)))
        why = list(dict.fromkeys(g["measured_withheld"].astype(str)))
        notes.append(f"{len(g)} measured row(s) of {where} not shown: {why[0]}"
                     + (f" (and {len(why) - 1} other reason(s))" if len(why) > 1 else ""))
    kept = df[~off].copy()
    kept.attrs.update(df.attrs)
    return kept, notes


def _row_stamps(df, root):
    """Per row of ``df``: ``(manifest key of its file, the config digest the manifest stamps for it or None)``."""
    manifest = find_manifest(root) if root is not None and "file" in df.columns else None
    files, _ = read_manifest(manifest)
    keys = [_manifest_key(root, f, manifest) if manifest is not None else None for f in df.get("file", df.index)]
    stamps = [stamp_for(files, k, r.get("device"), r.get("flash_mla"), r["model"]) if k is not None else None
              for k, (_, r) in zip(keys, df.iterrows())]
    return pd.Series(keys, index=df.index, dtype=object), pd.Series(stamps, index=df.index, dtype=object)


def detach_stale(df, root: str | Path | None = None):
    """Measured rows no longer measurements of the model config they name, dropped. Returns ``(kept rows, [one line
    per detached model and TP])``. A row the manifest stamps is kept when the stamped digest equals
    today's ``data/models/<model>/config.json``'s; one it does not stamp when its ``num_heads`` is today's heads per
    rank; a row of a model no longer known is detached."""
    if not len(df):
        return df, []
    keys, stamps = _row_stamps(df, root)
    keep, notes = pd.Series(True, index=df.index), []
    for (m, tp), g in df.groupby(["model", "tp"], dropna=False):
        stale, why = _stale(g, m, tp, keys[g.index], stamps[g.index])
        if stale.any():
            notes.append(f"{int(stale.sum())} measured row(s) of {m} TP{tp} detached: {why} (re-measure on the "
                         "current config and run mla_lab/report/stamp_measured.py to attach)")
            keep[stale.index[stale]] = False
    return df[keep].copy(), notes


def _stale(g, m, tp, keys, stamps):
    """``(mask of the stale rows of one (model, TP) group, why in words)``."""
    try:
        want = load_model(str(m)).heads_per_rank(int(tp))
        now = config_digest(model_config_path(str(m)))
    except (ValueError, TypeError) as e:
        return stamps.isna() | stamps.notna(), f"its model no longer loads ({' '.join(str(e).split())[:120]})"
    heads = g["num_heads"].astype(float) if "num_heads" in g.columns else None
    moved = stamps.notna() & (stamps != now)
    stale = moved | (stamps.isna() & (heads != want)) if heads is not None else moved
    parts = []
    if heads is not None and (heads[stale] != want).any():
        parts.append(f"measured at {sorted(set(heads[stale].astype(int)))} heads per rank, the config now gives {want}")
    whys = sorted({(keys[i], g.at[i, "device"] if "device" in g else None,
                    g.at[i, "flash_mla"] if "flash_mla" in g else None, stamps[i]) for i in g.index[moved]}, key=str)
    if whys:
        f, dev, prov, old = whys[0]
        more = f" and {len(whys) - 1} more" if len(whys) > 1 else ""
        parts.append(f"measured with data/models/{m}/config.json sha256 {old[:12]}, it is now {now[:12]} "
                     f"({f}, {dev}, {prov}{more})")
    return stale, "; ".join(parts)


def unstamped_files(df, root: str | Path | None) -> list[str]:
    """One line per measured CSV of ``df`` (its ``file`` column) with rows the manifest does not stamp (checked by
    heads per rank only), and one for a manifest that cannot be read."""
    if not len(df) or "file" not in df.columns or root is None:
        return []
    _, problem = read_manifest(find_manifest(root))
    n = _row_stamps(df, root)[1].isna().groupby(df["file"]).sum()
    return ([problem] if problem else []) + [
        f"{int(k)} measured row(s) of {f} carry no config digest (checked by heads per rank only; run "
        "mla_lab/report/stamp_measured.py after a GPU run)" for f, k in n.items() if k]


def load_measured_cached(root: str | Path | None = None, weight_dtype: str | None = None,
                         moe_parallel: str | None = None):
    """:func:`load_measured` through :func:`mla_lab.report.cache.cached_under`, its inputs hashed afresh each call
    (``mla-lab advise`` in ~1 s instead of ~3 s)."""
    where = Path(root) if root else measured_dir()
    inputs_digest(refresh=True, root=where)
    return cached_under(where, load_measured, root, weight_dtype, moe_parallel)


def measured_for(params, root: str | Path | None = None):
    """:func:`load_measured_cached` rows on the sweep grid of ``params`` (a :class:`mla_lab.sweep.SweepParams`), those
    off their route withheld (:func:`withhold_off_route`)."""
    m = load_measured_cached(root, weight_dtype=params.weight_dtype, moe_parallel=params.moe_parallel)  # priced once
    notes = {k: list(m.attrs.get(k, [])) for k in MEASURED_NOTES}
    if len(m) == 0:
        return m
    keep = {"model": set(params.models), "tp": set(params.tp_sizes), "arch": {get_arch(a).name for a in params.archs},
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
    """The sweep's rows and measured rows (None or empty allowed) in one frame, a row both hold (same point_key,
    strategy, source and timestamp) once, the measured frame's notes (:data:`MEASURED_NOTES`) carried over."""
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
    return preferred if preferred in vals else (vals[-1] if vals else None)

def failed_points(df):
    """Rows of points that failed (status neither ok nor :data:`mla_lab.sweep.rows.NOT_PRICED`), with their reason."""
    if "status" not in df.columns:
        return df.iloc[0:0]
    cols = [c for c in (*DEPLOYMENT_KEYS, "source", "status", "reason") if c in df.columns]
    st = df["status"].fillna("ok")
    return df[(st != "ok") & ~st.isin(NOT_PRICED)][cols]

def load_validation(root: str | Path | None = None):
    """The TTFT model's predicted-vs-measured rows: every ``layer_validation.csv`` under ``root`` (default the measured
    root), a ``run`` column naming its folder; empty DataFrame if none."""
    root = Path(root) if root else measured_dir()
    frames = [pd.read_csv(p).assign(run=str(p.parent.relative_to(root)) if p.parent != root else ".")
              for p in (sorted(root.rglob("layer_validation.csv")) if root.is_dir() else [])]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
