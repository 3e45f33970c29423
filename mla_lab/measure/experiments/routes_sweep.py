"""Time the attention routes of issue 25 on one GPU, beside the lab's model of them (one process per call).

Per model (GLM-5, DeepSeek-V3.2 at ``--tp``) and prompt length L (default 512 1024 2048 4096 8192), a full step of
``--tokens`` tokens (``tokens // L`` fresh prompts of L):

- ``mha_attn``: dense causal MHA with the real heads (``H``, qk ``qk_nope+qk_rope``, v ``v_head_dim``) through torch
  SDPA, backend ``flash`` and ``cudnn`` (``[B, H, L, d]``, ``is_causal=True``: varlen with equal lengths). A backend
  that refuses unequal qk / v head dims gets V zero-padded to qk's width (``v_padded=1`` in the row, the output's
  extra columns dropped); a backend that refuses the shape is recorded ``status=unsupported`` with the error.
- ``kv_b_proj``: ``[T, 512] @ [512, H*(d_nope + d_v)]`` bf16 (``torch.matmul``) and fp8 (``torch._scaled_mm``,
  per-tensor scales) when available; ``k_concat``: ``torch.cat((k_nope, k_pe.expand(-1, H, -1)), -1)``.
- ``sparse_kernel``: FlashMLA's padded path (``flash_mla_sparse_fwd``, Q padded with zeros to 64/128 heads, causal
  top-k indices with ``topk_length``, :func:`mla_lab.measure.attention.make_step_inputs`).

Each row carries the modelled ms of the same op (:mod:`mla_lab.model.routes`) and the provenance columns.
``--dry-run`` (CPU) writes only the modelled rows (``source=modelled``). Run it in >= 5 fresh processes.

Usage: ``python -m mla_lab.measure.experiments.routes_sweep --out data/measured/h200/routes/routes_p1.csv [--dry-run]``
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from mla_lab.arch import get_arch
from mla_lab.deployment import DEFAULT_MAX_NUM_SEQS, Deployment, RankView
from mla_lab.kernels import sparse_mla_prefill
from mla_lab.measure.attention import make_step_inputs
from mla_lab.measure.timer import median_ms
from mla_lab.model.route_timing import route_op_time_ms
from mla_lab.model.routes import (
    default_padded_kernel_fit,
    mha_attention_op,
    padded_kernel_terms,
    prompt_len_step,
    route_stats,
    up_projection_ops,
)
from mla_lab.provenance import provenance

COLS = ["model", "tp", "H", "prompt_len", "T", "op", "impl", "v_padded", "status", "error", "ms", "modelled_ms",
        "flops", "bytes"]


def _ranks(model_name: str, tp: int, tokens: int, arch) -> dict[str, RankView]:
    """The rank one point runs, by weight dtype (``bf16`` / ``fp8``: the ``kv_b_proj`` GEMM is timed at both), built
    once per (model, tp) at the :meth:`~mla_lab.deployment.Deployment.rank_of` door: bf16 KV cache (FlashMLA's padded
    heads), experts ``ep`` (not read by these ops), ``max_num_batched_tokens`` = ``tokens``."""
    return {wd: Deployment.rank_of(model=model_name, tp=tp, arch=arch, kv_cache_dtype="bf16", weight_dtype=wd,
                                   moe_parallel="ep", max_num_batched_tokens=tokens,
                                   max_num_seqs=min(tokens, DEFAULT_MAX_NUM_SEQS))
            for wd in ("bf16", "fp8")}


def _rows_for(ranks: dict[str, RankView], L: int, dry: bool) -> list[dict]:
    rank = ranks["bf16"]
    m, tp, H, Hp, arch = rank.model, rank.tp, rank.num_heads, rank.padded_num_heads, rank.arch
    step = prompt_len_step(L, rank.max_num_batched_tokens)
    rs = route_stats(m, step)
    mha = mha_attention_op(rank, rs)
    proj_bf16, cat = up_projection_ops(rank, rs)
    proj_fp8, _ = up_projection_ops(ranks["fp8"], rs)
    kt = padded_kernel_terms(rs.T, Hp, rs.K_s)
    base = {"model": m.name, "tp": tp, "H": H, "prompt_len": L, "T": rs.T, "v_padded": 0, "status": "ok",
            "error": ""}
    plan = [("mha_attn", "sdpa_flash", mha), ("mha_attn", "sdpa_cudnn", mha), ("kv_b_proj", "matmul_bf16", proj_bf16),
            ("kv_b_proj", "scaled_mm_fp8", proj_fp8), ("k_concat", "torch.cat", cat)]
    rows = [{**base, "op": op, "impl": impl, "flops": o.flops, "bytes": o.bytes,
             "modelled_ms": route_op_time_ms(o, arch, tp=tp), "ms": ""} for op, impl, o in plan]
    rows.append({**base, "op": "sparse_kernel", "impl": f"flash_mla_sparse_fwd h_q={Hp}", "flops": kt["flops"],
                 "bytes": kt["tok_bytes"], "modelled_ms": default_padded_kernel_fit().time_ms(rs.T, Hp, rs.K_s),
                 "ms": ""})
    if not dry:
        _measure(m, tp, H, Hp, L, step, rows)
    return rows


def _measure(m, tp, H, Hp, L, step, rows) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel


    dev = "cuda"
    dqk, dv, dn, dr = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim, m.qk_nope_head_dim, m.qk_rope_head_dim
    T = step.num_tokens
    B = len(step.chunks)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(B, H, L, dqk, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H, L, dqk, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H, L, dv, device=dev, dtype=torch.bfloat16, generator=g)
    scale = 1.0 / math.sqrt(dqk)
    for row, backend in zip(rows[:2], (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION)):
        for pad in (False, True):
            vv = F.pad(v, (0, dqk - dv)) if pad and dqk > dv else v
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, k, vv, is_causal=True, scale=scale)
                    torch.cuda.synchronize()
                    row["ms"] = median_ms(lambda vv=vv: F.scaled_dot_product_attention(q, k, vv, is_causal=True,
                                                                                       scale=scale))
                row["v_padded"] = int(vv is not v)
                row["status"], row["error"] = "ok", ""
                break
            except RuntimeError as e:
                row["status"], row["error"] = "unsupported", str(e).splitlines()[0][:200]
                if not (dqk > dv) or pad:
                    break
    latent = torch.randn(T, m.kv_lora_rank, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(m.kv_lora_rank, H * (dn + dv), device=dev, dtype=torch.bfloat16, generator=g)
    rows[2]["ms"] = median_ms(lambda: latent @ w)
    try:
        a8 = latent.to(torch.float8_e4m3fn)
        w8 = w.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        rows[3]["ms"] = median_ms(lambda: torch._scaled_mm(a8, w8, one, one, out_dtype=torch.bfloat16))
    except (RuntimeError, AttributeError) as e:
        rows[3]["status"], rows[3]["error"] = "unsupported", str(e).splitlines()[0][:200]
    k_nope = (latent @ w).view(T, H, dn + dv)[..., :dn]
    k_pe = torch.randn(T, 1, dr, device=dev, dtype=torch.bfloat16, generator=g)
    rows[4]["ms"] = median_ms(lambda: torch.cat((k_nope, k_pe.expand(-1, H, -1)), dim=-1))
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(m, tp, step, L, seed=0)
    qp = torch.zeros(T, Hp, m.head_size, device=dev, dtype=torch.bfloat16)
    qp[:, :H, :512] = ql_nope
    qp[:, :H, 512:] = q_pe
    rows[5]["ms"] = median_ms(lambda: sparse_mla_prefill(qp, kv, idx, 0.0625, topk_length=tl, actual_num_heads=H,
                                                          backend="flash_mla"))


OUTPUTS = {"routes_sweep.csv": COLS}
PROVENANCE = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp")
#: (model, prompt_len) at the default --lens and --tp 8
SHAPES = [(m, L) for m in ("glm-5", "deepseek-v3.2") for L in (512, 1024, 2048, 4096, 8192)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["glm-5", "deepseek-v3.2"])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--prompt-lens", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.exists():
        print(f"--out={a.out!r} exists; allowed: a path that does not exist (the lab writes new files only)",
              file=sys.stderr)
        return 2
    for L in a.prompt_lens:
        if L <= 0 or L > a.tokens:
            print(f"--prompt-lens {L} is not valid; allowed: 1..--tokens ({a.tokens})", file=sys.stderr)
            return 2
    arch = get_arch("h200")
    prov = provenance("modelled" if a.dry_run else "measured")
    rows = []
    for mn in a.models:
        ranks = _ranks(mn, a.tp, a.tokens, arch)  # one view per (model, tp) point
        for L in a.prompt_lens:
            rows += _rows_for(ranks, L, a.dry_run)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS + list(prov))
        w.writeheader()
        for r in rows:
            w.writerow({**r, **prov})
    print(f"wrote {len(rows)} rows to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
