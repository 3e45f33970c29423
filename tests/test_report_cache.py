"""The report's digest cache (mla_lab.report.cache) and the pricer's per-step memo: a cached result is the computed
one, a changed argument or input is recomputed, and a memoised step costs what pricing it afresh costs."""

from __future__ import annotations

import math

import pytest

from mla_lab.deployment import Deployment
from mla_lab.report import cache
from mla_lab.serving import serve_benchmark
from mla_lab.serving.step import DecodeToken, PrefillChunk, Step
from mla_lab.serving.step_pricer import CostModelPricer

CALLS: list = []


def _counted(x, y=1):
    CALLS.append((x, y))
    return {"sum": x + y, "list": [x] * y}


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLA_LAB_NO_CACHE", raising=False)
    CALLS.clear()
    return tmp_path / "cache"


def test_cached_call_computes_once_per_argument(tmp_cache):
    a = cache.cached_call(_counted, 2, y=3)
    b = cache.cached_call(_counted, 2, y=3)
    assert a == b == {"sum": 5, "list": [2, 2, 2]}
    assert CALLS == [(2, 3)]  # the second one was read back
    c = cache.cached_call(_counted, 2, y=4)  # another argument: computed
    assert c["sum"] == 6 and CALLS == [(2, 3), (2, 4)]
    assert len(list((tmp_cache / "results").glob("*.pkl"))) == 2


def test_cached_call_off_and_changed_inputs(tmp_cache, monkeypatch):
    cache.cached_call(_counted, 1)
    monkeypatch.setenv("MLA_LAB_NO_CACHE", "1")
    cache.cached_call(_counted, 1)
    assert CALLS == [(1, 1), (1, 1)]  # turned off: recomputed
    monkeypatch.delenv("MLA_LAB_NO_CACHE")
    monkeypatch.setitem(cache._DIGEST, str(cache.measured_dir()), "another-digest")  # an edited input file
    cache.cached_call(_counted, 1)
    assert CALLS == [(1, 1)] * 3


def test_truncated_cache_file_is_recomputed(tmp_cache):
    cache.cached_call(_counted, 7)
    (f,) = (tmp_cache / "results").glob("*.pkl")
    f.write_bytes(b"\x80")
    assert cache.cached_call(_counted, 7)["sum"] == 8
    assert CALLS == [(7, 1), (7, 1)]


def test_cached_serving_run_equals_a_fresh_one(tmp_cache):
    d = Deployment.seed(num_prompts=4, concurrency=None, prompt_len=256, output_len=8, max_num_batched_tokens=2048)
    args = (d, ["vllm-53878"])
    fresh = serve_benchmark(*args)
    cache.cached_call(serve_benchmark, *args)
    back = cache.cached_call(serve_benchmark, *args)
    for s, r in fresh["strategies"].items():
        for k, v in r["metrics"].items():
            assert back["strategies"][s]["metrics"][k] == pytest.approx(v, rel=1e-12, abs=1e-12)


def test_publish_cached_renders_once(tmp_cache, tmp_path):
    from matplotlib.figure import Figure

    built = []

    def build():
        built.append(1)
        fig = Figure(figsize=(3, 2), layout="constrained")
        fig.add_subplot().plot([0, 1], [1, 0])
        return fig

    a = cache.publish_cached(build, "line", tmp_path / "run1", key=[1, 2], show=False)
    b = cache.publish_cached(build, "line", tmp_path / "run2", key=[1, 2], show=False)
    assert built == [1]
    assert a["png"].read_bytes() == b["png"].read_bytes() and b["svg"].is_file()
    cache.publish_cached(build, "line", tmp_path / "run3", key=[1, 3], show=False)  # other data: rendered
    assert built == [1, 1]
    many = cache.publish_cached_many(lambda: [build(), build()], "f_", tmp_path / "run4", key="k", show=False)
    again = cache.publish_cached_many(lambda: [build(), build()], "f_", tmp_path / "run5", key="k", show=False)
    assert len(built) == 4 and [o["png"].name for o in again] == ["f_1.png", "f_2.png"]
    assert many[1]["png"].read_bytes() == again[1]["png"].read_bytes()


def test_pricer_memo_equals_pricing_afresh():
    rank = Deployment.seed().rank
    p = CostModelPricer(rank, "per_call_zeros")
    steps = [Step(decode=(DecodeToken(3, 1100), DecodeToken(5, 1300)), cudagraph_mode="FULL"),
             Step(decode=(DecodeToken(9, 1100), DecodeToken(1, 1300)), cudagraph_mode="FULL"),  # other req ids
             Step(decode=(DecodeToken(1, 1100),), prefill_chunks=(PrefillChunk(2, 0, 512),),
                  cudagraph_mode="PIECEWISE")]
    for s in steps:
        assert p(s) == pytest.approx(CostModelPricer(rank, "per_call_zeros").price(s)["total_ms"],
                                     rel=1e-12)
    assert len(p._memo) == 2  # the renumbered step was read back
    assert math.isfinite(p(steps[1]))


def test_figure_key_is_what_the_frame_holds(tmp_cache):
    import pickle

    import pandas as pd

    df = pd.DataFrame({"a": [1.5, float("nan")], "b": ["x", None], "timestamp": ["t1", "t2"]})
    back = pickle.loads(pickle.dumps(df))
    assert cache._figure_key("figure", "n", (cache.plotted_rows(df), "bf16")) == \
        cache._figure_key("figure", "n", (cache.plotted_rows(back.assign(timestamp=["t3", "t4"])), "bf16"))
    assert cache._figure_key("figure", "n", df) != cache._figure_key("figure", "n", df.assign(a=[1.5, 2.0]))
