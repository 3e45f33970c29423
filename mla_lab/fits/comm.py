"""Fit the all-reduce term of the cost model (latency + bandwidth, one fit per world size) to every NCCL run
committed under ``data/measured/<gpu>x<n>/`` and write it.

    python -m mla_lab.fits.comm [--gpu h200] [--measured-dir data/measured] [--out data/calibration/<gpu>_comm.csv]

Reads every rank's median all-reduce time (:func:`mla_lab.model.comm.measured_allreduce_rows`: ``allreduce.csv`` of
``mla_lab/measure/experiments/tp_block.py`` and the older ``tp2_attention.csv``), fits :func:`mla_lab.model.comm.fit_comm` per world
size and prints each rank row beside the fit (measured ms, fitted ms, error) and each fit with its in-sample and
leave-one-size-out MAPE. The output carries the provenance of the runs (GPU, driver, torch, NCCL env, commit) and
the files read.

Bad input (an unknown ``--gpu``, a ``--measured-dir`` that is missing or not a folder, a malformed measured file,
an ``--out`` that is a folder or an existing file the lab did not write as a fit) gets one line on stderr naming
it, and exit status 2, before anything is written; ``--out`` is replaced whole (through a temporary file) or not
at all. Only ``data/calibration/h200_comm.csv`` is read by the cost model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mla_lab.arch import ARCHS, get_arch
from mla_lab.model.comm import (
    check_comm_out,
    fit_comm,
    measured_allreduce_rows,
    write_comm_model,
)
from mla_lab.paths import REPO_ROOT as REPO
from mla_lab.paths import calibration_dir, measured_dir

PROVENANCE = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp",
              "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")


def main(argv=None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200", help=f"the <gpu> of data/measured/<gpu>x<n>/; one of {sorted(ARCHS)}")
    ap.add_argument("--measured-dir", default=str(measured_dir()))
    ap.add_argument("--out", default=None, help="default data/calibration/<gpu>_comm.csv")
    args = ap.parse_args(argv)

    def refuse(msg: str) -> int:
        print(f"fit_comm: {msg.replace('out=', '--out ', 1) if msg.startswith('out=') else msg}", file=sys.stderr)
        return 2

    try:
        gpu = get_arch(args.gpu).name.lower()
    except ValueError:
        return refuse(f"--gpu {args.gpu!r} is not valid; allowed: {sorted(ARCHS)}")
    if gpu != args.gpu.strip().lower():
        return refuse(f"--gpu {args.gpu!r} is not valid; allowed: {sorted(ARCHS)} (the folder prefix, e.g. {gpu!r})")
    mdir = Path(args.measured_dir)
    if not mdir.is_dir():
        return refuse(f"--measured-dir {args.measured_dir!r} is not an existing folder; allowed: a folder holding "
                      f"{gpu}x<n>/ folders (default {measured_dir()})")
    out = args.out if args.out is not None else str(calibration_dir() / f"{gpu}_comm.csv")
    try:
        check_comm_out(out)
        rows, files = measured_allreduce_rows(gpu, mdir)
    except ValueError as e:
        return refuse(str(e))
    if not rows:
        return refuse(f"no all-reduce rows under {mdir}/{gpu}x<n>/ (allreduce.csv or tp2_attention.csv); nothing "
                      "written")
    model = fit_comm(rows, name=Path(out).name)
    if not model.fits:
        return refuse(f"no all-reduce rows at a world size >= 2 under {mdir}/{gpu}x<n>/; nothing written")
    fitted = [r for r in rows if int(r["world_size"]) in model.fits]
    per = pd.DataFrame(fitted).rename(columns={"ms": "measured_ms"})
    per["fit_ms (modelled)"] = [model.fits[int(r["world_size"])].time_ms(r["nbytes"]) for r in fitted]
    per["error_pct"] = 100 * (per["fit_ms (modelled)"] - per["measured_ms"]) / per["measured_ms"]
    print(per.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    prov = {}
    for f in files:
        d = pd.read_csv(REPO / f if not Path(f).is_absolute() else f)
        for k in PROVENANCE:
            if k in d.columns and k not in prov:
                prov[k] = ";".join(sorted({str(v) for v in d[k].dropna()}))
    prov.update(source="measured", data_files=";".join(files))
    try:
        write_comm_model(model, out, prov)
    except ValueError as e:
        return refuse(f"{e}; nothing written")
    except OSError as e:
        return refuse(f"--out {out!r} cannot be written ({e.strerror}); nothing written")
    for n, fit in sorted(model.fits.items()):
        loo = "n/a (< 3 sizes)" if fit.loo_mape_pct is None else f"{fit.loo_mape_pct:.1f} %"
        print(f"tp={n} (fit of measured rows): latency {fit.latency_us:.1f} us, {fit.bw_gbps:.0f} GB/s per "
              f"direction; {fit.n} rank rows, {fit.n_sizes} sizes {fit.min_bytes / 2**20:.0f}-{fit.max_bytes / 2**20:.0f} MiB; MAPE "
              f"{fit.mape_pct:.1f} % in sample, {loo} leave-one-size-out, worst {fit.max_ape_pct:.1f} %")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
