"""Pricers (mla_lab.serving.pricing): the causal top-k lengths of prefill chunks and decode tokens, the linear
reference pricer computed by hand, and the make_pricer adapter hook."""

from __future__ import annotations

import numpy as np
import pytest

from mla_lab.serving.pricing import (
    LinearStepPricer,
    decode_topk_length,
    make_pricer,
    prefill_topk_lengths,
    step_topk_lengths,
)
from mla_lab.serving.step import DecodeToken, PrefillChunk, Step

TOPKS = [1, 4, 2048]
CHUNKS = [(0, 6), (3, 5), (2040, 16), (5000, 3)]


@pytest.mark.parametrize("topk", TOPKS)
@pytest.mark.parametrize("start, n", CHUNKS)
def test_prefill_topk_lengths_are_causal_and_capped(topk, start, n):
    got = prefill_topk_lengths(PrefillChunk(0, start, n), topk)
    assert got.dtype == np.int32 and got.tolist() == [min(p + 1, topk) for p in range(start, start + n)]


def test_prefill_topk_lengths_across_the_2048_boundary():
    assert prefill_topk_lengths(PrefillChunk(0, 2045, 5)).tolist() == [2046, 2047, 2048, 2048, 2048]


@pytest.mark.parametrize("context, want", [(1, 1), (2047, 2047), (2048, 2048), (2049, 2048), (131072, 2048)])
def test_decode_topk_length(context, want):
    assert decode_topk_length(DecodeToken(0, context)) == want


STEP = Step(decode=(DecodeToken(1, 3000), DecodeToken(2, 10)), prefill_chunks=(PrefillChunk(3, 0, 4),
                                                                                PrefillChunk(4, 2046, 3)),
            cudagraph_mode="PIECEWISE", cudagraph_num_tokens=16)


def test_step_topk_lengths_decodes_first():
    assert step_topk_lengths(STEP).tolist() == [2048, 10, 1, 2, 3, 4, 2047, 2048, 2048]


def test_linear_pricer_by_hand():
    # 9 tokens; prefill keys 1+2+3+4 + 2047+2048+2048 = 6153; decode keys 2048 + 10 = 2058; not a full graph.
    p = LinearStepPricer(per_token_ms=0.5, per_step_ms=2.0, per_decode_ctx_ms=0.001, per_prefill_ctx_ms=0.0001,
                         eager_step_ms=3.0)
    assert p(STEP) == pytest.approx(2.0 + 4.5 + 0.6153 + 2.058 + 3.0, abs=1e-12)


def test_linear_pricer_eager_overhead_only_without_a_full_graph():
    p = LinearStepPricer(per_step_ms=1.0, eager_step_ms=5.0)
    dec = (DecodeToken(0, 5),)
    assert p(Step(dec, (), "FULL", 1)) == 1.0
    assert p(Step(dec, (), "NONE", None)) == 6.0


def test_make_pricer_passes_the_attention_shape():
    seen = {}

    def fn(prefill_topk, decode_topk, cuda_graph):
        seen.update(prefill=[a.tolist() for a in prefill_topk], decode=decode_topk.tolist(), graph=cuda_graph)
        return 7.5

    assert make_pricer(fn, topk=2048)(STEP) == 7.5
    assert seen == {"prefill": [[1, 2, 3, 4], [2047, 2048, 2048]], "decode": [2048, 10], "graph": False}


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "3", None])
def test_make_pricer_refuses_a_bad_answer(bad):
    with pytest.raises(ValueError, match=r"pricer fn <lambda> returned .* ms; it must be a finite float > 0"):
        make_pricer(lambda p, d, g: bad)(STEP)


