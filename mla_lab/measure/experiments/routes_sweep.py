"""Time the attention routes of issue 25 on one GPU, beside the lab's model of them (one process per call).

Per model (parameter ``models``: GLM-5, DeepSeek-V3.2 at the rank's TP) and prompt length L (``prompt_lens``: 512 ..
8192), a full step of the rank's ``max_num_batched_tokens`` (``T // L`` fresh prompts of L):

- ``mha_attn``: dense causal MHA with the real heads (``H``, qk ``qk_nope+qk_rope``, v ``v_head_dim``) through torch
  SDPA, backend ``flash`` and ``cudnn`` (``[B, H, L, d]``, ``is_causal=True``: varlen with equal lengths). A backend
  that refuses unequal qk / v head dims gets V zero-padded to qk's width (``v_padded=1`` in the row, the output's
  extra columns dropped); a backend that refuses the shape is recorded ``status=unsupported`` with the error.
- ``kv_b_proj``: ``[T, 512] @ [512, H*(d_nope + d_v)]`` bf16 (``torch.matmul``) and fp8 (``torch._scaled_mm``,
  per-tensor scales) when available; ``k_concat``: ``torch.cat((k_nope, k_pe.expand(-1, H, -1)), -1)``.
- ``sparse_kernel``: FlashMLA's padded path (``flash_mla_sparse_fwd``, Q padded with zeros to 64/128 heads, causal
  top-k indices with ``topk_length``, :func:`mla_lab.measure.attention.make_step_inputs`).

Each row carries the modelled ms of the same op (:mod:`mla_lab.model.route_ops`) and the provenance columns.
``--dry-run`` (CPU) prints the modelled rows (:func:`plan`)."""

from __future__ import annotations

import math

from mla_lab.deployment import Deployment
from mla_lab.kernels import sparse_mla_prefill
from mla_lab.measure.attention import make_step_inputs
from mla_lab.measure.sink import log
from mla_lab.measure.timer import median_ms
from mla_lab.model.route_ops import (
    default_padded_kernel_fit,
    mha_attention_op,
    padded_kernel_terms,
    prompt_len_step,
    route_stats,
    up_projection_ops,
)
from mla_lab.model.route_timing import route_op_time_ms

COLS = ["model", "tp", "H", "prompt_len", "T", "op", "impl", "v_padded", "status", "error", "ms", "modelled_ms",
        "flops", "bytes"]


def _ranks(rank, model_name: str) -> dict:
    """The rank with ``model_name`` in its place, by weight dtype (``bf16`` / ``fp8``: the ``kv_b_proj`` GEMM is
    timed at both); bf16 KV cache (FlashMLA's padded heads)."""
    return {wd: Deployment.seed(model=model_name, tp=rank.tp, arch=rank.arch.name, weight_dtype=wd,
                                max_num_batched_tokens=rank.max_num_batched_tokens).rank for wd in ("bf16", "fp8")}


def _rows_for(ranks: dict, L: int, dry: bool) -> list[dict]:
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
        _measure(rank, L, step, rows)
    return rows


def _measure(rank, L, step, rows) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel


    m, H, Hp, dev = rank.model, rank.num_heads, rank.padded_num_heads, "cuda"
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
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(rank, step, L, seed=0)
    qp = torch.zeros(T, Hp, m.head_size, device=dev, dtype=torch.bfloat16)
    qp[:, :H, :512] = ql_nope
    qp[:, :H, 512:] = q_pe
    rows[5]["ms"] = median_ms(lambda: sparse_mla_prefill(qp, kv, idx, 0.0625, topk_length=tl, actual_num_heads=H,
                                                          backend="flash_mla"))


OUTPUTS = {"routes_sweep.csv": COLS}
#: (model, prompt_len) at the defaults (TP 8)
SHAPES = [(m, L) for m in ("glm-5", "deepseek-v3.2") for L in (512, 1024, 2048, 4096, 8192)]


def _points(rank, options):
    models = options.param("models", ("glm-5", "deepseek-v3.2"))
    lens = options.param("prompt_lens", (1024,) if options.smoke else (512, 1024, 2048, 4096, 8192))
    bad = [L for L in lens if not 0 < L <= rank.max_num_batched_tokens]
    if bad:
        raise ValueError(f"--param prompt_lens={bad[0]}; allowed: 1..max_num_batched_tokens "
                         f"({rank.max_num_batched_tokens})")
    return [(_ranks(rank, mn), L) for mn in models for L in lens]


def plan(rank, options) -> list[dict]:
    """The modelled rows (``ms`` empty): what a run measures, beside the model's figure (no GPU needed)."""
    return [r for ranks, L in _points(rank, options) for r in _rows_for(ranks, L, dry=True)]


def run(rank, sink, options) -> None:
    for ranks, L in _points(rank, options):
        for row in _rows_for(ranks, L, dry=False):
            sink.write("routes_sweep.csv", row)
        log(f"routes_sweep {ranks['bf16'].model.name} L={L}: done")
