"""What the padded heads hold: a factor on the sparse kernel's time, or over the whole step (modelled from H200
measurements; docs/ttft-model.md, "Content").

Scopes (:data:`CONTENT_SCOPES`): ``step`` (default, :class:`StepContentModel`) and ``kernel`` (:class:`ContentModel`,
the kernel alone). An H200 (sm90) measurement: elsewhere rows say it is unmeasured.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from ..paths import calibration_dir

CONTENT_CSV = "h200_content.csv"


@dataclass(frozen=True)
class ContentModel:
    """``a, b, c_ms`` of :func:`content_factor`, fitted on ``n`` shapes (MAPE in sample and leave-one-shape-out)."""

    a: float
    b: float
    c_ms: float
    n: int = 0
    mape_pct: float | None = None
    loso_mape_pct: float | None = None
    name: str = "uncalibrated"

    def factor(self, num_heads: int, padded_heads: int, t_zeros_ms: float) -> float:
        """``t_stale / t_zeros`` for ``num_heads`` real of ``padded_heads`` heads and a kernel of ``t_zeros_ms``."""
        return content_factor(num_heads, padded_heads, t_zeros_ms, self.a, self.b, self.c_ms)


def content_factor(num_heads: int, padded_heads: int, t_zeros_ms: float, a: float, b: float, c_ms: float) -> float:
    """``t_stale / t_zeros = 1 + a max(0, f - b) (1 - exp(-t_zeros / c))``, ``f = (H' - H) / H'`` (1.0 unpadded)."""
    if padded_heads <= num_heads or t_zeros_ms <= 0:
        return 1.0
    f = (padded_heads - num_heads) / padded_heads
    return 1.0 + a * max(0.0, f - b) * (1.0 - math.exp(-t_zeros_ms / c_ms))


def _predict(rows, a, b, c):
    return [r["zeros_ms"] * content_factor(r["num_heads"], r["padded_heads"], r["zeros_ms"], a, b, c) for r in rows]


def _mape(rows, pred) -> float:
    return 100.0 * sum(abs(p - r["stale_ms"]) / r["stale_ms"] for p, r in zip(pred, rows)) / len(rows)


def _grid(rows):
    """``(mape, a, b, c)`` of the grid's best point: the first in (a, b, c) order within 1e-12 of the least. Each
    point's MAPE is :func:`_mape` of :func:`_predict` evaluated for all points at once in the same operation order
    (one exp per row and c, rows summed in order), so the values are the scalar loop's to the bit."""
    import numpy as np

    cs = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
    a, b, c = (g.ravel() for g in np.meshgrid(np.linspace(0.0, 0.6, 61), np.linspace(0.0, 0.8, 33), np.arange(10),
                                              indexing="ij"))
    total = 0
    for r in rows:
        H, Hp, t = r["num_heads"], r["padded_heads"], r["zeros_ms"]
        if Hp <= H or t <= 0:
            pred = np.full(a.shape, t * 1.0)
        else:
            decay = np.array([1.0 - math.exp(-t / cc) for cc in cs])[c]
            pred = t * (1.0 + a * np.maximum(0.0, (Hp - H) / Hp - b) * decay)
        total = total + np.abs(pred - r["stale_ms"]) / r["stale_ms"]
    best = (math.inf, 0.0, 0.0, 1.0)
    for i, err in enumerate((100.0 * total / len(rows)).tolist()):
        if err < best[0] - 1e-12:
            best = (err, float(a[i]), float(b[i]), cs[c[i]])
    return best


def fit_content_factor(rows: list[dict], name: str = "fit") -> tuple[ContentModel, list[dict]]:
    """``(model, per_shape)``: ``a, b, c`` by grid search on per-shape medians ``{shape, num_heads, padded_heads,
    zeros_ms, stale_ms}``. Raises ValueError: fewer than 3 shapes, or a non-positive time."""
    if len(rows) < 3:
        raise ValueError(f"rows holds {len(rows)} shape(s); the fit needs at least 3")
    for r in rows:
        if not (r["zeros_ms"] > 0 and r["stale_ms"] > 0):
            raise ValueError(f"shape {r.get('shape')!r}: zeros_ms and stale_ms must be > 0")
    err, a, b, c = _grid(rows)
    per, loso = [], []
    for i, r in enumerate(rows):
        rest = rows[:i] + rows[i + 1:]
        _, a_i, b_i, c_i = _grid(rest)
        p_in = _predict([r], a, b, c)[0]
        p_out = _predict([r], a_i, b_i, c_i)[0]
        loso.append(abs(p_out - r["stale_ms"]) / r["stale_ms"] * 100)
        per.append({**r, "ratio_measured": r["stale_ms"] / r["zeros_ms"], "ratio_fit": p_in / r["zeros_ms"],
                    "stale_ms_fit": p_in, "ape_pct": abs(p_in - r["stale_ms"]) / r["stale_ms"] * 100,
                    "stale_ms_loso": p_out, "ape_loso_pct": loso[-1]})
    model = ContentModel(a, b, c, len(rows), err, sum(loso) / len(loso), name)
    return model, per


def _read_row(path, default: str, kind: str, build):
    """``build(row, name)`` of a one-row fit file, None without it. Raises ValueError: malformed (names it)."""
    p = Path(path) if path else calibration_dir() / default
    if not p.is_file():
        return None
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        return build(rows[0], f"{p.name} (measured on {rows[0].get('device', '?')})")
    except (IndexError, KeyError, ValueError) as e:
        raise ValueError(f"{p}: not a {kind} ({e})") from None


def load_content_model(path: str | Path | None = None) -> ContentModel | None:
    """The committed fit (``data/calibration/h200_content.csv``) or None. Raises ValueError: malformed."""
    return _read_row(path, CONTENT_CSV, "content-factor fit", lambda r, name: ContentModel(
        float(r["a"]), float(r["b"]), float(r["c_ms"]), int(float(r["n"])), float(r["mape_pct"]),
        float(r["loso_mape_pct"]), name))


STEP_CONTENT_CSV = "h200_content_step.csv"
#: The step-level fit's per-process table (in-sample and leave-one-process-out predictions), beside the fit.
STEP_CONTENT_PER_PROCESS_CSV = "h200_content_step_per_process.csv"
#: Values of ``Calibration.content_scope`` (``step``: the default when its fit exists).
CONTENT_SCOPES = ("step", "kernel")


@dataclass(frozen=True)
class StepContentModel:
    """Stale padded heads over the whole step (a power-limited H200 slows everything; docs/ttft-model.md, "Content";
    ``data/measured/h200/between_process/content_loop.csv``). With ``s`` the attention path's share of the step and
    ``f = (H' - H) / H'``: rest factor ``1 + u s f / f_fit``, attention factor ``1 + (u s + v) f / f_fit``.
    ``u`` = :attr:`uniform_per_share`, ``v`` = :attr:`attention_excess`, ``f_fit`` = :attr:`padded_fraction`."""

    uniform_per_share: float
    attention_excess: float
    fit_share: float
    padded_fraction: float
    n_processes: int = 0
    mape_step_pct: float | None = None
    lopo_mape_step_pct: float | None = None
    name: str = "uncalibrated"

    def factors(self, share: float, num_heads: int, padded_heads: int) -> tuple[float, float]:
        """``(attention factor, rest factor)`` (``(1.0, 1.0)`` unpadded). Raises ValueError: ``share`` not in [0, 1]."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share={share!r} must lie in [0, 1] (the attention path's share of the step)")
        if padded_heads <= num_heads:
            return 1.0, 1.0
        scale = (padded_heads - num_heads) / padded_heads / self.padded_fraction
        return (1.0 + (self.uniform_per_share * share + self.attention_excess) * scale,
                1.0 + self.uniform_per_share * share * scale)

    def step_change(self, share: float, num_heads: int, padded_heads: int) -> float:
        """Modelled ``t_stale / t_zeros - 1`` of the whole step (fraction)."""
        a, r = self.factors(share, num_heads, padded_heads)
        return share * (a - 1.0) + (1.0 - share) * (r - 1.0)


def _step_params(rows) -> tuple[float, float, float]:
    """``(u, v, median s)``: ``u + v`` = median of ``step change / s``, ``u`` = median of ``rest change / s``."""
    s = [r["attn_zeros_ms"] / r["step_zeros_ms"] for r in rows]
    step = [r["step_stale_ms"] / r["step_zeros_ms"] - 1 for r in rows]
    rest = [(r["step_stale_ms"] - r["attn_stale_ms"]) / (r["step_zeros_ms"] - r["attn_zeros_ms"]) - 1 for r in rows]
    slope = median([x / si for x, si in zip(step, s)])
    u = median([x / si for x, si in zip(rest, s)])
    return u, slope - u, median(s)


def fit_step_content(rows: list[dict], num_heads: int, padded_heads: int,
                     name: str = "fit") -> tuple[StepContentModel, list[dict]]:
    """``(model, per_process)``: ``u``, ``v`` fitted to per-process medians (ms) ``step_zeros_ms``,
    ``step_stale_ms``, ``attn_zeros_ms``, ``attn_stale_ms``, with in-sample and leave-one-process-out errors.
    Raises ValueError: fewer than 3 processes, a non-positive time, an attention path not shorter than the step."""
    if len(rows) < 3:
        raise ValueError(f"rows holds {len(rows)} process(es); the fit needs at least 3")
    for r in rows:
        ts = [r[k] for k in ("step_zeros_ms", "step_stale_ms", "attn_zeros_ms", "attn_stale_ms")]
        if min(ts) <= 0 or r["attn_zeros_ms"] >= r["step_zeros_ms"] or r["attn_stale_ms"] >= r["step_stale_ms"]:
            raise ValueError(f"process {r.get('process')!r}: times must be > 0 and the attention path shorter than "
                             f"the step; got {ts}")
    if padded_heads <= num_heads:
        raise ValueError(f"padded_heads={padded_heads} must exceed num_heads={num_heads}")
    u, v, s = _step_params(rows)
    per = []
    for i, r in enumerate(rows):
        u_i, v_i, _ = _step_params(rows[:i] + rows[i + 1:])
        meas = {"step_change_pct": 100 * (r["step_stale_ms"] / r["step_zeros_ms"] - 1),
                "attn_change_pct": 100 * (r["attn_stale_ms"] / r["attn_zeros_ms"] - 1),
                "rest_change_pct": 100 * ((r["step_stale_ms"] - r["attn_stale_ms"])
                                          / (r["step_zeros_ms"] - r["attn_zeros_ms"]) - 1)}
        row = {**r, **meas, "share": r["attn_zeros_ms"] / r["step_zeros_ms"]}
        for tag, (uu, vv) in (("fit", (u, v)), ("lopo", (u_i, v_i))):
            sh = row["share"]
            row[f"{tag}_step_stale_ms"] = r["step_zeros_ms"] * (1 + (uu + vv) * sh)
            for k, p in (("step", 100 * (uu + vv) * sh), ("attn", 100 * (uu * sh + vv)), ("rest", 100 * uu * sh)):
                row[f"{tag}_{k}_change_pct"] = p
                row[f"{tag}_{k}_err_pts"] = p - meas[f"{k}_change_pct"]
        row["ape_pct"] = 100 * abs(row["fit_step_stale_ms"] / r["step_stale_ms"] - 1)
        row["lopo_ape_pct"] = 100 * abs(row["lopo_step_stale_ms"] / r["step_stale_ms"] - 1)
        per.append(row)
    model = StepContentModel(u, v, s, (padded_heads - num_heads) / padded_heads, len(rows),
                             sum(r["ape_pct"] for r in per) / len(per),
                             sum(r["lopo_ape_pct"] for r in per) / len(per), name)
    return model, per


def load_step_content_model(path: str | Path | None = None) -> StepContentModel | None:
    """The committed step-level fit (``data/calibration/h200_content_step.csv``) or None. Raises ValueError:
    malformed."""
    return _read_row(path, STEP_CONTENT_CSV, "step-level content fit", lambda r, name: StepContentModel(
        float(r["uniform_per_share"]), float(r["attention_excess"]), float(r["fit_share"]),
        float(r["padded_fraction"]), int(float(r["n_processes"])), float(r["mape_step_pct"]),
        float(r["lopo_mape_step_pct"]), name))
