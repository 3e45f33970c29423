"""The measurement code's logic, dry-run on CPU with a small model (timings here mean nothing; shapes, ops and
bookkeeping are what is checked). The real run is on a GPU: benchmarks/bench_attention.py."""

import dataclasses

import pytest
import torch

from mla_lab.bench import _analytic_call_peak, make_step_inputs, time_attention_path
from mla_lab.models import load_model
from mla_lab.workload import Step


@pytest.fixture
def small_glm():
    return dataclasses.replace(load_model("glm-5"), index_topk=64)


def test_step_inputs_are_causal_and_strided(small_glm):
    step = Step([(0, 0, 40), (1, 10, 30)])
    ql, qpe, kv, idx, tl = make_step_inputs(small_glm, 8, step, prompt_len=40, device="cpu")
    assert ql.shape == (70, 8, 512) and not ql.is_contiguous() and ql.stride(-1) == 1
    assert qpe.shape == (70, 8, 64) and not qpe.is_contiguous()
    assert kv.shape == (80, 1, 576) and idx.shape == (70, 1, 64) and idx.dtype == torch.int32
    pos = torch.cat([torch.arange(0, 40), torch.arange(10, 40)])
    assert torch.equal(tl, torch.clamp(pos + 1, max=64).to(torch.int32))
    base = torch.cat([torch.zeros(40, dtype=torch.long), torch.full((30,), 40)])
    for i in range(70):
        used = idx[i, 0, : tl[i]].long()
        assert ((used >= base[i]) & (used <= base[i] + pos[i])).all()  # only its own prompt, causally


def test_time_attention_path_dry_run(small_glm):
    res = time_attention_path(small_glm, 8, Step([(0, 0, 16)]), 16, "hopper", device="cpu")
    assert set(res["unfused"]) >= {"concat", "pad", "kernel", "out_slice", "total", "workspace_bytes"}
    assert "pad" not in res["fused"]
    assert res["fused"]["workspace_bytes"] == 16 * 64 * 576 * 2
    assert res["unfused"]["workspace_bytes"] == 16 * 8 * 576 * 2
    assert res["kernel_backend"] == "reference"


def test_analytic_call_peak():
    glm = load_model("glm-5")
    T = 4096
    kernel_out = T * 64 * (512 * 2 + 8)
    assert _analytic_call_peak("unfused", 8, T, "hopper", T, glm) == T * 64 * 1152 + kernel_out
    # fused: the copy phase (full out + real-head copy; max_logits and lse already dropped) is the larger one
    assert _analytic_call_peak("fused", 8, T, "hopper", T, glm) == T * 64 * 512 * 2 + T * 8 * 512 * 2
    # no padding (64 heads on Hopper): the slice is the whole tensor, no copy; peak = kernel outputs
    assert _analytic_call_peak("unfused", 64, T, "hopper", T, glm) == T * 64 * (512 * 2 + 8)


def test_measured_ttft_recombination_replaces_attention_path():
    from mla_lab.bench import ttft_with_measured_attention
    from mla_lab.model.ttft import predict_ttft
    from mla_lab.workload import Workload, schedule

    point = dict(model="glm-5", tp=8, arch="h200", max_num_batched_tokens=16384, prompt_len=1024, num_prompts=32,
                 concurrency=32, kv_cache_dtype="bf16")
    from mla_lab.sweep import layer_kw

    mod = predict_ttft("glm-5", 8, "h200", Workload(1024, 32, 32), 16384, "fused", **layer_kw(point))
    assert layer_kw(point) == {"weight_dtype": "fp8", "moe_parallel": "ep"}  # the sweep's defaults
    attn = [sum(v for k, v in ops.items() if k in ("concat", "pad", "kernel", "out_slice"))
            for ops in mod["step_ops_ms"]]
    n = len(schedule(Workload(1024, 32, 32), 16384))
    # measured attention equal to the modelled one (per layer) reproduces the model's TTFT
    same = ttft_with_measured_attention(point, [a / 78 for a in attn], "fused")
    assert same["ttft_ms"] == pytest.approx(mod["ttft_ms_mean"], rel=1e-9)
    # 1 ms more per layer per step adds 78 ms per step before each prompt's first token
    plus = ttft_with_measured_attention(point, [a / 78 + 1.0 for a in attn], "fused")
    assert plus["ttft_ms_max"] == pytest.approx(mod["ttft_ms_max"] + 78.0 * n, rel=1e-9)
    assert "attention path measured" in plus["scope"]
    with pytest.raises(ValueError, match="entries; the workload has"):
        ttft_with_measured_attention(point, [1.0], "fused")


def test_measure_point_rows_with_stubbed_timings(monkeypatch):
    """measure_point's bookkeeping on CPU: the GPU timing is replaced by fixed numbers; the rows must carry the
    exact memory columns of the modelled rows, the measured attention path and measured provenance."""
    import mla_lab.bench as bench
    from mla_lab.sweep import expand_grid, validate_params
from mla_lab.sweep.rows import modelled_rows as price_point

    calls = []

    def fake_time(model, tp, step, prompt_len, arch_name, full_topk=False, seed=0, device="cuda"):
        calls.append(step.num_tokens)
        return {"unfused": {"concat": 0.1, "pad": 0.5, "kernel": 7.0, "out_slice": 0.2, "total": 7.8,
                            "peak_bytes": 123, "workspace_bytes": 1},
                "fused": {"concat": 0.1, "kernel": 7.0, "out_slice": 0.2, "total": 7.3, "peak_bytes": 100,
                          "workspace_bytes": 2},
                "kernel_backend": "flash_mla", "concat_backend": "triton"}

    monkeypatch.setattr(bench, "_require_cuda", lambda: None)
    monkeypatch.setattr(bench, "detect_arch", lambda: {"device": "stub H200", "prefill_padding": 64})
    monkeypatch.setattr(bench, "time_attention_path", fake_time)
    pt = expand_grid(validate_params(dict(models=["glm-5"], tp_sizes=[8], archs=["h200"],
                                          max_num_batched_tokens=[16384], prompt_lens=[1024], device="cpu")))[0]
    rows = {r["strategy"]: r for r in bench.measure_point(pt)}
    assert calls == [16384]  # two identical steps, measured once
    modelled = {r["strategy"]: r for r in price_point(pt)}
    for s in ("unfused", "fused"):
        for col in ("q_concat_heads", "persistent_bytes", "extra_persistent_bytes", "kv_tokens_lost", "num_heads"):
            assert rows[s][col] == modelled[s][col]
        assert rows[s]["source"] == "measured" and rows[s]["kernel_backend"] == "flash_mla"
    assert rows["fused"]["extra_persistent_bytes"] == 1_056_964_608
    # 0.5 ms per layer per step less, 78 layers, both prompts' groups see 1 or 2 steps: mean saving 1.5 * 39 ms
    saving = rows["unfused"]["ttft_ms"] - rows["fused"]["ttft_ms"]
    assert saving == pytest.approx(0.5 * 78 * 1.5)
    assert rows["fused"]["ttft_change_pct"] < 0 == rows["unfused"]["ttft_change_pct"]
    with pytest.raises(ValueError, match="only the bf16 path is measured"):
        bench.measure_point(dict(pt, kv_cache_dtype="fp8"))
