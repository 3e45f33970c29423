"""``mla-lab advise``: for one deployment and a memory budget, the strategy (and S) with the lowest TTFT.

A deployment is a :class:`~mla_lab.deployment.Deployment` (model, TP, GPU, max_num_batched_tokens, prompt length,
KV-cache dtype, workload, weight dtype, MoE layout, gpu_memory_utilization), validated at its door.
:func:`advise` prices every candidate strategy for it through the row builder
(:func:`mla_lab.sweep.rows.modelled_rows`: every engine preset, the shared workspace zeroed per call, and the
sub-chunked workspace at every power-of-two S up to max_num_batched_tokens, with both hand-offs), replaces a
modelled TTFT by a measured one where ``measured`` rows exist for the deployment, drops every candidate that does
not fit (weights or the workload's KV tokens: never a recommendation), applies the budget (persistent extra MiB
per rank, or KV-cache tokens lost), and ranks the rest by TTFT. The deployment's Pareto frontier over (persistent
extra MiB, TTFT) is marked.
"""

from __future__ import annotations

import math

from ..deployment import Deployment
from ..labels import KERNEL_NATIVE_LABEL, KERNEL_NATIVE_NOTE, PACKED_LABEL
from ..model.memory import memory_tradeoff
from ..model.packed_kernel import packed_strategy, packed_summary
from ..placement import (
    BASELINE,
    FORCED_TODAY,
    advise_candidates,
    engine_strategies,
    engine_summary,
    expand_strategies,
    parse_strategy,
    preset_label,
    resolve_engine,
    strategy_notes,
)
from ..serving.benchmark import options_summary
from .rows import between_process_changes, measured_changes, measured_withheld, modelled_rows

__all__ = ["DEFAULT_ENGINE", "strategy_engine", "strategy_label", "engine_group", "advise", "candidate_strategies", "frontier", "format_advice", "TODAY_ENGINES", "engines_block"]

#: Engine versions every advice describes (today's releases; ``--engine`` puts another first).
TODAY_ENGINES = ("vllm@0.33.0", "vllm@0.33.0-flashmla", "sglang@0.5.23")


def engines_block(d: Deployment, engine: str | None = None) -> list[dict]:
    """:func:`mla_lab.placement.engine_summary` of ``engine`` (first, if given) and :data:`TODAY_ENGINES` for the
    deployment ``d`` (its model, heads per rank, GPU, KV dtype, prompt length, step budget, prompts).

    Raises:
        ValueError: a bad engine name (one line, the allowed values).
    """
    names = list(dict.fromkeys(([resolve_engine(engine)] if engine else [])
                               + list(TODAY_ENGINES)))
    sm = "sm90" if d.arch.capability[0] == 9 else "sm100" if d.arch.capability[0] == 10 else d.arch.sm
    return [engine_summary(n, d.model, d.model.topk, d.num_heads, sm, d.kv_cache_dtype, d.prompt_len,
                           d.max_num_batched_tokens, d.num_prompts) for n in names]


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


def strategy_engine(name: str) -> str:
    """The engine version a canonical strategy is priced as (``vllm@0.33.0``, ``vllm@pr46189``, ``sglang@0.5.23``,
    ``vllm@pr53878-before`` / ``vllm@pr53878`` / ``vllm@56902`` for the PR-era presets and ``vllm@pr53878`` for the
    lab's proposals on the PR-era routes; ``modelled`` for ``kernel_native``, which no engine runs; ``mla_lab`` for
    ``packed``, the lab's own kernel)."""
    st = parse_strategy(name)
    if st.engine:  # an engine version's own rule: its release (mla_lab.engines record)
        return st.engine_release
    if st.rule is None:
        return "modelled"
    if st.rule == "vllm-flashmla":
        if st.placement == "per_call_empty":
            return "vllm@pr53878-before"
        if st.placement == "shared_workspace" and st.zero_policy == "none":
            return "vllm@56902"
    return RULE_ENGINE.get(st.rule, st.rule)


def engine_group(engine: str) -> str:
    """The engine version an answer is given within (:data:`ENGINE_GROUP`; others are their own)."""
    return ENGINE_GROUP.get(engine, engine)


def strategy_label(name: str) -> str:
    """The strategy as outputs print it: its name with the engine version it is priced as
    (``fa3_sparse@vllm-pr46189`` vs ``fa3_sparse@vllm-0.33.0``); a name that already says its rule stays."""
    if "@" in name:
        return name
    e = strategy_engine(name)
    if parse_strategy(name).rule == "sglang-flashmla":  # SGLang 0.5.23 with flashmla_sparse forced, not its default
        return f"{name}@sglang-0.5.23-flashmla"
    return name if e in ("modelled", "mla_lab") else f"{name}@{e.replace('@', '-')}"


def candidate_strategies(max_num_batched_tokens: int) -> list[str]:
    """Every strategy :func:`advise` weighs (:func:`mla_lab.placement.advise_candidates`)."""
    return advise_candidates(max_num_batched_tokens)


def frontier(points: list[tuple[float, float]]) -> list[bool]:
    """Pareto frontier of ``(memory, ttft)`` points, both minimised: a point is on it when no other point has
    memory <= and ttft <= with one strictly smaller. Ties (same memory and TTFT) keep the first."""
    on = []
    for i, (m, t) in enumerate(points):
        dominated = any((m2 <= m and t2 <= t and (m2 < m or t2 < t)) or (m2 == m and t2 == t and j < i)
                        for j, (m2, t2) in enumerate(points) if j != i)
        on.append(not dominated)
    return on


def advise(deployment: Deployment, *, memory_budget_mib: float | None = None, memory_budget_tokens: float | None = None,
           strategies=None, measured=None, engine: str | None = None, packed_overlap: float | None = None) -> dict:
    """The ranked strategies for one deployment under a memory budget.

    Args:
        deployment: a :class:`~mla_lab.deployment.Deployment` (:meth:`Deployment.of
            <mla_lab.deployment.Deployment.of>` or :meth:`Deployment.seed <mla_lab.deployment.Deployment.seed>`:
            its values were checked there). The older loose form (``advise("glm-5", 8, "h200", ...)``) is gone
            (issue 31: one door).
        memory_budget_mib (keyword): most persistent extra MiB per rank the strategy may add over the baseline
            (None: no limit); memory_budget_tokens (keyword): most KV-cache tokens it may cost (None: no limit).
            Both may be given.
        strategies: candidates (door names; default :func:`candidate_strategies`).
        measured: a DataFrame of measured rows (``mla_lab.report.data.load_measured``); where one matches the
            deployment and a strategy, its change against the same baseline and interval are attached
            (``measured_change_pct``, ``measured_ci_lo``, ``measured_ci_hi``).
        engine: the engine version to answer within (default :data:`DEFAULT_ENGINE`, vLLM 0.33.0; an engine preset
            such as ``sglang@0.5.23``, first names such as ``vllm-53878`` map to theirs): its strategies join the
            candidates, its summary heads the ``engines`` block, and only strategies priced as that engine version
            (:func:`strategy_engine`, :func:`engine_group`) are ranked; the others are listed in ``other_engines``.
        packed_overlap: the pairwise overlap of neighbouring tokens' top-k sets past the top-k that the lab's
            ``packed`` strategy assumes (a number in [0, 1]; None: :data:`mla_lab.model.packed_kernel
            .PACKED_OVERLAP_DEFAULT`, an assumption from TensorRT-LLM tech blog 21); ``packed`` (or
            ``packed:<overlap>``) joins the default candidates (and a given list when ``packed_overlap`` is given),
            labelled :data:`mla_lab.labels.PACKED_LABEL`. Answering within an engine version it is listed in
            ``lab_kernels`` (the lab's kernel runs in no engine: not ranked against it); with the caller's own
            candidates and no engine it is ranked with them. ``packed`` in the result says how its steps were priced
            (None when it was not a candidate).

    Returns:
        ``{"deployment", "budget", "recommendation": row | None, "alternatives": [rows], "excluded": [rows with a
        reason], "modelled_only": [rows of ``kernel_native``, "real-head FlashMLA (modelled)", with its ``label``
        and :data:`mla_lab.placement.KERNEL_NATIVE_NOTE` as the reason: no engine's backend runs it, so it is never
        ranked], "frontier": [strategy names], "engines": [engine_summary rows: what each engine version runs for
        this deployment, a code reading], "kv_capacity": {tokens, vllm_version, block_size, status, terms: [{term,
        value, unit, status, source}]} (the baseline's KV capacity per rank as vLLM computes it,
        :func:`mla_lab.model.memory.kv_capacity_terms`)}``; each row: strategy, preset, ttft_ms, ttft_change_pct (vs
        :data:`mla_lab.placement.BASELINE`), persistent_mib (the persistent Q workspace the strategy holds per
        rank), extra_persistent_mib (that minus the baseline's: what the budget and KV tokens lost count),
        call_transient_mib, kv_tokens_lost, preset_label (:func:`mla_lab.labels.preset_label`: ``sglang-dense
        (prefill graphs off)`` for SGLang's documented dense route, which is not its default today),
        ttft_source (modelled), measured_change_pct / measured_ci_lo / measured_ci_hi (or None),
        memory_source (exact), on_frontier.

    Raises:
        ValueError: a bad deployment argument (:meth:`~mla_lab.deployment.Deployment.of`'s message); a negative
            budget; a deployment whose weights or workload do not fit at all (the reason).
    """
    Deployment.require(deployment)  # the loose advise(model, tp, ...) form is gone
    d = deployment
    # before pricing anything: a deployment whose one request cannot be held is refused at once (pricing a
    # billion-token prompt first took minutes)
    mem = memory_tradeoff(d, strategies=[BASELINE])
    cap = mem["kv_capacity_tokens"]
    need = d.prompt_len + d.output_len
    if not cap > 0 or need > cap:
        raise ValueError(f"this deployment does not fit: one request needs {need:,} KV tokens ({d.prompt_len} + "
                         f"{d.output_len}); KV capacity {max(int(cap), 0):,} tokens; no strategy can be recommended")
    packed = packed_strategy(packed_overlap)  # checks the overlap (one line) before anything is priced
    # packed joins the default candidates, and any list when an overlap is asked for
    extra = [packed] if strategies is None or packed_overlap is not None else []
    if engine is None and strategies is not None:  # the caller's own candidates, ranked together (Python API)
        group = None
        engines = engines_block(d, None)
    else:
        engine = resolve_engine(engine if engine is not None else DEFAULT_ENGINE)
        group = engine_group(engine)
        engines = engines_block(d, engine)
        strategies = list(strategies if strategies is not None else candidate_strategies(d.max_num_batched_tokens))
        strategies += engine_strategies(engine)
        for e in TODAY_ENGINES:  # today's engines' own paths: listed beside the answer (or in it)
            strategies += engine_strategies(e)
        if group == "vllm@0.33.0":  # the engine's default and forced paths, and the lab's proposals on its routes
            strategies += (engine_strategies("vllm@0.33.0-flashmla")
                           + [f"{s}@vllm-0.33.0-flashmla" for s in FORCED_TODAY])
    for name, v in (("memory_budget_mib", memory_budget_mib), ("memory_budget_tokens", memory_budget_tokens)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                              or math.isnan(v)):
            raise ValueError(f"{name}={v!r} must be a non-negative number (or omitted: no limit)")
    cands = expand_strategies(list(strategies if strategies is not None
                                   else candidate_strategies(d.max_num_batched_tokens)) + extra)
    point = d.to_point(strategies=cands, shared_workspace_bytes=None, num_runs=7)
    rows = modelled_rows(point, deployment=d)
    base = next(r for r in rows if r["strategy"] == BASELINE)
    if not base["fits_in_memory"]:
        raise ValueError(f"this deployment does not fit: {base['fit_reason']}; no strategy can be recommended")
    _splice_measured(rows, point, measured)
    _splice_between_process(rows, d, measured)
    withheld = _withhold(rows, d, base) if measured is not None else ""
    excluded, kept, modelled_only, lab = [], [], [], []
    for r in rows:
        reason = ""
        if r["placement"] == "packed" and group is not None:  # the lab's kernel: beside the engine's answer
            lab.append(_summary(r, r["fit_reason"] if not r["fits_in_memory"] else "") | {"label": PACKED_LABEL})
            continue
        if r["placement"] == "kernel_native":  # no engine's backend runs it: shown beside the ranking, never in it
            modelled_only.append(_summary(r, KERNEL_NATIVE_NOTE if d.arch.sm == "sm90" else KERNEL_NATIVE_SHORT)
                                 | {"label": KERNEL_NATIVE_LABEL})
            continue
        if not r["fits_in_memory"]:
            reason = r["fit_reason"]
        elif memory_budget_mib is not None and r["extra_persistent_mib"] > memory_budget_mib + 1e-9:
            reason = f"extra {r['extra_persistent_mib']:.0f} MiB > budget {memory_budget_mib:g} MiB"
        elif memory_budget_tokens is not None and r["kv_tokens_lost"] > memory_budget_tokens + 1e-9:
            reason = f"{r['kv_tokens_lost']:.0f} KV tokens lost > budget {memory_budget_tokens:g}"
        (excluded if reason else kept).append(_summary(r, reason))
    fits = [_summary(r, "") for r in rows if r["fits_in_memory"] and r["placement"] != "kernel_native"
            and group in (None, engine_group(strategy_engine(r["strategy"])))]
    on = frontier([(s["extra_persistent_mib"], s["ttft_ms"]) for s in fits])
    front = [s["strategy"] for s, f in zip(fits, on) if f]
    for s in kept + excluded + modelled_only:
        s["on_frontier"] = s["strategy"] in front
    for s in lab:  # would it be on the answer's frontier (packed beside the engine's own strategies)?
        s["on_frontier"] = not s["reason"] and frontier([(x["extra_persistent_mib"], x["ttft_ms"])
                                                         for x in fits + [s]])[-1]
    kept.sort(key=lambda s: (s["ttft_ms"], s["extra_persistent_mib"]))
    kept, arch_notes = _on_this_gpu(kept, excluded, d, engines)
    others = [s for s in kept if group not in (None, engine_group(s["engine"]))]  # own section, never ranked
    kept = [s for s in kept if group in (None, engine_group(s["engine"]))]
    return {"deployment": {k: point[k] for k in ("model", "tp", "arch", "max_num_batched_tokens", "prompt_len",
                                                 "kv_cache_dtype", "num_prompts", "concurrency", "weight_dtype",
                                                 "moe_parallel", "gpu_memory_utilization") if k in point}
            | {"model_family": d.model.family, "model_family_note": d.model.family_note},
            "budget": {"memory_budget_mib": memory_budget_mib, "memory_budget_tokens": memory_budget_tokens},
            "engine": engine, "engine_group": group, "other_engines": others, "arch_sm": d.arch.sm,
            "arch_notes": arch_notes,
            "recommendation": kept[0] if kept else None, "alternatives": kept[1:], "excluded": excluded,
            "modelled_only": modelled_only, "lab_kernels": lab,
            "packed": packed_summary(d, packed) if any(c.startswith("packed") for c in cands) else None,
            "frontier": front, "baseline": BASELINE, "engines": engines,
            "kv_capacity": _kv_capacity_block(mem),
            "deployment_options": options_summary(d, BASELINE),  # MTP / DP attention (modelled; {} when off)
            "comm_source": rows[0].get("comm_source", "") if rows else "", "measured_withheld": withheld,
            "note": _NOTE_MODELLED if d.arch.sm != "sm90" else "ranked by the modelled TTFT (full_layer scope, content factor included); 'measured' = the "
                    "change with the attention path timed on an H200 (rest modelled) and its interval, where "
                    "measured: at the seed's attention step the median and [min, max] over >= 5 fresh processes "
                    "(data/measured/h200/between_process/presets.csv), elsewhere one process's 95 % interval of "
                    "its rounds (the measured sweep); memory exact (byte accounting); a negative extra = a workspace smaller than the "
                    "baseline's unpadded Q buffer"}


def _kv_capacity_block(mem: dict) -> dict:
    """The baseline's KV capacity per rank as vLLM computes it (:func:`mla_lab.model.memory.kv_capacity_terms`):
    tokens, the vLLM release whose rule it follows, and every term with value, unit, status and source."""
    kv = mem["kv_capacity"]
    return {"tokens": kv["tokens"], "vllm_version": kv["vllm_version"], "block_size": kv["block_size"],
            "status": "modelled (terms marked assumed are not measured; see mla_lab.model.memory)",
            "terms": kv["terms"]}


def _summary(r: dict, reason: str) -> dict:
    return {"strategy": r["strategy"], "engine": strategy_engine(r["strategy"]), "label": strategy_label(r["strategy"]),
            "preset": r["preset"], "preset_label": preset_label(r["preset"]),
            "ttft_ms": r["ttft_ms"],
            "ttft_change_pct": r["ttft_change_pct"], "persistent_mib": r.get("persistent_mib"),
            "extra_persistent_mib": r["extra_persistent_mib"], "call_transient_mib": r["call_transient_mib"], "kv_tokens_lost": round(r["kv_tokens_lost"]),
            "kv_capacity_pct_lost": r.get("kv_capacity_pct_lost"), "kv_capacity_tokens": r.get("kv_capacity_tokens"),
            "ttft_source": "modelled", "memory_source": "exact", "reason": reason,
            "measured_change_pct": r.get("measured_change_pct"), "measured_ci_lo": r.get("measured_ci_lo"),
            "measured_ci_hi": r.get("measured_ci_hi"), "measured_basis": r.get("measured_basis")}


#: The kernel_native line on a GPU where nothing was measured (the H200 kernel timings are not its evidence).
KERNEL_NATIVE_SHORT = (f"{KERNEL_NATIVE_LABEL}: a FlashMLA-style kernel taking the real head count, which no engine's "
                       "backend runs; priced as the padded kernel's time without the padded heads' Q reads and output "
                       "writes, always on the sparse route, so it is shown, not ranked")
#: advise's closing note on a GPU the lab never measured.
_NOTE_MODELLED = ("ranked by the modelled TTFT (full_layer scope, content factor included; modelled: the arch card's "
                  "datasheet rates, the H200's calibrated efficiencies); memory exact (byte accounting); a negative "
                  "extra = a workspace smaller than the baseline's unpadded Q buffer")
#: vLLM 0.33.0's real-head sparse backends on sm100 (``mla_lab/engines/presets/vllm_0_33_0.py``: FA4 for bf16 KV at <= 16 heads,
#: FlashInfer for fp8 KV): the name the FA3-sparse placement takes in a label there.
SM100_REAL_HEAD = {"FLASH_ATTN_MLA_SPARSE_FA4": "fa4_sparse", "FLASHINFER_MLA_SPARSE": "flashinfer_sparse"}


def _on_this_gpu(kept: list[dict], excluded: list[dict], d: Deployment, engines: list[dict]):
    """On a GPU other than sm90 (issue 39: B200): vLLM 0.33.0's FA3-sparse row is named as the backend that GPU
    runs (FA4 / FlashInfer, :data:`SM100_REAL_HEAD`) and PR #46189's FA3 sparse, a Hopper kernel, moves to
    ``excluded`` with the reason. Returns ``(kept, notes)``; ``excluded`` grows in place."""
    if d.arch.sm == "sm90":
        return kept, []
    backend = next((e.get("backend") for e in engines if e["preset"] == "vllm@0.33.0"), None)
    real = SM100_REAL_HEAD.get(backend)
    notes = [f"nothing here ran on a {d.arch.name.upper()} ({d.arch.sm}): every number is modelled (the arch card's "
             "datasheet rates with the H200's calibrated efficiencies); no measured column"]
    out = []
    for s in kept:
        st = parse_strategy(s["strategy"])
        if st.placement == "fa3_sparse" and st.rule == "vllm-fa3":
            excluded.append(s | {"reason": f"FA3 sparse (vLLM PR #46189) is a Hopper (sm90) kernel; on {d.arch.name} "
                                           f"vLLM 0.33.0 runs {backend or 'another backend'}"})
            continue
        if st.placement == "fa3_sparse" and real:
            s["label"] = s["label"].replace("fa3_sparse", real, 1)
        out.append(s)
    if real:
        notes.append(f"{real}@vllm-0.33.0 = vLLM 0.33.0's {backend} on {d.arch.sm} with the real {d.num_heads} heads "
                     "(no padding; mla_lab/engines/presets/vllm_0_33_0.py); its kernel is priced with FA3 sparse's model, "
                     "nothing ran on a B200")
    return out, notes


def _withhold(rows: list[dict], d: Deployment, base: dict) -> str:
    """Clear the measured columns of every row whose route here is not the measured kernel's or that does not fit
    (:func:`mla_lab.sweep.rows.measured_withheld`); returns the baseline's reason ("" when its route is the
    measured one): the line advise prints under an empty measured column."""
    for r in rows:
        if r.get("measured_change_pct") is not None and measured_withheld(d, r["strategy"], {r["strategy"]: r,
                                                                                            BASELINE: base}):
            r.update(measured_change_pct=None, measured_ci_lo=None, measured_ci_hi=None, measured_basis=None)
    return measured_withheld(d, BASELINE, {BASELINE: base})


def _splice_measured(rows: list[dict], point: dict, measured) -> None:
    """The measured column: :func:`mla_lab.sweep.rows.measured_changes` (the one function every view takes a
    measured change from)."""
    ch = measured_changes(measured, point)
    if BASELINE not in ch:
        return
    for r in rows:
        v = ch.get(r["strategy"])
        if v is not None and v["change_pct"] is not None:
            r.update(measured_change_pct=v["change_pct"], measured_ci_lo=v["ci_lo"], measured_ci_hi=v["ci_hi"])


def _splice_between_process(rows: list[dict], d: Deployment, measured) -> None:
    """Where the committed between-process rows measured this deployment's attention step (the seed's), the
    measured change and its interval are theirs: median and [min, max] over >= 5 fresh processes
    (:func:`mla_lab.sweep.rows.between_process_changes`); elsewhere they stay the sweep rows' (one process, 95 %
    interval of its rounds). ``measured is None`` (``--no-measured``) leaves the rows alone."""
    if measured is None:
        return
    bp = between_process_changes(d, [r["strategy"] for r in rows])
    for r in rows:
        v = bp.get(r["strategy"])
        if v is not None:
            r.update(measured_change_pct=v["median"], measured_ci_lo=v["lo"], measured_ci_hi=v["hi"],
                     measured_basis=f"{v['n_processes']} fresh processes, [min, max]")
        elif r.get("measured_change_pct") is not None:
            r["measured_basis"] = "one process, 95 % interval of its rounds"


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


def format_advice(result: dict) -> str:
    """The advice as a terminal table (recommendation first, then the alternatives, then what was excluded)."""
    d = result["deployment"]
    b = result["budget"]
    head = (f"deployment: {d['model']} TP{d['tp']} {d['arch']} max_num_batched_tokens {d['max_num_batched_tokens']} "
            f"prompt_len {d['prompt_len']} {d['kv_cache_dtype']} KV, {d['num_prompts']} prompts at concurrency "
            f"{d['concurrency']}, {d['weight_dtype']} weights, experts {d['moe_parallel']}\n"
            + (f"model family: {d['model_family_note']}\n" if d.get("model_family_note") else "") +
            f"budget: {b['memory_budget_mib'] if b['memory_budget_mib'] is not None else 'unlimited'} MiB, "
            f"{b['memory_budget_tokens'] if b['memory_budget_tokens'] is not None else 'unlimited'} KV tokens; "
            f"changes vs {result['baseline']}")
    # each column as wide as its title or its widest value, one space apart, no trailing blanks: 143 characters,
    # so the table fits a report's <pre> at 1280 px (160 wrapped the header: "frontie" / "r")
    widths = (44, 7, 7, 13, 9, 8, 7, 7, 22, 8)
    titles = ("strategy@engine version", "TTFT ms", "dTTFT %", "workspace MiB", "extra MiB", "call MiB", "KV lost",
              "% of KV", "measured dTTFT [int.]", "frontier")

    def line(vals):
        return " ".join(str(v)[:w].ljust(w) for v, w in zip(vals, widths)).rstrip()

    def measured(s):
        if s.get("measured_change_pct") is None:
            return "-"
        lo, hi = s.get("measured_ci_lo"), s.get("measured_ci_hi")
        ci = f" [{lo:+.2f}, {hi:+.2f}]" if lo is not None and hi is not None else ""
        return f"{s['measured_change_pct']:+.2f}{ci}"

    def fmt(s):
        held = s.get("persistent_mib")
        return [s.get("label") or s["strategy"], f"{s['ttft_ms']:.1f}", f"{s['ttft_change_pct']:+.2f}",
                "-" if held is None or held != held else f"{held:.0f}", f"{s['extra_persistent_mib']:+.0f}", f"{s['call_transient_mib']:.0f}", f"{s['kv_tokens_lost']:.0f}",
                pct(s), measured(s), "yes" if s["on_frontier"] else ""]

    def pct(s):
        v = s.get("kv_capacity_pct_lost")
        return "-" if v is None or v != v else f"{v:.1f}"

    out = [head, ""]
    for e in result.get("engines", []):
        out.append(_engine_line(e))
    if result.get("engines"):
        out.append("")
    rec = result["recommendation"]
    eng = result.get("engine_group") or ""
    within = f" within {eng} (one engine version; --engine picks another)" if eng else " (of the strategies given)"
    out.append(f"recommended{within}:" if rec else f"no strategy{' of ' + eng if eng else ''} fits this budget")
    out.append(line(titles))
    if rec:
        out.append(line(fmt(rec)))
        if result["alternatives"]:
            out.append(f"alternatives{' within ' + eng if eng else ''} (by TTFT):")
            out += [line(fmt(s)) for s in result["alternatives"]]
    if result.get("other_engines"):
        out.append(f"other engine versions' options (each priced on its own engine's routes; not ranked against "
                   f"{eng}):")
        out += [line(fmt(s)) for s in result["other_engines"]]
    if result["excluded"]:
        out.append("excluded:")
        out += [f"  {s['strategy']}: {s['reason']}" for s in result["excluded"]]
    for s in result.get("modelled_only", []):
        out.append(f"modelled only, not a recommendation: {s['strategy']} {s['ttft_change_pct']:+.2f} % "
                   f"({s['reason']})")
    ranked = ([rec] if rec else []) + list(result["alternatives"])
    if result.get("lab_kernels"):
        out.append(f"{PACKED_LABEL}, in no engine, not ranked against {eng or 'the engines'}:")
        out += [line(fmt({**s, "label": s["strategy"]})) + (f"  [{s['reason']}]" if s["reason"] else "")
                for s in result["lab_kernels"]]
    if result.get("packed"):
        out.append(f"packed: {result['packed']['line']}")
    out += [f"note: {n}" for n in result.get("arch_notes", [])]
    hopper = result.get("arch_sm", "sm90") == "sm90"
    out += [f"note: {n if hopper else n.replace('on an H200 ', '(read for sm90) ')}" for n in strategy_notes(
        [x["strategy"] for x in ranked + list(result.get("other_engines", [])) + list(result["excluded"])
         + list(result.get("lab_kernels", []))])]
    meas = [x for x in ranked if x.get("measured_change_pct") is not None]
    if len(meas) >= 2:
        by_meas = sorted(meas, key=lambda x: x["measured_change_pct"])
        if [x["strategy"] for x in by_meas] != [x["strategy"] for x in meas]:
            out.append(f"the measured column ranks these {len(meas)} strategies in another order than the modelled "
                       "ranking (best measured: " + by_meas[0]["strategy"] + "): the ranking is modelled (whole "
                       "layer, every step); the measured column times the attention path alone on an H200 in short "
                       "windows (below the power cap), with the rest modelled, so it is shown beside the ranking, "
                       "not used for it; its rows come from more than one machine lease (presets.csv and "
                       "strategies.csv), and two leases of one experiment differed by up to 8 % "
                       "(docs/perf-notes.md)")
    base_held = next((x.get("persistent_mib") for x in ranked + list(result.get("other_engines", []))
                      + list(result["excluded"])
                      if x["strategy"] == result["baseline"] and x.get("persistent_mib") is not None), None)
    out.append("'workspace MiB' = the persistent Q workspace the strategy holds per rank; 'extra MiB' = that minus "
               + (f"the baseline's {base_held:.0f} MiB unpadded buffer" if base_held is not None
                  else "the baseline's unpadded buffer")
               + " (what costs KV tokens); 'call MiB' = the layer call's transient peak (not budgeted)")
    kv = next((x.get("kv_capacity_tokens") for x in ranked if x.get("kv_capacity_tokens")), None)
    if kv:
        out.append(f"'% of KV' = KV tokens lost / the baseline's KV capacity of {kv:,.0f} tokens per rank "
                   f"(gpu_memory_utilization {d.get('gpu_memory_utilization', '')})".replace(" ()", ""))
    cap = result.get("kv_capacity")
    if cap:
        assumed = [t["term"] for t in cap["terms"] if t["status"] == "assumed"]
        out.append(f"KV capacity {cap['tokens']:,} tokens per rank as vLLM {cap['vllm_version']} computes it from "
                   f"torch's total memory ({len(cap['terms'])} terms with their sources in --json; assumed: "
                   f"{', '.join(assumed) or 'none'})")
    for name, o in (result.get("deployment_options") or {}).items():
        if name == "dp_attention":
            out.append(f"DP attention {o['dp']} (modelled): {o['heads_per_rank']} heads per rank "
                       f"({o['padded_heads_per_rank']} padded), KV {o['kv_capacity_tokens_per_rank']:,.0f} tokens per "
                       f"rank, mean TTFT {o['ttft_ms']:.1f} ms vs {o['ttft_ms_without']:.1f} ms without")
        else:
            out.append(f"MTP {o['num_speculative_tokens']} draft tokens, acceptance length {o['acceptance_length']:g} "
                       f"(input): KV {o['kv_capacity_tokens']:,.0f} tokens per rank (MTP layer's weights and KV; "
                       f"{o['kv_capacity_tokens_without']:,.0f} without); decode priced by mla-lab serve")
    if result.get("measured_withheld"):
        out.append(f"measured column empty: {result['measured_withheld']}")
    if result.get("comm_source"):
        out.append(f"all-reduce priced by: {result['comm_source']}")
    out.append(result["note"])
    return "\n".join(out)
