"""What the first requests of a bench run pay that the steady state does not (issue 37), where no vLLM is needed:
calls 1-3 (host wall, CUDA-event ms) against the steady median of

- ``triton_jit:concat_mla_q``: the lab's Triton concat (:func:`mla_lab.kernels.concat_mla_q`) first at the
  ready-check shape (one 1024-token prompt: vllm bench serve's test request), then at shapes the process has not
  seen: the step, one token fewer (not divisible by 16: a new compiled variant) and twice the step; ``triton_cache``
  ``cold`` (a fresh empty ``TRITON_CACHE_DIR``: compile from source) or ``warm`` (the default cache);
- ``alloc_growth:workspace+moe_block``: from an empty caching allocator to the step's peak (the query workspace
  fill plus one layer's routed experts, :func:`mla_lab.measure.tp_blocks.moe_forward`), reserved MiB before and after.

Rows: ``first_token.csv``. Parameters ``steady`` (20), ``triton_cache`` (``cold``). Not measurable here: DeepGEMM
JIT, CUDA-graph capture, the API server (``docs/serving.md``, "The first token, explained").
"""

from __future__ import annotations

import os
import tempfile

import torch

from mla_lab.kernels import concat_mla_q
from mla_lab.measure.sink import log
from mla_lab.measure.tp_blocks import make_moe_inputs, moe_forward

from ._common import PROMPT, first_calls

OUTPUTS = {"first_token.csv": ["what", "T", "call", "wall_ms", "gpu_ms", "steady_wall_ms", "steady_gpu_ms",
                               "steady_n", "triton_cache", "reserved_before_mib", "reserved_after_mib"]}
#: (what, T) at the seed: the ready-check shape first, then shapes the process has not seen (module docstring).
SHAPES = [("triton_jit:concat_mla_q", t) for t in (PROMPT, 16384, 16383, 32768)] + [
    ("alloc_growth:workspace+moe_block", 16384)]
D_NOPE, D_ROPE = 512, 64


def _jit_shapes(rank) -> tuple[int, ...]:
    T = rank.max_num_batched_tokens
    return PROMPT, T, T - 1, 2 * T


def plan(rank, options) -> list[dict]:
    """What one process measures, in order (the dry run prints it)."""
    cache = options.param("triton_cache", "cold")
    return [{"what": "triton_jit:concat_mla_q", "T": t, "calls": 3, "steady": True, "triton_cache": cache}
            for t in _jit_shapes(rank)] + [{"what": "alloc_growth:workspace+moe_block",
                                            "T": rank.max_num_batched_tokens, "calls": 3, "steady": True,
                                            "triton_cache": ""}]


def _measure(sink, what, T, fn, steady_n, cache="", before=None):
    firsts, _, med_w, med_g = first_calls(fn, steady_n)
    after = None if before is None else torch.cuda.memory_reserved()
    for i, (w, g) in enumerate(firsts, 1):
        sink.write("first_token.csv", {
            "what": what, "T": T, "call": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4),
            "steady_wall_ms": round(med_w, 4), "steady_gpu_ms": round(med_g, 4), "steady_n": steady_n,
            "triton_cache": cache, "reserved_before_mib": "" if before is None else round(before / 2**20, 1),
            "reserved_after_mib": "" if after is None else round(after / 2**20, 1)})
    log(f"{what} T {T}: call1 wall {firsts[0][0]:.1f} ms | call2 {firsts[1][0]:.2f} | steady wall {med_w:.3f} ms")


def _alloc_growth(rank, sink, steady_n: int) -> None:
    T = rank.max_num_batched_tokens
    moe = make_moe_inputs(rank, 0, T, seed=0, device="cuda")

    def step():
        ws = torch.empty(T, rank.padded_num_heads, D_NOPE + D_ROPE, device="cuda", dtype=torch.bfloat16)
        ws.zero_()
        moe_forward(moe, parts="compute", impl="grouped_mm")

    moe_forward(moe, parts="compute", impl="grouped_mm")  # compile/load outside the measured growth
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    _measure(sink, "alloc_growth:workspace+moe_block", T, step, steady_n, before=torch.cuda.memory_reserved())


def run(rank, sink, options) -> None:
    steady_n, cache = options.param("steady", 5 if options.smoke else 20), options.param("triton_cache", "cold")
    if cache not in ("cold", "warm"):
        raise ValueError(f"--param triton_cache={cache!r}; allowed: cold, warm")
    if cache == "cold":  # before the kernels' first compile (Triton reads it when it compiles)
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="mla_lab_triton_cold_")
    H, Hp = rank.num_heads, rank.padded_num_heads
    for T in _jit_shapes(rank):
        ql = torch.randn(T, H, D_NOPE, device="cuda", dtype=torch.bfloat16)
        pe = torch.randn(T, H, D_ROPE, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(T, Hp, D_NOPE + D_ROPE, device="cuda", dtype=torch.bfloat16)
        _measure(sink, "triton_jit:concat_mla_q", T, lambda: concat_mla_q(ql, pe, out, backend="triton"),  # noqa: B023
                 steady_n, cache)
    _alloc_growth(rank, sink, steady_n)
