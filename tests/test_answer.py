"""The answer block (mla_lab.report.answer): README.md and the report's first cell hold exactly what the function
renders from the committed files, and its figures agree with the data they come from."""

import json

import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.report import answer
from mla_lab.report.engine_kernel_figures import kernel_ms

README = (REPO_ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def block():
    return answer.answer_markdown()


def _between(text):
    return text[text.index(answer.BEGIN) + len(answer.BEGIN):text.index(answer.END)].strip()


def test_readme_holds_the_rendered_block_on_its_first_screen(block):
    assert _between(README) == block.strip()
    assert README[:README.index(answer.BEGIN)].count("\n") < 15  # the answer starts on the first screen


def test_report_notebook_opens_with_the_same_block(block):
    nb = json.loads((REPO_ROOT / "notebooks" / "padding_sweep.ipynb").read_text())
    assert _between("".join(nb["cells"][0]["source"])) == block.strip()
    py = (REPO_ROOT / "notebooks" / "padding_sweep.py").read_text()
    lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in _between(py).split("\n")]
    assert "\n".join(lines).strip() == block.strip()


def test_block_figures_come_from_the_data(block):
    f = answer.answer_figures()
    assert f"FA3 sparse {kernel_ms('fa3_sparse', 'seed', 8, num_splits=0)['median']:.2f} ms" in block
    assert f"{f['pred_duration_s']:.2f} s; the run took {f['real_duration_s']:.2f} s" in block
    assert f["duration_ratio"] == pytest.approx(0.68, abs=0.005)
    assert f"{f['extra_mib']:+.0f} MiB" in block and f["extra_mib"] == 1008
    # the block claims no more than the validation allows
    assert "does not rule noise out" in block and "rules out that" not in block
