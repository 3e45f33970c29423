"""Index data with known overlap (:mod:`mla_lab.kernels.index_sets`): each generator's stated properties, the
closed forms against samples (tolerances from the sample size), union_sizes against brute force, and the published
figures' mapping."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_lab.kernels.index_sets import (
    causal_indices,
    overlap_indices,
    overlap_union_expected,
    published_overlaps,
    structured_indices,
    union_ratio_common_core,
    union_sizes,
)

# ---------------------------------------------------------------------------------------------------- grid constants
#: (topk, s_kv, overlap or None for the random baseline topk / s_kv)
OVERLAP_GRID = [(64, 256, None), (64, 256, 0.5), (64, 1024, 0.3), (64, 1024, 0.8), (32, 4096, 0.95), (64, 64, 1.0)]
OVERLAP_T = 2048
GS = (1, 2, 4, 8)
Z = 5.0  # standard errors of tolerance


def _sets(data):
    idx, tl = data.indices, data.topk_length
    return [set(idx[t, : int(tl[t])].tolist()) for t in range(idx.shape[0])]


def _hypergeom_var(N, K, n):
    """Variance of the number of successes in n draws without replacement from N items with K successes."""
    if N <= 1:
        return 0.0
    return n * (K / N) * ((N - K) / N) * ((N - n) / (N - 1))


# ------------------------------------------------------------------------------------------------ overlap model


@pytest.mark.parametrize("g", [2, 8])
@pytest.mark.parametrize("topk,s_kv,overlap", OVERLAP_GRID)
def test_overlap_pairwise_matches_the_request(topk, s_kv, overlap, g):
    o = topk / s_kv if overlap is None else overlap
    exp = overlap_union_expected(topk, s_kv, o, g)
    data = overlap_indices(OVERLAP_T, topk, s_kv, o, g, seed=3)
    sets = _sets(data)
    # disjoint pairs (2i, 2i+1) inside one group: independent samples of |A n B|
    pairs = [(a, a + 1) for q in range(OVERLAP_T // g) for a in range(q * g, q * g + g - 1, 2)]
    inter = torch.tensor([len(sets[a] & sets[b]) for a, b in pairs], dtype=torch.float64)
    m = exp["m"]
    sd = math.sqrt(_hypergeom_var(s_kv - m, topk - m, topk - m) / len(pairs))
    assert abs(float(inter.mean()) - exp["pairwise"] * topk) <= Z * sd + 1e-9
    # the nearest integer core gives the requested overlap to within one key's step
    step = 1.0 / topk + 2.0 / (s_kv - m) if s_kv > m else 1.0 / topk
    assert abs(exp["pairwise"] - o) <= step


@pytest.mark.parametrize("g", [2, 4, 8])
@pytest.mark.parametrize("topk,s_kv,overlap", OVERLAP_GRID)
def test_overlap_union_matches_the_closed_form(topk, s_kv, overlap, g):
    o = topk / s_kv if overlap is None else overlap
    exp = overlap_union_expected(topk, s_kv, o, g)
    data = overlap_indices(OVERLAP_T, topk, s_kv, o, g, seed=5)
    sets = _sets(data)
    u = torch.tensor([len(set().union(*sets[q * g:(q + 1) * g])) for q in range(OVERLAP_T // g)], dtype=torch.float64)
    # variance: the sample's, floored by the expected number of private-key collisions (about Poisson): a sample
    # where no collision happened has zero spread but still a mean below g x (topk - m) + m by that expectation
    collisions = g * (topk - exp["m"]) + exp["m"] - exp["union"]
    tol = Z * math.sqrt(max(float(u.var()), collisions) / u.numel()) + 1e-9
    assert abs(float(u.mean()) - exp["union"]) <= tol
    assert exp["union_ratio"] == pytest.approx(exp["union"] / (g * topk))


def test_overlap_large_s_kv_gives_the_issue_figure():
    """s_kv >> g x topk: U ~ topk (1 + (g - 1)(1 - overlap)): 2.4 x topk at g 8, overlap 0.8 (issue 36)."""
    exp = overlap_union_expected(2048, 10**9, 0.8, 8)
    assert exp["union"] / 2048 == pytest.approx(2.4, abs=8 / 2048)  # m is an integer: 1638 of 1638.4
    assert exp["union_ratio"] == pytest.approx(union_ratio_common_core(0.8, 8), abs=1 / 2048)


@pytest.mark.parametrize("T,g", [(37, 8), (10, 4), (5, 16)])
def test_overlap_structure(T, g):
    topk, s_kv = 16, 200
    data = overlap_indices(T, topk, s_kv, 0.5, g, seed=7)
    idx = data.indices
    assert idx.shape == (T, topk) and idx.dtype == torch.int32 and data.s_kv == s_kv
    assert ((idx >= 0) & (idx < s_kv)).all() and (data.topk_length == topk).all()
    assert all(len(set(r)) == topk for r in idx.tolist()), "duplicates within a token"
    m = overlap_union_expected(topk, s_kv, 0.5, g)["m"]
    sets = _sets(data)
    for q in range(-(-T // g)):  # the core is shared by every token of a group, the partial last one too
        grp = sets[q * g:(q + 1) * g]
        assert len(set.intersection(*grp)) >= m


def test_overlap_seeds():
    a = overlap_indices(20, 16, 100, 0.5, 4, seed=1)
    b = overlap_indices(20, 16, 100, 0.5, 4, seed=1)
    c = overlap_indices(20, 16, 100, 0.5, 4, seed=2)
    assert torch.equal(a.indices, b.indices) and not torch.equal(a.indices, c.indices)


@pytest.mark.parametrize("kw,msg", [
    (dict(overlap=0.01), "overlap must be a number in [topk/s_kv"),
    (dict(overlap=1.5), "overlap must be a number in"),
    (dict(s_kv=8), "s_kv must be an int >= 16"),
    (dict(T=-1), "T must be an int >= 0"),
    (dict(seed=-1), "seed must be an int >= 0"),
])
def test_overlap_bad_input(kw, msg):
    args = dict(T=8, topk=16, s_kv=100, overlap=0.5, g=4, seed=0) | kw
    with pytest.raises(ValueError) as e:
        overlap_indices(**args)
    assert msg in str(e.value) and "\n" not in str(e.value)


# -------------------------------------------------------------------------------------------------------- causal


@pytest.mark.parametrize("lens,topk", [([5, 3, 8], 8), ([20, 7], 6), ([1], 4), ([12, 12], 12)])
def test_causal_indices(lens, topk):
    data = causal_indices(lens, topk, seed=0)
    T = sum(lens)
    assert data.indices.shape == (T, topk) and data.s_kv == max(T, topk)
    t = 0
    for r, L in enumerate(lens):
        base = sum(lens[:r])  # each request's keys at its own offset (engine_kernels._inputs' layout)
        for p in range(L):
            n = int(data.topk_length[t])
            assert n == min(p + 1, topk)
            row = data.indices[t].tolist()
            keys = set(row[:n])
            assert len(keys) == n and all(k == -1 for k in row[n:])
            assert keys <= set(range(base, base + p + 1)), "a key outside the causal prefix of its own request"
            if p + 1 <= topk:
                assert keys == set(range(base, base + p + 1)), "a short prompt's token must take its whole prefix"
            t += 1


def test_causal_seed_layout_matches_engine_kernels():
    """engine_kernels._inputs('seed'): request r of length L at r * L, s_kv = max(n * L, topk)."""
    data = causal_indices([1024] * 3, 2048)
    assert data.s_kv == 3072 and int(data.indices[1024, 0]) == 1024 and int(data.indices[2047].max()) == 2047
    assert causal_indices([1024], 2048).s_kv == 2048


def test_causal_bad_input():
    with pytest.raises(ValueError, match=r"prompt_lens\[1\] must be an int >= 1; got prompt_lens\[1\]=0"):
        causal_indices([3, 0], 4)


# ---------------------------------------------------------------------------------------------------- structured


@pytest.mark.parametrize("f", [0.0, 0.5, 1.0])
def test_structured_properties(f):
    T, topk, s_kv, window, content = 48, 32, 300, 8, 6
    data = structured_indices(T, topk, s_kv=s_kv, window=window, toeplitz_fraction=f, content_keys=content, seed=4)
    pos = torch.arange(s_kv - T, s_kv)
    first = None
    for t in range(T):
        n = int(data.topk_length[t])
        keys = data.indices[t, :n].tolist()
        p = int(pos[t])
        assert n == min(p + 1, topk) and len(set(keys)) == n
        assert all(0 <= k <= p for k in keys), "a key after the query's position"
        assert set(range(p - window + 1, p + 1)) <= set(keys), "the local window is missing"
        assert 0 in keys, "the sink (key 0) is missing"
        first = set(keys) if first is None else first & set(keys)
    assert len(first) >= content, "the content keys are not shared by every token"


def test_structured_toeplitz_is_shift_invariant():
    """f = 1, no window, no content keys: token p+1's set is token p's shifted by one, but for at most one key
    (the offset that becomes visible)."""
    data = structured_indices(40, 16, s_kv=400, window=0, toeplitz_fraction=1.0, content_keys=0, seed=9)
    sets = _sets(data)
    for a, b in zip(sets, sets[1:]):
        assert len({k + 1 for k in a} & b) >= 15


def test_structured_toeplitz_shrinks_the_union():
    kw = dict(s_kv=2048, window=8, content_keys=8, seed=2)
    u = [union_sizes(structured_indices(256, 64, toeplitz_fraction=f, **kw).indices, None, 8, 2048).mean
         for f in (0.0, 1.0)]
    assert u[1] < 0.6 * u[0]


def test_structured_positions_and_bad_input():
    pos = torch.tensor([3, 10, 50])
    data = structured_indices(3, 8, positions=pos, window=2, content_keys=1, seed=0)
    assert data.s_kv == 51 and data.topk_length.tolist() == [4, 8, 8]
    with pytest.raises(ValueError, match="give exactly one of s_kv or positions"):
        structured_indices(3, 8, s_kv=10, positions=pos)
    with pytest.raises(ValueError, match=r"toeplitz_fraction must be a number in \[0, 1\]"):
        structured_indices(3, 8, s_kv=10, toeplitz_fraction=2)


# --------------------------------------------------------------------------------------------------- union_sizes


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 30), topk=st.integers(1, 8), g=st.sampled_from((1, 2, 4, 8, 16)), seed=st.integers(0, 999))
def test_union_sizes_against_brute_force(T, topk, g, seed):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, 12, (T, topk), generator=gen, dtype=torch.int32)
    tl = torch.randint(0, topk + 1, (T,), generator=gen, dtype=torch.int32)
    s = union_sizes(idx, tl, g, 12)
    groups = [range(q * g, min(T, q * g + g)) for q in range(-(-T // g))]
    if T // g:
        groups = groups[: T // g]  # complete groups only
    u = torch.tensor([len({int(x) for t in grp for x in idx[t, : int(tl[t])].tolist() if 0 <= x < 12})
                      for grp in groups], dtype=torch.float64)
    assert s.groups == len(groups) and s.mean == pytest.approx(float(u.mean()))
    assert s.median == pytest.approx(float(torch.quantile(u, 0.5)))
    assert s.p90 == pytest.approx(float(torch.quantile(u, 0.9)))
    assert s.ratio == pytest.approx(float(u.mean()) / (g * topk))


# ---------------------------------------------------------------------------------------------- published figures


def test_published_figures_map_onto_the_union_axis():
    rows = published_overlaps()
    ids = {r["id"] for r in rows}
    assert {"trtllm_blog21_layers20_60", "trtllm_blog21_ablation", "trtllm_blog21_layers0_1",
            "vllm_rfc55394_jaccard", "sglang_pr32779_union"} <= ids
    for r in rows:
        assert r["source"] and r["figure"] and r["mapping"]
        if r["overlap_low"] is None:
            assert r["ratio_g8_low"] is None and r["ratio_g8_high"] is None
            continue
        assert r["ratio_g8_high"] == pytest.approx(union_ratio_common_core(r["overlap_low"], 8), abs=1e-4)
        assert r["ratio_g8_low"] == pytest.approx(union_ratio_common_core(r["overlap_high"], 8), abs=1e-4)
    vllm = next(r for r in rows if r["id"] == "vllm_rfc55394_jaccard")  # Jaccard 0.87-0.94 -> 2J / (1 + J)
    assert (vllm["overlap_low"], vllm["overlap_high"]) == pytest.approx((1.74 / 1.87, 1.88 / 1.94), abs=1e-4)
    sgl = next(r for r in rows if r["id"] == "sglang_pr32779_union")
    assert "not found in the stored copy" in sgl["mapping"]


@settings(max_examples=40, deadline=None)
@given(g=st.integers(2, 8), topk=st.integers(1, 10), seed=st.integers(0, 999))
def test_common_core_ratio_bounds_any_chain(g, topk, seed):
    """U <= topk (1 + sum over neighbours of (1 - overlap)): the bound union_ratio_common_core states."""
    gen = torch.Generator().manual_seed(seed)
    sets = [set(torch.randperm(3 * topk, generator=gen)[:topk].tolist()) for _ in range(g)]
    bound = topk + sum(topk - len(a & b) for a, b in zip(sets, sets[1:]))
    assert len(set().union(*sets)) <= bound
    mean_o = sum(len(a & b) for a, b in zip(sets, sets[1:])) / ((g - 1) * topk)
    assert bound == pytest.approx(union_ratio_common_core(mean_o, g) * g * topk)


def test_published_file_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        published_overlaps(tmp_path / "none.json")
    p = tmp_path / "bad.json"
    p.write_text(json.dumps([{"id": "x"}]))
    with pytest.raises(ValueError, match=r"entry 0 \(x\) lacks"):
        published_overlaps(p)
