"""The layer runner (:mod:`mla_lab.measure.layer`, its runs :mod:`mla_lab.measure.layer_runs`, the Triton stand-ins
:mod:`mla_lab.measure.triton_ops`) on CPU: a tiny model, float32, the Triton interpreter, the torch
reference sparse kernel. Timings on CPU mean nothing; what is checked is that the Triton kernels compute what torch
computes, that every op the runner times runs at the shape the cost model gives it, that the fused and unfused
layers give the same output, that the measurement loops write the rows the GPU run writes (positive ms), and that
the fit over them (:mod:`mla_lab.measure.validate`) reproduces the committed H200 validation table exactly.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, and the layer's kernels are decorated on first use;
so, as in ``tests/test_kernels_triton_interp.py``, the runner runs in a *subprocess* started with
``TRITON_INTERPRET=1`` (this file is that worker: ``python test_measure_layer.py --worker OUT``) and nothing leaks
into the other tests' process. The worker saves inputs, outputs and rows with ``torch.save``; the tests check them
here.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mla_lab.arch import get_arch
from mla_lab.measure.layer import CALIBRATION_CSV, LAYER_STRATEGIES, OPS_CSV, VALIDATION_CSV, tiny_model
from mla_lab.measure.layer_runs import measured_rank, moe_variants, ops_to_time
from mla_lab.placement import parse_strategy

T = 8
TP = 2
DATA = Path(__file__).resolve().parent.parent / "data"


def _worker(out_path: str) -> None:
    """Run the kernels, the runner, the loops and the fit on the tiny model; save everything to ``out_path``."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import tempfile

    from mla_lab.measure.layer import Layer, MeasureSettings, run_kernel_checks, select_implementations
    from mla_lab.measure.layer_runs import LAYER_OUTPUTS, measure_ops, paired_timing, run_layer_benchmark
    from mla_lab.measure.sink import Sink
    from mla_lab.measure.triton_ops import check_kernels, mqa_logits, rmsnorm, silu_mul
    from mla_lab.measure.validate import fit_and_validate

    arch = get_arch("h200")
    model = tiny_model()
    settings = MeasureSettings(device="cpu", dtype=torch.float32, interpret=True, cpu_calls=1)
    generator = torch.Generator().manual_seed(0)
    res = {}

    # the three Triton kernels on fixed inputs (NaN-poisoned outputs), odd shapes, a strided row
    x = torch.randn(37, 300, generator=generator)
    residual = torch.randn(37, 300, generator=generator)
    weight = torch.randn(300, generator=generator)
    out = torch.full_like(x, float("nan"))
    residual_after = residual.clone()
    rmsnorm(x, weight, out, residual=residual_after)
    res["rmsnorm_add"] = dict(x=x, residual=residual, weight=weight, out=out, residual_after=residual_after)
    full = torch.randn(21, 576, generator=generator)  # kv_a output: normalise the first 512 columns (row stride 576)
    weight = torch.randn(512, generator=generator)
    out = torch.full((21, 512), float("nan"))
    rmsnorm(full[:, :512], weight, out)
    res["rmsnorm_strided"] = dict(x=full[:, :512].clone(), weight=weight, out=out)
    x = torch.randn(19, 140, generator=generator)
    out = torch.full((19, 70), float("nan"))
    silu_mul(x, out)
    res["silu_mul"] = dict(x=x, out=out)
    q = torch.randn(40, 4, 32, generator=generator)
    k = torch.randn(40, 32, generator=generator)
    head_weights = torch.rand(40, 4, generator=generator)
    out = torch.full((40, 40), float("nan"))
    mqa_logits(q, k, head_weights, out, interpret=True)
    res["mqa_logits"] = dict(q=q, k=k, weights=head_weights, out=out)
    res["checks"] = [tuple(c) for c in check_kernels("cpu", torch.float32, True, seed=1)]

    implementations = select_implementations(settings, log=lambda *a: None)
    res["implementations"] = (implementations.kernel_detail, implementations.concat_detail)

    # every op the runner times, once, at T tokens: the shape of what it returns
    layer = Layer(measured_rank(model, TP, arch, ("tp", 1)), "cpu", torch.float32, T, implementations.kernel, implementations.concat, True,
                  moe_variants(TP))
    shapes = {}
    for variant in moe_variants(TP):
        for (name, concat_strategy), op in ops_to_time(measured_rank(model, TP, arch, variant), T, variant).items():
            fn = layer.runner(op, T, variant=concat_strategy or (variant if op.impl == "moe_bmm" else None))
            result = fn() if fn is not None else None
            if isinstance(result, tuple):  # torch.topk: (values, indices)
                result = result[0]
            shapes[(variant, name, concat_strategy)] = None if result is None else tuple(result.shape)
    res["op_shapes"] = shapes

    # the whole layer per kind and strategy, same random inputs for every strategy; the private workspace padded
    # with zeros (default) and with stale (N(0, 1)) values; per_call_empty's pad block holds its own content
    outputs = {}
    e2e_strategies = [*LAYER_STRATEGIES, parse_strategy("per_call_empty:stale")]
    for content in ("zeros", "stale"):
        torch.manual_seed(7)
        padded = Layer(measured_rank(model, TP, arch, ("tp", 1)), "cpu", torch.float32, T, implementations.kernel, implementations.concat, True,
                       moe_variants(TP), content=content)
        for kind, variant in (("dense", ("tp", 1)), ("moe", ("tp", 1)), ("moe", ("ep", TP))):
            for strategy in e2e_strategies:
                torch.manual_seed(11)
                fn, excluded = padded.e2e(T, strategy, kind, variant)
                outputs[(content, kind, variant, strategy.name)] = (fn(), excluded)
    res["e2e_contents"] = {s.name: padded.content_of(s) for s in e2e_strategies}
    try:
        padded.e2e(T, "fused", "dense", ("tp", 1))
        res["e2e_refuses_names"] = ""
    except ValueError as e:
        res["e2e_refuses_names"] = str(e)
    res["e2e"] = outputs
    res["padded_heads_fused"] = (padded.workspace_fused[:, padded.H:].abs().sum().item(), padded.H, padded.Hp)

    # timing helpers and the loops
    res["paired"] = tuple(paired_timing(lambda: torch.ones(64).sum(), lambda: torch.ones(64).sum(), 3, "cpu"))
    measured = {}  # shapes already timed: a second pass over the same ops times nothing
    res["measure_ops_passes"] = [len(list(measure_ops(layer, "tiny", T, ("tp", 1), arch, settings, implementations,
                                                      measured, log=lambda *a: None))) for _ in range(2)]
    res["deadline_rows"] = len(list(measure_ops(layer, "tiny", T, ("tp", 1), arch,
                                                MeasureSettings(device="cpu", dtype=torch.float32, interpret=True,
                                                                deadline=0.0),
                                                implementations, {}, log=lambda *a: None)))
    with tempfile.TemporaryDirectory() as tmp:
        provenance = {"source": "measured", "device": "cpu", "git_commit": "test"}
        sink = Sink(tmp, LAYER_OUTPUTS, prov=provenance)
        checks_sink = Sink(Path(tmp) / "checks", LAYER_OUTPUTS, prov=provenance)
        res["disabled"] = sorted(run_kernel_checks(settings, checks_sink, log=lambda *a: None))
        res["check_rows"] = list(csv.DictReader(open(Path(tmp) / "checks" / "layer_extras.csv")))
        run_layer_benchmark([("tiny", model)], [TP], [T], arch, settings, implementations, sink,
                            log=lambda *a: None, pairs=1)
        res["rows"] = {name: list(csv.DictReader(open(Path(tmp) / name))) for name in
                       ("layer_ops.csv", "layer_e2e.csv", "layer_extras.csv")}
        calibration = fit_and_validate(tmp, arch, {**provenance, "fit_commit": "test"}, {"tiny": model},
                                       log=lambda *a: None)
        res["calibration_name"] = calibration.name
        res["validation"] = list(csv.DictReader(open(Path(tmp) / VALIDATION_CSV)))
        res["calibration_rows"] = list(csv.DictReader(open(Path(tmp) / CALIBRATION_CSV)))
    torch.save(res, out_path)


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("measure_layer") / "out.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"layer runner worker failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return torch.load(out, weights_only=False)


def _rmsnorm_ref(s, weight):
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight


def test_triton_kernels_match_torch(worker_results):
    r = worker_results["rmsnorm_add"]
    s = r["x"] + r["residual"]
    torch.testing.assert_close(r["out"], _rmsnorm_ref(s, r["weight"]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r["residual_after"], s, rtol=0, atol=1e-6)  # the fused add writes the sum back
    r = worker_results["rmsnorm_strided"]
    torch.testing.assert_close(r["out"], _rmsnorm_ref(r["x"], r["weight"]), rtol=1e-5, atol=1e-5)
    r = worker_results["silu_mul"]
    torch.testing.assert_close(r["out"], torch.nn.functional.silu(r["x"][:, :70]) * r["x"][:, 70:], rtol=1e-5,
                               atol=1e-6)
    r = worker_results["mqa_logits"]
    ref = (torch.relu(torch.einsum("thd,sd->ths", r["q"], r["k"])) * r["weights"][:, :, None]).sum(1)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()
    torch.testing.assert_close(r["out"][causal], ref[causal], rtol=1e-4, atol=1e-4)
    above = r["out"][~causal]  # -inf in computed blocks, the NaN poison left in blocks wholly above the diagonal
    assert (torch.isneginf(above) | above.isnan()).all() and torch.isneginf(above).any()


def test_check_kernels_and_their_rows(worker_results):
    checks = worker_results["checks"]
    assert [c[0] for c in checks] == ["rmsnorm_add", "silu_mul", "mqa_logits"]
    assert all(0 <= error < 1e-5 and 0 <= aux_error < 1e-6 for _, error, aux_error in checks)
    assert worker_results["disabled"] == []
    rows = worker_results["check_rows"]
    assert [r["name"] for r in rows] == ["rmsnorm_add", "silu_mul", "mqa_logits"]
    assert all(r["experiment"] == "correctness" and "ok=True" in r["note"] and "tol=0.0001" in r["note"] for r in rows)


def _expected_shape(op, T):
    d = op.dims
    return {
        "linear": lambda: (d["M"], d["N"]), "moe_bmm": lambda: (d["E"], int(round(d["M"])), d["N"]),
        "rmsnorm": lambda: (d["M"], d["N"]), "rmsnorm_add": lambda: (d["M"], d["N"]),
        "silu_mul": lambda: (int(round(d["M"])), d["N"]), "bmm_uk": lambda: (d["B"], d["M"], d["N"]),
        "bmm_uv": lambda: (d["B"], d["M"], d["N"]), "mqa_logits": lambda: (d["T"], d["keys"]),
        "topk": lambda: (d["T"], min(d["k"], d["keys"])), "moe_sum": lambda: (d["T"], d["N"]),
        "attn_pad": lambda: (T, d["Hp"], 576), "attn_kernel": lambda: (T, d["Hp"], 512),
    }[op.impl]()


def test_runner_runs_every_op_at_its_modelled_shape(worker_results):
    shapes = worker_results["op_shapes"]
    model, arch = tiny_model(), get_arch("h200")
    expected_keys = set()
    for variant in moe_variants(TP):
        for (name, concat_strategy), op in ops_to_time(measured_rank(model, TP, arch, variant), T, variant).items():
            key = (variant, name, concat_strategy)
            expected_keys.add(key)
            if op.impl == "attn_concat":  # the buffer it wrote: H heads for a per-call pad, H' (padded) workspace
                heads = op.dims["H"] if concat_strategy.per_call_pad else op.dims["Hp"]
                assert shapes[key] == (T, heads, 576), key
            else:
                assert shapes[key] == _expected_shape(op, T), (key, op.dims)
    assert set(shapes) == expected_keys
    assert len(expected_keys) == 34  # 30 ops under TP-sharded experts (concat twice) + 4 MoE ops under EP
    assert worker_results["implementations"] == ("reference (CPU dry run)", "torch two copy_ (mla_lab.kernels.reference)")


def test_every_strategy_gives_the_same_layer_output(worker_results):
    outputs = worker_results["e2e"]
    model = tiny_model()
    for content in ("zeros", "stale"):  # what the padded heads hold never reaches the output
        pad, excluded = outputs[(content, "dense", ("tp", 1), "per_call_zeros")]
        assert pad.shape == (T, model.hidden_size) and pad.dtype == torch.float32
        assert excluded == [] and pad.abs().max() > 0 and not pad.isnan().any()
        for name in ("private_workspace", "per_call_empty:stale"):
            assert torch.equal(pad, outputs[(content, "dense", ("tp", 1), name)][0]), name
        for variant in (("tp", 1), ("ep", TP)):
            out, _ = outputs[(content, "moe", variant, "private_workspace")]
            assert out.shape == (T, model.hidden_size) and not out.isnan().any()
    total, H, Hp = worker_results["padded_heads_fused"]
    assert (H, Hp) == (8, 64) and total > 0  # the last layer built had stale padded heads
    assert worker_results["e2e_contents"] == {"per_call_zeros": "zeros", "private_workspace": "stale",
                                              "per_call_empty:stale": "stale"}
    assert "must be a mla_lab.placement.Strategy" in worker_results["e2e_refuses_names"]


def test_layer_strategies_parse_names_at_the_door():
    from mla_lab.measure.layer import layer_strategies

    assert [s.name for s in layer_strategies(["unfused", "private_workspace", "per_call_zeros"])] == [
        "per_call_empty:zeros", "per_call_empty:stale", "private_workspace", "per_call_zeros"]
    assert layer_strategies(LAYER_STRATEGIES) == LAYER_STRATEGIES
    with pytest.raises(ValueError, match=r"strategy='shared_workspace:none': the layer runs placements"):
        layer_strategies(["vllm-56902"])
    with pytest.raises(ValueError, match="strategy='nope' is not known"):
        layer_strategies(["nope"])


def test_layer_benchmark_rows(worker_results):
    rows = worker_results["rows"]
    ops, e2e, extras = rows["layer_ops.csv"], rows["layer_e2e.csv"], rows["layer_extras.csv"]
    assert len(ops) == 33 and all(r["status"] == "ok" for r in ops)  # 29 under TP-sharded experts + 4 under EP
    assert all(math.isfinite(float(r["ms"])) and float(r["ms"]) > 0 for r in ops)
    assert {(r["moe_parallel"], r["ep"]) for r in ops} == {("tp", "1"), ("ep", "2")}
    assert all(r["source"] == "measured" and r["git_commit"] == "test" for r in ops)  # provenance on every row
    concat = [r for r in ops if r["op"] == "concat"]
    assert sorted(r["impl_detail"].rsplit(" into ", 1)[1] for r in concat) == ["H-head buffer", "padded workspace"]
    # eager (no CUDA graphs on CPU) and paired, per kind and strategy; EP at the largest (only) TP
    modes = {(r["layer_kind"], r["moe_parallel"], r["strategy"], r["content"], r["mode"]) for r in e2e}
    assert modes == {(k, p, s, "zeros", m) for k, p in (("moe", "tp"), ("dense", "tp"), ("moe", "ep"))
                     for s in ("per_call_zeros", "private_workspace") for m in ("eager", "paired")}
    assert {r["content"] for r in ops if r["impl"] == "attn_kernel"} == {"zeros"}
    assert {r["content"] for r in ops if r["impl"] != "attn_kernel"} == {""}
    assert len(e2e) == 12 and all(r["status"] == "ok" and float(r["ms"]) > 0 for r in e2e)
    deltas = [r for r in extras if r["experiment"] == "e2e_paired_delta"]
    assert sorted(r["name"] for r in deltas) == ["dense_tp", "moe_ep", "moe_tp"]
    assert all(r["note"] == "1 interleaved pairs" and r["H"] == "8" and r["Hp"] == "64" for r in deltas)
    assert all(r["unit"] == "ms: median(per_call_zeros - private_workspace); value: IQR" for r in deltas)
    # each unique shape once (post_attn_norm has input_norm's shape), nothing past the deadline
    assert worker_results["measure_ops_passes"] == [29, 0] and worker_results["deadline_rows"] == 0
    a_ms, b_ms, difference_ms, iqr_ms = worker_results["paired"]
    assert a_ms > 0 and b_ms > 0 and iqr_ms >= 0 and isinstance(difference_ms, float)


def test_fit_and_validation_of_the_tiny_run(worker_results):
    val = worker_results["validation"]
    levels = {(r["level"], r["split"]) for r in val}
    assert levels == {("op", "in_sample"), ("layer", "in_sample"), ("layer_paired", "in_sample"),
                      ("layer_delta", "in_sample"), ("layer_paired_delta", "in_sample")}  # one model: no LOMO
    assert sum(r["level"] == "op" for r in val) == 33 and sum(r["level"] == "layer" for r in val) == 6
    assert all(r["source"] == "modelled" and r["fit_commit"] == "test" for r in val)
    assert all(float(r["predicted_ms"]) > 0 for r in val if r["level"] in ("op", "layer"))
    assert worker_results["calibration_name"] == "h200_ops.csv (measured on cpu)"
    kinds = {(r["kind"], r["op_class"]) for r in worker_results["calibration_rows"]}
    assert ("class", "gemm") in kinds and ("attention", "kernel") in kinds


@pytest.mark.skipif(not (DATA / "measured" / "h200" / OPS_CSV).is_file(), reason="no committed H200 layer data")
def test_fit_reproduces_the_committed_validation(tmp_path):
    """Refitting the committed H200 op rows gives the committed calibration and validation table, row for row."""
    from mla_lab.measure.validate import VALIDATION_COLUMNS, fit_and_validate, mape_summary
    from mla_lab.models import load_model

    measured = DATA / "measured" / "h200"
    for name in ("layer_ops.csv", "layer_e2e.csv", "layer_extras.csv"):
        shutil.copy(measured / name, tmp_path / name)
    models = {n: load_model(n) for n in ("glm-5", "deepseek-v3.2")}
    fit_and_validate(tmp_path, get_arch("h200"), {"source": "measured", "git_commit": "x", "fit_commit": "x"},
                     models, log=lambda *a: None)

    def rows(path, columns):
        with open(path, newline="") as f:
            return [[r[c] for c in columns] for r in csv.DictReader(f)]

    def same(got_rows, want_rows):
        """Row for row: text cells equal, numeric cells within 1e-9 relative (a refit may differ in the 16th
        digit: float sums in another order)."""
        assert len(got_rows) == len(want_rows)
        for g_row, w_row in zip(got_rows, want_rows):
            for g, w in zip(g_row, w_row):
                try:
                    gf, wf = float(g), float(w)
                except ValueError:
                    assert g == w, (g_row, w_row)
                    continue
                assert gf == pytest.approx(wf, rel=1e-9, abs=1e-12, nan_ok=True), (g_row, w_row)

    got = rows(tmp_path / VALIDATION_CSV, VALIDATION_COLUMNS)
    same(got, rows(measured / VALIDATION_CSV, VALIDATION_COLUMNS))
    fit_columns = ["kind", "op_class", "eff_flops", "eff_bytes", "floor_us", "overhead_mode", "n", "mape_pct"]
    same(rows(tmp_path / CALIBRATION_CSV, fit_columns), rows(DATA / "calibration" / CALIBRATION_CSV, fit_columns))
    summary = mape_summary([dict(zip(VALIDATION_COLUMNS, r), ape_pct=float(r[-1])) for r in got])
    n, mape, _ = summary[("layer", "in_sample", "layer")]
    assert n >= 100 and mape <= 10.0  # the 10 % target for the layer


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    _worker(sys.argv[2])
