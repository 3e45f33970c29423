"""Issue 38: an engine version is one record in one module. A module written here (outside the package) registers
``vllm@9.9.9``; it then shows in ``mla-lab engines``, ``advise``, ``serve`` and the sweep, with no other file
touched. And a strategy is parsed once per advise: below the door the typed value is carried."""

from __future__ import annotations

import importlib
import json

import pytest
from conftest import run_cli

from mla_lab import engines, placement
from mla_lab.deployment import Deployment
from mla_lab.routes import route_for, rules

MODULE = '''
from mla_lab.engines.record import EnginePreset, EngineVersion, version_rule
from mla_lab.engines.presets.vllm_0_33_0 import COMMON

PRESET = EnginePreset(
    "vllm@9.9.9", EngineVersion("vllm", "9.9.9", "2027-01-01", None), "a test release: vLLM 0.33.0's facts",
    version_rule("vllm@9.9.9", COMMON, "fa3-sparse", "topk", ("deepseek", "glm"), backend="FLASH_ATTN_MLA_SPARSE"),
    None, COMMON, members=("fa3_sparse",), order=99)
'''


@pytest.fixture
def new_version(tmp_path, monkeypatch):
    """``vllm@9.9.9`` registered from one module file (imported by name from a folder on sys.path); the registry
    restored afterwards."""
    (tmp_path / "test_preset_vllm_9_9_9.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("test_preset_vllm_9_9_9")
    before = dict(engines.ENGINE_PRESETS)
    engines.register(mod.PRESET)
    yield mod.PRESET
    engines.ENGINE_PRESETS.clear()
    engines.ENGINE_PRESETS.update(before)


def test_a_new_version_is_one_module(new_version):
    assert engines.engine_names()[-1] == "vllm@9.9.9"
    assert "vllm-9.9.9" in rules()
    assert placement.engine_strategies("vllm@9.9.9") == ["fa3_sparse@vllm-9.9.9"]
    st = placement.parse_strategy("fa3_sparse@vllm-9.9.9")
    assert (st.engine, st.route_rule, st.rule) == ("vllm@9.9.9", None, "vllm-9.9.9")
    assert route_for("vllm@9.9.9", "glm", 2048, "prefill", 1024).route == "mha-dense"
    with pytest.raises(ValueError, match="already taken"):
        engines.register(new_version)


def test_the_new_version_shows_in_engines_advise_serve_and_the_sweep(new_version):
    rc, out, err = run_cli(["engines"])
    assert rc == 0, err
    row = next(ln for ln in out.splitlines() if ln.startswith("vllm@9.9.9 "))
    assert "2027-01-01" in row and "FLASH_ATTN_MLA_SPARSE" in row
    rc, out, err = run_cli(["advise", "--no-measured", "--json", "--engine", "vllm@9.9.9"])
    assert rc == 0, err
    res = json.loads(out)
    assert res["engine"] == "vllm@9.9.9" and res["engines"][0]["preset"] == "vllm@9.9.9"
    ranked = [res["recommendation"]] + res["alternatives"]
    assert "fa3_sparse@vllm-9.9.9" in [r["strategy"] for r in ranked]
    rc, out, err = run_cli(["serve", "--json", "--num-prompts", "2", "--random-output-len", "4", "--engine",
                            "vllm@9.9.9", "--strategies", "private_workspace"])
    assert rc == 0, err
    assert "fa3_sparse@vllm-9.9.9" in json.loads(out)["strategies"]
    rc, out, err = run_cli(["sweep", "--dry-run", "-p", "strategies", '["vllm@9.9.9", "private_workspace"]'])
    assert rc == 0, err
    assert "fa3_sparse@vllm-9.9.9" in out


def test_a_strategy_is_parsed_once_at_the_door_and_carried(monkeypatch):
    """:func:`~mla_lab.placement.expand` reads each name it is handed once (a preset's or an engine version's
    members once per process); the views below it (engine members, preset_of, routes, engine summaries) take the
    values and read no name again. Counted: calls of the one parser on a str."""
    calls = []
    real = placement._parse
    monkeypatch.setattr(placement, "_parse", lambda name: calls.append(name) or real(name))
    given = ["subchunk:2048:graph2", "packed:0.3", "private_workspace", "fa3_sparse@vllm-0.33.0"]
    names = [*placement.PRESETS, *engines.engine_names(), *given]
    placement.expand(names)  # the records' and presets' members: parsed on first read
    calls.clear()
    values = placement.expand(names + given)
    assert calls == given
    assert len(values) == len({v.name for v in values})
    calls.clear()
    for st in values:
        placement.strategy_route(st, "glm", 2048, 1024, 1024, num_heads=8)
        placement.preset_of(st.name)
    placement.engine_table(Deployment.seed())
    assert placement.expand(values) == values
    assert calls == []
