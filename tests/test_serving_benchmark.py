"""The benchmark per strategy (mla_lab.serving.benchmark): the PR's benchmark end to end (CPU, a few seconds) and
a deployment without KV capacity refused."""

import math

import pytest

from mla_lab.deployment import Deployment
from mla_lab.placement import BASELINE
from mla_lab.serving.benchmark import PR_BENCH, bench_of, serve_benchmark


@pytest.mark.parametrize("model", ["glm-5", "glm-5.2"])
def test_pr_benchmark_gives_finite_metrics_and_the_changes_sign(model):
    """The PR's benchmark (32 x 1024 / 128, concurrency 32, rate inf, 16384-token budget, TP8 H200, fp8 weights,
    EP). Sign: the PR's pre-padded workspace lowers mean TTFT and raises total token throughput against the
    pre-PR baseline (as the PR reports, smaller in size); a stale per-call pad raises TTFT."""
    res = serve_benchmark(Deployment.seed(model=model), ["vllm-pre-53878", "vllm-53878"], PR_BENCH)
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
    """Issue 24: called from Python, the refusal printed "capacity -6258034 tokens". Now one line naming the
    deployment and memory_tradeoff's reason (the bf16 weights alone exceed the budget), no negative number."""
    import re
    import time

    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        serve_benchmark(Deployment.seed(weight_dtype="bf16"), ["vllm-53878"], PR_BENCH)
    msg = str(e.value)
    assert time.perf_counter() - t0 < 5  # refused before any strategy is simulated
    assert "\n" not in msg and not re.search(r"(?<![\w.])-\d", msg), msg
    assert msg.startswith("deployment glm-5 TP8 on h200 (weight_dtype='bf16', max_num_batched_tokens=16384, "
                          "gpu_memory_utilization=0.9) does not fit: weights (176.9 GiB per rank)"), msg
    assert "leave no KV cache" in msg


def test_serve_benchmark_refuses_a_strategy_whose_extra_takes_the_whole_kv_capacity():
    """A deployment with some KV capacity (half the PR's 1008 MiB extra, at a tuned gpu_memory_utilization): the
    baseline fits, the PR's workspace does not; the refusal names the strategy, the deployment and the extra MiB,
    and comes before the baseline is simulated."""
    import re

    from mla_lab.model.memory import memory_tradeoff

    mem = memory_tradeoff(Deployment.seed(), strategies=["private_workspace"])
    extra = mem["strategies"]["private_workspace"]["extra_bytes"]
    u = (0.9 * mem["total_memory_bytes"] - mem["kv_budget_bytes"] + extra / 2) / mem["total_memory_bytes"]
    mem_u = memory_tradeoff(Deployment.seed(gpu_memory_utilization=u), strategies=["private_workspace"])
    assert 0 < mem_u["kv_capacity_tokens"] < mem_u["strategies"]["private_workspace"]["kv_tokens_lost"]
    with pytest.raises(ValueError) as e:
        serve_benchmark(Deployment.seed(gpu_memory_utilization=u), ["vllm-53878"], PR_BENCH)
    msg = str(e.value)
    assert "\n" not in msg and not re.search(r"(?<![\w.])-\d", msg), msg
    assert msg.startswith("strategy='private_workspace' does not fit deployment glm-5 TP8 on h200"), msg
    assert f"({extra / 2**20:.0f} MiB beyond the baseline's)" in msg and "KV capacity 0" in msg


def test_the_workload_is_the_deployments():
    """One truth for the workload: with no bench the client sends the deployment's (the seed's is PR_BENCH); a
    bench sending another workload is refused in one line before anything is priced; bench_of keeps the workload
    and takes only the client's other flags."""
    d = Deployment.seed()
    assert bench_of(d) == PR_BENCH and bench_of(d, seed=7).seed == 7
    with pytest.raises(ValueError, match=r"bench_of\(deployment, ...\) got \['num_prompts'\]"):
        bench_of(d, num_prompts=8)
    with pytest.raises(ValueError) as e:
        serve_benchmark(d, ["vllm-53878"], bench_of(d.replace(num_prompts=8, concurrency=None)))
    assert "\n" not in str(e.value) and str(e.value).startswith("bench sends 8 x 1024-token prompts"), e.value


def test_serving_entry_points_name_a_wrong_type_in_one_line():
    """A rank where a Deployment is due (or the reverse, or the old loose form) is refused naming the argument."""
    from mla_lab.deployment import Deployment
    from mla_lab.serving import bench_of, serve_benchmark
    from mla_lab.serving.step_pricer import CostModelPricer

    d = Deployment.seed()
    for call, msg in ((lambda: CostModelPricer(d, "private_workspace"), "rank= a Deployment is not a RankView"),
                      (lambda: serve_benchmark(d.rank, ["private_workspace"]), "deployment= a RankView is not a"),
                      (lambda: bench_of(d.rank), "deployment= a RankView is not a Deployment"),
                      (lambda: serve_benchmark("glm-5", 8, ["private_workspace"]), "deployment= a str is not a")):
        with pytest.raises(ValueError, match=msg) as e:
            call()
        assert "\n" not in str(e.value)
