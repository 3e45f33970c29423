"""The round-2 experiments' attention pieces: index patterns and the engine presets' paths (:class:`Presets`,
labels :data:`mla_lab.placement.BENCH_PRESET_LABELS`). head_size 576 = 512 + 64, d_v 512."""

from __future__ import annotations

import contextlib

import torch

from mla_lab.kernels.device import Kernels
from mla_lab.measure.attention import padded_path
from mla_lab.placement import BENCH_PRESET_LABELS, parse_strategy

D_NOPE, D_QK, D_V = 512, 576, 512

PRESET_DOC = {
    "per_call_empty_zeros": "concat into [T,H,576]; q.new_empty((T,64,576)) + copy of the real heads; the cached "
                            "block held zeros (allocated zeroed and freed before the window) - pre-PR vLLM, block "
                            "only ever used for this pad",
    "per_call_empty_stale": "as per_call_empty_zeros but the cached block held N(0,1) (a same-size tensor filled "
                            "and freed before the window) - pre-PR vLLM with the block reused by other tensors",
    "per_call_zeros": "concat into [T,H,576]; q.new_zeros((T,64,576)) + copy (SGLang)",
    "private_workspace_zeros": "zeroed (T,64,576) workspace; concat writes the real heads (zero_padding=False) - "
                               "PR #53878 with a private workspace",
    "shared_workspace_stale": "workspace whose padded heads hold N(0,1) (fused-MoE scratch), zero_padding=False - "
                              "PR #53878 after vLLM #56902",
    "shared_workspace_zero_per_call": "stale workspace, concat with zero_padding=True every call",
    "subchunk": "zeroed (S,64,576) workspace; per chunk of S tokens: concat into ws[:n], kernel, copy out[:, :H] "
                "into the step's [T,H,512] output (allocated per call) - mla_lab.strategies subchunk:S",
    "subchunk_views": "as subchunk, per-chunk out[:, :H] views handed to the consumer (no copy; the views keep "
                      "every chunk's padded output alive until the call returns) - subchunk:S:views",
    "subchunk_2stream": "as subchunk with two (S,64,576) workspaces: chunk i+1's concat on a second stream while "
                        "chunk i's kernel runs",
}


def causal_indices(T, L, topk, dev):
    """T / L prompts of L tokens; position p reads the last min(p + 1, topk) keys of its prompt (kv row = token).
    Returns (indices [T, 1, topk] int32, -1 past topk_length; topk_length [T] int32; their sum)."""
    g = torch.arange(T, device=dev)
    start = (g // L) * L
    tl = torch.clamp(g - start + 1, max=topk)
    ar = torch.arange(topk, device=dev)
    idx = (g + 1 - tl)[:, None] + ar[None, :]
    idx = torch.where(ar[None, :] < tl[:, None], idx, torch.full_like(idx, -1))
    return idx.to(torch.int32).view(T, 1, topk).contiguous(), tl.to(torch.int32).contiguous(), int(tl.sum())


def make_pattern(pattern, T, dev, gen, topk, s_kv_full=32768):
    """``causal_<L>`` (:func:`causal_indices`, s_kv = T) or ``full_<k>`` (topk random keys of ``s_kv_full``) ->
    (s_kv, indices, topk_length or None, sum of topk, prompt length)."""
    if pattern.startswith("causal_"):
        L = min(int(pattern.split("_")[1]), T)
        idx, tl, st = causal_indices(T, L, topk, dev)
        return T, idx, tl, st, L
    idx = torch.randint(0, s_kv_full, (T, 1, topk), device=dev, dtype=torch.int32, generator=gen)
    return s_kv_full, idx, None, T * topk, 0


def content_of(label, strategy):
    """The padded heads' content of a preset row: the prepped block's (``per_call_empty_*``), else the strategy's."""
    if label in ("per_call_empty_zeros", "per_call_empty_stale"):
        return label.rsplit("_", 1)[1]
    return strategy.content if strategy is not None else "zeros"


def as_tensor(res):
    return torch.cat(res, 0) if isinstance(res, list) else res


class Presets:
    """One layer call's attention path per preset on ``rank``, T tokens of ``pattern`` (the label's strategy through
    :func:`mla_lab.measure.attention.padded_path`, or ``subchunk_2stream``). :meth:`build`: ``(fn, prep,
    persistent_bytes, S, n_chunks, strategy)``; ``fn(check)`` returns the real heads' output (``check["pad_absmax"]``:
    the largest |value| in the first kernel q's padded heads). ``prep`` before each window: ``per_call_empty_*``
    frees a block of zeros or N(0, 1) (pre-PR #53878's ``new_empty`` pad); the shared workspace scribbled N(0, 1)."""

    def __init__(self, rank, dev, dtype, T, pattern, gen, topk, skv_full):
        self.rank, self.dev, self.dtype, self.H, self.Hp, self.T, self.gen = (
            rank, dev, dtype, rank.num_heads, rank.padded_num_heads, T, gen)
        self.k = Kernels(dev)
        self.s_kv, self.idx, self.tl, self.sum_topk, _ = make_pattern(pattern, T, dev, gen, topk, skv_full)
        self.kv = torch.randn(self.s_kv, 1, D_QK, device=dev, dtype=dtype, generator=gen)
        self.qn = torch.randn(T, self.H, D_NOPE, device=dev, dtype=dtype, generator=gen)
        self.qp = torch.randn(T, self.H, D_QK - D_NOPE, device=dev, dtype=dtype, generator=gen)
        self.out_full = torch.empty(T, self.H, D_V, device=dev, dtype=dtype)

    def build(self, name, S=None):
        """The call of preset ``name`` (:data:`PRESET_DOC`; ``subchunk*``: ``S`` rows). Raises ValueError: unknown."""
        if name == "subchunk_2stream":
            return self._two_stream(S)
        if name in ("subchunk", "subchunk_views"):
            strategy = parse_strategy(f"subchunk:{S}" + (":views" if name == "subchunk_views" else ""))
        elif name in BENCH_PRESET_LABELS:
            strategy = parse_strategy(BENCH_PRESET_LABELS[name])
        else:
            raise ValueError(f"preset={name!r}; allowed: {list(PRESET_DOC)}")
        path = self._path(strategy)
        n_chunks = -(-self.T // strategy.rows) if strategy.placement == "subchunk" else 1
        return self._call(path, strategy.handoff == "views"), self._prep(name, path, strategy), \
            path.workspace.nbytes, S, n_chunks, strategy

    def _path(self, strategy):
        empty = strategy.placement == "per_call_empty"
        path = padded_path(self.rank, parse_strategy("per_call_empty:stale") if empty else strategy, self.T,
                           self.dev, dtype=self.dtype, kernel_backend="auto", concat_backend="auto",
                           fill_stale=(lambda t: t) if empty else (lambda t: t.normal_(generator=self.gen)))
        if path.padded_heads != self.Hp:
            raise ValueError(f"H={self.H}: padded to {path.padded_heads} heads, the rank says {self.Hp}")
        return path

    def _call(self, path, views):
        kernel, H = path._kernel, self.H

        def fn(check=None):
            if check is not None:  # instrument the first kernel call: what its padded heads held
                def spy(q, *a):
                    if "pad_absmax" not in check:
                        check["pad_absmax"] = float(q[:, H:].float().abs().max()) if q[:, H:].numel() else 0.0
                    return kernel(q, *a)
                path._kernel = spy
            try:
                if views:
                    res = []
                    path(self.qn, self.qp, self.kv, self.idx, D_QK ** -0.5, self.tl,
                         consumer=lambda start, o, lse: res.append(o))
                    return res
                return path(self.qn, self.qp, self.kv, self.idx, D_QK ** -0.5, self.tl)[0]
            finally:
                path._kernel = kernel
        return fn

    def _prep(self, name, path, strategy):
        """What runs before each window (None: nothing)."""
        if name in ("per_call_empty_zeros", "per_call_empty_stale"):
            def prep():
                if self.dev == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                z = torch.empty(self.T, self.Hp, D_QK, device=self.dev, dtype=self.dtype)
                z.normal_(generator=self.gen) if name.endswith("stale") else z.zero_()
            return prep
        if strategy.concat_zeroes_padding:
            return lambda: path.workspace.buffer[:, self.H:].normal_(generator=self.gen)
        return None

    def _two_stream(self, S):
        ws = [torch.zeros(S, self.Hp, D_QK, device=self.dev, dtype=self.dtype) for _ in range(2)]
        chunks = [(lo, min(lo + S, self.T)) for lo in range(0, self.T, S)]
        streams = _Streams(len(chunks), self.dev == "cuda")

        def concat_chunk(i):
            lo, hi = chunks[i]
            with streams.concat(i):
                self.k.concat(self.qn[lo:hi], self.qp[lo:hi], ws[i % 2][:hi - lo])

        def fn(check=None):
            concat_chunk(0)
            for i, (lo, hi) in enumerate(chunks):
                q = ws[i % 2][:hi - lo]
                tl = None if self.tl is None else self.tl[lo:hi]
                o = streams.kernel(i, self.k.kernel, q, self.kv, self.idx[lo:hi], D_QK ** -0.5, tl)
                if check is not None and i == 0:
                    check["pad_absmax"] = float(q[:, self.H:].float().abs().max())
                if i + 1 < len(chunks):
                    concat_chunk(i + 1)
                self.out_full[lo:hi].copy_(o[:, :self.H])
            return self.out_full

        return fn, None, 2 * S * self.Hp * D_QK * 2 + self.T * self.H * D_V * 2, S, len(chunks), None


class _Streams:
    """``subchunk_2stream``: concat i on a side stream after kernel i - 2 read its workspace, kernel i after concat
    i; on CPU in program order."""

    def __init__(self, n, cuda):
        self.cuda = cuda
        if cuda:
            self.side = torch.cuda.Stream()
            self.done, self.read = ([torch.cuda.Event() for _ in range(n)] for _ in range(2))

    @contextlib.contextmanager
    def concat(self, i):
        if not self.cuda:
            yield
            return
        if i == 0:
            self.side.wait_stream(torch.cuda.current_stream())
        elif i >= 2:
            self.side.wait_event(self.read[i - 2])
        with torch.cuda.stream(self.side):
            yield
            self.done[i].record(self.side)

    def kernel(self, i, call, *args):
        if self.cuda:
            torch.cuda.current_stream().wait_event(self.done[i])
        out = call(*args)
        if self.cuda:
            self.read[i].record(torch.cuda.current_stream())
        return out
