"""Workload -> time to first token (TTFT), modelled; and the fused strategy's memory as KV-cache capacity.

``predict_ttft`` schedules the workload into chunked-prefill steps (:func:`mla_lab.workload.schedule`: vLLM v1,
FCFS, at most ``max_num_batched_tokens`` prompt tokens per step, ``concurrency`` prompts in flight), prices every
step on one rank, and returns each prompt's TTFT = sum of step times up to the step holding its last prompt token.
Every rank runs the same step in lockstep under TP, so one rank's step time is the step time.

Scopes:

- ``full_layer`` (default): a step costs every layer's ops on one rank (:func:`mla_lab.layer_model.step_time_ms`:
  projections, norms, absorbed W_UK/W_UV, the DSA indexer, the sparse attention path of the strategy, o_proj, dense
  MLP or MoE, TP all-reduces over NVLink) plus the embedding, final norm and LM head. Efficiencies come from
  ``data/calibration/h200_ops.csv`` (measured on one H200 by ``benchmarks/bench_layer.py``) when it exists.
- ``attention_path``: ``num_hidden_layers x`` the sparse attention path of :mod:`mla_lab.costmodel` (concat, pad,
  sparse kernel, output slice) — the part the strategies change plus the attention kernel; a lower bound on TTFT
  that overstates the *relative* change.

Strategies (:data:`mla_lab.buffers.STRATEGIES`): ``unfused`` (vLLM before PR #53878), ``fused`` (the PR), and
``kernel_native`` (modelled bound: a kernel taking the real head count; no padded workspace, no pad copy, no output
slice copy, kernel time that of the padded kernel — :mod:`mla_lab.costmodel` says why).

Not modelled: CPU-side scheduling and launch gaps, sampling, decode steps interleaved by other requests (the seed
benchmark's prompts all arrive at once), network/HTTP time of ``vllm bench serve``.
"""

from __future__ import annotations

from .arch import GPUArch, get_arch
from .buffers import MIB, STRATEGIES, memory_account, padded_num_heads
from .costmodel import attention_path_ms
from .models import ModelConfig, load_model, normalize_kv_cache_dtype
from .workload import Workload, schedule

__all__ = ["predict_ttft", "compare_strategies", "memory_tradeoff", "seed_reproduction", "SEED", "SCOPES",
           "DEFAULT_GPU_MEMORY_UTILIZATION"]

SCOPES = ("full_layer", "attention_path")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization


def _check_strategy(strategy):
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not known; allowed: {list(STRATEGIES)}")


def predict_ttft(
    model: ModelConfig | str,
    tp: int,
    arch: str | GPUArch,
    workload: Workload,
    max_num_batched_tokens: int,
    strategy: str,
    kv_cache_dtype: str = "bf16",
    calibration=None,
    scope: str = "full_layer",
    **layer_kw,
) -> dict:
    """Modelled TTFT of ``workload`` on one rank.

    Args:
        model, tp, arch: model config or name, tensor-parallel size, GPU.
        workload: prompts (length, count, concurrency); max_num_batched_tokens: the chunked-prefill token budget.
        strategy: ``unfused`` | ``fused`` | ``kernel_native``.
        kv_cache_dtype: ``bf16`` (pads Q to the kernel's head multiple) or ``fp8`` (no padding).
        calibration: ``None`` (the committed calibration), a :class:`mla_lab.layer_model.OpsCalibration`, or a
            :class:`mla_lab.costmodel.Calibration` (attention ops only; with ``full_layer`` the other ops keep the
            committed efficiencies).
        scope: ``full_layer`` (default) or ``attention_path``.
        **layer_kw: ``full_layer`` options of :func:`mla_lab.layer_model.layer_ops` — ``weight_dtype``
            (``bf16``/``fp8``), ``moe_parallel`` (``tp``/``ep``), ``ep_size``, ``ep_comm``, ``out_slice_copy``,
            ``indexer_dtype``, ``context`` — and ``comm_efficiency``, ``comm_latency_us``.

    Returns:
        ``ttft_ms_mean``, ``ttft_ms_max`` (ms, over prompts), ``num_steps``, ``step_ms`` (list), ``ops_ms`` (ms per
        op summed over steps and layers), ``scope``; plus ``ttft_ms_list`` (per prompt, in finishing order), ``step_ops_ms`` (per step, ms per op over all layers),
        ``strategy``, ``attention_path_ms`` and ``comm_ms`` (summed over steps), ``calibration`` (its name),
        ``source`` (``modelled``).

    Raises:
        ValueError: unknown scope or strategy; layer options given with ``scope="attention_path"``; anything the
            cost functions raise (each message names the argument, its value and what is allowed).
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not known; allowed: {list(SCOPES)}")
    _check_strategy(strategy)
    if not isinstance(workload, Workload):
        raise ValueError(f"workload={workload!r} must be a mla_lab.workload.Workload")
    model = load_model(model)
    arch = get_arch(arch)
    steps = schedule(workload, max_num_batched_tokens)
    step_ms, ops_ms, ttfts, step_ops_ms = [], {}, [], []
    attn_total = comm_total = 0.0
    elapsed = 0.0
    if scope == "attention_path":
        if layer_kw:
            raise ValueError(f"layer options {sorted(layer_kw)} only apply to scope='full_layer'; allowed for "
                             f"scope='attention_path': none")
        from .layer_model import OpsCalibration

        cal = calibration.attention if isinstance(calibration, OpsCalibration) else calibration
        cal_name = cal.name if cal is not None else "costmodel default"
    else:
        from .layer_model import _resolve_cal

        comm_kw = {k: layer_kw.pop(k) for k in ("comm_efficiency", "comm_latency_us") if k in layer_kw}
        cal = _resolve_cal(calibration)
        if comm_kw:
            cal = cal.with_comm(**comm_kw)
        cal_name = cal.name
    for st in steps:
        if scope == "attention_path":
            per = attention_path_ms(model, tp, arch, strategy, st, kv_cache_dtype, cal)
            t = per["total"] * model.num_hidden_layers
            this = {k: v * model.num_hidden_layers for k, v in per.items() if k != "total"}
            attn_total += t
        else:
            from .layer_model import step_time_ms

            r = step_time_ms(model, tp, arch, strategy, st, cal, kv_cache_dtype=kv_cache_dtype, **layer_kw)
            t = r["total"]
            this = dict(r["by_op"])
            attn_total += r["attention_path"]
            comm_total += r["comm"]
        for k, v in this.items():
            ops_ms[k] = ops_ms.get(k, 0.0) + v
        step_ops_ms.append(this)
        elapsed += t
        step_ms.append(t)
        ttfts.extend([elapsed] * len(st.finished_prompts(workload.prompt_len)))
    return {
        "ttft_ms_mean": sum(ttfts) / len(ttfts),
        "ttft_ms_max": max(ttfts),
        "num_steps": len(steps),
        "step_ms": step_ms,
        "ops_ms": ops_ms,
        "scope": scope,
        "ttft_ms_list": ttfts,
        "step_ops_ms": step_ops_ms,
        "strategy": strategy,
        "attention_path_ms": attn_total,
        "comm_ms": comm_total,
        "calibration": cal_name,
        "source": "modelled",
    }


def compare_strategies(model, tp, arch, workload, max_num_batched_tokens, kv_cache_dtype="bf16", calibration=None,
                       scope="full_layer", strategies=STRATEGIES, **layer_kw) -> dict:
    """:func:`predict_ttft` for each strategy, plus ``delta_pct[s]`` = mean TTFT change of ``s`` vs ``unfused`` (%)
    and ``delta_ms[s]``. Returns ``{"results": {s: dict}, "delta_pct": {...}, "delta_ms": {...}}``."""
    for s in strategies:
        _check_strategy(s)
    res = {s: predict_ttft(model, tp, arch, workload, max_num_batched_tokens, s, kv_cache_dtype, calibration, scope,
                           **dict(layer_kw))
           for s in dict.fromkeys(("unfused",) + tuple(strategies))}
    base = res["unfused"]["ttft_ms_mean"]
    return {"results": res,
            "delta_ms": {s: r["ttft_ms_mean"] - base for s, r in res.items()},
            "delta_pct": {s: (r["ttft_ms_mean"] - base) / base * 100 for s, r in res.items()}}


def memory_tradeoff(
    model: ModelConfig | str,
    tp: int,
    arch: str | GPUArch,
    max_num_batched_tokens: int,
    kv_cache_dtype: str = "bf16",
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    weight_dtype: str = "bf16",
    moe_parallel: str = "tp",
    ep_size: int | None = None,
    total_memory_bytes: int | None = None,
    include_indexer: bool = True,
) -> dict:
    """The persistent Q-workspace bytes of each strategy as KV-cache tokens lost per rank and % of KV capacity.

    KV budget per rank = ``total_memory x gpu_memory_utilization`` (vLLM's rule, default 0.9) minus the weights one
    rank holds (:func:`mla_lab.layer_model.weights_bytes_per_rank`, counted from the config at ``weight_dtype``)
    minus the profile-run activation peak (:func:`mla_lab.layer_model.activation_peak_bytes`, an estimate) minus
    the *unfused* workspace (the baseline). ``total_memory`` defaults to the datasheet HBM (decimal GB; the H200
    reports 143771 MiB to nvidia-smi, pass ``total_memory_bytes`` to use that). Capacity in tokens = budget /
    :meth:`~mla_lab.models.ModelConfig.kv_cache_bytes_per_token` (latent cache + indexer keys, all layers; the
    MLA latent cache is replicated on every TP rank). The workspace is shared by all layers (one per rank), so its
    cost does not scale with the layer count.

    Only persistent bytes reduce the KV cache: vLLM sizes the cache after a profile run at
    ``max_num_batched_tokens``; the unfused pad tensor is transient and is freed inside each layer, and whether it
    raises the profiled peak depends on whether the attention path or the MoE sets that peak (with the MoE
    intermediates larger, as estimated here, it does not).

    Returns:
        ``{"strategies": {s: {persistent_bytes, extra_bytes, extra_mib, kv_tokens_lost, kv_capacity_pct_lost}},
        "kv_capacity_tokens", "kv_budget_bytes", "weights_bytes", "activation_bytes", "kv_bytes_per_token",
        "fits"}`` plus the assumptions.

    Raises:
        ValueError: gpu_memory_utilization outside (0, 1]; as the functions it calls.
    """
    from .layer_model import activation_peak_bytes, weights_bytes_per_rank

    if isinstance(gpu_memory_utilization, bool) or not isinstance(gpu_memory_utilization, (int, float)) \
            or not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization!r} must be a number in (0, 1]")
    model = load_model(model)
    arch = get_arch(arch)
    normalize_kv_cache_dtype(kv_cache_dtype)
    H = model.heads_per_rank(tp)
    total = arch.hbm_gb * 1e9 if total_memory_bytes is None else total_memory_bytes
    if isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0:
        raise ValueError(f"total_memory_bytes={total_memory_bytes!r} must be a positive number")
    weights = weights_bytes_per_rank(model, tp, weight_dtype, moe_parallel, ep_size)
    act = activation_peak_bytes(model, tp, max_num_batched_tokens, moe_parallel, ep_size)
    per_tok = model.kv_cache_bytes_per_token(kv_cache_dtype, include_indexer)
    accounts = {s: memory_account(s, H, max_num_batched_tokens, arch, kv_cache_dtype) for s in STRATEGIES}
    base_ws = accounts["unfused"].persistent_bytes
    budget = total * gpu_memory_utilization - weights - act - base_ws
    capacity = budget / per_tok
    out = {}
    for s, a in accounts.items():
        extra = a.persistent_bytes - base_ws
        lost = extra / per_tok
        out[s] = {"persistent_bytes": a.persistent_bytes, "extra_bytes": extra, "extra_mib": extra / MIB,
                  "kv_tokens_lost": lost,
                  "kv_capacity_pct_lost": (lost / capacity * 100) if capacity > 0 else float("nan"),
                  "step_transient_bytes": a.step_transient_bytes}
    return {
        "strategies": out,
        "num_heads": H,
        "padded_heads": padded_num_heads(H, arch, kv_cache_dtype),
        "kv_capacity_tokens": capacity,
        "kv_budget_bytes": budget,
        "weights_bytes": weights,
        "activation_bytes": act,
        "kv_bytes_per_token": per_tok,
        "total_memory_bytes": total,
        "gpu_memory_utilization": gpu_memory_utilization,
        "fits": budget > 0,
        "assumptions": ("KV budget = total x gpu_memory_utilization - weights (config count at weight_dtype) - "
                        "activation estimate - unfused workspace; CUDA graphs, NCCL buffers and other non-torch "
                        "memory not subtracted (capacity is an upper bound, % lost a lower bound)"),
    }


#: vLLM PR #53878's benchmark (FACTS.md section 1): GLM-5.2-FP8, TP8 with expert parallelism, Hopper, bf16 KV cache,
#: --max-num-batched-tokens 16384, 32 prompts x 1024 input tokens at concurrency 32. Reported: TTFT -9.5%, peak memory
#: 131753 -> 132785 MiB (+1032 MiB) per GPU.
SEED = {"model": "glm-5", "tp": 8, "arch": "h200", "max_num_batched_tokens": 16384, "prompt_len": 1024,
        "num_prompts": 32, "concurrency": 32, "kv_cache_dtype": "bf16", "weight_dtype": "fp8", "moe_parallel": "ep",
        "reported_ttft_change_pct": -9.5, "reported_peak_mib": (131753, 132785)}


def _anchored_attention(cal, measured_dir):
    """Attention efficiencies re-anchored on the measurements at the seed's own shapes: the pad op at T=16384, H=8
    (``layer_ops.csv``) and the sparse kernel on the seed step with causal topk_length (``layer_extras.csv``,
    ``seed_16x1024``). Returns (calibration, notes) or (None, reason)."""
    import csv
    from dataclasses import replace
    from pathlib import Path

    from .costmodel import Calibration, _op_work

    d = Path(measured_dir)
    if not (d / "layer_ops.csv").is_file() or not (d / "layer_extras.csv").is_file():
        return None, f"no measurements in {d}"
    arch = get_arch(SEED["arch"])
    pad = [r for r in csv.DictReader(open(d / "layer_ops.csv")) if r["op"] == "pad" and r["model"] == "glm-5"
           and r["tp"] == "8" and r["T"] == "16384" and r["status"] == "ok"]
    ker = [r for r in csv.DictReader(open(d / "layer_extras.csv")) if r["experiment"] == "kernel_topk_length"
           and r["name"] == "seed_16x1024" and r["ms"]]
    if not pad or not ker:
        return None, "seed-shape rows missing"
    eff = dict(cal.attention.eff)
    pad_ms = float(pad[0]["ms"])
    eff["pad"] = _op_work("pad", 16384, 8, 64, 0) / (pad_ms * 1e-3) / (arch.hbm_gbps * 1e9)
    k_ms = float(ker[0]["ms"])
    eff["kernel"] = float(ker[0]["flops"]) / (k_ms * 1e-3) / (arch.bf16_tflops * 1e12)
    notes = {"pad_ms_measured": pad_ms, "kernel_ms_measured_seed_step": k_ms}
    return replace(cal, attention=Calibration(eff=eff, name="anchored at the seed shapes", arch=arch.name)), notes


def seed_reproduction(calibration=None, measured_dir=None, **layer_kw) -> dict:
    """The PR's benchmark through the model: predicted mean-TTFT change of ``fused`` (and ``kernel_native``) vs
    ``unfused`` in both scopes, the memory trade, and a variant whose pad and kernel efficiencies are re-anchored on
    the H200 measurements at the seed's own shapes (``measured_dir``, default ``data/measured/h200``).

    Returns a dict with ``predicted`` (scope -> compare_strategies summary), ``anchored`` (same, or the reason it is
    absent), ``memory`` (:func:`memory_tradeoff`), ``analytic_extra_mib`` and the reported numbers.
    """
    from pathlib import Path

    from .layer_model import _resolve_cal

    cal = _resolve_cal(calibration)
    wl = Workload(SEED["prompt_len"], SEED["num_prompts"], SEED["concurrency"])
    args = (SEED["model"], SEED["tp"], SEED["arch"], wl, SEED["max_num_batched_tokens"], SEED["kv_cache_dtype"])
    kw = {"weight_dtype": SEED["weight_dtype"], "moe_parallel": SEED["moe_parallel"], **layer_kw}

    def summary(c):
        r = c["results"]
        return {"ttft_ms": {s: v["ttft_ms_mean"] for s, v in r.items()}, "delta_ms": c["delta_ms"],
                "delta_pct": c["delta_pct"], "num_steps": r["unfused"]["num_steps"],
                "step_ms_unfused": r["unfused"]["step_ms"], "ops_ms_unfused": r["unfused"]["ops_ms"],
                "calibration": r["unfused"]["calibration"]}

    out = {"seed": SEED, "predicted": {
        "full_layer": summary(compare_strategies(*args, calibration=cal, scope="full_layer", **kw)),
        "attention_path": summary(compare_strategies(*args, calibration=cal, scope="attention_path")),
    }}
    mdir = measured_dir or Path(__file__).resolve().parent.parent / "data" / "measured" / "h200"
    acal, notes = _anchored_attention(cal, mdir)
    if acal is None:
        out["anchored"] = {"absent": notes}
    else:
        out["anchored"] = {"notes": notes,
                           "full_layer": summary(compare_strategies(*args, calibration=acal, **kw))}
    mem = memory_tradeoff(SEED["model"], SEED["tp"], SEED["arch"], SEED["max_num_batched_tokens"],
                          SEED["kv_cache_dtype"], weight_dtype=SEED["weight_dtype"],
                          moe_parallel=SEED["moe_parallel"])
    out["memory"] = mem
    out["analytic_extra_mib"] = mem["strategies"]["fused"]["extra_mib"]
    out["reported_extra_mib"] = SEED["reported_peak_mib"][1] - SEED["reported_peak_mib"][0]
    return out
