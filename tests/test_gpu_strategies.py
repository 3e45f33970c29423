"""Every real strategy on a GPU (FlashMLA): real heads bit-identical to a ``new_zeros`` pad, NaN in the padded heads
never leaking, and the measured call peak of the per-call and pre-padded placements equal to the byte accounting.

Marked ``gpu``: skipped on a machine without CUDA or without a ``flash_mla`` provider (with the reason); with
``MLA_LAB_REQUIRE_GPU=1`` a skip is a failure (tests/conftest.py). The GPU run is recorded in docs/perf-notes.md.
"""

import pytest
import torch

from mla_lab.buffers import call_peak_bytes
from mla_lab.kernels import flash_mla_info, last_backend
from mla_lab.models import load_model
from mla_lab.strategies import equivalence_check
from mla_lab.workload import Step

CUDA = torch.cuda.is_available()
FLASH = flash_mla_info()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason="torch.cuda.is_available() is False: no CUDA GPU on this machine"),
    pytest.mark.skipif(CUDA and not FLASH.get("available"), reason=f"no flash_mla provider: {FLASH.get('reason')}"),
]

HEADS = (8, 16, 32)


@pytest.mark.parametrize("num_heads", HEADS)
def test_every_real_strategy_gives_the_same_real_heads_on_flash_mla(num_heads):
    # topk a multiple of 128 (sm90 B_TOPK), s_kv above it, causal topk_length with one empty row
    r = equivalence_check(num_heads=num_heads, arch="hopper", num_tokens=300, s_kv=512, topk=128, device="cuda")
    assert last_backend("sparse_mla_prefill") == "flash_mla"
    assert r["equal"], r["per_strategy"]


def test_measured_call_peak_equals_the_byte_accounting():
    from mla_lab.deployment import Deployment
    from mla_lab.measure.attention import time_attention_path

    model = load_model("glm-5")
    T = 4096
    step = Step([(0, 0, T)])
    names = ("per_call_empty:zeros", "per_call_zeros", "private_workspace", "shared_workspace:none")
    res = time_attention_path(Deployment.seed(model=model).rank, step, T, strategies=names, repeats=3)
    assert res["kernel_backend"] == "flash_mla"
    for name in names:
        got = res[name]["peak_bytes"]
        assert len(res[name]["samples"]) == 3, name
        # the call hands on views of the kernel's padded outputs (no copy): the pad tensor of a per-call placement
        # plus out [T, 64, 512] bf16 and lse / max_logits [T, 64] fp32 (mla_lab.buffers.memory_account)
        kernel_out = T * 64 * (512 * 2 + 8)
        expected = kernel_out + (T * 64 * 1152 if name.startswith("per_call") else 0)
        assert got == expected, (name, got, expected)
        assert call_peak_bytes(name, 8, T, "h200", T, model) == expected


def _graph2_inputs(T, H, s_kv, topk, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ql = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).cuda()
    qpe = torch.randn(T, H, 64, generator=g).to(torch.bfloat16).cuda()
    kv = torch.randn(s_kv, 1, 576, generator=g).to(torch.bfloat16).cuda()
    idx = torch.randint(-1, s_kv, (T, 1, topk), generator=g, dtype=torch.int32).cuda()
    tl = torch.clamp(torch.arange(1, T + 1, dtype=torch.int32), max=topk).cuda()
    return ql, qpe, kv, idx, tl


def test_graph2_graphed_outputs_equal_the_eager_loop_and_the_pr_path():
    """``subchunk:<S>:graph2`` on CUDA: the captured two-stream loop's outputs equal (bit for bit) the same loop run
    eagerly on the two streams and the PR's private workspace; a second call with new data in the same tensors
    replays the graph (same key) and is still equal; new tensors re-capture (new key)."""
    from mla_lab.strategies import PaddedQPath

    T, H, S = 2048, 8, 384  # 6 chunks, the last one short (128 rows)
    assert -(-T // S) == 6
    kw = dict(num_heads=H, max_num_batched_tokens=T, arch="hopper", device="cuda")
    graphed = PaddedQPath(f"subchunk:{S}:graph2", **kw)
    eager = PaddedQPath(f"subchunk:{S}:graph2", **kw, capture_graph=False)
    pr = PaddedQPath("private_workspace", **kw)
    ins = _graph2_inputs(T, H, 1024, 128, seed=0)
    sm = 576 ** -0.5
    for step in range(2):
        out_g, lse_g = (t.clone() for t in graphed(*ins[:4], sm, ins[4]))  # static buffers: keep a copy
        out_e, lse_e = eager(*ins[:4], sm, ins[4])
        out_p, lse_p = pr(*ins[:4], sm, ins[4])
        torch.cuda.synchronize()
        assert graphed._graph is not None and graphed._graph[0][0] == sm
        for a, b in ((out_g, out_e), (out_g, out_p)):
            assert torch.equal(a, b)
        finite = torch.isfinite(lse_p)
        assert torch.equal(lse_g[finite], lse_e[finite]) and torch.equal(lse_g[finite], lse_p[finite])
        assert torch.equal(torch.isinf(lse_g), torch.isinf(lse_p))
        key = graphed._graph[0]
        # new data in the same tensors: the same key replays
        fresh = _graph2_inputs(T, H, 1024, 128, seed=step + 1)
        for t, f in zip(ins, fresh):
            t.copy_(f)
    graphed(*ins[:4], sm, ins[4])
    assert graphed._graph[0] == key
    new = _graph2_inputs(T, H, 1024, 128, seed=9)  # new tensors: a new key, re-captured
    out_n = graphed(*new[:4], sm, new[4])[0].clone()
    assert graphed._graph[0] != key
    assert torch.equal(out_n, pr(*new[:4], sm, new[4])[0])
