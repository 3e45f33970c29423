"""The lab's one calibration type (:class:`Calibration`: efficiencies per op class and attention op against the
GPU's datasheet rates, comm assumptions and fits) and the one way a calibration file is read (:func:`load_file`).
Files under ``data/calibration/``, each fitted by its entry of :data:`mla_lab.fits.FITS`. Other GPUs reuse the
H200 efficiencies against their own datasheet rates (stated in every modelled row's ``calibration`` column).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .._validate import check_int
from ..arch import GPUArch, get_arch
from ..buffers import MIB
from ..paths import calibration_dir
from .comm import CommModel, load_comm_model
from .content import CONTENT_SCOPES, ContentModel, StepContentModel, load_content_model, load_step_content_model
from .ops import COMM_CLASSES, FP8_PEAK_FACTOR, attention_op_work

OVERHEAD_MODES = ("max", "add")
#: A measured all-reduce fit prices sizes within [min_bytes / F, max_bytes x F] of what was measured (F = 2).
COMM_FIT_RANGE_FACTOR = 2.0


def _priced_range(fit) -> tuple[float, float]:
    return fit.min_bytes / COMM_FIT_RANGE_FACTOR, fit.max_bytes * COMM_FIT_RANGE_FACTOR

@dataclass(frozen=True)
class ClassEff:
    """Efficiencies of one op class: fractions of peak FLOP/s and HBM bandwidth, a per-op overhead (us) entering
    as ``max(roofline, floor)`` (``mode`` ``max``) or ``floor + roofline`` (``add``; the fit picks per class)."""

    eff_flops: float
    eff_bytes: float
    floor_us: float = 0.0
    n: int = 0
    mape_pct: float | None = None
    mode: str = "max"

_DEFAULT_EFF = {
    # First-order guesses used only when no calibration file exists (labelled "uncalibrated-defaults").
    "gemm": ClassEff(0.75, 0.85, 5.0), "gemm_fp8": ClassEff(0.6, 0.85, 5.0),
    "moe_gemm": ClassEff(0.65, 0.8, 5.0), "moe_gemm_fp8": ClassEff(0.5, 0.8, 5.0),
    "bmm": ClassEff(0.6, 0.8, 5.0), "norm": ClassEff(1.0, 0.7, 3.0), "elementwise": ClassEff(1.0, 0.7, 3.0),
    "indexer_logits": ClassEff(0.4, 0.8, 5.0), "topk": ClassEff(1.0, 0.3, 5.0), "reduce": ClassEff(1.0, 0.7, 3.0),
}

#: Classes with no measurement of their own borrow another's efficiencies.
_FALLBACK = {"gemm_fp8": "gemm", "moe_gemm": "gemm", "moe_gemm_fp8": "gemm_fp8", "reduce": "elementwise",
             "bmm": "gemm", "norm": "elementwise", "topk": "elementwise", "indexer_logits": "gemm"}


@dataclass(frozen=True)
class Calibration:
    """Efficiencies and assumptions the cost model prices ops with (:func:`mla_lab.model.timing.op_time_ms`).

    ``classes``: ``{op_class: ClassEff}`` (missing ones borrow via ``_FALLBACK``); ``attention``: ``{op: eff}``,
    ``kernel`` of dense bf16 TFLOP/s, byte ops of HBM GB/s, ``chunk_overhead_us`` / ``graph_chunk_overhead_us`` per
    extra sub-chunk (us); ``name``: the source shown in every modelled row; ``comm_*``: the ring assumption (0.8 of
    per-direction NVLink, 0 us) and the small all-reduce latency (:meth:`with_small_comm_latency`); ``comm``,
    ``content``, ``content_step``: measured fits or None; ``content_scope``: ``step`` or ``kernel`` (issue 21).
    """

    classes: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    name: str = "uncalibrated-defaults"
    arch: str = "h200"
    comm_efficiency: float = 0.8
    comm_latency_us: float = 0.0
    comm_small_latency_us: float = 0.0
    comm_small_max_bytes: float = 0.0
    comm_small_source: str = ""
    content: ContentModel | None = None
    comm: CommModel | None = None
    content_step: StepContentModel | None = None
    content_scope: str = "step"

    def __post_init__(self):
        if self.content_scope not in CONTENT_SCOPES:
            raise ValueError(f"content_scope={self.content_scope!r} is not valid; allowed: {list(CONTENT_SCOPES)}")

    def step_content(self) -> StepContentModel | None:
        """The step content model pricing stale padded heads, or None (the kernel-only factor does)."""
        return self.content_step if self.content_scope == "step" else None

    def with_content_scope(self, scope: str) -> "Calibration":
        """A copy pricing stale padded heads over the ``step`` or the ``kernel`` only. Raises ValueError: unknown
        (:meth:`__post_init__`)."""
        return replace(self, content_scope=scope, name=self.name if scope == "step" else
                       f"{self.name}; content kernel-only")

    def comm_fit_for(self, world_size: int, kind: str = "allreduce", arch=None):
        """The measured fit of ``world_size`` on ``arch`` whatever the size (:meth:`comm_fit` adds the size
        range), or None. Raises ValueError: world_size not a positive int; unknown arch."""
        check_int("world_size", world_size)
        return self._fit_for(world_size, kind, arch)

    def _fit_for(self, world_size: int, kind: str, arch):
        name = arch.name if isinstance(arch, GPUArch) else (arch or self.arch)
        if kind != "allreduce" or self.comm is None or get_arch(name).name != get_arch(self.arch).name:
            return None  # a fit measured on one GPU (self.arch) says nothing measured about another's NVLink
        return self.comm.fit_for(world_size)

    def comm_fit(self, world_size: int, nbytes: float, kind: str = "allreduce", arch=None):
        """The measured fit pricing this collective, or None (the assumption prices it): an all-reduce on the GPU the
        fit was measured on (``arch``, default :attr:`arch`), ``nbytes`` within its measured range widened by
        :data:`COMM_FIT_RANGE_FACTOR`; ``world_size`` a checked positive int. Raises ValueError: unknown arch."""
        fit = self._fit_for(world_size, kind, arch)
        if fit is None:
            return None
        lo, hi = _priced_range(fit)
        return fit if lo <= nbytes <= hi else None

    def comm_source(self, world_size: int, kind: str = "allreduce", arch=None) -> str:
        """What prices a collective over ``world_size`` ranks (as :meth:`comm_fit`), in words; ``none`` for one rank.
        Raises ValueError: world_size not a positive int; unknown arch."""
        check_int("world_size", world_size)
        return self.comm_source_checked(world_size, kind, arch)

    def comm_source_checked(self, world_size: int, kind: str = "allreduce", arch=None) -> str:
        """:meth:`comm_source` below the door (``world_size`` a checked positive int: a Deployment's TP)."""
        fit = self._fit_for(world_size, kind, arch)
        if world_size == 1:
            return "none"
        assumption = (f"assumption: ring at {self.comm_efficiency:g} x NVLink per direction, "
                      f"latency {self.comm_latency_us:g} us")
        if self.comm_small_latency_us > 0 and kind == "allreduce":
            assumption += f"; {self.comm_small_source or f'+{self.comm_small_latency_us:g} us below'}"
        if fit is None:
            return assumption
        lo, hi = _priced_range(fit)
        return f"{self.comm.source(world_size)} for {lo / MIB:.0f}-{hi / MIB:.0f} MiB, {assumption} outside"

    def with_comm_fit(self, fit, name: str | None = None) -> "Calibration":
        """A copy whose all-reduce over ``fit.world_size`` ranks is priced by ``fit`` (a CommFit)."""
        fits = dict(self.comm.fits) if self.comm is not None else {}
        fits[fit.world_size] = fit
        comm = CommModel(fits, self.comm.name if self.comm is not None else "")
        return replace(self, comm=comm, name=name or self.name)

    def eff(self, op_class: str) -> ClassEff:
        """The :class:`ClassEff` of a class (via ``_FALLBACK``). Raises ValueError: none for it or a fallback."""
        seen = set()
        c = op_class
        while c not in self.classes:
            if c in seen or c not in _FALLBACK:
                raise ValueError(f"calibration {self.name!r} has no efficiency for op_class={op_class!r}; "
                                 f"has {sorted(self.classes)}")
            seen.add(c)
            c = _FALLBACK[c]
        return self.classes[c]

    def attention_eff(self, op: str) -> float:
        """Efficiency of an attention-path op. Raises ValueError when the calibration has none."""
        if op == "chunk_out" and op not in self.attention:
            return self.attention_eff("out_slice")
        if op in ("chunk_overhead_us", "graph_chunk_overhead_us") and op not in self.attention:
            return 0.0
        if op not in self.attention:
            raise ValueError(f"calibration {self.name!r} has no efficiency for op={op!r}; has {sorted(self.attention)}")
        return self.attention[op]

    def with_attention(self, name: str | None = None, **eff) -> "Calibration":
        """A copy with some attention efficiencies replaced (e.g. re-anchored on measurements)."""
        return replace(self, attention={**self.attention, **eff}, name=name or self.name)

    def with_small_comm_latency(self, latency_us: float, max_bytes: float, source: str) -> "Calibration":
        """A copy whose all-reduces below ``max_bytes`` (B) with no measured fit pay ``latency_us`` more.
        Raises ValueError: a negative or non-finite latency or size."""
        for n, v in (("latency_us", latency_us), ("max_bytes", max_bytes)):
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{n}={v!r} must be a non-negative number")
        return replace(self, comm_small_latency_us=float(latency_us), comm_small_max_bytes=float(max_bytes),
                       comm_small_source=str(source))

    def with_comm(self, comm_efficiency: float | None = None, comm_latency_us: float | None = None):
        """A copy with other comm assumptions, applied to every world size: the measured all-reduce fits are dropped
        (``comm=None``), so what is asked for is what is priced. Raises ValueError outside (0, 1] / below 0."""
        ce = self.comm_efficiency if comm_efficiency is None else comm_efficiency
        cl = self.comm_latency_us if comm_latency_us is None else comm_latency_us
        if isinstance(ce, bool) or not (isinstance(ce, (int, float)) and 0 < ce <= 1):
            raise ValueError(f"comm_efficiency={ce!r} must be a number in (0, 1]")
        if isinstance(cl, bool) or not (isinstance(cl, (int, float)) and cl >= 0):
            raise ValueError(f"comm_latency_us={cl!r} must be a non-negative number")
        return replace(self, comm_efficiency=float(ce), comm_latency_us=float(cl), comm=None)


OPS_CSV, ROUTES_CALIBRATION_CSV, REFERENCE_CSV = "h200_ops.csv", "h200_routes.csv", "h200_reference.csv"
SUBCHUNK_CSV, SUBCHUNK_GRAPH_CSV = "h200_subchunk.csv", "h200_subchunk_graph.csv"
#: The columns of an efficiency file (``h200_ops.csv``, ``h200_routes.csv``) before its provenance columns.
CALIBRATION_COLUMNS = ["kind", "op_class", "eff_flops", "eff_bytes", "floor_us", "overhead_mode", "n", "mape_pct"]


@functools.cache
def _cached(reader: Callable, path: str, mtime_ns: int):
    return reader(Path(path))


def load_file(reader: Callable[[Path], object], name: str, path: str | Path | None = None):
    """What ``reader`` makes of the calibration file ``path`` (default ``data/calibration/<name>``; None: no file),
    read once per (reader, path, mtime): the lab's one calibration cache. Raises ValueError: as ``reader``."""
    p = Path(path) if path is not None else calibration_dir() / name
    return _cached(reader, str(p.resolve()), p.stat().st_mtime_ns) if p.is_file() else None


def csv_rows(path: str | Path) -> list[dict]:
    """The rows of a CSV file (dicts of str); ``[]`` when the file does not exist."""
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _read_reference(path: Path) -> tuple[dict, str]:
    rows = [r for r in csv_rows(path) if not r["op"].startswith("#")]
    ratios: dict[str, list[float]] = {}
    arch = get_arch(rows[0]["arch"] if rows else "h200")
    for r in rows:
        op, T, topk = r["op"], int(r["T"]), int(r["topk"])
        work = attention_op_work(op, T, int(r["num_heads"]), int(r["padded_heads"]), T * topk)
        peak = arch.bf16_tflops * 1e12 if op == "kernel" else arch.hbm_gbps * 1e9
        ratios.setdefault(op, []).append(work / (float(r["ms"]) * 1e-3) / peak)
    return {op: sorted(v)[len(v) // 2] for op, v in ratios.items()}, \
        f"{path.name} ({rows[0]['source'] if rows else 'empty'})"


def attention_from_reference(path: str | Path | None = None) -> tuple[dict, str]:
    """``({op: eff}, name)``: per attention op the median achieved / datasheet rate of the reference timings
    (``h200_reference.csv``: do_bench medians on one H200, torch 2.11.0+cu130, driver 580.159.04, 2026-11-30; work by
    :func:`mla_lab.model.ops.attention_op_work`). Raises ValueError: the file does not exist."""
    got = load_file(_read_reference, REFERENCE_CSV, path)
    if got is None:
        raise ValueError(f"reference timings path={str(path or calibration_dir() / REFERENCE_CSV)!r} do not exist")
    return dict(got[0]), got[1]


def uncalibrated() -> Calibration:
    """First-order efficiencies with no measurement behind them, plus the reference-fitted attention ops."""
    att, name = attention_from_reference()
    return Calibration(dict(_DEFAULT_EFF), att, f"uncalibrated-defaults; attention from {name}", "h200",
                       content=load_content_model(), comm=load_comm_model(), content_step=load_step_content_model())


def _read_efficiencies(path: Path) -> tuple[dict, dict, str]:
    """One efficiency file (the :func:`write_calibration_csv` format) -> ``(classes, attention, device)``.
    Raises ValueError on a malformed row (names the file and the row)."""
    classes, attn, device = {}, {}, "h200"
    for r in csv_rows(path):
        try:
            ef, eb, fl = float(r["eff_flops"]), float(r["eff_bytes"]), float(r["floor_us"])
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}: bad calibration row {r}: {e}") from None
        if ef <= 0 or eb <= 0 or fl < 0:
            raise ValueError(f"{path}: efficiencies must be > 0 and floor >= 0, got row {r}")
        mode = r.get("overhead_mode") or "max"
        if mode not in OVERHEAD_MODES:
            raise ValueError(f"{path}: overhead_mode={mode!r} not valid; allowed: {list(OVERHEAD_MODES)}")
        if r["kind"] == "attention":
            attn[r["op_class"]] = {"kernel": ef, "chunk_overhead_us": fl}.get(r["op_class"], eb)
        else:
            mape = float(r["mape_pct"]) if r.get("mape_pct") not in (None, "", "nan") else None
            classes[r["op_class"]] = ClassEff(ef, eb, fl, int(float(r.get("n") or 0)), mape, mode)
        device = r.get("device", device)
    return classes, attn, device


def _read_calibration(path: Path, routes: bool, kernel_roofline: bool) -> Calibration:
    own_classes, own_attn, device = _read_efficiencies(path)
    classes, (attn, _) = {**_DEFAULT_EFF, **own_classes}, attention_from_reference()
    attn.update(own_attn)
    name = f"{path.name} (measured on {device})"
    extra = load_file(_read_efficiencies, ROUTES_CALIBRATION_CSV, path.with_name(ROUTES_CALIBRATION_CSV)) \
        if routes else None
    if extra is not None:
        classes.update(extra[0])
        if kernel_roofline:  # the kernel's roofline replaces the FLOP-only efficiency (issue 21)
            attn["kernel_flop_only"] = attn["kernel"]
            attn.update(extra[1])
        name += f" + {ROUTES_CALIBRATION_CSV}" + (" (kernel roofline)" if kernel_roofline else " (route classes)")
    for key, value in (("chunk_overhead_us", load_subchunk_overhead()),
                       ("graph_chunk_overhead_us", load_subchunk_graph_overhead())):
        if value is not None:
            attn[key] = value
    return Calibration(classes, attn, name, "h200", content=load_content_model(), comm=load_comm_model(),
                       content_step=load_step_content_model())


_explicit = functools.partial(_read_calibration, routes=False, kernel_roofline=False)
_default = functools.partial(_read_calibration, routes=True, kernel_roofline=False)
_default_roofline = functools.partial(_read_calibration, routes=True, kernel_roofline=True)


def load_calibration(path: str | Path | None = None, kernel_roofline: bool = False) -> Calibration:
    """The calibration in ``path`` (default ``data/calibration/h200_ops.csv``, plus the dense routes' classes of
    ``h200_routes.csv`` beside it and, with ``kernel_roofline``, its sparse-kernel roofline in place of the FLOP-only
    kernel efficiency, kept as ``kernel_flop_only``; :func:`uncalibrated` when the default file is missing).
    Raises ValueError: an explicit ``path`` that does not exist; a malformed row (names the file and the row)."""
    reader = _explicit if path is not None else (_default_roofline if kernel_roofline else _default)
    cal = load_file(reader, OPS_CSV, path)
    if cal is None and path is not None:
        raise ValueError(f"calibration path={str(path)!r} does not exist")
    return cal if cal is not None else uncalibrated()


def _one_value(path: Path, col: str, what: str) -> float:
    try:
        return float(csv_rows(path)[0][col])
    except (IndexError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: not a {what} ({e})") from None


_read_subchunk = functools.partial(_one_value, col="chunk_overhead_us", what="sub-chunk overhead fit")
_read_subchunk_graph = functools.partial(_one_value, col="graph_chunk_overhead_us",
                                         what="graphed sub-chunk overhead fit")


def load_subchunk_overhead(path: str | Path | None = None) -> float | None:
    """The fitted fixed cost per extra eager sub-chunk (us) from ``h200_subchunk.csv``, or None.
    Raises ValueError: a malformed file (names it)."""
    return load_file(_read_subchunk, SUBCHUNK_CSV, path)


def load_subchunk_graph_overhead(path: str | Path | None = None) -> float | None:
    """The fitted cost per extra chunk (us) of ``subchunk:<S>:graph2`` against the PR's path, both graphed
    (``h200_subchunk_graph.csv``), or None. Raises ValueError: a malformed file (names it)."""
    return load_file(_read_subchunk_graph, SUBCHUNK_GRAPH_CSV, path)


def fit_subchunk_overhead(rows: list[dict]) -> tuple[float, float]:
    """Least-squares cost per extra chunk through 0 from rows ``{"extra_chunks": n - 1, "extra_ms": t(n) - t(1)}``.
    Returns ``(us, mean abs residual us)``. Raises ValueError: no row with extra chunks."""
    xs = [float(r["extra_chunks"]) for r in rows]
    ys = [float(r["extra_ms"]) for r in rows]
    den = sum(x * x for x in xs)
    if den == 0:
        raise ValueError("rows hold no sub-chunked run with more than one chunk")
    c = sum(x * y for x, y in zip(xs, ys)) / den
    resid = sum(abs(y - c * x) for x, y in zip(xs, ys)) / len(xs)
    return c * 1e3, resid * 1e3


#: The committed calibration (:func:`load_calibration` with no path).
default_calibration = load_calibration


def resolve_calibration(calibration) -> Calibration:
    """``None`` -> :func:`default_calibration`; a :class:`Calibration` as is. Raises ValueError: anything else."""
    if calibration is None:
        return default_calibration()
    if isinstance(calibration, Calibration):
        return calibration
    raise ValueError(f"calibration={calibration!r} must be a mla_lab.model.Calibration or None")


def _grid_fit(flops, nbytes, ms, peak_f, peak_b, with_floor=True):
    """Minimise mean |pred - meas| / meas over a grid of (eff_flops, eff_bytes, overhead, mode): returns
    ``(eff_flops, eff_bytes, overhead_us, mape_pct, mode)``."""
    import numpy as np

    F, B, M = (np.asarray(v, float)[:, None, None] for v in (flops, nbytes, ms))
    g = np.geomspace(0.01, 1.5, 91)
    floors = [0.0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50] if with_floor else [0.0]
    tmax = np.maximum(F / (peak_f * g[None, :, None]) * 1e3, B / (peak_b * g[None, None, :]) * 1e3)
    best = (np.inf, 0, 0, 0.0, "max")
    for mode in OVERHEAD_MODES if with_floor else ("max",):
        for fl in floors:
            pred = np.maximum(tmax, fl * 1e-3) if mode == "max" else tmax + fl * 1e-3
            err = np.mean(np.abs(pred - M) / M, axis=0)
            i = np.unravel_index(np.argmin(err), err.shape)
            if err[i] < best[0] - 1e-12:
                best = (float(err[i]), i[0], i[1], fl, mode)
    e, i0, i1, fl, mode = best
    return float(g[i0]), float(g[i1]), float(fl), e * 100, mode


def fit_calibration(rows: list[dict], arch: str | GPUArch = "h200", name: str = "fit") -> tuple[Calibration, list]:
    """Per-class efficiencies from measured op rows (``op_class``, ``flops``, ``bytes``, ``ms``; attention ops as
    ``attn_<op>``; rows without ``ms`` > 0 ignored), each minimising the MAPE over a grid; a class measured on one
    side of the ridge only gets the other efficiency from the grid's best tie. Returns ``(calibration, report)``,
    one report dict per class (:data:`CALIBRATION_COLUMNS`)."""
    arch = get_arch(arch)
    by: dict[str, list] = {}
    for r in rows:
        try:
            ms = float(r["ms"])
        except (KeyError, TypeError, ValueError):
            continue
        if not ms > 0:
            continue
        by.setdefault(r["op_class"], []).append((float(r.get("flops") or 0), float(r.get("bytes") or 0), ms,
                                                  r.get("dtype", "bf16")))
    classes = dict(_DEFAULT_EFF)
    attn, _ = attention_from_reference()
    report = []
    for cls, rs in sorted(by.items()):
        F, B, M = ([x[i] for x in rs] for i in range(3))
        fp8 = rs[0][3] == "fp8"
        peak_f = arch.bf16_tflops * 1e12 * (FP8_PEAK_FACTOR if fp8 else 1.0)
        peak_b = arch.hbm_gbps * 1e9
        if cls.startswith("attn_"):
            op = cls[5:]
            zero, kernel = [0.0] * len(F), op == "kernel"
            ef, eb, _, mape, _ = _grid_fit(F if kernel else zero, zero if kernel else B, M, peak_f, peak_b, False)
            ef, eb = (ef, 1.0) if kernel else (1.0, eb)
            attn[op] = ef if op == "kernel" else eb
            report.append({"kind": "attention", "op_class": op, "eff_flops": ef, "eff_bytes": eb, "floor_us": 0.0,
                           "overhead_mode": "max", "n": len(rs), "mape_pct": mape})
            continue
        if cls in COMM_CLASSES:
            continue
        ef, eb, fl, mape, mode = _grid_fit(F, B, M, peak_f, peak_b)
        classes[cls] = ClassEff(ef, eb, fl, len(rs), mape, mode)
        report.append({"kind": "class", "op_class": cls, "eff_flops": ef, "eff_bytes": eb, "floor_us": fl,
                       "overhead_mode": mode, "n": len(rs), "mape_pct": mape})
    cal = Calibration(classes, attn, name, arch.name)
    return cal, report

def write_calibration_csv(report: list[dict], path: str | Path, provenance_cols: dict,
                          columns=CALIBRATION_COLUMNS) -> None:
    """Write rows (the fit report: one per class / attention op) as ``columns``, then the provenance columns."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*columns, *provenance_cols])
        w.writeheader()
        w.writerows({**r, **provenance_cols} for r in report)
