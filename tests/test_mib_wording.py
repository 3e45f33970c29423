"""Workspace bytes and extra bytes named apart (issue 24: "subchunk:2048 shown as +0 while it holds 144 MiB"; a run's
headline said "+1008 MiB per rank" without saying it is the extra over vLLM before the PR)."""

import csv

from mla_lab.buffers import memory_account
from mla_lab.deployment import Deployment
from mla_lab.report.site import HEADLINE_POINT, HEADLINE_STRATEGY, run_headline
from mla_lab.sweep.advise import advise, format_advice, strategy_label

MIB = 2**20


def test_advise_shows_the_workspace_held_beside_the_extra():
    r = advise(Deployment.seed(), strategies=["per_call_empty:zeros", "subchunk:2048", "private_workspace"])
    text = format_advice(r)
    header = next(ln for ln in text.splitlines() if ln.startswith("strategy@engine version "))
    assert header.split()[:8] == ["strategy@engine", "version", "TTFT", "ms", "dTTFT", "%", "workspace", "MiB"]
    assert "extra MiB" in header
    base = memory_account("per_call_empty:zeros", 8, 16384, "h200").persistent_bytes
    for s in ("subchunk:2048", "private_workspace", "per_call_empty:zeros"):
        held = memory_account(s, 8, 16384, "h200").persistent_bytes
        row = next(ln for ln in text.splitlines() if ln.startswith(strategy_label(s) + " "))
        cells = row.split()
        assert f"{held / MIB:.0f}" in cells and f"{(held - base) / MIB:+.0f}" in cells, row
        summary = next(x for x in [r["recommendation"], *r["alternatives"], *r["other_engines"]] if x["strategy"] == s)
        assert abs(summary["persistent_mib"] - held / MIB) < 1e-6
        assert abs(summary["extra_persistent_mib"] - (held - base) / MIB) < 1e-6
    sub = next(ln for ln in text.splitlines() if ln.startswith(strategy_label("subchunk:2048") + " ")).split()
    assert sub[3:5] == ["144", "+0"]  # held 144 MiB, +0 extra
    assert (f"'extra MiB' = that minus the baseline's {base / MIB:.0f} MiB unpadded buffer (what costs KV tokens)"
            in text)


def test_run_headline_names_the_extra(tmp_path):
    row = {**HEADLINE_POINT, "strategy": HEADLINE_STRATEGY, "source": "modelled", "status": "ok",
           "fits_in_memory": "True", "ttft_change_pct": "-2.0", "extra_persistent_mib": "1008",
           "kv_tokens_lost": "10554", "kv_capacity_pct_lost": "3.9"}
    with open(tmp_path / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    line = run_headline(tmp_path, {"csv": "rows.csv"})
    assert "+1,008 MiB extra per rank = 10,554 KV tokens lost (3.9 % of KV capacity)" in line, line
