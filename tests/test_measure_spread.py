"""mla_lab.measure.spread: between-process figures, hand-checked on small frames, and the committed H200 rows."""

import math

import pandas as pd
import pytest

from mla_lab.measure.spread import MIN_PROCESSES, between_process, coverage, paired_change, process_medians
from mla_lab.paths import measured_dir

BETWEEN = measured_dir("h200") / "between_process"


def _frame():
    # process p: A takes 10 + p ms in three rounds (median 10 + p), B takes 2 x A's median
    rows = []
    for p in range(1, 6):
        for r, d in enumerate((-0.5, 0.0, 0.7)):
            rows.append({"process": p, "strategy": "A", "shape": "s", "round": r, "ms": 10 + p + d})
            rows.append({"process": p, "strategy": "B", "shape": "s", "round": r, "ms": 2 * (10 + p) + d})
    return pd.DataFrame(rows)


def test_coverage_is_one_minus_two_over_two_to_the_n():
    assert coverage(5) == pytest.approx(1 - 2 / 32)
    assert coverage(7) == pytest.approx(0.984375)
    for bad in (1, 0, 2.5, True, "5"):
        with pytest.raises(ValueError, match="must be an int >= 2"):
            coverage(bad)


def test_process_medians_and_between_process_hand_checked():
    df = _frame()
    med = process_medians(df, ["strategy"])
    assert med.loc[("A", 3)] == pytest.approx(13.0)
    bp = between_process(df, ["strategy"])
    a = bp[("A",)]
    assert (a["median"], a["lo"], a["hi"], a["n_processes"]) == (pytest.approx(13.0), 11.0, 15.0, 5)
    assert a["coverage"] == pytest.approx(coverage(5))


def test_paired_change_is_per_process_then_summarised():
    df = _frame()
    ch = paired_change(df, ["shape"], "strategy", "B", "A")[("s",)]
    # B's median is 2 x A's + 0 in every process: +100 % each time
    assert ch["per_process"] == pytest.approx([100.0] * 5)
    assert ch["lo"] == pytest.approx(100.0) and ch["hi"] == pytest.approx(100.0)


def test_missing_column_and_unknown_value_are_named():
    df = _frame()
    with pytest.raises(ValueError, match=r"lack the column\(s\) \['nope'\]"):
        between_process(df, ["nope"])
    with pytest.raises(ValueError, match="strategy='C' has no rows"):
        paired_change(df, [], "strategy", "C", "A")


@pytest.mark.skipif(not (BETWEEN / "presets.csv").exists(), reason="committed H200 rows absent")
def test_committed_h200_rows_hold_five_fresh_processes_with_provenance():
    for name in ("presets.csv", "subgraph.csv", "routes.csv", "moe_decode.csv", "content_loop.csv",
                 "cold_start.csv", "step_spread.csv"):
        df = pd.read_csv(BETWEEN / name)
        assert df["process"].nunique() >= MIN_PROCESSES, name
        for col in ("device", "driver", "torch", "triton", "flash_mla", "git_commit"):
            assert df[col].notna().all(), (name, col)
        assert (df["device"] == "NVIDIA H200").all()


@pytest.mark.skipif(not (BETWEEN / "presets.csv").exists(), reason="committed H200 rows absent")
def test_pr_change_between_processes_is_wider_than_zero_and_negative():
    df = pd.read_csv(BETWEEN / "presets.csv")
    ch = paired_change(df, ["shape"], "strategy", "private_workspace", "per_call_empty:zeros")[("seed",)]
    assert ch["n_processes"] == 5
    assert ch["hi"] < 0  # the PR's path is faster in every fresh process
    assert ch["hi"] - ch["lo"] > 0.5  # and the processes disagree by more than half a percent
    assert not math.isnan(ch["median"])
