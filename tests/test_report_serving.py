"""The report's serving section (mla_lab.report.serving): the table of vllm bench serve metrics per strategy and
the request-rate curve (CPU, a few seconds)."""

import math

import pandas as pd
import pytest

from mla_lab.deployment import Deployment
from mla_lab.report.serving import (
    PR_STRATEGY,
    PRINTED_METRICS,
    SERVING_TABLE_COLUMNS,
    plot_rate_curve,
    rate_curve,
    serving_table,
)
from mla_lab.seed import SEED_REPORTED
from mla_lab.serving.benchmark import PR_BENCH, serve_benchmark

SMALL = Deployment.seed(num_prompts=8, concurrency=None, prompt_len=256, output_len=8)  # no client-side limit


@pytest.fixture(scope="module")
def result():
    return serve_benchmark(Deployment.seed(), ["vllm-pre-53878", "vllm-53878", "sglang"], PR_BENCH)


@pytest.fixture(scope="module")
def curve():
    return rate_curve(SMALL, ["vllm-53878", "sglang"], [2.0, math.inf], seed=0)


def test_serving_table_has_every_printed_metric_per_strategy(result):
    t = serving_table(result)
    assert tuple(t.columns) == SERVING_TABLE_COLUMNS
    assert set(t["strategy"]) == set(result["strategies"])
    for s in result["strategies"]:
        assert list(t[t["strategy"] == s]["metric"]) == [k for k, _ in PRINTED_METRICS]
    assert (t["source"] == "modelled").all()
    base = t[t["strategy"] == result["baseline"]]
    assert (base["change_pct"] == 0).all()
    ok = t["baseline"] != 0
    recomputed = (t.loc[ok, "value"] - t.loc[ok, "baseline"]) / t.loc[ok, "baseline"] * 100
    assert recomputed.to_numpy() == pytest.approx(t.loc[ok, "change_pct"].to_numpy(), abs=1e-9)
    rep = t.dropna(subset=["reported_change_pct"])
    assert set(rep["strategy"]) == {PR_STRATEGY}
    assert dict(zip(rep["metric"], rep["reported_change_pct"])) == {
        "mean_ttft_ms": SEED_REPORTED["ttft_change_pct"],
        "total_token_throughput": SEED_REPORTED["throughput_change_pct"]}
    assert set(t["preset"]) == {"vllm-pre-53878", "vllm-53878", "sglang-dense (prefill graphs off)"}


def test_serving_table_wide_form(result):
    w = serving_table(result, wide=True)
    assert list(w.index) == [label for _, label in PRINTED_METRICS]
    assert ("PR #53878 reported", "change %") in w.columns
    assert (PR_STRATEGY, "value") in w.columns and (PR_STRATEGY, "change %") in w.columns
    assert w.loc["Mean TTFT (ms)", ("PR #53878 reported", "change %")] == SEED_REPORTED["ttft_change_pct"]


def test_serving_table_refuses_other_input():
    with pytest.raises(ValueError, match="serve_benchmark"):
        serving_table({"rows": []})


def test_rate_curve_rows(curve):
    assert isinstance(curve, pd.DataFrame)
    assert len(curve) == 3 * 2  # baseline + two strategies, two rates
    assert set(curve["request_rate"]) == {2.0, math.inf}
    for c in ("strategy", "preset", "median_ttft_ms", "p99_ttft_ms", "total_token_throughput",
              "change_mean_ttft_ms_pct", "source"):
        assert c in curve.columns
    assert (curve["completed"] == 8).all()
    assert (curve[curve["strategy"] == "per_call_empty:zeros"]["change_mean_ttft_ms_pct"] == 0).all()


def test_rate_curve_refuses_bad_rates():
    for bad in ([], [0.0], [-1], [True]):
        with pytest.raises(ValueError, match="rate"):
            rate_curve(SMALL, ["vllm-53878"], bad)


def test_rate_curve_figure_has_its_lines(curve):
    from matplotlib.figure import Figure

    fig = plot_rate_curve(curve)
    assert isinstance(fig, Figure)
    assert type(fig.get_layout_engine()).__name__ == "ConstrainedLayoutEngine"
    ax_t, ax_p = fig.axes
    n = curve["strategy"].nunique() - 1  # the baseline's change is 0 by definition: not drawn

    def data_lines(ax):  # the zero line (axhline) is not a strategy's
        return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]

    assert len(data_lines(ax_t)) == 2 * n  # p50 and p99 change per strategy
    assert len(data_lines(ax_p)) == n
    assert ax_t.get_ylabel() == "TTFT change vs baseline [%]"  # the change, not absolute TTFT on a log axis
    assert ax_t.get_yscale() == "linear"
    for line in data_lines(ax_t) + data_lines(ax_p):
        assert len(line.get_xdata()) == 2
    assert [t.get_text() for t in ax_t.get_xticklabels()] == ["2", "inf"]
    assert fig.legends
    try:
        from mla_lab.report.layout_check import figure_clipping
    except ImportError:  # pragma: no cover - the layout check lives in another change
        return
    assert figure_clipping(fig) == []


def test_plot_rate_curve_refuses_two_deployments(curve):
    two = pd.concat([curve, curve.assign(tp=4)])
    with pytest.raises(ValueError, match="deployments"):
        plot_rate_curve(two)
    with pytest.raises(ValueError, match="columns"):
        plot_rate_curve(pd.DataFrame())


def test_serving_display_table_names_every_metric_and_prints_no_nan(result):
    from mla_lab.report import html_table
    from mla_lab.report.serving import serving_display_table

    t = serving_display_table(result)
    assert list(t.iloc[:, 0]) == [label for _, label in PRINTED_METRICS]
    html = html_table(t)
    assert "Mean TTFT (ms)" in html and "nan" not in html.lower().replace("nano", "")
    assert t.columns[-1] == "PR #53878 reported, change %"


def test_serving_changes_figure_and_folded_table():
    """The serving section as one figure (each metric's change per strategy, one decimal) and the full table folded
    in <details>; the swept deployment is the grid's point closest to the PR's that fits, with the swept workload."""
    from mla_lab.report.layout_check import figure_clipping, label_overlaps
    from mla_lab.report.serving import plot_serving_changes, serve_swept, serving_details_html, swept_deployment
    from mla_lab.sweep.params import validate_params

    p = validate_params({"models": ["glm-5"], "tp_sizes": [2, 8], "archs": ["h200"], "num_prompts": 8,
                         "output_len": 16, "request_rate": 4, "seed": 3})
    dep, note = swept_deployment(p)
    assert dep.tp == 8 and dep.output_len == 16 and note == "the PR's deployment"  # TP2 does not fit
    res = serve_swept(p, ["vllm-53878"])
    assert res["bench"]["request_rate"] == 4 and res["bench"]["seed"] == 3 and res["bench"]["num_prompts"] == 8
    fig = plot_serving_changes(res)
    labels = [t.get_text() for t in fig.axes[0].texts]
    ch = res["strategies"]["private_workspace"]["change_pct"]["mean_ttft_ms"]
    assert f"{ch:+.1f} %" in labels
    assert figure_clipping(fig) == [] and label_overlaps(fig) == []
    html = serving_details_html(res)
    assert html.startswith("<details><summary>") and "<table" in html
    none, why = swept_deployment(validate_params({"models": ["glm-5"], "tp_sizes": [2], "archs": ["h200"]}))
    assert none is None and "no deployment of the grid can serve" in why


def test_serving_figures_fit_every_preset_with_its_own_colour():
    """Every engine preset and the lab's graph2 sub-chunk in the serving figure and the rate curve: one colour per
    strategy (the style table of mla_lab.report.styles; vllm-fa3-sparse and sglang shared a black swatch) and the
    legends inside the figure (the table's longer labels overflowed a 4-column legend)."""
    from matplotlib.colors import to_hex

    from mla_lab.placement import PRESETS
    from mla_lab.report.layout_check import figure_clipping, label_overlaps
    from mla_lab.report.serving import plot_serving_changes

    names = [*PRESETS, "subchunk:2048:graph2"]
    d = Deployment.seed(num_prompts=8, concurrency=None, output_len=16)
    fig = plot_serving_changes(serve_benchmark(d, names))
    colours = [to_hex(c.patches[0].get_facecolor()) for c in fig.axes[0].containers]
    assert len(colours) == len(set(colours)) >= len(PRESETS)
    curve = plot_rate_curve(rate_curve(d, names, [4, float("inf")], seed=0))
    for f in (fig, curve):
        assert figure_clipping(f) == [] and label_overlaps(f) == []
