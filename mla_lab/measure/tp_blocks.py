"""The TP harness's blocks (:mod:`.tp`) per rank, for one causal prompt of ``T`` tokens: inputs, forward, and the
merge of the shards (the check that the sum over ranks equals the unsharded block: ``tests/test_measure_tp.py``).

- ``attention``: rank ``r`` holds heads ``[r H, (r+1) H)``; KV cache and indices replicated. The strategy's
  attention path (:class:`mla_lab.strategies.PaddedQPath`), ``W_UV`` bmm, row-parallel ``o_proj``, one all-reduce
  of ``[T, hidden]`` bf16 (vLLM's ``RowParallelLinear``).
- ``moe``: vLLM TP + EP, DP = 1 (``ep = tp``): the replicated router (sigmoid in fp32, top-k renormalised:
  ``config.json`` ``scoring_func: sigmoid``, ``norm_topk_prob: true``; grouped top-k and ``routed_scaling_factor``
  left out: neither changes the work), rank ``r``'s whole experts and its shard of the shared experts, one
  all-reduce. Ops: :data:`MOE_OPS`; routed GEMMs :data:`MOE_IMPLS` (torch, not vLLM's Triton ``fused_moe``); bf16.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .._validate import divisors
from ..models import load_model

BF16_BYTES = 2
BLOCKS = ("attention", "moe")
#: The per-rank ops of the moe block, in order: those :func:`mla_lab.model.ops.layer_ops` lists for a MoE layer
#: after ``post_attn_norm`` under ``moe_parallel="ep"`` (``ep_comm="all_reduce"``, ``tp > 1``, shared experts).
MOE_OPS = ("router", "router_topk", "moe_gate_up", "moe_act", "moe_down", "moe_combine", "shared_gate_up",
           "shared_act", "shared_down", "moe_allreduce")
#: Implementations of the moe block's routed-expert GEMMs (:func:`moe_forward`).
MOE_IMPLS = ("auto", "grouped_mm", "loop")


def tiny_overrides() -> dict:
    """ModelConfig fields for a CPU dry run: 8 heads, hidden 64, v_head_dim 16, topk 32 (head size stays 576);
    8 routed experts, 2 per token, moe_intermediate_size 32, one shared expert."""
    return {"num_attention_heads": 8, "hidden_size": 64, "v_head_dim": 16, "index_topk": 32,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1}


def _model(name: str, overrides: dict):
    model = load_model(name)
    return dataclasses.replace(model, **overrides) if overrides else model


def _generators(seed: int, rank: int, device: str):
    gs = torch.Generator(device=device).manual_seed(seed)
    gr = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 1 + rank)
    return gs, gr


def _randn(*shape, fan_in: int, generator, device) -> torch.Tensor:
    """bf16 ``N(0, 1) / sqrt(fan_in)`` drawn in bf16 (no fp32 copy of large expert weights)."""
    return torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=generator).div_(math.sqrt(fan_in))


def make_block_inputs(view, rank: int, T: int, seed: int = 0, device: str = "cpu") -> dict:
    """Rank ``rank``'s share of one attention block (``view``: its :class:`~mla_lab.rank.RankView`), bf16.

    Replicated (seeded ``seed``): ``kv [max(T, topk), 1, 576]``, causal ``indices [T, 1, topk]`` int32 (token
    ``i`` draws among keys ``0..i``), ``topk_length [T]`` int32. Sharded (seeded ``seed``, ``rank``): ``ql_nope
    [T, H, 512]`` (head-major strides, as vLLM's transposed W_UK bmm output), ``q_pe [T, H, 64]`` (a slice),
    ``w_uv [H, 512, v_head_dim]``, ``w_o [hidden, H v_head_dim]``.
    """
    model, H = view.model, view.num_heads
    topk = model.topk
    gs, gr = _generators(seed, rank, device)
    s_kv = max(T, topk)
    kv = torch.randn(s_kv, 1, model.head_size, device=device, dtype=torch.bfloat16, generator=gs)
    visible = torch.arange(1, T + 1, device=device)
    r = torch.rand(T, topk, device=device, generator=gs)
    idx = (r * visible[:, None]).long().to(torch.int32).view(T, 1, topk)
    tl = torch.clamp(visible, max=topk).to(torch.int32)
    del r
    ql_nope = torch.randn(H, T, model.kv_lora_rank, device=device, dtype=torch.bfloat16, generator=gr).transpose(0, 1)
    q_full = torch.randn(T, H, model.qk_nope_head_dim + model.qk_rope_head_dim, device=device,
                         dtype=torch.bfloat16, generator=gr)
    q_pe = q_full[..., model.qk_nope_head_dim:]
    w_uv = (torch.randn(H, model.kv_lora_rank, model.v_head_dim, device=device, generator=gr)
            / math.sqrt(model.kv_lora_rank)).to(torch.bfloat16)
    w_o = (torch.randn(model.hidden_size, H * model.v_head_dim, device=device, generator=gr)
           / math.sqrt(model.num_attention_heads * model.v_head_dim)).to(torch.bfloat16)
    return {"ql_nope": ql_nope, "q_pe": q_pe, "kv": kv, "indices": idx, "topk_length": tl, "w_uv": w_uv,
            "w_o": w_o, "num_heads": H}


def _check_moe_split(model, tp: int) -> None:
    E, inter = model.n_routed_experts, model.n_shared_experts * model.moe_intermediate_size
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive int")
    if E % tp:
        raise ValueError(f"tp={tp} (ep = tp) does not divide n_routed_experts={E} of model {model.name!r}; "
                         f"allowed tp: {divisors(E)}")
    if inter % tp:
        raise ValueError(f"tp={tp} does not divide the shared experts' intermediate size {inter} "
                         f"(n_shared_experts x moe_intermediate_size) of model {model.name!r}")


def make_moe_inputs(view, rank: int, T: int, seed: int = 0, device: str = "cpu") -> dict:
    """Rank ``rank``'s share of one MoE block under EP = TP = ``tp``, bf16, weights ``N(0, 1) / sqrt(fan_in)``.

    Replicated (seeded ``seed``): ``x [T, hidden]``, ``w_router [E, hidden]``. Sharded (seeded ``seed``,
    ``rank``): ``w13 [E/tp, 2 I, hidden]`` (gate rows first), ``w2 [E/tp, hidden, I]``, the shared shard
    ``w_sh13 [2 I_s, hidden]``, ``w_sh2 [hidden, I_s]`` (``I_s = n_shared_experts I / tp``); ``expert_start``,
    ``num_local_experts``, ``top_k``.

    Raises:
        ValueError: ``tp`` does not divide ``n_routed_experts`` or the shared intermediate size.
    """
    model, tp = view.model, view.tp
    _check_moe_split(model, tp)
    E, k, inter, h = model.n_routed_experts, model.num_experts_per_tok, model.moe_intermediate_size, model.hidden_size
    e_loc = E // tp
    i_s = model.n_shared_experts * inter // tp
    gs, gr = _generators(seed, rank, device)
    x = torch.randn(T, h, device=device, dtype=torch.bfloat16, generator=gs)
    w_router = _randn(E, h, fan_in=h, generator=gs, device=device)
    w13 = torch.empty(e_loc, 2 * inter, h, device=device, dtype=torch.bfloat16)
    w2 = torch.empty(e_loc, h, inter, device=device, dtype=torch.bfloat16)
    for e in range(e_loc):  # one expert at a time: no large temporaries
        w13[e] = _randn(2 * inter, h, fan_in=h, generator=gr, device=device)
        w2[e] = _randn(h, inter, fan_in=inter, generator=gr, device=device)
    w_sh13 = _randn(2 * i_s, h, fan_in=h, generator=gr, device=device)
    w_sh2 = _randn(h, i_s, fan_in=model.n_shared_experts * inter, generator=gr, device=device)
    return {"x": x, "w_router": w_router, "w13": w13, "w2": w2, "w_sh13": w_sh13, "w_sh2": w_sh2,
            "expert_start": rank * e_loc, "num_local_experts": e_loc, "top_k": k}


def merge_shards(block: str, shards: list) -> dict:
    """The unsharded block's inputs from the shards of ranks ``0..tp-1`` (rank order): the sharded tensors
    concatenated along heads / experts (the shared gate and up halves each), the replicated ones of rank 0.

    Raises:
        ValueError: unknown block.
    """
    s0 = shards[0]
    if block == "attention":
        full = {k: torch.cat([s[k] for s in shards], dim=1 if k in ("ql_nope", "q_pe", "w_o") else 0)
                for k in ("ql_nope", "q_pe", "w_uv", "w_o")}
        full.update({k: s0[k] for k in ("kv", "indices", "topk_length")})
        full["num_heads"] = sum(s["num_heads"] for s in shards)
        return full
    if block == "moe":
        i_s = s0["w_sh13"].shape[0] // 2
        gate = torch.cat([s["w_sh13"][:i_s] for s in shards])
        up = torch.cat([s["w_sh13"][i_s:] for s in shards])
        return {"x": s0["x"], "w_router": s0["w_router"], "w13": torch.cat([s["w13"] for s in shards]),
                "w2": torch.cat([s["w2"] for s in shards]), "w_sh13": torch.cat([gate, up]),
                "w_sh2": torch.cat([s["w_sh2"] for s in shards], dim=1), "expert_start": 0,
                "num_local_experts": sum(s["num_local_experts"] for s in shards), "top_k": s0["top_k"]}
    raise ValueError(f"block={block!r}; allowed: {list(BLOCKS)}")


def block_forward(strategy, inp: dict, sm_scale: float, world_size: int = 1, parts: str = "block"):
    """One rank's attention block: ``strategy`` (a :class:`mla_lab.strategies.PaddedQPath`) on ``inp``
    (:func:`make_block_inputs`) -> W_UV bmm -> o_proj -> (``world_size > 1``) in-place all-reduce. ``parts``:
    ``attn`` (returns ``[T, H, 512]``), ``compute`` (no all-reduce) or ``block``; else ``[T, hidden]`` bf16."""
    o, _ = strategy(inp["ql_nope"], inp["q_pe"], inp["kv"], inp["indices"], sm_scale, inp["topk_length"])
    if parts == "attn":
        return o
    T, H = o.shape[0], o.shape[1]
    x = torch.bmm(o.transpose(0, 1), inp["w_uv"])  # [H, T, v_head_dim]
    x = x.transpose(0, 1).reshape(T, H * inp["w_uv"].shape[-1])
    y = F.linear(x, inp["w_o"])  # [T, hidden]: this rank's partial sum
    if parts == "block" and world_size > 1:
        dist.all_reduce(y)
    return y


def moe_routing(inp: dict, as_tensor: bool = False):
    """Router and top-k (fp32 ``sigmoid(x @ w_router^T)``, renormalised) of this rank's experts: ``(tokens [P]
    int64, local_expert [P] int64, weight [P] fp32, counts)`` for the ``P`` pairs routed here, sorted by expert;
    ``counts`` per local expert, a list (a host sync) or, ``as_tensor``, an int64 tensor on the device."""
    logits = F.linear(inp["x"], inp["w_router"])  # [T, E] bf16
    scores = logits.float().sigmoid()
    top_w, top_i = torch.topk(scores, inp["top_k"], dim=-1)
    top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    e0, n = inp["expert_start"], inp["num_local_experts"]
    local = (top_i >= e0) & (top_i < e0 + n)
    tok, slot = local.nonzero(as_tuple=True)
    eid = top_i[tok, slot] - e0
    order = torch.argsort(eid, stable=True)
    tok, slot, eid = tok[order], slot[order], eid[order]
    counts = torch.bincount(eid, minlength=n)
    return tok, eid, top_w[tok, slot], (counts if as_tensor else counts.tolist())


def resolve_moe_impl(impl: str, device) -> str:
    """``auto`` -> ``grouped_mm`` on a CUDA sm90+ device whose torch has ``torch._grouped_mm``, else ``loop``.

    Raises:
        ValueError: ``impl`` not in :data:`MOE_IMPLS`; ``grouped_mm`` where it is not available.
    """
    if impl not in MOE_IMPLS:
        raise ValueError(f"moe_impl={impl!r}; allowed: {list(MOE_IMPLS)}")
    dev = torch.device(device)
    ok = (dev.type == "cuda" and hasattr(torch, "_grouped_mm") and torch.cuda.get_device_capability(dev) >= (9, 0))
    if impl == "grouped_mm" and not ok:
        raise ValueError(f"moe_impl='grouped_mm' needs torch._grouped_mm on a CUDA sm90+ device; device={device!s}")
    return impl if impl != "auto" else ("grouped_mm" if ok else "loop")


def _routed_loop(xs, w13, w2, counts):
    inter = w2.shape[-1]
    out = torch.empty(xs.shape[0], w2.shape[1], device=xs.device, dtype=torch.bfloat16)
    start = 0
    for e, c in enumerate(counts):
        if c:
            g = F.linear(xs[start:start + c], w13[e])  # moe_gate_up
            a = F.silu(g[:, :inter]) * g[:, inter:]  # moe_act
            out[start:start + c] = F.linear(a, w2[e])  # moe_down
            start += c
    return out


def _routed_grouped(xs, w13, w2, counts):
    """Two ``torch._grouped_mm`` over the pairs sorted by expert (``offs``: each group's end row, int32):
    ``[P, hidden] -> [P, 2 I]``, SiLU*mul, ``-> [P, hidden]``; the weights' transposes are column-major views."""
    inter = w2.shape[-1]
    offs = torch.cumsum(counts, 0).to(torch.int32)
    g = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)  # moe_gate_up
    a = (F.silu(g[:, :inter]) * g[:, inter:]).contiguous()  # moe_act
    return torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)  # moe_down


def moe_forward(inp: dict, world_size: int = 1, parts: str = "block", impl: str = "loop") -> torch.Tensor:
    """One rank's MoE block (:data:`MOE_OPS`) on ``inp`` (:func:`make_moe_inputs` or :func:`merge_shards`): routing,
    the local experts' gate_up / SiLU*mul / down times the router weight (``impl``: :func:`resolve_moe_impl`),
    summed per token in fp32, plus the shared shard; bf16 ``[T, hidden]``, then (``parts="block"``, ``world_size >
    1``) an in-place all-reduce.

    Raises:
        ValueError: as :func:`resolve_moe_impl`.
    """
    x = inp["x"]
    T, h = x.shape
    impl = resolve_moe_impl(impl, x.device)
    tok, eid, weight, counts = moe_routing(inp, as_tensor=impl == "grouped_mm")
    xs = x.index_select(0, tok)  # the token gather vLLM's fused_moe folds into its GEMM
    run = _routed_grouped if impl == "grouped_mm" else _routed_loop
    d = run(xs, inp["w13"], inp["w2"], counts)
    routed = (d.float() * weight[:, None]).to(torch.bfloat16)
    y = torch.zeros(T, h, device=x.device, dtype=torch.float32)
    y.index_add_(0, tok, routed.float())  # moe_combine
    i_s = inp["w_sh13"].shape[0] // 2
    if i_s:
        g = F.linear(x, inp["w_sh13"])  # shared_gate_up
        a = F.silu(g[:, :i_s]) * g[:, i_s:]  # shared_act
        y += F.linear(a, inp["w_sh2"]).float()  # shared_down
    y = y.to(torch.bfloat16)
    if parts == "block" and world_size > 1:
        dist.all_reduce(y)  # moe_allreduce
    return y
