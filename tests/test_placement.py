"""mla_lab.placement is the one place that names strategies and padded-head contents (issue 19).

- :func:`parse_strategy` takes canonical names only (presets and the first version's ``unfused`` / ``fused`` are read
  at the door: :func:`expand`, :func:`resolve_strategy`, :func:`measured_as`), round-trips every name, and takes a
  :class:`Strategy` as it is.
- :func:`expand` turns door names into :class:`Strategy` objects; :func:`expand_strategies` is its names form.
- No module of the package outside ``placement.py`` holds a literal list (tuple, set, dict keys or values) of two or
  more strategy names, nor a content vocabulary other than ``zeros`` / ``stale``: an AST scan of ``mla_lab/``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from mla_lab.placement import (
    ALIASES,
    BASELINE,
    CONTENTS,
    EXPLORER_STRATEGIES,
    PRESETS,
    SEED_STRATEGIES,
    SUBCHUNK_ROWS,
    SWEEP_STRATEGIES,
    Strategy,
    advise_candidates,
    as_strategy,
    canonical_names,
    expand,
    expand_strategies,
    fixed_strategies,
    measured_as,
    parse_strategy,
    real_strategies,
    resolve_strategy,
)

PKG = Path(__file__).resolve().parent.parent / "mla_lab"

#: Lists still held outside placement.py, in modules other engineers own (issue 19, in progress): file -> how many.
#: The scan fails when a file holds more than listed here *or fewer* (then this table must shrink with it), so the
#: only way out is moving the list into mla_lab.placement.
PENDING = {
    "mla_lab/measure/layer.py": 1,  # the layer runner's two concat strategies
    "mla_lab/measure/tp.py": 1,  # the TP harness's default ["unfused", "fused"]
    "mla_lab/report/styles.py": 1,  # STRATEGY_STYLE (moved from report/figures.py: the one style table)
    # the measurement experiments name the strategies they time (moved from benchmarks/, issue 31)
    "mla_lab/fits/predict_pr53878.py": 1,
    "mla_lab/measure/experiments/cold_start.py": 1,
    "mla_lab/measure/experiments/decode_layer.py": 1,
    "mla_lab/measure/experiments/presets.py": 1,
    "mla_lab/measure/experiments/routes_step.py": 1,
    "mla_lab/measure/experiments/tp_block.py": 1,
    "mla_lab/report/packed_figures.py": 2,  # the same kernel names in the rows' summary
}

_SUBCHUNK = re.compile(r"^subchunk:\d+(:copy|:views|:graph2)?$")
_STRATEGY_NAMES = set(fixed_strategies()) | set(PRESETS) | set(ALIASES)
#: Words other modules have used for what the padded heads hold; only CONTENTS (zeros, stale) is the vocabulary.
_CONTENT_WORDS = {"zero", "zeros", "random", "stale", "nonzero", "garbage"}


def _is_strategy_name(node) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (node.value in _STRATEGY_NAMES or bool(_SUBCHUNK.match(node.value))))


def _literal_groups(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            yield node, node.elts
        elif isinstance(node, ast.Dict):
            legacy = all(isinstance(v, ast.Constant) and v.value in CONTENTS for v in node.values)
            if not legacy:  # a table translating old words into the vocabulary (a door's legacy flag) is allowed
                yield node, [k for k in node.keys if k is not None]
            yield node, node.values


@functools.lru_cache(maxsize=4)
def _scan(pkg: Path = PKG) -> tuple[dict, list]:
    """``({file: number of strategy-name lists}, [content-vocabulary findings])`` outside placement.py and the
    engine-version records (mla_lab/engines/presets/: each names its own members)."""
    lists: dict = {}
    content = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg.parent).as_posix()
        if rel == "mla_lab/placement.py" or rel.startswith("mla_lab/engines/presets/"):
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        for node, elts in _literal_groups(tree):
            names = [e.value for e in elts if _is_strategy_name(e)]
            if len(names) >= 2:
                lists[rel] = lists.get(rel, 0) + 1
            words = {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                     and e.value in _CONTENT_WORDS}
            if len(words) >= 2 and not words <= set(CONTENTS) or "random" in words:
                content.append(f"{rel}:{node.lineno}: {sorted(words)}")
    return lists, content


def test_no_strategy_list_outside_placement():
    lists, _ = _scan()
    new = {f: n for f, n in lists.items() if n > PENDING.get(f, 0)}
    assert not new, f"strategy-name lists outside mla_lab/placement.py (move them there): {new}"
    stale = {f: (PENDING[f], lists.get(f, 0)) for f in PENDING if lists.get(f, 0) < PENDING[f]}
    assert not stale, f"PENDING lists more than the files hold now (shrink it): {stale}"


def test_one_content_vocabulary():
    _, content = _scan()
    assert CONTENTS == ("zeros", "stale")
    assert not content, "content words other than zeros/stale: " + "; ".join(content)


def test_the_scan_catches_a_planted_list(tmp_path):
    """Not vacuous: a planted list of two strategy names and a zero/random content pair are both reported."""
    pkg = tmp_path / "mla_lab"
    pkg.mkdir()
    (pkg / "placement.py").write_text('X = ("private_workspace", "per_call_zeros")\n')
    (pkg / "planted.py").write_text('A = {"unfused": 1, "subchunk:4096": 2}\nFILLS = ("zero", "random")\n')
    lists, content = _scan(pkg)  # a fresh tmp path: not a cached scan
    assert lists == {"mla_lab/planted.py": 1}
    assert content == ["mla_lab/planted.py:2: ['random', 'zero']"]


@pytest.mark.parametrize("name", [*fixed_strategies(), "subchunk:1024", "subchunk:4096:views",
                                  "subchunk:2048:graph2"])
def test_parse_round_trips_and_takes_a_strategy(name):
    s = parse_strategy(name)
    assert isinstance(s, Strategy) and s.name == name == str(s)
    assert parse_strategy(s) is s and as_strategy(name) == s
    assert s.content in CONTENTS


@pytest.mark.parametrize("name", ["unfused", "fused", "vllm-53878", "vllm-pre-53878", "kernel-native", "sglang"])
def test_door_names_are_refused_below_the_door(name):
    with pytest.raises(ValueError, match=rf"strategy='{name}' is a preset or alias, read only at the door"):
        parse_strategy(name)


def test_expand_is_the_door():
    got = expand(["unfused", "fused", "kernel_native", "vllm-56902", "subchunk:2048"])
    assert all(isinstance(s, Strategy) for s in got)
    assert [s.name for s in got] == ["per_call_empty:zeros", "per_call_empty:stale", "private_workspace",
                                     "kernel_native", "shared_workspace:none", "subchunk:2048"]
    assert expand_strategies(["unfused", "fused"]) == [s.name for s in expand(["unfused", "fused"])]
    assert [s.name for s in expand("vllm-53878")] == ["private_workspace"]  # a single name: one entry
    assert resolve_strategy("unfused") == BASELINE and resolve_strategy(parse_strategy("private_workspace")) == \
        "private_workspace"
    # what the first version's *measured* rows labelled unfused / fused ran
    assert measured_as("unfused") == "per_call_zeros" and measured_as("fused") == "private_workspace"
    with pytest.raises(ValueError, match="strategy='padded' is not known"):
        expand(["fused", "padded"])


def test_named_sets():
    members = [m for ms in PRESETS.values() for m in ms]
    assert list(SEED_STRATEGIES) == list(dict.fromkeys(
        members + ["shared_workspace:zero_per_call"] + [f"subchunk:{s}" for s in SUBCHUNK_ROWS]
        + ["subchunk:2048:graph2"]))
    assert {f"subchunk:{s}:graph2" for s in SUBCHUNK_ROWS} <= set(SWEEP_STRATEGIES)
    assert "subchunk:5:graph2" in real_strategies()  # several chunks over the two workspaces at T = 24
    assert expand_strategies(SWEEP_STRATEGIES)[:len(members)] == members
    assert set(fixed_strategies()) <= set(EXPLORER_STRATEGIES)
    assert "kernel_native" not in real_strategies() and "per_call_empty:stale" in real_strategies()
    assert advise_candidates(4096) == expand_strategies(list(PRESETS) + ["shared_workspace:zero_per_call"]) + [
        "subchunk:512", "subchunk:512:views", "subchunk:512:graph2", "subchunk:1024", "subchunk:1024:views",
        "subchunk:1024:graph2", "subchunk:2048", "subchunk:2048:views", "subchunk:2048:graph2"]


def test_graph2_handoff():
    """``subchunk:<S>:graph2``: views hand-off, two workspaces, a graphed loop; the other hand-offs one workspace."""
    g = parse_strategy("subchunk:2048:graph2")
    assert (g.placement, g.rows, g.handoff, g.workspaces, g.graphed, g.views_handoff) == \
        ("subchunk", 2048, "graph2", 2, True, True)
    assert parse_strategy("subchunk:2048:views").workspaces == 1 and not parse_strategy("subchunk:2048").graphed
    assert "subchunk:<S>:graph2" in canonical_names()
    with pytest.raises(ValueError, match="'copy' \\(default\\), 'views' or 'graph2'"):
        parse_strategy("subchunk:2048:graph")
