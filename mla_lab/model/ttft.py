"""Workload -> time to first token (TTFT), modelled: the public entry points of the cost model (docs/ttft-model.md).

A prompt's TTFT = the sum of step times (one rank; :func:`mla_lab.workload.schedule`) up to the step holding its
last token. Not modelled: CPU scheduling and launch gaps, sampling, interleaved decode steps, HTTP time.
"""

from __future__ import annotations

from .. import placement
from ..deployment import Deployment
from ..placement import BASELINE, Strategy, as_strategy, expand
from ..workload import schedule
from .calibration import Calibration, resolve_calibration
from .ops import ATTN_OPS
from .timing import attention_path_ms, step_time_ms

SCOPES = ("full_layer", "attention_path")
#: ``full_layer`` options beyond the deployment (:func:`mla_lab.model.ops.layer_ops`, the comm terms).
LAYER_OPTIONS = ("ep_size", "ep_comm", "out_slice_copy", "indexer_dtype", "context", "comm_efficiency",
                 "comm_latency_us")


def _check_deployment(deployment) -> Deployment:
    if not isinstance(deployment, Deployment):
        raise ValueError(f"deployment={deployment!r} must be a mla_lab.deployment.Deployment (build it with "
                         "Deployment.of(...) or Deployment.seed())")
    return deployment


def predict_ttft(deployment: Deployment, strategy: Strategy | str, calibration: Calibration | None = None,
                 scope: str = "full_layer", attention_override_ms: list[float] | None = None, **layer_kw) -> dict:
    """Modelled TTFT (ms) of ``deployment``'s workload on one rank. ``scope``: ``full_layer`` (every op) or
    ``attention_path`` (``num_hidden_layers x`` the path: a lower bound); ``attention_override_ms``: a measured
    attention path per layer, one per step; ``layer_kw``: :data:`LAYER_OPTIONS` (``full_layer`` only).
    Returns ``{ttft_ms_mean, ttft_ms_max, ttft_ms_list, num_steps, step_ms, ops_ms, step_ops_ms, attention_path_ms,
    comm_ms, scope, strategy, calibration, comm_source, source}``. Raises ValueError: not a Deployment; unknown scope
    or strategy; a bad layer option; as the cost functions."""
    d = _check_deployment(deployment)
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not known; allowed: {list(SCOPES)}")
    strategy = as_strategy(strategy)
    steps = schedule(d.workload, d.max_num_batched_tokens)
    cal, layer_kw = _check_ttft_args(scope, layer_kw, steps, attention_override_ms, resolve_calibration(calibration))
    rank = d.rank.with_ep_size(layer_kw.pop("ep_size", None))
    L = d.model.num_hidden_layers
    step_ms, ops_ms, ttfts, step_ops_ms = [], {}, [], []
    attn_total = comm_total = elapsed = 0.0
    priced: dict = {}  # a step's price depends only on its chunks' (start, length): equal steps priced once
    for i, st in enumerate(steps):
        sig = tuple((start, n) for _, start, n in st.chunks)
        if sig not in priced:
            priced[sig] = _price_step(rank, strategy, st, cal, scope, layer_kw)
        t, by_op, attn, comm = priced[sig]
        this = dict(by_op)
        attn_total += attn
        comm_total += comm
        if attention_override_ms is not None:
            measured = attention_override_ms[i] * L
            delta = measured - sum(v for k, v in this.items() if k in ATTN_OPS)
            t, attn_total = t + delta, attn_total + delta
            this = {k: v for k, v in this.items() if k not in ATTN_OPS} | {"attention_path": measured}
        for k, v in this.items():
            ops_ms[k] = ops_ms.get(k, 0.0) + v
        step_ops_ms.append(this)
        elapsed += t
        step_ms.append(t)
        ttfts.extend([elapsed] * len(st.finished_prompts(d.prompt_len)))
    return {"ttft_ms_mean": sum(ttfts) / len(ttfts), "ttft_ms_max": max(ttfts), "num_steps": len(steps),
            "step_ms": step_ms, "ops_ms": ops_ms,
            "scope": scope + (" (attention path measured)" if attention_override_ms is not None else ""),
            "ttft_ms_list": ttfts, "step_ops_ms": step_ops_ms, "strategy": strategy.name,
            "attention_path_ms": attn_total, "comm_ms": comm_total, "calibration": cal.name,
            "comm_source": cal.comm_source_checked(d.tp, arch=d.arch) if scope == "full_layer" else "none",
            "source": "modelled"}


def _check_ttft_args(scope: str, layer_kw: dict, steps, override, cal: Calibration) -> tuple[Calibration, dict]:
    """:func:`predict_ttft`'s options checked: ``(calibration with the comm options, the layer options left)``."""
    unknown = sorted(set(layer_kw) - set(LAYER_OPTIONS))
    if unknown:
        raise ValueError(f"layer option(s) {unknown} are not allowed here; allowed: {list(LAYER_OPTIONS)} (the "
                         "weight dtype, MoE layout and KV dtype are the Deployment's: Deployment.replace(...))")
    if override is not None and len(override) != len(steps):
        raise ValueError(f"attention_override_ms has {len(override)} entries; the workload has {len(steps)} steps")
    if scope == "attention_path":
        if layer_kw:
            raise ValueError(f"layer options {sorted(layer_kw)} only apply to scope='full_layer'; allowed for "
                             f"scope='attention_path': none")
        return cal, {}
    layer_kw = dict(layer_kw)
    comm_kw = {k: layer_kw.pop(k) for k in ("comm_efficiency", "comm_latency_us") if k in layer_kw}
    return (cal.with_comm(**comm_kw) if comm_kw else cal), layer_kw


def _price_step(rank, strategy: Strategy, st, cal: Calibration, scope: str, layer_kw: dict) -> tuple:
    """``(total ms, ms per op, attention-path ms, comm ms)`` of one step at ``scope``."""
    if scope == "attention_path":
        L = rank.model.num_hidden_layers
        per = attention_path_ms(rank, strategy, st, cal)
        t = per["total"] * L
        return t, {k: v * L for k, v in per.items() if k != "total"}, t, 0.0
    r = step_time_ms(rank, strategy, st, cal, **layer_kw)
    return r["total"], r["by_op"], r["attention_path"], r["comm"]


def compare_strategies(deployment: Deployment, strategies=None, baseline=BASELINE,
                       calibration: Calibration | None = None, scope: str = "full_layer", **layer_kw) -> dict:
    """``{results, delta_pct, delta_ms, baseline}``: :func:`predict_ttft` per strategy (door names expanded) and
    its mean-TTFT change vs ``baseline`` (default strategies :data:`mla_lab.placement.SEED_STRATEGIES`). Raises
    ValueError: an unknown strategy; as :func:`predict_ttft`."""
    d = _check_deployment(deployment)
    names = expand(placement.SEED_STRATEGIES if strategies is None else strategies)
    base = expand(baseline)[0]
    res = {s.name: predict_ttft(d, s, calibration, scope, **layer_kw) for s in dict.fromkeys([base] + names)}
    b = res[base.name]["ttft_ms_mean"]
    return {"results": res, "baseline": base.name,
            "delta_ms": {s: r["ttft_ms_mean"] - b for s, r in res.items()},
            "delta_pct": {s: (r["ttft_ms_mean"] - b) / b * 100 for s, r in res.items()}}
