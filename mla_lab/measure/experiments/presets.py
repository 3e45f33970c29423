"""The attention path of every real engine preset and the lab's sub-chunk strategies on the rank, at the seed and
full-topk shapes (:func:`._common.attention_rows`). Rows: ``presets.csv`` (one per round, ms)."""

from __future__ import annotations

from ._common import attention_rows

PRESET_STRATEGIES = ("per_call_empty:zeros", "per_call_empty:stale", "per_call_zeros", "private_workspace",
                     "shared_workspace:none", "shared_workspace:zero_per_call", "subchunk:2048:views",
                     "subchunk:4096:views", "subchunk:8192:views", "subchunk:4096")
OUTPUTS = {"presets.csv": ["shape", "strategy", "round", "ms", "median_ms", "workspace_bytes", "peak_bytes", "repeats",
                           "kernel_backend", "concat_backend"]}
#: (shape, strategy) on the seed rank (T 16384)
SHAPES = [(s, n) for s in ("seed", "full") for n in PRESET_STRATEGIES]


def run(rank, sink, options) -> None:
    attention_rows(rank, sink, "presets.csv", PRESET_STRATEGIES, options.reps, backends=True)
