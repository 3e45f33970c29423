"""Chunked-prefill scheduling, causal topk sums and the attention-path cost model."""

import pytest

from mla_lab.arch import get_arch
from mla_lab.deployment import Deployment
from mla_lab.model.calibration import uncalibrated
from mla_lab.model.ops import attention_path_ops
from mla_lab.model.timing import attention_path_ms
from mla_lab.workload import Workload, schedule, sum_topk_lengths

H200 = get_arch("h200")


def _rank(tp: int = 8, kv_cache_dtype: str = "bf16"):
    """GLM-5 on the H200 at ``tp`` (the seed's deployment otherwise): the rank view the cost model takes."""
    return Deployment.seed(tp=tp, kv_cache_dtype=kv_cache_dtype).rank


def test_schedule_seed_workload():
    steps = schedule(Workload(1024, 32, 32), 16384)
    assert len(steps) == 2 and all(s.num_tokens == 16384 for s in steps)
    assert sorted(p for s in steps for p in s.finished_prompts(1024)) == list(range(32))


def test_schedule_long_prompt_chunks_and_concurrency():
    steps = schedule(Workload(8192, 2, 1), 3000)
    # concurrency 1: prompt 0 takes ceil(8192/3000)=3 steps, but the last one only has 2192 tokens, prompt 1 can't join
    assert [s.num_tokens for s in steps] == [3000, 3000, 2192, 3000, 3000, 2192]
    steps = schedule(Workload(8192, 2, 2), 3000)
    assert [s.num_tokens for s in steps] == [3000, 3000, 3000, 3000, 3000, 1384]
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=0 must be a positive int"):
        schedule(Workload(8, 1), 0)
    with pytest.raises(ValueError, match=r"prompt_len=0 must be a positive int"):
        Workload(0)


@pytest.mark.parametrize("start,n,topk", [(0, 1, 4), (0, 10, 4), (3, 7, 4), (100, 50, 2048), (0, 5000, 2048),
                                          (2040, 20, 2048), (0, 0, 8)])
def test_sum_topk_lengths_matches_loop(start, n, topk):
    assert sum_topk_lengths(start, n, topk) == sum(min(p + 1, topk) for p in range(start, start + n))


def test_attention_path_ops_bytes():
    T = 16384
    def work(*a, **k):
        return {op.name: {"bytes": op.act_bytes, "flops": op.flops} for op in attention_path_ops(*a, **k)}

    u = work(_rank(), "per_call_zeros", T)
    f = work(_rank(), "private_workspace", T)
    k = work(_rank(), "kernel_native", T)
    assert u["concat"]["bytes"] == f["concat"]["bytes"] == 2 * T * 8 * 576 * 2
    assert u["pad"]["bytes"] == T * 64 * 1152 + 2 * T * 8 * 1152
    assert "pad" not in f and "pad" not in k and "out_slice" not in k
    assert u["kernel"]["flops"] == 2 * T * 2048 * 64 * (576 + 512) == k["kernel"]["flops"]
    assert u["out_slice"]["bytes"] == 2 * T * 8 * 512 * 2
    # fp8 KV cache: no padding anywhere
    assert "pad" not in work(_rank(kv_cache_dtype="fp8"), "per_call_zeros", T)
    # no padding needed at 64 heads on Hopper
    assert "pad" not in work(_rank(tp=1), "per_call_zeros", T)


def test_calibration_reproduces_reference_kernel_time():
    cal = uncalibrated()  # attention efficiencies fitted from data/calibration/h200_reference.csv alone
    assert set(cal.attention) == {"concat", "pad", "pad_copy", "kernel", "out_slice"}
    assert all(0 < v < 1 for v in cal.attention.values())
    t = attention_path_ms(_rank(), "per_call_zeros", 16384, calibration=cal)
    # one H200, 2026-11-30 (data/calibration/h200_reference.csv): 7.82 ms kernel, 0.534 ms pad at T=16384, 8 -> 64; median fit is within 10%
    assert t["kernel"] == pytest.approx(7.82, rel=0.1)
    assert t["pad"] == pytest.approx(0.534, rel=0.1)
    tf = attention_path_ms(_rank(), "private_workspace", 16384, calibration=cal)
    assert tf["total"] < t["total"]
    assert t["total"] - tf["total"] == pytest.approx(t["pad"])
