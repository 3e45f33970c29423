"""The union builder (:mod:`mla_lab.kernels.union`): the torch reference against a brute-force python set
computation, the Triton kernel against the reference under Triton's CPU interpreter (a subprocess started with
``TRITON_INTERPRET=1``: Triton reads it at import; this file is also that worker, ``python test_union_builder.py
--worker IN OUT``) and on the GPU at T = 16384. Exact compares (integers), lists compared as sets per group.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mla_lab.kernels.union import (
    PAD_MULTIPLE,
    UNION_GROUP_SIZES,
    UnionSets,
    build_union,
    build_union_ref,
    union_buffer_bytes,
    union_caps,
)

# ---------------------------------------------------------------------------------------------------- grid constants
GS = UNION_GROUP_SIZES
#: (T, topk, s_kv): a partial last group for every g > 1 (T = 37), topk not a multiple of anything, s_kv small enough
#: for many shared keys and duplicates, a single token, topk 0.
SHAPES = [(37, 9, 24), (16, 5, 8), (1, 7, 100), (5, 0, 10), (33, 64, 300)]
LENGTHS = ("none", "random")
#: interpreter cases: (id, T, topk, s_kv, g, lengths, block, programs)
INTERP_CASES = [(f"g{g}-T{T}-k{k}-s{s}-{ln}", T, k, s, g, ln, 64, 3)
                for g in GS for (T, k, s) in [(37, 9, 24), (19, 70, 150)] for ln in LENGTHS]
INTERP_CASES += [("g8-block128-1prog", 40, 200, 500, 8, "random", 128, 1),
                 ("g4-T0", 0, 16, 32, 4, "none", 64, 3),
                 ("g8-many-empty", 24, 12, 20, 8, "empty", 64, 2),
                 ("g16-big-skv", 40, 30, 70000, 16, "random", 64, 3),
                 ("g8-strided-views", 21, 40, 90, 8, "random", 64, 2)]
GPU_T, GPU_TOPK, GPU_SKV = 16384, 2048, 32768


# ------------------------------------------------------------------------------------------------------- helpers


def make_indices(T, topk, s_kv, lengths, seed):
    """Random indices with -1, >= s_kv entries, duplicates, and (lengths) random topk_length / empty tokens."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-2, s_kv + 2, (T, topk), generator=g, dtype=torch.int32)
    if T and topk > 1:
        idx[: T // 2, 1] = idx[: T // 2, 0]  # duplicates within a token
    tl = None
    if lengths == "random":
        tl = torch.randint(0, topk + 1, (T,), generator=g, dtype=torch.int32)
    elif lengths == "empty":
        tl = torch.full((T,), topk, dtype=torch.int32)
        tl[::5] = 0  # tokens with no valid key
    return idx, tl


def brute(indices, topk_length, g, s_kv):
    """Per group: (shared set, {rest key: mask}) by python sets."""
    T, topk = indices.shape
    out = []
    for q in range(-(-T // g)):
        sets = []
        for j in range(g):
            t = q * g + j
            if t >= T:
                break
            n = topk if topk_length is None else min(int(topk_length[t]), topk)
            sets.append({int(x) for x in indices[t, :n].tolist() if 0 <= x < s_kv})
        shared = set.intersection(*sets) if all(sets) else set()
        union = set().union(*sets)
        out.append((shared, {k: sum(1 << j for j, s in enumerate(sets) if k in s) for k in union - shared}))
    return out


def as_sets(u: UnionSets):
    out = []
    for q in range(u.num_groups):
        n, r = int(u.shared_len[q]), int(u.rest_len[q])
        out.append((set(u.shared_idx[q, :n].tolist()),
                    {int(k): int(m) for k, m in zip(u.rest_idx[q, :r].tolist(), u.rest_mask[q, :r].tolist())}))
    return out


def canonical(u: UnionSets):
    """Each list sorted by key (past the length: a sentinel), rest masks permuted alike: tensors to compare exactly
    (the vectorised per-group set compare, for large T)."""
    big = torch.iinfo(torch.int32).max

    def srt(idx, n, mask=None):
        col = torch.arange(idx.shape[1], device=idx.device)[None, :]
        keys = torch.where(col < n[:, None].long(), idx, big)
        keys, order = keys.sort(dim=1)
        return keys, (None if mask is None else torch.where(keys < big, mask.long().gather(1, order), 0))

    sk, _ = srt(u.shared_idx, u.shared_len)
    rk, rm = srt(u.rest_idx, u.rest_len, u.rest_mask)
    return sk, u.shared_len, rk, rm, u.rest_len, u.union_len


def check_padding(u: UnionSets):
    """-1 (mask 0) from each length to the next multiple of 64; lengths consistent."""
    assert torch.equal(u.union_len, u.shared_len + u.rest_len)
    for q in range(u.num_groups):
        for idx, n, mask in ((u.shared_idx, int(u.shared_len[q]), None), (u.rest_idx, int(u.rest_len[q]), u.rest_mask)):
            end = -(-n // PAD_MULTIPLE) * PAD_MULTIPLE
            assert (idx[q, n:end] == -1).all()
            assert (idx[q, :n] >= 0).all()
            if mask is not None:
                assert (mask[q, n:end] == 0).all() and (mask[q, :n] != 0).all()


# --------------------------------------------------------------------------------------------- reference vs brute


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-k{}-s{}".format(*s))
@pytest.mark.parametrize("g", GS)
def test_reference_matches_brute_force(g, shape, lengths):
    T, topk, s_kv = shape
    idx, tl = make_indices(T, topk, s_kv, lengths, seed=T * 31 + topk)
    u = build_union_ref(idx, tl, g, s_kv)
    assert as_sets(u) == brute(idx, tl, g, s_kv)
    check_padding(u)
    cap_s, cap_r = union_caps(topk, g)
    assert u.shared_idx.shape == (-(-T // g), cap_s) and u.rest_idx.shape == (-(-T // g), cap_r)
    assert cap_s % 128 == 0 and cap_s >= topk and cap_r % 64 == 0 and cap_r >= g * topk
    assert u.rest_mask.dtype == (torch.uint8 if g <= 8 else torch.int32)
    # the reference sorts each list
    for q in range(u.num_groups):
        r = u.rest_idx[q, : int(u.rest_len[q])]
        assert torch.equal(r, r.sort().values)


def test_shared_rules_on_a_hand_case():
    """g 4, T 7: group 0 tokens share {1, 2}; group 1 is partial (3 tokens) with one empty token -> no shared."""
    idx = torch.tensor([[1, 2, 3], [2, 1, 1], [2, 1, -1], [9, 1, 2],
                        [5, 6, 7], [-1, 99, -1], [6, 5, 5]], dtype=torch.int32)
    u = build_union_ref(idx, None, 4, 10)
    assert as_sets(u) == [({1, 2}, {3: 0b0001, 9: 0b1000}), (set(), {5: 0b101, 6: 0b101, 7: 0b001})]


@pytest.mark.parametrize("g", GS)
def test_union_buffer_bytes_counts_the_tensors(g):
    T, topk, s_kv, P = 37, 9, 24, 3
    u = build_union_ref(*make_indices(T, topk, s_kv, "none", 0), g, s_kv)
    b = union_buffer_bytes(T, topk, g, s_kv, P)
    tensors = (u.shared_idx, u.shared_len, u.rest_idx, u.rest_mask, u.rest_len, u.union_len)
    assert b["outputs"] == sum(t.numel() * t.element_size() for t in tensors)
    keys_per_word = {1: 4, 2: 4, 4: 4, 8: 2, 16: 1}[g]
    assert b["scratch"] == P * -(-s_kv // keys_per_word) * 4 and b["total"] == b["outputs"] + b["scratch"]


def test_union_buffer_bytes_docstring_example():
    b = union_buffer_bytes(16384, 2048, 8, 32768, 264)
    assert round(b["outputs"] / 1e6, 1) == 184.6 and round(b["scratch"] / 1e6, 1) == 17.3


BAD = [
    ("indices", dict(indices=[[1]]), "indices must be a torch.Tensor"),
    ("indices_1d", dict(indices=torch.zeros(4, dtype=torch.int32)), "indices must be 2-D"),
    ("indices_dtype", dict(indices=torch.zeros(4, 2, dtype=torch.int64)), "indices.dtype must be torch.int32"),
    ("g", dict(g=3), "g must be one of [1, 2, 4, 8, 16]; got g=3"),
    ("g_bool", dict(g=True), "g must be one of"),
    ("s_kv", dict(s_kv=0), "s_kv must be an int >= 1"),
    ("tl_shape", dict(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length must be None or a 1-D tensor [T=4]"),
    ("tl_dtype", dict(topk_length=torch.zeros(4, dtype=torch.int64)), "topk_length.dtype must be torch.int32"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("fn", [build_union_ref, build_union], ids=["ref", "triton"])
def test_bad_input_one_line(fn, case):
    _, kw, msg = case
    args = dict(indices=torch.zeros(4, 2, dtype=torch.int32), topk_length=None, g=2, s_kv=8) | kw
    with pytest.raises(ValueError) as e:
        fn(**args)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_triton_refuses_cpu_tensors_outside_the_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 in this process: CPU tensors are then allowed")
    with pytest.raises(ValueError, match="CUDA tensor|needs triton"):
        build_union(torch.zeros(4, 2, dtype=torch.int32), None, 2, 8)


# -------------------------------------------------------------------------------------- Triton interpreter (CPU)


def _worker(inp: str, outp: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from mla_lab.kernels.union import union_scratch

    assert Path(build_union.__code__.co_filename).resolve().parent.parent.parent == Path(__file__).resolve().parent.parent

    cases = torch.load(inp)
    res = {}
    for cid, c in cases.items():
        s_kv, g, block, P = c["s_kv"], c["g"], c["block"], c["P"]
        u = build_union(c["idx"], c["tl"], g, s_kv, num_programs=P, block=block)
        # a second call into the same buffers, poisoned first: the lists and padding are rewritten
        for t in (u.shared_idx, u.rest_idx, u.shared_len, u.rest_len, u.union_len):
            t.fill_(7)
        u.rest_mask.fill_(3)
        u2 = build_union(c["idx"], c["tl"], g, s_kv, num_programs=P, block=block, out=u)
        fields = ("shared_idx", "shared_len", "rest_idx", "rest_mask", "rest_len", "union_len")
        res[cid] = {"u": {f: getattr(u2, f) for f in fields}, "same_out": u2 is u, "scratch_zero": bool((union_scratch("cpu", P, s_kv, g) == 0).all())}
    torch.save(res, outp)


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory):
    d = tmp_path_factory.mktemp("union_interp")
    cases = {}
    for i, (cid, T, k, s, g, ln, block, P) in enumerate(INTERP_CASES):
        idx, tl = make_indices(T, k, s, ln, seed=100 + i)
        if "strided" in cid:  # a row-strided slice of wider indices, a strided topk_length view
            wide = torch.full((T, k + 13), 5, dtype=torch.int32)
            wide[:, :k] = idx
            idx = wide[:, :k]
            tl = torch.stack([tl, tl + 1], 1)[:, 0]
            assert idx.stride(0) == k + 13 and tl.stride(0) == 2
        cases[cid] = dict(T=T, topk=k, s_kv=s, g=g, block=block, P=P, idx=idx, tl=tl)
    torch.save(cases, d / "in.pt")
    # the worker imports mla_lab from this checkout (an editable install may point at another one)
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        p for p in (repo, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(d / "in.pt"),
                           str(d / "out.pt")], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"triton interpreter worker failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return cases, torch.load(d / "out.pt")


@pytest.mark.slow
@pytest.mark.parametrize("cid", [c[0] for c in INTERP_CASES])
def test_triton_interp_matches_reference(interp_results, cid):
    cases, res = interp_results
    c, r = cases[cid], res[cid]
    ref = build_union_ref(c["idx"], c["tl"], c["g"], c["s_kv"])
    u = UnionSets(**r["u"], g=c["g"], T=c["T"])
    assert r["same_out"] and r["scratch_zero"], "out= not reused or the scratch left dirty"
    assert as_sets(u) == as_sets(ref)
    for a, b in zip(canonical(u), canonical(ref)):
        assert torch.equal(a, b)
    check_padding(u)


def test_public_names_are_exported():
    import mla_lab.kernels as k

    for name in ("UnionSets", "build_union", "build_union_ref", "union_buffer_bytes", "overlap_indices",
                 "causal_indices", "structured_indices", "union_sizes", "published_overlaps"):
        assert name in k.__all__ and hasattr(k, name)


# --------------------------------------------------------------------------------------------------------- GPU


def _cuda_reason():
    if not torch.cuda.is_available():
        return "no CUDA GPU: the Triton union kernel's GPU test needs one"
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("s_kv", [GPU_SKV, 131072])
@pytest.mark.parametrize("overlap", [None, 0.8])
@pytest.mark.parametrize("g", [8, 16, 2])
def test_gpu_matches_reference_at_T16384(g, overlap, s_kv):
    why = _cuda_reason()
    if why:
        pytest.skip(why)
    from mla_lab.kernels.index_sets import overlap_indices
    from mla_lab.kernels.union import union_scratch

    o = GPU_TOPK / s_kv if overlap is None else overlap
    data = overlap_indices(GPU_T, GPU_TOPK, s_kv, o, g, seed=1, device="cuda")
    idx, tl = data.indices.clone(), data.topk_length.clone()
    idx[::7, ::5] = -1  # invalid entries
    idx[1::9, 3] = idx[1::9, 2]  # duplicates
    tl[::11] = 0  # empty tokens
    T = GPU_T - 3  # a partial last group
    idx, tl = idx[:T].contiguous(), tl[:T].contiguous()
    ref = build_union_ref(idx, tl, g, s_kv)
    u = build_union(idx, tl, g, s_kv)
    for a, b in zip(canonical(u), canonical(ref)):
        assert torch.equal(a, b)
    for q in (0, 1, u.num_groups - 1):  # -1 padding to the next multiple of 64 (the canonical form ignores it)
        for lst, n in ((u.shared_idx, int(u.shared_len[q])), (u.rest_idx, int(u.rest_len[q]))):
            assert (lst[q, n:-(-n // PAD_MULTIPLE) * PAD_MULTIPLE] == -1).all()
    assert bool((union_scratch(idx.device, u_programs(), s_kv, g) == 0).all()), "the scratch was left dirty"


def u_programs():
    from mla_lab.kernels.union import DEFAULT_PROGRAMS_PER_SM

    return DEFAULT_PROGRAMS_PER_SM * torch.cuda.get_device_properties(0).multi_processor_count


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3])
