"""Event loop of a simulated ``vllm bench serve`` run against one vLLM v1 engine (the rules: docs/serving.md, "Time").
Request ``i`` is sent at ``max(arrival_s, a max_concurrency slot freed)`` and reaches the engine core
``engine_delay_s[req_id]`` later; a step is built when the previous one ends (with ``async_scheduling``: when it starts)
and lasts ``pricer(step)`` ms of GPU time plus ``cpu_step_ms`` (their max under async scheduling, but after an idle
engine); its tokens reach the client ``output_delay_s`` after its end. Times in s from t = 0."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._checks import check_float, check_ms
from .client import BenchConfig, ClientRequest, make_requests
from .metrics import RequestRecord, bench_metrics, format_metrics
from .scheduler import Scheduler, SchedulerConfig
from .step import Step, StepPricer


@dataclass(frozen=True)
class StepRecord:
    """One executed step (s from the start; ``duration_ms`` GPU + CPU time as charged) and the engine state after
    scheduling it (``kv_wait``: the queue's head waited for KV blocks)."""

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
    """:func:`simulate`'s inputs, records by request id, steps and metrics (``bench_metrics``)."""

    bench: BenchConfig
    sched: SchedulerConfig
    requests: tuple[RequestRecord, ...]
    steps: tuple[StepRecord, ...]
    metrics: dict
    engine_arrival_s: dict = field(default_factory=dict)  #: req_id -> when it reached the engine core (s)

    def summary(self, title: str = " Serving Benchmark Result ") -> str:
        return format_metrics(self.metrics, title)


class _Client:
    """Client-side release of requests (arrival order, ``max_concurrency`` slots)."""

    def __init__(self, reqs: Sequence[ClientRequest], max_concurrency: int | None):
        self.pending = sorted(reqs, key=lambda r: (r.arrival_s, r.req_id))
        self.pos, self.limited = 0, max_concurrency is not None
        self.free_slots: list[float] = [0.0] * (max_concurrency or 0)  # times slots became free (min-heap)

    def release(self, now: float) -> list[tuple[ClientRequest, float]]:
        out = []
        while self.pos < len(self.pending) and self.pending[self.pos].arrival_s <= now:
            r = self.pending[self.pos]
            if self.limited and not self.free_slots:
                break
            out.append((r, max(r.arrival_s, heapq.heappop(self.free_slots)) if self.limited else r.arrival_s))
            self.pos += 1
        return out

    def complete(self, now: float) -> None:
        if self.limited:
            heapq.heappush(self.free_slots, now)

    def next_arrival(self) -> float | None:
        return self.pending[self.pos].arrival_s if self.pos < len(self.pending) else None


def _checked_requests(bench, sched, pricer, requests) -> list[ClientRequest]:
    for name, v, ok, want in (("bench", bench, isinstance(bench, BenchConfig), "be a BenchConfig"),
                              ("sched", sched, isinstance(sched, SchedulerConfig), "be a SchedulerConfig"),
                              ("pricer", pricer, callable(pricer), "be callable as pricer(step) -> ms")):
        if not ok:
            raise ValueError(f"{name}={v!r} must {want}")
    reqs = make_requests(bench) if requests is None else list(requests)
    if not reqs:
        raise ValueError("requests=[] must hold at least one ClientRequest")
    bad = next((r for r in reqs if not isinstance(r, ClientRequest)), None)
    if bad is not None:
        raise ValueError(f"requests must hold ClientRequest objects, got {type(bad).__name__}")
    if len({r.req_id for r in reqs}) != len(reqs):
        raise ValueError("requests have duplicate req_id values; ids must be unique")
    if bench.max_concurrency is not None and bench.max_concurrency > len(reqs):
        raise ValueError(f"max_concurrency={bench.max_concurrency!r} must be <= the number of requests {len(reqs)} "
                         "(None = unlimited)")
    return reqs


class _Run:
    """One :func:`simulate` run: the engine, the client, requests on their way to the core, steps and tokens."""

    def __init__(self, bench, sched, pricer, reqs, delays, cpu_ms, out_s):
        self.sched, self.pricer, self.cpu_ms, self.out_s, self.delays = sched, pricer, cpu_ms, out_s, delays
        self.engine = Scheduler(sched)
        for r in reqs:  # fail before any step if one request can never fit
            self.engine.check_fits(r.req_id, r.input_len, r.output_len)
        self.client = _Client(reqs, bench.max_concurrency)
        self.by_id = {r.req_id: r for r in reqs}
        self.send_s, self.at_engine, self.steps, self.finished, self.t = {}, {}, [], 0, 0.0  # times in s by req_id
        self.inbound: list[tuple[float, int]] = []  # (engine arrival, req_id): sent, not yet seen by the engine core
        self.tokens: dict[int, list[float]] = {r.req_id: [] for r in reqs}
        self.prev_start: float | None = None  # start of the step running when the next is built (async); None: idle

    def _admit(self, cutoff: float) -> None:
        while self.inbound and self.inbound[0][0] <= cutoff:
            _, rid = heapq.heappop(self.inbound)
            r = self.by_id[rid]
            self.engine.add_request(rid, r.input_len, r.output_len)

    def _next_step(self) -> Step | None:
        for r, s in self.client.release(self.t):
            self.send_s[r.req_id] = s
            self.at_engine[r.req_id] = s + self.delays[r.req_id]
            heapq.heappush(self.inbound, (self.at_engine[r.req_id], r.req_id))
        cutoff = self.prev_start if (self.sched.async_scheduling and self.prev_start is not None) else self.t
        self._admit(cutoff)
        step = self.engine.schedule()
        if step is None and cutoff < self.t:  # async: nothing to run at step N's start; built when step N ends
            self._admit(self.t)
            step = self.engine.schedule()
        return step

    def _idle(self) -> None:
        nxt = [x for x in (self.inbound[0][0] if self.inbound else None, self.client.next_arrival())
               if x is not None and x > self.t]
        if not nxt:  # pragma: no cover - guarded by the scheduler's invariants
            raise RuntimeError(f"simulation stalled at t={self.t} s with {len(self.by_id) - self.finished} "
                               "requests unfinished")
        self.t, self.prev_start = min(nxt), None

    def _run_step(self, step: Step) -> None:
        gpu_ms = check_ms(self.pricer(step), "pricer", f" for step {len(self.steps)} (kind {step.kind})")
        overlap = self.sched.async_scheduling and self.prev_start is not None  # CPU time hidden behind the GPU's
        ms = max(gpu_ms, self.cpu_ms) if overlap else gpu_ms + self.cpu_ms
        end = self.t + ms / 1000.0
        e = self.engine
        self.steps.append(StepRecord(len(self.steps), self.t, end, ms, step, e.used_blocks, self.sched.num_blocks,
                                     len(e.running), len(e.waiting), e.last_kv_wait))
        seen = end + self.out_s
        for ev in e.update_from_step(step):
            self.tokens[ev.req_id].append(seen)
            if ev.finished:
                self.finished += 1
                self.client.complete(seen)
        self.prev_start, self.t = self.t, end

    def run(self) -> tuple[RequestRecord, ...]:
        while self.finished < len(self.by_id):
            if (step := self._next_step()) is None:
                self._idle()
            else:
                self._run_step(step)
        b = self.by_id
        return tuple(RequestRecord(rid, b[rid].input_len, b[rid].output_len, b[rid].arrival_s, self.send_s[rid],
                                   tuple(self.tokens[rid])) for rid in sorted(b))


def simulate(bench: BenchConfig, sched: SchedulerConfig, pricer: StepPricer, *,
             requests: Sequence[ClientRequest] | None = None, percentiles: Sequence[float] = (99,),
             engine_delay_s: Mapping[int, float] | Sequence[float] | None = None, cpu_step_ms: float = 0.0,
             output_delay_s: float = 0.0) -> ServingResult:
    """Simulate ``vllm bench serve`` (``bench``) against an engine (``sched``) whose steps cost ``pricer(step)``
    ms of GPU time (module docstring). ``requests``: a trace instead of what ``bench`` draws; ``percentiles``: the
    ``p<P>_*_ms`` keys; ``engine_delay_s``: per request, send to engine core (s; by req_id, or a sequence in
    req_id order; None = 0); ``cpu_step_ms`` (ms) and ``output_delay_s`` (s) >= 0.

    Raises:
        ValueError: ``bench`` / ``sched`` of the wrong type, ``pricer`` not callable, an empty ``requests``,
            duplicate request ids, a request that can never fit the KV cache (before any step runs), a pricer
            answer that is not a finite number > 0 ms, a negative or non-finite delay / CPU time, an
            ``engine_delay_s`` without one entry per request.
        PreemptionRequired: ``sched.kv_admission == "lazy"`` and a step where vLLM would preempt.
    """
    reqs = _checked_requests(bench, sched, pricer, requests)
    cpu_ms = check_float("cpu_step_ms", cpu_step_ms, low=0.0, low_inclusive=True)
    out_s = check_float("output_delay_s", output_delay_s, low=0.0, low_inclusive=True)
    ids = [r.req_id for r in reqs]
    if engine_delay_s is None:
        delays = dict.fromkeys(ids, 0.0)
    elif isinstance(engine_delay_s, Mapping):
        missing = [i for i in ids if i not in engine_delay_s]
        if missing:
            raise ValueError(f"engine_delay_s has no entry for req_id {missing[0]}; it must map every request id "
                             "to a delay in s >= 0")
        delays = {i: engine_delay_s[i] for i in ids}
    else:
        seq = list(engine_delay_s)
        if len(seq) != len(ids):
            raise ValueError(f"engine_delay_s has {len(seq)} entries; it must have one per request ({len(ids)}), "
                             "in req_id order, or be a mapping req_id -> s")
        delays = dict(zip(sorted(ids), seq))
    delays = {i: check_float(f"engine_delay_s[{i}]", v, low=0.0, low_inclusive=True) for i, v in delays.items()}
    run = _Run(bench, sched, pricer, reqs, delays, cpu_ms, out_s)
    records = run.run()
    metrics = bench_metrics(records, percentiles=percentiles, max_concurrency=bench.max_concurrency,
                            request_rate=bench.request_rate)
    return ServingResult(bench, sched, records, tuple(run.steps), metrics, run.at_engine)
