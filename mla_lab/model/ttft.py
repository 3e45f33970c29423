"""Workload -> time to first token (TTFT), modelled: the public entry points of the cost model.

``predict_ttft`` schedules the workload into chunked-prefill steps (:func:`mla_lab.workload.schedule`: vLLM v1,
FCFS, at most ``max_num_batched_tokens`` prompt tokens per step, ``concurrency`` prompts in flight), prices every
step on one rank, and returns each prompt's TTFT = sum of step times up to the step holding its last prompt token.
Every rank runs the same step in lockstep under TP, so one rank's step time is the step time.

Scopes:

- ``full_layer`` (default): a step costs every layer's ops on one rank (:func:`mla_lab.model.timing.step_time_ms`:
  projections, norms, absorbed W_UK/W_UV, the DSA indexer, the sparse attention path of the strategy, o_proj, dense
  MLP or MoE, TP all-reduces over NVLink) plus the embedding, final norm and LM head, priced with the committed
  calibration (:mod:`mla_lab.model.calibration`).
- ``attention_path``: ``num_hidden_layers x`` the sparse attention path (concat, pad, sparse kernel, output slice)
  — the part the strategies change plus the attention kernel; a lower bound on TTFT that overstates the *relative*
  change.

Strategies: placement x padded-head content (:mod:`mla_lab.placement`): vLLM before PR #53878 (``new_empty`` pad
per call, zeros or stale), at the PR (private pre-padded workspace), after PR #56902 (shared workspace, stale),
SGLang (``new_zeros`` per call), sub-chunked workspaces, and ``kernel_native`` (modelled bound: a kernel taking the
real head count; :mod:`mla_lab.model.ops` says why its kernel time is the padded kernel's). Changes are taken
against :data:`mla_lab.placement.BASELINE` unless a baseline is given.

Names (model, arch) are resolved here, once; everything below takes objects.

Not modelled: CPU-side scheduling and launch gaps, sampling, decode steps interleaved by other requests (the seed
benchmark's prompts all arrive at once), network/HTTP time of ``vllm bench serve``.
"""

from __future__ import annotations

import csv

from ..arch import GPUArch, get_arch
from ..models import ModelConfig, load_model
from ..paths import measured_dir
from ..placement import BASELINE, PRESETS, expand_strategies, resolve_strategy
from ..seed import SEED, SEED_REPORTED
from ..workload import Workload, schedule
from .calibration import Calibration, resolve_calibration
from .memory import memory_tradeoff
from .ops import ATTN_OPS, attention_op_work
from .timing import attention_path_ms, step_time_ms

__all__ = ["predict_ttft", "compare_strategies", "seed_reproduction", "SCOPES", "resolve", "SEED_STRATEGIES"]

SCOPES = ("full_layer", "attention_path")


def resolve(model: ModelConfig | str, arch: GPUArch | str) -> tuple[ModelConfig, GPUArch]:
    """Names -> objects (the one place the cost model resolves them)."""
    return load_model(model), get_arch(arch)


def predict_ttft(
    model: ModelConfig | str,
    tp: int,
    arch: str | GPUArch,
    workload: Workload,
    max_num_batched_tokens: int,
    strategy: str,
    kv_cache_dtype: str = "bf16",
    calibration: Calibration | None = None,
    scope: str = "full_layer",
    attention_override_ms: list[float] | None = None,
    **layer_kw,
) -> dict:
    """Modelled TTFT of ``workload`` on one rank (optionally with a measured attention path spliced in).

    Args:
        model, tp, arch: model config or name, tensor-parallel size, GPU (object or name).
        workload: prompts (length, count, concurrency); max_num_batched_tokens: the chunked-prefill token budget.
        strategy: a canonical strategy, alias or preset (:func:`mla_lab.placement.resolve_strategy`).
        kv_cache_dtype: ``bf16`` (pads Q to the kernel's head multiple) or ``fp8`` (no padding).
        calibration: ``None`` (the committed calibration) or a :class:`~mla_lab.model.calibration.Calibration`.
        scope: ``full_layer`` (default) or ``attention_path``.
        attention_override_ms: the attention path per layer of every step, measured (ms, one entry per step of
            the schedule): each step's modelled attention-path ops are replaced by ``num_hidden_layers x`` this,
            the rest of the step stays modelled, and ``scope`` says ``(attention path measured)``.
        **layer_kw: ``full_layer`` options of :func:`mla_lab.model.ops.layer_ops` — ``weight_dtype``
            (``bf16``/``fp8``), ``moe_parallel`` (``tp``/``ep``), ``ep_size``, ``ep_comm``, ``out_slice_copy``,
            ``indexer_dtype``, ``context`` — and ``comm_efficiency``, ``comm_latency_us``.

    Returns:
        ``ttft_ms_mean``, ``ttft_ms_max`` (ms, over prompts), ``num_steps``, ``step_ms`` (list), ``ops_ms`` (ms per
        op summed over steps and layers), ``scope``; plus ``ttft_ms_list`` (per prompt, in finishing order),
        ``step_ops_ms`` (per step, ms per op over all layers), ``strategy``, ``attention_path_ms`` and ``comm_ms``
        (summed over steps), ``calibration`` (its name), ``comm_source`` (what priced the all-reduces:
        :meth:`~mla_lab.model.calibration.Calibration.comm_source`), ``source`` (``modelled``).

    Raises:
        ValueError: unknown scope or strategy; layer options given with ``scope="attention_path"``; anything the
            cost functions raise (each message names the argument, its value and what is allowed).
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not known; allowed: {list(SCOPES)}")
    strategy = resolve_strategy(strategy)
    if not isinstance(workload, Workload):
        raise ValueError(f"workload={workload!r} must be a mla_lab.workload.Workload")
    model, arch = resolve(model, arch)
    steps = schedule(workload, max_num_batched_tokens)
    if attention_override_ms is not None and len(attention_override_ms) != len(steps):
        raise ValueError(f"attention_override_ms has {len(attention_override_ms)} entries; the workload has "
                         f"{len(steps)} steps")
    cal = resolve_calibration(calibration)
    if scope == "attention_path":
        if layer_kw:
            raise ValueError(f"layer options {sorted(layer_kw)} only apply to scope='full_layer'; allowed for "
                             f"scope='attention_path': none")
    else:
        comm_kw = {k: layer_kw.pop(k) for k in ("comm_efficiency", "comm_latency_us") if k in layer_kw}
        if comm_kw:
            cal = cal.with_comm(**comm_kw)
    step_ms, ops_ms, ttfts, step_ops_ms = [], {}, [], []
    attn_total = comm_total = elapsed = 0.0
    for i, st in enumerate(steps):
        if scope == "attention_path":
            per = attention_path_ms(model, tp, arch, strategy, st, kv_cache_dtype, cal)
            t = per["total"] * model.num_hidden_layers
            this = {k: v * model.num_hidden_layers for k, v in per.items() if k != "total"}
            attn_total += t
        else:
            r = step_time_ms(model, tp, arch, strategy, st, cal, kv_cache_dtype=kv_cache_dtype, **layer_kw)
            t = r["total"]
            this = dict(r["by_op"])
            attn_total += r["attention_path"]
            comm_total += r["comm"]
        if attention_override_ms is not None:
            modelled_attention = sum(v for k, v in this.items() if k in ATTN_OPS)
            measured = attention_override_ms[i] * model.num_hidden_layers
            t += measured - modelled_attention
            attn_total += measured - modelled_attention
            this = {k: v for k, v in this.items() if k not in ATTN_OPS}
            this["attention_path"] = measured
        for k, v in this.items():
            ops_ms[k] = ops_ms.get(k, 0.0) + v
        step_ops_ms.append(this)
        elapsed += t
        step_ms.append(t)
        ttfts.extend([elapsed] * len(st.finished_prompts(workload.prompt_len)))
    return {
        "ttft_ms_mean": sum(ttfts) / len(ttfts), "ttft_ms_max": max(ttfts), "num_steps": len(steps),
        "step_ms": step_ms, "ops_ms": ops_ms,
        "scope": scope + (" (attention path measured)" if attention_override_ms is not None else ""), "ttft_ms_list": ttfts, "step_ops_ms": step_ops_ms,
        "strategy": strategy, "attention_path_ms": attn_total, "comm_ms": comm_total, "calibration": cal.name,
        "comm_source": cal.comm_source(tp, arch=arch) if scope == "full_layer" else "none", "source": "modelled",
    }


#: The strategies the seed reproduction prices: every engine preset's members, the zero policy of the shared
#: workspace and the sub-chunk sizes.
SEED_STRATEGIES = tuple(expand_strategies(list(PRESETS) + ["shared_workspace:zero_per_call", "subchunk:1024",
                                                           "subchunk:2048", "subchunk:4096", "subchunk:8192"]))


def compare_strategies(model, tp, arch, workload, max_num_batched_tokens, kv_cache_dtype="bf16", calibration=None,
                       scope="full_layer", strategies=SEED_STRATEGIES, baseline=BASELINE, **layer_kw) -> dict:
    """:func:`predict_ttft` for each strategy (presets and aliases expanded), plus ``delta_pct[s]`` = mean TTFT
    change of ``s`` vs ``baseline`` (%) and ``delta_ms[s]``. Returns ``{"results": {s: dict}, "delta_pct": {...},
    "delta_ms": {...}, "baseline": name}``.

    Raises:
        ValueError: an unknown strategy name; as :func:`predict_ttft`.
    """
    names = expand_strategies(strategies)
    base_name = resolve_strategy(baseline)
    model, arch = resolve(model, arch)
    res = {s: predict_ttft(model, tp, arch, workload, max_num_batched_tokens, s, kv_cache_dtype, calibration, scope,
                           **dict(layer_kw))
           for s in dict.fromkeys([base_name] + names)}
    base = res[base_name]["ttft_ms_mean"]
    return {"results": res, "baseline": base_name,
            "delta_ms": {s: r["ttft_ms_mean"] - base for s, r in res.items()},
            "delta_pct": {s: (r["ttft_ms_mean"] - base) / base * 100 for s, r in res.items()}}


def _anchored_attention(cal: Calibration, mdir):
    """Attention efficiencies re-anchored on the measurements at the seed's own shapes: the pad op at T=16384, H=8
    (``layer_ops.csv``) and the sparse kernel on the seed step with causal topk_length (``layer_extras.csv``,
    ``seed_16x1024``). Returns (calibration, notes) or (None, reason)."""
    if not (mdir / "layer_ops.csv").is_file() or not (mdir / "layer_extras.csv").is_file():
        return None, f"no measurements in {mdir.name}"
    arch = get_arch(SEED["arch"])
    with open(mdir / "layer_ops.csv") as f:
        pad = [r for r in csv.DictReader(f) if r["op"] == "pad" and r["model"] == "glm-5" and r["tp"] == "8"
               and r["T"] == "16384" and r["status"] == "ok"]
    with open(mdir / "layer_extras.csv") as f:
        ker = [r for r in csv.DictReader(f) if r["experiment"] == "kernel_topk_length"
               and r["name"] == "seed_16x1024" and r["ms"]]
    if not pad or not ker:
        return None, "seed-shape rows missing"
    pad_ms, k_ms = float(pad[0]["ms"]), float(ker[0]["ms"])
    acal = cal.with_attention(
        name="anchored at the seed shapes",
        pad=attention_op_work("pad", 16384, 8, 64, 0) / (pad_ms * 1e-3) / (arch.hbm_gbps * 1e9),
        kernel=float(ker[0]["flops"]) / (k_ms * 1e-3) / (arch.bf16_tflops * 1e12))
    return acal, {"pad_ms_measured": pad_ms, "kernel_ms_measured_seed_step": k_ms}


def seed_reproduction(calibration: Calibration | None = None, measured: str | None = None,
                      strategies=SEED_STRATEGIES, baseline: str = BASELINE, model: str | None = None,
                      **layer_kw) -> dict:
    """The PR's benchmark (:data:`mla_lab.seed.SEED`) through the model: predicted mean-TTFT change of every
    strategy vs ``baseline`` in both scopes, the memory trade, and a variant whose pad and kernel efficiencies are
    re-anchored on the H200 measurements at the seed's own shapes (``measured``: a folder, default
    :func:`mla_lab.paths.measured_dir` ``("h200")``). ``model`` replaces the seed's GLM-5 geometry (e.g.
    ``glm-5.2``).

    Returns a dict with ``predicted`` (scope -> summary), ``anchored`` (same, or the reason it is absent),
    ``memory`` (:func:`~mla_lab.model.memory.memory_tradeoff`), ``analytic_extra_mib`` and the reported numbers.
    """
    from pathlib import Path

    cal = resolve_calibration(calibration)
    model, arch = resolve(model or SEED["model"], SEED["arch"])
    wl = Workload(SEED["prompt_len"], SEED["num_prompts"], SEED["concurrency"])
    args = (model, SEED["tp"], arch, wl, SEED["max_num_batched_tokens"], SEED["kv_cache_dtype"])
    kw = {"weight_dtype": SEED["weight_dtype"], "moe_parallel": SEED["moe_parallel"], **layer_kw}
    cmp = dict(strategies=strategies, baseline=baseline)

    def summary(c):
        r, b = c["results"], c["baseline"]
        return {"ttft_ms": {s: v["ttft_ms_mean"] for s, v in r.items()}, "delta_ms": c["delta_ms"],
                "delta_pct": c["delta_pct"], "num_steps": r[b]["num_steps"], "baseline": b,
                "step_ms_baseline": r[b]["step_ms"], "ops_ms_baseline": r[b]["ops_ms"],
                "calibration": r[b]["calibration"]}

    out = {"seed": SEED, "reported": SEED_REPORTED, "model": model.name, "predicted": {
        "full_layer": summary(compare_strategies(*args, calibration=cal, scope="full_layer", **cmp, **kw)),
        "attention_path": summary(compare_strategies(*args, calibration=cal, scope="attention_path", **cmp)),
    }}
    acal, notes = _anchored_attention(cal, Path(measured) if measured else measured_dir("h200"))
    if acal is None:
        out["anchored"] = {"absent": notes}
    else:
        out["anchored"] = {"notes": notes,
                           "full_layer": summary(compare_strategies(*args, calibration=acal, **cmp, **kw))}
    mem = memory_tradeoff(model, SEED["tp"], arch, SEED["max_num_batched_tokens"], SEED["kv_cache_dtype"],
                          weight_dtype=SEED["weight_dtype"], moe_parallel=SEED["moe_parallel"],
                          strategies=list(strategies) + [baseline])
    out["memory"] = mem
    out["analytic_extra_mib"] = mem["strategies"]["private_workspace"]["extra_mib"]
    out["reported_extra_mib"] = SEED_REPORTED["extra_peak_mib"]
    return out
