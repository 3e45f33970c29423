"""advise's measured column: between fresh processes at the seed's attention step, and never a median outside its
own interval (a re-priced change moves its interval with it)."""

import pytest

from mla_lab.deployment import Deployment
from mla_lab.paths import measured_dir
from mla_lab.report.data import load_measured
from mla_lab.report.seed_answer import seed_answer
from mla_lab.sweep.advise import advise
from mla_lab.sweep.rows import between_process_changes

ROWS = measured_dir("h200") / "between_process" / "presets.csv"
pytestmark = pytest.mark.skipif(not ROWS.exists(), reason=f"committed H200 rows {ROWS} absent")


@pytest.fixture(scope="module")
def seed_advice():
    return advise(Deployment.seed(), measured=load_measured())


def _all(result):
    return [result["recommendation"], *result["alternatives"], *result["other_engines"]]


def test_seed_measured_changes_are_between_processes_and_match_the_seed_answer(seed_advice):
    rows = {r["strategy"]: r for r in _all(seed_advice)}
    pr = rows["private_workspace"]
    assert pr["measured_basis"].startswith("5 fresh processes")
    ans = next(r for r in seed_answer(models=("glm-5",)) if r["strategy"] == "private_workspace"
               and r["against"] == "per_call_empty:zeros")
    assert ans["measured_basis"] == "processes" and ans["n_processes"] == 5
    for a, b in (("measured_change_pct", "measured_pct"), ("measured_ci_lo", "measured_lo"),
                 ("measured_ci_hi", "measured_hi")):
        assert pr[a] == pytest.approx(ans[b], abs=0.02)


def test_no_measured_median_outside_its_interval(seed_advice):
    seen = 0
    for r in _all(seed_advice):
        if r.get("measured_change_pct") is None or r.get("measured_ci_lo") is None:
            continue
        seen += 1
        assert r["measured_ci_lo"] - 1e-9 <= r["measured_change_pct"] <= r["measured_ci_hi"] + 1e-9, r["strategy"]
    assert seen >= 5


def test_between_process_changes_only_for_the_measured_step():
    assert between_process_changes(Deployment.seed(prompt_len=2048), ["private_workspace"]) == {}
    got = between_process_changes(Deployment.seed(), ["private_workspace", "subchunk:2048:graph2"])
    assert set(got) == {"private_workspace", "subchunk:2048:graph2"}
    assert all(v["n_processes"] == 5 and v["lo"] <= v["median"] <= v["hi"] for v in got.values())
