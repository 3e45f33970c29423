"""Engine presets as they ship (issue 21): placement, content, route per prefill length, decode path, sources; the
post-#56902 memory; FA3 sparse without padded bytes; SGLang's dense route pads nothing at 1024-token prompts."""

from __future__ import annotations

import pytest

from mla_lab.arch import get_arch
from mla_lab.buffers import MIB, dense_route_transient_bytes, memory_account, shared_workspace_other_bytes
from mla_lab.deployment import Deployment
from mla_lab.model.ops import layer_ops
from mla_lab.model.timing import step_time_ms
from mla_lab.models import load_model
from mla_lab.placement import PRESET_SOURCES, PRESETS, expand, parse_strategy, preset_of, strategy_route
from mla_lab.workload import Step

GLM = load_model("glm-5")
DSV = load_model("deepseek-v3.2")
H200 = get_arch("h200")
SEED_STEP = Step([(i, 0, 1024) for i in range(16)])
SEED = Deployment.seed().rank  # GLM-5 TP8 H200, fp8 weights, experts ep, bf16 KV: the rank view the cost model takes
LENS = (512, 1024, 2048, 4096, 8192)

# preset -> [(strategy, placement, content, [prefill route at LENS], decode route)], GLM-5 / DeepSeek-V3.2
GLM_TABLE = {
    "vllm-pre-53878": [("per_call_empty:zeros", "per_call_empty", "zeros", ["sparse-mqa"] * 5, "sparse-mqa"),
                       ("per_call_empty:stale", "per_call_empty", "stale", ["sparse-mqa"] * 5, "sparse-mqa")],
    "vllm-53878": [("private_workspace", "private_workspace", "zeros", ["sparse-mqa"] * 5, "sparse-mqa")],
    "vllm-56902": [("shared_workspace:none", "shared_workspace", "stale", ["sparse-mqa"] * 5, "sparse-mqa")],
    "vllm-fa3-sparse": [("fa3_sparse", "fa3_sparse", "zeros", ["fa3-sparse"] * 5, "fa3-sparse")],
    "sglang-dense": [("per_call_zeros@sglang-dense", "per_call_zeros", "zeros",
                ["mha-dense"] * 3 + ["sparse-mqa"] * 2, "fa3-sparse")],
    "sglang-flashmla-sparse": [("per_call_zeros", "per_call_zeros", "zeros", ["sparse-mqa"] * 5, "sparse-mqa")],
    "kernel-native": [("kernel_native", "kernel_native", "zeros", ["sparse-mqa"] * 5, "sparse-mqa")],
}
# DeepSeek-V3.2 on vLLM takes dense MHA when every prefill has seq_len <= topk (#47327), except on FA3 sparse where
# requests of <= 1024 query tokens are handled as decodes (flashattn_mla_sparse.py reorder threshold 1024)
DSV_ROUTES = {
    "per_call_empty:zeros": ["mha-dense"] * 3 + ["sparse-mqa"] * 2,
    "private_workspace": ["mha-dense"] * 3 + ["sparse-mqa"] * 2,
    "shared_workspace:none": ["mha-dense"] * 3 + ["sparse-mqa"] * 2,
    "fa3_sparse": ["fa3-sparse", "fa3-sparse", "mha-dense", "fa3-sparse", "fa3-sparse"],
    "per_call_zeros@sglang-dense": ["mha-dense"] * 3 + ["sparse-mqa"] * 2,
    "per_call_zeros": ["sparse-mqa"] * 5,
    "kernel_native": ["sparse-mqa"] * 5,
}


def test_every_preset_member_and_its_routes():
    assert set(GLM_TABLE) == set(PRESETS)
    got: dict = {}
    for preset in PRESETS:
        for st in expand(preset):
            got.setdefault(preset, []).append((st.name, st.placement, st.content, [
                strategy_route(st, "glm", 2048, L, L) for L in LENS], strategy_route(st, "glm", 2048, phase="decode")))
            if st.name in DSV_ROUTES:
                dsv = [strategy_route(st, load_model("deepseek-v3.2"), 2048, L, L) for L in LENS]
                assert dsv == DSV_ROUTES[st.name], st.name
    assert got == GLM_TABLE
    for preset, members in PRESETS.items():
        assert all(preset_of(n) == preset for n in members)


def test_preset_sources_name_the_file_and_the_dates():
    pre = PRESET_SOURCES["vllm-pre-53878"]
    assert "flashmla_sparse.py" in pre and "new_empty" in pre and "topk_length" in pre and "concat_mla_q" in pre
    assert "60191e18" in pre and "Not the older" in pre  # the older file is named as not the baseline
    assert "on or after 2026-08-27" in PRESET_SOURCES["vllm-53878"]
    assert "#56902" in PRESET_SOURCES["vllm-56902"] and "-144 MiB" in PRESET_SOURCES["vllm-56902"]
    assert "flashattn_mla_sparse.py" in PRESET_SOURCES["vllm-fa3-sparse"] and "#46189" in PRESET_SOURCES[
        "vllm-fa3-sparse"]
    assert "deepseek_v32.md" in PRESET_SOURCES["sglang-dense"] and "new_zeros" in PRESET_SOURCES["sglang-dense"]
    assert "prefill CUDA graphs off" in PRESET_SOURCES["sglang-dense"] and "sglang@0.5.23" in PRESET_SOURCES["sglang-dense"]
    assert "no engine ships" not in PRESET_SOURCES["kernel-native"]
    assert "vllm-fa3-sparse" in PRESET_SOURCES["kernel-native"]


def test_post_56902_persistent_extra_by_hand():
    """GLM-5 TP8, 16384 tokens: before the PR a private (16384, 8, 576) bf16 buffer = 16384 x 8 x 1152 B =
    150,994,944 B = 144 MiB; after #56902 none (the padded view lies inside the 3072 MiB shared workspace)."""
    shared = shared_workspace_other_bytes(SEED)
    assert shared == 16384 * 8 * (6144 + 6144) * 2 == 3 * 1024 * MIB  # fused-MoE scratch: max(N/2,K) + max(N,K)
    pre = memory_account("per_call_empty:zeros", 8, 16384, H200, shared_other_bytes=shared)
    post = memory_account("shared_workspace:none", 8, 16384, H200, shared_other_bytes=shared)
    assert pre.persistent_bytes == 150_994_944
    assert post.persistent_bytes - pre.persistent_bytes == -150_994_944
    assert (post.persistent_bytes - pre.persistent_bytes) / MIB == -144.0


def test_vllm_fa3_sparse_has_no_padded_bytes_and_no_padded_writes():
    st = parse_strategy(PRESETS["vllm-fa3-sparse"][0])
    acc = memory_account(st, 8, 16384, H200)
    assert acc.persistent_bytes == 0 and acc.step_transient_bytes == 0 and acc.kernel_heads == 8
    assert acc.kernel_out_bytes == 16384 * 8 * (512 * 2 + 4)  # out [T, H, 512] bf16 + lse: real heads only
    ops = layer_ops(SEED, st, SEED_STEP)
    names = [op.name for op in ops]
    assert not {"concat", "pad", "pad_copy", "out_slice", "chunk_out"} & set(names)
    (k,) = [op for op in ops if op.name == "kernel"]
    assert k.act_bytes == 16384 * 8 * (1152 + 1024 + 4)  # nothing scales with the padded 64 heads
    padded = next(op for op in layer_ops(SEED, "private_workspace", SEED_STEP) if op.name == "kernel")
    assert padded.act_bytes == 16384 * 64 * 2184 and k.flops == padded.flops  # same 64-row MMAs, fewer bytes
    r = step_time_ms(SEED, st, SEED_STEP)
    assert r["route"] == "fa3-sparse"
    pr = step_time_ms(SEED, "private_workspace", SEED_STEP)
    assert r["attention_path"] < pr["attention_path"]


def test_a_1024_token_prompt_on_sglang_pads_nothing():
    st = parse_strategy(PRESETS["sglang-dense"][0])
    assert strategy_route(st, GLM, 2048, [1024] * 16, [1024] * 16) == "mha-dense"
    r = step_time_ms(SEED, st, SEED_STEP)
    assert r["route"] == "mha-dense"
    padded_ops = {"concat", "pad", "pad_copy", "kernel", "out_slice", "chunk_out", "chunk_overhead"}
    assert not padded_ops & set(r["by_op"]) and {"kv_b_proj", "k_concat", "mha_attn"} <= set(r["by_op"])
    acc = memory_account(st, 8, 16384, H200, model=GLM, prompt_len=1024)
    assert acc.route == "mha-dense" and acc.step_transient_bytes == 0 and acc.kernel_heads == 8
    assert acc.kernel_out_bytes == dense_route_transient_bytes(GLM, 8, 16384, 16384) == \
        16384 * 8 * (448 + 256 + 256) * 2 + 16384 * 8 * 4  # 240.5 MiB, not the padded 2184 MiB
    # the same preset above 2048 tokens takes flashmla_sparse with a new_zeros pad
    long = memory_account(st, 8, 16384, H200, model=GLM, prompt_len=8192)
    assert long.route == "sparse-mqa" and long.step_transient_bytes == 16384 * 64 * 1152
    assert step_time_ms(SEED, st, Step([(0, 0, 8192), (1, 0, 8192)]))["route"] == "sparse-mqa"
    # the forced padded route pads at 1024 too
    forced = step_time_ms(SEED, PRESETS["sglang-flashmla-sparse"][0], SEED_STEP)
    assert forced["route"] == "sparse-mqa" and "pad" in forced["by_op"]
    assert r["total"] < forced["total"]


def test_route_names_round_trip_and_bad_rules_are_refused():
    st = parse_strategy("per_call_zeros@sglang-dense")
    assert st.name == "per_call_zeros@sglang-dense" and st.rule == "sglang-dense"
    # the old rule name (issue 32: it is not SGLang's default today) is still read, as the new one
    assert parse_strategy("per_call_zeros@sglang-dense") == st
    assert parse_strategy("private_workspace@vllm-flashmla").name == "private_workspace"  # the default rule
    with pytest.raises(ValueError, match="route rule 'trtllm' is not known"):
        parse_strategy("private_workspace@trtllm")
