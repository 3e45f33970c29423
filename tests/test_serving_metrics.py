"""Metric definitions (mla_lab.serving.metrics) against a hand-computed 2-request run, as vllm bench serve's
calculate_metrics defines them: TTFT from the send, TPOT excludes the first token, ITL per gap (pooled), E2EL,
throughputs over the duration, np.percentile (linear) and np.std (population).

The run (times in ms, both requests arrive at 0):
  r0: input 100, output 3, sent 0,  tokens 10, 30, 60 -> TTFT 10, ITL [20, 30], E2EL 60, TPOT (60-10)/2 = 25
  r1: input 200, output 2, sent 20, tokens 50, 70     -> TTFT 30, ITL [20],     E2EL 50, TPOT (50-30)/1 = 20
  duration 70 ms; 2 requests, 300 input + 5 output tokens.
"""

from __future__ import annotations

import math

import pytest

from mla_lab.serving.metrics import RequestRecord, bench_metrics, compare, format_metrics

RUN = [RequestRecord(0, 100, 3, 0.0, 0.0, (0.010, 0.030, 0.060)),
       RequestRecord(1, 200, 2, 0.0, 0.020, (0.050, 0.070))]
ITL_STD = math.sqrt(((20 - 70 / 3) ** 2 * 2 + (30 - 70 / 3) ** 2) / 3)  # population std of [20, 30, 20]

EXPECTED = {
    "duration": 0.07, "completed": 2, "failed": 0, "total_input_tokens": 300, "total_output_tokens": 5,
    "request_throughput": 2 / 0.07, "output_throughput": 5 / 0.07, "total_token_throughput": 305 / 0.07,
    # linear percentile of [10, 30] at 99: 10 + 0.99 * 20
    "mean_ttft_ms": 20.0, "median_ttft_ms": 20.0, "std_ttft_ms": 10.0, "p99_ttft_ms": 29.8,
    "mean_tpot_ms": 22.5, "median_tpot_ms": 22.5, "std_tpot_ms": 2.5, "p99_tpot_ms": 24.95,
    # sorted ITLs [20, 20, 30]: p99 at rank 1.98 -> 20 + 0.98 * 10
    "mean_itl_ms": 70 / 3, "median_itl_ms": 20.0, "std_itl_ms": ITL_STD, "p99_itl_ms": 29.8,
    "mean_e2el_ms": 55.0, "median_e2el_ms": 55.0, "std_e2el_ms": 5.0, "p99_e2el_ms": 59.9,
    "max_concurrent_requests": 2, "max_output_tokens_per_s": 5.0,
}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_hand_computed_two_request_run(key):
    assert bench_metrics(RUN)[key] == pytest.approx(EXPECTED[key], rel=1e-12, abs=1e-12)


def test_the_key_set_is_vllms():
    assert set(bench_metrics(RUN)) == set(EXPECTED)  # nothing more, nothing less (percentiles: 99 only)


def test_per_request_properties():
    r0, r1 = RUN
    assert (r0.ttft_s, r0.e2el_s, r0.tpot_s) == pytest.approx((0.010, 0.060, 0.025))
    assert r0.itl_s == pytest.approx((0.020, 0.030))
    assert (r1.ttft_s, r1.tpot_s, r1.client_queue_s) == pytest.approx((0.030, 0.020, 0.020))


def test_client_queue_metrics_with_max_concurrency():
    m = bench_metrics(RUN, max_concurrency=1, request_rate=1.0)
    assert m["mean_client_queue_time_ms"] == pytest.approx(10.0)  # queues [0, 20]
    assert m["mean_e2el_including_client_queue_ms"] == pytest.approx(65.0)  # [60, 70]
    assert "mean_e2el_including_client_queue_ms" not in bench_metrics(RUN, max_concurrency=1)  # rate inf


@pytest.mark.parametrize("percentiles, keys", [((50,), {"p50_ttft_ms"}), ((90, 99.9), {"p90_ttft_ms", "p99.9_ttft_ms"})])
def test_percentile_key_names(percentiles, keys):
    m = bench_metrics(RUN, percentiles=percentiles)
    assert {k for k in m if k.endswith("_ttft_ms") and k.startswith("p")} == keys
    assert m["p50_ttft_ms" if 50 in percentiles else "p90_ttft_ms"] == pytest.approx(20.0 if 50 in percentiles
                                                                                     else 28.0)


def test_single_token_outputs_have_no_tpot_and_no_itl():
    recs = [RequestRecord(0, 10, 1, 0.0, 0.0, (0.010,)), RequestRecord(1, 10, 1, 0.0, 0.0, (0.020,))]
    m = bench_metrics(recs)
    assert (m["mean_tpot_ms"], m["p99_tpot_ms"], m["mean_itl_ms"]) == (0.0, 0.0, 0.0)  # vLLM: np.mean([] or 0)
    assert m["mean_ttft_ms"] == pytest.approx(15.0) and m["mean_e2el_ms"] == pytest.approx(15.0)


def test_tpot_excludes_requests_with_one_token_but_they_count_for_ttft():
    recs = [RUN[0], RequestRecord(1, 10, 1, 0.0, 0.0, (0.040,))]
    m = bench_metrics(recs)
    assert m["mean_tpot_ms"] == pytest.approx(25.0) and m["mean_ttft_ms"] == pytest.approx(25.0)


def test_explicit_duration_and_peak_tokens_per_second_buckets():
    recs = [RequestRecord(0, 1, 3, 0.0, 0.0, (0.5, 1.2, 1.7)), RequestRecord(1, 1, 2, 0.0, 0.9, (1.1, 2.5))]
    m = bench_metrics(recs, duration_s=4.0)
    assert m["duration"] == 4.0 and m["request_throughput"] == 0.5 and m["output_throughput"] == 1.25
    assert m["max_output_tokens_per_s"] == 3.0  # second [1, 2): tokens at 1.1, 1.2, 1.7


# -------------------------------------------------------------------------------------------------- compare

A = {"mean_ttft_ms": 100.0, "total_token_throughput": 1000.0, "zero": 0, "both_zero": 0.0, "label": "x"}
B = {"mean_ttft_ms": 90.5, "total_token_throughput": 1060.0, "zero": 3, "both_zero": 0.0, "label": "y",
     "only_b": 1.0}


@pytest.mark.parametrize("key, change", [("mean_ttft_ms", -9.5), ("total_token_throughput", 6.0), ("both_zero", 0.0)])
def test_compare_percent_change(key, change):
    assert compare(A, B)[key] == pytest.approx(change, abs=1e-12)


def test_compare_edge_keys():
    ch = compare(A, B)
    assert math.isnan(ch["zero"]) and "label" not in ch and "only_b" not in ch


def test_format_metrics_uses_vllms_labels():
    text = format_metrics(bench_metrics(RUN))
    for line in ("Successful requests:                     2", "Mean TTFT (ms):                          20.00",
                 "P99 ITL (ms):                            29.80", "Total token throughput (tok/s):          4357.14"):
        assert line in text
