"""Measured only where measured (issue 39): a measured change is shown only for a deployment whose route runs the
measured kernel (FlashMLA sparse, padded heads) for the strategy and the baseline, and only where the deployment
fits; a cell's measured change is one figure in every view (the between-process one where it exists)."""

import pytest

from mla_lab.deployment import Deployment
from mla_lab.placement import BASELINE, PR_STRATEGY
from mla_lab.report.data import load_measured, withhold_off_route
from mla_lab.report.seed_answer import seed_answer
from mla_lab.sweep.advise import advise, format_advice
from mla_lab.sweep.rows import MEASURED_ROUTE, between_process_changes, measured_change_pct, measured_withheld


@pytest.fixture(scope="module")
def measured():
    return load_measured()


def test_the_dense_route_gets_no_measured_number():
    dsv = Deployment.seed(model="deepseek-v3.2")  # 16 heads per rank, 1024-token prompts <= index_topk: dense MHA
    why = measured_withheld(dsv, PR_STRATEGY)
    assert "mha-dense" in why and MEASURED_ROUTE in why
    assert measured_withheld(Deployment.seed(), PR_STRATEGY) == ""  # GLM-5 is MQA-only on vLLM: the measured kernel
    assert measured_withheld(Deployment.seed(model="deepseek-v3.2", prompt_len=8192), PR_STRATEGY) == ""


def test_the_report_withholds_dense_and_unfit_deployments(measured):
    shown, notes = withhold_off_route(measured)  # what measured_for gives the report's figures and tables
    assert len(shown) and len(shown) < len(measured)
    measured = shown
    dense = measured[(measured["model"] == "deepseek-v3.2") & (measured["prompt_len"] == 1024)]
    assert dense.empty  # the committed file holds 28 such rows; none is shown
    assert (measured["tp"] != 4).all()  # TP4 does not fit GLM-5 / DeepSeek-V3.2 weights on an H200
    assert any("deepseek-v3.2 tp=8" in n and "prompt_len=1024" in n and "mha-dense" in n for n in notes)
    assert any("tp=4" in n and "does not fit" in n for n in notes)


def test_advise_shows_no_measured_change_on_the_dense_route(measured):
    res = advise(Deployment.seed(model="deepseek-v3.2"), measured=measured)
    rows = [res["recommendation"], *res["alternatives"], *res["other_engines"], *res["excluded"]]
    assert all(r["measured_change_pct"] is None for r in rows)
    assert "mha-dense" in res["measured_withheld"]
    assert "measured column empty" in format_advice(res)
    # with rows that were never screened (the Python API given a raw frame), advise screens them itself
    raw = measured.copy()
    res2 = advise(Deployment.seed(model="deepseek-v3.2", prompt_len=8192), measured=raw)
    assert any(r["measured_change_pct"] is not None for r in [res2["recommendation"], *res2["alternatives"], *res2["other_engines"]])


def test_one_measured_figure_per_cell(measured):
    """The seed cell's measured change is the between-process one in the rows every view reads (heatmap, TP bars,
    frontier, advise), and the seed answer's table states the same figure."""
    g = measured[(measured["model"] == "glm-5") & (measured["tp"] == 8) & (measured["prompt_len"] == 1024)
                 & (measured["max_num_batched_tokens"] == 16384) & (measured["strategy"] == PR_STRATEGY)]
    bp = between_process_changes(Deployment.seed(), [PR_STRATEGY])[PR_STRATEGY]
    assert measured_change_pct(g) == pytest.approx(bp["median"])
    seed = {(r["model"], r["strategy"], r["against"]): r for r in seed_answer(("glm-5",))}
    assert round(seed[("glm-5", PR_STRATEGY, BASELINE)]["measured_pct"], 1) == round(measured_change_pct(g), 1)
    res = advise(Deployment.seed(), measured=measured)
    pr = next(r for r in [res["recommendation"], *res["alternatives"], *res["other_engines"]] if r["strategy"] == PR_STRATEGY)
    assert pr["measured_change_pct"] == pytest.approx(bp["median"])


def test_figures_draw_no_withheld_measured_point(measured):
    """The TP bars given every measured row (TP4 included, which does not fit) draw no measured diamond there and
    no TP4 slot; the heatmap of DeepSeek-V3.2 at 1024 tokens carries no 'm:' figure."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd

    from mla_lab.report import figures
    from mla_lab.report.data import combine
    from mla_lab.sweep.rows import modelled_rows

    frames = []
    for model in ("glm-5", "deepseek-v3.2"):
        d = Deployment.seed(model=model)
        frames.append(pd.DataFrame(modelled_rows(d.to_point(strategies=[BASELINE, PR_STRATEGY],
                                                            shared_workspace_bytes=None, num_runs=7))))
    both = combine(pd.concat(frames, ignore_index=True), measured)
    both = both[(both["max_num_batched_tokens"] == 16384) & (both["prompt_len"] == 1024)]
    assert (both[both["source"] == "measured"]["tp"] == 4).any()  # the raw measured rows hold TP4
    fig = figures.plot_tp_bars(both)
    ticks = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels()]
    assert ticks and not any(t.startswith("TP4") for t in ticks)
    diamonds = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_marker() == "D"]
    assert len(diamonds) == 1  # GLM-5 TP8 only: DeepSeek-V3.2 at 1024 tokens runs dense MHA
    fig = figures.plot_heatmap(both)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert sum("m:" in t for t in texts) == 1


def test_the_explorer_shows_no_measured_change_on_the_dense_route(measured):
    from mla_lab.explore import explore_point, measured_html

    res = explore_point(Deployment.seed(model="deepseek-v3.2"), measured=measured)
    assert all(r["measured_change_pct"] is None for r in res["per_strategy"])
    assert "No measured rows" in measured_html(res)
    seed = explore_point(Deployment.seed(), measured=measured)
    assert any(r["measured_change_pct"] is not None for r in seed["per_strategy"])
