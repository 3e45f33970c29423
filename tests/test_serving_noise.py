"""The noise model of one ``vllm bench serve`` run (mla_lab.serving.noise) and the PR #53878 prediction file."""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from mla_lab.paths import REPO_ROOT
from mla_lab.serving import BenchConfig, ConstantPricer, LinearStepPricer, SchedulerConfig, simulate
from mla_lab.serving.noise import (
    METRICS,
    ArrivalModel,
    CachedPricer,
    NoiseConfig,
    load_cold_start,
    run_noise,
    simulate_once,
)

BENCH = BenchConfig(num_prompts=8, random_input_len=1024, random_output_len=16, max_concurrency=8)
SCHED = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=256, kv_capacity_tokens=1 << 20, block_size=64,
                        async_scheduling=True)
PRICER = LinearStepPricer(per_token_ms=0.02, per_step_ms=8.0)
# a noise model whose parts are all visible at this small scale (the first large step is one of 4096 tokens)
NOISE = NoiseConfig(arrival=ArrivalModel(first_ms=2.0, per_request_ms=3.0, cv=0.5), cpu_step_ms=1.0,
                    output_delay_ms=0.5, run_sigma=0.02, step_sigma=0.01, cold_extra_ms=15.0, cold_sd_ms=10.0,
                    cold_min_tokens=2048)


def _metrics(res) -> dict:
    return {k: res.metrics[k] for k in METRICS}


# ------------------------------------------------------------------------------------------ reproducible
def test_monte_carlo_is_seeded_and_reproducible():
    a = run_noise(BENCH, SCHED, PRICER, num_runs=6, seed=7, noise=NOISE)
    b = run_noise(BENCH, SCHED, PRICER, num_runs=6, seed=7, noise=NOISE)
    c = run_noise(BENCH, SCHED, PRICER, num_runs=6, seed=8, noise=NOISE)
    for m in METRICS:
        np.testing.assert_array_equal(a.a[m], b.a[m])
        np.testing.assert_array_equal(a.change[m], b.change[m])
    assert not np.array_equal(a.a["mean_ttft_ms"], c.a["mean_ttft_ms"])
    # run i draws from SeedSequence([seed, build, i]): the first runs do not depend on num_runs
    longer = run_noise(BENCH, SCHED, PRICER, num_runs=9, seed=7, noise=NOISE)
    np.testing.assert_array_equal(longer.a["mean_ttft_ms"][:6], a.a["mean_ttft_ms"])
    # the two builds are independent draws: A vs A' runs differ
    assert not np.array_equal(a.a["mean_ttft_ms"], a.b["mean_ttft_ms"])


def test_zero_noise_equals_the_deterministic_simulation():
    quiet = NOISE.without_noise()
    res = run_noise(BENCH, SCHED, PRICER, num_runs=3, seed=1, noise=quiet)
    det = _metrics(simulate_once(BENCH, SCHED, PRICER, NOISE, None))
    # the same run restated with simulate(): hand-made delays (queue: 2 ms, then 3 ms per request), CPU time,
    # delivery delay, and the cold extra on the first step of >= 2048 tokens
    delays = [(2.0 + 3.0 * (k + 1)) / 1e3 for k in range(BENCH.num_prompts)]
    seen = []

    def cold_pricer(step):
        extra = 15.0 if step.num_tokens >= 2048 and not seen else 0.0
        if extra:
            seen.append(step)
        return PRICER(step) + extra

    direct = _metrics(simulate(BENCH, SCHED, cold_pricer, engine_delay_s=delays, cpu_step_ms=1.0,
                               output_delay_s=0.5e-3))
    for m in METRICS:
        assert det[m] == pytest.approx(direct[m], rel=1e-12), m
        np.testing.assert_allclose(res.a[m], det[m], rtol=1e-12)
        np.testing.assert_allclose(res.b[m], det[m], rtol=1e-12)
        assert res.deterministic_a[m] == pytest.approx(det[m], rel=1e-12)
    np.testing.assert_allclose(res.change["mean_ttft_ms"], 0.0, atol=1e-9)


def test_all_at_t0_async_off_and_no_components_is_todays_simulate():
    sync = replace(SCHED, async_scheduling=False)
    today = simulate(BENCH, sync, PRICER).metrics
    for sched in (sync, SCHED):  # with every request at t = 0, async scheduling builds the same run
        now = simulate_once(BENCH, sched, PRICER, NoiseConfig.none()).metrics
        for m in METRICS:
            assert now[m] == pytest.approx(today[m], rel=1e-12), (sched.async_scheduling, m)


def test_hand_trace_numbers_unchanged_under_the_noise_wrapper():
    # tests/test_serving_scheduler.py's trace: 3 x 1500-token prompts, output 3, budget 2048, 10 ms per step
    bench = BenchConfig(num_prompts=3, random_input_len=1500, random_output_len=3)
    sched = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=256, kv_capacity_tokens=1 << 20)
    res = simulate_once(bench, sched, ConstantPricer(10.0), NoiseConfig.none())
    assert [round(r.ttft_s * 1e3, 9) for r in res.requests] == [10.0, 20.0, 30.0]
    assert res.metrics["duration"] == pytest.approx(0.050)


# ------------------------------------------------------------------------------------------ components
def test_arrival_queue_delays():
    am = ArrivalModel(first_ms=2.0, per_request_ms=1.5, cv=0.0)
    np.testing.assert_allclose(am.delays_s([0.0] * 4), [0.0035, 0.005, 0.0065, 0.008])
    # arrivals far apart never queue: each waits first + one service time
    np.testing.assert_allclose(am.delays_s([0.0, 1.0, 2.0]), [0.0035] * 3)
    # a request arriving while the server is busy waits for it: the 2nd arrives at 1 ms, server free at 3.5 ms
    np.testing.assert_allclose(am.delays_s([0.0, 0.001]), [0.0035, 0.004])
    # gamma service times: mean per_request_ms, cv as given (CLT check over many requests)
    rng = np.random.default_rng(0)
    d = ArrivalModel(first_ms=0.0, per_request_ms=1.0, cv=0.5).delays_s([0.0] * 4000, rng)
    gaps = np.diff(np.sort(d))
    assert gaps.mean() == pytest.approx(1e-3, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(0.5, rel=0.06)


def test_cold_extra_lands_on_the_first_large_step_only():
    nc = replace(NoiseConfig.none(), cold_extra_ms=40.0, cold_min_tokens=2048)
    base = simulate_once(BENCH, SCHED, PRICER, NoiseConfig.none())
    cold = simulate_once(BENCH, SCHED, PRICER, nc)
    big = [i for i, s in enumerate(base.steps) if s.step.num_tokens >= 2048]
    assert len(big) >= 2
    diff = [c.duration_ms - b.duration_ms for b, c in zip(base.steps, cold.steps)]
    assert diff[big[0]] == pytest.approx(40.0)
    assert sum(abs(x) for i, x in enumerate(diff) if i != big[0]) == pytest.approx(0.0, abs=1e-9)


def test_cached_pricer_prices_each_distinct_step_once():
    calls = []

    def pricer(step):
        calls.append(step)
        return PRICER(step)

    cp = CachedPricer(pricer)
    res = run_noise(BENCH, SCHED, cp, num_runs=4, seed=0, noise=NOISE.without_noise())
    # run_noise wraps the pricer in its own cache: the inner pricer is called once per distinct step
    assert len(calls) == cp.misses == len(cp.cache) == res.cache["a"]["misses"]
    assert cp.hits == 0
    assert res.cache["a"]["hits"] > 0  # 4 + 4 identical runs + the deterministic ones, one schedule


# ------------------------------------------------------------------------------------------ distributions
def test_identical_builds_change_is_centred_on_zero_and_a_faster_build_shifts_it():
    ident = run_noise(BENCH, SCHED, PRICER, num_runs=120, seed=3, noise=NOISE)
    faster = LinearStepPricer(per_token_ms=0.019, per_step_ms=7.6)  # every step 5 % faster
    ab = run_noise(BENCH, SCHED, PRICER, faster, num_runs=120, seed=3, noise=NOISE)
    for m in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "duration"):
        lo, hi = ident.band(m)
        assert lo < 0 < hi, m
        sd = float(np.std(ident.change[m]))
        # median of A vs A' ~ 0: within 3 standard errors of a sample median (1.25 sd / sqrt(n))
        assert abs(ident.quantiles(m)[1]) < 3 * 1.25 * sd / math.sqrt(ident.num_runs), m
        assert abs(float(np.mean(ident.change[m]))) < 3 * sd / math.sqrt(ident.num_runs) + 0.05 * sd, m
        assert ident.percentile_of(m, 0.0) == pytest.approx(50.0, abs=15.0), m
        # the spread of one run is wider than the zero-noise change of A vs A' (0)
        assert hi - lo > 0.5, m
    # the faster build's change is centred near the deterministic change (~ -5 % minus the fixed delays' share)
    det = (ab.deterministic_b["mean_ttft_ms"] - ab.deterministic_a["mean_ttft_ms"]) / ab.deterministic_a[
        "mean_ttft_ms"] * 100
    assert -5.0 < det < -3.0
    sd = float(np.std(ab.change["mean_ttft_ms"]))
    assert abs(ab.quantiles("mean_ttft_ms")[1] - det) < 3 * 1.25 * sd / math.sqrt(ab.num_runs)
    assert ab.percentile_of("mean_ttft_ms", det) == pytest.approx(50.0, abs=15.0)
    assert ab.percentile_of("total_token_throughput", 0.0) < ident.percentile_of("total_token_throughput", 0.0)


def test_percentile_of_counts_below_and_half_the_ties():
    res = run_noise(BENCH, SCHED, PRICER, num_runs=3, seed=0, noise=NOISE.without_noise())
    # every change is exactly 0: 0 is at percentile 50 (ties half), anything above at 100, below at 0
    assert res.percentile_of("mean_ttft_ms", 0.0) == pytest.approx(50.0)
    assert res.percentile_of("mean_ttft_ms", 1.0) == pytest.approx(100.0)
    assert res.percentile_of("mean_ttft_ms", -1.0) == pytest.approx(0.0)


def test_noise_config_record_round_trips():
    rec = json.loads(json.dumps(NOISE.record()))
    assert NoiseConfig.from_record(rec) == NOISE


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kw, name", [(dict(cpu_step_ms=-1.0), "cpu_step_ms"), (dict(run_sigma=float("nan")),
                                                                             "run_sigma"),
                                      (dict(cold_min_tokens=0), "cold_min_tokens")])
def test_noise_config_refuses_bad_values(kw, name):
    with pytest.raises(ValueError, match=name):
        NoiseConfig(**kw)


def test_run_noise_and_simulate_refuse_bad_input():
    with pytest.raises(ValueError, match="num_runs"):
        run_noise(BENCH, SCHED, PRICER, num_runs=1)
    with pytest.raises(ValueError, match="noise"):
        run_noise(BENCH, SCHED, PRICER, num_runs=2, noise={"cpu_step_ms": 1})
    with pytest.raises(ValueError, match="engine_delay_s"):
        simulate(BENCH, SCHED, PRICER, engine_delay_s=[0.0, 0.0])
    with pytest.raises(ValueError, match=r"engine_delay_s\[0\]"):
        simulate(BENCH, SCHED, PRICER, engine_delay_s=[-1.0] + [0.0] * 7)
    with pytest.raises(ValueError, match="cpu_step_ms"):
        simulate(BENCH, SCHED, PRICER, cpu_step_ms=float("inf"))
    res = run_noise(BENCH, SCHED, PRICER, num_runs=2, noise=NOISE.without_noise())
    with pytest.raises(ValueError, match="metric"):
        res.band("ttft")
    with pytest.raises(ValueError, match="which"):
        res.quantiles("mean_ttft_ms", "c")


# ------------------------------------------------------------------------------------------ cold_start.csv
_HEAD = "process,what,call,wall_ms,gpu_ms,steady_wall_ms,steady_gpu_ms,steady_n,T,num_heads,gpu\n"


def _cold_rows(proc: int, att2: float, moe2: float, steady_att: float, steady_moe: float) -> str:
    rows = ""
    for what, c2, st in (("attention_block:private_workspace", att2, steady_att), ("moe_block:grouped_mm", moe2,
                                                                                    steady_moe)):
        for call, wall in ((1, 900.0), (2, st + c2), (3, st)):
            rows += f"{proc},{what},{call},{wall},{wall},{st},{st},20,16384,8,H200\n"
    rows += f"{proc},attention_path:private_workspace,1,50.0,50.0,2.5,2.5,20,16384,8,H200\n"
    return rows


def test_load_cold_start_reads_round3_rows(tmp_path):
    p = tmp_path / "cold_start.csv"
    p.write_text(_HEAD + _cold_rows(1, 1.0, 3.0, 4.0, 6.0) + _cold_rows(2, 2.0, 4.0, 4.4, 6.6))
    sp = tmp_path / "step_spread.csv"
    lines = ["process,what,sample,wall_ms,gpu_ms"]
    for proc in (1, 2):
        for i, (a, m) in enumerate(((4.0, 6.0), (4.1, 6.1), (3.9, 5.9))):
            lines += [f"{proc},attention_block:private_workspace,{i},{a},{a}", f"{proc},moe_block:grouped_mm,{i},{m},{m}"]
    sp.write_text("\n".join(lines) + "\n")
    got = load_cold_start(p)
    assert got["cases"] == ["attention_block:private_workspace", "moe_block:grouped_mm"]
    assert got["num_processes"] == 2
    v = got["values"]
    assert v["cold_extra_ms"] == pytest.approx((4.0 + 6.0) / 2)  # call 2 - steady, summed over the layer's blocks
    assert v["cold_sd_ms"] == pytest.approx(np.std([4.0, 6.0], ddof=1))
    assert set(v) == {"cold_extra_ms", "cold_sd_ms"}  # the run / step factors come from content_loop.csv
    ls = got["layer_spread"]  # the layer blocks' spreads, for contrast only
    assert ls["run_log_sd"] == pytest.approx(np.std(np.log([10.0, 11.0]), ddof=1))
    assert ls["step_rel_sd"] == pytest.approx(np.std([10.0, 10.2, 9.8], ddof=1) / 10.0)
    assert got["cold_call1_ms"] == pytest.approx((900 - 4 + 900 - 6 + 900 - 4.4 + 900 - 6.6) / 2)
    nc = NoiseConfig().with_measurements(got)
    assert nc.cold_extra_ms == pytest.approx(5.0) and nc.sources["cold_extra_ms"]["status"] == "measured"
    assert nc.sources["cpu_step_ms"]["status"] == "assumed"
    # per-field sources win over the one source
    nc2 = NoiseConfig().with_measurements({"values": {"run_sigma": 0.01}, "sources": {"run_sigma": "x.csv col"},
                                           "source": "other"})
    assert nc2.run_sigma == 0.01 and nc2.sources["run_sigma"] == {"status": "measured", "source": "x.csv col"}


# ------------------------------------------------------------------------------------------ measured defaults
H200 = REPO_ROOT / "data" / "measured" / "h200" / "between_process"


def test_measured_defaults_are_the_committed_h200_rows():
    """COMPONENTS' measured defaults recomputed from data/measured/h200/between_process/ with
    mla_lab.measure.spread (run factor: whole-step spread between processes; step noise: within a process; cold
    step: call 2 - steady); every component names its status and, when measured, the file and column."""
    import pandas as pd

    from mla_lab.measure.spread import between_process
    from mla_lab.serving.noise import COMPONENTS

    loop = pd.read_csv(H200 / "content_loop.csv")
    z = loop[loop["content"] == "zeros"]
    per = between_process(z, ["content"], "step_ms")[("zeros",)]
    assert per["n_processes"] >= 5
    run = float(np.std(np.log(per["per_process"]), ddof=1))
    step = float(np.median([np.std(np.log(g.to_numpy()), ddof=1) for _, g in z.groupby("process")["step_ms"]]))
    cold = load_cold_start(H200 / "cold_start.csv")["values"]
    nc = NoiseConfig()
    assert nc.run_sigma == pytest.approx(run, rel=2e-3)
    assert nc.step_sigma == pytest.approx(step, rel=2e-3)
    assert nc.cold_extra_ms == pytest.approx(cold["cold_extra_ms"], rel=2e-3)
    assert nc.cold_sd_ms == pytest.approx(cold["cold_sd_ms"], rel=2e-3)
    # the attention path timed alone varies more between processes: reported for contrast, not used
    sp = pd.read_csv(H200 / "step_spread.csv")
    alone = between_process(sp, ["what"], "gpu_ms")[("attention_path:private_workspace",)]
    alone_sd = float(np.std(np.log(alone["per_process"]), ddof=1))
    assert alone_sd > 2 * run  # "varies more between processes"
    assert f"attention_path:private_workspace: log sd {alone_sd:.3f})" in COMPONENTS["run_sigma"]["source"]
    for k, c in COMPONENTS.items():
        assert c["status"] in ("measured", "cited", "assumed"), k
        if c["status"] == "measured":
            assert "data/measured/h200/between_process/" in c["source"] and "column" in c["source"], k
    assert "Not measured on the PR's server" in COMPONENTS["arrival_per_request_ms"]["source"]


# ------------------------------------------------------------------------------------------ one deployment
def test_serve_benchmark_noise_bands_and_changes():
    from mla_lab.deployment import Deployment
    from mla_lab.serving.noise import format_noise, serve_benchmark_noise

    d = Deployment.seed(num_prompts=4, prompt_len=512, output_len=4, concurrency=4, max_num_batched_tokens=2048)
    out = serve_benchmark_noise(d, ["per_call_empty:zeros", "private_workspace"], num_runs=8, seed=1,
                                baseline="per_call_empty:zeros")
    assert out["baseline"] == "per_call_empty:zeros" and set(out["changes"]) == {"private_workspace"}
    for s, m in out["strategies"].items():
        for k, v in m.items():
            assert v["band95"][0] <= v["median"] <= v["band95"][1], (s, k)
    c = out["changes"]["private_workspace"]["mean_ttft_ms"]
    assert c["band95"][0] <= c["median"] <= c["band95"][1] and c["band95"][1] > c["band95"][0]
    # the same seed gives the same numbers; the text shows every band
    again = serve_benchmark_noise(d, ["per_call_empty:zeros", "private_workspace"], num_runs=8, seed=1,
                                  baseline="per_call_empty:zeros")
    assert again["changes"] == out["changes"]
    text = format_noise(out)
    assert "over 8 simulated runs" in text and "change private_workspace vs per_call_empty:zeros" in text
    assert f"[{c['band95'][0]:+.2f}, {c['band95'][1]:+.2f}]" in text
    with pytest.raises(ValueError, match="num_runs"):
        serve_benchmark_noise(d, ["private_workspace"], num_runs=1)


def test_load_cold_start_refuses_bad_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_cold_start(tmp_path / "nope.csv")
    p = tmp_path / "c.csv"
    p.write_text("process,what,call\n1,x,1\n")
    with pytest.raises(ValueError, match="'wall_ms' is missing"):
        load_cold_start(p)
    p.write_text(_HEAD + "1,moe_block:x,1,abc,1,1,1,20,16384,8,H200\n")
    with pytest.raises(ValueError, match=r"line 2: wall_ms='abc'"):
        load_cold_start(p)
    p.write_text(_HEAD + "1,moe_block:x,1,1,1,1,1,20,1024,8,H200\n")
    with pytest.raises(ValueError, match="T >= 8192"):
        load_cold_start(p)


# ------------------------------------------------------------------------------------------ the prediction file
PRED = REPO_ROOT / "data" / "validation" / "pr53878_main_prediction.json"
FIELDS = ("duration", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
          "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms")


def _predictor():
    import mla_lab.fits.predict_pr53878 as mod

    return mod


@pytest.fixture(scope="module")
def prediction() -> dict:
    return json.loads(PRED.read_text())


def test_prediction_fields_and_provenance(prediction):
    d = prediction
    mod = _predictor()  # the committed file was written by this module (under its path of then, or of now)
    assert d["produced_by"] in (mod.PRODUCED_BY, *mod.EARLIER_PRODUCERS)
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", d["git_commit"])
    sha = d["git_commit"].split("+")[0]
    if (REPO_ROOT / ".git").exists():  # a copy of the tree without .git can only check the format
        assert subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=REPO_ROOT).returncode == 0
    assert d["deployment"]["model"].startswith("zai-org/GLM-5.2") and d["deployment"]["tp"] == 8
    assert d["deployment"]["async_scheduling"] is True and d["deployment"]["strategy_before"] == "per_call_empty:zeros"
    assert d["bench"]["num_prompts"] == 32 and d["bench"]["max_concurrency"] == 32
    paths = [f["path"] for f in d["calibration_files"]]
    assert "data/calibration/h200_decode.csv" in paths and "data/models/glm-5.2/config.json" in paths
    # the measured components came from the between-process rows (not the old round3/ folder), each marked
    for f in ("content_loop.csv", "cold_start.csv", "step_spread.csv"):
        assert f"data/measured/h200/between_process/{f}" in paths
    for k in ("run_sigma", "step_sigma", "cold_extra_ms", "cold_sd_ms"):
        assert d["noise"]["sources"][k]["status"] == "measured", k
        assert d["noise"]["values"][k] == pytest.approx(d["measurements_used"]["values"][k]), k
    for f in d["calibration_files"]:
        assert (REPO_ROOT / f["path"]).is_file() and re.fullmatch(r"[0-9a-f]{64}", f["sha256"])
    assert d["num_runs"] >= 500
    for k in FIELDS:
        p = d["prediction"][k]
        lo, hi = p["band95"]
        assert math.isfinite(p["deterministic"]) and lo < p["median"] < hi, k
        assert lo <= p["deterministic"] <= hi, k
    # consistency of the predicted run: 32 x (1024 + 128) tokens over the duration
    dur = d["prediction"]["duration"]["deterministic"]
    assert d["prediction"]["output_throughput"]["deterministic"] == pytest.approx(32 * 128 / dur, rel=1e-9)
    assert d["prediction"]["request_throughput"]["deterministic"] == pytest.approx(32 / dur, rel=1e-9)
    for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms"):
        c = d["change_distribution"][k]
        assert c["reported_by_pr"] == -9.5
        assert 0.0 <= c["identical_builds"]["percentile_of_reported"] <= 100.0
        lo, hi = c["identical_builds"]["band95"]
        assert lo < 0 < hi


def test_prediction_is_frozen(prediction):
    """The prediction of the PR's main run was committed before that run was read (3ef3de1, re-made in 83b1efc before
    reading) and was scored against it (issue 30): it is a record now, never re-made. Today's model's run of the same
    benchmark is ``revised`` in data/validation/pr53878_main_decomposition.json (in-sample; tests/test_validation.py
    recomputes it from the tree)."""
    import hashlib

    assert hashlib.sha256(PRED.read_bytes()).hexdigest() == (
        "9fd4d734d4f25c267fab9e150209058b7a65a740d575385aea0f2a047523face")


def test_docs_prediction_block_is_the_prediction_file(prediction):
    """docs/serving.md's prediction block is what mla_lab/fits/predict_pr53878.py renders from the committed file
    (re-render with `python -m mla_lab.fits.predict_pr53878 --docs-only`)."""
    mod = _predictor()
    text = mod.DOCS.read_text()
    block = text[text.index(mod.BEGIN) + len(mod.BEGIN):text.index(mod.END)].strip()
    assert block == mod.render_markdown(prediction).strip()


def test_distribution_file_is_the_predictions_runs(prediction):
    """data/validation/pr53878_noise_distribution.csv holds the per-run changes the JSON summarises: its sha256,
    its row count, and each band and percentile recomputed from it."""
    import hashlib

    import pandas as pd

    from mla_lab.serving.noise import NoiseResult

    f = prediction["distribution_file"]
    path = REPO_ROOT / f["path"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == f["sha256"]
    df = pd.read_csv(path)
    assert list(df.columns) == f["columns"]
    for case in ("identical_builds", "pr_vs_before"):
        sub = df[df["case"] == case]
        assert len(sub) == prediction["num_runs"]
        change = {k: sub[f"change_{k}_pct"].to_numpy() for k in METRICS if f"change_{k}_pct" in sub}
        r = NoiseResult({}, {}, change, {}, {}, len(sub), 0, NoiseConfig(), case == "identical_builds", {})
        for k, row in prediction["change_distribution"].items():
            if k not in change:
                continue
            np.testing.assert_allclose(r.band(k), row[case]["band95"], rtol=1e-9, atol=1e-9)
            if "reported_by_pr" in row:
                assert r.percentile_of(k, row["reported_by_pr"]) == pytest.approx(row[case]["percentile_of_reported"])


# ------------------------------------------------------------------------------------------ mla-lab serve --num-runs
def test_cli_serve_num_runs_prints_bands_and_the_changes_band(capsys):
    """``mla-lab serve --num-runs N`` (N > 1): each metric's median and 95 % band over N runs per strategy and, with
    two strategies, the change's band; the same numbers as serve_benchmark_noise with the same seed."""
    from mla_lab import cli
    from mla_lab.deployment import Deployment
    from mla_lab.serving.noise import serve_benchmark_noise

    argv = ["serve", "--num-runs", "20", "--num-prompts", "4", "--random-input-len", "512", "--random-output-len", "4",
            "--max-num-batched-tokens", "2048", "--seed", "3", "--strategies", "vllm-53878"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "over 20 simulated runs" in text
    assert cli.main(argv + ["--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["noise"]
    assert runs["num_runs"] == 20 and runs["seed"] == 3 and len(runs["changes"]) == 1
    (s, ch), = runs["changes"].items()
    lo, hi = ch["mean_ttft_ms"]["band95"]
    assert f"change {s} vs {runs['baseline']}" in text and f"[{lo:+.2f}, {hi:+.2f}]" in text
    bench = BenchConfig(num_prompts=4, random_input_len=512, random_output_len=4, max_concurrency=None, seed=3)
    d = Deployment.seed(num_prompts=4, prompt_len=512, output_len=4, concurrency=None, max_num_batched_tokens=2048)
    ref = serve_benchmark_noise(d, [s], bench, num_runs=20, seed=3, baseline=runs["baseline"])
    assert ref["changes"][s]["mean_ttft_ms"]["band95"] == pytest.approx([lo, hi], rel=1e-9)
