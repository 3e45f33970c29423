"""Property-based tests (hypothesis) of the padded-workspace allocator and of concat_mla_q over random shapes and
strides (issue 6).

Allocator: the padded head count is the *smallest* multiple of the arch's prefill_padding (64 Hopper, 128 Blackwell)
that is >= H for a bf16 KV cache, and exactly H for fp8 (vLLM PR #53878); the byte accounting of
``memory_account`` and ``QConcatWorkspace.nbytes`` follow ``rows x heads x head_size x element size``.

Concat: for T in 0..40, H in 1..16, H' >= H, bf16/fp16, inputs and output taken as slices or permuted views of
bigger tensors (arbitrary token/head strides, last dim contiguous), the real heads equal the inputs bit for bit,
padded heads keep their poisoned values (or become 0 with ``zero_padding``), and nothing outside the ``out`` view is
written.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mla_lab.arch import ARCHS, get_arch
from mla_lab.buffers import MIB, QConcatWorkspace, memory_account, padded_num_heads
from mla_lab.kernels import concat_mla_q
from mla_lab.placement import resolve_strategy

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ARCH_NAMES = sorted(ARCHS) + ["hopper", "blackwell", "sm90", "sm100"]
BF16_ALIASES = ["bf16", "auto", "bfloat16"]
FP8_ALIASES = ["fp8", "fp8_ds_mla", "fp8_e4m3"]

archs = st.sampled_from(ARCH_NAMES)
heads = st.integers(min_value=1, max_value=1024)


def _padding(arch: str) -> int:
    return 128 if get_arch(arch).family == "blackwell" else 64


# --------------------------------------------------------------------------------------------------- allocator


@FAST
@given(H=heads, arch=archs, kv=st.sampled_from(BF16_ALIASES))
def test_bf16_padding_is_smallest_allowed_multiple(H, arch, kv):
    p = _padding(arch)
    hp = padded_num_heads(H, arch, kv)
    assert hp % p == 0 and hp >= H
    assert hp - p < H  # no smaller multiple of p is >= H
    assert padded_num_heads(H, p, kv) == hp  # the padding itself as arch gives the same
    assert padded_num_heads(hp, arch, kv) == hp  # idempotent


@FAST
@given(H=heads, arch=st.one_of(archs, st.sampled_from([64, 128])), kv=st.sampled_from(FP8_ALIASES))
def test_fp8_is_never_padded(H, arch, kv):
    assert padded_num_heads(H, arch, kv) == H


@FAST
@given(H=heads, arch=archs, kv=st.sampled_from(["bf16", "fp8"]), mbt=st.integers(1, 131072),
       T_frac=st.floats(0, 1), head_size=st.sampled_from([576, 512, 192]), d_v=st.sampled_from([512, 128]))
def test_memory_account_bytes(H, arch, kv, mbt, T_frac, head_size, d_v):
    T = int(T_frac * mbt)
    hp = padded_num_heads(H, arch, kv)
    acc = {s: memory_account(resolve_strategy(s), H, mbt, arch, kv, num_tokens=T, head_size=head_size, d_v=d_v)
           for s in ("unfused", "fused", "kernel_native")}
    u, f, k = acc["unfused"], acc["fused"], acc["kernel_native"]
    # persistent: the Q-concat workspace, rows x heads x head_size x 2 bytes (bf16)
    assert u.persistent_bytes == mbt * H * head_size * 2 == k.persistent_bytes
    assert f.persistent_bytes == mbt * hp * head_size * 2
    assert f.persistent_bytes - u.persistent_bytes == mbt * (hp - H) * head_size * 2 >= 0
    if kv == "fp8":
        assert f.persistent_bytes == u.persistent_bytes and u.step_transient_bytes == 0
    # transient: only unfused with bf16 padding allocates the (T, H', head_size) pad tensor per step
    assert u.step_transient_bytes == (T * hp * head_size * 2 if hp != H else 0)
    assert f.step_transient_bytes == 0 and k.step_transient_bytes == 0
    # kernel outputs at the heads the kernel runs: out bf16 + lse and max_logits fp32
    assert u.kernel_out_bytes == f.kernel_out_bytes == T * hp * (d_v * 2 + 2 * 4)
    assert k.kernel_out_bytes == T * H * (d_v * 2 + 2 * 4)
    for a in acc.values():
        assert a.peak_bytes == a.persistent_bytes + a.step_transient_bytes + a.kernel_out_bytes
        assert a.num_tokens == T and a.num_heads == H


@FAST
@given(H=st.integers(1, 300), arch=archs, kv=st.sampled_from(["bf16", "fp8"]), mbt=st.integers(1, 70000),
       pad=st.booleans(), dtype=st.sampled_from([torch.bfloat16, torch.float16]),
       head_size=st.sampled_from([576, 512]))
def test_workspace_nbytes(H, arch, kv, mbt, pad, dtype, head_size):
    # meta device: shapes and strides without allocating (up to ~70000 x 384 x 576 x 2 bytes)
    ws = QConcatWorkspace(mbt, H, arch, kv, head_size=head_size, device="meta", dtype=dtype, pad=pad)
    heads_expected = padded_num_heads(H, arch, kv) if pad else H
    assert ws.q_concat_heads == heads_expected
    assert tuple(ws.buffer.shape) == (mbt, heads_expected, head_size)
    assert ws.nbytes == mbt * heads_expected * head_size * 2
    strategy = "private_workspace" if pad else "per_call_empty:zeros"
    assert ws.nbytes == memory_account(strategy, H, mbt, arch, kv, head_size=head_size).persistent_bytes
    T = mbt // 2
    assert tuple(ws.view(T).shape) == (T, heads_expected, head_size)
    assert f"{ws.nbytes / MIB:.1f} MiB" in repr(ws)


def test_seed_value_is_an_instance_of_the_property():
    # vLLM PR #53878's workspace: 16384 x (64 - 8) x 1152 B = 1008 MiB
    f = memory_account("private_workspace", 8, 16384, "h200", "bf16")
    u = memory_account("per_call_empty:zeros", 8, 16384, "h200", "bf16")
    assert (f.persistent_bytes - u.persistent_bytes) / MIB == 1008
    assert math.ceil(8 / 64) * 64 == padded_num_heads(8, "h200") == 64


# ------------------------------------------------------------------------------------------------------- concat


@st.composite
def strided(draw, T: int, heads: int, dim: int, dtype, gen: torch.Generator):
    """A ``[T, heads, dim]`` tensor with random token/head strides and a contiguous last dim: a slice of a bigger
    tensor (extra tokens, heads and columns, random offsets), optionally with the token and head dims stored in
    the other order (a permuted view). Returns ``(view, base)``."""
    et, eh, ec = draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.sampled_from([0, 8, 64]))
    ot, oh, oc = draw(st.integers(0, et)), draw(st.integers(0, eh)), draw(st.integers(0, ec))
    heads_major = draw(st.booleans())
    if heads_major:
        base = torch.randn(heads + eh, T + et, dim + ec, generator=gen).to(dtype)
        view = base.transpose(0, 1)[ot:ot + T, oh:oh + heads, oc:oc + dim]
    else:
        base = torch.randn(T + et, heads + eh, dim + ec, generator=gen).to(dtype)
        view = base[ot:ot + T, oh:oh + heads, oc:oc + dim]
    assert tuple(view.shape) == (T, heads, dim) and (view.numel() == 0 or view.stride(-1) == 1)
    return view, base


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), T=st.integers(0, 40), H=st.integers(1, 16), extra=st.integers(0, 20),
       dtype=st.sampled_from([torch.bfloat16, torch.float16]), zero_padding=st.booleans(), seed=st.integers(0, 2**16))
def test_concat_real_heads_equal_inputs_padded_heads_untouched(data, T, H, extra, dtype, zero_padding, seed):
    Hp = H + extra
    gen = torch.Generator().manual_seed(seed)
    nope, _ = data.draw(strided(T, H, 512, dtype, gen), label="ql_nope")
    pe, _ = data.draw(strided(T, H, 64, dtype, gen), label="q_pe")
    out, out_base = data.draw(strided(T, Hp, 576, dtype, gen), label="out")
    out_base.fill_(float("nan"))  # poison: padded heads and everything outside the view
    assert out_base.is_contiguous()
    nope_before, pe_before = nope.clone(), pe.clone()

    ret = concat_mla_q(nope, pe, out, zero_padding=zero_padding, backend="torch")

    assert ret is out
    # real heads are the inputs, bit for bit
    assert torch.equal(out[:, :H, :512], nope) and torch.equal(out[:, :H, 512:], pe)
    # padded heads: untouched poison (vLLM), or zeros with zero_padding
    pad = out[:, H:]
    if zero_padding:
        assert (pad == 0).all()
    else:
        assert torch.isnan(pad).all()
    # inputs are not modified
    assert torch.equal(nope, nope_before) and torch.equal(pe, pe_before)
    # nothing outside the out view was written (the base is contiguous: mark the view's elements in a mask)
    mask = torch.ones(out_base.shape, dtype=torch.bool)
    mask.as_strided(out.shape, out.stride(), out.storage_offset()).fill_(False)
    assert torch.isnan(out_base[mask]).all()
