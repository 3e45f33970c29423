"""Every view draws each number from one place, so a chart and the table under it cannot disagree (issue 32).

The explorer's chart plotted the measured TTFT of each strategy against the *modelled* baseline (private_workspace
at about +1.7 % while the table under it said -1.65 %, the baseline's own measured marker at +3.4 %). These tests
render the views for the seed and read the plotted positions back from the matplotlib artists."""

from __future__ import annotations

import re
from unittest import mock

import pandas as pd
import pytest
from matplotlib.axes import Axes

from mla_lab.deployment import Deployment
from mla_lab.explore import explore_point, measured_html, render_chart, summary_html
from mla_lab.placement import BASELINE
from mla_lab.report.data import combine, load_measured


@pytest.fixture(scope="module")
def measured():
    m = load_measured()
    assert len(m), "the committed measured rows (data/measured) are needed for this test"
    return m


def _spy_plots():
    """Patch Axes.plot / Axes.errorbar / Axes.text to record (axes, artist or args) of each call."""
    seen = {"plot": [], "errorbar": [], "text": []}
    real_plot, real_err, real_text = Axes.plot, Axes.errorbar, Axes.text

    def plot(self, *a, **k):
        out = real_plot(self, *a, **k)
        seen["plot"].append((self, out))
        return out

    def errorbar(self, *a, **k):
        out = real_err(self, *a, **k)
        seen["errorbar"].append((self, out))
        return out

    def text(self, x, y, s, *a, **k):
        seen["text"].append((self, x, y, s))
        return real_text(self, x, y, s, *a, **k)

    return seen, [mock.patch.object(Axes, "plot", plot), mock.patch.object(Axes, "errorbar", errorbar),
                  mock.patch.object(Axes, "text", text)]


def _render(fn, *a, **k):
    seen, patches = _spy_plots()
    for p in patches:
        p.start()
    try:
        out = fn(*a, **k)
    finally:
        for p in patches:
            p.stop()
    return seen, out


def _tables(html: str) -> list[list[list[str]]]:
    """Every <table> of ``html`` as rows of cell texts (header row first)."""
    from bs4 import BeautifulSoup

    return [[[c.get_text(strip=True) for c in tr.find_all(["td", "th"])] for tr in t.find_all("tr")]
            for t in BeautifulSoup(html, "html.parser").find_all("table")]


def _measured_table(result) -> dict:
    """The measured change per strategy as the explorer's measured table (``measured_html``) prints it."""
    head, *rows = _tables(measured_html(result))[0]
    i, j = head.index("strategy"), head.index("ttft_change_pct")
    return {r[i]: float(r[j]) for r in rows}


def test_explorer_chart_plots_measured_points_where_the_table_says(measured):
    result = explore_point(Deployment.seed(), measured=measured)
    seen, png = _render(render_chart, result)
    assert png[:4] == b"\x89PNG"
    diamonds = [(ax, ln) for ax, lines in seen["plot"] for ln in lines if ln.get_marker() == "D"]
    assert len(diamonds) == 1, "one set of measured diamonds on the TTFT panel"
    ax, line = diamonds[0]
    names = [t.get_text() for t in ax.get_xticklabels()]
    plotted = {names[int(round(x - 0.32))]: float(y) for x, y in zip(line.get_xdata(), line.get_ydata())}
    table = _measured_table(result)
    per = {r["strategy"]: r for r in result["per_strategy"]}
    assert plotted, "the seed has measured rows: the chart must show them"
    assert plotted[BASELINE] == pytest.approx(0.0, abs=1e-9)
    for s, y in plotted.items():
        assert y == pytest.approx(table[s], abs=0.005), (s, y, table[s])  # the table prints 2 decimals
        assert y == pytest.approx(per[s]["measured_change_pct"], abs=1e-9), s
    assert plotted["private_workspace"] < 0  # -1.65 %, not the +1.7 % of a measured/modelled mix
    # the summary table under the chart prints the same numbers
    head, *rows = _tables(summary_html(result))[1]
    col = next(i for i, c in enumerate(head) if "measured" in c and "vs" in c)
    for s, v in ((r[0], r[col]) for r in rows):
        if s in plotted:
            assert float(str(v).rstrip("%")) == pytest.approx(plotted[s], abs=0.005), s
        else:
            assert str(v) == "-", s


def _seed_frame(measured):
    from mla_lab.placement import MEASURED_STRATEGIES
    from mla_lab.sweep.rows import modelled_rows

    d = Deployment.seed()
    point = d.to_point(strategies=list(MEASURED_STRATEGIES), shared_workspace_bytes=None, num_runs=7)
    mod = pd.DataFrame(modelled_rows(point))
    return combine(mod, measured)


def test_report_figures_plot_measured_points_where_the_summary_table_says(measured):
    """plot_deployment (errorbars), plot_tp_bars (diamonds) and plot_heatmap ("m:" text) against the report's
    summary table's measured rows of the same deployment."""
    from mla_lab.report import figures
    from mla_lab.report.tables import summary_table
    from mla_lab.sweep.rows import measured_change_pct

    both = _seed_frame(measured)
    table = summary_table(both)
    seed = Deployment.seed().to_point()

    def sel(d):
        return d[(d["model"] == seed["model"]) & (d["tp"] == seed["tp"]) & (d["prompt_len"] == seed["prompt_len"])
                 & (d["max_num_batched_tokens"] == seed["max_num_batched_tokens"])
                 & (d["kv_cache_dtype"] == seed["kv_cache_dtype"])]

    t = sel(table)
    t = t[t["source"] == "measured"]
    assert len(t) >= 5
    want = {s: measured_change_pct(g) for s, g in t.groupby("strategy")}

    # one deployment's panel: every measured errorbar at its row's change (inside the y window)
    rows = sel(both)
    fig = figures.new_figure((5, 4))
    ax = fig.add_subplot()
    seen, _ = _render(figures.plot_deployment, ax, rows)
    ys = sorted(float(c.lines[0].get_ydata()[0]) for _, c in seen["errorbar"])
    lo, hi = ax.get_ylim()
    inside = sorted(v for v in t["ttft_change_pct"] if lo <= v <= hi)
    assert len(ys) == len(t)
    assert [y for y in ys if lo <= y <= hi and y not in (lo, hi)] == pytest.approx(inside, abs=0.006)

    # the TP bars: the PR strategy's measured diamond at the table's value
    seen, _ = _render(figures.plot_tp_bars, rows)
    diamonds = [float(ln.get_ydata()[0]) for _, lines in seen["plot"] for ln in lines if ln.get_marker() == "D"]
    assert len(diamonds) == 1, "the seed's measured PR point is drawn, once"
    assert diamonds[0] == pytest.approx(want["private_workspace"], abs=0.006)

    # the heatmap: the "m:" text of the seed cell
    seen, _ = _render(figures.plot_heatmap, rows)
    ms = [float(m.group(1)) for *_, s in seen["text"] for m in [re.search(r"m: ([+-][\d.]+)%", str(s))] if m]
    assert ms == [pytest.approx(round(want["private_workspace"], 1), abs=0.051)]


def test_advise_and_explorer_use_one_measured_change(measured):
    """advise's measured column (outside the between-process seed cells) and the explorer's table come from the
    same function (mla_lab.sweep.rows.measured_changes)."""
    from mla_lab.sweep.rows import measured_changes

    d = Deployment.seed()
    result = explore_point(d, measured=measured)
    ch = measured_changes(measured, d)
    for r in result["per_strategy"]:
        if r["measured_change_pct"] is None:
            assert ch.get(r["strategy"], {}).get("change_pct") is None
        else:
            assert r["measured_change_pct"] == ch[r["strategy"]]["change_pct"]
