"""The front door (issue 31): README.md stays short, carries the answer-block markers and the generated module map,
and every link it (and the pages it sends a reader to) gives resolves; the report notebook opens with the answer
block and a table of contents whose links reach its sections, and shows every figure once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mla_lab.report import module_map as mm

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
NOTEBOOK = REPO / "notebooks" / "padding_sweep.ipynb"
#: The pages of the front door whose links are checked: README.md and the docs it moved its sections to.
PAGES = [README, *(REPO / "docs" / n for n in ("findings.md", "cli.md", "glossary.md", "design.md"))]
ANSWER_BEGIN = "<!-- answer:begin (python -m mla_lab.report.answer --update) -->"
ANSWER_END = "<!-- answer:end -->"
MAX_README_LINES = 160
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; at most {MAX_README_LINES} (move detail to docs/)"


def test_readme_has_the_answer_markers_before_anything_but_the_intro():
    text = README.read_text()
    assert text.count(ANSWER_BEGIN) == 1 and text.count(ANSWER_END) == 1
    begin, end = text.index(ANSWER_BEGIN), text.index(ANSWER_END)
    assert begin < end
    assert text[begin + len(ANSWER_BEGIN):end].strip(), "the answer block is empty"
    # the answer comes before the commands, the quick start and everything else
    assert begin < text.index("## The two commands") < text.index("## Quick start")
    assert len(re.findall(r"^## ", text[:begin], flags=re.M)) == 1  # only "The answer" heading above it


def test_the_report_notebook_opens_with_the_answer_block_and_contents():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and ANSWER_BEGIN in first.source and ANSWER_END in first.source
    assert first.source.index(ANSWER_BEGIN) < first.source.index(ANSWER_END)
    assert nb.cells[1].cell_type == "markdown" and nb.cells[1].source.startswith("## Contents")


def _nbconvert_id(heading: str) -> str:
    """The id nbconvert's HTML export gives a Markdown heading (its text, spaces as hyphens)."""
    return heading.strip().replace(" ", "-")


def test_report_contents_link_every_section_in_order():
    """The contents list every ``## N.`` section in order and each link is the id the exported HTML gives it."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(NOTEBOOK, as_version=4)
    md = [c for c in nb.cells if c.cell_type == "markdown"]
    sections = [m.group(1) for c in md for m in re.finditer(r"^## (\d\..*)$", c.source, flags=re.M)]
    assert [s.split(".")[0] for s in sections] == [str(i) for i in range(1, len(sections) + 1)] and len(sections) >= 6
    links = re.findall(r"\]\(#([^)]+)\)", nb.cells[1].source)
    assert links == [_nbconvert_id(s) for s in sections]
    html, _ = HTMLExporter(exclude_input=True).from_notebook_node(nbformat.v4.new_notebook(cells=md))
    ids = set(re.findall(r'<h[1-6] id="([^"]+)"', html))
    missing = [ln for ln in links if ln.replace("'", "&#39;") not in ids and ln not in ids]
    assert not missing, f"contents links with no heading of that id in the exported HTML: {missing}"


def test_report_publishes_every_figure_once():
    """Each figure name the notebook publishes is published by exactly one cell."""
    src = Path(NOTEBOOK.with_suffix(".py")).read_text()
    names = re.findall(r'saved\[(?:f)?"([^"]+)"\]\s*=', src)
    assert len(names) >= 8 and len(names) == len(set(names)), names


def test_module_map_in_readme_is_current():
    text = README.read_text()
    assert mm.BEGIN in text and mm.END in text, "README.md has no module-map markers"
    block = text[text.index(mm.BEGIN) + len(mm.BEGIN):text.index(mm.END)].strip()
    assert block == mm.module_map().strip(), "stale: python -m mla_lab.report.module_map --update-readme"


def test_module_map_lists_every_subpackage_with_its_docstring():
    block = mm.module_map()
    for p in sorted((REPO / "mla_lab").iterdir()):
        if (p / "__init__.py").exists():
            assert f"| `mla_lab/{p.name}/` | {mm.summary(p)} |" in block, p.name


def _fake_package(root: Path) -> Path:
    pkg = root / "mla_lab"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text('"""root."""\n')
    (pkg / "low" / "__init__.py").write_text('"""Low things: :mod:`.x` and ``y``. Second sentence."""\n')
    (pkg / "low" / "x.py").write_text("from .. import base\n")
    (pkg / "base.py").write_text('"""Base | pipes."""\n')
    (pkg / "high" / "__init__.py").write_text('"""High."""\nfrom ..low import x\nimport mla_lab.mid\n')
    (pkg / "mid.py").write_text("from .low import x\n")
    (pkg / "notes").mkdir()  # a folder without __init__.py is not a unit
    return pkg


def test_module_map_layers_and_summaries_on_a_small_package(tmp_path):
    pkg = _fake_package(tmp_path)
    assert list(mm.units(pkg)) == ["base", "high", "low", "mid"]
    assert [mm.layer(n, pkg) for n in ("base", "low", "mid", "high")] == [0, 1, 2, 3]
    assert mm.summary(pkg / "low") == "Low things: `x` and `y`."
    assert mm.summary(pkg / "base.py") == "Base \\| pipes."
    assert mm.summary(pkg / "mid.py") == "(no docstring)"
    block = mm.module_map(pkg)
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and "`mla_lab/" in ln]
    assert rows == ["| 1 | `mla_lab/low/` | Low things: `x` and `y`. |", "| 3 | `mla_lab/high/` | High. |"]
    assert "`base`, `mid`" in block
    with pytest.raises(ValueError, match="name='nope' is not a unit"):
        mm.layer("nope", pkg)


def test_module_map_refuses_a_circle_and_a_file_without_markers(tmp_path):
    pkg = _fake_package(tmp_path)
    (pkg / "base.py").write_text("from .high import x\n")  # base -> high -> low -> base
    with pytest.raises(ValueError, match="import circle"):
        mm.layer("high", pkg)
    doc = tmp_path / "README.md"
    doc.write_text("# no markers\n")
    with pytest.raises(ValueError, match="no module-map markers"):
        mm.update_readme("x", doc)
    assert doc.read_text() == "# no markers\n"
    doc.write_text(f"a\n{mm.BEGIN}\nold\n{mm.END}\nb\n")
    assert mm.update_readme("new", doc) and doc.read_text() == f"a\n{mm.BEGIN}\nnew\n{mm.END}\nb\n"
    assert not mm.update_readme("new", doc)  # unchanged: not rewritten


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    heads = {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.*)$", text, flags=re.M)}
    return heads | set(re.findall(r'<a id="([^"]+)"></a>', text))


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_local_link_resolves(page):
    """Every relative link of the page points at a file that exists, and an ``#anchor`` at a heading or ``<a id>``
    of that file (GitHub's rendering)."""
    assert page.exists(), page
    bad = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading or <a id> {anchor!r} in {dest.name}")
    assert not bad, f"{page.relative_to(REPO)}: " + "; ".join(bad)


def test_readme_links_every_doc_page():
    links = {t.partition("#")[0] for t in LINK.findall(README.read_text())}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= links, f"docs pages README does not link: {sorted(pages - links)}"


def test_findings_link_the_glossary_terms_the_brief_names():
    """docs/findings.md links each term to its glossary entry (the anchors are checked above)."""
    text = (REPO / "docs" / "findings.md").read_text()
    for anchor in ("ttft", "tpot", "itl", "seed", "h-prime", "prefill_padding", "stale", "concat-variants",
                   "graph-timing", "per-rank", "measured", "in-sample", "doors"):
        assert f"(glossary.md#{anchor})" in text, anchor
    first = {m.group(1): m.start() for m in reversed(list(re.finditer(r"\(glossary\.md#([\w-]+)\)", text)))}
    assert first["ttft"] < text.index("## What the lab says")  # defined before the first section uses it


def _readme_batch_commands() -> tuple[dict, list[str]]:
    """The README's papermill parameters (its ``-y`` JSON) and its ``mla-lab sweep`` arguments, as written there."""
    import json
    import shlex

    text = README.read_text()
    y = re.search(r"\.venv/bin/papermill notebooks/padding_sweep\.ipynb \S+ -y '([^']+)'", text)
    sw = re.search(r"\.venv/bin/mla-lab sweep (-p (?:[^\n]*\\\n)*[^\n]*)", text)  # the batch run, not the dry run
    assert y and sw, "README lost its papermill or mla-lab sweep batch command"
    return json.loads(y.group(1)), shlex.split(sw.group(1).replace("\\\n", " "))


@pytest.mark.slow
def test_readme_papermill_run_and_mla_lab_sweep_give_the_same_rows(tmp_path):
    """README's two batch commands, as written, with only their output paths moved into tmp_path: the same rows
    (on a CPU machine, where ``device`` auto prices every row; a GPU would measure each run anew)."""
    import json
    import subprocess
    import sys

    import pandas as pd

    from mla_lab.kernelspec import ensure_kernel

    params, sweep_args = _readme_batch_commands()
    paths = {"store_dir", "data_file", "report_dir"}
    assert paths <= set(params) and all(f"{p}" in sweep_args for p in paths)
    pm = {**params, "store_dir": str(tmp_path / "pm"), "data_file": str(tmp_path / "pm.csv"),
          "report_dir": str(tmp_path / "pm_rep")}
    moved = {"store_dir": str(tmp_path / "cli"), "data_file": str(tmp_path / "cli.csv"),
             "report_dir": str(tmp_path / "cli_rep")}
    cli = [moved.get(sweep_args[i - 1], a) if i >= 2 and sweep_args[i - 2] == "-p" else a
           for i, a in enumerate(sweep_args)]
    assert sum(x != y for x, y in zip(cli, sweep_args)) == 3  # only the three output paths moved
    ensure_kernel()
    r = subprocess.run([sys.executable, "-m", "papermill", str(NOTEBOOK), str(tmp_path / "out.ipynb"), "-y",
                        json.dumps(pm), "--no-progress-bar"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "mla_lab.cli", "sweep", *cli], cwd=REPO, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (pd.read_csv(tmp_path / f).drop(columns=["git_commit", "timestamp"]) for f in ("pm.csv", "cli.csv"))
    a, b = (d.sort_values(list(d.columns)).reset_index(drop=True) for d in (a, b))
    assert len(a) > 1 and a["strategy"].nunique() == len(a)  # one deployment, every strategy
    pd.testing.assert_frame_equal(a, b)
