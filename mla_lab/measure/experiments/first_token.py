"""What the first requests of a bench run pay that the steady state does not (issue 37, "the first token"), for the
parts the H200 can measure without vLLM:

- **cold Triton JIT at a new shape**: the lab's Triton ``concat_mla_q`` kernel (:func:`mla_lab.kernels.concat_mla_q`,
  ``backend="triton"``) called first at the ready-check shape (one 1024-token prompt: vllm bench serve's initial
  test request), then at shapes the process has not seen: the seed step (16384 tokens), a token count Triton
  specialises differently (16383: not divisible by 16, so a new compiled variant) and a larger step (32768). Each
  shape: calls 1-3 (host wall and CUDA-event time) and the steady median. ``triton_cache`` says whether the on-disk
  cache was a fresh empty folder (``cold``: compile from source, what a new kernel version costs) or the default
  one (``warm``: the in-memory cache of a fresh process is empty, the disk cache may hold the binary);
- **allocator growth**: from an empty caching allocator (``torch.cuda.empty_cache()``) to the step's peak: the
  first call of the seed step's query workspace fill plus one layer's routed-expert block (GLM-5 TP-8 rank share,
  :func:`mla_lab.measure.tp.moe_forward`), with the reserved bytes before and after, against the same calls once
  the allocator holds the blocks.

Rows: ``first_token.csv`` (ms; MiB for the reserved columns). ``--dry-run`` prints the plan (no CUDA needed: the
CPU check of this module); without ``--dry-run`` it needs a CUDA GPU (exit 2 otherwise, one line). The lead decides
whether to run it on the GPU (``mla-lab measure --experiments first_token``).

Not measurable here (no vLLM): DeepGEMM JIT of the engine's indexer kernels, CUDA-graph capture and replay misses,
the API server and tokenizer; ``docs/serving.md`` ("The first token, explained") cites public figures for them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from mla_lab.kernels import concat_mla_q
from mla_lab.measure.tp import make_moe_inputs, moe_forward
from mla_lab.models import load_model
from mla_lab.provenance import provenance

from ._common import PROMPT, PROVENANCE, SEED_T, Sink, log, wall_and_gpu  # noqa: F401 (PROVENANCE: its rows' columns)

OUTPUTS = {"first_token.csv": ["what", "T", "call", "wall_ms", "gpu_ms", "steady_wall_ms", "steady_gpu_ms",
                               "steady_n", "triton_cache", "reserved_before_mib", "reserved_after_mib"]}
#: (what, T): the ready-check shape first, then shapes the process has not seen (module docstring).
JIT_SHAPES = (PROMPT, SEED_T, SEED_T - 1, 2 * SEED_T)
SHAPES = [("triton_jit:concat_mla_q", t) for t in JIT_SHAPES] + [("alloc_growth:workspace+moe_block", SEED_T)]
#: GLM-5 at TP 8: 8 real heads per rank, the workspace padded to 64 (vLLM PR #53878's benchmark; _common).
HEADS, PADDED_HEADS, D_NOPE, D_ROPE = 8, 64, 512, 64


def plan(triton_cache: str) -> list[dict]:
    """What one process measures, in order (the dry run prints it)."""
    return [{"what": w, "T": t, "calls": 3, "steady": True, "triton_cache": triton_cache if "jit" in w else ""}
            for w, t in SHAPES]


def _time_calls(fn, steady_n: int):
    firsts = [wall_and_gpu(fn) for _ in range(3)]
    steady = [wall_and_gpu(fn) for _ in range(steady_n)]
    return firsts, statistics.median(w for w, _ in steady), statistics.median(g for _, g in steady)


def _rows(sink, what, T, firsts, med_w, med_g, steady_n, cache, before=None, after=None):
    for i, (w, g) in enumerate(firsts, 1):
        sink.write("first_token.csv", {
            "what": what, "T": T, "call": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4),
            "steady_wall_ms": round(med_w, 4), "steady_gpu_ms": round(med_g, 4), "steady_n": steady_n,
            "triton_cache": cache, "reserved_before_mib": "" if before is None else round(before / 2**20, 1),
            "reserved_after_mib": "" if after is None else round(after / 2**20, 1)})
    log(f"{what} T {T}: call1 wall {firsts[0][0]:.1f} ms | call2 {firsts[1][0]:.2f} | steady wall {med_w:.3f} ms")


def part_jit(sink, steady_n: int, cache: str) -> None:
    for T in JIT_SHAPES:
        ql = torch.randn(T, HEADS, D_NOPE, device="cuda", dtype=torch.bfloat16)
        pe = torch.randn(T, HEADS, D_ROPE, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(T, PADDED_HEADS, D_NOPE + D_ROPE, device="cuda", dtype=torch.bfloat16)
        firsts, mw, mg = _time_calls(lambda: concat_mla_q(ql, pe, out, backend="triton"), steady_n)  # noqa: B023
        _rows(sink, "triton_jit:concat_mla_q", T, firsts, mw, mg, steady_n, cache)


def part_alloc(sink, steady_n: int) -> None:
    m = load_model("glm-5")
    moe = make_moe_inputs(m, 8, 0, SEED_T, seed=0, device="cuda")

    def step():
        ws = torch.empty(SEED_T, PADDED_HEADS, D_NOPE + D_ROPE, device="cuda", dtype=torch.bfloat16)
        ws.zero_()
        moe_forward(moe, parts="compute", impl="grouped_mm")

    moe_forward(moe, parts="compute", impl="grouped_mm")  # compile/load outside the measured growth
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    firsts, mw, mg = _time_calls(step, steady_n)
    _rows(sink, "alloc_growth:workspace+moe_block", SEED_T, firsts, mw, mg, steady_n, "", before,
          torch.cuda.memory_reserved())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for first_token.csv (rows appended); needed unless --dry-run")
    ap.add_argument("--process", type=int, default=1)
    ap.add_argument("--steady", type=int, default=20, help="steady calls per shape (median)")
    ap.add_argument("--triton-cache", choices=("cold", "warm"), default="cold",
                    help="cold: a fresh empty TRITON_CACHE_DIR (compile from source); warm: the default cache")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no CUDA needed)")
    a = ap.parse_args(argv)
    if a.process < 1 or a.steady < 1:
        print(f"--process / --steady: {a.process} / {a.steady}; each must be >= 1", file=sys.stderr)
        return 2
    if a.dry_run:
        print(json.dumps({"experiment": "first_token", "outputs": OUTPUTS, "plan": plan(a.triton_cache)}, indent=1))
        return 0
    if a.out is None:
        print("--out is required (a folder for first_token.csv) unless --dry-run", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("this experiment needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run prints the plan",
              file=sys.stderr)
        return 2
    if a.triton_cache == "cold":  # before the kernels' first compile (Triton reads it when it compiles)
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="mla_lab_triton_cold_")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sink = Sink(out, provenance("measured"), a.process)
    part_jit(sink, a.steady, a.triton_cache)
    part_alloc(sink, a.steady)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
