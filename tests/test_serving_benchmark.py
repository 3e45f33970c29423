"""The benchmark per strategy (mla_lab.serving.benchmark): the PR's benchmark end to end (CPU, a few seconds) and
a deployment without KV capacity refused."""

import math

import pytest

from mla_lab.placement import BASELINE
from mla_lab.serving.benchmark import PR_BENCH, serve_benchmark


@pytest.mark.parametrize("model", ["glm-5", "glm-5.2"])
def test_pr_benchmark_gives_finite_metrics_and_the_changes_sign(model):
    """The PR's benchmark (32 x 1024 / 128, concurrency 32, rate inf, 16384-token budget, TP8 H200, fp8 weights,
    EP). Sign: the PR's pre-padded workspace lowers mean TTFT and raises total token throughput against the
    pre-PR baseline (as the PR reports, smaller in size); a stale per-call pad raises TTFT."""
    res = serve_benchmark(model, 8, "h200", ["vllm-pre-53878", "vllm-53878"], PR_BENCH, 16384)
    assert res["baseline"] == BASELINE
    assert set(res["strategies"]) == {"per_call_empty:zeros", "per_call_empty:stale", "private_workspace"}
    for s, r in res["strategies"].items():
        m = r["metrics"]
        assert m["completed"] == 32 and m["total_input_tokens"] == 32 * 1024 and m["total_output_tokens"] == 32 * 128
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), s
        assert m["mean_ttft_ms"] > 0 and m["mean_tpot_ms"] > 0 and m["total_token_throughput"] > 0
        assert r["steps_by_launch"].get("decode:FULL", 0) >= 100  # decode dominates the step count
    pr = res["strategies"]["private_workspace"]
    assert pr["change_pct"]["mean_ttft_ms"] < 0 < pr["change_pct"]["total_token_throughput"]
    assert pr["change_pct"]["mean_tpot_ms"] < 0
    assert res["strategies"]["per_call_empty:stale"]["change_pct"]["mean_ttft_ms"] > 0
    assert pr["kv_capacity_tokens"] < res["strategies"][BASELINE]["kv_capacity_tokens"]
    assert res["notes"] and all(isinstance(n, str) for n in res["notes"])


def test_serve_benchmark_refuses_a_deployment_without_kv_capacity():
    with pytest.raises(ValueError, match="KV-cache capacity .* <= 0"):
        serve_benchmark("glm-5", 8, "h200", ["vllm-53878"], PR_BENCH, 16384, weight_dtype="bf16")
