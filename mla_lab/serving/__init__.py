"""Step-level simulation of a ``vllm bench serve`` run against a vLLM v1 engine (docs/serving.md).

One concept per module (client, step, scheduler, simulate, metrics, pricing, step_pricer, benchmark, noise): each
module's docstring says what it holds.

Example::

    from mla_lab.serving import BenchConfig, SchedulerConfig, LinearStepPricer, simulate, compare
    bench = BenchConfig(num_prompts=32, random_input_len=1024, random_output_len=128, max_concurrency=32)
    sched = SchedulerConfig(max_num_batched_tokens=16384, max_num_seqs=256, kv_capacity_tokens=270_000,
                            block_size=64)
    a = simulate(bench, sched, LinearStepPricer(per_token_ms=0.05, per_step_ms=6.0))
    b = simulate(bench, sched, LinearStepPricer(per_token_ms=0.045, per_step_ms=6.0))
    compare(a, b)["mean_ttft_ms"]   # percent change from a to b
"""

from __future__ import annotations

from .benchmark import PR_BENCH, bench_of, serve_benchmark
from .client import BenchConfig, ClientRequest
from .metrics import RequestRecord, bench_metrics, compare, format_metrics
from .pricing import ConstantPricer, LinearStepPricer, make_pricer
from .scheduler import PreemptionRequired, SchedulerConfig
from .simulate import ServingResult, StepRecord, simulate
from .step import DecodeToken, PrefillChunk, Step, StepPricer
from .step_pricer import CostModelPricer, load_decode_calibration

__all__ = ["BenchConfig", "ClientRequest", "RequestRecord", "bench_metrics", "compare", "format_metrics",
           "ConstantPricer", "LinearStepPricer", "make_pricer", "PreemptionRequired", "SchedulerConfig",
           "ServingResult", "StepRecord", "simulate", "DecodeToken", "PrefillChunk", "Step", "StepPricer",
           "CostModelPricer", "serve_benchmark", "bench_of", "load_decode_calibration", "PR_BENCH"]
