"""The union builder's reference against brute force on random small cases (hypothesis). Kept apart from
tests/test_union_builder.py, whose GPU tests must collect on the bare GPU image, which lacks hypothesis
(tests/test_experiments.py::test_gpu_tests_collect_on_a_bare_gpu_image)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_union_builder import GS, as_sets, brute, make_indices

from mla_lab.kernels.union import build_union_ref


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 40), topk=st.integers(0, 12), s_kv=st.integers(1, 30), g=st.sampled_from(GS),
       lengths=st.sampled_from(("none", "random", "empty")), seed=st.integers(0, 10**6))
def test_reference_matches_brute_force_random(T, topk, s_kv, g, lengths, seed):
    idx, tl = make_indices(T, topk, s_kv, lengths, seed)
    assert as_sets(build_union_ref(idx, tl, g, s_kv)) == brute(idx, tl, g, s_kv)
