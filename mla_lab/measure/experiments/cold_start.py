"""The first calls in a fresh process (issue 20): call 1, 2, 3 of the seed attention path (vLLM PR #53878's
private workspace and the pre-PR ``new_empty`` pad), of one layer's attention block and of its MoE block (GLM-5 TP-8
rank share), host wall and CUDA-event time, against the steady-state median of 20 calls; and every steady call's
time (the within-process spread of a step). Rows: ``cold_start.csv``, ``step_spread.csv`` (ms)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import statistics

import torch

from mla_lab.measure.attention import make_step_inputs
from mla_lab.measure.tp import block_forward, make_block_inputs, make_moe_inputs, moe_forward
from mla_lab.models import load_model
from mla_lab.strategies import PaddedQPath

from ._common import (
    PROMPT,
    PROVENANCE,  # noqa: F401 (re-exported: the provenance columns of its rows)
    SEED_T,
    Sink,
    log,
    part_main,
    seed_step,
    sm_scale_of,
    wall_and_gpu,
)

OUTPUTS = {"cold_start.csv": ["what", "call", "wall_ms", "gpu_ms", "steady_wall_ms", "steady_gpu_ms", "steady_n",
                              "T", "num_heads"],
           "step_spread.csv": ["what", "sample", "wall_ms", "gpu_ms"]}
#: (what, T, num_heads): the four callables timed at the seed shape, GLM-5 TP 8.
SHAPES = [(w, SEED_T, 8) for w in ("attention_path:private_workspace", "attention_path:per_call_empty:zeros",
                                   "attention_block:private_workspace", "moe_block:grouped_mm")]



def part_cold(sink: Sink, smoke: bool) -> None:
    m = load_model("glm-5")
    H = m.heads_per_rank(8)
    step = seed_step()
    sm = sm_scale_of(m)
    inp = make_step_inputs(m, 8, step, PROMPT, seed=0)
    ql, qpe, kv, idx, tl = inp
    blk = make_block_inputs(m, 8, 0, SEED_T, seed=0, device="cuda")
    moe = make_moe_inputs(m, 8, 0, SEED_T, seed=0, device="cuda")
    cases = []
    for name in ("private_workspace", "per_call_empty:zeros"):
        p = PaddedQPath(name, num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
        cases.append((f"attention_path:{name}", lambda p=p: p(ql, qpe, kv, idx, sm, tl)))
    pb = PaddedQPath("private_workspace", num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
    cases.append(("attention_block:private_workspace", lambda: block_forward(pb, blk, sm, parts="compute")))
    cases.append(("moe_block:grouped_mm", lambda: moe_forward(moe, parts="compute", impl="grouped_mm")))
    steady_n = 5 if smoke else 20
    for what, fn in cases:
        firsts = [wall_and_gpu(fn) for _ in range(3)]
        steady = [wall_and_gpu(fn) for _ in range(steady_n)]
        med_w = statistics.median(w for w, _ in steady)
        med_g = statistics.median(g for _, g in steady)
        for i, (w, g) in enumerate(firsts, 1):
            sink.write("cold_start.csv", {"what": what, "call": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4),
                                          "steady_wall_ms": round(med_w, 4), "steady_gpu_ms": round(med_g, 4),
                                          "steady_n": steady_n, "T": SEED_T, "num_heads": H})
        log(f"cold {what}: call1 wall {firsts[0][0]:.1f} gpu {firsts[0][1]:.2f} | call2 gpu {firsts[1][1]:.2f} "
            f"| steady gpu {med_g:.3f} ms")
        # step-time spread within the process: every steady sample
        for i, (w, g) in enumerate(steady):
            sink.write("step_spread.csv", {"what": what, "sample": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4)})
    torch.cuda.empty_cache()


def run(sink: Sink, a) -> None:
    """This experiment's part of one fresh process (``a``: the parsed arguments of :func:`~._common.part_main`)."""
    part_cold(sink, a.smoke)


def main(argv=None) -> int:
    return part_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
