"""The lab's one timer: :func:`median_ms` (``triton.testing.do_bench`` medians on CUDA: CUDA events, warm-up, L2
flushed; wall clock on CPU, dry runs only), :func:`graphed` (CUDA-graph replay), :func:`interleaved` (round-robin
repeats, order rotated, L2 flushed: drift hits all alike), :func:`summarize` (median, IQR, distribution-free 95 %
interval of the median), :func:`timed_window` (back-to-back calls each timed on its own, with the NVML readings of
the window), :func:`est_ms` (a rough figure to size a window) and :func:`quantile`. ms throughout.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

__all__ = ["median_ms", "graphed", "interleaved", "summarize", "cuda_ms", "timed_window", "est_ms", "quantile",
           "WINDOW_COLUMNS"]

#: Keys of a :func:`timed_window` result (``clock_event_reasons`` only with ``reasons=True``).
WINDOW_COLUMNS = ["n_calls", "ms_median", "ms_mean", "ms_p10", "ms_p90", "window_s", "sm_clock_mhz", "power_w",
                  "temp_c", "n_samples", "clock_event_reasons"]


def median_ms(fn: Callable[[], object], device: str = "cuda", warmup: int = 25, rep: int = 100, n_cpu: int = 3,
              graph: bool = False) -> float:
    """Median time (ms) of ``fn``.

    Args:
        fn: the call to time (no arguments).
        device: ``cuda`` (do_bench) or ``cpu`` (wall clock, ``n_cpu`` calls after one warm-up call).
        warmup, rep: do_bench's warm-up and repetition budgets (ms).
        graph: time the CUDA-graph replay of ``fn`` instead (CUDA only).
    """
    if device != "cuda":
        fn()
        ts = []
        for _ in range(n_cpu):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    from triton.testing import do_bench

    f = graphed(fn) if graph else fn
    return float(do_bench(f, warmup=warmup, rep=rep, return_mode="median"))


def graphed(fn: Callable[[], object], inner: int = 1) -> Callable[[], None]:
    """Capture ``inner`` back-to-back calls of ``fn`` in one CUDA graph after two warm-up calls on a side stream;
    returns the replay callable (the graph object is kept alive by the closure and exposed as ``replay.graph``)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()

    def replay():
        g.replay()

    replay.graph = g
    return replay


def cuda_ms(fn: Callable[[], object], flush=None) -> float:
    """One call of ``fn`` timed with CUDA events (ms); ``flush`` (a tensor) is zeroed first to evict L2."""
    import torch

    if flush is not None:
        flush.zero_()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def interleaved(fns: dict, repeats: int = 7, device: str = "cuda", inner: int = 1) -> dict:
    """Time each callable of ``fns`` ``repeats`` times, round-robin with the order rotated every round.

    Args:
        fns: ``{name: callable}``.
        repeats: rounds (>= 1); each round times every callable once (``inner`` calls averaged per sample).
        device: ``cuda`` (CUDA events, L2 flushed before each sample) or ``cpu`` (wall clock).
        inner: calls per sample (the sample is their mean), for calls much shorter than the event resolution.

    Returns:
        ``{name: [ms, ...]}`` in round order.
    """
    names = list(fns)
    flush = None
    if device == "cuda":
        import torch

        flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    for f in fns.values():  # warm-up
        f()
    out = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            f = fns[n]
            if device == "cuda":
                def many(f=f):
                    for _ in range(inner):
                        f()
                out[n].append(cuda_ms(many, flush) / inner)
            else:
                t0 = time.perf_counter()
                for _ in range(inner):
                    f()
                out[n].append((time.perf_counter() - t0) * 1e3 / inner)
    return out


def summarize(samples: Sequence[float]) -> dict:
    """``{"median", "q1", "q3", "iqr", "ci_lo", "ci_hi", "n"}`` of samples (ms). The 95 % interval of the median is
    distribution-free: the order statistics ``n/2 -+ 1.96 sqrt(n)/2`` (clamped to the sample range)."""
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        raise ValueError("samples=[] must hold at least one value")
    med = statistics.median(xs)
    q1, q3 = (statistics.quantiles(xs, n=4)[0], statistics.quantiles(xs, n=4)[2]) if n >= 2 else (xs[0], xs[0])
    half = 1.96 * math.sqrt(n) / 2
    lo = xs[max(0, int(math.floor(n / 2 - half)))]
    hi = xs[min(n - 1, int(math.ceil(n / 2 + half)) - 1)] if n > 1 else xs[0]
    return {"median": med, "q1": q1, "q3": q3, "iqr": q3 - q1, "ci_lo": lo, "ci_hi": hi, "n": n}


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, linear interpolation between order statistics (numpy's default).

    Raises:
        ValueError: ``xs`` is empty.
    """
    s = sorted(float(x) for x in xs)
    if not s:
        raise ValueError("xs=[] must hold at least one value")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def est_ms(fn: Callable[[], object], device: str = "cuda", k: int = 3) -> float:
    """Mean time (ms) of ``k`` back-to-back calls of ``fn`` after one warm-up call: CUDA events around all ``k`` on
    CUDA, wall clock on CPU. A rough figure to size a :func:`timed_window`, not a measurement to report."""
    fn()
    _sync(device)
    if device == "cuda":
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / k
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t0) * 1e3 / k


def timed_window(fn: Callable[[], object], n: int, device: str = "cuda", sampler=None,
                 after: Callable[[], object] | None = None, per: int = 1, reasons: bool = True) -> dict:
    """``n`` calls of ``fn``, each timed on its own: CUDA events around ``fn`` alone on CUDA (all events read after
    one synchronize at the end, so the calls run back to back), wall clock on CPU (a dry run of the logic).

    Args:
        fn: the call (its previous result is dropped before the next call allocates, so a window holds one output).
        n: calls (>= 1).
        device: ``cuda`` or ``cpu``.
        sampler: an :class:`mla_lab.measure.sink.NvmlSampler` (or None): its medians over the window are added.
        after: run untimed after each call (e.g. a GEMM interleaved between kernel calls).
        per: ``fn`` runs the op ``per`` times: per-call times are divided by it.
        reasons: include ``clock_event_reasons`` (the most frequent NVML clock-event bitmask, hex).

    Returns:
        ``{"n_calls", "ms_median", "ms_mean", "ms_p10", "ms_p90" (ms per call), "window_s" (wall s), "sm_clock_mhz",
        "power_w", "temp_c", "n_samples"[, "clock_event_reasons"]}`` (:data:`WINDOW_COLUMNS`; NVML fields empty
        strings and ``n_samples`` 0 without a working sampler).

    Raises:
        ValueError: ``n`` or ``per`` below 1.
    """
    if not isinstance(n, int) or n < 1 or not isinstance(per, int) or per < 1:
        raise ValueError(f"n={n!r}, per={per!r}: both must be ints >= 1")
    ts = []
    if device == "cuda":
        import torch

        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = None
        for start, end in events:
            result = None  # noqa: F841  (drop the previous output before the next call allocates)
            start.record()
            result = fn()
            end.record()
            if after is not None:
                after()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        del result
        ts = [start.elapsed_time(end) / per for start, end in events]
    else:
        t0 = time.perf_counter()
        for _ in range(n):
            a = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - a) * 1e3 / per)
            if after is not None:
                after()
        t1 = time.perf_counter()
    out = {"n_calls": n, "ms_median": statistics.median(ts), "ms_mean": statistics.fmean(ts),
           "ms_p10": quantile(ts, 0.1), "ms_p90": quantile(ts, 0.9), "window_s": round(t1 - t0, 4)}
    if sampler is not None and getattr(sampler, "ok", False):
        out.update(sampler.window(t0, t1, reasons=reasons))
    else:
        out.update({"sm_clock_mhz": "", "power_w": "", "temp_c": "", "n_samples": 0})
        if reasons:
            out["clock_event_reasons"] = ""
    return out
