"""The measurement loops over :class:`mla_lab.measure.layer.Layer` and the extras beside them, rows of
:data:`LAYER_OUTPUTS` written through one :class:`mla_lab.measure.sink.Sink` as measured (a killed run loses nothing
measured). :func:`run_extras` runs the five extras (``layer_extras.csv`` rows), each guarded on its own; on CPU their
shapes shrink and the GPU-only parts (memory statistics, profiler, fp8) are skipped.
"""

from __future__ import annotations

import math
import traceback
from typing import Callable, Iterator, Sequence

import torch

from ..arch import GPUArch
from ..buffers import MIB, memory_account, padded_num_heads
from ..deployment import Deployment, RankView
from ..model.ops import layer_ops
from ..models import ModelConfig
from ..placement import Strategy
from ..workload import sum_topk_lengths
from .attention import call_peak_bytes
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


def _time(settings: MeasureSettings, log, what: str, build, graph: bool = False) -> tuple:
    """``(ms, status, extra)`` of ``build() -> (fn, extra)``: ``fn`` called once, then
    :meth:`MeasureSettings.median_ms`; ``fn`` None: ``(None, "ok", extra)``; a raise: ``ms`` NaN, status ``error
    <type>: <message>`` (logged after ``what``), ``extra`` None."""
    try:
        fn, extra = build()
        if fn is None:
            return None, "ok", extra
        fn()
        return settings.median_ms(fn, graph=graph), "ok", extra
    except Exception as e:
        status = f"error {type(e).__name__}: {str(e)[:150]}"
        log(f"{what}: {status}")
        _free(settings)
        return float("nan"), status, None


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
        v = concat_strategy or (variant if op.impl == "moe_bmm" else None)
        ms, status, _ = _time(settings, log, f"op {op_name} {model_name} tp={tp} T={T}",
                              lambda op=op, v=v: (layer.runner(op, T, variant=v), None))
        measured[key] = ms
        if ms is None:
            continue
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
    for strategy in strategies:
        for mode in ["eager"] + (["graph"] if settings.gpu and T <= 4096 else []):
            if settings.out_of_time():
                break
            ms, status, excluded = _time(settings, log, f"e2e {kind} {strategy.name} {mode} {model_name} tp={layer.tp} "
                                         f"T={T}", lambda s=strategy: layer.e2e(T, s, kind, variant), mode == "graph")
            yield _e2e_row(layer, model_name, T, variant, kind, strategy, mode, ms, excluded, implementations, status)


def _e2e_row(layer, model_name, T, variant, kind, strategy, mode, ms, excluded, implementations, status) -> dict:
    """One ``layer_e2e.csv`` row."""
    return {"model": model_name, "tp": layer.tp, "moe_parallel": variant[0], "ep": variant[1], "T": T,
            "layer_kind": kind, "strategy": strategy.name, "content": layer.content_of(strategy), "mode": mode,
            "ms": ms, "excluded_ops": ";".join(excluded or []),
            "impl_detail": f"{implementations.kernel_detail}; {implementations.concat_detail}", "status": status}


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
    fa, excluded = layer.e2e(T, a, kind, variant)
    fb, _ = layer.e2e(T, b, kind, variant)
    a_ms, b_ms, difference_ms, difference_iqr_ms = paired_timing(fa, fb, pairs, settings.device)
    del fa, fb
    layer_rows = [_e2e_row(layer, model_name, T, variant, kind, s, "paired", ms, excluded, implementations, "ok")
                  for s, ms in ((a, a_ms), (b, b_ms))]
    delta_row = {"experiment": "e2e_paired_delta", "model": model_name, "tp": layer.tp, "T": T, "H": layer.H,
                 "Hp": layer.Hp, "name": f"{kind}_{variant[0]}", "ms": difference_ms,
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
            for T in tokens:
                for variant in moe_variants(tp):
                    e2e = not skip_e2e and (variant[0] != "ep" or tp == max(tps))
                    _point(sink, layer, model_name, T, variant, arch, settings, implementations, log, strategies,
                           measured, e2e, pairs)
                log(f"{model_name} tp={tp} T={T}: {sink.rows.get(OPS_CSV, 0)} op rows, {sink.rows.get(E2E_CSV, 0)} "
                    "e2e rows")
            del layer
            _free(settings)


def _free(settings: MeasureSettings) -> None:
    if settings.gpu:
        torch.cuda.empty_cache()


def _point(sink, layer, name, T, variant, arch, settings, impl, log, strategies, measured, e2e, pairs) -> None:
    """One (T, variant) of a :class:`Layer`: its ops, its layers end to end and their pairs, rows to the sink."""
    for row in measure_ops(layer, name, T, variant, arch, settings, impl, measured, log, strategies):
        sink.write(OPS_CSV, row)
    for kind in layer_kinds(variant) if e2e else ():
        for row in measure_layers(layer, name, T, variant, kind, settings, impl, log, strategies):
            sink.write(E2E_CSV, row)
        if not pairs or len(strategies) < 2 or settings.out_of_time():
            continue
        try:
            layer_rows, delta_row = measure_layer_pairs(layer, name, T, variant, kind, pairs, settings, impl,
                                                        strategies)
        except Exception as e:  # noqa: BLE001 - logged; the run goes on
            log(f"paired {kind} {name} tp={layer.tp} T={T}: {type(e).__name__}: {e}")
            _free(settings)
            continue
        for row in layer_rows:
            sink.write(E2E_CSV, row)
        sink.write(EXTRAS_CSV, delta_row)


def ceilings(settings: MeasureSettings) -> Iterator[dict]:
    """Ceilings: ``d2d_copy`` of ``2^28`` elements (GB/s, read + write) and ``matmul_8192^3`` (TFLOP/s)."""
    device, dtype = settings.device, settings.dtype
    n = (1 << 28) if settings.gpu else (1 << 16)
    a = torch.randn(n, device=device, dtype=dtype)
    b = torch.empty_like(a)
    ms = settings.median_ms(lambda: b.copy_(a))
    nbytes = 2 * a.numel() * a.element_size()
    yield {"experiment": "ceiling", "name": "d2d_copy", "ms": ms, "bytes": nbytes, "value": nbytes / ms / 1e6,
           "unit": "GB/s (read+write)"}
    s = 8192 if settings.gpu else 128
    a = torch.randn(s, s, device=device, dtype=dtype)
    b = torch.randn(s, s, device=device, dtype=dtype)
    ms = settings.median_ms(lambda: a @ b)
    yield {"experiment": "ceiling", "name": f"matmul_{s}^3", "ms": ms, "flops": 2 * s**3,
           "value": 2 * s**3 / ms / 1e9, "unit": "TFLOP/s"}


def _w_uv_variants(view, W, out_view, contiguous, batch_contiguous) -> dict:
    """The W_UV bmm five ways: vLLM's strided ``out[:, :H]`` view into a transposed output view, into a fresh
    output, from a contiguous copy (made beforehand), from a batch-major copy, and copying inside."""
    return {
        "bmm_view_out_view": lambda: torch.bmm(view.transpose(0, 1), W, out=out_view),
        "bmm_view": lambda: torch.bmm(view.transpose(0, 1), W),
        "bmm_contig_input": lambda: torch.bmm(contiguous.transpose(0, 1), W, out=out_view),
        "bmm_batch_contig_input": lambda: torch.bmm(batch_contiguous, W, out=out_view),
        "contiguous_then_bmm": lambda: torch.bmm(view.contiguous().transpose(0, 1), W, out=out_view),
    }


def _kernels_launched(fn) -> str:
    """The CUDA kernels one call of ``fn`` launches (``torch.profiler``), ``|``-joined, or why the profiler failed."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return "|".join(sorted({e.key[:60] for e in prof.key_averages()
                                if e.device_type.name == "CUDA" or "cuda" in str(e.device_type).lower()}))
    except Exception as e:  # profiler optional
        return f"profiler failed: {type(e).__name__}"


def w_uv_slice(settings: MeasureSettings, models: list[tuple[str, ModelConfig]], arch: GPUArch,
               max_T: int) -> Iterator[dict]:
    """Does the W_UV bmm copy the ``[:, :H]`` slice? Per model and tp (8 and 4; CPU: 2) at ``T = max_T``, the five
    variants of :func:`_w_uv_variants`: median ``ms``, the call's peak extra bytes (``value``) and the CUDA kernels
    launched (``note``; both GPU only)."""
    device, dtype = settings.device, settings.dtype
    for model_name, model in models:
        for tp in (8, 4) if settings.gpu else (2,):
            H, T, d_v = model.heads_per_rank(tp), max_T, model.v_head_dim
            Hp = padded_num_heads(H, arch, "bf16")
            attention = torch.randn(T, Hp, 512, device=device, dtype=dtype)
            W = torch.randn(H, 512, d_v, device=device, dtype=dtype) / math.sqrt(512)
            view = attention[:, :H]
            out = torch.empty(T, H * d_v, device=device, dtype=dtype)
            variants = _w_uv_variants(view, W, out.view(T, H, d_v).transpose(0, 1), view.contiguous(),
                                      view.transpose(0, 1).contiguous())
            for variant_name, fn in variants.items():
                ms = settings.median_ms(fn)
                extra_bytes = call_peak_bytes(fn) if settings.gpu else None
                kernels = _kernels_launched(fn) if settings.gpu else ""
                yield {"experiment": "w_uv_slice", "model": model_name, "tp": tp, "T": T, "H": H, "Hp": Hp,
                       "name": variant_name, "ms": ms, "value": extra_bytes, "unit": "peak extra bytes during call",
                       "note": f"view.is_contiguous()={view.is_contiguous()}; "
                               f"transpose contiguous={view.transpose(0, 1).is_contiguous()}; kernels={kernels}"}
            del attention, W, out, variants


def peak_memory(settings: MeasureSettings, implementations: Implementations, models: list[tuple[str, ModelConfig]],
                arch: GPUArch, max_T: int) -> Iterator[dict]:
    """Peak memory per strategy of the attention path alone at ``T = max_T``, tp 8, the workspace allocated inside
    the measured window: ``value`` the measured peak above the baseline, ``bytes`` the
    :func:`~mla_lab.buffers.memory_account` peak (bytes). GPU with a kernel only (a ``note`` row without one)."""
    device, dtype = settings.device, settings.dtype
    kernel, concat = implementations.kernel, implementations.concat
    if kernel is None:
        yield {"experiment": "note", "name": "flash_mla", "note": "flash_mla not importable: kernel skipped"}
    if not settings.gpu or kernel is None:
        return
    for model_name, model in models:
        tp, T = 8, max_T
        H, Hp = model.heads_per_rank(tp), padded_num_heads(model.heads_per_rank(tp), arch, "bf16")
        for strategy in LAYER_STRATEGIES:  # per_call_zeros (a new_zeros pad per call), private_workspace
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            ql_nope = torch.randn(T, H, 512, device=device, dtype=dtype)
            q_pe = torch.randn(T, H, 64, device=device, dtype=dtype)
            kv = torch.randn(max(T, 4096), 1, 576, device=device, dtype=dtype)
            indices = torch.randint(0, kv.shape[0], (T, 1, model.topk), device=device, dtype=torch.int32)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            if strategy.per_call_pad:
                workspace = torch.empty(max_T, H, 576, device=device, dtype=dtype)
                concat(ql_nope, q_pe, workspace[:T])
                qk = workspace[:T].new_zeros((T, Hp, 576))
                qk[:, :H] = workspace[:T]
            else:
                workspace = torch.empty(max_T, Hp, 576, device=device, dtype=dtype)
                qk = workspace[:T]
                concat(ql_nope, q_pe, qk)
            out = kernel(qk, kv, indices, 1.0 / 16)
            del qk
            o = out[:, :H]  # noqa: F841  (a view: vLLM's slice)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            persistent = torch.cuda.memory_allocated() - base
            account = memory_account(strategy.name, H, max_T, arch, "bf16", T)
            yield {"experiment": "peak_memory", "model": model_name, "tp": tp, "T": T, "H": H, "Hp": Hp,
                   "name": strategy.name, "content": "zeros", "value": peak, "bytes": account.peak_bytes,
                   "unit": "bytes (measured peak above baseline; 'bytes' = memory_account peak_bytes)",
                   "note": f"held after step {persistent} B ({persistent / MIB:.1f} MiB); "
                           f"account persistent {account.persistent_bytes / MIB:.1f} MiB transient "
                           f"{account.step_transient_bytes / MIB:.1f} MiB kernel_out "
                           f"{account.kernel_out_bytes / MIB:.1f} MiB"}
            del workspace, out, o, ql_nope, q_pe, kv, indices


def causal_kernel(settings: MeasureSettings, implementations: Implementations,
                  models: list[tuple[str, ModelConfig]], arch: GPUArch) -> Iterator[dict]:
    """The sparse kernel with causal ``topk_length`` (first model, tp 8; CPU: 2): ``seed_16x1024`` (16 prompts of
    1024 in one step), ``one_prompt_4096``, ``full_topk_16384`` (random indices). ``flops`` = 2 sum(topk_length) H'
    (576 + 512); ``value`` = sum(topk_length). Nothing without a kernel."""
    device, dtype, kernel = settings.device, settings.dtype, implementations.kernel
    if kernel is None:
        return
    for model_name, model in models[:1]:
        tp = 8 if settings.gpu else 2
        H, Hp = model.heads_per_rank(tp), padded_num_heads(model.heads_per_rank(tp), arch, "bf16")
        cases = ([("seed_16x1024", 16384, 1024), ("one_prompt_4096", 4096, 4096), ("full_topk_16384", 16384, 0)]
                 if settings.gpu else [("tiny", 256, 64), ("tiny_full", 256, 0)])
        for name, T, prompt_len in cases:
            q = torch.randn(T, Hp, 576, device=device, dtype=dtype)
            s_kv = max(T, 4096) if settings.gpu else max(T, 2 * model.topk)
            kv = torch.randn(s_kv, 1, 576, device=device, dtype=dtype)
            topk = model.topk
            if prompt_len:
                position = torch.arange(T, device=device) % prompt_len
                topk_length = torch.clamp(position + 1, max=topk).to(torch.int32)
                # token at position p of its prompt attends keys of its own prompt start..start+p
                start = (torch.arange(T, device=device) // prompt_len) * prompt_len
                offsets = torch.arange(topk, device=device)
                indices = (start[:, None] + offsets[None, :]).to(torch.int32)
                indices = torch.where(offsets[None, :] < topk_length[:, None], indices,
                                      torch.full_like(indices, -1)).view(T, 1, topk)
                sum_topk = sum(sum_topk_lengths(0, min(prompt_len, T - s), topk) for s in range(0, T, prompt_len))
            else:
                topk_length = None
                indices = torch.randint(0, s_kv, (T, 1, topk), device=device, dtype=torch.int32)
                sum_topk = T * topk
            ms = settings.median_ms(lambda q=q, kv=kv, indices=indices, topk_length=topk_length: kernel(
                q, kv, indices, 1.0 / 16, topk_length=topk_length))
            yield {"experiment": "kernel_topk_length", "model": model_name, "tp": tp, "T": T, "H": H, "Hp": Hp,
                   "name": name, "ms": ms, "flops": 2 * sum_topk * Hp * (576 + 512), "value": sum_topk,
                   "unit": "sum(topk_length)", "content": "stale"}  # q all N(0, 1), padded heads too
            del q, kv, indices


def pad_values(settings: MeasureSettings, implementations: Implementations, models: list[tuple[str, ModelConfig]],
               arch: GPUArch, max_T: int) -> Iterator[dict]:
    """Does the sparse kernel's time depend on what the padded heads hold? First model, tp 8 (CPU: 2), T 4096 and
    ``max_T``: the same real heads, the padded heads ``stale`` (N(0, 1)), ``zeros``, ``nan`` (older rows: ``random``
    / ``zero``). Nothing without a kernel."""
    device, dtype, kernel = settings.device, settings.dtype, implementations.kernel
    if kernel is None:
        return
    model_name, model = models[0]
    tp = 8 if settings.gpu else 2
    H, Hp = model.heads_per_rank(tp), padded_num_heads(model.heads_per_rank(tp), arch, "bf16")
    for T in ((4096, max_T) if settings.gpu else (max_T,)):
        kv = torch.randn(max(T, 2 * model.topk), 1, 576, device=device, dtype=dtype)
        indices = torch.randint(0, kv.shape[0], (T, 1, model.topk), device=device, dtype=torch.int32)
        base = torch.randn(T, Hp, 576, device=device, dtype=dtype)
        for fill in ("stale", "zeros", "nan"):
            q = base.clone()
            if fill == "zeros":
                q[:, H:].zero_()
            elif fill == "nan":
                q[:, H:] = float("nan")
            ms = settings.median_ms(lambda q=q, kv=kv, indices=indices: kernel(q, kv, indices, 1.0 / 16))
            yield {"experiment": "kernel_pad_values", "model": model_name, "tp": tp, "T": T, "H": H, "Hp": Hp,
                   "name": fill, "ms": ms, "content": fill if fill != "nan" else "",
                   "note": "padded heads H..H'-1 filled with this (stale: N(0, 1); nan: a poison check, no "
                           "content); real heads random"}


def run_extras(sink, settings: MeasureSettings, implementations: Implementations,
               models: list[tuple[str, ModelConfig]], arch: GPUArch, max_T: int,
               log: Callable[[str], None] = print) -> None:
    """The five extras in order, rows to ``sink``'s ``layer_extras.csv`` as they come; one failing logs its
    traceback and writes an ``error`` row naming it, and the others run."""
    experiments = (
        ("ceilings", lambda: ceilings(settings)),
        ("w_uv_slice", lambda: w_uv_slice(settings, models, arch, max_T)),
        ("peak_memory", lambda: peak_memory(settings, implementations, models, arch, max_T)),
        ("causal_kernel", lambda: causal_kernel(settings, implementations, models, arch)),
        ("pad_values", lambda: pad_values(settings, implementations, models, arch, max_T)),
    )
    for name, experiment in experiments:
        try:
            for row in experiment():
                sink.write(EXTRAS_CSV, row)
            log(f"{name} done")
        except Exception as e:
            log(f"{name} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            sink.write(EXTRAS_CSV, {"experiment": "error", "name": name, "note": f"{type(e).__name__}: {str(e)[:200]}"})


def fp8_gemm_rows(settings: MeasureSettings, model: ModelConfig, arch: GPUArch, tokens: list[int]) -> Iterator[dict]:
    """fp8 GEMMs (``torch._scaled_mm``, per-tensor scales, bf16 out) at the model's TP8 EP per-rank shapes
    (:func:`~mla_lab.model.ops.layer_ops`) per T of ``tokens``, each (M, K, N) once, dims not divisible by 16 skipped:
    ``layer_ops.csv`` rows (``gemm_fp8``; a failure: ``ms`` NaN, ``error`` status). GPU only; stops at the deadline."""
    if not settings.gpu:
        return
    device = settings.device
    seen = set()
    # the seed's rank (TP8, fp8 weights, experts ep), built once at the door; the GEMM shapes do not read its limits
    rank = Deployment.rank_of(model=model, tp=8, arch=arch, kv_cache_dtype="bf16", weight_dtype="fp8",
                              moe_parallel="ep", max_num_batched_tokens=16384)
    for T in tokens:
        for op in layer_ops(rank, "private_workspace", T):
            if op.op_class != "gemm_fp8" or settings.out_of_time():
                continue
            dims = op.dims
            key = (dims["M"], dims["K"], dims["N"])
            if key in seen or dims["N"] % 16 or dims["K"] % 16:
                continue
            seen.add(key)
            try:
                a = torch.randn(dims["M"], dims["K"], device=device).to(torch.float8_e4m3fn)
                b = torch.randn(dims["N"], dims["K"], device=device).to(torch.float8_e4m3fn)
                one = torch.tensor(1.0, device=device)

                def fn(a=a, b=b, one=one):
                    return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                fn()
                ms = settings.median_ms(fn)
                status = "ok"
            except Exception as e:
                ms, status = float("nan"), f"error {type(e).__name__}: {str(e)[:100]}"
            yield {"model": model.name, "tp": 8, "moe_parallel": "ep", "ep": 8, "T": T, "op": op.name,
                   "op_class": "gemm_fp8", "impl": "scaled_mm", "impl_detail": "torch._scaled_mm per-tensor",
                   "dims": op.to_dict()["dims"], "dtype": "fp8", "flops": op.flops, "bytes": op.bytes,
                   "ms": ms, "content": "", "status": status}
