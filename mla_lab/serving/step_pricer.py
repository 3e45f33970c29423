"""The lab's cost model as a step pricer: a vLLM v1 engine step -> ms, decode included (issue 13; each term, its fit and
validation: docs/serving.md, "The lab's cost model as the pricer"). A decode token of context ``c`` is the chunk ``(req,
c - 1, 1)`` of a :class:`mla_lab.workload.Step`, priced by :func:`mla_lab.model.timing.step_time_ms` (bf16 KV: decode
tokens pay the per-call pad too) plus the decode terms fitted on the H200
(:class:`~mla_lab.model.decode_calibration.DecodeCalibration`) and the launch model: a ``FULL`` CUDA-graph step costs
its GPU time, any other ``max(GPU + n x eager_gap_us, n x host_us_per_op)`` for ``n`` ops (an upper bound under
``PIECEWISE``). :func:`layer_decode_ms` prices the ops the ``decode_layer`` experiment timed, for the fit."""

from __future__ import annotations

from dataclasses import replace

from ..model.calibration import Calibration, resolve_calibration
from ..model.decode_calibration import DecodeCalibration, load_decode_calibration
from ..model.decode_kernels import decode_family, load_decode_kernels
from ..model.ops import ATTN_OPS, LayerOp, layer_ops, step_ops
from ..model.timing import op_time_ms, step_time_ms
from ..placement import parse_strategy, resolve_strategy
from ..rank import RankView
from ..workload import Step as WorkStep
from .step import Step

#: Ops whose decode-token part is priced by the decode calibration instead of the layer model's roofline.
OVERRIDDEN_OPS = ("idx_logits", "idx_topk", "kernel")

#: Kernels launched by each attention-path byte op (the per-launch cost of the decode calibration applies per kernel).
_ATTN_KERNELS = {"concat": 1, "pad": 2, "pad_copy": 1, "out_slice": 1, "chunk_out": 1}


class _Parts:
    """Per-layer pricing of one step's tokens (``prefill`` chunks ``(req, start, n)``, ``decode_ctx`` contexts in
    tokens) with the decode calibration, shared by the fit and the pricer; ``strategy`` canonical."""

    def __init__(self, rank: RankView, strategy: str, prefill, decode_ctx, cal: Calibration, dcal: DecodeCalibration,
                 decode_kernels: str = "engine"):
        self.rank, self.strategy = rank, strategy
        self.model, self.tp, self.arch, self.cal, self.dcal = rank.model, rank.tp, rank.arch, cal, dcal
        self.gcal = dcal.graph_calibration(cal)
        self.icl = replace(self.gcal, classes={**self.gcal.classes, "indexer_logits": dcal.idx_decode})
        self.decode_ctx = [int(c) for c in decode_ctx]
        self.ws = WorkStep([(i, c - 1, 1) for i, c in enumerate(self.decode_ctx)]
                           + [(10**9 + i, s, n) for i, (_, s, n) in enumerate(prefill)])
        self.dec_keys = [min(c, rank.model.topk) for c in self.decode_ctx]
        # "engine": the engines' own decode kernels priced by their parallelism (mla_lab.model.decode_kernels);
        # "fit": the decode calibration's KernelDecode (what h200_decode.csv was fitted with, to reproduce that fit)
        if decode_kernels not in ("engine", "fit"):
            raise ValueError(f"decode_kernels={decode_kernels!r}; allowed: 'engine', 'fit'")
        self.dkern = load_decode_kernels() if decode_kernels == "engine" else None
        self._sub: dict = {}

    def sub_op(self, which: str, name: str) -> LayerOp | None:
        if which not in self._sub:
            chunks = (self.ws.chunks[len(self.decode_ctx):] if which == "prefill"
                      else self.ws.chunks[:len(self.decode_ctx)])
            ops = layer_ops(self.rank, self.strategy, WorkStep(chunks), layer_kind="moe") if chunks else []
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
            # the decode kernel priced by its parallelism (CTAs per token, FA3's split-KV): the engines' own
            # kernels measured at B = 1..256 (mla_lab.model.decode_kernels); the prefill tokens' MMAs by the roofline
            if self.dkern is None:
                zeros = replace(op, dims={**op.dims, "content": "zeros"})
                t = self.dcal.kernel_decode.ms(op_time_ms(zeros, arch, self.gcal), max(self.dec_keys),
                                               sum(self.dec_keys), self.model.head_size * 2, arch)
            else:
                fam = decode_family(parse_strategy(self.strategy).placement)
                t = self.dkern[fam].ms(len(dec), max(self.dec_keys), arch)
            if op.dims.get("content") == "stale" and self.cal.content is not None and self.cal.step_content() is None:
                t *= self.cal.content.factor(op.dims["H"], op.dims["Hp"], t)  # kernel-only scope
            return max(flop, t)
        if op.op_class.startswith("attn_") and op.name in _ATTN_KERNELS:
            t = op_time_ms(op, arch, self.gcal)
            return t + (_ATTN_KERNELS[op.name] * self.dcal.attn_floor_us.get(op.name, 0.0) * 1e-3 if op.bytes else 0.0)
        return op_time_ms(op, arch, self.gcal, self.tp)


def _eager_ms(gpu_ms: float, n_ops: int, dcal: DecodeCalibration) -> tuple[float, float]:
    """(eager step time, host time) in ms for ``n_ops`` launches."""
    host = n_ops * dcal.host_us_per_op * 1e-3
    return max(gpu_ms + n_ops * dcal.eager_gap_us * 1e-3, host), host


def launched(gpu_ms: float, step: Step, n_ops: int, dcal: DecodeCalibration) -> dict:
    """``{"total_ms", "gpu_ms", "host_ms", "launch"}`` (ms): a ``FULL`` CUDA-graph step costs its GPU time, any
    other the eager launch model (module docstring)."""
    if step.cuda_graph:
        return {"total_ms": gpu_ms, "gpu_ms": gpu_ms, "host_ms": 0.0, "launch": "graph"}
    total, host = _eager_ms(gpu_ms, n_ops, dcal)
    return {"total_ms": total, "gpu_ms": gpu_ms, "host_ms": host, "launch": "eager"}


def step_key(step: Step) -> tuple:
    """What the pricers read of a step: the decode contexts, the prefill chunks' ``(start, num_tokens)`` in order and
    ``cuda_graph`` (request ids are renumbered by position, the padded capture size is not priced): equal keys cost
    the same."""
    return (tuple(d.context_len for d in step.decode), tuple((c.start, c.num_tokens) for c in step.prefill_chunks),
            step.cuda_graph)


class MemoPricer:
    """A step pricer with a ``price(step) -> {"total_ms", ...}`` method: calling it gives ``total_ms`` (ms), priced
    once per :func:`step_key`."""

    def __call__(self, step: Step) -> float:
        memo, key = self.__dict__.setdefault("_memo", {}), step_key(step)
        if key not in memo:
            memo[key] = self.price(step)["total_ms"]
        return memo[key]


def layer_decode_ms(rank: RankView, strategy: str, prefill=(), decode_contexts=(),
                    calibration: Calibration | None = None, decode_cal: DecodeCalibration | None = None, *,
                    graph: bool = True, measured_subset: bool = True, decode_kernels: str = "engine") -> dict:
    """One per-rank MoE layer of a step (``prefill`` chunks ``(req, start, n)``, decode tokens of
    ``decode_contexts``) with the decode calibration, as ``mla_lab.fits.decode`` fits it on ``decode_layer.csv``:
    ``measured_subset`` only the ops the measured layer runs; ``graph`` CUDA-graph replay or eager;
    ``decode_kernels`` ``engine`` (:mod:`mla_lab.model.decode_kernels`) or ``fit`` (:class:`KernelDecode`).

    Returns ``{"total_ms", "gpu_ms", "host_ms", "n_ops", "ops": {name: ms}}`` (ms, one layer).

    Raises:
        ValueError: an unknown strategy or ``decode_kernels`` (one line, the allowed values).
    """
    RankView.require(rank)
    strategy = resolve_strategy(strategy)
    dcal = decode_cal if decode_cal is not None else load_decode_calibration()
    parts = _Parts(rank, strategy, prefill, decode_contexts, resolve_calibration(calibration), dcal, decode_kernels)
    ops = layer_ops(rank, strategy, parts.ws, layer_kind="moe")
    if measured_subset:
        ops = [op for op in ops if op.impl and not op.is_comm]
    per = {op.name: parts.op_ms(op) for op in ops}
    gpu = sum(per.values()) + dcal.layer_fixed_us * 1e-3
    total, host = (gpu, 0.0) if graph else _eager_ms(gpu, len(ops), dcal)
    return {"total_ms": total, "gpu_ms": gpu, "host_ms": host, "n_ops": len(ops), "ops": per}


class CostModelPricer(MemoPricer):
    """One engine step on one TP rank (``rank``: ``bf16`` KV pads the kernel, decode included) priced by the cost
    model (module docstring); ``strategy`` a strategy, alias or preset (its first member); calibrations None: the
    committed ones. Calling it gives the step's ms; :meth:`price` the breakdown.

    Raises:
        ValueError: an unknown strategy (one line, the allowed values).
    """

    def __init__(self, rank: RankView, strategy: str, calibration: Calibration | None = None,
                 decode_cal: DecodeCalibration | None = None):
        RankView.require(rank)
        self.rank, self.model, self.tp, self.arch = rank, rank.model, rank.tp, rank.arch
        self.strategy = resolve_strategy(strategy)
        self.calibration = resolve_calibration(calibration)
        self.decode_cal = decode_cal if decode_cal is not None else load_decode_calibration()
        self.gcal = self.decode_cal.graph_calibration(self.calibration)
        self.n_ops = sum(n for _, n in step_ops(rank, self.strategy, WorkStep([(0, 0, 1)])))  # launches per step
        L = self.model.num_hidden_layers
        idx_layers = len({i for i in self.model.indexer_layers if 0 <= i < L})
        self.counts = {"idx_logits": idx_layers, "idx_topk": idx_layers, **dict.fromkeys(ATTN_OPS, L)}

    def __repr__(self) -> str:
        return (f"CostModelPricer({self.model.name!r}, tp={self.tp}, arch={self.arch.name!r}, "
                f"strategy={self.strategy!r}, kv_cache_dtype={self.rank.kv_cache_dtype!r})")

    def price(self, step: Step) -> dict:
        """The step's time and its parts: ``total_ms``, ``gpu_ms``, ``host_ms`` (eager steps), ``launch``
        (``graph`` or ``eager``), ``by_op`` (ms over all layers), ``attention_path_ms``, ``comm_ms``."""
        parts = _Parts(self.rank, self.strategy, [(c.req_id, c.start, c.num_tokens) for c in step.prefill_chunks],
                       [d.context_len for d in step.decode], self.calibration, self.decode_cal)
        base = step_time_ms(self.rank, self.strategy, parts.ws, self.gcal)
        by = dict(base["by_op"])
        one_layer = {op.name: op for op in layer_ops(self.rank, self.strategy, parts.ws, layer_kind="moe")}
        for name in list(OVERRIDDEN_OPS) + list(_ATTN_KERNELS):
            if name in by and name in one_layer:
                by[name] = parts.op_ms(one_layer[name]) * self.counts[name]
                if base["content"]["scope"] == "step" and not one_layer[name].is_comm:  # stale heads over the step
                    by[name] *= base["content"]["attention_factor" if name in ATTN_OPS else "rest_factor"]
        gpu = sum(by.values()) + self.decode_cal.layer_fixed_us * 1e-3 * self.model.num_hidden_layers
        return {**launched(gpu, step, self.n_ops, self.decode_cal), "by_op": by,
                "attention_path_ms": sum(by.get(a, 0.0) for a in ATTN_OPS), "comm_ms": base["comm"]}
