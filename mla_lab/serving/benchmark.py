"""``vllm bench serve`` priced by the lab's cost model: one deployment, once per strategy (issue 13).

:func:`serve_benchmark` runs :func:`mla_lab.serving.simulate` once per strategy with that strategy's own KV-cache
capacity (:func:`mla_lab.model.memory.memory_tradeoff`) and :class:`~mla_lab.serving.engine_pricer.EnginePricer`
as the step pricer, and compares every metric with a baseline. :data:`PR_BENCH` is the benchmark of vLLM PR #53878;
:data:`MODELLED_NOTES` says what is modelled. ``python -m mla_lab.serving.benchmark`` prints the PR's benchmark per
engine preset.
"""

from __future__ import annotations

from dataclasses import asdict

from ..model.calibration import Calibration, resolve_calibration
from ..model.decode_calibration import DecodeCalibration, load_decode_calibration
from ..model.memory import memory_tradeoff
from ..placement import BASELINE, SERVE_PRESETS, expand_strategies, preset_of, resolve_strategy
from .client import BenchConfig
from .engine_pricer import EnginePricer, _resolve_objs
from .metrics import compare
from .scheduler import SchedulerConfig
from .simulate import simulate

__all__ = ["PR_BENCH", "MODELLED_NOTES", "serve_benchmark"]

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
    "Not modelled anywhere: CUDA-graph batch padding, MTP / speculative decoding, expert load imbalance (uniform "
    "routing), all-reduce latency at decode sizes (the ring model with comm_latency_us = 0).",
)


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
        ValueError: a deployment whose weights and activations leave no KV cache (one line naming the deployment
            and :func:`~mla_lab.model.memory.memory_tradeoff`'s ``fit_reason``, raised before any strategy is
            priced), or a strategy whose persistent workspace extra takes the whole KV capacity (names the
            strategy, the deployment and its extra MiB); never a negative capacity. As ``SchedulerConfig``,
            :func:`simulate` and the cost model.
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
    where = (f"{model_obj.name} TP{tp} on {arch_obj.name} (weight_dtype={weight_dtype!r}, "
             f"max_num_batched_tokens={max_num_batched_tokens}, gpu_memory_utilization={gpu_memory_utilization})")
    if not mem["fits"] or not mem["kv_capacity_tokens"] > 0:
        # checked once, before any strategy is priced; never a negative capacity in the message
        why = mem["fit_reason"] or "KV capacity 0 tokens"
        raise ValueError(f"deployment {where} does not fit: {why}; allowed: a deployment whose weights fit "
                         "(e.g. weight_dtype='fp8', a larger tp, a higher gpu_memory_utilization)")
    caps = {s: mem["kv_capacity_tokens"] - mem["strategies"][s]["kv_tokens_lost"] for s in order}
    for s, cap in caps.items():  # every strategy checked before the first is simulated
        if not cap > 0:
            raise ValueError(
                f"strategy={s!r} does not fit deployment {where}: its persistent workspace extra "
                f"({mem['strategies'][s]['extra_mib']:.0f} MiB beyond the baseline's) takes all "
                f"{mem['kv_capacity_tokens']:.0f} tokens of KV capacity, KV capacity 0; allowed: a strategy whose "
                "extra bytes fit, a larger tp or a higher gpu_memory_utilization")
    out: dict = {}
    for s in order:
        lost, cap = mem["strategies"][s]["kv_tokens_lost"], caps[s]
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
                           "kv_admission": kv_admission, "enforce_eager": enforce_eager,
                           "model_family": model_obj.family, "model_family_note": model_obj.family_note},
            "bench": asdict(bench), "calibration": cal.name, "decode_calibration": dcal.name,
            "notes": list(MODELLED_NOTES)}


def main() -> None:
    """Demo: the PR's benchmark on GLM-5 TP8 H200 (fp8 weights, EP, bf16 KV cache) per engine preset."""
    res = serve_benchmark("glm-5", 8, "h200", [*SERVE_PRESETS, "sglang"], PR_BENCH,
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
