"""Step-level simulation of a ``vllm bench serve`` run against a vLLM v1 engine (docs/serving.md has an example): one
concept per module (client, step, scheduler, simulate, metrics, pricing, step_pricer, benchmark, noise)."""

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
