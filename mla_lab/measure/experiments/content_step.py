"""Padded-head content over the whole step (issue 21): a 78-layer loop at the seed shape (q/kv projections, the
PR's attention path, W_UV bmm + o_proj, the rank's MoE share), padded heads zero (``private_workspace``) or stale
(``shared_workspace:none``), steps interleaved; per step the total and its parts (CUDA events per layer), SM clock
and power (NVML). Rows: ``content_loop.csv`` (ms, MHz, W; ``python -m mla_lab.fits content_step``)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from mla_lab.measure.attention import make_step_inputs, padded_path, sm_scale
from mla_lab.measure.sink import NvmlSampler, log
from mla_lab.measure.tp_blocks import make_block_inputs, make_moe_inputs, moe_forward

from ._common import PROMPT, seed_step

OUTPUTS = {"content_loop.csv": ["content", "round", "layers", "T", "num_heads", "step_ms", "proj_ms", "attn_path_ms",
                                "post_ms", "moe_ms", "sm_clock_mhz", "power_w", "nvml_samples"]}
#: (content, layers, T, num_heads)
SHAPES = [(c, 78, 16384, 8) for c in ("zeros", "stale")]



def _layer_loop(rank, layers: int):
    """``run_step(content) -> (total ms, {proj_ms, attn_path_ms, post_ms, moe_ms})``: ``layers`` layers of the
    rank, CUDA events per part."""
    m, T = rank.model, rank.max_num_batched_tokens
    sm = sm_scale(m)
    ql, qpe, kv, idx, tl = make_step_inputs(rank, seed_step(rank), PROMPT, seed=0)
    blk = make_block_inputs(rank, 0, T, seed=0, device="cuda")
    moe = make_moe_inputs(rank, 0, T, seed=0, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    hid = torch.randn(T, m.hidden_size, device="cuda", dtype=torch.bfloat16, generator=g)
    w_qa = torch.randn(m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, m.hidden_size, device="cuda",
                       dtype=torch.bfloat16, generator=g).div_(math.sqrt(m.hidden_size))  # fused q_a + kv_a
    w_qb = torch.randn(rank.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank, device="cuda",
                       dtype=torch.bfloat16, generator=g).div_(math.sqrt(m.q_lora_rank))
    paths = {c: padded_path(rank, s) for c, s in (("zeros", "private_workspace"), ("stale", "shared_workspace:none"))}

    def run_step(content):
        p = paths[content]
        evs = [[torch.cuda.Event(enable_timing=True) for _ in range(5)] for _ in range(layers)]
        for e0, e1, e2, e3, e4 in evs:
            e0.record()
            qkv = F.linear(hid, w_qa)  # fused q_a + kv_a (+ k_pe)
            F.linear(qkv[:, : m.q_lora_rank], w_qb)  # q_b
            e1.record()
            o, _ = p(ql, qpe, kv, idx, sm, tl)  # concat + kernel
            e2.record()
            x = torch.bmm(o.transpose(0, 1), blk["w_uv"]).transpose(0, 1).reshape(T, -1)  # W_UV
            F.linear(x, blk["w_o"])  # o_proj
            e3.record()
            moe_forward(moe, parts="compute", impl="grouped_mm")
            e4.record()
        evs[-1][4].synchronize()
        parts = {k: sum(ev[j].elapsed_time(ev[j + 1]) for ev in evs)
                 for j, k in enumerate(("proj_ms", "attn_path_ms", "post_ms", "moe_ms"))}
        return evs[0][0].elapsed_time(evs[-1][4]), parts

    return run_step


def run(rank, sink, options) -> None:
    """``rounds`` (6; 2 under smoke) interleaved rounds of the zeros and the stale step, the model's every layer
    (6 under smoke)."""
    layers = 6 if options.smoke else rank.model.num_hidden_layers
    rounds = 2 if options.smoke else options.param("rounds", 6)
    run_step = _layer_loop(rank, layers)
    run_step("zeros")
    run_step("stale")  # warm-up both
    with NvmlSampler() as nv:
        for r in range(rounds):
            for c in ("zeros", "stale") if r % 2 == 0 else ("stale", "zeros"):
                t0 = time.perf_counter()
                total, parts = run_step(c)
                w = nv.window(t0, time.perf_counter(), reasons=False)
                sink.write("content_loop.csv", {"content": c, "round": r, "layers": layers,
                                                "T": rank.max_num_batched_tokens, "num_heads": rank.num_heads,
                                                "step_ms": round(total, 4), **{k: round(v, 4) for k, v in parts.items()},
                                                "sm_clock_mhz": w["sm_clock_mhz"], "power_w": w["power_w"],
                                                "nvml_samples": len(nv.samples)})
                log(f"content r{r} {c}: step {total:.1f} ms, " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                    + f", SM {w['sm_clock_mhz']} MHz, {w['power_w']} W")
    torch.cuda.empty_cache()
