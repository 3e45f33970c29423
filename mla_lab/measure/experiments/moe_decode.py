"""The routed experts of one MoE layer at decode sizes (T = 1..256 tokens), the rank's expert share (GLM-5 EP 8:
32 local experts, hidden 6144, moe_intermediate 2048, top-8 of 256, random routing), graph timing: bf16
``torch._grouped_mm`` and fp8 e4m3 ``torch._scaled_grouped_mm`` (row-wise scales) where this torch has it
(recorded: ``impl``). Rows: ``moe_decode.csv`` (ms; fitted by ``python -m mla_lab.fits moe_decode``)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mla_lab.measure.sink import log

OUTPUTS = {"moe_decode.csv": ["model", "ep", "T", "pairs", "experts_hit", "local_experts", "impl", "ms",
                              "weight_bytes", "gbps", "rel_err_vs_bf16", "timing"]}
#: (model, ep, T decode tokens)
SHAPES = [("glm-5", 8, T) for T in (1, 8, 16, 32, 64, 128, 256)]
F8 = torch.float8_e4m3fn


class _Weights:
    """The rank's local experts' gate-up / down weights, bf16 and fp8 with per-output-row scales."""

    def __init__(self, rank, g):
        m = rank.model
        self.e_loc, self.inter, h = rank.experts_per_rank, m.moe_intermediate_size, m.hidden_size
        self.w13 = torch.randn(self.e_loc, 2 * self.inter, h, device="cuda", dtype=torch.bfloat16,
                               generator=g).div_(math.sqrt(h))
        self.w2 = torch.randn(self.e_loc, h, self.inter, device="cuda", dtype=torch.bfloat16,
                              generator=g).div_(math.sqrt(self.inter))
        self.s13 = (self.w13.abs().amax(dim=2).float() / 448.0).clamp(min=1e-8)  # [e, 2I]
        self.s2 = (self.w2.abs().amax(dim=2).float() / 448.0).clamp(min=1e-8)  # [e, h]
        self.w13_8 = (self.w13.float() / self.s13[..., None]).to(F8)
        self.w2_8 = (self.w2.float() / self.s2[..., None]).to(F8)

    def calls(self, xs, offs) -> dict:
        I = self.inter  # noqa: E741

        def bf16():
            gu = torch._grouped_mm(xs, self.w13.transpose(1, 2), offs=offs)
            return torch._grouped_mm((F.silu(gu[:, :I]) * gu[:, I:]).contiguous(), self.w2.transpose(1, 2), offs=offs)

        def fp8():
            xa = xs.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 448.0
            gu = torch._scaled_grouped_mm((xs.float() / xa).to(F8), self.w13_8.transpose(1, 2), xa.view(-1), self.s13,
                                          offs=offs, out_dtype=torch.bfloat16)
            a = F.silu(gu[:, :I]) * gu[:, I:]
            aa = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 448.0
            return torch._scaled_grouped_mm((a.float() / aa).to(F8), self.w2_8.transpose(1, 2), aa.view(-1), self.s2,
                                            offs=offs, out_dtype=torch.bfloat16)

        return {"bf16_grouped_mm": bf16, **({"fp8_scaled_grouped_mm": fp8} if hasattr(torch, "_scaled_grouped_mm")
                                            else {})}


def _routing(rank, T, g):
    """Random top-k routing of T tokens: (tokens x experts pairs on this rank, experts hit, the grouped-GEMM offsets,
    the activations [pairs, hidden])."""
    m, e_loc = rank.model, rank.experts_per_rank
    top = torch.stack([torch.randperm(m.n_routed_experts, device="cuda", generator=g)[:m.num_experts_per_tok]
                       for _ in range(T)])
    counts = torch.bincount(top[top < e_loc].flatten(), minlength=e_loc)  # experts 0..e_loc-1 are this rank's
    P = int(counts.sum())
    pad = counts.clone()
    pad[0] += P == 0
    xs = torch.randn(max(P, 1), m.hidden_size, device="cuda", dtype=torch.bfloat16, generator=g)
    return P, int((counts > 0).sum()), torch.cumsum(pad, 0).to(torch.int32), xs


def run(rank, sink, options) -> None:
    """Decode sizes 1..256 (1, 32 under smoke); needs ``moe_parallel="ep"`` (the seed's)."""
    from triton.testing import do_bench_cudagraph

    g = torch.Generator(device="cuda").manual_seed(0)
    w = _Weights(rank, g)
    h, ep = rank.model.hidden_size, rank.ep_size
    for T in (1, 32) if options.smoke else (1, 8, 16, 32, 64, 128, 256):
        P, hit, offs, xs = _routing(rank, T, g)
        calls = w.calls(xs, offs)
        ref = calls["bf16_grouped_mm"]().float()
        base = {"model": rank.model.name, "ep": ep, "T": T, "pairs": P, "experts_hit": hit, "local_experts": w.e_loc}
        for name, fn in calls.items():
            try:
                rel = float((fn().float() - ref).norm() / ref.norm().clamp(min=1e-12))
                ms = float(do_bench_cudagraph(fn, rep=50 if options.smoke else 200, return_mode="median"))
                wbytes = hit * 3 * w.inter * h * (1 if "fp8" in name else 2)
                sink.write("moe_decode.csv", {**base, "impl": name, "ms": round(ms, 5), "weight_bytes": wbytes,
                                              "gbps": round(wbytes / ms / 1e6, 1), "rel_err_vs_bf16": rel,
                                              "timing": "graph (do_bench_cudagraph median)"})
                log(f"moe decode T={T} {name}: {ms:.4f} ms ({wbytes / ms / 1e6:.0f} GB/s weights), rel {rel:.1e}")
            except Exception as e:  # noqa: BLE001 - the fp8 op's support varies by torch build; recorded
                sink.write("moe_decode.csv", {**base, "impl": name, "timing": f"failed: {type(e).__name__}: "
                                                                              f"{str(e).splitlines()[0][:150]}"})
                log(f"moe decode T={T} {name} failed: {e}")
    torch.cuda.empty_cache()
