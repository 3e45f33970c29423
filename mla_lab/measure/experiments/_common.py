"""What the between-process experiments share: the seed shape, the row sink, the fresh-process entry point.

Every between-process experiment (``cold_start``, ``presets``, ``subgraph``, ``routes_step``, ``moe_decode``,
``concat_ceiling``, ``attention_strategies``, ``content_step``) is run by ``mla-lab measure`` once per fresh Python
process (a fresh CUDA context, caching allocator, Triton in-memory cache, FlashMLA module load) with ``--process k``;
every row carries ``process`` so the between-process spread is computed from the CSVs
(:mod:`mla_lab.measure.spread`), and the provenance columns :data:`PROVENANCE` (:func:`mla_lab.provenance.provenance`).
Times in ms unless a column says ``us``.

The seed shape is vLLM PR #53878's benchmark step: ``max_num_batched_tokens`` 16384 = 16 prompts of 1024 tokens
(``vllm bench serve --random-input-len 1024``) in one prefill step, GLM-5 at TP 8 (8 heads per rank, padded to 64).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import mla_lab.strategies as _strategies
from mla_lab.placement import TIMED_STRATEGIES
from mla_lab.provenance import provenance
from mla_lab.workload import Step

#: The seed step's tokens (``max_num_batched_tokens`` of PR #53878's run) and prompt length.
SEED_T = 16384
PROMPT = 1024
#: The provenance columns every measured row carries (:func:`mla_lab.provenance.provenance`).
PROVENANCE = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp")


class Sink:
    """Rows appended to ``out/name`` as they are measured (a kill keeps what was measured); each row gets
    ``process`` first and the provenance ``prov`` last."""

    def __init__(self, out: Path, prov: dict, process: int):
        self.out, self.prov, self.process = out, prov, process
        self.files: dict = {}

    def write(self, name: str, row: dict) -> None:
        row = {"process": self.process, **row, **self.prov}
        path = self.out / name
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new:
                w.writeheader()
            w.writerow(row)


def log(*a):
    print(f"[measure {time.strftime('%H:%M:%S')}]", *a, flush=True)


def seed_step(prompt_len: int = PROMPT, T: int = SEED_T) -> Step:
    """``T // prompt_len`` causal prompts of ``prompt_len`` tokens in one step."""
    return Step([(j, 0, prompt_len) for j in range(T // prompt_len)])


def full_step(T: int = SEED_T) -> Step:
    """One prompt of ``T`` tokens (the full-topk shape: every token sees topk 2048 keys)."""
    return Step([(0, 0, T)])


def sm_scale_of(model) -> float:
    """The softmax scale ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` of the model's attention."""
    return 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)


def wall_and_gpu(fn):
    """(host wall ms until the GPU finished, CUDA-event ms) of one call."""
    import torch

    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    fn()
    b.record()
    b.synchronize()
    return (time.perf_counter() - t0) * 1e3, a.elapsed_time(b)


def stale_fill_on_gpu() -> None:
    """The lab's stale stand-in (N(0, 1), seeded) drawn on the tensor's device instead of on the CPU: the same
    distribution, seconds less per [16384, 56, 576] fill (mla_lab.strategies.stale_fill draws on the CPU)."""
    import torch

    def fill(t, seed: int = 1234):
        g = torch.Generator(device=t.device).manual_seed(seed)
        t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32).to(t.dtype))
        return t

    _strategies.stale_fill = fill


def part_main(run, doc: str, argv=None) -> int:
    """The command line of one between-process experiment: ``--out DIR --process K [--repeats N] [--smoke]
    [--content-rounds N] [--strategies a,b]``; rows appended to ``DIR/<file>.csv``. Exit 2 (one line on stderr)
    without CUDA or on a bad argument; 1 when the part raised (the rows measured before stay)."""
    import torch

    ap = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the CSVs (rows appended)")
    ap.add_argument("--process", type=int, default=1, help="index of this fresh process (1..N)")
    ap.add_argument("--repeats", type=int, default=11, help="interleaved rounds per measured set")
    ap.add_argument("--content-rounds", type=int, default=6)
    ap.add_argument("--smoke", action="store_true", help="tiny repeats, for the first call of a session")
    ap.add_argument("--strategies", default=",".join(TIMED_STRATEGIES),
                    help="attention_strategies: canonical names timed through mla_lab.measure.attention")
    a = ap.parse_args(argv)
    if a.process < 1 or a.repeats < 1 or a.content_rounds < 1:
        print(f"--process / --repeats / --content-rounds: {a.process} / {a.repeats} / {a.content_rounds}; "
              "each must be >= 1", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("this experiment needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    a.reps = 3 if a.smoke else a.repeats
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stale_fill_on_gpu()
    sink = Sink(out, provenance("measured"), a.process)
    t0 = time.perf_counter()
    try:
        run(sink, a)
    except Exception as e:  # noqa: BLE001 - say what failed; the rows measured before it stay
        import traceback

        traceback.print_exc()
        log(f"FAILED: {type(e).__name__}: {e}")
        return 1
    log(f"done in {time.perf_counter() - t0:.1f} s (process {a.process})")
    return 0
