"""Padded-head content over the whole step (issue 21): the fit ``content_step`` of :data:`mla_lab.fits.FITS` on the H200
78-layer loop, the cost model pricing it (``Calibration.content_scope``), and the seed answer's stale end."""

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest

from mla_lab.deployment import Deployment
from mla_lab.model.calibration import resolve_calibration
from mla_lab.model.content import STEP_CONTENT_CSV, StepContentModel, fit_step_content, load_step_content_model
from mla_lab.model.ops import ATTN_OPS, step_ops
from mla_lab.model.route_ops import default_padded_kernel_fit
from mla_lab.model.route_timing import route_layer_time_ms
from mla_lab.model.timing import layer_time_ms, op_time_ms, step_time_ms
from mla_lab.model.ttft import predict_ttft
from mla_lab.paths import calibration_dir
from mla_lab.placement import parse_strategy
from mla_lab.report.seed_answer import seed_answer
from mla_lab.workload import schedule

REPO = Path(__file__).resolve().parent.parent
LOOP = REPO / "data" / "measured" / "h200" / "between_process" / "content_loop.csv"


def _row(path: Path) -> dict:
    with open(path, newline="") as f:
        return next(csv.DictReader(f))


def test_committed_calibration_states_the_measured_changes():
    """(that a refit gives the committed file: tests/test_fits.py)"""
    want = _row(calibration_dir() / STEP_CONTENT_CSV)
    m = load_step_content_model()
    assert m.n_processes == 5 and m.padded_fraction == pytest.approx(56 / 64)
    # the between-process figures of the H200 run (mla-lab measure, 2026-12-02): step +2.3 % [+1.9, +2.6], attention
    # path +4.3 % (the rows committed before, at 6a7dec28895d, gave +2.2 % and +5.1 %)
    assert float(want["measured_step_ms_change_pct"]) == pytest.approx(2.31, abs=0.01)
    assert float(want["measured_attn_path_ms_change_pct"]) == pytest.approx(4.27, abs=0.01)
    # the fitted model reproduces the measured step change in sample and out of sample within 0.5 point
    assert m.mape_step_pct < 0.5 and m.lopo_mape_step_pct < 0.5 and float(want["lopo_max_step_err_pts"]) < 0.5


def test_fit_recovers_known_parameters():
    # three synthetic processes built with u = 0.05, v = 0.03 at different shares: the fit returns them
    u, v = 0.05, 0.03
    rows = []
    for p, (step, attn) in enumerate(((800.0, 200.0), (700.0, 250.0), (900.0, 150.0))):
        s = attn / step
        rows.append({"process": p, "step_zeros_ms": step, "attn_zeros_ms": attn,
                     "attn_stale_ms": attn * (1 + u * s + v), "step_stale_ms": step - attn + (step - attn) * u * s
                     + attn * (1 + u * s + v)})
    m, per = fit_step_content(rows, 8, 64)
    assert m.uniform_per_share == pytest.approx(u) and m.attention_excess == pytest.approx(v)
    assert m.mape_step_pct == pytest.approx(0, abs=1e-9) and m.lopo_mape_step_pct == pytest.approx(0, abs=1e-9)
    assert per[1]["fit_attn_change_pct"] == pytest.approx(100 * (u * 250 / 700 + v))


def test_fit_refuses_bad_rows():
    ok = {"process": 1, "step_zeros_ms": 800.0, "step_stale_ms": 810.0, "attn_zeros_ms": 200.0,
          "attn_stale_ms": 210.0}
    with pytest.raises(ValueError, match="at least 3"):
        fit_step_content([ok, ok], 8, 64)
    with pytest.raises(ValueError, match="process 9"):
        fit_step_content([ok, ok, {**ok, "process": 9, "attn_zeros_ms": 900.0}], 8, 64)
    with pytest.raises(ValueError, match="padded_heads=8"):
        fit_step_content([ok, ok, ok], 8, 8)
    with pytest.raises(ValueError, match="share=1.5"):
        load_step_content_model().factors(1.5, 8, 64)


def test_fit_refuses_a_missing_file(tmp_path):
    from mla_lab.fits import refit

    with pytest.raises(ValueError, match="content_loop.csv does not exist"):
        refit("content_step", measured=tmp_path, out_dir=tmp_path)
    assert not (tmp_path / STEP_CONTENT_CSV).exists()


def test_factors_scale_with_share_and_padding():
    m = StepContentModel(0.06, 0.03, 0.25, 56 / 64)
    assert m.factors(0.5, 8, 8) == (1.0, 1.0)  # nothing padded
    assert m.factors(0.0, 8, 64) == pytest.approx((1.03, 1.0))  # no stale share: the GEMMs keep their clock
    a, r = m.factors(0.4, 8, 64)
    assert (a, r) == pytest.approx((1 + 0.06 * 0.4 + 0.03, 1 + 0.06 * 0.4))
    assert m.step_change(0.4, 8, 64) == pytest.approx((0.06 + 0.03) * 0.4)
    # 16 real of 64 heads: 48/64 padded, scaled by the padded fraction
    assert m.factors(0.4, 16, 64)[1] - 1 == pytest.approx(0.06 * 0.4 * (48 / 64) / (56 / 64))


@pytest.fixture(scope="module")
def seed():
    d = Deployment.seed()
    return d, schedule(d.workload, d.max_num_batched_tokens)


def test_step_time_applies_step_factors(seed):
    d, steps = seed
    cal = resolve_calibration(None)
    assert cal.content_scope == "step" and cal.step_content() is not None
    stale = parse_strategy("per_call_empty:stale")
    got = step_time_ms(d.rank, stale, steps[0], cal)
    # zero-content prices of the same ops (no content model at all), scaled by hand
    bare = replace(cal, content=None, content_step=None)
    base = step_time_ms(d.rank, stale, steps[0], bare)
    comm = base["comm"]
    attn = sum(base["by_op"].get(a, 0.0) for a in ATTN_OPS)
    share = attn / (base["total"] - comm)
    fa, fr = cal.content_step.factors(share, d.num_heads, 64)
    assert got["content"] == pytest.approx({"scope": "step", "share": share, "attention_factor": fa,
                                            "rest_factor": fr})
    assert got["total"] == pytest.approx(comm + attn * fa + (base["total"] - comm - attn) * fr, rel=1e-12)
    assert got["comm"] == pytest.approx(comm, rel=1e-12)
    assert got["by_op"]["kernel"] == pytest.approx(base["by_op"]["kernel"] * fa, rel=1e-12)
    assert got["by_op"]["moe_gate_up"] == pytest.approx(base["by_op"]["moe_gate_up"] * fr, rel=1e-12)
    # the kernel-only scope: the kernel op alone, by the kernel factor
    kern = step_time_ms(d.rank, stale, steps[0], cal.with_content_scope("kernel"))
    assert kern["content"]["scope"] == "kernel"
    assert kern["by_op"]["moe_gate_up"] == pytest.approx(base["by_op"]["moe_gate_up"], rel=1e-12)
    k = base["by_op"]["kernel"] / (d.model.num_hidden_layers)
    assert kern["by_op"]["kernel"] == pytest.approx(base["by_op"]["kernel"] * cal.content.factor(d.num_heads, 64, k),
                                                    rel=1e-9)
    # one layer, same factors (its share is the layer's)
    lay = layer_time_ms(d.rank, stale, steps[0], cal, layer_kind="moe")
    assert lay["content"]["scope"] == "step" and 0 < lay["content"]["share"] < 1


def test_zero_content_gives_no_change(seed):
    d, steps = seed
    cal = resolve_calibration(None)
    bare = replace(cal, content=None, content_step=None)
    for name in ("per_call_empty:zeros", "private_workspace", "per_call_zeros"):
        s = parse_strategy(name)
        got = step_time_ms(d.rank, s, steps[0], cal)
        assert got["content"]["scope"] == "none"
        assert got["total"] == pytest.approx(step_time_ms(d.rank, s, steps[0], bare)["total"],
                                             rel=1e-15)
    # a lone stale op under the step scope is priced with zero content (the step prices the content)
    op = next(o for o, _ in step_ops(d.rank, parse_strategy("per_call_empty:stale"), steps[0])
              if o.name == "kernel")
    assert op_time_ms(op, d.arch, cal) == pytest.approx(op_time_ms(replace(op, dims={**op.dims, "content": "zeros"}),
                                                                   d.arch, cal), rel=1e-15)


def test_seed_stale_end_uses_the_step_effect(seed):
    d, steps = seed
    rows = {(r["model"], r["strategy"], r["against"]): r for r in seed_answer(models=("glm-5",))}
    r = rows[("glm-5", "private_workspace", "per_call_empty:stale")]
    assert r["content_scope"] == "step"
    # recomputed by hand: seed = 2 steps of 16 whole prompts, mean TTFT = step 1 + step 2 / 2 (docs/ttft-model.md)
    cal = resolve_calibration(None)
    bare = replace(cal, content=None, content_step=None)
    m = cal.content_step

    def stale_step(st):
        b = step_time_ms(d.rank, parse_strategy("per_call_empty:stale"), st, bare)
        attn = sum(b["by_op"].get(a, 0.0) for a in ATTN_OPS)
        fa, fr = m.factors(attn / (b["total"] - b["comm"]), d.num_heads, 64)
        return b["comm"] + attn * fa + (b["total"] - b["comm"] - attn) * fr

    assert len(steps) == 2
    t1, t2 = stale_step(steps[0]), stale_step(steps[1])
    assert r["against_ttft_ms"] == pytest.approx(t1 + t2 / 2, rel=1e-12)
    # the kernel-only factor stays available, and it prices the stale end larger
    k = predict_ttft(d, "per_call_empty:stale", cal.with_content_scope("kernel"))["ttft_ms_mean"]
    assert r["modelled_pct_kernel_content"] == pytest.approx(100 * (r["ttft_ms"] / k - 1), rel=1e-12)
    assert r["modelled_pct_kernel_content"] < r["modelled_pct"] < rows[("glm-5", "private_workspace",
                                                                       "per_call_empty:zeros")]["modelled_pct"]
    z = rows[("glm-5", "private_workspace", "per_call_empty:zeros")]
    assert z["content_scope"] == "none" and z["modelled_pct_kernel_content"] == z["modelled_pct"]
    assert not math.isnan(r["modelled_pct"])


def test_content_scope_refused():
    with pytest.raises(ValueError, match="scope='power'"):
        resolve_calibration(None).with_content_scope("power")


def test_routes_price_stale_heads_over_the_layer(seed):
    d, steps = seed
    cal = resolve_calibration(None)
    fit = default_padded_kernel_fit()
    args = (d.rank, "sparse-mqa", steps[0], "per_call_empty:stale")
    step_scope = route_layer_time_ms(*args, cal, fit)
    zeros = route_layer_time_ms(*args[:-1], "per_call_empty:zeros", cal, fit)
    kern = route_layer_time_ms(*args, cal.with_content_scope("kernel"), fit)
    attn = sum(zeros.get(a, 0.0) for a in ATTN_OPS)
    fa, fr = cal.content_step.factors(attn / (zeros["total"] - zeros["comm"]), d.num_heads, 64)
    assert step_scope["kernel"] == pytest.approx(zeros["kernel"] * fa, rel=1e-12)
    assert step_scope["o_proj"] == pytest.approx(zeros["o_proj"] * fr, rel=1e-12)
    assert kern["o_proj"] == pytest.approx(zeros["o_proj"], rel=1e-12)
    assert kern["kernel"] > step_scope["kernel"]  # the kernel-only factor (+11 %) is larger than the step's
