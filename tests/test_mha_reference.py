"""The dense MHA route equals the sparse MQA route when top-k covers every earlier token (CPU, small shapes).

MLA with kv_b_proj ``W = [W_k; W_v]`` per head (``W_k [d_nope, L]``, ``W_v [d_v, L]``):

- sparse MQA (absorbed, FlashMLA math): ``q_abs = [W_k^T q_nope, q_pe]`` over ``kv = [kv_c, k_pe]`` with the top-k
  indices, latent output ``o_lat [T, H, L]``, then ``out = W_v o_lat``;
- dense MHA (up-projected, FlashAttention math): ``k = [W_k kv_c, k_pe]``, ``v = W_v kv_c``, ``q = [q_nope, q_pe]``,
  causal.

``q_nope . (W_k kv_c) = (W_k^T q_nope) . kv_c``, so the logits, the lse and the output agree when the top-k indices
of token i are exactly keys 0..i. Tolerances: lse (fp32 on both sides) 1e-4 abs; the output 2e-2 abs / 2e-2 rel,
because the sparse reference returns its latent output in bf16 (FlashMLA's output dtype) before ``W_v`` (bf16 keeps
8 bits of mantissa: ~0.4 % relative per element).
"""

from __future__ import annotations

import math

import pytest
import torch

from mla_lab.kernels.reference import mha_causal_varlen_ref, sparse_mla_prefill_ref

H, L, D_NOPE, D_ROPE, D_V = 4, 32, 16, 8, 24


def _mla(seqs, ctx, seed=0):
    """Random MLA tensors for sequences of ``seqs[b]`` queries after ``ctx[b]`` context tokens (fp32)."""
    g = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in zip(ctx, seqs)]
    Tk, T = sum(lens), sum(seqs)
    kv_c = torch.randn(Tk, L, generator=g)
    k_pe = torch.randn(Tk, D_ROPE, generator=g)
    q_nope = torch.randn(T, H, D_NOPE, generator=g)
    q_pe = torch.randn(T, H, D_ROPE, generator=g)
    W_k = torch.randn(H, D_NOPE, L, generator=g) / math.sqrt(L)
    W_v = torch.randn(H, D_V, L, generator=g) / math.sqrt(L)
    return dict(kv_c=kv_c, k_pe=k_pe, q_nope=q_nope, q_pe=q_pe, W_k=W_k, W_v=W_v, lens=lens)


def _sparse(t, seqs, ctx, topk, drop_key=None):
    """The absorbed sparse path with indices = every earlier key of the token (optionally dropping one key)."""
    q_abs = torch.cat([torch.einsum("thd,hdl->thl", t["q_nope"], t["W_k"]), t["q_pe"]], dim=-1)
    kv = torch.cat([t["kv_c"], t["k_pe"]], dim=-1)
    idx = torch.full((sum(seqs), topk), -1, dtype=torch.int32)
    row = 0
    k_off = 0
    for n, c, s in zip(seqs, ctx, t["lens"]):
        for i in range(n):
            keys = [k_off + j for j in range(c + i + 1) if (row, j) != drop_key]
            idx[row, :len(keys)] = torch.tensor(keys, dtype=torch.int32)
            row += 1
        k_off += s
    scale = 1.0 / math.sqrt(D_NOPE + D_ROPE)
    o_lat, _, lse = sparse_mla_prefill_ref(q_abs, kv, idx, scale, d_v=L)
    out = torch.einsum("thl,hvl->thv", o_lat.float(), t["W_v"])
    return out, lse


def _dense(t, seqs, ctx):
    k = torch.cat([torch.einsum("hdl,kl->khd", t["W_k"], t["kv_c"]),
                   t["k_pe"].unsqueeze(1).expand(-1, H, -1)], dim=-1)
    v = torch.einsum("hvl,kl->khv", t["W_v"], t["kv_c"])
    q = torch.cat([t["q_nope"], t["q_pe"]], dim=-1)
    cq = [0]
    ck = [0]
    for n, s in zip(seqs, t["lens"]):
        cq.append(cq[-1] + n)
        ck.append(ck[-1] + s)
    return mha_causal_varlen_ref(q, k, v, cq, ck, 1.0 / math.sqrt(D_NOPE + D_ROPE))


@pytest.mark.parametrize("seqs,ctx", [([7], [0]), ([5, 9, 1], [0, 0, 0]), ([4, 6], [3, 0])])
def test_mha_equals_sparse_when_topk_covers_every_key(seqs, ctx):
    t = _mla(seqs, ctx)
    topk = 16  # >= every sequence's length: top-k covers every earlier key
    assert max(t["lens"]) <= topk
    out_s, lse_s = _sparse(t, seqs, ctx, topk)
    out_d, lse_d = _dense(t, seqs, ctx)
    torch.testing.assert_close(lse_d, lse_s, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out_d, out_s, atol=2e-2, rtol=2e-2)


def test_the_comparison_sees_a_missing_key():
    """Not vacuous: drop one earlier key from one token's top-k and that token's result no longer matches."""
    seqs, ctx = [8], [0]
    t = _mla(seqs, ctx, seed=3)
    out_s, lse_s = _sparse(t, seqs, ctx, 16, drop_key=(7, 2))
    out_d, lse_d = _dense(t, seqs, ctx)
    assert (lse_d[7] - lse_s[7]).abs().max() > 1e-3
    torch.testing.assert_close(lse_d[:7], lse_s[:7], atol=1e-4, rtol=1e-5)


def test_mha_reference_causal_alignment():
    """A context of c tokens: query i attends keys 0..c+i (bottom-right aligned, FlashAttention varlen causal)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 4, generator=g)
    k = torch.randn(5, 1, 4, generator=g)
    v = torch.randn(5, 1, 3, generator=g)
    out, lse = mha_causal_varlen_ref(q, k, v, [0, 2], [0, 5], 0.5)
    P = (q[0, 0] @ k[:4, 0].T) * 0.5  # first query sits at position 3: keys 0..3
    torch.testing.assert_close(lse[0, 0], torch.logsumexp(P, 0))
    torch.testing.assert_close(out[0, 0], torch.softmax(P, 0) @ v[:4, 0])
