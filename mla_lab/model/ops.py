"""Per-rank ops of one decoder layer of a sparse-MLA (DSA) MoE model for one prefill step (docs/ttft-model.md).

Functions take a checked :class:`~mla_lab.rank.RankView` first; layer options are keywords checked once per call.
Ops follow vLLM's order (``vllm/model_executor/models/deepseek_v2.py``), with per-rank shape, FLOPs and bytes (each
tensor read and written once: a lower bound). Activations bf16; linear weights ``weight_dtype`` (fp8: 1 B + an fp32
scale per 128x128 block); W_UK / W_UV, router, norms, embedding and LM head bf16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .._validate import check_int
from ..models import ModelConfig
from ..placement import Strategy, as_strategy
from ..rank import RankView
from ..workload import Step, sum_topk_lengths

BF16, FP32 = 2, 4

WEIGHT_DTYPES = {"bf16": 2, "fp8": 1}
COMM_CLASSES = ("allreduce", "all_to_all", "allgather")

EP_COMM = ("all_reduce", "all_to_all")
LAYER_KINDS = ("moe", "dense")
FP8_PEAK_FACTOR = 2.0  # dense fp8 / dense bf16 tensor rate on Hopper and Blackwell datasheets (H200 1979/989)

def _err(name, value, allowed) -> ValueError:
    return ValueError(f"{name}={value!r} is not valid; allowed: {allowed}")

@dataclass(frozen=True)
class LayerOp:
    """One op on one rank: ``op_class`` (``gemm``..., ``attn_<op>``, :data:`COMM_CLASSES`), bytes read plus
    written, ``comm_bytes`` (per rank, before the collective), ``dims`` (per-rank shape), ``impl`` (None: modelled
    only)."""

    name: str
    op_class: str
    flops: float = 0.0
    weight_bytes: float = 0.0
    act_bytes: float = 0.0
    comm_bytes: float = 0.0
    dims: dict = field(default_factory=dict)
    impl: str | None = None
    dtype: str = "bf16"

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.act_bytes

    @property
    def is_comm(self) -> bool:
        return self.op_class in COMM_CLASSES

    def to_dict(self) -> dict:
        return {"op": self.name, "op_class": self.op_class, "flops": self.flops, "weight_bytes": self.weight_bytes,
                "act_bytes": self.act_bytes, "bytes": self.bytes, "comm_bytes": self.comm_bytes,
                "dims": ";".join(f"{k}={v}" for k, v in self.dims.items()), "impl": self.impl or "",
                "dtype": self.dtype}

def _gemm(name, M, K, N, wbytes, dtype, impl="linear") -> LayerOp:
    """``[M, K] @ [K, N]``: 2MKN FLOPs; weights K*N*wbytes (+ fp32 block scales for fp8); activations bf16 in/out."""
    w = K * N * wbytes
    if wbytes == 1:
        w += math.ceil(K / 128) * math.ceil(N / 128) * FP32
    cls = "gemm_fp8" if dtype == "fp8" else "gemm"
    return LayerOp(name, cls, flops=2.0 * M * K * N, weight_bytes=w, act_bytes=(M * K + M * N) * BF16,
                   dims={"M": M, "K": K, "N": N}, impl=impl, dtype=dtype)

def _norm(name, M, N, fused_add) -> LayerOp:
    """RMSNorm over N (bf16): reads x (and the residual when fused with the add), writes out (and the residual)."""
    passes = 4 if fused_add else 2
    return LayerOp(name, "norm", flops=0.0, weight_bytes=N * BF16, act_bytes=passes * M * N * BF16,
                   dims={"M": M, "N": N, "fused_add": int(fused_add)}, impl="rmsnorm_add" if fused_add else "rmsnorm")

def _silu_mul(name, M, N) -> LayerOp:
    """SiLU(gate) * up: reads ``M x 2N``, writes ``M x N`` (bf16)."""
    return LayerOp(name, "elementwise", act_bytes=3 * M * N * BF16, dims={"M": M, "N": N}, impl="silu_mul")

def _comm(name, cls, nbytes) -> LayerOp:
    return LayerOp(name, cls, comm_bytes=nbytes, dims={"bytes": nbytes}, impl=None)

@dataclass(frozen=True)
class StepStats:
    """A step's counts: ``sum_topk`` (sum of FlashMLA ``topk_length``), ``sum_visible`` (indexer keys, ``min(p+1,
    context)`` each), ``keys_read`` (``start + n`` per chunk), ``num_seqs`` (chunks: LM-head rows)."""

    num_tokens: int
    sum_topk: int
    sum_visible: int
    keys_read: int
    num_seqs: int

def step_stats(model: ModelConfig, step: Step | int, causal: bool = True, context: int | None = None) -> StepStats:
    """:class:`StepStats` of a Step (an int T: full topk per token, the indexer over one causal prompt).
    Raises ValueError: T not a non-negative int, context not a positive int."""
    if context is not None:
        check_int("context", context)
    big = context if context is not None else 1 << 62
    if isinstance(step, Step):
        T = step.num_tokens
        st = sum(sum_topk_lengths(s, n, model.topk) if causal else n * model.topk for _, s, n in step.chunks)
        sv = sum(sum_topk_lengths(s, n, big) for _, s, n in step.chunks)
        kr = sum(min(s + n, big) for _, s, n in step.chunks)
        return StepStats(T, st, sv, kr, len(step.chunks))
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step={step!r} must be a non-negative int (a token count) or a Step")
    T = check_int("step", step, allow_zero=True)
    return StepStats(T, T * model.topk, sum_topk_lengths(0, T, big), min(T, big), 1 if T else 0)

def _check_options(ep_comm: str, indexer_dtype: str, layer_kind: str | None = None) -> None:
    """Check the layer options (not deployment fields). Raises ValueError: a value outside those allowed."""
    if ep_comm not in EP_COMM:
        raise _err("ep_comm", ep_comm, list(EP_COMM))
    if layer_kind is not None and layer_kind not in LAYER_KINDS:
        raise _err("layer_kind", layer_kind, list(LAYER_KINDS))
    if indexer_dtype not in ("bf16", "fp8"):
        raise _err("indexer_dtype", indexer_dtype, ["bf16", "fp8"])


def layer_ops(rank: RankView, strategy: Strategy | str, step: Step | int, layer_kind: str = "moe",
              **kw) -> list[LayerOp]:
    """Every op of one decoder layer on one rank for one step (keywords of :func:`_layer_ops`). ``layer_kind``:
    ``moe`` / ``dense`` (the first ``first_k_dense_replace`` layers); ``ep_comm``: ``all_reduce`` (vLLM TP+EP) /
    ``all_to_all``; ``out_slice_copy``: price the ``out[:, :H]`` copy (vLLM hands the view to the W_UV bmm:
    ``data/measured/h200/layer_extras.csv``); ``with_indexer``: False for IndexShare layers. Raises ValueError:
    ``strategy``, ``step``, ``context`` or an option outside its allowed values."""
    _check_options(kw.get("ep_comm", "all_reduce"), kw.get("indexer_dtype", "bf16"), layer_kind)
    return _layer_ops(rank, as_strategy(strategy), step, layer_kind, **kw)


def _layer_ops(rank: RankView, strategy: Strategy, step: Step | int, layer_kind: str = "moe", *,
               ep_comm: str = "all_reduce", out_slice_copy: bool = False, causal: bool = True,
               context: int | None = None, indexer_dtype: str = "bf16", with_indexer: bool = True) -> list[LayerOp]:
    """:func:`layer_ops` unchecked."""
    model, tp, H = rank.model, rank.tp, rank.num_heads
    ss = step_stats(model, step, causal, context)
    T = ss.num_tokens
    wb, wd = WEIGHT_DTYPES[rank.weight_dtype], rank.weight_dtype
    h, qr, kr = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    ops: list[LayerOp] = [
        _norm("input_norm", T, h, True),
        _gemm("q_a_proj", T, h, qr, wb, wd),
        _norm("q_a_norm", T, qr, False),
        _gemm("q_b_proj", T, qr, H * (dn + dr), wb, wd),
        _gemm("kv_a_proj", T, h, kr + dr, wb, wd),
        _norm("kv_a_norm", T, kr, False),
        LayerOp("rope_cache", "elementwise",
                act_bytes=(2 * T * H * dr + T * (kr + dr)) * BF16
                + T * model.kv_cache_bytes_per_token_layer(rank.kv_cache_dtype, include_indexer=False),
                dims={"T": T, "H": H}, impl=None),
        LayerOp("w_uk_bmm", "bmm", flops=2.0 * H * T * dn * kr, weight_bytes=H * dn * kr * BF16,
                act_bytes=(T * H * dn + T * H * kr) * BF16, dims={"B": H, "M": T, "K": dn, "N": kr}, impl="bmm_uk"),
    ]
    if with_indexer:
        ops += _indexer_ops(model, ss, wb, wd, indexer_dtype)
    ops += [op for op in strategy.kind.price(rank, strategy, T, ss.sum_topk, step)  # its kind's price, unchecked
            if op.name != "out_slice" or out_slice_copy]
    ops += [
        LayerOp("w_uv_bmm", "bmm", flops=2.0 * H * T * kr * dv, weight_bytes=H * kr * dv * BF16,
                act_bytes=(T * H * kr + T * H * dv) * BF16, dims={"B": H, "M": T, "K": kr, "N": dv}, impl="bmm_uv"),
        _gemm("o_proj", T, H * dv, h, wb, wd),
    ]
    if tp > 1:
        ops.append(_comm("attn_allreduce", "allreduce", T * h * BF16))
    ops.append(_norm("post_attn_norm", T, h, True))
    if layer_kind == "dense":
        i_loc = model.intermediate_size // tp
        ops += [_gemm("mlp_gate_up", T, h, 2 * i_loc, wb, wd), _silu_mul("mlp_act", T, i_loc),
                _gemm("mlp_down", T, i_loc, h, wb, wd)]
        return ops + ([_comm("mlp_allreduce", "allreduce", T * h * BF16)] if tp > 1 else [])
    return ops + _moe_ops(rank, T, ep_comm)


def _indexer_ops(model: ModelConfig, ss: StepStats, wb: int, wd: str, indexer_dtype: str) -> list[LayerOp]:
    """The DSA indexer's ops."""
    T, nih, dih, qr, h = ss.num_tokens, model.index_n_heads, model.index_head_dim, model.q_lora_rank, model.hidden_size
    ib = BF16 if indexer_dtype == "bf16" else 1
    return [
        _gemm("idx_wq_b", T, qr, nih * dih, wb, wd),
        _gemm("idx_wk", T, h, dih, wb, wd),
        _gemm("idx_weights_proj", T, h, nih, BF16, "bf16"),
        LayerOp("idx_prep", "elementwise",
                act_bytes=T * nih * dih * (BF16 + 1) + T * dih * (BF16 + 1)
                + T * (dih + FP32 * math.ceil(dih / 128)), dims={"T": T}, impl=None),
        LayerOp("idx_logits", "indexer_logits", flops=2.0 * ss.sum_visible * nih * dih,
                act_bytes=T * nih * dih * ib + ss.keys_read * dih * ib + T * nih * FP32 + ss.sum_visible * FP32,
                dims={"T": T, "NH": nih, "D": dih, "sum_visible": ss.sum_visible, "keys": ss.keys_read},
                impl="mqa_logits", dtype=indexer_dtype),
        LayerOp("idx_topk", "topk", act_bytes=ss.sum_visible * FP32 + T * model.topk * FP32,
                dims={"T": T, "keys": ss.keys_read, "k": model.topk}, impl="topk"),
    ]


def _moe_ops(rank: RankView, T: int, ep_comm: str) -> list[LayerOp]:
    """Router, routed experts (balanced; weights of experts hit under uniform routing), shared experts, comm."""
    model, tp, ep = rank.model, rank.tp, rank.ep_size
    wb, wd, h = WEIGHT_DTYPES[rank.weight_dtype], rank.weight_dtype, model.hidden_size
    E, k, im = model.n_routed_experts, model.num_experts_per_tok, model.moe_intermediate_size
    if rank.moe_parallel == "tp":
        e_loc, i_loc, pairs = E, im // tp, T * k
    else:
        e_loc, i_loc, pairs = E // ep, im, T * k / ep
    m_e = pairs / e_loc
    touched = e_loc * (1.0 - (1.0 - 1.0 / E) ** (T * k)) if T else 0.0
    mcls = "moe_gemm_fp8" if wd == "fp8" else "moe_gemm"

    def moe_gemm(name, K, N):
        w = K * N * wb + (math.ceil(K / 128) * math.ceil(N / 128) * FP32 if wb == 1 else 0)
        return LayerOp(name, mcls, flops=2.0 * pairs * K * N, weight_bytes=touched * w,
                       act_bytes=pairs * (K + N) * BF16, dims={"E": e_loc, "M": m_e, "K": K, "N": N},
                       impl="moe_bmm", dtype=wd)

    ns_i = model.n_shared_experts * im // tp
    ops = [
        _gemm("router", T, h, E, BF16, "bf16"),
        LayerOp("router_topk", "elementwise", act_bytes=T * E * FP32 + T * k * (FP32 + 4), dims={"T": T}, impl=None),
        moe_gemm("moe_gate_up", h, 2 * i_loc),
        LayerOp("moe_act", "elementwise", act_bytes=3 * pairs * i_loc * BF16, dims={"M": m_e * e_loc, "N": i_loc},
                impl="silu_mul"),
        moe_gemm("moe_down", i_loc, h),
        LayerOp("moe_combine", "reduce", act_bytes=(pairs + T) * h * BF16,
                dims={"T": T, "k": pairs / T if T else 0, "N": h}, impl="moe_sum"),
    ]
    if ns_i:
        ops += [_gemm("shared_gate_up", T, h, 2 * ns_i, wb, wd), _silu_mul("shared_act", T, ns_i),
                _gemm("shared_down", T, ns_i, h, wb, wd)]
    if rank.moe_parallel == "ep" and ep_comm == "all_to_all" and ep > 1:
        share = T / ep * k * h * BF16
        ops += [_comm("moe_dispatch", "all_to_all", share), _comm("moe_combine_a2a", "all_to_all", share),
                _comm("moe_allgather", "allgather", T * h * BF16)]
        if tp > 1 and ns_i:
            ops.append(_comm("shared_allreduce", "allreduce", T * h * BF16))
    elif tp > 1:
        ops.append(_comm("moe_allreduce", "allreduce", T * h * BF16))
    return ops


def step_ops(rank: RankView, strategy: Strategy | str, step: Step | int, **kw) -> list[tuple[LayerOp, int]]:
    """One engine step's ops as ``(op, count)``: each layer kind x its count, the step-level ops once. Keywords
    as :func:`layer_ops` (no ``layer_kind``)."""
    strategy = as_strategy(strategy)
    return _step_pairs(rank, step, kw, "step_ops", lambda kind, idx: _layer_ops(rank, strategy, step, kind,
                                                                              with_indexer=idx, **kw))


def _step_pairs(rank: RankView, step: Step | int, kw: dict, who: str, layer) -> list[tuple[LayerOp, int]]:
    """``(op, count)`` of ``layer(kind, with_indexer)`` per layer kind, then the step-level ops; options checked."""
    if "layer_kind" in kw:
        raise ValueError(f"layer_kind=... is chosen per layer by {who}; allowed: omit it")
    _check_options(kw.get("ep_comm", "all_reduce"), kw.get("indexer_dtype", "bf16"))
    out = [(op, n) for (kind, idx), n in layer_kinds(rank.model) for op in layer(kind, idx)]
    return out + step_level_ops(rank, step_stats(rank.model, step, kw.get("causal", True), kw.get("context")))


def layer_kinds(model: ModelConfig) -> list[tuple[tuple[str, bool], int]]:
    """``((layer_kind, with_indexer), count)`` over the model's layers, dense first, indexer layers first."""
    n_dense = min(model.first_k_dense_replace, model.num_hidden_layers)
    with_idx = set(model.indexer_layers)
    counts: dict[tuple[str, bool], int] = {}
    for i in range(model.num_hidden_layers):
        key = ("dense" if i < n_dense else "moe", i in with_idx)
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items(), key=lambda kv: (kv[0][0] != "dense", not kv[0][1]))


def step_level_ops(rank: RankView, ss: StepStats) -> list[tuple[LayerOp, int]]:
    """The once-per-step ops as ``(op, 1)``: embedding, final norm, LM head over ``num_seqs`` rows (vLLM v1) and,
    for ``tp > 1``, the embedding all-reduce and logits gather."""
    model, tp = rank.model, rank.tp
    T, h, V = ss.num_tokens, model.hidden_size, model.vocab_size
    R = ss.num_seqs
    out = [
        (LayerOp("embedding", "elementwise", act_bytes=T * h * BF16 / tp + T * h * BF16 + T * 8,
                 dims={"T": T, "N": h}, impl=None), 1),
        (_norm("final_norm", T, h, True), 1),
        (_gemm("lm_head", R, h, V // tp, BF16, "bf16"), 1),
    ]
    if tp > 1:
        out += [(_comm("embed_allreduce", "allreduce", T * h * BF16), 1),
                (_comm("logits_gather", "allgather", R * V * FP32), 1)]
    return out


ATTN_OPS = ("concat", "pad", "pad_copy", "kernel", "out_slice", "chunk_out", "chunk_overhead")


def attention_op_work(op: str, T: int, H: int, Hp: int, sum_topk: int, head_size: int = 576, d_v: int = 512) -> float:
    """Bytes, or FLOPs for ``kernel`` (``2 sum_topk H' (576+512)``, FlashMLA README), of one attention-path op.
    Raises ValueError: unknown op."""
    row, concat, out = head_size * 2, 2 * T * H * head_size * 2, 2 * T * H * d_v * 2
    work = {"concat": concat, "pad": T * Hp * row + concat, "pad_copy": concat, "out_slice": out, "chunk_out": out,
            "kernel": 2 * sum_topk * Hp * (head_size + d_v),
            "concat_zero_padding": concat + T * (Hp - H) * row}  # the concat also zeroes the padded heads
    if op not in work:
        raise ValueError(f"op={op!r} is not known; allowed: {list(ATTN_OPS) + ['concat_zero_padding']}")
    return work[op]


def attention_path_ops(rank: RankView, strategy: Strategy | str, num_tokens: int,
                       sum_topk: int | None = None) -> list[LayerOp]:
    """The attention-path ops (:data:`ATTN_OPS`, absent ones omitted) of one layer for ``strategy``, ``num_tokens``
    T and ``sum_topk`` keys (default ``T * index_topk``).
    Raises ValueError: unknown strategy; negative counts; ``sum_topk > T * index_topk``."""
    spec = as_strategy(strategy)
    model = rank.model
    check_int("num_tokens", num_tokens, allow_zero=True)
    if sum_topk is not None:
        check_int("sum_topk", sum_topk, allow_zero=True)
        if sum_topk > num_tokens * model.topk:
            raise ValueError(f"sum_topk={sum_topk} exceeds num_tokens * index_topk = {num_tokens * model.topk}")
    return spec.kind.price(rank, spec, num_tokens, num_tokens * model.topk if sum_topk is None else sum_topk, None)


def path_op(rank: RankView, name: str, T: int, st: int, work_of: str | None = None, **dims) -> LayerOp:
    """One op of :data:`ATTN_OPS` at the rank's heads: bytes, or FLOPs for ``kernel``, from :func:`attention_op_work`
    (of ``work_of``, default ``name``); ``dims`` added to ``T, H, Hp, sum_topk``."""
    m, H, Hp = rank.model, rank.num_heads, rank.padded_num_heads
    w = attention_op_work(work_of or name, T, H, Hp, st, m.head_size, m.d_v)
    flops = name == "kernel"
    return LayerOp(name, f"attn_{name}", flops=w if flops else 0.0, act_bytes=0.0 if flops else w,
                   dims={"T": T, "H": H, "Hp": Hp, "sum_topk": st, **dims}, impl=f"attn_{name}")


def padded_path_ops(rank: RankView, spec: Strategy, T: int, st: int, step=None, *, pad: str | None = None,
                    native: bool = False, chunk_ops=()) -> list[LayerOp]:
    """A FlashMLA path (a kind's ``price``; ``step`` unread): concat, the per-call ``pad`` op (a padded bf16 Q
    only), the kernel (``native``: padded inside it, real heads in and out), ``chunk_ops``, ``out_slice`` (padded
    heads, not ``native``)."""
    m, H, Hp = rank.model, rank.num_heads, rank.padded_num_heads
    padded = Hp > H and rank.kv_cache_dtype == "bf16"
    ops = [path_op(rank, "concat", T, st, "concat_zero_padding" if padded and spec.concat_zeroes_padding else None)]
    if pad and padded:
        ops.append(path_op(rank, pad, T, st))
    # per-token bytes: Q read, out [T, h, 512] bf16 + lse, max_logits fp32 written, for each head the kernel runs
    tok = m.head_size * 2 + m.d_v * 2 + 2 * 4
    kern = path_op(rank, "kernel", T, st, content=spec.content if padded else "zeros", native=int(native))
    ops += [replace(kern, act_bytes=T * (H if native else Hp) * tok), *chunk_ops]
    return ops + ([path_op(rank, "out_slice", T, st)] if not native and Hp > H else [])
