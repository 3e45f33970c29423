"""Named strategies (parameter ``strategies``, canonical names; default :data:`mla_lab.placement.TIMED_STRATEGIES`)
through :func:`mla_lab.measure.attention.time_attention_path` at the rank's seed and full-topk steps (rows as
``presets``). Rows: ``strategies.csv`` (ms)."""

from __future__ import annotations

from mla_lab.measure.attention import time_attention_path
from mla_lab.measure.sink import log
from mla_lab.placement import TIMED_STRATEGIES

from ._common import PROMPT, full_step, seed_step

OUTPUTS = {"strategies.csv": ["shape", "strategy", "round", "ms", "median_ms", "workspace_bytes", "peak_bytes",
                              "repeats"]}
#: (shape, T, strategy) at the seed
SHAPES = [(s, 16384, n) for s in ("seed", "full") for n in TIMED_STRATEGIES]


def run(rank, sink, options) -> None:
    names = options.param("strategies", tuple(TIMED_STRATEGIES))
    T = rank.max_num_batched_tokens
    for shape, step, plen, full in (("seed", seed_step(rank), PROMPT, False), ("full", full_step(rank), 2 * T, True)):
        res = time_attention_path(rank, step, plen, strategies=names, full_topk=full, repeats=options.reps)
        for name in names:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write("strategies.csv", {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                              "median_ms": round(r["total"], 5),
                                              "workspace_bytes": r["workspace_bytes"], "peak_bytes": r["peak_bytes"],
                                              "repeats": options.reps})
        log(f"strategies {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in names))
