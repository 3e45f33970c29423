"""Issue 32: in a sweep over ``kv_cache_dtype: [bf16, fp8]`` every figure, the serving section and the advice showed
bf16 only, and the fp8 rows appeared in the last table with no word. Each bf16-only view now names what it leaves
out: the figures' titles, the frontier section's text and the serving / advice sections' deployment note."""

from __future__ import annotations

import pandas as pd
import pytest

from mla_lab.placement import BASELINE
from mla_lab.seed import seed_point
from mla_lab.sweep.rows import modelled_rows

STRATS = [BASELINE, "private_workspace", "kernel_native"]


@pytest.fixture(scope="module")
def both() -> pd.DataFrame:
    """The seed at bf16 and fp8 KV, and a second prompt length at fp8 (3 deployment points, 2 of them fp8)."""
    rows = []
    for kv, L in (("bf16", 1024), ("fp8", 1024), ("fp8", 4096)):
        rows += modelled_rows(seed_point(strategies=STRATS, kv_cache_dtype=kv, prompt_len=L))
    return pd.DataFrame(rows)


def _title(fig) -> str:
    return fig._suptitle.get_text().replace("\n", " ") if fig._suptitle is not None else ""


def test_the_note_counts_the_points_left_out(both):
    from mla_lab.report.figures import kv_dtype_note
    note = kv_dtype_note(both, "bf16")
    assert note.startswith("fp8 KV rows: 2 deployment points, not drawn here (this view shows bf16 KV only)")
    assert "no heads are padded, so the padded-Q strategies price alike" in note
    assert kv_dtype_note(both[both["kv_cache_dtype"] == "bf16"], "bf16") == ""  # nothing left out: no note
    assert kv_dtype_note(both, None) == ""  # every dtype shown
    assert kv_dtype_note(both, "fp8").startswith("bf16 KV rows: 1 deployment point, not drawn here")


def test_every_bf16_only_figure_says_what_it_leaves_out(both):
    from mla_lab.report.figures import plot_frontier_grid, plot_heatmap, plot_tp_bars
    figs = {"frontier": plot_frontier_grid(both, kv_cache_dtype="bf16")[0],
            "tp_bars": plot_tp_bars(both, kv_cache_dtype="bf16"),
            "heatmap": plot_heatmap(both, kv_cache_dtype="bf16")}
    for name, fig in figs.items():
        assert "fp8 KV rows: 2 deployment points, not drawn here" in _title(fig), (name, _title(fig))
    only = both[both["kv_cache_dtype"] == "bf16"]
    assert "fp8" not in _title(plot_tp_bars(only, kv_cache_dtype="bf16"))  # a bf16 sweep: no note


def test_the_serving_and_advice_sections_name_the_dtypes_they_leave_out():
    from mla_lab.report.serving import swept_deployment
    from mla_lab.sweep import validate_params
    grid = dict(models=["glm-5"], tp_sizes=[8], archs=["h200"], max_num_batched_tokens=[16384],
                prompt_lens=[1024], num_prompts=32)
    dep, note = swept_deployment(validate_params({**grid, "kv_cache_dtype": ["bf16", "fp8"]}))
    assert dep.kv_cache_dtype == "bf16"
    assert "bf16 KV only: the sweep's fp8 KV rows are not served or advised here" in note
    dep, note = swept_deployment(validate_params({**grid, "kv_cache_dtype": "bf16"}))
    assert note == "the PR's deployment"
