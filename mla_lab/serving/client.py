"""The benchmark client as ``vllm bench serve`` drives it with the random dataset: request lengths and arrival
times.

Semantics, read in vllm-project/vllm (commits as stored by the lab's source index):

- **Lengths** (``vllm/benchmarks/datasets/random.py``, ``RandomDataset.get_sampling_params``, @ 237145ea): with
  ``real_input_len = max(0, random_input_len - num_special_tokens)``, input lengths are integer-uniform in
  ``[floor(real_input_len * (1 - r)), ceil(real_input_len * (1 + r))]`` and output lengths in
  ``[max(1, floor(out * (1 - r))), max(1, ceil(out * (1 + r)))]`` (both ends inclusive), drawn in that order
  from ``np.random.default_rng(seed)``; ``r = random_range_ratio`` must be in ``[0, 1)``. With ``--ignore-eos``
  every request produces exactly its output length. Not modelled: the decode/re-encode step that can shift a
  prompt by a token or two (vLLM logs the mismatch), ``--random-prefix-len``.
- **Arrivals** (``vllm/benchmarks/serve.py``, ``get_request``, @ 009e6d4a): ``request_rate = inf`` sends every
  request at t = 0. Otherwise each request's delay is drawn from ``np.random.gamma(shape=burstiness,
  scale=1 / (request_rate * burstiness))`` (burstiness 1 = exponential, a Poisson process; ``burstiness = inf``
  = constant ``1 / request_rate``), the delays are summed, and the cumulative times are rescaled so the last one
  is exactly ``num_prompts / request_rate``. ``serve.py`` seeds numpy's global generator with
  ``np.random.seed(args.seed)`` (``main_async``), so the draws here use ``np.random.RandomState(seed)``, the same
  stream. ``normalize_arrivals=False`` gives the older generator instead (``vllm/benchmarks/benchmark_serving.py``
  ``get_request`` @ 139d41fa): the first request at t = 0, each next one a gamma delay after the previous, no
  rescaling (that version's random dataset drew lengths differently; only its arrivals are reproduced).
- **Concurrency** (``serve.py``, ``benchmark`` / ``limited_request_func``): ``--max-concurrency`` is an
  ``asyncio.Semaphore`` on the client: a request that has arrived waits client side until fewer than
  ``max_concurrency`` requests are in flight; its ``start_time`` (and so its TTFT and E2EL clocks) is taken
  inside the request function, after the semaphore is acquired (``vllm/benchmarks/lib/endpoint_request_func.py``,
  @ 02cfb534: ``st = time.perf_counter()`` before the POST). The wait is reported separately as
  ``client_queue_time``. vLLM rejects ``max_concurrency <= 0``; a value above ``num_prompts`` has no effect there,
  and is refused here as a likely mistake.

Defaults are vLLM's (``vllm/benchmarks/datasets/arg_utils.py`` @ 237145ea: ``--seed 0``, ``--num-prompts 1000``,
``--random-input-len 1024``, ``--random-output-len 128``, ``--random-range-ratio 0.0``; ``serve.py``:
``--request-rate inf``, ``--burstiness 1.0``, ``--max-concurrency None``).

"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import check_bool, check_float, check_int, check_int_or_none

__all__ = ["BenchConfig", "ClientRequest", "length_bounds", "sample_lengths", "sample_intervals", "arrival_times",
           "make_requests"]

_MAX_SEED = 2**32 - 1  # np.random.RandomState / np.random.seed accept [0, 2**32 - 1]


@dataclass(frozen=True)
class BenchConfig:
    """The ``vllm bench serve`` arguments the simulation uses (random dataset, ``--ignore-eos``).

    Fields are spelled as vLLM spells them: ``num_prompts``, ``random_input_len`` / ``random_output_len``
    (tokens), ``random_range_ratio`` (in [0, 1)), ``request_rate`` (requests/s, ``float('inf')`` = all at
    t = 0), ``burstiness`` (gamma shape, > 0, inf allowed), ``max_concurrency`` (client-side limit, None =
    unlimited), ``seed``. Two extras: ``num_special_tokens`` (what the tokenizer's
    ``num_special_tokens_to_add()`` returns; vLLM subtracts it from the input length) and ``normalize_arrivals``
    (see the module docstring).

    Raises:
        ValueError: one line naming the field, its value and what is allowed, for any invalid field, including
            ``max_concurrency > num_prompts`` and an input length range whose minimum is below 1 token.
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
        check_int("num_prompts", self.num_prompts)
        check_int("random_input_len", self.random_input_len)
        check_int("random_output_len", self.random_output_len)
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
    """One request of the benchmark: ``arrival_s`` is when ``get_request`` yields it (seconds from the
    benchmark start), ``input_len`` / ``output_len`` its prompt and output lengths (tokens)."""

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
    (in_lo, in_hi), (out_lo, out_hi) = length_bounds(bench)
    rng = np.random.default_rng(bench.seed)
    input_lens = rng.integers(in_lo, in_hi + 1, size=bench.num_prompts)
    output_lens = rng.integers(out_lo, out_hi + 1, size=bench.num_prompts)
    return input_lens.astype(np.int64), output_lens.astype(np.int64)


def sample_intervals(bench: BenchConfig) -> np.ndarray:
    """The raw per-request delays (seconds, float64 array of ``num_prompts``) before summing and rescaling.

    Zeros for ``request_rate = inf``; ``1 / request_rate`` each for ``burstiness = inf``; otherwise one
    ``gamma(shape=burstiness, scale=1 / (request_rate * burstiness))`` draw per request, in request order, from
    ``np.random.RandomState(seed)``: mean ``1 / request_rate``, variance ``1 / (request_rate**2 * burstiness)``.
    """
    n, rate, b = bench.num_prompts, float(bench.request_rate), float(bench.burstiness)
    if math.isinf(rate):
        return np.zeros(n)
    if math.isinf(b):
        return np.full(n, 1.0 / rate)
    rs = np.random.RandomState(bench.seed)
    theta = 1.0 / (rate * b)
    return np.array([rs.gamma(shape=b, scale=theta) for _ in range(n)], dtype=np.float64)


def arrival_times(bench: BenchConfig) -> np.ndarray:
    """When each request arrives at the client (seconds from the benchmark start, float64, non-decreasing).

    With ``normalize_arrivals`` (default): cumulative :func:`sample_intervals` rescaled so the last arrival is
    ``num_prompts / request_rate``, as ``serve.py``'s ``get_request`` does. Without: ``0`` then the cumulative
    delays of all but the last request (the older ``benchmark_serving.py`` generator).
    """
    d = sample_intervals(bench)
    t = np.cumsum(d)
    if not bench.normalize_arrivals:
        return np.concatenate([[0.0], t[:-1]])
    if not math.isinf(bench.request_rate) and t[-1] != 0:
        t = t * ((bench.num_prompts / float(bench.request_rate)) / t[-1])
    return t


def make_requests(bench: BenchConfig) -> list[ClientRequest]:
    """The benchmark's requests in arrival order: ids ``0..num_prompts-1``, lengths and arrival times."""
    ins, outs = sample_lengths(bench)
    ts = arrival_times(bench)
    return [ClientRequest(i, float(ts[i]), int(ins[i]), int(outs[i])) for i in range(bench.num_prompts)]
