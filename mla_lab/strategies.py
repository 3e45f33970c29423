"""Every real strategy (:mod:`mla_lab.placement`) on tensors, and the check that they all give the same output.

Every real strategy returns the real heads' ``[T, H, 512]`` bf16 output and ``[T, H]`` fp32 lse, bit-identical
across strategies (:func:`equivalence_check`). ``subchunk:<S>:graph2`` on CUDA captures its chunk loop in one CUDA
graph per inputs' key; on CPU the loop runs eagerly.
"""

from __future__ import annotations

import contextlib

import torch

from .buffers import QConcatWorkspace, padded_num_heads
from .kernels import concat_mla_q, sparse_mla_prefill
from .placement import Strategy, as_strategy, real_strategies, resolve_strategy

__all__ = ["PaddedQPath", "make_strategy", "stale_fill", "equivalence_check", "REAL_STRATEGIES", "real_strategies"]


#: The real strategies of the default equivalence check.
REAL_STRATEGIES = tuple(real_strategies())


def stale_fill(t: torch.Tensor, seed: int = 1234) -> torch.Tensor:
    """``t`` filled in place with seeded N(0, 1) values: the lab's stale data."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype))
    return t


class PaddedQPath:
    """The attention path of one strategy: Q concat, padding as the strategy does it, sparse kernel, real heads out.
    ``reuse_pad_block``: ``per_call_empty`` fills one pad block once (as the caching allocator hands it back);
    ``capture_graph``: ``subchunk:<S>:graph2`` on CUDA captures the chunk loop (default) or runs it eagerly.
    Raises ValueError: a strategy with no padded Q (modelled only); as the workspace."""

    def __init__(self, strategy: Strategy | str, num_heads: int, max_num_batched_tokens: int, arch="hopper",
                 kv_cache_dtype: str = "bf16", head_size: int = 576, device="cpu", dtype=None,
                 kernel_backend: str = "auto", concat_backend: str = "auto", fill_stale=None,
                 reuse_pad_block: bool = False, capture_graph: bool = True):
        self.spec = as_strategy(strategy)
        if not self.spec.padded:
            raise ValueError(f"strategy={self.spec.name!r} cannot be run on tensors; allowed: "
                             f"{list(REAL_STRATEGIES)} ('kernel_native' and 'fa3_sparse' are modelled only)")
        self.name = self.spec.name
        self.num_heads = num_heads
        self.max_num_batched_tokens = max_num_batched_tokens
        self.arch, self.kv_cache_dtype, self.head_size = arch, kv_cache_dtype, head_size
        self.kernel_backend, self.concat_backend = kernel_backend, concat_backend
        self.fill_stale = fill_stale or stale_fill
        rows = min(self.spec.rows, max_num_batched_tokens) if self.spec.placement == "subchunk" else \
            max_num_batched_tokens
        pads = (self.spec.pre_padded, True)[:self.spec.workspaces]  # graph2: a second S-row workspace (chunk i: i % 2)
        self.workspaces = [QConcatWorkspace(rows, num_heads, arch, kv_cache_dtype, head_size, device, dtype, pad=p,
                                            zero_init=True) for p in pads]
        self.workspace = self.workspaces[0]
        self.capture_graph = capture_graph
        self._streams = None  # graph2 on CUDA: the two side streams
        self._graph = None  # graph2 on CUDA: (key, CUDAGraph, static outputs) of the last capture
        if self.spec.placement == "shared_workspace" and self.padded_heads > num_heads:
            self.fill_stale(self.workspace.buffer[:, num_heads:])  # another user's scratch in the padded heads
        self._pad_block = None
        if reuse_pad_block and self.spec.placement == "per_call_empty" and self.padded_heads > num_heads:
            block = torch.empty((max_num_batched_tokens, self.padded_heads, head_size),
                                dtype=self.workspace.buffer.dtype, device=device)
            block.zero_() if self.spec.content == "zeros" else self.fill_stale(block)
            self._pad_block = block

    padded_heads = property(lambda self: padded_num_heads(self.num_heads, self.arch, self.kv_cache_dtype))

    def _check_heads(self, ql_nope, q_pe):
        for name, t in (("ql_nope", ql_nope), ("q_pe", q_pe)):
            if getattr(t, "dim", lambda: 0)() != 3 or t.shape[1] != self.num_heads:
                raise ValueError(f"{name}.shape={tuple(getattr(t, 'shape', ()))} must be [T, num_heads={self.num_heads}, "
                                 f"{512 if name == 'ql_nope' else 64}] for this strategy")

    def _kernel(self, q, kv, indices, sm_scale, topk_length):
        out, _, lse = sparse_mla_prefill(q, kv, indices, sm_scale, topk_length=topk_length,
                                         actual_num_heads=self.num_heads, backend=self.kernel_backend)
        return out, lse

    def __call__(self, ql_nope, q_pe, kv, indices, sm_scale: float, topk_length=None, consumer=None):
        """One layer call: ql_nope ``[T, H, 512]``, q_pe ``[T, H, 64]``, kv ``[s_kv, 1, 576]`` bf16; indices
        ``[T, 1, topk]`` int32 (-1 invalid); topk_length ``[T]`` int32; consumer (``subchunk`` views):
        ``consumer(start, out_view, lse_view)`` per chunk. Returns ``(out [T, H, 512] bf16, lse [T, H] fp32)`` of the
        real heads (``graph2``: the graph's static buffers). Raises ValueError: inputs without ``num_heads`` heads; T
        over the workspace; as :mod:`mla_lab.kernels`."""
        self._check_heads(ql_nope, q_pe)
        T = ql_nope.shape[0]
        H, hp, p = self.num_heads, self.padded_heads, self.spec.placement
        if p == "subchunk":
            return self._subchunked(ql_nope, q_pe, kv, indices, sm_scale, topk_length, consumer)
        q = self.workspace.view(T)
        concat_mla_q(ql_nope, q_pe, q, zero_padding=self.spec.concat_zeroes_padding, backend=self.concat_backend)
        if self.spec.per_call_pad and hp > H:
            if p == "per_call_zeros":
                q_padded = q.new_zeros((T, hp, self.head_size))
            elif self._pad_block is not None:
                q_padded = self._pad_block[:T]
            else:
                q_padded = q.new_empty((T, hp, self.head_size))
                pad = q_padded[:, H:]
                pad.zero_() if self.spec.content == "zeros" else self.fill_stale(pad)
            q_padded[:, :H] = q
            q = q_padded
        return self._kernel(q, kv, indices, sm_scale, topk_length)

    def _subchunked(self, ql_nope, q_pe, kv, indices, sm_scale, topk_length, consumer=None):
        args = (ql_nope, q_pe, kv, indices, sm_scale, topk_length, consumer)
        if not (self.spec.graphed and ql_nope.is_cuda):
            return self._chunk_loop(*args)
        if self._streams is None:
            self._streams = [torch.cuda.Stream(device=ql_nope.device) for _ in self.workspaces]
        if not self.capture_graph:
            return self._chunk_loop(*args, streams=self._streams)
        key = (sm_scale, consumer is None, *((None if t is None else (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype))
                                         for t in (ql_nope, q_pe, kv, indices, topk_length)))
        if self._graph is None or self._graph[0] != key:
            self._graph = None  # drop the old graph (and its memory pool) before capturing the new one
            main = torch.cuda.current_stream(ql_nope.device)
            warm = torch.cuda.Stream(device=ql_nope.device)
            warm.wait_stream(main)
            with torch.cuda.stream(warm):  # warm-up off the capture (Triton JIT, FlashMLA module load)
                self._chunk_loop(*args, streams=self._streams)
            main.wait_stream(warm)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = self._chunk_loop(*args, streams=self._streams)
            self._graph = (key, graph, outs)
        self._graph[1].replay()
        return self._graph[2]

    def _chunk_loop(self, ql_nope, q_pe, kv, indices, sm_scale, topk_length, consumer=None, streams=None):
        """Chunk i into workspace (and stream) i mod their count."""
        T, H = ql_nope.shape[0], self.num_heads
        S = self.workspace.max_num_batched_tokens
        out = lse = None
        if consumer is None:
            out = torch.empty((T, H, 512), dtype=ql_nope.dtype, device=ql_nope.device)
            lse = torch.empty((T, H), dtype=torch.float32, device=ql_nope.device)
        main = torch.cuda.current_stream(ql_nope.device) if streams else None
        for st in streams or ():
            st.wait_stream(main)
        for i, s in enumerate(range(0, T, S)):
            n = min(S, T - s)
            ctx = torch.cuda.stream(streams[i % len(streams)]) if streams else contextlib.nullcontext()
            with ctx:
                q = self.workspaces[i % len(self.workspaces)].view(n)
                concat_mla_q(ql_nope[s:s + n], q_pe[s:s + n], q, backend=self.concat_backend)
                tl = None if topk_length is None else topk_length[s:s + n]
                o, lse_chunk = self._kernel(q, kv, indices[s:s + n], sm_scale, tl)
                if consumer is not None:
                    consumer(s, o, lse_chunk)
                else:
                    out[s:s + n] = o
                    lse[s:s + n] = lse_chunk
        for st in streams or ():
            main.wait_stream(st)
        return out, lse


def make_strategy(name: str, **kwargs) -> PaddedQPath:
    """A :class:`PaddedQPath` for a door name (``zero_padding=True``: the concat zeroes the padded heads per call).
    Raises ValueError: unknown name; no padded Q; zero_padding with a per-call placement."""
    zero_padding = kwargs.pop("zero_padding", False)
    path = PaddedQPath(resolve_strategy(name), **kwargs)  # the door: presets and aliases are read here
    if zero_padding:
        if not path.spec.pre_padded:
            raise ValueError(f"zero_padding=True applies only to pre-padded workspaces, not strategy={name!r}")
        path.spec = Strategy(path.spec.placement, "zeros", "zero_per_call", path.spec.rows)
    return path


def equivalence_check(num_heads: int = 8, arch: str = "hopper", num_tokens: int = 24, s_kv: int = 96,
                      topk: int = 32, seed: int = 0, device: str = "cpu", strategies=None) -> dict:
    """Every real strategy against ``per_call_zeros`` on one random input, padded heads poisoned with NaN. Returns
    ``{num_heads, padded_heads, strategies, max_abs_diff_out, max_abs_diff_lse, equal, per_strategy}``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    T = num_tokens
    ql_nope = torch.randn(T, num_heads, 512, generator=g).to(torch.bfloat16).to(device)
    q_pe = torch.randn(T, num_heads, 64, generator=g).to(torch.bfloat16).to(device)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(torch.bfloat16).to(device)
    idx = torch.randint(-1, s_kv + 8, (T, 1, topk), generator=g, dtype=torch.int32).to(device)
    idx[0] = -1  # a row with no valid index
    topk_length = torch.clamp(torch.arange(1, T + 1, dtype=torch.int32), max=topk).to(device)
    kw = dict(num_heads=num_heads, max_num_batched_tokens=T, arch=arch, device=device)
    sm_scale = 576 ** -0.5
    ref_out, ref_lse = PaddedQPath("per_call_zeros", **kw)(ql_nope, q_pe, kv, idx, sm_scale, topk_length)
    names = list(strategies) if strategies is not None else list(REAL_STRATEGIES)
    d_out = d_lse = 0.0
    per = {}
    for name in names:
        path = PaddedQPath(name, **kw, fill_stale=lambda t: t.fill_(float("nan")))
        if path.spec.pre_padded and path.padded_heads > num_heads:
            for ws in path.workspaces:  # graph2: both workspaces
                ws.buffer[:, num_heads:].fill_(float("nan"))
        out, lse = path(ql_nope, q_pe, kv, idx, sm_scale, topk_length)
        finite = torch.isfinite(ref_lse)
        d_out = max(d_out, (ref_out.float() - out.float()).abs().nan_to_num(float("inf")).max().item())
        d_lse = max(d_lse, (ref_lse[finite] - lse[finite]).abs().nan_to_num(float("inf")).max().item()
                    if finite.any() else 0.0)
        per[name] = bool(torch.equal(ref_out, out) and torch.equal(torch.isinf(ref_lse), torch.isinf(lse))
                         and torch.equal(ref_lse[finite], lse[finite]))
    return {"num_heads": num_heads, "padded_heads": padded_num_heads(num_heads, arch), "strategies": names,
            "max_abs_diff_out": d_out, "max_abs_diff_lse": d_lse, "equal": all(per.values()), "per_strategy": per}
