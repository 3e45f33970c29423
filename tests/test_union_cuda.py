"""The CUDA union builder (:mod:`mla_lab.kernels.union_cuda`): on the GPU, exact against the torch reference
(:func:`mla_lab.kernels.union.build_union_ref`) as sets per group (lengths, sorted lists, masks per key, the ``-1``
padding); on CPU, the module imports, refuses CPU tensors and g = 16 in one line, the set comparison finds what it
must, and (slow) the kernel source compiles with nvcc for sm_90a without register spills.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from mla_lab.kernels.index_sets import causal_indices, overlap_indices
from mla_lab.kernels.union import _empty_sets, build_union_ref, union_caps
from mla_lab.kernels.union_cuda import CUDA_SOURCE, MAX_WINDOW, _vector_rows, build_union_cuda, union_mismatch

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="torch.cuda.is_available() is False: no CUDA GPU on this machine")


def make_indices(T, topk, s_kv, lengths, seed, pad_cols=0):
    """Random int32 indices with -1, -2, >= s_kv entries and duplicates inside rows; ``lengths``: ``none``,
    ``random`` (0 .. topk + 2, so 0 and past-topk occur), ``empty`` (every 5th token 0). ``pad_cols`` > 0 returns a
    column slice of a wider tensor (rows not contiguous with each other)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-2, s_kv + 2, (T, topk + pad_cols), generator=g, dtype=torch.int32)[:, :topk]
    if T and topk > 1:
        idx[: T // 2, 1] = idx[: T // 2, 0]
    tl = None
    if lengths == "random":
        tl = torch.randint(0, topk + 3, (T,), generator=g, dtype=torch.int32)
        tl[::7] = 0
    elif lengths == "empty":
        tl = torch.full((T,), topk, dtype=torch.int32)
        tl[::5] = 0
    return idx, tl


def check_exact(idx, tl, g, s_kv, **kw):
    """The CUDA build into stale (7-filled) buffers equals the reference; returns the reference."""
    ref = build_union_ref(idx, tl, g, s_kv)
    T, topk = idx.shape
    cap_s, cap_r = union_caps(topk, g)
    out = _empty_sets(-(-T // g), cap_s, cap_r, g, T, idx.device)
    for t in (out.shared_idx, out.rest_idx, out.rest_mask, out.shared_len, out.rest_len, out.union_len):
        t.fill_(7)
    got = build_union_cuda(idx, tl, g, s_kv, out=out, **kw)
    assert got is out
    why = union_mismatch(got, ref)
    assert why is None, why
    return ref


# ------------------------------------------------------------------------------------------------------------- CPU


def test_imports_and_refuses_cpu_tensors_in_one_line():
    idx, tl = make_indices(8, 16, 40, "random", 0)
    with pytest.raises(ValueError) as e:
        build_union_cuda(idx, tl, 8, 40)
    msg = str(e.value)
    assert "\n" not in msg and "indices must be a CUDA tensor" in msg and "device=cpu" in msg


@pytest.mark.parametrize("kw, pattern", [
    (dict(g=16), r"^g must be <= 8 for build_union_cuda .*g=16.*Triton"),
    (dict(g=3), r"^g must be one of \[1, 2, 4, 8, 16\]; got g=3$"),
    (dict(window=8), r"^window must be None or an int multiple of 16 .*got window=8$"),
    (dict(window=MAX_WINDOW + 16), r"^window must be .*got window=196624$"),
    (dict(s_kv=0), r"^s_kv must be an int >= 1"),
])
def test_bad_arguments_refused_in_one_line(kw, pattern):
    idx, tl = make_indices(8, 16, 40, "random", 0)
    args = dict(g=8, s_kv=40) | kw
    with pytest.raises(ValueError, match=pattern) as e:
        build_union_cuda(idx, tl, args.pop("g"), args.pop("s_kv"), **args)
    assert "\n" not in str(e.value)


def test_rows_are_read_in_place_or_copied_padded_to_128():
    full = torch.arange(4 * 256, dtype=torch.int32).reshape(4, 256)
    assert _vector_rows(full) is full
    assert _vector_rows(full[:, :128]) is not None and _vector_rows(full[:, :128]).data_ptr() == full.data_ptr()
    for view in (full[:, :9], full[:, 1:129]):  # topk 9; rows not 16-byte aligned
        rows = _vector_rows(view)
        assert rows.shape == (4, -(-view.shape[1] // 128) * 128) and rows.is_contiguous()
        assert torch.equal(rows[:, : view.shape[1]], view) and bool((rows[:, view.shape[1]:] == -1).all())


def _permuted(sets, seed):
    """A copy of ``sets`` with each list permuted inside its length (masks moved with their keys)."""
    g = torch.Generator().manual_seed(seed)
    out = _empty_sets(sets.num_groups, sets.shared_idx.shape[1], sets.rest_idx.shape[1], sets.g, sets.T, "cpu")
    for name in ("shared_len", "rest_len", "union_len", "shared_idx", "rest_idx", "rest_mask"):
        getattr(out, name).copy_(getattr(sets, name))
    for q in range(sets.num_groups):
        n = int(sets.shared_len[q])
        out.shared_idx[q, :n] = sets.shared_idx[q, torch.randperm(n, generator=g)]
        n = int(sets.rest_len[q])
        p = torch.randperm(n, generator=g)
        out.rest_idx[q, :n] = sets.rest_idx[q, p]
        out.rest_mask[q, :n] = sets.rest_mask[q, p]
    return out


def test_union_mismatch_ignores_order_and_finds_each_difference():
    idx, tl = make_indices(37, 24, 30, "random", 1)
    ref = build_union_ref(idx, tl, 4, 30)
    perm = _permuted(ref, 2)
    assert not torch.equal(perm.rest_idx, ref.rest_idx)  # the permutation moved something
    assert union_mismatch(perm, ref) is None
    q = int(ref.rest_len.argmax())
    bad = _permuted(ref, 2)
    bad.rest_mask[q, 0] ^= 1
    assert "rest list (keys and masks) of group" in union_mismatch(bad, ref)
    bad = _permuted(ref, 2)
    bad.rest_len[q] -= 1
    assert union_mismatch(bad, ref).startswith(f"rest_len differs first at group {q}")
    qs = int(ref.shared_len.argmax())
    assert int(ref.shared_len[qs]) > 0
    bad = _permuted(ref, 2)
    bad.shared_idx[qs, 0] = 29 if int(bad.shared_idx[qs, 0]) != 29 else 28
    assert "shared list (keys) of group" in union_mismatch(bad, ref)
    bad = _permuted(ref, 2)
    n = int(bad.rest_len[q])
    assert n % 64
    bad.rest_idx[q, n] = 5
    assert union_mismatch(bad, ref).startswith("rest padding")


@pytest.mark.slow
def test_cuda_source_compiles_for_sm90a_without_spills(tmp_path):
    """nvcc (CUDA 13 here and on the GPU machine) compiles ``CUDA_SOURCE`` for sm_90a; ptxas reports no spill and
    at most 128 registers (512 threads x 128 = the SM's 65536 registers: one CTA must fit)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH: the CUDA source cannot be compiled on this machine")
    from torch.utils.cpp_extension import include_paths

    src = tmp_path / "union.cu"
    src.write_text(CUDA_SOURCE)
    cmd = [nvcc, "-c", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", str(src), "-o",
           str(tmp_path / "union.o")] + [f"-I{p}" for p in include_paths()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr
    regs = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
    assert regs <= 128, res.stderr


# ------------------------------------------------------------------------------------------------------------- GPU

#: (T, topk, s_kv): partial last groups and super-groups (T not a multiple of g or 8), topk not a multiple of 128 (the
#: padded copy), more entries per super-group than one register chunk (8 x 2176 padded > 16384), a single token.
SMALL = [(37, 9, 24), (19, 70, 150), (1, 7, 100), (33, 64, 300), (40, 2100, 5000), (100, 128, 70000)]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("g", [1, 2, 4, 8])
@pytest.mark.parametrize("lengths", ["none", "random", "empty"])
@pytest.mark.parametrize("shape", SMALL, ids=[f"T{t}-k{k}-s{s}" for t, k, s in SMALL])
@pytest.mark.parametrize("window", [None, 16, 64])
def test_gpu_random_small_cases_exact(g, lengths, shape, window):
    T, topk, s_kv = shape
    idx, tl = make_indices(T, topk, s_kv, lengths, seed=T + topk + g)
    dev = torch.device("cuda")
    check_exact(idx.to(dev), None if tl is None else tl.to(dev), g, s_kv, window=window)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("g", [2, 8])
def test_gpu_strided_rows_and_empty_inputs(g):
    dev = torch.device("cuda")
    idx, tl = make_indices(45, 128, 500, "random", seed=3, pad_cols=5)  # row stride 133: the padded copy
    check_exact(idx.to(dev), tl.to(dev), g, 500)
    idx, tl = make_indices(45, 128, 500, "random", seed=4, pad_cols=4)  # row stride 132: read in place, not contiguous
    assert not idx.is_contiguous()
    check_exact(idx.to(dev), tl.to(dev), g, 500)
    for T, topk in ((0, 16), (9, 0)):
        out = build_union_cuda(torch.zeros(T, topk, dtype=torch.int32, device=dev), None, g, 10)
        assert out.shared_len.numel() == -(-T // g) and int(out.union_len.sum()) == 0


def _big(name, g, dev):
    if name == "seed":  # causal 1024-token prompts (the seed layout)
        return causal_indices([1024] * 16, 2048, seed=0, device=dev)
    if name.startswith("overlap"):
        return overlap_indices(16384, 2048, 32768, float(name.split()[1]), g, seed=0, device=dev)
    s = int(name.split()[1])
    return overlap_indices(16384 if s < 200000 else 2048, 2048, s, 2048 / s, g, seed=0, device=dev)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("g", [2, 4, 8])
@pytest.mark.parametrize("name", ["seed", "overlap 1.0", "overlap 0.8", "context 4096", "context 300000"])
def test_gpu_large_layouts_exact(name, g):
    """T = 16384, topk 2048 (s_kv 300000: T 2048; groups span more than one 192K-key window)."""
    d = _big(name, g, "cuda")
    ref = check_exact(d.indices, d.topk_length, g, d.s_kv)
    assert int(ref.union_len.sum()) > 0
