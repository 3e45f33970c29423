"""The decode calibration fit (``h200_decode.csv``) on ``data/measured/h200/round2/decode_ops.csv`` (each op, graph
replay) and ``decode_layer.csv`` (the per-rank layer, B = 1..256, contexts 1k-8k, eager and graph): op-level grids, the
per-layer cost on graph rows, the eager launch model; validated in sample and leave-one-model-out."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..arch import get_arch
from ..measure.layer_runs import measured_rank as _layer_rank
from ..model.calibration import ClassEff, load_calibration
from ..model.decode_calibration import DECODE_CSV, DecodeCalibration, KernelDecode, decode_calibration_rows
from ..model.ops import layer_ops
from ..model.timing import op_time_ms
from ..models import load_model
from ..placement import measured_as
from ..provenance import git_commit
from ..rank import RankView
from ..serving.step_pricer import layer_decode_ms
from ..workload import Step as WorkStep
from .files import provenance, rel

_PROV = ("source", "gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "date_utc")
H200 = get_arch("h200")
TP, EP = 8, 8
#: Measured op name -> the layer model's op name (decode_ops.csv).
OP_NAMES = {"idx_q_proj": "idx_wq_b", "idx_k_proj": "idx_wk", "idx_logits_decode": "idx_logits",
            "idx_topk_decode": "idx_topk", "concat_unfused": "concat", "concat_fused": "concat",
            "pad_new_zeros_copy": "pad", "sparse_kernel": "kernel", "moe_silu_mul": "moe_act",
            "moe_sum": "moe_combine", "shared_silu_mul": "shared_act"}
#: Ops of the measured layer the layer model does not list (absorbed by the per-layer fixed cost).
NOT_IN_MODEL = ("idx_to_global",)
CLASSES = ("gemm", "norm", "bmm", "moe_gemm", "elementwise", "reduce")
FLOORS = [round(float(x), 2) for x in np.arange(0.0, 12.01, 0.1)]


def mape(pred, meas) -> float:
    return float(np.mean(np.abs(np.asarray(pred, float) - meas) / np.asarray(meas, float)) * 100)


@functools.cache
def _rank(name: str) -> RankView:
    """The rank the decode measurements ran: ``name`` TP8 (EP8) on an H200, bf16 weights and KV cache."""
    return _layer_rank(load_model(name), TP, H200, ("ep", EP))


def decode_ws(B, c, P=0) -> WorkStep:
    return WorkStep([(i, c - 1, 1) for i in range(B)] + ([(10**9, 0, P)] if P else []))


def op_rows(ops_df) -> list[dict]:
    """decode_ops.csv -> one row per (model, B, c, op, strategy): the measured median (us) and the model's op."""
    d = ops_df[ops_df["status"] == "ok"].copy()
    d["context"] = d["context"].fillna(4096).astype(int)
    d["strategy"] = d["strategy"].fillna("")
    rows = []
    for r in d.groupby(["model", "batch", "context", "op", "strategy"])["ms"].median().reset_index().itertuples():
        if r.op in NOT_IN_MODEL:
            continue
        strat = measured_as(r.strategy or "fused")
        ops = {op.name: op for op in layer_ops(_rank(r.model), strat, decode_ws(int(r.batch), int(r.context)),
                                               layer_kind="moe")}
        op = ops[OP_NAMES.get(r.op, r.op)]
        rows.append({"model": r.model, "B": int(r.batch), "c": int(r.context), "op": op.name, "measured_op": r.op,
                     "cls": op.op_class, "obj": op, "us": float(r.ms) * 1e3})
    return rows


# -------------------------------------------------------------------------------------------- op-level fits
def fit_kernel(rows, cal) -> KernelDecode:
    k = [r for r in rows if r["op"] == "kernel"]
    meas = np.array([r["us"] for r in k])
    flop = np.array([op_time_ms(replace(r["obj"], dims={**r["obj"].dims, "content": "zeros"}), H200, cal) * 1e3
                     for r in k])
    keys = np.array([min(r["c"], 2048) for r in k], float)
    kvb = np.array([r["B"] for r in k], float) * keys * 1152 / (H200.hbm_gbps * 1e9) * 1e6
    # grid search, the first of equal errors wins
    _, a, b, e, p = min(((np.mean(np.abs(a + core - meas) / meas), a, b, e, p) for p in (1.5, 2.0, 3.0, 4.0, 6.0)
                         for e in np.arange(0.50, 1.001, 0.02) for b in np.arange(0.020, 0.0301, 0.00025)
                         for core in [((b * keys) ** p + flop ** p + (kvb / e) ** p) ** (1 / p)]
                         for a in np.arange(0.0, 8.01, 0.25)), key=lambda t: t[0])
    return KernelDecode(round(float(a), 4), round(float(b), 6), round(float(e), 4), float(p))


def _roofline_us(flops, nbytes, ef, eb, fl, mode):
    t = np.maximum(flops / (H200.bf16_tflops * 1e12 * ef), nbytes / (H200.hbm_gbps * 1e9 * eb)) * 1e6
    return t + fl if mode == "add" else np.maximum(t, fl)


def fit_idx(rows) -> ClassEff:
    k = [r for r in rows if r["op"] == "idx_logits"]
    meas = np.array([r["us"] for r in k])
    F = np.array([r["obj"].flops for r in k])
    Bt = np.array([r["obj"].bytes for r in k])
    best = (np.inf, None)
    grid = np.round(np.arange(0.02, 1.001, 0.01), 3)
    for mode in ("add", "max"):
        for fl in np.arange(0.0, 8.01, 0.25):
            pred = _roofline_us(F[:, None, None], Bt[:, None, None], grid[None, :, None], grid[None, None, :], fl, mode)
            err = np.mean(np.abs(pred - meas[:, None, None]) / meas[:, None, None], axis=0)
            i = np.unravel_index(np.argmin(err), err.shape)
            if err[i] < best[0]:
                best = (err[i], ClassEff(round(float(grid[i[0]]), 4), round(float(grid[i[1]]), 4), float(fl), len(k),
                                         float(err[i] * 100), mode))
    return best[1]


def fit_topk(rows) -> tuple:
    k = [r for r in rows if r["op"] == "idx_topk"]
    meas = np.array([r["us"] for r in k])
    w = 1.0 / meas  # least squares on relative error
    X = np.array([[1.0, r["c"], r["B"] * r["c"]] for r in k])
    coef, *_ = np.linalg.lstsq(X * w[:, None], meas * w, rcond=None)
    return tuple(round(float(x), 9) for x in np.maximum(coef, 0.0))


def fit_class_floors(rows, cal) -> dict:
    out = {}
    for cls in CLASSES:
        if not (k := [r for r in rows if r["cls"] == cls]):
            continue
        e = cal.eff(cls)
        meas = np.array([r["us"] for r in k])
        F = np.array([r["obj"].flops for r in k])
        Bt = np.array([r["obj"].bytes for r in k])
        # bf16 measurements (fp8 classes borrow these floors); the first of equal errors wins
        out[cls] = min(((mape(_roofline_us(F, Bt, e.eff_flops, e.eff_bytes, fl, mode), meas), (float(fl), mode))
                        for mode in ("add", "max") for fl in FLOORS), key=lambda t: t[0])[1]
    return out


def fit_attn_floors(rows, cal) -> dict:
    out = {}
    for op, kernels in (("concat", 1), ("pad", 2)):
        k = [r for r in rows if r["op"] == op]
        meas = np.array([r["us"] for r in k])
        base = np.array([op_time_ms(r["obj"], H200, cal) * 1e3 for r in k])
        out[op] = float(min((mape(base + kernels * fl, meas), fl) for fl in FLOORS)[1])
    # one copy kernel (new_empty + copy; out[:, :H] copies): the per-kernel cost of the measured pad
    return out | dict.fromkeys(("pad_copy", "out_slice", "chunk_out"), out["pad"])


# ------------------------------------------------------------------------------------------ layer-level fits
def layer_configs(layer_df) -> list[dict]:
    keys = ["experiment", "model", "strategy", "mode", "batch", "context", "prefill_tokens"]
    g = layer_df[layer_df["status"] == "ok"].groupby(keys)["ms_median"]
    q25, q75, n = g.quantile(0.25), g.quantile(0.75), g.size()
    return [{**dict(zip(keys, k)), "measured_ms": float(v), "measured_q25_ms": float(q25[k]),
             "measured_q75_ms": float(q75[k]), "n_repeats": int(n[k])} for k, v in g.median().items()]


def predict(cfg, cal, dcal) -> dict:
    B, c, P = int(cfg["batch"]), int(cfg["context"]), int(cfg["prefill_tokens"])
    return layer_decode_ms(_rank(cfg["model"]), measured_as(cfg["strategy"]),
                           prefill=[(10**9, 0, P)] if P else [], decode_contexts=[c] * B, calibration=cal,
                           decode_cal=dcal, graph=cfg["mode"] == "graph", measured_subset=True, decode_kernels="fit")


def fit_all(ops, cfgs, cal, models, form=None) -> DecodeCalibration:
    """Every part fitted on the rows of ``models`` (op rows and layer configurations)."""
    o = [r for r in ops if r["model"] in models]
    c = [r for r in cfgs if r["model"] in models]
    dcal = DecodeCalibration(fit_class_floors(o, cal), {}, fit_idx(o), fit_topk(o), fit_kernel(o, cal))
    dcal = replace(dcal, attn_floor_us=fit_attn_floors(o, dcal.graph_calibration(cal)))
    # 2. per-layer fixed cost on graph rows: the median relative gap, refined by a grid
    g = [r for r in c if r["mode"] == "graph"]
    gpu0 = np.array([predict(r, cal, dcal)["gpu_ms"] for r in g])
    meas = np.array([r["measured_ms"] for r in g])
    fixed = round(min(((mape(gpu0 + f * 1e-3, meas), float(f)) for f in np.arange(-20.0, 60.01, 0.25)))[1], 4)
    dcal = replace(dcal, layer_fixed_us=fixed)
    # 3. the launch model on eager rows
    e = [r for r in c if r["mode"] == "eager"]
    priced = [predict(r, cal, dcal) for r in e]
    gpu, n = np.array([p["gpu_ms"] for p in priced]), np.array([p["n_ops"] for p in priced], float)
    meas = np.array([r["measured_ms"] for r in e])
    hosts, gaps = np.arange(0.0, 40.01, 0.25), np.arange(0.0, 8.01, 0.1)
    forms = {"max": (hosts, [0.0]), "add": ([0.0], gaps), "max+add": (hosts, gaps)}
    best = {name: min((mape(np.maximum(gpu + n * gp * 1e-3, n * h * 1e-3), meas), float(h), float(gp))
                      for h in hs for gp in gs) for name, (hs, gs) in forms.items()}
    name = form or min(best, key=lambda k: best[k][0])
    _, h, gp = best[name]
    return replace(dcal, host_us_per_op=round(h, 4), eager_gap_us=round(gp, 4), eager_form=name,
                   fit={f"eager_form_{k}_mape_pct": v[0] for k, v in best.items()})


def validate(cfgs, cal, dcal, fit_name) -> list[dict]:
    return [{"fit": fit_name, "kind": "mixed" if r["prefill_tokens"] else f"decode_{r['mode']}",
             **{k: r[k] for k in ("experiment", "model", "strategy", "mode", "batch", "context", "prefill_tokens")},
             "strategy_modelled": measured_as(r["strategy"]), "measured_ms": r["measured_ms"],
             "measured_q25_ms": r["measured_q25_ms"], "measured_q75_ms": r["measured_q75_ms"],
             "n_repeats": r["n_repeats"], "predicted_ms": p["total_ms"], "predicted_gpu_ms": p["gpu_ms"],
             "predicted_host_ms": p["host_ms"], "n_ops": p["n_ops"],
             "ape_pct": abs(p["total_ms"] - r["measured_ms"]) / r["measured_ms"] * 100}
            for r in cfgs for p in [predict(r, cal, dcal)]]


def summarize(rows) -> dict:
    """Mean APE (%) per ``fit:kind`` (kinds decode_graph, decode_eager, mixed, all) that has rows."""
    return {f"{fit}:{kind}": float(np.mean(a)) for fit in sorted({r["fit"] for r in rows})
            for kind in ("decode_graph", "decode_eager", "mixed", "all")
            if (a := [r["ape_pct"] for r in rows if r["fit"] == fit and (kind == "all" or r["kind"] == kind)])}


def fit_decode_file(measured: Path) -> dict:
    """``h200/round2/decode_ops.csv`` and ``decode_layer.csv`` under ``measured`` -> the decode calibration's rows
    (:func:`~mla_lab.model.decode_calibration.decode_calibration_rows`, with the in-sample and leave-one-model-out
    MAPE) and the validation table ``h200/round2/decode_validation.csv``."""
    ddir = measured / "h200" / "round2"
    layer_df, ops_df = (pd.read_csv(ddir / f) for f in ("decode_layer.csv", "decode_ops.csv"))
    cal = load_calibration()
    ops, cfgs = op_rows(ops_df), layer_configs(layer_df)
    models = sorted({r["model"] for r in cfgs})
    dcal = fit_all(ops, cfgs, cal, set(models))
    rows = validate(cfgs, cal, dcal, "in_sample")
    for held in models:
        part = fit_all(ops, cfgs, cal, set(models) - {held}, form=dcal.eager_form)
        rows += validate([r for r in cfgs if r["model"] == held], cal, part, "leave_one_model_out")
    prov = provenance(layer_df, _PROV)
    prov.update(device=prov.get("gpu", "?"), data_file=f"{rel(ddir / 'decode_layer.csv')};{rel(ddir / 'decode_ops.csv')}",
                calibration=cal.name, fit_commit=git_commit())
    fit = {**dcal.fit, **{k.replace(":", "_") + "_mape_pct": v for k, v in summarize(rows).items()}}
    return {DECODE_CSV: decode_calibration_rows(replace(dcal, fit=fit), prov),
            "h200/round2/decode_validation.csv": pd.DataFrame(rows).assign(**prov)}
