"""What each attention route (:mod:`mla_lab.routes`) costs per layer and per step on one rank (modelled;
docs/routes.md). Functions take the rank (:class:`~mla_lab.rank.RankView`) first, as :mod:`mla_lab.model.ops`.

Per rank ``H`` real heads, ``H'`` padded, ``d_qk = d_nope + d_rope``, ``d_v`` (config.json), bf16 2 B. A step of
chunks ``(start, n)``: ``T = sum n``, ``Tk = sum (start + n)``, ``K_c = sum_p (p + 1)``, ``K_s = sum_p min(p + 1,
topk)``. (a) ``mha-dense``; (b) its up-projection (vLLM ``forward_mha``; it drops :data:`DROPPED_BY_DENSE`: vLLM
#51298, SGLang #30258); (c) ``mha-masked`` (vLLM #48770 / #53785; modelled, no kernel run); (d) ``fa3-sparse``;
(e) ``sparse-mqa``, the padded FlashMLA roofline (:class:`PaddedKernelFit`).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from .._validate import check_int
from ..arch import GPUArch, get_arch
from ..deployment import Deployment
from ..models import ModelConfig
from ..paths import calibration_dir, calibration_measurements_dir
from ..placement import Strategy, as_strategy, strategy_route
from ..rank import RankView
from ..routes import ROUTES, check_route
from ..workload import Step, sum_topk_lengths
from .calibration import Calibration, csv_rows, fit_calibration, resolve_calibration
from .ops import ATTN_OPS, BF16, FP32, WEIGHT_DTYPES, LayerOp, _check_options, _gemm, _layer_ops, _step_pairs

#: Absorbed-MLA widths the sparse kernels see: head_size 576 (kv_lora_rank 512 + rope 64) and d_v 512.
D_QK_ABSORBED, D_V_ABSORBED = 576, 512
#: Layer ops the dense MHA routes replace or skip (see the module docstring).
DROPPED_BY_DENSE = ("w_uk_bmm", "w_uv_bmm", "idx_logits", "idx_topk") + ATTN_OPS
MHA_CLASS = "mha_attn"
#: The dense routes' attention ops (beside :data:`mla_lab.model.ops.ATTN_OPS`).
ROUTE_ATTN_OPS = ("kv_b_proj", "k_concat", "mha_attn", "mask")


@dataclass(frozen=True)
class RouteStats:
    """A step's token counts (module docstring), ``mask_bits`` ``sum n (start + n)``, ``max_seq_len``."""

    T: int
    Tk: int
    K_c: int
    K_s: int
    mask_bits: int
    max_seq_len: int


def route_stats(model: ModelConfig, step: Step | int) -> RouteStats:
    """:class:`RouteStats` of a Step (an int T: one fresh prompt). Raises ValueError: T not a positive int."""
    if not isinstance(step, Step):
        T = check_int("step", step)
        step = Step([(0, 0, T)])
    big = 1 << 62
    chunks = step.chunks
    return RouteStats(
        T=sum(n for _, _, n in chunks), Tk=sum(s + n for _, s, n in chunks),
        K_c=sum(sum_topk_lengths(s, n, big) for _, s, n in chunks),
        K_s=sum(sum_topk_lengths(s, n, model.topk) for _, s, n in chunks),
        mask_bits=sum(n * (s + n) for _, s, n in chunks), max_seq_len=max((s + n for _, s, n in chunks), default=0))


def mha_attention_op(rank: RankView, rs: RouteStats) -> LayerOp:
    """(a): FLOPs ``2 H K_c (d_qk + d_v)``; bytes Q ``T H d_qk 2`` + K, V ``Tk H (d_qk + d_v) 2`` + O + lse."""
    model, H = rank.model, rank.num_heads
    dqk = model.qk_nope_head_dim + model.qk_rope_head_dim
    dv = model.v_head_dim
    flops = 2.0 * H * rs.K_c * (dqk + dv)
    act = (rs.T * H * dqk + rs.Tk * H * (dqk + dv) + rs.T * H * dv) * BF16 + rs.T * H * FP32
    return LayerOp("mha_attn", MHA_CLASS, flops=flops, act_bytes=act,
                   dims={"T": rs.T, "Tk": rs.Tk, "H": H, "d_qk": dqk, "d_v": dv, "causal_keys": rs.K_c},
                   impl="flash_attn_varlen causal")


def up_projection_ops(rank: RankView, rs: RouteStats) -> list[LayerOp]:
    """(b): ``kv_b_proj`` ``[Tk, L] @ [L, H (d_nope + d_v)]`` at ``weight_dtype`` and ``k_concat``."""
    model, H, weight_dtype = rank.model, rank.num_heads, rank.weight_dtype
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    proj = _gemm("kv_b_proj", rs.Tk, model.kv_lora_rank, H * (dn + dv), WEIGHT_DTYPES[weight_dtype], weight_dtype)
    cat = LayerOp("k_concat", K_CONCAT_CLASS, act_bytes=(rs.Tk * (H * dn + dr) + rs.Tk * H * (dn + dr)) * BF16,
                  dims={"Tk": rs.Tk, "H": H, "d_nope": dn, "d_rope": dr}, impl="torch.cat k_nope, k_pe")
    return [proj, cat]


def mha_dense_ops(rank: RankView, step: Step | int) -> list[LayerOp]:
    """``kv_b_proj``, ``k_concat``, ``mha_attn``. Raises ValueError: a chunk with ``start + n > topk``."""
    model = rank.model
    rs = route_stats(model, step)
    check_route("mha-dense", model.name, max(rs.max_seq_len, 1), model.topk)
    return up_projection_ops(rank, rs) + [mha_attention_op(rank, rs)]


def padded_kernel_terms(T: int, Hp: int, sum_topk: int, H_out: int | None = None) -> dict:
    """(e): ``flops`` ``2 K_s H' (576+512)``, ``gather_bytes`` ``K_s ceil(H'/64) 1152``, ``q_bytes`` / ``out_bytes``
    / ``tok_bytes`` at ``H_out`` heads (default ``Hp``)."""
    Hq = Hp if H_out is None else H_out
    return {"flops": 2.0 * sum_topk * Hp * (D_QK_ABSORBED + D_V_ABSORBED),
            "gather_bytes": float(sum_topk) * math.ceil(Hp / 64) * D_QK_ABSORBED * BF16,
            "q_bytes": float(T) * Hq * D_QK_ABSORBED * BF16,
            "out_bytes": float(T) * Hq * (D_V_ABSORBED * BF16 + 2 * FP32),
            "tok_bytes": float(T) * Hq * (D_QK_ABSORBED * BF16 + D_V_ABSORBED * BF16 + 2 * FP32)}


@dataclass(frozen=True)
class PaddedKernelFit:
    """``t = flops / (peak eff_flops) + tok_bytes / (HBM eff_bytes)`` on an H200; errors in sample, ``oos``
    ``{source: MAPE %}`` leave-one-file-out, ``flop_only_mape_pct`` the FLOP-only model's."""

    eff_flops: float
    eff_bytes: float
    arch: str
    n: int
    mape_pct: float
    max_err_pct: float
    oos: dict
    flop_only_mape_pct: float
    name: str

    def time_ms(self, T: int, Hp: int, sum_topk: int, H_out: int | None = None, arch=None) -> float:
        """Modelled kernel ms (``H_out`` < ``Hp``: Q and output at ``H_out`` heads only)."""
        a = get_arch(arch or self.arch)
        t = padded_kernel_terms(T, Hp, sum_topk, H_out)
        return float((t["flops"] / (a.bf16_tflops * 1e12 * self.eff_flops)
                      + t["tok_bytes"] / (a.hbm_gbps * 1e9 * self.eff_bytes)) * 1e3)

    def bytes_ms(self, nbytes: float, arch=None) -> float:
        """Time (ms) of ``nbytes`` of the kernel's per-token traffic at the fitted byte efficiency."""
        return nbytes / (get_arch(arch or self.arch).hbm_gbps * 1e9 * self.eff_bytes) * 1e3


def _content_rows(d: Path) -> list[dict]:
    """``round2/content.csv`` zeros / alone rows: the median of the repeats per shape."""
    groups: dict = {}
    for r in csv_rows(d / "round2" / "content.csv"):
        if r.get("content") == "zeros" and r.get("mode") == "alone" and r.get("status") == "ok":
            k = (int(r["T"]), int(r["H"]), int(r["Hp"]), int(r["sum_topk"]))
            groups.setdefault(k, []).append(float(r["ms_median"]))
    return [{"T": T, "H": H, "Hp": Hp, "sum_topk": S, "ms": sorted(v)[len(v) // 2], "source": "round2/content.csv"}
            for (T, H, Hp, S), v in sorted(groups.items())]


def _layer_ops_rows(d: Path) -> list[dict]:
    out = []
    for r in csv_rows(d / "layer_ops.csv"):
        if r.get("op") == "kernel" and r.get("status", "ok") == "ok":
            dims = dict(x.split("=") for x in r["dims"].split(";"))
            out.append({"T": int(dims["T"]), "H": int(dims["H"]), "Hp": int(dims["Hp"]),
                        "sum_topk": int(dims["sum_topk"]), "ms": float(r["ms"]), "source": "layer_ops.csv"})
    return out


def _attention_path_rows(d: Path) -> list[dict]:
    out = []
    for r in csv_rows(d / "attention_path.csv"):
        if r.get("strategy") == "fused":
            T = int(r["T"])
            S = sum_topk_lengths(0, T, 2048) if r["topk_mode"] == "causal" else T * 2048
            out.append({"T": T, "H": int(r["num_heads"]), "Hp": int(r["padded_heads"]), "sum_topk": S,
                        "ms": float(r["kernel_ms"]), "source": "attention_path.csv"})
    return out


def padded_kernel_rows(root: str | Path | None = None) -> list[dict]:
    """The committed H200 FlashMLA kernel rows, zero padded heads, ``{T, H, Hp, sum_topk, ms, source}``: content.csv,
    layer_ops.csv, attention_path.csv and (without ``root``) ``data/calibration/h200_reference.csv``."""
    d = Path(root) if root else calibration_measurements_dir("h200")  # calibration input, not the measured column
    reference = [] if root is not None else [
        {"T": int(r["T"]), "H": int(r["num_heads"]), "Hp": int(r["padded_heads"]),
         "sum_topk": int(r["T"]) * int(r["topk"]), "ms": float(r["ms"]), "source": "h200_reference.csv"}
        for r in csv_rows(calibration_dir() / "h200_reference.csv") if r["op"] == "kernel"]
    return _content_rows(d) + _layer_ops_rows(d) + _attention_path_rows(d) + reference


def _lstsq2(rows, arch: GPUArch):
    """Relative-error least squares of ``ms = x0 * flops + x1 * tok_bytes``; returns (eff_flops, eff_bytes)."""
    import numpy as np

    A = np.array([[padded_kernel_terms(r["T"], r["Hp"], r["sum_topk"])[k] for k in ("flops", "tok_bytes")]
                  for r in rows], float)
    m = np.array([r["ms"] * 1e-3 for r in rows], float)
    x, *_ = np.linalg.lstsq(A / m[:, None], np.ones(len(m)), rcond=None)
    if (x <= 0).any():
        raise ValueError(f"padded-kernel fit gave a non-positive coefficient {x.tolist()}; rows do not span the "
                         "flops and per-token-bytes terms")
    return float(1.0 / (x[0] * arch.bf16_tflops * 1e12)), float(1.0 / (x[1] * arch.hbm_gbps * 1e9))


def fit_padded_kernel(rows: list[dict], arch: str = "h200", calibration: Calibration | None = None,
                      name: str = "fit") -> PaddedKernelFit:
    """Fit :class:`PaddedKernelFit` to rows ``{T, Hp, sum_topk, ms[, source]}``.
    Raises ValueError: fewer than 3 rows; a non-positive coefficient."""
    if len(rows) < 3:
        raise ValueError(f"rows has {len(rows)} kernel rows; allowed: at least 3")
    a = get_arch(arch)
    cal = resolve_calibration(calibration)
    ef, eb = _lstsq2(rows, a)
    fit = PaddedKernelFit(ef, eb, a.name, len(rows), 0.0, 0.0, {}, 0.0, name)
    errs = [abs(fit.time_ms(r["T"], r["Hp"], r["sum_topk"]) - r["ms"]) / r["ms"] for r in rows]
    rate = a.bf16_tflops * 1e12 * cal.attention.get("kernel_flop_only", cal.attention_eff("kernel"))
    fo = [abs(padded_kernel_terms(r["T"], r["Hp"], r["sum_topk"])["flops"] / rate * 1e3 - r["ms"]) / r["ms"]
          for r in rows]
    oos = {}
    for src in sorted({r.get("source", "") for r in rows}):
        train = [r for r in rows if r.get("source", "") != src]
        test = [r for r in rows if r.get("source", "") == src]
        if len(train) >= 3 and test:
            try:
                f2 = replace(fit, eff_flops=_lstsq2(train, a)[0], eff_bytes=_lstsq2(train, a)[1])
            except ValueError:
                continue
            oos[src] = 100 * sum(abs(f2.time_ms(r["T"], r["Hp"], r["sum_topk"]) - r["ms"]) / r["ms"]
                                 for r in test) / len(test)
    return replace(fit, mape_pct=float(100 * sum(errs) / len(errs)), max_err_pct=float(100 * max(errs)),
                   oos={k: float(v) for k, v in oos.items()}, flop_only_mape_pct=float(100 * sum(fo) / len(fo)))


def default_padded_kernel_fit() -> PaddedKernelFit:
    """The fit on the committed H200 rows (:func:`padded_kernel_rows`), cached per rows folder."""
    return _padded_fit(str(calibration_measurements_dir("h200")))


@functools.cache
def _padded_fit(root: str) -> PaddedKernelFit:
    return fit_padded_kernel(padded_kernel_rows(), "h200",
                             name="padded-kernel roofline fitted on the committed H200 rows")


#: Where the H200 route rows live (``mla_lab/measure/experiments/routes_step.py``, 5 fresh processes).
ROUTES_CSV = ("between_process", "routes.csv")
#: SDPA backend whose rows fit ``mha_attn``: cuDNN (Hopper wgmma, nearest to the FA3 varlen kernel engines call).
MHA_FIT_BACKEND = "cudnn"
K_CONCAT_CLASS = "k_concat"


@functools.cache
def route_rows_rank(model: str) -> RankView:
    """The TP8 H200 rank the route rows of ``model`` ran on (bf16 weights and KV, experts TP, 16384 tokens), once."""
    return Deployment.rank_of(model=model, tp=8, arch="h200", kv_cache_dtype="bf16", weight_dtype="bf16",
                              moe_parallel="tp", max_num_batched_tokens=16384)


def route_rows(path: str | Path | None = None) -> list[dict]:
    """The committed H200 route rows ``{model, route, prompt_len, num_prompts, T, ms, n_processes}`` (median over
    processes); [] when absent."""
    p = Path(path) if path else calibration_measurements_dir("h200").joinpath(*ROUTES_CSV)  # calibration input
    per: dict = {}
    meta: dict = {}
    for r in csv_rows(p):
        k = (r["model"], r["route"], int(r["prompt_len"]))
        per.setdefault(k, {})[r["process"]] = float(r["median_ms"])
        meta[k] = (int(r["num_prompts"]), int(r["T"]), r.get("v_padded") == "True")
    return [{"model": k[0], "route": k[1], "prompt_len": k[2], "num_prompts": meta[k][0], "T": meta[k][1],
             "v_padded": meta[k][2], "ms": statistics.median(per[k].values()), "n_processes": len(per[k])}
            for k in sorted(per)]


def fit_route_classes(rows: list[dict] | None = None, backend: str = MHA_FIT_BACKEND):
    """``(classes, report)``: ``mha_attn`` (SDPA ``backend`` rows) and ``k_concat`` fitted at TP8.
    Raises ValueError: no rows for ``backend``; an unknown model."""
    rows = route_rows() if rows is None else rows
    fit_in = []
    for r in rows:
        is_mha = r["route"] == f"mha:sdpa:{backend}"
        is_cat = r["route"] == "mha:assemble" and not r.get("v_padded")
        if not (is_mha or is_cat):
            continue
        rank = route_rows_rank(r["model"])
        rs = route_stats(rank.model, prompt_len_step(r["prompt_len"], r["T"]))
        op = mha_attention_op(rank, rs) if is_mha else up_projection_ops(rank, rs)[1]
        fit_in.append({"op_class": MHA_CLASS if is_mha else K_CONCAT_CLASS, "flops": op.flops, "bytes": op.bytes,
                       "ms": r["ms"]})
    if not any(x["op_class"] == MHA_CLASS for x in fit_in):
        raise ValueError(f"backend={backend!r} has no mha:sdpa rows; allowed: the SDPA backends in the rows")
    cal, report = fit_calibration(fit_in, "h200", name=f"routes.csv fit ({backend})")
    return {c: cal.classes[c] for c in (MHA_CLASS, K_CONCAT_CLASS) if c in cal.classes}, report


def route_layer_ops(rank: RankView, route: str, step: Step | int, strategy: Strategy | str = "private_workspace",
                    **kw) -> list[LayerOp]:
    """One layer's ops on ``route`` (MHA routes: :data:`DROPPED_BY_DENSE` replaced by the MHA ops). Keywords as
    ``layer_ops``. Raises ValueError: unknown route; ``mha-dense`` where not equivalent; as ``layer_ops``."""
    _check_route_name(route)
    _check_options(kw.get("ep_comm", "all_reduce"), kw.get("indexer_dtype", "bf16"), kw.get("layer_kind"))
    return _route_layer_ops(rank, route, step, strategy, **kw)


def _check_route_name(route: str) -> None:
    if route not in ROUTES:
        raise ValueError(f"route={route!r} is not valid; allowed: {list(ROUTES)}")


def _route_layer_ops(rank: RankView, route: str, step: Step | int, strategy: Strategy | str, **kw) -> list[LayerOp]:
    """:func:`route_layer_ops` unchecked."""
    strategy = as_strategy("fa3_sparse" if route == "fa3-sparse" else strategy)
    ops = _layer_ops(rank, strategy, step, **kw)
    if route in ("sparse-mqa", "fa3-sparse"):
        return ops
    if route == "mha-dense":
        add = mha_dense_ops(rank, step)
    else:  # (c) mha-masked: the dense route's ops plus a [n, start + n] bit mask per chunk written and read once
        rs = route_stats(rank.model, step)  # (assumed; modelled, no kernel run)
        mask = LayerOp("mask", "elementwise", act_bytes=2 * math.ceil(rs.mask_bits / 8), dims={"bits": rs.mask_bits})
        add = up_projection_ops(rank, rs) + [mha_attention_op(rank, rs), mask]
    drop = set(DROPPED_BY_DENSE) - ({"idx_topk", "idx_logits"} if route == "mha-masked" else set())
    i = next(k for k, op in enumerate(ops) if op.name == "w_uk_bmm")
    kept = [op for op in ops if op.name not in drop]
    j = sum(1 for op in ops[:i] if op.name not in drop)
    return kept[:j] + add + kept[j:]


def step_route(model: ModelConfig, strategy: Strategy | str, step: Step | int) -> str:
    """The route ``strategy`` takes for ``step`` (a chunk is a request: seq_len ``start + n``, query_len ``n``)."""
    if isinstance(step, Step):
        if not step.chunks:
            return "sparse-mqa"
        seq = [s + n for _, s, n in step.chunks]
        q = [n for _, _, n in step.chunks]
    else:
        T = check_int("step", step, allow_zero=True)
        if T == 0:
            return "sparse-mqa"
        seq, q = [T], [T]
    return strategy_route(strategy, model, model.topk, seq, q)


def route_step_ops(rank: RankView, route: str, strategy: Strategy | str, step: Step | int,
                   **kw) -> list[tuple[LayerOp, int]]:
    """One engine step's ops on ``route`` as ``(op, count)``: each layer kind x its count, then the step-level
    ops once. Keywords as ``layer_ops``."""
    _check_route_name(route)
    return _step_pairs(rank, step, kw, "route_step_ops", lambda kind, idx: _route_layer_ops(
        rank, route, step, strategy, layer_kind=kind, with_indexer=idx, **kw))


def prompt_len_step(prompt_len: int, max_num_batched_tokens: int = 16384) -> Step:
    """A full budget's step: ``budget // prompt_len`` fresh prompts, else a prompt's last chunk. Raises ValueError:
    non-positive ints."""
    L = check_int("prompt_len", prompt_len)
    B = check_int("max_num_batched_tokens", max_num_batched_tokens)
    return Step([(i, 0, L) for i in range(B // L)]) if L <= B else Step([(0, L - B, B)])


def route_calibration_rows() -> list[dict]:
    """The rows of ``data/calibration/h200_routes.csv``: the roofline's ``kernel`` / ``kernel_bytes`` and the
    ``mha_attn`` / ``k_concat`` classes."""
    fit = default_padded_kernel_fit()
    rows = [{"kind": "attention", "op_class": "kernel", "eff_flops": fit.eff_flops, "eff_bytes": 1.0,
             "floor_us": 0.0, "overhead_mode": "max", "n": fit.n, "mape_pct": fit.mape_pct},
            {"kind": "attention", "op_class": "kernel_bytes", "eff_flops": 1.0, "eff_bytes": fit.eff_bytes,
             "floor_us": 0.0, "overhead_mode": "max", "n": fit.n, "mape_pct": fit.mape_pct}]
    _, report = fit_route_classes()
    return rows + [r for r in report if r["op_class"] in (MHA_CLASS, K_CONCAT_CLASS)]
