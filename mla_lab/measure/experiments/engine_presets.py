"""The pieces of the engine-preset experiment (:mod:`.engines`): the kernels it calls, the top-k patterns, and the
attention-path presets of the engines built from :mod:`mla_lab.strategies` (labels:
:data:`mla_lab.placement.BENCH_PRESET_LABELS`). Shapes: head_size 576 = 512 + 64, d_v 512, padded heads H' = 64
(Hopper ``prefill_padding``, vLLM ``flashmla_sparse.py``), topk 2048, bf16.
"""

from __future__ import annotations

import time

import torch

from mla_lab import kernels as K
from mla_lab.placement import BENCH_PRESET_LABELS, parse_strategy
from mla_lab.strategies import PaddedQPath

T0 = time.time()
D_NOPE, D_PE, D_QK, D_V = 512, 64, 576, 512
HP = 64  # Hopper prefill_padding (vLLM flashmla_sparse.py)
TOPK = 2048

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




def log(*a):
    print(f"[{time.time() - T0:7.1f}s] " + " ".join(str(x) for x in a), flush=True)


class Kernels:
    """concat (the lab's Triton concat_mla_q on CUDA, its torch backend on CPU) and the sparse kernel
    (flash_mla_sparse_fwd called directly, as vLLM does, on CUDA; the lab's reference on CPU)."""

    def __init__(self, dev):

        self.dev, self.torch = dev, torch
        self.info = {"available": False, "reason": "not probed"}
        self.concat_impl = self.kernel_impl = "none"
        try:

            self.K = K
            self.info = K.flash_mla_info()
            self.concat_impl = "mla_lab.kernels.concat_mla_q(" + ("triton" if dev == "cuda" else "torch") + ")"
        except Exception as e:
            log(f"mla_lab.kernels import failed ({type(e).__name__}: {e}); torch copy_ concat, direct flash_mla")
            self.K = None
            self.concat_impl = "torch copy_ (fallback)"
        self._fm = None
        if dev == "cuda":
            try:
                import flash_mla

                self._fm = flash_mla.flash_mla_sparse_fwd
                self.kernel_impl = "flash_mla.flash_mla_sparse_fwd"
                if not self.info.get("available"):
                    self.info = {"available": True, "provider": "flash_mla", "version":
                                 getattr(flash_mla, "__version__", "unknown"), "reason": None}
            except Exception as e:
                raise SystemExit(f"flash_mla not importable on CUDA: {type(e).__name__}: {e}") from None
        else:
            self.kernel_impl = "mla_lab.kernels.sparse_mla_prefill(reference)"

    def concat(self, qn, qp, out, zero_padding=False):
        if self.K is not None:
            return self.K.concat_mla_q(qn, qp, out, zero_padding=zero_padding,
                                       backend="triton" if self.dev == "cuda" else "torch")
        H = qn.shape[1]
        out[:, :H, :D_NOPE].copy_(qn)
        out[:, :H, D_NOPE:].copy_(qp)
        if zero_padding:
            out[:, H:].zero_()
        return out

    def kernel(self, q, kv, idx, sm_scale, topk_length=None):
        """Full padded output [T, 64, 512] (the caller slices [:, :H], a view, as vLLM)."""
        if self._fm is not None:
            return self._fm(q, kv, idx, sm_scale, d_v=D_V, topk_length=topk_length)[0]
        if self.K is None:
            raise RuntimeError("no kernel: mla_lab.kernels missing and not on CUDA")
        return self.K.sparse_mla_prefill(q, kv, idx, sm_scale, d_v=D_V, topk_length=topk_length,
                                         backend="reference")[0].to(q.dtype)


# --------------------------------------------------------------------------------------------------- timing


def _sync(dev):
    if dev == "cuda":
        import torch

        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------- inputs


def causal_indices(T, L, topk, dev):
    """T // L prompts of L tokens (the last one shorter if L does not divide T): token at position p of its prompt
    attends to the last min(p+1, topk) keys of its own prompt (kv row = global token index). Returns
    (indices [T,1,topk] int32 with -1 past topk_length, topk_length [T] int32, sum of topk_length)."""

    g = torch.arange(T, device=dev)
    start = (g // L) * L
    p = g - start
    tl = torch.clamp(p + 1, max=topk)
    first = start + p + 1 - tl
    ar = torch.arange(topk, device=dev)
    idx = first[:, None] + ar[None, :]
    idx = torch.where(ar[None, :] < tl[:, None], idx, torch.full_like(idx, -1))
    return idx.to(torch.int32).view(T, 1, topk).contiguous(), tl.to(torch.int32).contiguous(), int(tl.sum())


def make_pattern(pattern, T, dev, gen, topk=TOPK, s_kv_full=32768):
    """-> (s_kv, indices, topk_length or None, sum_topk, prompt_len)."""

    if pattern.startswith("causal_"):
        L = min(int(pattern.split("_")[1]), T)
        idx, tl, st = causal_indices(T, L, topk, dev)
        return T, idx, tl, st, L
    idx = torch.randint(0, s_kv_full, (T, 1, topk), device=dev, dtype=torch.int32, generator=gen)
    return s_kv_full, idx, None, T * topk, 0


# --------------------------------------------------------------------------------------- 1. content factor


def _keep(t):
    """``fill_stale`` that leaves the pad as the caching allocator hands it (``new_empty``, no fill)."""
    return t


class Presets:
    """The attention path of one layer call per preset label (:data:`mla_lab.placement.BENCH_PRESET_LABELS`), built
    from :class:`mla_lab.strategies.PaddedQPath` of the label's :class:`~mla_lab.placement.Strategy`, plus
    ``subchunk_2stream`` (a lab variant no engine or strategy has: two sub-chunk workspaces, chunk i+1's concat on a
    second stream while chunk i's kernel runs). ``build(name, S)`` gives ``(fn, prep, persistent_bytes, S,
    n_chunks, strategy)``; ``fn(check)`` runs the call once and returns the real heads' output (a tensor, a list of
    views or the step's [T, H, 512]); with a dict ``check`` it also stores the largest |value| in the padded heads
    of the first q the kernel read (``pad_absmax``).

    ``per_call_empty`` runs with its pad as ``new_empty`` hands it (no fill): the ``prep`` before each window frees
    a same-size block holding zeros (``per_call_empty_zeros``) or N(0, 1) (``per_call_empty_stale``), which is what
    vLLM before PR #53878 gets from the caching allocator. The shared workspace's padded heads hold N(0, 1) (the
    fused-MoE scratch), re-scribbled before each window for ``shared_workspace_zero_per_call``.
    """

    def __init__(self, kern, dev, dtype, H, T, pattern, sub_S, two_stream_S, gen, topk, skv_full):

        self.torch, self.k, self.dev, self.dtype, self.H, self.T = torch, kern, dev, dtype, H, T
        self.s_kv, self.idx, self.tl, self.sum_topk, _ = make_pattern(pattern, T, dev, gen, topk, skv_full)
        self.kv = torch.randn(self.s_kv, 1, D_QK, device=dev, dtype=dtype, generator=gen)
        self.qn = torch.randn(T, H, D_NOPE, device=dev, dtype=dtype, generator=gen)
        self.qp = torch.randn(T, H, D_PE, device=dev, dtype=dtype, generator=gen)
        self.sm = D_QK ** -0.5
        self.out_full = torch.empty(T, H, D_V, device=dev, dtype=dtype)
        self.sub2 = {S: (torch.zeros(S, HP, D_QK, device=dev, dtype=dtype),
                         torch.zeros(S, HP, D_QK, device=dev, dtype=dtype)) for S in two_stream_S}
        self.side = torch.cuda.Stream() if dev == "cuda" else None
        self.gen = gen
        self.bytes_out = T * H * D_V * 2  # bf16

    # ---- helpers
    def _kernel(self, q, lo=0, hi=None):
        hi = self.T if hi is None else hi
        tl = self.tl[lo:hi] if self.tl is not None else None
        return self.k.kernel(q, self.kv, self.idx[lo:hi], self.sm, tl)

    def _absmax(self, t, check):
        if check is not None:
            check["pad_absmax"] = float(t.float().abs().max()) if t.numel() else 0.0

    def strategy(self, name, S=None):
        """The canonical strategy a preset label runs (``subchunk`` / ``subchunk_views`` take ``S``)."""
        if name == "subchunk":
            return parse_strategy(f"subchunk:{S}")
        if name == "subchunk_views":
            return parse_strategy(f"subchunk:{S}:views")
        if name == "subchunk_2stream":
            return None
        return parse_strategy(BENCH_PRESET_LABELS[name])

    def _path(self, strategy):
        spec = parse_strategy("per_call_empty:stale") if strategy.placement == "per_call_empty" else strategy
        path = PaddedQPath(spec, num_heads=self.H, max_num_batched_tokens=self.T, arch="hopper", device=self.dev,
                           dtype=self.dtype, kernel_backend="auto", concat_backend="auto",
                           fill_stale=_keep if strategy.placement == "per_call_empty"
                           else (lambda t: t.normal_(generator=self.gen)))
        if path.padded_heads != HP:
            raise ValueError(f"H={self.H}: padded to {path.padded_heads} heads, the bench assumes {HP}")
        return path

    def build(self, name, S=None):
        torch, H, T = self.torch, self.H, self.T
        strategy = self.strategy(name, S)
        if strategy is not None:
            path = self._path(strategy)
            views = strategy.handoff == "views"
            kernel = path._kernel

            def fn(check=None):
                if check is not None:  # instrument the first kernel call: what its padded heads held
                    def spy(q, *a):
                        if "pad_absmax" not in check:
                            self._absmax(q[:, H:], check)
                        return kernel(q, *a)
                    path._kernel = spy
                try:
                    if views:
                        res = []
                        path(self.qn, self.qp, self.kv, self.idx, self.sm, self.tl,
                             consumer=lambda start, o, lse: res.append(o))
                        return res
                    return path(self.qn, self.qp, self.kv, self.idx, self.sm, self.tl)[0]
                finally:
                    path._kernel = kernel

            prep = None
            if name in ("per_call_empty_zeros", "per_call_empty_stale"):
                stale = name == "per_call_empty_stale"

                def prep():
                    self._empty_cache()
                    z = torch.empty(T, HP, D_QK, device=self.dev, dtype=self.dtype)
                    z.normal_(generator=self.gen) if stale else z.zero_()
                    del z
            elif strategy.concat_zeroes_padding:  # the shared workspace was scribbled on since the last call
                def prep():
                    path.workspace.buffer[:, H:].normal_(generator=self.gen)
            n_chunks = -(-T // strategy.rows) if strategy.placement == "subchunk" else 1
            return fn, prep, path.workspace.nbytes, S, n_chunks, strategy
        if name == "subchunk_2stream":
            wa, wb = self.sub2[S]
            chunks = [(lo, min(lo + S, T)) for lo in range(0, T, S)]
            nc = len(chunks)
            if self.dev == "cuda":
                evc = [torch.cuda.Event() for _ in range(nc)]
                evk = [torch.cuda.Event() for _ in range(nc)]
            side = self.side
            k = self.k

            def fn(check=None):
                wss = (wa, wb)
                if self.dev != "cuda":  # no streams: sequential
                    for i, (lo, hi) in enumerate(chunks):
                        q = wss[i % 2][: hi - lo]
                        k.concat(self.qn[lo:hi], self.qp[lo:hi], q)
                        if check is not None and i == 0:
                            self._absmax(q[:, H:], check)
                        o = self._kernel(q, lo, hi)
                        self.out_full[lo:hi].copy_(o[:, :H])
                    return self.out_full
                main = torch.cuda.current_stream()
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    lo, hi = chunks[0]
                    k.concat(self.qn[lo:hi], self.qp[lo:hi], wa[: hi - lo])
                    evc[0].record(side)
                for i, (lo, hi) in enumerate(chunks):
                    q = wss[i % 2][: hi - lo]
                    main.wait_event(evc[i])
                    if check is not None and i == 0:
                        self._absmax(q[:, H:], check)
                    o = self._kernel(q, lo, hi)
                    evk[i].record(main)
                    if i + 1 < nc:
                        lo2, hi2 = chunks[i + 1]
                        with torch.cuda.stream(side):
                            if i >= 1:
                                side.wait_event(evk[i - 1])  # ws of chunk i+1 was read by kernel i-1
                            k.concat(self.qn[lo2:hi2], self.qp[lo2:hi2], wss[(i + 1) % 2][: hi2 - lo2])
                            evc[i + 1].record(side)
                    self.out_full[lo:hi].copy_(o[:, :H])
                    del o
                return self.out_full

            return fn, None, 2 * S * HP * D_QK * 2 + self.bytes_out, S, nc, None
        raise ValueError(f"preset={name!r}; allowed: {list(BENCH_PRESET_LABELS)} + subchunk, subchunk_views, "
                         "subchunk_2stream")

    def _empty_cache(self):
        if self.dev == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.empty_cache()


def _content(label, strategy):
    """What the padded heads hold in a preset row: the allocator block's content for ``per_call_empty`` (set by
    the prep), the strategy's otherwise (``subchunk_2stream``: zeroed workspaces)."""
    if label in ("per_call_empty_zeros", "per_call_empty_stale"):
        return label.rsplit("_", 1)[1]
    return strategy.content if strategy is not None else "zeros"


def _as_tensor(res):

    if isinstance(res, list):
        return torch.cat(res, 0)
    return res


def call_peak(fn, dev):
    """Peak bytes allocated during one call above what was allocated before it (outputs kept alive count)."""

    if dev != "cuda":
        return "", None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del r
    return peak, None


