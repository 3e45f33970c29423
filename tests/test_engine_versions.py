"""Issue 29: engine versions as an axis (mla_lab.engines, the route rules built on them, the engines door, advise's
engine lines, Blackwell rows per version). Facts read from the release wheels; their check is tests/test_wheel_facts.py.
"""

import json
import re

import pytest

from mla_lab.cli import main
from mla_lab.deployment import Deployment
from mla_lab.engines import ENGINE_PRESETS, decode_threshold, engine_preset, first_names, padding_for, sparse_backend
from mla_lab.placement import (
    PRESETS,
    engine_strategies,
    engine_summary,
    expand_strategies,
    preset_of,
    resolve_engine,
)
from mla_lab.routes import route_for

GLM_TOPK = 2048  # data/models/glm-5/config.json index_topk
LINE = re.compile(r"^\d+(-\d+)?$")


def test_every_release_fact_cites_a_file_and_line_in_the_wheel():
    for name in ("vllm@0.13.0", "vllm@0.24.0", "vllm@0.33.0", "vllm@0.33.0-flashmla", "sglang@0.5.23"):
        p = engine_preset(name)
        assert p.engine_version.wheel, name
        for f in p.facts:
            for s in f.sources:
                assert s.checkable and LINE.match(s.line), (name, f.key, s.line)
                assert s.path.startswith(("vllm/", "sglang/")), s.path
    assert {"vllm@0.33.0", "sglang@0.5.23", "vllm@0.13.0", "vllm@0.24.0"} <= set(ENGINE_PRESETS)


def test_engines_lists_the_presets_with_sources(capsys):
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    for name in ENGINE_PRESETS:
        assert re.search(rf"^{re.escape(name)} ", out, re.M), name
    row = next(ln for ln in out.splitlines() if ln.startswith("vllm@0.33.0 "))
    assert "2026-11-01" in row and "mha-dense" in row and "FLASH_ATTN_MLA_SPARSE" in row
    assert main(["engines", "--json"]) == 0
    rows = {r["preset"]: r for r in json.loads(capsys.readouterr().out)}
    pad = next(f for f in rows["vllm@0.33.0"]["facts"] if f["key"] == "prefill_padding")
    assert pad["value"] == {"sm90": 64, "sm100": 64}
    assert pad["sources"] == ["vllm/v1/attention/backends/mla/flashmla_sparse.py:754"]
    assert rows["sglang@0.5.23"]["prefill_route"] == "sparse-mqa" and rows["sglang@0.5.23"]["padding"] == 64


def test_advise_names_dense_mha_for_vllm_0_33_at_1024_tokens_and_where_the_pad_runs(capsys):
    assert main(["advise", "--no-measured", "--model", "glm-5", "--tp", "8", "--arch", "h200",
                 "--prompt-len", "1024"]) == 0
    out = capsys.readouterr().out
    v33 = next(ln for ln in out.splitlines() if ln.startswith("engine vllm@0.33.0 "))
    assert "prefill route dense MHA" in v33 and "every prefill has seq_len <= 2048" in v33
    assert "nowhere: FA3 sparse takes the real 8 heads" in v33
    forced = next(ln for ln in out.splitlines() if ln.startswith("engine vllm@0.33.0-flashmla "))
    assert "prefill route dense MHA" in forced
    assert "padded path runs: decode rows (FlashMLA sparse, heads padded 8 -> 64); prefill rows dense MHA" in forced
    sg = next(ln for ln in out.splitlines() if ln.startswith("engine sglang@0.5.23 "))
    assert "prefill route sparse MQA (FlashMLA, padded)" in sg and "breakable prefill CUDA graph" in sg


def test_the_dense_route_stops_above_index_topk():
    short = engine_summary("vllm@0.33.0-flashmla", Deployment.seed(prompt_len=2048))
    long = engine_summary("vllm@0.33.0-flashmla", Deployment.seed(prompt_len=2049))
    assert short["prefill_route"] == "mha-dense" and long["prefill_route"] == "sparse-mqa"
    assert long["padded_path"].startswith("prefill rows and decode rows")
    # PR-era vLLM ran GLM-5 MQA-only (vLLM #52512): the padded kernel for every prefill, even 1024 tokens
    pr = engine_summary("vllm-53878", Deployment.seed())
    assert pr["preset"] == "vllm@pr53878" and pr["prefill_route"] == "sparse-mqa"
    # one long prefill in the step sends every prefill row sparse ("every prefill has seq_len <= topk")
    mixed = route_for("vllm-0.33.0-flashmla", "glm", GLM_TOPK, "prefill", [1024, 4096], [1024, 4096], 8)
    assert mixed.route == "sparse-mqa"


def test_old_names_map_to_the_new_ones():
    assert first_names() == {"vllm-pre-53878": "vllm@pr53878-before", "vllm-53878": "vllm@pr53878",
                                   "vllm-56902": "vllm@56902", "vllm-fa3-sparse": "vllm@0.33.0",
                                   "sglang": "sglang@0.5.23", "sglang-flashmla-sparse": "sglang@0.5.23"}
    for old in ("vllm-pre-53878", "vllm-53878", "vllm-56902"):
        new = resolve_engine(old)
        assert expand_strategies([new]) == expand_strategies([old]) == list(PRESETS[old])
        assert engine_strategies(old) == engine_strategies(new)
    assert engine_strategies("vllm-fa3-sparse") == ["fa3_sparse@vllm-0.33.0"]
    assert preset_of("fa3_sparse@vllm-0.33.0") == "vllm@0.33.0"
    assert preset_of("private_workspace") == "vllm-53878"  # the measured rows keep the first names


@pytest.mark.parametrize("preset,kv,backend,padding,heads,mib", [
    ("vllm@pr53878", "bf16", "FLASHMLA_SPARSE", 128, 128, 16384 * 128 * 576 * 2 / 2**20),  # PR-era rule: 2304 MiB
    ("vllm@0.33.0-flashmla", "bf16", "FLASHMLA_SPARSE", 64, 64, 1152.0),  # 0.33.0: 64 on Blackwell too
    ("vllm@0.33.0", "bf16", "FLASH_ATTN_MLA_SPARSE_FA4", 0, 8, 144.0),  # bf16, <= 16 heads: FA4 sparse, no pad
    ("vllm@0.33.0", "fp8", "FLASHINFER_MLA_SPARSE", 0, 8, 144.0),  # fp8: FlashInfer sparse, no pad
    ("vllm@0.24.0", "bf16", "FLASHINFER_MLA_SPARSE", 0, 8, 144.0),  # 0.24.0: FlashInfer first at <= 16 heads
    ("sglang@0.5.23", "bf16", "FLASHMLA_SPARSE", 128, 128, 2304.0),  # new_zeros to 128 on sm100
])
def test_blackwell_rows_per_engine_version(preset, kv, backend, padding, heads, mib):
    """GLM-5 TP8 (8 heads) on sm100: each version's sparse backend, its padding and the 16384-row Q buffer."""
    b = sparse_backend(preset, "sm100", kv, 8)
    pad = padding_for(preset, b, "sm100", kv)
    hp = -(-8 // pad) * pad if pad else 8
    assert (b, pad, hp) == (backend, padding, heads)
    assert 16384 * hp * 576 * 2 / 2**20 == pytest.approx(mib)


def test_blackwell_backend_switches_above_16_heads():
    assert sparse_backend("vllm@0.33.0", "sm100", "bf16", 16) == "FLASH_ATTN_MLA_SPARSE_FA4"
    assert sparse_backend("vllm@0.33.0", "sm100", "bf16", 32) == "FLASHMLA_SPARSE"
    assert padding_for("vllm@0.33.0", "FLASHMLA_SPARSE", "sm100") == 64
    assert padding_for("vllm@pr53878", "FLASHMLA_SPARSE", "sm100") == 128
    assert sparse_backend("vllm@0.33.0", "sm90", "fp8", 8) == "FLASHMLA_SPARSE"  # FA3 sparse is bf16-KV only


def test_decode_thresholds():
    assert decode_threshold("vllm@0.33.0", "FLASH_ATTN_MLA_SPARSE", "sm90", 8) == (256, False)
    assert decode_threshold("vllm@0.33.0", "FLASH_ATTN_MLA_SPARSE", "sm90", 16) == (128, False)
    assert decode_threshold("vllm@0.33.0-flashmla", "FLASHMLA_SPARSE", "sm90", 8) == (256, True)
    assert decode_threshold("vllm@0.33.0-flashmla", "FLASHMLA_SPARSE", "sm100", 128) == (1024, True)
    assert decode_threshold("vllm@0.24.0", "FLASHMLA_SPARSE", "sm90", 8) == (1, False)
    # a 256-token extend at 8 heads is a decode for FA3 sparse in 0.33.0, a 257-token one a prefill
    assert route_for("vllm-0.33.0", "glm", GLM_TOPK, "prefill", [1500], [256], 8).route == "fa3-sparse"
    assert route_for("vllm-0.33.0", "glm", GLM_TOPK, "prefill", [1500], [257], 8).route == "mha-dense"
    assert "handled as decodes" in route_for("vllm-0.33.0", "glm", GLM_TOPK, "prefill", [1500], [200], 8).reason
    assert "handled as decodes" not in route_for("vllm-0.33.0", "glm", GLM_TOPK, "prefill", [1500], [200],
                                                 16).reason
    # FlashMLA's uniform rule: two short requests of different lengths -> the second is a prefill (dense here)
    fa3 = route_for("vllm-0.33.0", "glm", GLM_TOPK, "prefill", [1030, 1100], [6, 100], 8)
    fm = route_for("vllm-0.33.0-flashmla", "glm", GLM_TOPK, "prefill", [1030, 1100], [6, 100], 8)
    assert "handled as decodes" in fa3.reason and fm.route == "mha-dense"
    # the PR-era rules keep their thresholds (1024 for FA3 sparse at 0299fca7, 1 for FlashMLA)
    assert "handled as decodes" in route_for("vllm-fa3", "glm", GLM_TOPK, "prefill", [3000], [1000]).reason


def test_sglang_prefill_graphs_turn_the_dense_route_off():
    assert route_for("sglang-0.5.23", "glm", GLM_TOPK, "prefill", [1024] * 8, [1024] * 8).route == "sparse-mqa"
    assert route_for("sglang-0.5.23", "glm", GLM_TOPK, "prefill", [1024] * 9, [1024] * 9).route == "mha-dense"
    assert route_for("sglang-0.5.23", "glm", GLM_TOPK, "prefill", [4096] * 3, [4096] * 3).route == "sparse-mqa"
    assert route_for("sglang-dense", "glm", GLM_TOPK, "prefill", [1024] * 8, [1024] * 8).route == "mha-dense"


def test_vllm_0_13_does_not_run_glm():
    s = engine_summary("vllm@0.13.0", Deployment.seed())
    assert s["supported"] is False and s["models"] == ["deepseek"]
    assert engine_summary("vllm@0.13.0", Deployment.seed(model="deepseek-v3.2"))["prefill_route"] == "sparse-mqa"


@pytest.mark.parametrize("argv,needle", [
    (["advise", "--engine", "vllm@0.99"], "--engine='vllm@0.99' is not valid; allowed: ['vllm@pr53878-before'"),
    (["serve", "--engine", "x"], "--engine='x' is not valid; allowed:"),
    (["engines", "--check-wheel", "/nonexistent/vllm-0.33.0-x.whl"], "is not a file; allowed: a release wheel"),
    (["engines", "--download", "vllm"], "--download='vllm' is not valid; allowed: <engine>==<version>"),
])
def test_bad_engine_input_is_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_fp8_kv_reservations_of_vllm_0_33_glm5_tp8():
    from mla_lab.engines import fp8_reserved_bytes

    r = fp8_reserved_bytes(8, 16384, 131072)
    mib = {k: v / 2**20 for k, v in r.items()}
    # 16384 x 8 x 576 x 2 B; 5 x 131072 x 576 x 2 B; 16384 x 64 x 576 x 2 B; 16384 x 64 x 512 x 2 B; 16384 x 8 x 512 x 2 B
    assert mib == {"q_concat": 144, "prefill_gather": 720, "padded_q": 1152, "padded_out": 1024, "out": 128,
                   "total": 3168}
    assert fp8_reserved_bytes(8, 16384, 512 * 1024)["prefill_gather"] == 2 * 512 * 1024 * 576 * 2


def test_the_prs_trade_as_it_was_and_as_it_is():
    from mla_lab.report.seed_answer import pr_trade_by_engine

    was, now, fa3 = pr_trade_by_engine(("glm-5",))
    assert was["engine"] == "vllm@pr53878" and was["prefill_route"] == "sparse-mqa"
    assert was["modelled_pct"] < 0 and was["extra_persistent_mib"] == 1008  # 16384 x 56 x 1152 B
    # 0.33.0: 1024-token prefills go dense, so the PR's workspace changes no prefill step of the benchmark
    assert now["prefill_route"] == "mha-dense" and now["modelled_pct"] == pytest.approx(0.0, abs=1e-9)
    assert now["padded_path"].startswith("decode rows") and now["extra_persistent_mib"] == -144
    assert fa3["padded_path"].startswith("nowhere") and all(r["source"] == "modelled" for r in (was, now, fa3))


def test_explorer_shows_todays_engine_versions_and_padding():
    """The explorer's summary names today's engine versions, their prefill route and padding rule (issue 29/31)."""
    from mla_lab.explore import explore_point, summary_html

    r = explore_point()
    by = {x["preset"]: x for x in r["engines"]}
    assert by["vllm@0.33.0"]["prefill_route"] == "mha-dense" and by["vllm@0.33.0-flashmla"]["padding"] == 64
    html = summary_html(r)
    assert "Engine versions today" in html and "vllm@0.33.0" in html and "sglang@0.5.23" in html


@pytest.mark.slow  # five engine versions x four concurrencies of the serving simulation (~20 s)
def test_docs_tpot_per_engine_version_is_current():
    from mla_lab.report.engine_serving import BEGIN, DOCS, END, table_markdown

    text = DOCS.read_text()
    assert text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip() == table_markdown().strip()
