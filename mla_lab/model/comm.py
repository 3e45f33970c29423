"""The all-reduce as measured: a latency + bandwidth fit of NCCL ring all-reduce times, one per world size.

The cost model's collective formula (:func:`mla_lab.model.timing.comm_time_ms`) prices a ring all-reduce of ``B``
bytes over ``n`` ranks as ``2 (n-1)/n x B`` bytes moved per rank and direction. Without a measurement it assumes the
datasheet NVLink bandwidth (:attr:`mla_lab.arch.GPUArch.nvlink_gbps`, both directions together, so ``/ 2`` per
direction) at ``comm_efficiency`` 0.8 and no latency. Where the all-reduce has been measured at world size ``n``
this module replaces that assumption, for that ``n`` only, with

    t(B) = latency_us x 1e-3 + 2 (n-1)/n x B / (bw_gbps x 1e9) x 1e3     [ms]

``latency_us`` and ``bw_gbps`` (the per-direction rate the ring's moved bytes reach; NCCL's "bus bandwidth" is
the same quantity) fitted by least squares on relative error (:func:`fit_comm`) to every rank's median time of an
all-reduce (sum) of a bf16 tensor, each call after a barrier of all ranks (:mod:`mla_lab.measure.tp`). The fit's
in-sample MAPE and its leave-one-size-out MAPE are kept with it. A world size that was never measured keeps the
assumption, and every modelled row says which of the two priced it (:meth:`CommModel.source`): a fit at ``n = 2``
says nothing measured about ``n = 8`` (more hops, other NCCL algorithms and channel counts).

:func:`extrapolated` is the one exception, for sensitivity only: it prices world size ``n`` with the fit of another
world size (the ring formula carries the ``2 (n-1)/n`` factor; latency and bandwidth are taken as they are). The
report shows it beside the assumption as the range the TP=8 denominator may take; it is never the default.

Measured rows are read by :func:`measured_allreduce_rows` from ``data/measured/<gpu>x<n>/``: ``allreduce.csv``
(columns ``world_size, rank, nbytes, ms``, the harness's all-reduce sweep) and the older
``tp2_attention.csv`` (``run == "tp"``: ``world_size, rank, allreduce_bytes, allreduce_ms``, one all-reduce per
(model, T), repeated on each strategy's row). The fit lives in ``data/calibration/h200_comm.csv``
(:func:`write_comm_model`; ``benchmarks/fit_comm.py`` writes it) and is loaded by
:func:`mla_lab.model.calibration.load_calibration`.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..paths import REPO_ROOT, calibration_dir, measured_dir

__all__ = ["CommFit", "CommModel", "COMM_CSV", "fit_comm", "ring_allreduce_ms", "load_comm_model",
           "write_comm_model", "measured_allreduce_rows", "extrapolated"]

COMM_CSV = "h200_comm.csv"
FIT_COLUMNS = ["world_size", "latency_us", "bw_gbps", "n", "n_sizes", "min_bytes", "max_bytes", "mape_pct",
               "loo_mape_pct", "max_ape_pct"]


def ring_allreduce_ms(nbytes: float, world_size: int, bw_gbps: float, latency_us: float) -> float:
    """``latency_us x 1e-3 + 2 (n-1)/n x nbytes / (bw_gbps x 1e9) x 1e3`` ms (0 for one rank or no bytes)."""
    if world_size <= 1 or nbytes <= 0:
        return 0.0
    return latency_us * 1e-3 + 2.0 * (world_size - 1) / world_size * nbytes / (bw_gbps * 1e9) * 1e3


@dataclass(frozen=True)
class CommFit:
    """A measured all-reduce at one world size.

    Attributes:
        world_size: ranks (GPUs) of the measured all-reduce.
        latency_us: fixed cost per call (us).
        bw_gbps: per-direction rate of the ring's moved bytes (GB/s, 1e9 B/s).
        n: rank rows fitted; n_sizes: distinct byte sizes; min_bytes, max_bytes: the sizes' range (bytes).
        mape_pct: in-sample MAPE over the rank rows; loo_mape_pct: leave-one-size-out MAPE (None with < 3 sizes);
        max_ape_pct: the worst in-sample row.
        name: where the rows came from (files, GPU).
        measured: False for :func:`extrapolated` fits (priced at a world size that was not measured).
    """

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
        """Modelled ms of an all-reduce of ``nbytes`` bytes (at this fit's world size unless ``world_size``)."""
        return ring_allreduce_ms(nbytes, world_size or self.world_size, self.bw_gbps, self.latency_us)


@dataclass(frozen=True)
class CommModel:
    """The measured all-reduce fits of one GPU, by world size.

    Attributes:
        fits: ``{world_size: CommFit}``.
        name: the file they were loaded from.
    """

    fits: dict = field(default_factory=dict)
    name: str = ""

    def fit_for(self, world_size: int) -> CommFit | None:
        """The fit measured at ``world_size``, or None (the assumption then prices it)."""
        return self.fits.get(int(world_size))

    def source(self, world_size: int) -> str:
        """``measured fit tp=N (file)`` or ``assumption`` — what prices an all-reduce over ``world_size`` ranks."""
        f = self.fit_for(world_size)
        if f is None:
            return "assumption"
        return f"measured fit tp={f.world_size} ({self.name})" if f.measured else f.name


def extrapolated(model: CommModel, world_size: int, from_world_size: int | None = None) -> CommFit:
    """The fit of ``from_world_size`` (default: the largest measured one) used for ``world_size``: the ring's
    ``2 (n-1)/n`` factor at the new ``n``, latency and bandwidth unchanged. Sensitivity only (module docstring).

    Raises:
        ValueError: no fit in ``model``; ``from_world_size`` not measured.
    """
    if not model.fits:
        raise ValueError("no measured all-reduce fit to extrapolate from")
    src = max(model.fits) if from_world_size is None else int(from_world_size)
    if src not in model.fits:
        raise ValueError(f"from_world_size={from_world_size!r} was not measured; measured: {sorted(model.fits)}")
    f = model.fits[src]
    return CommFit(int(world_size), f.latency_us, f.bw_gbps, f.n, f.n_sizes, f.min_bytes, f.max_bytes, None, None,
                   None, f"extrapolated from the tp={src} fit ({model.name}), not measured at tp={int(world_size)}",
                   measured=False)


def _solve(rows) -> tuple[float, float]:
    """Weighted least squares of ``ms = a + b x`` with ``x`` the moved bytes, weights ``1 / ms^2`` (relative
    error); ``a`` clipped at 0 (then through the origin). Returns ``(latency_us, bw_gbps)``."""
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


def fit_comm(rows: list[dict], name: str = "") -> CommModel:
    """Fit one :class:`CommFit` per world size.

    Args:
        rows: dicts ``{"world_size": n, "rank": r, "nbytes": B, "ms": median ms}``, one per rank and size
            (:func:`measured_allreduce_rows`). Rows with ``n < 2`` or ``ms <= 0`` are ignored.
        name: recorded in each fit.

    Returns:
        :class:`CommModel`; a world size with a single size gets a bandwidth-only fit (latency 0).
    """
    by: dict[int, list] = {}
    for r in rows:
        n, ms, nb = int(r["world_size"]), float(r["ms"]), float(r["nbytes"])
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
    """Every rank's measured all-reduce median under ``<root>/<gpu>x<n>/`` (default :func:`mla_lab.paths.measured_dir`
    ``()``), from ``allreduce.csv`` and ``tp2_attention.csv`` (module docstring). Returns ``(rows, files)``; rows
    ``{"world_size", "rank", "nbytes", "ms", "file"}``, one per (file, world size, rank, bytes)."""
    import pandas as pd

    root = Path(root) if root is not None else measured_dir()
    rows, files = [], []
    for d in sorted(root.glob(f"{gpu}x*")):
        ar, legacy = d / "allreduce.csv", d / "tp2_attention.csv"
        if ar.is_file():
            t = pd.read_csv(ar)
            t = t[pd.to_numeric(t["ms"], errors="coerce") > 0]
            g = t.groupby(["world_size", "rank", "nbytes"], as_index=False)["ms"].median()
            files.append(_shown(ar))
            rows += [dict(r, file=files[-1]) for r in g.to_dict("records")]
        if legacy.is_file():
            t = pd.read_csv(legacy)
            t = t[(t["run"] == "tp") & (pd.to_numeric(t["allreduce_ms"], errors="coerce") > 0)]
            g = (t.groupby(["world_size", "rank", "allreduce_bytes"], as_index=False)["allreduce_ms"].first()
                 .rename(columns={"allreduce_bytes": "nbytes", "allreduce_ms": "ms"}))
            files.append(_shown(legacy))
            rows += [dict(r, file=files[-1]) for r in g.to_dict("records")]
    return rows, files


def _shown(p: Path) -> str:
    """``p`` relative to the repository when inside it, else absolute."""
    p = p.resolve()
    return str(p.relative_to(REPO_ROOT)) if REPO_ROOT in p.parents else str(p)


def write_comm_model(model: CommModel, path: str | Path, provenance_cols: dict) -> None:
    """Write one row per world size (:data:`FIT_COLUMNS`) plus ``provenance_cols``."""
    cols = FIT_COLUMNS + [c for c in provenance_cols if c not in FIT_COLUMNS]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for _n, fit in sorted(model.fits.items()):
            w.writerow({**{c: getattr(fit, c) for c in FIT_COLUMNS}, **provenance_cols})


def _num(v):
    return None if v in (None, "", "nan", "None") or (isinstance(v, float) and math.isnan(v)) else float(v)


def load_comm_model(path: str | Path | None = None) -> CommModel | None:
    """The fits in ``path`` (default ``data/calibration/h200_comm.csv``), or None when the file does not exist.

    Raises:
        ValueError: a malformed row (names the file and the row), latency < 0 or bandwidth <= 0.
    """
    p = Path(path) if path else calibration_dir() / COMM_CSV
    if not p.is_file():
        return None
    fits = {}
    with open(p, newline="") as f:
        for r in csv.DictReader(f):
            try:
                n, lat, bw = int(r["world_size"]), float(r["latency_us"]), float(r["bw_gbps"])
                fit = CommFit(n, lat, bw, int(float(r["n"])), int(float(r["n_sizes"])), float(r["min_bytes"]),
                              float(r["max_bytes"]), _num(r["mape_pct"]), _num(r["loo_mape_pct"]),
                              _num(r["max_ape_pct"]), r.get("data_files", ""))
            except (KeyError, ValueError) as e:
                raise ValueError(f"{p}: bad all-reduce fit row {r}: {e}") from None
            if n < 2 or lat < 0 or bw <= 0:
                raise ValueError(f"{p}: world_size must be >= 2, latency_us >= 0 and bw_gbps > 0, got row {r}")
            fits[n] = fit
    return CommModel(fits, p.name)
