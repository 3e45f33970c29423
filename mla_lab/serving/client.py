"""The benchmark client as ``vllm bench serve`` drives it with the random dataset (rules: docs/serving.md, "Client").
Lengths: ``RandomDataset.get_sampling_params`` (``vllm/benchmarks/datasets/random.py`` @ 237145ea),
``np.random.default_rng(seed)``. Arrivals: ``get_request`` (``vllm/benchmarks/serve.py`` @ 009e6d4a), gamma delays from
``np.random.RandomState(seed)`` rescaled so the last arrival is ``num_prompts / request_rate``
(``normalize_arrivals=False``: the older ``benchmark_serving.py`` @ 139d41fa). ``max_concurrency``: the client's
``asyncio.Semaphore``, the TTFT clock starting after it (``endpoint_request_func.py`` @ 02cfb534). Defaults are vLLM's
(``vllm/benchmarks/datasets/arg_utils.py`` @ 237145ea; ``serve.py``: ``--request-rate inf``, ``--burstiness 1.0``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import check_bool, check_float, check_int, check_int_or_none

_MAX_SEED = 2**32 - 1  # np.random.RandomState / np.random.seed accept [0, 2**32 - 1]


@dataclass(frozen=True)
class BenchConfig:
    """The ``vllm bench serve`` arguments simulated (random dataset, ``--ignore-eos``), spelled as vLLM spells them
    (lengths in tokens, ``request_rate`` req/s with inf = all at t = 0, ``max_concurrency`` None = unlimited); extras:
    ``num_special_tokens`` (the tokenizer's ``num_special_tokens_to_add()``, taken off the input length) and
    ``normalize_arrivals`` (module docstring).

    Raises:
        ValueError: one line naming the field, its value and what is allowed (also ``max_concurrency >
            num_prompts``, a likely mistake, and an input range whose minimum is below 1 token).
    """

    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    num_special_tokens: int = 0
    normalize_arrivals: bool = True

    def __post_init__(self) -> None:
        for k in ("num_prompts", "random_input_len", "random_output_len"):
            check_int(k, getattr(self, k))
        check_float("random_range_ratio", self.random_range_ratio, low=0.0, low_inclusive=True, high=1.0)
        check_float("request_rate", self.request_rate, low=0.0, allow_inf=True)
        check_float("burstiness", self.burstiness, low=0.0, allow_inf=True)
        check_int_or_none("max_concurrency", self.max_concurrency)
        if self.max_concurrency is not None and self.max_concurrency > self.num_prompts:
            raise ValueError(f"max_concurrency={self.max_concurrency!r} must be <= num_prompts={self.num_prompts} "
                             "(None = unlimited)")
        check_int("seed", self.seed, allow_zero=True)
        if self.seed > _MAX_SEED:
            raise ValueError(f"seed={self.seed!r} must be an int in [0, {_MAX_SEED}]")
        check_int("num_special_tokens", self.num_special_tokens, allow_zero=True)
        check_bool("normalize_arrivals", self.normalize_arrivals)
        (lo, _), _ = length_bounds(self)
        if lo < 1:
            raise ValueError(f"random_input_len={self.random_input_len!r} gives a minimum input of {lo} tokens "
                             f"(num_special_tokens={self.num_special_tokens}, random_range_ratio="
                             f"{self.random_range_ratio}); it must give >= 1")


@dataclass(frozen=True)
class ClientRequest:
    """One request: ``arrival_s`` when ``get_request`` yields it (s from the start), lengths in tokens."""

    req_id: int
    arrival_s: float
    input_len: int
    output_len: int

    def __post_init__(self) -> None:
        check_int("req_id", self.req_id, allow_zero=True)
        check_float("arrival_s", self.arrival_s, low=0.0, low_inclusive=True)
        check_int("input_len", self.input_len)
        check_int("output_len", self.output_len)


def length_bounds(bench: BenchConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((input_low, input_high), (output_low, output_high))``, inclusive, in tokens (module docstring)."""
    r = float(bench.random_range_ratio)
    real_in = max(0, bench.random_input_len - bench.num_special_tokens)
    in_lo, in_hi = math.floor(real_in * (1 - r)), math.ceil(real_in * (1 + r))
    out = bench.random_output_len
    out_lo, out_hi = max(math.floor(out * (1 - r)), 1), max(math.ceil(out * (1 + r)), 1)
    return (in_lo, in_hi), (out_lo, out_hi)


def sample_lengths(bench: BenchConfig) -> tuple[np.ndarray, np.ndarray]:
    """Input and output lengths (int64 arrays of ``num_prompts``, tokens), drawn as ``RandomDataset`` draws them."""
    rng = np.random.default_rng(bench.seed)  # the input lengths drawn first, then the output lengths
    return tuple(rng.integers(lo, hi + 1, size=bench.num_prompts).astype(np.int64) for lo, hi in length_bounds(bench))


def sample_intervals(bench: BenchConfig) -> np.ndarray:
    """The raw per-request delays (s, float64 of ``num_prompts``): zeros at rate inf, ``1 / request_rate`` at
    burstiness inf, else ``gamma(burstiness, 1 / (request_rate * burstiness))`` draws from ``RandomState(seed)``."""
    n, rate, b = bench.num_prompts, float(bench.request_rate), float(bench.burstiness)
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(b):
        return np.full(n, 1.0 / rate)
    rs = np.random.RandomState(bench.seed)
    return np.array([rs.gamma(shape=b, scale=1.0 / (rate * b)) for _ in range(n)], dtype=np.float64)


def arrival_times(bench: BenchConfig) -> np.ndarray:
    """When each request arrives at the client (s, float64, non-decreasing): the cumulative delays, rescaled as
    ``get_request`` does; without ``normalize_arrivals``, 0 then all but the last (``benchmark_serving.py``)."""
    t = np.cumsum(sample_intervals(bench))
    if not bench.normalize_arrivals:
        return np.concatenate([[0.0], t[:-1]])
    if not math.isinf(bench.request_rate) and t[-1] != 0:
        t = t * ((bench.num_prompts / float(bench.request_rate)) / t[-1])
    return t


def make_requests(bench: BenchConfig) -> list[ClientRequest]:
    """The benchmark's requests in arrival order: ids ``0..num_prompts-1``, lengths and arrival times."""
    (ins, outs), ts = sample_lengths(bench), arrival_times(bench)
    return [ClientRequest(i, float(ts[i]), int(ins[i]), int(outs[i])) for i in range(bench.num_prompts)]
