"""Fit the all-reduce term of the cost model (latency + bandwidth, one fit per world size) to every NCCL run
committed under ``data/measured/<gpu>x<n>/`` and write it.

    python benchmarks/fit_comm.py [--gpu h200] [--measured-dir data/measured] [--out data/calibration/h200_comm.csv]

Reads every rank's median all-reduce time (:func:`mla_lab.model.comm.measured_allreduce_rows`: ``allreduce.csv`` of
``benchmarks/tp_block.py`` and the older ``tp2_attention.csv``), fits :func:`mla_lab.model.comm.fit_comm` per world
size and prints each rank row beside the fit (measured ms, fitted ms, error) and each fit with its in-sample and
leave-one-size-out MAPE. The output carries the provenance of the runs (GPU, driver, torch, NCCL env, commit) and
the files read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mla_lab.model.comm import COMM_CSV, fit_comm, measured_allreduce_rows, write_comm_model  # noqa: E402
from mla_lab.paths import calibration_dir, measured_dir  # noqa: E402

PROVENANCE = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp",
              "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")


def main(argv=None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--measured-dir", default=str(measured_dir()))
    ap.add_argument("--out", default=str(calibration_dir() / COMM_CSV))
    args = ap.parse_args(argv)
    rows, files = measured_allreduce_rows(args.gpu, args.measured_dir)
    if not rows:
        print(f"fit_comm: no all-reduce rows under {args.measured_dir}/{args.gpu}x*/", file=sys.stderr)
        return 2
    model = fit_comm(rows, name=Path(args.out).name)
    per = pd.DataFrame(rows)
    per["fit_ms"] = [model.fits[int(r["world_size"])].time_ms(r["nbytes"]) for r in rows]
    per["ape_pct"] = 100 * (per["fit_ms"] - per["ms"]).abs() / per["ms"]
    print(per.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    prov = {}
    for f in files:
        d = pd.read_csv(REPO / f if not Path(f).is_absolute() else f)
        for k in PROVENANCE:
            if k in d.columns and k not in prov:
                prov[k] = ";".join(sorted({str(v) for v in d[k].dropna()}))
    prov.update(source="measured", data_files=";".join(files))
    write_comm_model(model, args.out, prov)
    for n, fit in sorted(model.fits.items()):
        loo = "n/a (< 3 sizes)" if fit.loo_mape_pct is None else f"{fit.loo_mape_pct:.1f} %"
        print(f"tp={n}: latency {fit.latency_us:.1f} us, {fit.bw_gbps:.0f} GB/s per direction; {fit.n} rank rows, "
              f"{fit.n_sizes} sizes {fit.min_bytes / 2**20:.0f}-{fit.max_bytes / 2**20:.0f} MiB; MAPE "
              f"{fit.mape_pct:.1f} % in sample, {loo} leave-one-size-out, worst {fit.max_ape_pct:.1f} %")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
