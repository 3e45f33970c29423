"""The published report rendered in headless Chromium (playwright driving the system binary): every figure loaded
and is not blank on screen (screenshot pixel check), and no JavaScript error or failed request occurred. Also shows
the check fails on a blank figure, a broken image, a script error, a network load and a clipped SVG legend/title;
and that a figure with a clipped legend or title is refused when it is published (checked on the Figure itself,
:func:`mla_lab.report.layout_check.figure_clipping`; no browser needed).

Chromium: Debian's `chromium` package (`.ci/run` installs it); playwright: the `lab` extra. Without either the
browser tests are skipped, except in CI (CI=true), where they fail.
"""

import base64
import importlib.util
import io
import os
import subprocess
import sys

import pytest

from mla_lab.report import figures
from mla_lab.report.browser import PLAYWRIGHT_HINT, PROTECTED_DIRS, check_in_browser, find_chromium
from mla_lab.report.layout_check import figure_clipping

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    msg = None
    if not path:
        msg = "no Chromium on PATH (apt-get update && apt-get install -y chromium)"
    elif importlib.util.find_spec("playwright") is None:
        msg = f"playwright is not installed ({PLAYWRIGHT_HINT})"
    if msg is None:
        return path
    if IN_CI:
        pytest.fail(f"{msg}; CI=true, so the browser check must run")
    pytest.skip(f"{msg}; outside CI this test is skipped")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A report published by the main command on a small grid (both archs, so every figure has two panels)."""
    tmp = tmp_path_factory.mktemp("pub")
    args = ["sweep", "-p", "models", "[glm-5, deepseek-v3.2]", "-p", "tp_sizes", "[2, 8]", "-p", "prompt_lens",
            "[1024, 8192]", "-p", "max_num_batched_tokens", "[16384]", "-p", "device", "cpu", "-p", "store_dir", "st",
            "-p", "data_file", "rows.csv"]
    r = subprocess.run([sys.executable, "-m", "mla_lab.cli", *args], cwd=tmp, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "reports"


def _published_pngs(reports) -> list:
    """The PNG figures of the (one) published run, each with its SVG beside it."""
    pngs = sorted((reports / "runs").glob("*/*.png"))
    assert pngs and all(p.with_suffix(".svg").is_file() for p in pngs)
    return pngs


@pytest.mark.slow
def test_published_report_renders_with_every_figure(chromium, published, tmp_path):
    res = check_in_browser(published / "padding_sweep.html", screenshot=tmp_path / "report.png", chromium=chromium)
    assert res["errors"] == [], res["errors"]
    assert res["problems"] == [], res["problems"]
    assert res["ok"]
    # every figure the run published (PNG + SVG in runs/<run id>/) is on the page: frontier pages, per-TP bars,
    # heatmap, rate curve, model validation...
    assert len(res["images"]) == len(_published_pngs(published)) >= 3
    for im in res["images"]:
        assert im["complete"] and im["naturalWidth"] > 500 and im["naturalHeight"] > 300
        assert im["width"] > 300 and im["ink"] > 0.02, im  # drawn on screen with visible content
    assert res["page"]["title"].startswith("mla_lab padding_sweep ")
    assert res["screenshot"].stat().st_size > 50_000


@pytest.mark.slow
def test_index_and_run_report_render(chromium, published, tmp_path):
    res = check_in_browser(published / "index.html", screenshot=tmp_path / "index.png", chromium=chromium)
    assert res["ok"], res["problems"]
    assert len(res["images"]) == 1 and res["images"][0]["naturalWidth"] > 500  # the run's thumbnail (a file)
    run_html = next((published / "runs").glob("*.html"))
    res = check_in_browser(run_html, screenshot=tmp_path / "run.png", chromium=chromium)
    assert res["ok"], res["problems"]
    assert len(res["images"]) == len(_published_pngs(published))


def _png(color, size=(400, 300), line=False) -> str:
    from PIL import Image, ImageDraw

    im = Image.new("RGB", size, color)
    if line:
        ImageDraw.Draw(im).line((0, 0, size[0], size[1]), fill="black", width=12)
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_the_check_catches_blank_and_broken_figures_and_script_errors(chromium, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(f"""<!DOCTYPE html><html><head><title>bad</title></head><body>
<p>a good figure</p><img alt="good" src="{_png('white', line=True)}">
<p>a blank figure</p><img alt="blank" src="{_png('white')}">
<p>a broken figure</p><img alt="broken" src="missing-figure.png" width="300" height="200">
<script>undefinedFunctionInTheReport();</script>
</body></html>""")
    res = check_in_browser(page, screenshot=tmp_path / "bad.png", chromium=chromium)
    assert not res["ok"]
    by_alt = {im["alt"]: im for im in res["images"]}
    assert by_alt["good"]["ink"] > 0.02 and by_alt["blank"]["ink"] < 0.001
    probs = "\n".join(res["problems"])
    assert "image 2 (blank) looks blank on screen" in probs
    assert "image 3 (broken) did not load" in probs
    assert "image 1 (good)" not in probs
    assert any("undefinedFunctionInTheReport" in e for e in res["errors"])  # the JS exception
    assert any("missing-figure.png" in e for e in res["errors"])  # the failed load, from the browser log


@pytest.mark.slow  # Chromium start (1-4 s); the blank/broken/script-error check stays in test-fast
def test_a_clean_page_passes(chromium, tmp_path):
    page = tmp_path / "good.html"
    page.write_text(f"<!DOCTYPE html><html><body><img alt='fig' src=\"{_png('white', line=True)}\">"
                    "<script>console.log('fine');</script></body></html>")
    res = check_in_browser(page, screenshot=tmp_path / "good.png", chromium=chromium)
    assert res["ok"] and res["problems"] == [] and len(res["images"]) == 1


@pytest.mark.slow  # Chromium start (1-4 s); the blank/broken/script-error check stays in test-fast
def test_network_loads_are_blocked_and_reported(chromium, tmp_path):
    """A self-contained report loads nothing from the network: a remote image is aborted and named."""
    page = tmp_path / "net.html"
    page.write_text(f"<!DOCTYPE html><html><body><img alt='fig' src=\"{_png('white', line=True)}\">"
                    "<img alt='remote' src='https://example.invalid/fig.png' width='300' height='200'></body></html>")
    res = check_in_browser(page, screenshot=tmp_path / "net.png", chromium=chromium)
    assert not res["ok"]
    assert any("request failed: https://example.invalid/fig.png" in e for e in res["errors"]), res["errors"]
    assert "image 2 (remote) did not load" in "\n".join(res["problems"])


@pytest.mark.slow  # Chromium start (1-4 s); the blank/broken/script-error check stays in test-fast
def test_screenshot_goes_to_a_temp_folder_never_beside_the_page(chromium, tmp_path):
    page = tmp_path / "p.html"
    page.write_text(f"<!DOCTYPE html><html><body><img alt='fig' src=\"{_png('white', line=True)}\"></body></html>")
    res = check_in_browser(page, chromium=chromium)
    assert res["ok"], res["problems"]
    assert res["screenshot"].is_file() and res["screenshot"].parent != tmp_path
    assert list(tmp_path.iterdir()) == [page]  # nothing written beside the checked page
    with pytest.raises(RuntimeError, match="inside the committed report folder"):
        check_in_browser(page, screenshot=PROTECTED_DIRS[0] / "x.png", chromium=chromium)
    assert not (PROTECTED_DIRS[0] / "x.png").exists()


# ------------------------------------------------------------------------- clipped legends and titles (issue 12)


def _clipped_figure(kind: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))  # no layout engine, saved without bbox_inches="tight": outside means cut off
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="private_workspace")
    ax.plot([0, 1], [1, 0], label="per_call_empty:zeros")
    if kind in ("legend", "both"):
        ax.legend(bbox_to_anchor=(1.3, 1), loc="upper left", title="strategy")
    else:
        ax.legend()
    ax.set_title("GLM-5 TP8 on H200", y=1.5 if kind in ("title", "both") else 1.0)
    if kind == "suptitle":
        fig.suptitle("memory vs TTFT", y=1.2)
    if kind == "figlegend":
        fig.legend(bbox_to_anchor=(0.5, -0.2), loc="upper center")
    return fig


def _normal_figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4), layout="constrained")
    axs = fig.subplots(1, 2)
    for ax in axs:
        ax.plot([0, 1], [0, 1], label="private_workspace")
        ax.set_title("H200")
    axs[1].legend(bbox_to_anchor=(1.02, 1), loc="upper left")  # outside the axes, but the layout makes room
    fig.suptitle("memory vs TTFT per deployment")
    return fig


@pytest.mark.parametrize("kind,artist,side", [
    ("legend", "axes 1 legend 'strategy'", "right"),
    ("title", "axes 1 title 'GLM-5 TP8 on H200'", "top"),
    ("suptitle", "suptitle 'memory vs TTFT'", "top"),
    ("figlegend", "figure legend", "bottom"),
])
def test_figure_clipping_names_the_clipped_artist(kind, artist, side):
    problems = figure_clipping(_clipped_figure(kind))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{artist} is clipped: ") and f"past the {side} edge" in problems[0]


def test_figure_clipping_passes_a_normal_figure_and_keeps_its_canvas():
    fig = _normal_figure()
    canvas = fig.canvas
    assert figure_clipping(fig) == []
    assert fig.canvas is canvas


def test_figure_clipping_of_axis_labels_on_request():
    """Axis labels (a colour bar's included) are checked with ``axis_labels=True``: a colour-bar label longer than
    the figure is tall is cut at both ends."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 2.5), layout="constrained")
    ax = fig.add_subplot()
    cb = fig.colorbar(ax.imshow([[1.0, 2.0]]), ax=ax)
    cb.set_label("TTFT change of private_workspace vs baseline [%]")
    assert figure_clipping(fig) == []  # legends and titles only: fine
    (line,) = figure_clipping(fig, axis_labels=True)
    assert line.startswith("axes 2 ylabel 'TTFT change of private_workspace vs baseline [%]' is clipped: ")
    assert "past the bottom" in line and "past the top" in line


def test_publish_figure_refuses_a_clipped_legend_and_title(tmp_path):
    """The deliberately clipped figure (legend at bbox_to_anchor=(1.3, 1), title far above) is not published; a
    normal one is."""
    with pytest.raises(ValueError) as ei:
        figures.publish_figure(_clipped_figure("both"), "clipped", tmp_path / "figs", show=False)
    msg = str(ei.value)
    assert msg.startswith("figure 'clipped': ")
    assert "axes 1 legend 'strategy' is clipped" in msg and "axes 1 title 'GLM-5 TP8 on H200' is clipped" in msg
    assert not (tmp_path / "figs").exists()  # nothing written
    out = figures.publish_figure(_normal_figure(), "normal", tmp_path / "figs", show=False)
    assert out["png"].is_file() and out["svg"].is_file()


@pytest.mark.slow  # Chromium start (1-4 s); the blank/broken/script-error check stays in test-fast
def test_the_browser_check_catches_a_clipped_svg(chromium, tmp_path):
    """The same clipping seen in the browser on the published SVG (opened as the page, and inline in a page)."""
    bad, good = tmp_path / "clipped.svg", tmp_path / "normal.svg"
    _clipped_figure("both").savefig(bad, format="svg")  # what a figure saved behind publish_figure's back shows
    _normal_figure().savefig(good, format="svg")
    res = check_in_browser(bad, screenshot=tmp_path / "bad.png", chromium=chromium)
    probs = "\n".join(res["problems"])
    assert not res["ok"] and "legend_1" in probs and "past the right edge" in probs and "past the top edge" in probs
    assert check_in_browser(good, screenshot=tmp_path / "good.png", chromium=chromium)["problems"] == []
    page = tmp_path / "inline.html"
    page.write_text("<!DOCTYPE html><html><body><p>figure</p><svg" + bad.read_text().split("<svg", 1)[1]
                    + "</body></html>")
    res = check_in_browser(page, screenshot=tmp_path / "inline.png", chromium=chromium)
    assert any(p.startswith("svg 1 is clipped: legend_1") for p in res["problems"]), res["problems"]


# ------------------------------------------------------------------- pages that fit a 1280 px window (issue 22)
def test_the_check_fails_a_page_wider_than_the_window_and_a_table_wider_than_its_box(chromium, tmp_path):
    """A 2000 px block makes the page scroll sideways; a 1500 px table in a 600 px scrolling box is cut off; the
    same table folded in a closed <details> is not on screen and passes; a narrow page passes."""
    cells = "".join(f"<td>column {i} with a long value</td>" for i in range(12))
    wide = tmp_path / "wide.html"
    wide.write_text(f"""<!DOCTYPE html><html><body><div style="width:2000px">a wide block</div>
<div style="width:600px; overflow-x:auto"><table style="width:1500px"><tr><th>strategy</th>{cells}</tr></table></div>
</body></html>""")
    res = check_in_browser(wide, screenshot=tmp_path / "wide.png", chromium=chromium)
    probs = "\n".join(res["problems"])
    assert not res["ok"]
    assert "wider than the 1280 px window" in probs and "the page is 20" in probs
    assert "table 1 (strategy) is 1500 px wide in a 600 px container" in probs
    narrow = tmp_path / "narrow.html"
    narrow.write_text(f"""<!DOCTYPE html><html><body><p>a narrow page</p>
<details><summary>full table</summary><div style="width:600px; overflow-x:auto"><table style="width:1500px"><tr>
<th>strategy</th>{cells}</tr></table></div></details></body></html>""")
    res = check_in_browser(narrow, screenshot=tmp_path / "narrow.png", chromium=chromium)
    assert res["ok"], res["problems"]


def _bars_with_labels(n: int, width: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 2.5), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.bar(range(n), [1.0 + 0.01 * i for i in range(n)])
    ax.set_xticks(range(n), [f"subchunk:{512 * (i + 1)}:views" for i in range(n)])
    ax.bar_label(bars, labels=[f"{-4.15 + 0.01 * i:+.1f} %" for i in range(n)])
    return fig


def test_label_overlaps_catches_overlapping_tick_and_bar_labels():
    """Twelve long tick labels and bar labels on a 4-inch axes print over each other: named, pair by pair; the same
    three bars on a wide figure pass."""
    from mla_lab.report.layout_check import label_overlaps

    probs = label_overlaps(_bars_with_labels(12, 4.0))
    assert probs and any("x-tick label 'subchunk:512:views' and x-tick label 'subchunk:1024:views' overlap" in p
                         for p in probs), probs[:3]
    assert any("label '-4.2 %' and label '-4.1 %' overlap" in p for p in probs), probs[:5]
    assert label_overlaps(_bars_with_labels(3, 9.0)) == []
