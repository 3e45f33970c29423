"""Every figure README.md and docs/findings.md state, recomputed from the named committed file or function (issue 14:
the docs and the data cannot drift). Each assertion checks the number as the page prints it. Since issue 31 the
findings live in docs/findings.md and README.md carries the answer block; ``README`` below is both pages' text, so a
figure moved between them is still checked."""

from pathlib import Path

import pandas as pd
import pytest

from mla_lab.buffers import memory_account
from mla_lab.report.seed_answer import seed_answer

REPO = Path(__file__).resolve().parent.parent
#: The pages whose figures are checked: README.md (the front door) and docs/findings.md (where the figures live).
PAGES = (REPO / "README.md", REPO / "docs" / "findings.md")
README = "\n".join(p.read_text() for p in PAGES)
SWEEP = REPO / "data" / "measured" / "h200" / "padding_sweep.csv"
ROUND2 = REPO / "data" / "measured" / "h200" / "round2"


def _in_readme(text: str) -> None:
    """``text`` stands in README.md or docs/findings.md with its words in order (line breaks and runs of spaces are
    layout, not content)."""
    assert " ".join(text.split()) in " ".join(README.split()), f"README does not say {text!r}"


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


BETWEEN = REPO / "data" / "measured" / "h200" / "between_process"


def test_measured_ttft_changes_between_processes(seed_rows):
    for model, fmt in (("glm-5", "{m:+.1f} % [{lo:+.1f}, {hi:+.1f}]"), ("glm-5.2", "(GLM-5.2: {m:+.1f} %)")):
        r = seed_rows[(model, "private_workspace", "per_call_empty:zeros")]
        assert r["measured_basis"] == "processes" and r["n_processes"] >= 5
        _in_readme(fmt.format(m=r["measured_pct"], lo=r["measured_lo"], hi=r["measured_hi"]))
    r = seed_rows[("glm-5", "private_workspace", "per_call_empty:stale")]
    _in_readme(f"{r['measured_pct']:+.1f} % [{r['measured_lo']:+.1f}, {r['measured_hi']:+.1f}] |")


def test_attention_path_and_the_copy_removed():
    from mla_lab.measure.spread import between_process, paired_change

    p = pd.read_csv(BETWEEN / "presets.csv")
    p = p[p["shape"] == "seed"]
    bp = between_process(p, ["strategy"])
    med = p.groupby(["strategy", "process"])["ms"].median().unstack()
    copy = (med.loc["per_call_empty:zeros"] - med.loc["private_workspace"]).median()
    ch = paired_change(p, [], "strategy", "private_workspace", "per_call_empty:zeros")[()]
    flat = " ".join(README.split())
    assert (f"removes a {copy:.2f} ms copy per layer call ({bp[('per_call_empty:zeros',)]['median']:.2f} -> "
            f"{bp[('private_workspace',)]['median']:.2f} ms measured, attention path {ch['median']:+.1f} % "
            f"[{ch['lo']:+.1f}, {ch['hi']:+.1f}])") in flat
    sub = paired_change(p, [], "strategy", "subchunk:4096:views", "private_workspace")[()]
    assert f"ran {sub['median']:+.1f} % [{sub['lo']:+.1f}, {sub['hi']:+.1f}] against the PR's attention path" in flat


def test_engine_presets_modelled(seed_rows):
    flat = " ".join(README.split())
    fa, fa52 = (seed_rows[(m, "fa3_sparse", "private_workspace")]["modelled_pct"] for m in ("glm-5", "glm-5.2"))
    assert f"is modelled at {fa:+.1f} % TTFT against the PR's path (GLM-5.2: {fa52:+.1f} %" in flat
    sg, sg52 = (seed_rows[(m, "per_call_zeros@sglang-dense", "private_workspace")]["modelled_pct"]
                for m in ("glm-5", "glm-5.2"))
    z52 = seed_rows[("glm-5.2", "private_workspace", "per_call_empty:zeros")]["modelled_pct"]
    assert (f"modelled at {sg52:+.1f} % TTFT against the PR's path for GLM-5.2 (GLM-5: {sg:+.1f} %), beside the "
            f"PR's own {z52:+.1f} %") in flat


def test_route_figures():
    from mla_lab.report.route_figures import crossover, route_sentence

    flat = " ".join(README.split())
    assert route_sentence() in flat
    c = crossover(model="glm-5")
    assert f"{c['median'] / 1000:.0f}K [{c['lo'] / 1000:.0f}K, {c['hi'] / 1000:.0f}K] tokens" in flat
    chk = pd.read_csv(BETWEEN / "routes_check.csv")
    assert f"to {chk['rel_err'].max():.1e} (bf16)".replace("e-03", "e-3") in flat


def test_concat_figures():
    c = pd.read_csv(BETWEEN / "concat_round3.csv")
    g = c[c["timer"] == "graph"].groupby(["T", "H", "method", "process"])["us"].median().unstack("method")
    flat = " ".join(README.split())
    for meth, lead in (("v2", "graph timing, 5 fresh processes, `between_process/concat_round3.csv`): "),
                       ("v3", "v3, reached "), ("v2_unpadded", "the same kernel reaches ")):
        x = (100 * g["copy"] / g[meth]).groupby(level=[0, 1]).median()
        assert f"{lead}{x.min():.1f}-{x.max():.1f} %" in flat, meth
    h = c.groupby("method")["us"].median()
    assert f"{h['launcher(v2)']:.1f} us through `make_concat_launcher`" in flat
    assert f"vs {h['concat_mla_q(v2, checked)']:.1f} us through the checked" in flat


def _concat_pct(name):
    """``(table, g)``: % of the same-byte copy per (T, H) x method (per-process medians of us, copy / method, median
    over processes; graph timer, the ``main`` series where the file has one) and the per-process medians ``g``."""
    c = pd.read_csv(BETWEEN / name)
    c = c[c["timer"] == "graph"]
    if "series" in c:
        c = c[c["series"] == "main"]
    g = c.groupby(["T", "H", "method", "process"])["us"].median().unstack("method")
    return (100 * g.rdiv(g["copy"], axis=0)).groupby(level=[0, 1]).median(), g


def test_concat_round4_figures():
    flat = " ".join(README.split())
    table, g = _concat_pct("concat_round4.csv")
    best = {v: pd.concat({m: table[m] for m in g.columns if m.startswith(v) and "unpadded" not in m}, axis=1)
            .max(axis=1) for v in ("v4", "v5")}
    n = {v: sum(1 for m in g.columns if m.startswith(v) and "unpadded" not in m) for v in ("v4", "v5")}
    assert (f"(v4, best of {n['v4']} configurations {best['v4'].min():.1f}-{best['v4'].max():.1f} % per shape)"
            in flat)
    assert f"(v5, best of {n['v5']}: {best['v5'].min():.1f}-{best['v5'].max():.1f} %)" in flat
    v2, mc = table["v2"], table["memcpy2d"]
    assert f"leave v2 ({v2.min():.1f}-{v2.max():.1f} % in the same run" in flat
    ahead = best["v4"][best["v4"] > v2]
    assert list(ahead.index) == [(4096, 8)] and (best["v5"] < v2).all()
    assert (f"except at 4096 x 8, where v4 reaches {ahead.iloc[0]:.1f} % against {v2[(4096, 8)]:.1f} %, still short "
            "of 97") in flat and ahead.iloc[0] < 97.0
    assert f"own 2-D copy into the layout reaches {mc.min():.1f}-{mc.max():.1f} %" in flat
    c = pd.read_csv(BETWEEN / "concat_round4.csv")
    h = c[(c["timer"] == "host_per_call") & (c["series"] == "main")].groupby(["method", "process"])["us"]
    h = h.median().groupby(level=0)
    med, lo, hi = h.median(), h.min(), h.max()
    for m, lead in (("launcher(v2)", "same run): "), ("concat_mla_q(v2, checked)", "launcher vs ")):
        assert f"{lead}{med[m]:.1f} us [{lo[m]:.1f}, {hi[m]:.1f}]" in flat, m
    assert f"(v5's launcher {med['launcher(v5)']:.1f} us" in flat
    table, g = _concat_pct("concat_layout_ceiling.csv")
    ratio = (g["fill_padded"] / g["fill_unpadded"]).groupby(level=[0, 1]).median()
    per = g["fill_padded"] / g["fill_unpadded"]
    assert (f"(time ratio {ratio.min():.3f}-{ratio.max():.3f}; {per.min():.3f}-{per.max():.3f} per process)"
            in flat)
    cost = (g["copy1_padded"] / g["copy1_unpadded"]).groupby(level=[0, 1]).median()
    assert f"the gapped writes cost {100 * (cost.min() - 1):.1f}-{100 * (cost.max() - 1):.1f} %" in flat
    hp, _ = _concat_pct("concat_hints_clean.csv")
    gain = max((hp[m] - hp["v2"]).max() for m in hp.columns if m.startswith("v2:"))
    assert f"cache hints on v2 included: at most {gain:+.1f} points" in flat
    assert (hp.drop(columns=["copy", "v2_unpadded"]) < 97).all().all()
    best = []  # every writer into the padded layout, every file of rounds 3-4 (not the unpadded or write-only rows)
    for name in ("concat_round3.csv", "concat_round4.csv", "concat_layout_ceiling.csv", "concat_hints_clean.csv"):
        fp, _ = _concat_pct(name)
        keep = [m for m in fp.columns if m not in ("copy", "memset") and "unpadded" not in m and "fill" not in m]
        best.append(fp[keep].stack())
    best = pd.concat(best)
    top = best.idxmax()
    assert top[2] == "v2:4x1" and top[:2] == (4096, 8)
    assert (f"the best single figure is {best.max():.1f} % (v2 with 4 rows per program at 4096 x 8, round 3), and at "
            f"T = 16384 none passes {best.xs(16384, level=0).max():.1f} %") in flat and best.max() < 97
    cp, cu = table["copy1_padded"], table["copy1_unpadded"]
    assert f"reaches {cp.min():.1f}-{cp.max():.1f} % against {cu.min():.1f}-{cu.max():.1f} % unpadded" in flat
    assert cp.max() < 97.0  # the one-source copy into the layout stays under the target at every shape
    d = pd.read_csv(BETWEEN / "concat_layout_ceiling.csv")
    d = d[(d["timer"] == "graph") & (d["series"] == "density") & (d["method"] == "v2")]
    dens = d.groupby("Hp")["pct_of_copy"].median()
    assert f"{dens[9]:.1f} / {dens[16]:.1f} / {dens[128]:.1f} % at H' = 9 / 16 / 128" in flat
    assert dens[9] > dens[16] > dens[128]  # "more the sparser the workspace"


def test_fused_bmm_figures():
    flat = " ".join(README.split())
    c = pd.read_csv(BETWEEN / "fused_bmm.csv")
    g = c.groupby(["model", "T", "method", "process"])["us"].median().unstack("method")
    ratio = (g["fused"] / g["pr"]).groupby(level=[0, 1])
    med, lo, hi = ratio.median(), ratio.min(), ratio.max()
    us = g.groupby(level=[0, 1]).median()
    k = ("glm-5", 16384)
    assert (f"the pair takes {med[k]:.3f} [{lo[k]:.3f}, {hi[k]:.3f}] of the PR's bmm + concat for GLM-5 TP8 at T = "
            f"16384 ({us.loc[k, 'fused']:.1f} vs {us.loc[k, 'pr']:.1f} us per layer call; "
            f"{med[('glm-5', 4096)]:.3f} at T = 4096)") in flat
    d = ("deepseek-v3.2", 16384)
    assert f"and {med[d]:.3f} [{lo[d]:.3f}, {hi[d]:.3f}] for DeepSeek-V3.2 TP8 (H = 16)" in flat
    assert (c["max_abs_diff"].dropna() == 0).all() and "with equal real heads (max abs difference 0)" in flat


def test_content_figures():
    from mla_lab.measure.spread import paired_change

    c = pd.read_csv(BETWEEN / "content_loop.csv")
    flat = " ".join(README.split())
    step = paired_change(c, [], "content", "stale", "zeros", value="step_ms")[()]
    attn = paired_change(c, [], "content", "stale", "zeros", value="attn_path_ms")[()]
    clk = paired_change(c, [], "content", "stale", "zeros", value="sm_clock_mhz")[()]
    others = [paired_change(c, [], "content", "stale", "zeros", value=v)[()]["median"]
              for v in ("proj_ms", "post_ms", "moe_ms")]
    assert (f"slowed the step {step['median']:+.1f} % [{step['lo']:+.1f}, {step['hi']:+.1f}] (the attention path "
            f"{attn['median']:+.1f} %, the GEMMs after it {min(others):+.1f}-{max(others):.1f} %, SM clock "
            f"{clk['median']:+.1f} %") in flat
    fit = pd.read_csv(REPO / "data" / "calibration" / "h200_content_step.csv").iloc[0]
    assert (f"({fit['mape_step_pct']:.2f} % MAPE in sample, {fit['lopo_mape_step_pct']:.2f} % leaving one process "
            "out)") in flat


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


@pytest.mark.slow
def test_serving_throughput():
    from mla_lab.deployment import Deployment
    from mla_lab.serving import serve_benchmark

    r = serve_benchmark(Deployment.seed(), ["vllm-pre-53878", "vllm-53878"])
    ch = r["strategies"]["private_workspace"]["change_pct"]["total_token_throughput"]
    _in_readme(f"| +6 % | {ch:+.1f} % (serving simulation")
