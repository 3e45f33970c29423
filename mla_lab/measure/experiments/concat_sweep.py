"""The Q concat into a head-padded workspace over T x H (vLLM PR #53878's ``concat_mla_q``), H' by the rank's
padding rule (:func:`mla_lab.rank.pad_heads`), :func:`mla_lab.measure.timer.median_ms` ``eager`` and ``graph``.
Methods (:func:`_methods`, Triton ones checked bitwise first): the kernel into the padded / an unpadded buffer /
zeroing the padding, ``torch.cat``, two ``copy_``, both on vLLM-strided inputs, a device copy (the ceiling).
``pct_of_copy`` = copy time / method time. Rows: ``concat_bench.csv`` (also a 4 GiB copy's GB/s and the host cost
per call at T 16); parameter ``tune``: ``concat_bench_tune.csv`` (:data:`TUNE_CONFIGS`). Parameters ``tokens``,
``heads``, ``warmup`` / ``rep`` (ms)."""

from __future__ import annotations

import torch

from mla_lab.kernels import concat_mla_q
from mla_lab.kernels.triton_concat import DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS, concat_mla_q_triton
from mla_lab.measure.sink import log
from mla_lab.measure.timer import median_ms
from mla_lab.rank import pad_heads

from .concat_variants import check_concat, concat_tensors, host_us

DEFAULT_T = (1024, 4096, 16384, 32768)
DEFAULT_H = (8, 16, 32, 64, 128)
#: (variant, block_rows, num_warps, streaming): v2 = both loads before the stores; v2s = v2 with streaming hints.
TUNE_CONFIGS = ([("v2", br, nw, False) for br, nw in [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4),
                                                      (8, 8), (16, 4), (16, 8), (32, 8)]]
                + [("v2s", br, 4, True) for br in (4, 8, 16)])
OUTPUTS = {"concat_bench.csv": ["T", "H", "Hp", "dtype", "method", "layout", "timing", "block_rows", "num_warps",
                                "loads_first", "streaming", "ms", "bytes_effective", "bytes_moved", "gbps_effective",
                                "gbps_moved", "copy_gbps_same_bytes", "pct_of_copy", "big_copy_gbps",
                                "predicted_ms_at_big_copy"],
           "concat_bench_tune.csv": ["T", "H", "Hp", "dtype", "variant", "block_rows", "num_warps", "loads_first",
                                     "streaming", "timing", "ms", "bytes_effective", "gbps_effective",
                                     "copy_gbps_same_bytes", "pct_of_copy"]}
SHAPES = [(T, H) for T in DEFAULT_T for H in DEFAULT_H]
_V2 = {"block_rows": DEFAULT_BLOCK_ROWS, "num_warps": DEFAULT_NUM_WARPS, "streaming": False}


def _methods(T, H, Hp) -> tuple:
    """``(a, b, out, {method: (fn, zero_padding, layout, triton config or None)})``, inputs checked first."""
    t = concat_tensors(T, H, Hp)
    a, b, out, buf, src, dst = t.a, t.b, t.out, t.buf, t.src, t.dst
    av = torch.randn(H, T, 512, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    bv = torch.randn(T, H, 256, device="cuda", dtype=torch.bfloat16)[..., 192:]

    def two_copy(x, y):
        out[:, :H, :512].copy_(x)
        out[:, :H, 512:].copy_(y)

    methods = {
        "triton": (lambda: concat_mla_q(a, b, out, backend="triton"), False, "contiguous", _V2),
        "triton_unpadded": (lambda: concat_mla_q(a, b, buf, backend="triton"), False, "contiguous", _V2),
        "triton_zero_pad": (lambda: concat_mla_q(a, b, out, zero_padding=True, backend="triton"), True, "contiguous",
                            _V2),
        "torch_cat": (lambda: torch.cat([a, b], dim=-1, out=buf), False, "contiguous", None),
        "two_copy": (lambda: two_copy(a, b), False, "contiguous", None),
        "triton_vllm_layout": (lambda: concat_mla_q(av, bv, out, backend="triton"), False, "vllm", _V2),
        "two_copy_vllm_layout": (lambda: two_copy(av, bv), False, "vllm", None),
        "d2d_copy": (lambda: dst.copy_(src), False, "contiguous", None),
    }
    for name, x, y, o in (("triton", a, b, out), ("triton_zero_pad", a, b, out), ("triton_unpadded", a, b, buf),
                          ("triton_vllm_layout", av, bv, out)):
        check_concat(x, y, o, methods[name][0], name, zero_padding=methods[name][1])
    out.copy_(torch.randn_like(out))  # no timed run sees zeros or NaN in the padded heads
    return a, b, out, methods


def time_shape(sink, T, H, Hp, s, big_copy_gbps) -> None:
    """Every method at (T, H -> Hp), eager and graph; with ``s["tune"]`` the kernel's configs too."""
    a, b, out, methods = _methods(T, H, Hp)
    eff = 2 * T * H * 576 * 2
    base = {"T": T, "H": H, "Hp": Hp, "dtype": "bfloat16", "bytes_effective": eff}
    for timing in ("eager", "graph"):
        ms = {m: median_ms(v[0], warmup=s["warmup"], rep=s["rep"], graph=timing == "graph") for m, v in methods.items()}
        copy_gbps = eff / (ms["d2d_copy"] * 1e-3) / 1e9
        for m, (_, zp, layout, cfg) in methods.items():
            moved = eff + (T * (Hp - H) * 576 * 2 if zp else 0)
            sink.write("concat_bench.csv", {
                **base, **(cfg or {}), "method": m, "layout": layout, "timing": timing, "ms": ms[m],
                "bytes_moved": moved, "gbps_effective": eff / (ms[m] * 1e-3) / 1e9, "gbps_moved": moved / ms[m] / 1e6,
                "copy_gbps_same_bytes": copy_gbps, "pct_of_copy": 100.0 * ms["d2d_copy"] / ms[m],
                "big_copy_gbps": big_copy_gbps, "predicted_ms_at_big_copy": eff / (big_copy_gbps * 1e9) * 1e3})
        log(f"concat T={T} H={H} H'={Hp} [{timing}] triton {ms['triton'] * 1e3:.1f} us, "
            f"{100.0 * ms['d2d_copy'] / ms['triton']:.1f} % of copy")
    if s["tune"]:
        copy_ms = median_ms(methods["d2d_copy"][0], warmup=s["warmup"], rep=s["rep"], graph=True)
        for name, br, nw, st in TUNE_CONFIGS:
            fn = lambda br=br, nw=nw, st=st: concat_mla_q_triton(a, b, out, block_rows=br, num_warps=nw,  # noqa: E731
                                                                 streaming=st)
            check_concat(a, b, out, fn, name)
            out.copy_(torch.randn_like(out))
            ms = median_ms(fn, warmup=max(5, s["warmup"] // 2), rep=max(20, s["rep"] // 2), graph=True)
            sink.write("concat_bench_tune.csv", {
                **base, "variant": name, "block_rows": br, "num_warps": nw, "streaming": st, "timing": "graph",
                "ms": ms, "gbps_effective": eff / (ms * 1e-3) / 1e9, "copy_gbps_same_bytes": eff / copy_ms / 1e6,
                "pct_of_copy": 100.0 * copy_ms / ms})


def host_launch(sink, H, Hp, big_copy_gbps) -> None:
    """Host microseconds per call at T 16 (back to back, no sync): there the device time is below the host cost."""
    t = concat_tensors(16, H, Hp)
    a, b, out = t.a, t.b, t.out
    fns = {"concat_mla_q(api, triton)": lambda: concat_mla_q(a, b, out, backend="triton"),
           "concat_mla_q_triton(direct)": lambda: concat_mla_q_triton(a, b, out),
           "torch_cat": lambda: torch.cat([a, b], dim=-1, out=t.buf),
           "two_copy": lambda: (out[:, :H, :512].copy_(a), out[:, :H, 512:].copy_(b)),
           "d2d_copy": lambda: t.dst.copy_(t.src)}
    for name, fn in fns.items():
        sink.write("concat_bench.csv", {"T": 16, "H": H, "Hp": Hp, "dtype": "bfloat16", "method": name,
                                        "timing": "host_per_call", "ms": host_us(fn, 2000, 1) * 1e-3,
                                        "big_copy_gbps": big_copy_gbps})


def big_copy_gbps(nbytes: int) -> float:
    """GB/s (read + write) of one device-to-device copy of ``nbytes``: the asymptotic ceiling."""
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    gbps = 2 * nbytes / (median_ms(lambda: dst.copy_(src), warmup=25, rep=200) * 1e-3) / 1e9
    log(f"device-to-device copy of {nbytes / 2**30:.2f} GiB: {gbps:.0f} GB/s (read + write)")
    return gbps


def run(rank, sink, options) -> None:
    s = {"tune": options.param("tune", False), "warmup": options.param("warmup", 25), "rep": options.param("rep", 100)}
    tokens, heads = options.param("tokens", DEFAULT_T), options.param("heads", DEFAULT_H)
    if options.smoke:
        tokens, heads, s["rep"] = (rank.max_num_batched_tokens,), (rank.num_heads,), 20
    big = big_copy_gbps(2**27 if options.smoke else 4 * 2**30)
    host_launch(sink, rank.num_heads, rank.padded_num_heads, big)
    for T in tokens:
        for H in heads:
            time_shape(sink, T, H, pad_heads(H, rank.prefill_padding, rank.kv_cache_dtype), s, big)
            torch.cuda.empty_cache()
