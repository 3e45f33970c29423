"""Padded-head content over the whole step (issue 21): a sustained 78-layer loop at the seed shape, each layer
= the attention block (PR path: concat, FlashMLA, W_UV bmm, o_proj) + q/kv projections + the MoE block (TP-8 / EP-8
rank share, grouped GEMMs), with the padded heads zero (``private_workspace``) or stale (N(0,1):
``shared_workspace:none``), steps interleaved; per step: total, attention-kernel sum and the rest (CUDA events per
layer), SM clock and power sampled by NVML during the step. Rows: ``content_loop.csv`` (ms, MHz, W; fitted by
``mla_lab.fits.content_step``)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import math
import statistics
import threading
import time

import torch
import torch.nn.functional as F

from mla_lab.measure.attention import make_step_inputs
from mla_lab.measure.tp import make_block_inputs, make_moe_inputs, moe_forward
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
)

OUTPUTS = {"content_loop.csv": ["content", "round", "layers", "T", "num_heads", "step_ms", "proj_ms", "attn_path_ms",
                                "post_ms", "moe_ms", "sm_clock_mhz", "power_w", "nvml_samples"]}
#: (content, layers, T, num_heads)
SHAPES = [(c, 78, SEED_T, 8) for c in ("zeros", "stale")]



class NvmlSampler:
    """SM clock (MHz) and power (W) sampled every ``period_s`` in a thread, with host timestamps."""

    def __init__(self, period_s=0.02):
        self.samples, self.period, self.stop = [], period_s, threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML: no clock columns
            self.nv = None

    def run(self):
        while not self.stop.is_set():
            try:
                clk = self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM)
                pw = self.nv.nvmlDeviceGetPowerUsage(self.h) / 1e3
                self.samples.append((time.perf_counter(), clk, pw))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(self.period)

    def __enter__(self):
        if self.nv:
            self.t = threading.Thread(target=self.run, daemon=True)
            self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        if self.nv:
            self.t.join()

    def window(self, t0, t1):
        xs = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        if not xs:
            return None, None
        return statistics.median(c for c, _ in xs), statistics.median(p for _, p in xs)


def part_content(sink: Sink, rounds: int, smoke: bool) -> None:
    m = load_model("glm-5")
    tp = 8
    H = m.heads_per_rank(tp)
    sm = sm_scale_of(m)
    layers = 6 if smoke else 78
    step = seed_step()
    ql, qpe, kv, idx, tl = make_step_inputs(m, tp, step, PROMPT, seed=0)
    blk = make_block_inputs(m, tp, 0, SEED_T, seed=0, device="cuda")
    blk.update({"ql_nope": ql, "q_pe": qpe, "kv": kv, "indices": idx, "topk_length": tl})
    moe = make_moe_inputs(m, tp, 0, SEED_T, seed=0, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    hid = torch.randn(SEED_T, m.hidden_size, device="cuda", dtype=torch.bfloat16, generator=g)
    w_qa = torch.randn(m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, m.hidden_size, device="cuda",
                       dtype=torch.bfloat16, generator=g).div_(math.sqrt(m.hidden_size))  # fused q_a + kv_a
    w_qb = torch.randn(H * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank, device="cuda",
                       dtype=torch.bfloat16, generator=g).div_(math.sqrt(m.q_lora_rank))
    paths = {c: PaddedQPath(s, num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
             for c, s in (("zeros", "private_workspace"), ("stale", "shared_workspace:none"))}

    def run_step(content):
        p = paths[content]
        evs = [[torch.cuda.Event(enable_timing=True) for _ in range(5)] for _ in range(layers)]
        for i in range(layers):
            e0, e1, e2, e3, e4 = evs[i]
            e0.record()
            qkv = F.linear(hid, w_qa)  # fused q_a + kv_a (+ k_pe)
            F.linear(qkv[:, : m.q_lora_rank], w_qb)  # q_b
            e1.record()
            o, _ = p(blk["ql_nope"], blk["q_pe"], blk["kv"], blk["indices"], sm, blk["topk_length"])  # concat+kernel
            e2.record()
            x = torch.bmm(o.transpose(0, 1), blk["w_uv"]).transpose(0, 1).reshape(SEED_T, -1)  # W_UV
            F.linear(x, blk["w_o"])  # o_proj
            e3.record()
            moe_forward(moe, parts="compute", impl="grouped_mm")
            e4.record()
        e4.synchronize()
        parts = {k: sum(evs[i][j].elapsed_time(evs[i][j + 1]) for i in range(layers))
                 for j, k in enumerate(("proj_ms", "attn_path_ms", "post_ms", "moe_ms"))}
        total = evs[0][0].elapsed_time(evs[-1][4])
        return total, parts

    run_step("zeros")
    run_step("stale")  # warm-up both
    with NvmlSampler() as nv:
        for r in range(rounds):
            order = ("zeros", "stale") if r % 2 == 0 else ("stale", "zeros")
            for c in order:
                t0 = time.perf_counter()
                total, parts = run_step(c)
                t1 = time.perf_counter()
                clk, pw = nv.window(t0, t1)
                sink.write("content_loop.csv", {"content": c, "round": r, "layers": layers, "T": SEED_T,
                                                "num_heads": H, "step_ms": round(total, 4),
                                                **{k: round(v, 4) for k, v in parts.items()},
                                                "sm_clock_mhz": clk, "power_w": pw,
                                                "nvml_samples": len(nv.samples)})
                log(f"content r{r} {c}: step {total:.1f} ms, " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                    + f", SM {clk} MHz, {pw} W")
    torch.cuda.empty_cache()


def run(sink: Sink, a) -> None:
    """This experiment's part of one fresh process (``a``: the parsed arguments of :func:`~._common.part_main`)."""
    part_content(sink, 2 if a.smoke else a.content_rounds, a.smoke)


def main(argv=None) -> int:
    return part_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
