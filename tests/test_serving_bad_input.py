"""Bad input to mla_lab.serving gives a one-line ValueError naming the argument, its value and what is allowed.

One table; each case is (id, callable, regex the message must match). Every case also checks the message is a
single line.
"""

from __future__ import annotations

import math

import pytest

from mla_lab.serving import (
    BenchConfig,
    ClientRequest,
    ConstantPricer,
    LinearStepPricer,
    RequestRecord,
    SchedulerConfig,
    bench_metrics,
    compare,
    make_pricer,
    simulate,
)
from mla_lab.serving.pricing import prefill_topk_lengths
from mla_lab.serving.scheduler import Scheduler
from mla_lab.serving.step import PrefillChunk

SCHED = dict(max_num_batched_tokens=2048, max_num_seqs=8, kv_capacity_tokens=1 << 16)
OK_BENCH = BenchConfig(num_prompts=2, random_input_len=16, random_output_len=2)
OK_SCHED = SchedulerConfig(**SCHED)
RUN = [RequestRecord(0, 100, 2, 0.0, 0.0, (0.01, 0.07))]


def _sched(**kw):
    return SchedulerConfig(**{**SCHED, **kw})


def _dup_scheduler():
    s = Scheduler(OK_SCHED)
    s.add_request(3, 10, 2)
    s.add_request(3, 10, 2)


CASES = [
    # ----------------------------------------------------------------------------------------- BenchConfig
    ("num_prompts=0", lambda: BenchConfig(num_prompts=0), r"^num_prompts=0 must be a positive int$"),
    ("num_prompts=True", lambda: BenchConfig(num_prompts=True), r"^num_prompts=True must be a positive int$"),
    ("random_input_len<0", lambda: BenchConfig(random_input_len=-5), r"^random_input_len=-5 must be a positive int$"),
    ("random_output_len=0", lambda: BenchConfig(random_output_len=0), r"^random_output_len=0 must be a positive int$"),
    ("range_ratio=1", lambda: BenchConfig(random_range_ratio=1.0),
     r"^random_range_ratio=1\.0 must be a float in \[0, 1\)$"),
    ("range_ratio<0", lambda: BenchConfig(random_range_ratio=-0.1),
     r"^random_range_ratio=-0\.1 must be a float in \[0, 1\)$"),
    ("request_rate=0", lambda: BenchConfig(request_rate=0), r"^request_rate=0 must be a float in \(0, inf\]$"),
    ("request_rate=nan", lambda: BenchConfig(request_rate=math.nan), r"^request_rate=nan must be a float in \(0, inf\]$"),
    ("request_rate=-inf", lambda: BenchConfig(request_rate=-math.inf), r"^request_rate=-inf must be a float in"),
    ("request_rate='inf'", lambda: BenchConfig(request_rate="inf"), r"^request_rate='inf' must be a float in"),
    ("burstiness=0", lambda: BenchConfig(burstiness=0.0), r"^burstiness=0\.0 must be a float in \(0, inf\]$"),
    ("max_concurrency=0", lambda: BenchConfig(max_concurrency=0),
     r"^max_concurrency=0 must be a positive int or None$"),
    ("max_concurrency>num_prompts", lambda: BenchConfig(num_prompts=32, max_concurrency=64),
     r"^max_concurrency=64 must be <= num_prompts=32 \(None = unlimited\)$"),
    ("seed<0", lambda: BenchConfig(seed=-1), r"^seed=-1 must be a non-negative int$"),
    ("seed>=2**32", lambda: BenchConfig(seed=2**32), r"^seed=4294967296 must be an int in \[0, 4294967295\]$"),
    ("min input < 1", lambda: BenchConfig(random_input_len=1, random_range_ratio=0.5),
     r"^random_input_len=1 gives a minimum input of 0 tokens .* it must give >= 1$"),
    ("special tokens eat the input", lambda: BenchConfig(random_input_len=2, num_special_tokens=2),
     r"^random_input_len=2 gives a minimum input of 0 tokens \(num_special_tokens=2"),
    ("normalize_arrivals='yes'", lambda: BenchConfig(normalize_arrivals="yes"),
     r"^normalize_arrivals='yes' must be a bool$"),
    ("ClientRequest arrival<0", lambda: ClientRequest(0, -1.0, 10, 2), r"^arrival_s=-1\.0 must be a float in \[0, inf\)$"),
    # ------------------------------------------------------------------------------------- SchedulerConfig
    ("max_num_batched_tokens=0", lambda: _sched(max_num_batched_tokens=0),
     r"^max_num_batched_tokens=0 must be a positive int$"),
    ("max_num_seqs=1.5", lambda: _sched(max_num_seqs=1.5), r"^max_num_seqs=1\.5 must be a positive int$"),
    ("kv < one block", lambda: _sched(kv_capacity_tokens=8),
     r"^kv_capacity_tokens=8 must be >= block_size=16 \(at least one KV block\)$"),
    ("block_size=0", lambda: _sched(block_size=0), r"^block_size=0 must be a positive int$"),
    ("threshold<0", lambda: _sched(long_prefill_token_threshold=-1),
     r"^long_prefill_token_threshold=-1 must be a non-negative int$"),
    ("kv_admission", lambda: _sched(kv_admission="preempt"),
     r"^kv_admission='preempt' must be one of \['reserve', 'lazy'\]$"),
    ("enforce_eager=1", lambda: _sched(enforce_eager=1), r"^enforce_eager=1 must be a bool$"),
    ("capture size 0", lambda: _sched(max_cudagraph_capture_size=0),
     r"^max_cudagraph_capture_size=0 must be a positive int or None$"),
    ("duplicate req_id", _dup_scheduler, r"^req_id=3 was already added; ids must be unique$"),
    # -------------------------------------------------------------------------------------------- simulate
    ("never fits", lambda: simulate(BenchConfig(num_prompts=1, random_input_len=1500, random_output_len=3),
                                    _sched(kv_capacity_tokens=1024), ConstantPricer(1.0)),
     r"^request 0 needs 94 KV blocks \(1502 tokens = prompt 1500 \+ output 3 - 1\) but kv_capacity_tokens=1024 "
     r"holds 64 blocks of 16; it can never run"),
    ("pricer 0 ms", lambda: simulate(OK_BENCH, OK_SCHED, lambda s: 0),
     r"^pricer returned 0 ms for step 0 \(kind prefill\); it must be a finite float > 0$"),
    ("pricer nan", lambda: simulate(OK_BENCH, OK_SCHED, lambda s: math.nan), r"^pricer returned nan ms for step 0"),
    ("pricer str", lambda: simulate(OK_BENCH, OK_SCHED, lambda s: "5"), r"^pricer returned '5' for step 0"),
    ("bench type", lambda: simulate("x", OK_SCHED, ConstantPricer(1.0)), r"^bench='x' must be a BenchConfig$"),
    ("sched type", lambda: simulate(OK_BENCH, {}, ConstantPricer(1.0)), r"^sched=\{\} must be a SchedulerConfig$"),
    ("pricer None", lambda: simulate(OK_BENCH, OK_SCHED, None),
     r"^pricer=None must be callable as pricer\(step\) -> ms$"),
    ("requests=[]", lambda: simulate(OK_BENCH, OK_SCHED, ConstantPricer(1.0), requests=[]),
     r"^requests=\[\] must hold at least one ClientRequest$"),
    ("duplicate ids", lambda: simulate(OK_BENCH, OK_SCHED, ConstantPricer(1.0),
                                       requests=[ClientRequest(1, 0.0, 5, 2), ClientRequest(1, 0.0, 5, 2)]),
     r"^requests have duplicate req_id values; ids must be unique$"),
    ("trace shorter than max_concurrency", lambda: simulate(BenchConfig(num_prompts=4, max_concurrency=3), OK_SCHED,
                                                            ConstantPricer(1.0),
                                                            requests=[ClientRequest(0, 0.0, 5, 2)]),
     r"^max_concurrency=3 must be <= the number of requests 1 \(None = unlimited\)$"),
    # --------------------------------------------------------------------------------------------- pricing
    ("per_token_ms<0", lambda: LinearStepPricer(per_token_ms=-1.0),
     r"^per_token_ms=-1\.0 must be a float in \[0, inf\)$"),
    ("eager_step_ms=inf", lambda: LinearStepPricer(per_step_ms=1.0, eager_step_ms=math.inf),
     r"^eager_step_ms=inf must be a float in \[0, inf\)$"),
    ("all-zero pricer", lambda: LinearStepPricer(), r"^LinearStepPricer\(\) with every coefficient 0 prices steps"),
    ("pricer topk=0", lambda: LinearStepPricer(per_step_ms=1.0, topk=0), r"^topk=0 must be a positive int$"),
    ("ConstantPricer(0)", lambda: ConstantPricer(0.0), r"^ms=0\.0 must be a float in \(0, inf\)$"),
    ("chunk topk", lambda: prefill_topk_lengths(PrefillChunk(0, 0, 4), topk=0), r"^topk=0 must be a positive int$"),
    ("make_pricer fn", lambda: make_pricer("f"), r"^fn='f' must be callable as fn\(prefill_topk, decode_topk, "),
    # --------------------------------------------------------------------------------------------- metrics
    ("no records", lambda: bench_metrics([]), r"^records=\[\] must hold at least one RequestRecord$"),
    ("percentile 101", lambda: bench_metrics(RUN, percentiles=(101,)),
     r"^percentile=101 must be a float in \[0, 100\]$"),
    ("duration too short", lambda: bench_metrics(RUN, duration_s=0.01),
     r"^duration_s=0\.01 must be >= the last token time 0\.07$"),
    ("token count", lambda: RequestRecord(0, 10, 3, 0.0, 0.0, (0.1, 0.2)),
     r"^token_times_s has 2 entries; it must have output_len=3$"),
    ("send before arrival", lambda: RequestRecord(0, 10, 1, 0.5, 0.2, (0.6,)),
     r"^send_s=0\.2 must be a float in \[0\.5, inf\)$"),
    ("token before send", lambda: RequestRecord(0, 10, 2, 0.0, 0.2, (0.1, 0.3)),
     r"^token_times_s=\(0\.1, 0\.3\) must be non-decreasing and >= send_s=0\.2$"),
    ("compare type", lambda: compare(1, {}), r"^compare\(\) takes metrics dicts or ServingResult objects, got int$"),
]


@pytest.mark.parametrize("fn, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(fn, pattern):
    with pytest.raises(ValueError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    assert e.match(pattern)


def test_the_table_is_big_and_ids_unique():
    assert len(CASES) >= 10 and len({c[0] for c in CASES}) == len(CASES)
