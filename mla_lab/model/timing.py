"""Modelled time of ops, layers and steps: the lab's one roofline and its one collective model (docs/ttft-model.md).

An op: ``max(FLOPs / (peak x eff_flops), bytes / (HBM x eff_bytes))`` with the class's overhead as a floor
(``max``) or added (``add``); peaks from the GPU record (fp8 GEMMs x :data:`~mla_lab.model.ops.FP8_PEAK_FACTOR`).
Collectives: :func:`comm_time_ms`. Layer and step functions take a checked :class:`~mla_lab.rank.RankView` first.
"""

from __future__ import annotations

from .._validate import check_int
from ..arch import GPUArch, get_arch
from ..placement import Strategy, as_strategy
from ..rank import RankView
from ..workload import Step
from .calibration import COMM_CLASSES, Calibration, ClassEff, resolve_calibration
from .fa3_kernel import GPU as FA3_RATIO_GPU
from .fa3_kernel import load_fa3_ratio
from .ops import ATTN_OPS, FP8_PEAK_FACTOR, LayerOp, step_stats
from .packed_kernel import FIT_GPU as PACKED_FIT_GPU
from .route_ops import ROUTE_ATTN_OPS, default_padded_kernel_fit, route_layer_ops, route_step_ops, step_route


def op_time_ms(op: LayerOp, arch: GPUArch, calibration: Calibration | None = None, tp: int = 1) -> float:
    """Modelled ms of one op (comm ops: :func:`comm_time_ms` over ``tp``)."""
    cal = resolve_calibration(calibration)
    if op.is_comm:
        return comm_time_ms(op.op_class, op.comm_bytes, tp, arch, cal)
    return _op_ms(op, arch, cal, tp)


def _op_ms(op: LayerOp, arch: GPUArch, cal: Calibration, tp: int) -> float:
    """:func:`op_time_ms` unchecked, ``cal`` resolved."""
    if op.is_comm:
        return _comm_ms(op.op_class, op.comm_bytes, tp, arch, cal)
    if op.op_class == "attn_chunk_overhead":
        # per extra chunk its measured cost (eager or graphed); per extra consumer launch the bmm overhead
        per_chunk = cal.attention_eff("graph_chunk_overhead_us" if op.dims.get("graphed") else "chunk_overhead_us")
        return (op.dims.get("chunks", 0) * per_chunk
                + op.dims.get("consumer_launches", 0) * cal.eff("bmm").floor_us) * 1e-3
    if not (op.flops or op.bytes):
        return 0.0
    if op.op_class.startswith("attn_"):
        return _attention_ms(op, arch, cal)
    e = _class_eff(cal, op.op_class)
    peak = arch.bf16_tflops * 1e12 * (FP8_PEAK_FACTOR if op.dtype == "fp8" else 1.0)
    t = max(op.flops / (peak * e.eff_flops), op.bytes / (arch.hbm_gbps * 1e9 * e.eff_bytes)) * 1e3
    return t + e.floor_us * 1e-3 if e.mode == "add" else max(t, e.floor_us * 1e-3)


def _class_eff(cal: Calibration, op_class: str):
    """The class's efficiencies; uncalibrated ``k_concat`` as ``elementwise``, ``mha_attn`` ASSUMED at the sparse
    kernel's fraction of peak with ``gemm``'s bytes and overhead."""
    if op_class == "k_concat" and op_class not in cal.classes:
        return cal.eff("elementwise")
    if op_class == "mha_attn" and op_class not in cal.classes:
        g = cal.eff("gemm")
        return ClassEff(cal.attention_eff("kernel"), g.eff_bytes, g.floor_us, 0, None, g.mode)
    return cal.eff(op_class)


def kernel_rate_tflops(arch: GPUArch, calibration: Calibration) -> tuple[float, str]:
    """``(TFLOP/s, source)`` of the sparse kernel: FlashMLA README's rate where the record has one, else calibrated."""
    if arch.sparse_prefill_tflops:
        return arch.sparse_prefill_tflops, f"FlashMLA README {arch.name.upper()} figure"
    return arch.bf16_tflops * calibration.attention_eff("kernel"), f"calibrated ({calibration.name})"


def _attention_ms(op: LayerOp, arch: GPUArch, cal: Calibration) -> float:
    name = op.op_class[5:]
    if name == "kernel":
        rate, _ = kernel_rate_tflops(arch, cal)
        if op.impl == "attn_packed":  # the packed kernel's H200 fit x the H200's kernel rate over this GPU's
            return op.dims["packed_ms"] * kernel_rate_tflops(get_arch(PACKED_FIT_GPU), cal)[0] / rate
        t = op.flops / (rate * 1e12) * 1e3
        if op.impl == "attn_fa3_sparse" and arch.name == FA3_RATIO_GPU and "kernel_bytes" not in cal.attention:
            r = load_fa3_ratio()
            if r is not None:  # the padded kernel's time x vLLM 0.33.0's FA3 / its padded FlashMLA (model.fa3_kernel)
                return t * r.ratio(op.dims["H"], op.dims["sum_topk"] / max(1, op.dims["T"]))
        if op.act_bytes and "kernel_bytes" in cal.attention:
            t += op.act_bytes / (arch.hbm_gbps * 1e9 * cal.attention["kernel_bytes"]) * 1e3
        elif op.dims.get("native") and t > 0:
            # FLOP-only calibration: a real-head kernel = padded time x the roofline's native / padded ratio
            t *= _native_ratio(op.dims)
        if op.dims.get("content") == "stale" and cal.content is not None and cal.step_content() is None:
            t *= cal.content.factor(op.dims["H"], op.dims["Hp"], t)  # kernel-only scope (step scope: _step_content)
        return t
    return op.bytes / (arch.hbm_gbps * 1e9 * cal.attention_eff(name)) * 1e3


def _native_ratio(d: dict) -> float:
    """Roofline time at the real heads' per-token bytes over the padded kernel's (1.0 without the rows)."""
    try:
        fit = default_padded_kernel_fit()
    except ValueError:
        return 1.0
    padded = fit.time_ms(d["T"], d["Hp"], d["sum_topk"])
    return fit.time_ms(d["T"], d["Hp"], d["sum_topk"], H_out=d["H"]) / padded if padded > 0 else 1.0


def comm_time_ms(kind: str, nbytes: float, tp: int, arch: GPUArch, calibration: Calibration | None = None,
                 group: int | None = None) -> float:
    """Time (ms) of a collective over ``group`` ranks (default ``tp``): the measured fit of that world size
    (:mod:`mla_lab.model.comm`) in its range, else a ring moving ``2 (n-1)/n x nbytes`` (allgather ``(n-1)/n``,
    all_to_all ``nbytes``) at ``nvlink_gbps / 2 x comm_efficiency`` (0.8, assumed) + latency.
    Raises ValueError: group not a positive int; unknown kind."""
    cal = resolve_calibration(calibration)
    n = tp if group is None else group
    check_int("tp", n)
    if kind not in COMM_CLASSES:
        raise ValueError(f"kind={kind!r} is not valid; allowed: {list(COMM_CLASSES)}")
    return _comm_ms(kind, nbytes, n, arch, cal)


def _comm_ms(kind: str, nbytes: float, n: int, arch: GPUArch, cal: Calibration) -> float:
    """:func:`comm_time_ms` unchecked."""
    if n == 1 or nbytes <= 0:
        return 0.0
    fit = cal.comm_fit(n, nbytes, kind, arch)
    if fit is not None:
        return fit.time_ms(nbytes)
    moved = {"allreduce": 2.0 * (n - 1) / n * nbytes, "allgather": (n - 1) / n * nbytes,
             "all_to_all": nbytes}[kind]
    bw = arch.nvlink_gbps / 2 * 1e9 * cal.comm_efficiency
    small = cal.comm_small_latency_us if kind == "allreduce" and nbytes < cal.comm_small_max_bytes else 0.0
    return moved / bw * 1e3 + (cal.comm_latency_us + small) * 1e-3


def attention_path_ms(rank: RankView, strategy: Strategy | str, step: Step | int,
                      calibration: Calibration | None = None, causal: bool = True) -> dict:
    """Modelled ms per attention-path op and ``total`` for one layer, one rank, one step (an int: full topk)."""
    ss = step_stats(rank.model, step, causal)
    cal, st = resolve_calibration(calibration), as_strategy(strategy)
    out = {op.name: _op_ms(op, rank.arch, cal, 1) for op in st.kind.price(rank, st, ss.num_tokens, ss.sum_topk, step)}
    out["total"] = sum(out.values())
    return out


def layer_time_ms(rank: RankView, strategy: Strategy | str, step: Step | int,
                  calibration: Calibration | None = None, **kw) -> dict:
    """Modelled ``{op: ms}`` of one layer on the strategy's route, plus ``total``, ``attention_path``, ``comm``,
    ``route``, ``content`` (:func:`apply_step_content`). Keywords as :func:`~mla_lab.model.ops.layer_ops`."""
    route = step_route(rank.model, strategy, step)
    r = _priced(rank, [(op, 1) for op in route_layer_ops(rank, route, step, strategy, **kw)], calibration)
    return {**r.pop("by_op"), **r, "route": route}


def step_time_ms(rank: RankView, strategy: Strategy | str, step: Step | int,
                 calibration: Calibration | None = None, **kw) -> dict:
    """Modelled ms of one engine step, all layers: ``total``, ``by_op``, ``attention_path``, ``comm``, ``route``,
    ``content``. Keywords as :func:`~mla_lab.model.ops.layer_ops`."""
    route = step_route(rank.model, strategy, step)
    return {**_priced(rank, route_step_ops(rank, route, strategy, step, **kw), calibration), "route": route}


def _priced(rank: RankView, pairs, calibration) -> dict:
    """``{total, by_op, attention_path, comm, content}`` of ``(op, count)`` pairs on the rank (tp checked at its
    door), stale padded heads applied (:func:`apply_step_content`)."""
    cal, by = resolve_calibration(calibration), {}
    for op, count in pairs:
        by[op.name] = by.get(op.name, 0.0) + _op_ms(op, rank.arch, cal, rank.tp) * count
    content = apply_step_content(by, [op for op, _ in pairs], cal)
    comm = sum(by[name] for name in {op.name for op, _ in pairs if op.is_comm})
    attn = sum(by.get(a, 0.0) for a in ATTN_OPS + ROUTE_ATTN_OPS)
    return {"total": sum(by.values()), "by_op": by, "attention_path": attn, "comm": comm, "content": content}


def apply_step_content(times: dict, ops, cal: Calibration) -> dict:
    """Scale ``times`` (zero-content ms per op) in place for stale padded heads over the step
    (:class:`~mla_lab.model.content.StepContentModel`). Returns ``{scope (none / kernel / step), share,
    attention_factor, rest_factor}``."""
    stale = next((op for op in ops if op.dims.get("content") == "stale" and op.dims.get("Hp", 0) > op.dims.get("H", 0)),
                 None)
    model = cal.step_content()
    if stale is None or (model is None and cal.content is None):
        return {"scope": "none", "share": 0.0, "attention_factor": 1.0, "rest_factor": 1.0}
    if model is None:
        return {"scope": "kernel", "share": 0.0, "attention_factor": 1.0, "rest_factor": 1.0}
    comm = {op.name for op in ops if op.is_comm}
    compute = sum(t for name, t in times.items() if name not in comm)
    attn = sum(times.get(a, 0.0) for a in ATTN_OPS)
    share = attn / compute if compute > 0 else 0.0
    fa, fr = model.factors(share, stale.dims["H"], stale.dims["Hp"])
    for name in times:
        if name not in comm:
            times[name] *= fa if name in ATTN_OPS else fr
    return {"scope": "step", "share": share, "attention_factor": fa, "rest_factor": fr}


def predict_measured_op_ms(row: dict, arch: GPUArch, calibration: Calibration | None = None) -> float:
    """Model prediction for a measured op row (``op_class``, ``flops``, ``bytes``, ``dtype``)."""
    op = LayerOp(row.get("op", "?"), row["op_class"], flops=float(row.get("flops") or 0),
                 act_bytes=float(row.get("bytes") or 0), dtype=row.get("dtype") or "bf16")
    return op_time_ms(op, arch, calibration)
