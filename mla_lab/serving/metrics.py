"""The metrics ``vllm bench serve`` prints, computed from per-request timestamps, with vLLM's names and units
(``calculate_metrics`` in ``vllm/benchmarks/serve.py`` @ 009e6d4a, ``endpoint_request_func.py`` @ 02cfb534; each
definition in docs/serving.md, "Metrics"): ``ttft`` / ``itl`` / ``e2el`` from the send (after the client's semaphore),
``tpot = (latency - ttft) / (output_len - 1)``; ``mean_/median_/std_/p<P>_*_ms`` (``np.std`` population,
``np.percentile`` linear; an empty list gives 0); throughputs per ``duration`` (s, from t = 0 to the last token). Every
simulated request succeeds (``failed`` = 0)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._checks import check_float, check_int, check_int_or_none

#: The metrics ``mla-lab serve`` prints (``vllm bench serve``'s labels), in its order.
SERVE_METRICS = (("completed", "Successful requests"), ("duration", "Benchmark duration (s)"),
                 ("request_throughput", "Request throughput (req/s)"),
                 ("output_throughput", "Output token throughput (tok/s)"),
                 ("total_token_throughput", "Total token throughput (tok/s)"),
                 *((f"{s}_{m}_ms", f"{s.capitalize()} {m.upper()} (ms)")  # e.g. "P99 TTFT (ms)"
                   for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "p99")))


@dataclass(frozen=True)
class RequestRecord:
    """One finished request: lengths in tokens, times in s from the start (``send_s``: the semaphore acquired;
    ``token_times_s``: each output token at the client). Raises ValueError: ``output_len`` tokens missing,
    decreasing times, a token before ``send_s``, a send before ``arrival_s``."""

    req_id: int
    input_len: int
    output_len: int
    arrival_s: float
    send_s: float
    token_times_s: tuple[float, ...]

    def __post_init__(self) -> None:
        check_int("input_len", self.input_len)
        check_int("output_len", self.output_len)
        check_float("arrival_s", self.arrival_s, low=0.0, low_inclusive=True)
        check_float("send_s", self.send_s, low=self.arrival_s, low_inclusive=True)
        ts = tuple(float(t) for t in self.token_times_s)
        object.__setattr__(self, "token_times_s", ts)
        if len(ts) != self.output_len:
            raise ValueError(f"token_times_s has {len(ts)} entries; it must have output_len={self.output_len}")
        if ts[0] < self.send_s or any(b < a for a, b in zip(ts, ts[1:])):
            raise ValueError(f"token_times_s={ts!r} must be non-decreasing and >= send_s={self.send_s}")

    @property
    def ttft_s(self) -> float:
        return self.token_times_s[0] - self.send_s

    @property
    def e2el_s(self) -> float:
        """Last token - send (vLLM's ``latency``), s."""
        return self.token_times_s[-1] - self.send_s

    @property
    def itl_s(self) -> tuple[float, ...]:
        ts = self.token_times_s
        return tuple(b - a for a, b in zip(ts, ts[1:]))

    @property
    def tpot_s(self) -> float | None:
        """Time per output token but the first (s); None for ``output_len == 1``."""
        return (self.e2el_s - self.ttft_s) / (self.output_len - 1) if self.output_len > 1 else None

    @property
    def client_queue_s(self) -> float:
        return self.send_s - self.arrival_s


def _stats(name: str, values_s: list[float], percentiles: Sequence[float], out: dict) -> None:
    v = values_s or 0  # vLLM: np.mean(x or 0)
    for stat, f in (("mean", np.mean), ("median", np.median), ("std", np.std)):
        out[f"{stat}_{name}_ms"] = float(f(v)) * 1000
    for p in percentiles:
        out[f"p{int(p) if int(p) == p else p}_{name}_ms"] = float(np.percentile(v, p)) * 1000


def bench_metrics(records: Sequence[RequestRecord], duration_s: float | None = None,
                  percentiles: Sequence[float] = (99,), max_concurrency: int | None = None,
                  request_rate: float = math.inf) -> dict[str, float]:
    """The result dict of ``vllm bench serve`` (its keys; ``duration`` s, default the last token, throughputs req/s
    or tok/s, ``*_ms`` ms) for finished ``records``.

    Raises:
        ValueError: no records, a record that is not a :class:`RequestRecord`, ``duration_s`` <= 0 or before the
            last token, a percentile outside [0, 100].
    """
    if not records:
        raise ValueError("records=[] must hold at least one RequestRecord")
    for r in records:
        if not isinstance(r, RequestRecord):
            raise ValueError(f"records must hold RequestRecord objects, got {type(r).__name__}")
    last = max(r.token_times_s[-1] for r in records)
    duration_s = last if duration_s is None else duration_s
    check_float("duration_s", duration_s, low=0.0)
    if duration_s < last:
        raise ValueError(f"duration_s={duration_s!r} must be >= the last token time {last}")
    for p in percentiles:
        check_float("percentile", p, low=0.0, low_inclusive=True, high=100.0, high_inclusive=True)
    check_int_or_none("max_concurrency", max_concurrency)

    total_in = sum(r.input_len for r in records)
    total_out = sum(r.output_len for r in records)
    out: dict[str, float] = {"duration": float(duration_s), "completed": len(records), "failed": 0,
                             "total_input_tokens": total_in, "total_output_tokens": total_out,
                             "request_throughput": len(records) / duration_s, "output_throughput": total_out / duration_s,
                             "total_token_throughput": (total_in + total_out) / duration_s}
    # peak output tokens in one-second buckets and peak concurrency (serve.py calculate_metrics)
    t0 = min(r.send_s for r in records)
    # sparse buckets (issue 39): a dense array of one float per simulated second asked 8.91 TiB at 1e-12 req/s
    n_buckets = int(np.ceil(max(r.send_s + r.e2el_s for r in records) - t0)) + 1
    buckets = Counter(b for r in records for b in (int(t - t0) for t in r.token_times_s) if 0 <= b < n_buckets)
    events = sorted([(r.send_s, 1) for r in records] + [(r.send_s + r.e2el_s, -1) for r in records])
    out["max_output_tokens_per_s"] = float(max(buckets.values(), default=0))
    out["max_concurrent_requests"] = max(0, int(np.cumsum([d for _, d in events]).max()))

    _stats("ttft", [r.ttft_s for r in records], percentiles, out)
    _stats("tpot", [r.tpot_s for r in records if r.tpot_s is not None], percentiles, out)
    _stats("itl", [g for r in records for g in r.itl_s], percentiles, out)
    _stats("e2el", [r.e2el_s for r in records], percentiles, out)
    if max_concurrency is not None:
        _stats("client_queue_time", [r.client_queue_s for r in records], percentiles, out)
        if not math.isinf(request_rate):
            _stats("e2el_including_client_queue", [r.e2el_s + r.client_queue_s for r in records], percentiles, out)
    return out


def _as_metrics(x) -> Mapping[str, float]:
    m = getattr(x, "metrics", x)
    if not isinstance(m, Mapping):
        raise ValueError(f"compare() takes metrics dicts or ServingResult objects, got {type(x).__name__}")
    return m


def compare(a, b) -> dict[str, float]:
    """``(b - a) / a * 100`` per numeric metric in both (metrics dicts or ``ServingResult``); a 0 baseline gives 0.0
    when ``b`` is 0 too, else nan. Raises ValueError: an argument that is neither."""
    ma, mb = _as_metrics(a), _as_metrics(b)
    return {k: (0.0 if vb == 0 else math.nan) if va == 0 else (vb - va) / va * 100.0 for k, va in ma.items()
            if not isinstance(va, bool) and isinstance(va, (int, float)) and isinstance(vb := mb.get(k), (int, float))}


_LABELS = [("completed", "Successful requests:", "d"), ("failed", "Failed requests:", "d"),
           ("duration", "Benchmark duration (s):", ".2f"), ("total_input_tokens", "Total input tokens:", "d"),
           ("total_output_tokens", "Total generated tokens:", "d"),
           ("request_throughput", "Request throughput (req/s):", ".2f"),
           ("output_throughput", "Output token throughput (tok/s):", ".2f"),
           ("max_output_tokens_per_s", "Peak output token throughput (tok/s):", ".2f"),
           ("max_concurrent_requests", "Peak concurrent requests:", ".2f"),
           ("total_token_throughput", "Total token throughput (tok/s):", ".2f")]
_HEADERS = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
            "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency"),
            "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
            "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency")}


def format_metrics(metrics: Mapping[str, float], title: str = " Serving Benchmark Result ") -> str:
    """The metrics as ``vllm bench serve`` lays them out (``{:<40} {:<10.2f}`` lines)."""
    lines = ["{s:{c}^{n}}".format(s=title, n=50, c="=")]
    for key, label, fmt in _LABELS:
        if key in metrics:
            lines.append("{:<40} {:<10{f}}".format(label, metrics[key], f=fmt))
    for name, (short, header) in _HEADERS.items():
        if f"mean_{name}_ms" not in metrics:
            continue
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        lines.append("{:<40} {:<10.2f}".format(f"Mean {short} (ms):", metrics[f"mean_{name}_ms"]))
        lines.append("{:<40} {:<10.2f}".format(f"Median {short} (ms):", metrics[f"median_{name}_ms"]))
        for k in metrics:
            if k.startswith("p") and k.endswith(f"_{name}_ms") and k[1:-len(name) - 4].replace(".", "").isdigit():
                lines.append("{:<40} {:<10.2f}".format(f"P{k[1:-len(name) - 4]} {short} (ms):", metrics[k]))
    lines.append("=" * 50)
    return "\n".join(lines)
