"""Measurement on a GPU: the sparse-MLA prefill attention path per strategy, per op and end to end, plus peak memory.

Timing: ``triton.testing.do_bench(..., return_mode="median")`` (CUDA events, warm-up, many repeats). Inputs are
fresh random bf16 tensors (never zeros) shaped as vLLM hands them over: ``ql_nope`` is the transposed output of the
W_UK bmm (``[H, T, 512]`` viewed as ``[T, H, 512]``, head-major strides) and ``q_pe`` a slice of the q_b projection
output (``[T, H, qk_nope_head_dim + 64][..., -64:]``). Causal prompts: the token at position p of its prompt sees
``min(p + 1, topk)`` keys of its own prompt (``topk_length``); indices are random among those keys.

Peak memory: ``torch.cuda.reset_peak_memory_stats`` then ``max_memory_allocated`` minus the bytes allocated before
the call, i.e. what one layer call of the strategy adds on top of its inputs and persistent workspace.

Every row carries :func:`mla_lab.provenance.provenance` ``("measured")`` columns.
"""

from __future__ import annotations

import json
import math

from .arch import detect_arch, get_arch
from .buffers import memory_account, padded_num_heads
from .models import load_model
from .provenance import provenance
from .workload import Step, Workload, schedule

__all__ = ["make_step_inputs", "time_attention_path", "measure_point", "nan_padding_check"]

OPS = ("concat", "pad", "kernel", "out_slice")


def _require_cuda():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measurement needs a CUDA GPU; torch sees none (use device='cpu' for modelled rows)")
    return torch


def make_step_inputs(model, tp: int, step: Step, prompt_len: int, seed: int = 0, full_topk: bool = False,
                     device: str = "cuda"):
    """Random inputs for one step on the GPU: ``ql_nope [T,H,512]``, ``q_pe [T,H,64]`` (strided like vLLM), ``kv
    [s_kv,1,576]`` (one region of ``prompt_len`` keys per prompt in the step), ``indices [T,1,topk]`` int32 and
    ``topk_length [T]`` int32 (``None`` when ``full_topk``: every token uses all topk random keys)."""
    import torch

    if device == "cuda":
        _require_cuda()
    g = torch.Generator(device=device).manual_seed(seed)
    H = model.heads_per_rank(tp)
    T = step.num_tokens
    topk = model.topk
    dev = device
    ql_nope = torch.randn(H, T, model.kv_lora_rank, device=dev, dtype=torch.bfloat16, generator=g).transpose(0, 1)
    q_full = torch.randn(T, H, model.qk_nope_head_dim + model.qk_rope_head_dim, device=dev, dtype=torch.bfloat16,
                         generator=g)
    q_pe = q_full[..., model.qk_nope_head_dim:]
    n_prompts = len(step.chunks)
    s_kv = max(n_prompts * prompt_len, topk)
    kv = torch.randn(s_kv, 1, model.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    pos = torch.cat([torch.arange(s, s + n, device=dev) for _, s, n in step.chunks])
    base = torch.cat([torch.full((n,), j * prompt_len, device=dev) for j, (_, s, n) in enumerate(step.chunks)])
    if full_topk:
        idx = torch.randint(0, s_kv, (T, topk), device=dev, generator=g)
        tl = None
    else:
        visible = pos + 1
        r = torch.rand(T, topk, device=dev, generator=g)
        idx = base[:, None] + (r * visible[:, None]).long()
        tl = torch.clamp(visible, max=topk).to(torch.int32)
    return ql_nope, q_pe, kv, idx.to(torch.int32).view(T, 1, topk), tl


def time_attention_path(model, tp: int, step: Step, prompt_len: int, arch_name: str, full_topk: bool = False,
                        seed: int = 0, device: str = "cuda") -> dict:
    """Median ms per op and per strategy total for one layer call, and peak extra bytes per strategy.

    Returns ``{"unfused": {"concat": ms, "pad": ms, "kernel": ms, "out_slice": ms, "total": ms, "peak_bytes": B},
    "fused": {...}, "kernel_backend": name}``.
    """
    if device == "cuda":
        _require_cuda()
    H = model.heads_per_rank(tp)
    Hp = padded_num_heads(H, arch_name, "bf16")
    T = step.num_tokens
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(model, tp, step, prompt_len, seed, full_topk, device)
    sm_scale = 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)
    res = {name: _time_strategy(name, model, H, Hp, T, arch_name, ql_nope, q_pe, kv, idx, tl, sm_scale, device)
           for name in ("unfused", "fused")}
    from .kernels import last_backend

    res["kernel_backend"] = str(last_backend("sparse_mla_prefill"))
    res["concat_backend"] = str(last_backend("concat_mla_q"))
    return res


def _cpu_median_ms(fn, warmup=0, rep=0, return_mode="median", n: int = 3) -> float:
    """Median wall time (ms) of ``n`` calls: the CPU stand-in for do_bench (dry runs of the benchmark logic only)."""
    import statistics
    import time

    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def _time_strategy(name, model, H, Hp, T, arch_name, ql_nope, q_pe, kv, idx, tl, sm_scale, device="cuda") -> dict:
    """Per-op and end-to-end medians (ms) and the call's peak extra bytes for one strategy (on ``device="cpu"`` a
    dry run: wall-clock medians and no memory statistics)."""
    import torch

    if device == "cuda":
        from triton.testing import do_bench
    else:
        do_bench = _cpu_median_ms

    from .kernels import concat_mla_q, sparse_mla_prefill
    from .strategies import make_strategy

    bench = dict(warmup=25, rep=100, return_mode="median")
    strat = make_strategy(name, num_heads=H, max_num_batched_tokens=T, arch=arch_name, device=device)
    q = strat.workspace.view(T)
    ops = {"concat": do_bench(lambda: concat_mla_q(ql_nope, q_pe, q), **bench)}
    concat_mla_q(ql_nope, q_pe, q)
    qk = q  # fused: the workspace already holds Hp heads

    def pad():
        qp = q.new_zeros((T, Hp, model.head_size))
        qp[:, :H] = q
        return qp

    if name == "unfused" and Hp > H:
        ops["pad"] = do_bench(pad, **bench)
        qk = pad()
    out, _, _ = sparse_mla_prefill(qk, kv, idx, sm_scale, topk_length=tl, actual_num_heads=H)
    ops["kernel"] = do_bench(lambda: sparse_mla_prefill(qk, kv, idx, sm_scale, topk_length=tl, actual_num_heads=H),
                             **bench)
    if Hp > H:
        ops["out_slice"] = do_bench(lambda: out.contiguous(), **bench)
    ops["total"] = do_bench(lambda: strat(ql_nope, q_pe, kv, idx, sm_scale, tl)[0].contiguous(), **bench)
    qk = out = None  # free before the peak-memory call
    ops["workspace_bytes"] = strat.workspace.nbytes
    if device != "cuda":
        ops["peak_bytes"] = None
        return ops
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    o, _ = strat(ql_nope, q_pe, kv, idx, sm_scale, tl)
    o = o.contiguous()
    torch.cuda.synchronize()
    ops["peak_bytes"] = torch.cuda.max_memory_allocated() - before
    return ops


def ttft_with_measured_attention(point: dict, step_attention_ms: list[float], strategy: str,
                                 calibration=None) -> dict:
    """TTFT of a sweep point from the current TTFT model (:func:`mla_lab.ttft.predict_ttft`, default scope) with each
    step's modelled attention path replaced by the measured one.

    Args:
        point: sweep point (model, tp, arch, max_num_batched_tokens, prompt_len, num_prompts, concurrency).
        step_attention_ms: measured attention path per layer for every step, ms (len = number of steps).
        strategy: ``unfused`` | ``fused``.

    Returns ``{"ttft_ms", "ttft_ms_max", "ttft_ms_list", "scope"}`` (scope names the model scope and says the
    attention path is measured).

    Raises:
        ValueError: ``step_attention_ms`` does not have one entry per step.
    """
    from .ttft import predict_ttft

    model = load_model(point["model"])
    wl = Workload(point["prompt_len"], point["num_prompts"], point["concurrency"])
    steps = schedule(wl, point["max_num_batched_tokens"])
    if len(step_attention_ms) != len(steps):
        raise ValueError(f"step_attention_ms has {len(step_attention_ms)} entries; the workload has {len(steps)} "
                         "steps")
    from .sweep import layer_kw

    mod = predict_ttft(model, point["tp"], point["arch"], wl, point["max_num_batched_tokens"], strategy,
                       point.get("kv_cache_dtype", "bf16"), calibration, **layer_kw(point))
    mod_attn = [sum(v for k, v in ops.items() if k in OPS) for ops in _per_step_attention(mod)]
    elapsed, ttfts = 0.0, []
    for st, step_ms, ma, me in zip(steps, mod["step_ms"], mod_attn, step_attention_ms):
        elapsed += step_ms - ma + me * model.num_hidden_layers
        ttfts.extend([elapsed] * len(st.finished_prompts(point["prompt_len"])))
    return {"ttft_ms": sum(ttfts) / len(ttfts), "ttft_ms_max": max(ttfts), "ttft_ms_list": ttfts,
            "scope": f"{mod['scope']} (attention path measured)"}


def recompute_measured_ttft(df, weight_dtype: str | None = None, moe_parallel: str | None = None):
    """Re-derive the TTFT columns of measured sweep rows with the current TTFT model (the measured attention path
    per step, ``attn_path_ms_steps``, stays as measured). ``weight_dtype`` / ``moe_parallel`` set the model's layer
    options for every row (default: the row's own columns, else the sweep defaults); the rows record them. Rows without the per-step list fall back to
    ``attn_path_ms_step0`` only when every step of their workload has the same shape (same chunk positions), else
    they are left unchanged and marked in ``ttft_note``. Returns a new DataFrame."""
    import pandas as pd

    out = df.copy()
    if out.empty or "source" not in out.columns:
        return out
    out["ttft_note"] = out.get("ttft_note", pd.Series([""] * len(out), index=out.index)).fillna("")
    for i, r in out[(out["source"] == "measured") & (out.get("status", "ok") == "ok")].iterrows():
        point = {k: r[k] for k in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "num_prompts",
                                   "concurrency", "kv_cache_dtype")}
        for k in ("tp", "max_num_batched_tokens", "prompt_len", "num_prompts", "concurrency"):
            point[k] = int(point[k])
        for k, v in (("weight_dtype", weight_dtype), ("moe_parallel", moe_parallel)):
            row_v = r.get(k)
            point[k] = v or (row_v if isinstance(row_v, str) and row_v else None)
        from .sweep import layer_kw

        point.update(layer_kw(point))
        out.at[i, "weight_dtype"], out.at[i, "moe_parallel"] = point["weight_dtype"], point["moe_parallel"]
        steps = schedule(Workload(point["prompt_len"], point["num_prompts"], point["concurrency"]),
                         point["max_num_batched_tokens"])
        step0 = r.get("attn_path_ms_step0")
        if isinstance(r.get("attn_path_ms_steps"), str) and r["attn_path_ms_steps"]:
            meas = json.loads(r["attn_path_ms_steps"])
        elif step0 is None or pd.isna(step0):
            out.at[i, "ttft_note"] = "no measured attention path stored: TTFT left as measured then"
            continue
        elif len({_step_signature(s, point["prompt_len"]) for s in steps}) == 1:
            meas = [float(r["attn_path_ms_step0"])] * len(steps)
        else:
            out.at[i, "ttft_note"] = "steps differ and only step 0 was stored: TTFT left as measured then"
            continue
        t = ttft_with_measured_attention(point, meas, r["strategy"])
        out.at[i, "ttft_ms"], out.at[i, "ttft_ms_max"], out.at[i, "ttft_scope"] = t["ttft_ms"], t["ttft_ms_max"], \
            t["scope"]
    meas_rows = out[out["source"] == "measured"]
    for _, g in meas_rows.groupby(["model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype"]):
        base = g[g["strategy"] == "unfused"]["ttft_ms"]
        if len(base) == 1:
            out.loc[g.index, "ttft_change_pct"] = 100.0 * (g["ttft_ms"] - base.iloc[0]) / base.iloc[0]
    return out


def _step_signature(step: Step, prompt_len: int) -> tuple:
    return tuple((s, n) for _, s, n in step.chunks)


def measure_point(point: dict) -> list[dict]:
    """Measured rows (unfused, fused) for one sweep point on the running GPU.

    The attention path is measured for every distinct step of the point's workload (identical steps are measured
    once); TTFT is then the modelled TTFT (:func:`mla_lab.ttft.predict_ttft`, default scope) with its attention-path
    ops replaced by the measured ones (``ttft_scope`` says so).

    Raises:
        RuntimeError: no CUDA GPU; ValueError: the point's arch family differs from the running GPU's.
    """
    _require_cuda()
    gpu = detect_arch()
    arch = get_arch(point["arch"])
    if gpu["prefill_padding"] != arch.prefill_padding:
        raise ValueError(f"arch={point['arch']!r} (prefill_padding {arch.prefill_padding}) cannot be measured on "
                         f"{gpu['device']} (prefill_padding {gpu['prefill_padding']})")
    if point["kv_cache_dtype"] != "bf16":
        raise ValueError(f"kv_cache_dtype={point['kv_cache_dtype']!r}: only the bf16 path is measured")
    model = load_model(point["model"])
    tp, mbt, L = point["tp"], point["max_num_batched_tokens"], point["prompt_len"]
    H = model.heads_per_rank(tp)
    wl = Workload(L, point["num_prompts"], point["concurrency"])
    steps = schedule(wl, mbt)
    cache: dict = {}
    per_step = []
    for st in steps:
        sig = _step_signature(st, L)
        if sig not in cache:
            cache[sig] = time_attention_path(model, tp, st, L, arch.name)
        per_step.append(cache[sig])
    from .sweep import add_ttft_change, memory_columns

    prov = provenance("measured")
    rows = []
    for name in ("unfused", "fused"):
        meas = [m[name]["total"] for m in per_step]
        t = ttft_with_measured_attention(point, meas, name)
        first = per_step[0][name]
        row = memory_columns(point, name)
        row.update(
            ttft_ms=t["ttft_ms"], ttft_ms_max=t["ttft_ms_max"], num_steps=len(steps), ttft_scope=t["scope"],
            attn_path_ms_step0=first["total"], attn_path_ms_steps=json.dumps([round(x, 6) for x in meas]),
            measured_peak_extra_bytes=first["peak_bytes"],
            analytic_peak_extra_bytes=_analytic_call_peak(name, H, mbt, arch, steps[0].num_tokens, model),
            kernel_backend=per_step[0]["kernel_backend"], concat_backend=per_step[0]["concat_backend"],
            **{f"{op}_ms_step0": first.get(op, 0.0) for op in OPS},
        )
        row.update(prov)
        rows.append(row)
    return add_ttft_change(rows)


def _analytic_call_peak(strategy: str, H: int, mbt: int, arch, T: int, model) -> int:
    """Analytic extra bytes of one measured layer call (``out[:, :H].contiguous()`` included) at step size T.

    While the kernel runs, the pad tensor (unfused only) and the kernel's out ``[T,H',d_v]`` bf16, max_logits and lse
    ``[T,H']`` fp32 are alive; the caller drops max_logits and lse, then copies the real heads out of the full
    ``out`` (no copy when ``H' == H``: the slice is the whole, already contiguous tensor). Peak = the larger phase.
    """
    acc = memory_account(strategy, H, mbt, arch, "bf16", num_tokens=T)
    kh = acc.kernel_heads
    during_kernel = acc.step_transient_bytes + acc.kernel_out_bytes
    during_copy = T * kh * model.d_v * 2 + T * H * model.d_v * 2 if kh > H else 0
    return max(during_kernel, during_copy)


def _per_step_attention(mod: dict) -> list[dict]:
    """Per-step attention-path op times from a predict_ttft result (``step_ops_ms`` if the model provides it)."""
    if "step_ops_ms" in mod:
        return mod["step_ops_ms"]
    # older result shape: spread the summed ops evenly over steps of equal size
    n = len(mod["step_ms"])
    tot = sum(mod["step_ms"])
    return [{k: v * (s / tot) for k, v in mod["ops_ms"].items()} for s in mod["step_ms"]] if n else []


def nan_padding_check(model_name: str = "glm-5", tp: int = 8, T: int = 4096, prompt_len: int = 4096,
                      arch_name: str = "hopper") -> dict:
    """Does garbage in the fused workspace's padded heads reach the real heads' output?

    Runs the fused path twice on the same inputs: padded heads filled with NaN, then with zeros; compares the real
    heads' outputs (``nan_in_real_heads``, ``max_abs_diff``). vLLM leaves those heads uninitialized; some vLLM
    variants zero them because the kernel reduces across the head group.
    """
    torch = _require_cuda()
    from .strategies import make_strategy

    model = load_model(model_name)
    H = model.heads_per_rank(tp)
    step = Step([(0, 0, T)])
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(model, tp, step, prompt_len, seed=1)
    sm = 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)
    outs = {}
    for fill in ("nan", "zero", "inf"):
        s = make_strategy("fused", num_heads=H, max_num_batched_tokens=T, arch=arch_name, device="cuda")
        s.workspace.buffer.fill_({"nan": float("nan"), "zero": 0.0, "inf": float("inf")}[fill])
        o, lse = s(ql_nope, q_pe, kv, idx, sm, tl)
        outs[fill] = (o.float().clone(), lse.clone())
    zo, zl = outs["zero"]
    res = {"model": model_name, "tp": tp, "num_heads": H, "T": T}
    for fill in ("nan", "inf"):
        o, lse = outs[fill]
        res[f"{fill}_in_real_heads"] = bool(torch.isnan(o).any().item())
        res[f"{fill}_max_abs_diff"] = float((o - zo).abs().nan_to_num(float("inf")).max().item())
    return res
