"""The attention path of every real engine preset and the lab's sub-chunk strategies on the rank, interleaved rounds
(:func:`mla_lab.measure.attention.time_attention_path`), at its step of 1024-token causal prompts (``seed``) and at
full topk (one prompt of the step's tokens, random topk keys over twice as many: ``full``). Rows: ``presets.csv``
(one per round, ms)."""

from __future__ import annotations

import torch

from mla_lab.measure.attention import time_attention_path
from mla_lab.measure.sink import log

from ._common import PROMPT, full_step, seed_step

PRESET_STRATEGIES = ("per_call_empty:zeros", "per_call_empty:stale", "per_call_zeros", "private_workspace",
                     "shared_workspace:none", "shared_workspace:zero_per_call", "subchunk:2048:views",
                     "subchunk:4096:views", "subchunk:8192:views", "subchunk:4096")
OUTPUTS = {"presets.csv": ["shape", "strategy", "round", "ms", "median_ms", "workspace_bytes", "peak_bytes", "repeats",
                           "kernel_backend", "concat_backend"]}
#: (shape, strategy) on the seed rank (T 16384)
SHAPES = [(s, n) for s in ("seed", "full") for n in PRESET_STRATEGIES]


def run(rank, sink, options) -> None:
    for shape, step, plen, full in (("seed", seed_step(rank), PROMPT, False),
                                    ("full", full_step(rank), 2 * rank.max_num_batched_tokens, True)):
        res = time_attention_path(rank, step, plen, strategies=PRESET_STRATEGIES, full_topk=full, seed=0,
                                  repeats=options.reps)
        for name in PRESET_STRATEGIES:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write("presets.csv", {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                           "median_ms": round(r["total"], 5), "workspace_bytes": r["workspace_bytes"],
                                           "peak_bytes": r["peak_bytes"], "repeats": options.reps,
                                           "kernel_backend": res["kernel_backend"],
                                           "concat_backend": res["concat_backend"]})
        log(f"presets {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in PRESET_STRATEGIES))
        torch.cuda.empty_cache()
