"""Named strategies (parameter ``strategies``; default :data:`mla_lab.placement.TIMED_STRATEGIES`) at the seed and
full-topk shapes (:func:`._common.attention_rows`). Rows: ``strategies.csv`` (ms)."""

from __future__ import annotations

from mla_lab.placement import TIMED_STRATEGIES

from ._common import attention_rows

OUTPUTS = {"strategies.csv": ["shape", "strategy", "round", "ms", "median_ms", "workspace_bytes", "peak_bytes",
                              "repeats"]}
#: (shape, T, strategy) at the seed
SHAPES = [(s, 16384, n) for s in ("seed", "full") for n in TIMED_STRATEGIES]


def run(rank, sink, options) -> None:
    attention_rows(rank, sink, "strategies.csv", options.param("strategies", tuple(TIMED_STRATEGIES)), options.reps)
