"""The routed experts of one MoE layer at decode sizes (T = 1..256 tokens), GLM-5 EP8 rank share (32 local
experts, hidden 6144, moe_intermediate 2048, top-8 of 256, random routing), graph timing: bf16 ``torch._grouped_mm``
and fp8 e4m3 ``torch._scaled_grouped_mm`` (row-wise scales) where this torch has it (recorded: ``impl``). Rows:
``moe_decode.csv`` (ms; fitted by ``mla_lab.fits.moe_decode``)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mla_lab.models import load_model

from ._common import (
    PROVENANCE,  # noqa: F401 (re-exported: the provenance columns of its rows)
    Sink,
    log,
    part_main,
)

OUTPUTS = {"moe_decode.csv": ["model", "ep", "T", "pairs", "experts_hit", "local_experts", "impl", "ms",
                              "weight_bytes", "gbps", "rel_err_vs_bf16", "timing"]}
#: (model, ep, T decode tokens)
SHAPES = [("glm-5", 8, T) for T in (1, 8, 16, 32, 64, 128, 256)]



def part_moe_decode(sink: Sink, smoke: bool) -> None:
    from triton.testing import do_bench_cudagraph

    m = load_model("glm-5")
    ep = 8
    E, k, I, h = m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.hidden_size  # noqa: E741
    e_loc = E // ep
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(e_loc, 2 * I, h, device="cuda", dtype=torch.bfloat16, generator=g).div_(math.sqrt(h))
    w2 = torch.randn(e_loc, h, I, device="cuda", dtype=torch.bfloat16, generator=g).div_(math.sqrt(I))
    f8 = torch.float8_e4m3fn
    # fp8 weights with per-output-row scales (row-wise), column-major views as the grouped ops take them
    s13 = (w13.abs().amax(dim=2).float() / 448.0).clamp(min=1e-8)  # [e, 2I]
    s2 = (w2.abs().amax(dim=2).float() / 448.0).clamp(min=1e-8)  # [e, h]
    w13_8 = (w13.float() / s13[..., None]).to(f8)
    w2_8 = (w2.float() / s2[..., None]).to(f8)
    has_scaled = hasattr(torch, "_scaled_grouped_mm")
    for T in ((1, 32) if smoke else (1, 8, 16, 32, 64, 128, 256)):
        top = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(T)])
        local = top[(top < e_loc)]  # experts 0..e_loc-1 are this rank's
        counts = torch.bincount(local.flatten(), minlength=e_loc)
        P = int(counts.sum())
        pairs = max(P, 1)
        pad_counts = counts.clone()
        if P == 0:
            pad_counts[0] = 1
        offs = torch.cumsum(pad_counts, 0).to(torch.int32)
        xs = torch.randn(pairs, h, device="cuda", dtype=torch.bfloat16, generator=g)
        experts_hit = int((counts > 0).sum())

        def bf16():
            gu = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
            a = (F.silu(gu[:, :I]) * gu[:, I:]).contiguous()
            return torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)

        impls = {"bf16_grouped_mm": bf16}
        if has_scaled:
            def fp8():
                xa = xs.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 448.0
                x8 = (xs.float() / xa).to(f8)
                gu = torch._scaled_grouped_mm(x8, w13_8.transpose(1, 2), xa.view(-1), s13, offs=offs,
                                              out_dtype=torch.bfloat16)
                a = F.silu(gu[:, :I]) * gu[:, I:]
                aa = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 448.0
                a8 = (a.float() / aa).to(f8)
                return torch._scaled_grouped_mm(a8, w2_8.transpose(1, 2), aa.view(-1), s2, offs=offs,
                                                out_dtype=torch.bfloat16)

            impls["fp8_scaled_grouped_mm"] = fp8
        ref = bf16().float()
        for name, fn in impls.items():
            try:
                out = fn().float()
                torch.cuda.synchronize()
                rel = float((out - ref).norm() / ref.norm().clamp(min=1e-12))
                ms = float(do_bench_cudagraph(fn, rep=50 if smoke else 200, return_mode="median"))
                wbytes = experts_hit * 3 * I * h * (1 if "fp8" in name else 2)
                sink.write("moe_decode.csv", {"model": "glm-5", "ep": ep, "T": T, "pairs": P,
                                              "experts_hit": experts_hit, "local_experts": e_loc, "impl": name,
                                              "ms": round(ms, 5), "weight_bytes": wbytes,
                                              "gbps": round(wbytes / ms / 1e6, 1), "rel_err_vs_bf16": rel,
                                              "timing": "graph (do_bench_cudagraph median)"})
                log(f"moe decode T={T} {name}: {ms:.4f} ms ({wbytes / ms / 1e6:.0f} GB/s weights), rel {rel:.1e}")
            except Exception as e:  # noqa: BLE001 - the fp8 op's support varies by torch build; recorded
                sink.write("moe_decode.csv", {"model": "glm-5", "ep": ep, "T": T, "pairs": P,
                                              "experts_hit": experts_hit, "local_experts": e_loc, "impl": name,
                                              "ms": "", "weight_bytes": "", "gbps": "", "rel_err_vs_bf16": "",
                                              "timing": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"})
                log(f"moe decode T={T} {name} failed: {e}")
    torch.cuda.empty_cache()


def run(sink: Sink, a) -> None:
    """This experiment's part of one fresh process (``a``: the parsed arguments of :func:`~._common.part_main`)."""
    part_moe_decode(sink, a.smoke)


def main(argv=None) -> int:
    return part_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
