"""The lab's cost model as a serving pricer: a vLLM v1 engine step -> milliseconds, decode included (issue 13).

:class:`EnginePricer` turns a :class:`~mla_lab.serving.step.Step` (prefill chunks with their start positions,
decode tokens with their contexts) into a :class:`mla_lab.workload.Step` of chunks ``(req, start, n)`` (a decode
token with context ``c`` is the chunk ``(req, c - 1, 1)``: it attends ``min(c, topk)`` keys and its indexer scans
``c`` keys), prices it with :func:`mla_lab.model.timing.step_time_ms` (every layer, the strategy's attention path,
so with a bf16 KV cache decode tokens go through the padded kernel and pay the unfused pad too) and adds what the
layer model lacks at decode batch sizes, fitted on the H200 decode measurements
(``data/measured/h200/round2/decode_*.csv``, ``benchmarks/fit_decode.py`` -> ``data/calibration/h200_decode.csv``,
:class:`DecodeCalibration`):

- **GPU time of small ops** (:attr:`DecodeCalibration.graph_floors`): the committed per-class overheads
  (``h200_ops.csv``) were fitted on eagerly launched ops, where the host's launch cost shows up as a floor
  (5-15 us); replayed inside a CUDA graph the same kernels cost 2-6 us. Each roofline class gets its graph-replay
  overhead (its efficiencies stay the committed ones); the attention-path byte ops (concat, pad, ...) get a fixed
  cost per kernel launched (:attr:`~DecodeCalibration.attn_floor_us`; the pad of ``per_call_zeros`` is two
  kernels, zero fill and copy).
- **The decode indexer** (``idx_logits`` of decode tokens, :attr:`~DecodeCalibration.idx_decode`): each token
  reads its request's ``c`` cached indexer keys, a bandwidth-bound scan (prefill's causal logits are
  compute-bound; the committed class was fitted on those). Prefill chunks of a mixed step keep the committed class.
- **The decode top-k** (:attr:`~DecodeCalibration.topk_decode`): ``f + a * c_max + b * sum(c)`` us (a per-row
  latency and a throughput term), for ``torch.topk`` over ``[B, c]`` as measured.
- **The sparse kernel at decode** (:class:`KernelDecode`): one CTA per token (grid ``H'/64 x T``), so a decode
  batch costs ``a + (lat^p + flop^p + kv^p)^(1/p)`` with ``lat = us_per_key x max(topk_length)`` (one CTA's walk
  over its keys), ``flop`` the layer model's kernel roofline and ``kv`` the KV rows read
  (``sum(topk_length) x 576 x 2`` B) at ``eff_bytes`` of HBM bandwidth. The kernel time is the larger of that and
  the layer model's (which covers the prefill tokens of a mixed step); stale padded heads scale it by the content
  factor as in prefill.
- **A per-layer fixed cost** (:attr:`~DecodeCalibration.layer_fixed_us`): what the op list leaves out in the
  measured layer (the top-k -> global slot conversion, the bf16 cast of the indexer weights, graph node gaps).
- **The launch model**: a step with :attr:`Step.cuda_graph` (a uniform decode batch replayed as a full CUDA graph)
  costs its GPU time alone; any other step (``PIECEWISE`` or ``NONE``) is priced eagerly:
  ``max(GPU + n x eager_gap_us, n x host_us_per_op)`` for ``n`` ops launched (host-bound at small batches,
  GPU-bound with an idle gap per launch otherwise; :attr:`~DecodeCalibration.eager_form` says which terms the fit
  kept). vLLM's ``PIECEWISE`` mode replays the non-attention pieces as graphs, so this host floor is an upper
  bound there (it matters only for small mixed steps).

What the decode measurements time (``benchmarks/bench_decode.py``): one per-rank MoE layer, bf16 weights, EP8
experts as a ``bmm`` over the expected active experts, no KV-cache write, RoPE, indexer k-prep, router top-k or
all-reduce. :func:`layer_decode_ms` prices that same subset (``layer_ops`` ops with ``impl`` and not comm; the
excluded ops are :data:`EXCLUDED_FROM_MEASURED`) for the fit and its validation; :class:`EnginePricer` prices the
whole step: every op of :func:`mla_lab.model.ops.step_ops`, the excluded ones with the committed model and graph
overheads, collectives with the lab's one ring model (not calibrated at decode sizes).

:func:`serve_benchmark` runs :func:`mla_lab.serving.simulate` once per strategy with that strategy's own KV-cache
capacity (:func:`mla_lab.model.memory.memory_tradeoff`) and compares every metric with a baseline.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..arch import GPUArch, get_arch
from ..model.calibration import Calibration, ClassEff, resolve_calibration
from ..model.memory import memory_tradeoff
from ..model.ops import ATTN_OPS, LayerOp, layer_ops, step_ops
from ..model.timing import op_time_ms, step_time_ms
from ..models import ModelConfig, load_model, normalize_kv_cache_dtype
from ..paths import calibration_dir
from ..placement import BASELINE, expand_strategies, preset_of, resolve_strategy
from ..workload import Step as WorkStep
from .client import BenchConfig
from .metrics import compare
from .scheduler import SchedulerConfig
from .simulate import simulate
from .step import Step

__all__ = ["EnginePricer", "DecodeCalibration", "KernelDecode", "load_decode_calibration", "write_decode_calibration",
           "layer_decode_ms", "to_workload_step", "serve_benchmark", "DECODE_CSV", "EXCLUDED_FROM_MEASURED",
           "OVERRIDDEN_OPS", "MODELLED_NOTES", "PR_BENCH"]

DECODE_CSV = "h200_decode.csv"

#: Ops of :func:`~mla_lab.model.ops.layer_ops` that the measured decode layer does not run (no ``impl``), plus the
#: collectives: the fit and its validation leave them out of both sides.
EXCLUDED_FROM_MEASURED = ("rope_cache", "idx_prep", "router_topk", "attn_allreduce", "mlp_allreduce",
                          "moe_allreduce", "moe_dispatch", "moe_combine_a2a", "moe_allgather", "shared_allreduce")

#: Ops whose decode-token part is priced by the decode calibration instead of the layer model's roofline.
OVERRIDDEN_OPS = ("idx_logits", "idx_topk", "kernel")

#: Kernels launched by each attention-path byte op (the per-launch cost of the decode calibration applies per kernel).
_ATTN_KERNELS = {"concat": 1, "pad": 2, "pad_copy": 1, "out_slice": 1, "chunk_out": 1}

#: The PR's benchmark (vLLM PR #53878): 32 prompts x 1024 in / 128 out, max concurrency 32, request rate inf.
PR_BENCH = BenchConfig(num_prompts=32, random_input_len=1024, random_output_len=128, max_concurrency=32)

MODELLED_NOTES = (
    "Every number is modelled: a step-level simulation of vllm bench serve (random dataset, --ignore-eos) against "
    "vLLM v1's scheduler (mla_lab.serving), each step priced by the lab's cost model (mla_lab.model.timing."
    "step_time_ms, committed calibration) plus the decode calibration fitted on H200 decode measurements.",
    "Decode tokens go through the same padded bf16 sparse kernel as prefill (vLLM mla_attention.py: sparse impls send every token down the MQA path), so per-call pad "
    "strategies pay their pad on every decode step too; with an fp8 KV cache nothing is padded and the strategies "
    "price alike.",
    "Uniform decode batches run as full CUDA graphs (GPU time only); prefill and mixed steps are priced eagerly "
    "(max of GPU time + launch gaps and host launch time; vLLM's PIECEWISE graphs make that an upper bound).",
    "Each strategy has its own KV-cache capacity (memory_tradeoff: capacity minus the strategy's persistent "
    "workspace in tokens); the scheduler admits a request only when its whole footprint fits (no preemption).",
    "Not modelled: CPU scheduling, sampling, detokenisation, HTTP, CUDA-graph batch padding, async scheduling, "
    "MTP / speculative decoding, expert load imbalance (uniform routing), all-reduce latency at decode sizes "
    "(the ring model with comm_latency_us = 0).",
)


# ------------------------------------------------------------------------------------------ the calibration
@dataclass(frozen=True)
class KernelDecode:
    """The sparse kernel on decode tokens: ``a_us + (lat^p + flop^p + kv^p)^(1/p)`` us (module docstring).

    Attributes:
        a_us: fixed cost per call (us); us_per_key: one CTA's time per key of its ``topk_length`` (us);
        eff_bytes: fraction of HBM bandwidth the KV-row reads reach; p: the norm combining the three terms.
    """

    a_us: float
    us_per_key: float
    eff_bytes: float
    p: float

    def ms(self, flop_ms: float, max_keys: int, sum_keys: int, row_bytes: int, arch: GPUArch) -> float:
        """Kernel time (ms) for decode tokens with ``max_keys`` / ``sum_keys`` keys and the flop roofline ``flop_ms``."""
        if sum_keys <= 0:
            return flop_ms
        lat = self.us_per_key * max_keys
        kv = sum_keys * row_bytes / (arch.hbm_gbps * 1e9 * self.eff_bytes) * 1e6
        fl = flop_ms * 1e3
        return (self.a_us + (lat ** self.p + fl ** self.p + kv ** self.p) ** (1.0 / self.p)) * 1e-3


@dataclass(frozen=True)
class DecodeCalibration:
    """What the layer model lacks at decode batch sizes, fitted on one H200 (module docstring).

    Attributes:
        graph_floors: ``{op_class: (overhead_us, mode)}`` of each roofline class replayed in a CUDA graph (mode
            ``max`` or ``add`` as :class:`~mla_lab.model.calibration.ClassEff`); classes not listed borrow their
            bf16 twin's (``gemm_fp8`` <- ``gemm``, ``moe_gemm_fp8`` <- ``moe_gemm``) or keep the committed floor.
        attn_floor_us: fixed cost per kernel of the attention-path byte ops (us).
        idx_decode: the indexer-logits class for decode tokens (a :class:`ClassEff`).
        topk_decode: ``(f_us, us_per_key_row, us_per_key_batch)`` of the decode top-k.
        kernel_decode: :class:`KernelDecode`.
        layer_fixed_us: fixed cost per layer (us), GPU time.
        host_us_per_op: host launch cost per op in eager steps (us); eager_gap_us: idle GPU gap per op (us).
        eager_form: ``max`` (host floor only), ``add`` (gaps only) or ``max+add``; documents the fit's choice.
        name: where the fit came from; fit: MAPE figures of the fit (``{key: pct}``); provenance: copied columns.
    """

    graph_floors: dict
    attn_floor_us: dict
    idx_decode: ClassEff
    topk_decode: tuple
    kernel_decode: KernelDecode
    layer_fixed_us: float = 0.0
    host_us_per_op: float = 0.0
    eager_gap_us: float = 0.0
    eager_form: str = "max+add"
    name: str = "uncalibrated"
    fit: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    def graph_calibration(self, cal: Calibration) -> Calibration:
        """``cal`` with every roofline class's overhead replaced by its graph-replay overhead."""
        classes = dict(cal.classes)
        twins = {"gemm_fp8": "gemm", "moe_gemm_fp8": "moe_gemm"}
        for cls in set(classes) | set(self.graph_floors) | set(twins):
            src = cls if cls in self.graph_floors else twins.get(cls)
            if src not in self.graph_floors:
                continue
            base = classes.get(cls) or cal.eff(cls)
            fl, mode = self.graph_floors[src]
            classes[cls] = replace(base, floor_us=float(fl), mode=mode)
        return replace(cal, classes=classes, name=f"{cal.name} + graph overheads ({self.name})")

    def topk_ms(self, max_ctx: int, sum_ctx: int) -> float:
        """Decode top-k time (ms) of a batch whose longest context is ``max_ctx`` and whose contexts sum to
        ``sum_ctx``."""
        if sum_ctx <= 0:
            return 0.0
        f, a, b = self.topk_decode
        return (f + a * max_ctx + b * sum_ctx) * 1e-3


_PARAMS = ("graph_floor", "attn_floor", "idx_decode", "topk_decode", "kernel_decode", "layer", "launch", "fit")


def write_decode_calibration(dcal: DecodeCalibration, path: str | Path, provenance: dict | None = None) -> Path:
    """Write ``dcal`` as one CSV row per parameter (``group, key, value, mode, unit, meaning``) with the
    ``provenance`` columns on every row. Returns the path."""
    path = Path(path)
    prov = dict(provenance if provenance is not None else dcal.provenance)
    rows = []

    def add(group, key, value, unit, meaning, mode=""):
        rows.append({"group": group, "key": key, "value": repr(float(value)), "mode": mode, "unit": unit,
                     "meaning": meaning})

    for cls, (fl, mode) in sorted(dcal.graph_floors.items()):
        add("graph_floor", cls, fl, "us", "per-op overhead of the class replayed in a CUDA graph", mode)
    for op, us in sorted(dcal.attn_floor_us.items()):
        add("attn_floor", op, us, "us", "fixed cost per kernel of the attention-path byte op")
    e = dcal.idx_decode
    add("idx_decode", "eff_flops", e.eff_flops, "fraction", "indexer logits of decode tokens: of dense bf16 TFLOP/s")
    add("idx_decode", "eff_bytes", e.eff_bytes, "fraction", "indexer logits of decode tokens: of HBM GB/s")
    add("idx_decode", "floor_us", e.floor_us, "us", "indexer logits of decode tokens: overhead", e.mode)
    for k, v, u in zip(("f_us", "us_per_key_row", "us_per_key_batch"), dcal.topk_decode, ("us", "us/key", "us/key")):
        add("topk_decode", k, v, u, "decode top-k: f + a * max(c) + b * sum(c)")
    kd = dcal.kernel_decode
    for k in ("a_us", "us_per_key", "eff_bytes", "p"):
        add("kernel_decode", k, getattr(kd, k), {"a_us": "us", "us_per_key": "us/key", "eff_bytes": "fraction",
                                                  "p": "1"}[k], "sparse kernel on decode tokens (KernelDecode)")
    add("layer", "layer_fixed_us", dcal.layer_fixed_us, "us", "fixed GPU cost per layer")
    add("launch", "host_us_per_op", dcal.host_us_per_op, "us", "eager: host launch cost per op", dcal.eager_form)
    add("launch", "eager_gap_us", dcal.eager_gap_us, "us", "eager: idle GPU gap per op", dcal.eager_form)
    for k, v in sorted(dcal.fit.items()):
        add("fit", k, v, "%", "validation MAPE (decode_validation.csv)")
    cols = ["group", "key", "value", "mode", "unit", "meaning"] + [k for k in prov if k not in
                                                                    ("group", "key", "value", "mode", "unit")]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({**r, **prov})
    return path


_LOADED: dict = {}


def load_decode_calibration(path: str | Path | None = None) -> DecodeCalibration:
    """The decode calibration in ``path`` (default ``data/calibration/h200_decode.csv``, written by
    ``benchmarks/fit_decode.py``). Cached per (path, mtime).

    Raises:
        ValueError: the file does not exist (says how to make it) or a row is malformed (names the file and row).
    """
    p = Path(path) if path is not None else calibration_dir() / DECODE_CSV
    if not p.is_file():
        raise ValueError(f"decode calibration path={str(p)!r} does not exist; run `python benchmarks/fit_decode.py` "
                         "to fit it from data/measured/h200/round2/decode_layer.csv")
    key = (str(p), p.stat().st_mtime)
    if key in _LOADED:
        return _LOADED[key]
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    vals: dict = {}
    modes: dict = {}
    try:
        for r in rows:
            if r["group"] not in _PARAMS:
                raise ValueError(f"group={r['group']!r} not one of {list(_PARAMS)}")
            v = float(r["value"])
            if not math.isfinite(v):
                raise ValueError(f"value {r['value']!r} is not finite")
            vals[(r["group"], r["key"])] = v
            modes[(r["group"], r["key"])] = r.get("mode") or ""
        floors = {k: (v, modes[(g, k)] or "add") for (g, k), v in vals.items() if g == "graph_floor"}
        attn = {k: v for (g, k), v in vals.items() if g == "attn_floor"}
        idx = ClassEff(vals[("idx_decode", "eff_flops")], vals[("idx_decode", "eff_bytes")],
                       vals[("idx_decode", "floor_us")], mode=modes[("idx_decode", "floor_us")] or "add")
        topk = tuple(vals[("topk_decode", k)] for k in ("f_us", "us_per_key_row", "us_per_key_batch"))
        kd = KernelDecode(*(vals[("kernel_decode", k)] for k in ("a_us", "us_per_key", "eff_bytes", "p")))
        fit = {k: v for (g, k), v in vals.items() if g == "fit"}
        prov_keys = [c for c in (rows[0] if rows else {}) if c not in ("group", "key", "value", "mode", "unit",
                                                                       "meaning")]
        prov = {c: rows[0][c] for c in prov_keys}
        dcal = DecodeCalibration(floors, attn, idx, topk, kd, vals[("layer", "layer_fixed_us")],
                                 vals[("launch", "host_us_per_op")], vals[("launch", "eager_gap_us")],
                                 modes[("launch", "host_us_per_op")] or "max+add",
                                 f"{p.name} (measured on {prov.get('device') or prov.get('gpu') or '?'})", fit, prov)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{p}: not a decode calibration ({type(e).__name__}: {e})") from None
    _LOADED[key] = dcal
    return dcal


# ------------------------------------------------------------------------------------------------- pricing
def to_workload_step(step: Step) -> WorkStep:
    """A serving step as the cost model's :class:`mla_lab.workload.Step`: decode tokens first (vLLM reorders the
    batch decode-first), each ``(req, context_len - 1, 1)``, then the prefill chunks ``(req, start, n)``."""
    return WorkStep([(d.req_id, d.context_len - 1, 1) for d in step.decode]
                    + [(c.req_id, c.start, c.num_tokens) for c in step.prefill_chunks])


class _Parts:
    """Per-layer pricing of one step's tokens with the decode calibration (shared by the fit and the pricer)."""

    def __init__(self, model, tp, arch, strategy, prefill, decode_ctx, cal, dcal, kw):
        self.model, self.tp, self.arch, self.strategy, self.kw = model, tp, arch, strategy, kw
        self.cal, self.dcal = cal, dcal
        self.gcal = dcal.graph_calibration(cal)
        self.icl = replace(self.gcal, classes={**self.gcal.classes, "indexer_logits": dcal.idx_decode})
        self.prefill = [tuple(c) for c in prefill]
        self.decode_ctx = [int(c) for c in decode_ctx]
        self.ws = WorkStep([(i, c - 1, 1) for i, c in enumerate(self.decode_ctx)]
                           + [(10**9 + i, s, n) for i, (_, s, n) in enumerate(self.prefill)])
        topk = model.topk
        self.dec_keys = [min(c, topk) for c in self.decode_ctx]
        self._sub: dict = {}

    def sub_op(self, which: str, name: str) -> LayerOp | None:
        """Op ``name`` of a layer over only the prefill chunks (``which="prefill"``) or only the decode tokens."""
        if which not in self._sub:
            chunks = (self.ws.chunks[len(self.decode_ctx):] if which == "prefill"
                      else self.ws.chunks[:len(self.decode_ctx)])
            ops = layer_ops(self.model, self.tp, self.arch, self.strategy, WorkStep(chunks), layer_kind="moe",
                            **self.kw) if chunks else []
            self._sub[which] = {op.name: op for op in ops}
        return self._sub[which].get(name)

    def op_ms(self, op: LayerOp) -> float:
        """One layer's time (ms) of ``op`` (an op of the whole step's layer), decode-aware."""
        arch, dec = self.arch, self.decode_ctx
        if op.is_comm:
            return op_time_ms(op, arch, self.gcal, self.tp)
        if dec and op.name == "idx_logits":
            pre = self.sub_op("prefill", "idx_logits")
            return ((op_time_ms(pre, arch, self.gcal) if pre else 0.0)
                    + op_time_ms(self.sub_op("decode", "idx_logits"), arch, self.icl))
        if dec and op.name == "idx_topk":
            pre = self.sub_op("prefill", "idx_topk")
            return (op_time_ms(pre, arch, self.gcal) if pre else 0.0) + self.dcal.topk_ms(max(dec), sum(dec))
        if op.name == "kernel":
            flop = op_time_ms(op, arch, self.gcal)
            if not dec:
                return flop
            zeros = replace(op, dims={**op.dims, "content": "zeros"})
            t = self.dcal.kernel_decode.ms(op_time_ms(zeros, arch, self.gcal), max(self.dec_keys),
                                           sum(self.dec_keys), self.model.head_size * 2, arch)
            if op.dims.get("content") == "stale" and self.cal.content is not None:
                t *= self.cal.content.factor(op.dims["H"], op.dims["Hp"], t)
            return max(flop, t)
        if op.op_class.startswith("attn_") and op.name in _ATTN_KERNELS:
            t = op_time_ms(op, arch, self.gcal)
            return t + (_ATTN_KERNELS[op.name] * self.dcal.attn_floor_us.get(op.name, 0.0) * 1e-3 if op.bytes
                        else 0.0)
        return op_time_ms(op, arch, self.gcal, self.tp)


def _eager_ms(gpu_ms: float, n_ops: int, dcal: DecodeCalibration) -> tuple[float, float]:
    """(eager step time, host time) in ms for ``n_ops`` launches."""
    host = n_ops * dcal.host_us_per_op * 1e-3
    return max(gpu_ms + n_ops * dcal.eager_gap_us * 1e-3, host), host


def _resolve_objs(model, arch) -> tuple[ModelConfig, GPUArch]:
    return (model if isinstance(model, ModelConfig) else load_model(model),
            arch if isinstance(arch, GPUArch) else get_arch(arch))


def layer_decode_ms(model: ModelConfig | str, tp: int, arch: GPUArch | str, strategy: str, prefill=(),
                    decode_contexts=(), calibration: Calibration | None = None,
                    decode_cal: DecodeCalibration | None = None, *, graph: bool = True, measured_subset: bool = True,
                    kv_cache_dtype: str = "bf16", weight_dtype: str = "bf16", moe_parallel: str = "ep",
                    ep_size: int | None = None) -> dict:
    """One per-rank MoE layer of a step (``prefill`` chunks ``(req, start, n)`` + decode tokens with
    ``decode_contexts``), priced with the decode calibration: what ``benchmarks/fit_decode.py`` fits and
    validates against ``decode_layer.csv``.

    ``measured_subset``: only the ops the measured layer runs (``layer_ops`` ops with ``impl``, no comm;
    :data:`EXCLUDED_FROM_MEASURED`); ``graph``: CUDA-graph replay (GPU time) or eager (launch model).

    Returns ``{"total_ms", "gpu_ms", "host_ms", "n_ops", "ops": {name: ms}}``.
    """
    model, arch = _resolve_objs(model, arch)
    strategy = resolve_strategy(strategy)
    cal = resolve_calibration(calibration)
    dcal = decode_cal if decode_cal is not None else load_decode_calibration()
    kw = dict(kv_cache_dtype=kv_cache_dtype, weight_dtype=weight_dtype, moe_parallel=moe_parallel, ep_size=ep_size)
    parts = _Parts(model, tp, arch, strategy, prefill, decode_contexts, cal, dcal, kw)
    ops = layer_ops(model, tp, arch, strategy, parts.ws, layer_kind="moe", **kw)
    if measured_subset:
        ops = [op for op in ops if op.impl and not op.is_comm]
    per = {op.name: parts.op_ms(op) for op in ops}
    gpu = sum(per.values()) + dcal.layer_fixed_us * 1e-3
    total, host = (gpu, 0.0) if graph else _eager_ms(gpu, len(ops), dcal)
    return {"total_ms": total, "gpu_ms": gpu, "host_ms": host, "n_ops": len(ops), "ops": per}


class EnginePricer:
    """A :data:`~mla_lab.serving.step.StepPricer` for :func:`mla_lab.serving.simulate`: one engine step on one rank
    (every rank runs the same step in lockstep under TP), priced by the lab's cost model (module docstring).

    Args:
        model, tp, arch: model config or name, tensor-parallel size, GPU (object or name).
        strategy: a canonical strategy, alias or preset (a two-member preset gives its first member).
        calibration: the layer model's calibration (None: the committed one).
        weight_dtype, moe_parallel: as :func:`mla_lab.model.ops.layer_ops` (the PR ran GLM-5.2-FP8 with ``-ep``).
        decode_cal: a :class:`DecodeCalibration` (None: :func:`load_decode_calibration`).
        kv_cache_dtype: ``bf16`` (the padded kernel, decode included) or ``fp8`` (no padding).
        ep_size: expert-parallel size (default ``tp``).

    Calling it returns the step's ms; :meth:`price` returns the breakdown.

    Raises:
        ValueError: as the cost model's functions (unknown strategy, model, arch, dtype).
    """

    def __init__(self, model, tp: int, arch, strategy: str, calibration: Calibration | None = None,
                 weight_dtype: str = "fp8", moe_parallel: str = "ep", decode_cal: DecodeCalibration | None = None,
                 kv_cache_dtype: str = "bf16", ep_size: int | None = None):
        self.model, self.arch = _resolve_objs(model, arch)
        self.tp = tp
        self.strategy = resolve_strategy(strategy)
        self.kv_cache_dtype = normalize_kv_cache_dtype(kv_cache_dtype)
        self.calibration = resolve_calibration(calibration)
        self.decode_cal = decode_cal if decode_cal is not None else load_decode_calibration()
        self.kw = dict(kv_cache_dtype=self.kv_cache_dtype, weight_dtype=weight_dtype, moe_parallel=moe_parallel,
                       ep_size=ep_size)
        self.gcal = self.decode_cal.graph_calibration(self.calibration)
        one = WorkStep([(0, 0, 1)])
        counted = step_ops(self.model, tp, self.arch, self.strategy, one, **self.kw)
        self.n_ops = sum(n for _, n in counted)  # launches per step (every op of every layer, once)
        L = self.model.num_hidden_layers
        idx_layers = len({i for i in self.model.indexer_layers if 0 <= i < L})
        self.counts = {"idx_logits": idx_layers, "idx_topk": idx_layers}
        self.counts.update({a: L for a in ATTN_OPS})

    def __repr__(self) -> str:
        return (f"EnginePricer({self.model.name!r}, tp={self.tp}, arch={self.arch.name!r}, "
                f"strategy={self.strategy!r}, kv_cache_dtype={self.kv_cache_dtype!r})")

    def price(self, step: Step) -> dict:
        """The step's time and its parts: ``total_ms``, ``gpu_ms``, ``host_ms`` (eager steps), ``launch``
        (``graph`` or ``eager``), ``by_op`` (ms over all layers), ``attention_path_ms``, ``comm_ms``."""
        prefill = [(c.req_id, c.start, c.num_tokens) for c in step.prefill_chunks]
        parts = _Parts(self.model, self.tp, self.arch, self.strategy, prefill,
                       [d.context_len for d in step.decode], self.calibration, self.decode_cal, self.kw)
        base = step_time_ms(self.model, self.tp, self.arch, self.strategy, parts.ws, self.gcal, **self.kw)
        by = dict(base["by_op"])
        one_layer = {op.name: op for op in layer_ops(self.model, self.tp, self.arch, self.strategy, parts.ws,
                                                     layer_kind="moe", **self.kw)}
        for name in list(OVERRIDDEN_OPS) + list(_ATTN_KERNELS):
            if name in by and name in one_layer:
                by[name] = parts.op_ms(one_layer[name]) * self.counts[name]
        L = self.model.num_hidden_layers
        gpu = sum(by.values()) + self.decode_cal.layer_fixed_us * 1e-3 * L
        if step.cuda_graph:
            total, host, launch = gpu, 0.0, "graph"
        else:
            total, host = _eager_ms(gpu, self.n_ops, self.decode_cal)
            launch = "eager"
        return {"total_ms": total, "gpu_ms": gpu, "host_ms": host, "launch": launch, "by_op": by,
                "attention_path_ms": sum(by.get(a, 0.0) for a in ATTN_OPS), "comm_ms": base["comm"]}

    def __call__(self, step: Step) -> float:
        return self.price(step)["total_ms"]


# ------------------------------------------------------------------------------------------ serve_benchmark
def serve_benchmark(model, tp: int, arch, strategies, bench: BenchConfig = PR_BENCH,
                    max_num_batched_tokens: int = 16384, max_num_seqs: int = 256,
                    gpu_memory_utilization: float = 0.9, kv_cache_dtype: str = "bf16", block_size: int = 64,
                    weight_dtype: str = "fp8", moe_parallel: str = "ep", calibration: Calibration | None = None,
                    decode_cal: DecodeCalibration | None = None, baseline: str = BASELINE,
                    kv_admission: str = "reserve", enforce_eager: bool = False,
                    percentiles=(99,)) -> dict:
    """``vllm bench serve`` (``bench``) against one deployment, once per strategy, each with its own KV capacity.

    Per strategy (presets and aliases expanded; ``baseline`` added when missing): the KV-cache capacity is
    :func:`~mla_lab.model.memory.memory_tradeoff`'s ``kv_capacity_tokens`` minus the strategy's
    ``kv_tokens_lost`` (its persistent workspace beyond the baseline's), the scheduler is
    :class:`~mla_lab.serving.scheduler.SchedulerConfig` with the engine limits given, the pricer
    :class:`EnginePricer`; :func:`mla_lab.serving.simulate` runs the benchmark.

    Returns:
        ``{"strategies": {s: {"preset", "metrics", "change_pct" (vs baseline, % per metric), "kv_capacity_tokens",
        "kv_tokens_lost", "extra_mib", "num_steps", "steps_by_launch", "result" (the ServingResult)}},
        "baseline", "deployment" (the arguments), "bench" (dict), "calibration", "decode_calibration", "notes"}``.

    Raises:
        ValueError: a strategy whose KV capacity is <= 0 tokens (the weights and workspace do not fit at
            ``gpu_memory_utilization``), names it; as ``SchedulerConfig``, :func:`simulate` and the cost model.
    """
    if not isinstance(bench, BenchConfig):
        raise ValueError(f"bench={bench!r} must be a mla_lab.serving.BenchConfig")
    if isinstance(strategies, str):
        strategies = [strategies]
    names = expand_strategies(list(strategies))
    base = resolve_strategy(baseline)
    order = list(dict.fromkeys([base] + names))
    model_obj, arch_obj = _resolve_objs(model, arch)
    cal = resolve_calibration(calibration)
    dcal = decode_cal if decode_cal is not None else load_decode_calibration()
    mem = memory_tradeoff(model_obj, tp, arch_obj, max_num_batched_tokens, kv_cache_dtype,
                          gpu_memory_utilization=gpu_memory_utilization, weight_dtype=weight_dtype,
                          moe_parallel=moe_parallel, strategies=order)
    out: dict = {}
    for s in order:
        lost = mem["strategies"][s]["kv_tokens_lost"]
        cap = mem["kv_capacity_tokens"] - lost
        if not cap > 0:
            raise ValueError(
                f"strategy={s!r}: KV-cache capacity {cap:.0f} tokens <= 0 for {model_obj.name} TP{tp} on "
                f"{arch_obj.name} (weights {mem['weights_bytes'] / 2**30:.1f} GiB, activations "
                f"{mem['activation_bytes'] / 2**30:.1f} GiB, budget {mem['kv_budget_bytes'] / 2**30:.1f} GiB at "
                f"gpu_memory_utilization={gpu_memory_utilization}); allowed: a deployment whose weights fit "
                "(e.g. weight_dtype='fp8', a larger tp, a higher gpu_memory_utilization)")
        sched = SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                kv_capacity_tokens=int(cap), block_size=block_size, kv_admission=kv_admission,
                                enforce_eager=enforce_eager)
        pricer = EnginePricer(model_obj, tp, arch_obj, s, cal, weight_dtype, moe_parallel, dcal, kv_cache_dtype)
        res = simulate(bench, sched, pricer, percentiles=percentiles)
        launches: dict = {}
        for rec in res.steps:
            k = f"{rec.step.kind}:{rec.step.cudagraph_mode}"
            launches[k] = launches.get(k, 0) + 1
        out[s] = {"preset": preset_of(s), "metrics": res.metrics, "kv_capacity_tokens": int(cap),
                  "kv_tokens_lost": lost, "extra_mib": mem["strategies"][s]["extra_mib"],
                  "num_steps": len(res.steps), "steps_by_launch": launches, "result": res}
    for s in order:
        out[s]["change_pct"] = compare(out[base]["metrics"], out[s]["metrics"])
    return {"strategies": out, "baseline": base,
            "deployment": {"model": model_obj.name, "tp": tp, "arch": arch_obj.name,
                           "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
                           "gpu_memory_utilization": gpu_memory_utilization, "kv_cache_dtype": kv_cache_dtype,
                           "block_size": block_size, "weight_dtype": weight_dtype, "moe_parallel": moe_parallel,
                           "kv_admission": kv_admission, "enforce_eager": enforce_eager},
            "bench": asdict(bench), "calibration": cal.name, "decode_calibration": dcal.name,
            "notes": list(MODELLED_NOTES)}


def main() -> None:
    """Demo: the PR's benchmark on GLM-5 TP8 H200 (fp8 weights, EP, bf16 KV cache) per engine preset."""
    res = serve_benchmark("glm-5", 8, "h200", ["vllm-pre-53878", "vllm-53878", "vllm-56902", "sglang"], PR_BENCH,
                          16384)
    print(f"baseline {res['baseline']}; decode calibration {res['decode_calibration']}")
    keys = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "total_token_throughput")
    for s, r in res["strategies"].items():
        m, c = r["metrics"], r["change_pct"]
        print(f"{s:24s} {r['preset']:15s} " + "  ".join(f"{k.replace('_ms', '')} {m[k]:8.1f} ({c[k]:+.2f} %)"
                                                        for k in keys))
    for n in res["notes"]:
        print("-", n)


if __name__ == "__main__":
    main()
