"""The packed kernel's committed H200 rows (data/measured/h200/between_process/packed_kernels.csv): the figures
docs/packed.md and README state are recomputed here from the file with plain pandas (not through
mla_lab.report.packed_figures), the dispatch rule holds on every shape, and the generated table is current."""

from __future__ import annotations

import re
import shutil

import pandas as pd
import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.report import packed_figures as pk

CSV = REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "packed_kernels.csv"
DOC = REPO_ROOT / "docs" / "packed.md"


@pytest.fixture(scope="module")
def med():
    d = pd.read_csv(CSV)
    d = d[d["experiment"] == "packed_kernels"]
    per_process = d.groupby(["shape", "kernel", "process"])["ms"].median()
    return per_process.groupby(["shape", "kernel"]).median().unstack()


def _x(med, kernel, shape, against="flashmla_ts_pad64"):
    return med.loc[shape, against] / med.loc[shape, kernel]


def test_rows_are_five_fresh_processes_on_an_h200():
    d = pd.read_csv(CSV)
    assert d["process"].nunique() == 5
    assert set(d["gpu"]) == {"NVIDIA H200"} and set(d["source"]) == {"measured"}
    assert set(d["shape"].dropna()) >= set(pk.SHAPE_ORDER)


def test_packed_kernel_matches_the_reference_in_every_process():
    d = pd.read_csv(CSV)
    chk = d[d["experiment"] == "check"]
    assert len(chk) == 5 * 3 * 2  # processes x H in {8, 16, 32} x {hybrid, triton}
    assert (chk["max_abs_err"] < 3e-2).all()  # bf16 outputs of magnitude ~1


def test_module_figures_equal_plain_pandas(med):
    for s in pk.SHAPE_ORDER:
        for k in ("packed", "packed_kernel", "dispatched", "flashmla_bound", "fa3_sparse", "sglang_triton"):
            assert pk.speedup(k, s) == pytest.approx(_x(med, k, s), rel=1e-12)


def test_dispatch_is_never_more_than_2_percent_slower_than_its_fallback(med):
    for s in pk.SHAPE_ORDER:
        assert med.loc[s, "dispatched"] <= 1.02 * med.loc[s, "flashmla_ts_pad64_zeros"], s


def test_dispatch_packs_only_where_packing_is_faster(med):
    for s in pk.SHAPE_ORDER:
        path = pk.dispatch_path(s)
        best_packed = min(med.loc[s, "packed"], med.loc[s, "packed_kernel"] + med.loc[s, "union_build"])
        if path == "padded":
            assert best_packed > 0.95 * med.loc[s, "flashmla_ts_pad64_zeros"], s
        else:
            assert best_packed < med.loc[s, "flashmla_ts_pad64_zeros"], s


def test_targets_are_reported_as_measured(med):
    rows = pk.targets()
    assert rows[0]["value"] == pytest.approx(_x(med, "packed", "seed")) and not rows[0]["met"]
    assert rows[1]["value"] == pytest.approx(_x(med, "packed", "o0.8")) and not rows[1]["met"]
    assert rows[2]["value"] == pytest.approx(_x(med, "packed", "ctx4096")) and not rows[2]["met"]
    worst = max(med.loc[s, "dispatched"] / med.loc[s, "flashmla_ts_pad64_zeros"] for s in pk.SHAPE_ORDER)
    assert rows[3]["value"] == pytest.approx(worst) and rows[3]["met"]
    packs = [s for s in pk.SHAPE_ORDER if pk.dispatch_path(s) != "padded"]
    share = max(med.loc[s, "union_build"] / med.loc[s, "packed_kernel"] for s in packs)
    assert rows[4]["value"] == pytest.approx(share) and not rows[4]["met"]


def test_docs_state_the_figures_of_the_rows(med):
    text = DOC.read_text()
    want = {
        "3.30x": _x(med, "packed", "seed"), "4.46x": _x(med, "packed_kernel", "seed"),
        "7.51x": _x(med, "flashmla_bound", "seed"), "6.09x": _x(med, "packed", "o1.0"),
        "1.21x": _x(med, "packed", "o0.8"), "3.17x": _x(med, "flashmla_bound", "o0.8"),
        "1.20x": _x(med, "packed", "ctx4096"), "4.02x": _x(med, "flashmla_bound", "ctx4096"),
    }
    for stated, value in want.items():
        assert stated in text
        assert f"{value:.2f}x" == stated
    slow = max(med.loc[s, "dispatched"] / med.loc[s, "flashmla_ts_pad64_zeros"] for s in pk.SHAPE_ORDER)
    assert "never more than 1.5 % slower" in text and round((slow - 1) * 100, 1) == 1.5
    assert f"packed path's {med.loc['seed', 'packed']:.2f} ms" in text
    share = med.loc["seed", "union_build"] / med.loc["seed", "packed_kernel"]
    assert re.search(r"at the\s+seed \(35 %\)", text) and round(share * 100) == 35


def test_generated_table_is_current(tmp_path):
    doc = tmp_path / "packed.md"
    shutil.copy(DOC, doc)
    assert pk.update_docs(doc) is False, "run python -m mla_lab.report.packed_figures --update-docs"
