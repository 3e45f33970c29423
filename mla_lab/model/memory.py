"""Memory per rank: weights, the profile-run activation estimate, and the KV-cache budget they leave.

vLLM sizes the KV cache after a profile run: budget = total memory x ``gpu_memory_utilization`` - weights -
the profiled activation peak - persistent buffers reserved before profiling (the workspace manager's buffer).
The lab follows that rule (:func:`memory_tradeoff`); the Q path's own bytes per strategy come from
:func:`mla_lab.buffers.memory_account`.
"""

from __future__ import annotations

import math

from .._validate import check_int
from ..buffers import MIB, STRATEGIES, memory_account_of, shared_workspace_other_bytes
from .packed_kernel import packed_union_bytes
from ..deployment import DEFAULT_GPU_MEMORY_UTILIZATION, Deployment
from ..placement import BASELINE, expand
from ..rank import RankView
from .ops import BF16, FP32, WEIGHT_DTYPES

__all__ = ["weights_bytes_per_rank", "activation_peak_bytes", "memory_tradeoff", "DEFAULT_GPU_MEMORY_UTILIZATION"]

def weights_bytes_per_rank(rank: RankView) -> int:
    """Estimated weight bytes one rank holds (vLLM layout), of a :class:`~mla_lab.rank.RankView`
    (``Deployment.rank``: checked at the Deployment's door, nothing re-checked here).

    Counted from the config: per layer q_a, q_b (1/tp), kv_a, kv_b (1/tp; plus vLLM's bf16 W_UK/W_UV copies),
    o_proj (1/tp), the indexer (wq_b, wk, weights_proj; replicated), norms; dense MLP (1/tp) or router + experts
    (1/tp each under TP; ``E/ep`` whole experts under EP) + shared experts (1/tp); embedding and LM head (1/tp each).
    Linears in the rank's ``weight_dtype`` (fp8: 1 B + fp32 scale per 128x128 block); norms, router, embedding, LM
    head, ``idx_weights_proj`` and the W_UK/W_UV copies bf16. The MTP layer is not counted (vLLM loads it only for
    speculative decoding).
    """
    model, tp, H, weight_dtype, moe_parallel = rank.model, rank.tp, rank.num_heads, rank.weight_dtype, rank.moe_parallel
    ep = rank.ep_size
    wb = WEIGHT_DTYPES[weight_dtype]

    def lin(K, N):
        return K * N * wb + (math.ceil(K / 128) * math.ceil(N / 128) * FP32 if wb == 1 else 0)

    h, qr, kr = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    attn = (lin(h, qr) + lin(qr, H * (dn + dr)) + lin(h, kr + dr) + lin(kr, H * (dn + dv)) + lin(H * dv, h)
            + H * kr * (dn + dv) * BF16  # W_UK_T / W_UV bf16 copies
            + lin(qr, model.index_n_heads * model.index_head_dim) + lin(h, model.index_head_dim)
            + h * model.index_n_heads * BF16 + (2 * h + qr + kr + 2 * model.index_head_dim) * BF16)
    dense = 3 * lin(h, model.intermediate_size // tp)
    E, im = model.n_routed_experts, model.moe_intermediate_size
    experts = E * 3 * lin(h, im // tp) if moe_parallel == "tp" else (E // ep) * 3 * lin(h, im)
    moe = h * E * BF16 + E * FP32 + experts + model.n_shared_experts * 3 * lin(h, im // tp)
    n_dense = min(model.first_k_dense_replace, model.num_hidden_layers)
    n_moe = model.num_hidden_layers - n_dense
    emb = 2 * (model.vocab_size // tp) * h * BF16 + h * BF16
    return int(model.num_hidden_layers * attn + n_dense * dense + n_moe * moe + emb)


def activation_peak_bytes(rank: RankView) -> int:
    """Rough peak of transient activations in a profile run at the rank's ``max_num_batched_tokens`` (what vLLM's
    memory profiling subtracts before sizing the KV cache), taken as the fused-MoE intermediate caches
    ``T x k x (2 I_loc + I_loc + h)`` bf16 plus four ``T x h`` bf16 hidden/residual buffers. An estimate, not a
    measurement; the attention-path buffers of each strategy are accounted separately (buffers.memory_account).
    ``rank``: a :class:`~mla_lab.rank.RankView` (``Deployment.rank``), nothing re-checked."""
    model, tp, moe_parallel, T = rank.model, rank.tp, rank.moe_parallel, rank.max_num_batched_tokens
    k, h = model.num_experts_per_tok, model.hidden_size
    i_loc = model.moe_intermediate_size // tp if moe_parallel == "tp" else model.moe_intermediate_size
    return int(T * k * (3 * i_loc + h) * BF16 + 4 * T * h * BF16)


def memory_tradeoff(
    deployment: Deployment,
    *,
    ep_size: int | None = None,
    total_memory_bytes: int | None = None,
    include_indexer: bool = True,
    strategies=None,
    shared_workspace_bytes: int | None = None,
) -> dict:
    """The persistent Q-workspace bytes of each strategy as KV-cache tokens lost per rank and % of KV capacity.

    KV budget per rank = ``total_memory x gpu_memory_utilization`` (vLLM's rule, default 0.9) minus the weights one
    rank holds (:func:`weights_bytes_per_rank`, counted from the config at ``weight_dtype``)
    minus the profile-run activation peak (:func:`activation_peak_bytes`, an estimate) minus
    the baseline's Q-concat buffer (:data:`mla_lab.placement.BASELINE`). ``total_memory`` defaults to the datasheet HBM (decimal GB; the H200
    reports 143771 MiB to nvidia-smi, pass ``total_memory_bytes`` to use that). Capacity in tokens = budget /
    :meth:`~mla_lab.models.ModelConfig.kv_cache_bytes_per_token` (latent cache + indexer keys, all layers; the
    MLA latent cache is replicated on every TP rank). The workspace is shared by all layers (one per rank), so its
    cost does not scale with the layer count.

    Only persistent bytes reduce the KV cache: vLLM sizes the cache after a profile run at
    ``max_num_batched_tokens``; the unfused pad tensor is transient and is freed inside each layer, and whether it
    raises the profiled peak depends on whether the attention path or the MoE sets that peak (with the MoE
    intermediates larger, as estimated here, it does not).

    Returns:
        ``{"strategies": {s: {persistent_bytes, extra_bytes, extra_mib, kv_tokens_lost, kv_capacity_pct_lost}},
        "kv_capacity_tokens", "kv_budget_bytes", "weights_bytes", "activation_bytes", "kv_bytes_per_token",
        "fits", "accounts": {s: MemoryAccount}}`` plus the assumptions.

    ``deployment``: a :class:`~mla_lab.deployment.Deployment` (model, tp, arch, max_num_batched_tokens, KV dtype,
    weight dtype, MoE layout and gpu_memory_utilization from it, checked at its door; ``Deployment.replace(...)``
    changes one). The older loose form ``memory_tradeoff(model, tp, arch, ...)`` is gone (issue 31: the serving
    benchmark, its last caller, takes a Deployment).
    ``strategies``: :class:`~mla_lab.placement.Strategy` objects or door names (presets, aliases; default every
    fixed canonical strategy);
    ``shared_workspace_bytes``: the shared workspace's size from its other users (default
    :func:`mla_lab.buffers.shared_workspace_other_bytes`, the fused-MoE scratch at ``max_num_batched_tokens``).

    Raises:
        ValueError: a bad ``total_memory_bytes`` / ``shared_workspace_bytes`` / ``ep_size`` (one line).
    """
    d = deployment
    model, arch = d.model, d.arch
    kv_cache_dtype, gpu_memory_utilization = d.kv_cache_dtype, d.gpu_memory_utilization
    moe_parallel = d.moe_parallel
    H = d.num_heads
    total = arch.hbm_gb * 1e9 if total_memory_bytes is None else total_memory_bytes
    if isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0:
        raise ValueError(f"total_memory_bytes={total_memory_bytes!r} must be a positive number")
    rank = d.rank.with_ep_size(ep_size) if moe_parallel == "ep" else d.rank  # derived once from the checked deployment
    weights = weights_bytes_per_rank(rank)
    act = activation_peak_bytes(rank)
    per_tok = model.kv_cache_bytes_per_token(kv_cache_dtype, include_indexer)
    names = [st.name for st in expand(strategies if strategies is not None else STRATEGIES)]
    shared = shared_workspace_other_bytes(rank) \
        if shared_workspace_bytes is None else check_int("shared_workspace_bytes", shared_workspace_bytes,
                                                         allow_zero=True)
    # model + prompt length: a strategy whose route is dense MHA at this prompt length pads nothing (its transient
    # is the up-projected K/V, mla_lab.buffers.memory_account)
    accounts = {s: memory_account_of(rank, s, shared, d.prompt_len,
                                     union_bytes=packed_union_bytes(rank, d.prompt_len) if s.startswith("packed") else None)
                for s in dict.fromkeys([BASELINE] + names)}
    base_ws = accounts[BASELINE].persistent_bytes
    budget = total * gpu_memory_utilization - weights - act - base_ws
    capacity = budget / per_tok
    out = {}
    for s, a in accounts.items():
        extra = a.persistent_bytes - base_ws
        lost = extra / per_tok
        out[s] = {"persistent_bytes": a.persistent_bytes, "extra_bytes": extra, "extra_mib": extra / MIB,
                  "kv_tokens_lost": lost,
                  "kv_capacity_pct_lost": (lost / capacity * 100) if capacity > 0 else float("nan"),
                  "step_transient_bytes": a.step_transient_bytes,
                  "call_transient_bytes": a.call_transient_bytes}
    return {
        "strategies": out,
        "num_heads": H,
        "padded_heads": rank.padded_num_heads,
        "accounts": accounts,  # name -> mla_lab.buffers.MemoryAccount (the row builder's memory columns)
        "kv_capacity_tokens": max(capacity, 0.0),  # never negative: "fits" and "fit_reason" say why it is 0
        "fit_reason": "" if budget > 0 else (
            f"weights ({weights / 2**30:.1f} GiB per rank), activations ({act / 2**30:.1f} GiB) and the baseline "
            f"workspace leave no KV cache in {gpu_memory_utilization} x {total / 2**30:.1f} GiB"),
        "kv_budget_bytes": budget,
        "weights_bytes": weights,
        "activation_bytes": act,
        "kv_bytes_per_token": per_tok,
        "total_memory_bytes": total,
        "gpu_memory_utilization": gpu_memory_utilization,
        "shared_workspace_bytes": shared,
        "fits": budget > 0,
        "assumptions": ("KV budget = total x gpu_memory_utilization - weights (config count at weight_dtype) - "
                        "activation estimate - unfused workspace; CUDA graphs, NCCL buffers and other non-torch "
                        "memory not subtracted (capacity is an upper bound, % lost a lower bound)"),
    }
