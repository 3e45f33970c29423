"""Every figure README.md states, recomputed from the named committed file or function (issue 14: README and data
cannot drift). Each assertion checks the number as README prints it."""

from pathlib import Path

import pandas as pd
import pytest

from mla_lab.buffers import memory_account
from mla_lab.model.content import load_content_model
from mla_lab.report.seed_answer import seed_answer

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
SWEEP = REPO / "data" / "measured" / "h200" / "padding_sweep.csv"
ROUND2 = REPO / "data" / "measured" / "h200" / "round2"


def _in_readme(text: str) -> None:
    assert text in README, f"README does not say {text!r}"


@pytest.fixture(scope="module")
def seed_rows():
    return {(r["model"], r["strategy"], r["against"]): r for r in seed_answer()}


@pytest.fixture(scope="module")
def measured_seed():
    d = pd.read_csv(SWEEP)
    d = d[(d["source"] == "measured") & (d["model"] == "glm-5") & (d["tp"] == 8)
          & (d["max_num_batched_tokens"] == 16384) & (d["prompt_len"] == 1024)]
    return d.set_index("strategy")


def test_modelled_ttft_changes(seed_rows):
    for model, label in (("glm-5", "{}"), ("glm-5.2", "GLM-5.2: {}")):
        zeros = seed_rows[(model, "private_workspace", "per_call_empty:zeros")]["modelled_pct"]
        stale = seed_rows[(model, "private_workspace", "per_call_empty:stale")]["modelled_pct"]
        _in_readme(label.format(f"{zeros:+.1f} %"))
        _in_readme(label.format(f"{stale:+.1f} %"))
    best = min(r["modelled_pct"] for r in seed_rows.values() if r["strategy"] == "private_workspace")
    _in_readme(f"the largest modelled gain, {best:+.1f} %")


def test_measured_ttft_change_and_attention_path(measured_seed):
    pr, base = measured_seed.loc["private_workspace"], measured_seed.loc["per_call_empty:zeros"]
    _in_readme(f"{pr['ttft_change_pct']:+.2f} % [{pr['ttft_change_ci_lo']:+.2f}, {pr['ttft_change_ci_hi']:+.2f}] "
               f"(measured sweep, {int(pr['num_runs'])} interleaved rounds)")
    _in_readme(f"({base['attn_path_ms_step0']:.3f} -> {pr['attn_path_ms_step0']:.3f} ms measured)")
    _in_readme("0.16 ms copy per layer call")
    assert round(base["attn_path_ms_step0"] - pr["attn_path_ms_step0"], 2) == 0.16
    stale = measured_seed.loc["per_call_empty:stale"]
    _in_readme(f"{100 * (pr['ttft_ms'] / stale['ttft_ms'] - 1):+.1f} % (this sweep)")


def test_round2_changes(seed_rows):
    r = seed_rows[("glm-5", "private_workspace", "per_call_empty:stale")]
    _in_readme(f"{r['measured_pct']:+.1f} % [{r['measured_lo']:+.1f}, {r['measured_hi']:+.1f}] (round 2)")
    z = seed_rows[("glm-5", "private_workspace", "per_call_empty:zeros")]
    _in_readme(f"{z['measured_pct']:+.1f} % [{z['measured_lo']:+.1f}, {z['measured_hi']:+.1f}] (round 2, "
               f"{z['rounds']} rounds)")


def test_memory_figures(measured_seed):
    base = memory_account("per_call_empty:zeros", 8, 16384, "h200")
    pr = memory_account("private_workspace", 8, 16384, "h200")
    extra = pr.persistent_bytes - base.persistent_bytes
    _in_readme(f"+{extra // 2**20} MiB ({extra:,} B)")
    _in_readme(f"{pr.call_transient_bytes // 2**20} vs {base.call_transient_bytes // 2**20} MiB")
    for s in ("private_workspace", "per_call_empty:zeros"):
        r = measured_seed.loc[s]
        assert r["measured_peak_extra_bytes"] == r["analytic_peak_extra_bytes"]  # "to the byte"
    sub = memory_account("subchunk:4096", 8, 16384, "h200")
    _in_readme(f"holds {sub.persistent_bytes // 2**20} MiB, {(sub.persistent_bytes - base.persistent_bytes) // 2**20} "
               f"MiB extra over vLLM's unpadded buffer before the PR (the PR's holds {pr.persistent_bytes // 2**20} "
               f"MiB, {extra // 2**20} MiB extra)")
    _in_readme(f"a {pr.persistent_bytes // 2**20} MiB workspace vs a {base.persistent_bytes // 2**20} MiB unpadded buffer")
    s2048 = memory_account("subchunk:2048", 8, 16384, "h200")
    assert s2048.persistent_bytes == base.persistent_bytes  # "+0 for subchunk:2048" while it holds 144 MiB
    _in_readme(f"`subchunk:2048` holds {s2048.persistent_bytes // 2**20} MiB")
    _in_readme(f"that\nminus the baseline's {base.persistent_bytes // 2**20} MiB unpadded buffer")


def test_subchunk_gap(measured_seed):
    gap = measured_seed.loc["subchunk:4096:views", "attn_path_ms_step0"] / \
        measured_seed.loc["private_workspace", "attn_path_ms_step0"] - 1
    _in_readme(f"ran {100 * gap:.1f} % slower than the PR's attention path")


def test_content_figures():
    fit = pd.read_csv(ROUND2 / "content_fit.csv")
    f = fit[(fit["num_heads"] <= 16) & (fit["T"] >= 4096)]
    _in_readme(f"the kernel ran {100 * (f['ratio_measured'].min() - 1):.0f}-{100 * (f['ratio_measured'].max() - 1):.0f} % "
               "slower at 8-16 real of 64 heads")
    m = load_content_model()
    _in_readme(f"{m.mape_pct:.1f} % MAPE in sample and {m.loso_mape_pct:.1f} % leaving one shape out")
    c = pd.read_csv(ROUND2 / "content.csv")
    seed = c[(c["shape_id"] == 1) & (c["mode"] == "alone")].groupby("content")["sm_clock_mhz"].median()
    _in_readme(f"median SM clock {seed['zeros']:.0f} -> {seed['stale']:.0f} MHz at the seed shape")


@pytest.mark.slow
def test_serving_throughput():
    from mla_lab.serving import serve_benchmark

    r = serve_benchmark("glm-5", 8, "h200", ["vllm-pre-53878", "vllm-53878"])
    ch = r["strategies"]["private_workspace"]["change_pct"]["total_token_throughput"]
    _in_readme(f"| +6 % | {ch:+.1f} % (serving simulation")
