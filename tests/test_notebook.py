"""The sweep notebook executed by papermill (through the CLI) on a tiny grid: data file, chart, HTML."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mla_lab import report

REPO = Path(__file__).resolve().parent.parent


def _cli(*args, cwd, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "mla_lab.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_cli_runs_notebook_on_tiny_grid(tmp_path):
    r = _cli("sweep", "-p", "models", "[glm-5]", "-p", "tp_sizes", "[8]", "-p", "prompt_lens", "[1024]",
             "-p", "max_num_batched_tokens", "[16384]", "-p", "device", "cpu",
             "-p", "store_dir", str(tmp_path / "st"), "-p", "data_file", str(tmp_path / "sweep.csv"),
             "-p", "report_dir", str(tmp_path / "rep"), "--report-name", "tiny", cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    import pandas as pd

    df = pd.read_csv(tmp_path / "sweep.csv")
    from mla_lab.placement import expand_strategies
    from mla_lab.sweep.params import DEFAULT_STRATEGIES

    want = set(expand_strategies(["per_call_empty:zeros"] + DEFAULT_STRATEGIES))
    assert set(df["strategy"]) == want and len(df) == 2 * len(want)  # 2 archs x every default strategy
    assert (df["source"] == "modelled").all()
    html = (tmp_path / "rep" / "tiny.html").read_text()
    # frontier page, TP bars, heatmap, serving changes, serving rate curve, the single-run noise distribution
    # (data/validation), + the validation figure and the routes figure when data/measured has their rows
    from mla_lab.report.route_figures import routes_available

    n_fig = 6 + bool(len(report.load_validation())) + routes_available()
    assert html.count('src="data:image/png;base64') == n_fig and "Memory vs TTFT, one panel per deployment" in html
    assert "The PR&#x27;s numbers, answered" in html or "The PR's numbers, answered" in html
    assert "Advice for the swept deployment" in html
    assert "the PR&#x27;s deployment" in html or "the PR's deployment" in html  # the swept one, named
    assert (tmp_path / "rep" / "tiny.png").stat().st_size > 10_000  # headline chart beside the latest HTML
    nb = json.loads((tmp_path / "rep" / "tiny.ipynb").read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in nb["cells"])


def test_cli_rejects_unknown_parameter_before_running(tmp_path):
    r = _cli("sweep", "-p", "tp_size", "[8]", "-p", "report_dir", str(tmp_path), cwd=REPO)
    assert r.returncode == 2
    assert "unknown sweep parameter(s) ['tp_size']" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_params_file_errors(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("- just\n- a list\n")
    r = _cli("sweep", "-f", str(f), cwd=REPO)
    assert r.returncode == 2 and "must hold a mapping" in r.stderr  # bad input: exit 2 (issue 24)
    r = _cli("sweep", "-f", str(tmp_path / "missing.yaml"), cwd=REPO)
    assert r.returncode == 2 and "no such file" in r.stderr


def test_notebook_without_parameters_cell_is_refused(tmp_path):
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / "padding_sweep.ipynb", as_version=4)
    for c in nb.cells:
        c.metadata.pop("tags", None)
    p = tmp_path / "noparams.ipynb"
    nbformat.write(nb, p)
    r = _cli("sweep", "--notebook", str(p), "-p", "report_dir", str(tmp_path), cwd=REPO)
    assert r.returncode == 2 and "has no cell tagged 'parameters'" in r.stderr  # bad input, refused at the door


def test_failing_cell_reports_its_error_not_a_traceback_wall(tmp_path):
    import nbformat

    nb = nbformat.read(REPO / "notebooks" / "padding_sweep.ipynb", as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("raise RuntimeError('boom from cell')"))
    p = tmp_path / "fails.ipynb"
    nbformat.write(nb, p)
    r = _cli("sweep", "--notebook", str(p), "-p", "report_dir", str(tmp_path / "rep"), "-p", "store_dir",
             str(tmp_path / "st"), "-p", "data_file", str(tmp_path / "d.csv"), cwd=REPO)
    assert r.returncode == 1
    assert "failed: RuntimeError: boom from cell" in r.stderr
    assert r.stderr.count("\n") < 5


@pytest.mark.slow
def test_sweep_where_every_point_fails_still_publishes_the_failures(tmp_path):
    # a model whose MLP does not shard over TP8 (heads do): every point fails when it is priced, not before
    import shutil

    data = tmp_path / "data"
    shutil.copytree(REPO / "data" / "models", data / "models")
    shutil.copytree(REPO / "data" / "calibration", data / "calibration")
    cfg = json.loads((data / "models" / "glm-5" / "config.json").read_text())
    (data / "models" / "odd").mkdir()
    (data / "models" / "odd" / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=12290)))
    env_data = {"MLA_LAB_DATA": str(data)}
    r = _cli("sweep", "-p", "models", "[odd]", "-p", "tp_sizes", "[8]", "-p", "archs", "[h200]",
             "-p", "store_dir", str(tmp_path / "st"), "-p", "data_file", str(tmp_path / "d.csv"),
             "-p", "report_dir", str(tmp_path / "rep"), "--report-name", "allfail", cwd=REPO, env=env_data)
    assert r.returncode == 1, r.stderr[-2000:]  # published, and the exit code says nothing was priced
    assert "every point failed" in r.stderr
    html = (tmp_path / "rep" / "allfail.html").read_text()
    assert "No grid point could be priced" in html
    assert "tp=8 does not divide intermediate_size=12290" in html


def test_concurrent_runs_get_distinct_run_ids(tmp_path):
    import datetime as dt

    from mla_lab.report import site

    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.timezone.utc)
    ids = {site.new_run_id(tmp_path, {"a": 1}, now) for _ in range(3)}
    assert len(ids) == 3 and all((tmp_path / i).is_dir() for i in ids)
