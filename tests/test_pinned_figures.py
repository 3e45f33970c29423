"""Issue 10's guard: after the restructure the committed data re-derive the same figures as before.

``tests/data/pinned_before_restructure.json`` holds what the lab computed from the committed ``data/`` at commit
4d0e9e4, before the package was restructured: the seed reproduction (full-layer, attention-path and anchored TTFT
changes, TTFT ms, extra MiB, KV tokens lost and capacity), the measured seed rows (attention path measured, the rest
modelled) and every row of the model-validation MAPE table. The same code paths today must give the same numbers.
"""

import csv
import json
from pathlib import Path

import pytest

from mla_lab.deployment import Deployment
from mla_lab.model.calibration import resolve_calibration
from mla_lab.model.memory import memory_tradeoff
from mla_lab.model.ops import attention_op_work
from mla_lab.model.ttft import compare_strategies
from mla_lab.paths import measured_dir
from mla_lab.report.data import load_measured, load_validation
from mla_lab.report.tables import validation_table

PINNED = json.loads((Path(__file__).parent / "data" / "pinned_before_restructure.json").read_text())
#: The first version's strategies are what the lab now calls these (issue 11): ``unfused`` padded with new_zeros
#: per call, ``fused`` was a zero-initialised private workspace.
THEN = {"unfused": "per_call_zeros", "fused": "private_workspace", "kernel_native": "kernel_native"}


def _anchored(cal, d: Deployment):
    """The calibration with the pad and kernel efficiencies re-anchored on the H200 measurements at the seed's own
    shapes (what the deleted ``seed_reproduction`` called its anchored variant; docs/ttft-model.md's table): the pad
    op at T=16384, H=8 (``layer_ops.csv``) and the sparse kernel on the seed step with causal topk_length
    (``layer_extras.csv``, ``seed_16x1024``)."""
    mdir = measured_dir("h200")
    with open(mdir / "layer_ops.csv") as f:
        pad = [r for r in csv.DictReader(f) if r["op"] == "pad" and r["model"] == "glm-5" and r["tp"] == "8"
               and r["T"] == "16384" and r["status"] == "ok"]
    with open(mdir / "layer_extras.csv") as f:
        ker = [r for r in csv.DictReader(f) if r["experiment"] == "kernel_topk_length"
               and r["name"] == "seed_16x1024" and r["ms"]]
    pad_ms, k_ms = float(pad[0]["ms"]), float(ker[0]["ms"])
    return cal.with_attention(
        name="anchored at the seed shapes",
        pad=attention_op_work("pad", 16384, 8, 64, 0) / (pad_ms * 1e-3) / (d.arch.hbm_gbps * 1e9),
        kernel=float(ker[0]["flops"]) / (k_ms * 1e-3) / (d.arch.bf16_tflops * 1e12))


def test_seed_figures_unchanged():
    seed = Deployment.seed()
    kw = dict(strategies=("private_workspace", "kernel_native"), baseline="per_call_zeros")
    full = compare_strategies(seed, **kw)
    attn = compare_strategies(seed, scope="attention_path", **kw)
    anchored = compare_strategies(seed, calibration=_anchored(resolve_calibration(None), seed), **kw)
    for s, v in PINNED["seed_full_layer_delta_pct"].items():
        assert full["delta_pct"][THEN[s]] == pytest.approx(v, abs=1e-9)
    for s, v in PINNED["seed_attention_path_delta_pct"].items():
        assert attn["delta_pct"][THEN[s]] == pytest.approx(v, abs=1e-9)
    for s, v in PINNED["seed_anchored_delta_pct"].items():
        assert anchored["delta_pct"][THEN[s]] == pytest.approx(v, abs=1e-9)
    for s, v in PINNED["seed_ttft_ms_full_layer"].items():
        assert full["results"][THEN[s]]["ttft_ms_mean"] == pytest.approx(v, rel=1e-12)
    mem = memory_tradeoff(seed, strategies=["private_workspace", "kernel_native", "per_call_zeros"])
    assert mem["strategies"]["private_workspace"]["extra_mib"] == PINNED["extra_mib"] == 1008.0
    assert mem["strategies"]["private_workspace"]["kv_tokens_lost"] == pytest.approx(PINNED["kv_tokens_lost"])
    assert mem["kv_capacity_tokens"] == PINNED["kv_capacity_tokens_issue37"]  # 271,663 before issue 37


def test_measured_seed_rows_unchanged():
    # the first version's measured sweep, superseded by the run of issue 12 and kept under archive/
    m = load_measured(Path(__file__).resolve().parent.parent / "data" / "measured" / "h200" / "archive")
    m = m[m["file"] == "padding_sweep_run6.csv"]
    sub = m[(m.model == "glm-5") & (m.tp == 8) & (m.max_num_batched_tokens == 16384) & (m.prompt_len == 1024)]
    sub = sub[sub["legacy_strategy"].fillna("") != ""]  # the first version's rows, relabelled
    got = {r["strategy"]: (r["ttft_ms"], r["ttft_change_pct"]) for _, r in sub.iterrows()}
    for want in PINNED["measured_seed_rows"]:
        ttft, change = got[THEN[want["strategy"]]]
        assert ttft == pytest.approx(want["ttft_ms"], rel=1e-9)
        assert change == pytest.approx(want["ttft_change_pct"], abs=1e-9)


def test_validation_mape_table_unchanged():
    t = validation_table(load_validation(), include_unpaired_deltas=True)
    got = {(r["run"], r["level"], r["op_class"], r["split"]): r for r in t.to_dict(orient="records")}
    assert len(got) == len(PINNED["validation"])
    for want in PINNED["validation"]:
        row = got[(want["run"], want["level"], want["op_class"], want["split"])]
        assert row["n"] == want["n"]
        assert row["MAPE_pct"] == pytest.approx(want["MAPE_pct"], abs=1e-9)
        assert row["max_APE_pct"] == pytest.approx(want["max_APE_pct"], abs=1e-9)
    # the report's table leaves the unpaired deltas out (explained in mla_lab.report.tables.UNPAIRED_DELTA_LEVELS)
    shown = validation_table(load_validation())
    assert not shown["level"].isin(["layer_delta", "layer_graph_delta"]).any()
    assert shown["level"].isin(["layer_paired_delta"]).any()
