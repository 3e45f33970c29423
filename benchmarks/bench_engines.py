"""GPU round 2, engines: padded-head content factor, engine attention-path presets, sub-chunking, NaN check.

Three experiments on one GPU (FlashMLA sparse prefill, head_size 576 = 512 + 64, d_v 512, padded heads H' = 64,
bf16, sm_scale = 576**-0.5); each writes one tidy CSV, a row per repeat, appended as it is measured (a kill
loses nothing measured):

1. ``content.csv`` ("content factor"): the FlashMLA kernel alone with the padded heads H..63 holding zeros vs
   stale (``content_fill``: N(0,1), the same distribution as the real heads and the kv, standing for activations
   that a shared workspace held before), for H in {8, 16, 32} real heads of 64, T in {1024, 4096, 16384} and three
   top-k patterns: ``causal_1024`` / ``causal_8192`` (T/L prompts of L tokens, token at position p of its prompt
   sees the last min(p+1, 2048) keys of its own prompt, topk_length = min(p+1, 2048), s_kv = T; for T < 8192
   ``causal_8192`` becomes one prompt of T tokens (prompt_len = T), and at T = 1024 it is the same shape as
   ``causal_1024`` and is skipped) and ``full_2048`` (random topk 2048 over s_kv 32768, no topk_length). Modes:
   ``alone`` (kernel calls back to back) and ``interleaved`` (each kernel call followed by a bf16 GEMM
   [T, 6144] x [6144, 4096]; only the kernel is timed, CUDA events around it). Repeats alternate zeros/stale
   (order flipped every repeat). Each row: median (and mean, p10, p90) per-call kernel time of one window, and
   the median SM clock / board power / temperature read by NVML every ~20 ms during that window.
2. ``presets.csv`` ("engine presets", "subchunk"): the attention path of one layer call (concat + pad + kernel +
   output handling) as each engine or variant does it, at the seed shape (16 causal 1024-token prompts,
   T = 16384) and at full topk (T = 16384, random topk 2048 over s_kv 32768), GLM-5 TP8 (8 -> 64 heads) and
   DeepSeek-V3.2 TP8 (16 -> 64), >= 7 repeats interleaved across presets, with the call's peak memory above the
   pre-call baseline (``torch.cuda.max_memory_allocated``), the persistent bytes the preset keeps, what the padded
   heads held (read once after each window) and the real heads' max abs difference against the private
   zero-initialised workspace call. Presets in :data:`PRESET_DOC`: each label is a strategy of
   :mod:`mla_lab.placement` (``BENCH_PRESET_LABELS``, ``subchunk:S``, ``subchunk:S:views``) run by
   :class:`mla_lab.strategies.PaddedQPath` (rows carry ``strategy`` and ``content``), except ``subchunk_2stream``,
   a variant of this script's own; ``persistent_bytes`` is the strategy's workspace.
3. ``nan.csv``: padded heads NaN in the workspace -> are the real heads identical to the zero-padded call?

``--smoke``: tiny shapes (CPU: torch concat and the reference kernel; GPU: the real kernels) in seconds.
Provenance columns on every row: gpu, sm, driver, cuda, torch, triton, flash_mla (provider==version from
``mla_lab.kernels.flash_mla_info()``), git_commit (env ``MLA_LAB_COMMIT``), date_utc.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

from mla_lab.kernels import last_backend
from mla_lab.measure.record import CsvSink, NvmlSampler, bench_provenance
from mla_lab.measure.timer import est_ms, timed_window
from mla_lab.paths import REPO_ROOT as REPO
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


# ------------------------------------------------------------------------------------------------ provenance






# ----------------------------------------------------------------------------------------------- NVML sampler




# ------------------------------------------------------------------------------------------------- kernels


class Kernels:
    """concat (the lab's Triton concat_mla_q on CUDA, its torch backend on CPU) and the sparse kernel
    (flash_mla_sparse_fwd called directly, as vLLM does, on CUDA; the lab's reference on CPU)."""

    def __init__(self, dev):
        import torch

        self.dev, self.torch = dev, torch
        self.info = {"available": False, "reason": "not probed"}
        self.concat_impl = self.kernel_impl = "none"
        try:
            from mla_lab import kernels as K

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
    import torch

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
    import torch

    if pattern.startswith("causal_"):
        L = min(int(pattern.split("_")[1]), T)
        idx, tl, st = causal_indices(T, L, topk, dev)
        return T, idx, tl, st, L
    idx = torch.randint(0, s_kv_full, (T, 1, topk), device=dev, dtype=torch.int32, generator=gen)
    return s_kv_full, idx, None, T * topk, 0


# --------------------------------------------------------------------------------------- 1. content factor

CONTENT_COLS = ["experiment", "shape_id", "H", "Hp", "T", "pattern", "prompt_len", "s_kv", "topk", "sum_topk",
                "content", "content_fill", "mode", "repeat", "order_in_pair", "n_calls", "ms_median", "ms_mean",
                "ms_p10", "ms_p90", "window_s", "tflops", "gemm_shape", "sm_clock_mhz", "power_w", "temp_c",
                "n_samples", "clock_event_reasons", "power_kind", "out_equal", "kernel_impl", "status"]


def run_content(sink, kern, dev, dtype, sampler, args, deadline):
    import torch

    gen = torch.Generator(device=dev).manual_seed(1234)
    if args.smoke:
        Ts, Hs, pats, topk, skv_full = [128], [8], ["causal_128", "causal_8192", "full_2048"], 128, 1024
    else:
        Ts, Hs, pats, topk, skv_full = [16384, 4096, 1024], [8, 16, 32], ["causal_1024", "causal_8192",
                                                                          "full_2048"], TOPK, 32768
    modes = [m for m in args.modes.split(",") if m]
    sm_scale = D_QK ** -0.5
    fill = "randn N(0,1), same distribution as the real heads and kv (stands for activations)"
    shape_id = 0
    gemm = {}
    seen = set()
    gk, gn = (256, 256) if args.smoke else (6144, 4096)
    for T in Ts:
        for H in Hs:
            for pat in pats:
                if time.time() > deadline:
                    log(f"content: deadline reached before T={T} H={H} {pat}")
                    return
                L = int(pat.split("_")[1]) if pat.startswith("causal_") else 0
                if L:  # causal_8192 at T = 1024 is causal_1024 again (prompt_len = min(L, T)): skipped
                    if (T, H, min(L, T)) in seen:
                        continue
                    seen.add((T, H, min(L, T)))
                shape_id += 1
                try:
                    s_kv, idx, tl, st, plen = make_pattern(pat, T, dev, gen, topk, skv_full)
                    kv = torch.randn(s_kv, 1, D_QK, device=dev, dtype=dtype, generator=gen)
                    qz = torch.randn(T, HP, D_QK, device=dev, dtype=dtype, generator=gen)
                    qs = qz.clone()
                    qz[:, H:].zero_()
                    # the stale fill is an independent N(0,1) draw (qs keeps its own random padded heads)
                    qs[:, H:].normal_(generator=gen)
                    qs[:, :H] = qz[:, :H]
                    fz = lambda qz=qz, kv=kv, idx=idx, tl=tl: kern.kernel(qz, kv, idx, sm_scale, tl)  # noqa: E731
                    fs = lambda qs=qs, kv=kv, idx=idx, tl=tl: kern.kernel(qs, kv, idx, sm_scale, tl)  # noqa: E731
                    oz, os_ = fz(), fs()
                    _sync(dev)
                    eq = bool(torch.equal(oz[:, :H], os_[:, :H]))
                    del oz, os_
                    if "interleaved" in modes and T not in gemm:
                        ga = torch.randn(T, gk, device=dev, dtype=dtype, generator=gen) / gk ** 0.5
                        gb = torch.randn(gk, gn, device=dev, dtype=dtype, generator=gen)
                        gc = torch.empty(T, gn, device=dev, dtype=dtype)
                        gemm = {T: (ga, gb, gc)}
                    ms1 = est_ms(fz, dev)
                    n = max(args.min_calls, min(args.max_calls, int(round(args.window_ms / max(ms1, 1e-3)))))
                    for mode in modes:
                        after = None
                        gshape = ""
                        if mode == "interleaved":
                            ga, gb, gc = gemm[T]
                            after = lambda ga=ga, gb=gb, gc=gc: torch.mm(ga, gb, out=gc)  # noqa: E731
                            gshape = f"[{T},{gk}]x[{gk},{gn}] bf16"
                        # warm-up window per mode (both contents), untimed
                        timed_window(fz, max(2, n // 4), dev, sampler, after)
                        timed_window(fs, max(2, n // 4), dev, sampler, after)
                        for r in range(args.repeats):
                            order = ("zeros", "stale") if r % 2 == 0 else ("stale", "zeros")
                            for k, content in enumerate(order):
                                res = timed_window(fz if content == "zeros" else fs, n, dev, sampler, after)
                                sink.write({"experiment": "content_factor", "shape_id": shape_id, "H": H, "Hp": HP,
                                            "T": T, "pattern": pat, "prompt_len": plen, "s_kv": s_kv,
                                            "topk": topk, "sum_topk": st, "content": content,
                                            "content_fill": "zeros" if content == "zeros" else fill,
                                            "mode": mode, "repeat": r, "order_in_pair": k, **res,
                                            "tflops": 2 * st * HP * (D_QK + D_V) / (res["ms_median"] * 1e9),
                                            "gemm_shape": gshape, "power_kind": sampler.power_kind,
                                            "out_equal": eq, "kernel_impl": kern.kernel_impl, "status": "ok"})
                    log(f"content T={T} H={H} {pat}: n={n} est {ms1:.3f} ms, real heads equal={eq}")
                    del qz, qs, kv, idx, tl, fz, fs
                except Exception as e:
                    log(f"content T={T} H={H} {pat} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                    sink.write({"experiment": "content_factor", "shape_id": shape_id, "H": H, "T": T,
                                "pattern": pat, "status": f"error {type(e).__name__}: {str(e)[:200]}"})
                if dev == "cuda":
                    torch.cuda.empty_cache()
    gemm.clear()


# ------------------------------------------------------------------------------------------- 2. presets

PRESET_COLS = ["experiment", "model", "tp", "H", "Hp", "pattern", "T", "s_kv", "sum_topk", "preset", "strategy",
               "content", "S",
               "n_chunks", "repeat", "order", "n_calls", "ms_median", "ms_mean", "ms_p10", "ms_p90", "window_s",
               "call_peak_bytes", "call_peak_mib", "persistent_bytes", "persistent_mib", "max_abs_diff",
               "bit_identical", "pad_absmax", "sm_clock_mhz", "power_w", "temp_c", "n_samples",
               "clock_event_reasons", "concat_impl", "kernel_impl", "description", "status"]


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
        import torch

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
    import torch

    if isinstance(res, list):
        return torch.cat(res, 0)
    return res


def call_peak(fn, dev):
    """Peak bytes allocated during one call above what was allocated before it (outputs kept alive count)."""
    import torch

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


def run_presets(sink, kern, dev, dtype, sampler, args, deadline):
    import torch

    from_models = [("glm-5", 8), ("deepseek-v3.2", 8)]
    H_of = {}
    try:
        from mla_lab.models import load_model

        for m, tp in from_models:
            H_of[m] = load_model(m).heads_per_rank(tp)
    except Exception as e:
        log(f"load_model unavailable ({type(e).__name__}: {e}); config values from the HF config.json files")
        H_of = {"glm-5": 64 // 8, "deepseek-v3.2": 128 // 8}
    if args.smoke:
        T, sub_S, two_S, topk, skv_full = 256, [128, 256], [128], 128, 1024
        pats = [("seed", "causal_128"), ("full", "full_2048")]
    else:
        T, sub_S, two_S, topk, skv_full = 16384, [1024, 2048, 4096, 8192, 16384], [2048, 4096], TOPK, 32768
        pats = [("seed", "causal_1024"), ("full", "full_2048")]
    gen = torch.Generator(device=dev).manual_seed(99)
    for mname, tp in from_models:
        H = H_of[mname]
        for pname, pat in pats:
            if time.time() > deadline:
                log(f"presets: deadline reached before {mname} {pname}")
                return
            try:
                P = Presets(kern, dev, dtype, H, T, pat, sub_S, two_S, gen, topk, skv_full)
            except Exception as e:
                log(f"presets {mname} {pname}: setup failed {type(e).__name__}: {e}")
                continue
            names = [("per_call_empty_zeros", None), ("per_call_empty_stale", None), ("per_call_zeros", None),
                     ("private_workspace_zeros", None), ("shared_workspace_stale", None),
                     ("shared_workspace_zero_per_call", None)]
            names += [("subchunk", S) for S in sub_S] + [("subchunk_views", S) for S in sub_S]
            names += [("subchunk_2stream", S) for S in two_S]
            built = {}
            # reference: the private zero workspace call
            ref_fn = P.build("private_workspace_zeros")[0]
            ref = ref_fn().clone()
            _sync(dev)
            for nm, S in names:
                try:
                    fn, prep, pers, S_, nch, strategy = P.build(nm, S)
                    if prep:
                        prep()
                    chk = {}
                    res = fn(chk)
                    r = _as_tensor(res)
                    _sync(dev)
                    d = float((r.float() - ref.float()).abs().max())
                    ident = bool(torch.equal(r, ref))
                    del r, res
                    if prep:
                        prep()
                    peak, _ = call_peak(fn, dev)
                    ms1 = est_ms(fn, dev, k=2)
                    n = max(3, min(60, int(round(args.preset_window_ms / max(ms1, 1e-3)))))
                    impls = ((kern.concat_impl, kern.kernel_impl) if strategy is None else
                             (f"mla_lab.kernels.concat_mla_q({last_backend('concat_mla_q')})",
                              f"mla_lab.kernels.sparse_mla_prefill({last_backend('sparse_mla_prefill')})"))
                    built[(nm, S)] = dict(fn=fn, prep=prep, pers=pers, nch=nch, diff=d, ident=ident, peak=peak,
                                          n=n, pad0=chk.get("pad_absmax"), impls=impls,
                                          strategy=strategy.name if strategy else "", content=_content(nm, strategy))
                except Exception as e:
                    log(f"preset {mname} {pname} {nm} S={S} failed to build/check: {type(e).__name__}: {e}\n"
                        f"{traceback.format_exc()}")
                    sink.write({"experiment": "preset", "model": mname, "tp": tp, "H": H, "Hp": HP, "pattern": pname,
                                "T": T, "preset": nm, "S": S or "", "status": f"error {type(e).__name__}: "
                                f"{str(e)[:200]}"})
                    if dev == "cuda":
                        torch.cuda.empty_cache()
            keys = list(built)
            for r in range(args.preset_repeats):
                if time.time() > deadline:
                    log(f"presets {mname} {pname}: deadline after {r} repeats")
                    break
                rot = keys[r % len(keys):] + keys[: r % len(keys)]
                if r % 2:
                    rot = rot[::-1]
                for o, key in enumerate(rot):
                    b = built[key]
                    nm, S = key
                    try:
                        if b["prep"]:
                            b["prep"]()
                        b["fn"]()  # warm-up call after the prep (allocator blocks, clocks)
                        res = timed_window(b["fn"], b["n"], dev, sampler)
                        chk = {}
                        rr = b["fn"](chk)
                        del rr
                        st = "ok"
                    except Exception as e:
                        res, chk, st = {}, {}, f"error {type(e).__name__}: {str(e)[:200]}"
                        log(f"preset {mname} {pname} {nm} S={S} rep {r}: {st}")
                    sink.write({"experiment": "preset", "model": mname, "tp": tp, "H": H, "Hp": HP, "pattern": pname,
                                "T": T, "s_kv": P.s_kv, "sum_topk": P.sum_topk, "preset": nm,
                                "strategy": b["strategy"], "content": b["content"], "S": S or "",
                                "n_chunks": b["nch"], "repeat": r, "order": o, **res,
                                "call_peak_bytes": b["peak"],
                                "call_peak_mib": round(b["peak"] / 2**20, 2) if b["peak"] != "" else "",
                                "persistent_bytes": b["pers"], "persistent_mib": round(b["pers"] / 2**20, 2),
                                "max_abs_diff": b["diff"], "bit_identical": b["ident"],
                                "pad_absmax": chk.get("pad_absmax", ""), "concat_impl": b["impls"][0],
                                "kernel_impl": b["impls"][1], "description": PRESET_DOC[nm], "status": st})
                log(f"presets {mname} {pname}: repeat {r} done")
            summ = {}
            for key, b in built.items():
                summ[key] = b["diff"]
            log(f"presets {mname} {pname}: max_abs_diff {max(summ.values()) if summ else 'n/a'}; "
                f"peaks MiB " + ", ".join(f"{k[0]}{'' if k[1] is None else k[1]}="
                                          f"{(b['peak'] / 2**20 if b['peak'] != '' else float('nan')):.0f}"
                                          for k, b in built.items()))
            del P, built, ref, ref_fn
            if dev == "cuda":
                torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------- 3. NaN

NAN_COLS = ["experiment", "model", "tp", "H", "Hp", "pattern", "T", "pad_fill", "max_abs_diff", "bit_identical",
            "real_heads_nonfinite", "ms_zeros", "ms_fill", "status"]


def run_nan(sink, kern, dev, dtype, sampler, args):
    import torch

    gen = torch.Generator(device=dev).manual_seed(7)
    T, topk, skv_full = (256, 128, 1024) if args.smoke else (16384, TOPK, 32768)
    pat = "causal_128" if args.smoke else "causal_1024"
    for mname, H in (("glm-5", 8), ("deepseek-v3.2", 16)):
        try:
            s_kv, idx, tl, st, _ = make_pattern(pat, T, dev, gen, topk, skv_full)
            kv = torch.randn(s_kv, 1, D_QK, device=dev, dtype=dtype, generator=gen)
            q = torch.randn(T, HP, D_QK, device=dev, dtype=dtype, generator=gen)
            q[:, H:].zero_()
            ref = kern.kernel(q, kv, idx, D_QK ** -0.5, tl)[:, :H].clone()
            mz = est_ms(lambda q=q, kv=kv, idx=idx, tl=tl: kern.kernel(q, kv, idx, D_QK ** -0.5, tl), dev)
            for fill in ("nan", "inf"):
                q[:, H:] = float("nan") if fill == "nan" else float("inf")
                o = kern.kernel(q, kv, idx, D_QK ** -0.5, tl)[:, :H]
                _sync(dev)
                mf = est_ms(lambda q=q, kv=kv, idx=idx, tl=tl: kern.kernel(q, kv, idx, D_QK ** -0.5, tl), dev)
                d = float((o.float() - ref.float()).abs().max())
                sink.write({"experiment": "nan_padding", "model": mname, "tp": 8, "H": H, "Hp": HP,
                            "pattern": pat, "T": T, "pad_fill": fill, "max_abs_diff": d,
                            "bit_identical": bool(torch.equal(o, ref)),
                            "real_heads_nonfinite": int((~torch.isfinite(o)).sum()), "ms_zeros": mz, "ms_fill": mf,
                            "status": "ok"})
                log(f"nan check {mname} {fill}: max_abs_diff {d} identical {bool(torch.equal(o, ref))}")
            del q, kv, idx, ref
        except Exception as e:
            log(f"nan check {mname} failed: {type(e).__name__}: {e}")
            sink.write({"experiment": "nan_padding", "model": mname, "status": f"error {type(e).__name__}: {e}"})


# ---------------------------------------------------------------------------------------------------- main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="output folder (default data/measured/h200/round2, smoke: /tmp)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, seconds (CPU or GPU)")
    ap.add_argument("--parts", default="nan,presets,content", help="which experiments, in this order")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new work after this many seconds")
    ap.add_argument("--presets-budget-s", type=float, default=90.0, help="deadline of the presets part (from start)")
    ap.add_argument("--repeats", type=int, default=5, help="content: repeats per (shape, content, mode)")
    ap.add_argument("--preset-repeats", type=int, default=7)
    ap.add_argument("--modes", default="alone,interleaved")
    ap.add_argument("--window-ms", type=float, default=120.0, help="content: kernel time per window")
    ap.add_argument("--preset-window-ms", type=float, default=50.0)
    ap.add_argument("--min-calls", type=int, default=5)
    ap.add_argument("--max-calls", type=int, default=300)
    args = ap.parse_args(argv)
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.smoke:
        ap.error("no CUDA GPU: use --smoke on CPU")
    if args.smoke:
        args.repeats, args.preset_repeats = min(args.repeats, 2), min(args.preset_repeats, 2)
        args.window_ms, args.preset_window_ms, args.min_calls, args.max_calls = 5.0, 5.0, 2, 4
    dtype = torch.bfloat16
    out = Path(args.out) if args.out else (Path("/tmp/bench_engines_smoke") if args.smoke
                                           else REPO / "data/measured/h200/round2")
    out.mkdir(parents=True, exist_ok=True)
    kern = Kernels(dev)
    prov = bench_provenance(kern.info)
    sampler = NvmlSampler(0.02)
    log(f"device={prov['gpu']} driver={prov['driver']} torch={prov['torch']} triton={prov['triton']} "
        f"flash_mla={prov['flash_mla']} commit={prov['git_commit']}; concat={kern.concat_impl} "
        f"kernel={kern.kernel_impl}; nvml={'ok, power ' + sampler.power_kind if sampler.ok else sampler.why}")
    if sampler.ok:
        time.sleep(0.1)
        log(f"idle sample (t, sm MHz, W, C, reasons): {sampler.now()}")
    deadline = T0 + args.budget_s
    parts = [p for p in args.parts.split(",") if p]
    for part in parts:
        if time.time() > deadline:
            log(f"budget reached before {part}")
            break
        try:
            if part == "nan":
                run_nan(CsvSink(out / "nan.csv", NAN_COLS, prov), kern, dev, dtype, sampler, args)
            elif part == "presets":
                run_presets(CsvSink(out / "presets.csv", PRESET_COLS, prov), kern, dev, dtype, sampler, args,
                            min(deadline, T0 + args.presets_budget_s))
            elif part == "content":
                run_content(CsvSink(out / "content.csv", CONTENT_COLS, prov), kern, dev, dtype, sampler, args,
                            deadline)
            else:
                raise ValueError(f"unknown part {part!r}")
            log(f"{part} done")
        except Exception as e:
            log(f"{part} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    sampler.stop()
    summary(out, args)
    log(f"bench_engines done in {time.time() - T0:.0f}s -> {out}")
    return 0


def summary(out, args):
    """Short tables for the log (the device reply carries the end of the output)."""
    try:
        import pandas as pd
    except Exception:
        return
    pd.set_option("display.width", 200)
    pd.set_option("display.max_rows", 200)
    f = out / "content.csv"
    if f.exists():
        d = pd.read_csv(f)
        d = d[d.status == "ok"]
        if len(d):
            p = d.pivot_table(index=["T", "H", "pattern", "mode"], columns="content", values="ms_median",
                              aggfunc="median")
            if {"zeros", "stale"} <= set(p.columns):
                p["ratio"] = p["stale"] / p["zeros"]
            c = d.pivot_table(index=["T", "H", "pattern", "mode"], columns="content", values="sm_clock_mhz",
                              aggfunc="median")
            p = p.join(c.add_suffix("_mhz"))
            print("content factor (median ms of window medians; stale/zeros):\n" + p.round(3).to_string())
    f = out / "presets.csv"
    if f.exists():
        d = pd.read_csv(f)
        d = d[d.status == "ok"]
        if len(d):
            d["S"] = d["S"].fillna(0).astype(int)
            g = d.groupby(["model", "pattern", "preset", "S"]).agg(
                ms=("ms_median", "median"), q1=("ms_median", lambda x: x.quantile(0.25)),
                q3=("ms_median", lambda x: x.quantile(0.75)), peak_mib=("call_peak_mib", "max"),
                pers_mib=("persistent_mib", "max"), diff=("max_abs_diff", "max"), pad=("pad_absmax", "max"),
                mhz=("sm_clock_mhz", "median"), n=("repeat", "count"))
            print("presets (median over repeats of window medians, ms):\n" + g.round(3).to_string())


if __name__ == "__main__":
    sys.exit(main())
