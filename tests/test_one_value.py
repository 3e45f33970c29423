"""One source per figure (issue 39): no two of README.md, docs/*.md, the report's text (its answer block, sections
and table captions: notebooks/padding_sweep.py) and the CLI's own text (``mla-lab advise``, ``mla-lab sweep
--dry-run``) state one quantity with different values. Each quantity is computed once by the function over its
committed file (:data:`mla_lab.report.figures_registry.QUANTITIES`); every statement the registry's patterns find is
checked at the page's own rounding."""

import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.report.figures_registry import QUANTITIES, agrees, pages, statements


@pytest.fixture(scope="module")
def texts():
    return pages()


@pytest.fixture(scope="module")
def values():
    return {q.name: q.compute() for q in QUANTITIES}


@pytest.mark.parametrize("q", QUANTITIES, ids=[q.name for q in QUANTITIES])
def test_every_statement_of_a_quantity_is_its_one_value(q, texts, values):
    found = statements(q, texts)
    assert found, f"{q.name}: no page states it any more (a dead pattern or a lost figure)"
    wrong = [(page, s) for page, s in found if not agrees(s, values[q.name])]
    assert not wrong, f"{q.name} = {values[q.name]:.4g} ({q.source}); pages that differ: {wrong}"


def test_the_issues_quantities_are_stated_on_several_pages(texts):
    """The figures issue 39 found disagreeing are each stated in more than one place and now agree there."""
    where = {q.name: {p for p, _ in statements(q, texts)} for q in QUANTITIES}
    assert {"docs/findings.md", "docs/ttft-model.md"} <= where["pr_ttft_measured_glm5"]
    assert {"docs/findings.md", "docs/ttft-model.md"} <= where["pad_copy_measured_ms"]
    assert {"README.md", "docs/findings.md"} <= where["dense_route_glm52_pct"]
    assert {"docs/cli.md", "cli: mla-lab sweep --dry-run"} <= where["default_grid_points"]
    assert {"README.md", "cli: mla-lab advise"} <= where["forced_today_mib"]
    assert {"README.md", "cli: mla-lab advise"} <= where["pr_extra_mib"]
    assert "cli: mla-lab advise" in where["pr_ttft_measured_glm5"]


@pytest.mark.parametrize("page, good, bad", [
    ("docs/findings.md", "removes a 0.17 ms copy", "removes a 0.10 ms copy"),
    ("docs/cli.md", "default grid is 16 points", "default grid is 64 points"),
    ("README.md", "the shared view costs -144 MiB", "the shared view costs +1008 MiB"),
])
def test_a_page_that_drifts_is_caught(texts, values, page, good, bad):
    """The check is not vacuous: the same page with one figure changed fails it."""
    flat = " ".join(texts[page].split())
    assert good in flat
    edited = dict(texts, **{page: flat.replace(good, bad)})
    caught = [(q.name, s) for q in QUANTITIES for p, s in statements(q, edited)
              if p == page and not agrees(s, values[q.name])]
    assert caught, (page, bad)


def test_rounding_reads_the_printed_digits():
    assert agrees("-1.8", -1.773) and not agrees("-1.7", -1.773)
    assert agrees("+0.17", 0.1689) and not agrees("0.16", 0.1689)
    assert agrees("1,008", 1008.0) and agrees("\u22121.2", -1.24) and not agrees("64", 16.0)


def test_findings_agrees_with_engines_about_routes():
    """docs/findings.md states today's routes as docs/engines.md and the route rules do; the PR-era statements stand
    only under a dated History line."""
    from mla_lab.models import load_model
    from mla_lab.routes import route_for

    findings = " ".join((REPO_ROOT / "docs" / "findings.md").read_text().split())
    engines = " ".join((REPO_ROOT / "docs" / "engines.md").read_text().split())
    glm = load_model("glm-5")
    assert route_for("vllm-0.33.0", glm, glm.topk, "prefill", [1024] * 16).route == "mha-dense"
    assert "| `vllm@0.33.0` |" in engines and "**dense MHA** (every prefill `seq_len <= index_topk`)" in engines
    assert ("vLLM 0.33.0 runs GLM-5/5.2 and DeepSeek-V3.2 prefills on dense MHA when every prefill has "
            "`seq_len <= index_topk` (2048)") in findings
    assert "SGLang 0.5.23 runs prompts of <= 8192 tokens inside breakable prefill CUDA graphs" in findings
    for stale in ("SGLang's default for prompts <= 2048", "`sglang` (default H200 route"):
        assert stale not in findings, stale
    old = "vLLM ran GLM-5/5.2 on sparse MQA for every prefill"
    assert "vLLM runs GLM-5/5.2 on sparse MQA for every prefill" not in findings
    assert findings.index("History (the PR-era builds, before 2026-11)") < findings.index(old)
    assert "On a B200 (`b200`, sm100; modelled, nothing ran on a B200)" in findings


def test_readme_stays_a_front_door():
    readme = (REPO_ROOT / "README.md").read_text()
    assert readme.count("\n") <= 160
    assert "B200" in readme and "--model glm-5.2" in readme


def _answer_text():
    from mla_lab.report.answer import BEGIN, END

    readme = (REPO_ROOT / "README.md").read_text()
    return " ".join(readme[readme.index(BEGIN):readme.index(END)].split())


def test_readmes_glm52_figures_reproduce_with_the_commands_it_shows():
    """README's -28.4 % / -3.4 % / +3.2 % are GLM-5.2's: the block names the commands (with ``--model glm-5.2``)
    and running them gives the figures (issue 39: the commands defaulted to GLM-5)."""
    import json
    import re
    import shlex

    from conftest import run_cli

    from mla_lab.report.figures_registry import QUANTITIES

    text = _answer_text()
    q = {x.name: x for x in QUANTITIES}
    advise_cmd = re.search(r"`mla-lab (advise --model glm-5\.2)`: its `(\S+)` row against its `(\S+)` row", text)
    serve_cmd = re.search(r"the ratio of the two rows of `mla-lab (serve --model glm-5\.2 --strategies (\S+) (\S+))`",
                          text)
    assert advise_cmd and serve_cmd, "the answer block names the commands behind its GLM-5.2 figures"
    rc, out, _ = run_cli(shlex.split(advise_cmd.group(1)) + ["--json"])
    assert rc == 0
    res = json.loads(out)
    rows = {r["label"]: r["ttft_change_pct"] for r in [res["recommendation"], *res["alternatives"],
                                                        *res["other_engines"]]}
    dense = 100 * ((1 + rows[advise_cmd.group(2)] / 100) / (1 + rows[advise_cmd.group(3)] / 100) - 1)
    stated = [s for p, s in statements(q["dense_route_glm52_pct"], {"README.md": (REPO_ROOT / "README.md").read_text()})]
    assert stated and all(agrees(s, dense) for s in stated)
    rc, out, _ = run_cli(shlex.split(serve_cmd.group(1)) + ["--json"])
    assert rc == 0
    m = {k: v["metrics"] for k, v in json.loads(out)["strategies"].items()}
    forced, fa3 = m[serve_cmd.group(2)], m[serve_cmd.group(3)]
    for name, metric in (("fa3_tpot_today_pct", "mean_tpot_ms"), ("fa3_tput_today_pct", "output_throughput")):
        v = 100 * (fa3[metric] / forced[metric] - 1)
        stated = [s for p, s in statements(q[name], {"README.md": (REPO_ROOT / "README.md").read_text()})]
        assert stated and all(agrees(s, v) for s in stated), (name, v, stated)
