"""Fit the padded-head content factor (mla_lab.model.content) to the H200 content measurements and write the fit.

    python benchmarks/fit_content.py [--data data/measured/h200/round2/content.csv]

Reads the interleaved zeros/stale kernel timings of ``benchmarks/bench_engines.py`` (experiment
``content_factor``), takes per (shape, mode) the median over repeats, fits ``a, b, c`` with leave-one-shape-out
error, prints the table and writes ``data/calibration/h200_content.csv`` (the fit, with the measurements'
provenance) and ``<data folder>/content_fit.csv`` (per shape: measured and fitted ratios, errors).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mla_lab.model.content import CONTENT_CSV, fit_content_factor, write_content_model  # noqa: E402
from mla_lab.paths import calibration_dir  # noqa: E402

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
    ap.add_argument("--data", default=str(REPO / "data/measured/h200/round2/content.csv"))
    ap.add_argument("--out", default=str(calibration_dir() / CONTENT_CSV))
    args = ap.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
