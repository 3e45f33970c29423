"""A change the serving simulation shows at a finite request rate carries its single-run band (issue 32: ``serve
--request-rate 4`` gave the stale pad -2.3 % TTFT from one run; with ``--num-runs 20``, +2.3 % [-1.3, +6.3]).

Decision: at a finite request rate ``--num-runs`` defaults to 20 (the band's 2.5th/97.5th percentiles); an explicit
``--num-runs 1`` there says "one run: band unknown" in the text and the JSON. An infinite rate (every request at
t=0) keeps one deterministic run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--num-prompts", "8", "--random-output-len", "16", "--strategies", "vllm-pre-53878"]


def _serve(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mla_lab.cli", "serve", *SMALL, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_a_finite_rate_gets_its_band_by_default():
    r = _serve("--request-rate", "4", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["noise"], "a finite rate runs the noise Monte-Carlo by default"
    assert out["num_runs"] >= 20 and out["band"].startswith("95 %")
    t = _serve("--request-rate", "4")
    assert t.returncode == 0 and "[" in t.stdout and "band unknown" not in t.stdout


def test_one_run_at_a_finite_rate_says_its_band_is_unknown():
    r = _serve("--request-rate", "4", "--num-runs", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["num_runs"] == 1 and out["band"] == "one run: band unknown"
    t = _serve("--request-rate", "4", "--num-runs", "1")
    assert t.returncode == 0 and "one run: band unknown" in t.stdout


def test_an_infinite_rate_stays_one_deterministic_run():
    r = _serve("--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["num_runs"] == 1 and "noise" not in out and out["band"].startswith("deterministic")


def test_the_report_rate_curve_carries_the_band_at_finite_rates():
    """mla_lab.report.serving.rate_curve: each finite rate's change has its 95 % band over single runs (columns
    ``band_<metric>_lo/hi``, ``band``), and plot_rate_curve draws it as error bars; inf stays deterministic."""
    import math

    from matplotlib.axes import Axes

    from mla_lab.deployment import Deployment
    from mla_lab.report.serving import plot_rate_curve, rate_curve

    d = Deployment.seed(num_prompts=8, concurrency=None, output_len=16)
    df = rate_curve(d, ["vllm-pre-53878"], [4, float("inf")], seed=0)
    other = df[df["strategy"] == "per_call_empty:stale"]
    fin, inf = other[other["request_rate"] == 4].iloc[0], other[other["request_rate"] == math.inf].iloc[0]
    assert fin["band"].startswith("95 %") and fin["band_median_ttft_ms_lo"] <= fin["band_median_ttft_ms_hi"]
    assert fin["band_median_ttft_ms_lo"] < fin["band_median_ttft_ms_hi"]
    assert inf["band"].startswith("deterministic") and math.isnan(inf["band_median_ttft_ms_lo"])
    seen = []
    real = Axes.errorbar

    def spy(self, *a, **k):
        seen.append(k.get("yerr"))
        return real(self, *a, **k)

    from unittest import mock

    with mock.patch.object(Axes, "errorbar", spy):
        plot_rate_curve(df)
    assert seen, "the band is drawn"
