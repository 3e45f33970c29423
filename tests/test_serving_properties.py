"""Property tests (hypothesis) of the serving simulation over random small workloads and engines.

For every run: every prompt token is scheduled exactly once and in order (chunks tile ``[0, prompt_len)``), every
request gets ``output_len - 1`` decode tokens with contexts ``prompt_len + 1 .. prompt_len + output_len - 1`` and
``output_len`` output tokens; each step's tokens fit ``max_num_batched_tokens``; its requests (decode tokens
included) never exceed ``max_num_seqs``; no request appears twice in a step; KV blocks in use never exceed the
capacity; token times are non-decreasing and no request is sent before it arrives nor has more than
``max_concurrency`` peers in flight. In ``"lazy"`` admission a run either satisfies all of that or stops with
PreemptionRequired.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mla_lab.serving import BenchConfig, LinearStepPricer, PreemptionRequired, SchedulerConfig, simulate
from mla_lab.serving.step import cudagraph_capture_sizes

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRICER = LinearStepPricer(per_token_ms=0.01, per_step_ms=1.0, per_decode_ctx_ms=1e-4, eager_step_ms=0.5)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 8))
    bench = BenchConfig(
        num_prompts=n,
        random_input_len=draw(st.integers(20, 300)),  # floor(20 * (1 - 0.9)) = 1 in floats (10 gives 0.99..)
        random_output_len=draw(st.integers(1, 12)),
        random_range_ratio=draw(st.sampled_from([0.0, 0.3, 0.9])),
        request_rate=draw(st.sampled_from([math.inf, 5.0, 200.0])),
        burstiness=draw(st.sampled_from([0.5, 1.0, 3.0])),
        max_concurrency=draw(st.one_of(st.none(), st.integers(1, n))),
        seed=draw(st.integers(0, 2**16)),
    )
    return bench


@st.composite
def engines(draw, bench):
    block = draw(st.sampled_from([1, 4, 16]))
    r = bench.random_range_ratio
    peak = math.ceil(bench.random_input_len * (1 + r)) + math.ceil(bench.random_output_len * (1 + r)) - 1
    blocks = -(-peak // block) + draw(st.sampled_from([0, 1, 3, 10, 40]))  # the largest request always fits
    return SchedulerConfig(
        max_num_batched_tokens=draw(st.integers(1, 512)),
        max_num_seqs=draw(st.integers(1, 6)),
        kv_capacity_tokens=blocks * block,
        block_size=block,
        long_prefill_token_threshold=draw(st.sampled_from([0, 7, 64])),
        kv_admission=draw(st.sampled_from(["reserve", "lazy"])),
    )


def _check(res):
    sched, bench = res.sched, res.bench
    prefill: dict[int, list] = {r.req_id: [] for r in res.requests}
    decode: dict[int, list] = {r.req_id: [] for r in res.requests}
    for s in res.steps:
        step = s.step
        assert 0 < step.num_tokens <= sched.max_num_batched_tokens
        ids = [d.req_id for d in step.decode] + [c.req_id for c in step.prefill_chunks]
        assert len(ids) == len(set(ids)) <= sched.max_num_seqs
        assert len(step.decode) <= sched.max_num_seqs
        assert s.num_running <= sched.max_num_seqs
        assert 0 <= s.kv_used_blocks <= sched.num_blocks
        uniform = all(c.num_tokens == 1 for c in step.prefill_chunks)  # vLLM: max_query_len == 1
        assert step.cuda_graph == (step.cudagraph_mode == "FULL")
        assert step.cudagraph_mode == ("NONE" if step.num_tokens > cudagraph_capture_sizes(sched.max_num_seqs)[-1]
                                       else "FULL" if uniform else "PIECEWISE")
        if step.cudagraph_num_tokens is not None:
            assert step.num_tokens <= step.cudagraph_num_tokens
        for c in step.prefill_chunks:
            assert c.num_tokens >= 1
            if sched.long_prefill_token_threshold:
                assert c.num_tokens <= sched.long_prefill_token_threshold
            prefill[c.req_id].append((c.start, c.end))
        for d in step.decode:
            decode[d.req_id].append(d.context_len)
    for r in res.requests:
        spans = prefill[r.req_id]
        assert spans[0][0] == 0 and spans[-1][1] == r.input_len  # tiles [0, P) in order, each token once
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert decode[r.req_id] == list(range(r.input_len + 1, r.input_len + r.output_len))
        assert len(r.token_times_s) == r.output_len
        assert r.send_s >= r.arrival_s and r.ttft_s > 0
    if bench.max_concurrency is not None:
        spans = [(r.send_s, r.token_times_s[-1]) for r in res.requests]
        for t, _ in spans:
            assert sum(1 for a, b in spans if a <= t < b) <= bench.max_concurrency
    m = res.metrics
    assert m["completed"] == bench.num_prompts
    assert m["total_output_tokens"] == sum(r.output_len for r in res.requests)
    assert m["duration"] == max(r.token_times_s[-1] for r in res.requests)


@FAST
@given(data=st.data())
def test_every_token_scheduled_once_within_every_limit(data):
    bench = data.draw(workloads())
    sched = data.draw(engines(bench))
    try:
        res = simulate(bench, sched, PRICER)
    except PreemptionRequired:
        assert sched.kv_admission == "lazy"  # reserve admission never needs a preemption
        return
    _check(res)


@FAST
@given(bench=workloads())
def test_reserve_and_lazy_agree_without_kv_pressure(bench):
    # with room for every request at its peak, admission never waits on KV: both modes schedule the same steps
    big = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, kv_capacity_tokens=1 << 20)
    lazy = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, kv_capacity_tokens=1 << 20,
                           kv_admission="lazy")
    a, b = simulate(bench, big, PRICER), simulate(bench, lazy, PRICER)
    assert [s.step for s in a.steps] == [s.step for s in b.steps]
    assert a.metrics == b.metrics
    _check(a)
