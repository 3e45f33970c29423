"""THE row builder: :func:`price` turns one checked :class:`~mla_lab.deployment.Deployment` and its strategies into
typed :class:`Row` s (one memory account, :func:`mla_lab.model.memory.memory_tradeoff`; TTFT from
:func:`mla_lab.model.ttft.predict_ttft`). Point dicts live only at the sweep's door (:func:`modelled_rows`,
:func:`measured_rows` write :meth:`Row.to_point` plus provenance); :func:`reprice_measured_rows` re-derives stored
measured rows with today's model.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from .. import measure
from ..arch import GPUArch, detect_arch, get_arch
from ..buffers import MIB, MemoryAccount, call_peak_bytes
from ..deployment import SEED_ARGS, Deployment
from ..measure.timer import summarize
from ..model.calibration import resolve_calibration
from ..model.memory import memory_tradeoff
from ..model.ops import ATTN_OPS
from ..model.route_ops import step_route
from ..model.timing import kernel_rate_tflops
from ..model.ttft import predict_ttft
from ..models import model_config_path
from ..paths import calibration_dir, measured_dir, read_measured_csv
from ..placement import BASELINE, LEGACY_MEASURED, Strategy, as_strategy, expand, parse_strategy, preset_of
from ..provenance import provenance
from ..workload import schedule

MODES = ("modelled", "measured")
NAN = float("nan")
_BASE = parse_strategy(BASELINE)


@dataclass
class Row:
    """One (deployment, strategy), priced (bytes and KV tokens per rank, ms). ``memory``: the Q path's bytes on its
    route (:class:`~mla_lab.buffers.MemoryAccount`); ``extra_persistent_bytes`` / ``kv_tokens_lost``: over the
    baseline's; ``kv_capacity_pct_lost`` nan at no capacity; ``fit_reason``: why it does not fit; ``ops_ms``: attention
    ms per op; ``notes``: more columns (kernel-rate source, content note; a measured row's intervals and backends).
    """

    deployment: Deployment
    strategy: Strategy
    memory: MemoryAccount
    extra_persistent_bytes: int
    kv_tokens_lost: float
    kv_capacity_tokens: float
    kv_capacity_pct_lost: float
    weights_bytes_per_rank: int
    shared_workspace_bytes: int
    fits_in_memory: bool
    fit_reason: str
    ttft_ms: float | None = None
    ttft_ms_max: float | None = None
    num_steps: int = 0
    ttft_scope: str = ""
    calibration: str = ""
    comm_source: str = ""
    ops_ms: dict = field(default_factory=dict)
    ttft_change_pct: float = NAN
    source: str = "modelled"
    notes: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The canonical strategy name."""
        return self.strategy.name

    @property
    def extra_persistent_mib(self) -> float:
        return self.extra_persistent_bytes / MIB

    def columns(self) -> dict:
        """The row's own columns (the deployment's are :meth:`to_point`'s)."""
        d, st, m = self.deployment, self.strategy, self.memory
        return {"model_family": d.model.family, "model_family_note": d.model.family_note, "strategy": st.name,
            "preset": preset_of(st.name), "placement": st.placement, "content": st.content,
            "zero_policy": st.zero_policy or "", "subchunk_rows": st.rows or 0, "family": d.arch.family,
            "sm": d.arch.sm, "prefill_padding": d.arch.prefill_padding, "num_heads": d.num_heads,
            **{k: getattr(m, k) for k in ("q_concat_heads", "kernel_heads", "persistent_bytes")},
            "persistent_mib": m.persistent_bytes / MIB, "step_transient_bytes": m.step_transient_bytes,
            "kernel_out_bytes": m.kernel_out_bytes, "call_transient_bytes": m.call_transient_bytes,
            "call_transient_mib": m.call_transient_bytes / MIB, "peak_bytes": m.peak_bytes,
            "extra_persistent_bytes": self.extra_persistent_bytes, "extra_persistent_mib": self.extra_persistent_mib,
            "kv_tokens_lost": self.kv_tokens_lost, "shared_workspace_bytes": self.shared_workspace_bytes,
            "model_arch": d.arch.name, "status": "ok", "reason": "",
            **{k: getattr(self, k) for k in ("ttft_ms", "ttft_ms_max", "num_steps", "ttft_scope")},
            **{f"{op}_ms": v for op, v in self.ops_ms.items()},
            "calibration": self.calibration, "comm_source": self.comm_source, **self.notes,
            **{k: getattr(self, k) for k in ("kv_capacity_tokens", "kv_capacity_pct_lost", "weights_bytes_per_rank",
                                             "fits_in_memory", "fit_reason", "ttft_change_pct")},
            "baseline": BASELINE}

    def to_point(self, **extra) -> dict:
        """The row as one flat record, as the store and the CSV hold it: the deployment's sweep point
        (:meth:`~mla_lab.deployment.Deployment.to_point`, ``extra`` added) and :meth:`columns`."""
        return {**self.deployment.to_point(**extra), **self.columns()}


def _row(d: Deployment, st: Strategy, mem: dict, **ttft) -> Row:
    """A :class:`Row` of ``st`` from the deployment's memory account ``mem`` (:func:`memory_tradeoff` holding
    ``st`` and the baseline), with the TTFT fields ``ttft``."""
    cost, cap = mem["strategies"][st.name], mem["kv_capacity_tokens"]
    lost = cost["kv_tokens_lost"]
    if cap <= 0:
        reason = (f"weights ({mem['weights_bytes'] / 2**30:.1f} GiB per rank) and activations leave no KV cache at "
                  f"gpu_memory_utilization {mem['gpu_memory_utilization']}")
    elif d.prompt_len > cap - lost:
        reason = f"one prompt of {d.prompt_len} tokens exceeds the KV capacity of {int(cap - lost)} tokens"
    elif d.concurrency * d.prompt_len > cap - lost:
        reason = (f"the workload needs {d.concurrency * d.prompt_len} KV tokens in flight (concurrency "
                  f"{d.concurrency} x {d.prompt_len}); capacity {int(cap - lost)}")
    else:
        reason = ""
    return Row(d, st, mem["accounts"][st.name], cost["extra_bytes"], lost, cap,
               cost["kv_capacity_pct_lost"] if cap > 0 else NAN, mem["weights_bytes"], mem["shared_workspace_bytes"],
               not reason, reason, **ttft)


def _with_change(rows: list[Row]) -> list[Row]:
    """Set every row's ``ttft_change_pct`` against the baseline's row (in place; returns ``rows``)."""
    base = next(r.ttft_ms for r in rows if r.name == BASELINE)
    for r in rows:
        r.ttft_change_pct = 100.0 * (r.ttft_ms - base) / base
    return rows


def _content_note(st: Strategy, arch: GPUArch, cal) -> str:
    if st.content != "stale":
        return ""
    m = cal.step_content() or cal.content
    if m is None:
        return "stale content not priced: no content-factor fit in data/calibration"
    what = "content over the whole step" if cal.step_content() is not None else "content factor (kernel only)"
    if arch.sm != get_arch(cal.arch).sm:
        return f"{what} measured on an H200 ({m.name}); the {arch.sm} effect is unmeasured"
    return f"{what}: {m.name}"


def price(deployment: Deployment, strategies, *, calibration=None, memory: dict | None = None) -> list[Row]:
    """Modelled rows of one deployment: the baseline first, then ``strategies`` (door names or
    :class:`~mla_lab.placement.Strategy`, parsed once here), each with its memory account, fit and TTFT. ``memory``:
    the deployment's ``memory_tradeoff`` of every strategy, when the caller has it. ValueError: an unknown strategy.
    """
    d, cal = deployment, resolve_calibration(calibration)
    sts = expand(strategies)
    sts = [_BASE, *(st for st in sts if st.name != BASELINE)]
    mem = memory if memory is not None else memory_tradeoff(d, strategies=sts)
    notes = {"kernel_rate_source": kernel_rate_tflops(d.arch, cal)[1]}
    rows = []
    for st in sts:
        t = predict_ttft(d, st, cal)
        rows.append(_row(d, st, mem, ttft_ms=t["ttft_ms_mean"], ttft_ms_max=t["ttft_ms_max"],
                         num_steps=t["num_steps"], ttft_scope=t["scope"], calibration=t["calibration"],
                         comm_source=t["comm_source"], ops_ms={op: t["ops_ms"].get(op, 0.0) for op in ATTN_OPS},
                         notes={**notes, "content_note": _content_note(st, d.arch, cal)}))
    return _with_change(rows)


def point_inputs(point: dict) -> list:
    """The input files a point's rows depend on (their contents enter the point key): the model's
    ``config.json`` and every calibration CSV."""
    d = calibration_dir()
    return [model_config_path(point["model"]), *(sorted(d.glob("*.csv")) if d.is_dir() else [])]


def _write(rows: list[Row], source: str, **extra) -> list[dict]:
    """The rows as the store holds them: :meth:`Row.to_point` (``extra`` point keys) and the provenance columns."""
    prov = provenance(source)
    return [{**r.to_point(**extra), **prov} for r in rows]


def _point_memory(d: Deployment, point: dict, names) -> dict:
    return memory_tradeoff(d, strategies=names, shared_workspace_bytes=point.get("shared_workspace_bytes"))


def modelled_rows(point: dict, calibration=None) -> list[dict]:
    """The sweep's modelled rows of one grid point (:func:`mla_lab.sweep.params.expand_grid`'s keys), as written:
    :meth:`~mla_lab.deployment.Deployment.from_point`, then :func:`price` (ValueError as both).
    """
    d = Deployment.from_point(point)
    sts = expand([BASELINE, *point["strategies"]])
    rows = price(d, sts, calibration=calibration, memory=_point_memory(d, point, sts))
    return _write(rows, "modelled", **{k: point[k] for k in ("num_runs",) if k in point})


def ttft_with_attention(modelled: dict, steps, prompt_len: int, layers: int, attention_ms) -> float:
    """Mean TTFT (ms) of a modelled run with each step's attention path replaced by ``attention_ms[i]`` per layer."""
    elapsed, ttfts = 0.0, []
    for st, step_ms, ops, a in zip(steps, modelled["step_ms"], modelled["step_ops_ms"], attention_ms):
        elapsed += step_ms - sum(v for k, v in ops.items() if k in ATTN_OPS) + a * layers
        ttfts.extend([elapsed] * len(st.finished_prompts(prompt_len)))
    return sum(ttfts) / len(ttfts)


def _check_measurable(d: Deployment) -> None:
    gpu = detect_arch()
    if gpu["capability"] is None:
        raise RuntimeError("measurement needs a CUDA GPU; torch sees none (use device='cpu' for modelled rows)")
    if gpu["prefill_padding"] != d.arch.prefill_padding:
        raise ValueError(f"arch={d.arch.name!r} (prefill_padding {d.arch.prefill_padding}) cannot be measured on "
                         f"{gpu['device']} (prefill_padding {gpu['prefill_padding']})")
    if d.kv_cache_dtype != "bf16":
        raise ValueError(f"kv_cache_dtype={d.kv_cache_dtype!r}: only the bf16 path is measured")


def _time_steps(d: Deployment, steps, names: list[str], runs: int) -> list[dict]:
    """The attention path timed per step (identical steps once; :func:`mla_lab.measure.attention.time_attention_path`,
    torch imported on the first measured point: ``mla-lab advise`` and ``sweep --dry-run`` start without it)."""
    cache: dict = {}
    for st in steps:
        sig = tuple((s, n) for _, s, n in st.chunks)
        if sig not in cache:
            cache[sig] = measure.attention.time_attention_path(d.rank, st, d.prompt_len, strategies=names, repeats=runs)
    return [cache[tuple((s, n) for _, s, n in st.chunks)] for st in steps]


def _measured_notes(d: Deployment, name: str, steps, per_step, rounds: dict, runs: int) -> dict:
    t_ci = summarize(rounds[name])
    c_ci = summarize([100.0 * (a - b) / b for a, b in zip(rounds[name], rounds[BASELINE])])
    first = per_step[0][name]
    return {"ttft_ms_ci_lo": t_ci["ci_lo"], "ttft_ms_ci_hi": t_ci["ci_hi"], "ttft_change_ci_lo": c_ci["ci_lo"],
            "ttft_change_ci_hi": c_ci["ci_hi"], "change_measurable": not (c_ci["ci_lo"] <= 0 <= c_ci["ci_hi"]),
            "attn_path_ms_step0": first["total"], "attn_path_q1_step0": first["q1"], "attn_path_q3_step0": first["q3"],
            "attn_path_ms_steps": json.dumps([round(m[name]["total"], 6) for m in per_step]),
            "attn_path_samples_step0": json.dumps([round(x, 6) for x in first["samples"]]),
            "measured_peak_extra_bytes": first["peak_bytes"],
            "analytic_peak_extra_bytes": call_peak_bytes(name, d.num_heads, d.max_num_batched_tokens, d.arch,
                                                         steps[0].num_tokens, d.model),
            "kernel_backend": per_step[0]["kernel_backend"], "concat_backend": per_step[0]["concat_backend"]}


def measured_rows(point: dict, calibration=None) -> list[dict]:
    """Measured rows of one grid point on the running GPU (every real strategy and the baseline): the attention path
    timed per distinct step in ``num_runs`` interleaved rounds (:func:`_time_steps`), spliced into the modelled
    TTFT, with the 95 % intervals of TTFT and of the change paired with the baseline's rounds. Raises RuntimeError (no
    CUDA GPU) or ValueError (an arch family other than the GPU's; a KV cache other than bf16).
    """
    d = Deployment.from_point(point)
    _check_measurable(d)
    sts = [s for s in expand([BASELINE, *point["strategies"]]) if s.padded]  # runs on tensors (PaddedQPath)
    names, runs = [s.name for s in sts], int(point.get("num_runs") or 7)
    steps = schedule(d.workload, d.max_num_batched_tokens)
    per_step = _time_steps(d, steps, names, runs)
    mem = _point_memory(d, point, sts)
    cal = resolve_calibration(calibration)
    layers = d.model.num_hidden_layers
    modelled = {n: predict_ttft(d, n, cal) for n in names}
    rounds = {n: [ttft_with_attention(modelled[n], steps, d.prompt_len, layers, [m[n]["samples"][r] for m in per_step])
                  for r in range(runs)] for n in names}
    rows = [_row(d, st, mem, ttft_ms=ttft_with_attention(modelled[st.name], steps, d.prompt_len, layers,
                                                         [m[st.name]["total"] for m in per_step]),
                 num_steps=len(steps), ttft_scope=f"{modelled[st.name]['scope']} (attention path measured)",
                 calibration=modelled[st.name]["calibration"], comm_source=modelled[st.name]["comm_source"],
                 source="measured", notes=_measured_notes(d, st.name, steps, per_step, rounds, runs))
            for st in sts]
    return _write(_with_change(rows), "measured", num_runs=runs)


#: Row statuses of a deployment that is not priced: its weights or workload do not fit at all
#: (``does_not_fit``), or it fits with the baseline and not with this strategy (``tips_out``).
NOT_PRICED = ("does_not_fit", "tips_out")
#: The columns a row that is not priced leaves empty (its TTFT; the byte accounting stays: it says why).
TTFT_COLUMNS = ("ttft_ms", "ttft_ms_max", "ttft_change_pct", "ttft_change_ci_lo", "ttft_change_ci_hi",
                "ttft_ms_ci_lo", "ttft_ms_ci_hi", *(f"{op}_ms" for op in ATTN_OPS))


def fit_status(rows: list[dict]) -> list[dict]:
    """Set each row's ``status`` in place (returns ``rows``): ``does_not_fit`` for all when the baseline does not fit,
    ``tips_out`` for a strategy that alone does not; either way its :data:`TTFT_COLUMNS` are None (never priced).
    """
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
    """The executors' compute function: :func:`modelled_rows` or :func:`measured_rows` (``mode``; else ValueError),
    then :func:`fit_status`.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not known; allowed: {list(MODES)}")
    return fit_status(modelled_rows(point) if mode == "modelled" else measured_rows(point))


#: The analytic memory columns of a row; a measured row's are re-derived with them.
MEMORY_COLUMNS = ("q_concat_heads", "kernel_heads", "persistent_bytes", "persistent_mib", "step_transient_bytes",
                  "kernel_out_bytes", "call_transient_bytes", "call_transient_mib", "peak_bytes",
                  "extra_persistent_bytes", "extra_persistent_mib", "kv_tokens_lost")
#: The route the measured attention path ran (:func:`measured_rows`: FlashMLA's sparse prefill kernel on the padded
#: heads): a measured change stands for a configuration only where it and the baseline take this route.
MEASURED_ROUTE = "sparse-mqa"


def measured_withheld(d: Deployment, strategy: Strategy | str, fits: dict | None = None) -> str:
    """Why a measured change of ``strategy`` must not be shown for ``d`` ("" when it may): the deployment's route
    (:func:`mla_lab.model.route_ops.step_route`, every step) is not :data:`MEASURED_ROUTE` for it or the baseline
    (e.g. DeepSeek-V3.2 at 1024-token prompts: dense MHA, vLLM #47327), or it does not fit (``fits``: name -> Row;
    issue 39).
    """
    st = as_strategy(strategy)
    order = (_BASE, st) if st.name != BASELINE else (_BASE,)  # the deployment's own reason first: one line for all
    for s in order:
        if fits and s.name in fits and not fits[s.name].fits_in_memory:
            who = "the deployment" if s.name == BASELINE else st.name
            return f"{who} does not fit ({fits[s.name].fit_reason}): no measured number"
    steps = schedule(d.workload, d.max_num_batched_tokens)
    for s in order:
        other = sorted({step_route(d.model, s, step) for step in steps} - {MEASURED_ROUTE})
        if other:
            who = f"the baseline ({s.name})" if s.name == BASELINE else s.name
            return (f"{who} takes {', '.join(other)} here, not the measured {MEASURED_ROUTE} kernel: the measured "
                    "change does not apply")
    return ""


_POINT_INTS = ("tp", "max_num_batched_tokens", "prompt_len", "num_prompts", "concurrency")


def _stored_deployment(r, weight_dtype: str | None, moe_parallel: str | None) -> Deployment:
    """The door for a stored measured row: its deployment, the layer options given, else the row's, else the
    seed's (rows stored before these columns existed ran the PR's fp8 weights with ``-ep``: :data:`SEED_ARGS`)."""
    point = {k: r[k] for k in ("model", "arch", "kv_cache_dtype")} | {k: int(r[k]) for k in _POINT_INTS}
    for k, v in (("weight_dtype", weight_dtype), ("moe_parallel", moe_parallel)):
        own = r.get(k)
        point[k] = v or (own if isinstance(own, str) and own else SEED_ARGS[k])
    return Deployment.from_point(point)


def _relabel_legacy(out) -> None:
    """Rows of the first version (no ``placement``): ``unfused`` / ``fused`` become ``per_call_zeros`` /
    ``private_workspace`` (``legacy_strategy`` keeps the old name), changes against ``per_call_zeros``."""
    import pandas as pd

    legacy = out["placement"].isna() if "placement" in out.columns else pd.Series(True, index=out.index)
    if not legacy.any():
        return
    out["legacy_strategy"] = out.get("legacy_strategy", pd.Series([""] * len(out), index=out.index))
    old = out.loc[legacy, "strategy"]
    out.loc[legacy, "legacy_strategy"] = old
    out.loc[legacy, "strategy"] = old.map(LEGACY_MEASURED).fillna(old)
    for col, f in (("preset", preset_of), ("placement", lambda n: parse_strategy(n).placement),
                   ("content", lambda n: parse_strategy(n).content)):
        out.loc[legacy, col] = out.loc[legacy, "strategy"].map(f)
    out.loc[legacy, "baseline"] = "per_call_zeros"


def _stored_attention(r, steps) -> list | str:
    """The measured attention path per step of a stored row, or the note saying why TTFT stays as measured."""
    import pandas as pd

    step0 = r.get("attn_path_ms_step0")
    if isinstance(r.get("attn_path_ms_steps"), str) and r["attn_path_ms_steps"]:
        return json.loads(r["attn_path_ms_steps"])
    if step0 is None or pd.isna(step0):
        return "no measured attention path stored: TTFT left as measured then"
    if len({tuple((s, n) for _, s, n in st.chunks) for st in steps}) == 1:
        return [float(step0)] * len(steps)
    return "steps differ and only step 0 was stored: TTFT left as measured then"


def _reprice_row(out, i, r, names: list, accounts: dict, layer: tuple) -> None:
    """Re-derive one measured row in place: TTFT around its measured attention path, memory columns, withheld."""
    import pandas as pd

    d = _stored_deployment(r, *layer)
    out.at[i, "weight_dtype"], out.at[i, "moe_parallel"] = d.weight_dtype, d.moe_parallel
    steps = schedule(d.workload, d.max_num_batched_tokens)
    attention = _stored_attention(r, steps)
    if isinstance(attention, str):
        out.at[i, "ttft_note"] = attention
        return
    t = predict_ttft(d, r["strategy"], attention_override_ms=attention)
    out.at[i, "ttft_ms"], out.at[i, "ttft_ms_max"], out.at[i, "ttft_scope"] = \
        t["ttft_ms_mean"], t["ttft_ms_max"], t["scope"]
    # the bytes are analytic, never measured: today's account, as the modelled row of the same point states it
    sw = r.get("shared_workspace_bytes")
    key = (d, None if sw is None or pd.isna(sw) else int(sw))
    if key not in accounts:
        accounts[key] = memory_tradeoff(d, strategies=[BASELINE, *names], shared_workspace_bytes=key[1])
    fits = {s: _row(d, parse_strategy(s), accounts[key]) for s in {BASELINE, r["strategy"]}}
    cols = fits[r["strategy"]].columns()
    for c in MEMORY_COLUMNS:
        if c in out.columns:
            out.at[i, c] = cols[c]
    out.at[i, "fits_in_memory"] = cols["fits_in_memory"]
    out.at[i, "measured_withheld"] = measured_withheld(d, r["strategy"], fits)


def _rechange(out) -> None:
    """Each measured row's change against its baseline's re-priced TTFT; the paired rounds' interval moves with
    it (its width is the measured one: a median outside its own interval would be a confident wrong number)."""
    keys = ["model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "baseline"]
    for _, g in out[out["source"] == "measured"].groupby(keys, dropna=False):
        base_name = g["baseline"].iloc[0] if isinstance(g["baseline"].iloc[0], str) else BASELINE
        base = g[g["strategy"] == base_name]["ttft_ms"]
        if len(base) != 1:
            continue
        new = 100.0 * (g["ttft_ms"] - base.iloc[0]) / base.iloc[0]
        if "ttft_change_pct" in out.columns:
            shift = (new - out.loc[g.index, "ttft_change_pct"]).where(out.loc[g.index, "ttft_change_pct"].notna(), 0.0)
            for c in ("ttft_change_ci_lo", "ttft_change_ci_hi"):
                if c in out.columns:
                    out.loc[g.index, c] = out.loc[g.index, c] + shift
        out.loc[g.index, "ttft_change_pct"] = new


def reprice_measured_rows(df, weight_dtype: str | None = None, moe_parallel: str | None = None):
    """Measured rows (a DataFrame) re-derived with today's model as a new DataFrame: TTFT around the measured attention
    path per step (``attn_path_ms_steps``, or ``attn_path_ms_step0`` where every step has one shape, else ``ttft_note``
    says why), the memory columns (:data:`MEMORY_COLUMNS`), ``measured_withheld``, the change and the between-process
    change. ``weight_dtype`` / ``moe_parallel``: default the row's, else the seed's. First-version rows (no
    ``placement``) are relabelled (``unfused`` -> ``per_call_zeros``, ``fused`` -> ``private_workspace``).
    """
    out = df.copy()
    if out.empty or "source" not in out.columns:
        return out
    for c in ("measured_withheld", "ttft_note"):
        out[c] = out[c].fillna("").astype(object) if c in out.columns else ""
    _relabel_legacy(out)
    ok = out[(out["source"] == "measured") & ((out["status"] if "status" in out.columns else "ok") == "ok")]
    pk = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype") if c in ok]
    point_names = {i: sorted(set(g["strategy"])) for _, g in ok.groupby(pk, dropna=False) for i in g.index}
    accounts: dict = {}  # (deployment, shared_workspace_bytes) -> memory_tradeoff, once per point
    for i, r in ok.iterrows():
        _reprice_row(out, i, r, point_names[i], accounts, (weight_dtype, moe_parallel))
    if "baseline" not in out.columns:
        out["baseline"] = BASELINE
    _rechange(out)
    _attach_between_process(out)
    return out


#: Where the between-process rows measured a deployment, its change columns hold theirs (``measured_basis`` says
#: so) and the sweep's one-process figures move here: every view states one measured change per cell (issue 39).
ONE_PROCESS_COLUMNS = ("one_process_change_pct", "one_process_ci_lo", "one_process_ci_hi")


def _attach_between_process(out) -> None:
    """Put :func:`between_process_changes` into the change columns of the measured rows of each deployment it
    covers; the one-process figures move to :data:`ONE_PROCESS_COLUMNS` (in place)."""
    for c in ONE_PROCESS_COLUMNS:
        out[c] = NAN
    out["measured_basis"] = out.get("measured_basis", "")
    out["measured_basis"] = out["measured_basis"].fillna("").astype(object)
    ok = out[(out["source"] == "measured") & (out.get("status", "ok") == "ok")
             & (out["baseline"].fillna(BASELINE) == BASELINE)]  # changes against the same baseline only
    keys = [c for c in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "num_prompts", "concurrency",
                        "kv_cache_dtype") if c in ok.columns]
    cols = ["ttft_change_pct", "ttft_change_ci_lo", "ttft_change_ci_hi"]
    for _, g in ok.groupby(keys, dropna=False):
        try:
            bp = between_process_changes(_stored_deployment(g.iloc[0], None, None), sorted(set(g["strategy"])))
        except ValueError:
            continue
        for i, r in g.iterrows():
            v = bp.get(r["strategy"])
            if v is None:
                out.loc[i, "measured_basis"] = "one process, 95 % interval of its rounds"
                continue
            out.loc[i, list(ONE_PROCESS_COLUMNS)] = [r.get(c) for c in cols]
            out.loc[i, cols] = [v["median"], v["lo"], v["hi"]]
            out.loc[i, "measured_basis"] = f"{v['n_processes']} fresh processes, [min, max]"


#: The committed between-process rows of the seed attention path, ``data/measured/<gpu>/between_process/<file>``:
#: ``presets.csv`` (``mla_lab/measure/experiments/presets.py``: GLM-5 TP8 geometry, 16 x 1024-token causal prompts in
#: one 16384-token step, H200, bf16 KV cache), then the strategies timed later through the package (``strategies.csv``:
#: the graph2 sub-chunks).
BETWEEN_PROCESS_GPU, BETWEEN_PROCESS_FILES = "h200", ("presets.csv", "strategies.csv")


def _between_process_seed_ms(name: str) -> dict:
    """``{strategy: {process: median ms}}`` of the seed attention path in file ``name``, ``{}`` without the file."""
    p = measured_dir(BETWEEN_PROCESS_GPU) / "between_process" / name
    if not p.is_file():
        return {}
    d = read_measured_csv(p)  # whole or refused in one line (issue 32: a cut file moved the figure silently)
    med = d[d["shape"] == "seed"].groupby(["strategy", "process"])["ms"].median()
    return {s: dict(g.droplevel(0).items()) for s, g in med.groupby(level=0)}


def between_process_changes(deployment: Deployment, strategies) -> dict:
    """The TTFT change against the baseline with the attention path measured in >= 5 fresh processes (at the seed step;
    the rest modelled), per process against its own baseline, then the median and [min, max]:
    ``{strategy: {"median", "lo", "hi", "n_processes"}}`` (``{}`` elsewhere or without the file).
    """
    d, m = deployment, deployment.model
    if not (d.num_heads == 8 and m.head_size == 576 and m.topk == 2048 and d.max_num_batched_tokens == 16384
            and d.prompt_len == 1024 and d.arch.name == BETWEEN_PROCESS_GPU and d.kv_cache_dtype == "bf16"):
        return {}  # not the attention step the between-process rows measured
    n_steps = len(schedule(d.workload, d.max_num_batched_tokens))

    def ttft(st, x):
        return predict_ttft(d, st, attention_override_ms=[x] * n_steps)["ttft_ms_mean"]

    out = {}
    # a strategy whose route here is not the measured kernel's gets no measured number (issue 39)
    sts = {st.name: st for st in map(as_strategy, strategies) if not measured_withheld(d, st)}
    # each file pairs its strategies with the baseline timed in the same processes; the first file wins
    for f in BETWEEN_PROCESS_FILES:
        ms = _between_process_seed_ms(f)
        if BASELINE not in ms:
            continue
        base = {k: ttft(_BASE, x) for k, x in ms[BASELINE].items()}
        for name in (n for n in sts if n not in out and n in ms):
            ch = sorted(100.0 * (ttft(sts[name], x) / base[k] - 1) for k, x in ms[name].items() if k in base)
            if len(ch) >= 2:
                out[name] = {"median": statistics.median(ch), "lo": ch[0], "hi": ch[-1], "n_processes": len(ch)}
    return out


#: Columns a measured row must agree on to be shown beside (or spliced into) a deployment's modelled numbers.
MEASURED_MATCH_KEYS = ("model", "tp", "arch", "max_num_batched_tokens", "kv_cache_dtype", "prompt_len",
                       "num_prompts", "concurrency", "weight_dtype", "moe_parallel")


def measured_change_pct(rows, base_rows=None) -> float | None:
    """THE measured TTFT change (%) of one strategy's measured rows (a DataFrame) against
    :data:`mla_lab.placement.BASELINE`, the one every view shows: the median of their ``ttft_change_pct``; without
    that column ``100 * (median ttft_ms / median ttft_ms of base_rows - 1)``; None for no row."""
    if not len(rows):
        return None
    if "ttft_change_pct" in rows.columns and rows["ttft_change_pct"].notna().any():
        return float(rows["ttft_change_pct"].dropna().median())
    if base_rows is None or not len(base_rows) or "ttft_ms" not in rows.columns:
        return None
    ms, base = rows["ttft_ms"].dropna(), base_rows["ttft_ms"].dropna()
    return 100.0 * (float(ms.median()) / float(base.median()) - 1) if len(ms) and len(base) else None


def _median(g, c) -> float | None:
    return float(g[c].median()) if c in g.columns and g[c].notna().any() else None


def measured_matching(measured, deployment: Deployment, keys=MEASURED_MATCH_KEYS):
    """The rows of ``measured`` (a DataFrame) with status ok that agree with ``deployment`` on every ``keys`` column."""
    point, d = deployment.args(), measured
    if "status" in d.columns:
        d = d[d["status"].fillna("ok") == "ok"]
    for k in (k for k in keys if k in d.columns and k in point):
        d = d[d[k].astype(str) == str(point[k])]
    return d


def measured_changes(measured, deployment: Deployment, keys=MEASURED_MATCH_KEYS) -> dict:
    """Per strategy, :func:`measured_matching` rows against the baseline: ``{strategy: {"change_pct"
    (:func:`measured_change_pct`), "ttft_ms", "ci_lo", "ci_hi" (the rows' median), "n_rows"}}``; ``{}`` for none.
    """
    if measured is None or len(measured) == 0 or "strategy" not in measured.columns:
        return {}
    d = measured_matching(measured, deployment, keys)
    if "baseline" in d.columns:
        d = d[d["baseline"].fillna(BASELINE) == BASELINE]  # changes against the same baseline only
    base = d[d["strategy"] == BASELINE]
    return {s: {"change_pct": measured_change_pct(g, base), "ttft_ms": _median(g, "ttft_ms"),
                "ci_lo": _median(g, "ttft_change_ci_lo"), "ci_hi": _median(g, "ttft_change_ci_hi"), "n_rows": len(g)}
            for s, g in d.groupby("strategy")}
