"""MTP speculative decoding and SGLang DP attention as deployment options (issue 37): the door, the pricers'
composition recomputed from their parts, the memory per rank, the serve run and the CLI flags."""

from __future__ import annotations

import pytest

from mla_lab.deployment import Deployment
from mla_lab.model.memory import _layer_bytes, memory_tradeoff
from mla_lab.serving.deploy_options import (
    MOE_SIDE_OPS,
    DPAttentionPricer,
    SpecDecodePricer,
    dp_attention_memory,
    dp_share,
    per_rank_deployment,
    spec_verify_step,
)
from mla_lab.serving.step import DecodeToken, PrefillChunk, Step
from mla_lab.serving.step_pricer import CostModelPricer

S = "per_call_empty:zeros@vllm-flashmla-mqa"


@pytest.mark.parametrize("kw, msg", [
    ({"num_speculative_tokens": -1}, "num_speculative_tokens=-1"),
    ({"num_speculative_tokens": 2, "acceptance_length": 3.5}, "acceptance_length=3.5 is not allowed; allowed: a "
                                                              "number in [1, num_speculative_tokens + 1] = [1, 3]"),
    ({"acceptance_length": 0.5}, "acceptance_length=0.5"),
    ({"dp_attention": 3}, "dp_attention=3 does not divide tp=8; allowed: [1, 2, 4, 8]"),
])
def test_the_door_names_the_option(kw, msg):
    with pytest.raises(ValueError) as e:
        Deployment.seed(**kw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_options_round_trip_and_attention_rank():
    d = Deployment.seed(num_speculative_tokens=3, acceptance_length=2.5, dp_attention=8)
    assert d.replace().args() == d.args()
    ar = d.attention_rank
    assert ar.num_heads == d.model.num_attention_heads  # GLM-5: all 64 heads on each rank at --dp 8
    assert ar.padded_num_heads == ar.num_heads == 64  # a full FlashMLA tile: nothing padded
    assert d.rank.padded_num_heads == 64 and d.rank.num_heads == 8  # the TP8 rank pads 8 -> 64
    plain = Deployment.seed()
    assert plain.attention_rank is plain.rank
    assert "MTP 3 draft tokens" in d.describe() and "DP attention 8" in d.describe()


def test_spec_step_is_verify_plus_drafts_over_acceptance():
    d = Deployment.seed()
    base = CostModelPricer(d.rank, S)
    k, a = 3, 2.5
    p = SpecDecodePricer(base, d.model.num_hidden_layers, k, a)
    step = Step(tuple(DecodeToken(i, 1100 + i) for i in range(4)), (), "FULL", 4)
    verify = spec_verify_step(step, k)
    assert len(verify.decode) == (k + 1) * 4
    assert [t.context_len for t in verify.decode[:k + 1]] == [1100, 1101, 1102, 1103]
    L = d.model.num_hidden_layers
    draft = base.price(verify)["gpu_ms"] / L + (k - 1) * base.price(step)["gpu_ms"] / L
    want = (base.price(verify)["total_ms"] + draft) / a
    assert p(step) == pytest.approx(want, rel=1e-12)
    assert p.price(step)["engine_step_ms"] == pytest.approx(want * a, rel=1e-12)


def test_spec_mixed_step_pays_prefill_in_full():
    d = Deployment.seed()
    base = CostModelPricer(d.rank, S)
    k, a = 1, 2.0
    p = SpecDecodePricer(base, d.model.num_hidden_layers, k, a)
    step = Step((DecodeToken(0, 1500),), (PrefillChunk(1, 0, 512),), "PIECEWISE", 520)
    pre_step = Step((), step.prefill_chunks, "NONE", None)
    L = d.model.num_hidden_layers
    pre = base.price(pre_step)["total_ms"] + base.price(pre_step)["gpu_ms"] / L
    verify = spec_verify_step(step, k)
    engine = base.price(verify)["total_ms"] + base.price(verify)["gpu_ms"] / L
    assert p(step) == pytest.approx(pre + (engine - pre) / a, rel=1e-12)
    only_pre = p.price(pre_step)
    assert only_pre["total_ms"] == pytest.approx(pre, rel=1e-12)


def test_dp_pricer_composes_attention_of_the_rank_and_moe_of_all_ranks():
    d = per_rank_deployment(Deployment.seed(dp_attention=8, moe_parallel="tp", concurrency=32))
    p = DPAttentionPricer(d, S)
    step = Step(tuple(DecodeToken(i, 2000) for i in range(4)), (), "FULL", 4)
    got = p.price(step)
    attn = CostModelPricer(d.attention_rank, S).price(step)["by_op"]
    want_attn = sum(v for k, v in attn.items() if k not in MOE_SIDE_OPS)
    assert got["attention_side_ms"] == pytest.approx(want_attn, rel=1e-12)
    glob = Step(tuple(DecodeToken(i + r * 4, 2000) for r in range(p.active) for i in range(4)), (), "FULL", 32)
    moe = CostModelPricer(d.rank, S).price(glob)["by_op"]
    assert got["moe_side_ms"] == pytest.approx(sum(v for k, v in moe.items() if k in MOE_SIDE_OPS), rel=1e-12)
    assert "moe_allgather" not in got["by_op"]


def test_dp_share_and_memory_per_rank():
    d = Deployment.seed(dp_attention=8, num_prompts=100, concurrency=20, max_num_seqs=256)
    sh = dp_share(d)
    assert sh == {"num_prompts": 13, "concurrency": 3, "max_num_batched_tokens": 16384 // 8, "max_num_seqs": 32,
                  "active_ranks": 8}
    assert dp_share(Deployment.seed(dp_attention=8, num_prompts=4))["active_ranks"] == 4
    mem = dp_attention_memory(d, [S])
    base = memory_tradeoff(d, strategies=[S])
    extra = d.model.num_hidden_layers * (_layer_bytes(d.attention_rank)[0] - _layer_bytes(d.rank)[0])
    assert mem["dp_attention"]["extra_attention_weight_bytes"] == extra > 0
    kv = base["kv_capacity"]
    blocks = int((kv["available_bytes"] - extra) // (kv["block_size"] * kv["bytes_per_token"]))
    assert mem["kv_capacity_tokens"] == blocks * kv["block_size"] < base["kv_capacity_tokens"]


def test_mtp_memory_is_the_mtp_layer():
    d = Deployment.seed(num_speculative_tokens=1, acceptance_length=1.6)
    with_mtp = memory_tradeoff(d, strategies=[S], mtp_layers=1)["kv_capacity"]
    per_layer = d.model.kv_cache_bytes_per_token_layer(d.kv_cache_dtype)
    assert with_mtp["bytes_per_token"] == d.model.kv_cache_bytes_per_token(d.kv_cache_dtype) + per_layer


def test_serve_runs_the_options():
    from mla_lab.serving.benchmark import serve_benchmark

    plain = serve_benchmark(Deployment.seed(), [S], baseline=S)["strategies"][S]
    spec = serve_benchmark(Deployment.seed(num_speculative_tokens=1, acceptance_length=2.0), [S], baseline=S)
    s = spec["strategies"][S]
    assert spec["options"]["speculative"]["status"] == "modelled"
    assert s["metrics"]["mean_tpot_ms"] < plain["metrics"]["mean_tpot_ms"]  # 2 tokens per step at a=2
    assert s["kv_capacity_tokens"] < plain["kv_capacity_tokens"]  # the MTP layer's weights and KV
    assert s["metrics"]["total_output_tokens"] == plain["metrics"]["total_output_tokens"]
    dp = serve_benchmark(Deployment.seed(dp_attention=8), [S], baseline=S)
    r = dp["strategies"][S]
    rank = r["rank_metrics"]  # the representative rank's own (unscaled) metrics
    assert r["metrics"]["completed"] == rank["completed"] * 8 == 32
    assert r["metrics"]["total_token_throughput"] == pytest.approx(rank["total_token_throughput"] * 8)
    assert dp["options"]["dp_attention"]["padded_heads_per_rank"] == 64


def test_cli_flags_are_checked_at_the_door(capsys):
    from mla_lab.cli import main

    with pytest.raises(SystemExit) as e:  # argparse's type check: exit status 2
        main(["serve", "--dp-attention", "0"])
    assert e.value.code == 2
    assert "--dp-attention: '0' is out of range; allowed: 1..1,024" in capsys.readouterr().err
    assert main(["serve", "--acceptance-length", "2"]) == 2
    err = capsys.readouterr().err
    assert "--acceptance-length=2.0 is given without --num-speculative-tokens" in err
    assert main(["serve", "--num-speculative-tokens", "1", "--acceptance-length", "2.5"]) == 2
    assert "acceptance_length=2.5 is not allowed" in capsys.readouterr().err


def test_frontier_shows_dp_attention_as_its_own_modelled_point():
    """The report's memory-vs-TTFT panel with ``dp_attention=True``: one hollow star at 0 extra MiB and the TTFT
    change recomputed from options_summary; off by default (the committed figures are unchanged)."""
    import pandas as pd

    from mla_lab.placement import BASELINE
    from mla_lab.report.figures import DP_POINT, plot_frontier_grid, y_window
    from mla_lab.serving.benchmark import options_summary
    from mla_lab.sweep.rows import modelled_rows

    d = Deployment.seed()
    o = options_summary(d.replace(dp_attention=8), BASELINE)["dp_attention"]
    want = 100.0 * (o["ttft_ms"] - o["ttft_ms_without"]) / o["ttft_ms_without"]
    assert o["heads_per_rank"] == o["padded_heads_per_rank"] == 64
    # two strategies: no y window, the star at its value; four: the window clips it to the edge (the report's case)
    for extra in ([], ["shared_workspace:none", "subchunk:4096"]):
        rows = pd.DataFrame(modelled_rows(d.to_point(strategies=[BASELINE, "private_workspace", *extra])))
        fig = plot_frontier_grid(rows, dp_attention=True)[0]
        stars = [c for ax in fig.axes for c in ax.collections if c.get_gid() == DP_POINT]
        assert len(stars) == 1
        (x, y), = stars[0].get_offsets()
        w = y_window(list(rows["ttft_change_pct"]) + [want])  # a point far off is drawn at the window's edge
        shown = want if w is None else min(max(want, w[0]), w[1])
        assert x == 0.0 and y == pytest.approx(shown, rel=1e-9) and (shown == want) == (not extra)
        label, = [a.get_text() for ax in fig.axes for a in ax.texts if a.get_gid() == DP_POINT]
        # at the edge its real change is written beside it, as every off-scale point's is
        assert label == "DP attention, 64 heads/rank (modelled)" + (f": \u25bc {want:+.1f} %" if extra else "")
    off = plot_frontier_grid(rows)[0]
    assert not [c for ax in off.axes for c in ax.collections if c.get_gid() == DP_POINT]


def test_posthoc_file_recomputes_from_its_inputs():
    """data/validation/blind_2026-12b_posthoc.json (POST HOC, not blind): every error recomputed from the published
    figure and the file's own predictions, the blind errors are the score file's, the summary is summarise(rows)
    and docs/serving.md states the sentence built from it."""
    import json

    from mla_lab.paths import REPO_ROOT
    from mla_lab.validation import BLIND_B_POSTHOC as OUT
    from mla_lab.validation import BLIND_B_RESULTS, BLIND_B_SCORE
    from mla_lab.validation.blind import cases_of
    from mla_lab.validation.posthoc_options import options_of, posthoc_sentence, summarise

    doc = json.loads(OUT.read_text())
    assert doc["posthoc"] is True and "POST HOC" in doc["what"]
    results = json.loads(BLIND_B_RESULTS.read_text())
    score = {(r["case"], json.dumps(r["workload"], sort_keys=True), r["metric"]): r
             for r in json.loads(BLIND_B_SCORE.read_text())["rows"]}
    real = {(c["id"], r["workload"]["random_input_len"], r["workload"]["random_output_len"],
             r["workload"]["max_concurrency"], m): v for c in results["cases"] for r in c["runs"]
            for m, v in (r.get("metrics") or {}).items()}
    assert doc["rows"]
    for r in doc["rows"]:
        w = r["workload"]
        assert r["real"] == real[(r["case"], w["random_input_len"], w["random_output_len"], w["max_concurrency"],
                                  r["metric"])]
        assert r["error_pct"] == pytest.approx((r["posthoc"] - r["real"]) / r["real"] * 100, rel=1e-12)
        if r["without_options"] is not None:
            assert r["error_pct_without_options"] == pytest.approx(
                (r["without_options"] - r["real"]) / r["real"] * 100, rel=1e-12)
        key = (r["case"], json.dumps({k: w[k] for k in ("random_input_len", "random_output_len", "max_concurrency")},
                                     sort_keys=True), r["metric"])
        assert r["blind_error_pct"] == (score[key]["error_pct"] if key in score else None)
    assert doc["summary"] == summarise(doc["rows"])
    docs = " ".join((REPO_ROOT / "docs" / "serving.md").read_text().split())
    assert posthoc_sentence(doc) in docs
    opts = {c["id"]: options_of(c) for c in cases_of("2026-12b")}
    assert opts["sglang_glm52_h200_fp8_balanced"] == {"num_speculative_tokens": 1, "acceptance_length": 2.0,
                                                      "dp_attention": 8}
    assert opts["sglang_glm52_h200_fp8_low-latency"] == {"num_speculative_tokens": 5, "acceptance_length": 3.5}
    assert opts["gpustack_dsv32_sglang_dp8"] == {"dp_attention": 8}
    assert {r["case"] for r in doc["runs"]} == {k for k, v in opts.items() if v}


@pytest.mark.slow
def test_posthoc_cell_is_reproduced():
    """One cell of the post-hoc file (the cheapest: H200 low-latency at concurrency 1) re-run: deterministic, so
    equal."""
    import json

    from mla_lab.validation import BLIND_B_POSTHOC as OUT
    from mla_lab.validation.posthoc_options import posthoc_options

    doc = json.loads(OUT.read_text())
    fresh = posthoc_options(only="sglang_glm52_h200_fp8_low-latency", log=lambda *a: None)
    pick = [r for r in fresh["rows"] if r["workload"]["max_concurrency"] == 1]
    stored = {(r["metric"]): r for r in doc["rows"] if r["case"] == "sglang_glm52_h200_fp8_low-latency"
              and r["workload"]["max_concurrency"] == 1}
    assert pick
    for r in pick:
        assert r["posthoc"] == pytest.approx(stored[r["metric"]]["posthoc"], rel=1e-9)
        assert r["without_options"] == pytest.approx(stored[r["metric"]]["without_options"], rel=1e-9)


def test_serve_json_carries_the_options_and_the_noise_path_refuses_them(capsys):
    import json

    from mla_lab.cli import main
    from mla_lab.serving.noise import serve_benchmark_noise

    assert main(["serve", "--dp-attention", "8", "--num-speculative-tokens", "1", "--acceptance-length", "2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"]["num_prompts"] == 32  # the client's run, not the simulated rank's
    dp = out["options"]["dp_attention"]
    assert dp["num_prompts"] == dp["rank_bench"]["num_prompts"] == 4 and dp["active_ranks"] == 8
    assert out["options"]["speculative"]["acceptance_length"] == 2.0
    assert out["deployment"]["dp_attention"] == 8 and out["deployment"]["num_speculative_tokens"] == 1
    assert main(["serve", "--dp-attention", "8", "--num-runs", "20"]) == 2
    assert "the noise Monte-Carlo does not price these options" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the noise model does not price these options"):
        serve_benchmark_noise(Deployment.seed(dp_attention=8), [S], num_runs=20)


def test_report_frontier_dp_labels_carry_their_value_and_overlap_nothing():
    """The committed H200 report's rows (reports/h200/padding_sweep_h200_rows.csv), drawn as the report draws them:
    every DP-attention star beyond its panel's y range says its TTFT change, stacked past the panel's other
    off-scale labels so that the report's own overlap check (which refused a render of the first fix) passes."""
    import pandas as pd

    from mla_lab.paths import REPO_ROOT
    from mla_lab.report.figures import DP_POINT, plot_frontier_grid
    from mla_lab.report.layout_check import label_overlaps

    rows = pd.read_csv(REPO_ROOT / "reports" / "h200" / "padding_sweep_h200_rows.csv")
    figs = plot_frontier_grid(rows, dp_attention=True)
    labels = [a.get_text() for f in figs for ax in f.axes for a in ax.texts if a.get_gid() == DP_POINT]
    assert len(labels) == 16 and all(" %" in s and "\u25bc -" in s for s in labels), labels  # -37 .. -72 %: off-scale
    assert [p for f in figs for p in label_overlaps(f)] == []
