"""One style table for every strategy (tester's report: vllm-fa3-sparse and sglang shared a black swatch in the
serving figure; fa3_sparse, SGLang's routes, kernel_native and subchunk:<S>:graph2 fell back to the baseline's open
circle on the frontier panels), and the frontier panels' y window when a route dwarfs the PR's change."""

import re

import pytest

from mla_lab.placement import (
    EXPLORER_STRATEGIES,
    PRESETS,
    SEED_STRATEGIES,
    SWEEP_STRATEGIES,
    advise_candidates,
    expand_strategies,
    real_strategies,
)
from mla_lab.report.styles import FALLBACK_STYLE, STRATEGY_STYLE, strategy_style, style_key

NAMED = sorted(set(expand_strategies(list(SWEEP_STRATEGIES)) + list(EXPLORER_STRATEGIES) + list(SEED_STRATEGIES)
                   + [m for ms in PRESETS.values() for m in ms] + advise_candidates(16384) + real_strategies()))


def _family(name: str) -> str:
    """A strategy with its sub-chunk size S taken out (sizes of one hand-off are one curve, one style)."""
    return re.sub(r"^subchunk:\d+", "subchunk:S", name)


@pytest.mark.parametrize("name", NAMED)
def test_every_named_strategy_has_a_style_of_its_own(name):
    key = style_key(name)
    assert key in STRATEGY_STYLE, name
    assert strategy_style(name)[:2] != FALLBACK_STYLE


def test_styles_are_unique_per_strategy():
    by_style: dict = {}
    for n in NAMED:
        by_style.setdefault(strategy_style(n)[:2], set()).add(_family(n))
    shared = {k: v for k, v in by_style.items() if len(v) > 1}
    assert shared == {}, shared
    cols = [c for c, _, _ in STRATEGY_STYLE.values()]
    marks = [m for _, m, _ in STRATEGY_STYLE.values()]
    labels = [lbl for _, _, lbl in STRATEGY_STYLE.values()]
    # the serving figure's bars are told apart by colour alone, the frontier's points by marker alone as well
    assert len(set(cols)) == len(cols) and len(set(marks)) == len(marks) and len(set(labels)) == len(labels)
    assert {_family(n) for n in NAMED} == {_family(n) for n in NAMED if style_key(n)}  # nothing falls back


def test_presets_and_aliases_take_their_members_style():
    assert strategy_style("sglang") == strategy_style("per_call_zeros@sglang-dense")
    assert strategy_style("sglang-flashmla-sparse") == strategy_style("per_call_zeros")
    assert strategy_style("vllm-fa3-sparse") == strategy_style("fa3_sparse")
    assert strategy_style("sglang") != strategy_style("vllm-fa3-sparse")
    assert strategy_style("no-such-strategy") == (*FALLBACK_STYLE, "no-such-strategy")


def test_serving_figure_gives_fa3_and_sglang_their_own_colours():
    from matplotlib.colors import to_hex

    from mla_lab.deployment import Deployment
    from mla_lab.report.serving import plot_serving_changes
    from mla_lab.serving.benchmark import PR_BENCH, serve_benchmark

    res = serve_benchmark(Deployment.seed(), ["vllm-fa3-sparse", "sglang", "sglang-flashmla-sparse", "vllm-53878"],
                          PR_BENCH)
    ax = plot_serving_changes(res).axes[0]
    colours = {c.get_label(): to_hex(c.patches[0].get_facecolor()) for c in ax.containers}
    assert len(colours) == 4 and len(set(colours.values())) == 4, colours
    for s in ("fa3_sparse", "per_call_zeros@sglang-dense", "per_call_zeros", "private_workspace"):
        col, _, label = strategy_style(s)
        assert colours[label] == col.lower()


def test_y_window():
    from mla_lab.report.figures import y_window

    assert y_window([0.0, -2.0, -1.5, 1.0, 2.0, -0.5]) is None  # nothing far: the plain axis
    lo, hi = y_window([0.0, -2.0, -1.9, -1.5, 1.0, 2.0, -0.5, -35.0])
    assert lo < -2.0 and hi > 2.0 and lo > -35.0 and hi - lo < 10
    assert y_window([0.0, -1.0, float("nan"), 0.5]) is None


def test_frontier_panel_keeps_the_pr_readable_and_writes_the_off_scale_value():
    """GLM-5 TP8 H200 1024-token prompts: SGLang's dense route at about -35 % and the packed kernel at about -16 %
    beside the PR's -2 %: the panel's y axis stays near the small changes, the far points sit at the bottom edge
    labelled with their values."""
    import pandas as pd

    from mla_lab.report.figures import OFF_SCALE, plot_frontier_grid
    from mla_lab.report.layout_check import figure_clipping, label_overlaps
    from mla_lab.sweep import expand_grid, validate_params
    from mla_lab.sweep.rows import modelled_rows

    pt = expand_grid(validate_params(dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], prompt_lens=[1024],
                                          max_num_batched_tokens=[16384], device="cpu",
                                          strategies=list(SWEEP_STRATEGIES))))[0]
    df = pd.DataFrame(modelled_rows(pt))
    by = df.set_index("strategy")["ttft_change_pct"]
    far, pr = by["per_call_zeros@sglang-dense"], by["private_workspace"]
    assert far < -20 and abs(pr) < 5  # the case of the report (modelled numbers, not a constant of this test)
    fig = plot_frontier_grid(df)[0]
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert lo > far and lo < pr < hi and hi - lo < 0.6 * (max(by.max(), 0) - far)  # at most 60 % of the full range
    off = {t.get_text(): t for t in ax.texts if t.get_gid() == OFF_SCALE}
    # the far points: SGLang's dense route and the lab's packed kernel (both well below the PR's change)
    packed = by["packed"]
    assert packed < -10 and sorted(off) == sorted([f"\u25bc {far:+.1f} %", f"\u25bc {packed:+.1f} %"])
    assert off[f"\u25bc {far:+.1f} %"].get_color() == strategy_style("per_call_zeros@sglang-dense")[0]
    assert off[f"\u25bc {packed:+.1f} %"].get_color() == strategy_style("packed")[0]
    assert "\u25b2/\u25bc" in fig._suptitle.get_text()
    assert figure_clipping(fig) == [] and label_overlaps(fig) == []


def test_frontier_staircase_stays_inside_the_y_window():
    """GLM-5 TP8 B200, 8192-token prompts: the frontier (fa3_sparse, then packed) lies far below the panel's y window;
    its points sit at the window's edge with their values, and the staircase was drawn at the true values, outside
    the axes (the report's B200 panels showed no frontier). It is clipped to the window as its points are."""
    import pandas as pd

    from mla_lab.report.figures import FRONTIER, plot_frontier_grid
    from mla_lab.sweep import expand_grid, validate_params
    from mla_lab.sweep.advise import frontier
    from mla_lab.sweep.rows import modelled_rows

    pt = expand_grid(validate_params(dict(models=["glm-5"], tp_sizes=[8], archs=["b200"], prompt_lens=[8192],
                                          max_num_batched_tokens=[16384], device="cpu",
                                          strategies=list(SWEEP_STRATEGIES))))[0]
    df = pd.DataFrame(modelled_rows(pt))
    fits = df[df["fits_in_memory"].astype(bool) & (df["placement"] != "kernel_native")]
    front = fits[frontier(list(zip(fits["extra_persistent_mib"], fits["ttft_change_pct"])))]
    ax = plot_frontier_grid(df)[0].axes[0]
    lo, hi = ax.get_ylim()
    assert len(front) >= 2 and (front["ttft_change_pct"] < lo).all()  # the case: every frontier point off-scale
    (line,) = [ln for ln in ax.lines if ln.get_gid() == FRONTIER]
    assert list(line.get_xdata()) == sorted(front["extra_persistent_mib"])
    assert all(lo <= y <= hi for y in line.get_ydata())


def test_frontier_caption_names_the_sub_chunk_lines_colours():
    """The report's caption of the frontier panels named "orange and pink" sub-chunk lines; the three families are
    drawn in Okabe-Ito orange, Tol's olive and teal (:data:`STRATEGY_STYLE`), in the notebook and its .ipynb twin."""
    from mla_lab.paths import REPO_ROOT

    names = {"#E69F00": "orange", "#999933": "olive", "#44AA99": "teal"}
    colours = [names[STRATEGY_STYLE[f][0]] for f in ("subchunk", "subchunk_views", "subchunk_graph2")]
    want = f"The {colours[0]}, {colours[1]} and {colours[2]} lines are the sub-chunked workspace"
    for f in ("padding_sweep.py", "padding_sweep.ipynb"):
        text = (REPO_ROOT / "notebooks" / f).read_text().replace('\\n",\n    "', " ").replace("\n# ", " ")
        assert want in text and "orange and pink" not in text, f
