"""The TP=2 attention-block benchmark harness (mla_lab.measure.tp) run on CPU: two gloo processes on tiny shapes with the reference
kernel, plus the one-process simulation. Timings on CPU mean nothing; what is checked is the sharding (the
all-reduced output equals the unsharded block), the rows and columns the GPU run writes, the comparison formulas and
the NVLink-multicast-off environment. The GPU run: benchmarks/tp2_attention.py on two H200s."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch

from mla_lab.arch import get_arch
from mla_lab.measure.tp import (
    SAFE_ENV,
    TPBenchmarkConfig,
    _model,
    _sm_scale,
    block_forward,
    compare,
    ideal_ring_calibration,
    make_block_inputs,
    run_tp_benchmark,
    summary_table,
    tiny_overrides,
)
from mla_lab.model.timing import comm_time_ms
from mla_lab.strategies import make_strategy

T = 16
MODELS = ["glm-5", "deepseek-v3.2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    cfg = TPBenchmarkConfig(models=MODELS, tokens=[T], device="cpu", warmup=1, iters=2, model_overrides=tiny_overrides(),
                        save_outputs=True)
    return run_tp_benchmark(cfg, out_dir=out), out


def _y(out, run, model, strategy, rank):
    return torch.load(out / f"y_{run}_{model}_{T}_{strategy}_r{rank}.pt")


@pytest.mark.slow
def test_rows_and_columns(run):
    df, _ = run
    assert len(df) == 2 * 2 * 3  # models x strategies x (tp rank 0, tp rank 1, sim rank 0)
    tp, sim = df[df["run"] == "tp"], df[df["run"] == "sim"]
    assert sorted(tp["rank"].unique()) == [0, 1] and list(sim["rank"].unique()) == [0]
    assert (tp["world_size"] == 2).all() and (tp["dist_backend"] == "gloo").all()
    assert (sim["world_size"] == 1).all() and (sim["dist_backend"] == "none").all()
    assert (df["num_heads"] == 2).all() and (df["padded_heads"] == 64).all()  # 4 heads / TP 2, hopper padding
    assert (df["kernel_backend"] == "reference").all()
    for k, v in SAFE_ENV.items():  # NVLink multicast off in every worker
        assert (df[k].astype(str) == v).all()
    assert (df["source"] == "measured").all() and (df["device"] == "cpu").all() and df["git_commit"].all()
    for c in ("attn_ms", "compute_ms", "block_ms"):
        assert (df[c] > 0).all()
    assert (tp["allreduce_ms"] > 0).all() and sim["allreduce_ms"].isna().all()
    assert (sim["block_ms"] == sim["compute_ms"]).all()
    for value in df["allreduce_model_ms"]:  # the cost model's ideal ring, tiny hidden 64, TP 2, h200 by default
        assert math.isclose(value, allreduce_model_ms(T, 64, 2, "h200"))
    assert tp["time_error_pct"].notna().all() and sim["time_error_pct"].isna().all()
    s = summary_table(df)
    assert len(s) == 4 and {"time_err_%", "compute_err_%", "mem_err_%"} <= set(s.columns)


@pytest.mark.slow
def test_all_reduced_output_equals_the_unsharded_block(run):
    _, out = run
    for name in MODELS:
        model = _model(name, tiny_overrides())
        sm = _sm_scale(model)
        shards = [make_block_inputs(model, 2, r, T, seed=0) for r in range(2)]
        # sharded by hand in this process: sum of the two ranks' partial o_proj outputs
        partial = [block_forward(make_strategy("fused", num_heads=2, max_num_batched_tokens=T), s, sm, 1)
                   for s in shards]
        # unsharded: all 4 heads on one "rank" (TP=1), the shards concatenated along heads
        full = {k: torch.cat([s[k] for s in shards], dim=1 if k in ("ql_nope", "q_pe", "w_o") else 0)
                for k in ("ql_nope", "q_pe", "w_uv", "w_o")}
        full.update({k: shards[0][k] for k in ("kv", "indices", "topk_length")}, num_heads=4)
        for k in ("kv", "indices", "topk_length"):  # replicated inputs really are the same on both ranks
            assert torch.equal(shards[0][k], shards[1][k])
        y_full = block_forward(make_strategy("unfused", num_heads=4, max_num_batched_tokens=T), full, sm, 1)
        for strategy in ("unfused", "fused"):
            y0, y1 = _y(out, "tp", name, strategy, 0), _y(out, "tp", name, strategy, 1)
            assert y0.shape == (T, model.hidden_size) and y0.dtype == torch.bfloat16
            assert torch.equal(y0, y1)  # every rank holds the reduced output
            torch.testing.assert_close(y0, (partial[0].float() + partial[1].float()).to(torch.bfloat16),
                                       rtol=1.6e-2, atol=1e-3)
            torch.testing.assert_close(y0.float(), y_full.float(), rtol=3e-2, atol=3e-3)
            # the simulation = rank 0's share, no all-reduce
            torch.testing.assert_close(_y(out, "sim", name, strategy, 0), partial[0], rtol=1.6e-2, atol=1e-3)
        assert torch.equal(_y(out, "tp", name, "fused", 0), _y(out, "tp", name, "unfused", 0))
        assert y_full.abs().max() > 0


def allreduce_model_ms(T, hidden, tp, arch_name):
    """What the harness's ``allreduce_model_ms`` column holds: the cost model's all-reduce at the ideal ring."""
    return comm_time_ms("allreduce", T * hidden * 2, tp, get_arch(arch_name), ideal_ring_calibration())


def test_allreduce_model():
    # GLM-5 hidden 6144, T 16384, TP 2 on H200 NVLink (900 GB/s both directions): 1 x 201326592 B / 450 GB/s
    assert get_arch("h200").nvlink_gbps == 900
    assert math.isclose(allreduce_model_ms(16384, 6144, 2, "h200"), 16384 * 6144 * 2 / 450e9 * 1e3)
    assert math.isclose(allreduce_model_ms(1000, 1000, 8, "h200"), 2 * 7 / 8 * 1000 * 1000 * 2 / 450e9 * 1e3)
    assert allreduce_model_ms(1000, 1000, 1, "h200") == 0.0


def test_compare_formulas():
    base = dict(model="m", T=8, strategy="fused", num_heads=4, allreduce_model_ms=0.5, device_used_bytes=None)
    df = pd.DataFrame([
        dict(base, run="tp", rank=0, compute_ms=2.0, block_ms=3.0, allreduce_ms=1.0, peak_extra_bytes=100),
        dict(base, run="tp", rank=1, compute_ms=2.5, block_ms=3.0, allreduce_ms=1.0, peak_extra_bytes=100),
        dict(base, run="sim", rank=0, compute_ms=2.2, block_ms=2.2, allreduce_ms=None, peak_extra_bytes=110),
    ])
    c = compare(df)
    tp0 = c[(c["run"] == "tp") & (c["rank"] == 0)].iloc[0]
    assert math.isclose(tp0["time_error_pct"], 100 * (2.2 + 0.5 - 3.0) / 3.0)
    assert math.isclose(tp0["compute_error_pct"], 100 * (2.2 - 2.0) / 2.0)
    assert math.isclose(tp0["allreduce_model_error_pct"], -50.0)
    assert math.isclose(tp0["mem_error_pct"], 10.0)
    assert c[c["run"] == "sim"]["time_error_pct"].isna().all()
    s = summary_table(c).iloc[0]
    assert s["tp_block_ms"] == 3.0 and s["tp_compute_ms"] == 2.5  # the slowest rank
    assert math.isclose(s["compute_err_%"], 100 * (2.2 - 2.5) / 2.5)


def test_inputs_are_sharded_by_head_and_replicated_kv():
    model = dataclasses.replace(_model("glm-5", tiny_overrides()))
    a, b = (make_block_inputs(model, 2, r, 24, seed=3) for r in range(2))
    assert a["ql_nope"].shape == (24, 2, 512) and a["ql_nope"].stride(-1) == 1 and not a["ql_nope"].is_contiguous()
    assert a["q_pe"].shape == (24, 2, 64) and a["w_uv"].shape == (2, 512, 16) and a["w_o"].shape == (64, 32)
    assert not torch.equal(a["ql_nope"], b["ql_nope"]) and torch.equal(a["kv"], b["kv"])
    tl = a["topk_length"]
    assert torch.equal(tl, torch.clamp(torch.arange(1, 25), max=32).to(torch.int32))
    for i in range(24):  # causal: token i draws among keys 0..i
        assert (a["indices"][i, 0] <= i).all() and (a["indices"][i, 0] >= 0).all()


def test_bad_config_is_refused_before_spawning():
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        run_tp_benchmark(TPBenchmarkConfig(models=["glm-5"], tp=3, device="cpu"))
    with pytest.raises(ValueError, match="strategies holds 'kernel_native'"):
        run_tp_benchmark(TPBenchmarkConfig(strategies=["kernel_native"], device="cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="tp=2 needs 2 GPUs; torch sees 0"):
            run_tp_benchmark(TPBenchmarkConfig(models=["glm-5"], device="cuda"))
