"""What the padded heads hold, as a factor on the sparse kernel's time (modelled from H200 measurements).

FlashMLA's sparse prefill kernel computes every padded head; its *time* depends on their values: on an H200 at its
power limit the SM clock drops when the padded heads hold non-zero data (1920 -> 1770 MHz at the seed shape) and
the kernel runs 9-15 % slower than with zeros, the real heads' output unchanged. The lab models the ratio
``t_stale / t_zeros`` as

    factor = 1 + a * max(0, f - b) * (1 - exp(-t_zeros / c))

with ``f = (H' - H) / H'`` the padded fraction of the heads and ``t_zeros`` the kernel's zero-content time (ms):
more padded heads, more extra switching power; a short kernel ends before the clock settles at the power limit.
``a``, ``b``, ``c`` are fitted (:func:`fit_content_factor`) to the medians of interleaved zeros/stale runs
(``benchmarks/bench_engines.py``), with leave-one-shape-out error; the fit lives in
``data/calibration/h200_content.csv`` (:class:`ContentModel`). It is an H200 (sm90) measurement: on sm100 the
factor is unmeasured and rows say so.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from ..paths import calibration_dir

__all__ = ["ContentModel", "content_factor", "fit_content_factor", "load_content_model", "write_content_model",
           "CONTENT_CSV"]

CONTENT_CSV = "h200_content.csv"


@dataclass(frozen=True)
class ContentModel:
    """Fitted parameters of the content factor and how well they fit.

    Attributes:
        a, b, c_ms: the formula's parameters (module docstring).
        n: shapes fitted; mape_pct: in-sample MAPE of the stale kernel time; loso_mape_pct: leave-one-shape-out.
        name: where the fit came from (file, GPU).
    """

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
    """The formula of the module docstring (1.0 when nothing is padded)."""
    if padded_heads <= num_heads or t_zeros_ms <= 0:
        return 1.0
    f = (padded_heads - num_heads) / padded_heads
    return 1.0 + a * max(0.0, f - b) * (1.0 - math.exp(-t_zeros_ms / c_ms))


def _predict(rows, a, b, c):
    return [r["zeros_ms"] * content_factor(r["num_heads"], r["padded_heads"], r["zeros_ms"], a, b, c) for r in rows]


def _mape(rows, pred) -> float:
    return 100.0 * sum(abs(p - r["stale_ms"]) / r["stale_ms"] for p, r in zip(pred, rows)) / len(rows)


def _grid(rows):
    import numpy as np

    best = (math.inf, 0.0, 0.0, 1.0)
    for a in np.linspace(0.0, 0.6, 61):
        for b in np.linspace(0.0, 0.8, 33):
            for c in (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
                err = _mape(rows, _predict(rows, a, b, c))
                if err < best[0] - 1e-12:
                    best = (err, float(a), float(b), float(c))
    return best


def fit_content_factor(rows: list[dict], name: str = "fit") -> tuple[ContentModel, list[dict]]:
    """Fit ``a, b, c`` to per-shape medians.

    Args:
        rows: one dict per shape with ``shape`` (an id), ``num_heads``, ``padded_heads``, ``zeros_ms`` and
            ``stale_ms`` (medians of interleaved repeats, ms).

    Returns:
        ``(model, per_shape)``: per_shape rows with the in-sample and leave-one-shape-out predictions and errors.

    Raises:
        ValueError: fewer than 3 shapes, or a non-positive time.
    """
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


def write_content_model(model: ContentModel, path: str | Path, provenance_cols: dict) -> None:
    """One-row CSV of the fit with provenance columns."""
    cols = ["a", "b", "c_ms", "n", "mape_pct", "loso_mape_pct"] + list(provenance_cols)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerow({"a": model.a, "b": model.b, "c_ms": model.c_ms, "n": model.n, "mape_pct": model.mape_pct,
                    "loso_mape_pct": model.loso_mape_pct, **provenance_cols})


def load_content_model(path: str | Path | None = None) -> ContentModel | None:
    """The committed fit (``data/calibration/h200_content.csv``), or None when it does not exist.

    Raises:
        ValueError: a malformed file (names it).
    """
    p = Path(path) if path else calibration_dir() / CONTENT_CSV
    if not p.is_file():
        return None
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        r = rows[0]
        return ContentModel(float(r["a"]), float(r["b"]), float(r["c_ms"]), int(float(r["n"])),
                            float(r["mape_pct"]), float(r["loso_mape_pct"]),
                            f"{p.name} (measured on {r.get('device', '?')})")
    except (IndexError, KeyError, ValueError) as e:
        raise ValueError(f"{p}: not a content-factor fit ({e})") from None
