"""The published site: each sweep run gets its own report (never overwritten), the latest copy, figures as PNG + SVG
beside the HTML, and reports/index.html listing every run with date, parameters and provenance."""

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mla_lab.report import site

REPO = Path(__file__).resolve().parent.parent
# the fixture's measured folder has no route rows: no routes figure; the noise figure reads data/validation
FIGURES = {"frontier_1", "tp_bars", "ttft_heatmap", "serving_changes", "rate_curve", "noise_pr53878"}
N_STRATEGIES = 3  # the fixture's sweeps price unfused (both ends of vllm-pre-53878) and fused


def _sweep(tmp: Path, *extra, measured: Path):
    args = ["sweep", "-p", "models", "[glm-5]", "-p", "tp_sizes", "[8]", "-p", "prompt_lens", "[1024]",
            "-p", "max_num_batched_tokens", "[16384]", "-p", "device", "cpu", "-p", "check_equivalence", "false",
            "-p", "strategies", "[unfused, fused]", "-p", "store_dir", "st", "-p", "data_file", "rows.csv", *extra]
    env = {**os.environ, "MLA_LAB_MEASURED": str(measured)}
    return subprocess.run([sys.executable, "-m", "mla_lab.cli", *args], cwd=tmp, capture_output=True, text=True,
                          timeout=600, env=env)


def _measured_rows(path: Path):
    """Test-only rows shaped like a GPU sweep's measured rows for the h200 point of the grid (never under data/)."""
    import pandas as pd

    from mla_lab.sweep.rows import modelled_rows as price_point

    pt = {"model": "glm-5", "tp": 8, "arch": "h200", "max_num_batched_tokens": 16384, "prompt_len": 1024,
          "kv_cache_dtype": "bf16", "num_prompts": 32, "concurrency": 32, "weight_dtype": "fp8", "moe_parallel": "ep",
          "strategies": ["fused"]}
    d = pd.DataFrame(price_point(pt))
    d = d.assign(source="measured", device="NVIDIA H200 (test row)", git_commit="feedc0ffee00", point_key="m1",
                 timestamp="2026-11-30T00:00:00+00:00")
    path.mkdir(parents=True)
    d.to_csv(path / "padding_sweep.csv", index=False)
    return d


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two sweep runs into one report_dir (relative paths: resolved against the command's directory): h200 with
    measured rows beside it, then b200 (no measured rows for that arch) with --overwrite."""
    tmp = tmp_path_factory.mktemp("site")
    _measured_rows(tmp / "measured" / "h200")
    r1 = _sweep(tmp, "-p", "archs", "[h200]", measured=tmp / "measured")
    assert r1.returncode == 0, r1.stderr[-3000:]
    # another grid into the same data_file and main report: replaced only when asked (issue 32)
    r2 = _sweep(tmp, "-p", "archs", "[b200]", "--overwrite", measured=tmp / "measured")
    assert r2.returncode == 0, r2.stderr[-3000:]
    return tmp, r1, r2


@pytest.mark.slow
def test_each_run_has_its_own_report_and_figures(two_runs):
    tmp, r1, r2 = two_runs
    runs = tmp / "reports" / "runs"
    metas = sorted(runs.glob("*.json"))
    assert len(metas) == 2
    ids = [json.loads(p.read_text())["run_id"] for p in metas]
    for rid in ids:
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}(-\d+)?", rid)
        html = (runs / f"{rid}.html").read_text()
        assert html.count('src="data:image/png;base64') == len(FIGURES)  # embedded: the HTML stands alone
        assert "cdnjs" not in html and "<script src=" not in html  # nothing fetched from the network
        assert "points  elapsed" not in html  # the sweep's progress log is left out of the report
        assert "Provenance" in html and "numbers, answered" in html
        for name in FIGURES:
            assert (runs / rid / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
            assert "<svg" in (runs / rid / f"{name}.svg").read_text()[:500]
        assert (runs / f"{rid}.ipynb").is_file() and (runs / f"{rid}.csv").is_file()
    # different parameters -> different hash part; the two reports differ (h200 vs b200)
    assert ids[0].split("-")[2] != ids[1].split("-")[2]
    for p in metas:
        m = json.loads(p.read_text())
        arch, other = m["params"]["archs"][0], {"h200": "b200", "b200": "h200"}[m["params"]["archs"][0]]
        html = (runs / f"{m['run_id']}.html").read_text()
        assert f"arch = {arch}" in html and f"arch = {other}" not in html  # the summary table's caption
        # the provenance banner: measured rows (test rows for the h200 point) named with their GPU, or none
        assert ("Measured: 2 rows" in html and "NVIDIA H200 (test row)" in html) if arch == "h200" else \
            ("Measured: none." in html)
    # the terminal got the progress and the three paths
    assert "[mla-lab] 1/1 points" in r1.stderr
    assert "report written to reports/padding_sweep.html" in r1.stdout and "reports/index.html" in r1.stdout


@pytest.mark.slow
def test_latest_copy_is_the_last_run(two_runs):
    tmp, _, r2 = two_runs
    rep = tmp / "reports"
    last = json.loads(max((rep / "runs").glob("*.json"), key=lambda p: json.loads(p.read_text())["created_utc"]
                          + p.name).read_text())
    assert (rep / "padding_sweep.html").read_text() == (rep / last["html"]).read_text()
    assert "'b200'" in json.dumps(last["params"]["archs"]).replace('"', "'")
    for name in FIGURES:
        assert (rep / "padding_sweep" / f"{name}.png").read_bytes() == (rep / "runs" / last["run_id"] /
                                                                        f"{name}.png").read_bytes()
    assert (rep / "padding_sweep.png").read_bytes() == (rep / "padding_sweep" / "frontier_1.png").read_bytes()
    assert (rep / "padding_sweep.svg").is_file()


@pytest.mark.slow
def test_index_lists_every_run_with_date_parameters_provenance(two_runs):
    tmp, _, _ = two_runs
    rep = tmp / "reports"
    index = (rep / "index.html").read_text()
    metas = [json.loads(p.read_text()) for p in (rep / "runs").glob("*.json")]
    assert index.count('<div class="run">') == 2
    assert index.count('class="headline"') == 2  # one headline per run (issue 22)
    for m in metas:
        assert f'href="{m["html"]}"' in index
        assert m["created_utc"].replace("T", " ").replace("+00:00", " UTC") in index
        assert m["provenance"]["sources"]["modelled"]["rows"] == N_STRATEGIES  # 1 point x every strategy
        for name in FIGURES:
            f = m["figures"][name]
            assert f'href="{f["png"]}"' in index and f'href="{f["svg"]}"' in index
    assert "archs: <code>h200</code>" in index and "archs: <code>b200</code>" in index
    scope = pd.read_csv(tmp / "rows.csv")["ttft_scope"].iloc[0]
    assert index.count(f"<b>modelled</b> 3 rows (TTFT scope {scope}") == 2
    by_arch = {m["params"]["archs"][0]: m for m in metas}
    # the h200 run shows the measured rows of its point (2 strategies), with their GPU and commit; b200 has none
    assert by_arch["h200"]["provenance"]["sources"]["measured"]["rows"] == 2
    assert by_arch["h200"]["provenance"]["sources"]["measured"]["device"] == ["NVIDIA H200 (test row)"]
    assert "measured" not in by_arch["b200"]["provenance"]["sources"]
    assert "<b>measured</b> 2 rows on NVIDIA H200 (test row)" in index and "commit feedc0ffee00" in index
    assert "<b>measured</b>: none" in index
    assert 'href="padding_sweep.html"' in index
    # newest first
    dates = re.findall(r'<span class="meta">([^,<]+?UTC)', index)
    assert len(dates) == 2 and dates == sorted(dates, reverse=True)
    # rebuilding from the run files gives the same page
    before = index
    r = subprocess.run([sys.executable, "-m", "mla_lab.cli", "index"], cwd=tmp, capture_output=True, text=True)
    assert r.returncode == 0 and "index of 2 report(s)" in r.stdout
    assert (rep / "index.html").read_text() == before


def test_run_ids_never_collide(tmp_path):
    now = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.timezone.utc)
    a = site.new_run_id(tmp_path, {"x": 1}, now)
    assert a == f"20261130-120000-{site.params_hash({'x': 1})}"
    (tmp_path / f"{a}.html").write_text("x")
    b = site.new_run_id(tmp_path, {"x": 1}, now)
    assert b == f"{a}-2"
    assert site.new_run_id(tmp_path, {"x": 2}, now) != a
    assert site.params_hash({"a": 1, "b": 2}) == site.params_hash({"b": 2, "a": 1})


def test_index_without_runs_says_so(tmp_path):
    out = site.build_index(tmp_path)
    assert "No published reports yet" in out.read_text()
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "broken.json").write_text("{not json")
    (tmp_path / "runs" / "orphan.json").write_text(json.dumps({"run_id": "orphan"}))  # its HTML is missing
    assert site.list_runs(tmp_path) == []


def test_printed_text_wraps_between_words_not_inside_them(tmp_path):
    """The lab theme sets ``word-break: break-all`` on printed output (the advice block broke 'which' into 'w' /
    'hich'); the report's own rule comes after it and sets ``normal``, so a long line wraps at its spaces."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('x')", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="which " * 300)])])
    nbformat.write(nb, tmp_path / "n.ipynb")
    html = site.notebook_to_html(tmp_path / "n.ipynb", "t")
    theme, ours = html.find("word-break: break-all"), html.find(".jp-OutputArea-output pre { word-break: normal; }")
    assert 0 <= theme < ours, (theme, ours)
