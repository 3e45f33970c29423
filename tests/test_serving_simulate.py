"""The event loop (mla_lab.serving.simulate): client-side max-concurrency, step timing, token timestamps, idle
jumps, and the change between two pricers. Times are worked out by hand from constant or linear pricers."""

from __future__ import annotations

import numpy as np
import pytest

from mla_lab.serving import (
    BenchConfig,
    ClientRequest,
    ConstantPricer,
    LinearStepPricer,
    SchedulerConfig,
    compare,
    simulate,
)

STEP_MS = 10.0
SCHED = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256, kv_capacity_tokens=1 << 20)
CONCURRENCY = [1, 2, 3]
APPROX = dict(abs=1e-9)


def _ms(x):
    return [round(v * 1000, 9) for v in x]


# ------------------------------------------------------------------------------------------ the hand trace, timed


def test_hand_trace_token_times_under_a_constant_pricer():
    # 5 steps of 10 ms (tests/test_serving_scheduler.py): r0 tokens at the ends of steps 1-3, r1 of 2-4, r2 of 3-5.
    res = simulate(BenchConfig(num_prompts=3, random_input_len=1500, random_output_len=3), SCHED,
                   ConstantPricer(STEP_MS))
    assert [_ms(r.token_times_s) for r in res.requests] == [[10, 20, 30], [20, 30, 40], [30, 40, 50]]
    assert res.metrics["mean_ttft_ms"] == pytest.approx(20.0, **APPROX)
    assert res.metrics["duration"] == pytest.approx(0.05, **APPROX)
    assert [s.step.kind for s in res.steps] == ["prefill", "mixed", "mixed", "decode", "decode"]


def test_hand_trace_under_a_linear_pricer():
    # 1 ms per step + 0.01 ms per token: steps of 2048, 2048, 407, 2, 1 tokens -> 21.48, 21.48, 5.07, 1.02, 1.01 ms
    res = simulate(BenchConfig(num_prompts=3, random_input_len=1500, random_output_len=3), SCHED,
                   LinearStepPricer(per_token_ms=0.01, per_step_ms=1.0))
    ends = [21.48, 42.96, 48.03, 49.05, 50.06]
    assert [s.duration_ms for s in res.steps] == pytest.approx([21.48, 21.48, 5.07, 1.02, 1.01], abs=1e-9)
    assert [s.end_s * 1000 for s in res.steps] == pytest.approx(ends, abs=1e-9)
    assert [r.ttft_s * 1000 for r in res.requests] == pytest.approx([ends[0], ends[1], ends[2]], abs=1e-9)
    assert res.requests[0].itl_s == pytest.approx((0.02148, 0.00507), abs=1e-12)


# ---------------------------------------------------------------------------------------------- max concurrency


def test_concurrency_one_ttft_excludes_client_waiting_while_duration_grows():
    # 3 requests (P=100, O=3) at t=0, 10 ms per step. Concurrency 1: each runs alone for 3 steps (prefill + 2
    # decodes) = 30 ms; sends at 0, 30, 60 ms (the slot frees with the last token); TTFT 10 ms each (measured from
    # the send); queue 0, 30, 60 ms; duration 90 ms.
    # Unlimited: one 300-token prefill step, then 2 decode steps: TTFT 10 ms each, duration 30 ms.
    bench = dict(num_prompts=3, random_input_len=100, random_output_len=3)
    one = simulate(BenchConfig(**bench, max_concurrency=1), SCHED, ConstantPricer(STEP_MS))
    free = simulate(BenchConfig(**bench), SCHED, ConstantPricer(STEP_MS))
    assert [_ms([r.send_s])[0] for r in one.requests] == [0, 30, 60]
    assert [r.ttft_s * 1000 for r in one.requests] == pytest.approx([10, 10, 10], **APPROX)
    assert [r.ttft_s * 1000 for r in free.requests] == pytest.approx([10, 10, 10], **APPROX)
    assert [r.client_queue_s * 1000 for r in one.requests] == pytest.approx([0, 30, 60], **APPROX)
    assert one.metrics["duration"] == pytest.approx(0.09, **APPROX)
    assert free.metrics["duration"] == pytest.approx(0.03, **APPROX)
    assert one.metrics["mean_e2el_ms"] == pytest.approx(30.0, **APPROX)
    assert one.metrics["mean_client_queue_time_ms"] == pytest.approx(30.0, **APPROX)
    assert "e2el_including_client_queue" not in " ".join(one.metrics)  # only with a finite request rate
    assert "mean_client_queue_time_ms" not in free.metrics  # only with max_concurrency set
    assert one.metrics["max_concurrent_requests"] == 1 and free.metrics["max_concurrent_requests"] == 3


@pytest.mark.parametrize("conc", CONCURRENCY)
def test_in_flight_never_exceeds_max_concurrency(conc):
    res = simulate(BenchConfig(num_prompts=6, random_input_len=64, random_output_len=4, random_range_ratio=0.5,
                               max_concurrency=conc, seed=conc), SCHED, ConstantPricer(STEP_MS))
    spans = [(r.send_s, r.token_times_s[-1]) for r in res.requests]
    for t, _ in spans:  # at each send: requests sent before and not yet finished, plus this one
        assert sum(1 for s, e in spans if s <= t < e) <= conc
    assert res.metrics["max_concurrent_requests"] == conc


def test_finite_rate_with_concurrency_reports_queue_inclusive_e2el():
    res = simulate(BenchConfig(num_prompts=4, random_input_len=64, random_output_len=2, request_rate=1000.0,
                               max_concurrency=1, seed=0), SCHED, ConstantPricer(STEP_MS))
    m = res.metrics
    want = sum(r.e2el_s + r.client_queue_s for r in res.requests) / 4 * 1000
    assert m["mean_e2el_including_client_queue_ms"] == pytest.approx(want, **APPROX)


# ------------------------------------------------------------------------------------------ arrivals and idling


def test_engine_idles_until_the_next_arrival():
    # r0 at 0 s, r1 at 1 s, (P=10, O=2), 10 ms steps: r0 tokens at 10, 20 ms; the engine idles; r1 at 1010, 1020.
    trace = [ClientRequest(0, 0.0, 10, 2), ClientRequest(1, 1.0, 10, 2)]
    res = simulate(BenchConfig(num_prompts=2, request_rate=2.0), SCHED, ConstantPricer(STEP_MS), requests=trace)
    assert [_ms(r.token_times_s) for r in res.requests] == [[10, 20], [1010, 1020]]
    assert res.metrics["duration"] == pytest.approx(1.02, **APPROX)
    assert res.steps[2].start_s == 1.0


def test_request_arriving_mid_step_joins_the_next_step_and_its_ttft_counts_from_arrival():
    # r1 arrives at 5 ms, during step 1 [0, 10) ms; sent at once (no limit); scheduled in step 2 [10, 20) ms
    # (beside r0's decode token): TTFT = 20 - 5 = 15 ms.
    trace = [ClientRequest(0, 0.0, 10, 2), ClientRequest(1, 0.005, 10, 2)]
    res = simulate(BenchConfig(num_prompts=2), SCHED, ConstantPricer(STEP_MS), requests=trace)
    assert res.requests[1].send_s == 0.005
    assert res.requests[1].ttft_s * 1000 == pytest.approx(15.0, **APPROX)
    assert res.steps[1].step.kind == "mixed"


# --------------------------------------------------------------------------------------------------- strategies


def test_half_price_steps_halve_every_latency_and_double_throughput():
    bench = BenchConfig(num_prompts=8, random_input_len=700, random_output_len=5, random_range_ratio=0.3, seed=4)
    a = simulate(bench, SCHED, ConstantPricer(10.0))
    b = simulate(bench, SCHED, ConstantPricer(5.0))
    ch = compare(a, b)
    for k in ("duration", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
              "mean_e2el_ms"):
        assert ch[k] == pytest.approx(-50.0, abs=1e-9), k
    for k in ("request_throughput", "output_throughput", "total_token_throughput"):
        assert ch[k] == pytest.approx(100.0, abs=1e-9), k
    assert ch["total_input_tokens"] == 0.0 and ch["completed"] == 0.0


def test_steps_are_back_to_back_unless_the_engine_idles_and_kv_stays_within_capacity():
    res = simulate(BenchConfig(num_prompts=10, random_input_len=300, random_output_len=8, random_range_ratio=0.5,
                               request_rate=20.0, seed=9),
                   SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, kv_capacity_tokens=1024),
                   LinearStepPricer(per_token_ms=0.02, per_step_ms=2.0))
    sends = {r.send_s for r in res.requests}
    gaps = 0
    for prev, nxt in zip(res.steps, res.steps[1:]):
        if nxt.start_s != prev.end_s:  # a gap only when everything sent so far had finished: idle until a send
            gaps += 1
            assert nxt.start_s > prev.end_s and nxt.start_s in sends
            assert all(r.token_times_s[-1] <= prev.end_s for r in res.requests if r.send_s < nxt.start_s)
    assert gaps > 0  # this workload does idle (20 req/s against ~10 ms requests)
    assert all(s.kv_used_blocks <= s.kv_num_blocks == 64 for s in res.steps)
    assert res.metrics["completed"] == 10


# ------------------------------------------------------------------------------------------ async scheduling (issue 20)
def _two_requests(delay_ms: float, out0: int = 3):
    reqs = [ClientRequest(0, 0.0, 100, out0), ClientRequest(1, 0.0, 100, 3)]
    return reqs, {0: 0.0, 1: delay_ms / 1e3}


@pytest.mark.parametrize("use_async, r1_first_token_ms, step2", [(False, 20.0, (1, 1)), (True, 30.0, (1, 0))])
def test_async_scheduling_delays_a_late_arrival_by_one_step(use_async, r1_first_token_ms, step2):
    # r1 reaches the engine core at 5 ms, while step 1 (r0's prompt, 0-10 ms) runs. Without async scheduling step 2
    # is built at 10 ms and takes r1's prompt; with it, step 2 was built when step 1 started (t = 0), so it is r0's
    # decode alone and r1 joins step 3 (20-30 ms): one step later.
    reqs, delays = _two_requests(5.0)
    sched = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256, kv_capacity_tokens=1 << 20,
                            async_scheduling=use_async)
    res = simulate(BenchConfig(num_prompts=2, random_input_len=100, random_output_len=3), sched,
                   ConstantPricer(STEP_MS), requests=reqs, engine_delay_s=delays)
    s2 = res.steps[1].step
    assert (len(s2.decode), len(s2.prefill_chunks)) == step2
    assert _ms(res.requests[0].token_times_s) == [10.0, 20.0, 30.0]
    assert _ms(res.requests[1].token_times_s)[0] == r1_first_token_ms
    assert res.requests[1].ttft_s * 1000 == pytest.approx(r1_first_token_ms)  # TTFT counts from the send (t = 0)
    assert res.engine_arrival_s == {0: 0.0, 1: 0.005}


def test_async_step_with_nothing_to_run_at_its_build_time_is_built_when_the_previous_step_ends():
    # r0 has one output token: after step 1 nothing of it is left. At step 1's start (t = 0) nothing else is at the
    # engine, so vLLM blocks on step 1 and schedules at 10 ms, when r1 (arrived at 5 ms) is there.
    reqs, delays = _two_requests(5.0, out0=1)
    sched = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256, kv_capacity_tokens=1 << 20,
                            async_scheduling=True)
    res = simulate(BenchConfig(num_prompts=2, random_input_len=100, random_output_len=3), sched,
                   ConstantPricer(STEP_MS), requests=reqs, engine_delay_s=delays)
    assert [round(s.start_s * 1000, 9) for s in res.steps] == [0.0, 10.0, 20.0, 30.0]
    assert _ms(res.requests[1].token_times_s) == [20.0, 30.0, 40.0]


@pytest.mark.parametrize("use_async, durations", [(False, [12.0, 12.0, 12.0]), (True, [12.0, 10.0, 10.0])])
def test_cpu_step_time_adds_without_async_and_overlaps_with_it(use_async, durations):
    # one request, output 3, 10 ms of GPU per step, 2 ms of CPU: sync 10 + 2 every step; async max(10, 2) except
    # the first step after an idle engine (nothing to overlap with)
    sched = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256, kv_capacity_tokens=1 << 20,
                            async_scheduling=use_async)
    res = simulate(BenchConfig(num_prompts=1, random_input_len=100, random_output_len=3), sched,
                   ConstantPricer(STEP_MS), cpu_step_ms=2.0, output_delay_s=0.001)
    assert [s.duration_ms for s in res.steps] == pytest.approx(durations)
    ends = np.cumsum(durations)
    assert _ms(res.requests[0].token_times_s) == pytest.approx(list(ends + 1.0))  # + 1 ms delivery


def test_all_at_t0_async_gives_the_same_run_as_sync():
    bench = BenchConfig(num_prompts=32, random_input_len=1024, random_output_len=16, max_concurrency=32)
    kw = dict(max_num_batched_tokens=16384, max_num_seqs=256, kv_capacity_tokens=300_000, block_size=64)
    pricer = LinearStepPricer(per_token_ms=0.03, per_step_ms=9.0)
    a = simulate(bench, SchedulerConfig(**kw), pricer)
    b = simulate(bench, SchedulerConfig(**kw, async_scheduling=True), pricer)
    assert a.metrics == b.metrics
    assert [s.step for s in a.steps] == [s.step for s in b.steps]
