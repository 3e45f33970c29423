"""Event loop of a simulated ``vllm bench serve`` run against one vLLM v1 engine.

- **Client** (:mod:`mla_lab.serving.client`): request ``i`` arrives at ``arrival_s``; with ``max_concurrency``
  it is *sent* only when fewer than ``max_concurrency`` requests are in flight (FIFO, as the waiters of an
  ``asyncio.Semaphore``), at ``send_s = max(arrival_s, the time a slot freed)``. TTFT and E2EL are measured
  from ``send_s``.
- **Engine**: steps run back to back; a step starts when the previous one ends. A request sent at ``send_s``
  reaches the engine core at ``send_s + engine_delay_s[req_id]`` (the API server's HTTP handling, tokenisation
  and hand-off; 0 by default). Without async scheduling a step is built when the previous one ends and sees every
  request that has reached the engine core by then; with ``sched.async_scheduling`` step N+1 is built when step N
  starts (vLLM's batch queue of two, :mod:`mla_lab.serving.scheduler`), so it sees only the requests that arrived
  by then: a request arriving while step N runs joins step N+2. If that leaves nothing to run, the step is built
  when step N ends instead (the engine core blocks on step N, then schedules). If nothing is runnable, time jumps
  to the next arrival. Each step is built by :class:`~mla_lab.serving.scheduler.Scheduler`; the pricer gives its
  GPU time ``pricer(step)`` (ms).
- **Per-step CPU time** ``cpu_step_ms`` (scheduling, input preparation, output handling in the engine core; 0 by
  default): without async scheduling it adds to every step (``gpu + cpu``); with it, it overlaps the previous
  step's GPU time (``max(gpu, cpu)``), except for a step that follows an idle engine (``gpu + cpu``).
- **Tokens**: every token sampled in a step reaches the client ``output_delay_s`` after the step's end
  (detokenisation, the API server's streaming, HTTP; 0 by default): the step completing a prompt gives the first
  token, each later step with the request's decode token one more. A ``max_concurrency`` slot frees when a
  request's last token reaches the client.
- **Metrics** (:mod:`mla_lab.serving.metrics`): the benchmark starts at t = 0 (when ``get_request`` starts), its
  duration ends with the last token.

Run ``python -m mla_lab.serving.simulate`` for a demo (two illustrative pricers and the change between them).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._checks import check_float
from .client import BenchConfig, ClientRequest, make_requests
from .metrics import RequestRecord, bench_metrics, compare, format_metrics
from .pricing import LinearStepPricer
from .scheduler import Scheduler, SchedulerConfig
from .step import Step, StepPricer

__all__ = ["StepPricer", "StepRecord", "ServingResult", "simulate"]

@dataclass(frozen=True)
class StepRecord:
    """One executed step: ``start_s`` / ``end_s`` (s from the benchmark start), ``duration_ms`` (ms: the pricer's
    GPU time, plus ``cpu_step_ms`` as :func:`simulate` charges it), the :class:`Step`, and the engine state after scheduling it: ``kv_used_blocks`` (of
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
    (``vllm bench serve`` names and units: see :func:`mla_lab.serving.metrics.bench_metrics`), and when each
    request reached the engine core."""

    bench: BenchConfig
    sched: SchedulerConfig
    requests: tuple[RequestRecord, ...]
    steps: tuple[StepRecord, ...]
    metrics: dict
    engine_arrival_s: dict = field(default_factory=dict)  #: req_id -> when it reached the engine core (s)

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


def _engine_delays(engine_delay_s, reqs) -> dict[int, float]:
    ids = [r.req_id for r in reqs]
    if engine_delay_s is None:
        return dict.fromkeys(ids, 0.0)
    if isinstance(engine_delay_s, Mapping):
        missing = [i for i in ids if i not in engine_delay_s]
        if missing:
            raise ValueError(f"engine_delay_s has no entry for req_id {missing[0]}; it must map every request id "
                             "to a delay in s >= 0")
        vals = {i: engine_delay_s[i] for i in ids}
    else:
        seq = list(engine_delay_s)
        if len(seq) != len(ids):
            raise ValueError(f"engine_delay_s has {len(seq)} entries; it must have one per request ({len(ids)}), "
                             "in req_id order, or be a mapping req_id -> s")
        vals = dict(zip(sorted(ids), seq))
    return {i: check_float(f"engine_delay_s[{i}]", v, low=0.0, low_inclusive=True) for i, v in vals.items()}


def simulate(bench: BenchConfig, sched: SchedulerConfig, pricer: StepPricer, *,
             requests: Sequence[ClientRequest] | None = None, percentiles: Sequence[float] = (99,),
             engine_delay_s: Mapping[int, float] | Sequence[float] | None = None, cpu_step_ms: float = 0.0,
             output_delay_s: float = 0.0) -> ServingResult:
    """Simulate ``vllm bench serve`` (``bench``) against an engine (``sched``) whose steps cost ``pricer(step)``
    ms of GPU time; see the module docstring for the semantics.

    ``requests`` replaces the requests :func:`~mla_lab.serving.client.make_requests` would draw from ``bench``
    (a trace); ``bench.max_concurrency`` and ``bench.request_rate`` still apply to the client and the metrics.
    ``percentiles``: the ``p<P>_*_ms`` keys computed (vLLM default 99). ``engine_delay_s``: per request, the time
    from its send to the engine core (s; a mapping by req_id or a sequence in req_id order; None = 0).
    ``cpu_step_ms``: the engine core's CPU time per step (ms, >= 0). ``output_delay_s``: from a step's end to its
    tokens reaching the client (s, >= 0). With all three 0 and ``sched.async_scheduling`` False the run is the
    lab's original one (every request at the engine when sent, steps of GPU time only, tokens at the step's end).

    Raises:
        ValueError: ``bench`` / ``sched`` of the wrong type, ``pricer`` not callable, an empty ``requests``,
            duplicate request ids, a request that can never fit the KV cache (before any step runs), a pricer
            answer that is not a finite number > 0 ms, a negative or non-finite delay / CPU time, an
            ``engine_delay_s`` without one entry per request.
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
    cpu_ms = check_float("cpu_step_ms", cpu_step_ms, low=0.0, low_inclusive=True)
    out_s = check_float("output_delay_s", output_delay_s, low=0.0, low_inclusive=True)
    delays = _engine_delays(engine_delay_s, reqs)
    use_async = sched.async_scheduling

    engine = Scheduler(sched)
    for r in reqs:  # fail before any step if one request can never fit
        engine.check_fits(r.req_id, r.input_len, r.output_len)
    client = _Client(reqs, bench.max_concurrency)
    by_id = {r.req_id: r for r in reqs}
    send_s: dict[int, float] = {}
    at_engine: dict[int, float] = {}
    inbound: list[tuple[float, int]] = []  # (engine arrival, req_id): sent, not yet seen by the engine core
    tokens: dict[int, list[float]] = {r.req_id: [] for r in reqs}
    steps: list[StepRecord] = []
    finished = 0
    t = 0.0
    prev_start: float | None = None  # start of the step running when the next one is built (async), None = idle

    def admit(cutoff: float) -> None:
        while inbound and inbound[0][0] <= cutoff:
            ta, rid = heapq.heappop(inbound)
            r = by_id[rid]
            engine.add_request(rid, r.input_len, r.output_len)

    while finished < len(reqs):
        for r, s in client.release(t):
            send_s[r.req_id] = s
            at_engine[r.req_id] = s + delays[r.req_id]
            heapq.heappush(inbound, (at_engine[r.req_id], r.req_id))
        cutoff = prev_start if (use_async and prev_start is not None) else t
        admit(cutoff)
        step = engine.schedule()
        if step is None and cutoff < t:  # async: nothing to run at step N's start; built when step N ends
            admit(t)
            step = engine.schedule()
        if step is None:
            nxt = [x for x in (inbound[0][0] if inbound else None, client.next_arrival()) if x is not None and x > t]
            if not nxt:  # pragma: no cover - guarded by the scheduler's invariants
                raise RuntimeError(f"simulation stalled at t={t} s with {len(reqs) - finished} requests unfinished")
            t = min(nxt)
            prev_start = None
            continue
        gpu_ms = _check_pricer_ms(pricer(step), len(steps), step)
        if cpu_ms == 0.0:
            ms = gpu_ms
        elif use_async and prev_start is not None:
            ms = max(gpu_ms, cpu_ms)
        else:
            ms = gpu_ms + cpu_ms
        end = t + ms / 1000.0
        steps.append(StepRecord(len(steps), t, end, ms, step, engine.used_blocks, sched.num_blocks,
                                len(engine.running), len(engine.waiting), engine.last_kv_wait))
        seen = end + out_s
        for ev in engine.update_from_step(step):
            tokens[ev.req_id].append(seen)
            if ev.finished:
                finished += 1
                client.complete(seen)
        prev_start = t
        t = end

    records = tuple(RequestRecord(rid, by_id[rid].input_len, by_id[rid].output_len, by_id[rid].arrival_s,
                                  send_s[rid], tuple(tokens[rid])) for rid in sorted(by_id))
    metrics = bench_metrics(records, percentiles=percentiles, max_concurrency=bench.max_concurrency,
                            request_rate=bench.request_rate)
    return ServingResult(bench, sched, records, tuple(steps), metrics, at_engine)


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
