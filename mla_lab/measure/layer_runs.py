"""The measurement loops over :class:`mla_lab.measure.layer.Layer`: rows of :data:`LAYER_OUTPUTS` written through one
:class:`mla_lab.measure.sink.Sink` as measured (a killed run loses nothing measured).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from ..arch import GPUArch
from ..deployment import Deployment, RankView
from ..model.ops import layer_ops
from ..models import ModelConfig
from ..placement import Strategy
from .layer import (
    E2E_COLUMNS,
    E2E_CSV,
    EXTRAS_COLUMNS,
    EXTRAS_CSV,
    LAYER_STRATEGIES,
    OPS_COLUMNS,
    OPS_CSV,
    Implementations,
    Layer,
    MeasureSettings,
)
from .timer import interleaved, summarize

__all__ = ["paired_timing", "moe_variants", "layer_kinds", "ops_to_time", "measure_ops",
           "measure_layers", "measure_layer_pairs", "run_layer_benchmark", "LAYER_OUTPUTS", "read_rows"]

#: The files one layer run writes (its :class:`~mla_lab.measure.sink.Sink`'s outputs).
LAYER_OUTPUTS = {OPS_CSV: OPS_COLUMNS, E2E_CSV: E2E_COLUMNS, EXTRAS_CSV: EXTRAS_COLUMNS}


def paired_timing(fa: Callable[[], object], fb: Callable[[], object], pairs: int,
                  device: str) -> tuple[float, float, float, float]:
    """``(a_ms, b_ms, difference_ms, difference_iqr_ms)``: medians of ``fa`` and ``fb`` timed alternately ``pairs``
    times (:func:`mla_lab.measure.timer.interleaved`: drift hits both alike), the median and IQR of ``a_i - b_i``."""
    samples = interleaved({"a": fa, "b": fb}, repeats=pairs, device=device)
    differences = summarize([a - b for a, b in zip(samples["a"], samples["b"])])
    return (summarize(samples["a"])["median"], summarize(samples["b"])["median"], differences["median"],
            differences["iqr"])


def moe_variants(tp: int) -> list[tuple[str, int]]:
    """MoE layouts measured at ``tp``: TP-sharded experts, and (tp > 1) expert parallelism with ep = tp."""
    return [("tp", 1)] + ([("ep", tp)] if tp > 1 else [])


def layer_kinds(variant: tuple[str, int]) -> tuple[str, ...]:
    """Layer kinds timed end to end under a MoE variant: ``moe`` and ``dense`` under ``tp``, ``moe`` under ``ep``."""
    return ("moe", "dense") if variant[0] == "tp" else ("moe",)


def measured_rank(model: ModelConfig, tp: int, arch: GPUArch, variant: tuple[str, int]) -> RankView:
    """The rank the layer runner measures (:meth:`~mla_lab.deployment.Deployment.rank_of`): bf16 weights and KV
    cache, MoE ``variant`` ``(moe_parallel, ep)``, ``max_num_batched_tokens`` 16384 (vLLM PR #53878's
    ``--max-num-batched-tokens``; the layer's ops do not read it).

    Raises:
        ValueError: as :meth:`~mla_lab.deployment.Deployment.rank_of` (a ``tp`` that does not divide the model).
    """
    parallel, ep = variant
    rank = Deployment.rank_of(model=model, tp=tp, arch=arch, kv_cache_dtype="bf16", weight_dtype="bf16",
                              moe_parallel=parallel, max_num_batched_tokens=16384)
    return rank.with_ep_size(ep) if parallel == "ep" else rank


def ops_to_time(rank: RankView, T: int, variant: tuple[str, int],
                strategies: Sequence[Strategy] = LAYER_STRATEGIES) -> dict:
    """``{(op name, concat Strategy or None): LayerOp}``: the measurable ops of ``strategies`` and the variant's
    layer kinds at ``T`` tokens, each once (``concat`` once per strategy: another buffer); no communication or
    modelled-only ops; under ``ep`` only the ``moe_*`` ops. ``rank``: :func:`measured_rank` of the variant."""
    parallel = variant[0]
    ops = {}
    for kind in layer_kinds(variant):
        for strategy in strategies:
            for op in layer_ops(rank, strategy, T, layer_kind=kind):
                if op.impl and not op.is_comm:
                    concat_strategy = strategy if op.name == "concat" else None
                    ops[(op.name, concat_strategy)] = op
    if parallel == "ep":
        ops = {key: op for key, op in ops.items() if key[0].startswith("moe_")}
    return ops


def measure_ops(layer: Layer, model_name: str, T: int, variant: tuple[str, int], arch: GPUArch,
                settings: MeasureSettings, implementations: Implementations, measured: dict,
                log: Callable[[str], None] = print,
                strategies: Sequence[Strategy] = LAYER_STRATEGIES) -> Iterator[dict]:
    """A ``layer_ops.csv`` row per op of :func:`ops_to_time`, each unique shape once (``measured``, ``{shape key:
    ms or None}``, shared across tp and T, skips those timed). A raising op: ``ms`` NaN, status ``error <type>:
    <message>``. Stops at the deadline."""
    parallel, ep = variant
    tp = layer.tp
    for (op_name, concat_strategy), op in ops_to_time(measured_rank(layer.model, tp, arch, variant), T, variant,
                                                                  strategies).items():
        if settings.out_of_time():
            break
        shape = (tuple(sorted(op.dims.items())) if op.op_class != "attn_kernel" else (op.dims["T"], op.dims["Hp"]))
        buffer = None if concat_strategy is None else ("heads" if concat_strategy.per_call_pad else "padded")
        key = (model_name, op.impl, buffer, shape, parallel if op.impl == "moe_bmm" else None)
        if key in measured:
            continue
        status = "ok"
        try:
            fn = layer.runner(op, T, variant=concat_strategy or (variant if op.impl == "moe_bmm" else None))
            if fn is None:
                measured[key] = None
                continue
            fn()
            ms = settings.median_ms(fn)
            del fn
        except Exception as e:
            ms, status = float("nan"), f"error {type(e).__name__}: {str(e)[:150]}"
            log(f"op {op_name} {model_name} tp={tp} T={T}: {status}")
            if settings.gpu:
                torch.cuda.empty_cache()
        measured[key] = ms
        detail = {"attn_concat": implementations.concat_detail,
                  "attn_kernel": implementations.kernel_detail}.get(op.op_class, "")
        if concat_strategy:
            detail += f" into {'H-head buffer' if concat_strategy.per_call_pad else 'padded workspace'}"
        yield {"model": model_name, "tp": tp, "moe_parallel": parallel, "ep": ep, "T": T, "op": op_name,
               "op_class": op.op_class, "impl": op.impl, "impl_detail": detail, "dims": op.to_dict()["dims"],
               "dtype": op.dtype, "flops": op.flops, "bytes": op.bytes, "ms": ms,
               "content": layer.content if op.impl == "attn_kernel" else "", "status": status}


def measure_layers(layer: Layer, model_name: str, T: int, variant: tuple[str, int], kind: str,
                   settings: MeasureSettings, implementations: Implementations,
                   log: Callable[[str], None] = print,
                   strategies: Sequence[Strategy] = LAYER_STRATEGIES) -> Iterator[dict]:
    """``layer_e2e.csv`` rows: the layer of ``kind`` (:meth:`Layer.e2e`) per strategy, ``eager`` and (GPU, ``T <=
    4096``) ``graph``. A failing call: ``ms`` NaN, an ``error`` status. Stops at the deadline."""
    parallel, ep = variant
    detail = f"{implementations.kernel_detail}; {implementations.concat_detail}"
    for strategy in strategies:
        for mode in ["eager"] + (["graph"] if settings.gpu and T <= 4096 else []):
            if settings.out_of_time():
                break
            status = "ok"
            try:
                fn, excluded = layer.e2e(T, strategy, kind, variant)
                fn()
                ms = settings.median_ms(fn, graph=mode == "graph")
                del fn
            except Exception as e:
                ms, excluded, status = float("nan"), [], f"error {type(e).__name__}: {str(e)[:150]}"
                log(f"e2e {kind} {strategy.name} {mode} {model_name} tp={layer.tp} T={T}: {status}")
                if settings.gpu:
                    torch.cuda.empty_cache()
            yield {"model": model_name, "tp": layer.tp, "moe_parallel": parallel, "ep": ep, "T": T,
                   "layer_kind": kind, "strategy": strategy.name, "content": layer.content_of(strategy),
                   "mode": mode, "ms": ms, "excluded_ops": ";".join(excluded), "impl_detail": detail,
                   "status": status}


def measure_layer_pairs(layer: Layer, model_name: str, T: int, variant: tuple[str, int], kind: str, pairs: int,
                        settings: MeasureSettings, implementations: Implementations,
                        strategies: Sequence[Strategy] = LAYER_STRATEGIES) -> tuple[list[dict], dict]:
    """The layers of the first two ``strategies`` timed alternately (:func:`paired_timing`; where ``H == H'`` a
    null control for the noise): ``(two layer_e2e.csv "paired" rows, a layer_extras.csv "e2e_paired_delta" row)``,
    its ``ms`` the median of ``a - b``, its ``value`` the IQR.

    Raises:
        ValueError: fewer than two strategies.
    """
    if len(strategies) < 2:
        raise ValueError(f"strategies={[s.name for s in strategies]}: pairs need two")
    a, b = strategies[:2]
    parallel, ep = variant
    fa, excluded = layer.e2e(T, a, kind, variant)
    fb, _ = layer.e2e(T, b, kind, variant)
    a_ms, b_ms, difference_ms, difference_iqr_ms = paired_timing(fa, fb, pairs, settings.device)
    del fa, fb
    detail = f"{implementations.kernel_detail}; {implementations.concat_detail}"
    layer_rows = [{"model": model_name, "tp": layer.tp, "moe_parallel": parallel, "ep": ep, "T": T,
                   "layer_kind": kind, "strategy": strategy.name, "content": layer.content_of(strategy),
                   "mode": "paired", "ms": ms, "excluded_ops": ";".join(excluded), "impl_detail": detail,
                   "status": "ok"}
                  for strategy, ms in ((a, a_ms), (b, b_ms))]
    delta_row = {"experiment": "e2e_paired_delta", "model": model_name, "tp": layer.tp, "T": T, "H": layer.H,
                 "Hp": layer.Hp, "name": f"{kind}_{parallel}", "ms": difference_ms,
                 "value": difference_iqr_ms, "unit": f"ms: median({a.name} - {b.name}); value: IQR",
                 "content": layer.content_of(b), "note": f"{pairs} interleaved pairs"}
    return layer_rows, delta_row


def run_layer_benchmark(models: list[tuple[str, ModelConfig]], tps: list[int], tokens: list[int], arch: GPUArch,
                        settings: MeasureSettings, implementations: Implementations, sink,
                        log: Callable[[str], None] = print, pairs: int = 0, skip_e2e: bool = False,
                        strategies: Sequence[Strategy] = LAYER_STRATEGIES) -> None:
    """Every model x TP x T: the ops (:func:`measure_ops`) and, unless ``skip_e2e``, per layer kind the layer end
    to end (:func:`measure_layers`; ``ep`` at the largest TP only) and, ``pairs`` > 0, its pairs
    (:func:`measure_layer_pairs`). One :class:`Layer` per (model, tp) for ``max(tokens)``; rows to ``sink`` as
    measured; failures logged and skipped; the deadline stops the run."""
    measured: dict = {}
    for tp in tps:
        for model_name, model in models:
            if settings.out_of_time():
                log(f"budget reached before {model_name} tp={tp}")
                break
            try:
                layer = Layer(measured_rank(model, tp, arch, ("tp", 1)), settings.device, settings.dtype, max(tokens),
                              implementations.kernel, implementations.concat, settings.interpret, moe_variants(tp),
                              content=settings.content, disabled_kernels=settings.disabled_kernels)
            except Exception as e:  # noqa: BLE001 - a failed allocation skips this (model, tp)
                log(f"alloc failed {model_name} tp={tp}: {type(e).__name__}: {e}")
                _free(settings)
                continue
            run = _LayerRun(layer, model_name, arch, settings, implementations, sink, log, strategies, measured)
            for T in tokens:
                for variant in moe_variants(tp):
                    run.point(T, variant, e2e=not skip_e2e and (variant[0] != "ep" or tp == max(tps)), pairs=pairs)
                log(f"{model_name} tp={tp} T={T}: {sink.rows.get(OPS_CSV, 0)} op rows, {sink.rows.get(E2E_CSV, 0)} "
                    "e2e rows")
            del layer, run
            _free(settings)


def _free(settings: MeasureSettings) -> None:
    if settings.gpu:
        torch.cuda.empty_cache()


class _LayerRun:
    """One :class:`Layer`'s points: its ops, its layers end to end and their pairs, rows to the sink."""

    def __init__(self, layer, model_name, arch, settings, implementations, sink, log, strategies, measured):
        self.layer, self.name, self.arch, self.settings = layer, model_name, arch, settings
        self.impl, self.sink, self.log, self.strategies, self.measured = implementations, sink, log, strategies, \
            measured

    def point(self, T: int, variant: tuple[str, int], e2e: bool, pairs: int) -> None:
        for row in measure_ops(self.layer, self.name, T, variant, self.arch, self.settings, self.impl, self.measured,
                               self.log, self.strategies):
            self.sink.write(OPS_CSV, row)
        for kind in layer_kinds(variant) if e2e else ():
            for row in measure_layers(self.layer, self.name, T, variant, kind, self.settings, self.impl, self.log,
                                      self.strategies):
                self.sink.write(E2E_CSV, row)
            if pairs and len(self.strategies) >= 2 and not self.settings.out_of_time():
                self.pairs(T, variant, kind, pairs)

    def pairs(self, T: int, variant: tuple[str, int], kind: str, pairs: int) -> None:
        try:
            layer_rows, delta_row = measure_layer_pairs(self.layer, self.name, T, variant, kind, pairs, self.settings,
                                                        self.impl, self.strategies)
        except Exception as e:  # noqa: BLE001 - logged; the run goes on
            self.log(f"paired {kind} {self.name} tp={self.layer.tp} T={T}: {type(e).__name__}: {e}")
            _free(self.settings)
            return
        for row in layer_rows:
            self.sink.write(E2E_CSV, row)
        self.sink.write(EXTRAS_CSV, delta_row)


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a CSV as dicts of strings; ``[]`` when the file does not exist."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
