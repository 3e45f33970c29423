"""The rewritten experiments (issue 38) measure, on the seed rank (GLM-5 TP 8 on the H200, 16384 tokens), the grid
their committed rows hold: the rank replaced the hard-coded seed without moving a shape. Reads the committed files
under data/measured/h200/; CPU only (the grids, not the timings)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from mla_lab.deployment import Deployment
from mla_lab.measure.experiments import Options, decode_layer, engines, packed_kernels, presets
from mla_lab.measure.experiments._common import ranks_of

H200 = Path(__file__).resolve().parent.parent / "data" / "measured" / "h200"


@pytest.fixture(scope="module")
def seed():
    return Deployment.seed().rank


def _keys(df, cols):
    return {tuple(r) for r in df[cols].drop_duplicates().itertuples(index=False)}


def test_decode_layer_grid(seed):
    d = pd.read_csv(H200 / "round2" / "decode_layer.csv")
    plan = decode_layer.plan(seed, Options(Path(".")))
    want = {(r.model.name, e["batch"], e["context"], e.get("prefill_tokens", 0))
            for r in ranks_of(seed, decode_layer.MODELS) for e in plan}
    assert _keys(d, ["model", "batch", "context", "prefill_tokens"]) == want and len(want) == 40
    assert set(d["H"]) == {r.num_heads for r in ranks_of(seed, decode_layer.MODELS)} and set(d["Hp"]) == {64}


def test_engines_grids(seed):
    content = pd.read_csv(H200 / "round2" / "content.csv")
    assert _keys(content, ["T", "H", "pattern"]) == set(engines.content_shapes(seed))  # 24 shapes
    rows = pd.read_csv(H200 / "round2" / "presets.csv")
    names = {(n, float(S) if S else float("nan")) for n, S in engines.preset_names(seed.max_num_batched_tokens)}
    got = {(n, S) for n, S in _keys(rows, ["preset", "S"])}
    assert {(n, S) for n, S in got if S == S} == {(n, S) for n, S in names if S == S}
    assert {n for n, S in got if S != S} == {n for n, S in names if S != S}
    assert set(rows["model"]) == {"glm-5", "deepseek-v3.2"} and set(rows["T"]) == {seed.max_num_batched_tokens}


def test_presets_grid():
    bp = pd.read_csv(H200 / "between_process" / "presets.csv")
    assert set(bp["strategy"]) == set(presets.PRESET_STRATEGIES)


def test_packed_kernels_shapes():
    rows = pd.read_csv(H200 / "between_process" / "packed_kernels.csv")
    assert set(rows["shape"]) - {"boundaries"} == {s for s, _ in packed_kernels.SHAPES}  # boundaries: the check rows
