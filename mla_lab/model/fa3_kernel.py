"""FA3 sparse (vLLM ``FLASH_ATTN_MLA_SPARSE``) prefill kernel time against the padded FlashMLA kernel, from the
engines' own kernels measured side by side on one H200 (issue 29; docs/routes.md).

FA3 = the padded kernel's modelled time x ``r``, the median over processes of vLLM 0.33.0's FA3 / its FlashMLA at
64 zero heads, paired (:data:`ROWS_CSV`), interpolated in mean keys per token and H, held constant outside.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..paths import REPO_ROOT

#: The GPU the paired rows ran on (the only GPU the ratio prices: :func:`mla_lab.model.timing`).
GPU = "h200"
ROWS_CSV = f"data/measured/{GPU}/between_process/engine_kernels_content.csv"
#: mean topk_length per token of the two measured shapes (mla_lab.kernels.engine_libs.engine_inputs): seed = causal
#: 1024-token prompts ((1 + 1024) / 2), full_topk = 2048
MEAN_KEYS = {"seed": 512.5, "full_topk": 2048.0}


class Fa3Ratio:
    """``r(H, mean_keys)``: FA3 / padded FlashMLA (zeros), bilinear between the measured points, clamped."""

    def __init__(self, table: dict):
        self.table = table  # {(shape, H): {"median", "min", "max"}}
        self.heads = sorted({h for _, h in table})

    def _at_h(self, shape: str, H: int) -> float:
        hs = self.heads
        H = min(max(H, hs[0]), hs[-1])  # held constant outside the measured heads
        lo, hi = max(h for h in hs if h <= H), min(h for h in hs if h >= H)
        a, b = self.table[(shape, lo)]["median"], self.table[(shape, hi)]["median"]
        return a if hi == lo else a + (b - a) * (H - lo) / (hi - lo)

    def ratio(self, H: int, mean_keys: float) -> float:
        s, f = self._at_h("seed", H), self._at_h("full_topk", H)
        x0, x1 = MEAN_KEYS["seed"], MEAN_KEYS["full_topk"]
        t = min(1.0, max(0.0, (mean_keys - x0) / (x1 - x0)))
        return s + (f - s) * t


def fit_fa3_ratio(rows_csv: str | Path = REPO_ROOT / ROWS_CSV) -> Fa3Ratio:
    """The paired ratios (median, min, max over processes). Raises ValueError: no paired rows."""
    import pandas as pd

    d = pd.read_csv(rows_csv)
    d = d[(d["experiment"] == "engine_kernels") & (d["kernel"].isin(["fa3_sparse", "flashmla_vllm_pad64_zeros"]))]
    if d.empty:
        raise ValueError(f"{rows_csv} has no fa3_sparse / flashmla_vllm_pad64_zeros rows")
    pm = d.groupby(["shape", "H", "kernel", "process"])["ms"].median().unstack("kernel")
    r = (pm["fa3_sparse"] / pm["flashmla_vllm_pad64_zeros"]).groupby(["shape", "H"]).agg(["median", "min", "max"])
    return Fa3Ratio({(s, int(h)): dict(row) for (s, h), row in r.iterrows()})


@lru_cache(maxsize=1)
def load_fa3_ratio() -> Fa3Ratio | None:
    """:func:`fit_fa3_ratio` of the committed rows (cached), or None when they are absent."""
    p = REPO_ROOT / ROWS_CSV
    return fit_fa3_ratio(p) if p.exists() else None

