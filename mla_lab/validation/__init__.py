"""Validation against real runs: blind predictions (:mod:`.blind`), their scores (:mod:`.score`), post-hoc runs
(:mod:`.posthoc`, :mod:`.posthoc_options`), the PR's main run decomposed (:mod:`.main_run`), KV capacity against
startup logs (:mod:`.kv_capacity`) and the docs' block (:mod:`.docs_tables`). The committed records, one name each:"""

from __future__ import annotations

import json
from pathlib import Path

from ..paths import REPO_ROOT

DIR = REPO_ROOT / "data" / "validation"
#: vLLM PR #53878's main run: the lab's prediction (``mla_lab.fits.predict_pr53878``) and its decomposition
PR53878_PREDICTION, PR53878_DECOMPOSITION = DIR / "pr53878_main_prediction.json", DIR / "pr53878_main_decomposition.json"
#: blind round one (issue 30): predictions, the runs' figures (committed after), score, post-hoc runs
BLIND, BLIND_RESULTS = DIR / "blind_2026-12.json", DIR / "blind_2026-12_results.json"
#: round one's cases (the runs as the issue named them, workloads, assumptions), read by ``blind.cases_of``
BLIND_CASES = DIR / "blind_2026-12_cases.json"
BLIND_SCORE, BLIND_POSTHOC = DIR / "blind_2026-12_score.json", DIR / "blind_2026-12_posthoc.json"
#: blind round two (issue 37): workloads (committed first), predictions, figures, score, post-hoc with the options
BLIND_B_WORKLOADS, BLIND_B = DIR / "blind_2026-12b_workloads.json", DIR / "blind_2026-12b.json"
BLIND_B_RESULTS, BLIND_B_SCORE = DIR / "blind_2026-12b_results.json", DIR / "blind_2026-12b_score.json"
BLIND_B_POSTHOC = DIR / "blind_2026-12b_posthoc.json"


def write_record(path: Path, doc: dict, overwrite: bool, ap) -> None:
    """Write ``doc`` as JSON to ``path`` (a committed record: replaced only with ``overwrite``; else ``ap.error``,
    one line naming the file)."""
    if path.exists() and not overwrite:
        ap.error(f"{path} exists: pass --overwrite to replace it")
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
