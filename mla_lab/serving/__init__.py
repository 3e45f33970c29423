"""Step-level simulation of a ``vllm bench serve`` run against a vLLM v1 engine (docs/serving.md).

One concept per module, each with a runnable ``main()`` demo (``python -m mla_lab.serving.<module>``):

- :mod:`~mla_lab.serving.client` the benchmark client: :class:`BenchConfig`, request lengths, arrival times;
- :mod:`~mla_lab.serving.step` one engine step: :class:`Step`, :class:`PrefillChunk`, :class:`DecodeToken`;
- :mod:`~mla_lab.serving.scheduler` vLLM v1's scheduler: :class:`SchedulerConfig`, ``Scheduler``;
- :mod:`~mla_lab.serving.simulate` the event loop: :func:`simulate` -> :class:`ServingResult`;
- :mod:`~mla_lab.serving.metrics` the metrics ``vllm bench serve`` prints, :func:`compare`;
- :mod:`~mla_lab.serving.pricing` pricers (Step -> ms): :class:`LinearStepPricer`, :func:`make_pricer`.

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

import importlib

# Lazy exports (PEP 562), so that ``python -m mla_lab.serving.<module>`` runs a module that the package has not
# imported yet.
_EXPORTS = {
    "BenchConfig": "client", "ClientRequest": "client",
    "RequestRecord": "metrics", "bench_metrics": "metrics", "compare": "metrics", "format_metrics": "metrics",
    "ConstantPricer": "pricing", "LinearStepPricer": "pricing", "make_pricer": "pricing",
    "PreemptionRequired": "scheduler", "SchedulerConfig": "scheduler",
    "ServingResult": "simulate", "StepRecord": "simulate", "simulate": "simulate",
    "DecodeToken": "step", "PrefillChunk": "step", "Step": "step", "StepPricer": "step",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
