"""Blind predictions of public serving runs (issues 30, 37), committed before any result is read (protocol:
docs/serving.md). ``python -m mla_lab.validation.blind predict [--round 2026-12b]`` writes the round's file from
:func:`mla_lab.serving.noise.serve_benchmark_noise`; round two's cases come from its committed workloads file.

Engine facts (release wheels' sources, not run): vLLM 0.13.0 / 0.24.0 on Hopper serve sparse MLA only through
``FLASHMLA_SPARSE`` (``vllm/platforms/cuda.py``), Q padded to 64 heads by ``q.new_empty`` per call (0.13.0
``flashmla_sparse.py:936``, 0.24.0 ``:841``); ``vllm serve`` defaults on a >= 70 GiB GPU: max_num_batched_tokens
8192, max_num_seqs 1024 (``vllm/engine/arg_utils.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from pathlib import Path

from ..deployment import Deployment
from ..provenance import git_commit
from ..serving import BenchConfig, serve_benchmark
from ..serving.noise import NOISE_METRICS, serve_benchmark_noise
from . import BLIND, BLIND_B, BLIND_B_WORKLOADS, BLIND_CASES

PRODUCED_BY = "python -m mla_lab.validation.blind predict"
#: request-steps above which a run gets fewer Monte-Carlo runs (the simulation costs ~70 us per request-step here)
HEAVY_REQUEST_STEPS = 150_000
NUM_RUNS, NUM_RUNS_HEAVY = 10, 3

#: vllm serve defaults on an H200 (vllm/engine/arg_utils.py, 0.13.0 and 0.24.0, OPENAI_API_SERVER, >= 70 GiB)
SERVE_DEFAULTS = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024}
#: round name -> (prediction file, the committed file its cases come from)
ROUNDS = {"2026-12": (BLIND, BLIND_CASES), "2026-12b": (BLIND_B, BLIND_B_WORKLOADS)}
#: Deployment.of arguments a case may set (round two: ``deployment``); the rest are round one's fixed values
_DEPLOYMENT_DEFAULTS = {"tp": 8, "arch": "h200", "max_num_batched_tokens": SERVE_DEFAULTS["max_num_batched_tokens"],
                        "max_num_seqs": SERVE_DEFAULTS["max_num_seqs"], "kv_cache_dtype": "bf16",
                        "weight_dtype": "fp8", "moe_parallel": "tp", "gpu_memory_utilization": 0.9}


def _wl_tuple(w: dict) -> tuple:
    rate = w.get("request_rate", "inf")
    return (int(w["random_input_len"]), int(w["random_output_len"]),
            None if w.get("max_concurrency") is None else int(w["max_concurrency"]), int(w["num_prompts"]),
            math.inf if rate in ("inf", None) else float(rate))


def cases_of(round_: str) -> list[dict]:
    """The cases of ``round_`` (a key of :data:`ROUNDS`), workloads as ``(input, output, concurrency, num_prompts,
    rate)``. Raises ValueError: an unknown round; FileNotFoundError: its file is missing."""
    if round_ not in ROUNDS:
        raise ValueError(f"round={round_!r} is not a blind round; allowed: {sorted(ROUNDS)}")
    doc = json.loads(Path(ROUNDS[round_][1]).read_text())
    return [{**c, "workloads": [_wl_tuple(w) for w in c["workloads"]]} for c in doc["cases"]]


#: round one's cases (read once at import: posthoc and the tests use them)
CASES = cases_of("2026-12")


_PROTOCOL = {
    "2026-12": "this file is committed before its sources are read; the results go in blind_2026-12_results.json "
               "in a later commit; nothing is fitted to them",
    "2026-12b": "the workloads (blind_2026-12b_workloads.json, whose protocol says what was seen while finding the "
                "runs) were written first; this file comes from the model as committed and is committed before any "
                "result is written down (blind_2026-12b_results.json, a later commit); nothing is fitted to them",
}


def request_steps(case: dict, wl: tuple, dp: int = 1) -> int:
    """Request-steps of workload ``wl`` under ``case``'s deployment split over ``dp`` ranks (the simulation's cost)."""
    i, o, _, n, _ = wl
    mbt = {**_DEPLOYMENT_DEFAULTS, **case.get("deployment", {})}["max_num_batched_tokens"]
    return math.ceil(n / dp) * (2 * math.ceil(i / max(mbt // dp, 1)) + o)


def _setup(case: dict, wl: tuple, seed: int = 0, options: dict | None = None) -> tuple:
    """``case``'s deployment (its own fields over round one's) and the client of workload ``wl``."""
    i, o, c, n, rate = wl
    d = {**_DEPLOYMENT_DEFAULTS, **case.get("deployment", {}), **(options or {})}
    dep = Deployment.of(model=case["model"], prompt_len=i, output_len=o, num_prompts=n, concurrency=c, **d)
    return dep, BenchConfig(num_prompts=n, random_input_len=i, random_output_len=o, max_concurrency=c,
                            request_rate=rate, seed=seed)


def deterministic(case: dict, wl: tuple, options: dict | None = None, strategy: str | None = None) -> dict:
    """One deterministic run of ``strategy`` (default the case's first) on ``wl`` with deployment ``options``."""
    dep, bench = _setup(case, wl, options=options)
    strat = strategy or next(iter(case["strategies"].values()))
    r = serve_benchmark(dep, [strat], bench, baseline=strat)
    s = r["strategies"][strat]
    return {"metrics": s["metrics"], "kv_capacity_tokens": s["kv_capacity_tokens"], "options": r["options"]}


def _run(case: dict, wl: tuple, seed: int, log) -> dict:
    i, o, c, n, rate = wl
    strategies = list(case["strategies"].values())
    runs = NUM_RUNS if request_steps(case, wl) * len(strategies) <= HEAVY_REQUEST_STEPS else NUM_RUNS_HEAVY
    t0 = time.time()
    wl_rec = {"random_input_len": i, "random_output_len": o, "max_concurrency": c, "num_prompts": n,
              "request_rate": "inf" if math.isinf(rate) else rate}
    if case.get("not_priced_reason"):  # decided before reading, in the workloads file
        log(f"  {case['id']} {wl_rec}: not priced ({case['not_priced_reason']})")
        return {"workload": wl_rec, "not_priced": case["not_priced_reason"]}
    try:
        dep, bench = _setup(case, wl, seed)
        r = serve_benchmark_noise(dep, strategies, bench, num_runs=runs, seed=seed, baseline=strategies[0])
    except Exception as e:  # a run the lab cannot price is recorded as such, before reading
        log(f"  {case['id']} {wl_rec}: not priced ({type(e).__name__}: {e})")
        return {"workload": wl_rec, "not_priced": f"{type(e).__name__}: {e}"}
    by_name = {v: k for k, v in case["strategies"].items()}
    out = {"workload": wl_rec, "num_runs": runs, "seconds": round(time.time() - t0, 1), "backends": {
        by_name.get(s, s): {"strategy": s, "metrics": {
            k: {"median": round(v["median"], 4), "band95": [round(x, 4) for x in v["band95"]]} for k, v in m.items()}}
        for s, m in r["strategies"].items()}, "changes_pct": {by_name.get(s, s): {
            k: {"median": round(v["median"], 3), "band95": [round(x, 3) for x in v["band95"]],
                "deterministic": round(v["deterministic"], 3)} for k, v in m.items()} for s, m in r["changes"].items()}}
    log(f"  {case['id']} {wl_rec}: {runs} runs, {out['seconds']} s; " + ", ".join(
        f"{b}: TPOT {x['metrics']['mean_tpot_ms']['median']:.1f} ms, TTFT {x['metrics']['mean_ttft_ms']['median']:.0f} ms"
        for b, x in out["backends"].items()))
    return out


def predict(out: Path | None = None, seed: int = 0, only: str | None = None, log=print,
            round_: str = "2026-12") -> dict:
    """Run every case of ``round_`` (or ``only``) and write ``out`` (default the round's file) after each case.
    Raises FileExistsError: ``out`` was not written by :data:`PRODUCED_BY`; ValueError: unknown ``only`` / round."""
    all_cases = cases_of(round_)
    out = Path(ROUNDS[round_][0] if out is None else out)
    if out.exists() and json.loads(out.read_text()).get("produced_by") != PRODUCED_BY:
        raise FileExistsError(f"out={out} exists and was not written by {PRODUCED_BY}: refusing to replace it")
    cases = [c for c in all_cases if only in (None, c["id"])]
    if not cases:
        raise ValueError(f"only={only!r} is not a case; allowed: {[c['id'] for c in all_cases]}")
    rec = {"what": "blind predictions of public serving runs, written before any result of them was read (issue 30)",
           "produced_by": PRODUCED_BY, "git_commit": git_commit(),
           "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "round": round_, "protocol": _PROTOCOL[round_],
           "model": "modelled: mla_lab.serving.noise.serve_benchmark_noise (step-level vllm bench serve simulation, "
                    "cost model with the committed H200 calibration, decode kernels priced by their parallelism "
                    "(data/calibration/h200_decode_kernels.csv), single-run 95 % bands of the noise model; band = "
                    "the 2.5-97.5 % of num_runs simulated single runs)",
           "metrics": [k for k, _ in NOISE_METRICS],
           "assumed_everywhere": json.loads(BLIND_CASES.read_text())["assumed_everywhere"],
           "serve_defaults": SERVE_DEFAULTS, "seed": seed, "cases": []}
    for case in cases:
        log(f"{case['id']}: {len(case['workloads'])} workloads")
        c = {k: v for k, v in case.items() if k != "workloads"}
        c["runs"] = [_run(case, wl, seed, log) for wl in case["workloads"]]
        rec["cases"].append(c)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1) + "\n")  # after every case: a run cut short keeps what it had
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.blind")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict", help="write the blind predictions (before reading any source)")
    p.add_argument("--round", dest="round_", default="2026-12", help=f"one of {sorted(ROUNDS)}")
    p.add_argument("--out", default=None, help="default: the round's file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="one case id of the round")
    a = ap.parse_args(argv)
    try:
        predict(None if a.out is None else Path(a.out), a.seed, a.only, round_=a.round_)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        ap.error(str(e))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
