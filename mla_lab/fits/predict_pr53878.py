#!/usr/bin/env python3
"""The lab's written prediction of vLLM PR #53878's "main" run (vLLM before the PR; issue 20): modelled, nothing
fitted to an end-to-end figure of it. The run (the PR's description): ``vllm serve zai-org/GLM-5.2-FP8`` TP8 EP,
max_num_batched_tokens 16384, FLASHMLA_SPARSE, bf16 KV, async scheduling, 8 H200; ``vllm bench serve`` random
1024 / 128, 32 prompts, concurrency 32, rate inf, seed 12345. Steps priced by ``CostModelPricer`` (pre-PR
``per_call_empty:zeros``), the noise of :mod:`mla_lab.serving.noise` with its measured components recomputed
(:func:`measured_noise`), ``--num-runs`` runs per build. Writes ``data/validation/pr53878_main_prediction.json``
and ``pr53878_noise_distribution.csv`` beside it (never over a file the lab did not write).

    python -m mla_lab.fits.predict_pr53878 [--num-runs 1000] [--seed 0] [--out PATH] [--no-measurements]
        [--update-docs | --docs-only]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from mla_lab.measure.spread import between_process
from mla_lab.paths import REPO_ROOT, calibration_dir, measured_dir, models_dir
from mla_lab.provenance import git_commit
from mla_lab.serving import PR_BENCH, BenchConfig, CostModelPricer, SchedulerConfig, serve_benchmark
from mla_lab.serving.benchmark import async_scheduler, pr_deployment
from mla_lab.serving.noise import NOISE_METRICS, CachedPricer, NoiseConfig, load_cold_start, run_noise, simulate_once

from .files import rel as _rel

PRODUCED_BY = "mla_lab.fits.predict_pr53878"
#: The committed prediction's ``produced_by`` (this module's former path): a file it names is ours too.
EARLIER_PRODUCERS = ("benchmarks/predict_pr53878.py",)
OUT = REPO_ROOT / "data" / "validation" / "pr53878_main_prediction.json"
BEFORE, ALT_BEFORE, PR = "per_call_empty:zeros", "per_call_empty:stale", "private_workspace"
BLOCK_SIZE = 64
#: the PR's client: PR_BENCH with the PR's --seed (lengths are fixed at range ratio 0, so the seed changes nothing)
BENCH = replace(PR_BENCH, seed=12345)
#: metric -> unit (NOISE_METRICS' label's, e.g. "Benchmark duration (s)" -> "s")
PREDICTED = {k: label.rsplit(" (", 1)[1][:-1] for k, label in NOISE_METRICS}
TTFT_STATS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms")
REPORTED = {"mean_ttft_ms": -9.5, "median_ttft_ms": -9.5, "p99_ttft_ms": -9.5, "total_token_throughput": 6.0,
            "output_throughput": 6.0}
#: The H200 between-process rows (5 fresh processes, ``mla-lab measure``).
MEASURED = measured_dir("h200") / "between_process"
CONTENT_CSV, COLD_CSV, SPREAD_CSV = (MEASURED / f for f in ("content_loop.csv", "cold_start.csv", "step_spread.csv"))
#: The per-run changes of the prediction's Monte-Carlo (one row per case and run), beside the JSON.
DIST_NAME = "pr53878_noise_distribution.csv"
DIST_METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "total_token_throughput", "output_throughput",
                "duration")
DIST_HEADER = "case,run," + ",".join(f"change_{k}_pct" for k in DIST_METRICS)


def _log_sd(xs) -> float:
    return float(np.std(np.log(np.asarray(xs, dtype=np.float64)), ddof=1))


def measured_noise(folder: Path = MEASURED) -> dict:
    """The measured noise components from the H200 between-process rows in ``folder`` (sources in words):
    ``run_sigma`` (sd of log per-process median ``step_ms``, content zeros), ``step_sigma`` (median within-process
    log sd), ``cold_*`` (``load_cold_start``); the attention path's spreads as ``contrast`` (not used). Raises
    ValueError: a file is missing or lacks a column (names it)."""
    import pandas as pd

    for f in (folder / n for n in ("content_loop.csv", "cold_start.csv", "step_spread.csv")):
        if not f.is_file():
            raise ValueError(f"{f} does not exist; the measured noise needs content_loop.csv, cold_start.csv and "
                             "step_spread.csv (mla-lab measure)")
    zeros = pd.read_csv(folder / "content_loop.csv").query("content == 'zeros'")
    step = between_process(zeros, ["content"], "step_ms")[("zeros",)]
    attn_loop = between_process(zeros, ["content"], "attn_path_ms")[("zeros",)]
    within = zeros.groupby("process")["step_ms"].apply(lambda v: float(np.std(np.log(v.to_numpy()), ddof=1)))
    alone = between_process(pd.read_csv(folder / "step_spread.csv"), ["what"], "gpu_ms")
    cold = load_cold_start(folder / "cold_start.csv", folder / "step_spread.csv")
    first = pd.read_csv(folder / "cold_start.csv").query("call == 1 and what == 'attention_path:private_workspace'")
    first_ms = (first["wall_ms"] - first["steady_wall_ms"]).to_numpy()
    rel = _rel(folder)
    vals = {"run_sigma": _log_sd(step["per_process"]), "step_sigma": float(within.median()), **cold["values"]}
    sources = {
        "run_sigma": f"{rel}/content_loop.csv step_ms (content zeros): sd of log of {step['n_processes']} "
                     f"per-process medians ({step['lo']:.1f} .. {step['hi']:.1f} ms), mla_lab.measure.spread",
        "step_sigma": f"{rel}/content_loop.csv step_ms (content zeros): median over processes of the within-process "
                      f"log sd over rounds ({within.min():.4f} .. {within.max():.4f})",
        "cold_extra_ms": f"{rel}/cold_start.csv wall_ms - steady_wall_ms at call 2, {' + '.join(cold['cases'])}, "
                         f"mean over {cold['num_processes']} processes",
        "cold_sd_ms": f"{rel}/cold_start.csv: sd over {cold['num_processes']} processes of the call-2 extra"}
    contrast = {"timed_alone_run_log_sd": {w[0]: _log_sd(v["per_process"]) for w, v in alone.items()},
                "attention_path_in_loop_run_log_sd": _log_sd(attn_loop["per_process"]),
                "step_ms_per_process_medians": step["per_process"], "layer_blocks": cold["layer_spread"]}
    return {"values": vals, "sources": sources, "contrast": contrast, "cold_call1_ms": cold["cold_call1_ms"],
            "attention_path_call1_ms": [float(first_ms.min()), float(first_ms.max())],
            "num_processes": step["n_processes"],
            "source": f"{rel}/ (content_loop.csv, cold_start.csv, step_spread.csv; {step['n_processes']} fresh "
                      "processes)"}


def what_moved(bench: BenchConfig, sched: SchedulerConfig, pricer, noise: NoiseConfig) -> list[dict]:
    """Deterministic runs adding one component at a time, from the lab's earlier model to the prediction."""
    queue = replace(NoiseConfig.none(), arrival=replace(noise.arrival, cv=0.0))
    cpu = replace(queue, cpu_step_ms=noise.cpu_step_ms)
    steps = [("lab's earlier model (all at the engine at t = 0, GPU time only)", NoiseConfig.none(), False),
             ("+ API-server arrival queue (mean service times)", queue, False), ("+ async scheduling", queue, True),
             ("+ per-step CPU time", cpu, True),
             ("+ token delivery delay", replace(cpu, output_delay_ms=noise.output_delay_ms), True),
             ("+ cold first large step (mean) = the prediction's deterministic run", noise.without_noise(), True)]
    keys = ("duration", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "output_throughput")
    return [{"step": label, **{k: m[k] for k in keys}} for label, nc, asy in steps
            for m in [simulate_once(bench, replace(sched, async_scheduling=asy), pricer, nc, None).metrics]]


def sensitivity(bench: BenchConfig, sched: SchedulerConfig, pricer, noise: NoiseConfig, num_runs: int,
                seed: int) -> list[dict]:
    """The identical-builds 95 % band of each TTFT statistic's change with one source of noise at a time."""
    q = noise.without_noise()
    cases = [("arrival jitter only", replace(q, arrival=noise.arrival)),
             ("per-run GPU-time factor only", replace(q, run_sigma=noise.run_sigma)),
             ("per-step GPU-time noise only", replace(q, step_sigma=noise.step_sigma)),
             ("cold first step spread only", replace(q, cold_sd_ms=noise.cold_sd_ms)), ("all", noise)]
    runs = [(label, run_noise(bench, sched, pricer, num_runs=num_runs, seed=seed, noise=nc)) for label, nc in cases]
    return [{"noise": label, **{k: list(r.band(k)) for k in TTFT_STATS + ("total_token_throughput",)}}
            for label, r in runs]


def arrival_sensitivity(bench: BenchConfig, st: dict, pricers: dict, noise: NoiseConfig, num_runs: int,
                        seed: int) -> list[dict]:
    """Per API-server service time per request (not measured on the PR's server): the deterministic run, the PR's
    change, the identical-builds band with arrival jitter only, and PR vs before with every source of noise."""
    rows = []
    for per in (0.1, noise.arrival.per_request_ms, 3.0, 10.0):
        am = replace(noise.arrival, per_request_ms=per)
        quiet = replace(noise.without_noise(), arrival=replace(am, cv=0.0))
        a, b = (simulate_once(bench, st[s]["sched"], pricers[s], quiet).metrics for s in (BEFORE, PR))
        r = run_noise(bench, st[BEFORE]["sched"], pricers[BEFORE], num_runs=num_runs, seed=seed,
                      noise=replace(quiet, arrival=am))
        ab = run_noise(bench, st[BEFORE]["sched"], pricers[BEFORE], pricers[PR], sched_b=st[PR]["sched"],
                       num_runs=num_runs, seed=seed, noise=replace(noise, arrival=am))
        tt = "total_token_throughput"
        rows.append({"per_request_ms": per, **{k: a[k] for k in ("mean_ttft_ms", "p99_ttft_ms", "duration")},
                     "pr_change_mean_ttft_pct": (b["mean_ttft_ms"] - a["mean_ttft_ms"]) / a["mean_ttft_ms"] * 100,
                     "identical_builds_band95_mean_ttft_jitter_only": list(r.band("mean_ttft_ms")),
                     "pr_vs_before_all_noise": {
                         "band95_mean_ttft": list(ab.band("mean_ttft_ms")),
                         "percentile_of_reported_mean_ttft": ab.percentile_of("mean_ttft_ms", REPORTED["mean_ttft_ms"]),
                         "band95_total_token_throughput": list(ab.band(tt)),
                         "percentile_of_reported_throughput": ab.percentile_of(tt, REPORTED[tt])},
                     "distinct_steps_priced": r.cache["a"]["misses"]})
    return rows


def code_commit() -> dict:
    """The last commit of the code that makes the prediction, and whether that code differs from it."""
    paths = ["mla_lab/serving", "mla_lab/model", "mla_lab/fits/predict_pr53878.py", "data/calibration", "data/models"]
    try:
        sha = subprocess.run(["git", "log", "-1", "--format=%H", "--", *paths], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=20).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *paths], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=20).stdout.strip()
        return {"commit": sha or "unknown", "paths": paths, "clean": not dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "paths": paths, "clean": False}


def distribution_rows(ident, prvs) -> list[str]:
    """The CSV lines (header first) of the per-run changes (%) of the two Monte-Carlo runs (``repr`` floats)."""
    return [DIST_HEADER] + [f"{case},{i}," + ",".join(repr(float(r.change[k][i])) for k in DIST_METRICS)
                            for case, r in (("identical_builds", ident), ("pr_vs_before", prvs))
                            for i in range(r.num_runs)]


def predict(num_runs: int = 1000, seed: int = 0, use_measurements: bool = True,
            distribution: list | None = None) -> dict:
    """The prediction as a JSON-ready dict; ``distribution`` receives :func:`distribution_rows`."""
    d = pr_deployment()  # per strategy: KV capacity, its SchedulerConfig and the deterministic metrics
    det = serve_benchmark(d, [BEFORE, ALT_BEFORE, PR], BENCH, block_size=BLOCK_SIZE)
    st = {s: {"kv_capacity_tokens": (cap := det["strategies"][s]["kv_capacity_tokens"]),
              "lab_metrics": det["strategies"][s]["metrics"], "sched": async_scheduler(d, cap, BLOCK_SIZE)}
          for s in (BEFORE, ALT_BEFORE, PR)}
    measured = measured_noise() if use_measurements else None
    noise = NoiseConfig() if measured is None else NoiseConfig().with_measurements(measured)
    pricers = {s: CachedPricer(CostModelPricer(d.rank, s)) for s in st}
    ident = run_noise(BENCH, st[BEFORE]["sched"], pricers[BEFORE], num_runs=num_runs, seed=seed, noise=noise)
    prvs = run_noise(BENCH, st[BEFORE]["sched"], pricers[BEFORE], pricers[PR], sched_b=st[PR]["sched"],
                     num_runs=num_runs, seed=seed, noise=noise)
    if distribution is not None:
        distribution.extend(distribution_rows(ident, prvs))
    alt = simulate_once(BENCH, st[ALT_BEFORE]["sched"], pricers[ALT_BEFORE], noise.without_noise()).metrics
    prediction = {k: {"deterministic": ident.deterministic_a[k], "median": q[1], "band95": [q[0], q[2]], "unit": unit,
                      "alt_before_stale_deterministic": alt[k], "lab_earlier_model": st[BEFORE]["lab_metrics"][k]}
                  for k, unit in PREDICTED.items() for q in [ident.quantiles(k, "a")]}
    changes = {}
    for k in TTFT_STATS + ("duration", "total_token_throughput", "output_throughput", "mean_tpot_ms"):
        row = {"identical_builds": {"band95": list(ident.band(k)), "median": ident.quantiles(k)[1]},
               "pr_vs_before": {"band95": list(prvs.band(k)), "median": prvs.quantiles(k)[1],
                                "deterministic": prvs.deterministic_change(k)}}
        if k in REPORTED:
            row["reported_by_pr"] = v = REPORTED[k]
            for case, r in (("identical_builds", ident), ("pr_vs_before", prvs)):
                row[case]["percentile_of_reported"] = r.percentile_of(k, v)
        changes[k] = row
    joint = {}
    for name, r in (("identical_builds", ident), ("pr_vs_before", prvs)):
        hit = (r.change["mean_ttft_ms"] <= REPORTED["mean_ttft_ms"]) & (
            r.change["total_token_throughput"] >= REPORTED["total_token_throughput"])
        joint[name] = {"percent_of_pairs": float(100.0 * hit.mean()),
                       "corr_mean_ttft_vs_throughput": float(np.corrcoef(r.change["mean_ttft_ms"],
                                                                         r.change["total_token_throughput"])[0, 1])}
    cal_files = (sorted(calibration_dir().glob("*.csv")) + [models_dir() / d.model.name / "config.json"]
                 + ([] if measured is None else [CONTENT_CSV, COLD_CSV, SPREAD_CSV]))
    return {
        "what": "prediction of vLLM PR #53878's 'main' run (vLLM before the PR), modelled; fitted to no end-to-end "
                "figure of that run",
        "produced_by": PRODUCED_BY,
        "command": f"python -m {PRODUCED_BY} --num-runs {num_runs} --seed {seed}"
                   + ("" if use_measurements else " --no-measurements"),
        "git_commit": git_commit(),
        "code_commit": code_commit(),
        "timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "deployment": {"model": "zai-org/GLM-5.2-FP8 (data/models/glm-5.2)", "tp": d.tp, "moe_parallel": "ep",
                       "gpu": "H200", "max_num_batched_tokens": d.max_num_batched_tokens,
                       "max_num_seqs": d.max_num_seqs, "block_size": BLOCK_SIZE, "kv_cache_dtype": "bf16",
                       "weight_dtype": "fp8", "gpu_memory_utilization": 0.9, "async_scheduling": True,
                       "strategy_before": BEFORE, "strategy_pr": PR,
                       "kv_capacity_tokens": {s: v["kv_capacity_tokens"] for s, v in st.items()}},
        "bench": {"num_prompts": BENCH.num_prompts, "random_input_len": BENCH.random_input_len,
                  "random_output_len": BENCH.random_output_len, "max_concurrency": BENCH.max_concurrency,
                  "request_rate": "inf", "ignore_eos": True, "seed": BENCH.seed},
        "calibration": {"layer": det["calibration"], "decode": det["decode_calibration"]},
        "calibration_files": [{"path": _rel(p), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                              for p in cal_files if p.is_file()],
        "measurements_used": None if measured is None else {k: v for k, v in measured.items()},
        "distribution_file": {"path": _rel(OUT.with_name(DIST_NAME)), "columns": DIST_HEADER.split(","),
                              "what": "per-run change (%) of each metric, one row per case and Monte-Carlo run "
                                      "(the runs of change_distribution)"},
        "noise": noise.record(),
        "num_runs": num_runs, "seed": seed,
        "prediction": prediction,
        "what_moved_it": what_moved(BENCH, st[BEFORE]["sched"], pricers[BEFORE], noise),
        "change_distribution": changes,
        "joint_reported": {"what": "percent of pairs of runs with mean TTFT change <= -9.5 % and total token "
                                   "throughput change >= +6 % together", **joint},
        "band_sensitivity": sensitivity(BENCH, st[BEFORE]["sched"], pricers[BEFORE], noise, min(num_runs, 300), seed),
        "arrival_sensitivity": arrival_sensitivity(BENCH, st, pricers, noise, min(num_runs, 150), seed),
        "notes": [
            "band95: the central 95 % of single runs of the Monte-Carlo (one build, one run each); deterministic: "
            "the run with every random quantity at its mean; median: the Monte-Carlo median.",
            "The two builds' runs are independent draws; change = (PR - before) / before * 100 per pair of runs.",
            "fp8 MoE GEMMs at decode sizes: measured-fit (data/calibration/h200_moe_decode.csv); all-reduces "
            "below 24 MiB: +26 us each, assumption (cited: NCCL tuning-model time, NVIDIA/nccl#1453).",
            "Not modelled: MTP, expert load imbalance, CUDA-graph batch padding, PIECEWISE graphs (priced eager).",
        ],
    }


DOCS = REPO_ROOT / "docs" / "serving.md"
BEGIN, END = "<!-- prediction:begin (mla_lab/fits/predict_pr53878.py --update-docs) -->", "<!-- prediction:end -->"
#: metric -> its name in the docs (NOISE_METRICS' label without its unit, lower case but for "P99")
_LABEL = {k: (lb[0].lower() + lb[1:] if lb[1].islower() else lb).rsplit(" (", 1)[0] for k, lb in NOISE_METRICS}


def _f(x: float, unit: str = "") -> str:
    return f"{x:.2f}" if unit in ("s", "req/s") else f"{x:.1f}"


def render_markdown(d: dict) -> str:
    """The prediction's tables and the plain sentences of docs/serving.md, from the prediction file ``d``."""
    P, C = d["prediction"], d["change_distribution"]
    src = d["noise"]["sources"]
    status = "; ".join(f"{st}: {', '.join(f'`{k}`' for k, v in src.items() if v['status'] == st)}"
                       for st in sorted({v["status"] for v in src.values()}))
    out = [f"Prediction file: commit `{d['git_commit']}` (code `{d['code_commit']['commit'][:12]}`), "
           f"{d['num_runs']} runs per build, seed {d['seed']}. Components {status}"
           + ("" if d["measurements_used"] is None else f" (measured: {d['measurements_used']['source']})") + ".",
           "",
           "| metric | deterministic | MC median | single-run 95 % band | stale-pad variant | lab's earlier model |",
           "|---|---|---|---|---|---|"]
    for k, p in P.items():
        u = p["unit"]
        out.append(f"| {_LABEL[k]} ({u}) | {_f(p['deterministic'], u)} | {_f(p['median'], u)} | "
                   f"[{_f(p['band95'][0], u)}, {_f(p['band95'][1], u)}] | "
                   f"{_f(p['alt_before_stale_deterministic'], u)} | {_f(p['lab_earlier_model'], u)} |")
    out += ["", "What moved it (deterministic runs, one component added at a time):", "",
            "| | duration (s) | mean TTFT | median TTFT | P99 TTFT | mean TPOT (ms) | output tok/s |",
            "|---|---|---|---|---|---|---|"]
    out += [f"| {r['step']} | {r['duration']:.3f} | {r['mean_ttft_ms']:.1f} | {r['median_ttft_ms']:.1f} | "
            f"{r['p99_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} | {r['output_throughput']:.1f} |"
            for r in d["what_moved_it"]]
    out += ["", "#### Is the PR's -9.5 % inside one run's noise?", "",
            "The change between two single runs (%; each build's run an independent draw):", "",
            "| statistic | A vs A': 95 % band | PR vs before: deterministic | PR vs before: 95 % band | "
            "reported by the PR | its percentile, A vs A' | its percentile, PR vs before |",
            "|---|---|---|---|---|---|---|"]
    for k, c in C.items():
        i, q = c["identical_builds"], c["pr_vs_before"]
        rep = (f"{c['reported_by_pr']:+.1f} | {i['percentile_of_reported']:.1f} | {q['percentile_of_reported']:.1f}"
               if "reported_by_pr" in c else "- | - | -")
        out.append(f"| {_LABEL[k]} | [{i['band95'][0]:+.2f}, {i['band95'][1]:+.2f}] | {q['deterministic']:+.2f} | "
                   f"[{q['band95'][0]:+.2f}, {q['band95'][1]:+.2f}] | {rep} |")
    out += ["", "Where the spread comes from (identical builds, 95 % band of the change, %, one source at a time):", "",
            "| noise | mean TTFT | median TTFT | P99 TTFT | total token throughput |", "|---|---|---|---|---|"]
    out += ["| " + " | ".join([r["noise"]] + [f"[{r[k][0]:+.2f}, {r[k][1]:+.2f}]" for k in TTFT_STATS
                                               + ("total_token_throughput",)]) + " |" for r in d["band_sensitivity"]]
    if d.get("arrival_sensitivity"):
        out += ["", "How much the API server's speed matters (not measured on the PR's server; the model's largest "
                "unknown):", "",
                "| service time per request (ms) | mean TTFT (ms) | P99 TTFT (ms) | PR's change of mean TTFT (%) | "
                "A vs A' 95 % band, mean TTFT, arrival jitter only (%) | PR vs before, all noise: 95 % band, mean "
                "TTFT (%) | -9.5 % at percentile | +6 % throughput at percentile | distinct steps priced |",
                "|---|---|---|---|---|---|---|---|---|"]
    for r in d.get("arrival_sensitivity", []):
        b = r["identical_builds_band95_mean_ttft_jitter_only"]
        f = r.get("pr_vs_before_all_noise")
        fb = (f"[{f['band95_mean_ttft'][0]:+.2f}, {f['band95_mean_ttft'][1]:+.2f}] | "
              f"{f['percentile_of_reported_mean_ttft']:.1f} | {f['percentile_of_reported_throughput']:.1f}"
              if f else "- | - | -")
        out.append(f"| {r['per_request_ms']:g} | {r['mean_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | "
                   f"{r['pr_change_mean_ttft_pct']:+.2f} | [{b[0]:+.2f}, {b[1]:+.2f}] | {fb} | "
                   f"{r['distinct_steps_priced']} |")
    i, q = C["mean_ttft_ms"]["identical_builds"], C["mean_ttft_ms"]["pr_vs_before"]
    t, n = C["total_token_throughput"], d["num_runs"]
    out += ["", "What the lab can and cannot say, with these figures:", "",
            f"- Two runs of the *same* build differ in mean TTFT by {i['band95'][0]:+.1f} % to {i['band95'][1]:+.1f} % "
            f"(95 % of pairs). The PR's -9.5 % lies {_at(i['percentile_of_reported'], n)} of that: "
            + ("outside the band, so under this noise model it is not what two runs of one build show."
               if not 2.5 <= i["percentile_of_reported"] <= 97.5 else "inside the band: one run per build cannot "
               "tell it from noise."),
            f"- With the PR's modelled effect ({q['deterministic']:+.2f} % mean TTFT), one run each gives "
            f"{q['band95'][0]:+.1f} % to {q['band95'][1]:+.1f} %; -9.5 % lies {_at(q['percentile_of_reported'], n)}"
            + (". Under this noise model the lab's modelled effect plus one unlucky pair of runs does not reach the "
               "PR's -9.5 %: either a mechanism or a source of run-to-run spread the lab does not model, or a "
               "different run from the one modelled." if q["percentile_of_reported"] < 2.5 else
               f": a pair of runs that far out happens about {q['percentile_of_reported']:.0f} times in 100, so the "
               "lab cannot rule out that the PR's -9.5 % is the modelled effect plus one unlucky pair of runs, nor "
               "show that it is."),
            f"- The PR's +6 % total token throughput lies {_at(t['pr_vs_before']['percentile_of_reported'], n)}"
            f" of the PR-vs-before distribution (A vs A': {_at(t['identical_builds']['percentile_of_reported'], n)})."
            + (f" Both at once (-9.5 % mean TTFT and +6 % throughput in the same pair of runs): "
               f"{d['joint_reported']['pr_vs_before']['percent_of_pairs']:.1f} % of PR-vs-before pairs, "
               f"{d['joint_reported']['identical_builds']['percent_of_pairs']:.1f} % of A-vs-A' pairs (the two "
               "changes move together: a faster run is faster everywhere)." if "joint_reported" in d else ""),
            _spread_sentence(d) + _arrival_sentence(d),
            "- The lab cannot rule out a mechanism it does not model (the list under 'Not modelled' and the "
            "pricer's uncalibrated parts), and a single run of the PR's own benchmark cannot separate the two "
            "explanations: the median of >= 3 warmed runs per build (vllm-project/perf-eval#59) would."]
    return "\n".join(out)


def _at(pct: float, n: int) -> str:
    """Where a reported figure lies in ``n`` simulated pairs, in words (percentile 0 or 100: beyond every run)."""
    if pct <= 0.0:
        return f"below all {n} simulated pairs (percentile 0.0)"
    if pct >= 100.0:
        return f"above all {n} simulated pairs (percentile 100.0)"
    return f"at percentile {pct:.1f}"


def _spread_sentence(d: dict) -> str:
    """Which figures carry the spread, and their status (from the prediction file)."""
    v, src = d["noise"]["values"], d["noise"]["sources"]
    run = {r["noise"]: r["mean_ttft_ms"] for r in d["band_sensitivity"]}.get("per-run GPU-time factor only")
    return ("- The spread of one run is mostly the per-run GPU-time factor, log sd "
            f"{v['run_sigma']:.4f} ({src['run_sigma']['status']}: the between-process spread of a whole sustained "
            "step on one H200, 5 fresh processes)"
            + (f", alone [{run[0]:+.2f}, {run[1]:+.2f}] % of mean TTFT" if run else "")
            + f"; the per-step noise (log sd {v['step_sigma']:.4f}, {src['step_sigma']['status']}) and the cold "
            f"first large step ({v['cold_extra_ms']:.2f} ms, sd {v['cold_sd_ms']:.2f} ms, "
            f"{src['cold_extra_ms']['status']}; the fresh process's first calls, "
            + (f"{d['measurements_used']['attention_path_call1_ms'][0] / 1e3:.1f}-"
               f"{d['measurements_used']['attention_path_call1_ms'][1] / 1e3:.1f} s for the attention path (Triton "
               "JIT or its disk cache, the FlashMLA module load) and "
               f"{d['measurements_used']['cold_call1_ms']:.0f} ms more for one layer's blocks, "
               if d.get("measurements_used") else "")
            + "are paid at start-up and by the ready-check request, before the timed requests) add little. These "
            "are one GPU's kernel-level spreads, not a measured vLLM server's (its 8 GPUs, host and clocks).")


def _arrival_sentence(d: dict) -> str:
    rows = d.get("arrival_sensitivity") or []
    if not rows:
        return ""
    parts = [f"{r['per_request_ms']:g} ms: [{r['identical_builds_band95_mean_ttft_jitter_only'][0]:+.1f}, "
             f"{r['identical_builds_band95_mean_ttft_jitter_only'][1]:+.1f}] %" for r in rows]
    worst = max(rows, key=lambda r: r.get("pr_vs_before_all_noise", {}).get("percentile_of_reported_mean_ttft", 0))
    f = worst.get("pr_vs_before_all_noise")
    tail = ("" if not f else
            f" The least favourable service time tried ({worst['per_request_ms']:g} ms) puts the PR's -9.5 % at "
            f"percentile {f['percentile_of_reported_mean_ttft']:.1f} of PR vs before (band "
            f"[{f['band95_mean_ttft'][0]:+.1f}, {f['band95_mean_ttft'][1]:+.1f}] %).")
    return (" Arrival jitter alone moves the A-vs-A' band of mean TTFT by the API server's service time per request "
            "(" + "; ".join(parts) + "): where the 32 prompts reach the engine core within the first step, they "
            "split over steps the same way in every run; when the spread is about as long as that step, the split "
            "changes from run to run. The lab has no measurement of that service time on the PR's server: it is the "
            "largest unmeasured factor." + tail)


def update_docs(d: dict, path: Path = DOCS) -> None:
    """Replace the block between the prediction markers of docs/serving.md with :func:`render_markdown`."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{path} has no prediction markers ({BEGIN} ... {END}); nothing written")
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:a] + "\n" + render_markdown(d) + "\n" + text[b:])


def _refuse_out(a) -> str | None:
    """Why ``--out`` (and the distribution CSV beside it) may not be written (None: it may)."""
    out = Path(a.out)
    if out.is_dir():
        return f"--out={a.out!r} is a folder; it must be a .json file path"
    if out.exists():
        try:
            ours = json.loads(out.read_text()).get("produced_by") in (PRODUCED_BY, *EARLIER_PRODUCERS)
        except (ValueError, AttributeError):
            ours = False
        if not ours:
            return f"--out={a.out!r} exists and was not written by {PRODUCED_BY}; refusing to overwrite it"
    dist = out.with_name(DIST_NAME)
    if dist.exists() and (not dist.is_file() or dist.read_text().split("\n", 1)[0] != DIST_HEADER):
        return (f"--out={a.out!r}: {dist} exists and was not written by {PRODUCED_BY} (its header is not "
                f"{DIST_HEADER!r}); refusing to overwrite it")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-runs", type=int, default=1000, help="Monte-Carlo runs per build (>= 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-measurements", action="store_true", help="do not recompute the measured components from "
                    "data/measured/h200/between_process/ (use the defaults of mla_lab.serving.noise.COMPONENTS)")
    ap.add_argument("--update-docs", action="store_true", help="rewrite the prediction block of docs/serving.md")
    ap.add_argument("--docs-only", action="store_true", help="only --update-docs from the existing --out file")
    a = ap.parse_args(argv)
    out = Path(a.out)
    why = (f"--num-runs={a.num_runs} must be an int >= 2" if a.num_runs < 2 else
           f"--seed={a.seed} must be an int >= 0" if a.seed < 0 else
           (None if out.is_file() else f"--out={a.out!r} does not exist; run without --docs-only first")
           if a.docs_only else _refuse_out(a))
    if why:
        print(why, file=sys.stderr)
        return 2
    if not a.docs_only:
        rows: list = []
        res = predict(a.num_runs, a.seed, not a.no_measurements, distribution=rows)
        out.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(rows) + "\n"
        dist = out.with_name(DIST_NAME)
        res["distribution_file"].update(path=_rel(dist), sha256=hashlib.sha256(text.encode()).hexdigest())
        dist.write_text(text)
        out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"-> {out}\n-> {dist}")
    if a.docs_only or a.update_docs:
        update_docs(json.loads(out.read_text()) if a.docs_only else res)
        print(f"-> {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
