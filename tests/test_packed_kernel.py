"""The packed kernel (mla_lab.kernels.packed) against the fp32 reference: CPU through Triton's interpreter (fp16: the
interpreter's bf16 dot is wrong in Triton 3.9, seen 2026-12-04), and on the GPU in bf16 with FlashMLA (``gpu``).

Cases: request boundaries inside groups, a partial last group (T not a multiple of g), a token whose entries are all
-1, a token with ``topk_length`` 0 (both: out 0 and lse +inf), H in {8, 16, 32} (g = 8, 4, 2), and overlap data.
Tolerances (METHOD: bf16/fp16 operands land between 1e-3 and 1e-2 in relative Frobenius error): relative error
< 1e-2, LSE absolute error < 1e-3, no NaN, the +inf LSE rows exactly where the reference has them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HEADS = (8, 16, 32)
MODES = ("hybrid", "triton")
REL_TOL, LSE_TOL = 1e-2, 1e-3
SM_SCALE = 1.0 / math.sqrt(192 + 64)  # GLM-5 qk_nope_head_dim + qk_rope_head_dim (config.json)


def _case(H: int, device: str, dtype, seed: int, topk: int = 128):
    """q, kv, indices, topk_length: causal prompts [37, 30, 5, 70] (crossing groups; T = 142, not a multiple of 8),
    token 10 with topk_length 0, token 11 all -1."""
    from mla_lab.kernels import index_sets as ix

    d = ix.causal_indices([37, 30, 5, 70], topk, seed=seed, device=device)
    idx, tlen = d.indices.clone(), d.topk_length.clone()
    tlen[10] = 0
    idx[11] = -1
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(idx.shape[0], H, 576, generator=g, device=device).to(dtype)
    kv = torch.randn(d.s_kv, 1, 576, generator=g, device=device).to(dtype)
    return q, kv, idx, tlen, d.s_kv


def _errors(o, lse, ref, ref_lse) -> dict:
    fin = torch.isfinite(ref_lse)
    return {"rel": ((o.float() - ref).norm() / ref.norm()).item(),
            "lse": (lse[fin] - ref_lse[fin]).abs().max().item(),
            "inf_match": bool((torch.isinf(lse) == torch.isinf(ref_lse)).all()),
            "nan": bool(o.isnan().any() or lse.isnan().any())}


def _ref_flash(q, kv, idx, sc, dv, topk_length=None):
    """FlashMLA's contract computed by the reference (for the hybrid mode on CPU)."""
    from mla_lab.kernels.reference import sparse_mla_prefill_ref

    o, m, lse = sparse_mla_prefill_ref(q.float(), kv.float(), idx, sc, dv, topk_length)
    return o.to(q.dtype), m, lse


def _run_case(H: int, mode: str, device: str, dtype, flash=None) -> dict:
    from mla_lab.kernels.packed import packed_sparse_prefill
    from mla_lab.kernels.reference import sparse_mla_prefill_ref
    from mla_lab.kernels.union import build_union_ref

    q, kv, idx, tlen, s_kv = _case(H, device, dtype, seed=H)
    sets = build_union_ref(idx, tlen, 64 // H, s_kv)
    ref, _, ref_lse = sparse_mla_prefill_ref(q.float(), kv.float(), idx.view(idx.shape[0], 1, -1), SM_SCALE, 512,
                                             tlen)
    o, lse = packed_sparse_prefill(q, kv, sets, SM_SCALE, mode=mode, flash_fwd=flash)
    return _errors(o, lse, ref, ref_lse)


def _check(e: dict) -> None:
    assert not e["nan"]
    assert e["inf_match"]
    assert e["rel"] < REL_TOL, e
    assert e["lse"] < LSE_TOL, e


# --------------------------------------------------------------------------------------------- CPU (interpreter)

def _worker(out: str) -> None:  # runs with TRITON_INTERPRET=1 set before triton is imported
    res = {f"{H}-{m}": _run_case(H, m, "cpu", torch.float16, flash=_ref_flash if m == "hybrid" else None)
           for H in HEADS for m in MODES}
    Path(out).write_text(json.dumps(res))


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("packed") / "res.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, __file__, "--worker", str(out)], env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("H", HEADS)
def test_packed_matches_reference_interpreter(interp_results, H, mode):
    _check(interp_results[f"{H}-{mode}"])


# ------------------------------------------------------------------------------------------------ CPU (the door)

@pytest.mark.parametrize("bad,msg", [
    (dict(H=64), "num_heads=64"),
    (dict(mode="x"), "mode='x'"),
    (dict(g=4), "sets.g=4"),
    (dict(sm_scale=-1.0), "sm_scale=-1.0"),
])
def test_packed_refuses_bad_input_in_one_line(bad, msg):
    from mla_lab.kernels.packed import packed_sparse_prefill
    from mla_lab.kernels.union import build_union_ref

    H = bad.get("H", 8)
    q = torch.randn(16, H, 576).to(torch.bfloat16)
    kv = torch.randn(40, 1, 576).to(torch.bfloat16)
    idx = torch.randint(0, 40, (16, 8), dtype=torch.int32)
    sets = build_union_ref(idx, None, bad.get("g", 64 // H if H <= 32 else 8), 40)
    with pytest.raises(ValueError) as e:
        packed_sparse_prefill(q, kv, sets, bad.get("sm_scale", 0.1), mode=bad.get("mode", "hybrid"))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_group_size_per_tile():
    from mla_lab.kernels.packed import packed_group_size

    assert [packed_group_size(h) for h in HEADS] == [8, 4, 2]
    assert packed_group_size(8, tile_rows=128) == 16  # Blackwell's 128-row tile at 8 heads (modelled)


# ------------------------------------------------------------------------------------------------------ GPU

def _flash():
    try:
        from flash_mla import flash_mla_sparse_fwd
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no flash_mla provider: {e}")
    return flash_mla_sparse_fwd


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("H", HEADS)
def test_packed_matches_reference_gpu(H, mode):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (the packed kernel's GPU run)")
    _check(_run_case(H, mode, "cuda", torch.bfloat16, flash=_flash() if mode == "hybrid" else None))


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", [1.0, 0.8, 0.25])
def test_packed_overlap_data_gpu(overlap):
    """T = 2048 tokens at topk 2048, the common-core model: the hybrid path against the reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (the packed kernel's GPU run)")
    from mla_lab.kernels import index_sets as ix
    from mla_lab.kernels.packed import packed_sparse_prefill
    from mla_lab.kernels.reference import sparse_mla_prefill_ref
    from mla_lab.kernels.union import build_union

    d = ix.overlap_indices(2048, 2048, 32768, overlap, 8, seed=3, device="cuda")
    q = torch.randn(2048, 8, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(d.s_kv, 1, 576, device="cuda", dtype=torch.bfloat16)
    sets = build_union(d.indices, d.topk_length, 8, d.s_kv)
    ref, _, ref_lse = sparse_mla_prefill_ref(q, kv, d.indices.view(2048, 1, -1), SM_SCALE, 512, d.topk_length)
    o, lse = packed_sparse_prefill(q, kv, sets, SM_SCALE, flash_fwd=_flash())
    _check(_errors(o, lse, ref.float(), ref_lse))


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    _worker(sys.argv[2])
