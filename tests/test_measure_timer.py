"""The lab's one timer (mla_lab.measure.timer) and its one CSV sink (mla_lab.measure.sink.Sink), on CPU: the
window's counts and quantiles, the callbacks, the NVML fields with and without a sampler, and the sink's columns."""

from __future__ import annotations

import csv

import pytest

from mla_lab.measure.sink import Sink
from mla_lab.measure.timer import WINDOW_COLUMNS, est_ms, quantile, timed_window
from mla_lab.provenance import PROVENANCE_COLUMNS


def test_quantile_interpolates_linearly_between_order_statistics():
    # hand-computed: position q (n - 1) in the sorted sample, linear between its neighbours (numpy's default)
    for xs, q, want in (([3.0, 1.0, 4.0, 2.0], 0.25, 1.75), ([3.0, 1.0, 4.0, 2.0], 0.5, 2.5), ([5.0], 0.9, 5.0),
                        ([10.0, 20.0], 0.1, 11.0), ([7.0, 1.0, 4.0], 0.0, 1.0), ([7.0, 1.0, 4.0], 1.0, 7.0)):
        assert quantile(xs, q) == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match=r"xs=\[\] must hold at least one value"):
        quantile([], 0.5)


def test_timed_window_counts_calls_and_runs_after_untimed():
    calls, after = [], []
    res = timed_window(lambda: calls.append(1), 5, "cpu", after=lambda: after.append(1))
    assert len(calls) == 5 and len(after) == 5 and res["n_calls"] == 5
    assert list(res) == WINDOW_COLUMNS  # no sampler: NVML fields empty, clock reasons kept
    assert res["ms_p10"] <= res["ms_median"] <= res["ms_p90"] and res["ms_mean"] >= 0 and res["window_s"] >= 0
    assert (res["sm_clock_mhz"], res["power_w"], res["temp_c"], res["n_samples"]) == ("", "", "", 0)
    assert "clock_event_reasons" not in timed_window(lambda: None, 1, "cpu", reasons=False)
    with pytest.raises(ValueError, match="n=0, per=1: both must be ints >= 1"):
        timed_window(lambda: None, 0, "cpu")


def test_timed_window_divides_by_per_and_reads_the_sampler_over_its_window(monkeypatch):
    """A fake clock that advances 4 ms per reading: every call measures 4 ms, 1 ms per op with per=4 (no real
    timing, so no race with a loaded machine)."""
    import mla_lab.measure.timer as timer

    class Sampler:
        ok = True

        def __init__(self):
            self.asked = []

        def window(self, t0, t1, reasons=True):
            self.asked.append((t0, t1, reasons))
            return {"sm_clock_mhz": 1980, "power_w": 700.0, "temp_c": 60, "n_samples": 3}

    clock = iter(range(10**6))
    monkeypatch.setattr(timer.time, "perf_counter", lambda: next(clock) * 0.004)
    sampler = Sampler()
    res = timed_window(lambda: None, 3, "cpu", sampler=sampler, per=4, reasons=False)
    assert res["ms_median"] == pytest.approx(1.0) and res["ms_p10"] == pytest.approx(1.0)
    assert res["window_s"] == pytest.approx(7 * 0.004)  # t0, two readings per call, t1
    (t0, t1, reasons), = sampler.asked
    assert t1 - t0 == pytest.approx(7 * 0.004) and reasons is False
    assert res["sm_clock_mhz"] == 1980 and res["n_samples"] == 3


def test_est_ms_warms_up_once_then_averages_k_calls():
    calls = []
    assert est_ms(lambda: calls.append(1), "cpu", k=4) >= 0 and len(calls) == 5


def test_sink_columns_provenance_and_refusals(tmp_path):
    """process first (a between-process run), the experiment's columns, then the provenance columns; a missing
    column empty; an unknown column, an unknown file and a file with another header refused by name."""
    prov = {"source": "measured", "git_commit": "abc"}
    sink = Sink(tmp_path, {"x.csv": ["a", "b"]}, process=3, prov=prov)
    assert sink.columns("x.csv") == ["process", "a", "b", *PROVENANCE_COLUMNS] and sink.n == 0
    sink.write("x.csv", {"a": 1})
    with pytest.raises(ValueError, match=r"row has columns \['c'\] not in x.csv's header"):
        sink.write("x.csv", {"a": 2, "c": 3})
    with pytest.raises(ValueError, match=r"file='y.csv' is not one of this experiment's outputs; allowed: \['x.csv'\]"):
        sink.write("y.csv", {"a": 1})
    rows = list(csv.DictReader(open(tmp_path / "x.csv")))
    assert len(rows) == 1 and sink.n == 1
    assert {k: v for k, v in rows[0].items() if v} == {"process": "3", "a": "1", "source": "measured",
                                                        "git_commit": "abc"}
    Sink(tmp_path, {"x.csv": ["a", "b"]}, process=4, prov=prov).write("x.csv", {"b": 2})  # appended: same header
    assert [r["process"] for r in csv.DictReader(open(tmp_path / "x.csv"))] == ["3", "4"]
    with pytest.raises(ValueError, match="exists with another header"):
        Sink(tmp_path, {"x.csv": ["a"]}, prov=prov).write("x.csv", {"a": 1})
