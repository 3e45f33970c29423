"""GPU checks: the Triton concat kernel against torch on CUDA, and FlashMLA sparse prefill against the reference.

All tests here except the NaN-metric self-test are marked ``gpu`` and skipped (with the reason) when
``torch.cuda.is_available()`` is False; the flash_mla tests also skip, with ``flash_mla_info()['reason']``, when
no ``flash_mla`` provider imports. On a GPU machine run them with ``MLA_LAB_REQUIRE_GPU=1`` (``make test-gpu``):
tests/conftest.py then turns every such skip into a failure, so a missing provider cannot pass silently; each
flash_mla test also asserts that the flash_mla backend (not the torch reference) ran. Inputs are fresh random tensors (never zeros); outputs are NaN-poisoned before
each call; copies are compared bitwise; attention by ``||out - ref|| / ||ref||`` (bf16: < 1e-2), where any NaN
counts as a failure.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from mla_lab.kernels import concat_mla_q, flash_mla_info, last_backend, sparse_mla_prefill, sparse_mla_prefill_ref

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch.cuda.is_available() is False: no CUDA GPU on this machine")
gpu = [pytest.mark.gpu, needs_cuda]


_REPORT: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _dump_report():
    """With env MLA_LAB_TEST_REPORT=path, write the measured errors of the flash_mla checks there (JSON lines)."""
    yield
    import json
    import os

    path = os.environ.get("MLA_LAB_TEST_REPORT")
    if path and _REPORT:
        with open(path, "a") as f:
            for row in _REPORT:
                f.write(json.dumps(row) + "\n")


def _close(name, got, ref, rtol=1e-3, atol=1e-3):
    """assert_close with a diagnostic: the median ratio got/ref (1.4427 would mean log2 vs natural log)."""
    try:
        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    except AssertionError as e:
        ratio = (got.double() / ref.double()).median().item() if got.numel() else float("nan")
        raise AssertionError(f"{name}: median({name}/ref)={ratio:.5f}; {e}") from None


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in float64; ``inf`` if either side has a NaN (NaN never passes)."""
    x, ref = x.double(), ref.double()
    if x.isnan().any() or ref.isnan().any():
        return math.inf
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def test_rel_err_rejects_nan():
    a = torch.randn(10)
    b = a.clone()
    assert rel_err(a, b) == 0.0
    b[3] = float("nan")
    assert rel_err(a, b) == math.inf and not rel_err(a, b) < 1e-2
    assert rel_err(b, a) == math.inf


# ------------------------------------------------------------------------------------------------ concat (Triton)

def _bits(t):
    return t.contiguous().view(torch.int16)


def _check_concat(a, b, out, before, zero_padding):
    H = a.shape[1]
    assert torch.equal(_bits(out[:, :H]), _bits(torch.cat([a, b], dim=-1))), "real heads differ from torch.cat"
    if zero_padding:
        assert torch.equal(_bits(out[:, H:]), torch.zeros_like(_bits(out[:, H:]))), "padded heads not zeroed"
    else:
        assert torch.equal(_bits(out[:, H:]), _bits(before[:, H:])), "padded heads were touched"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T", [0, 1, 7, 1000, 4096])
@pytest.mark.parametrize("H,Hp", [(8, 64), (16, 64), (32, 64), (64, 64), (128, 128), (5, 8)])
@pytest.mark.parametrize("zero_padding", [False, True])
@pytest.mark.gpu
@needs_cuda
def test_gpu_triton_concat_grid(dtype, T, H, Hp, zero_padding):
    a = torch.randn(T, H, 512, device="cuda", dtype=dtype)
    b = torch.randn(T, H, 64, device="cuda", dtype=dtype)
    out = torch.full((T, Hp, 576), float("nan"), device="cuda", dtype=dtype)
    before = out.clone()
    concat_mla_q(a, b, out, zero_padding=zero_padding)
    torch.cuda.synchronize()
    assert last_backend("concat_mla_q") == "triton"
    _check_concat(a, b, out, before, zero_padding)


@pytest.mark.parametrize("layout", ["vllm", "slices", "transposed_out", "odd_stride"])
@pytest.mark.parametrize("zero_padding", [False, True])
@pytest.mark.gpu
@needs_cuda
def test_gpu_triton_concat_strided(layout, zero_padding):
    T, H, Hp, dt = 777, 8, 64, torch.bfloat16
    dev = "cuda"
    ws = None
    if layout == "vllm":  # ql_nope from a head-major bmm, q_pe a slice of q [T, H, 192 + 64] (GLM-5 geometry)
        a = torch.randn(H, T, 512, device=dev, dtype=dt).transpose(0, 1)
        b = torch.randn(T, H, 256, device=dev, dtype=dt)[..., 192:]
    elif layout == "slices":
        big = torch.randn(2 * T + 1, H + 2, 640, device=dev, dtype=dt)
        a, b = big[: 2 * T : 2, 1 : H + 1, :512], big[1 : T + 1, :H, 576:]
    elif layout == "odd_stride":  # row stride 579 elements: no 16-byte alignment, kernel must still be right
        x = torch.randn(T, H, 579, device=dev, dtype=dt)
        a, b = x[..., :512], x[..., 515:]
    else:
        a = torch.randn(T, H, 512, device=dev, dtype=dt)
        b = torch.randn(T, H, 64, device=dev, dtype=dt)
    if layout in ("transposed_out", "slices"):
        ws = torch.full((Hp + 2, T + 3, 576), float("nan"), device=dev, dtype=dt)
        out = ws[1 : Hp + 1, :T].transpose(0, 1)
    else:
        out = torch.full((T, Hp, 576), float("nan"), device=dev, dtype=dt)
    before = out.clone()
    concat_mla_q(a, b, out, zero_padding=zero_padding, backend="triton")
    torch.cuda.synchronize()
    _check_concat(a, b, out, before, zero_padding)
    if ws is not None:
        outside = torch.ones(ws.shape[:2], dtype=torch.bool, device=dev)
        outside[1 : Hp + 1, :T] = False
        assert ws[outside].isnan().all(), "kernel wrote outside the out view"


@pytest.mark.parametrize("H,Hp,zero_padding", [(8, 64, False), (8, 64, True), (128, 128, False)])
@pytest.mark.gpu
@needs_cuda
def test_gpu_triton_concat_large_T_int64_offsets(H, Hp, zero_padding):
    """T = 131072: out has T*H'*576 > 2**31 elements, so 32-bit offsets would wrap."""
    T, dt = 131072, torch.bfloat16
    assert T * Hp * 576 > 2**31
    a = torch.randn(T, H, 512, device="cuda", dtype=dt)
    b = torch.randn(T, H, 64, device="cuda", dtype=dt)
    out = torch.full((T, Hp, 576), float("nan"), device="cuda", dtype=dt)
    # Check the tail of the buffer (where wrapped offsets would land elsewhere) and the whole real part.
    concat_mla_q(a, b, out, zero_padding=zero_padding, backend="triton")
    torch.cuda.synchronize()
    assert torch.equal(_bits(out[:, :H, :512]), _bits(a)) and torch.equal(_bits(out[:, :H, 512:]), _bits(b))
    if Hp > H:
        pad = out[:, H:]
        if zero_padding:
            assert (_bits(pad) == 0).all()
        else:
            assert pad.isnan().all()
    del a, b, out
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ flash_mla vs reference

def _need_flash():
    info = flash_mla_info()
    if not info["available"]:
        pytest.skip(f"flash_mla unavailable: {info['reason']}")
    major = torch.cuda.get_device_capability()[0]
    if major not in (9, 10):
        pytest.skip(f"flash_mla sparse prefill needs sm90/sm100; this GPU is capability {major}.x")
    return info


def _prefill_case(s_q, h_real, h_pad, s_kv, topk, with_topk_length, seed, poison_pad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(s_q, h_pad, 576, device=dev, dtype=dt, generator=g)
    if poison_pad and h_pad > h_real:
        # vLLM leaves the padded heads uninitialised; NaN there must not reach the real heads.
        q[:, h_real:] = float("nan")
    elif h_pad > h_real:
        q[:, h_real:] *= 50.0  # garbage of another scale in the padded heads
    kv = torch.randn(s_kv, 1, 576, device=dev, dtype=dt, generator=g)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), device=dev, dtype=torch.int32, generator=g)
    r = torch.rand(s_q, 1, topk, device=dev, generator=g)
    idx[r < 0.05] = -1
    idx[(r >= 0.05) & (r < 0.1)] = s_kv + 5
    idx[1] = -1  # a token with no valid index at all
    idx[2] = s_kv  # ... and one whose indices are all >= s_kv
    tl = None
    if with_topk_length:
        tl = torch.randint(1, topk + 1, (s_q,), device=dev, dtype=torch.int32, generator=g)
        tl[3] = 0  # empty by topk_length
        tl[4] = topk
    return q, kv, idx, tl


@pytest.mark.parametrize("h_real,h_pad", [(8, 64), (16, 64), (16, 128), (64, 64), (128, 128)])
@pytest.mark.parametrize("with_topk_length", [False, True])
@pytest.mark.parametrize("topk", [128, 2048])
@pytest.mark.gpu
@needs_cuda
def test_gpu_flash_mla_vs_reference(h_real, h_pad, with_topk_length, topk):
    _need_flash()
    s_q, s_kv = 192, 4096
    q, kv, idx, tl = _prefill_case(s_q, h_real, h_pad, s_kv, topk, with_topk_length, seed=h_pad * 7 + topk)
    scale = 1.0 / math.sqrt(192 + 64)  # GLM-5: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
    out, mx, lse = sparse_mla_prefill(q, kv, idx, scale, topk_length=tl, actual_num_heads=h_real)
    torch.cuda.synchronize()
    assert last_backend("sparse_mla_prefill") == "flash_mla"
    assert out.shape == (s_q, h_real, 512) and lse.shape == (s_q, h_real) and mx.shape == (s_q, h_real)
    r_out, r_mx, r_lse = sparse_mla_prefill_ref(q[:, :h_real].contiguous(), kv, idx, scale, topk_length=tl)

    e = rel_err(out, r_out)
    fin = torch.isfinite(r_lse)
    _REPORT.append({"test": "flash_vs_ref", "h_real": h_real, "h_pad": h_pad, "topk": topk, "s_q": s_q,
                    "s_kv": s_kv, "topk_length": with_topk_length, "rel_err_out": e,
                    "max_abs_err_lse": (lse[fin] - r_lse[fin]).abs().max().item(),
                    "max_abs_err_max_logits": (mx[fin] - r_mx[fin]).abs().max().item(),
                    "empty_rows_lse_posinf": bool(torch.isposinf(lse[~fin]).all()),
                    "empty_rows_out_zero": bool((out[~fin] == 0).all()),
                    "empty_rows_max_logits": sorted({str(v) for v in mx[~fin].flatten().tolist()})})
    assert e < 1e-2, f"rel err out {e}"
    empty = torch.isposinf(r_lse)
    assert empty[1].all() and empty[2].all()
    if tl is not None:
        assert empty[3].all()
    assert torch.equal(torch.isposinf(lse), empty), "empty rows: flash_mla lse must be +inf exactly there"
    assert (out[empty] == 0).all(), "empty rows must give out = 0"
    fin = ~empty
    assert not lse.isnan().any() and not mx[fin].isnan().any()
    _close("lse", lse[fin], r_lse[fin])
    _close("max_logits", mx[fin], r_mx[fin])


@pytest.mark.parametrize("h_real,h_pad", [(8, 64), (16, 128)])
@pytest.mark.gpu
@needs_cuda
def test_gpu_flash_mla_nan_in_padded_heads_stays_there(h_real, h_pad):
    """vLLM's padded workspace heads are uninitialised (could hold NaN): real heads must be unaffected."""
    _need_flash()
    q, kv, idx, tl = _prefill_case(160, h_real, h_pad, 2048, 2048, True, seed=5, poison_pad=True)
    out, mx, lse = sparse_mla_prefill(q, kv, idx, 0.0625, topk_length=tl)  # full h_pad outputs
    torch.cuda.synchronize()
    assert last_backend("sparse_mla_prefill") == "flash_mla"
    r_out, _, r_lse = sparse_mla_prefill_ref(q[:, :h_real].contiguous(), kv, idx, 0.0625, topk_length=tl)
    e = rel_err(out[:, :h_real], r_out)
    _REPORT.append({"test": "nan_in_padded_heads", "h_real": h_real, "h_pad": h_pad, "rel_err_out": e,
                    "padded_heads_out_all_nan": bool(out[:, h_real:].isnan().all())})
    assert e < 1e-2, f"rel err out {e}"
    fin = torch.isfinite(r_lse)
    _close("lse", lse[:, :h_real][fin], r_lse[fin])


@pytest.mark.gpu
@needs_cuda
def test_gpu_flash_mla_concat_end_to_end():
    """The PR's path: Triton concat into a padded workspace (padded heads never written), flash_mla, slice."""
    _need_flash()
    from mla_lab.buffers import QConcatWorkspace

    T, H = 300, 8
    ws = QConcatWorkspace(512, H, arch=(128 if torch.cuda.get_device_capability()[0] == 10 else 64),
                          dtype=torch.bfloat16, device="cuda")
    ws.buffer.fill_(float("nan"))
    a = torch.randn(T, H, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(T, H, 64, device="cuda", dtype=torch.bfloat16)
    q = concat_mla_q(a, b, ws.view(T))
    assert last_backend("concat_mla_q") == "triton"
    kv = torch.randn(2048, 1, 576, device="cuda", dtype=torch.bfloat16)
    idx = torch.randint(0, 2048, (T, 1, 2048), device="cuda", dtype=torch.int32)
    out, mx, lse = sparse_mla_prefill(q, kv, idx, 0.0625, actual_num_heads=H)
    torch.cuda.synchronize()
    assert last_backend("sparse_mla_prefill") == "flash_mla"
    r_out, r_mx, r_lse = sparse_mla_prefill_ref(torch.cat([a, b], -1), kv, idx, 0.0625)
    e = rel_err(out, r_out)
    _REPORT.append({"test": "concat_end_to_end", "T": T, "H": H, "h_pad": ws.q_concat_heads, "rel_err_out": e})
    assert e < 1e-2, f"rel err out {e}"
    _close("lse", lse, r_lse)


CONTRACT = [
    ("h_q_8", dict(h=8), "h_q must be one of (64, 128)"),
    ("fp16", dict(dtype=torch.float16), "q must be bfloat16"),
    ("d_qk_640", dict(d=640), "d_qk (q.shape[-1]) must be one of (576, 512)"),
    ("int64_indices", dict(idx_dtype=torch.int64), "indices.dtype must be torch.int32"),
]
if not CUDA or torch.cuda.get_device_capability()[0] == 9:  # topk=64 is valid on sm100: no case there, no skip
    CONTRACT.insert(1, ("topk_64_on_sm90", dict(topk=64), "positive multiple of"))


@pytest.mark.parametrize("name,kw,msg", CONTRACT, ids=[c[0] for c in CONTRACT])
@pytest.mark.gpu
@needs_cuda
def test_gpu_flash_mla_contract_violations_raise(name, kw, msg):
    _need_flash()
    h, topk, dtype, d = kw.get("h", 64), kw.get("topk", 128), kw.get("dtype", torch.bfloat16), kw.get("d", 576)
    q = torch.randn(4, h, d, device="cuda", dtype=dtype)
    kv = torch.randn(256, 1, d, device="cuda", dtype=dtype)
    idx = torch.randint(0, 256, (4, 1, topk), device="cuda", dtype=kw.get("idx_dtype", torch.int32))
    with pytest.raises(ValueError, match=re.escape(msg)):
        sparse_mla_prefill(q, kv, idx, 0.1, backend="flash_mla")
