"""THE row builder: every sweep row, modelled or measured, is made here (and only here).

A row is one (grid point, strategy): the point's parameters, the exact byte accounting of the Q path
(:func:`mla_lab.buffers.memory_account`), the KV-cache budget (:func:`mla_lab.model.memory.memory_tradeoff`),
whether the deployment fits (the point's :class:`~mla_lab.deployment.Deployment`, :func:`point_deployment`), TTFT
(modelled by :func:`mla_lab.model.ttft.predict_ttft`, or with the attention path
measured by :func:`mla_lab.measure.attention.time_attention_path` spliced in), the change against ``unfused``, and
provenance columns (:func:`mla_lab.provenance.provenance`).

The explorer, the report and the sweep all price through :func:`modelled_rows`, so they give the same number.
"""

from __future__ import annotations

import json

from .. import measure
from ..arch import GPUArch, detect_arch, get_arch
from ..buffers import MIB, call_peak_bytes, kv_tokens_lost
from ..deployment import Deployment
from ..measure.timer import summarize
from ..model.calibration import resolve_calibration
from ..model.memory import memory_tradeoff
from ..model.ops import ATTN_OPS
from ..model.routes import step_route
from ..model.timing import kernel_rate_tflops
from ..model.ttft import predict_ttft
from ..models import ModelConfig, model_config_path
from ..paths import calibration_dir, measured_dir, read_measured_csv
from ..placement import BASELINE, LEGACY_MEASURED, expand, expand_strategies, parse_strategy, preset_of
from ..provenance import provenance
from ..workload import schedule

__all__ = ["MEASURED_ROUTE", "measured_withheld", "ONE_PROCESS_COLUMNS", "between_process_changes", "fit_status", "NOT_PRICED", "TTFT_COLUMNS", "MEASURED_MATCH_KEYS", "measured_change_pct", "measured_changes", "layer_options", "memory_columns", "add_ttft_change", "modelled_rows", "measured_rows", "compute_rows",
           "reprice_measured_rows", "point_inputs", "MODES", "LAYER_OPTION_DEFAULTS", "ttft_with_attention",
           "strategy_columns", "point_deployment"]

def time_attention_path(*args, **kwargs):
    """:func:`mla_lab.measure.attention.time_attention_path`; torch is imported on the first measured point, not
    with this module (``mla-lab advise`` and ``sweep --dry-run`` start without it, issue 22)."""
    return measure.attention.time_attention_path(*args, **kwargs)


MODES = ("modelled", "measured")

#: The TTFT model's layer options when a point does not give them (the sweep's defaults: the PR ran
#: GLM-5.2-FP8 with ``-ep``).
LAYER_OPTION_DEFAULTS = {"weight_dtype": "fp8", "moe_parallel": "ep"}


def layer_options(point: dict) -> dict:
    """The TTFT model's layer options of a point (weight dtype, MoE parallelism; :data:`LAYER_OPTION_DEFAULTS` for
    points stored before these existed)."""
    return {k: point.get(k) or v for k, v in LAYER_OPTION_DEFAULTS.items()}


def point_inputs(point: dict) -> list:
    """The input files a point's rows depend on (their contents enter the point key): the model's
    ``config.json`` and every calibration CSV."""
    files = [model_config_path(point["model"])]
    d = calibration_dir()
    if d.is_dir():
        files += sorted(p for p in d.glob("*.csv"))
    return files


def strategy_columns(name: str) -> dict:
    """What a canonical strategy is: its engine preset, placement, padded-head content, zero policy, sub-chunk rows."""
    spec = parse_strategy(name)
    return {"strategy": spec.name, "preset": preset_of(spec.name), "placement": spec.placement,
            "content": spec.content, "zero_policy": spec.zero_policy or "", "subchunk_rows": spec.rows or 0}


def memory_columns(point: dict, strategy: str, model: ModelConfig, arch: GPUArch, cap: dict) -> dict:
    """The columns every row has, modelled or measured: the point's parameters, the strategy, heads per rank,
    the Q path's bytes split into budgeted persistent bytes (they cost KV tokens) and the unbudgeted transient peak
    of one layer call (vLLM's profile run does not run the sparse kernel), the extra persistent bytes against
    :data:`mla_lab.placement.BASELINE` in bytes, MiB and KV-cache tokens lost per rank.

    Raises:
        ValueError: as the model/arch/padding functions (e.g. tp not dividing the heads).
    """
    H = cap["num_heads"]  # the deployment's, checked at its door (memory_tradeoff's num_heads)
    kv = point["kv_cache_dtype"]
    # memory_tradeoff's accounts (the deployment's rank, the strategy's route at this prompt length: dense MHA pads
    # nothing), computed once per strategy there and not again here
    mem, base = cap["accounts"][strategy], cap["accounts"][BASELINE]
    extra = mem.persistent_bytes - base.persistent_bytes
    row = {k: v for k, v in point.items() if k not in ("strategies", "mode")}
    row.update(
        model=model.name, model_family=model.family, model_family_note=model.family_note,
        **strategy_columns(strategy), family=arch.family, sm=arch.sm,
        prefill_padding=arch.prefill_padding, num_heads=H, q_concat_heads=mem.q_concat_heads,
        kernel_heads=mem.kernel_heads, persistent_bytes=mem.persistent_bytes,
        persistent_mib=mem.persistent_bytes / MIB, step_transient_bytes=mem.step_transient_bytes,
        kernel_out_bytes=mem.kernel_out_bytes, call_transient_bytes=mem.call_transient_bytes,
        call_transient_mib=mem.call_transient_bytes / MIB, peak_bytes=mem.peak_bytes,
        extra_persistent_bytes=extra, extra_persistent_mib=extra / MIB,
        kv_tokens_lost=kv_tokens_lost(extra, model, kv), shared_workspace_bytes=cap["shared_workspace_bytes"],
        model_arch=arch.name, status="ok", reason="",
    )
    return row


def _capacity_columns(cap: dict, strategy: str, point: dict) -> dict:
    """KV capacity (never negative) and whether the deployment fits, with the reason when it does not."""
    raw = cap["kv_capacity_tokens"]
    reasons = []
    if raw <= 0:
        reasons.append(f"weights ({cap['weights_bytes'] / 2**30:.1f} GiB per rank) and activations leave no KV "
                       f"cache at gpu_memory_utilization {cap['gpu_memory_utilization']}")
    else:
        need = point["concurrency"] * point["prompt_len"]
        left = raw - cap["strategies"][strategy]["kv_tokens_lost"]
        if point["prompt_len"] > left:
            reasons.append(f"one prompt of {point['prompt_len']} tokens exceeds the KV capacity of {int(left)} tokens")
        elif need > left:
            reasons.append(f"the workload needs {need} KV tokens in flight (concurrency {point['concurrency']} x "
                           f"{point['prompt_len']}); capacity {int(left)}")
    return {"kv_capacity_tokens": max(0.0, raw),
            "kv_capacity_pct_lost": cap["strategies"][strategy]["kv_capacity_pct_lost"] if raw > 0 else float("nan"),
            "weights_bytes_per_rank": cap["weights_bytes"], "fits_in_memory": not reasons,
            "fit_reason": "; ".join(reasons)}


def add_ttft_change(rows: list[dict]) -> list[dict]:
    """Set ``ttft_change_pct`` of every row against the point's :data:`mla_lab.placement.BASELINE` row (in place;
    returns ``rows``)."""
    base = next(r["ttft_ms"] for r in rows if r["strategy"] == BASELINE)
    for r in rows:
        r["ttft_change_pct"] = 100.0 * (r["ttft_ms"] - base) / base
        r["baseline"] = BASELINE
    return rows


def point_deployment(point: dict) -> Deployment:
    """The door for a sweep point: its :class:`~mla_lab.deployment.Deployment` (points stored before
    ``weight_dtype`` / ``moe_parallel`` existed get :data:`LAYER_OPTION_DEFAULTS`, the PR's fp8 / ep).

    Raises:
        ValueError: as :meth:`mla_lab.deployment.Deployment.of`.
    """
    return Deployment.from_point({**point, **layer_options(point)})


def _capacity(point: dict, d: Deployment, names) -> dict:
    return memory_tradeoff(d, strategies=names, shared_workspace_bytes=point.get("shared_workspace_bytes"))


def _content_note(strategy: str, arch: GPUArch, cal) -> str:
    if parse_strategy(strategy).content != "stale":
        return ""
    m = cal.step_content() or cal.content
    if m is None:
        return "stale content not priced: no content-factor fit in data/calibration"
    what = "content over the whole step" if cal.step_content() is not None else "content factor (kernel only)"
    if arch.sm != get_arch(cal.arch).sm:
        return f"{what} measured on an H200 ({m.name}); the {arch.sm} effect is unmeasured"
    return f"{what}: {m.name}"


def modelled_rows(point: dict, calibration=None, deployment: Deployment | None = None) -> list[dict]:
    """Modelled rows (one per strategy, :data:`mla_lab.placement.BASELINE` always first) for one grid point.

    ``deployment``: the point's :class:`~mla_lab.deployment.Deployment` when the caller already holds it (advise,
    the explorer: validated at their door); default :func:`point_deployment` (``point`` then needs the keys
    of :meth:`~mla_lab.deployment.Deployment.from_point`). ``point`` gives ``strategies`` and
    ``shared_workspace_bytes``.

    Raises:
        ValueError: as :meth:`mla_lab.deployment.Deployment.of` and the model/padding functions.
    """
    d = deployment if deployment is not None else point_deployment(point)
    model, arch = d.model, d.arch
    point = {**point, **d.to_point()}
    cal = resolve_calibration(calibration)
    strategies = expand([BASELINE] + list(point["strategies"]))
    names = [st.name for st in strategies]
    prov = provenance("modelled")
    kw = {"weight_dtype": d.weight_dtype, "moe_parallel": d.moe_parallel}
    cap = _capacity(point, d, names)
    rate, rate_source = kernel_rate_tflops(arch, cal)
    rows = []
    for st in strategies:
        s = st.name
        t = predict_ttft(d, st, cal)
        row = memory_columns(point, s, model, arch, cap)
        row.update(
            ttft_ms=t["ttft_ms_mean"], ttft_ms_max=t["ttft_ms_max"], num_steps=t["num_steps"],
            ttft_scope=t["scope"], **{f"{op}_ms": t["ops_ms"].get(op, 0.0) for op in ATTN_OPS},
            calibration=t["calibration"], comm_source=t["comm_source"], kernel_rate_source=rate_source, content_note=_content_note(s, arch, cal),
            **_capacity_columns(cap, s, point), **kw,
        )
        row.update(prov)
        rows.append(row)
    return add_ttft_change(rows)


def _step_signature(step) -> tuple:
    return tuple((s, n) for _, s, n in step.chunks)


def ttft_with_attention(modelled: dict, steps, prompt_len: int, layers: int, attention_ms) -> float:
    """Mean TTFT (ms) of a modelled run with each step's attention path replaced by ``attention_ms[i]`` per layer."""
    elapsed, ttfts = 0.0, []
    for st, step_ms, ops, a in zip(steps, modelled["step_ms"], modelled["step_ops_ms"], attention_ms):
        rest = step_ms - sum(v for k, v in ops.items() if k in ATTN_OPS)
        elapsed += rest + a * layers
        ttfts.extend([elapsed] * len(st.finished_prompts(prompt_len)))
    return sum(ttfts) / len(ttfts)


def measured_rows(point: dict, calibration=None) -> list[dict]:
    """Measured rows for one grid point on the running GPU: every real strategy of the point (and the baseline).

    The attention path is measured for every distinct step of the point's workload (identical steps once),
    ``num_runs`` interleaved rounds per strategy (:func:`mla_lab.measure.attention.time_attention_path`); TTFT is
    the modelled TTFT with each step's attention path replaced by the measured median (``ttft_scope`` says so).
    Each round also gives a TTFT, so rows carry the TTFT's 95 % interval (``ttft_ms_ci_lo/hi``) and the change's
    interval from the rounds paired with the baseline's (``ttft_change_ci_lo/hi``); ``change_measurable`` is False
    when that interval holds 0.

    Raises:
        RuntimeError: no CUDA GPU; ValueError: the point's arch family differs from the running GPU's, or the KV
            cache is not bf16 (only that path is measured).
    """
    gpu = detect_arch()
    d = point_deployment(point)
    model, arch, wl = d.model, d.arch, d.workload
    if gpu["capability"] is None:
        raise RuntimeError("measurement needs a CUDA GPU; torch sees none (use device='cpu' for modelled rows)")
    if gpu["prefill_padding"] != arch.prefill_padding:
        raise ValueError(f"arch={point['arch']!r} (prefill_padding {arch.prefill_padding}) cannot be measured on "
                         f"{gpu['device']} (prefill_padding {gpu['prefill_padding']})")
    if point["kv_cache_dtype"] != "bf16":
        raise ValueError(f"kv_cache_dtype={point['kv_cache_dtype']!r}: only the bf16 path is measured")
    tp, mbt, L = point["tp"], point["max_num_batched_tokens"], point["prompt_len"]
    names = [n for n in expand_strategies([BASELINE] + list(point["strategies"])) if n != "kernel_native"]
    runs = int(point.get("num_runs") or 7)
    H = model.heads_per_rank(tp)
    steps = schedule(wl, mbt)
    cache: dict = {}
    per_step = []
    for st in steps:
        sig = _step_signature(st)
        if sig not in cache:
            cache[sig] = time_attention_path(model, tp, st, L, arch.name, strategies=names, repeats=runs)
        per_step.append(cache[sig])
    prov = provenance("measured")
    kw = {"weight_dtype": d.weight_dtype, "moe_parallel": d.moe_parallel}
    cap = _capacity(point, d, names)
    cal = resolve_calibration(calibration)
    modelled = {n: predict_ttft(d, n, cal) for n in names}
    round_ttft = {n: [ttft_with_attention(modelled[n], steps, L, model.num_hidden_layers,
                                           [m[n]["samples"][r] for m in per_step]) for r in range(runs)]
                  for n in names}
    rows = []
    for name in names:
        medians = [m[name]["total"] for m in per_step]
        ttft = ttft_with_attention(modelled[name], steps, L, model.num_hidden_layers, medians)
        t_ci = summarize(round_ttft[name])
        change = [100.0 * (a - b) / b for a, b in zip(round_ttft[name], round_ttft[BASELINE])]
        c_ci = summarize(change)
        first = per_step[0][name]
        row = memory_columns(point, name, model, arch, cap)
        row.update(
            ttft_ms=ttft, ttft_ms_max=None, num_steps=len(steps),
            ttft_scope=f"{modelled[name]['scope']} (attention path measured)",
            ttft_ms_ci_lo=t_ci["ci_lo"], ttft_ms_ci_hi=t_ci["ci_hi"], ttft_change_ci_lo=c_ci["ci_lo"],
            ttft_change_ci_hi=c_ci["ci_hi"], change_measurable=not (c_ci["ci_lo"] <= 0 <= c_ci["ci_hi"]),
            num_runs=runs, attn_path_ms_step0=first["total"], attn_path_q1_step0=first["q1"],
            attn_path_q3_step0=first["q3"], attn_path_ms_steps=json.dumps([round(x, 6) for x in medians]),
            attn_path_samples_step0=json.dumps([round(x, 6) for x in first["samples"]]),
            measured_peak_extra_bytes=first["peak_bytes"],
            analytic_peak_extra_bytes=call_peak_bytes(name, H, mbt, arch, steps[0].num_tokens, model),
            kernel_backend=per_step[0]["kernel_backend"], concat_backend=per_step[0]["concat_backend"],
            calibration=modelled[name]["calibration"], comm_source=modelled[name]["comm_source"], **_capacity_columns(cap, name, point), **kw,
        )
        row.update(prov)
        rows.append(row)
    return add_ttft_change(rows)


#: Row statuses of a deployment that is not priced: its weights or workload do not fit at all
#: (``does_not_fit``), or it fits with the baseline and not with this strategy (``tips_out``).
NOT_PRICED = ("does_not_fit", "tips_out")
#: The columns a row that is not priced leaves empty (its TTFT; the byte accounting stays: it says why).
TTFT_COLUMNS = ("ttft_ms", "ttft_ms_max", "ttft_change_pct", "ttft_change_ci_lo", "ttft_change_ci_hi",
                "ttft_ms_ci_lo", "ttft_ms_ci_hi", *(f"{op}_ms" for op in ATTN_OPS))


def fit_status(rows: list[dict]) -> list[dict]:
    """The sweep rows' ``status``: where the point's baseline does not fit, every row ``does_not_fit`` (reason: the
    fit reason); where the baseline fits and a strategy does not, that row ``tips_out`` (reason "fits without it,
    not with it: ..."); either way its TTFT columns (:data:`TTFT_COLUMNS`) are None: a deployment that cannot load
    is never priced. In place; returns ``rows``."""
    base = next((r for r in rows if r["strategy"] == BASELINE), None)
    base_fits = base is None or bool(base.get("fits_in_memory", True))
    for r in rows:
        if bool(r.get("fits_in_memory", True)) and base_fits:
            continue
        if base_fits:
            r.update(status="tips_out", reason=f"fits without it, not with it: {r.get('fit_reason', '')}")
        else:
            r.update(status="does_not_fit", reason=str((base or r).get("fit_reason", "")))
        r.update(dict.fromkeys((k for k in TTFT_COLUMNS if k in r), None))
    return rows


def compute_rows(point: dict, mode: str) -> list[dict]:
    """The compute function the executors run: :func:`modelled_rows` or :func:`measured_rows`, with
    :func:`fit_status` (rows of a deployment that does not load carry no TTFT).

    Raises:
        ValueError: unknown mode.
    """
    if mode == "modelled":
        return fit_status(modelled_rows(point))
    if mode == "measured":
        return fit_status(measured_rows(point))
    raise ValueError(f"mode={mode!r} is not known; allowed: {list(MODES)}")


#: The analytic memory columns of a row (:func:`memory_columns`); a measured row's are re-derived with them.
MEMORY_COLUMNS = ("q_concat_heads", "kernel_heads", "persistent_bytes", "persistent_mib", "step_transient_bytes",
                  "kernel_out_bytes", "call_transient_bytes", "call_transient_mib", "peak_bytes",
                  "extra_persistent_bytes", "extra_persistent_mib", "kv_tokens_lost")


#: The route the measured attention path ran (:func:`measured_rows`: FlashMLA's sparse prefill kernel on the padded
#: heads): a measured change stands for a configuration only where it and the baseline take this route.
MEASURED_ROUTE = "sparse-mqa"


def measured_withheld(d: Deployment, strategy: str, fits: dict | None = None) -> str:
    """Why a measured change of ``strategy`` (against :data:`mla_lab.placement.BASELINE`) must not be shown for the
    deployment ``d``: "" when it may. A measured row timed :data:`MEASURED_ROUTE`; where the deployment's route
    (:func:`mla_lab.model.routes.step_route`, every step of its schedule) is another for the strategy or the
    baseline (e.g. DeepSeek-V3.2 at 1024-token prompts: dense MHA, vLLM #47327), the measured kernel does not run
    there; where the deployment or the strategy does not fit (``fits``: ``{strategy: {"fits_in_memory",
    "fit_reason"}}``, as the sweep rows state it), nothing is priced at all (issue 39)."""
    order = tuple(dict.fromkeys((BASELINE, strategy)))  # the deployment's own reason first: one line for all rows
    for s in order:
        if fits and s in fits and not fits[s]["fits_in_memory"]:
            who = "the deployment" if s == BASELINE else strategy
            return f"{who} does not fit ({fits[s]['fit_reason']}): no measured number"
    for s in order:
        routes = {step_route(d.model, s, st) for st in schedule(d.workload, d.max_num_batched_tokens)}
        other = sorted(routes - {MEASURED_ROUTE})
        if other:
            who = f"the baseline ({s})" if s == BASELINE else s
            return (f"{who} takes {', '.join(other)} here, not the measured {MEASURED_ROUTE} kernel: the measured "
                    "change does not apply")
    return ""


def reprice_measured_rows(df, weight_dtype: str | None = None, moe_parallel: str | None = None):
    """Re-derive the TTFT columns of measured rows with the current model (the measured attention path per step,
    ``attn_path_ms_steps``, stays as measured), and their analytic memory columns (:data:`MEMORY_COLUMNS`) with
    the current account, so a measured row states the same bytes as the modelled row of its point. ``weight_dtype`` / ``moe_parallel`` set the layer options for every
    row (default: the row's own columns, else :data:`LAYER_OPTION_DEFAULTS`); the rows record them. Rows without the
    per-step list fall back to ``attn_path_ms_step0`` only when every step of their workload has the same shape,
    else they are left unchanged and marked in ``ttft_note``.

    Rows of the first version (no ``placement`` column) name what was measured then: ``unfused`` was a
    ``new_zeros`` pad per call and ``fused`` a zero-initialised private workspace; they are relabelled
    ``per_call_zeros`` and ``private_workspace`` (``legacy_strategy`` keeps the old name), and their change is
    taken against ``per_call_zeros``, the baseline they were measured with. Returns a new DataFrame."""
    import pandas as pd

    out = df.copy()
    if out.empty or "source" not in out.columns:
        return out
    out["measured_withheld"] = out.get("measured_withheld", pd.Series([""] * len(out), index=out.index))
    out["measured_withheld"] = out["measured_withheld"].fillna("").astype(object)
    out["ttft_note"] = out.get("ttft_note", pd.Series([""] * len(out), index=out.index)).fillna("")
    legacy = out["placement"].isna() if "placement" in out.columns else pd.Series(True, index=out.index)
    if legacy.any():
        out["legacy_strategy"] = out.get("legacy_strategy", pd.Series([""] * len(out), index=out.index))
        old = out.loc[legacy, "strategy"]
        out.loc[legacy, "legacy_strategy"] = old
        out.loc[legacy, "strategy"] = old.map(LEGACY_MEASURED).fillna(old)
        for col, f in (("preset", preset_of), ("placement", lambda n: parse_strategy(n).placement),
                       ("content", lambda n: parse_strategy(n).content)):
            out.loc[legacy, col] = out.loc[legacy, "strategy"].map(f)
        out.loc[legacy, "baseline"] = "per_call_zeros"
    status = out["status"] if "status" in out.columns else "ok"
    ok = out[(out["source"] == "measured") & (status == "ok")]
    pk = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype") if c in ok]
    point_names = {i: sorted(set(g["strategy"])) for _, g in ok.groupby(pk, dropna=False) for i in g.index}
    accounts: dict = {}  # (deployment, shared_workspace_bytes) -> memory_tradeoff, once per point
    for i, r in ok.iterrows():
        point = {k: r[k] for k in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "num_prompts",
                                   "concurrency", "kv_cache_dtype")}
        for k in ("tp", "max_num_batched_tokens", "prompt_len", "num_prompts", "concurrency"):
            point[k] = int(point[k])
        for k, v in (("weight_dtype", weight_dtype), ("moe_parallel", moe_parallel)):
            row_v = r.get(k)
            point[k] = v or (row_v if isinstance(row_v, str) and row_v else None)
        point.update(layer_options(point))
        out.at[i, "weight_dtype"], out.at[i, "moe_parallel"] = point["weight_dtype"], point["moe_parallel"]
        d = point_deployment(point)
        steps = schedule(d.workload, d.max_num_batched_tokens)
        step0 = r.get("attn_path_ms_step0")
        if isinstance(r.get("attn_path_ms_steps"), str) and r["attn_path_ms_steps"]:
            attention_ms = json.loads(r["attn_path_ms_steps"])
        elif step0 is None or pd.isna(step0):
            out.at[i, "ttft_note"] = "no measured attention path stored: TTFT left as measured then"
            continue
        elif len({_step_signature(s) for s in steps}) == 1:
            attention_ms = [float(step0)] * len(steps)
        else:
            out.at[i, "ttft_note"] = "steps differ and only step 0 was stored: TTFT left as measured then"
            continue
        t = predict_ttft(d, r["strategy"], attention_override_ms=attention_ms)
        out.at[i, "ttft_ms"], out.at[i, "ttft_ms_max"], out.at[i, "ttft_scope"] = \
            t["ttft_ms_mean"], t["ttft_ms_max"], t["scope"]
        # the bytes are analytic, never measured: today's account, as the modelled row of the same point states it
        key = (d, r.get("shared_workspace_bytes"))
        if key not in accounts:
            sw = key[1]
            accounts[key] = memory_tradeoff(d, strategies=[BASELINE, *point_names[i]],
                                            shared_workspace_bytes=None if sw is None or pd.isna(sw) else int(sw))
        mem = memory_columns(point, r["strategy"], d.model, d.arch, accounts[key])
        for c in MEMORY_COLUMNS:
            if c in out.columns:
                out.at[i, c] = mem[c]
        fits = {s: _capacity_columns(accounts[key], s, point) for s in {BASELINE, r["strategy"]}}
        out.at[i, "fits_in_memory"] = fits[r["strategy"]]["fits_in_memory"]
        out.at[i, "measured_withheld"] = measured_withheld(d, r["strategy"], fits)
    if "baseline" not in out.columns:
        out["baseline"] = BASELINE
    measured = out[out["source"] == "measured"]
    keys = ["model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "baseline"]
    for _, g in measured.groupby(keys, dropna=False):
        base_name = g["baseline"].iloc[0] if isinstance(g["baseline"].iloc[0], str) else BASELINE
        base = g[g["strategy"] == base_name]["ttft_ms"]
        if len(base) == 1:
            new = 100.0 * (g["ttft_ms"] - base.iloc[0]) / base.iloc[0]
            if "ttft_change_pct" in out.columns:
                # the interval of the paired rounds moves with the re-priced change (its width is the measured
                # one): a median outside its own interval would be a confident wrong number
                old = out.loc[g.index, "ttft_change_pct"]
                shift = (new - old).where(old.notna(), 0.0)
                for c in ("ttft_change_ci_lo", "ttft_change_ci_hi"):
                    if c in out.columns:
                        out.loc[g.index, c] = out.loc[g.index, c] + shift
            out.loc[g.index, "ttft_change_pct"] = new
    _attach_between_process(out)
    return out


#: Where the committed between-process rows measured a row's deployment (median and [min, max] over >= 5 fresh
#: processes), :func:`reprice_measured_rows` writes that change into the row's ``ttft_change_pct`` /
#: ``ttft_change_ci_lo`` / ``ttft_change_ci_hi`` (``measured_basis`` says so) and keeps the sweep's own one-process
#: figures in these columns: every view (heatmap, TP bars, frontier, tables, advise, the explorer) then states one
#: measured change per cell, the seed answer's (issue 39: the heatmap said -1.6 % where the table said -1.8 %).
ONE_PROCESS_COLUMNS = ("one_process_change_pct", "one_process_ci_lo", "one_process_ci_hi")


def _attach_between_process(out) -> None:
    """Put :func:`between_process_changes` into the change columns of the measured rows of each deployment it
    covers; the one-process figures move to :data:`ONE_PROCESS_COLUMNS` (in place)."""
    for c in ONE_PROCESS_COLUMNS:
        out[c] = float("nan")
    out["measured_basis"] = out.get("measured_basis", "")
    out["measured_basis"] = out["measured_basis"].fillna("").astype(object)
    ok = out[(out["source"] == "measured") & (out.get("status", "ok") == "ok")
             & (out["baseline"].fillna(BASELINE) == BASELINE)]  # changes against the same baseline only
    keys = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "num_prompts", "concurrency",
                        "kv_cache_dtype") if c in ok.columns]
    for k, g in ok.groupby(keys, dropna=False):
        point = dict(zip(keys, k)) | {c: g.iloc[0][c] for c in ("weight_dtype", "moe_parallel") if c in g.columns}
        for c in ("tp", "max_num_batched_tokens", "prompt_len", "num_prompts", "concurrency"):
            point[c] = int(point[c])
        try:
            bp = between_process_changes(point_deployment(point), sorted(set(g["strategy"])))
        except ValueError:
            continue
        for i, r in g.iterrows():
            v = bp.get(r["strategy"])
            if v is None:
                out.loc[i, "measured_basis"] = "one process, 95 % interval of its rounds"
                continue
            cols = ["ttft_change_pct", "ttft_change_ci_lo", "ttft_change_ci_hi"]
            out.loc[i, list(ONE_PROCESS_COLUMNS)] = [r.get(c) for c in cols]
            out.loc[i, cols] = [v["median"], v["lo"], v["hi"]]
            out.loc[i, "measured_basis"] = f"{v['n_processes']} fresh processes, [min, max]"


#: The committed between-process rows of the seed attention path (``mla_lab/measure/experiments/presets.py``:
#: GLM-5 TP8 geometry, 16 x 1024-token causal prompts in one 16384-token step, H200, bf16 KV cache).
BETWEEN_PROCESS_PRESETS = ("h200", "between_process", "presets.csv")


#: The same for the strategies timed later through the package (part ``strategies``: the graph2 sub-chunks).
BETWEEN_PROCESS_STRATEGIES = ("h200", "between_process", "strategies.csv")


def _between_process_seed_ms(path=None) -> dict:
    """``{strategy: {process: median ms}}`` of the seed attention path, ``{}`` without the file. ``path``: a path
    or a ``(gpu, folder, file)`` tuple under ``data/measured`` (default :data:`BETWEEN_PROCESS_PRESETS`)."""

    parts = path if isinstance(path, tuple) else BETWEEN_PROCESS_PRESETS
    p = path if (path is not None and not isinstance(path, tuple)) else \
        measured_dir(parts[0]).joinpath(*parts[1:])
    if not p.is_file():
        return {}
    d = read_measured_csv(p)  # whole or refused in one line (issue 32: a cut file moved the figure silently)
    d = d[d["shape"] == "seed"]
    med = d.groupby(["strategy", "process"])["ms"].median()
    return {s: dict(g.droplevel(0).items()) for s, g in med.groupby(level=0)}


def between_process_changes(deployment: Deployment, strategies, path=None) -> dict:
    """The TTFT change against :data:`mla_lab.placement.BASELINE` with the attention path measured in >= 5 fresh
    processes (the rest modelled), for a deployment whose attention step is the one measured (8 heads per rank,
    head_size 576, topk 2048, 16384 batched tokens, 1024-token prompts, an H200, bf16 KV cache).

    Per process: that process's median attention-path ms (interleaved rounds) in every step, the TTFT model
    around it (:func:`mla_lab.model.ttft.predict_ttft` with ``attention_override_ms``), the change against the
    baseline's of the same process; then the median and ``[min, max]`` over processes (the between-process
    interval; :mod:`mla_lab.measure.spread`). Returns ``{strategy name: {"median", "lo", "hi", "n_processes"}}``
    (``{}`` where the deployment is not the measured one or the file is absent)."""
    d = deployment
    m = d.model
    if not (d.num_heads == 8 and m.head_size == 576 and m.topk == 2048 and d.max_num_batched_tokens == 16384
            and d.prompt_len == 1024 and d.arch.name == BETWEEN_PROCESS_PRESETS[0] and d.kv_cache_dtype == "bf16"):
        return {}
    steps = schedule(d.workload, d.max_num_batched_tokens)

    def ttft(name, x):
        return predict_ttft(d, parse_strategy(name), attention_override_ms=[x] * len(steps))["ttft_ms_mean"]

    out = {}
    # a strategy whose route here is not the measured kernel's gets no measured number (issue 39)
    names = [n for n in (s if isinstance(s, str) else s.name for s in strategies) if not measured_withheld(d, n)]
    # each file pairs its strategies with the baseline timed in the same processes; the first file wins
    for f in ([path] if path else [None, BETWEEN_PROCESS_STRATEGIES]):
        ms = _between_process_seed_ms(f)
        if BASELINE not in ms:
            continue
        base = {k: ttft(BASELINE, x) for k, x in ms[BASELINE].items()}
        for name in names:
            if name in out or name not in ms:
                continue
            ch = sorted(100.0 * (ttft(name, x) / base[k] - 1) for k, x in ms[name].items() if k in base)
            if len(ch) < 2:
                continue
            n = len(ch)
            mid = ch[n // 2] if n % 2 else 0.5 * (ch[n // 2 - 1] + ch[n // 2])
            out[name] = {"median": mid, "lo": ch[0], "hi": ch[-1], "n_processes": n}
    return out


#: Columns a measured row must agree on to be shown beside (or spliced into) a deployment's modelled numbers.
MEASURED_MATCH_KEYS = ("model", "tp", "arch", "max_num_batched_tokens", "kv_cache_dtype", "prompt_len",
                       "num_prompts", "concurrency", "weight_dtype", "moe_parallel")


def measured_change_pct(rows, base_rows=None) -> float | None:
    """THE measured TTFT change (%) of one strategy's measured sweep rows against
    :data:`mla_lab.placement.BASELINE`: the median of the rows' ``ttft_change_pct`` (the between-process change
    where >= 5 fresh processes measured the deployment: :func:`reprice_measured_rows`; else each row's change, paired
    with the baseline timed in the same process, in interleaved rounds: :func:`measured_rows`); for rows without
    that column, ``100 * (median ttft_ms / median ttft_ms of base_rows - 1)`` when ``base_rows`` (the baseline's
    measured rows) are given. None for no row. Every view that shows a measured change (the explorer's chart and
    tables, advise, the report's figures) takes it from here, so a chart and the table under it cannot disagree.
    ``rows``, ``base_rows``: DataFrames of measured sweep rows."""
    if not len(rows):
        return None
    if "ttft_change_pct" in rows.columns and rows["ttft_change_pct"].notna().any():
        return float(rows["ttft_change_pct"].dropna().median())
    if base_rows is None or not len(base_rows) or "ttft_ms" not in rows.columns:
        return None
    ms, base = rows["ttft_ms"].dropna(), base_rows["ttft_ms"].dropna()
    return 100.0 * (float(ms.median()) / float(base.median()) - 1) if len(ms) and len(base) else None


def measured_changes(measured, point: dict, keys=MEASURED_MATCH_KEYS) -> dict:
    """The measured rows of ``measured`` (a DataFrame, e.g. :func:`mla_lab.report.data.load_measured`) that agree
    with ``point`` on every ``keys`` column the frame has, ``status`` ok and changes against
    :data:`mla_lab.placement.BASELINE`, per strategy: ``{strategy: {"change_pct": measured_change_pct(rows) (or
    None), "ttft_ms": median ms, "ci_lo", "ci_hi": median of the rows' 95 % interval of the change (or None),
    "n_rows"}}``. ``{}`` when nothing matches."""
    if measured is None or len(measured) == 0 or "strategy" not in measured.columns:
        return {}
    d = measured
    if "status" in d.columns:
        d = d[d["status"].fillna("ok") == "ok"]
    for k in keys:
        if k in d.columns and k in point:
            d = d[d[k].astype(str) == str(point[k])]
    if "baseline" in d.columns:
        d = d[d["baseline"].fillna(BASELINE) == BASELINE]  # changes against the same baseline only
    base = d[d["strategy"] == BASELINE]
    out = {}
    for s, g in d.groupby("strategy"):
        ci = {}
        for c, key in (("ttft_change_ci_lo", "ci_lo"), ("ttft_change_ci_hi", "ci_hi")):
            ci[key] = float(g[c].median()) if c in g.columns and g[c].notna().any() else None
        ms = g["ttft_ms"].dropna() if "ttft_ms" in g.columns else ()
        out[s] = {"change_pct": measured_change_pct(g, base), "ttft_ms": float(ms.median()) if len(ms) else None,
                  **ci, "n_rows": len(g)}
    return out
