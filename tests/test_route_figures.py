"""mla_lab.report.route_figures: the measured routes per prompt length (committed H200 rows) and the crossover."""

import pytest

from mla_lab.paths import measured_dir
from mla_lab.report.route_figures import ROUTE_LABELS, ROUTES_CSV, crossover, mean_keys, route_sentence, route_table

ROWS = measured_dir("h200") / ROUTES_CSV
pytestmark = pytest.mark.skipif(not ROWS.exists(), reason=f"committed H200 rows {ROWS} absent")


def test_mean_keys_hand_checked():
    assert mean_keys(4, None) == 2.5  # (1 + 2 + 3 + 4) / 4
    assert mean_keys(4, 8) == 2.5  # top-k covers every earlier token: dense
    assert mean_keys(6, 2) == pytest.approx((1 + 2 + 2 + 2 + 2 + 2) / 6)


def test_route_table_has_every_route_length_and_five_processes():
    t = route_table()
    assert set(t["route"]) == set(ROUTE_LABELS)
    assert set(t["prompt_len"]) >= {512, 1024, 2048, 4096, 8192}
    assert (t["n_processes"] >= 5).all()
    assert ((t["lo_ms"] <= t["median_ms"]) & (t["median_ms"] <= t["hi_ms"])).all()
    # dense MHA is labelled equivalent only where top-k covers every earlier token
    dense = t[t["route"].str.startswith("dense")]
    assert (dense["equivalent"] == (dense["prompt_len"] <= 2048)).all()


def test_dense_route_beats_the_padded_path_at_1024_in_every_process():
    t = route_table().set_index(["model", "prompt_len", "route"])
    for model in ("glm-5", "deepseek-v3.2"):
        dense = t.loc[(model, 1024, "dense MHA, real heads (SDPA cuDNN)")]
        pr = t.loc[(model, 1024, "sparse MQA, vLLM #53878 (pre-padded workspace)")]
        assert dense["hi_ms"] < pr["lo_ms"]


def test_crossover_is_an_extrapolation_beyond_the_measured_lengths():
    c = crossover(model="glm-5")
    assert c["n_processes"] == 5 and c["beyond_measured"]
    assert c["measured_max"] < c["lo"] <= c["median"] <= c["hi"]


def test_route_sentence_names_all_three_paths():
    s = route_sentence()
    assert "before the PR" in s and "with it" in s and "dense MHA route" in s and "5 fresh processes" in s


def test_route_summary_without_rows_says_so_and_gives_no_number(tmp_path):
    from mla_lab.report.route_figures import route_summary, routes_available

    missing = tmp_path / "routes.csv"
    assert not routes_available(missing)
    (line,) = route_summary(missing)
    assert "not measured" in line and " ms" not in line and "%" not in line and "tokens [" not in line
    assert len(route_summary()) == 2


def test_plot_routes_leaves_no_pyplot_figure():
    """A pyplot figure would be shown a second time (unsaved) by a notebook's inline backend."""
    import matplotlib.pyplot as plt

    from mla_lab.report.route_figures import plot_routes

    before = set(plt.get_fignums())
    fig = plot_routes()
    assert set(plt.get_fignums()) == before and len(fig.axes) == 2
