"""A deployment that cannot run yields no TTFT or memory number from the explorer (tester's report: glm-5 TP2 on
H200 said ``fits False`` and still gave workspace MiB, KV lost and per-strategy TTFT changes)."""

import numbers

import pytest

from mla_lab.deployment import Deployment
from mla_lab.explore import explore_point, measured_html, render_chart, summary_html

NUMBER_KEYS = ("workspace_bytes", "workspace_mib", "extra_bytes", "extra_mib", "kv_tokens_lost",
               "kv_capacity_pct_lost", "kv_capacity_tokens")
PER_KEYS = ("persistent_bytes", "workspace_mib", "extra_mib", "peak_bytes", "ttft_ms", "ttft_ms_max",
            "ttft_change_pct", "kv_tokens_lost", "kv_capacity_pct_lost", "measured_ttft_ms")


def _is_number(v) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, bool)


@pytest.mark.parametrize("model, tp", [("glm-5", 2), ("glm-5", 1), ("deepseek-v3.2", 1)])
def test_a_deployment_that_does_not_fit_has_no_ttft_or_memory_number(model, tp):
    r = explore_point(Deployment.seed(model=model, tp=tp))
    assert r["fits_in_memory"] is False
    assert "weights" in r["fit_reason"] and "GiB per rank" in r["fit_reason"]
    for k in NUMBER_KEYS:
        assert r[k] is None, k
    assert r["measured"] is None
    for row in r["per_strategy"]:
        for k in PER_KEYS:
            assert row[k] is None, (row["strategy"], k)
    html = summary_html(r)
    assert "does not fit" in html and "MiB" not in html and "TTFT ms" not in html
    assert "does not fit" in measured_html(r)
    assert render_chart(r)[:4] == b"\x89PNG"


def test_a_fitting_deployment_keeps_its_numbers():
    r = explore_point(Deployment.seed())
    assert r["fits_in_memory"] is True
    for k in ("workspace_bytes", "workspace_mib", "extra_bytes", "extra_mib", "kv_tokens_lost"):
        assert _is_number(r[k]), k
    assert r["workspace_mib"] > 0
    for row in r["per_strategy"]:
        assert row["fits_in_memory"] is True
        for k in ("persistent_bytes", "workspace_mib", "ttft_ms", "ttft_change_pct"):
            assert _is_number(row[k]), (row["strategy"], k)
    assert "TTFT ms (modelled)" in summary_html(r)


def test_the_chart_wraps_the_reason_at_spaces():
    """The does-not-fit chart's text is wrapped at spaces: a number such as gpu_memory_utilization 0.9 stays whole
    (a fixed 90-character cut printed "0" and ".9" on two lines)."""
    from unittest import mock

    from matplotlib.axes import Axes

    r = explore_point(Deployment.seed(model="glm-5", tp=2))
    seen = []
    real = Axes.text

    def spy(self, x, y, s, *a, **k):
        seen.append(s)
        return real(self, x, y, s, *a, **k)

    with mock.patch.object(Axes, "text", spy):
        render_chart(r)
    words = set(" ".join(seen).split())
    assert "0.9" in words, seen


def test_the_advice_table_fits_a_1280_px_report():
    """The advice's table lines are at most 143 characters (the report's <pre> at 1280 px wrapped the 160-character
    header, "frontie" / "r"), with no trailing blanks, and still name every column."""
    from mla_lab.sweep.advise import advise, format_advice

    text = format_advice(advise(Deployment.seed(), memory_budget_mib=300))
    header = next(ln for ln in text.splitlines() if ln.startswith("strategy@engine version "))
    assert header.endswith("frontier") and "measured dTTFT [int.]" in header
    rows = [ln for ln in text.splitlines() if ln.split() and ln.split()[0] in
            {"per_call_empty:zeros@vllm-pr53878-before", "private_workspace@vllm-pr53878", "fa3_sparse@vllm-0.33.0",
             "fa3_sparse@vllm-pr46189", "per_call_zeros@sglang-dense"}]
    assert len(rows) >= 3
    for ln in [header, *rows]:
        assert len(ln) <= 143 and ln == ln.rstrip(), ln


def test_the_explorer_widget_shows_the_reason_and_no_number():
    pytest.importorskip("ipywidgets")
    from mla_lab.explore import Explorer

    e = Explorer(tp=8)
    assert e.result["fits_in_memory"] is True and e.result["workspace_mib"] > 0
    r = e.set(tp=2)
    assert e.error == "" and r["fits_in_memory"] is False and r["workspace_mib"] is None
    assert "does not fit" in e.summary.value and "349.6 GiB per rank" in e.summary.value
    assert "does not fit" in e.advice_out.value and "recommended:" not in e.advice_out.value and "<pre" not in e.advice_out.value
    assert e.chart.value[:4] == b"\x89PNG"
