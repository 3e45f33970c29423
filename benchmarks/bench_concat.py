"""Benchmark the Q concat into a head-padded workspace on a CUDA GPU (vLLM PR #53878's concat_mla_q step).

For T x H (H' = padded_num_heads(H, 'hopper')) it times, with ``triton.testing.do_bench(..., return_mode="median")``
(warm-up, L2 cleared before every repetition, CUDA events):

- ``triton``             the lab's Triton kernel into ``out[T, H', 576]`` (real heads only),
- ``triton_zero_pad``    the same kernel also zeroing heads H..H'-1,
- ``torch_cat``          ``torch.cat([ql_nope, q_pe], -1, out=buf)`` into an H-head buffer (vLLM before the PR),
- ``two_copy``           two ``copy_`` into ``out[:, :H, :512]`` and ``out[:, :H, 512:]`` (the padded view),
- ``triton_vllm_layout`` / ``two_copy_vllm_layout``: inputs strided as in vLLM (ql_nope head-major from a bmm,
  q_pe a slice of q ``[T, H, 192 + 64]``),
- ``d2d_copy``           a plain device-to-device copy of the same byte count (the ceiling for this size).

Bytes: ``effective = 2 * T * H * 576 * elem`` (read + write of the real heads); ``moved`` adds the zero writes of
the padded heads for ``triton_zero_pad``. GB/s = bytes / time (1e9); ``pct_of_copy`` = GB/s / d2d_copy GB/s at the
same byte count. ``--tune`` also sweeps the kernel's (block_rows, num_warps) at every shape.

Inputs are fresh random tensors (never zeros); every Triton variant is checked bitwise against torch.cat on a
NaN-poisoned output before it is timed. Writes a CSV (``--out``, default ``data/measured/h200/concat_bench.csv``)
with :func:`mla_lab.provenance.provenance` ``("measured")`` columns on every row, and prints a pandas table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mla_lab.buffers import padded_num_heads  # noqa: E402
from mla_lab.kernels import concat_mla_q  # noqa: E402
from mla_lab.kernels.triton_concat import DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS, concat_mla_q_triton  # noqa: E402
from mla_lab.provenance import provenance  # noqa: E402

DEFAULT_T = (1024, 4096, 16384, 32768)
DEFAULT_H = (8, 16, 32, 64, 128)
DEVICE = "cuda"  # module-level so a CPU smoke test (Triton interpreter) can swap it
TUNE_CONFIGS = [(br, nw) for br in (4, 8, 16, 32, 64) for nw in (2, 4, 8)]


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


def bench_shape(T, H, dtype, do_bench, warmup, rep, tune):
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

    methods = {
        "triton": (lambda: concat_mla_q(a, b, out, backend="triton"), False, "contiguous"),
        "triton_zero_pad": (lambda: concat_mla_q(a, b, out, zero_padding=True, backend="triton"), True, "contiguous"),
        "torch_cat": (lambda: torch.cat([a, b], dim=-1, out=buf), False, "contiguous"),
        "two_copy": (lambda: two_copy(a, b), False, "contiguous"),
        "triton_vllm_layout": (lambda: concat_mla_q(av, bv, out, backend="triton"), False, "vllm"),
        "two_copy_vllm_layout": (lambda: two_copy(av, bv), False, "vllm"),
        "d2d_copy": (lambda: dst.copy_(src), False, "contiguous"),
    }
    _check(a, b, out, False, methods["triton"][0])
    _check(a, b, out, True, methods["triton_zero_pad"][0])
    _check(av, bv, out, False, methods["triton_vllm_layout"][0])
    # fill the padded heads with random data again so no timed run sees zeros there
    out.copy_(torch.randn_like(out))

    eff = 2 * T * H * 576 * es
    times = {m: do_bench(fn, warmup=warmup, rep=rep, return_mode="median") for m, (fn, _, _) in methods.items()}
    copy_gbps = eff / (times["d2d_copy"] * 1e-3) / 1e9
    rows = []
    for m, (_, zp, layout) in methods.items():
        ms = times[m]
        moved = eff + (T * (Hp - H) * 576 * es if zp else 0)
        gbps = eff / (ms * 1e-3) / 1e9
        rows.append(dict(
            T=T, H=H, Hp=Hp, dtype=str(dtype).replace("torch.", ""), method=m, layout=layout,
            block_rows=DEFAULT_BLOCK_ROWS if m.startswith("triton") else None,
            num_warps=DEFAULT_NUM_WARPS if m.startswith("triton") else None,
            ms=ms, bytes_effective=eff, bytes_moved=moved, gbps_effective=gbps,
            gbps_moved=moved / (ms * 1e-3) / 1e9, copy_gbps_same_bytes=copy_gbps,
            pct_of_copy=100.0 * gbps / copy_gbps,
        ))
    tune_rows = []
    if tune:
        for br, nw in TUNE_CONFIGS:
            fn = lambda br=br, nw=nw: concat_mla_q_triton(a, b, out, block_rows=br, num_warps=nw)  # noqa: E731
            _check(a, b, out, False, fn)
            out.copy_(torch.randn_like(out))
            ms = do_bench(fn, warmup=max(5, warmup // 2), rep=max(20, rep // 2), return_mode="median")
            gbps = eff / (ms * 1e-3) / 1e9
            tune_rows.append(dict(T=T, H=H, Hp=Hp, dtype=str(dtype).replace("torch.", ""), method="triton",
                                  block_rows=br, num_warps=nw, ms=ms, bytes_effective=eff, gbps_effective=gbps,
                                  copy_gbps_same_bytes=copy_gbps, pct_of_copy=100.0 * gbps / copy_gbps))
    return rows, tune_rows  # the tensors die with this frame; the caller empties the allocator cache


def big_copy_gbps(do_bench, nbytes=4 * 1024**3):
    """Bandwidth of one large device-to-device copy (bytes read + written), the asymptotic ceiling."""
    src = torch.randn(nbytes // 2, device=DEVICE, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9, ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "data/measured/h200/concat_bench.csv"))
    ap.add_argument("--tune-out", default=None, help="CSV for the (block_rows, num_warps) sweep (with --tune)")
    ap.add_argument("--tune", action="store_true", help="also sweep the Triton kernel's block shape per shape")
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
    from triton.testing import do_bench

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    ceiling, ceiling_ms = big_copy_gbps(do_bench)
    _free()
    print(f"device-to-device copy, 4 GiB: {ceiling:.0f} GB/s (read+write), {ceiling_ms:.3f} ms", flush=True)
    rows, tune_rows = [], []
    for T in args.T:
        for H in args.H:
            r, tr = bench_shape(T, H, dtype, do_bench, args.warmup, args.rep, args.tune)
            _free()
            rows += r
            tune_rows += tr
            tri = next(x for x in r if x["method"] == "triton")
            print(f"T={T:6d} H={H:4d} H'={tri['Hp']:4d}  triton {tri['ms'] * 1e3:8.1f} us "
                  f"{tri['gbps_effective']:7.0f} GB/s {tri['pct_of_copy']:5.1f}% of copy", flush=True)
    prov = provenance("measured")
    df = pd.DataFrame(rows)
    df["big_copy_gbps"] = ceiling
    df["predicted_ms_at_big_copy"] = df["bytes_effective"] / (ceiling * 1e9) * 1e3
    for k, v in prov.items():
        df[k] = v
    outp = Path(args.out)
    outp.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(outp, index=False)
    if tune_rows:
        tdf = pd.DataFrame(tune_rows)
        for k, v in prov.items():
            tdf[k] = v
        tpath = Path(args.tune_out) if args.tune_out else outp.with_name(outp.stem + "_tune.csv")
        tdf.to_csv(tpath, index=False)
        best = tdf.loc[tdf.groupby(["T", "H"])["ms"].idxmin(), ["T", "H", "block_rows", "num_warps", "gbps_effective",
                                                               "pct_of_copy"]]
        print("\nbest (block_rows, num_warps) per shape:")
        print(best.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    pd.set_option("display.width", 200)
    gb = df.pivot_table(index=["T", "H", "Hp"], columns="method", values="gbps_effective")
    pct = df.pivot_table(index=["T", "H", "Hp"], columns="method", values="pct_of_copy")
    us = df.pivot_table(index=["T", "H", "Hp"], columns="method", values="ms") * 1e3
    print(f"\nmedian time, us ({prov['device']}, torch {prov['torch']}, triton {prov['triton']}):")
    print(us.to_string(float_format=lambda x: f"{x:.1f}"))
    print("\neffective GB/s (real-head bytes read + written):")
    print(gb.to_string(float_format=lambda x: f"{x:.0f}"))
    print("\n% of a device-to-device copy of the same bytes:")
    print(pct.drop(columns=["d2d_copy"]).to_string(float_format=lambda x: f"{x:.1f}"))
    print(f"\nwrote {outp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
