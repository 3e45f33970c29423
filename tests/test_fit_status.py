"""Default grids that fit, and deployments that do not fit are listed, never priced (issue 32).

The default sweep's tp_sizes [1, 2, 4, 8] made 48 of 64 points whose weights need 176-697 GiB per rank, and the CSV
still gave them ``ttft_ms`` with ``status=ok``; where the PR's +1008 MiB is what tips a deployment out of fitting
(GLM-5 TP8 H200, 8k prompts: 261,109 < 262,144 KV tokens with the H200 taken as 141e9 bytes; 40 x 8k prompts
since the memory is torch's 150.1e9) the heatmap showed "does not fit" for the whole cell and
the big table printed 10,739 ms for that strategy."""

from __future__ import annotations

import math
from unittest import mock

import pandas as pd
import pytest

from mla_lab.deployment import Deployment
from mla_lab.sweep.params import expand_grid, validate_params
from mla_lab.sweep.rows import compute_rows

STRATS = ["private_workspace", "fa3_sparse"]


def _point(**kw) -> dict:
    d = Deployment.seed(**kw)
    return d.to_point(strategies=STRATS, shared_workspace_bytes=None, num_runs=7)


def _none(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_every_point_of_the_default_grid_fits():
    pts = expand_grid(validate_params({}))
    assert pts
    bad = []
    for p in pts:
        rows = compute_rows({**p, "strategies": [p["strategies"][0]]}, "modelled")
        if not rows[0]["fits_in_memory"]:
            bad.append((p["model"], p["tp"], p["arch"], rows[0]["fit_reason"][:60]))
    assert not bad, f"{len(bad)} of {len(pts)} default points do not fit, e.g. {bad[:3]}"


def test_a_deployment_that_does_not_fit_is_never_priced_in_the_sweep_rows():
    rows = compute_rows(_point(tp=4), "modelled")  # GLM-5 fp8 at TP4 on an H200: the weights do not fit
    for r in rows:
        assert r["status"] == "does_not_fit", r["strategy"]
        assert "weights" in r["reason"]
        for k in ("ttft_ms", "ttft_ms_max", "ttft_change_pct"):
            assert _none(r[k]), (r["strategy"], k)


def _tipped():
    # GLM-5 TP8 H200, 40 x 8k prompts: with the H200's memory as torch reports it (150.1e9 bytes, issue 37) the
    # seed's 32 x 8k fit with the PR's workspace too; 40 x 8k fit without it and not with it
    return compute_rows(_point(prompt_len=8192, num_prompts=40, concurrency=40), "modelled")


def test_a_strategy_that_tips_the_deployment_out_is_marked_so():
    by = {r["strategy"]: r for r in _tipped()}
    base, pr = by["per_call_empty:zeros"], by["private_workspace"]
    assert base["status"] == "ok" and base["ttft_ms"] > 0
    assert pr["status"] == "tips_out" and "fits without it, not with it" in pr["reason"]
    assert _none(pr["ttft_ms"]) and _none(pr["ttft_change_pct"])
    assert pr["extra_persistent_mib"] == pytest.approx(1008.0)  # the cost that tips it out is still shown
    assert by["fa3_sparse"]["status"] == "ok"


def test_the_report_shows_tips_out_in_the_heatmap_the_tables_and_lists_it():
    from matplotlib.axes import Axes

    from mla_lab.report import figures
    from mla_lab.report.data import failed_points
    from mla_lab.report.tables import summary_table

    df = pd.DataFrame(_tipped() + compute_rows(_point(tp=4), "modelled"))
    texts = []
    real = Axes.text

    def spy(self, x, y, s, *a, **k):
        texts.append(str(s))
        return real(self, x, y, s, *a, **k)

    with mock.patch.object(Axes, "text", spy):
        figures.plot_heatmap(df, strategy="private_workspace")
    assert any("tips out" in t for t in texts), texts
    assert any("does not fit" in t for t in texts), texts
    t = summary_table(df)
    assert not ((t["strategy"] == "private_workspace") & (t["prompt_len"] == 8192)).any()
    assert (t["tp"] == 8).all()
    unfit = figures.not_fitting(df)
    assert len(unfit) == 2 and set(unfit["status"]) == {"tips_out", "does_not_fit"}
    assert "fits without it" in " ".join(unfit["reason"])
    assert len(failed_points(df)) == 0  # not a failure: a result of its own
