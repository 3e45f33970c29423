"""FA3 sparse (vLLM ``FLASH_ATTN_MLA_SPARSE``) prefill kernel time, fitted on the engine's own kernel (issue 29).

The lab first priced FA3 sparse as the padded FlashMLA kernel's per-key term with the real heads' per-token bytes
(:mod:`mla_lab.model.routes` (d): an assumption "until a native-head kernel is measured"). Measured on one H200 with
vLLM 0.33.0's FA3 (``data/measured/h200/between_process/engine_kernels.csv``, 5 fresh processes, graph timing), that
assumption priced the seed shape (16 x 1024-token prompts, 8 heads) at 1.46 ms against 2.21 ms measured (-34 %):
the padded heads' per-token bytes it removed are not what the kernel spends its time on; the per-token top-k gather
is (a gather-only kernel takes 1.60 ms of FlashMLA's 2.48 there).

The fit (measured-fit, H200 only)::

    t_ms = a_tok * T + b_key * sum_topk + c_head * T * H

on the between-process medians of the ``fa3_sparse`` rows (``num_splits`` 0: vLLM's call) at the seed and full-topk
shapes, H 8 / 16 / 32 / 64 (8 rows), by least squares on relative error (numpy). ``python -m
mla_lab.model.fa3_kernel --write`` -> ``data/calibration/h200_fa3_kernel.csv`` (with the in-sample MAPE and the
leave-one-shape-out MAPE). Other GPUs keep the roofline assumption.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..paths import REPO_ROOT, calibration_dir

__all__ = ["Fa3KernelFit", "fit_fa3_kernel", "load_fa3_kernel", "FA3_KERNEL_CSV"]

FA3_KERNEL_CSV = "h200_fa3_kernel.csv"
ROWS_CSV = "data/measured/h200/between_process/engine_kernels.csv"
#: sum of topk_length per shape of the rows (mla_lab.measure.engine_kernels._inputs): seed = 16 prompts of 1024
#: tokens, causal (sum_{p=1..1024} p per prompt); full_topk = 16384 tokens x 2048 keys
_SUM_TOPK = {"seed": 16 * 1024 * 1025 // 2, "full_topk": 16384 * 2048}
_FIELDS = ("a_tok_ns", "b_key_ps", "c_head_ns", "mape_pct", "loso_mape_pct", "source", "data_file")


@dataclass(frozen=True)
class Fa3KernelFit:
    """``t_ms = a_tok_ns * 1e-6 * T + b_key_ps * 1e-9 * sum_topk + c_head_ns * 1e-6 * T * H`` (module docstring)."""

    a_tok_ns: float
    b_key_ps: float
    c_head_ns: float
    mape_pct: float = float("nan")
    loso_mape_pct: float = float("nan")

    def ms(self, T: int, H: int, sum_topk: int) -> float:
        return self.a_tok_ns * 1e-6 * T + self.b_key_ps * 1e-9 * sum_topk + self.c_head_ns * 1e-6 * T * H


def _points(path: Path) -> list[tuple[int, int, int, float]]:
    import pandas as pd

    d = pd.read_csv(path)
    d = d[(d["experiment"] == "engine_kernels") & (d["kernel"] == "fa3_sparse") & (d["shape"].isin(list(_SUM_TOPK)))]
    d = d[d["num_splits"].fillna(0).astype(int) == 0]
    if d.empty:
        raise ValueError(f"{path} has no fa3_sparse prefill rows")
    pm = d.groupby(["shape", "T", "H", "process"])["ms"].median().reset_index()
    med = pm.groupby(["shape", "T", "H"])["ms"].median().reset_index()
    return [(r.shape, int(r.T), int(r.H), float(r.ms)) for r in med.itertuples()]


def _lsq(pts) -> np.ndarray:
    X = np.array([[T, _SUM_TOPK[s], T * H] for s, T, H, _ in pts], dtype=float)
    y = np.array([ms for *_, ms in pts])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    return coef


def _mape(coef, pts) -> float:
    X = np.array([[T, _SUM_TOPK[s], T * H] for s, T, H, _ in pts], dtype=float)
    y = np.array([ms for *_, ms in pts])
    return float(np.mean(np.abs(X @ coef - y) / y) * 100)


def fit_fa3_kernel(rows_csv: str | Path = REPO_ROOT / ROWS_CSV) -> Fa3KernelFit:
    """Fit on the committed rows; leave-one-shape-out MAPE beside the in-sample one.

    Raises:
        ValueError: no fa3_sparse prefill rows in the file.
    """
    pts = _points(Path(rows_csv))
    coef = _lsq(pts)
    loso = [_mape(_lsq([p for p in pts if p[0] != s]), [p for p in pts if p[0] == s]) for s in _SUM_TOPK]
    return Fa3KernelFit(coef[0] * 1e6, coef[1] * 1e9, coef[2] * 1e6, _mape(coef, pts), float(np.mean(loso)))


@lru_cache(maxsize=2)
def load_fa3_kernel(path: str | None = None) -> Fa3KernelFit | None:
    """The committed fit, or None when the file is absent (the roofline assumption is used then).

    Raises:
        ValueError: a malformed file (names it).
    """
    p = Path(path) if path else calibration_dir() / FA3_KERNEL_CSV
    if not p.exists():
        return None
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        r = rows[0]
        return Fa3KernelFit(float(r["a_tok_ns"]), float(r["b_key_ps"]), float(r["c_head_ns"]), float(r["mape_pct"]),
                            float(r["loso_mape_pct"]))
    except (IndexError, KeyError, ValueError) as e:
        raise ValueError(f"{p}: row 2 is malformed ({type(e).__name__}: {e})") from e


def main(argv=None) -> int:
    """``python -m mla_lab.model.fa3_kernel [--write [--overwrite]]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mla_lab.model.fa3_kernel")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    f = fit_fa3_kernel()
    print(f"fa3_sparse kernel: {f.a_tok_ns:.2f} ns/token + {f.b_key_ps:.2f} ps/key + {f.c_head_ns:.4f} ns/(token x "
          f"head); MAPE {f.mape_pct:.1f} % in sample, {f.loso_mape_pct:.1f} % leave-one-shape-out")
    if a.write:
        p = calibration_dir() / FA3_KERNEL_CSV
        if p.exists() and not a.overwrite:
            ap.error(f"{p} exists: pass --overwrite to replace it")
        with open(p, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=_FIELDS)
            w.writeheader()
            w.writerow({"a_tok_ns": round(f.a_tok_ns, 4), "b_key_ps": round(f.b_key_ps, 4),
                        "c_head_ns": round(f.c_head_ns, 5), "mape_pct": round(f.mape_pct, 2),
                        "loso_mape_pct": round(f.loso_mape_pct, 2), "source": "measured-fit (NVIDIA H200)",
                        "data_file": ROWS_CSV})
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
