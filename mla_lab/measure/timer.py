"""The lab's one timer, ms throughout: :func:`median_ms` (``triton.testing.do_bench`` medians on CUDA: CUDA events,
warm-up, L2 flushed; wall clock on CPU, dry runs only), :func:`call_ms` (one call), :func:`graphed` (CUDA-graph
replay), :func:`interleaved` (round-robin, order rotated, L2 flushed: drift hits all alike), :func:`summarize`,
:func:`timed_window` (back-to-back calls each timed, with the window's NVML readings), :func:`est_ms` (a rough
figure to size a window) and :func:`quantile`.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

#: Keys of a :func:`timed_window` result (``clock_event_reasons`` only with ``reasons=True``).
WINDOW_COLUMNS = ["n_calls", "ms_median", "ms_mean", "ms_p10", "ms_p90", "window_s", "sm_clock_mhz", "power_w",
                  "temp_c", "n_samples", "clock_event_reasons"]


def call_ms(fn: Callable[[], object], device: str = "cuda", flush=None) -> float:
    """One call of ``fn`` (ms): CUDA events on ``cuda`` (``flush``, a tensor, zeroed first to evict L2), wall clock
    otherwise."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    import torch

    if flush is not None:
        flush.zero_()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def median_ms(fn: Callable[[], object], device: str = "cuda", warmup: int = 25, rep: int = 100, n_cpu: int = 3,
              graph: bool = False) -> float:
    """Median ms of ``fn``: do_bench (``warmup`` / ``rep``: its budgets, ms; ``graph``: the CUDA-graph replay) on
    ``cuda``, else ``n_cpu`` wall-clock calls after one warm-up call."""
    if device != "cuda":
        fn()
        return statistics.median(call_ms(fn, "cpu") for _ in range(n_cpu))
    from triton.testing import do_bench

    return float(do_bench(graphed(fn) if graph else fn, warmup=warmup, rep=rep, return_mode="median"))


def graphed(fn: Callable[[], object], inner: int = 1) -> Callable[[], None]:
    """Capture ``inner`` back-to-back calls of ``fn`` in one CUDA graph after two warm-up calls on a side stream;
    returns the replay callable (its bound graph stays alive with it)."""
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
    return g.replay


def interleaved(fns: dict, repeats: int = 7, device: str = "cuda", inner: int = 1) -> dict:
    """``{name: [ms, ...]}``: each callable of ``fns`` (``{name: callable}``) timed once per round (:func:`call_ms`,
    L2 flushed on CUDA), ``repeats`` rounds after one warm-up call each, the order rotated every round; a sample is
    the mean of ``inner`` back-to-back calls (for calls much shorter than the event resolution)."""
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
            def many(f=fns[n]):
                for _ in range(inner):
                    f()
            out[n].append(call_ms(many, device, flush) / inner)
    return out


def summarize(samples: Sequence[float]) -> dict:
    """``{"median", "q1", "q3", "iqr", "ci_lo", "ci_hi", "n"}`` of samples (ms). The 95 % interval of the median is
    distribution-free: the order statistics ``n/2 -+ 1.96 sqrt(n)/2`` (clamped to the sample range).

    Raises:
        ValueError: no samples.
    """
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        raise ValueError("samples=[] must hold at least one value")
    q1, _, q3 = statistics.quantiles(xs, n=4) if n >= 2 else (xs[0],) * 3
    half = 1.96 * math.sqrt(n) / 2
    lo = xs[max(0, int(math.floor(n / 2 - half)))]
    hi = xs[min(n - 1, int(math.ceil(n / 2 + half)) - 1)] if n > 1 else xs[0]
    return {"median": statistics.median(xs), "q1": q1, "q3": q3, "iqr": q3 - q1, "ci_lo": lo, "ci_hi": hi, "n": n}


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, linear interpolation between order statistics (numpy's default).

    Raises:
        ValueError: ``xs`` is empty.
    """
    import numpy as np

    if len(xs) == 0:
        raise ValueError("xs=[] must hold at least one value")
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def est_ms(fn: Callable[[], object], device: str = "cuda", k: int = 3) -> float:
    """Mean ms of ``k`` back-to-back calls of ``fn`` (one :func:`call_ms` around all ``k``) after one warm-up call:
    a rough figure to size a :func:`timed_window`, not a measurement to report."""
    fn()
    if device == "cuda":
        import torch

        torch.cuda.synchronize()

    def calls():
        for _ in range(k):
            fn()
    return call_ms(calls, device) / k


def _event_times(fn, n: int, after) -> tuple[float, float, list[float]]:
    """``n`` calls back to back, each between two CUDA events, all read after one synchronize at the end: the
    window's wall-clock start and end (s) and the per-call ms."""
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
    return t0, t1, [start.elapsed_time(end) for start, end in events]


def timed_window(fn: Callable[[], object], n: int, device: str = "cuda", sampler=None,
                 after: Callable[[], object] | None = None, per: int = 1, reasons: bool = True) -> dict:
    """``n`` calls of ``fn``, each timed on its own (CUDA: events read after one synchronize at the end, so the calls
    run back to back; CPU: wall clock, a dry run). ``sampler``: an :class:`mla_lab.measure.sink.NvmlSampler` or None;
    ``after``: run untimed after each call; ``per``: ``fn`` runs the op ``per`` times (times divided by it);
    ``reasons``: add the most frequent NVML clock-event bitmask (hex).

    Returns:
        :data:`WINDOW_COLUMNS`: ms per call (median, mean, p10, p90), ``window_s`` (wall s) and the sampler's
        medians (empty strings and ``n_samples`` 0 without a working sampler).

    Raises:
        ValueError: ``n`` or ``per`` below 1.
    """
    if not isinstance(n, int) or n < 1 or not isinstance(per, int) or per < 1:
        raise ValueError(f"n={n!r}, per={per!r}: both must be ints >= 1")
    if device == "cuda":
        t0, t1, ts = _event_times(fn, n, after)
    else:
        t0, ts = time.perf_counter(), []
        for _ in range(n):
            ts.append(call_ms(fn, "cpu"))
            if after is not None:
                after()
        t1 = time.perf_counter()
    ts = [t / per for t in ts]
    out = {"n_calls": n, "ms_median": statistics.median(ts), "ms_mean": statistics.fmean(ts),
           "ms_p10": quantile(ts, 0.1), "ms_p90": quantile(ts, 0.9), "window_s": round(t1 - t0, 4)}
    if sampler is not None and getattr(sampler, "ok", False):
        out.update(sampler.window(t0, t1, reasons=reasons))
    else:
        out.update({"sm_clock_mhz": "", "power_w": "", "temp_c": "", "n_samples": 0})
        if reasons:
            out["clock_event_reasons"] = ""
    return out
