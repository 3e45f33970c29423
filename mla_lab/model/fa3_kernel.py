"""FA3 sparse (vLLM ``FLASH_ATTN_MLA_SPARSE``) prefill kernel time against the padded FlashMLA kernel, from the
engines' own kernels measured side by side (issue 29).

The lab first priced FA3 sparse as the padded FlashMLA kernel's per-key term with only the real heads' per-token
bytes (:mod:`mla_lab.model.routes` (d): an assumption "until a native-head kernel is measured"). That priced the
seed shape (16 x 1024-token prompts, 8 heads per rank) at 1.46 ms, against 2.21 ms measured for vLLM 0.33.0's FA3
on one H200: the padded heads' per-token bytes it removed are not what the kernel spends its time on; the per-token
top-k gather is (a gather-only kernel takes 1.61 ms of FlashMLA's 2.49 at that shape).

Now (measured-paired, H200): the FA3 kernel costs the padded FlashMLA kernel's modelled time (the committed
:class:`~mla_lab.model.routes.PaddedKernelFit`, zero padded heads) times ``r``, the ratio of vLLM 0.33.0's FA3 to
vLLM 0.33.0's bundled FlashMLA padded to 64 heads with zero padded heads, measured in the same processes
(``data/measured/h200/between_process/engine_kernels_content.csv``: 5 fresh processes x 7 interleaved rounds, graph
timing; median over processes of the per-process ratios):

============  ======================  ======================
H per rank    seed (512.5 keys/token)  full topk (2048 keys)
============  ======================  ======================
8             0.894 [0.893, 0.896]    0.926 [0.905, 0.944]
16            0.909 [0.909, 0.912]    0.941 [0.924, 0.957]
============  ======================  ======================

``r`` is interpolated linearly in the mean keys per token between the two shapes and in H between 8 and 16, and
held constant outside (a stated extrapolation: H > 16 and other key counts were not paired). Other GPUs keep the
roofline assumption. :func:`fit_fa3_ratio` recomputes the table from the rows.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..paths import REPO_ROOT

__all__ = ["Fa3Ratio", "fit_fa3_ratio", "load_fa3_ratio", "ROWS_CSV", "MEAN_KEYS"]

ROWS_CSV = "data/measured/h200/between_process/engine_kernels_content.csv"
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
        if H <= hs[0]:
            return self.table[(shape, hs[0])]["median"]
        if H >= hs[-1]:
            return self.table[(shape, hs[-1])]["median"]
        lo = max(h for h in hs if h <= H)
        hi = min(h for h in hs if h >= H)
        a, b = self.table[(shape, lo)]["median"], self.table[(shape, hi)]["median"]
        return a if hi == lo else a + (b - a) * (H - lo) / (hi - lo)

    def ratio(self, H: int, mean_keys: float) -> float:
        s, f = self._at_h("seed", H), self._at_h("full_topk", H)
        x0, x1 = MEAN_KEYS["seed"], MEAN_KEYS["full_topk"]
        t = min(1.0, max(0.0, (mean_keys - x0) / (x1 - x0)))
        return s + (f - s) * t


def fit_fa3_ratio(rows_csv: str | Path = REPO_ROOT / ROWS_CSV) -> Fa3Ratio:
    """The paired ratios from the rows (median and [min, max] over processes).

    Raises:
        ValueError: the file lacks the paired rows.
    """
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


def main() -> int:  # pragma: no cover - prints the table
    r = fit_fa3_ratio()
    for (s, h), v in sorted(r.table.items()):
        print(f"{s:9s} H={h:3d}: {v['median']:.3f} [{v['min']:.3f}, {v['max']:.3f}]")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
