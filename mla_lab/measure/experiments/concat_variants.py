"""The Q concat into the padded [T, H', 576] workspace (issue 23, rounds 3-4). Parameter ``set`` picks the methods
(:func:`methods`) and the file (:data:`FILES`): ``round3`` (v2, v3, :data:`TUNE`), ``round4`` (v4, v5 and
:data:`TUNE4`; ``memcpy2d``: ``cudaMemcpy2DAsync``), ``ceiling`` (one-source copies and fills,
:mod:`mla_lab.measure.bandwidth`), ``hints`` / ``hints_clean`` (:data:`HINTS`; clean: no evict_last). Every set also
times ``*_unpadded`` (into ``[T, H, 576]``) and ``copy`` (the same bytes); methods writing the workspace are checked
bitwise first (:func:`check_concat`). Bytes ``2 T H 576 2``; ``pct_of_copy`` = copy time / method time. Timers:
``graph`` (:func:`mla_lab.measure.timer.median_ms` ``graph=True``, L2 flushed) and ``cudagraph``
(``do_bench_cudagraph``, no flush); host launch at T 16: :func:`host_launch`. Rows in us.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from types import SimpleNamespace

import torch

from mla_lab.kernels import concat_mla_q, make_concat_launcher
from mla_lab.kernels.triton_concat import _plan, concat_mla_q_triton, v3_config
from mla_lab.measure.bandwidth import gapped_write
from mla_lab.measure.sink import log
from mla_lab.measure.timer import graphed, median_ms

#: Extra configurations into the padded workspace (name -> (variant, knobs)); v3: tile tokens x heads, tiles per
#: program, warps.
TUNE = {"v2:4x1": ("v2", {"block_rows": 4, "num_warps": 1}), **{
    f"v3:{t}x{h}x{n}w{w}": ("v3", {"block_t": t, "block_h": h, "head_tiles": n, "num_warps": w})
    for t, h, n, w in ((1, 2, 4, 1), (1, 2, 1, 1), (1, 4, 2, 1), (1, 4, 4, 2), (1, 8, 1, 2), (1, 8, 2, 4),
                       (2, 8, 1, 4))}}
#: Round 4 (docs/perf-notes.md "Round 4"): v4 rows per chunk, warps, programs per SM; v5 tokens per tile, warps,
#: programs per SM.
TUNE4 = {"v2:stream": ("v2", {"streaming": True}), "v4": ("v4", {}), "v4:stride": ("v4", {"order": "stride"}),
         **{f"v4:{r}r{w}w{p}": ("v4", {"block_rows": r, "num_warps": w, "progs_per_sm": p})
            for r, w, p in ((2, 1, 32), (4, 1, 8), (4, 1, 16), (8, 2, 8), (16, 4, 4))},
         "v4:stream": ("v4", {"streaming": True}), "v5": ("v5", {}),
         **{f"v5:{t}t{w}w{p}": ("v5", {"block_t": t, "num_warps": w, "progs_per_sm": p})
            for t, w, p in ((1, 1, 16), (1, 4, 4), (1, 2, 4), (2, 4, 4))}}
#: v2 cache hints (name -> (load eviction_policy, store cache_modifier)): the last lever on the kernel side, since a
#: one-source copy into this layout loses ~5 % only when its reads and writes mix.
HINTS = {
    "v2:ld_first": ("evict_first", ""), "v2:ld_last": ("evict_last", ""), "v2:st_cs": ("", ".cs"),
    "v2:st_wt": ("", ".wt"), "v2:st_cg": ("", ".cg"), "v2:ld_first_st_wt": ("evict_first", ".wt"),
    "v2:ld_last_st_cs": ("evict_last", ".cs"),
}
FILES = {"round3": "concat_round3.csv", "round4": "concat_round4.csv", "ceiling": "concat_layout_ceiling.csv",
         "hints": "concat_hints.csv", "hints_clean": "concat_hints_clean.csv"}
#: The write-only methods (bytes one way).
WRITE_ONLY = ("fill_padded", "fill_unpadded", "memset")
TIMERS = ("graph", "cudagraph")
FIELDS = ["T", "H", "Hp", "dtype", "method", "variant", "config", "timer", "round", "us", "bytes", "gbps",
          "copy_us", "pct_of_copy", "launcher_path", "graph_capture_ok"]
OUTPUTS = {f: FIELDS for f in FILES.values()}
#: (T, H) on the seed rank (GLM-5 TP 8: the step and a quarter of it, 8 heads and twice as many)
SHAPES = [(T, H) for T in (4096, 16384) for H in (8, 16)]
#: The 4 GiB device copy of docs/perf-notes.md GPU run 2 (read + write, GB/s): the plan's floor, not a measurement.
COPY_GBPS = 4256


def methods(which: str, tune: bool = True) -> list[str]:
    """The methods of set ``which`` in timing order."""
    extra = {"round3": ["v3", *(TUNE if tune else ())], "round4": list(TUNE4),
             "ceiling": ["copy1_padded", "copy1_unpadded", "fill_padded", "fill_unpadded", "memset"],
             "hints": list(HINTS), "hints_clean": [k for k, (ld, _) in HINTS.items() if ld != "evict_last"]}[which]
    unpadded = {"round3": ["v2_unpadded", "v3_unpadded", "torch_cat"],
                "round4": ["v2_unpadded", "v4_unpadded", "v5_unpadded", "memcpy2d"]}.get(which, ["v2_unpadded"])
    if which == "ceiling":
        return ["v2", "v2_unpadded", *extra, "copy"]
    return ["v2", *extra, *unpadded, "copy"]


def settings(rank, options) -> SimpleNamespace:
    """The parameters (``set``, ``tokens``, ``heads``, ``padded_heads`` (the rank's), ``timers``, ``rounds``, ``rep``,
    ``host_calls``, ``tune``) of one run on ``rank``, checked. Raises ValueError: one line naming the parameter, the
    value and what is allowed."""
    T_max, Hp = rank.max_num_batched_tokens, options.param("padded_heads", rank.padded_num_heads)
    s = SimpleNamespace(which=options.param("set", "round3"), Hp=Hp, rounds=options.param("rounds", 3),
                        rep=options.param("rep", 100), host_calls=options.param("host_calls", 1000),
                        tokens=options.param("tokens", tuple(sorted({T_max // 4, T_max}))),
                        heads=options.param("heads", tuple(dict.fromkeys((rank.num_heads,
                                                                          min(2 * rank.num_heads, Hp))))))
    s.timers = options.param("timers", TIMERS if s.which == "round3" else ("graph",))
    s.tune = options.param("tune", s.which == "round3")
    bad = [f"{k}={v}" for k, v in (("tokens", min(s.tokens)), ("heads", min(s.heads)), ("rounds", s.rounds),
                                   ("rep", s.rep), ("host_calls", s.host_calls)) if v < 1]
    bad += [f"timers={t}" for t in s.timers if t not in TIMERS] + [f"heads={h}" for h in s.heads if h > Hp]
    why = {"set": f"; allowed: {', '.join(FILES)}", "tune": ": tune=true applies to set round3 only (its TUNE configs)",
           "bad": f": allowed: integers >= 1, heads <= the padded heads {Hp}, timers of {TIMERS}",
           "v5": ": set round4 runs v5 (TMA stores), which needs a power of two <= 32 real heads; allowed: 1 .. 32"}
    for key, wrong, name in (("set", s.which not in FILES, f"set={s.which!r}"),
                             ("tune", s.tune and s.which != "round3", f"set={s.which}"), ("bad", bad, bad[:1]),
                             ("v5", s.which == "round4" and any(h > 32 or h & (h - 1) for h in s.heads),
                              f"heads={s.heads}")):
        if wrong:
            raise ValueError(f"--param {''.join(name)}{why[key]}")
    s.smoke = options.smoke
    if options.smoke:
        s.tokens, s.heads, s.rounds, s.rep, s.host_calls = s.tokens[:1], s.heads[:1], 1, 20, 100
    return s


def plan(rank, options) -> list[dict]:
    """Per shape: the methods, the bytes moved and the floor at :data:`COPY_GBPS` (an estimate, not a measurement);
    then the host-launch part."""
    s = settings(rank, options)
    out = []
    for T in s.tokens:
        for H in s.heads:
            nbytes = 2 * T * H * 576 * 2
            entry = {"set": s.which, "file": FILES[s.which], "T": T, "H": H, "Hp": s.Hp, "timers": list(s.timers),
                     "rounds": s.rounds, "methods": methods(s.which, s.tune), "mb_moved": round(nbytes / 1e6, 1),
                     "floor_us_at_copy_gbps": round(nbytes / (COPY_GBPS * 1e9) * 1e6, 1)}
            if s.which == "round3":
                entry["v3_default"] = v3_config(H, H)
            out.append(entry)
    return out + [{"host_launch": f"T=16 H={s.heads[0]}->{s.Hp}, {s.host_calls} calls back to back, median of 5"}]


def _cudart():
    """The CUDA runtime library (torch's own first, for ``cudaMemcpy2DAsync``), or None."""
    import glob
    import os

    ours = glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "*", "lib", "libcudart*"))
    for name in sorted(ours) + ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _memcpy2d(dst, src, H):
    """``cudaMemcpy2DAsync`` of ``src [T, H, 576]`` (contiguous) into the first H heads of ``dst [T, H', 576]`` on
    the current stream (device to device), or None without a CUDA runtime library."""
    lib = _cudart()
    if lib is None:
        return None
    f, es = lib.cudaMemcpy2DAsync, dst.element_size()
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                  ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def run():
        rc = f(dst.data_ptr(), dst.stride(0) * es, src.data_ptr(), src.stride(0) * es, H * 576 * es, src.shape[0], 3,
               torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"cudaMemcpy2DAsync returned {rc}")
    return run


def _hinted(t, ld, st):
    kernel, grid, args, cx, nw = _plan(t.a, t.b, t.out, False, "v2", {})
    cx = {**cx, "LOAD_EVICT": ld, "STORE_CACHE": st}
    return lambda: kernel[grid](*args, **cx, num_warps=nw)


def _method(name, t, H):
    """``(variant or None, config or None, fn, the output to check bitwise or None)`` of one method on tensors t."""
    kern = {**{v: (v, {}) for v in ("v2", "v3", "v4", "v5")}, **TUNE, **TUNE4}
    if name in kern or name.endswith("_unpadded") and name[:-9] in kern:
        variant, cfg = kern[name.removesuffix("_unpadded")]
        o = t.buf if name.endswith("_unpadded") else t.out
        return variant, cfg, lambda: concat_mla_q_triton(t.a, t.b, o, variant=variant, **cfg), o
    if name in HINTS:
        ld, st = HINTS[name]
        return "v2", {"load": ld, "store": st}, _hinted(t, ld, st), t.out
    other = {"copy": (lambda: t.dst.copy_(t.src), None), "memset": (lambda: t.dst.zero_(), None),
             "torch_cat": (lambda: torch.cat([t.a, t.b], dim=-1, out=t.buf), None),
             "copy1_padded": (lambda: gapped_write(t.out, H, src=t.cat), t.out),
             "copy1_unpadded": (lambda: gapped_write(t.buf, H, src=t.cat), t.buf),
             "fill_padded": (lambda: gapped_write(t.out, H), None),
             "fill_unpadded": (lambda: gapped_write(t.buf, H), None),
             "memcpy2d": (_memcpy2d(t.out, t.cat, H), t.out)}
    return None, None, *other[name]


def concat_tensors(T, H, Hp) -> SimpleNamespace:
    """Seeded bf16 inputs on CUDA: ``a [T,H,512]``, ``b [T,H,64]``, ``out [T,Hp,576]``, ``buf [T,H,576]``, ``src`` /
    ``dst`` (the same bytes flat), ``cat`` (a and b concatenated, contiguous)."""
    torch.manual_seed(T * 131 + H)
    t = SimpleNamespace(a=torch.randn(T, H, 512, device="cuda", dtype=torch.bfloat16),
                        b=torch.randn(T, H, 64, device="cuda", dtype=torch.bfloat16),
                        out=torch.empty(T, Hp, 576, device="cuda", dtype=torch.bfloat16),
                        buf=torch.empty(T, H, 576, device="cuda", dtype=torch.bfloat16),
                        src=torch.randn(T * H * 576, device="cuda", dtype=torch.bfloat16))
    t.dst, t.cat = torch.empty_like(t.src), torch.cat([t.a, t.b], dim=-1).contiguous()
    return t


def check_concat(a, b, out, fn, name="concat", zero_padding=False) -> None:
    """``fn`` (writing ``a`` and ``b`` into ``out``) bitwise against ``torch.cat`` on a NaN-poisoned ``out``; the
    padded heads must stay NaN (all zero with ``zero_padding``). Raises RuntimeError naming ``name`` and the shape."""
    out.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    H = a.shape[1]
    pad = out[:, H:]
    ok = torch.equal(out[:, :H].contiguous().view(torch.int16), torch.cat([a, b], -1).view(torch.int16))
    ok = ok and bool((pad.view(torch.int16) == 0).all() if zero_padding else pad.isnan().all())
    if not ok:
        raise RuntimeError(f"{name}: wrong result at T={a.shape[0]} H={H} H'={out.shape[1]} (bitwise vs torch.cat; "
                           f"padded heads {'zero' if zero_padding else 'untouched'})")


def _time(fn, timer, rep) -> float:
    if timer == "graph":
        return median_ms(fn, warmup=10, rep=rep, graph=True)
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def _cfg_str(variant, cfg) -> str:
    if variant is None:
        return ""
    if variant == "v2":
        return f"block_rows={cfg.get('block_rows', 'default')},num_warps={cfg.get('num_warps', 'default')}"
    return ",".join(f"{k}={v}" for k, v in cfg.items()) or "default"


def time_shape(s, T, H, sink) -> None:
    """Every method of the set at (T, H): checked, then ``s.rounds`` rotated rounds per timer, one row each."""
    t = concat_tensors(T, H, s.Hp)
    ms = {n: _method(n, t, H) for n in methods(s.which, s.tune)}
    ms = {n: m for n, m in ms.items() if m[2] is not None}  # memcpy2d without a CUDA runtime library
    for n, (_, _, fn, o) in ms.items():
        if o is not None:
            check_concat(t.a, t.b, o, fn, n)
    t.out.copy_(torch.randn_like(t.out))  # no timed call sees NaN or zeros in the padded heads
    names, nbytes = list(ms), 2 * T * H * 576 * 2
    for timer in s.timers:
        times = {n: [] for n in names}
        for r in range(s.rounds):
            for n in names[(r * 3) % len(names):] + names[:(r * 3) % len(names)]:
                times[n].append(_time(ms[n][2], timer, s.rep))
        for n in names:
            b = nbytes // 2 if n in WRITE_ONLY else nbytes
            for r, x in enumerate(times[n]):
                sink.write(FILES[s.which], {
                    "T": T, "H": H, "Hp": s.Hp, "dtype": "bfloat16", "method": n, "variant": ms[n][0] or "",
                    "config": _cfg_str(ms[n][0], ms[n][1]), "timer": timer, "round": r, "us": x * 1e3, "bytes": b,
                    "gbps": b / (x * 1e-3) / 1e9, "copy_us": times["copy"][r] * 1e3,
                    "pct_of_copy": 100.0 * times["copy"][r] / x})
        log(f"concat {s.which} T={T} H={H} [{timer}] % of copy: " + ", ".join(
            f"{n} {100 * statistics.median(times['copy']) / statistics.median(times[n]):.1f}" for n in names[:6]))


def host_us(fn, calls: int, repeats: int = 5) -> float:
    """Host microseconds per call of ``fn``: ``calls`` calls back to back after a warm-up and a sync (perf_counter,
    then a sync), median of ``repeats``."""
    per = []
    for _ in range(repeats):
        for _ in range(min(50, calls)):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(per)


def _graph_ok(launch, t) -> bool:
    """The launcher's CUDA graph (:func:`mla_lab.measure.timer.graphed`), replayed after its inputs changed, writes
    the new result bitwise."""
    replay = graphed(launch)
    t.a.copy_(torch.randn_like(t.a))
    t.b.copy_(torch.randn_like(t.b))
    try:
        check_concat(t.a, t.b, t.out, replay)
        return True
    except RuntimeError:
        return False


def host_launch(s, sink) -> None:
    """The host cost per call of the concat's entry points at T 16 (rows ``timer`` = ``host_per_call``), then the
    hot launchers' CUDA-graph check."""
    H, variants = s.heads[0], {"round3": ("v2", "v3"), "round4": ("v2", "v4", "v5")}.get(s.which, ("v2",))
    t = concat_tensors(16, H, s.Hp)
    fns, launchers = {}, {}
    for v in variants:
        fns[f"concat_mla_q({v}, checked)"] = lambda v=v: concat_mla_q(t.a, t.b, t.out, backend="triton", variant=v)
    for v in variants:
        launchers[f"launcher({v})"] = make_concat_launcher(t.a, t.b, t.out, backend="triton", variant=v)
    for v in variants:
        launchers[f"launcher({v}, jit path)"] = make_concat_launcher(t.a, t.b, t.out, backend="triton", variant=v,
                                                                     force_path="jit")
    fns.update(launchers)
    fns["concat_mla_q_triton(v2, unchecked)"] = lambda: concat_mla_q_triton(t.a, t.b, t.out, variant="v2")
    fns["torch_cat"] = lambda: torch.cat([t.a, t.b], dim=-1, out=t.buf)
    us = {n: host_us(fn, s.host_calls, 1 if s.smoke else 5) for n, fn in fns.items()}
    for name in fns:
        L = launchers.get(name)
        ok = _graph_ok(L, t) if L is not None and "jit" not in name else ""
        sink.write(FILES[s.which], {"T": 16, "H": H, "Hp": s.Hp, "dtype": "bfloat16", "method": name,
                                    "timer": "host_per_call", "us": us[name], "launcher_path": L.path if L else "",
                                    "graph_capture_ok": ok})
    log("host launch, us per call (T=16): " + ", ".join(f"{n} {x:.1f}" for n, x in us.items()))


def run(rank, sink, options) -> None:
    s = settings(rank, options)
    host_launch(s, sink)
    for T in s.tokens:
        for H in s.heads:
            time_shape(s, T, H, sink)
            torch.cuda.empty_cache()
