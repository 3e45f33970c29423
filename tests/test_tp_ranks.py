"""The report's TP section (mla_lab.report.tp_ranks, seed_comm_sensitivity) recomputed from the committed NCCL runs:
data/measured/h200x2/tp2_attention.csv (TP=2, 2 H200s) and data/calibration/h200_comm.csv. TP 4 and 8 were not
measured; the tables must say so rather than show a number."""

from __future__ import annotations

import pandas as pd
import pytest

from mla_lab.model.calibration import default_calibration
from mla_lab.paths import measured_dir
from mla_lab.report.seed_answer import seed_comm_sensitivity
from mla_lab.report.tp_ranks import comm_fit_table, load_tp_runs, tp_rank_table, tp_status_table

TP2 = measured_dir("h200x2") / "tp2_attention.csv"


def test_status_names_what_was_measured_and_what_was_not():
    t = tp_status_table().set_index("TP")
    assert t.loc[2, "measured"] == "yes" and t.loc[2, "files"] == "h200x2/tp2_attention.csv"
    assert t.loc[2, "ranks"] == 2 and t.loc[2, "configurations"] == 8  # 2 models x 2 T x 2 strategies
    for n in (4, 8):
        if (measured_dir(f"h200x{n}") / "tp_block.csv").is_file():
            continue  # measured since: the status must say yes (checked by the synthetic test below)
        assert t.loc[n, "measured"] == "no" and t.loc[n, "ranks"] == 0
        assert f"needs {n} GPUs" in t.loc[n, "note"]
        if (measured_dir("h200") / f"tp{n}_sim_block.csv").is_file():
            assert f"h200/tp{n}_sim_block.csv" in t.loc[n, "note"]


def test_every_rank_is_reported_and_the_errors_follow_from_the_raw_columns():
    raw = pd.read_csv(TP2)
    t = tp_rank_table()
    t2 = t[t["TP"] == 2]
    assert len(t2) == (raw["run"] == "tp").sum() == 16 and sorted(t2["rank"].unique()) == [0, 1]
    for _, r in t2.iterrows():
        same = (raw["model"] == r["model"]) & (raw["T"] == r["T"]) & (raw["strategy"] == r["strategy"])
        sim = raw[same & (raw["run"] == "sim")]
        rank = raw[same & (raw["run"] == "tp") & (raw["rank"] == r["rank"])]
        assert r["sim_compute_ms"] == sim["compute_ms"].iloc[0]
        assert r["compute_err_%"] == pytest.approx(100 * (sim["compute_ms"].iloc[0] / rank["compute_ms"].iloc[0] - 1))
        assert r["block_ms"] == rank["block_ms"].iloc[0] and r["allreduce_ms"] == rank["allreduce_ms"].iloc[0]
        assert r["peak_MiB"] == r["sim_peak_MiB"]  # the simulation's call peak equals the real rank's, to the byte
    # docs/findings.md figures: per-rank compute error, block error with the TP=2 all-reduce fit, NCCL's own memory
    assert round(t2["compute_err_%"].min(), 1) == -1.5 and round(t2["compute_err_%"].max(), 1) == 9.7
    assert round(t2["block_err_%"].min(), 1) == -3.2 and round(t2["block_err_%"].max(), 1) == 4.8
    assert round(t2["nccl_MiB"].min()) == 840 and round(t2["nccl_MiB"].max()) == 854
    assert t2["comm_source"].str.startswith("measured fit tp=2").all()


def test_comm_fit_table_gives_the_fit_at_tp2_and_the_assumption_elsewhere():
    t = comm_fit_table().set_index("TP")
    assert t.loc[2, "priced by"].startswith("measured fit tp=2")
    assert round(t.loc[2, "bw_gbps"]) == 286 and round(t.loc[2, "latency_us"]) == 65
    assert round(t.loc[2, "assumption error %"]) == 34  # the 0.8 x 450 GB/s ring, no latency, against TP=2
    if default_calibration().comm.fit_for(8) is None:
        assert t.loc[8, "priced by"].startswith("assumption") and t.loc[8, "rank rows"] == 0
        assert pd.isna(t.loc[8, "MAPE %"]) and t.loc[8, "bw_gbps"] == pytest.approx(360.0)


def test_seed_change_under_each_comm_term():
    s = seed_comm_sensitivity(models=("glm-5",)).set_index("comm term")
    col = "PR vs before, zeros, modelled %"
    assert round(s.loc["committed calibration", col], 1) == -2.0
    assert round(s.loc["ideal ring (lower bound)", col], 1) == -2.1
    ext = "tp=2 fit extrapolated to tp=8"
    if ext in s.index:  # while TP=8 is unmeasured
        assert round(s.loc[ext, col], 1) == -1.9
        assert "not measured at tp=8" in s.loc[ext, "priced by"]
        assert round(s.loc[ext, "all-reduce ms"]) == 407 and round(s.loc["committed calibration", "all-reduce ms"]) == 307
    assert round(s.loc["ideal ring (lower bound)", "all-reduce ms"]) == 246
    # a slower all-reduce makes the denominator larger and the PR's relative change smaller
    order = s.sort_values("all-reduce ms")[col]
    assert list(order) == sorted(order)


def test_a_tp8_run_is_picked_up_per_rank(tmp_path):
    """A tp_block.csv under h200x8 (mla_lab/measure/experiments/tp_block.py's file) shows as measured, with all 8 ranks."""
    d = tmp_path / "h200x8"
    d.mkdir()
    rows = []
    for run, ranks, ws in (("tp", range(8), 8), ("sim", [0], 1)):
        for rank in ranks:
            rows.append({"run": run, "rank": rank, "world_size": ws, "tp": 8, "model": "glm-5", "T": 4096,
                         "block": "attention", "strategy": "vllm-53878", "num_heads": 8, "block_ms": 2.0 + rank / 100,
                         "compute_ms": 1.8, "allreduce_ms": 0.2 if run == "tp" else None, "allreduce_bytes": 4096 * 6144 * 2,
                         "peak_extra_bytes": 100, "device_used_bytes": 1000, "nccl_bytes": 7 * 2**20 if run == "tp" else None,
                         "device": "NVIDIA H200", "git_commit": "abc"})
    pd.DataFrame(rows).to_csv(d / "tp_block.csv", index=False)
    st = tp_status_table(root=tmp_path).set_index("TP")
    assert st.loc[8, "measured"] == "yes" and st.loc[8, "ranks"] == 8 and st.loc[2, "measured"] == "no"
    t = tp_rank_table(root=tmp_path)
    assert list(t["rank"]) == list(range(8)) and (t["nccl_MiB"] == 7).all()
    assert len(load_tp_runs(root=tmp_path)) == 9


@pytest.mark.parametrize("fn", [tp_status_table, tp_rank_table, comm_fit_table])
@pytest.mark.parametrize("bad", [[0], [-1], ["2"], [2.5], [True], None])
def test_bad_world_sizes_are_refused_not_read_as_not_measured(fn, bad):
    """["2"] used to give TP=2 "not measured" (a str never equals the int column), [0] "needs 0 GPUs"."""
    with pytest.raises(ValueError, match=r"world_sizes=.* is not valid; allowed: a list of integer world sizes >= 2"):
        fn(world_sizes=bad)


@pytest.mark.parametrize("fn", [tp_status_table, tp_rank_table, comm_fit_table])
def test_bad_gpu_is_refused(fn):
    with pytest.raises(ValueError, match="bogus"):
        fn(gpu="bogus")
    with pytest.raises(ValueError, match="gpu='hopper' is not valid"):  # an alias is not a folder prefix
        fn(gpu="hopper")


def test_world_sizes_accept_integral_numbers():
    assert list(tp_status_table(world_sizes=[2.0])["TP"]) == [2]
    assert tp_status_table(world_sizes=[2.0]).loc[0, "measured"] == "yes"
    assert list(tp_status_table(world_sizes=8)["TP"]) == [8]


@pytest.mark.parametrize("text,match", [("", "not a readable CSV"), ("a,b\n1,2\n", r"missing column\(s\)")])
def test_a_foreign_tp_block_file_is_named(tmp_path, text, match):
    d = tmp_path / "h200x4"
    d.mkdir()
    (d / "tp_block.csv").write_text(text)
    for fn in (tp_status_table, tp_rank_table, load_tp_runs):
        with pytest.raises(ValueError, match="h200x4/tp_block.csv: " + match):
            fn(root=tmp_path)


def test_one_gpu_shares_of_tp8_and_tp4_as_docs_state():
    """docs/scaling.md's figures of the one-GPU simulation of the TP-8 / TP-4 shares (no real TP-8 run yet)."""
    s8 = pd.read_csv(measured_dir("h200") / "tp8_sim_block.csv")
    s4 = pd.read_csv(measured_dir("h200") / "tp4_sim_block.csv")
    loop = pd.read_csv(measured_dir("h200") / "tp8_sim_moe_loop.csv")
    assert (s8["run"] == "sim").all() and (s8["tp"] == 8).all() and (s4["tp"] == 4).all()
    assert set(s8.loc[s8["block"] == "moe", "moe_impl"]) == {"grouped_mm"} and set(loop["moe_impl"]) == {"loop"}

    def att(d, model, T, col):
        g = d[(d["block"] == "attention") & (d["model"] == model) & (d["T"] == T)][col]
        return round(g.min(), 2), round(g.max(), 2)

    assert att(s8, "glm-5", 16384, "attn_ms") == (6.88, 7.86) and att(s4, "glm-5", 16384, "attn_ms") == (7.11, 8.09)
    assert att(s8, "glm-5", 4096, "compute_ms") == (1.67, 1.84) and att(s8, "glm-5", 16384, "compute_ms") == (7.66, 8.6)

    def moe(d, model, T):
        return round(d[(d["block"] == "moe") & (d["model"] == model) & (d["T"] == T)]["compute_ms"].iloc[0], 2)

    assert (moe(s8, "glm-5", 4096), moe(s8, "glm-5", 16384)) == (2.44, 5.92)
    assert (moe(s4, "glm-5", 4096), moe(s4, "glm-5", 16384)) == (3.64, 10.08)
    assert (moe(loop, "glm-5", 4096), moe(loop, "glm-5", 16384)) == (5.26, 7.6)
