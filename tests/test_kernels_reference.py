"""Sparse MLA prefill reference (FlashMLA tests/ref.py math) against a naive per-token, per-head float64 loop;
the public sparse_mla_prefill API's validation, slicing and backend choice; the flash_mla contract check (which
takes the GPU capability as an argument, so it is tested here on CPU tensors)."""

from __future__ import annotations

import math

import pytest
import torch

from mla_lab.kernels import (
    flash_mla_info,
    last_backend,
    sparse_mla_prefill,
    sparse_mla_prefill_ref,
    validate_sparse_prefill_inputs,
)
from mla_lab.kernels.reference import default_chunk_tokens


def naive_sparse_prefill(q, kv, indices, sm_scale, d_v, topk_length=None):
    """One (token, head) at a time in float64, from the definition; no vectorised masking tricks."""
    s_q, h_q, d_qk = q.shape
    kv2 = kv.reshape(kv.shape[0], -1).double()
    s_kv = kv2.shape[0]
    idx = indices.reshape(s_q, -1)
    topk = idx.shape[1]
    out = torch.zeros(s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.empty(s_q, h_q, dtype=torch.float64)
    mx = torch.empty(s_q, h_q, dtype=torch.float64)
    for i in range(s_q):
        n = topk if topk_length is None else int(topk_length[i])
        valid = [int(idx[i, j]) for j in range(min(max(n, 0), topk)) if 0 <= int(idx[i, j]) < s_kv]
        for h in range(h_q):
            if not valid:
                lse[i, h], mx[i, h] = math.inf, -math.inf
                continue
            qi = q[i, h].double()
            logits = [float(qi @ kv2[r]) * sm_scale for r in valid]
            m = max(logits)
            s = sum(math.exp(x - m) for x in logits)
            lse[i, h] = m + math.log(s)
            mx[i, h] = m
            for x, r in zip(logits, valid):
                out[i, h] += math.exp(x - lse[i, h].item()) * kv2[r, :d_v]
    return out, mx, lse


def _inputs(s_q, h_q, d_qk, s_kv, topk, seed, dtype=torch.bfloat16, p_invalid=0.2):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h_q, d_qk, generator=g).to(dtype)
    kv = torch.randn(s_kv, 1, d_qk, generator=g).to(dtype)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=g, dtype=torch.int32)
    r = torch.rand(s_q, 1, topk, generator=g)
    idx[r < p_invalid / 2] = -1  # FlashMLA's invalid marker
    idx[(r >= p_invalid / 2) & (r < p_invalid)] = s_kv + 3  # >= s_kv is invalid too
    return q, kv, idx


def _assert_matches_naive(got, ref):
    out, mx, lse = got
    n_out, n_mx, n_lse = ref
    assert out.dtype == torch.bfloat16 and mx.dtype == torch.float32 and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any() and not mx.isnan().any()
    # bf16 output: within half an ulp of bf16 (2**-8 relative) of the float64 value, plus fp32 noise.
    torch.testing.assert_close(out.double(), n_out, rtol=2**-8, atol=1e-5)
    torch.testing.assert_close(lse.double(), n_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mx.double(), n_mx, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "s_q,h_q,d_qk,d_v,s_kv,topk",
    [
        (1, 1, 16, 8, 5, 4),
        (5, 3, 64, 32, 40, 16),
        (4, 2, 576, 512, 64, 32),
        (3, 4, 512, 512, 20, 8),
        (6, 2, 32, 32, 7, 24),  # topk > s_kv: repeated rows
    ],
)
@pytest.mark.parametrize("with_topk_length", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ref_vs_naive(s_q, h_q, d_qk, d_v, s_kv, topk, with_topk_length, dtype):
    q, kv, idx = _inputs(s_q, h_q, d_qk, s_kv, topk, seed=s_q * 100 + topk, dtype=dtype)
    tl = None
    if with_topk_length:
        g = torch.Generator().manual_seed(3)
        tl = torch.randint(0, topk + 3, (s_q,), generator=g, dtype=torch.int32)  # incl. 0 and > topk
        tl[0] = 0
    scale = 1.0 / math.sqrt(d_qk)
    got = sparse_mla_prefill_ref(q, kv, idx, scale, d_v=d_v, topk_length=tl)
    _assert_matches_naive(got, naive_sparse_prefill(q, kv, idx, scale, d_v, tl))
    assert got[0].shape == (s_q, h_q, d_v)


def test_ref_empty_rows_and_invalid_indices():
    s_q, h_q, d_qk, s_kv, topk = 5, 3, 64, 10, 8
    q, kv, idx = _inputs(s_q, h_q, d_qk, s_kv, topk, seed=11, p_invalid=0.0)
    idx[0] = -1  # all -1
    idx[1] = s_kv  # all >= s_kv
    idx[2, 0, ::2] = -7  # other negatives are invalid too
    tl = torch.tensor([topk, topk, topk, 0, 3], dtype=torch.int32)  # token 3: topk_length 0 -> empty
    out, mx, lse = sparse_mla_prefill_ref(q, kv, idx, 0.125, d_v=64, topk_length=tl)
    for i in (0, 1, 3):
        assert torch.equal(out[i], torch.zeros_like(out[i])), i
        assert torch.isposinf(lse[i]).all() and torch.isneginf(mx[i]).all(), i
    assert torch.isfinite(lse[[2, 4]]).all()
    _assert_matches_naive((out, mx, lse), naive_sparse_prefill(q, kv, idx, 0.125, 64, tl))


def test_ref_only_first_topk_length_used():
    """Indices past topk_length[i] must not matter, whatever they point at."""
    q, kv, idx = _inputs(4, 2, 64, 30, 16, seed=5, p_invalid=0.0)
    tl = torch.tensor([16, 5, 1, 9], dtype=torch.int32)
    idx2 = idx.clone()
    for i, n in enumerate(tl.tolist()):
        idx2[i, 0, n:] = torch.randint(0, 30, (16 - n,), dtype=torch.int32)
    a = sparse_mla_prefill_ref(q, kv, idx, 0.1, d_v=64, topk_length=tl)
    b = sparse_mla_prefill_ref(q, kv, idx2, 0.1, d_v=64, topk_length=tl)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    assert not torch.equal(idx, idx2)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_ref_chunking_identical(chunk):
    q, kv, idx = _inputs(7, 4, 576, 50, 32, seed=chunk)
    tl = torch.tensor([32, 0, 5, 32, 17, 31, 1], dtype=torch.int32)
    one = sparse_mla_prefill_ref(q, kv, idx, 0.07, topk_length=tl, chunk_tokens=10**6)
    many = sparse_mla_prefill_ref(q, kv, idx, 0.07, topk_length=tl, chunk_tokens=chunk)
    for x, y in zip(one, many):
        assert torch.equal(x, y)


def test_ref_default_chunk_bounds_memory():
    for h_q, topk, d_qk in [(64, 2048, 576), (128, 2048, 576), (8, 128, 576), (128, 64, 512)]:
        c = default_chunk_tokens(h_q, topk, d_qk)
        assert c >= 1
        assert c * topk * d_qk * 4 <= 256 * 1024**2
        assert c * 2 * h_q * topk * 4 <= 256 * 1024**2
        # and it is not needlessly small: one more token would cross the budget
        assert (c + 1) * max(topk * d_qk * 4, 2 * h_q * topk * 4) > 256 * 1024**2


def test_ref_accepts_2d_kv_and_indices():
    q, kv, idx = _inputs(3, 2, 64, 12, 8, seed=9)
    a = sparse_mla_prefill_ref(q, kv, idx, 0.2, d_v=64)
    b = sparse_mla_prefill_ref(q, kv[:, 0], idx[:, 0], 0.2, d_v=64)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_ref_zero_tokens_and_zero_topk():
    q, kv, idx = _inputs(0, 2, 64, 12, 8, seed=1)
    out, mx, lse = sparse_mla_prefill_ref(q, kv, idx, 0.2, d_v=64)
    assert out.shape == (0, 2, 64) and mx.shape == (0, 2) and lse.shape == (0, 2)
    q, kv, _ = _inputs(2, 2, 64, 12, 8, seed=1)
    out, mx, lse = sparse_mla_prefill_ref(q, kv, torch.empty(2, 1, 0, dtype=torch.int32), 0.2, d_v=64)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isposinf(lse).all() and torch.isneginf(mx).all()


def test_ref_nan_propagates_like_the_math():
    q, kv, idx = _inputs(3, 2, 64, 12, 8, seed=2, p_invalid=0.0)
    q[0, 1, 5] = float("nan")  # token 0, head 1 only
    idx[2, 0, :] = 0
    idx[2, 0, 3] = 7
    kv[7, 0, 0] = float("nan")  # referenced by token 2 (valid), not by token 1 unless randomly picked
    idx[1, 0] = torch.where(idx[1, 0] == 7, torch.zeros_like(idx[1, 0]), idx[1, 0])
    out, mx, lse = sparse_mla_prefill_ref(q, kv, idx, 0.1, d_v=64)
    assert out[0, 1].isnan().all() and lse[0, 1].isnan() and mx[0, 1].isnan()
    assert not out[0, 0].isnan().any() and torch.isfinite(lse[0, 0])
    assert out[2].isnan().all() and lse[2].isnan().all()
    assert not out[1].isnan().any() and torch.isfinite(lse[1]).all()


def test_ref_nan_in_row_only_invalid_entries_point_at_is_not_read():
    q, kv, idx = _inputs(2, 2, 64, 12, 8, seed=4, p_invalid=0.0)
    idx = idx.clamp_min(1)  # no valid entry points at row 0
    idx[0, 0, :3] = -1  # invalid entries (FlashMLA's ref would gather row 0 for them)
    kv[0] = float("nan")
    out, mx, lse = sparse_mla_prefill_ref(q, kv, idx, 0.1, d_v=64)
    assert not out.isnan().any() and torch.isfinite(lse).all()


# ----------------------------------------------------------------------------------------------- public API

def test_api_reference_slices_views_and_records_backend():
    q, kv, idx = _inputs(4, 64, 576, 300, 128, seed=21)
    tl = torch.tensor([128, 0, 70, 3], dtype=torch.int32)
    full = sparse_mla_prefill(q, kv, idx, 0.05, topk_length=tl, backend="reference")
    assert last_backend("sparse_mla_prefill") == "reference"
    out, mx, lse = sparse_mla_prefill(q, kv, idx, 0.05, topk_length=tl, actual_num_heads=8)
    assert last_backend("sparse_mla_prefill") == "reference"  # auto on CPU
    assert out.shape == (4, 8, 512) and mx.shape == (4, 8) and lse.shape == (4, 8)
    assert out._base is not None and lse._base is not None  # views of the full outputs, as in vLLM
    assert torch.equal(out, full[0][:, :8]) and torch.equal(lse, full[2][:, :8]) and torch.equal(mx, full[1][:, :8])
    # padded heads do not change the real heads' results, to rounding: the reference's CPU bmm over 64 vs 8 heads
    # may block its sums differently (1 bf16 ulp here: MKL on an AVX2 machine; bit-equal on others)
    small = sparse_mla_prefill(q[:, :8].contiguous(), kv, idx, 0.05, topk_length=tl)
    for x, y in zip(small, (out, mx, lse)):
        torch.testing.assert_close(x, y, equal_nan=True)  # bf16: rtol 1.6e-2; fp32: rtol 1.3e-6, atol 1e-5


def _ok_prefill():
    return _inputs(3, 4, 64, 16, 8, seed=0)


PREFILL_ERRORS = [
    ("q_rank", dict(q=lambda q: q[0]), "q must be a 3-D tensor"),
    ("q_dtype", dict(q=lambda q: q.to(torch.int32)), "q.dtype must be bfloat16"),
    ("kv_rank", dict(kv=lambda kv: kv[0, 0]), "kv must be [s_kv, 1, d_qk] or [s_kv, d_qk]; got kv.shape=(64,)"),
    ("kv_hkv", dict(kv=lambda kv: kv.expand(16, 2, 64)), "kv.shape[1] (h_kv) must be 1; got kv.shape=(16, 2, 64)"),
    ("kv_width", dict(kv=lambda kv: kv[..., :32]), "kv.shape[-1] must equal q.shape[-1]=64"),
    ("kv_dtype", dict(kv=lambda kv: kv.float()), "kv.dtype must equal q.dtype=torch.bfloat16; got kv.dtype=torch.float32"),
    ("idx_rank", dict(indices=lambda i: i[0, 0]), "indices must be [s_q, 1, topk] or [s_q, topk]; got indices.shape=(8,)"),
    ("idx_hkv", dict(indices=lambda i: i.expand(3, 2, 8)), "indices.shape[1] must be 1"),
    ("idx_sq", dict(indices=lambda i: i[:2]), "indices.shape[0] must equal s_q=3"),
    ("idx_dtype", dict(indices=lambda i: i.long()), "indices.dtype must be torch.int32; got torch.int64"),
    ("d_v", dict(d_v=100), "d_v must be an int in [1, d_qk=64] (FlashMLA: 512); got d_v=100"),
    ("sm_scale", dict(sm_scale="x"), "sm_scale must be a float; got sm_scale='x'"),
    ("tl_shape", dict(topk_length=torch.zeros(2, dtype=torch.int32)), "topk_length must be a 1-D tensor [s_q=3]"),
    ("tl_dtype", dict(topk_length=torch.zeros(3, dtype=torch.int64)), "topk_length.dtype must be torch.int32"),
    ("heads_0", dict(actual_num_heads=0), "actual_num_heads must be an int in [1, h_q=4]; got 0"),
    ("heads_big", dict(actual_num_heads=5), "actual_num_heads must be an int in [1, h_q=4]; got 5"),
    ("device", dict(kv=lambda kv: torch.empty(16, 1, 64, dtype=kv.dtype, device="meta")), "must be on one device"),
    ("backend", dict(backend="cutlass"), "backend='cutlass' is not known; allowed: ['auto', 'flash_mla', 'reference']"),
]


@pytest.mark.parametrize("name,change,message", PREFILL_ERRORS, ids=[c[0] for c in PREFILL_ERRORS])
def test_api_prefill_errors(name, change, message):
    q, kv, idx = _ok_prefill()
    args = dict(q=q, kv=kv, indices=idx, sm_scale=0.1, d_v=64)
    for k, v in change.items():
        args[k] = v(args[k]) if callable(v) else v
    with pytest.raises(ValueError) as ei:
        sparse_mla_prefill(**args)
    assert message in str(ei.value), str(ei.value)


def test_api_flash_backend_on_cpu_raises():
    q, kv, idx = _inputs(2, 64, 576, 16, 128, seed=0)
    info = flash_mla_info()
    exc = ValueError if info["available"] else RuntimeError
    with pytest.raises(exc) as ei:
        sparse_mla_prefill(q, kv, idx, 0.1, backend="flash_mla")
    if not info["available"]:
        assert "flash_mla backend unavailable" in str(ei.value) and info["reason"] in str(ei.value)
    else:
        assert "needs CUDA tensors" in str(ei.value)


def test_flash_mla_info_shape():
    info = flash_mla_info()
    for k in ("available", "provider", "version", "reason", "has_sparse_fwd", "takes_use_legacy"):
        assert k in info
    if info["available"]:
        assert info["provider"] and info["version"] and info["reason"] is None
    else:
        assert isinstance(info["reason"], str) and info["reason"]


# ------------------------------------------------------------------------------------- flash_mla contract

def _valid(s_q=4, h_q=64, d_qk=576, topk=128, s_kv=256):
    q = torch.zeros(s_q, h_q, d_qk, dtype=torch.bfloat16)
    kv = torch.zeros(s_kv, 1, d_qk, dtype=torch.bfloat16)
    idx = torch.zeros(s_q, 1, topk, dtype=torch.int32)
    tl = torch.zeros(s_q, dtype=torch.int32)
    return q, kv, idx, tl


@pytest.mark.parametrize("cap,h_q,d_qk,topk", [
    ((9, 0), 64, 576, 128), ((9, 0), 128, 512, 2048), ((10, 0), 64, 576, 64), ((10, 0), 128, 576, 192),
])
def test_contract_accepts_valid(cap, h_q, d_qk, topk):
    q, kv, idx, tl = _valid(h_q=h_q, d_qk=d_qk, topk=topk)
    validate_sparse_prefill_inputs(q, kv, idx, tl, 512, cap)
    validate_sparse_prefill_inputs(q, kv[:, 0], idx[:, 0], None, 512, cap)  # 2-D kv / indices are viewed


CONTRACT_ERRORS = [
    ("arch", {}, (8, 0), "capability major 9 or 10; got arch_capability=(8, 0)"),
    ("q_dtype", {"q": lambda t: t.half()}, (9, 0), "q must be bfloat16; got q.dtype=torch.float16"),
    ("q_rank", {"q": lambda t: t[0]}, (9, 0), "q must be a 3-D tensor [s_q, h_q, d_qk]; got q.shape=(64, 576)"),
    ("d_qk", {"q": lambda t: t[..., :256], "kv": lambda t: t[..., :256]}, (9, 0),
     "d_qk (q.shape[-1]) must be one of (576, 512); got q.shape=(4, 64, 256)"),
    ("h_q_sm90", {"q": lambda t: t[:, :8]}, (9, 0), "h_q must be one of (64, 128) on sm90"),
    ("h_q_192", {"q": lambda t: torch.cat([t, t, t], 1)}, (9, 0), "got q.shape[1] (h_q)=192"),
    ("h_q_sm100", {"q": lambda t: t[:, :16]}, (10, 0), "h_q must be one of (64, 128) on sm100 (pad the heads: vLLM prefill_padding); got q.shape[1] (h_q)=16"),
    ("q_stride", {"q": lambda t: torch.zeros(4, 64, 1152, dtype=t.dtype)[..., ::2]}, (9, 0),
     "q's last dim must be contiguous"),
    ("d_v", {"d_v": 256}, (9, 0), "d_v must be one of (512,); got d_v=256"),
    ("kv_dtype", {"kv": lambda t: t.float()}, (9, 0), "kv must be bfloat16; got kv.dtype=torch.float32"),
    ("kv_hkv", {"kv": lambda t: t.expand(256, 2, 576)}, (9, 0), "kv must have h_kv == 1"),
    ("kv_width", {"kv": lambda t: t[..., :512]}, (9, 0), "kv.shape[-1] must equal q's d_qk=576"),
    ("idx_dtype", {"indices": lambda t: t.long()}, (9, 0), "indices must be int32; got indices.dtype=torch.int64"),
    ("idx_sq", {"indices": lambda t: t[:3]}, (9, 0), "indices.shape[0] must equal q's s_q=4"),
    ("idx_hkv", {"indices": lambda t: t.expand(4, 2, 128)}, (9, 0), "indices must be [s_q, 1, topk]"),
    ("topk_sm90", {"indices": lambda t: t[..., :64]}, (9, 0),
     "topk (indices.shape[-1]) must be a positive multiple of 128 on sm90; got indices.shape=(4, 1, 64)"),
    ("topk_sm100", {"indices": lambda t: t[..., :96]}, (10, 0), "multiple of 64 on sm100; got indices.shape=(4, 1, 96)"),
    ("topk_zero", {"indices": lambda t: t[..., :0]}, (10, 0), "positive multiple of 64"),
    ("tl_dtype", {"topk_length": lambda t: t.long()}, (9, 0), "topk_length must be int32"),
    ("tl_shape", {"topk_length": lambda t: t[:2]}, (9, 0), "topk_length must be a 1-D tensor [s_q=4]"),
    ("device", {"topk_length": lambda t: torch.empty(4, dtype=t.dtype, device="meta")}, (9, 0),
     "all tensors must be on one device"),
]


@pytest.mark.parametrize("name,change,cap,message", CONTRACT_ERRORS, ids=[c[0] for c in CONTRACT_ERRORS])
def test_contract_violations(name, change, cap, message):
    q, kv, idx, tl = _valid()
    args = {"q": q, "kv": kv, "indices": idx, "topk_length": tl, "d_v": 512, "arch_capability": cap}
    for k, v in change.items():
        args[k] = v(args[k]) if callable(v) else v
    with pytest.raises(ValueError) as ei:
        validate_sparse_prefill_inputs(**args)
    assert "flash_mla_sparse_fwd contract" in str(ei.value)
    assert message in str(ei.value), str(ei.value)
