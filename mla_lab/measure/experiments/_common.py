"""What several experiments share: the rank's step shapes, one call's wall and GPU time, the
stale fill drawn on the GPU, the attention path timed at the two seed shapes. Times in ms.

The seed step is vLLM PR #53878's benchmark step: ``max_num_batched_tokens`` 16384 = 16 prompts of 1024 tokens
(``vllm bench serve --random-input-len 1024``), GLM-5 at TP 8 (:meth:`mla_lab.deployment.Deployment.seed`).
"""

from __future__ import annotations

import statistics
import time

import mla_lab.strategies as _strategies
from mla_lab.deployment import Deployment
from mla_lab.measure.attention import time_attention_path
from mla_lab.measure.sink import log
from mla_lab.workload import Step

#: The prompt length of the seed step (``vllm bench serve --random-input-len 1024``).
PROMPT = 1024


def seed_step(rank, prompt_len: int = PROMPT) -> Step:
    """``max_num_batched_tokens // prompt_len`` causal prompts of ``prompt_len`` tokens in one step."""
    return Step([(j, 0, prompt_len) for j in range(rank.max_num_batched_tokens // prompt_len)])


def seed_shapes(rank) -> tuple:
    """``(shape, step, prompt_len, full_topk)`` of ``seed`` (:func:`seed_step`) and ``full`` (one prompt of the
    step's tokens, every token topk random keys over twice as many)."""
    T = rank.max_num_batched_tokens
    return ("seed", seed_step(rank), PROMPT, False), ("full", Step([(0, 0, T)]), 2 * T, True)


def wall_and_gpu(fn) -> tuple[float, float]:
    """(host wall ms until the GPU finished, CUDA-event ms) of one call of ``fn``."""
    import torch

    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    fn()
    b.record()
    b.synchronize()
    return (time.perf_counter() - t0) * 1e3, a.elapsed_time(b)


def first_calls(fn, steady_n: int) -> tuple[list, list, float, float]:
    """(calls 1-3, then ``steady_n`` steady calls, as (wall, gpu) ms each; the steady median wall and gpu ms)."""
    firsts = [wall_and_gpu(fn) for _ in range(3)]
    steady = [wall_and_gpu(fn) for _ in range(steady_n)]
    return firsts, steady, statistics.median(w for w, _ in steady), statistics.median(g for _, g in steady)


def attention_rows(rank, sink, file: str, names, reps: int, backends: bool = False) -> None:
    """:func:`mla_lab.measure.attention.time_attention_path` of strategies ``names`` at :func:`seed_shapes`, ``reps``
    interleaved rounds: one row per round into ``file`` (with ``backends``: the kernel and concat backends)."""
    for shape, step, plen, full in seed_shapes(rank):
        res = time_attention_path(rank, step, plen, strategies=names, full_topk=full, seed=0, repeats=reps)
        more = {k: res[k] for k in ("kernel_backend", "concat_backend")} if backends else {}
        for name in names:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write(file, {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                  "median_ms": round(r["total"], 5), "workspace_bytes": r["workspace_bytes"],
                                  "peak_bytes": r["peak_bytes"], "repeats": reps, **more})
        log(f"{file.removesuffix('.csv')} {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in names))
        if backends:
            import torch

            torch.cuda.empty_cache()


def stale_fill_on_gpu() -> None:
    """The lab's stale stand-in (N(0, 1), seeded) drawn on the tensor's device instead of on the CPU
    (:func:`mla_lab.strategies.stale_fill`): the same distribution, seconds less per [16384, 56, 576] fill."""
    import torch

    def fill(t, seed: int = 1234):
        g = torch.Generator(device=t.device).manual_seed(seed)
        t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32).to(t.dtype))
        return t

    _strategies.stale_fill = fill


def ranks_of(rank, models, tp: int | None = None) -> list:
    """The rank with each of ``models`` (names) in its place: same TP (or ``tp``), GPU and step tokens. Raises
    ValueError as :meth:`mla_lab.deployment.Deployment.seed`."""
    return [Deployment.seed(model=m, tp=tp or rank.tp, arch=rank.arch.name,
                            max_num_batched_tokens=rank.max_num_batched_tokens).rank for m in models]
