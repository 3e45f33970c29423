"""Sub-chunking without the per-chunk cost (issue 23): per S the chunk loop eager (``views``), captured in one CUDA
graph (``graph``), over two streams and two S-row workspaces (``2stream``), beside the PR's private workspace eager and
graphed; seed and full-topk shapes, interleaved rounds. Rows: ``subgraph.csv`` (ms; ``mla_lab.fits subchunk_graph``)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import statistics

import torch

from mla_lab.kernels import concat_mla_q, sparse_mla_prefill
from mla_lab.measure.attention import make_step_inputs, padded_path, sm_scale
from mla_lab.measure.sink import log
from mla_lab.measure.timer import graphed, interleaved

from ._common import seed_shapes

OUTPUTS = {"subgraph.csv": ["shape", "variant", "round", "ms", "median_ms", "workspace_bytes", "repeats"]}
VARIANTS = ["pr:eager", "pr:graph"] + [f"subchunk:{S}:{k}" for S in (2048, 4096)
                                      for k in ("views", "graph", "2stream", "2stream_graph")]
#: (shape, T, variant)
SHAPES = [(s, 16384, v) for s in ("seed", "full") for v in VARIANTS]


class ChunkLoop:
    """The sub-chunked attention path on ``n_ws`` zeroed workspaces of ``S`` rows, chunk i on stream i % n_ws (one:
    the current stream); the chunks' outputs dropped (views hand-off, as ``time_attention_path``)."""

    def __init__(self, H, Hp, S, n_ws, T):
        self.H, self.S, self.T = H, S, T
        self.ws = [torch.zeros(S, Hp, 576, dtype=torch.bfloat16, device="cuda") for _ in range(n_ws)]
        self.streams = [] if n_ws == 1 else [torch.cuda.Stream() for _ in range(n_ws)]
        self.bounds = [(s, min(s + S, T)) for s in range(0, T, S)]

    def _chunk(self, i, a, b, ql, qpe, kv, idx, sm, tl):
        q = self.ws[i % len(self.ws)][: b - a]
        concat_mla_q(ql[a:b], qpe[a:b], q)
        sparse_mla_prefill(q, kv, idx[a:b], sm, topk_length=None if tl is None else tl[a:b], actual_num_heads=self.H)

    def __call__(self, ql, qpe, kv, idx, sm, tl):
        if not self.streams:
            for i, (a, b) in enumerate(self.bounds):
                self._chunk(i, a, b, ql, qpe, kv, idx, sm, tl)
            return
        main = torch.cuda.current_stream()
        for s in self.streams:
            s.wait_stream(main)
        for i, (a, b) in enumerate(self.bounds):
            with torch.cuda.stream(self.streams[i % len(self.streams)]):
                self._chunk(i, a, b, ql, qpe, kv, idx, sm, tl)
        for s in self.streams:
            main.wait_stream(s)


def _calls(rank, inputs, sizes) -> dict:
    """Variant name -> the call (eager or its graph replay) on ``inputs``."""
    ql, qpe, kv, idx, tl = inputs
    H, Hp, T, sm = rank.num_heads, rank.padded_num_heads, rank.max_num_batched_tokens, sm_scale(rank.model)
    pr = padded_path(rank, "private_workspace")
    fns = {"pr:eager": lambda: pr(ql, qpe, kv, idx, sm, tl), "pr:graph": graphed(lambda: pr(ql, qpe, kv, idx, sm, tl))}
    for S in sizes:
        one, two = ChunkLoop(H, Hp, S, 1, T), ChunkLoop(H, Hp, S, 2, T)
        fns[f"subchunk:{S}:views"] = lambda one=one: one(ql, qpe, kv, idx, sm, tl)
        fns[f"subchunk:{S}:graph"] = graphed(lambda one=one: one(ql, qpe, kv, idx, sm, tl))
        fns[f"subchunk:{S}:2stream"] = lambda two=two: two(ql, qpe, kv, idx, sm, tl)
        fns[f"subchunk:{S}:2stream_graph"] = graphed(lambda two=two: two(ql, qpe, kv, idx, sm, tl))
    return fns


def run(rank, sink, options) -> None:
    T, Hp = rank.max_num_batched_tokens, rank.padded_num_heads
    sizes = (512, 1024) if options.smoke else (2048, 4096)
    for shape, step, plen, full in seed_shapes(rank):
        inputs = make_step_inputs(rank, step, plen, seed=0, full_topk=full)
        samples = interleaved(_calls(rank, inputs, sizes), repeats=options.reps, device="cuda")
        for name, xs in samples.items():
            rows = T if name.startswith("pr") else (2 if "2stream" in name else 1) * int(name.split(":")[1])
            for i, ms in enumerate(xs):
                sink.write("subgraph.csv", {"shape": shape, "variant": name, "round": i, "ms": round(ms, 5),
                                            "median_ms": round(statistics.median(xs), 5),
                                            "workspace_bytes": rows * Hp * 576 * 2, "repeats": options.reps})
        log(f"subgraph {shape}: " + ", ".join(f"{n} {statistics.median(x):.3f}" for n, x in samples.items()))
        torch.cuda.empty_cache()
