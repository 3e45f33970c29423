"""Is ~95 % of a contiguous copy the ceiling of a gapped write? The concat into the padded [T, 64, 576]
workspace against a contiguous copy of the same bytes and torch's strided copy of the same bytes into the same padded
layout, graph timing (:func:`mla_lab.measure.timer.median_ms` ``graph=True``, L2 flushed), rounds rotated. Rows:
``concat_ceiling.csv`` (us)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import torch

from mla_lab.kernels import concat_mla_q
from mla_lab.measure.timer import median_ms

from ._common import (
    PROVENANCE,  # noqa: F401 (re-exported: the provenance columns of its rows)
    Sink,
    log,
    part_main,
)

OUTPUTS = {"concat_ceiling.csv": ["T", "num_heads", "padded_heads", "method", "round", "us", "bytes", "timer"]}
#: (T, num_heads)
SHAPES = [(T, H) for T in (4096, 16384) for H in (8, 16)]



def part_concat_ceiling(sink: Sink, repeats: int) -> None:
    """Is ~95 % of a contiguous copy the ceiling of a gapped write? The concat into the padded [T, 64, 576]
    workspace against a contiguous copy of the same bytes and against torch's strided copy of the same bytes into
    the same padded layout (``out[:, :H].copy_(src)``), graph timing (one call captured, replayed under do_bench
    with L2 flushed: ``mla_lab.measure.timer.median_ms(graph=True)``), rounds rotated."""

    for T in (4096, 16384):
        for H in (8, 16):
            g = torch.Generator(device="cuda").manual_seed(T + H)
            ql = torch.randn(H, T, 512, device="cuda", dtype=torch.bfloat16, generator=g).transpose(0, 1)
            qpe = torch.randn(T, H, 192 + 64, device="cuda", dtype=torch.bfloat16, generator=g)[..., 192:]
            ws = torch.zeros(T, 64, 576, device="cuda", dtype=torch.bfloat16)
            src = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16, generator=g)
            dst = torch.empty_like(src)
            fns = {"concat_v2_padded": lambda: concat_mla_q(ql, qpe, ws[:T]),
                   "strided_copy_padded": lambda: ws[:T, :H].copy_(src),
                   "copy_contiguous": lambda: dst.copy_(src)}
            names = list(fns)
            for r in range(repeats):
                k = r % len(names)
                for n in names[k:] + names[:k]:
                    us = 1e3 * median_ms(fns[n], graph=True, rep=50)
                    sink.write("concat_ceiling.csv", {"T": T, "num_heads": H, "padded_heads": 64, "method": n,
                                                      "round": r, "us": round(us, 3),
                                                      "bytes": 2 * T * H * 576 * 2,
                                                      "timer": "graph (median_ms graph=True, L2 flushed)"})
            log(f"concat ceiling T={T} H={H} done")


def run(sink: Sink, a) -> None:
    """This experiment's part of one fresh process (``a``: the parsed arguments of :func:`~._common.part_main`)."""
    part_concat_ceiling(sink, 2 if a.smoke else 5)


def main(argv=None) -> int:
    return part_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
