"""Fit the engine-strategy terms of the cost model to the H200 round-2 measurements and write them.

    python -m mla_lab.fits.engines [--data-dir data/measured/h200/round2]

1. The padded-head content factor (:mod:`mla_lab.model.content`) from ``content.csv`` (interleaved zeros/stale
   kernel timings of ``mla_lab/measure/experiments/engines.py``): per (shape, mode) the median over repeats, ``a, b, c``
   fitted with leave-one-shape-out error -> ``data/calibration/h200_content.csv`` and ``content_fit.csv``.
2. The fixed cost per extra sub-chunk from ``presets.csv`` (sub-chunked attention path at S = 1024 .. 16384):
   ``t(n chunks) - t(1 chunk)`` against ``n - 1``, both hand-offs, both models, seed and full topk ->
   ``data/calibration/h200_subchunk.csv``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from mla_lab.model.calibration import SUBCHUNK_CSV, fit_subchunk_overhead
from mla_lab.model.content import CONTENT_CSV, fit_content_factor, write_content_model
from mla_lab.paths import REPO_ROOT as REPO
from mla_lab.paths import calibration_dir

PROVENANCE = ("gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "date_utc")


def shape_medians(df) -> list[dict]:
    """Per (shape, mode): median kernel ms with zeros and with stale padded heads (ms_median of each repeat)."""
    d = df[(df["experiment"] == "content_factor") & (df["status"] == "ok")]
    keys = ["shape_id", "H", "Hp", "T", "pattern", "prompt_len", "mode"]
    g = d.groupby(keys + ["content"])["ms_median"].median().unstack("content").reset_index()
    return [{"shape": f"{r.shape_id}:{r.mode}", "num_heads": int(r.H), "padded_heads": int(r.Hp), "T": int(r.T),
             "pattern": r.pattern, "mode": r.mode, "zeros_ms": float(r.zeros), "stale_ms": float(r.stale)}
            for r in g.itertuples()]


def main(argv=None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=str(REPO / "data/measured/h200/round2"))
    ap.add_argument("--out-dir", default=str(calibration_dir()))
    args = ap.parse_args(argv)
    args.data = str(Path(args.data_dir) / "content.csv")
    args.out = str(Path(args.out_dir) / CONTENT_CSV)
    df = pd.read_csv(args.data)
    rows = shape_medians(df)
    model, per = fit_content_factor(rows, name=Path(args.out).name)
    prov = {k: str(df[k].iloc[0]) for k in PROVENANCE if k in df.columns}
    prov.update(source="measured", device=prov.get("gpu", "?"), data_file=str(Path(args.data).relative_to(REPO)))
    write_content_model(model, args.out, prov)
    table = pd.DataFrame(per)
    table.to_csv(Path(args.data).with_name("content_fit.csv"), index=False)
    print(table[["shape", "T", "num_heads", "pattern", "zeros_ms", "stale_ms", "ratio_measured", "ratio_fit",
                 "ape_pct", "ape_loso_pct"]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"a={model.a:.3f} b={model.b:.3f} c_ms={model.c_ms:.3f}; {model.n} shapes; MAPE in sample "
          f"{model.mape_pct:.2f} %, leave-one-shape-out {model.loso_mape_pct:.2f} %")
    presets = pd.read_csv(Path(args.data_dir) / "presets.csv")
    rows = subchunk_rows(presets)
    us, resid = fit_subchunk_overhead(rows)
    path = Path(args.out_dir) / SUBCHUNK_CSV
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["chunk_overhead_us", "mean_abs_residual_us", "n", *prov])
        w.writeheader()
        w.writerow({"chunk_overhead_us": us, "mean_abs_residual_us": resid, "n": len(rows), **prov,
                    "data_file": str((Path(args.data_dir) / "presets.csv").relative_to(REPO))})
    print(f"sub-chunk: {us:.1f} us per extra chunk (mean abs residual {resid:.1f} us over {len(rows)} runs)")
    return 0


def subchunk_rows(presets) -> list[dict]:
    """Per (model, pattern, hand-off): median ms at each chunk count minus the one-chunk median."""
    d = presets[(presets["status"] == "ok") & presets["preset"].isin(["subchunk", "subchunk_views"])]
    g = d.groupby(["model", "pattern", "preset", "n_chunks"])["ms_median"].median().reset_index()
    rows = []
    for _, part in g.groupby(["model", "pattern", "preset"]):
        one = part[part["n_chunks"] == 1]["ms_median"]
        if one.empty:
            continue
        for r in part[part["n_chunks"] > 1].itertuples():
            rows.append({"extra_chunks": int(r.n_chunks) - 1, "extra_ms": float(r.ms_median) - float(one.iloc[0])})
    return rows


if __name__ == "__main__":
    sys.exit(main())
