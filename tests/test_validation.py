"""Validation against real runs (issue 30): the PR's main run scored and decomposed
(data/validation/pr53878_main_decomposition.json, mla_lab.validation.main_run) and the blind set's protocol."""

import json
import subprocess

import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.validation import main_run
from mla_lab.validation.blind import CASES
from mla_lab.validation.blind import OUT as BLIND

DEC = json.loads(main_run.OUT.read_text())


def test_main_run_score_is_recomputed_from_the_prediction_and_the_run():
    pred = json.loads(main_run.PREDICTION_FILE.read_text())["prediction"]
    for s in DEC["score"]:
        assert s["predicted"] == pred[s["metric"]]["deterministic"]
        assert s["real"] == main_run.REAL[s["metric"]]
        assert s["ratio_predicted_over_real"] == pytest.approx(s["predicted"] / s["real"])
        assert not s["inside_band"]  # the run lies outside the lab's single-run band: a miss, published
    dur = next(s for s in DEC["score"] if s["metric"] == "duration")
    assert dur["ratio_predicted_over_real"] == pytest.approx(0.68, abs=0.005)
    # output throughput = 32 x 128 tokens / duration (vllm bench serve's definition) holds for the real run
    assert main_run.REAL["output_throughput"] == pytest.approx(32 * 128 / main_run.REAL["duration"], rel=2e-3)


def test_consistent_pairs_reproduce_the_duration():
    for p in DEC["consistent_pairs"]:
        assert p["ttft_last_s"] + main_run.STEPS * p["tpot_ms"] / 1e3 == pytest.approx(main_run.REAL["duration"],
                                                                                       abs=0.01)


def test_decomposition_is_current_with_the_tree():
    fresh = main_run.decompose()
    assert fresh["decode_step_graph_ms"] == pytest.approx(DEC["decode_step_graph_ms"], rel=1e-6)
    for k, v in DEC["revised"].items():
        if k != "note":
            assert fresh["revised"][k] == pytest.approx(v, rel=1e-6), k
    for a, b in zip(fresh["components"], DEC["components"]):
        assert a["component"] == b["component"] and a["status"] == b["status"]
        if b["closes_s"] is not None:
            assert a["closes_s"] == pytest.approx(b["closes_s"], rel=1e-6)
    assert "in-sample" in DEC["revised"]["note"]


def test_blind_predictions_were_committed_before_their_results():
    """git history: the prediction file's first commit precedes the results file's first commit."""
    assert BLIND.exists()
    blind = json.loads(BLIND.read_text())
    assert {c["id"] for c in blind["cases"]} == {c["id"] for c in CASES}
    results = REPO_ROOT / "data" / "validation" / "blind_2026-12_results.json"
    if not results.exists():
        pytest.skip("the results of the blind set are not committed yet")

    def first_commit_time(path):
        r = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ct", "--", str(path)], cwd=REPO_ROOT,
                           capture_output=True, text=True)
        out = r.stdout.split()
        if r.returncode != 0 or not out:
            pytest.skip(f"no git history for {path.name} here (a copy without .git)")
        return int(out[-1])

    assert first_commit_time(BLIND) <= first_commit_time(results)
    r = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", str(results)], cwd=REPO_ROOT,
                       capture_output=True, text=True).stdout.split()[-1]
    # the results commit must not be the one that added the predictions
    p = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", str(BLIND)], cwd=REPO_ROOT,
                       capture_output=True, text=True).stdout.split()[-1]
    assert r != p
