"""Workload -> TTFT (both scopes), strategy comparison and the memory trade as KV-cache tokens."""

import math

import pytest

from mla_lab.arch import get_arch
from mla_lab.deployment import Deployment
from mla_lab.model.calibration import uncalibrated as default_ops_calibration
from mla_lab.model.memory import memory_tradeoff
from mla_lab.model.timing import step_time_ms
from mla_lab.model.ttft import SCOPES, compare_strategies, predict_ttft
from mla_lab.models import load_model
from mla_lab.workload import Workload, schedule

H200 = get_arch("h200")
GLM = load_model("glm-5")
CAL = default_ops_calibration()  # fixed efficiencies: the tests do not depend on the committed calibration
SEED = Workload(1024, 32, 32)
#: bf16 weights, experts sharded over TP: stated, not defaulted (the cost model has no default for either).
BF16_TP = Deployment.of(model=GLM, tp=8, arch=H200, max_num_batched_tokens=16384, kv_cache_dtype="bf16",
                        weight_dtype="bf16", moe_parallel="tp", prompt_len=1024, num_prompts=32, concurrency=32)


def dep(wl: Workload, **kw) -> Deployment:
    """BF16_TP with the workload ``wl`` (and other :meth:`Deployment.of` arguments ``kw``)."""
    return BF16_TP.replace(prompt_len=wl.prompt_len, num_prompts=wl.num_prompts, concurrency=wl.concurrency, **kw)


def test_default_scope_is_full_layer_and_keys():
    assert SCOPES[0] == "full_layer"
    r = predict_ttft(dep(SEED), "private_workspace", calibration=CAL)
    assert r["scope"] == "full_layer" and r["source"] == "modelled"
    for k in ("ttft_ms_mean", "ttft_ms_max", "num_steps", "step_ms", "ops_ms", "step_ops_ms", "ttft_ms_list"):
        assert k in r
    assert len(r["step_ops_ms"]) == r["num_steps"] == len(r["step_ms"])
    assert math.isclose(sum(r["ops_ms"].values()), sum(r["step_ms"]), rel_tol=1e-9)


def test_chunked_prefill_step_count_and_ttft():
    # seed: 32 x 1024 tokens with a 16384-token budget -> 2 steps of 16 whole prompts each
    r = predict_ttft(dep(SEED), "private_workspace", calibration=CAL)
    assert r["num_steps"] == 2
    s1, s2 = r["step_ms"]
    # prompts 0..15 finish after step 1, 16..31 after step 2
    assert r["ttft_ms_list"] == [s1] * 16 + [s1 + s2] * 16
    assert math.isclose(r["ttft_ms_mean"], s1 + s2 / 2, rel_tol=1e-12)
    assert math.isclose(r["ttft_ms_max"], s1 + s2, rel_tol=1e-12)
    # a 40000-token prompt alone needs ceil(40000 / 16384) = 3 steps: 16384, 16384, 7232
    r = predict_ttft(dep(Workload(40000)), "private_workspace", calibration=CAL)
    assert r["num_steps"] == 3 and len(r["ttft_ms_list"]) == 1
    assert math.isclose(r["ttft_ms_mean"], sum(r["step_ms"]), rel_tol=1e-12)
    # each step priced on its own chunks (later chunks of a prompt see more keys, so cost more)
    st = schedule(Workload(40000), 16384)
    assert [s.num_tokens for s in st] == [16384, 16384, 7232]
    assert math.isclose(r["step_ms"][1], step_time_ms(dep(Workload(40000)).rank, "private_workspace", st[1],
                                                      CAL)["total"], rel_tol=1e-12)
    assert r["step_ms"][1] > r["step_ms"][0]
    # concurrency 4 over 8 prompts of 1024: at most 4 in flight -> 2 steps of 4096 tokens
    r = predict_ttft(dep(Workload(1024, 8, 4)), "private_workspace", calibration=CAL)
    assert r["num_steps"] == 2


@pytest.mark.parametrize("strategy", ["per_call_zeros", "private_workspace", "kernel_native"])
def test_full_layer_at_least_attention_path(strategy):
    full = predict_ttft(dep(SEED), strategy, calibration=CAL)
    attn = predict_ttft(dep(SEED), strategy, calibration=CAL, scope="attention_path")
    assert full["ttft_ms_mean"] > attn["ttft_ms_mean"]
    # with costmodel's output-slice copy kept, the attention part of full_layer is exactly the attention_path scope
    full_c = predict_ttft(dep(SEED), strategy, calibration=CAL, out_slice_copy=True)
    assert math.isclose(full_c["attention_path_ms"], attn["attention_path_ms"], rel_tol=1e-9)
    assert full_c["ttft_ms_mean"] >= full["ttft_ms_mean"]


def test_monotone_in_workload_and_strategy_order():
    prev = 0.0
    for L in (256, 1024, 4096, 16384):
        t = predict_ttft(dep(Workload(L, 4)), "private_workspace", calibration=CAL)["ttft_ms_mean"]
        assert t > prev
        prev = t
    prev = 0.0
    for n in (1, 8, 32, 64):
        t = predict_ttft(dep(Workload(1024, n)), "private_workspace", calibration=CAL)["ttft_ms_max"]
        assert t > prev
        prev = t
    c = compare_strategies(dep(SEED), calibration=CAL, strategies=("per_call_zeros", "private_workspace", "kernel_native"), baseline="per_call_zeros")
    d = c["delta_pct"]
    assert d["per_call_zeros"] == 0 and d["kernel_native"] <= d["private_workspace"] < 0
    # the attention_path scope overstates the relative change (same absolute saving, smaller denominator)
    ca = compare_strategies(dep(SEED), calibration=CAL, scope="attention_path", strategies=("per_call_zeros", "private_workspace", "kernel_native"), baseline="per_call_zeros")
    assert ca["delta_pct"]["private_workspace"] < d["private_workspace"]
    # unfused and fused both keep (or both drop) the output slice, so the absolute saving is the same in both scopes
    assert math.isclose(ca["delta_ms"]["private_workspace"], c["delta_ms"]["private_workspace"], rel_tol=1e-9)


def test_layer_options_pass_through():
    b = predict_ttft(dep(SEED), "private_workspace", calibration=CAL)
    f = predict_ttft(dep(SEED, weight_dtype="fp8", moe_parallel="ep"), "private_workspace", calibration=CAL)
    assert f["ttft_ms_mean"] < b["ttft_ms_mean"]
    slow = predict_ttft(dep(SEED), "private_workspace", calibration=CAL, comm_efficiency=0.4)
    assert math.isclose(slow["comm_ms"], 2 * b["comm_ms"], rel_tol=1e-9)


def test_memory_tradeoff_seed():
    seed = Deployment.seed()
    m = memory_tradeoff(seed)
    f = m["strategies"]["private_workspace"]
    # 16384 x (64 - 8) x 576 x 2 B = 1,056,964,608 B = 1008 MiB (vLLM PR #53878's workspace)
    assert f["extra_bytes"] == 16384 * 56 * 1152 == 1_056_964_608 and f["extra_mib"] == 1008.0
    # per token: 78 layers x (1152 B latent + 132 B indexer key) = 100152 B
    assert m["kv_bytes_per_token"] == 78 * (1152 + 132) == 100_152
    assert math.isclose(f["kv_tokens_lost"], 1_056_964_608 / 100_152, rel_tol=1e-12)
    assert math.isclose(f["kv_capacity_pct_lost"], f["kv_tokens_lost"] / m["kv_capacity_tokens"] * 100)
    # vLLM 0.33.0's rule (issue 37): torch's total, the top-k buffer, the logits reserve, non-torch and graph terms
    # and (post hoc, vLLM's wheels) the fused-MoE workspace 16384 x 8 x (6144 + 6144) x 2 B and the sampler's
    # top-k/top-p buffer 132 x 154,880 x 4 B
    budget = (math.ceil(150_109_880_320 * 0.9) - m["weights_bytes"] - m["activation_bytes"] - 16384 * 8 * 1152
              - 16384 * 2048 * 4 - 2**29 - 2**29 - 2**30 - 16384 * 8 * 12288 * 2 - 132 * 154_880 * 4)
    assert m["kv_budget_bytes"] == budget
    assert m["strategies"]["kernel_native"]["extra_bytes"] == 0 and m["fits"]
    # more memory for the KV cache -> the same workspace is a smaller share
    m95 = memory_tradeoff(seed.replace(gpu_memory_utilization=0.95))
    assert m95["strategies"]["private_workspace"]["kv_capacity_pct_lost"] < f["kv_capacity_pct_lost"]
    # fp8 KV cache: the workspace is not padded, nothing lost
    assert memory_tradeoff(seed.replace(kv_cache_dtype="fp8"))["strategies"]["private_workspace"]["extra_bytes"] == 0
    # GLM-5 in bf16 does not fit 8 x H200
    assert not memory_tradeoff(BF16_TP)["fits"]


@pytest.mark.parametrize("call,match", [
    (lambda: predict_ttft(dep(SEED), "private_workspace", scope="layer"),
     r"scope='layer' is not known; allowed: \['full_layer', 'attention_path'\]"),
    (lambda: predict_ttft(dep(SEED), "padded"),
     r"strategy='padded' is not known; allowed: \['per_call_empty:zeros'.*aliases \['unfused', 'fused', 'sglang'\]"),
    (lambda: predict_ttft(dep(SEED), "fused"), r"strategy='fused' is a preset or alias, read only at the door"),
    (lambda: predict_ttft(dep(SEED), "private_workspace", scope="attention_path", ep_comm="all_to_all"),
     r"layer options \['ep_comm'\] only apply to scope='full_layer'"),
    (lambda: predict_ttft(dep(SEED), "private_workspace", weight_dtype="fp8"),
     r"layer option\(s\) \['weight_dtype'\] are not allowed here.*the Deployment's"),
    (lambda: predict_ttft(GLM, "private_workspace"), r"deployment=.* must be a mla_lab.deployment.Deployment"),
    (lambda: dep(SEED, weight_dtype="fp4"), r"weight_dtype='fp4' is not allowed; allowed: \['bf16', 'fp8'\]"),
    (lambda: dep(SEED, max_num_batched_tokens=0), r"max_num_batched_tokens=0 must be a positive int"),
    (lambda: dep(SEED, arch="a100"), r"arch='a100' is not a known GPU architecture"),
    (lambda: dep(SEED, gpu_memory_utilization=1.2), r"gpu_memory_utilization=1.2 must be a number in \(0, 1\]"),
    (lambda: dep(SEED, kv_cache_dtype="int8"), r"kv_cache_dtype='int8' is not supported"),
    (lambda: compare_strategies(dep(SEED), strategies=("fused", "x")),
     r"strategy='x' is not known"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_seed_comparison_numbers_are_computed():
    from mla_lab.seed import SEED_REPORTED

    seed = Deployment.seed()
    kw = dict(calibration=CAL, strategies=("private_workspace", "kernel_native"), baseline="per_call_zeros")
    full, attn = compare_strategies(seed, **kw), compare_strategies(seed, scope="attention_path", **kw)
    assert memory_tradeoff(seed)["strategies"]["private_workspace"]["extra_mib"] == 1008.0
    assert SEED_REPORTED["extra_peak_mib"] == 132785 - 131753 == 1032
    assert full["results"]["per_call_zeros"]["num_steps"] == 2
    # the same absolute saving over a larger denominator: full_layer's relative change is the smaller one
    assert attn["delta_pct"]["private_workspace"] < full["delta_pct"]["private_workspace"] < 0
    assert math.isclose(full["delta_ms"]["private_workspace"], attn["delta_ms"]["private_workspace"], rel_tol=1e-9)
    assert SEED_REPORTED["ttft_change_pct"] == -9.5
