"""Post-hoc runs of blind round one (issue 30): the same model with each run's workload as its source states it.
NOT blind, nothing fitted; the H20 run is left out (no H20 calibration).

    python -m mla_lab.validation.posthoc [--write [--overwrite]]   # -> data/validation/blind_2026-12_posthoc.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..provenance import git_commit
from . import BLIND_POSTHOC, BLIND_RESULTS, write_record
from .blind import CASES, deterministic
from .score import METRIC_CLASS


def posthoc(log=print) -> dict:
    """Deterministic runs (no noise model) of every published run the lab can price, as the source states it."""
    rows = []
    for rc in json.loads(BLIND_RESULTS.read_text())["cases"]:
        case = next(c for c in CASES if c["id"] == rc["id"])
        for rr in rc["runs"]:
            a, w = rr.get("as_run", {}), rr["workload"]
            if a.get("gpu", "H200") != "H200":
                continue
            rate = a.get("request_rate", "inf")
            wl = (w["random_input_len"], w["random_output_len"], w.get("max_concurrency"), int(a["num_prompts"]),
                  math.inf if rate == "inf" else float(rate))
            m = deterministic(case, wl, strategy=case["strategies"][rr["backend"]])["metrics"]
            rows += [{"case": rc["id"], "workload": w, "as_run": a, "backend": rr["backend"], "metric": k,
                      "class": METRIC_CLASS.get(k, "other"), "posthoc": float(m[k]), "real": real,
                      "error_pct": (float(m[k]) - real) / real * 100} for k, real in rr["metrics"].items()
                     if k in m and real]
            log(f"{rc['id']} {w} {rr['backend']}: TPOT {m['mean_tpot_ms']:.1f} vs {rr['metrics'].get('mean_tpot_ms')}")
    return {"what": "post-hoc runs of the blind set with each run's stated workload: NOT blind, nothing fitted",
            "produced_by": "python -m mla_lab.validation.posthoc --write", "git_commit": git_commit(), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.validation.posthoc")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    d = posthoc()
    if a.write:
        write_record(BLIND_POSTHOC, d, a.overwrite, ap)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
