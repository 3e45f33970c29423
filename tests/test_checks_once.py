"""Each integer of a deployment is checked once, at its door (issue 31): one ``mla-lab advise`` run in-process, with
every module's ``check_int`` replaced by a counter.

Measured on this tree (``mla-lab advise --no-measured``, the seed deployment, 24 strategies): before the rank view
2,218 ``check_int`` calls (``tp`` 151, ``max_num_batched_tokens`` 77, ``prompt_len`` 78, ``head_size`` / ``d_v`` /
``shared_other_bytes`` 73 each, ``world_size`` 168); after it 1,070, with each deployment integer checked once at
``Deployment.of``. With the cost model taking the rank view too (no layer-option memo in ``model.ops``), 1,066:
``tp`` once, ``ep_size`` never, ``num_heads`` 3 (one engine summary per engine version). What remains are the per-step route checks of the engine rules (``seq_len`` / ``query_len`` of
each chunk, :func:`mla_lab.routes.route_for`) and the strategy names' sub-chunk rows, which are not deployment
integers.
"""

from __future__ import annotations

import collections
import sys

from conftest import run_cli

import mla_lab._validate as validate


def _count_checks(monkeypatch) -> collections.Counter:
    import importlib
    import pkgutil

    import mla_lab

    for m in pkgutil.walk_packages(mla_lab.__path__, "mla_lab."):
        if m.name.startswith(("mla_lab.measure", "mla_lab.kernels")):
            continue  # torch / triton: advise imports neither (issue 22)
        importlib.import_module(m.name)
    orig = validate.check_int
    calls: collections.Counter = collections.Counter()

    def counting(name, value, *a, **k):
        calls[name] += 1
        return orig(name, value, *a, **k)

    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("mla_lab") and getattr(mod, "check_int", None) is orig:
            monkeypatch.setattr(mod, "check_int", counting)
    return calls


def test_one_advise_call_checks_each_deployment_integer_once(monkeypatch):
    calls = _count_checks(monkeypatch)
    rc, out, err = run_cli(["advise", "--no-measured"])
    assert rc == 0, err
    assert "recommended" in out
    for name in ("max_num_batched_tokens", "max_num_seqs", "num_prompts", "concurrency", "output_len",
                 "num_speculative_tokens", "dp_attention"):
        assert calls[name] == 1, (name, calls[name])
    # tp: Deployment.of only (the cost model reads the rank view: 2 before, with ops._check_common's memo)
    assert calls["tp"] == 1, calls["tp"]
    # prompt_len / num_heads: Deployment.of plus one engine summary per engine version
    # (mla_lab.placement.engine_summary, three today: placement.today_engines())
    assert calls["prompt_len"] <= 4 and calls["num_heads"] <= 3, (calls["prompt_len"], calls["num_heads"])
    for name in ("head_size", "d_v", "shared_other_bytes", "world_size", "num_tokens", "sum_topk", "ep_size"):
        assert calls[name] == 0, (name, calls[name])  # below the door: the rank view's, never re-checked
    # 2,218 before the rank view, 1,070 before the cost model took it, 1,066 after; +3 since advise checks that one
    # request fits the KV cache before pricing anything (its memory account: issue 31 fresh-user pass); +312 since
    # advise answers within vLLM 0.33.0 and prices today's engines' own paths too (issue 39: 6 more candidates,
    # each route's seq_len / query_len checked per step); +36 for the packed candidate (issue 36), the same way;
    # +2 for the deployment options (issue 37: MTP's num_speculative_tokens and dp_attention, once each at the door)
    assert sum(calls.values()) <= 1419, dict(calls)


def test_one_modelled_grid_point_checks_max_num_batched_tokens_once(monkeypatch):
    from mla_lab.placement import advise_candidates, expand_strategies
    from mla_lab.seed import seed_point
    from mla_lab.sweep.rows import modelled_rows

    calls = _count_checks(monkeypatch)
    point = {**seed_point(), "strategies": expand_strategies(advise_candidates(16384)),
             "shared_workspace_bytes": None}
    rows = modelled_rows(point)
    assert len(rows) > 20
    assert calls["max_num_batched_tokens"] == 1  # 74 before the rank view
    assert calls["tp"] == 1  # 150 before the rank view
