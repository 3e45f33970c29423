"""Round 2, engines: FlashMLA's sparse kernel (:class:`mla_lab.kernels.device.Kernels`, head_size 576, d_v 512,
bf16, sm_scale 576**-0.5) on the rank's padded heads H'. Three parts (:data:`PARTS`), one file each:

1. ``content.csv``: the kernel alone, padded heads zeros vs stale (N(0, 1)), H = the rank's heads x 1, 2, 4, T = the
   step / 4 / 16, patterns ``causal_1024``, ``causal_<T/2>`` (:func:`~.engine_presets.causal_indices`) and
   ``full_<topk>`` (random topk over 2 T keys); modes ``alone`` and ``interleaved`` (an untimed bf16 GEMM [T, 6144] x
   [6144, 4096] after each call); repeats alternate zeros / stale; a row per window (CUDA events per call, NVML).
2. ``presets.csv``: one layer call's attention path per preset (:class:`~.engine_presets.Presets`) per model at the
   seed and full-topk shapes, repeats interleaved: peak memory, persistent bytes, the padded heads' content, the real
   heads' max abs difference against the private zeroed workspace's.
3. ``nan.csv``: padded heads NaN / inf: are the real heads identical to the zero-padded call's?
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mla_lab.kernels import last_backend
from mla_lab.kernels.device import Kernels
from mla_lab.measure.attention import call_peak_bytes
from mla_lab.measure.sink import NvmlSampler, log
from mla_lab.measure.timer import est_ms, timed_window

from ._common import PROMPT, ranks_of
from .engine_presets import D_QK, D_V, PRESET_DOC, Presets, as_tensor, content_of, make_pattern

CONTENT_COLS = ["experiment", "shape_id", "H", "Hp", "T", "pattern", "prompt_len", "s_kv", "topk", "sum_topk",
                "content", "content_fill", "mode", "repeat", "order_in_pair", "n_calls", "ms_median", "ms_mean",
                "ms_p10", "ms_p90", "window_s", "tflops", "gemm_shape", "sm_clock_mhz", "power_w", "temp_c",
                "n_samples", "clock_event_reasons", "power_kind", "out_equal", "kernel_impl", "status"]
PRESET_COLS = ["experiment", "model", "tp", "H", "Hp", "pattern", "T", "s_kv", "sum_topk", "preset", "strategy",
               "content", "S", "n_chunks", "repeat", "order", "n_calls", "ms_median", "ms_mean", "ms_p10", "ms_p90",
               "window_s", "call_peak_bytes", "call_peak_mib", "persistent_bytes", "persistent_mib", "max_abs_diff",
               "bit_identical", "pad_absmax", "sm_clock_mhz", "power_w", "temp_c", "n_samples",
               "clock_event_reasons", "concat_impl", "kernel_impl", "description", "status"]
NAN_COLS = ["experiment", "model", "tp", "H", "Hp", "pattern", "T", "pad_fill", "max_abs_diff", "bit_identical",
            "real_heads_nonfinite", "ms_zeros", "ms_fill", "status"]
OUTPUTS = {"content.csv": CONTENT_COLS, "presets.csv": PRESET_COLS, "nan.csv": NAN_COLS}
#: (part, H or model, T, pattern or preset) on the seed rank (GLM-5 TP 8: 8 of 64 heads, T 16384)
SHAPES = ([("content", H, T, p) for H in (8, 16, 32) for T in (1024, 4096, 16384)
           for p in ("causal_1024", "causal_8192", "full")]
          + [(part, m, 16384, label) for m in ("glm-5", "deepseek-v3.2")
             for part, label in [*(("presets", x) for x in PRESET_DOC), ("nan", "nan")]])
_FILL = "randn N(0,1), same distribution as the real heads and kv (stands for activations)"
_SM = D_QK ** -0.5


def content_shapes(rank, smoke=False):
    """(T, H, pattern) of the content factor (smoke: the step's T, the rank's H); a prompt covering T once."""
    T_max, H, topk = rank.max_num_batched_tokens, rank.num_heads, rank.model.topk
    seen = set()
    for T in (T_max,) if smoke else (T_max, T_max // 4, T_max // 16):
        for h in [x for x in ((H,) if smoke else (H, 2 * H, 4 * H)) if x < rank.padded_num_heads]:
            for pat in (f"causal_{PROMPT}", f"causal_{T_max // 2}", f"full_{topk}"):
                key = (T, h, min(int(pat[7:]), T) if pat.startswith("causal_") else pat)
                if key not in seen:
                    seen.add(key)
                    yield T, h, pat


def _inputs(rank, T, H, pat, gen):
    """(kv, indices, topk_length, q [T, H', 576] with zero padded heads, the pattern's facts) at one shape."""
    s_kv, idx, tl, st, plen = make_pattern(pat, T, "cuda", gen, rank.model.topk, 2 * rank.max_num_batched_tokens)
    kv = torch.randn(s_kv, 1, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(T, rank.padded_num_heads, D_QK, device="cuda", dtype=torch.bfloat16, generator=gen)
    q[:, H:].zero_()
    return kv, idx, tl, q, {"s_kv": s_kv, "sum_topk": st, "prompt_len": plen}


def _content_calls(ctx, rank, T, H, pat, gen):
    """The zeros and stale calls at one shape and the facts (``out_equal``: their real heads agree)."""
    kv, idx, tl, qz, facts = _inputs(rank, T, H, pat, gen)
    qs = qz.clone()
    qs[:, H:].normal_(generator=gen)  # the stale fill: an independent N(0, 1) draw
    calls = {"zeros": lambda: ctx.k.kernel(qz, kv, idx, _SM, tl), "stale": lambda: ctx.k.kernel(qs, kv, idx, _SM, tl)}
    facts["out_equal"] = bool(torch.equal(calls["zeros"]()[:, :H], calls["stale"]()[:, :H]))
    return calls, facts


def _gemm(T, gen, k=6144, n=4096):
    """The untimed bf16 GEMM [T, k] x [k, n] of ``interleaved`` mode, and its shape."""
    a = torch.randn(T, k, device="cuda", dtype=torch.bfloat16, generator=gen) / k ** 0.5
    b, c = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen), torch.empty(
        T, n, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.mm(a, b, out=c), f"[{T},{k}]x[{k},{n}] bf16"


def time_content(ctx, rank, shape_id, T, H, pat, gen) -> None:
    """Zeros against stale padded heads at one shape, both modes, ``ctx.repeats`` alternating pairs."""
    calls, facts = _content_calls(ctx, rank, T, H, pat, gen)
    Hp = rank.padded_num_heads
    n = max(ctx.min_calls, min(ctx.max_calls, int(round(ctx.window_ms / max(est_ms(calls["zeros"]), 1e-3)))))
    gemm, gshape = _gemm(T, gen)
    for mode, after in (("alone", None), ("interleaved", gemm)):
        for f in calls.values():  # a warm-up window per mode and content, untimed
            timed_window(f, max(2, n // 4), sampler=ctx.sampler, after=after)
        for r in range(ctx.repeats):
            for k, content in enumerate(("zeros", "stale") if r % 2 == 0 else ("stale", "zeros")):
                res = timed_window(calls[content], n, sampler=ctx.sampler, after=after)
                ctx.sink.write("content.csv", {
                    "experiment": "content_factor", "shape_id": shape_id, "H": H, "Hp": Hp, "T": T,
                    "pattern": pat, "topk": rank.model.topk, **facts, "content": content,
                    "content_fill": "zeros" if content == "zeros" else _FILL, "mode": mode, "repeat": r,
                    "order_in_pair": k, **res, "tflops": 2 * facts["sum_topk"] * Hp * (D_QK + D_V) / (
                        res["ms_median"] * 1e9), "gemm_shape": gshape if after else "",
                    "power_kind": ctx.sampler.power_kind, "kernel_impl": ctx.k.kernel_impl, "status": "ok"})
    log(f"content T={T} H={H} {pat}: n={n}, real heads equal={facts['out_equal']}")


def part_content(ctx, rank) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for shape_id, (T, H, pat) in enumerate(content_shapes(rank, ctx.smoke), 1):
        time_content(ctx, rank, shape_id, T, H, pat, gen)
        torch.cuda.empty_cache()


def _built(ctx, P, name, S, ref) -> dict:
    """One preset built and checked against ``ref``: its call, prep, window size and row."""
    fn, prep, pers, _, nch, strategy = P.build(name, S)
    if prep:
        prep()
    chk: dict = {}
    r = as_tensor(fn(chk))
    torch.cuda.synchronize()
    diff, ident = float((r.float() - ref.float()).abs().max()), bool(torch.equal(r, ref))
    del r
    if prep:
        prep()
    peak = call_peak_bytes(fn) if torch.cuda.is_available() else ""
    n = max(3, min(60, int(round(ctx.preset_window_ms / max(est_ms(fn, k=2), 1e-3)))))
    impls = ((ctx.k.concat_impl, ctx.k.kernel_impl) if strategy is None else
             (f"mla_lab.kernels.concat_mla_q({last_backend('concat_mla_q')})",
              f"mla_lab.kernels.sparse_mla_prefill({last_backend('sparse_mla_prefill')})"))
    return {"fn": fn, "prep": prep, "n": n, "row": {
        "preset": name, "strategy": strategy.name if strategy else "", "content": content_of(name, strategy),
        "S": S or "", "n_chunks": nch, "call_peak_bytes": peak,
        "call_peak_mib": round(peak / 2**20, 2) if peak != "" else "", "persistent_bytes": pers,
        "persistent_mib": round(pers / 2**20, 2), "max_abs_diff": diff, "bit_identical": ident,
        "concat_impl": impls[0], "kernel_impl": impls[1], "description": PRESET_DOC[name]}}


def preset_names(T, smoke=False) -> list[tuple]:
    """(preset, S) at T tokens: six fixed presets, sub-chunks of T / 16 .. T rows (smoke: T / 2, T), views, two
    streams at T / 8 and T / 4."""
    sub_S = [T // 2, T] if smoke else [T // 16, T // 8, T // 4, T // 2, T]
    return [(n, None) for n in list(PRESET_DOC)[:6]] + [("subchunk", S) for S in sub_S] + [
        ("subchunk_views", S) for S in sub_S] + [("subchunk_2stream", S) for S in sub_S[1:3]]


def part_presets(ctx, rank) -> None:
    T = rank.max_num_batched_tokens
    names = preset_names(T, ctx.smoke)
    gen = torch.Generator(device="cuda").manual_seed(99)
    for pname, pat in (("seed", f"causal_{PROMPT}"), ("full", f"full_{rank.model.topk}")):
        P = Presets(rank, "cuda", torch.bfloat16, T, pat, gen, rank.model.topk, 2 * T)
        ref = P.build("private_workspace_zeros")[0]().clone()
        built = {key: _built(ctx, P, *key, ref) for key in names}
        base = {"experiment": "preset", "model": rank.model.name, "tp": rank.tp, "H": P.H, "Hp": P.Hp,
                "pattern": pname, "T": T, "s_kv": P.s_kv, "sum_topk": P.sum_topk}
        for r in range(ctx.preset_repeats):
            rot = names[r % len(names):] + names[:r % len(names)]
            for o, key in enumerate(rot[::-1] if r % 2 else rot):
                b = built[key]
                if b["prep"]:
                    b["prep"]()
                b["fn"]()  # a warm-up call after the prep (allocator blocks, clocks)
                res = timed_window(b["fn"], b["n"], sampler=ctx.sampler)
                chk: dict = {}
                b["fn"](chk)
                ctx.sink.write("presets.csv", {**base, **b["row"], "repeat": r, "order": o, **res,
                                               "pad_absmax": chk.get("pad_absmax", ""), "status": "ok"})
        log(f"presets {rank.model.name} {pname}: max_abs_diff {max(b['row']['max_abs_diff'] for b in built.values())}")
        del P, built, ref
        torch.cuda.empty_cache()


def part_nan(ctx, rank) -> None:
    T, H, Hp = rank.max_num_batched_tokens, rank.num_heads, rank.padded_num_heads
    gen = torch.Generator(device="cuda").manual_seed(7)
    pat = f"causal_{PROMPT}"
    kv, idx, tl, q, _ = _inputs(rank, T, H, pat, gen)
    call = lambda: ctx.k.kernel(q, kv, idx, _SM, tl)  # noqa: E731
    ref, ms_zeros = call()[:, :H].clone(), est_ms(call)
    for fill in ("nan", "inf"):
        q[:, H:] = float(fill)
        o = call()[:, :H]
        torch.cuda.synchronize()
        d = float((o.float() - ref.float()).abs().max())
        ctx.sink.write("nan.csv", {"experiment": "nan_padding", "model": rank.model.name, "tp": rank.tp, "H": H,
                                   "Hp": Hp, "pattern": pat, "T": T, "pad_fill": fill, "max_abs_diff": d,
                                   "bit_identical": bool(torch.equal(o, ref)), "ms_zeros": ms_zeros,
                                   "real_heads_nonfinite": int((~torch.isfinite(o)).sum()), "ms_fill": est_ms(call),
                                   "status": "ok"})
        log(f"nan check {rank.model.name} {fill}: max_abs_diff {d}, identical {bool(torch.equal(o, ref))}")


PARTS = {"nan": part_nan, "presets": part_presets, "content": part_content}
#: The parts run once per model (GLM-5, DeepSeek-V3.2); the content factor sweeps H on the rank's padding.
PER_MODEL = ("nan", "presets")


def run(rank, sink, options) -> None:
    """Every part of :data:`PARTS` in order; parameters ``repeats`` (5), ``window_ms`` (120)."""
    smoke = options.smoke
    with NvmlSampler(0.02) as sampler:
        ctx = SimpleNamespace(sink=sink, k=Kernels("cuda"), sampler=sampler, smoke=smoke, min_calls=5, max_calls=300,
                              repeats=2 if smoke else options.param("repeats", 5), preset_repeats=2 if smoke else 7,
                              window_ms=5.0 if smoke else options.param("window_ms", 120.0),
                              preset_window_ms=5.0 if smoke else 50.0)
        ranks = [rank] if smoke else ranks_of(rank, ("glm-5", "deepseek-v3.2"))
        for part, fn in PARTS.items():
            for r in ranks if part in PER_MODEL else [rank]:
                fn(ctx, r)
            log(f"engines: {part} done")
