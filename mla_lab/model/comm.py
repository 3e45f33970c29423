"""The measured all-reduce: a latency + bandwidth fit of NCCL ring all-reduce times per world size
(:func:`ring_allreduce_ms`; docs/ttft-model.md, "Communication"). Rows: ``data/measured/<gpu>x<n>/allreduce.csv``
and the older ``tp2_attention.csv``; the fit: ``data/calibration/h200_comm.csv`` (``mla_lab/fits/comm.py``).
"""

from __future__ import annotations

import csv
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from .._validate import read_csv_checked
from ..paths import REPO_ROOT, calibration_dir, measured_dir

COMM_CSV = "h200_comm.csv"
FIT_COLUMNS = ["world_size", "latency_us", "bw_gbps", "n", "n_sizes", "min_bytes", "max_bytes", "mape_pct",
               "loo_mape_pct", "max_ape_pct"]
#: The columns :func:`measured_allreduce_rows` needs in ``allreduce.csv`` / ``tp2_attention.csv``.
ALLREDUCE_NEEDED = ("world_size", "rank", "nbytes", "ms")
LEGACY_NEEDED = ("run", "world_size", "rank", "allreduce_bytes", "allreduce_ms")


def _real(v) -> float:
    """``v`` as a float if it is a real number (not a bool), else nan."""
    return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else math.nan


def _world_size(v, name: str = "world_size", lo: int = 2) -> int:
    """``v`` as an int >= ``lo`` (int or integral float), else ValueError naming ``name``."""
    f = _real(v)
    if not (math.isfinite(f) and f == int(f) and int(f) >= lo):
        raise ValueError(f"{name}={v!r} is not valid; allowed: an integer number of ranks >= {lo}")
    return int(f)


def _positive(v, name: str) -> float:
    """``v`` as a finite float > 0, else ValueError naming ``name``."""
    f = _real(v)
    if not (math.isfinite(f) and f > 0):
        raise ValueError(f"{name}={v!r} is not valid; allowed: a finite number > 0")
    return f


def ring_allreduce_ms(nbytes: float, world_size: int, bw_gbps: float, latency_us: float) -> float:
    """``latency_us x 1e-3 + 2 (n-1)/n x nbytes / (bw_gbps x 1e9) x 1e3`` ms (0 for one rank or no bytes).
    Raises ValueError: ``world_size`` < 1; ``bw_gbps`` not finite > 0; ``latency_us`` not finite >= 0."""
    world_size = _world_size(world_size, "world_size", lo=1)
    bw_gbps = _positive(bw_gbps, "bw_gbps")
    if not _real(latency_us) >= 0 or not math.isfinite(_real(latency_us)):
        raise ValueError(f"latency_us={latency_us!r} is not valid; allowed: a finite number >= 0")
    if world_size <= 1 or nbytes <= 0:
        return 0.0
    return latency_us * 1e-3 + 2.0 * (world_size - 1) / world_size * nbytes / (bw_gbps * 1e9) * 1e3


@dataclass(frozen=True)
class CommFit:
    """A measured all-reduce at one world size: ``latency_us`` per call, ``bw_gbps`` per direction (1e9 B/s), errors
    in sample and leave-one-size-out (None under 3 sizes); ``measured`` False for :func:`extrapolated` fits."""

    world_size: int
    latency_us: float
    bw_gbps: float
    n: int = 0
    n_sizes: int = 0
    min_bytes: float = 0.0
    max_bytes: float = 0.0
    mape_pct: float | None = None
    loo_mape_pct: float | None = None
    max_ape_pct: float | None = None
    name: str = ""
    measured: bool = True

    def time_ms(self, nbytes: float, world_size: int | None = None) -> float:
        """Modelled ms of an all-reduce of ``nbytes`` (raises as :func:`ring_allreduce_ms`)."""
        n = self.world_size if world_size is None else world_size
        return ring_allreduce_ms(nbytes, n, self.bw_gbps, self.latency_us)


@dataclass(frozen=True)
class CommModel:
    """One GPU's fits ``{world_size: CommFit}``, loaded from file ``name``."""

    fits: dict = field(default_factory=dict)
    name: str = ""

    def fit_for(self, world_size: int) -> CommFit | None:
        """The fit measured at ``world_size``, or None. Raises ValueError: not an integer >= 1 (``2.5``, ``"8"``)."""
        return self.fits.get(_world_size(world_size, "world_size", lo=1))

    def source(self, world_size: int) -> str:
        """``measured fit tp=N (file)`` or ``assumption`` — what prices an all-reduce over ``world_size`` ranks."""
        f = self.fit_for(world_size)
        if f is None:
            return "assumption"
        return f"measured fit tp={f.world_size} ({self.name})" if f.measured else f.name


def extrapolated(model: CommModel, world_size: int, from_world_size: int | None = None) -> CommFit:
    """``from_world_size``'s fit (default the largest) at ``world_size``; sensitivity only, never the default.
    Raises ValueError: no fit; ``world_size`` not an integer >= 2; ``from_world_size`` not measured."""
    world_size = _world_size(world_size, "world_size")
    if not model.fits:
        raise ValueError("no measured all-reduce fit to extrapolate from")
    src = max(model.fits) if from_world_size is None else _world_size(from_world_size, "from_world_size")
    if src not in model.fits:
        raise ValueError(f"from_world_size={from_world_size!r} was not measured; measured: {sorted(model.fits)}")
    f = model.fits[src]
    return CommFit(world_size, f.latency_us, f.bw_gbps, f.n, f.n_sizes, f.min_bytes, f.max_bytes, None, None,
                   None, f"extrapolated from the tp={src} fit ({model.name}), not measured at tp={world_size}",
                   measured=False)


def _solve(rows) -> tuple[float, float]:
    """``(latency_us, bw_gbps)``: ``ms = a + b x`` on relative error, ``a`` clipped at 0."""
    sw = swx = swy = swxx = swxy = 0.0
    for x, y in rows:
        w = 1.0 / (y * y)
        sw, swx, swy, swxx, swxy = sw + w, swx + w * x, swy + w * y, swxx + w * x * x, swxy + w * x * y
    det = sw * swxx - swx * swx
    if det > 0:
        b = (sw * swxy - swx * swy) / det
        a = (swy - b * swx) / sw
    else:
        a, b = 0.0, 0.0
    if a < 0 or b <= 0 or det <= 0:
        a, b = 0.0, swxy / swxx
    return a * 1e3, 1.0 / b * 1e3 / 1e9  # ms -> us; ms per byte -> GB/s


def _comm_row(i: int, r) -> tuple[int, float, float]:
    """``(world_size, ms, nbytes)`` of ``rows[i]`` (:func:`fit_comm`). Raises ValueError naming the row."""
    if not isinstance(r, dict) or any(k not in r for k in ("world_size", "nbytes", "ms")):
        raise ValueError(f"rows[{i}]={r!r:.120} is not valid; allowed: a dict with keys world_size, nbytes, ms")
    try:
        n = _world_size(r["world_size"], f"rows[{i}] world_size", lo=0)
    except ValueError:
        raise ValueError(f"rows[{i}] world_size={r['world_size']!r} is not valid; allowed: an integer number "
                         "of ranks") from None
    ms, nb = _real(r["ms"]), _real(r["nbytes"])
    for k, v in (("ms", ms), ("nbytes", nb)):
        if not math.isfinite(v):
            raise ValueError(f"rows[{i}] {k}={r[k]!r} is not valid; allowed: a finite number")
    return n, ms, nb


def fit_comm(rows: list[dict], name: str = "") -> CommModel:
    """One :class:`CommFit` per world size from rows ``{world_size, rank, nbytes, ms}`` (one size: bandwidth only).
    Raises ValueError: not a list of dicts; a row missing a key or with a bad value (names the row)."""
    if isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
        raise ValueError(f"rows={rows!r:.80} is not valid; allowed: a list of dicts with keys {list(ALLREDUCE_NEEDED)}")
    by: dict[int, list] = {}
    for i, r in enumerate(rows):
        n, ms, nb = _comm_row(i, r)
        if n >= 2 and ms > 0 and nb > 0:
            by.setdefault(n, []).append((2.0 * (n - 1) / n * nb, ms, nb))
    fits = {}
    for n, rs in sorted(by.items()):
        sizes = sorted({nb for _, _, nb in rs})
        pts = [(x, y) for x, y, _ in rs]
        lat, bw = _solve(pts) if len(sizes) > 1 else (0.0, _solve(pts)[1])
        apes = [abs(ring_allreduce_ms(nb, n, bw, lat) - y) / y * 100 for _, y, nb in rs]
        loo = None
        if len(sizes) >= 3:
            errs = []
            for s in sizes:
                lat_s, bw_s = _solve([(x, y) for x, y, nb in rs if nb != s])
                errs += [abs(ring_allreduce_ms(nb, n, bw_s, lat_s) - y) / y * 100 for _, y, nb in rs if nb == s]
            loo = sum(errs) / len(errs)
        fits[n] = CommFit(n, lat, bw, len(rs), len(sizes), sizes[0], sizes[-1], sum(apes) / len(apes), loo,
                          max(apes), name)
    return CommModel(fits, name)


def measured_allreduce_rows(gpu: str = "h200", root: str | Path | None = None) -> tuple[list[dict], list[str]]:
    """``(rows, files)``: every rank's all-reduce median under ``<root>/<gpu>x<n>/``, rows ``{world_size, rank,
    nbytes, ms, file}``. Raises ValueError: ``root`` not a folder; a missing column or bad row; non-nccl rows."""
    import pandas as pd

    root = Path(root) if root is not None else measured_dir()
    if root.exists() and not root.is_dir():
        raise ValueError(f"measured dir {str(root)!r} is not a folder; allowed: a folder holding <gpu>x<n>/ folders")
    rows, files = [], []
    for d in sorted(root.glob(f"{gpu}x*")):
        n_dir = d.name[len(gpu) + 1:]
        if not (d.is_dir() and n_dir.isdigit()):
            continue
        ar, legacy = d / "allreduce.csv", d / "tp2_attention.csv"
        for path, need, b_col, ms_col in ((ar, ALLREDUCE_NEEDED, "nbytes", "ms"),
                                          (legacy, LEGACY_NEEDED, "allreduce_bytes", "allreduce_ms")):
            if not path.is_file():
                continue
            t = read_csv_checked(path, need, "mla_lab/measure/experiments/tp_block.py")
            if path is legacy:
                t = t[t["run"].astype(str) == "tp"]
            _check_allreduce_rows(t, path, int(n_dir), b_col, ms_col)
            t = t.assign(**{c: pd.to_numeric(t[c]) for c in ("world_size", "rank", b_col, ms_col)})
            g = t.groupby(["world_size", "rank", b_col], as_index=False)[ms_col]
            # the older file repeats one all-reduce per (model, T) on each strategy's row: take the first
            g = (g.median() if path is ar else g.first()).rename(columns={b_col: "nbytes", ms_col: "ms"})
            files.append(_shown(path))
            rows += [dict(r, file=files[-1]) for r in g.to_dict("records")]
    return rows, files


def _check_allreduce_rows(t, path: Path, n_dir: int, b_col: str, ms_col: str) -> None:
    import pandas as pd

    num = {c: pd.to_numeric(t[c], errors="coerce") for c in ("world_size", "rank", b_col, ms_col)}
    bad = [
        ("world_size", num["world_size"] != n_dir, f"{n_dir} (the folder is {path.parent.name})"),
        ("rank", ~((num["rank"] >= 0) & (num["rank"] < n_dir) & (num["rank"] % 1 == 0)), f"an integer in [0, {n_dir})"),
        (b_col, ~((num[b_col] > 0) & num[b_col].abs().lt(float("inf"))), "a finite number > 0"),
        (ms_col, ~((num[ms_col] > 0) & num[ms_col].abs().lt(float("inf"))), "a finite number > 0"),
    ]
    for col, mask, allowed in bad:
        if mask.any():
            i = mask.to_numpy().nonzero()[0][0]
            v = t[col].iloc[i]
            v = v.item() if hasattr(v, "item") else v  # numpy scalar -> its Python value (plain repr)
            raise ValueError(f"{path}: row {int(t.index[i]) + 2} {col}={v!r} is not valid; allowed: "
                             f"{allowed}")
    if "dist_backend" in t.columns:
        other = sorted({str(v) for v in t["dist_backend"].dropna()} - {"nccl"})
        if other:
            raise ValueError(f"{path}: dist_backend {other} is not an NVLink all-reduce (a --cpu-dry-run?); allowed: "
                             "nccl rows only")


def _shown(p: Path) -> str:
    """``p`` relative to the repository when inside it, else absolute."""
    p = p.resolve()
    return str(p.relative_to(REPO_ROOT)) if REPO_ROOT in p.parents else str(p)


def _num(v):
    return None if v in (None, "", "nan", "None") or (isinstance(v, float) and math.isnan(v)) else float(v)


def load_comm_model(path: str | Path | None = None) -> CommModel | None:
    """The fits in ``path`` (default ``data/calibration/h200_comm.csv``); None without the file.
    Raises ValueError: a folder; a missing column; a malformed or repeated row (names the file and row)."""
    p = Path(path) if path else calibration_dir() / COMM_CSV
    if p.is_dir():
        raise ValueError(f"all-reduce fit path={str(p)!r} is a folder; allowed: a CSV file ({COMM_CSV})")
    if not p.is_file():
        return None
    fits = {}
    with open(p, newline="", errors="replace") as f:
        reader = csv.DictReader(f)
        missing = [c for c in FIT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{p}: missing column(s) {missing}; allowed: a file written by mla_lab/fits/comm.py")
        for r in reader:
            try:
                n, lat, bw = int(r["world_size"]), float(r["latency_us"]), float(r["bw_gbps"])
                fit = CommFit(n, lat, bw, int(float(r["n"])), int(float(r["n_sizes"])), float(r["min_bytes"]),
                              float(r["max_bytes"]), _num(r["mape_pct"]), _num(r["loo_mape_pct"]),
                              _num(r["max_ape_pct"]), r.get("data_files", "") or "")
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{p}: bad all-reduce fit row {r}: {e}") from None
            if not (n >= 2 and math.isfinite(lat) and lat >= 0 and math.isfinite(bw) and bw > 0):
                raise ValueError(f"{p}: world_size must be >= 2, latency_us >= 0 and bw_gbps > 0 (both finite), "
                                 f"got row {r}")
            if not (0 < fit.min_bytes <= fit.max_bytes < math.inf):
                raise ValueError(f"{p}: min_bytes must be > 0 and <= max_bytes, got row {r}")
            if n in fits:
                raise ValueError(f"{p}: world_size {n} has two fit rows; allowed: one row per world size")
            fits[n] = fit
    return CommModel(fits, p.name)
