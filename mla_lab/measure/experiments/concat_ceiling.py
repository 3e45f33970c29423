"""Is ~95 % of a contiguous copy the ceiling of a gapped write? The concat into the rank's padded [T, H', 576]
workspace against a contiguous copy of the same bytes and torch's strided copy of the same bytes into the same padded
layout (``ws[:, :H].copy_(src)``), graph timing (:func:`mla_lab.measure.timer.median_ms` ``graph=True``, L2
flushed), rounds rotated. Rows: ``concat_ceiling.csv`` (us); H = the rank's heads and twice as many."""

from __future__ import annotations

import torch

from mla_lab.kernels import concat_mla_q
from mla_lab.measure.sink import log
from mla_lab.measure.timer import median_ms

OUTPUTS = {"concat_ceiling.csv": ["T", "num_heads", "padded_heads", "method", "round", "us", "bytes", "timer"]}
#: (T, num_heads) on the seed rank (GLM-5 TP 8: 8 heads, padded to 64)
SHAPES = [(T, H) for T in (4096, 16384) for H in (8, 16)]


def _methods(T, H, Hp) -> dict:
    g = torch.Generator(device="cuda").manual_seed(T + H)
    ql = torch.randn(H, T, 512, device="cuda", dtype=torch.bfloat16, generator=g).transpose(0, 1)
    qpe = torch.randn(T, H, 192 + 64, device="cuda", dtype=torch.bfloat16, generator=g)[..., 192:]
    ws = torch.zeros(T, Hp, 576, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    dst = torch.empty_like(src)
    return {"concat_v2_padded": lambda: concat_mla_q(ql, qpe, ws), "strided_copy_padded": lambda: ws[:, :H].copy_(src),
            "copy_contiguous": lambda: dst.copy_(src)}


def run(rank, sink, options) -> None:
    """Parameter ``rounds`` (5; 2 under smoke)."""
    T_max, Hp = rank.max_num_batched_tokens, rank.padded_num_heads
    rounds = 2 if options.smoke else options.param("rounds", 5)
    for T in sorted({T_max // 4, T_max}):
        for H in [h for h in (rank.num_heads, 2 * rank.num_heads) if h <= Hp]:
            fns = _methods(T, H, Hp)
            names = list(fns)
            for r in range(rounds):
                for n in names[r % 3:] + names[:r % 3]:
                    sink.write("concat_ceiling.csv", {"T": T, "num_heads": H, "padded_heads": Hp, "method": n,
                                                      "round": r, "us": round(1e3 * median_ms(fns[n], graph=True,
                                                                                              rep=50), 3),
                                                      "bytes": 2 * T * H * 576 * 2,
                                                      "timer": "graph (median_ms graph=True, L2 flushed)"})
            log(f"concat ceiling T={T} H={H} done")
