"""The blind set scored (issue 30): the lab's predictions (``data/validation/blind_2026-12.json``, committed first)
beside the runs' published figures (``data/validation/blind_2026-12_results.json``, committed after, with their
sources), and the errors per metric. Nothing here changes a prediction; a miss is published as it is.

``error_pct = (predicted median - real) / real x 100``; ``inside_band``: the real figure lies in the lab's single-run
95 % band. A workload of the source that the file did not predict is listed under ``not_predicted``; a prediction the
source has no figure for, under ``no_result``. ``python -m mla_lab.validation.score --write`` writes
``data/validation/blind_2026-12_score.json`` (what the report, README and tests read).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from ..paths import REPO_ROOT

__all__ = ["PRED", "RESULTS", "SCORE", "score", "main", "METRIC_CLASS"]

PRED = REPO_ROOT / "data" / "validation" / "blind_2026-12.json"
RESULTS = REPO_ROOT / "data" / "validation" / "blind_2026-12_results.json"
SCORE = REPO_ROOT / "data" / "validation" / "blind_2026-12_score.json"
#: metric -> class the summary groups by
METRIC_CLASS = {"duration": "throughput", "request_throughput": "throughput", "output_throughput": "throughput",
                "total_token_throughput": "throughput", "mean_ttft_ms": "TTFT", "median_ttft_ms": "TTFT",
                "p99_ttft_ms": "TTFT", "mean_tpot_ms": "TPOT", "median_tpot_ms": "TPOT", "p99_tpot_ms": "TPOT",
                "mean_itl_ms": "TPOT"}


def _key(w: dict) -> tuple:
    return (int(w["random_input_len"]), int(w["random_output_len"]),
            None if w.get("max_concurrency") in (None, "None") else int(w["max_concurrency"]))


def score(pred: dict, results: dict) -> dict:
    """Pair every published figure with its prediction (module docstring)."""
    by_case = {c["id"]: c for c in pred["cases"]}
    rows, not_predicted, no_result, change_rows = [], [], [], []
    for rc in results["cases"]:
        pc = by_case.get(rc["id"])
        if pc is None:
            raise ValueError(f"results case {rc['id']!r} has no prediction in {PRED.name}")
        pruns = {_key(r["workload"]): r for r in pc["runs"] if "backends" in r}
        seen = set()
        for rr in rc.get("runs", []):
            k = _key(rr["workload"])
            pr = pruns.get(k)
            if pr is None or rr["backend"] not in pr["backends"]:
                not_predicted.append({"case": rc["id"], "workload": rr["workload"], "backend": rr["backend"]})
                continue
            seen.add(k)
            pm = pr["backends"][rr["backend"]]["metrics"]
            for m, real in rr["metrics"].items():
                if m not in pm or real in (None, 0):
                    continue
                p = pm[m]["median"]
                lo, hi = pm[m]["band95"]
                rows.append({"case": rc["id"], "workload": rr["workload"], "backend": rr["backend"], "metric": m,
                             "class": METRIC_CLASS.get(m, "other"), "predicted": p, "band95": [lo, hi],
                             "real": real, "error_pct": (p - real) / real * 100, "inside_band": lo <= real <= hi})
        for rch in rc.get("changes", []):
            k = _key(rch["workload"])
            pr = pruns.get(k)
            if pr is None or not pr.get("changes_pct"):
                continue
            (b, ch), = pr["changes_pct"].items()
            m = rch["metric"]
            if m in ch:
                change_rows.append({"case": rc["id"], "workload": rch["workload"], "metric": m, "backend": b,
                                    "predicted_pct": ch[m]["median"], "band95": ch[m]["band95"],
                                    "real_pct": rch["change_pct"],
                                    "inside_band": ch[m]["band95"][0] <= rch["change_pct"] <= ch[m]["band95"][1]})
        for k, pr in pruns.items():
            if k not in seen:
                no_result.append({"case": rc["id"], "workload": pr["workload"]})
    summary = {}
    for case in {r["case"] for r in rows}:
        for cls in ("TPOT", "TTFT", "throughput"):
            errs = [abs(r["error_pct"]) for r in rows if r["case"] == case and r["class"] == cls]
            if errs:
                summary[f"{case}/{cls}"] = {"n": len(errs), "median_abs_error_pct": statistics.median(errs),
                                            "max_abs_error_pct": max(errs),
                                            "inside_band": sum(r["inside_band"] for r in rows if r["case"] == case
                                                               and r["class"] == cls)}
    allerr = [abs(r["error_pct"]) for r in rows]
    n_in = sum(r["inside_band"] for r in rows)
    sentence = (f"Scored blind on {len(rows)} published figures of {len({r['case'] for r in rows})} public runs "
                f"(predictions committed before reading): median |error| {statistics.median(allerr):.0f} %, "
                f"{n_in} of {len(rows)} inside the lab's single-run band" if rows else "No published figure scored.")
    return {"what": "the blind set scored: predictions vs published figures (issue 30)",
            "produced_by": "python -m mla_lab.validation.score --write", "rows": rows, "changes": change_rows,
            "summary": summary, "not_predicted": not_predicted, "no_result": no_result, "sentence": sentence}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.score")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    for p in (PRED, RESULTS):
        if not p.exists():
            ap.error(f"{p} does not exist")
    s = score(json.loads(PRED.read_text()), json.loads(RESULTS.read_text()))
    print(s["sentence"])
    for k, v in sorted(s["summary"].items()):
        print(f"  {k}: n {v['n']}, median |error| {v['median_abs_error_pct']:.1f} %, max {v['max_abs_error_pct']:.1f} %,"
              f" inside band {v['inside_band']}")
    for c in s["changes"]:
        print(f"  change {c['case']} {c['workload']} {c['metric']}: predicted {c['predicted_pct']:+.1f} % "
              f"{c['band95']}, real {c['real_pct']:+.1f} %")
    if a.write:
        if SCORE.exists() and not a.overwrite:
            ap.error(f"{SCORE} exists: pass --overwrite to replace it")
        SCORE.write_text(json.dumps(s, indent=1) + "\n")
        print(f"wrote {SCORE}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
