"""Fit the decode calibration of the serving pricer to the H200 decode measurements and validate it.

    python -m mla_lab.fits.decode [--data-dir data/measured/h200/round2] [--out data/calibration/h200_decode.csv]

Inputs (``mla_lab/measure/experiments/decode_layer.py``, GPU round 2, docs/perf-notes.md): ``decode_ops.csv`` (every op of the decode
layer alone, CUDA-graph replay of 10 back-to-back calls, device time per call) and ``decode_layer.csv`` (the
per-rank layer: decode batches B = 1..256 at contexts 1k-8k, eager and graph; mixed steps, eager). Per
configuration the measured value is the median over repeats of each window's median.

Fit (each part with the committed layer calibration ``h200_ops.csv`` underneath; what each part means:
``mla_lab/serving/step_pricer.py``):

1. from ``decode_ops.csv``: the sparse kernel on decode tokens (:class:`KernelDecode`), the decode indexer logits
   (a :class:`ClassEff`), the decode top-k (``f + a max(c) + b sum(c)``, least squares on relative error), the
   graph-replay overhead of each roofline class and the per-kernel cost of the attention byte ops (grids,
   minimum mean absolute percentage error);
2. from ``decode_layer.csv`` graph rows: the fixed cost per layer;
3. from ``decode_layer.csv`` eager rows (decode and mixed): the launch model
   ``max(GPU + n x gap, n x host)``; three forms (host floor only, gaps only, both) are fitted and the one with the
   lowest leave-one-model-out error kept.

Validation: every (model, strategy, mode, B, c, prefill) of ``decode_layer.csv`` predicted by
:func:`mla_lab.serving.step_pricer.layer_decode_ms` over the measured op subset (``layer_ops`` ops with ``impl``
and not comm, bf16 weights, EP8: what the benchmark runs; no KV-cache write, RoPE, indexer k-prep, router top-k or
all-reduce), in sample and leave-one-model-out (every part refitted on the other model's rows). Outputs:
``data/calibration/h200_decode.csv`` (parameters + provenance columns copied from the CSV) and
``data/measured/h200/round2/decode_validation.csv`` (per configuration: measured, predicted, APE, fit).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from mla_lab.arch import get_arch
from mla_lab.deployment import Deployment
from mla_lab.model.calibration import ClassEff, load_calibration
from mla_lab.model.ops import layer_ops
from mla_lab.model.timing import op_time_ms
from mla_lab.models import load_model
from mla_lab.paths import REPO_ROOT as REPO
from mla_lab.paths import calibration_dir
from mla_lab.placement import measured_as
from mla_lab.rank import RankView
from mla_lab.serving.step_pricer import (
    DECODE_CSV,
    DecodeCalibration,
    KernelDecode,
    _eager_ms,
    layer_decode_ms,
    write_decode_calibration,
)
from mla_lab.workload import Step as WorkStep

PROVENANCE = ("source", "gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "date_utc")
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
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred - meas) / meas) * 100)


def _model(name, cache={}):  # noqa: B006 - a small memo of loaded configs
    if name not in cache:
        cache[name] = load_model(name)
    return cache[name]


def _rank(name: str, tp: int = TP, moe_parallel: str = "ep", ep: int | None = EP, cache={}):  # noqa: B006 - memo
    """The rank a measured decode row ran (bf16 weights, bf16 KV cache, H200), built once per point at the
    :meth:`~mla_lab.deployment.Deployment.rank_of` door (``max_num_batched_tokens`` 16384: the rows' engine
    limit, not read by :func:`~mla_lab.model.ops.layer_ops`); ``ep`` the expert-parallel size under ``ep``."""
    key = (name, tp, moe_parallel, ep)
    if key not in cache:
        r = Deployment.rank_of(model=_model(name), tp=tp, arch=H200, kv_cache_dtype="bf16", weight_dtype="bf16",
                               moe_parallel=moe_parallel, max_num_batched_tokens=16384)
        cache[key] = r.with_ep_size(ep) if moe_parallel == "ep" else r
    return cache[key]


def measured_rank(name) -> RankView:
    """The rank the decode measurements ran (``benchmarks/bench_decode.py``): model ``name``, TP8 (EP8 whole
    experts) on an H200, bf16 weights, bf16 KV cache (:func:`_rank`)."""
    return _rank(name)


def decode_ws(B, c, P=0) -> WorkStep:
    return WorkStep([(i, c - 1, 1) for i in range(B)] + ([(10**9, 0, P)] if P else []))


def op_rows(ops_df) -> list[dict]:
    """decode_ops.csv -> one row per (model, B, c, op, strategy): the measured median (us) and the model's op."""
    d = ops_df[ops_df["status"] == "ok"].copy()
    d["context"] = d["context"].fillna(4096).astype(int)
    d["strategy"] = d["strategy"].fillna("")
    g = d.groupby(["model", "batch", "context", "op", "strategy"])["ms"].median().reset_index()
    rows = []
    for r in g.itertuples():
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
    B = np.array([r["B"] for r in k], float)
    kvb = B * keys * 1152 / (H200.hbm_gbps * 1e9) * 1e6
    best = (np.inf, None)
    for p in (1.5, 2.0, 3.0, 4.0, 6.0):
        for e in np.arange(0.50, 1.001, 0.02):
            for b in np.arange(0.020, 0.0301, 0.00025):
                core = ((b * keys) ** p + flop ** p + (kvb / e) ** p) ** (1 / p)
                for a in np.arange(0.0, 8.01, 0.25):
                    err = np.mean(np.abs(a + core - meas) / meas)
                    if err < best[0]:
                        best = (err, KernelDecode(round(float(a), 4), round(float(b), 6), round(float(e), 4), float(p)))
    return best[1]


def _roofline_us(flops, nbytes, ef, eb, fl, mode, arch=H200):
    t = np.maximum(flops / (arch.bf16_tflops * 1e12 * ef), nbytes / (arch.hbm_gbps * 1e9 * eb)) * 1e6
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
            t = np.maximum(F[:, None, None] / (H200.bf16_tflops * 1e12 * grid[None, :, None]),
                           Bt[:, None, None] / (H200.hbm_gbps * 1e9 * grid[None, None, :])) * 1e6
            pred = t + fl if mode == "add" else np.maximum(t, fl)
            err = np.mean(np.abs(pred - meas[:, None, None]) / meas[:, None, None], axis=0)
            i = np.unravel_index(np.argmin(err), err.shape)
            if err[i] < best[0]:
                best = (err[i], ClassEff(round(float(grid[i[0]]), 4), round(float(grid[i[1]]), 4), float(fl), len(k),
                                         float(err[i] * 100), mode))
    return best[1]


def fit_topk(rows) -> tuple:
    k = [r for r in rows if r["op"] == "idx_topk"]
    meas = np.array([r["us"] for r in k])
    X = np.array([[1.0, r["c"], r["B"] * r["c"]] for r in k])
    w = 1.0 / meas  # least squares on relative error
    coef, *_ = np.linalg.lstsq(X * w[:, None], meas * w, rcond=None)
    coef = np.maximum(coef, 0.0)
    return tuple(round(float(x), 9) for x in coef)


def fit_class_floors(rows, cal) -> dict:
    out = {}
    for cls in CLASSES:
        k = [r for r in rows if r["cls"] == cls]
        if not k:
            continue
        e = cal.eff(cls)
        meas = np.array([r["us"] for r in k])
        F = np.array([r["obj"].flops for r in k])
        Bt = np.array([r["obj"].bytes for r in k])
        peak = 1.0  # bf16 measurements (fp8 classes borrow these floors)
        best = (np.inf, None)
        for mode in ("add", "max"):
            for fl in FLOORS:
                err = mape(_roofline_us(F * peak, Bt, e.eff_flops, e.eff_bytes, fl, mode), meas)
                if err < best[0]:
                    best = (err, (float(fl), mode))
        out[cls] = best[1]
    return out


def fit_attn_floors(rows, cal) -> dict:
    out = {}
    for op, kernels in (("concat", 1), ("pad", 2)):
        k = [r for r in rows if r["op"] == op]
        meas = np.array([r["us"] for r in k])
        base = np.array([op_time_ms(r["obj"], H200, cal) * 1e3 for r in k])
        errs = [(mape(base + kernels * fl, meas), fl) for fl in FLOORS]
        out[op] = float(min(errs)[1])
    # one copy kernel (new_empty + copy; out[:, :H] copies): the per-kernel cost of the measured pad
    for op in ("pad_copy", "out_slice", "chunk_out"):
        out[op] = out["pad"]
    return out


# ------------------------------------------------------------------------------------------ layer-level fits
def layer_configs(layer_df) -> list[dict]:
    d = layer_df[layer_df["status"] == "ok"]
    keys = ["experiment", "model", "strategy", "mode", "batch", "context", "prefill_tokens"]
    g = d.groupby(keys)["ms_median"]
    med = g.median()
    q25, q75, n = g.quantile(0.25), g.quantile(0.75), g.size()
    rows = []
    for k, v in med.items():
        rows.append({**dict(zip(keys, k)), "measured_ms": float(v), "measured_q25_ms": float(q25[k]),
                     "measured_q75_ms": float(q75[k]), "n_repeats": int(n[k])})
    return rows


def predict(cfg, cal, dcal) -> dict:
    B, c, P = int(cfg["batch"]), int(cfg["context"]), int(cfg["prefill_tokens"])
    return layer_decode_ms(measured_rank(cfg["model"]), measured_as(cfg["strategy"]),
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
    gpu = np.array([predict(r, cal, dcal)["gpu_ms"] for r in e])
    n = np.array([predict(r, cal, dcal)["n_ops"] for r in e], float)
    meas = np.array([r["measured_ms"] for r in e])
    hosts = np.arange(0.0, 40.01, 0.25)
    gaps = np.arange(0.0, 8.01, 0.1)
    forms = {"max": (hosts, [0.0]), "add": ([0.0], gaps), "max+add": (hosts, gaps)}
    best = {}
    for name, (hs, gs) in forms.items():
        cand = []
        for h in hs:
            for gp in gs:
                pred = np.maximum(gpu + n * gp * 1e-3, n * h * 1e-3)
                cand.append((mape(pred, meas), float(h), float(gp)))
        best[name] = min(cand)
    name = form or min(best, key=lambda k: best[k][0])
    _, h, gp = best[name]
    h, gp = round(h, 4), round(gp, 4)
    return replace(dcal, host_us_per_op=h, eager_gap_us=gp, eager_form=name,
                   fit={f"eager_form_{k}_mape_pct": v[0] for k, v in best.items()})


def validate(cfgs, cal, dcal, fit_name) -> list[dict]:
    out = []
    for r in cfgs:
        p = predict(r, cal, dcal)
        kind = "mixed" if r["prefill_tokens"] else f"decode_{r['mode']}"
        out.append({"fit": fit_name, "kind": kind, **{k: r[k] for k in ("experiment", "model", "strategy", "mode",
                                                                         "batch", "context", "prefill_tokens")},
                    "strategy_modelled": measured_as(r["strategy"]), "measured_ms": r["measured_ms"],
                    "measured_q25_ms": r["measured_q25_ms"], "measured_q75_ms": r["measured_q75_ms"],
                    "n_repeats": r["n_repeats"], "predicted_ms": p["total_ms"], "predicted_gpu_ms": p["gpu_ms"],
                    "predicted_host_ms": p["host_ms"], "n_ops": p["n_ops"],
                    "ape_pct": abs(p["total_ms"] - r["measured_ms"]) / r["measured_ms"] * 100})
    return out


def summarize(rows) -> dict:
    out = {}
    for fit in sorted({r["fit"] for r in rows}):
        for kind in ("decode_graph", "decode_eager", "mixed", "all"):
            a = [r["ape_pct"] for r in rows if r["fit"] == fit and (kind == "all" or r["kind"] == kind)]
            if a:
                out[f"{fit}:{kind}"] = float(np.mean(a))
    return out


def prefill_crosscheck(cal, dcal, path) -> dict:
    """MAPE of the committed prefill layer measurements (``layer_e2e.csv``, mla_lab/measure/experiments/layer_calibration.py) priced as the
    committed model does (tests/test_layer_model_validation.py) and with the decode calibration's graph overheads
    and launch model: a check that the decode terms leave prefill intact (not part of the fit)."""
    import csv


    if not Path(path).is_file():
        return {}
    g = dcal.graph_calibration(cal)
    out: dict = {}
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    for r in rows:
        excl = set((r.get("excluded_ops") or "").split(";"))
        rank = _rank(r["model"], int(r["tp"]), r["moe_parallel"], int(r["ep"]))
        ops = [op for op in layer_ops(rank, measured_as(r["strategy"]), int(r["T"]), layer_kind=r["layer_kind"])
               if op.impl and not op.is_comm and op.name not in excl]
        old = sum(op_time_ms(op, H200, cal) for op in ops)
        new = sum(op_time_ms(op, H200, g) for op in ops)
        if r["mode"] == "eager":
            new = _eager_ms(new, len(ops), dcal)[0]
        ms = float(r["ms"])
        for k, v in (("committed", old), ("decode_calibration", new)):
            out.setdefault(f"prefill_{r['mode']}_{k}", []).append(abs(v - ms) / ms * 100)
    return {k: float(np.mean(v)) for k, v in out.items()}


def _git_commit() -> str:
    try:
        c = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
        return c + ("+dirty" if dirty.strip() else "")
    except Exception:
        return "unknown"


def main(argv=None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=str(REPO / "data/measured/h200/round2"))
    ap.add_argument("--out", default=str(calibration_dir() / DECODE_CSV))
    ap.add_argument("--validation", default=None, help="default: <data-dir>/decode_validation.csv")
    args = ap.parse_args(argv)
    ddir = Path(args.data_dir)
    layer_df = pd.read_csv(ddir / "decode_layer.csv")
    ops_df = pd.read_csv(ddir / "decode_ops.csv")
    cal = load_calibration()
    ops = op_rows(ops_df)
    cfgs = layer_configs(layer_df)
    models = sorted({r["model"] for r in cfgs})
    dcal = fit_all(ops, cfgs, cal, set(models))
    rows = validate(cfgs, cal, dcal, "in_sample")
    for held in models:
        part = fit_all(ops, cfgs, cal, set(models) - {held}, form=dcal.eager_form)
        rows += validate([r for r in cfgs if r["model"] == held], cal, part, "leave_one_model_out")
    summ = summarize(rows)
    rel = lambda p: str(Path(p).resolve().relative_to(REPO)) if Path(p).resolve().is_relative_to(REPO) else str(p)  # noqa: E731
    prov = {k: str(layer_df[k].iloc[0]) for k in PROVENANCE if k in layer_df.columns}
    prov.update(device=prov.get("gpu", "?"), data_file=f"{rel(ddir / 'decode_layer.csv')};{rel(ddir / 'decode_ops.csv')}",
                calibration=cal.name, fit_commit=_git_commit())
    dcal = replace(dcal, fit={**dcal.fit, **{k.replace(":", "_") + "_mape_pct": v for k, v in summ.items()}},
                   provenance=prov)
    write_decode_calibration(dcal, args.out, prov)
    vpath = Path(args.validation) if args.validation else ddir / "decode_validation.csv"
    vt = pd.DataFrame(rows)
    for k, v in prov.items():
        vt[k] = v
    vt.to_csv(vpath, index=False)
    pd.set_option("display.width", 200)
    piv = vt.pivot_table(index=["kind", "model", "batch", "prefill_tokens"], columns=["fit"], values="ape_pct",
                         aggfunc="mean")
    print(piv.round(1).to_string())
    print(f"graph floors {dcal.graph_floors}\nattention floors {dcal.attn_floor_us}\nidx decode {dcal.idx_decode}\n"
          f"topk {dcal.topk_decode}\nkernel {dcal.kernel_decode}\nlayer fixed {dcal.layer_fixed_us} us; launch "
          f"{dcal.eager_form}: host {dcal.host_us_per_op} us/op, gap {dcal.eager_gap_us} us/op")
    for k, v in summ.items():
        print(f"MAPE {k}: {v:.2f} %")
    for k, v in prefill_crosscheck(cal, dcal, ddir.parent / "layer_e2e.csv").items():
        print(f"cross-check (not fitted) MAPE {k}: {v:.2f} %")
    print(f"wrote {args.out} and {vpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
