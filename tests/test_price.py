"""The one pricing entry (issue 38): ``price(deployment, strategies) -> list[Row]``; advise takes one memory account."""

import importlib

from mla_lab.deployment import Deployment
from mla_lab.placement import BASELINE
from mla_lab.sweep.rows import Row, modelled_rows, price

advise_mod = importlib.import_module("mla_lab.sweep.advise")
rows_mod = importlib.import_module("mla_lab.sweep.rows")


def test_one_memory_account_per_advise(monkeypatch):
    calls = []
    real = rows_mod.memory_tradeoff

    def counting(*a, **k):
        calls.append(k.get("strategies"))
        return real(*a, **k)

    for mod in (advise_mod, rows_mod):
        monkeypatch.setattr(mod, "memory_tradeoff", counting)
    res = advise_mod.advise(Deployment.seed())
    assert len(calls) == 1  # 2 before (a baseline-only account for the fit check, then the rows' own)
    assert res["recommendation"] is not None and len(calls[0]) > 20


def test_price_gives_typed_rows_and_the_sweep_writes_them_flat():
    d = Deployment.seed()
    rows = price(d, ["private_workspace", "subchunk:2048"])
    assert all(isinstance(r, Row) for r in rows) and [r.name for r in rows][0] == BASELINE
    by = {r.name: r for r in rows}
    assert by["private_workspace"].extra_persistent_bytes == 1_056_964_608 and by[BASELINE].ttft_change_pct == 0
    flat = by["private_workspace"].to_point(num_runs=7)
    assert Deployment.from_point(flat) == d and flat["extra_persistent_mib"] == 1008
    # the sweep's door writes the same numbers (the point dict only there)
    swept = {r["strategy"]: r for r in modelled_rows(d.to_point(strategies=["private_workspace", "subchunk:2048"]))}
    for name, r in by.items():
        assert swept[name]["ttft_ms"] == r.ttft_ms and swept[name]["kv_tokens_lost"] == r.kv_tokens_lost
        assert swept[name]["source"] == "modelled"
