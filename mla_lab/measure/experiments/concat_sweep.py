"""Benchmark the Q concat into a head-padded workspace on a CUDA GPU (vLLM PR #53878's concat_mla_q step).

For T x H (H' = padded_num_heads(H, 'hopper')) it times, with :func:`mla_lab.measure.timer.median_ms`
(``triton.testing.do_bench(..., return_mode="median")``: warm-up, L2 cleared before every repetition, CUDA events):

- ``triton``             the lab's Triton kernel into ``out[T, H', 576]`` (real heads only),
- ``triton_unpadded``    the kernel into an unpadded ``[T, H, 576]`` buffer (isolates the gapped-write cost),
- ``triton_zero_pad``    the same kernel also zeroing heads H..H'-1,
- ``torch_cat``          ``torch.cat([ql_nope, q_pe], -1, out=buf)`` into an H-head buffer (vLLM before the PR),
- ``two_copy``           two ``copy_`` into ``out[:, :H, :512]`` and ``out[:, :H, 512:]`` (the padded view),
- ``triton_vllm_layout`` / ``two_copy_vllm_layout``: inputs strided as in vLLM (ql_nope head-major from a bmm,
  q_pe a slice of q ``[T, H, 192 + 64]``),
- ``d2d_copy``           a plain device-to-device copy of the same byte count (the ceiling for this size).

Bytes: ``effective = 2 * T * H * 576 * elem`` (read + write of the real heads); ``moved`` adds the zero writes of
the padded heads for ``triton_zero_pad``. GB/s = bytes / time (1e9); ``pct_of_copy`` = GB/s / d2d_copy GB/s at the
same byte count. Every method is timed twice: ``eager`` (the call as a program makes it; includes the host launch
cost whenever the host is slower than the GPU's L2 clear between repetitions) and ``graph`` (one call captured in a
CUDA graph and replayed, :func:`mla_lab.measure.timer.graphed`: device time). ``--tune`` also sweeps kernel variants
(``TUNE_CONFIGS``) at every shape. (GPU run 1's v1 kernel, load/store/load/store order, is gone from the lab; its A/B
rows stay in ``data/measured/h200/concat_bench_run1_v1*.csv``.)

Inputs are fresh random tensors (never zeros); every Triton variant is checked bitwise against torch.cat on a
NaN-poisoned output before it is timed. Writes a CSV (``--out``, default ``data/measured/h200/concat_bench.csv``)
with :func:`mla_lab.provenance.provenance` ``("measured")`` columns on every row, and prints a pandas table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from mla_lab.buffers import padded_num_heads
from mla_lab.kernels import concat_mla_q
from mla_lab.kernels.triton_concat import DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS, concat_mla_q_triton
from mla_lab.measure.timer import median_ms
from mla_lab.paths import measured_dir
from mla_lab.provenance import provenance

DEFAULT_T = (1024, 4096, 16384, 32768)
DEFAULT_H = (8, 16, 32, 64, 128)
DEVICE = "cuda"  # module-level so a CPU smoke test (Triton interpreter) can swap it
# (variant, block_rows, num_warps, streaming): v2 = both loads before the stores (the kernel), v2s = v2 with streaming
# cache hints.
TUNE_CONFIGS = (
    [("v2", br, nw, False) for br, nw in [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8),
                                          (16, 4), (16, 8), (32, 8)]]
    + [("v2s", br, 4, True) for br in (4, 8, 16)]
)


#: Methods of :func:`bench_shape` that write into the padded workspace (the others: an unpadded buffer, a copy).
_INTO_PADDED = ("triton", "triton_zero_pad", "two_copy", "triton_vllm_layout", "two_copy_vllm_layout")


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _free():
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _bits(t):
    return t.contiguous().view(torch.int16)


def _check(a, b, out, zero_padding, fn):
    out.fill_(float("nan"))
    fn()
    _sync()
    H = a.shape[1]
    ok = torch.equal(_bits(out[:, :H]), _bits(torch.cat([a, b], -1)))
    pad = out[:, H:]
    ok &= bool((_bits(pad) == 0).all()) if zero_padding else bool(pad.isnan().all())
    if not ok:
        raise RuntimeError(f"Triton concat result wrong at T={a.shape[0]} H={H} zero_padding={zero_padding}")


def _median_ms(fn, timing, warmup, rep):
    """Median ms of ``fn``: ``eager`` (the call as a program makes it) or ``graph`` (one call captured in a CUDA
    graph and replayed: device time without the host launch cost, which the eager timing includes whenever the host
    is slower than the L2 clear before each repetition)."""
    return median_ms(fn, device=DEVICE, warmup=warmup, rep=rep, graph=timing == "graph")


def bench_shape(T, H, dtype, warmup, rep, tune, timings=("eager", "graph")):
    Hp = padded_num_heads(H, "hopper")
    dev = DEVICE
    es = torch.empty((), dtype=dtype).element_size()
    a = torch.randn(T, H, 512, device=dev, dtype=dtype)
    b = torch.randn(T, H, 64, device=dev, dtype=dtype)
    out = torch.empty(T, Hp, 576, device=dev, dtype=dtype)
    buf = torch.empty(T, H, 576, device=dev, dtype=dtype)
    av = torch.randn(H, T, 512, device=dev, dtype=dtype).transpose(0, 1)
    bv = torch.randn(T, H, 256, device=dev, dtype=dtype)[..., 192:]
    src = torch.randn(T * H * 576, device=dev, dtype=dtype)
    dst = torch.empty_like(src)

    def two_copy(x, y):
        out[:, :H, :512].copy_(x)
        out[:, :H, 512:].copy_(y)

    v2 = dict(block_rows=DEFAULT_BLOCK_ROWS, num_warps=DEFAULT_NUM_WARPS, streaming=False)
    # name: (fn, writes padding, layout, triton config or None)
    methods = {
        "triton": (lambda: concat_mla_q(a, b, out, backend="triton"), False, "contiguous", v2),
        # same kernel into an unpadded [T, H, 576] buffer: separates the cost of the gapped writes (H of H' heads)
        "triton_unpadded": (lambda: concat_mla_q(a, b, buf, backend="triton"), False, "contiguous", v2),
        "triton_zero_pad": (lambda: concat_mla_q(a, b, out, zero_padding=True, backend="triton"), True,
                            "contiguous", v2),
        "torch_cat": (lambda: torch.cat([a, b], dim=-1, out=buf), False, "contiguous", None),
        "two_copy": (lambda: two_copy(a, b), False, "contiguous", None),
        "triton_vllm_layout": (lambda: concat_mla_q(av, bv, out, backend="triton"), False, "vllm", v2),
        "two_copy_vllm_layout": (lambda: two_copy(av, bv), False, "vllm", None),
        "d2d_copy": (lambda: dst.copy_(src), False, "contiguous", None),
    }
    _check(a, b, out, False, methods["triton"][0])
    _check(a, b, out, True, methods["triton_zero_pad"][0])
    _check(a, b, buf, False, methods["triton_unpadded"][0])
    _check(av, bv, out, False, methods["triton_vllm_layout"][0])
    # fill the padded heads with random data again so no timed run sees zeros there
    out.copy_(torch.randn_like(out))

    eff = 2 * T * H * 576 * es
    rows = []
    for timing in timings:
        times = {m: _median_ms(fn, timing, warmup, rep) for m, (fn, _, _, _) in methods.items()}
        copy_gbps = eff / (times["d2d_copy"] * 1e-3) / 1e9
        for m, (_, zp, layout, cfg) in methods.items():
            ms = times[m]
            moved = eff + (T * (Hp - H) * 576 * es if zp else 0)
            gbps = eff / (ms * 1e-3) / 1e9
            rows.append(dict(
                T=T, H=H, Hp=Hp, dtype=str(dtype).replace("torch.", ""), method=m, layout=layout, timing=timing,
                block_rows=cfg["block_rows"] if cfg else None, num_warps=cfg["num_warps"] if cfg else None,
                streaming=cfg["streaming"] if cfg else None,
                # the padded heads of `out` hold N(0, 1) between timed runs unless the method zeroes them
                content="zeros" if zp else ("stale" if m in _INTO_PADDED else ""),
                ms=ms, bytes_effective=eff, bytes_moved=moved, gbps_effective=gbps,
                gbps_moved=moved / (ms * 1e-3) / 1e9, copy_gbps_same_bytes=copy_gbps,
                pct_of_copy=100.0 * gbps / copy_gbps,
            ))
    tune_rows = []
    if tune:
        copy_ms = _median_ms(methods["d2d_copy"][0], "graph", warmup, rep)
        copy_gbps = eff / (copy_ms * 1e-3) / 1e9
        for name, br, nw, st in TUNE_CONFIGS:
            fn = lambda br=br, nw=nw, st=st: concat_mla_q_triton(  # noqa: E731
                a, b, out, block_rows=br, num_warps=nw, streaming=st)
            _check(a, b, out, False, fn)
            out.copy_(torch.randn_like(out))
            ms = _median_ms(fn, "graph", max(5, warmup // 2), max(20, rep // 2))
            gbps = eff / (ms * 1e-3) / 1e9
            tune_rows.append(dict(T=T, H=H, Hp=Hp, dtype=str(dtype).replace("torch.", ""), variant=name,
                                  block_rows=br, num_warps=nw, streaming=st, timing="graph", content="stale", ms=ms,
                                  bytes_effective=eff, gbps_effective=gbps, copy_gbps_same_bytes=copy_gbps,
                                  pct_of_copy=100.0 * gbps / copy_gbps))
    return rows, tune_rows  # the tensors die with this frame; the caller empties the allocator cache


def host_launch_cost(n=2000):
    """Host microseconds per call, back to back without sync, on a tiny problem (T=16, H=8 -> 64), where the
    device time per call (a few us) is below the host cost, so wall time / n is the host's launch cost."""
    import time

    a = torch.randn(16, 8, 512, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(16, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    out = torch.empty(16, 64, 576, device=DEVICE, dtype=torch.bfloat16)
    buf = torch.empty(16, 8, 576, device=DEVICE, dtype=torch.bfloat16)
    src = torch.randn(16 * 8 * 576, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)

    def two_copy():
        out[:, :8, :512].copy_(a)
        out[:, :8, 512:].copy_(b)

    fns = {
        "concat_mla_q(api, triton)": lambda: concat_mla_q(a, b, out, backend="triton"),
        "concat_mla_q_triton(direct)": lambda: concat_mla_q_triton(a, b, out),
        "torch_cat": lambda: torch.cat([a, b], dim=-1, out=buf),
        "two_copy": two_copy,
        "d2d_copy": lambda: dst.copy_(src),
    }
    res = {}
    for name, fn in fns.items():
        for _ in range(50):
            fn()
        _sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        _sync()
        res[name] = (time.perf_counter() - t0) / n * 1e6
    return res


def big_copy_gbps(nbytes=4 * 1024**3):
    """Bandwidth of one large device-to-device copy (bytes read + written), the asymptotic ceiling."""
    src = torch.randn(nbytes // 2, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device=DEVICE, warmup=25, rep=200)
    return 2 * nbytes / (ms * 1e-3) / 1e9, ms


OUTPUTS = {"concat_bench.csv": ["T", "H", "Hp", "dtype", "method", "layout", "timing", "block_rows", "num_warps",
                                "loads_first", "streaming", "ms", "bytes_effective", "bytes_moved", "gbps_effective",
                                "gbps_moved", "copy_gbps_same_bytes", "pct_of_copy", "big_copy_gbps",
                                "predicted_ms_at_big_copy"],
           "concat_bench_tune.csv": ["T", "H", "Hp", "dtype", "variant", "block_rows", "num_warps", "loads_first",
                                     "streaming", "timing", "ms", "bytes_effective", "gbps_effective",
                                     "copy_gbps_same_bytes", "pct_of_copy"]}
PROVENANCE = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp")
SHAPES = [(T, H) for T in DEFAULT_T for H in DEFAULT_H]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(measured_dir("h200") / "concat_bench.csv"))
    ap.add_argument("--tune-out", default=None, help="CSV for the kernel-variant sweep (with --tune)")
    ap.add_argument("--tune", action="store_true", help="also sweep the Triton kernel's variants (TUNE_CONFIGS) "
                    "per shape, timed through CUDA graphs")
    ap.add_argument("--T", type=int, nargs="+", default=list(DEFAULT_T))
    ap.add_argument("--H", type=int, nargs="+", default=list(DEFAULT_H))
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_concat: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    import pandas as pd

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    ceiling, ceiling_ms = big_copy_gbps()
    _free()
    print(f"device-to-device copy, 4 GiB: {ceiling:.0f} GB/s (read+write), {ceiling_ms:.3f} ms", flush=True)
    host = host_launch_cost()
    print("host launch cost, us per call (T=16, back to back): "
          + ", ".join(f"{k} {v:.1f}" for k, v in host.items()), flush=True)
    rows, tune_rows = [], []
    for T in args.T:
        for H in args.H:
            r, tr = bench_shape(T, H, dtype, args.warmup, args.rep, args.tune)
            _free()
            rows += r
            tune_rows += tr
            msg = []
            for x in r:
                if x["method"] == "triton":
                    msg.append(f"{x['timing']} {x['ms'] * 1e3:7.1f} us {x['gbps_effective']:5.0f} GB/s "
                               f"{x['pct_of_copy']:5.1f}%")
            print(f"T={T:6d} H={H:4d} H'={r[0]['Hp']:4d}  triton: " + " | ".join(msg), flush=True)
    prov = provenance("measured")
    df = pd.DataFrame(rows)
    for name, us_ in host.items():
        df = pd.concat([df, pd.DataFrame([dict(T=16, H=8, Hp=64, dtype="bfloat16", method=name,
                                               timing="host_per_call", ms=us_ * 1e-3)])], ignore_index=True)
    df["big_copy_gbps"] = ceiling
    df["predicted_ms_at_big_copy"] = df["bytes_effective"] / (ceiling * 1e9) * 1e3
    for k, v in prov.items():
        df[k] = v
    outp = Path(args.out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(outp, index=False)
    pd.set_option("display.width", 250)
    if tune_rows:
        tdf = pd.DataFrame(tune_rows)
        for k, v in prov.items():
            tdf[k] = v
        tpath = Path(args.tune_out) if args.tune_out else outp.with_name(outp.stem + "_tune.csv")
        tdf.to_csv(tpath, index=False)
        tdf["cfg"] = (tdf["variant"] + ":" + tdf["block_rows"].astype(str) + "x" + tdf["num_warps"].astype(str))
        piv = tdf.pivot_table(index=["T", "H"], columns="cfg", values="pct_of_copy", sort=False)
        print("\nsweep (CUDA-graph timing), % of the same-byte copy:")
        print(piv.to_string(float_format=lambda x: f"{x:.1f}"))
    main_df = df[df["timing"].isin(["eager", "graph"])]
    for timing in ("graph", "eager"):
        d = main_df[main_df["timing"] == timing]
        us = d.pivot_table(index=["T", "H", "Hp"], columns="method", values="ms", sort=False) * 1e3
        pct = d.pivot_table(index=["T", "H", "Hp"], columns="method", values="pct_of_copy", sort=False)
        print(f"\n[{timing}] median us ({prov['device']}, torch {prov['torch']}, triton {prov['triton']}):")
        print(us.to_string(float_format=lambda x: f"{x:.1f}"))
        print(f"[{timing}] % of a device-to-device copy of the same bytes (effective bytes):")
        print(pct.drop(columns=["d2d_copy"]).to_string(float_format=lambda x: f"{x:.1f}"))
    print(f"\nwrote {outp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
