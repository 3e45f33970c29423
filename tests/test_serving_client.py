"""The benchmark client (mla_lab.serving.client): random-dataset lengths and arrival times as ``vllm bench serve``
draws them (vllm/benchmarks/datasets/random.py, vllm/benchmarks/serve.py ``get_request``).

Statistical checks use a tolerance of ``Z = 5`` standard errors (CLT): for n i.i.d. gamma(shape b, scale
1/(rate*b)) delays the sample mean has standard error ``1 / (rate * sqrt(b) * sqrt(n))``; for exponential delays
(b = 1) the sample variance has standard error ``sqrt(8 / n) * sigma**2`` (fourth central moment 9 sigma**4). The
seeds are fixed, so each check is deterministic; 5 sigma means a correct sampler would fail it with probability
below 1e-6 for a fresh seed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from mla_lab.serving.client import (
    BenchConfig,
    arrival_times,
    length_bounds,
    make_requests,
    sample_intervals,
    sample_lengths,
)

SEEDS = [0, 1, 12345]
RATES = [0.5, 4.0, 100.0]
BURSTINESS = [0.25, 1.0, 4.0]
N_STAT = 20_000
Z = 5.0


# ---------------------------------------------------------------------------------------------------- lengths


@pytest.mark.parametrize("inp, out, r, special, bounds", [
    (1024, 128, 0.0, 0, ((1024, 1024), (128, 128))),
    (1000, 100, 0.25, 0, ((750, 1250), (75, 125))),
    (1000, 100, 0.25, 1, ((749, 1249), (75, 125))),  # real input 999: floor(749.25), ceil(1248.75)
    (10, 1, 0.5, 0, ((5, 15), (1, 2))),  # output low floor(0.5) = 0 -> clamped to 1
])
def test_length_bounds_floor_ceil(inp, out, r, special, bounds):
    b = BenchConfig(num_prompts=1, random_input_len=inp, random_output_len=out, random_range_ratio=r,
                    num_special_tokens=special)
    assert length_bounds(b) == bounds


def test_sampled_lengths_cover_exactly_the_bounds():
    b = BenchConfig(num_prompts=N_STAT, random_input_len=1000, random_output_len=100, random_range_ratio=0.25)
    ins, outs = sample_lengths(b)
    assert (ins.min(), ins.max(), outs.min(), outs.max()) == (750, 1250, 75, 125)


@pytest.mark.parametrize("seed", SEEDS)
def test_lengths_are_randomdataset_draws(seed):
    # RandomDataset: rng = default_rng(seed); input_lens = rng.integers(lo, hi + 1, n); then output_lens.
    b = BenchConfig(num_prompts=50, random_input_len=512, random_output_len=64, random_range_ratio=0.5, seed=seed)
    rng = np.random.default_rng(seed)
    want_in, want_out = rng.integers(256, 768 + 1, size=50), rng.integers(32, 96 + 1, size=50)
    ins, outs = sample_lengths(b)
    assert ins.tolist() == want_in.tolist() and outs.tolist() == want_out.tolist()


def test_zero_range_ratio_gives_fixed_lengths():
    reqs = make_requests(BenchConfig(num_prompts=32, random_input_len=1024, random_output_len=128))
    assert {(r.input_len, r.output_len, r.arrival_s) for r in reqs} == {(1024, 128, 0.0)}
    assert [r.req_id for r in reqs] == list(range(32))


# --------------------------------------------------------------------------------------------------- arrivals


def _vllm_get_request_delays(n, rate, burstiness, seed):
    """serve.py's get_request delay logic, restated: np.random.seed(seed) (main_async), one np.random.gamma per
    request, cumulative, rescaled so the last delay is n / rate."""
    np.random.seed(seed)
    delay = [np.random.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)) for _ in range(n)]
    for i in range(1, n):
        delay[i] += delay[i - 1]
    return np.array(delay) * ((n / rate) / delay[-1])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("burstiness", BURSTINESS)
def test_arrivals_equal_vllm_get_request(seed, rate, burstiness):
    b = BenchConfig(num_prompts=64, request_rate=rate, burstiness=burstiness, seed=seed)
    np.testing.assert_array_equal(arrival_times(b), _vllm_get_request_delays(64, rate, burstiness, seed))


@pytest.mark.parametrize("burstiness", BURSTINESS)
def test_arrivals_reproducible_with_a_seed_different_with_another(burstiness):
    a = arrival_times(BenchConfig(num_prompts=100, request_rate=4.0, burstiness=burstiness, seed=7))
    again = arrival_times(BenchConfig(num_prompts=100, request_rate=4.0, burstiness=burstiness, seed=7))
    other = arrival_times(BenchConfig(num_prompts=100, request_rate=4.0, burstiness=burstiness, seed=8))
    np.testing.assert_array_equal(a, again)
    assert not np.array_equal(a, other)
    assert np.all(np.diff(a) >= 0)


@pytest.mark.parametrize("rate", RATES)
def test_normalized_last_arrival_is_num_prompts_over_rate(rate):
    t = arrival_times(BenchConfig(num_prompts=37, request_rate=rate, seed=3))
    assert t[-1] == pytest.approx(37 / rate, rel=1e-12)


def _legacy_get_request_times(n, rate, burstiness, seed):
    """The older benchmark_serving.py get_request, restated: yield a request, then sleep one gamma draw."""
    np.random.seed(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += np.random.gamma(shape=burstiness, scale=1.0 / (rate * burstiness))
    return np.array(out)


@pytest.mark.parametrize("burstiness", BURSTINESS)
def test_unnormalized_arrivals_are_the_legacy_generator(burstiness):
    b = BenchConfig(num_prompts=20, request_rate=2.0, burstiness=burstiness, seed=5, normalize_arrivals=False)
    np.testing.assert_allclose(arrival_times(b), _legacy_get_request_times(20, 2.0, burstiness, 5), rtol=1e-12)
    assert arrival_times(b)[0] == 0.0


def test_infinite_rate_sends_everything_at_zero():
    assert arrival_times(BenchConfig(num_prompts=5, burstiness=0.1)).tolist() == [0.0] * 5


def test_infinite_burstiness_is_a_constant_interval():
    assert arrival_times(BenchConfig(num_prompts=4, request_rate=2.0, burstiness=math.inf)).tolist() == \
        [0.5, 1.0, 1.5, 2.0]


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("burstiness", BURSTINESS)
def test_mean_interval_is_one_over_rate_clt(rate, burstiness):
    d = sample_intervals(BenchConfig(num_prompts=N_STAT, request_rate=rate, burstiness=burstiness, seed=11))
    se = 1.0 / (rate * math.sqrt(burstiness) * math.sqrt(N_STAT))
    assert abs(d.mean() - 1.0 / rate) < Z * se


@pytest.mark.parametrize("rate", RATES)
def test_burstiness_one_is_poisson_exponential_variance(rate):
    # exponential delays: variance = mean**2 (coefficient of variation 1), as a Poisson process has.
    d = sample_intervals(BenchConfig(num_prompts=N_STAT, request_rate=rate, burstiness=1.0, seed=13))
    sigma2 = 1.0 / rate**2
    assert abs(d.var() - sigma2) < Z * math.sqrt(8.0 / N_STAT) * sigma2


def test_lower_burstiness_is_burstier():
    cv = {b: (lambda d: d.std() / d.mean())(sample_intervals(BenchConfig(num_prompts=N_STAT, request_rate=1.0,
                                                                          burstiness=b, seed=2)))
          for b in BURSTINESS}
    # gamma CV = 1 / sqrt(shape): 2, 1, 0.5 (far apart compared with the sampling error at n = 20000)
    assert cv[0.25] > 1.5 > cv[1.0] > 0.75 > cv[4.0]
