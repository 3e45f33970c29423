"""``mla-lab advise``: for one deployment and a memory budget, the strategy with the lowest TTFT.

:func:`advise` prices every candidate through :func:`mla_lab.sweep.rows.price` (one memory account), attaches
measured changes, drops what does not fit, applies the budget (extra MiB per rank or KV tokens lost), ranks by TTFT
within one engine version and marks the Pareto frontier over (extra MiB, TTFT).
"""

from __future__ import annotations

import math

from .. import placement as pl
from ..buffers import MIB
from ..deployment import Deployment
from ..labels import PACKED_LABEL
from ..model.memory import memory_tradeoff
from ..model.packed_kernel import packed_strategy, packed_summary
from ..placement import BASELINE
from ..serving.benchmark import options_summary
from .rows import Row, between_process_changes, measured_changes, measured_withheld, price


def engines_block(d: Deployment, engine: str | None = None) -> list[dict]:
    """:func:`mla_lab.placement.engine_summary` for ``d`` of ``engine`` (first, if given) and of
    :func:`mla_lab.placement.today_engines` (ValueError: a bad engine name, one line).
    """
    names = list(dict.fromkeys(([pl.resolve_engine(engine)] if engine else []) + pl.today_engines()))
    return [pl.engine_summary(n, d) for n in names]


#: The engine version ``advise`` answers within when ``--engine`` is not given (issue 39: one answer per engine;
#: vLLM's release the lab read, ``mla_lab/engines/presets/vllm_0_33_0.py``).
DEFAULT_ENGINE = "vllm@0.33.0"
#: Route rule (:func:`mla_lab.routes.rules`) -> the engine version whose code it reads. ``vllm-fa3`` is FA3
#: sparse as PR #46189 added it (always sparse, PR-era); ``sglang-dense`` / ``sglang-flashmla`` are SGLang 0.5.23 with
#: its prefill CUDA graphs off / flashmla_sparse forced; ``vllm-flashmla`` the PR-era FLASHMLA_SPARSE path.
RULE_ENGINE = {"vllm-0.33.0": "vllm@0.33.0", "vllm-0.33.0-flashmla": "vllm@0.33.0", "vllm-0.24.0": "vllm@0.24.0",
               "vllm-0.13.0": "vllm@0.13.0", "sglang-0.5.23": "sglang@0.5.23", "sglang-dense": "sglang@0.5.23",
               "sglang-flashmla": "sglang@0.5.23", "vllm-fa3": "vllm@pr46189", "vllm-flashmla": "vllm@pr53878",
               "vllm-flashmla-mqa": "vllm@0.24.0", "mla_lab-packed": "mla_lab"}
#: Engine versions answered together: the PR-era builds (mid-2026 vLLM main, #53878, #56902, FA3 sparse as #46189
#: added it, and the lab's proposals priced on those routes) are one; vLLM 0.33.0 with FLASHMLA_SPARSE forced is
#: vLLM 0.33.0.
ENGINE_GROUP = {"vllm@0.33.0-flashmla": "vllm@0.33.0", "vllm@pr53878-before": "vllm PR-era",
                "vllm@pr53878": "vllm PR-era", "vllm@56902": "vllm PR-era", "vllm@pr46189": "vllm PR-era"}


def strategy_engine(strategy) -> str:
    """The engine version a strategy is priced as (its record's release, or by route rule: :data:`RULE_ENGINE`; the
    PR-era presets by placement); ``modelled`` for ``kernel_native`` (no engine runs it), ``mla_lab`` for ``packed``.
    """
    st = pl.as_strategy(strategy)
    if st.engine:  # an engine version's own rule: its release (mla_lab.engines record)
        return st.engine_release
    if st.rule is None:
        return "modelled"
    if st.rule == "vllm-flashmla" and st.placement == "per_call_empty":
        return "vllm@pr53878-before"
    if st.rule == "vllm-flashmla" and st.placement == "shared_workspace" and st.zero_policy == "none":
        return "vllm@56902"
    return RULE_ENGINE.get(st.rule, st.rule)


def engine_group(engine: str) -> str:
    """The engine version an answer is given within (:data:`ENGINE_GROUP`; others are their own)."""
    return ENGINE_GROUP.get(engine, engine)


def strategy_label(strategy) -> str:
    """The strategy as outputs print it: its name with the engine version it is priced as
    (``fa3_sparse@vllm-pr46189`` vs ``fa3_sparse@vllm-0.33.0``); a name that already says its rule stays."""
    st = pl.as_strategy(strategy)
    if "@" in st.name:
        return st.name
    if st.rule == "sglang-flashmla":  # SGLang 0.5.23 with flashmla_sparse forced, not its default
        return f"{st.name}@sglang-0.5.23-flashmla"
    e = strategy_engine(st)
    return st.name if e in ("modelled", "mla_lab") else f"{st.name}@{e.replace('@', '-')}"


def frontier(points: list[tuple[float, float]]) -> list[bool]:
    """Pareto frontier of ``(memory, ttft)`` points, both minimised: a point is on it when no other point has
    memory <= and ttft <= with one strictly smaller. Ties (same memory and TTFT) keep the first."""
    return [not any((m2 <= m and t2 <= t and (m2 < m or t2 < t)) or (m2 == m and t2 == t and j < i)
                    for j, (m2, t2) in enumerate(points) if j != i) for i, (m, t) in enumerate(points)]


def _candidates(d: Deployment, strategies, engine: str | None, packed: str, with_packed: bool):
    """``(candidates, engine, group)``: the strategies advise weighs and the engine version it answers within (None:
    the caller's own candidates, ranked together)."""
    extra = [packed] if with_packed else []
    if engine is None and strategies is not None:  # the caller's own candidates, ranked together (Python API)
        return pl.expand([*strategies, *extra]), None, None
    engine = pl.resolve_engine(engine if engine is not None else DEFAULT_ENGINE)
    group = engine_group(engine)
    names = list(strategies if strategies is not None else pl.advise_candidates(d.max_num_batched_tokens))
    for e in (engine, *pl.today_engines()):  # today's engines' own paths: listed beside the answer (or in it)
        names += pl.engine_strategies(e)
    if group == "vllm@0.33.0":  # the engine's default and forced paths, and the lab's proposals on its routes
        names += pl.engine_strategies("vllm@0.33.0-flashmla") + [f"{s}@vllm-0.33.0-flashmla"
                                                                 for s in pl.FORCED_TODAY]
    return pl.expand([*names, *extra]), engine, group


def _measured(rows: list[Row], d: Deployment, measured) -> tuple[dict, str]:
    """``({strategy: measured columns}, the baseline's withheld line)``: the sweep rows' change (one process, 95 %
    interval of its rounds), replaced by the between-process rows' (median, [min, max]) where they measured this step;
    none where the route is not the measured kernel's, the row does not fit, or ``measured`` is None.
    """
    if measured is None:
        return {}, ""
    by = {r.name: r for r in rows}
    ch = measured_changes(measured, d)
    out = {n: (v["change_pct"], v["ci_lo"], v["ci_hi"], "one process, 95 % interval of its rounds")
           for n, v in ch.items() if BASELINE in ch and v["change_pct"] is not None}
    for n, v in between_process_changes(d, [r.strategy for r in rows]).items():
        out[n] = (v["median"], v["lo"], v["hi"], f"{v['n_processes']} fresh processes, [min, max]")
    keys = ("measured_change_pct", "measured_ci_lo", "measured_ci_hi", "measured_basis")
    return ({n: dict(zip(keys, v)) for n, v in out.items()
             if n in by and not measured_withheld(d, by[n].strategy, {n: by[n], BASELINE: by[BASELINE]})},
            measured_withheld(d, by[BASELINE].strategy, {BASELINE: by[BASELINE]}))


def _summary(r: Row, reason: str, meas: dict) -> dict:
    preset = pl.preset_of(r.name)
    return {"strategy": r.name, "engine": strategy_engine(r.strategy), "label": strategy_label(r.strategy),
            "preset": preset, "preset_label": pl.preset_label(preset), "ttft_ms": r.ttft_ms,
            "ttft_change_pct": r.ttft_change_pct, "persistent_mib": r.memory.persistent_bytes / MIB,
            "extra_persistent_mib": r.extra_persistent_mib, "call_transient_mib": r.memory.call_transient_bytes / MIB,
            "kv_tokens_lost": round(r.kv_tokens_lost), "kv_capacity_pct_lost": r.kv_capacity_pct_lost,
            "kv_capacity_tokens": r.kv_capacity_tokens, "ttft_source": "modelled", "memory_source": "exact",
            "reason": reason, "measured_change_pct": None, "measured_ci_lo": None, "measured_ci_hi": None,
            "measured_basis": None} | meas.get(r.name, {})


def _over_budget(r: Row, mib: float | None, tokens: float | None) -> str:
    if not r.fits_in_memory:
        return r.fit_reason
    if mib is not None and r.extra_persistent_mib > mib + 1e-9:
        return f"extra {r.extra_persistent_mib:.0f} MiB > budget {mib:g} MiB"
    if tokens is not None and r.kv_tokens_lost > tokens + 1e-9:
        return f"{r.kv_tokens_lost:.0f} KV tokens lost > budget {tokens:g}"
    return ""


def _place(rows: list[Row], d: Deployment, group, budget: dict, meas: dict) -> dict:
    """The rows' summaries by section: ``kept`` (within the budget, by TTFT), ``excluded`` (with the reason),
    ``modelled_only`` and ``lab`` (beside an engine's answer): the kind's ``shown``, ``display`` and ``notes``."""
    out: dict = {"kept": [], "excluded": [], "modelled_only": [], "lab": []}
    for r in rows:
        k = r.strategy.kind
        if k.shown == "lab" and group is not None:
            out["lab"].append(_summary(r, r.fit_reason, meas) | {"label": k.display})
        elif k.shown == "modelled_only":  # no engine's backend runs it: beside the ranking, never in it
            note = k.notes[0] if d.arch.sm == "sm90" else k.notes[-1]
            out["modelled_only"].append(_summary(r, note, meas) | {"label": k.display})
        else:
            reason = _over_budget(r, budget["memory_budget_mib"], budget["memory_budget_tokens"])
            out["excluded" if reason else "kept"].append(_summary(r, reason, meas))
    return out


def _mark_frontier(rows: list[Row], placed: dict, group) -> list[str]:
    """Mark ``on_frontier`` on every summary (``packed`` beside an engine's answer: would it be on the answer's
    frontier?); returns the frontier's strategy names."""
    fits = [r for r in rows if r.fits_in_memory and r.strategy.kind.shown != "modelled_only"
            and group in (None, engine_group(strategy_engine(r.strategy)))]
    pts = [(r.extra_persistent_mib, r.ttft_ms) for r in fits]
    front = [r.name for r, f in zip(fits, frontier(pts)) if f]
    for s in placed["kept"] + placed["excluded"] + placed["modelled_only"]:
        s["on_frontier"] = s["strategy"] in front
    for s in placed["lab"]:
        s["on_frontier"] = not s["reason"] and frontier(pts + [(s["extra_persistent_mib"], s["ttft_ms"])])[-1]
    return front


def advise(deployment: Deployment, *, memory_budget_mib: float | None = None, memory_budget_tokens: float | None = None,
           strategies=None, measured=None, engine: str | None = None, packed_overlap: float | None = None) -> dict:
    """The ranked strategies for one checked :class:`~mla_lab.deployment.Deployment` under a memory budget.

    ``memory_budget_mib`` / ``memory_budget_tokens``: most persistent extra MiB per rank over the baseline / KV-cache
    tokens a strategy may cost (None: no limit). ``strategies``: door names (default
    :func:`mla_lab.placement.advise_candidates`). ``measured``: measured rows (``load_measured``); matching ones attach
    ``measured_change_pct`` / ``_ci_lo`` / ``_ci_hi`` / ``measured_basis``. ``engine``: the engine version answered
    within (default :data:`DEFAULT_ENGINE`): only strategies priced as it (:func:`strategy_engine`,
    :func:`engine_group`) are ranked, others go to ``other_engines``. ``packed_overlap``: the overlap past the top-k
    ``packed`` assumes ([0, 1]; None: ``PACKED_OVERLAP_DEFAULT``); ``packed`` is listed in ``lab_kernels``, not ranked.

    Returns ``{"deployment", "budget", "engine", "engine_group", "recommendation" (a summary or None),
    "alternatives", "other_engines", "excluded", "modelled_only", "lab_kernels", "packed", "frontier", "engines",
    "kv_capacity", "deployment_options", "arch_sm", "arch_notes", "comm_source", "measured_withheld", "note"}``; a
    summary: strategy, engine, label, preset, TTFT (ms) and change (%), persistent / extra / call MiB, KV tokens lost
    and % of capacity, measured columns (or None), reason, ``on_frontier``.

    Raises:
        ValueError: a bad deployment, engine, overlap or budget (one line); a deployment that does not fit.
    """
    Deployment.require(deployment)  # the loose advise(model, tp, ...) form is gone
    d, budget = deployment, {"memory_budget_mib": memory_budget_mib, "memory_budget_tokens": memory_budget_tokens}
    packed = packed_strategy(packed_overlap)  # checks the overlap (one line) before anything is priced
    cands, engine, group = _candidates(d, strategies, engine, packed, strategies is None or packed_overlap is not None)
    mem = memory_tradeoff(d, strategies=cands)  # the one memory account of this advice (the baseline's included)
    cap, need = mem["kv_capacity_tokens"], d.prompt_len + d.output_len
    if not cap > 0 or need > cap:  # refused before pricing (a billion-token prompt: minutes)
        raise ValueError(f"this deployment does not fit: one request needs {need:,} KV tokens ({d.prompt_len} + "
                         f"{d.output_len}); KV capacity {max(int(cap), 0):,} tokens; no strategy can be recommended")
    for name, v in budget.items():
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or math.isnan(v)):
            raise ValueError(f"{name}={v!r} must be a non-negative number (or omitted: no limit)")
    rows = price(d, cands, memory=mem)
    if not rows[0].fits_in_memory:
        raise ValueError(f"this deployment does not fit: {rows[0].fit_reason}; no strategy can be recommended")
    meas, withheld = _measured(rows, d, measured)
    placed = _place(rows, d, group, budget, meas)
    front = _mark_frontier(rows, placed, group)
    engines = engines_block(d, engine)
    kept, arch_notes = _on_this_gpu(sorted(placed["kept"], key=lambda s: (s["ttft_ms"], s["extra_persistent_mib"])),
                                    placed["excluded"], d, engines, {r.name: r.strategy for r in rows})
    ranked = [s for s in kept if group in (None, engine_group(s["engine"]))]
    args, kv = d.args(), mem["kv_capacity"]
    return {"deployment": {k: args[k] for k in _DEPLOYMENT_KEYS}
            | {"model_family": d.model.family, "model_family_note": d.model.family_note},
            "budget": budget, "engine": engine, "engine_group": group,
            "other_engines": [s for s in kept if s not in ranked], "arch_sm": d.arch.sm, "arch_notes": arch_notes,
            "recommendation": ranked[0] if ranked else None, "alternatives": ranked[1:],
            "excluded": placed["excluded"], "modelled_only": placed["modelled_only"], "lab_kernels": placed["lab"],
            "packed": packed_summary(d, packed) if any(c.placement == "packed" for c in cands) else None,
            "frontier": front, "baseline": BASELINE, "engines": engines,
            "kv_capacity": {k: kv[k] for k in ("tokens", "vllm_version", "block_size")} | {
                "status": "modelled (terms marked assumed are not measured; see mla_lab.model.memory)",
                "terms": kv["terms"]},
            "deployment_options": options_summary(d, BASELINE),  # MTP / DP attention (modelled; {} when off)
            "comm_source": rows[0].comm_source, "measured_withheld": withheld,
            "note": _NOTE_MEASURED if d.arch.sm == "sm90" else _NOTE_MODELLED}


_DEPLOYMENT_KEYS = ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "kv_cache_dtype", "num_prompts",
                    "concurrency", "weight_dtype", "moe_parallel", "gpu_memory_utilization")
#: advise's closing note on a GPU the lab never measured.
_NOTE_MODELLED = ("ranked by the modelled TTFT (full_layer scope, content factor included; modelled: the arch card's "
                  "datasheet rates, the H200's calibrated efficiencies); memory exact (byte accounting); a negative "
                  "extra = a workspace smaller than the baseline's unpadded Q buffer")
#: advise's closing note on sm90, where the attention path was measured.
_NOTE_MEASURED = ("ranked by the modelled TTFT (full_layer scope, content factor included); 'measured' = the change "
                  "with the attention path timed on an H200 (rest modelled) and its interval, where measured: at the "
                  "seed's attention step the median and [min, max] over >= 5 fresh processes "
                  "(data/measured/h200/between_process/presets.csv), elsewhere one process's 95 % interval of its "
                  "rounds (the measured sweep); memory exact (byte accounting); a negative extra = a workspace "
                  "smaller than the baseline's unpadded Q buffer")
#: vLLM 0.33.0's real-head sparse backends on sm100 (``mla_lab/engines/presets/vllm_0_33_0.py``: FA4 for bf16 KV
#: at <= 16 heads, FlashInfer for fp8 KV): the name the FA3-sparse placement takes in a label there.
SM100_REAL_HEAD = {"FLASH_ATTN_MLA_SPARSE_FA4": "fa4_sparse", "FLASHINFER_MLA_SPARSE": "flashinfer_sparse"}


def _on_this_gpu(kept: list[dict], excluded: list[dict], d: Deployment, engines: list[dict], sts: dict):
    """On a GPU other than sm90 (issue 39: B200): vLLM 0.33.0's FA3-sparse row is named as the backend that GPU
    runs (FA4 / FlashInfer, :data:`SM100_REAL_HEAD`) and PR #46189's FA3 sparse, a Hopper kernel, moves to
    ``excluded`` with the reason. ``sts``: name -> Strategy. Returns ``(kept, notes)``; ``excluded`` grows in place."""
    if d.arch.sm == "sm90":
        return kept, []
    backend = next((e.get("backend") for e in engines if e["preset"] == "vllm@0.33.0"), None)
    real = SM100_REAL_HEAD.get(backend)
    notes = [f"nothing here ran on a {d.arch.name.upper()} ({d.arch.sm}): every number is modelled (the arch card's "
             "datasheet rates with the H200's calibrated efficiencies); no measured column"]
    out = []
    for s in kept:
        st = sts[s["strategy"]]
        if st.placement == "fa3_sparse" and st.rule == "vllm-fa3":
            excluded.append(s | {"reason": f"FA3 sparse (vLLM PR #46189) is a Hopper (sm90) kernel; on {d.arch.name} "
                                           f"vLLM 0.33.0 runs {backend or 'another backend'}"})
            continue
        if st.placement == "fa3_sparse" and real:
            s["label"] = s["label"].replace("fa3_sparse", real, 1)
        out.append(s)
    if real:
        notes.append(f"{real}@vllm-0.33.0 = vLLM 0.33.0's {backend} on {d.arch.sm} with the real {d.num_heads} heads "
                     "(no padding; mla_lab/engines/presets/vllm_0_33_0.py); its kernel is priced with FA3 sparse's "
                     "model, nothing ran on a B200")
    return out, notes


_ROUTE_WORDS = {"mha-dense": "dense MHA", "sparse-mqa": "sparse MQA (FlashMLA, padded)",
                "fa3-sparse": "sparse MQA (real heads)", "mha-masked": "masked MHA"}


def _engine_line(e: dict) -> str:
    """One engine version's route for the deployment, in words."""
    if e.get("backend") is None:
        return f"engine {e['preset']} ({e['release_date']}): {e['prefill_reason']}"
    if not e.get("supported", True):
        return f"engine {e['preset']} ({e['release_date']}): does not run this model (runs {e['models']})"
    dec = "same-length " if e.get("uniform_decodes") else ""
    return (f"engine {e['preset']} ({e['release_date']}, {e['backend']}): prefill route "
            f"{_ROUTE_WORDS.get(e['prefill_route'], e['prefill_route'])} [{e['prefill_reason']}]; decode "
            f"{_ROUTE_WORDS.get(e['decode_route'], e['decode_route'])} for requests of <= {e['decode_threshold']} "
            f"{dec}query tokens; padded path runs: {e['padded_path']} ({e['scope']})"
            + (f"; note: {e['note']}" if e.get("note") else ""))


# each column as wide as its title or its widest value, one space apart, no trailing blanks: 143 characters, so the
# table fits a report's <pre> at 1280 px (160 wrapped the header: "frontie" / "r")
_WIDTHS = (44, 7, 7, 13, 9, 8, 7, 7, 22, 8)
_TITLES = ("strategy@engine version", "TTFT ms", "dTTFT %", "workspace MiB", "extra MiB", "call MiB", "KV lost",
           "% of KV", "measured dTTFT [int.]", "frontier")


def _line(vals) -> str:
    return " ".join(str(v)[:w].ljust(w) for v, w in zip(vals, _WIDTHS)).rstrip()


def _num(v, fmt: str) -> str:
    return "-" if v is None or v != v else format(v, fmt)


def _fmt(s: dict) -> str:
    m = "-" if s.get("measured_change_pct") is None else f"{s['measured_change_pct']:+.2f}" + (
        f" [{s['measured_ci_lo']:+.2f}, {s['measured_ci_hi']:+.2f}]" if s.get("measured_ci_lo") is not None
        and s.get("measured_ci_hi") is not None else "")
    return _line([s.get("label") or s["strategy"], f"{s['ttft_ms']:.1f}", f"{s['ttft_change_pct']:+.2f}",
                  _num(s.get("persistent_mib"), ".0f"), f"{s['extra_persistent_mib']:+.0f}",
                  f"{s['call_transient_mib']:.0f}", f"{s['kv_tokens_lost']:.0f}",
                  _num(s.get("kv_capacity_pct_lost"), ".1f"), m, "yes" if s["on_frontier"] else ""])


def _head(result: dict) -> list[str]:
    d, b = result["deployment"], result["budget"]
    mib, tok = b["memory_budget_mib"], b["memory_budget_tokens"]
    return [f"deployment: {d['model']} TP{d['tp']} {d['arch']} max_num_batched_tokens {d['max_num_batched_tokens']} "
            f"prompt_len {d['prompt_len']} {d['kv_cache_dtype']} KV, {d['num_prompts']} prompts at concurrency "
            f"{d['concurrency']}, {d['weight_dtype']} weights, experts {d['moe_parallel']}",
            *([f"model family: {d['model_family_note']}"] if d.get("model_family_note") else []),
            f"budget: {mib if mib is not None else 'unlimited'} MiB, {tok if tok is not None else 'unlimited'} KV "
            f"tokens; changes vs {result['baseline']}", "",
            *[_engine_line(e) for e in result.get("engines", [])], *([""] if result.get("engines") else [])]


def _tables(result: dict) -> list[str]:
    rec, eng = result["recommendation"], result.get("engine_group") or ""
    within = f" within {eng} (one engine version; --engine picks another)" if eng else " (of the strategies given)"
    out = [f"recommended{within}:" if rec else f"no strategy{' of ' + eng if eng else ''} fits this budget",
           _line(_TITLES)]
    if rec:
        out.append(_fmt(rec))
        if result["alternatives"]:
            out += [f"alternatives{' within ' + eng if eng else ''} (by TTFT):", *map(_fmt, result["alternatives"])]
    if result.get("other_engines"):
        out += [f"other engine versions' options (each priced on its own engine's routes; not ranked against {eng}):",
                *map(_fmt, result["other_engines"])]
    if result["excluded"]:
        out += ["excluded:", *(f"  {s['strategy']}: {s['reason']}" for s in result["excluded"])]
    out += [f"modelled only, not a recommendation: {s['strategy']} {s['ttft_change_pct']:+.2f} % ({s['reason']})"
            for s in result.get("modelled_only", [])]
    if result.get("lab_kernels"):
        out += [f"{PACKED_LABEL}, in no engine, not ranked against {eng or 'the engines'}:",
                *(_fmt({**s, "label": s["strategy"]}) + (f"  [{s['reason']}]" if s["reason"] else "")
                  for s in result["lab_kernels"])]
    return out + ([f"packed: {result['packed']['line']}"] if result.get("packed") else [])


def _order_note(ranked: list[dict]) -> list[str]:
    """The line saying the measured column orders the ranked strategies otherwise (empty when it does not)."""
    meas = [x for x in ranked if x.get("measured_change_pct") is not None]
    by_meas = sorted(meas, key=lambda x: x["measured_change_pct"])
    if len(meas) < 2 or [x["strategy"] for x in by_meas] == [x["strategy"] for x in meas]:
        return []
    return [f"the measured column ranks these {len(meas)} strategies in another order than the modelled ranking "
            f"(best measured: {by_meas[0]['strategy']}): the ranking is modelled (whole layer, every step); the "
            "measured column times the attention path alone on an H200 in short windows (below the power cap), with "
            "the rest modelled, so it is shown beside the ranking, not used for it; its rows come from more than one "
            "machine lease (presets.csv and strategies.csv), and two leases of one experiment differed by up to 8 % "
            "(docs/perf-notes.md)"]


def _option_line(name: str, o: dict) -> str:
    if name == "dp_attention":
        return (f"DP attention {o['dp']} (modelled): {o['heads_per_rank']} heads per rank ({o['padded_heads_per_rank']}"
                f" padded), KV {o['kv_capacity_tokens_per_rank']:,.0f} tokens per rank, mean TTFT {o['ttft_ms']:.1f} "
                f"ms vs {o['ttft_ms_without']:.1f} ms without")
    return (f"MTP {o['num_speculative_tokens']} draft tokens, acceptance length {o['acceptance_length']:g} (input): KV "
            f"{o['kv_capacity_tokens']:,.0f} tokens per rank (MTP layer's weights and KV; "
            f"{o['kv_capacity_tokens_without']:,.0f} without); decode priced by mla-lab serve")


def _notes(result: dict) -> list[str]:
    rec = result["recommendation"]
    ranked = ([rec] if rec else []) + list(result["alternatives"])
    listed = ranked + list(result.get("other_engines", [])) + list(result["excluded"])
    hopper = result.get("arch_sm", "sm90") == "sm90"
    out = [f"note: {n}" for n in result.get("arch_notes", [])]
    out += [f"note: {n if hopper else n.replace('on an H200 ', '(read for sm90) ')}"
            for n in pl.strategy_notes([x["strategy"] for x in listed + list(result.get("lab_kernels", []))])]
    out += _order_note(ranked)
    held = next((x["persistent_mib"] for x in listed if x["strategy"] == result["baseline"]
                 and x.get("persistent_mib") is not None), None)
    out.append("'workspace MiB' = the persistent Q workspace the strategy holds per rank; 'extra MiB' = that minus "
               + (f"the baseline's {held:.0f} MiB unpadded buffer" if held is not None else "the baseline's unpadded "
                  "buffer") + " (what costs KV tokens); 'call MiB' = the layer call's transient peak (not budgeted)")
    kv = next((x.get("kv_capacity_tokens") for x in ranked if x.get("kv_capacity_tokens")), None)
    if kv:
        out.append(f"'% of KV' = KV tokens lost / the baseline's KV capacity of {kv:,.0f} tokens per rank "
                   f"(gpu_memory_utilization {result['deployment'].get('gpu_memory_utilization', '')})"
                   .replace(" ()", ""))
    cap = result.get("kv_capacity")
    if cap:
        assumed = [t["term"] for t in cap["terms"] if t["status"] == "assumed"]
        out.append(f"KV capacity {cap['tokens']:,} tokens per rank as vLLM {cap['vllm_version']} computes it from "
                   f"torch's total memory ({len(cap['terms'])} terms with their sources in --json; assumed: "
                   f"{', '.join(assumed) or 'none'})")
    out += [_option_line(n, o) for n, o in (result.get("deployment_options") or {}).items()]
    out += [f"measured column empty: {result['measured_withheld']}"] if result.get("measured_withheld") else []
    out += [f"all-reduce priced by: {result['comm_source']}"] if result.get("comm_source") else []
    return out + [result["note"]]


def format_advice(result: dict) -> str:
    """The advice as a terminal table (recommendation first, then the alternatives, then what was excluded)."""
    return "\n".join(_head(result) + _tables(result) + _notes(result))
