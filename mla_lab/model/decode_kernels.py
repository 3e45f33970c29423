"""Sparse-MLA attention kernels at decode sizes, priced by their parallelism (issue 29), fitted on one H200.

``B`` decode tokens, each over ``n = min(context, topk)`` keys. ``flashmla_pad64`` (vLLM 0.33.0
``flashmla_sparse.py:753-754,1352-1393``): one CTA per token, no split. ``fa3_sparse``
(``flashattn_mla_sparse.py:215-259``): heads packed in one 64-row m-block, the key walk split over ``s`` CTAs
(:func:`fa3_num_splits`). Per family (us): ``waves = ceil(B s / sms)``, ``lat = waves us_per_key n / s``, ``kv = B n
1152 / (HBM eff_bytes)``, ``t = a_us + (lat^p + kv^p)^(1/p)``; fitted on the H200 rows of :data:`ROWS_CSV` (in
sample; leave-one-context-out MAPE beside).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..arch import GPUArch, get_arch
from ..paths import REPO_ROOT, calibration_dir
from ..placement import KINDS

FAMILIES = ("flashmla_pad64", "fa3_sparse")
DECODE_KERNELS_CSV = "h200_decode_kernels.csv"
#: The GPU the fitted rows ran on, and the rows.
FIT_GPU = "h200"
ROWS_CSV = f"data/measured/{FIT_GPU}/between_process/engine_kernels.csv"
ROW_BYTES = 576 * 2  # head_size 576, bf16 KV cache
#: FA3's key-block width for the MLA shape (hdim 64 + hdimv 512) used to count ``n_blocks`` in the heuristic.
FA3_BLOCK_N = 64
#: the measured kernel -> family (rows of engine_kernels.csv; ``num_splits`` 0 = FA3's heuristic, vLLM's call)
_ROW_FAMILY = {("flashmla_vllm_pad64", -1): "flashmla_pad64", ("fa3_sparse", 0): "fa3_sparse"}


def fa3_num_splits(total_mblocks: int, num_sms: int, n_blocks: int, max_splits: int = 128) -> int:
    """FA3's split-KV heuristic (Dao-AILab/flash-attention ``hopper/heuristics.h`` ``num_splits_heuristic``; vLLM
    passes ``num_splits = 0``): 1 when m-blocks >= 0.8 x SMs, else the fewest splits within 85 % of the best wave
    efficiency. Raises ValueError: a count < 1."""
    for name, v in (("total_mblocks", total_mblocks), ("num_sms", num_sms), ("n_blocks", n_blocks)):
        if int(v) < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    if total_mblocks >= 0.8 * num_sms:
        return 1
    waves = [total_mblocks * s / num_sms for s in range(1, min(max_splits, num_sms, n_blocks) + 1)]
    eff = [w / math.ceil(w) for w in waves]
    return next(s for s, e in enumerate(eff, start=1) if e >= 0.85 * max(eff))  # the best one qualifies


@dataclass(frozen=True)
class DecodeKernel:
    """One family's decode-kernel parameters (module docstring) and its MAPE (%) in sample and
    leave-one-context-out."""

    family: str
    a_us: float
    us_per_key: float
    eff_bytes: float
    p: float
    mape_pct: float = float("nan")
    loco_mape_pct: float = float("nan")

    def ms(self, B: int, keys: int, arch: GPUArch) -> float:
        """Kernel ms of ``B`` decode tokens of ``keys`` keys each. Raises ValueError: ``B`` < 1 or ``keys`` < 0."""
        if B < 1 or keys < 0:
            raise ValueError(f"B={B} must be >= 1 and keys={keys} >= 0")
        return _model(np.array([B]), np.array([keys]), self.a_us, self.us_per_key, self.eff_bytes, self.p,
                      self.family, arch)[0] * 1e-3


def _one(b: int, x: int, a, k, eff, p, family: str, arch: GPUArch):
    """The model for one (B, keys); ``a``, ``k``, ``eff`` may be arrays (the fit's grid)."""
    sms = arch.sm_count
    s = fa3_num_splits(b, sms, max(1, math.ceil(x / FA3_BLOCK_N))) if family == "fa3_sparse" else 1
    waves = math.ceil(b * s / sms)
    lat = waves * k * x / s
    kv = b * x * ROW_BYTES / (arch.hbm_gbps * 1e3 * eff)  # B / (GB/s * 1e3) = us
    return a + (lat ** p + kv ** p) ** (1.0 / p)


def _model(B, n, a, k, eff, p, family, arch) -> np.ndarray:
    return np.array([_one(int(b), int(x), a, k, eff, p, family, arch) for b, x in zip(B, n)], dtype=float)


def decode_family(placement: str) -> str:
    """The family a placement's decode rows are priced as (its :class:`~mla_lab.placement.StrategyKind` ``decode``)."""
    return KINDS[placement].decode


def _rows(path: Path) -> list[tuple[str, int, int, int, float]]:
    """``(family, B, keys, ctx, per-process-median ms -> median over processes)`` of the decode rows."""
    import pandas as pd

    d = pd.read_csv(path)
    d = d[(d["experiment"] == "engine_kernels") & (d["shape"] == "decode")].copy()
    if d.empty:
        raise ValueError(f"{path} has no decode rows of the engine_kernels experiment")
    d["num_splits"] = d["num_splits"].fillna(-1).astype(int)
    d["family"] = [_ROW_FAMILY.get((k, s)) for k, s in zip(d["kernel"], d["num_splits"])]
    d = d[d["family"].notna()]
    pm = d.groupby(["family", "T", "H", "ctx_len", "process"])["ms"].median().reset_index()
    med = pm.groupby(["family", "T", "H", "ctx_len"])["ms"].median().reset_index()
    return [(r.family, int(r.T), int(min(r.ctx_len, 2048)), int(r.ctx_len), float(r.ms)) for r in med.itertuples()]


def _fit(B, n, y_us, family, arch) -> tuple[float, float, float, float]:
    """Least log-error fit of (a, us_per_key, eff, p) by grid refinement (numpy only)."""
    best = (math.inf, None)
    for p in (1.0, 2.0, 3.0, 4.0, 6.0):
        a_g, k_g, e_g = np.linspace(0, 40, 41), np.geomspace(0.002, 0.1, 40), np.linspace(0.2, 1.2, 26)
        for _ in range(3):
            A, K, E = np.meshgrid(a_g, k_g, e_g, indexing="ij")
            err = np.zeros(A.shape)
            for b, x, y in zip(B, n, y_us):
                pred = _one(int(b), int(x), A, K, E, p, family, arch)
                err += np.log(pred / y) ** 2
            i = np.unravel_index(np.argmin(err), err.shape)
            if err[i] < best[0]:
                best = (float(err[i]), (float(A[i]), float(K[i]), float(E[i]), p))
            a0, k0, e0 = A[i], K[i], E[i]
            a_g = np.linspace(max(0, a0 - 2 * (a_g[1] - a_g[0])), a0 + 2 * (a_g[1] - a_g[0]), 21)
            k_g = np.geomspace(k0 / 1.3, k0 * 1.3, 21)
            e_g = np.linspace(max(0.05, e0 - 0.08), e0 + 0.08, 21)
    return best[1]


def _mape(B, n, y_us, params, family, arch) -> float:
    a, k, e, p = params
    pred = _model(np.array(B), np.array(n), a, k, e, p, family, arch)
    return float(np.mean(np.abs(pred - np.array(y_us)) / np.array(y_us)) * 100)


def fit_decode_kernels(rows_csv: str | Path = REPO_ROOT / ROWS_CSV, arch: GPUArch | None = None) -> dict:
    """``{family: DecodeKernel}`` fitted on the decode rows of ``rows_csv``. Raises ValueError: no decode rows."""
    arch, rows = arch or get_arch(FIT_GPU), _rows(Path(rows_csv))
    out = {}
    for fam in FAMILIES:
        B, n, ctx, y = (np.array(c) for c in zip(*[(b, x, c, ms * 1e3) for f, b, x, c, ms in rows if f == fam]))
        params = _fit(B, n, y, fam, arch)
        loco = [_mape(B[ctx == c], n[ctx == c], y[ctx == c], _fit(B[ctx != c], n[ctx != c], y[ctx != c], fam, arch),
                      fam, arch) for c in sorted(set(ctx))]
        out[fam] = DecodeKernel(fam, *params, mape_pct=_mape(B, n, y, params, fam, arch),
                                loco_mape_pct=float(np.mean(loco)))
    return out


def fit_decode_kernels_file(measured: Path) -> dict:
    """``{DECODE_KERNELS_CSV: rows}``: :func:`fit_decode_kernels` of ``measured``'s engine_kernels rows, rounded (the
    ``mla_lab.fits`` entry ``decode_kernels``). Raises ValueError: no decode rows."""
    fits = fit_decode_kernels(measured / FIT_GPU / "between_process" / "engine_kernels.csv")
    return {DECODE_KERNELS_CSV: [
        {"family": fam, "a_us": round(k.a_us, 4), "us_per_key": round(k.us_per_key, 6),
         "eff_bytes": round(k.eff_bytes, 4), "p": k.p, "mape_pct": round(k.mape_pct, 2),
         "loco_mape_pct": round(k.loco_mape_pct, 2), "source": "measured-fit (NVIDIA H200)", "data_file": ROWS_CSV}
        for fam, k in fits.items()]}


def load_decode_kernels(path: str | Path | None = None) -> dict:
    """``{family: DecodeKernel}`` from :data:`DECODE_KERNELS_CSV`. Raises FileNotFoundError; ValueError: a malformed
    row or missing family."""
    path = Path(path) if path else calibration_dir() / DECODE_KERNELS_CSV
    out = {}
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                out[r["family"]] = DecodeKernel(r["family"], float(r["a_us"]), float(r["us_per_key"]),
                                                float(r["eff_bytes"]), float(r["p"]), float(r["mape_pct"]),
                                                float(r["loco_mape_pct"]))
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{path}: row {i} is malformed ({type(e).__name__}: {e})") from e
    missing = set(FAMILIES) - set(out)
    if missing:
        raise ValueError(f"{path} lacks the families {sorted(missing)}")
    return out
