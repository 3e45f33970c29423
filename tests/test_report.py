"""Report building blocks: Pareto frontier, figures (with measured rows beside modelled), seed table, provenance,
measured-data loading, figure files."""

import re
from pathlib import Path

import pandas as pd
import pytest

from mla_lab import report
from mla_lab.sweep import expand_grid, validate_params
from mla_lab.sweep.rows import modelled_rows as price_point

GRID = dict(models=["glm-5", "deepseek-v3.2"], tp_sizes=[2, 8], archs=["h200", "b200"],
            max_num_batched_tokens=[16384], prompt_lens=[1024, 8192], device="cpu")


@pytest.fixture(scope="module")
def modelled():
    rows = []
    for i, pt in enumerate(expand_grid(validate_params(GRID))):
        rows += [dict(r, point_key=f"p{i}") for r in price_point(pt)]  # run_sweep adds the key likewise
    return pd.DataFrame(rows)


def _fake_measured(modelled, **match):
    """Rows shaped like measured sweep rows (source=measured, GPU provenance), derived from modelled ones with a
    different TTFT so a test can tell them apart. Test data only: never written under data/."""
    d = modelled
    for k, v in match.items():
        d = d[d[k] == v]
    m = d[d["strategy"].isin(["unfused", "fused"])].copy()
    m["source"] = "measured"
    m["device"] = "NVIDIA H200"
    m["torch"] = "2.11.0+cu130"
    m["flash_mla"] = "tokenspeed-flashmla==9.9"
    m["git_commit"] = "abc123def456"
    m["timestamp"] = "2026-11-30T12:00:00+00:00"
    m["ttft_ms"] = m["ttft_ms"] * 1.1
    m.loc[m["strategy"] == "fused", "ttft_change_pct"] = -7.25
    return m.reset_index(drop=True)


def test_pareto_front_minimises_both():
    x = [0, 100, 100, 200, 50, float("nan"), 0]
    y = [0, -10, -5, -20, 5, -99, 0]
    # (0,0) twice: ties both kept; (100,-5) dominated by (100,-10); (50,5) dominated by (0,0); NaN never on it
    assert report.pareto_front(x, y) == [True, True, False, True, False, False, True]


def test_memory_vs_ttft_marks_the_frontier_and_measured_points(modelled):
    meas = _fake_measured(modelled, arch="h200", tp=8, prompt_len=1024)
    fig = report.plot_memory_vs_ttft(report.combine(modelled, meas))
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["b200 (prefill_padding 128)", "h200 (prefill_padding 64)"]
    for ax, arch in zip(axes, ["b200", "h200"]):
        d = report.combine(modelled, meas)
        d = d[(d["arch"] == arch) & d["strategy"].isin(["unfused", "fused"])]
        mask = report.pareto_front(d["extra_persistent_mib"], d["ttft_change_pct"])
        want = sorted(set(zip(d[mask]["extra_persistent_mib"], d[mask]["ttft_change_pct"])))
        step = [ln for ln in ax.lines if ln.get_color() == "#d62728"]
        assert len(step) == 1
        got = sorted(set(zip(step[0].get_xdata(), step[0].get_ydata())))
        assert len(got) == len(want) >= 2
        assert [v for p in got for v in p] == pytest.approx([v for p in want for v in p])
        # every frontier point beyond the baseline is numbered; the x label names each number's configuration
        n = len([p for p in want if p != (0.0, 0.0)])
        assert [t.get_text() for t in ax.texts] == [str(k) for k in range(1, n + 1)]
        key = ax.get_xlabel().split("Pareto frontier:")[1]
        assert [int(k) for k in re.findall(r"(\d+): (?:GLM-5|DSV3\.2) TP\d+ L\d+k B\d+k", key)] == list(range(1, n + 1))
    # the measured points are drawn filled on the h200 panel (facecolor alpha 1), modelled ones hollow
    filled = [c for c in axes[1].collections if len(c.get_offsets()) and c.get_facecolors().size
              and c.get_facecolors()[0][3] > 0 and c.get_sizes()[0] < 100]
    assert sum(len(c.get_offsets()) for c in filled) == len(meas)
    assert "measured (filled)" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_tp_bars_values_and_measured_diamonds(modelled):
    meas = _fake_measured(modelled, arch="h200", prompt_len=1024)
    fig = report.plot_tp_bars(report.combine(modelled, meas))
    assert "max_num_batched_tokens 16384" in fig._suptitle.get_text() and "1024-token" in fig._suptitle.get_text()
    ax_by_title = {ax.get_title(): ax for ax in fig.axes}
    mem = ax_by_title["h200: extra Q workspace of fused"]
    heights = sorted(round(p.get_height(), 1) for p in mem.patches)
    # fused extra MiB at 16384 tokens on Hopper: GLM-5 TP2 (32->64) 576, TP8 (8->64) 1008; DSV3.2 TP2 (64) 0,
    # TP8 (16->64) 864
    assert heights == [0.0, 576.0, 864.0, 1008.0]
    ttft = ax_by_title["h200: TTFT change"]
    diamonds = [ln for ln in ttft.lines if ln.get_marker() == "D"]
    assert {ln.get_markerfacecolor() for ln in diamonds} == {"#d95f02", "#7570b3"}  # coloured by model
    assert sorted(round(float(ln.get_ydata()[0]), 2) for ln in diamonds) == [-7.25] * 4
    assert [t.get_text() for t in ttft.get_xticklabels()] == ["TP2\nH=64/32", "TP8\nH=16/8"]


def test_heatmap_cells_are_the_modelled_changes(modelled):
    fig = report.plot_heatmap(modelled)
    ax = [a for a in fig.axes if a.get_title() == "h200"][0]
    grid = ax.images[0].get_array()
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert rows == ["H=8 (glm-5)", "H=16 (deepseek-v3.2)", "H=32 (glm-5)", "H=64 (deepseek-v3.2)"]
    d = modelled[(modelled["arch"] == "h200") & (modelled["strategy"] == "fused")]
    want = d[(d["model"] == "glm-5") & (d["tp"] == 8) & (d["prompt_len"] == 8192)]["ttft_change_pct"].iloc[0]
    assert grid[0, 1] == pytest.approx(want)
    assert grid[3, 0] == pytest.approx(0.0)  # 64 heads per rank: nothing to pad on Hopper
    assert f"{want:+.1f}%" in [t.get_text() for t in ax.texts]


def test_seed_table_reported_vs_ours():
    t = report.seed_setup_table(None).set_index("quantity")  # priced on the spot
    assert t.loc["heads per rank -> workspace heads", "ours (modelled)"] == "8 -> 64"
    assert t.loc["TTFT change, fused vs unfused", "PR #53878 (reported)"] == "-9.5%"
    assert "+1032 MiB peak (131753 -> 132785 MiB)" == t.loc["extra memory per GPU", "PR #53878 (reported)"]
    assert t.loc["extra memory per GPU", "ours (modelled)"] == "+1008 MiB persistent (1,056,964,608 B)"
    assert t.loc["TTFT change, fused vs unfused", "ours (measured)"] == "-"
    ttft = float(t.loc["TTFT change, fused vs unfused", "ours (modelled)"].rstrip("%"))
    assert ttft < 0


def test_seed_table_takes_measured_rows(modelled):
    seedish = modelled[(modelled["model"] == "glm-5") & (modelled["tp"] == 8) & (modelled["arch"] == "h200")
                       & (modelled["prompt_len"] == 1024)]
    meas = _fake_measured(seedish)
    t = report.seed_setup_table(modelled, meas).set_index("quantity")
    assert t.loc["TTFT change, fused vs unfused", "ours (measured)"] == "-7.2%"
    # the fake measured rows carry no per-call peak: nothing measured to show for memory
    assert t.loc["extra memory per GPU", "ours (measured)"] == "-"
    meas = meas.assign(measured_peak_extra_bytes=[2184 * 2**20 if s == "unfused" else 1152 * 2**20
                                                  for s in meas["strategy"]])
    t = report.seed_setup_table(modelled, meas).set_index("quantity")
    assert t.loc["extra memory per GPU", "ours (measured)"] == \
        "layer call peak 2184 MiB (unfused) vs 1152 MiB (fused), on top of the workspace"


def test_provenance_banner_names_gpu_software_and_model(modelled):
    html = report.provenance_html(modelled, "run-1")
    assert "Measured: none." in html and f"Modelled: {len(modelled)} rows" in html
    assert f"scope <code>{modelled['ttft_scope'].iloc[0]}</code>" in html
    assert str(modelled["calibration"].iloc[0]).split(" ")[0] in html and "run-1" in html
    meas = _fake_measured(modelled, arch="h200", tp=8)
    html = report.provenance_html(report.combine(modelled, meas))
    assert f"Measured: {len(meas)} rows" in html
    for s in ("NVIDIA H200", "2.11.0+cu130", "tokenspeed-flashmla==9.9", "abc123def456"):
        assert s in html
    summ = report.provenance_summary(report.combine(modelled, meas))
    assert summ["sources"]["measured"]["device"] == ["NVIDIA H200"]
    assert summ["sources"]["modelled"]["rows"] == len(modelled)


def test_load_measured_reads_sweep_rows_only(tmp_path, modelled):
    d = tmp_path / "h200"
    d.mkdir()
    meas = _fake_measured(modelled, tp=8)
    pd.concat([modelled.head(6), meas]).to_csv(d / "padding_sweep.csv", index=False)  # a GPU sweep: both sources
    pd.DataFrame({"op": ["concat"], "T": [4096], "ms": [0.1]}).to_csv(d / "concat_bench.csv", index=False)
    got = report.load_measured(tmp_path)
    assert len(got) == len(meas) and set(got["source"]) == {"measured"}
    assert set(got["file"]) == {"h200/padding_sweep.csv"}
    params = validate_params(dict(GRID, tp_sizes=[2]))
    assert len(report.measured_for(params, tmp_path)) == 0  # measured rows are TP8: off this grid
    params = validate_params(dict(GRID, archs=["hopper"]))
    assert len(report.measured_for(params, tmp_path)) == len(meas[meas["arch"] == "h200"])
    assert len(report.load_measured(tmp_path / "missing")) == 0


def test_combine_keeps_a_measured_row_once(modelled):
    meas = _fake_measured(modelled, tp=8)
    both = report.combine(report.combine(modelled, meas), meas)
    assert len(both) == len(modelled) + len(meas)


def test_publish_figure_writes_png_and_svg(tmp_path, modelled):
    out = report.publish_figure(report.plot_heatmap(modelled), "hm", tmp_path / "figs", show=False)
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out["png"].stat().st_size > 10_000
    assert "<svg" in out["svg"].read_text()[:500]


def test_summary_html_names_shared_values(modelled):
    html = report.summary_html(modelled, tp=8, max_num_batched_tokens=16384)
    assert "Every row: tp = 8" in html and "max_num_batched_tokens = 16384" in html
    assert "<th" in html and "kernel_native" in html


def test_report_module_leaves_the_matplotlib_backend_alone():
    import subprocess
    import sys

    code = ("import matplotlib; b = matplotlib.get_backend(); import mla_lab.report as r, pandas as pd; "
            "from mla_lab.sweep.rows import modelled_rows as price_point; "
            "r.plot_heatmap(pd.DataFrame(price_point({'model': 'glm-5', 'tp': 8, 'arch': 'h200', "
            "'max_num_batched_tokens': 16384, 'prompt_len': 1024, 'kv_cache_dtype': 'bf16', 'num_prompts': 4, "
            "'concurrency': 4, 'strategies': ['fused']}))); "
            "import sys; sys.exit(0 if matplotlib.get_backend() == b and 'matplotlib.pyplot' not in sys.modules "
            "else 1)")
    env = {**__import__("os").environ, "MPLBACKEND": "svg"}
    assert subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).parent).returncode == 0
