"""The Q concat into the padded [T, H', 576] workspace (issue 23, rounds 3-4): kernel variants, the layout's own
cost, cache hints, and the host launch cost.

Run on a CUDA GPU (torch + triton + mla_lab, nothing else)::

    python -m mla_lab.measure.experiments.concat_variants --out DIR                  # --set round3: DIR/concat_round3.csv
    python -m mla_lab.measure.experiments.concat_variants --set round4 --out DIR     # DIR/concat_round4.csv
    python -m mla_lab.measure.experiments.concat_variants --set ceiling --out DIR    # DIR/concat_layout_ceiling.csv
    python -m mla_lab.measure.experiments.concat_variants --set hints --out DIR      # DIR/concat_hints.csv
    python -m mla_lab.measure.experiments.concat_variants --set hints_clean --out DIR  # DIR/concat_hints_clean.csv
    python -m mla_lab.measure.experiments.concat_variants --dry-run [--set ...]      # CPU: prints the plan, exits 0

Method sets (``--set``; each writes its own CSV, so a set never overwrites another's rows):

- ``round3`` (below): v2, v3 and :data:`TUNE`, both timers;
- ``round4``: v2, the persistent span kernel v4 and TMA stores v5 (:data:`TUNE4`; v5 needs every ``--H`` a power of
  two <= 32), v2 with streaming hints, each variant's unpadded ceiling, and ``memcpy2d``
  (``cudaMemcpy2DAsync`` of a contiguous ``[T, H, 576]`` source into the same gapped layout);
- ``ceiling``: the layout's cost with the kernel held fixed (:mod:`mla_lab.measure.bandwidth`): ``copy1_*`` (a
  one-source copy) and ``fill_*`` (zeros, write only) into the padded and an unpadded buffer, ``memset``;
- ``hints``: v2 with the load-eviction / store-cache pairs of :data:`HINTS` (evict_last loads included: their
  inputs survive the timer's L2 flush and speed up later methods that read the same inputs; docs/perf-notes.md);
- ``hints_clean``: the pairs of :data:`HINTS` without evict_last (no method leaves protected lines behind).

The rest of this docstring describes ``round3``; the others time the graph timer only by default.

What it measures, per shape (T x H real heads into H' padded heads, bf16; default T 4096/16384, H 8/16, H' 64):

- ``v2``, ``v3`` (the defaults) and the ``v3:...`` / ``v2:...`` configs of :data:`TUNE` into ``out[T, H', 576]``
  (real heads only, vLLM semantics), each checked bitwise against ``torch.cat`` on a NaN-poisoned ``out`` (padded
  heads must stay poisoned) before it is timed;
- ``v2_unpadded``, ``v3_unpadded``: the same kernels into an unpadded ``[T, H, 576]`` buffer (the gapped-write cost);
- ``copy``: ``dst.copy_(src)`` of the same bytes (``T * H * 576`` elements read and written), the ceiling;
- ``torch_cat`` into the unpadded buffer (vLLM before the PR), for reference.

Bytes: ``2 * T * H * 576 * 2`` (read + write of the real heads; the write-only rows ``fill_*`` and ``memset``:
``T * H * 576 * 2``), ``gbps`` from those bytes; ``pct_of_copy`` = copy time / method time under the same timer
(= GB/s ratio at equal bytes; a plain time ratio for the write-only rows). Two timers, both device time (no host
launch cost):

- ``graph``: the lab's timer (:func:`mla_lab.measure.timer.median_ms` with ``graph=True``): one call captured in a
  CUDA graph, replayed under ``triton.testing.do_bench`` (median, L2 flushed before every replay) — the timing of
  the figures in issue 23 (93.0-95.4 %) and docs/perf-notes.md;
- ``cudagraph``: ``triton.testing.do_bench_cudagraph(fn, return_mode="median")``: many calls back to back in one
  graph, no L2 flush between them (inputs up to ~75 MB at 4096 x 8 partly stay in the H200's L2, so this timer
  favours small shapes; it is reported because it is Triton's documented graph timer).

Each (shape, method, timer) is timed ``--rounds`` times in a rotated order (drift hits every method alike); the
table shows the median over rounds; the CSV has every round. A CUDA graph copy_ is a memcpy node, which the lab
measured 1.55x slow from ~1.2 GB one way (docs/perf-notes.md GPU run 2): the default shapes stay below that
(16384 x 16: 302 MB one way); larger ones print a warning.

Host launch (T = 16, H = 8 -> 64, eager, back to back): microseconds per call over ``--host-calls`` calls after a
warm-up and a sync (perf_counter, then a sync), median of 5 repeats, for ``concat_mla_q`` (the checked API, v2 and
v3), the launcher hot path (:func:`mla_lab.kernels.make_concat_launcher`, its ``path`` printed: ``compiled``
expected), the launcher forced onto its ``jit`` fallback, ``concat_mla_q_triton`` (no checks, Triton's JIT launch)
and ``torch.cat``. Also checked: the launcher captured in a CUDA graph and replayed after its inputs changed gives
the new result bitwise (``graph_capture_ok``).

Rows carry :func:`mla_lab.provenance.provenance` ``("measured")`` columns. Bad arguments: one line naming the
argument, exit 2 (argparse's own errors too); an existing CSV of the set not written by this script is never
overwritten, and ``--out`` naming a file is refused, both before anything is timed (exit 2).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

from mla_lab.kernels import concat_mla_q, make_concat_launcher
from mla_lab.kernels.triton_concat import _plan, concat_mla_q_triton, triton_interpreting, v3_config
from mla_lab.measure.bandwidth import gapped_write
from mla_lab.measure.timer import median_ms
from mla_lab.provenance import provenance

CSV_NAME = "concat_round3.csv"
#: Extra configurations timed into the padded workspace (name -> (variant, knobs)); the defaults are "v2" / "v3".
#: v3 rows: tile tokens x heads, tiles per program (a run of block_h * head_tiles heads), warps.
TUNE = {
    "v2:4x1": ("v2", {"block_rows": 4, "num_warps": 1}),
    "v3:1x2x4w1": ("v3", {"block_t": 1, "block_h": 2, "head_tiles": 4, "num_warps": 1}),
    "v3:1x2x1w1": ("v3", {"block_t": 1, "block_h": 2, "head_tiles": 1, "num_warps": 1}),
    "v3:1x4x2w1": ("v3", {"block_t": 1, "block_h": 4, "head_tiles": 2, "num_warps": 1}),
    "v3:1x4x4w2": ("v3", {"block_t": 1, "block_h": 4, "head_tiles": 4, "num_warps": 2}),
    "v3:1x8x1w2": ("v3", {"block_t": 1, "block_h": 8, "head_tiles": 1, "num_warps": 2}),
    "v3:1x8x2w4": ("v3", {"block_t": 1, "block_h": 8, "head_tiles": 2, "num_warps": 4}),
    "v3:2x8x1w4": ("v3", {"block_t": 2, "block_h": 8, "head_tiles": 1, "num_warps": 4}),
}
#: Round 4 (docs/perf-notes.md "Round 4"): the persistent span kernel (v4) and TMA stores (v5) into the padded
#: workspace, v2 with streaming hints, each variant's unpadded ceiling, the v4 chunk-order control, and the CUDA
#: runtime's own 2-D copy of the same bytes into the same gapped layout (``cudaMemcpy2DAsync``, one source).
#: v4 names: rows per chunk, warps, programs per SM; v5: tokens per tile, warps, programs per SM.
TUNE4 = {
    "v2:stream": ("v2", {"streaming": True}),
    "v4": ("v4", {}),
    "v4:stride": ("v4", {"order": "stride"}),
    "v4:2r1w32": ("v4", {"block_rows": 2, "num_warps": 1, "progs_per_sm": 32}),
    "v4:4r1w8": ("v4", {"block_rows": 4, "num_warps": 1, "progs_per_sm": 8}),
    "v4:4r1w16": ("v4", {"block_rows": 4, "num_warps": 1, "progs_per_sm": 16}),
    "v4:8r2w8": ("v4", {"block_rows": 8, "num_warps": 2, "progs_per_sm": 8}),
    "v4:16r4w4": ("v4", {"block_rows": 16, "num_warps": 4, "progs_per_sm": 4}),
    "v4:stream": ("v4", {"streaming": True}),
    "v5": ("v5", {}),
    "v5:1t1w16": ("v5", {"block_t": 1, "num_warps": 1, "progs_per_sm": 16}),
    "v5:1t4w4": ("v5", {"block_t": 1, "num_warps": 4, "progs_per_sm": 4}),
    "v5:1t2w4": ("v5", {"block_t": 1, "num_warps": 2, "progs_per_sm": 4}),
    "v5:2t4w4": ("v5", {"block_t": 2, "num_warps": 4, "progs_per_sm": 4}),
}
#: Cache hints on v2 into the padded workspace (name -> (load eviction_policy, store cache_modifier)): a one-source
#: copy into this layout loses ~5 % only when its reads and writes mix (writes alone lose nothing: set "ceiling"),
#: so the hints that change how L2 allocates and writes back are the last lever tried on the kernel side.
HINTS = {
    "v2:ld_first": ("evict_first", ""),
    "v2:ld_last": ("evict_last", ""),
    "v2:st_cs": ("", ".cs"),
    "v2:st_wt": ("", ".wt"),
    "v2:st_cg": ("", ".cg"),
    "v2:ld_first_st_wt": ("evict_first", ".wt"),
    "v2:ld_last_st_cs": ("evict_last", ".cs"),
}
#: The pairs of HINTS whose loads leave no evict_last lines behind.
HINTS_CLEAN = {k: v for k, v in HINTS.items() if v[0] != "evict_last"}
SETS = ("round3", "round4", "ceiling", "hints", "hints_clean")
CSV_NAMES = {"round3": "concat_round3.csv", "round4": "concat_round4.csv", "ceiling": "concat_layout_ceiling.csv",
             "hints": "concat_hints.csv", "hints_clean": "concat_hints_clean.csv"}
#: The write-only methods (bytes = one way).
WRITE_ONLY = ("fill_padded", "fill_unpadded", "memset")
TIMERS = ("graph", "cudagraph")
FIELDS = ["T", "H", "Hp", "dtype", "method", "variant", "config", "timer", "round", "us", "bytes", "gbps",
          "copy_us", "pct_of_copy", "launcher_path", "graph_capture_ok"]
PROV_FIELDS = ["source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp"]


def _bits(t):
    return t.contiguous().view(torch.int16)


def _cudart():
    """The CUDA runtime library torch loaded (for ``cudaMemcpy2DAsync``), or None."""
    import ctypes
    import glob
    import os
    import site

    for d in [os.path.dirname(os.path.dirname(torch.__file__))] + site.getsitepackages():
        for f in sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", "libcudart.so*"))
                        + glob.glob(os.path.join(d, "lib", "libcudart.so*"))):
            try:
                return ctypes.CDLL(f)
            except OSError:
                continue
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _memcpy2d(dst, src, H, es):
    """``cudaMemcpy2DAsync`` of ``src [T, H, 576]`` (contiguous) into the first ``H`` heads of ``dst [T, H', 576]``
    on the current stream (device to device: kind 3), or None when no CUDA runtime library is found."""
    import ctypes

    lib = _cudart()
    if lib is None:
        return None
    f = lib.cudaMemcpy2DAsync
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                  ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    width = H * 576 * es

    def run():
        rc = f(dst.data_ptr(), dst.stride(0) * es, src.data_ptr(), src.stride(0) * es, width, src.shape[0], 3,
               torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"cudaMemcpy2DAsync returned {rc}")
    return run


def _methods(T, H, Hp, dtype, device, tune, which="round3"):
    """``(a, b, out, methods)``: the inputs, the padded output and name -> (variant or None, config dict or None,
    callable, the output to check bitwise before timing or None)."""
    a = torch.randn(T, H, 512, device=device, dtype=dtype)
    b = torch.randn(T, H, 64, device=device, dtype=dtype)
    out = torch.empty(T, Hp, 576, device=device, dtype=dtype)
    buf = torch.empty(T, H, 576, device=device, dtype=dtype)
    src = torch.randn(T * H * 576, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    m = {}

    def kern(o, variant, cfg):
        return lambda: concat_mla_q_triton(a, b, o, variant=variant, **cfg)

    if which in ("hints", "hints_clean"):

        def hinted(o, ld, st):
            kernel, grid, args, cx, nw = _plan(a, b, o, zero_padding=False, variant="v2", block_rows=None,
                                               num_warps=None, streaming=False, block_t=None, block_h=None,
                                               head_tiles=None)
            cx = {**cx, "LOAD_EVICT": ld, "STORE_CACHE": st}
            return lambda: kernel[grid](*args, **cx, num_warps=nw)

        m["v2"] = ("v2", {}, kern(out, "v2", {}), out)
        for name, (ld, st) in (HINTS if which == "hints" else HINTS_CLEAN).items():
            m[name] = ("v2", {"load": ld, "store": st}, hinted(out, ld, st), out)
        m["v2_unpadded"] = ("v2", {}, kern(buf, "v2", {}), buf)
        m["copy"] = (None, None, lambda: dst.copy_(src), None)
        return a, b, out, m
    if which == "ceiling":  # the layout's cost with the kernel held fixed (mla_lab.measure.bandwidth)

        cat = torch.cat([a, b], dim=-1).contiguous()
        m["v2"] = ("v2", {}, kern(out, "v2", {}), out)
        m["v2_unpadded"] = ("v2", {}, kern(buf, "v2", {}), buf)
        m["copy1_padded"] = (None, None, lambda: gapped_write(out, H, src=cat), out)
        m["copy1_unpadded"] = (None, None, lambda: gapped_write(buf, H, src=cat), buf)
        m["fill_padded"] = (None, None, lambda: gapped_write(out, H), None)
        m["fill_unpadded"] = (None, None, lambda: gapped_write(buf, H), None)
        m["memset"] = (None, None, lambda: dst.zero_(), None)
        m["copy"] = (None, None, lambda: dst.copy_(src), None)
        return a, b, out, m
    if which == "round4":
        m["v2"] = ("v2", {}, kern(out, "v2", {}), out)
        for name, (variant, cfg) in TUNE4.items():
            m[name] = (variant, cfg, kern(out, variant, cfg), out)
        for v in ("v2", "v4", "v5"):
            m[f"{v}_unpadded"] = (v, {}, kern(buf, v, {}), buf)
        if device == "cuda":
            cat = torch.cat([a, b], dim=-1).contiguous()
            mc = _memcpy2d(out, cat, H, torch.empty((), dtype=dtype).element_size())
            if mc is not None:
                m["memcpy2d"] = (None, None, mc, out)
            else:
                print("memcpy2d: no CUDA runtime library found; row skipped", file=sys.stderr)
        m["copy"] = (None, None, lambda: dst.copy_(src), None)
        return a, b, out, m
    m["v2"] = ("v2", {}, kern(out, "v2", {}), out)
    m["v3"] = ("v3", {}, kern(out, "v3", {}), out)
    for name, (variant, cfg) in (tune.items() if tune else ()):
        m[name] = (variant, cfg, kern(out, variant, cfg), out)
    m["v2_unpadded"] = ("v2", {}, kern(buf, "v2", {}), buf)
    m["v3_unpadded"] = ("v3", {}, kern(buf, "v3", {}), buf)
    m["torch_cat"] = (None, None, lambda: torch.cat([a, b], dim=-1, out=buf), None)
    m["copy"] = (None, None, lambda: dst.copy_(src), None)
    return a, b, out, m


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _check(a, b, o, fn, name, device="cuda"):
    o.fill_(float("nan"))
    fn()
    _sync(device)
    H = a.shape[1]
    ok = torch.equal(_bits(o[:, :H]), _bits(torch.cat([a, b], -1))) and bool(o[:, H:].isnan().all())
    if not ok:
        raise RuntimeError(f"{name}: wrong result at T={a.shape[0]} H={H} H'={o.shape[1]} (bitwise vs torch.cat, "
                           f"padded heads must stay untouched)")


def _time(fn, timer, rep, device="cuda"):
    if device != "cuda":  # CPU smoke run of this script's logic under the Triton interpreter: timings mean nothing

        return median_ms(fn, device="cpu", n_cpu=1)
    if timer == "graph":

        return median_ms(fn, device="cuda", warmup=10, rep=rep, graph=True)
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def bench_concat_variants(T_list=(4096, 16384), H_list=(8, 16), Hp=64, dtype=torch.bfloat16, timers=TIMERS,
                          rounds=3, rep=100, tune=True, device="cuda", which="round3") -> list[dict]:
    """Device time of every method at every shape (see the module docstring); one dict per (shape, method, timer,
    round), microseconds. ``device="cpu"`` is a smoke run of the logic under ``TRITON_INTERPRET=1`` (wall-clock
    timings, meaningless). Raises RuntimeError when a kernel's result is wrong."""
    rows = []
    es = torch.empty((), dtype=dtype).element_size()
    for T in T_list:
        for H in H_list:
            if T * H * 576 * es >= 1.2e9:
                print(f"warning: T={T} H={H}: {T * H * 576 * es / 1e9:.2f} GB one way; a graph-captured copy_ is "
                      f"slow from ~1.2 GB (memcpy node), so pct_of_copy overstates there", file=sys.stderr)
            torch.manual_seed(T * 131 + H)
            a, b, out, methods = _methods(T, H, Hp, dtype, device, TUNE if tune else None, which)
            for name, (_variant, _cfg, fn, o) in methods.items():
                if o is not None:
                    _check(a, b, o, fn, name, device)
            out.copy_(torch.randn_like(out))  # no timed run sees NaN or zeros in the padded heads
            nbytes_rw = 2 * T * H * 576 * es
            names = list(methods)
            for timer in timers:
                times = {n: [] for n in names}
                for r in range(rounds):
                    k = (r * 3) % len(names)
                    for n in names[k:] + names[:k]:
                        times[n].append(_time(methods[n][2], timer, rep, device))
                for n in names:
                    variant, cfg, _, _ = methods[n]
                    nbytes = nbytes_rw // 2 if n in WRITE_ONLY else nbytes_rw
                    for r, ms in enumerate(times[n]):
                        copy_ms = times["copy"][r]
                        rows.append(dict(T=T, H=H, Hp=Hp, dtype=str(dtype).replace("torch.", ""), method=n,
                                         variant=variant or "", config=_cfg_str(variant, cfg), timer=timer,
                                         round=r, us=ms * 1e3, bytes=nbytes, gbps=nbytes / (ms * 1e-3) / 1e9,
                                         copy_us=copy_ms * 1e3, pct_of_copy=100.0 * copy_ms / ms))
                med = {n: statistics.median(x["pct_of_copy"] for x in rows if x["T"] == T and x["H"] == H
                                            and x["timer"] == timer and x["method"] == n)
                       for n in names if n != "copy"}
                top = sorted(med, key=med.get, reverse=True)[:4]
                print(f"T={T:6d} H={H:3d} H'={Hp} [{timer}] % of copy: v2 {med['v2']:.1f}; best "
                      + ", ".join(f"{n} {med[n]:.1f}" for n in top), flush=True)
            del a, b, out, methods
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def _cfg_str(variant, cfg):
    if variant is None:
        return ""
    if variant == "v2":
        return f"block_rows={cfg.get('block_rows', 'default')},num_warps={cfg.get('num_warps', 'default')}"
    return ",".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def host_launch_us(calls=1000, repeats=5, dtype=torch.bfloat16, device="cuda", variants=("v2", "v3")
                   ) -> tuple[list[dict], dict]:
    """Host microseconds per call (T = 16, H = 8 -> 64, eager, back to back), median of ``repeats``; and the
    launcher checks (path; on CUDA, a CUDA-graph capture replays new inputs bitwise). ``device="cpu"``: smoke run
    under the Triton interpreter (no graph check; numbers meaningless)."""
    T, H, Hp = 16, 8, 64
    a = torch.randn(T, H, 512, device=device, dtype=dtype)
    b = torch.randn(T, H, 64, device=device, dtype=dtype)
    out = torch.empty(T, Hp, 576, device=device, dtype=dtype)
    buf = torch.empty(T, H, 576, device=device, dtype=dtype)
    launchers = {v: make_concat_launcher(a, b, out, backend="triton", variant=v) for v in variants}
    jit_launchers = {v: make_concat_launcher(a, b, out, backend="triton", variant=v, force_path="jit")
                     for v in variants}
    fns = {f"concat_mla_q({v}, checked)": (lambda v=v: concat_mla_q(a, b, out, backend="triton", variant=v))
           for v in variants}
    fns.update({f"launcher({v})": launchers[v] for v in variants})
    fns.update({f"launcher({v}, jit path)": jit_launchers[v] for v in variants})
    fns["concat_mla_q_triton(v2, unchecked)"] = lambda: concat_mla_q_triton(a, b, out, variant="v2")
    fns["torch_cat"] = lambda: torch.cat([a, b], dim=-1, out=buf)
    res = {}
    for name, fn in fns.items():
        per = []
        for _ in range(repeats):
            for _ in range(min(50, calls)):
                fn()
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)
            per.append((time.perf_counter() - t0) / calls * 1e6)
        res[name] = statistics.median(per)
    checks = {}
    for v, L in launchers.items():
        checks[f"launcher({v})_path"] = L.path
        if device != "cuda":
            continue
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            L()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            L()
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        checks[f"launcher({v})_graph_capture_ok"] = bool(
            torch.equal(_bits(out[:, :H]), _bits(torch.cat([a, b], -1))) and out[:, H:].isnan().all())
    rows = []
    for n, us in res.items():
        path = cap = ""
        if n in {f"launcher({v})" for v in variants}:
            path, cap = checks[f"{n}_path"], checks.get(f"{n}_graph_capture_ok", "")
        elif "jit path" in n:
            path = jit_launchers[n[len("launcher("):].split(",")[0]].path
        rows.append(dict(T=T, H=H, Hp=Hp, dtype=str(dtype).replace("torch.", ""), method=n, timer="host_per_call",
                         us=us, launcher_path=path, graph_capture_ok=cap))
    return rows, checks


def _positive_ints(name, vals):
    for v in vals:
        if v < 1:
            raise SystemExit(_die(f"--{name} values must be >= 1; got {v}"))
    return vals


def _die(msg):
    print(f"bench_concat_round3: {msg}", file=sys.stderr)
    return 2


def plan_lines(T_list, H_list, Hp, timers, rounds, tune, which="round3", rep=100, host_calls=1000) -> list[str]:
    es = 2
    lines = [f"set {which}; shapes: T {list(T_list)} x H {list(H_list)} -> H'={Hp}, bf16; timers {list(timers)}; "
             f"{rounds} rounds each"]
    if which in ("hints", "hints_clean"):
        names = ["v2"] + list(HINTS if which == "hints" else HINTS_CLEAN) + ["v2_unpadded", "copy"]
    elif which == "ceiling":
        names = ["v2", "v2_unpadded", "copy1_padded", "copy1_unpadded", "fill_padded", "fill_unpadded", "memset",
                 "copy"]
    elif which == "round4":
        names = ["v2"] + list(TUNE4) + ["v2_unpadded", "v4_unpadded", "v5_unpadded", "memcpy2d", "copy"]
    else:
        names = ["v2", "v3"] + (list(TUNE) if tune else []) + ["v2_unpadded", "v3_unpadded", "torch_cat", "copy"]
    lines.append("methods: " + ", ".join(names))
    for T in T_list:
        for H in H_list:
            nbytes = 2 * T * H * 576 * es
            line = (f"  T={T} H={H}: {nbytes / 1e6:.1f} MB moved (read + write); floor at 4256 GB/s "
                    f"(4 GiB copy, docs/perf-notes.md GPU run 2) {nbytes / 4256e9 * 1e6:.1f} us")
            if which == "round3":
                cfg = v3_config(H, H)
                line += (f"; v3 default {cfg['block_t']} tok x {cfg['block_h']} heads x {cfg['head_tiles']} tiles, "
                         f"{cfg['num_warps']} warp(s), {cfg['num_runs']} run(s)/token block")
            lines.append(line)
    n = len(T_list) * len(H_list) * len(names) * len(timers) * rounds
    per = rep / 1e3 + 0.05
    lines.append(f"{n} timings of ~{per:.2f} s each (do_bench budget {rep} ms + capture) plus ~{len(names) - 2} "
                 f"kernel compiles: about {n * per + 30:.0f} s per process, estimated (not measured)")
    hv = {"round3": "v2/v3", "round4": "v2/v4/v5", "ceiling": "v2", "hints": "v2", "hints_clean": "v2"}[which]
    lines.append(f"host launch: T=16 H=8->64, {host_calls} calls back to back, median of 5: concat_mla_q (checked, {hv}), "
                 f"launcher (hot path, {hv}), launcher jit path, concat_mla_q_triton, torch.cat; launcher CUDA-graph "
                 "capture check")
    return lines


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints its usage block first)
        print(f"bench_concat_round3: {message}", file=sys.stderr)
        raise SystemExit(2)


#: One file per method set (``--set``), each with these columns (plus ``series`` where the set has series).
OUTPUTS = {CSV_NAMES[s]: FIELDS for s in SETS}
PROVENANCE = tuple(PROV_FIELDS)
#: (T, H) of the default set
SHAPES = [(T, H) for T in (4096, 16384) for H in (8, 16)]


def main(argv=None) -> int:
    ap = _Parser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="directory for the set's CSV (CSV_NAMES; required unless --dry-run)")
    ap.add_argument("--T", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--H", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--Hp", type=int, default=64, help="padded heads H' (vLLM prefill_padding on sm90: 64)")
    ap.add_argument("--set", dest="which", choices=list(SETS), default="round3",
                    help="round3: v2/v3 and their configs (concat_round3.csv); round4: v4 spans, v5 TMA stores, "
                         "streaming hints, memcpy2d (concat_round4.csv); ceiling: the layout's cost with the kernel "
                         "held fixed, mla_lab.measure.bandwidth (concat_layout_ceiling.csv); hints: load/store cache hints on v2 "
                         "(concat_hints.csv); hints_clean: the same without evict_last (concat_hints_clean.csv)")
    ap.add_argument("--timers", nargs="+", choices=list(TIMERS), default=None,
                    help="default: both for round3, graph (issue 23's timer) for the other sets")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition budget per timing, ms")
    ap.add_argument("--host-calls", type=int, default=1000)
    ap.add_argument("--no-tune", action="store_true", help=f"skip the {len(TUNE)} extra configs of TUNE")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit 0 (no GPU needed)")
    ap.add_argument("--cpu-smoke", action="store_true", help="run the whole script on CPU under TRITON_INTERPRET=1 "
                    "(tests only: tiny shapes, wall-clock numbers that mean nothing, rows marked cpu_smoke)")
    args = ap.parse_args(argv)
    if args.timers is None:
        args.timers = list(TIMERS) if args.which == "round3" else ["graph"]
    csv_name = CSV_NAMES[args.which]
    for name, vals in (("T", args.T), ("H", args.H), ("timers", args.timers)):
        if len(set(vals)) != len(vals):
            return _die(f"--{name} lists a value twice; got {' '.join(map(str, vals))}")
    if args.which == "round4":
        bad = [h for h in args.H if h < 1 or h > 32 or h & (h - 1)]
        if bad:
            return _die(f"--H {bad[0]}: --set round4 runs v5 (TMA stores), which needs a power of two <= 32 real "
                        f"heads; allowed: 1, 2, 4, 8, 16, 32")
    _positive_ints("T", args.T)
    _positive_ints("H", args.H)
    if args.no_tune and args.which != "round3":
        return _die(f"--no-tune applies to --set round3 only (its TUNE configs); got --set {args.which}")
    for name in ("Hp", "rounds", "rep", "host_calls"):
        if getattr(args, name) < 1:
            return _die(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.Hp < max(args.H):
        return _die(f"--Hp must be >= every --H (padded heads >= real heads); got --Hp {args.Hp}, --H {args.H}")
    lines = plan_lines(args.T, args.H, args.Hp, args.timers, args.rounds, not args.no_tune, args.which, args.rep,
                       args.host_calls)
    if args.dry_run:
        print("bench_concat_round3 plan (dry run, nothing timed):")
        print("\n".join(lines))
        print(f"output: {Path(args.out) / csv_name if args.out else '(--out DIR)/' + csv_name}")
        return 0
    if args.out is None:
        return _die("--out DIR is required (or --dry-run)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        return _die(f"--out {args.out}: exists and is not a directory")
    outp = Path(args.out) / csv_name
    if outp.exists():
        with open(outp) as f:
            head = f.readline().strip().split(",")
        if head[: len(FIELDS)] != FIELDS:
            return _die(f"--out: {outp} exists and was not written by this script; not overwriting it")
    device = "cuda"
    if args.cpu_smoke:

        if not triton_interpreting():
            return _die("--cpu-smoke needs TRITON_INTERPRET=1 in the environment")
        device = "cpu"
    elif not torch.cuda.is_available():
        return _die("needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run prints the plan on CPU")

    print("\n".join(lines), flush=True)
    hv = {"round3": ("v2", "v3"), "round4": ("v2", "v4", "v5")}.get(args.which, ("v2",))
    host_rows, checks = host_launch_us(calls=args.host_calls, repeats=1 if args.cpu_smoke else 5, device=device,
                                       variants=hv)
    print("host launch, us per call (T=16, back to back): "
          + ", ".join(f"{r['method']} {r['us']:.1f}" for r in host_rows), flush=True)
    print("launcher checks: " + ", ".join(f"{k}={v}" for k, v in checks.items()), flush=True)
    rows = bench_concat_variants(args.T, args.H, args.Hp, timers=args.timers, rounds=args.rounds, rep=args.rep,
                                 tune=not args.no_tune, device=device, which=args.which)
    prov = provenance("measured")
    if args.cpu_smoke:
        prov["source"] = "cpu_smoke_not_a_measurement"
    outp.parent.mkdir(parents=True, exist_ok=True)
    with open(outp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS + PROV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows + host_rows:
            w.writerow({**{k: "" for k in FIELDS}, **r, **{k: prov.get(k, "none") for k in PROV_FIELDS}})
    for timer in args.timers:
        meths = list(dict.fromkeys(r["method"] for r in rows if r["timer"] == timer))
        print(f"\n[{timer}] % of a copy of the same bytes (median of {args.rounds} rounds); us in brackets")
        print(f"{'method':<14}" + "".join(f"{f'{T}x{H}':>20}" for T in args.T for H in args.H))
        for m in meths:
            cells = []
            for T in args.T:
                for H in args.H:
                    sel = [r for r in rows if r["timer"] == timer and r["method"] == m and r["T"] == T and r["H"] == H]
                    cells.append(f"{statistics.median(r['pct_of_copy'] for r in sel):7.1f}% "
                                 f"({statistics.median(r['us'] for r in sel):8.1f})")
            print(f"{m:<14}" + "".join(f"{c:>20}" for c in cells))
    print(f"\n{prov['device']}, torch {prov['torch']}, triton {prov['triton']}, commit {prov['git_commit']}")
    print(f"wrote {outp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
