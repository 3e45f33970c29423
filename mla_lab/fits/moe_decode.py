"""Fit the fp8 routed-expert MoE at decode sizes to the H200 measurements.

    python -m mla_lab.fits.moe_decode [--data data/measured/h200/between_process/moe_decode.csv]
                                        [--out data/calibration/h200_moe_decode.csv]

Input: ``moe_decode.csv`` (``mla_lab/measure/experiments/moe_decode.py``): GLM-5's EP8 rank share (32 local experts) of
the routed experts, ``T`` = 1..256 decode tokens, ``impl`` ``fp8_scaled_grouped_mm`` (``torch._scaled_grouped_mm``
with row-wise scales, the activation quantization included) timed by CUDA-graph replay in 5 fresh processes;
``weight_bytes`` the fp8 weights of the experts hit (gate_up + down).

Statistics: per ``T`` the figure is the median over processes of the per-process value
(:func:`mla_lab.measure.spread.process_medians` / :func:`~mla_lab.measure.spread.between_process`).
Fit: ``ms = a + weight_bytes / BW`` by least squares on the per-``T`` figures (a: the fixed cost of one MoE block,
both grouped GEMMs and the quantization; BW: the achieved weight-read bandwidth). Error: MAPE in sample and
leave-one-T-out (each ``T`` predicted by the fit on the others). Output: one row per parameter with provenance
columns copied from the measured CSV; the serving pricer loads it in
:func:`mla_lab.model.decode_calibration.load_moe_decode_fit`.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from mla_lab.arch import get_arch
from mla_lab.measure.spread import between_process
from mla_lab.paths import REPO_ROOT

ROOT = REPO_ROOT
IMPL = "fp8_scaled_grouped_mm"
PROV = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timing")


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    A = np.column_stack([np.ones_like(x), x])
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(a), float(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "data/measured/h200/between_process/moe_decode.csv"))
    ap.add_argument("--out", default=str(ROOT / "data/calibration/h200_moe_decode.csv"))
    args = ap.parse_args(argv)
    df = pd.read_csv(args.data)
    df = df[df["impl"] == IMPL]
    if df.empty:
        raise SystemExit(f"--data={args.data!r} has no impl={IMPL!r} rows")
    Ts = sorted(int(t) for t in df["T"].unique())
    bp = between_process(df, ["T"], "ms")
    figs = [float(bp[(T,)]["median"]) for T in Ts]
    wb = [float(df.loc[df["T"] == T, "weight_bytes"].median()) for T in Ts]
    x, y = np.array(wb), np.array(figs)
    a, b = _fit(x, y)
    ape_in = np.abs(a + b * x - y) / y * 100
    ape_out = []
    for i in range(len(Ts)):
        keep = np.arange(len(Ts)) != i
        ai, bi = _fit(x[keep], y[keep])
        ape_out.append(abs(ai + bi * x[i] - y[i]) / y[i] * 100)
    ape_out = np.array(ape_out)
    bw_gbps = 1.0 / b / 1e6  # bytes per ms -> GB/s
    hbm = get_arch("h200").hbm_gbps
    n_proc = int(df["process"].nunique())
    try:
        fit_commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        fit_commit = ""
    prov = {k: df[k].iloc[0] for k in PROV if k in df}
    prov.update(source="measured-fit", n_processes=n_proc, data_file=str(Path(args.data).relative_to(ROOT))
                if Path(args.data).resolve().is_relative_to(ROOT) else args.data, impl=IMPL,
                method="per T: median over processes of per-process ms (mla_lab.measure.spread.between_process); "
                       "least squares ms = a + weight_bytes / BW on the per-T figures",
                fit_commit=fit_commit)
    rows = [("a_us", a * 1e3, "us", "fixed cost of one MoE block (gate_up + down + activation quantization)"),
            ("bw_gbps", bw_gbps, "GB/s", "achieved fp8 weight-read bandwidth"),
            ("eff_bytes", bw_gbps / hbm, "fraction", f"bw_gbps / H200 datasheet HBM {hbm:g} GB/s"),
            ("mape_in_pct", float(ape_in.mean()), "%", "in-sample MAPE over T"),
            ("max_ape_in_pct", float(ape_in.max()), "%", "in-sample max APE over T"),
            ("mape_loo_pct", float(ape_out.mean()), "%", "leave-one-T-out MAPE"),
            ("max_ape_loo_pct", float(ape_out.max()), "%", "leave-one-T-out max APE"),
            ("n_T", len(Ts), "count", f"T values {','.join(str(int(t)) for t in Ts)}")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["key", "value", "unit", "meaning", *prov])
        w.writeheader()
        for k, v, u, m in rows:
            w.writerow({"key": k, "value": v, "unit": u, "meaning": m, **prov})
    for T, xi, yi, e1, e2 in zip(Ts, x, y, ape_in, ape_out):
        print(f"T={int(T):4d} weight {xi / 2**20:7.0f} MiB  measured {yi:.4f} ms  APE in {e1:5.1f} %  loo {e2:5.1f} %")
    print(f"a = {a * 1e3:.1f} us, BW = {bw_gbps:.0f} GB/s ({bw_gbps / hbm:.3f} of HBM), MAPE in {ape_in.mean():.1f} % "
          f"(max {ape_in.max():.1f}), leave-one-T-out {ape_out.mean():.1f} % (max {ape_out.max():.1f}) -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
