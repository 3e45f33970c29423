"""Issue 38: a strategy is one record in one module, its pricing beside it. A module written here (outside the
package) declares ``KIND`` for ``test_real`` (a test-only real-head kernel on vLLM's FA3 routes, not a real
engine's); registered, it reaches ``advise``, ``serve`` and the sweep with no other file touched."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest
from conftest import run_cli

from mla_lab import placement
from mla_lab.deployment import Deployment
from mla_lab.model import strategy_kinds
from mla_lab.model.decode_kernels import decode_family
from mla_lab.model.ops import attention_path_ops
from mla_lab.sweep.advise import advise

MODULE = '''
"""Test-only strategy (no engine runs it): the real heads concatenated, a kernel padded inside to its 64-row tile."""

from mla_lab.model.ops import padded_path_ops
from mla_lab.placement import Strategy, StrategyKind


def price(rank, spec, T, sum_topk, step):
    return padded_path_ops(rank, spec, T, sum_topk, native=True)


def memory(spec, s):
    """The real-head Q buffer plus a 1 MiB persistent table of its own."""
    return {"persistent": s.unpadded + 2**20}


KIND = StrategyKind("test_real", 99, "vllm-fa3", "real", "fa3_sparse", price, fixed=(Strategy("test_real", "zeros"),),
                    memory=memory, shown="modelled_only", display="test_real (a test kernel)",
                    notes=("test_real: a test-only kernel, in no engine",))
'''


@pytest.fixture
def new_kind(tmp_path, monkeypatch):
    """``test_real`` registered from one module file (imported by name from a folder on sys.path); the registry
    restored afterwards."""
    (tmp_path / "test_kind_test_real.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(placement.KINDS)
    kind = placement.register_kind(importlib.import_module("test_kind_test_real").KIND)
    yield kind
    placement.KINDS.clear()
    placement.KINDS.update(before)


def test_every_module_of_the_package_is_a_registered_kind():
    mods = {m.name for m in pkgutil.iter_modules(strategy_kinds.__path__)}
    assert mods == set(placement.KINDS)
    assert all(importlib.import_module(f"{strategy_kinds.__name__}.{m}").KIND is placement.KINDS[m] for m in mods)


def test_a_new_strategy_is_one_module(new_kind):
    st = placement.parse_strategy("test_real")
    assert (st.kind, st.rule, st.padded, st.name) == (new_kind, "vllm-fa3", False, "test_real")
    assert "test_real" in placement.fixed_strategies() and "test_real" in placement.canonical_names()
    assert placement.parse_strategy("test_real@vllm-flashmla").route_rule == "vllm-flashmla"
    assert decode_family("test_real") == "fa3_sparse"
    ops = {o.name: o for o in attention_path_ops(Deployment.seed().rank, st, 1024)}
    assert set(ops) == {"concat", "kernel"} and ops["kernel"].dims["native"] == 1
    with pytest.raises(ValueError, match="already taken"):
        placement.register_kind(new_kind)
    with pytest.raises(ValueError, match="rule 'no-such-rule' is not known"):
        placement.register_kind(placement.StrategyKind("x", 0, "no-such-rule", "real", "fa3_sparse", new_kind.price))


def test_the_new_strategy_reaches_advise_serve_and_the_sweep(new_kind):
    res = advise(Deployment.seed(), strategies=["test_real", "kernel_native@vllm-fa3", "private_workspace"])
    rows = {r["strategy"]: r for r in [res["recommendation"], *res["alternatives"], *res["other_engines"],
                                        *res["modelled_only"]] if r}
    # priced by its own module: kernel_native's path under the same rule, so the same prefill time; its memory
    # hook's 1 MiB table on top of the same real-head Q buffer; shown where its record says, with its label and note
    twin = rows["kernel_native@vllm-fa3"]
    assert rows["test_real"]["ttft_ms"] == pytest.approx(twin["ttft_ms"]) and rows["test_real"]["ttft_ms"] > 0
    assert twin["persistent_mib"] > 0
    assert rows["test_real"]["persistent_mib"] == pytest.approx(twin["persistent_mib"] + 1)
    mine = next(r for r in res["modelled_only"] if r["strategy"] == "test_real")
    assert mine["label"] == "test_real (a test kernel)" and "test_real" not in res["frontier"]
    assert mine["reason"] == "test_real: a test-only kernel, in no engine"
    assert placement.strategy_notes(["test_real", "private_workspace"]) == [mine["reason"]]
    rc, out, err = run_cli(["serve", "--json", "--num-prompts", "2", "--random-output-len", "4", "--strategies",
                            "test_real", "private_workspace"])
    assert rc == 0, err
    assert "test_real" in json.loads(out)["strategies"]
    rc, out, err = run_cli(["sweep", "--dry-run", "-p", "strategies", '["test_real", "private_workspace"]'])
    assert rc == 0, err
    assert "test_real" in out
