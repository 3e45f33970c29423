"""Fit the sparse kernel's roofline and the dense routes' classes on the committed H200 rows; write
``data/calibration/h200_routes.csv`` (the format of :func:`mla_lab.model.calibration.write_calibration_csv`).

Inputs (all committed, measured on one H200): the FlashMLA kernel rows with zero padded heads
(:func:`mla_lab.model.routes.padded_kernel_rows`) and the route rows of round 3
(``data/measured/h200/between_process/routes.csv``, :func:`mla_lab.model.routes.route_rows`). Prints each fit's error.

Usage: ``python -m mla_lab.fits.routes [--out data/calibration/h200_routes.csv]`` (refuses a path it did not
write: an existing file without this script's ``fit_inputs`` column).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from mla_lab.model.calibration import write_calibration_csv
from mla_lab.model.routes import default_padded_kernel_fit, route_calibration_rows
from mla_lab.paths import calibration_dir
from mla_lab.provenance import git_commit

FIT_INPUTS = ("data/measured/h200/{round2/content.csv,layer_ops.csv,attention_path.csv}, "
              "data/calibration/h200_reference.csv, data/measured/h200/between_process/routes.csv")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(calibration_dir() / "h200_routes.csv"))
    a = ap.parse_args(argv)
    out = Path(a.out)
    if out.exists():
        with open(out, newline="") as f:
            if "fit_inputs" not in (csv.DictReader(f).fieldnames or []):
                print(f"--out={a.out!r} exists and was not written by this script; allowed: a new path or this "
                      "script's own file", file=sys.stderr)
                return 2
    rows = route_calibration_rows()
    fit = default_padded_kernel_fit()
    write_calibration_csv(rows, out, {"source": "measured", "device": "NVIDIA H200", "fit_inputs": FIT_INPUTS,
                                      "fit_commit": git_commit()})
    print(f"padded-kernel roofline: eff_flops {fit.eff_flops:.3f}, eff_bytes {fit.eff_bytes:.3f}, n {fit.n}, "
          f"MAPE {fit.mape_pct:.1f} % (max {fit.max_err_pct:.1f} %), out of sample by source "
          + ", ".join(f"{k} {v:.1f} %" for k, v in fit.oos.items()) + f"; FLOP-only {fit.flop_only_mape_pct:.1f} %")
    for r in rows[2:]:
        print(f"class {r['op_class']}: eff_flops {r['eff_flops']:.3f}, eff_bytes {r['eff_bytes']:.3f}, "
              f"{r['floor_us']:g} us {r['overhead_mode']}, n {r['n']}, MAPE {r['mape_pct']:.1f} %")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
