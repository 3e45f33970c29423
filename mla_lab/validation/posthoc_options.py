"""Blind round two re-predicted POST HOC with the deployment options (issue 37): MTP / EAGLE and SGLang's DP
attention, which ``data/validation/blind_2026-12b.json`` priced at the nearest vLLM TP8 configuration. NOT blind,
nothing fitted (acceptance lengths as the cells state them). Per cell and metric: the blind error, the deterministic
run without the options and with them. SGLang's EAGLE ``speculative_num_steps`` s (``eagle_topk`` 1) is
``num_speculative_tokens`` s.

    python -m mla_lab.validation.posthoc_options [--write [--overwrite]] [--only CASE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ..paths import REPO_ROOT
from ..provenance import git_commit
from . import BLIND_B, BLIND_B_POSTHOC, BLIND_B_RESULTS, BLIND_B_SCORE, BLIND_B_WORKLOADS, write_record
from .blind import cases_of, deterministic, request_steps
from .score import METRIC_CLASS

PRODUCED_BY = "python -m mla_lab.validation.posthoc_options --write"
#: the run without the options is skipped above this many request-steps (the TP8 simulation of 5120+ prompts x 1025
#: steps, ~7 min each on a 2-core machine: why the blind round left those cells unpriced)
WITHOUT_MAX_REQUEST_STEPS = 1_500_000


def options_of(case: dict) -> dict:
    """The Deployment options a round-two case states. Raises ValueError: ``speculative_eagle_topk`` not 1."""
    out: dict = {}
    spec = case.get("speculative")
    if spec:
        if spec.get("speculative_eagle_topk", 1) != 1:
            raise ValueError(f"case {case['id']}: speculative_eagle_topk={spec['speculative_eagle_topk']!r}; "
                             "allowed: 1 (a chain of drafts)")
        out["num_speculative_tokens"] = int(spec["speculative_num_steps"])
        out["acceptance_length"] = float(spec["acceptance_length"])
    par = case.get("parallel") or {}
    if par.get("dp_attention"):
        out["dp_attention"] = int(par["dp"])
    return out


def _key(case_id: str, w: dict, metric: str) -> tuple:
    return (case_id, w["random_input_len"], w["random_output_len"], w.get("max_concurrency"), metric)


def posthoc_options(only: str | None = None, log=print) -> dict:
    """Every round-two case with MTP or DP attention re-run with and without its options: rows per (case, workload,
    metric) with the three errors, and :func:`summarise`."""
    blind = {_key(r["case"], r["workload"], r["metric"]): r for r in json.loads(BLIND_B_SCORE.read_text())["rows"]}
    real = {_key(c["id"], r["workload"], m): float(v) for c in json.loads(BLIND_B_RESULTS.read_text())["cases"]
            for r in c["runs"] for m, v in (r.get("metrics") or {}).items()
            if v and (r.get("comparable") or {}).get(m, True)}
    rows, runs = [], []
    for case in cases_of("2026-12b"):
        opts = options_of(case)
        if not opts or only not in (None, case["id"]):
            continue
        for wl in case["workloads"]:
            i, o, c, n, rate = wl
            w = {"random_input_len": i, "random_output_len": o, "max_concurrency": c, "num_prompts": n}
            t0 = time.time()
            with_opts = deterministic(case, wl, opts)
            heavy = request_steps(case, wl) > WITHOUT_MAX_REQUEST_STEPS
            without = None if heavy else deterministic(case, wl, {})
            runs.append({"case": case["id"], "workload": w, "options": opts, "options_priced": with_opts["options"],
                         "kv_capacity_tokens": with_opts["kv_capacity_tokens"],
                         "kv_capacity_tokens_without": None if without is None else without["kv_capacity_tokens"],
                         "without_not_run": (f"TP8 simulation of {request_steps(case, wl):,} request-steps "
                                             f"(> {WITHOUT_MAX_REQUEST_STEPS:,})") if heavy else "",
                         "seconds": round(time.time() - t0, 1)})
            for m in sorted({k[4] for k in real if k[:4] == _key(case["id"], w, "")[:4]}):
                truth = real[_key(case["id"], w, m)]
                b = blind.get(_key(case["id"], w, m), {})
                p = float(with_opts["metrics"][m])
                q = None if without is None else float(without["metrics"][m])
                rows.append({"case": case["id"], "workload": w, "metric": m, "class": METRIC_CLASS.get(m, "other"),
                             "real": truth, "posthoc": p, "error_pct": (p - truth) / truth * 100, "without_options": q,
                             "error_pct_without_options": None if q is None else (q - truth) / truth * 100,
                             "blind_predicted": b.get("predicted"), "blind_error_pct": b.get("error_pct")})
            log(f"{case['id']} {w}: {runs[-1]['seconds']} s; " + ", ".join(
                f"{r['metric']} {r['error_pct']:+.0f} % (blind {r['blind_error_pct'] or float('nan'):+.0f} %)"
                for r in rows if r["case"] == case["id"] and r["workload"] == w))
    return {"what": "POST HOC (not blind): blind round two's cells with MTP / DP attention re-predicted with the "
                    "deployment options built after the results were read (issue 37); nothing fitted, acceptance "
                    "lengths as the cells state them; the blind scores stay in blind_2026-12b_score.json",
            "produced_by": PRODUCED_BY, "git_commit": git_commit(), "posthoc": True,
            "inputs": {k: str(v.relative_to(REPO_ROOT)) for k, v in (("workloads", BLIND_B_WORKLOADS),
                       ("predictions", BLIND_B), ("results", BLIND_B_RESULTS), ("score", BLIND_B_SCORE))},
            "model": "deterministic mla_lab.serving.serve_benchmark (no noise model) with the deployment options "
                     "(mla_lab.serving.deploy_options); 'without_options' the same run at the blind round's nearest "
                     "configuration; 'blind_error_pct' the blind round's noise-model median error",
            "runs": runs, "rows": rows, "summary": summarise(rows)}


def _med(xs: list) -> float | None:
    return statistics.median(abs(x) for x in xs) if xs else None


def summarise(rows: list[dict]) -> dict:
    """Median |error| (%) per metric class and over all: with the options, without, blind, over the rows with all
    three (``n``); with the options over every row (``n_all``)."""
    out = {}
    for cl in sorted({r["class"] for r in rows}) + ["all"]:
        rs = [r for r in rows if cl in ("all", r["class"])]
        full = [r for r in rs if r["error_pct_without_options"] is not None and r["blind_error_pct"] is not None]
        out[cl] = {"n": len(full), "median_abs_error_pct": _med([r["error_pct"] for r in full]),
                   "median_abs_error_pct_without_options": _med([r["error_pct_without_options"] for r in full]),
                   "median_abs_blind_error_pct": _med([r["blind_error_pct"] for r in full]),
                   "n_all": len(rs), "median_abs_error_pct_all": _med([r["error_pct"] for r in rs])}
    return out


def posthoc_sentence(doc: dict) -> str:
    """One line for docs/serving.md from the committed file's summary."""
    parts = [f"{cl} {x['median_abs_error_pct']:.0f} % (without the options "
             f"{x['median_abs_error_pct_without_options']:.0f} %, blind {x['median_abs_blind_error_pct']:.0f} %, "
             f"{x['n']} rows)"
             for cl in ("TTFT", "TPOT", "throughput") if (x := doc["summary"].get(cl)) and x["n"]]
    return ("Post hoc (not blind; data/validation/blind_2026-12b_posthoc.json), the round-two cells with MTP or DP "
            "attention re-predicted with the options, median |error|: " + "; ".join(parts) + ".")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.posthoc_options")
    ap.add_argument("--write", action="store_true", help=f"write {BLIND_B_POSTHOC.relative_to(REPO_ROOT)}")
    ap.add_argument("--overwrite", action="store_true", help="replace the committed file")
    ap.add_argument("--only", default=None, help="one case id (a dry look; not for --write)")
    a = ap.parse_args(argv)
    if a.write and a.only:
        ap.error("--only=... with --write would commit part of the round; allowed: one of them")
    d = posthoc_options(a.only)
    if a.write:
        write_record(BLIND_B_POSTHOC, d, a.overwrite, ap)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
