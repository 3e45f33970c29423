"""Route timing on one rank (modelled): explicit routes priced by the one cost model, by prompt length, the
masked-MHA crossover, and the model against the committed H200 route rows.

Kernel models (:data:`KERNEL_MODELS`): ``roofline`` (FLOPs + per-token bytes) or ``calibrated`` (FLOP-only).
"""

from __future__ import annotations

from dataclasses import replace

from .._validate import check_int
from ..arch import GPUArch, get_arch
from ..rank import RankView
from ..routes import ROUTES
from ..workload import Step
from .calibration import Calibration, resolve_calibration
from .ops import ATTN_OPS, LayerOp, layer_ops
from .route_ops import (
    ROUTE_ATTN_OPS,
    PaddedKernelFit,
    default_padded_kernel_fit,
    prompt_len_step,
    route_layer_ops,
    route_rows,
    route_rows_rank,
)
from .timing import apply_step_content, op_time_ms

KERNEL_MODELS = ("roofline", "calibrated")


def route_op_time_ms(op: LayerOp, arch: GPUArch, calibration: Calibration | None = None, tp: int = 1,
                     kernel_fit: PaddedKernelFit | None = None, kernel_model: str = "roofline") -> float:
    """:func:`mla_lab.model.timing.op_time_ms`, except the ``kernel`` op under ``kernel_fit`` (roofline) or
    ``kernel_model="calibrated"`` (FLOP-only). Raises ValueError: kernel_model not in :data:`KERNEL_MODELS`."""
    if kernel_model not in KERNEL_MODELS:
        raise ValueError(f"kernel_model={kernel_model!r} is not valid; allowed: {list(KERNEL_MODELS)}")
    cal = resolve_calibration(calibration)
    if op.op_class == "attn_kernel":
        d = op.dims
        if kernel_model == "calibrated":
            flop_only = cal.attention.get("kernel_flop_only", cal.attention_eff("kernel"))
            return op_time_ms(replace(op, act_bytes=0.0), arch, cal.with_attention(kernel=flop_only), tp)
        if kernel_fit is not None:
            t = kernel_fit.time_ms(d["T"], d["Hp"], d["sum_topk"], H_out=d["H"] if d.get("native") else None,
                                   arch=arch.name)
            if d.get("content") == "stale" and cal.content is not None and cal.step_content() is None:
                t *= cal.content.factor(d["H"], d["Hp"], t)  # kernel-only scope (step scope: apply_step_content)
            return t
    return op_time_ms(op, arch, cal, tp)


def route_layer_time_ms(rank: RankView, route: str, step: Step | int, strategy: str = "private_workspace",
                        calibration: Calibration | None = None, kernel_fit: PaddedKernelFit | None = None,
                        kernel_model: str = "roofline", **kw) -> dict:
    """``{op: ms}`` of one layer on ``route`` plus ``total``, ``attention`` (the route's attention ops) and ``comm``.
    Keywords as :func:`mla_lab.model.ops.layer_ops`."""
    out: dict = {}
    cal = resolve_calibration(calibration)
    ops = list(route_layer_ops(rank, route, step, strategy, **kw))
    for op in ops:
        out[op.name] = route_op_time_ms(op, rank.arch, cal, rank.tp, kernel_fit, kernel_model)
    apply_step_content(out, ops, cal)  # stale padded heads over the layer (content_scope "step")
    comm = sum(out[op.name] for op in ops if op.is_comm)
    att = set(ATTN_OPS) | set(ROUTE_ATTN_OPS)
    out["attention"] = sum(v for k, v in out.items() if k in att)
    out["comm"] = comm
    out["total"] = sum(v for k, v in out.items() if k not in ("attention", "comm"))
    return out


def crossover_prompt_len(rank: RankView, route: str = "mha-masked", against: str = "sparse-mqa", lo: int = 1024,
                         hi: int = 1 << 20, strategy: str = "private_workspace", what: str = "attention",
                         calibration: Calibration | None = None, **kw) -> int | None:
    """The shortest prompt length in ``[lo, hi]`` where ``against`` beats ``route`` (``what``: ``attention`` /
    ``total`` of one layer of :func:`prompt_len_step`), by bisection; None if never.
    Raises ValueError: unknown route or ``what``; ``lo >= hi``."""
    for name, r in (("route", route), ("against", against)):
        if r not in ROUTES:
            raise ValueError(f"{name}={r!r} is not valid; allowed: {list(ROUTES)}")
    if what not in ("attention", "total"):
        raise ValueError(f"what={what!r} is not valid; allowed: ['attention', 'total']")
    check_int("lo", lo)
    check_int("hi", hi)
    if lo >= hi:
        raise ValueError(f"lo={lo} must be below hi={hi}")

    def margin(L: int) -> float:
        step = prompt_len_step(L, rank.max_num_batched_tokens)
        a = route_layer_time_ms(rank, route, step, strategy, calibration, **kw)[what]
        b = route_layer_time_ms(rank, against, step, strategy, calibration, **kw)[what]
        return a - b  # > 0: `against` wins

    if margin(lo) > 0:
        return lo
    if margin(hi) <= 0:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if margin(mid) > 0 else (mid, hi)
    return hi


def validate_routes(rows: list[dict] | None = None, kernel_fit: PaddedKernelFit | None = None) -> list[dict]:
    """``[{model, prompt_len, what, measured_ms, modelled_ms, err_pct}]``: the model against the committed H200
    route rows (out of the padded-kernel fit)."""
    rows = route_rows() if rows is None else rows
    kernel_fit = kernel_fit or default_padded_kernel_fit()
    meas = {(r["model"], r["route"], r["prompt_len"]): r["ms"] for r in rows}
    arch = get_arch("h200")
    out = []
    for (mn, route, L), ms in sorted(meas.items()):
        if route != "mqa_kernel_only:private_workspace":
            continue
        step = prompt_len_step(L, next(r["T"] for r in rows if r["model"] == mn and r["prompt_len"] == L))
        ops = {o.name: o for o in layer_ops(route_rows_rank(mn), "private_workspace", step)}
        t = {km: route_op_time_ms(ops["concat"], arch) + route_op_time_ms(ops["kernel"], arch, None, 8, kernel_fit, km)
             for km in KERNEL_MODELS}
        bmm = route_op_time_ms(ops["w_uk_bmm"], arch) + route_op_time_ms(ops["w_uv_bmm"], arch)
        cases = [("mqa_kernel_only roofline", ms, t["roofline"]), ("mqa_kernel_only calibrated", ms, t["calibrated"])]
        full = meas.get((mn, "mqa:private_workspace", L))
        if full is not None:
            cases.append(("mqa roofline", full, t["roofline"] + bmm))
        for what, mm, mod in cases:
            out.append({"model": mn, "prompt_len": L, "what": what, "measured_ms": mm, "modelled_ms": mod,
                        "err_pct": 100 * (mod / mm - 1)})
    return out
