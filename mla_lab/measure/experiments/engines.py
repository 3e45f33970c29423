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
from mla_lab.models import load_model
from mla_lab.paths import REPO_ROOT as REPO

from .engine_presets import (
    D_QK,
    D_V,
    HP,
    PRESET_DOC,
    T0,
    TOPK,
    Kernels,
    Presets,
    _as_tensor,
    _content,
    _sync,
    call_peak,
    log,
    make_pattern,
)

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



def run_presets(sink, kern, dev, dtype, sampler, args, deadline):
    import torch

    from_models = [("glm-5", 8), ("deepseek-v3.2", 8)]
    H_of = {}
    try:

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


#: Files and their row columns (each row also carries :func:`mla_lab.measure.record.bench_provenance`'s columns).
OUTPUTS = {"content.csv": CONTENT_COLS, "presets.csv": PRESET_COLS, "nan.csv": NAN_COLS}
PROVENANCE = ("gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "date_utc")
#: (part, H real heads, T): the content factor's H x T x 3 patterns, the presets of both models at T = 16384.
SHAPES = ([("content", H, T, p) for H in (8, 16, 32) for T in (1024, 4096, 16384)
           for p in ("causal_1024", "causal_8192", "full")]
          + [("presets", m, 16384, label) for m in ("glm-5", "deepseek-v3.2") for label in PRESET_DOC]
          + [("nan", "glm-5", 16384, "nan")])


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
