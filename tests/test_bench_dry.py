"""The measurement code's logic, dry-run on CPU with a small model (timings here mean nothing; shapes, ops and
bookkeeping are what is checked): :mod:`mla_lab.measure.attention`, the analytic call peak it is compared with
(:func:`mla_lab.buffers.call_peak_bytes`) and the measured sweep rows built around it (:mod:`mla_lab.sweep.rows`).
The real run is on a GPU: mla_lab/measure/experiments/attention_path.py."""

import dataclasses
from pathlib import Path

import pytest
import torch

from mla_lab.buffers import call_peak_bytes
from mla_lab.measure.attention import make_step_inputs, time_attention_path
from mla_lab.models import load_model
from mla_lab.workload import Step


def _rank(model):
    from mla_lab.deployment import Deployment

    return Deployment.seed(model=model).rank  # TP 8 on an H200 (prefill_padding 64)


@pytest.fixture
def small_glm():
    return dataclasses.replace(load_model("glm-5"), index_topk=64)


def test_step_inputs_are_causal_and_strided(small_glm):
    step = Step([(0, 0, 40), (1, 10, 30)])
    ql, qpe, kv, idx, tl = make_step_inputs(_rank(small_glm), step, prompt_len=40, device="cpu")
    assert ql.shape == (70, 8, 512) and not ql.is_contiguous() and ql.stride(-1) == 1
    assert qpe.shape == (70, 8, 64) and not qpe.is_contiguous()
    assert kv.shape == (80, 1, 576) and idx.shape == (70, 1, 64) and idx.dtype == torch.int32
    pos = torch.cat([torch.arange(0, 40), torch.arange(10, 40)])
    assert torch.equal(tl, torch.clamp(pos + 1, max=64).to(torch.int32))
    base = torch.cat([torch.zeros(40, dtype=torch.long), torch.full((30,), 40)])
    for i in range(70):
        used = idx[i, 0, : tl[i]].long()
        assert ((used >= base[i]) & (used <= base[i] + pos[i])).all()  # only its own prompt, causally


def test_time_attention_path_dry_run(small_glm):
    res = time_attention_path(_rank(small_glm), Step([(0, 0, 16)]), 16, device="cpu", repeats=3,
                              strategies=("per_call_empty:zeros", "private_workspace", "subchunk:4"))
    for name in ("per_call_empty:zeros", "private_workspace", "subchunk:4"):
        r = res[name]
        assert set(r) >= {"total", "samples", "q1", "q3", "ci_lo", "ci_hi", "workspace_bytes", "peak_bytes"}
        assert len(r["samples"]) == 3 and r["q1"] <= r["total"] <= r["q3"] and r["peak_bytes"] is None
    assert res["private_workspace"]["workspace_bytes"] == 16 * 64 * 576 * 2
    assert res["per_call_empty:zeros"]["workspace_bytes"] == 16 * 8 * 576 * 2
    assert res["subchunk:4"]["workspace_bytes"] == 4 * 64 * 576 * 2
    assert res["kernel_backend"] == "reference" and res["repeats"] == 3


def test_call_peak_bytes():
    glm = load_model("glm-5")
    T = 4096
    kernel_out = T * 64 * (512 * 2 + 8)
    assert call_peak_bytes("per_call_empty:zeros", 8, T, "hopper", T, glm) == T * 64 * 1152 + kernel_out
    # fused: the kernel's padded outputs, handed on as views (the consumer copies nothing; on an H200 the measured
    # peak of the seed call is this to the byte: data/measured/h200/padding_sweep.csv)
    assert call_peak_bytes("private_workspace", 8, T, "hopper", T, glm) == kernel_out
    # sub-chunks of 1024 rows: two chunks' outputs alive at once, plus the step's own output and lse
    assert call_peak_bytes("subchunk:1024", 8, T, "hopper", T, glm) == 2 * 1024 * 64 * (512 * 2 + 8) + T * 8 * 1028
    # no padding (64 heads on Hopper): the slice is the whole tensor, no copy; peak = kernel outputs
    assert call_peak_bytes("per_call_empty:zeros", 64, T, "hopper", T, glm) == T * 64 * (512 * 2 + 8)


def test_measured_ttft_recombination_replaces_attention_path():
    from mla_lab.deployment import Deployment
    from mla_lab.model.ttft import predict_ttft
    from mla_lab.workload import Workload, schedule

    point = dict(model="glm-5", tp=8, arch="h200", max_num_batched_tokens=16384, prompt_len=1024, num_prompts=32,
                 concurrency=32, kv_cache_dtype="bf16", weight_dtype="fp8", moe_parallel="ep")
    workload = Workload(1024, 32, 32)
    deployment = Deployment.from_point(point)

    def with_measured_attention(step_attention_ms):
        return predict_ttft(deployment, "private_workspace", attention_override_ms=step_attention_ms)

    modelled = predict_ttft(deployment, "private_workspace")
    assert deployment == Deployment.seed()  # the PR's point
    attn = [sum(v for k, v in ops.items() if k in ("concat", "pad", "kernel", "out_slice"))
            for ops in modelled["step_ops_ms"]]
    n = len(schedule(workload, 16384))
    # measured attention equal to the modelled one (per layer) reproduces the model's TTFT
    same = with_measured_attention([a / 78 for a in attn])
    assert same["ttft_ms_mean"] == pytest.approx(modelled["ttft_ms_mean"], rel=1e-9)
    # 1 ms more per layer per step adds 78 ms per step before each prompt's first token
    plus = with_measured_attention([a / 78 + 1.0 for a in attn])
    assert plus["ttft_ms_max"] == pytest.approx(modelled["ttft_ms_max"] + 78.0 * n, rel=1e-9)
    assert "attention path measured" in plus["scope"]
    with pytest.raises(ValueError, match="entries; the workload has"):
        with_measured_attention([1.0])


def test_measure_point_rows_with_stubbed_timings(monkeypatch):
    """measured_rows' bookkeeping on CPU: the GPU timing is replaced by fixed numbers; the rows must carry the
    exact memory columns of the modelled rows, the measured attention path and measured provenance."""
    import mla_lab.sweep.rows as rows_module
    from mla_lab.sweep import expand_grid, validate_params

    calls = []

    totals = {"per_call_empty:zeros": 7.8, "private_workspace": 7.3}
    runs = 5

    def fake_time(rank, step, prompt_len, strategies, full_topk=False, seed=0, device="cuda", repeats=7):
        calls.append((step.num_tokens, tuple(strategies), repeats))
        # the baseline is 0.5 ms slower in every round, with round-to-round noise common to both
        res = {n: {"total": totals[n], "samples": [totals[n] + 0.01 * r for r in range(repeats)], "q1": totals[n],
                   "q3": totals[n], "ci_lo": totals[n], "ci_hi": totals[n], "peak_bytes": 100, "workspace_bytes": 1}
               for n in strategies}
        res.update(kernel_backend="flash_mla", concat_backend="triton", repeats=repeats)
        return res

    monkeypatch.setattr(rows_module, "detect_arch",
                        lambda: {"device": "stub H200", "prefill_padding": 64, "capability": (9, 0)})
    monkeypatch.setattr(rows_module.measure.attention, "time_attention_path", fake_time)  # what rows calls
    pt = expand_grid(validate_params(dict(models=["glm-5"], tp_sizes=[8], archs=["h200"],
                                          max_num_batched_tokens=[16384], prompt_lens=[1024], device="cpu",
                                          strategies=["fused"], num_runs=runs)))[0]
    rows = {r["strategy"]: r for r in rows_module.measured_rows(pt)}
    # two identical steps, measured once; the baseline is always measured beside the point's strategies
    assert calls == [(16384, ("per_call_empty:zeros", "private_workspace"), runs)]
    modelled = {r["strategy"]: r for r in rows_module.modelled_rows(pt)}
    for s in ("per_call_empty:zeros", "private_workspace"):
        for col in ("q_concat_heads", "persistent_bytes", "extra_persistent_bytes", "kv_tokens_lost", "num_heads"):
            assert rows[s][col] == modelled[s][col]
        assert rows[s]["source"] == "measured" and rows[s]["kernel_backend"] == "flash_mla"
    fused, base = rows["private_workspace"], rows["per_call_empty:zeros"]
    assert fused["extra_persistent_bytes"] == 1_056_964_608
    # 0.5 ms per layer per step less, 78 layers, both prompts' groups see 1 or 2 steps: mean saving 1.5 * 39 ms
    assert base["ttft_ms"] - fused["ttft_ms"] == pytest.approx(0.5 * 78 * 1.5)
    assert fused["ttft_change_pct"] < 0 == base["ttft_change_pct"]
    # the paired rounds differ by exactly 0.5 ms, so the change's interval is a point and is measurable
    assert fused["ttft_change_ci_lo"] <= fused["ttft_change_pct"] <= fused["ttft_change_ci_hi"] < 0
    assert fused["change_measurable"] and fused["num_runs"] == runs
    with pytest.raises(ValueError, match="only the bf16 path is measured"):
        rows_module.measured_rows(dict(pt, kv_cache_dtype="fp8"))


# ------------------------------------------------------------------------------ mla_lab/measure/experiments
def test_experiment_modules_time_through_the_package_timer():
    """The experiments share the package's timer (mla_lab.measure.timer): the engines and decode experiments keep
    no timer of their own."""
    import ast

    import mla_lab.measure.experiments as ex

    for name in ("engines", "decode_layer", "engine_presets"):
        path = Path(ex.__file__).with_name(f"{name}.py")
        defined = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        assert not defined & {"timed_window", "est_ms", "_q"}, f"{name} keeps its own timer {defined}"


def test_bench_engines_presets_are_the_strategies_and_agree(tmp_path):
    """Every preset of mla_lab.measure.experiments.engine_presets on CPU at tiny shapes (reference kernel): built from the
    strategy its label names (mla_lab.placement.BENCH_PRESET_LABELS), real heads bit-identical to the private
    workspace's, persistent bytes = the strategy's workspace, the padded heads the kernel read as the content
    says (per_call_empty's depend on the allocator, not checked on CPU)."""
    import mla_lab.measure.experiments.engine_presets as be
    from mla_lab.deployment import Deployment
    from mla_lab.placement import BENCH_PRESET_LABELS
    from mla_lab.strategies import PaddedQPath
    gen = torch.Generator().manual_seed(0)
    P = be.Presets(Deployment.seed().rank, "cpu", torch.bfloat16, 16, "causal_8", gen, 8, 64)  # 8 heads -> 64
    ref = P.build("private_workspace_zeros")[0]().clone()
    labels = [(n, None) for n in BENCH_PRESET_LABELS] + [("subchunk", 8), ("subchunk_views", 8),
                                                         ("subchunk_2stream", 8)]
    for label, S in labels:
        fn, prep, persistent, _, n_chunks, strategy = P.build(label, S)
        if prep:
            prep()
        check = {}
        out = be.as_tensor(fn(check))
        assert torch.equal(out, ref), label
        content = be.content_of(label, strategy)
        if strategy is None:
            assert label == "subchunk_2stream" and n_chunks == 2 and content == "zeros"
            continue
        want = BENCH_PRESET_LABELS.get(label) or (f"subchunk:{S}" + (":views" if label.endswith("views") else ""))
        assert strategy.name == want and persistent == PaddedQPath(
            strategy, num_heads=8, max_num_batched_tokens=16).workspace.nbytes
        assert n_chunks == (2 if strategy.placement == "subchunk" else 1)
        if strategy.placement != "per_call_empty":
            assert content == strategy.content
            assert (check["pad_absmax"] > 0) == (content == "stale"), (label, check)
        else:
            assert content == label.rsplit("_", 1)[1]
