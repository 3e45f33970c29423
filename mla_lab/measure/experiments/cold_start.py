"""The first calls in a fresh process (issue 20): calls 1-3 of the rank's attention path (PR #53878's private
workspace, the pre-PR ``new_empty`` pad), of one layer's attention block and of its MoE block, host wall and
CUDA-event time, against the steady median of 20 calls; every steady call's time (the within-process spread of a
step). Rows: ``cold_start.csv``, ``step_spread.csv`` (ms)."""

from __future__ import annotations

import torch

from mla_lab.measure.attention import make_step_inputs, padded_path, sm_scale
from mla_lab.measure.sink import log
from mla_lab.measure.tp_blocks import block_forward, make_block_inputs, make_moe_inputs, moe_forward

from ._common import PROMPT, first_calls, seed_step

OUTPUTS = {"cold_start.csv": ["what", "call", "wall_ms", "gpu_ms", "steady_wall_ms", "steady_gpu_ms", "steady_n",
                              "T", "num_heads"],
           "step_spread.csv": ["what", "sample", "wall_ms", "gpu_ms"]}
#: the four calls timed at the seed step (T 16384, 8 heads: GLM-5 TP 8)
SHAPES = [(w, 16384, 8) for w in ("attention_path:private_workspace", "attention_path:per_call_empty:zeros",
                                  "attention_block:private_workspace", "moe_block:grouped_mm")]


def _cases(rank) -> list:
    """(what, call) of the four timed calls at the rank's step."""
    T, sm = rank.max_num_batched_tokens, sm_scale(rank.model)
    ql, qpe, kv, idx, tl = make_step_inputs(rank, seed_step(rank), PROMPT, seed=0)
    blk = make_block_inputs(rank, 0, T, seed=0, device="cuda")
    moe = make_moe_inputs(rank, 0, T, seed=0, device="cuda")
    path = {n: padded_path(rank, n) for n in ("private_workspace", "per_call_empty:zeros")}
    block = padded_path(rank, "private_workspace")
    return [*((f"attention_path:{n}", lambda p=p: p(ql, qpe, kv, idx, sm, tl)) for n, p in path.items()),
            ("attention_block:private_workspace", lambda: block_forward(block, blk, sm, parts="compute")),
            ("moe_block:grouped_mm", lambda: moe_forward(moe, parts="compute", impl="grouped_mm"))]


def run(rank, sink, options) -> None:
    steady_n = 5 if options.smoke else 20
    for what, fn in _cases(rank):
        firsts, steady, med_w, med_g = first_calls(fn, steady_n)
        for i, (w, g) in enumerate(firsts, 1):
            sink.write("cold_start.csv", {"what": what, "call": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4),
                                          "steady_wall_ms": round(med_w, 4), "steady_gpu_ms": round(med_g, 4),
                                          "steady_n": steady_n, "T": rank.max_num_batched_tokens,
                                          "num_heads": rank.num_heads})
        for i, (w, g) in enumerate(steady):
            sink.write("step_spread.csv", {"what": what, "sample": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4)})
        log(f"cold {what}: call1 wall {firsts[0][0]:.1f} gpu {firsts[0][1]:.2f} | call2 gpu {firsts[1][1]:.2f} "
            f"| steady gpu {med_g:.3f} ms")
    torch.cuda.empty_cache()
