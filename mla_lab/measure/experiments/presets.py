"""The attention path of every real engine preset and the lab's sub-chunk strategies at the seed shape (16 x
1024-token causal prompts in one 16384-token step) and at full topk (16384 tokens, random topk 2048 over s_kv 32768),
GLM-5 TP 8, ``--repeats`` interleaved rounds (:func:`mla_lab.measure.attention.time_attention_path`). Rows:
``presets.csv`` (one per sample, ms)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import torch

from mla_lab.measure.attention import time_attention_path
from mla_lab.models import load_model

from ._common import (
    PROMPT,
    PROVENANCE,  # noqa: F401 (re-exported: the provenance columns of its rows)
    SEED_T,
    Sink,
    full_step,
    log,
    part_main,
    seed_step,
)

PRESET_STRATEGIES = ("per_call_empty:zeros", "per_call_empty:stale", "per_call_zeros", "private_workspace",
                     "shared_workspace:none", "shared_workspace:zero_per_call", "subchunk:2048:views",
                     "subchunk:4096:views", "subchunk:8192:views", "subchunk:4096")
OUTPUTS = {"presets.csv": ["shape", "strategy", "round", "ms", "median_ms", "workspace_bytes", "peak_bytes", "repeats",
                           "kernel_backend", "concat_backend"]}
#: (shape, T, strategy)
SHAPES = [(s, SEED_T, n) for s in ("seed", "full") for n in PRESET_STRATEGIES]



def part_presets(sink: Sink, repeats: int) -> None:
    m = load_model("glm-5")
    for shape, step, plen, full in (("seed", seed_step(), PROMPT, False), ("full", full_step(), 2 * SEED_T, True)):
        res = time_attention_path(m, 8, step, plen, "h200", strategies=PRESET_STRATEGIES, full_topk=full,
                                  seed=0, device="cuda", repeats=repeats)
        for name in PRESET_STRATEGIES:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write("presets.csv", {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                           "median_ms": round(r["total"], 5), "workspace_bytes": r["workspace_bytes"],
                                           "peak_bytes": r["peak_bytes"], "repeats": repeats,
                                           "kernel_backend": res["kernel_backend"],
                                           "concat_backend": res["concat_backend"]})
        log(f"presets {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in PRESET_STRATEGIES))
        torch.cuda.empty_cache()


def run(sink: Sink, a) -> None:
    """This experiment's part of one fresh process (``a``: the parsed arguments of :func:`~._common.part_main`)."""
    part_presets(sink, a.reps)


def main(argv=None) -> int:
    return part_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
