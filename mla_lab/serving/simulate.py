"""Event loop of a simulated ``vllm bench serve`` run against one vLLM v1 engine.

- **Client** (:mod:`mla_lab.serving.client`): request ``i`` arrives at ``arrival_s``; with ``max_concurrency``
  it is *sent* only when fewer than ``max_concurrency`` requests are in flight (FIFO, as the waiters of an
  ``asyncio.Semaphore``), at ``send_s = max(arrival_s, the time a slot freed)``; a slot frees when a request's
  last token reaches the client. TTFT and E2EL are measured from ``send_s``.
- **Engine**: steps run back to back; a step starts when the previous one ends, and sees every request sent up to
  that moment (zero network / API-server latency). If nothing is runnable, time jumps to the next send. Each step
  is built by :class:`~mla_lab.serving.scheduler.Scheduler` and lasts ``pricer(step)`` milliseconds.
- **Tokens**: every token sampled in a step reaches the client at the step's end (no detokenisation or HTTP
  delay): the step completing a prompt gives the first token, each later step with the request's decode token one
  more.
- **Metrics** (:mod:`mla_lab.serving.metrics`): the benchmark starts at t = 0 (when ``get_request`` starts), its
  duration ends with the last token.

Run ``python -m mla_lab.serving.simulate`` for a demo (two illustrative pricers and the change between them).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .client import BenchConfig, ClientRequest, make_requests
from .metrics import RequestRecord, bench_metrics, compare, format_metrics
from .pricing import LinearStepPricer
from .scheduler import Scheduler, SchedulerConfig
from .step import Step, StepPricer

__all__ = ["StepPricer", "StepRecord", "ServingResult", "simulate"]

@dataclass(frozen=True)
class StepRecord:
    """One executed step: ``start_s`` / ``end_s`` (s from the benchmark start), ``duration_ms`` (ms, the pricer's
    answer), the :class:`Step`, and the engine state after scheduling it: ``kv_used_blocks`` (of
    ``kv_num_blocks``), ``num_running``, ``num_waiting`` and ``kv_wait`` (the queue's head waited for KV blocks)."""

    index: int
    start_s: float
    end_s: float
    duration_ms: float
    step: Step
    kv_used_blocks: int
    kv_num_blocks: int
    num_running: int
    num_waiting: int
    kv_wait: bool


@dataclass(frozen=True)
class ServingResult:
    """What :func:`simulate` returns: the inputs, per-request records (by request id), the steps and the metrics
    (``vllm bench serve`` names and units: see :func:`mla_lab.serving.metrics.bench_metrics`)."""

    bench: BenchConfig
    sched: SchedulerConfig
    requests: tuple[RequestRecord, ...]
    steps: tuple[StepRecord, ...]
    metrics: dict

    def summary(self, title: str = " Serving Benchmark Result ") -> str:
        """The metrics laid out as ``vllm bench serve`` prints them."""
        return format_metrics(self.metrics, title)


class _Client:
    """Client-side release of requests (arrival order, ``max_concurrency`` slots)."""

    def __init__(self, reqs: Sequence[ClientRequest], max_concurrency: int | None):
        self.pending = sorted(reqs, key=lambda r: (r.arrival_s, r.req_id))
        self.pos = 0
        self.limited = max_concurrency is not None
        self.free_slots: list[float] = [0.0] * (max_concurrency or 0)  # times slots became free (min-heap)

    def release(self, now: float) -> list[tuple[ClientRequest, float]]:
        """Requests sent by time ``now``, with their send times."""
        out = []
        while self.pos < len(self.pending) and self.pending[self.pos].arrival_s <= now:
            r = self.pending[self.pos]
            if self.limited:
                if not self.free_slots:
                    break
                send = max(r.arrival_s, heapq.heappop(self.free_slots))
            else:
                send = r.arrival_s
            out.append((r, send))
            self.pos += 1
        return out

    def complete(self, now: float) -> None:
        if self.limited:
            heapq.heappush(self.free_slots, now)

    def next_arrival(self) -> float | None:
        return self.pending[self.pos].arrival_s if self.pos < len(self.pending) else None


def _check_pricer_ms(ms, index: int, step: Step) -> float:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) and not hasattr(ms, "__float__"):
        raise ValueError(f"pricer returned {ms!r} for step {index} (kind {step.kind}); it must be a finite float > 0 "
                         "(ms)")
    v = float(ms)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"pricer returned {ms!r} ms for step {index} (kind {step.kind}); it must be a finite float "
                         "> 0")
    return v


def simulate(bench: BenchConfig, sched: SchedulerConfig, pricer: StepPricer, *,
             requests: Sequence[ClientRequest] | None = None, percentiles: Sequence[float] = (99,)) -> ServingResult:
    """Simulate ``vllm bench serve`` (``bench``) against an engine (``sched``) whose steps cost ``pricer(step)``
    ms; see the module docstring for the semantics.

    ``requests`` replaces the requests :func:`~mla_lab.serving.client.make_requests` would draw from ``bench``
    (a trace); ``bench.max_concurrency`` and ``bench.request_rate`` still apply to the client and the metrics.
    ``percentiles``: the ``p<P>_*_ms`` keys computed (vLLM default 99).

    Raises:
        ValueError: ``bench`` / ``sched`` of the wrong type, ``pricer`` not callable, an empty ``requests``,
            duplicate request ids, a request that can never fit the KV cache (before any step runs), a pricer
            answer that is not a finite number > 0 ms.
        PreemptionRequired: ``sched.kv_admission == "lazy"`` and a step where vLLM would preempt.
    """
    if not isinstance(bench, BenchConfig):
        raise ValueError(f"bench={bench!r} must be a BenchConfig")
    if not isinstance(sched, SchedulerConfig):
        raise ValueError(f"sched={sched!r} must be a SchedulerConfig")
    if not callable(pricer):
        raise ValueError(f"pricer={pricer!r} must be callable as pricer(step) -> ms")
    reqs = make_requests(bench) if requests is None else list(requests)
    if not reqs:
        raise ValueError("requests=[] must hold at least one ClientRequest")
    for r in reqs:
        if not isinstance(r, ClientRequest):
            raise ValueError(f"requests must hold ClientRequest objects, got {type(r).__name__}")
    ids = [r.req_id for r in reqs]
    if len(set(ids)) != len(ids):
        raise ValueError("requests have duplicate req_id values; ids must be unique")
    if bench.max_concurrency is not None and bench.max_concurrency > len(reqs):
        raise ValueError(f"max_concurrency={bench.max_concurrency!r} must be <= the number of requests {len(reqs)} "
                         "(None = unlimited)")

    engine = Scheduler(sched)
    for r in reqs:  # fail before any step if one request can never fit
        engine.check_fits(r.req_id, r.input_len, r.output_len)
    client = _Client(reqs, bench.max_concurrency)
    by_id = {r.req_id: r for r in reqs}
    send_s: dict[int, float] = {}
    tokens: dict[int, list[float]] = {r.req_id: [] for r in reqs}
    steps: list[StepRecord] = []
    finished = 0
    t = 0.0
    while finished < len(reqs):
        for r, s in client.release(t):
            send_s[r.req_id] = s
            engine.add_request(r.req_id, r.input_len, r.output_len)
        step = engine.schedule()
        if step is None:
            nxt = client.next_arrival()
            if nxt is None or nxt <= t:  # pragma: no cover - guarded by the scheduler's invariants
                raise RuntimeError(f"simulation stalled at t={t} s with {len(reqs) - finished} requests unfinished")
            t = nxt
            continue
        ms = _check_pricer_ms(pricer(step), len(steps), step)
        end = t + ms / 1000.0
        steps.append(StepRecord(len(steps), t, end, ms, step, engine.used_blocks, sched.num_blocks,
                                len(engine.running), len(engine.waiting), engine.last_kv_wait))
        for ev in engine.update_from_step(step):
            tokens[ev.req_id].append(end)
            if ev.finished:
                finished += 1
                client.complete(end)
        t = end

    records = tuple(RequestRecord(rid, by_id[rid].input_len, by_id[rid].output_len, by_id[rid].arrival_s,
                                  send_s[rid], tuple(tokens[rid])) for rid in sorted(by_id))
    metrics = bench_metrics(records, percentiles=percentiles, max_concurrency=bench.max_concurrency,
                            request_rate=bench.request_rate)
    return ServingResult(bench, sched, records, tuple(steps), metrics)


def main() -> None:
    """Demo: the PR #53878 benchmark shape (32 x 1024 / 128, concurrency 32, 16384-token budget, block 64) with two
    *illustrative* linear pricers (not the lab's cost model: the second one drops an assumed per-token pad copy),
    and the change between them."""
    bench = BenchConfig(num_prompts=32, random_input_len=1024, random_output_len=128, max_concurrency=32)
    sched = SchedulerConfig(max_num_batched_tokens=16384, max_num_seqs=256, kv_capacity_tokens=270_000,
                            block_size=64)
    base = dict(per_step_ms=6.0, per_decode_ctx_ms=2e-5, per_prefill_ctx_ms=1e-6, eager_step_ms=3.0)
    pricers = {"unfused": LinearStepPricer(per_token_ms=0.0475, **base),
               "fused": LinearStepPricer(per_token_ms=0.0450, **base)}
    results = {name: simulate(bench, sched, p) for name, p in pricers.items()}
    kinds = {}
    for s in results["fused"].steps:
        kinds[(s.step.kind, s.step.cudagraph_mode)] = kinds.get((s.step.kind, s.step.cudagraph_mode), 0) + 1
    print(f"steps (fused): {len(results['fused'].steps)}: {kinds}")
    for name, res in results.items():
        print(res.summary(f" {name} (illustrative pricer) "))
    ch = compare(results["unfused"], results["fused"])
    keys = ["duration", "total_token_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
            "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms"]
    print("fused vs unfused (%): " + ", ".join(f"{k} {ch[k]:+.2f}" for k in keys))


if __name__ == "__main__":
    main()
