"""Step-level simulation of a ``vllm bench serve`` run against a vLLM v1 engine (docs/serving.md).

One concept per module:

- :mod:`~mla_lab.serving.client` the benchmark client: :class:`BenchConfig`, request lengths, arrival times;
- :mod:`~mla_lab.serving.step` one engine step: :class:`Step`, :class:`PrefillChunk`, :class:`DecodeToken`;
- :mod:`~mla_lab.serving.scheduler` vLLM v1's scheduler: :class:`SchedulerConfig`, ``Scheduler``;
- :mod:`~mla_lab.serving.simulate` the event loop: :func:`simulate` -> :class:`ServingResult`;
- :mod:`~mla_lab.serving.metrics` the metrics ``vllm bench serve`` prints, :func:`compare`;
- :mod:`~mla_lab.serving.pricing` pricers (Step -> ms): :class:`LinearStepPricer`, :func:`make_pricer`;
- :mod:`~mla_lab.serving.step_pricer` the lab's cost model as a pricer: :class:`CostModelPricer`;
- :mod:`~mla_lab.serving.benchmark` the benchmark per strategy: :func:`serve_benchmark` (a :class:`~mla_lab.deployment.Deployment`),
  :func:`bench_of`, :data:`PR_BENCH`.

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
