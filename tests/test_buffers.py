"""Padding rule and byte accounting (vLLM PR #53878 rule; its workspace arithmetic)."""

import pytest
import torch

from mla_lab.buffers import MIB, QConcatWorkspace, memory_account, padded_num_heads
from mla_lab.models import load_model


@pytest.mark.parametrize(
    "num_heads,arch,expected",
    [(8, "hopper", 64), (16, "hopper", 64), (32, "hopper", 64), (64, "hopper", 64), (96, "hopper", 128),
     (128, "hopper", 128), (1, "h100", 64), (65, "h20", 128), (8, "blackwell", 128), (64, "b200", 128),
     (128, "b200", 128), (129, "b200", 256), (16, 64, 64), (16, 128, 128)],
)
def test_padding_rule_bf16(num_heads, arch, expected):
    assert padded_num_heads(num_heads, arch, "bf16") == expected


@pytest.mark.parametrize("num_heads", [1, 8, 16, 32, 64, 96, 128])
@pytest.mark.parametrize("arch", ["hopper", "blackwell"])
@pytest.mark.parametrize("dtype", ["fp8", "fp8_ds_mla"])
def test_padding_rule_fp8_unchanged(num_heads, arch, dtype):
    assert padded_num_heads(num_heads, arch, dtype) == num_heads


def test_seed_workspace_difference_is_1008_mib():
    glm = load_model("glm-5")
    H = glm.heads_per_rank(8)
    fused = memory_account("private_workspace", H, 16384, "hopper", "bf16")
    unfused = memory_account("per_call_empty:zeros", H, 16384, "hopper", "bf16")
    diff = fused.persistent_bytes - unfused.persistent_bytes
    assert diff == 16384 * (64 - 8) * 576 * 2 == 1_056_964_608
    assert diff / MIB == 1008
    # the unfused pad tensor allocated per step is the full padded tensor
    assert unfused.step_transient_bytes == 16384 * 64 * 576 * 2
    assert fused.step_transient_bytes == 0


def test_graph2_holds_two_workspaces_288_mib():
    """GLM-5 TP8 (H = 8 -> 64 padded heads), max_num_batched_tokens 16384, ``subchunk:2048:graph2``: two zeroed
    (2048, 64, 576) bf16 workspaces = 2 x 2048 x 64 x 576 x 2 B = 288 MiB; vLLM before the PR holds an unpadded
    (16384, 8, 576) buffer = 144 MiB, so the extra is 144 MiB (1/7 of the PR's 1008 MiB)."""
    H = load_model("glm-5").heads_per_rank(8)
    g = memory_account("subchunk:2048:graph2", H, 16384, "hopper", "bf16", num_tokens=16384)
    views = memory_account("subchunk:2048:views", H, 16384, "hopper", "bf16", num_tokens=16384)
    pre = memory_account("per_call_empty:zeros", H, 16384, "hopper", "bf16")
    pr = memory_account("private_workspace", H, 16384, "hopper", "bf16")
    assert g.persistent_bytes == 2 * 2048 * 64 * 576 * 2 == 301_989_888 == 288 * MIB
    assert pre.persistent_bytes == 16384 * 8 * 576 * 2 == 144 * MIB
    assert g.persistent_bytes - pre.persistent_bytes == 144 * MIB
    assert (g.persistent_bytes - pre.persistent_bytes) / (pr.persistent_bytes - pre.persistent_bytes) == 1 / 7
    # views hand-off: two chunks' padded outputs (out bf16 + lse + max_logits fp32) alive, nothing delivered
    assert g.kernel_out_bytes == views.kernel_out_bytes == 2 * 2048 * 64 * (512 * 2 + 2 * 4)
    assert views.persistent_bytes == 144 * MIB and g.step_transient_bytes == 0


def test_fp8_difference_is_zero_and_blackwell_pads_to_128():
    f = memory_account("private_workspace", 8, 16384, "hopper", "fp8")
    u = memory_account("per_call_empty:zeros", 8, 16384, "hopper", "fp8")
    assert f.persistent_bytes - u.persistent_bytes == 0
    assert u.step_transient_bytes == 0
    b = memory_account("private_workspace", 8, 16384, "blackwell", "bf16")
    assert b.q_concat_heads == 128
    assert b.persistent_bytes == 16384 * 128 * 576 * 2


def test_kernel_native_keeps_real_heads():
    k = memory_account("kernel_native", 8, 1024, "hopper")
    assert k.q_concat_heads == 8 and k.kernel_heads == 8 and k.step_transient_bytes == 0
    assert k.kernel_out_bytes == 1024 * 8 * (512 * 2 + 8)


def test_kv_bytes_per_token_matches_layout():
    glm = load_model("glm-5")
    assert glm.kv_cache_bytes_per_token("bf16") == 78 * (1152 + 132)


def test_workspace_views_and_bytes():
    ws = QConcatWorkspace(32, 8, "hopper", "bf16")
    assert ws.buffer.shape == (32, 64, 576) and ws.buffer.dtype == torch.bfloat16
    assert ws.nbytes == 32 * 64 * 576 * 2
    v = ws.view(5)
    assert v.shape == (5, 64, 576) and v.data_ptr() == ws.buffer.data_ptr()
    assert ws.view(0).shape[0] == 0
    with pytest.raises(ValueError, match=r"num_tokens=33 exceeds the workspace's max_num_batched_tokens=32"):
        ws.view(33)
    with pytest.raises(ValueError, match=r"num_tokens=-1 must be a non-negative int"):
        ws.view(-1)
    assert QConcatWorkspace(4, 8, pad=False).buffer.shape == (4, 8, 576)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: padded_num_heads(0), r"num_heads=0 must be a positive int"),
        (lambda: padded_num_heads(8, "a100"), r"arch='a100' is not a known GPU architecture; allowed: \["),
        (lambda: padded_num_heads(8, "hopper", "int4"), r"kv_cache_dtype='int4' is not supported; allowed"),
        (lambda: padded_num_heads(8, 96), r"prefill_padding=96 must be 64 or 128"),
        (lambda: memory_account("padded", 8, 16), r"strategy='padded' is not known; allowed"),
        (lambda: memory_account("private_workspace", 8, 0), r"max_num_batched_tokens=0 must be a positive int"),
        (lambda: memory_account("private_workspace", 8, 16, num_tokens=17), r"num_tokens=17 exceeds max_num_batched_tokens=16"),
        (lambda: QConcatWorkspace(16, 8, dtype=torch.float32), r"dtype=torch.float32 is not supported"),
    ],
)
def test_bad_input_messages(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_workspace_zero_init_keeps_padded_heads_zero_through_concat():
    from mla_lab.kernels import concat_mla_q

    ws = QConcatWorkspace(6, 8, "hopper", "bf16")
    assert torch.count_nonzero(ws.buffer) == 0
    q = ws.view(6)
    concat_mla_q(torch.randn(6, 8, 512).bfloat16(), torch.randn(6, 8, 64).bfloat16(), q, backend="torch")
    assert torch.count_nonzero(q[:, 8:]) == 0 and torch.count_nonzero(q[:, :8]) > 0
    raw = QConcatWorkspace(6, 8, "hopper", "bf16", zero_init=False)
    assert raw.buffer.shape == ws.buffer.shape
