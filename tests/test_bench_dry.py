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
    from mla_lab.ttft import predict_ttft
    from mla_lab.workload import Workload, schedule

    point = dict(model="glm-5", tp=8, arch="h200", max_num_batched_tokens=16384, prompt_len=1024, num_prompts=32,
                 concurrency=32, kv_cache_dtype="bf16")
    mod = predict_ttft("glm-5", 8, "h200", Workload(1024, 32, 32), 16384, "fused")
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
