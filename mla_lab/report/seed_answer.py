"""The PR's three numbers, answered: TTFT, throughput and memory of vLLM PR #53878 beside the lab's, at the PR's
benchmark (:meth:`mla_lab.deployment.Deployment.seed`) for GLM-5's geometry and GLM-5.2's. Each change is modelled
(full-layer TTFT model) and measured (the attention path timed in >= 5 fresh processes on one H200, the rest
modelled: ``data/measured/h200/between_process/presets.csv``): the median over processes with ``[min, max]``.
"""

from __future__ import annotations

import statistics

import pandas as pd

from ..buffers import MIB, memory_account, shared_workspace_other_bytes
from ..deployment import Deployment
from ..model.calibration import resolve_calibration
from ..model.comm import extrapolated
from ..model.ttft import predict_ttft
from ..paths import measured_dir, read_measured_csv
from ..placement import (
    BASELINE,
    CONTENTS,
    PR_STRATEGY,
    PR_TRADE_BY_ENGINE,
    SEED_COMPARISONS,
    engine_summary,
    parse_strategy,
)
from ..seed import SEED_REPORTED
from ..sweep.rows import ttft_with_attention
from ..workload import schedule

__all__ = ["seed_answer", "seed_answer_table", "seed_sentences", "seed_comm_sensitivity", "pr_trade_by_engine"]


def _measured_seed_samples() -> dict:
    """``{strategy: {process: median attention-path ms at the seed}}`` of the committed between-process rows
    ``data/measured/h200/between_process/presets.csv`` (mla_lab/measure/experiments/presets.py); ``{}`` without it."""
    p = measured_dir("h200") / "between_process" / "presets.csv"
    if not p.is_file():
        return {}
    d = read_measured_csv(p)  # whole or refused in one line (a truncated file would move the figure silently)
    med = d[d["shape"] == "seed"].groupby(["strategy", "process"])["ms"].median()
    return {s: dict(g.droplevel(0).items()) for s, g in med.groupby(level=0)}


def _memory(d: Deployment, names) -> tuple[dict, int]:
    """Per strategy its memory account on the step's route (dense MHA pads nothing), and the baseline's persistent
    bytes (:func:`mla_lab.buffers.memory_account`)."""
    shared = shared_workspace_other_bytes(d.rank)
    mem = {s: memory_account(parse_strategy(s), d.num_heads, d.max_num_batched_tokens, d.arch, d.kv_cache_dtype,
                             shared_other_bytes=shared, model=d.model, prompt_len=d.prompt_len) for s in names}
    base = memory_account(parse_strategy(BASELINE), d.num_heads, d.max_num_batched_tokens, d.arch,
                          d.kv_cache_dtype).persistent_bytes
    return mem, base


def _measured_change(ttft: dict, s: str, ref: str) -> dict:
    """The row's measured columns from per-process TTFTs of ``s`` and ``ref``: the median change with ``[min, max]``
    over processes (:mod:`mla_lab.measure.spread`'s convention)."""
    if s not in ttft or ref not in ttft:
        return {"measured_pct": None, "measured_lo": None, "measured_hi": None, "rounds": 0, "measured_basis": None,
                "n_processes": 0}
    keys = sorted(set(ttft[s]) & set(ttft[ref]))
    ch = [100.0 * (ttft[s][k] / ttft[ref][k] - 1) for k in keys]
    return {"measured_pct": statistics.median(ch), "measured_lo": min(ch), "measured_hi": max(ch),
            "rounds": len(keys), "n_processes": len(keys), "measured_basis": "processes"}


def seed_answer(models=("glm-5", "glm-5.2"), calibration=None) -> list[dict]:
    """One dict per (model geometry, comparison of :data:`mla_lab.placement.SEED_COMPARISONS`), priced with
    ``calibration`` (None: the committed one): ``modelled_pct``; ``modelled_pct_kernel_content`` (stale padded heads
    priced on the kernel only; ``content_scope`` says which scope ``modelled_pct`` used); ``ttft_ms`` /
    ``against_ttft_ms`` (mean, ms), ``against_run_ms`` (the last prompt's TTFT), ``comm_ms`` / ``comm_source`` (its
    all-reduces, one rank); ``measured_pct`` / ``_lo`` / ``_hi`` (None without measurements), ``measured_basis``,
    ``n_processes``, ``rounds``; ``extra_persistent_mib`` and ``call_transient_mib`` of the strategy and of
    ``against``."""
    samples = _measured_seed_samples()
    names = {s for _, a, b in SEED_COMPARISONS for s in (a, b)}
    out = []
    for name in models:
        d = Deployment.seed(model=name)
        steps = schedule(d.workload, d.max_num_batched_tokens)
        cal = resolve_calibration(calibration)
        modelled = {s: predict_ttft(d, parse_strategy(s), cal) for s in names}
        kernel_cal = cal.with_content_scope("kernel")  # stale heads priced on the kernel only (before issue 21)
        kernel_only = {s: (predict_ttft(d, parse_strategy(s), kernel_cal) if parse_strategy(s).content == "stale"
                           else modelled[s]) for s in names}
        mem, base = _memory(d, names)
        ttft = {s: {k: ttft_with_attention(modelled[s], steps, d.prompt_len, d.model.num_hidden_layers,
                                           [x] * len(steps)) for k, x in samples[s].items()}
                for s in names if s in samples}  # strategy -> {process: mean TTFT, ms}
        for label, s, ref in SEED_COMPARISONS:
            stale = any(parse_strategy(x).content == "stale" for x in (s, ref))
            out.append({
                "model": name, "comparison": label, "strategy": s, "against": ref,
                "modelled_pct": 100.0 * (modelled[s]["ttft_ms_mean"] / modelled[ref]["ttft_ms_mean"] - 1),
                "modelled_pct_kernel_content": 100.0 * (kernel_only[s]["ttft_ms_mean"]
                                                        / kernel_only[ref]["ttft_ms_mean"] - 1),
                "content_scope": ("step" if cal.step_content() is not None else "kernel") if stale else "none",
                "ttft_ms": modelled[s]["ttft_ms_mean"], "against_ttft_ms": modelled[ref]["ttft_ms_mean"],
                "comm_ms": modelled[ref]["comm_ms"], "against_run_ms": modelled[ref]["ttft_ms_max"],
                "comm_source": modelled[ref]["comm_source"], "extra_persistent_mib": (mem[s].persistent_bytes - base) / MIB,
                "against_extra_persistent_mib": (mem[ref].persistent_bytes - base) / MIB,
                "call_transient_mib": mem[s].call_transient_bytes / MIB,
                "against_call_transient_mib": mem[ref].call_transient_bytes / MIB,
                **_measured_change(ttft, s, ref)})
    return out


def seed_answer_table(rows=None):
    """:func:`seed_answer` as a table beside the PR's reported numbers (pandas DataFrame)."""
    rows = seed_answer() if rows is None else rows

    def measured(r):
        if r["measured_pct"] is None:
            return "no measurement"
        verdict = "" if not (r["measured_lo"] <= 0 <= r["measured_hi"]) else " (no measurable change)"
        return f"{r['measured_pct']:+.1f} % [{r['measured_lo']:+.1f}, {r['measured_hi']:+.1f}]{verdict}"

    return pd.DataFrame([{
        "model geometry": r["model"], "comparison": r["comparison"],
        "TTFT, modelled": f"{r['modelled_pct']:+.1f} %",
        ("TTFT, attention path measured (5 fresh processes, [min, max])" if any(
            x.get("measured_basis") == "processes" for x in rows) else
         "TTFT, attention path measured (95 % interval)"): measured(r),
        "persistent extra MiB (strategy / against)":
            f"{r['extra_persistent_mib']:+.0f} / {r['against_extra_persistent_mib']:+.0f}",
        "call transient MiB (strategy / against)":
            f"{r['call_transient_mib']:.0f} / {r['against_call_transient_mib']:.0f}",
        "PR #53878 reported": (f"TTFT {SEED_REPORTED['ttft_change_pct']:+.1f} %, +{SEED_REPORTED['extra_peak_mib']} "
                               "MiB peak" if r["strategy"] == PR_STRATEGY and
                               parse_strategy(r["against"]).placement == "per_call_empty" else "-"),
    } for r in rows])


def seed_sentences(rows=None) -> list[str]:
    """Plain sentences: what the lab's answer is, which assumptions can reach the reported -9.5 % and which cannot,
    and what cannot be reproduced."""
    rows = seed_answer() if rows is None else rows
    target = SEED_REPORTED["ttft_change_pct"]
    out = []
    pr = [r for r in rows if r["strategy"] == PR_STRATEGY]
    best = min(pr, key=lambda r: r["modelled_pct"])
    reach = [r for r in pr if r["modelled_pct"] <= target or (r["measured_lo"] is not None and
                                                               r["measured_lo"] <= target)]
    for r in pr:
        if parse_strategy(r["against"]).placement == "per_call_empty":
            m = "" if r["measured_pct"] is None else (
                f", {r['measured_pct']:+.1f} % [{r['measured_lo']:+.1f}, {r['measured_hi']:+.1f}]; the attention "
                f"path measured in {r['n_processes']} fresh processes, median [min, max]")
            out.append(f"{r['model']}: the PR's change against vLLM before it ({r['against']}) is "
                       f"{r['modelled_pct']:+.1f} % modelled{m}, against the reported {target:+.1f} %.")
    if reach:
        out.append("Assumptions that reach the reported change: " + "; ".join(
            f"{r['model']} against {r['against']}" for r in reach) + ".")
    else:
        vllm = [r for r in pr if r["against"] == BASELINE and r["model"] == best["model"]][0]
        k = target / vllm["modelled_pct"] if vllm["modelled_pct"] < 0 else float("inf")
        shrink = vllm["modelled_pct"] / target
        out.append(f"No comparison of the PR's path the lab prices reaches {target:+.1f} %: its largest modelled gain "
                   f"is {best['modelled_pct']:+.1f} % ({best['model']} against {best['against']}, a zero-filled pad per "
                   f"call, which vLLM's bf16 path never did). Against vLLM's own new_empty pad, reaching it would "
                   f"need the removed work to cost {k:.1f}x what the model prices (the H200 measurement "
                   f"gives less still), or the whole step to take {shrink:.2f}x the modelled time with the same "
                   "saving.")
    others = [r for r in rows if r["against"] == PR_STRATEGY and r["modelled_pct"] <= target]
    if others:
        out.append("Routes that skip the padding do go further, against the PR's path (modelled): " + "; ".join(
            f"{r['model']} {r['comparison'].split(' vs ')[0]} {r['modelled_pct']:+.1f} %" for r in others) +
            ". The PR's benchmark forced FLASHMLA_SPARSE on both builds, so none of these is in its comparison.")
    fit = measured_dir("h200") / "round2" / "content_fit.csv"
    if fit.is_file():
        f = pd.read_csv(fit)
        f = f[(f["num_heads"] <= 16) & (f["T"] >= 4096)]
        if len(f):
            out.append(f"Stale padded heads (vLLM #56902's shared workspace) slowed the kernel by "
                       f"{100 * (f['ratio_measured'].min() - 1):.0f}-{100 * (f['ratio_measured'].max() - 1):.0f} % "
                       f"on an H200 at its power limit (8-16 real of 64 heads, T >= 4096, {len(f)} shape-modes, "
                       f"{fit.name}; short windows of the kernel alone): at these shapes that is as large as the "
                       "copy the PR removed.")
    step = [r for r in pr if r["against"] == "per_call_empty:stale" and r["content_scope"] == "step"]
    if step:
        out.append("Stale padded heads are priced over the whole step (a power-limited H200 slows every op; "
                   "data/calibration/h200_content_step.csv, a sustained 78-layer loop): the PR against vLLM before "
                   "it with stale heads is " + "; ".join(
                       f"{r['model']} {r['modelled_pct']:+.1f} % (kernel-only factor "
                       f"{r['modelled_pct_kernel_content']:+.1f} %)" for r in step) + ".")
    out.append("Not reproducible here: the PR's GPU model and power limit, its serving stack's other costs, and the "
               "peak-memory figure (+1032 MiB includes allocator rounding and buffers the lab does not model; the "
               f"lab's {pr[0]['extra_persistent_mib']:+.0f} MiB is the extra alone: the PR's workspace minus vLLM's "
               "unpadded Q buffer before it, exact).")
    return out


def seed_comm_sensitivity(models=("glm-5", "glm-5.2")):
    """The seed answer under each all-reduce term the lab can defend at the PR's TP (DataFrame, one row per (model,
    comm term)): the committed calibration's, the largest measured world size's fit extrapolated
    (:func:`mla_lab.model.comm.extrapolated`) and the ideal ring (a lower bound); the all-reduce ms and share of the
    run before the PR, and the PR's change against vLLM before it (zero and stale heads, modelled and measured, %)."""
    base = resolve_calibration(None)
    tp = Deployment.seed().tp
    terms = [("committed calibration", base)]
    if base.comm is not None and base.comm.fits and base.comm.fit_for(tp) is None:
        e = extrapolated(base.comm, tp)
        terms.append((f"tp={max(base.comm.fits)} fit extrapolated to tp={tp}", base.with_comm_fit(e)))
    terms.append(("ideal ring (lower bound)", base.with_comm(comm_efficiency=1.0, comm_latency_us=0.0)))
    out = []
    for label, cal in terms:
        rows = seed_answer(models, calibration=cal)
        # the measured columns name their basis, as the seed answer's table does (one figure, one label)
        n = {r["n_processes"] for r in rows if r.get("measured_basis") == "processes"}
        meas = f"attention measured ({n.pop()} fresh processes)" if len(n) == 1 else "attention measured"
        for name in models:
            pr = {parse_strategy(r["against"]): r for r in rows if r["model"] == name and r["strategy"] == PR_STRATEGY}
            z, st = (next(r for s, r in pr.items() if s.placement == "per_call_empty" and s.content == c)
                     for c in CONTENTS)  # zeros, stale
            out.append({
                "model": name, "comm term": label, "priced by": z["comm_source"], "all-reduce ms": z["comm_ms"],
                "share of run %": 100 * z["comm_ms"] / z["against_run_ms"],
                "TTFT before the PR ms": z["against_ttft_ms"],
                "PR vs before, zeros, modelled %": z["modelled_pct"],
                f"PR vs before, zeros, {meas} %": z["measured_pct"],
                "PR vs before, stale, modelled %": st["modelled_pct"],
                f"PR vs before, stale, {meas} %": st["measured_pct"],
            })
    return pd.DataFrame(out)


def pr_trade_by_engine(models=("glm-5",), calibration=None) -> list[dict]:
    """The PR's trade on its benchmark per row of :data:`mla_lab.placement.PR_TRADE_BY_ENGINE` (as it was, vLLM
    0.33.0 with FLASHMLA_SPARSE forced, vLLM 0.33.0's FA3 sparse), modelled: one dict per (model, row) with
    ``label``, ``engine``, ``strategy``, ``against``, ``modelled_pct`` (mean TTFT change, %), ``ttft_ms`` /
    ``against_ttft_ms``, ``extra_persistent_mib`` / ``against_extra_persistent_mib`` (over the pre-PR baseline's),
    ``prefill_route``, ``padded_path``, ``source``. Raises ValueError: an unknown model."""
    names = {x for _, a, b, _ in PR_TRADE_BY_ENGINE for x in (a, b)}
    out = []
    for name in models:
        d = Deployment.seed(model=name)
        cal = resolve_calibration(calibration)
        ttft = {s: predict_ttft(d, parse_strategy(s), cal)["ttft_ms_mean"] for s in names}
        mem, base = _memory(d, names)
        for label, s, ref, engine in PR_TRADE_BY_ENGINE:
            e = engine_summary(engine, d)
            out.append({"model": name, "label": label, "engine": engine, "strategy": s, "against": ref,
                        "modelled_pct": 100.0 * (ttft[s] / ttft[ref] - 1), "ttft_ms": ttft[s],
                        "against_ttft_ms": ttft[ref], "extra_persistent_mib": (mem[s].persistent_bytes - base) / MIB,
                        "against_extra_persistent_mib": (mem[ref].persistent_bytes - base) / MIB,
                        "prefill_route": e["prefill_route"], "padded_path": e["padded_path"], "source": "modelled"})
    return out
