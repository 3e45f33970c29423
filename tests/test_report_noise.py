"""mla_lab.report.noise_figures: the single-run distribution of PR #53878's change (figure, sentences, the section of docs/findings.md), every
number recomputed here from the committed data/validation/pr53878_noise_distribution.csv with numpy."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.report.noise_figures import (
    CASES,
    DIST_CSV,
    FIGURE_NAME,
    FINDINGS,
    NOISE_BEGIN,
    NOISE_END,
    PANELS,
    REPORTED,
    findings_section,
    load_noise_distribution,
    noise_sentences,
    plot_noise,
)

DOC = REPO_ROOT / "docs" / "findings.md"


def _pct(v: np.ndarray, x: float) -> float:
    """Percent of runs below x, ties half (written out here, not taken from the package)."""
    return float(100.0 * (np.sum(v < x) + 0.5 * np.sum(v == x)) / len(v))


@pytest.fixture(scope="module")
def raw() -> dict:
    df = pd.read_csv(DIST_CSV)
    return {c: {k: df[df["case"] == c][f"change_{k}_pct"].to_numpy() for k, _ in PANELS} for c, _ in CASES}


@pytest.fixture(scope="module")
def dist() -> dict:
    return load_noise_distribution()


def test_loaded_runs_are_the_committed_rows(dist, raw):
    for c, _ in CASES:
        r = dist["results"][c]
        assert r.num_runs == len(raw[c]["mean_ttft_ms"]) >= 500
        for k, _ in PANELS:
            np.testing.assert_array_equal(np.sort(r.change[k]), np.sort(raw[c][k]))
            assert r.percentile_of(k, REPORTED[k]) == pytest.approx(_pct(raw[c][k], REPORTED[k]))
    assert dist["results"]["identical_builds"].identical and not dist["results"]["pr_vs_before"].identical


def test_figure_renders_with_the_reported_lines_and_percentiles(dist, raw, tmp_path):
    from mla_lab.report.figures import publish_figure

    fig = plot_noise(dist)
    axes = fig.axes
    assert len(axes) == len(PANELS)
    for ax, (k, _) in zip(axes, PANELS):
        xs = [ln.get_xdata()[0] for ln in ax.get_lines()]
        assert REPORTED[k] in xs, k  # the reported figure is marked
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        for c, _ in CASES:
            assert any(f"at percentile {_pct(raw[c][k], REPORTED[k]):.1f}" in t for t in texts), (k, c, texts)
        lo, hi = ax.get_xlim()
        assert lo <= min(REPORTED[k], raw["identical_builds"][k].min()) and hi >= REPORTED[k]
        assert sum(p.get_height() for p in ax.patches) == pytest.approx(2 * len(raw["identical_builds"][k]))
    out = publish_figure(fig, FIGURE_NAME, tmp_path, show=False)  # the layout check passes
    assert out["png"].stat().st_size > 10_000


def test_sentences_state_the_recomputed_bands_and_percentiles(dist, raw):
    s = noise_sentences(dist)
    assert 2 <= len(s) <= 4
    text = " ".join(s)
    i, p = raw["identical_builds"]["mean_ttft_ms"], raw["pr_vs_before"]["mean_ttft_ms"]
    lo, hi = np.percentile(i, [2.5, 97.5])
    plo, phi = np.percentile(p, [2.5, 97.5])
    assert f"{lo:+.1f} % to {hi:+.1f} %" in text and f"{plo:+.1f} % to {phi:+.1f} %" in text
    assert f"percentile {_pct(p, -9.5):.1f}" in text and f"percentile {_pct(i, -9.5):.1f}" in text
    worst = max(_pct(raw["pr_vs_before"][k], -9.5) for k in ("median_ttft_ms", "p99_ttft_ms"))
    assert f"at most percentile {worst:.1f}" in text or max(worst, _pct(p, -9.5)) >= 2.5
    tp = _pct(raw["pr_vs_before"]["total_token_throughput"], 6.0)
    assert f"percentile {tp:.1f}" in text
    # the conclusion follows the numbers: "inside this noise model ... does not turn" only when -9.5 % is outside the
    # 95 % band of every statistic, and even then the lab does not rule noise out (issue 30: the model is not
    # validated for it)
    outside = max(_pct(raw["pr_vs_before"][k], -9.5) for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms")) < 2.5
    assert ("inside this noise model, one unlucky pair of runs does not turn" in text) == outside
    assert "the lab does not rule noise out" in text or not outside
    assert "rules out that" not in text
    assert "cannot rule out" in text
    # the API-server sensitivity: the prediction file's row that puts -9.5 % highest
    rows = [r for r in dist["prediction"]["arrival_sensitivity"] if "pr_vs_before_all_noise" in r]
    w = max(rows, key=lambda r: r["pr_vs_before_all_noise"]["percentile_of_reported_mean_ttft"])
    assert (f"at {w['per_request_ms']:g} ms per request" in text
            and f"percentile {w['pr_vs_before_all_noise']['percentile_of_reported_mean_ttft']:.1f} of PR vs before"
            in text)
    det = dist["prediction"]["change_distribution"]["mean_ttft_ms"]["pr_vs_before"]["deterministic"]
    assert f"modelled effect ({det:+.1f} %)" in text


def _doc_block() -> str:
    text = DOC.read_text()
    assert NOISE_BEGIN in text and NOISE_END in text, "docs/findings.md has no noise block"
    return text[text.index(NOISE_BEGIN) + len(NOISE_BEGIN):text.index(NOISE_END)].strip()


def test_findings_section_sits_after_the_prs_three_numbers():
    assert FINDINGS == DOC  # the generator writes where the block lives
    text = DOC.read_text()
    heads = [m.group(0) for m in re.finditer(r"^## .*$", text, flags=re.M)]
    i = heads.index("## Is the PR's -9.5 % one run's noise?")
    assert heads[i - 1] == "## What the lab says about the PR's three numbers"
    start = text.index("## Is the PR's -9.5 % one run's noise?")
    nxt = text.index(heads[i + 1]) if i + 1 < len(heads) else len(text)
    assert start < text.index(NOISE_BEGIN) < nxt  # the generated block is this section's


def test_findings_section_numbers_recomputed_from_the_committed_file(dist, raw):
    block = _doc_block()
    assert block == findings_section(dist).strip(), "re-render: python -m mla_lab.report.noise_figures --update-findings"
    assert f"`{DIST_CSV.relative_to(REPO_ROOT)}`" in block
    # every table row: bands and percentiles recomputed with numpy from the CSV
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and "%" in ln and "statistic" not in ln]
    assert len(rows) == len(PANELS)
    for ln, (k, label) in zip(rows, PANELS):
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert cells[0] == label and float(cells[1].rstrip(" %")) == pytest.approx(REPORTED[k])
        for j, (c, _) in enumerate(CASES):
            lo, hi = (float(x) for x in re.findall(r"[-+]\d+\.\d+", cells[2 + 2 * j]))
            elo, ehi = np.percentile(raw[c][k], [2.5, 97.5])
            assert lo == pytest.approx(elo, abs=0.006) and hi == pytest.approx(ehi, abs=0.006), (k, c)
            assert float(cells[3 + 2 * j]) == pytest.approx(_pct(raw[c][k], REPORTED[k]), abs=0.06), (k, c)
    n = len(raw["identical_builds"]["mean_ttft_ms"])
    flat = " ".join(block.split())
    assert f"{n} simulated single runs" in flat
    for sentence in noise_sentences(dist):  # the plain sentences, whose numbers the test above recomputes
        assert sentence in flat
    m = re.search(r"!\[[^\]]*\]\(([^)]+)\)", block)
    if m:
        assert (DOC.parent / m.group(1)).is_file(), m.group(1)  # relative to the page that shows it


def test_bad_files_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_noise_distribution(tmp_path / "nope.csv", None)
    p = tmp_path / "d.csv"
    p.write_text("case,run,change_mean_ttft_ms_pct\nidentical_builds,0,1.0\n")
    with pytest.raises(ValueError, match="'change_median_ttft_ms_pct' is missing"):
        load_noise_distribution(p, None)
    cols = ",".join(f"change_{k}_pct" for k, _ in PANELS)
    p.write_text(f"case,run,{cols}\nidentical_builds,0,1,1,1,1\nidentical_builds,1,nan,1,1,1\n"
                 "pr_vs_before,0,1,1,1,1\npr_vs_before,1,1,1,1,1\n")
    with pytest.raises(ValueError, match="not finite"):
        load_noise_distribution(p, None)
    p.write_text(f"case,run,{cols}\nidentical_builds,0,1,1,1,1\nidentical_builds,1,1,1,1,1\n")
    with pytest.raises(ValueError, match="'pr_vs_before' has 0 rows"):
        load_noise_distribution(p, None)
