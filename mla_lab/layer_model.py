"""Per-rank ops of one decoder layer of a sparse-MLA (DSA) MoE model for one prefill step, and their modelled time.

For an engine step of ``T`` tokens on one tensor-parallel rank (``tp`` ranks, ``H = num_attention_heads // tp``
heads per rank) :func:`layer_ops` lists every op with its real per-rank shape, FLOPs and bytes (weights plus
activations read and written, counted once each: a lower bound on traffic), in the order vLLM runs them
(``vllm/model_executor/models/deepseek_v2.py`` with the FlashMLA sparse backend):

============================  ======================================  ===========================================
op                            per-rank shape (GEMM ``M x K -> N``)    class / notes
============================  ======================================  ===========================================
input_norm                    fused residual add + RMSNorm, T x h     norm (reads x, residual; writes both)
q_a_proj                      T x h -> q_lora_rank                    gemm, replicated (vLLM fuses q_a and kv_a)
q_a_norm                      RMSNorm T x q_lora_rank                 norm
q_b_proj                      T x q_lora_rank -> H*(d_nope+d_rope)    gemm, column-parallel
kv_a_proj                     T x h -> kv_lora_rank + d_rope          gemm, replicated
kv_a_norm                     RMSNorm T x kv_lora_rank                norm
rope_cache                    rope on q_pe/k_pe, KV-cache write       elementwise (modelled only, not measured)
w_uk_bmm                      H x [T x d_nope] @ [d_nope x 512]       bmm, absorbed W_UK (bf16 weights)
idx_wq_b                      T x q_lora_rank -> n_ih*d_ih            gemm, replicated (DSA indexer)
idx_wk                        T x h -> d_ih                           gemm, replicated
idx_weights_proj              T x h -> n_ih                           gemm, replicated, bf16 (not quantized)
idx_prep                      k norm, rope, fp8 quant, cache write    elementwise (modelled only)
idx_logits                    sum_visible x n_ih x d_ih               indexer_logits: weighted-ReLU MQA logits,
                                                                      fp32 logits written for visible keys
idx_topk                      top-``index_topk`` of each row          topk
concat / pad / kernel /       :mod:`mla_lab.costmodel`                attention path per strategy (reused from
out_slice                     ``attention_path_ops``                  costmodel, not duplicated)
w_uv_bmm                      H x [T x 512] @ [512 x d_v]             bmm, absorbed W_UV (bf16 weights)
o_proj                        T x H*d_v -> h                          gemm, row-parallel
attn_allreduce                T x h bf16                              comm (ring all-reduce over NVLink)
post_attn_norm                fused add + RMSNorm T x h               norm
dense layers (first ``first_k_dense_replace``):
mlp_gate_up / mlp_act /       T x h -> 2*I/tp, SiLU*mul, I/tp -> h    gemm / elementwise / gemm, + mlp_allreduce
mlp_down
MoE layers (the rest):
router                        T x h -> n_routed_experts               gemm, replicated, bf16
router_topk                   grouped top-k                           elementwise (modelled only)
moe_gate_up / moe_act /       E_loc experts x M_e tokens each         moe_gemm / elementwise / moe_gemm
moe_down                      (balanced routing, M_e = T*k/E)
moe_combine                   sum of the k expert outputs per token   reduce
shared_gate_up/act/down       T x h -> 2*n_s*I_moe/tp ...             gemm / elementwise / gemm (TP-sharded)
moe_allreduce                 T x h bf16 (routed + shared, one)       comm; or all-to-all with ``ep_comm``
============================  ======================================  ===========================================

Per step (not per layer, :func:`step_ops`): vocab-parallel embedding (gather + all-reduce), final norm and the LM
head. Logits: vLLM v1 computes them for the last scheduled token of every request in the step (partial prefills
included, their samples discarded), so the LM head GEMM has ``M = number of chunks in the step`` rows; the
``[M, vocab/tp]`` fp32 logits are gathered to rank 0.

Expert parallelism (``moe_parallel="ep"``, vLLM ``--enable-expert-parallel`` with DP = 1, as in the PR's benchmark):
each rank holds ``n_routed_experts / ep_size`` whole experts and computes, for all ``T`` (replicated) tokens, the
``T * k / ep_size`` token-expert pairs routed to them; the routed and shared outputs are summed and all-reduced over
TP exactly as without EP (``ep_comm="all_reduce"``). ``ep_comm="all_to_all"`` models a DeepEP-style dispatch and
combine instead (each rank dispatches its ``T/ep`` token share, ``k`` copies, ``(ep-1)/ep`` of them remote, and an
all-gather restores the replicated hidden state for the next TP attention) — an option, not what the PR ran.

Dtypes: activations bf16 (2 B). Linear weights ``weight_dtype`` bf16 (2 B) or fp8 (1 B + one fp32 scale per
128x128 block; GLM-5.2-FP8 / DeepSeek-V3.2 ship fp8 block-quantized linears, and their GEMMs run at the fp8 tensor
rate, taken as 2x the dense bf16 rate from the same datasheets: H100/H200 1979, B200 4500 TFLOP/s dense fp8). The
absorbed W_UK / W_UV (vLLM dequantizes ``kv_b_proj`` into bf16 copies), the router, ``idx_weights_proj``, norms,
embedding and LM head stay bf16. The indexer's MQA logits are priced at bf16 (``indexer_dtype``), which is what
``benchmarks/bench_layer.py`` measures (a Triton kernel); vLLM runs DeepGEMM's fp8 ``fp8_mqa_logits`` there.

Time of an op (:func:`op_time_ms`): the roofline ``max(FLOPs / (peak x eff_flops), bytes / (HBM BW x eff_bytes))``
combined with a per-op overhead that the roofline alone lacks for small ops — as a floor, ``max(roofline,
overhead)``, or added, ``overhead + roofline`` (a fixed launch, ramp-up and tail cost), whichever fits the class's
measurements better (:class:`ClassEff` ``mode``) — with the efficiencies and overhead per op class from
an :class:`OpsCalibration` (``data/calibration/h200_ops.csv``, fitted by :func:`fit_calibration` from measurements
on one H200; other GPUs reuse the H200 efficiencies against their own datasheet rates, an assumption). The
attention-path ops are timed by :func:`mla_lab.costmodel.attention_path_ms` with the calibration's ``attention``
efficiencies.

Communication (:func:`comm_time_ms`): ring all-reduce of ``B`` bytes moves ``2 (tp-1)/tp x B`` per rank in each
direction; time = that / (``nvlink_gbps / 2`` x ``comm_efficiency``) + ``comm_latency_us``. ``nvlink_gbps`` is the
datasheet figure for both directions together, so one direction gets half (450 GB/s on H100/H200). The default
``comm_efficiency`` 0.8 and latency 0 are assumptions, not measurements (no multi-GPU machine was used to
calibrate them); NVLink SHARP (NVLS) all-reduce, which can beat a ring, is not modelled.

Not modelled: kernel-launch gaps between ops beyond the per-op floor, CPU scheduling, sampling, the MTP layer.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ._validate import check_int
from .arch import GPUArch, get_arch
from .buffers import STRATEGIES, padded_num_heads
from .costmodel import Calibration, attention_path_ms, attention_path_ops, default_calibration
from .models import ModelConfig, load_model, normalize_kv_cache_dtype
from .workload import Step, sum_topk_lengths

__all__ = [
    "LayerOp", "StepStats", "ClassEff", "OpsCalibration", "OP_CLASSES", "COMM_CLASSES", "WEIGHT_DTYPES",
    "step_stats", "layer_ops", "step_ops", "op_time_ms", "comm_time_ms", "layer_time_ms", "step_time_ms",
    "default_ops_calibration", "load_ops_calibration", "fit_calibration", "write_calibration_csv",
    "weights_bytes_per_rank", "activation_peak_bytes", "predict_measured_op_ms", "OVERHEAD_MODES",
]

BF16 = 2
FP32 = 4
WEIGHT_DTYPES = {"bf16": 2, "fp8": 1}
#: Classes priced by the roofline-with-floor formula. Attention-path ops use costmodel ("attn_<op>").
OP_CLASSES = ("gemm", "gemm_fp8", "moe_gemm", "moe_gemm_fp8", "bmm", "norm", "elementwise", "indexer_logits",
              "topk", "reduce")
COMM_CLASSES = ("allreduce", "all_to_all", "allgather")
ATTN_OPS = ("concat", "pad", "kernel", "out_slice")
MOE_PARALLEL = ("tp", "ep")
EP_COMM = ("all_reduce", "all_to_all")
LAYER_KINDS = ("moe", "dense")
FP8_PEAK_FACTOR = 2.0  # dense fp8 / dense bf16 tensor rate on Hopper and Blackwell datasheets (H200 1979/989)
_CAL_DIR = Path(__file__).resolve().parent.parent / "data" / "calibration"


def _err(name, value, allowed) -> ValueError:
    return ValueError(f"{name}={value!r} is not valid; allowed: {allowed}")


_pos_int = check_int


# ------------------------------------------------------------------------------------------------------ ops


@dataclass(frozen=True)
class LayerOp:
    """One op of a layer (or of the step) on one rank.

    Attributes:
        name: op name (``q_a_proj``...); op_class: efficiency class (:data:`OP_CLASSES`, ``attn_<op>`` for the
            attention path, or a :data:`COMM_CLASSES` entry).
        flops: floating-point operations; weight_bytes / act_bytes: bytes of weights and of activations read plus
            written; comm_bytes: for comm ops, the message size (bytes each rank holds before the collective).
        dims: the per-rank shape (``M``, ``K``, ``N``, ``B`` ...), used by the benchmark to run the op.
        impl: how ``benchmarks/bench_layer.py`` measures the op (None: modelled only, never measured).
        dtype: compute dtype of the op (``bf16``/``fp8``).
    """

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
    """What a step's shape means for the attention and the indexer.

    Attributes:
        num_tokens: T. sum_topk: sparse-attention keys summed over the step's tokens (FlashMLA ``topk_length``).
        sum_visible: keys visible to the indexer summed over tokens (token at position p sees ``min(p+1, context)``).
        keys_read: indexer keys read, one pass per chunk over its ``start + n`` visible keys (capped by context).
        num_seqs: chunks (requests) in the step: the LM head rows.
    """

    num_tokens: int
    sum_topk: int
    sum_visible: int
    keys_read: int
    num_seqs: int


def step_stats(model: ModelConfig, step: Step | int, causal: bool = True, context: int | None = None) -> StepStats:
    """Token counts of a step.

    ``step`` a :class:`~mla_lab.workload.Step`: each chunk ``(pid, start, n)`` contributes ``sum min(p+1, topk)``
    attention keys (``causal``; else ``n * topk``) and ``sum min(p+1, context)`` indexer keys over its positions.
    ``step`` an int T: the benchmark's synthetic step — the sparse kernel at full topk for every token (as
    :func:`mla_lab.costmodel.attention_path_ms` does for an int) and the indexer over one causal prompt of T tokens.

    Raises:
        ValueError: T not a non-negative int, context not a positive int.
    """
    if context is not None:
        _pos_int("context", context)
    big = context if context is not None else 1 << 62
    if isinstance(step, Step):
        T = step.num_tokens
        st = sum(sum_topk_lengths(s, n, model.topk) if causal else n * model.topk for _, s, n in step.chunks)
        sv = sum(sum_topk_lengths(s, n, big) for _, s, n in step.chunks)
        kr = sum(min(s + n, big) for _, s, n in step.chunks)
        return StepStats(T, st, sv, kr, len(step.chunks))
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"step={step!r} must be a Step or a non-negative int token count")
    T = _pos_int("step", step, allow_zero=True)
    return StepStats(T, T * model.topk, sum_topk_lengths(0, T, big), min(T, big), 1 if T else 0)


def _check_common(model, tp, strategy, weight_dtype, moe_parallel, ep_size, ep_comm, layer_kind):
    if strategy not in STRATEGIES:
        raise _err("strategy", strategy, list(STRATEGIES))
    if weight_dtype not in WEIGHT_DTYPES:
        raise _err("weight_dtype", weight_dtype, list(WEIGHT_DTYPES))
    if moe_parallel not in MOE_PARALLEL:
        raise _err("moe_parallel", moe_parallel, list(MOE_PARALLEL))
    if ep_comm not in EP_COMM:
        raise _err("ep_comm", ep_comm, list(EP_COMM))
    if layer_kind not in LAYER_KINDS:
        raise _err("layer_kind", layer_kind, list(LAYER_KINDS))
    H = model.heads_per_rank(tp)
    ep = tp if ep_size is None else ep_size
    if moe_parallel == "ep":
        _pos_int("ep_size", ep)
        if model.n_routed_experts % ep:
            divs = [d for d in range(1, model.n_routed_experts + 1) if model.n_routed_experts % d == 0]
            raise ValueError(f"ep_size={ep} does not divide n_routed_experts={model.n_routed_experts}; allowed: {divs}")
    for nm, size in (("intermediate_size", model.intermediate_size),
                     ("moe_intermediate_size", model.moe_intermediate_size)):
        if size % tp:
            raise ValueError(f"tp={tp} does not divide {nm}={size} of model {model.name!r}")
    return H, ep


def layer_ops(
    model: ModelConfig | str,
    tp: int,
    arch: str | GPUArch,
    strategy: str,
    step: Step | int,
    layer_kind: str = "moe",
    kv_cache_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    moe_parallel: str = "tp",
    ep_size: int | None = None,
    ep_comm: str = "all_reduce",
    out_slice_copy: bool = False,
    causal: bool = True,
    context: int | None = None,
    indexer_dtype: str = "bf16",
) -> list[LayerOp]:
    """Every op of one decoder layer on one rank for one step (table in the module docstring).

    Args:
        model: config or name; tp: tensor-parallel size (divides num_attention_heads and the MLP sizes).
        arch: gives the padded head count of the attention path (vLLM rule).
        strategy: ``unfused`` | ``fused`` | ``kernel_native`` (attention path from :mod:`mla_lab.costmodel`).
        step: a :class:`~mla_lab.workload.Step` or a token count (see :func:`step_stats`).
        layer_kind: ``moe`` or ``dense`` (the first ``first_k_dense_replace`` layers).
        kv_cache_dtype: bf16 / fp8 (padding rule, KV-cache write bytes).
        weight_dtype: ``bf16`` (2 B) or ``fp8`` (1 B, fp8 GEMM rate) for the quantized linears.
        moe_parallel: ``tp`` (every expert sharded over TP) or ``ep`` (``ep_size`` ranks hold whole experts,
            default ``ep_size = tp``); ep_comm: ``all_reduce`` (vLLM TP+EP, DP=1) or ``all_to_all``.
        out_slice_copy: keep costmodel's ``out_slice`` op (a ``.contiguous()`` copy of ``out[:, :H]``). Default
            False: vLLM hands the ``[:, :H]`` view to the W_UV bmm, and on the H200 ``torch.bmm`` read that strided
            view with the same cuBLAS kernel, no extra allocation and the same time as a contiguous input
            (``data/measured/h200/layer_extras.csv``, experiment ``w_uv_slice``; docs/ttft-model.md).
        causal, context: as :func:`step_stats`.
        indexer_dtype: ``bf16`` or ``fp8`` q/k of the indexer logits (fp8 at 2x the bf16 rate, 1 B per value).

    Raises:
        ValueError: any argument outside its allowed values (message names it, its value and what is allowed).
    """
    model = load_model(model)
    arch = get_arch(arch)
    H, ep = _check_common(model, tp, strategy, weight_dtype, moe_parallel, ep_size, ep_comm, layer_kind)
    if indexer_dtype not in ("bf16", "fp8"):
        raise _err("indexer_dtype", indexer_dtype, ["bf16", "fp8"])
    kvd = normalize_kv_cache_dtype(kv_cache_dtype)
    ss = step_stats(model, step, causal, context)
    T = ss.num_tokens
    wb = WEIGHT_DTYPES[weight_dtype]
    wd = weight_dtype
    h, qr, kr = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    nih, dih = model.index_n_heads, model.index_head_dim
    ops: list[LayerOp] = [
        _norm("input_norm", T, h, True),
        _gemm("q_a_proj", T, h, qr, wb, wd),
        _norm("q_a_norm", T, qr, False),
        _gemm("q_b_proj", T, qr, H * (dn + dr), wb, wd),
        _gemm("kv_a_proj", T, h, kr + dr, wb, wd),
        _norm("kv_a_norm", T, kr, False),
        LayerOp("rope_cache", "elementwise",
                act_bytes=(2 * T * H * dr + T * (kr + dr)) * BF16
                + T * model.kv_cache_bytes_per_token_layer(kvd, include_indexer=False),
                dims={"T": T, "H": H}, impl=None),
        LayerOp("w_uk_bmm", "bmm", flops=2.0 * H * T * dn * kr, weight_bytes=H * dn * kr * BF16,
                act_bytes=(T * H * dn + T * H * kr) * BF16, dims={"B": H, "M": T, "K": dn, "N": kr}, impl="bmm_uk"),
        _gemm("idx_wq_b", T, qr, nih * dih, wb, wd),
        _gemm("idx_wk", T, h, dih, wb, wd),
        _gemm("idx_weights_proj", T, h, nih, BF16, "bf16"),
        LayerOp("idx_prep", "elementwise",
                act_bytes=T * nih * dih * (BF16 + 1) + T * dih * (BF16 + 1) + T * (dih + FP32 * math.ceil(dih / 128)),
                dims={"T": T}, impl=None),
    ]
    ib = BF16 if indexer_dtype == "bf16" else 1
    ops.append(LayerOp(
        "idx_logits", "indexer_logits", flops=2.0 * ss.sum_visible * nih * dih,
        act_bytes=T * nih * dih * ib + ss.keys_read * dih * ib + T * nih * FP32 + ss.sum_visible * FP32,
        dims={"T": T, "NH": nih, "D": dih, "sum_visible": ss.sum_visible, "keys": ss.keys_read},
        impl="mqa_logits", dtype=indexer_dtype))
    ops.append(LayerOp(
        "idx_topk", "topk", act_bytes=ss.sum_visible * FP32 + T * model.topk * FP32,
        dims={"T": T, "keys": ss.keys_read, "k": model.topk}, impl="topk"))
    # attention path: costmodel's work per op (not duplicated here)
    for op, w in attention_path_ops(model, tp, arch, strategy, T, ss.sum_topk, kv_cache_dtype).items():
        if op == "out_slice" and not out_slice_copy:
            continue
        hp = padded_num_heads(H, arch, kv_cache_dtype)
        ops.append(LayerOp(op, f"attn_{op}", flops=w.get("flops", 0.0), act_bytes=w.get("bytes", 0.0),
                           dims={"T": T, "H": H, "Hp": hp, "sum_topk": ss.sum_topk}, impl=f"attn_{op}"))
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
        if tp > 1:
            ops.append(_comm("mlp_allreduce", "allreduce", T * h * BF16))
        return ops
    E, k, im = model.n_routed_experts, model.num_experts_per_tok, model.moe_intermediate_size
    if moe_parallel == "tp":
        e_loc, i_loc, pairs = E, im // tp, T * k
    else:
        e_loc, i_loc, pairs = E // ep, im, T * k / ep
    m_e = pairs / e_loc  # balanced routing: tokens per local expert
    # weights of the local experts that receive at least one token (uniform random routing, expectation)
    touched = e_loc * (1.0 - (1.0 - 1.0 / E) ** (T * k)) if T else 0.0
    mcls = "moe_gemm_fp8" if wd == "fp8" else "moe_gemm"

    def moe_gemm(name, K, N):
        w = K * N * wb + (math.ceil(K / 128) * math.ceil(N / 128) * FP32 if wb == 1 else 0)
        return LayerOp(name, mcls, flops=2.0 * pairs * K * N, weight_bytes=touched * w,
                       act_bytes=pairs * (K + N) * BF16, dims={"E": e_loc, "M": m_e, "K": K, "N": N},
                       impl="moe_bmm", dtype=wd)

    ns_i = model.n_shared_experts * im // tp
    ops += [
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
    if moe_parallel == "ep" and ep_comm == "all_to_all" and ep > 1:
        share = T / ep * k * h * BF16
        ops += [_comm("moe_dispatch", "all_to_all", share), _comm("moe_combine_a2a", "all_to_all", share),
                _comm("moe_allgather", "allgather", T * h * BF16)]
        if tp > 1 and ns_i:
            ops.append(_comm("shared_allreduce", "allreduce", T * h * BF16))
    elif tp > 1:
        ops.append(_comm("moe_allreduce", "allreduce", T * h * BF16))
    return ops


def step_ops(model: ModelConfig | str, tp: int, arch: str | GPUArch, strategy: str, step: Step | int,
             **kw) -> list[tuple[LayerOp, int]]:
    """All ops of one engine step on one rank as ``(op, count)``: the dense layers' ops x first_k_dense_replace,
    the MoE layers' ops x the rest, and the embedding, final norm, LM head and logits gather once.

    Keyword arguments are those of :func:`layer_ops` (``layer_kind`` excluded).
    """
    model = load_model(model)
    if "layer_kind" in kw:
        raise ValueError("layer_kind=... is chosen per layer by step_ops; allowed: omit it")
    ss = step_stats(model, step, kw.get("causal", True), kw.get("context"))
    T, h, V = ss.num_tokens, model.hidden_size, model.vocab_size
    n_dense = min(model.first_k_dense_replace, model.num_hidden_layers)
    n_moe = model.num_hidden_layers - n_dense
    out: list[tuple[LayerOp, int]] = []
    if n_dense:
        out += [(op, n_dense) for op in layer_ops(model, tp, arch, strategy, step, layer_kind="dense", **kw)]
    if n_moe:
        out += [(op, n_moe) for op in layer_ops(model, tp, arch, strategy, step, layer_kind="moe", **kw)]
    if V % tp:
        raise ValueError(f"tp={tp} does not divide vocab_size={V}")
    R = ss.num_seqs
    out += [
        (LayerOp("embedding", "elementwise", act_bytes=T * h * BF16 / tp + T * h * BF16 + T * 8,
                 dims={"T": T, "N": h}, impl=None), 1),
        (_norm("final_norm", T, h, True), 1),
        (_gemm("lm_head", R, h, V // tp, BF16, "bf16"), 1),
    ]
    if tp > 1:
        out += [(_comm("embed_allreduce", "allreduce", T * h * BF16), 1),
                (_comm("logits_gather", "allgather", R * V * FP32), 1)]
    return out


# --------------------------------------------------------------------------------------------- calibration


OVERHEAD_MODES = ("max", "add")


@dataclass(frozen=True)
class ClassEff:
    """Efficiencies of one op class: fraction of peak FLOP/s and of HBM bandwidth, and a per-op overhead (us).

    ``mode`` says how the overhead enters: ``max`` (a floor: ``max(roofline, floor)``) or ``add`` (a fixed launch,
    ramp-up and tail cost on top of the streaming time: ``floor + roofline``); the fit picks, per class, the one
    with the lower error on the measurements.
    """

    eff_flops: float
    eff_bytes: float
    floor_us: float = 0.0
    n: int = 0
    mape_pct: float | None = None
    mode: str = "max"


_DEFAULT_EFF = {
    # First-order guesses used only when no calibration file exists (labelled "uncalibrated-defaults").
    "gemm": ClassEff(0.75, 0.85, 5.0), "gemm_fp8": ClassEff(0.6, 0.85, 5.0),
    "moe_gemm": ClassEff(0.65, 0.8, 5.0), "moe_gemm_fp8": ClassEff(0.5, 0.8, 5.0),
    "bmm": ClassEff(0.6, 0.8, 5.0), "norm": ClassEff(1.0, 0.7, 3.0), "elementwise": ClassEff(1.0, 0.7, 3.0),
    "indexer_logits": ClassEff(0.4, 0.8, 5.0), "topk": ClassEff(1.0, 0.3, 5.0), "reduce": ClassEff(1.0, 0.7, 3.0),
}
#: Classes with no measurement of their own borrow another's efficiencies.
_FALLBACK = {"gemm_fp8": "gemm", "moe_gemm": "gemm", "moe_gemm_fp8": "gemm_fp8", "reduce": "elementwise",
             "bmm": "gemm", "norm": "elementwise", "topk": "elementwise", "indexer_logits": "gemm"}


@dataclass(frozen=True)
class OpsCalibration:
    """Per-class efficiencies (:class:`ClassEff`), the attention-path :class:`~mla_lab.costmodel.Calibration`,
    and the communication assumptions.

    Attributes:
        classes: ``{op_class: ClassEff}``; attention: costmodel calibration for concat/pad/kernel/out_slice.
        comm_efficiency: fraction of per-direction NVLink bandwidth a ring collective reaches (assumption 0.8).
        comm_latency_us: fixed cost per collective (assumption 0).
        name, arch: provenance of the efficiencies (the GPU they were measured on).
    """

    classes: dict
    attention: Calibration
    name: str = "uncalibrated-defaults"
    arch: str = "h200"
    comm_efficiency: float = 0.8
    comm_latency_us: float = 0.0

    def eff(self, op_class: str) -> ClassEff:
        seen = set()
        c = op_class
        while c not in self.classes:
            if c in seen or c not in _FALLBACK:
                raise ValueError(f"calibration {self.name!r} has no efficiency for op_class={op_class!r}; "
                                 f"has {sorted(self.classes)}")
            seen.add(c)
            c = _FALLBACK[c]
        return self.classes[c]

    def with_comm(self, comm_efficiency: float | None = None, comm_latency_us: float | None = None):
        ce = self.comm_efficiency if comm_efficiency is None else comm_efficiency
        cl = self.comm_latency_us if comm_latency_us is None else comm_latency_us
        if not (isinstance(ce, (int, float)) and 0 < ce <= 1):
            raise ValueError(f"comm_efficiency={ce!r} must be a number in (0, 1]")
        if not (isinstance(cl, (int, float)) and cl >= 0):
            raise ValueError(f"comm_latency_us={cl!r} must be a non-negative number")
        return replace(self, comm_efficiency=float(ce), comm_latency_us=float(cl))


def default_ops_calibration() -> OpsCalibration:
    """Uncalibrated first-order efficiencies (no measurement behind them) plus costmodel's default attention
    calibration (FACTS.md s5 H200 timings)."""
    return OpsCalibration(dict(_DEFAULT_EFF), default_calibration(), "uncalibrated-defaults", "h200")


_LOADED: dict = {}


def load_ops_calibration(path: str | Path | None = None) -> OpsCalibration:
    """Read ``data/calibration/h200_ops.csv`` (written by :func:`write_calibration_csv`); classes it lacks keep the
    uncalibrated defaults, attention ops it lacks keep costmodel's default calibration. Without the file (and
    ``path`` None) returns :func:`default_ops_calibration`.

    Raises:
        ValueError: ``path`` given but missing; a row with a non-numeric or non-positive efficiency.
    """
    explicit = path is not None
    path = Path(path) if explicit else _CAL_DIR / "h200_ops.csv"
    if not path.is_file():
        if explicit:
            raise ValueError(f"calibration path={str(path)!r} does not exist")
        return default_ops_calibration()
    key = (str(path), path.stat().st_mtime)
    if key in _LOADED:
        return _LOADED[key]
    classes = dict(_DEFAULT_EFF)
    attn = dict(default_calibration().eff)
    device = "h200"
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                ef, eb, fl = float(r["eff_flops"]), float(r["eff_bytes"]), float(r["floor_us"])
            except (KeyError, ValueError) as e:
                raise ValueError(f"{path}: bad calibration row {r}: {e}") from None
            if ef <= 0 or eb <= 0 or fl < 0:
                raise ValueError(f"{path}: efficiencies must be > 0 and floor >= 0, got row {r}")
            mape = float(r["mape_pct"]) if r.get("mape_pct") not in (None, "", "nan") else None
            if r["kind"] == "attention":
                attn[r["op_class"]] = ef if r["op_class"] == "kernel" else eb
            else:
                mode = r.get("overhead_mode") or "max"
                if mode not in OVERHEAD_MODES:
                    raise ValueError(f"{path}: overhead_mode={mode!r} not valid; allowed: {list(OVERHEAD_MODES)}")
                classes[r["op_class"]] = ClassEff(ef, eb, fl, int(float(r.get("n") or 0)), mape, mode)
            device = r.get("device", device)
    cal = OpsCalibration(classes, Calibration(eff=attn, name=f"{path.name} attention", arch="h200"),
                         f"{path.name} (measured on {device})", "h200")
    _LOADED[key] = cal
    return cal


def _grid_fit(flops, nbytes, ms, peak_f, peak_b, with_floor=True):
    """Minimise mean |pred - meas| / meas over a grid of (eff_flops, eff_bytes, overhead, mode).

    Returns ``(eff_flops, eff_bytes, overhead_us, mape_pct, mode)``; ``mode`` ``max`` (overhead as a floor) or
    ``add`` (overhead added to the roofline time).
    """
    import numpy as np

    F = np.asarray(flops, float)[:, None, None]
    B = np.asarray(nbytes, float)[:, None, None]
    M = np.asarray(ms, float)[:, None, None]
    g = np.geomspace(0.01, 1.5, 91)
    floors = [0.0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50] if with_floor else [0.0]
    tmax = np.maximum(F / (peak_f * g[None, :, None]) * 1e3, B / (peak_b * g[None, None, :]) * 1e3)
    best = (np.inf, 0, 0, 0.0, "max")
    for mode in OVERHEAD_MODES if with_floor else ("max",):
        for fl in floors:
            pred = np.maximum(tmax, fl * 1e-3) if mode == "max" else tmax + fl * 1e-3
            err = np.mean(np.abs(pred - M) / M, axis=0)
            i = np.unravel_index(np.argmin(err), err.shape)
            if err[i] < best[0] - 1e-12:
                best = (float(err[i]), i[0], i[1], fl, mode)
    e, i0, i1, fl, mode = best
    return float(g[i0]), float(g[i1]), float(fl), e * 100, mode


def fit_calibration(rows: list[dict], arch: str | GPUArch = "h200", name: str = "fit") -> tuple[OpsCalibration, list]:
    """Fit per-class efficiencies from measured op rows.

    Each row needs ``op_class``, ``flops``, ``bytes``, ``ms`` (measured median) and, for attention ops
    (``op_class`` ``attn_<op>``), their costmodel work in ``flops`` (kernel) or ``bytes``. Rows with ``ms`` <= 0
    or missing are ignored. Roofline classes get ``(eff_flops, eff_bytes, floor_us)`` minimising the mean absolute
    percentage error (grid search); attention ops one efficiency each (costmodel has no floor). A class whose rows
    are all on one side of the ridge gets the other efficiency from the grid's best tie (it does not matter for
    those rows); use with care outside the measured shapes.

    Returns:
        ``(calibration, report)``: report is a list of dicts ``{kind, op_class, eff_flops, eff_bytes, floor_us, n,
        mape_pct}``.
    """
    arch = get_arch(arch)
    by: dict[str, list] = {}
    for r in rows:
        try:
            ms = float(r["ms"])
        except (KeyError, TypeError, ValueError):
            continue
        if not ms > 0:
            continue
        by.setdefault(r["op_class"], []).append((float(r.get("flops") or 0), float(r.get("bytes") or 0), ms,
                                                  r.get("dtype", "bf16")))
    classes = dict(_DEFAULT_EFF)
    attn = dict(default_calibration().eff)
    report = []
    for cls, rs in sorted(by.items()):
        F = [x[0] for x in rs]
        B = [x[1] for x in rs]
        M = [x[2] for x in rs]
        fp8 = rs[0][3] == "fp8"
        peak_f = arch.bf16_tflops * 1e12 * (FP8_PEAK_FACTOR if fp8 else 1.0)
        peak_b = arch.hbm_gbps * 1e9
        if cls.startswith("attn_"):
            op = cls[5:]
            if op == "kernel":
                ef, _, _, mape, _ = _grid_fit(F, [0.0] * len(F), M, peak_f, peak_b, with_floor=False)
                eb = 1.0
            else:
                _, eb, _, mape, _ = _grid_fit([0.0] * len(B), B, M, peak_f, peak_b, with_floor=False)
                ef = 1.0
            attn[op] = ef if op == "kernel" else eb
            report.append({"kind": "attention", "op_class": op, "eff_flops": ef, "eff_bytes": eb, "floor_us": 0.0,
                           "overhead_mode": "max", "n": len(rs), "mape_pct": mape})
            continue
        if cls in COMM_CLASSES:
            continue
        ef, eb, fl, mape, mode = _grid_fit(F, B, M, peak_f, peak_b)
        classes[cls] = ClassEff(ef, eb, fl, len(rs), mape, mode)
        report.append({"kind": "class", "op_class": cls, "eff_flops": ef, "eff_bytes": eb, "floor_us": fl,
                       "overhead_mode": mode, "n": len(rs), "mape_pct": mape})
    cal = OpsCalibration(classes, Calibration(eff=attn, name=f"{name} attention", arch=arch.name), name, arch.name)
    return cal, report


def write_calibration_csv(report: list[dict], path: str | Path, provenance_cols: dict) -> None:
    """Write the fit report with provenance columns (one row per class / attention op)."""
    cols = ["kind", "op_class", "eff_flops", "eff_bytes", "floor_us", "overhead_mode", "n", "mape_pct"] + \
        list(provenance_cols)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in report:
            w.writerow({**r, **provenance_cols})


# ---------------------------------------------------------------------------------------------------- time


def op_time_ms(op: LayerOp, arch: str | GPUArch, calibration: OpsCalibration | None = None, tp: int = 1) -> float:
    """Modelled time of one op (ms). Comm ops need ``tp``; attention ops are priced by costmodel's formula with the
    calibration's attention efficiencies (same result as :func:`mla_lab.costmodel.attention_path_ms`)."""
    cal = calibration or load_ops_calibration()
    arch = get_arch(arch)
    if op.is_comm:
        return comm_time_ms(op.op_class, op.comm_bytes, tp, arch, cal)
    if op.op_class.startswith("attn_"):
        a = op.op_class[5:]
        if op.flops:
            return op.flops / (arch.bf16_tflops * 1e12 * cal.attention.get(a)) * 1e3
        return op.bytes / (arch.hbm_gbps * 1e9 * cal.attention.get(a)) * 1e3
    e = cal.eff(op.op_class)
    peak = arch.bf16_tflops * 1e12 * (FP8_PEAK_FACTOR if op.dtype == "fp8" else 1.0)
    t = max(op.flops / (peak * e.eff_flops), op.bytes / (arch.hbm_gbps * 1e9 * e.eff_bytes)) * 1e3
    if not (op.flops or op.bytes):
        return 0.0
    return t + e.floor_us * 1e-3 if e.mode == "add" else max(t, e.floor_us * 1e-3)


def comm_time_ms(kind: str, nbytes: float, tp: int, arch: str | GPUArch, calibration: OpsCalibration | None = None,
                 group: int | None = None) -> float:
    """Time (ms) of a collective over ``group`` ranks (default ``tp``) on NVLink.

    - ``allreduce`` (ring): each rank sends and receives ``2 (n-1)/n x nbytes``.
    - ``allgather`` (ring): ``(n-1)/n x nbytes`` (``nbytes`` is the gathered size).
    - ``all_to_all``: ``nbytes`` is what one rank sends (already the remote share).
    Bandwidth per direction = ``nvlink_gbps / 2`` x ``comm_efficiency``; plus ``comm_latency_us`` when n > 1.
    """
    cal = calibration or load_ops_calibration()
    arch = get_arch(arch)
    n = tp if group is None else group
    _pos_int("tp", n)
    if n == 1 or nbytes <= 0:
        return 0.0
    if kind == "allreduce":
        moved = 2.0 * (n - 1) / n * nbytes
    elif kind == "allgather":
        moved = (n - 1) / n * nbytes
    elif kind == "all_to_all":
        moved = nbytes
    else:
        raise _err("kind", kind, list(COMM_CLASSES))
    bw = arch.nvlink_gbps / 2 * 1e9 * cal.comm_efficiency
    return moved / bw * 1e3 + cal.comm_latency_us * 1e-3


def _resolve_cal(calibration) -> OpsCalibration:
    if calibration is None:
        return load_ops_calibration()
    if isinstance(calibration, OpsCalibration):
        return calibration
    if isinstance(calibration, Calibration):
        return replace(load_ops_calibration(), attention=calibration)
    raise ValueError(f"calibration={calibration!r} must be an OpsCalibration, a costmodel Calibration or None")


def layer_time_ms(model, tp, arch, strategy, step, calibration=None, **kw) -> dict:
    """Modelled ms per op of one layer (``{op: ms}``) plus ``total``, ``attention_path`` (the costmodel ops) and
    ``comm``. Keyword arguments as :func:`layer_ops`."""
    cal = _resolve_cal(calibration)
    model = load_model(model)
    out: dict = {}
    comm = 0.0
    for op in layer_ops(model, tp, arch, strategy, step, **kw):
        out[op.name] = op_time_ms(op, arch, cal, tp)
        comm += out[op.name] if op.is_comm else 0.0
    _check_attention_consistency(model, tp, arch, strategy, step, kw, cal, out)
    total = sum(out.values())
    out["attention_path"] = sum(out.get(a, 0.0) for a in ATTN_OPS)
    out["comm"] = comm
    out["total"] = total
    return out


def _check_attention_consistency(model, tp, arch, strategy, step, kw, cal, out):
    """The attention ops priced here must equal costmodel.attention_path_ms (guards against drift)."""
    if not kw.get("out_slice_copy", False):
        return
    ref = attention_path_ms(model, tp, arch, strategy, step if isinstance(step, Step) else int(step),
                            kw.get("kv_cache_dtype", "bf16"), cal.attention, kw.get("causal", True))
    for a in ATTN_OPS:
        if a in ref and abs(ref[a] - out.get(a, 0.0)) > 1e-9 * max(1.0, ref[a]):
            raise AssertionError(f"attention op {a}: layer_model {out.get(a)} != costmodel {ref[a]}")


def step_time_ms(model, tp, arch, strategy, step, calibration=None, **kw) -> dict:
    """Modelled ms of one engine step on one rank, all layers: ``total``, ``by_op`` (ms summed over layers),
    ``attention_path``, ``comm``. Keyword arguments as :func:`layer_ops`."""
    cal = _resolve_cal(calibration)
    model = load_model(model)
    by: dict = {}
    comm = 0.0
    for op, count in step_ops(model, tp, arch, strategy, step, **kw):
        t = op_time_ms(op, arch, cal, tp) * count
        by[op.name] = by.get(op.name, 0.0) + t
        comm += t if op.is_comm else 0.0
    attn = sum(by.get(a, 0.0) for a in ATTN_OPS)
    return {"total": sum(by.values()), "by_op": by, "attention_path": attn, "comm": comm}


def predict_measured_op_ms(row: dict, arch: str | GPUArch, calibration: OpsCalibration | None = None) -> float:
    """Model prediction for a measured op row (``op_class``, ``flops``, ``bytes``, ``dtype``)."""
    op = LayerOp(row.get("op", "?"), row["op_class"], flops=float(row.get("flops") or 0),
                 act_bytes=float(row.get("bytes") or 0), dtype=row.get("dtype") or "bf16")
    return op_time_ms(op, arch, calibration)


# -------------------------------------------------------------------------------------------------- memory


def weights_bytes_per_rank(model: ModelConfig | str, tp: int, weight_dtype: str = "bf16", moe_parallel: str = "tp",
                           ep_size: int | None = None) -> int:
    """Estimated weight bytes one rank holds (vLLM layout).

    Counted from the config: per layer q_a, q_b (1/tp), kv_a, kv_b (1/tp; plus vLLM's bf16 W_UK/W_UV copies),
    o_proj (1/tp), the indexer (wq_b, wk, weights_proj; replicated), norms; dense MLP (1/tp) or router + experts
    (1/tp each under TP; ``E/ep`` whole experts under EP) + shared experts (1/tp); embedding and LM head (1/tp each).
    Linears in ``weight_dtype`` (fp8: 1 B + fp32 scale per 128x128 block); norms, router, embedding, LM head,
    ``idx_weights_proj`` and the W_UK/W_UV copies bf16. The MTP layer is not counted (vLLM loads it only for
    speculative decoding).
    """
    model = load_model(model)
    H, ep = _check_common(model, tp, "fused", weight_dtype, moe_parallel, ep_size, "all_reduce", "moe")
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


def activation_peak_bytes(model: ModelConfig | str, tp: int, max_num_batched_tokens: int,
                          moe_parallel: str = "tp", ep_size: int | None = None) -> int:
    """Rough peak of transient activations in a profile run at ``max_num_batched_tokens`` (what vLLM's memory
    profiling subtracts before sizing the KV cache), taken as the fused-MoE intermediate caches
    ``T x k x (2 I_loc + I_loc + h)`` bf16 plus four ``T x h`` bf16 hidden/residual buffers. An estimate, not a
    measurement; the attention-path buffers of each strategy are accounted separately (buffers.memory_account)."""
    model = load_model(model)
    H, ep = _check_common(model, tp, "fused", "bf16", moe_parallel, ep_size, "all_reduce", "moe")
    T = _pos_int("max_num_batched_tokens", max_num_batched_tokens)
    k, h = model.num_experts_per_tok, model.hidden_size
    i_loc = model.moe_intermediate_size // tp if moe_parallel == "tp" else model.moe_intermediate_size
    return int(T * k * (3 * i_loc + h) * BF16 + 4 * T * h * BF16)
