"""``vllm bench serve`` priced by the lab's cost model: one deployment, once per strategy, each with its own KV
capacity, compared with a baseline (issue 13). :data:`MODELLED_NOTES` says what is modelled."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, replace

from ..deployment import Deployment
from ..model.calibration import Calibration, resolve_calibration
from ..model.decode_calibration import DecodeCalibration, load_decode_calibration
from ..model.memory import memory_tradeoff
from ..placement import BASELINE, expand_strategies, preset_of, resolve_strategy
from .client import BenchConfig
from .deploy_options import (
    OPTIONS_NOTES,
    DPAttentionPricer,
    SpecDecodePricer,
    dp_attention_memory,
    dp_share,
    per_rank_deployment,
)
from .metrics import compare
from .scheduler import SchedulerConfig
from .simulate import simulate
from .step_pricer import CostModelPricer

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
    "Not in this deterministic run (every request at the engine at t = 0, GPU time only): async scheduling, the "
    "API server's hand-off, per-step CPU time (scheduling, sampling, output handling), token delivery "
    "(detokenisation, HTTP) and the run-to-run spread; mla_lab.serving.noise adds them (mla-lab serve --num-runs "
    "N; docs/serving.md gives each component's source and whether it is measured, cited or assumed).",
    "Not modelled anywhere: CUDA-graph batch padding, expert load imbalance (uniform routing), all-reduce latency "
    "at decode sizes (the ring model with comm_latency_us = 0). MTP / speculative decoding and DP attention are "
    "priced only when the deployment sets them (num_speculative_tokens, dp_attention: mla_lab.serving."
    "deploy_options), acceptance length an input.",
)


def pr_deployment() -> Deployment:
    """vLLM PR #53878's main run (its description): :meth:`Deployment.seed` (fp8 weights, EP, bf16 KV, PR_BENCH's
    workload) on GLM-5.2, TP8 on H200, max_num_batched_tokens 16384, max_num_seqs 256."""
    return Deployment.seed(model="glm-5.2", tp=8, arch="h200", max_num_batched_tokens=16384, max_num_seqs=256)


def async_scheduler(d: Deployment, kv_capacity_tokens: int, block_size: int = 64) -> SchedulerConfig:
    """``d``'s engine limits with ``kv_capacity_tokens`` and async scheduling (vLLM's default)."""
    return SchedulerConfig(d.max_num_batched_tokens, d.max_num_seqs, kv_capacity_tokens, block_size,
                           async_scheduling=True)


def bench_of(deployment: Deployment, **options) -> BenchConfig:
    """``vllm bench serve`` of ``deployment``'s workload (``num_prompts``, ``prompt_len``, ``output_len``,
    ``concurrency``), the client's other :class:`~mla_lab.serving.client.BenchConfig` flags from ``options``.

    Raises:
        ValueError: an unknown option, or as :class:`~mla_lab.serving.client.BenchConfig`.
    """
    Deployment.require(deployment)
    wl = {"num_prompts": deployment.num_prompts, "random_input_len": deployment.prompt_len,
          "random_output_len": deployment.output_len, "max_concurrency": deployment.concurrency}
    bad = sorted(set(options) & set(wl)) + sorted(set(options) - set(BenchConfig.__dataclass_fields__))
    if bad:
        raise ValueError(f"bench_of(deployment, ...) got {bad}; allowed: the client's other flags "
                         f"{sorted(set(BenchConfig.__dataclass_fields__) - set(wl))} (the workload is the "
                         "deployment's: Deployment.replace(num_prompts=...) changes it)")
    return BenchConfig(**wl, **options)


def serve_benchmark(deployment: Deployment, strategies, bench: BenchConfig | None = None, *, block_size: int = 64,
                    calibration: Calibration | None = None, decode_cal: DecodeCalibration | None = None,
                    baseline: str = BASELINE, kv_admission: str = "reserve", enforce_eager: bool = False,
                    percentiles=(99,)) -> dict:
    """``vllm bench serve`` (``bench``, None: :func:`bench_of`; it must send the deployment's workload) against a
    :class:`~mla_lab.deployment.Deployment` (its KV budget and workload), once per strategy (presets expanded,
    ``baseline`` added): KV capacity ``memory_tradeoff``'s minus the strategy's ``kv_tokens_lost``, the deployment's
    engine limits, :class:`CostModelPricer` of ``deployment.rank`` (the options' pricers under MTP / DP attention).

    Returns:
        ``{"strategies": {s: {"preset", "metrics", "change_pct" (% vs baseline), "kv_capacity_tokens", "result",
        ...}}, "baseline", "deployment" (engine arguments), "options", "bench", "calibration", "decode_calibration",
        "notes"}``.

    Raises:
        ValueError: a ``bench`` that is not a BenchConfig or sends another workload; a deployment that leaves no KV
            cache, or a strategy whose workspace extra takes all of it (one line naming them, before any strategy is
            priced); as ``SchedulerConfig``, :func:`simulate` and the cost model.
    """
    Deployment.require(deployment)
    d = deployment
    b = bench_of(d) if bench is None else bench
    if not isinstance(b, BenchConfig):
        raise ValueError(f"bench={b!r} must be a mla_lab.serving.BenchConfig")
    if (b.num_prompts, b.random_input_len, b.random_output_len, b.max_concurrency or b.num_prompts) != (
            d.num_prompts, d.prompt_len, d.output_len, d.concurrency):
        raise ValueError(f"bench sends {b.num_prompts} x {b.random_input_len}-token prompts ({b.random_output_len} "
                         f"out) at max_concurrency {b.max_concurrency}, the deployment {d.num_prompts} x "
                         f"{d.prompt_len} ({d.output_len} out) at concurrency {d.concurrency}; allowed: bench=None "
                         "or bench_of(deployment, ...) (Deployment.replace changes the workload)")
    base = resolve_strategy(baseline)
    order = list(dict.fromkeys([base] + expand_strategies([strategies] if isinstance(strategies, str)
                                                          else list(strategies))))
    cal = resolve_calibration(calibration)
    dcal = decode_cal if decode_cal is not None else load_decode_calibration()
    opts = _Options(d, b)
    mem = opts.memory(order)
    caps = _kv_capacities(d, mem, order)
    out: dict = {}
    for s in order:  # every strategy checked (caps) before the first is simulated
        sched = SchedulerConfig(opts.deployment.max_num_batched_tokens, opts.deployment.max_num_seqs, int(caps[s]),
                                block_size, kv_admission=kv_admission, enforce_eager=enforce_eager)
        raw = simulate(opts.bench, sched, opts.pricer(s, cal, dcal), percentiles=percentiles)
        res = opts.scale(raw)
        out[s] = {"preset": preset_of(s), "metrics": res.metrics, "kv_capacity_tokens": int(caps[s]),
                  **{k: mem["strategies"][s][k] for k in ("kv_tokens_lost", "extra_mib")}, "num_steps": len(res.steps),
                  "steps_by_launch": dict(Counter(f"{r.step.kind}:{r.step.cudagraph_mode}" for r in res.steps)),
                  "result": res, "rank_metrics": raw.metrics if d.dp_attention > 1 else None}
    for s in order:
        out[s]["change_pct"] = compare(out[base]["metrics"], out[s]["metrics"])
    args = {"model": d.model.name, "tp": d.tp, "arch": d.arch.name, "max_num_batched_tokens": d.max_num_batched_tokens,
            "max_num_seqs": d.max_num_seqs, "gpu_memory_utilization": d.gpu_memory_utilization,
            "kv_cache_dtype": d.kv_cache_dtype, "block_size": block_size, "weight_dtype": d.weight_dtype,
            "moe_parallel": d.moe_parallel, "kv_admission": kv_admission, "enforce_eager": enforce_eager,
            "model_family": d.model.family, "model_family_note": d.model.family_note,
            "num_speculative_tokens": d.num_speculative_tokens, "acceptance_length": d.acceptance_length,
            "dp_attention": d.dp_attention}
    return {"strategies": out, "baseline": base, "deployment": args, "options": opts.describe(), "bench": asdict(b),
            "calibration": cal.name, "decode_calibration": dcal.name, "notes": list(MODELLED_NOTES) + opts.notes()}


def _kv_capacities(d: Deployment, mem: dict, order) -> dict:
    """KV-cache tokens per strategy: ``mem``'s capacity minus its ``kv_tokens_lost`` (ValueError: none left)."""
    where = (f"{d.model.name} TP{d.tp} on {d.arch.name} (weight_dtype={d.weight_dtype!r}, "
             f"max_num_batched_tokens={d.max_num_batched_tokens}, gpu_memory_utilization={d.gpu_memory_utilization})")
    if not mem["fits"] or not mem["kv_capacity_tokens"] > 0:
        why = mem["fit_reason"] or "KV capacity 0 tokens"
        raise ValueError(f"deployment {where} does not fit: {why}; allowed: a deployment whose weights fit "
                         "(e.g. weight_dtype='fp8', a larger tp, a higher gpu_memory_utilization)")
    caps = {s: mem["kv_capacity_tokens"] - mem["strategies"][s]["kv_tokens_lost"] for s in order}
    for s, cap in caps.items():
        if not cap > 0:
            raise ValueError(
                f"strategy={s!r} does not fit deployment {where}: its persistent workspace extra "
                f"({mem['strategies'][s]['extra_mib']:.0f} MiB beyond the baseline's) takes all "
                f"{mem['kv_capacity_tokens']:.0f} tokens of KV capacity, KV capacity 0; allowed: a strategy whose "
                "extra bytes fit, a larger tp or a higher gpu_memory_utilization")
    return caps


class _Options:
    """The deployment options of one run (:mod:`mla_lab.serving.deploy_options`): what is simulated (one DP rank's
    share under DP attention), its memory, pricer and metric scaling."""

    def __init__(self, d: Deployment, bench: BenchConfig):
        self.d, self.k, self.dp = d, d.num_speculative_tokens, d.dp_attention
        self.mtp_layers = 1 if self.k else 0
        if self.dp > 1:
            self.share = dp_share(d)
            self.deployment = per_rank_deployment(d)
            self.bench = replace(bench, num_prompts=self.deployment.num_prompts,
                                 max_concurrency=self.deployment.concurrency)
        else:
            self.share, self.deployment, self.bench = None, d, bench

    def memory(self, order) -> dict:
        if self.dp > 1:
            return dp_attention_memory(self.deployment, order, mtp_layers=self.mtp_layers)
        return memory_tradeoff(self.d, strategies=order, mtp_layers=self.mtp_layers)

    def pricer(self, strategy, cal, dcal):
        base = (DPAttentionPricer(self.deployment, strategy, cal, dcal) if self.dp > 1
                else CostModelPricer(self.d.rank, strategy, cal, dcal))
        return SpecDecodePricer(base, self.d.model.num_hidden_layers, self.k, self.d.acceptance_length) if self.k \
            else base

    def scale(self, res):
        """Under DP attention, throughputs and token counts x the active ranks (lockstep); latencies the rank's."""
        if self.dp == 1:
            return res
        n, counts = self.share["active_ranks"], ("completed", "total_input_tokens", "total_output_tokens",
                                                 "max_output_tokens_per_s")
        return replace(res, metrics={k: v * n if k.endswith("_throughput") or k in counts else v
                                     for k, v in res.metrics.items()})

    def describe(self) -> dict:
        out = {}
        if self.k:
            out["speculative"] = {"method": "mtp", "num_speculative_tokens": self.k,
                                  "acceptance_length": self.d.acceptance_length, "acceptance_length_status": "input",
                                  "status": "modelled"}
        if self.dp > 1:
            ar = self.deployment.attention_rank
            out["dp_attention"] = {"dp": self.dp, **self.share, "rank_bench": asdict(self.bench),
                                   "heads_per_rank": ar.num_heads, "padded_heads_per_rank": ar.padded_num_heads,
                                   "status": "modelled"}
        return out

    def notes(self) -> list:
        return [OPTIONS_NOTES[k] for k in ("speculative", "dp_attention") if k in self.describe()]


def options_summary(deployment: Deployment, strategy: str) -> dict:
    """What the deployment options change (modelled; ``mla-lab advise``, the report's frontier): ``{}`` without
    options, else ``{"speculative", "dp_attention"}`` with the KV capacity per rank and, for DP attention, heads and
    padded heads per rank, the extra persistent Q workspace (0 MiB: a full tile pads nothing) and the workload's
    mean TTFT (ms; :func:`serve_benchmark` at ``output_len`` 1) with and without it."""
    d, out = deployment, {}
    if d.num_speculative_tokens:
        mem = memory_tradeoff(d, strategies=[strategy], mtp_layers=1)
        out["speculative"] = {"num_speculative_tokens": d.num_speculative_tokens,
                              "acceptance_length": d.acceptance_length, "acceptance_length_status": "input",
                              "kv_capacity_tokens": mem["kv_capacity_tokens"],
                              "kv_capacity_tokens_without": memory_tradeoff(d, strategies=[strategy])[
                                  "kv_capacity_tokens"], "status": "modelled"}
    if d.dp_attention > 1:
        first = d.replace(output_len=1, num_speculative_tokens=0, acceptance_length=1.0)
        ttft, ttft_tp = (serve_benchmark(x, [strategy], baseline=strategy)["strategies"][strategy]["metrics"]
                         for x in (first, first.replace(dp_attention=1)))
        ar = d.attention_rank
        mem = dp_attention_memory(per_rank_deployment(d), [strategy], mtp_layers=1 if d.num_speculative_tokens else 0)
        out["dp_attention"] = {"dp": d.dp_attention, "heads_per_rank": ar.num_heads,
                               "padded_heads_per_rank": ar.padded_num_heads, "extra_persistent_mib": 0.0,
                               "kv_capacity_tokens_per_rank": mem["kv_capacity_tokens"],
                               "ttft_ms": ttft["mean_ttft_ms"], "ttft_ms_without": ttft_tp["mean_ttft_ms"],
                               "ttft_scope": "mean TTFT of the workload (serve simulation, output_len 1)",
                               "strategy": strategy, "status": "modelled"}
    return out
