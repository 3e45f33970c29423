"""First-order roofline model of the sparse-MLA prefill *attention path* per strategy (modelled numbers).

Per layer, per rank, for one engine step of ``T`` tokens (``H`` real heads, ``H'`` padded heads, head_size 576,
d_v 512, bf16 = 2 bytes):

================  ===================================================  ==============================
op                bytes / FLOPs                                        strategies
================  ===================================================  ==============================
``concat``        read + write of the real heads: ``2*T*H*576*2`` B    all
``pad``           zero-fill ``T*H'*576*2`` B + copy real heads          unfused (bf16 cache, H' > H)
                  ``2*T*H*576*2`` B (vLLM ``q.new_zeros`` + copy)
``kernel``        ``2 * sum(topk_length) * H' * (576 + 512)`` FLOP     all (kernel_native too: see below)
                  (FlashMLA README FLOP count)
``out_slice``     ``out[:, :H].contiguous()``: ``2*T*H*512*2`` B       unfused, fused (not kernel_native)
================  ===================================================  ==============================

``kernel_native`` (modelled bound, a kernel that takes the real head count and pads inside, as FlashAttention #2883
does with TMA on sm100): no padded workspace, no pad, no output slice; its kernel time is the padded kernel's,
because on sm90 each token's query heads form the M dimension of a 64-row wgmma tile and tokens cannot share a tile
(each has its own index list), so 8 real heads still cost 64-row MMAs. At very small T this is pessimistic if a
native kernel could skip the padded rows' softmax work; that part is small next to the MMAs.

Time of an op = bytes / (HBM GB/s x eff) or FLOPs / (bf16 TFLOP/s x eff). The efficiencies (fraction of the
datasheet rate an op reaches) come from a :class:`Calibration`; the default one is derived from the H200 reference
timings in ``data/calibration/h200_reference.csv`` (FACTS.md section 5: do_bench medians on one H200, torch
2.11.0+cu130, driver 580.159.04). Other architectures reuse the H200 efficiencies, which is an assumption the rows
state (``calibration`` column).

``out_slice`` is priced here as FACTS.md section 5 measured it, but vLLM's consumer (the W_UV bmm) reads the strided
``out[:, :H]`` view without a copy (measured on an H200: same time, 0 extra bytes;
``data/measured/h200/layer_extras.csv``, experiment ``w_uv_slice``), so the ``full_layer`` TTFT scope of
:mod:`mla_lab.layer_model` leaves it out by default (``out_slice_copy=False``).

fp8 KV cache: the Q workspace is not padded (vLLM), so no pad op and identical strategies; the kernel term then
stands for vLLM's FP8 path at the same padded head count, which this first-order model does not distinguish.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from ._validate import check_int
from .arch import GPUArch, get_arch
from .buffers import padded_num_heads
from .models import ModelConfig, normalize_kv_cache_dtype
from .workload import Step, sum_topk_lengths

__all__ = ["Calibration", "default_calibration", "attention_path_ops", "attention_path_ms", "OP_NAMES"]

OP_NAMES = ("concat", "pad", "kernel", "out_slice")
BYTES_OPS = ("concat", "pad", "out_slice")
_CAL_DIR = Path(__file__).resolve().parent.parent / "data" / "calibration"


@dataclass(frozen=True)
class Calibration:
    """Efficiency per op (fraction of the datasheet HBM bandwidth for byte-bound ops, of dense bf16 TFLOP/s for
    the kernel) and where it came from."""

    eff: dict = field(default_factory=dict)
    name: str = "uncalibrated"
    arch: str = "h200"

    def get(self, op: str) -> float:
        if op not in self.eff:
            raise ValueError(f"calibration {self.name!r} has no efficiency for op={op!r}; has {sorted(self.eff)}")
        return self.eff[op]


def _ref_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if not r["op"].startswith("#")]


def calibration_from_reference(path: str | Path | None = None) -> Calibration:
    """Fit one efficiency per op from reference timings (median over the rows of each op of achieved / datasheet).

    The CSV has columns ``op, T, num_heads, padded_heads, topk, ms, arch, source``; bytes/FLOPs are recomputed with
    the formulas of this module so the fit and the model agree by construction.
    """
    path = Path(path) if path else _CAL_DIR / "h200_reference.csv"
    rows = _ref_rows(path)
    ratios: dict[str, list[float]] = {}
    arch_name = rows[0]["arch"] if rows else "h200"
    arch = get_arch(arch_name)
    for r in rows:
        op, T, H, Hp, topk, ms = r["op"], int(r["T"]), int(r["num_heads"]), int(r["padded_heads"]), int(r["topk"]), float(r["ms"])
        work = _op_work(op, T, H, Hp, T * topk)
        peak = arch.bf16_tflops * 1e12 if op == "kernel" else arch.hbm_gbps * 1e9
        ratios.setdefault(op, []).append(work / (ms * 1e-3) / peak)
    eff = {op: sorted(v)[len(v) // 2] for op, v in ratios.items()}
    return Calibration(eff=eff, name=f"{path.name} ({rows[0]['source'] if rows else 'empty'})", arch=arch_name)


_DEFAULT: Calibration | None = None


def default_calibration() -> Calibration:
    """The calibration fitted from ``data/calibration/h200_reference.csv`` (cached)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = calibration_from_reference()
    return _DEFAULT


def _op_work(op: str, T: int, H: int, Hp: int, sum_topk: int, head_size: int = 576, d_v: int = 512) -> float:
    """Bytes (byte-bound ops) or FLOPs (kernel) of one op."""
    if op == "concat":
        return 2 * T * H * head_size * 2
    if op == "pad":
        return T * Hp * head_size * 2 + 2 * T * H * head_size * 2
    if op == "out_slice":
        return 2 * T * H * d_v * 2
    if op == "kernel":
        return 2 * sum_topk * Hp * (head_size + d_v)
    raise ValueError(f"op={op!r} is not known; allowed: {list(OP_NAMES)}")


def _nonneg_int(name: str, v) -> int:
    return check_int(name, v, allow_zero=True)


def attention_path_ops(
    model: ModelConfig,
    tp: int,
    arch: str | GPUArch,
    strategy: str,
    num_tokens: int,
    sum_topk: int | None = None,
    kv_cache_dtype: str = "bf16",
) -> dict:
    """Work per op for one layer, one rank, one step: ``{op: {"bytes"|"flops": x}}`` (absent ops omitted).

    Args:
        model, tp: give ``H = num_attention_heads // tp``.
        arch: gives ``H'`` via vLLM's padding rule.
        strategy: ``unfused`` | ``fused`` | ``kernel_native``.
        num_tokens: T of the step.
        sum_topk: keys attended summed over the step's tokens (default ``T * index_topk``: full topk).
    """
    from .buffers import STRATEGIES
    from .models import load_model

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not known; allowed: {list(STRATEGIES)}")
    model = load_model(model)
    _nonneg_int("num_tokens", num_tokens)
    if sum_topk is not None:
        _nonneg_int("sum_topk", sum_topk)
        if sum_topk > num_tokens * model.topk:
            raise ValueError(f"sum_topk={sum_topk} exceeds num_tokens * index_topk = {num_tokens * model.topk}")
    arch = get_arch(arch)
    H = model.heads_per_rank(tp)
    Hp = padded_num_heads(H, arch, kv_cache_dtype)
    dt = normalize_kv_cache_dtype(kv_cache_dtype)
    T = num_tokens
    st = T * model.topk if sum_topk is None else sum_topk
    ops = {"concat": {"bytes": _op_work("concat", T, H, Hp, st, model.head_size, model.d_v)}}
    if strategy == "unfused" and dt == "bf16" and Hp > H:
        ops["pad"] = {"bytes": _op_work("pad", T, H, Hp, st, model.head_size, model.d_v)}
    # kernel_native pads inside the kernel: on sm90 the wgmma tile is 64 query rows per token and each token has its
    # own index list, so a kernel taking 8 real heads still issues 64-row MMAs; its time is the padded kernel's.
    ops["kernel"] = {"flops": _op_work("kernel", T, H, Hp, st, model.head_size, model.d_v)}
    if strategy != "kernel_native" and Hp > H:
        ops["out_slice"] = {"bytes": _op_work("out_slice", T, H, Hp, st, model.head_size, model.d_v)}
    return ops


def attention_path_ms(
    model: ModelConfig,
    tp: int,
    arch: str | GPUArch,
    strategy: str,
    step: Step | int,
    kv_cache_dtype: str = "bf16",
    calibration: Calibration | None = None,
    causal: bool = True,
) -> dict:
    """Modelled time (ms) per op and ``total`` for one layer, one rank, one step.

    Args:
        step: a :class:`~mla_lab.workload.Step` (causal topk_length per chunk when ``causal``) or a token count
            (full topk for every token).
    """
    from .models import load_model

    cal = calibration or default_calibration()
    arch = get_arch(arch)
    model = load_model(model)
    if not isinstance(step, Step):
        _nonneg_int("step", step)
    if isinstance(step, Step):
        T = step.num_tokens
        st = (sum(sum_topk_lengths(s, n, model.topk) for _, s, n in step.chunks) if causal else T * model.topk)
    else:
        T, st = step, step * model.topk
    ops = attention_path_ops(model, tp, arch, strategy, T, st, kv_cache_dtype)
    out = {}
    for op, w in ops.items():
        if "flops" in w:
            out[op] = w["flops"] / (arch.bf16_tflops * 1e12 * cal.get(op)) * 1e3
        else:
            out[op] = w["bytes"] / (arch.hbm_gbps * 1e9 * cal.get(op)) * 1e3
    out["total"] = sum(out.values())
    return out
