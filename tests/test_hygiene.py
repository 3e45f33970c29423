"""Notebook hygiene: every notebook is paired with a jupytext py:percent file and in sync with it, committed
notebooks carry no outputs, and the papermill entry point keeps a `parameters` cell that matches the sweep.

Each check is a small function used twice: on the repository's notebooks, and on deliberately broken copies, so a
check that cannot fail would show."""

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


def _cells(nb) -> list[tuple]:
    """What a pair must agree on: each cell's type, source and tags."""
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", []))) for c in nb.cells]


def pairing_problems(ipynb: Path) -> list[str]:
    """Why ``ipynb`` and its ``.py`` twin are not a synchronised jupytext ``ipynb,py:percent`` pair ([] if they are)."""
    import nbformat

    py = ipynb.with_suffix(".py")
    if not py.is_file():
        return [f"{ipynb.name}: no paired {py.name} (jupytext --set-formats ipynb,py:percent {ipynb.name})"]
    nb = nbformat.read(ipynb, as_version=4)
    fmts = nb.metadata.get("jupytext", {}).get("formats", "")
    problems = []
    if set(fmts.split(",")) != {"ipynb", "py:percent"}:
        problems.append(f"{ipynb.name}: jupytext formats {fmts!r}, want 'ipynb,py:percent'")
    text = py.read_text()
    if "format_name: percent" not in text:
        problems.append(f"{py.name}: not a py:percent file")
    import jupytext  # here, not at import: a GPU machine's `-m gpu` run collects this file without jupytext

    a, b = _cells(nb), _cells(jupytext.reads(text, fmt="py:percent"))
    if a != b:
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        problems.append(f"{ipynb.name} and {py.name} are out of sync from cell {diff} "
                        f"({len(a)} vs {len(b)} cells); run: jupytext --sync {py.relative_to(REPO) if py.is_relative_to(REPO) else py}")
    return problems


def output_problems(ipynb: Path) -> list[str]:
    """Cells of ``ipynb`` that carry outputs or execution counts."""
    nb = json.loads(ipynb.read_text())
    bad = [i for i, c in enumerate(nb["cells"]) if c.get("cell_type") == "code"
           and (c.get("outputs") or c.get("execution_count") is not None)]
    return [f"{ipynb.name}: cells {bad} carry outputs/execution counts (clear them before committing: "
            f"jupyter nbconvert --clear-output --inplace {ipynb.name})"] if bad else []


def _repo_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_notebooks():
    names = {p.name for p in _repo_notebooks()}
    assert {"padding_sweep.ipynb", "explore.ipynb"} <= names


@pytest.mark.parametrize("ipynb", _repo_notebooks(), ids=lambda p: p.name)
def test_notebook_is_paired_and_in_sync(ipynb):
    assert pairing_problems(ipynb) == []


def test_every_percent_script_has_its_notebook():
    for py in NOTEBOOKS.glob("*.py"):
        assert py.with_suffix(".ipynb").is_file(), f"{py.name} has no paired notebook (jupytext --sync {py.name})"


@pytest.mark.parametrize("ipynb", _repo_notebooks(), ids=lambda p: p.name)
def test_notebook_has_no_outputs(ipynb):
    assert output_problems(ipynb) == []


def test_committed_notebooks_have_no_outputs():
    """The committed blobs (HEAD), not only the working tree."""
    r = subprocess.run(["git", "ls-files", "notebooks/*.ipynb"], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"not a git checkout: {r.stderr.strip()}")
    tracked = r.stdout.split()
    assert "notebooks/padding_sweep.ipynb" in tracked
    for path in tracked:
        blob = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=REPO, capture_output=True, text=True)
        if blob.returncode != 0:
            continue  # added to the index but not committed yet: the working-tree test covers it
        nb = json.loads(blob.stdout)
        bad = [i for i, c in enumerate(nb["cells"]) if c.get("cell_type") == "code"
               and (c.get("outputs") or c.get("execution_count") is not None)]
        assert not bad, f"{path} at HEAD: cells {bad} carry outputs"


def test_the_checks_catch_broken_notebooks(tmp_path):
    import nbformat

    src = NOTEBOOKS / "padding_sweep.ipynb"
    # out of sync: a cell edited in the notebook only
    nb = nbformat.read(src, as_version=4)
    nb.cells[-1].source += "\nprint('edited in the ipynb only')"
    nbformat.write(nb, tmp_path / "a.ipynb")
    (tmp_path / "a.py").write_text((NOTEBOOKS / "padding_sweep.py").read_text())
    assert any("out of sync" in p for p in pairing_problems(tmp_path / "a.ipynb"))
    # a tag lost in the script
    nbformat.write(nbformat.read(src, as_version=4), tmp_path / "b.ipynb")
    (tmp_path / "b.py").write_text((NOTEBOOKS / "padding_sweep.py").read_text().replace(
        '# %% tags=["parameters"]', "# %%"))
    assert any("out of sync" in p for p in pairing_problems(tmp_path / "b.ipynb"))
    # no twin at all
    nbformat.write(nbformat.read(src, as_version=4), tmp_path / "c.ipynb")
    assert any("no paired c.py" in p for p in pairing_problems(tmp_path / "c.ipynb"))
    # outputs left in
    nb = nbformat.read(src, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    code.execution_count = 1
    nbformat.write(nb, tmp_path / "d.ipynb")
    assert output_problems(tmp_path / "d.ipynb") and not output_problems(src)


def _parameters(nb_path: Path) -> dict:
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{nb_path.name}: want exactly one cell tagged 'parameters', found {len(cells)}"
    ns: dict = {}
    exec(cells[0].source, {}, ns)
    return {k: v for k, v in ns.items() if not k.startswith("__")}  # typed parameters also leave __annotations__


def test_sweep_notebook_parameters_match_the_sweep():
    """The papermill entry point's parameters cell declares sweep parameters (plus the two the CLI injects) with the
    sweep's own defaults, so `make report` and the documented defaults agree."""
    from mla_lab.sweep.params import DEFAULTS
    from mla_lab.sweep.params import NOTEBOOK_ONLY as CLI_PARAMETERS  # what mla-lab sweep injects

    params = _parameters(NOTEBOOKS / "padding_sweep.ipynb")
    unknown = set(params) - set(DEFAULTS) - set(CLI_PARAMETERS)
    assert not unknown, f"parameters cell declares names the sweep does not know: {sorted(unknown)}"
    for k in set(params) & set(DEFAULTS):
        assert params[k] == DEFAULTS[k], f"notebook default {k}={params[k]!r} differs from the sweep's {DEFAULTS[k]!r}"
    for k in CLI_PARAMETERS:
        assert params[k] is None


def test_explore_notebook_parameters_are_explorer_arguments():
    from mla_lab.explore import DEPLOYMENT_CONTROLS

    params = _parameters(NOTEBOOKS / "explore.ipynb")
    assert set(params) <= set(DEPLOYMENT_CONTROLS) | {"strategy", "memory_budget_mib"}
