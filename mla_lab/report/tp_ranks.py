"""Real TP ranks against the lab's one-GPU simulation, and the all-reduce term, at TP 2, 4 and 8: what was measured
(:func:`tp_status_table`), every rank beside the simulation (:func:`tp_rank_table`), the all-reduce fit
(:func:`comm_fit_table`). Data: ``data/measured/<gpu>x<n>/tp_block.csv`` (``mla_lab/measure/experiments/tp_block.py``),
the older ``h200x2/tp2_attention.csv`` (attention only), the simulation alone ``<gpu>/tp<N>_sim_block.csv``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .._validate import read_csv_checked
from ..arch import get_arch
from ..model.calibration import resolve_calibration
from ..model.comm import measured_allreduce_rows
from ..model.timing import comm_time_ms
from ..paths import measured_dir

__all__ = ["WORLD_SIZES", "load_tp_runs", "tp_status_table", "tp_rank_table", "comm_fit_table"]

#: The world sizes the report asks for (the PR's TP=8, and the steps to it).
WORLD_SIZES = (2, 4, 8)
FILES = ("tp_block.csv", "tp2_attention.csv")
MIB = 2**20
REQUIRED = ("run", "world_size", "rank", "model", "T", "strategy")


def _checked(world_sizes, gpu) -> tuple[list[int], str]:
    """``world_sizes`` as a list of ints >= 2 (``"8"`` or ``2.5`` would match no measured run and read as "not
    measured") and the folder prefix of ``gpu`` (a lab arch name, :func:`mla_lab.arch.get_arch`); else ValueError
    naming the argument, the value and what is allowed."""
    try:
        vals = list([world_sizes] if isinstance(world_sizes, (int, float, str)) else world_sizes)
    except TypeError:
        vals = [None]
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and float(n).is_integer() and n >= 2
               for n in vals):
        raise ValueError(f"world_sizes={world_sizes!r} is not valid; allowed: a list of integer world sizes >= 2, "
                         f"e.g. {list(WORLD_SIZES)}")
    name = get_arch(gpu).name.lower()
    if str(gpu).strip().lower() != name:
        raise ValueError(f"gpu={gpu!r} is not valid; allowed: a GPU name as the measured folders spell it, e.g. "
                         f"{name!r}")
    return [int(n) for n in vals], name


def load_tp_runs(world_sizes=WORLD_SIZES, gpu: str = "h200", root: str | Path | None = None):
    """Every row (``run`` ``tp`` and ``sim``) of the committed TP runs, with ``file`` and ``block`` (default
    ``attention``); empty when nothing was measured. Raises ValueError: ``world_sizes`` not integers >= 2, ``gpu``
    not a lab GPU, a run file unreadable or lacking a column of :data:`REQUIRED` (names the file)."""
    world_sizes, gpu = _checked(world_sizes, gpu)
    parts = []
    for n in world_sizes:
        folder = (Path(root) if root else measured_dir()) / f"{gpu}x{n}"
        for f in (folder / name for name in FILES if (folder / name).is_file()):
            d = read_csv_checked(f, REQUIRED, "mla_lab/measure/experiments/tp_block.py")
            parts.append(d.assign(**({} if "block" in d.columns else {"block": "attention"}),
                                  file=f"{f.parent.name}/{f.name}"))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def tp_status_table(world_sizes=WORLD_SIZES, gpu: str = "h200", root: str | Path | None = None):
    """One row per world size: ``measured`` (yes/no), ``files``, ``ranks``, ``configurations``, ``blocks``,
    ``device``, ``git_commit``, or the reason nothing is there. Raises ValueError: as :func:`load_tp_runs`."""
    world_sizes, gpu = _checked(world_sizes, gpu)
    runs = load_tp_runs(world_sizes, gpu, root)
    out = []
    for n in world_sizes:
        d = runs[(runs["run"] == "tp") & (runs["world_size"] == n)] if len(runs) else runs
        sim_only = (Path(root) if root else measured_dir()) / gpu / f"tp{n}_sim_block.csv"
        if not len(d):
            note = f"not measured: needs {n} GPUs of one host (python -m mla_lab.measure.experiments tp_block --tp {n})"
            if sim_only.is_file():
                note += f"; the one-GPU simulation of its share is measured ({gpu}/{sim_only.name})"
            out.append({"TP": n, "measured": "no", "files": "-", "ranks": 0, "configurations": 0, "blocks": "-",
                        "device": "-", "git_commit": "-", "note": note})
            continue
        out.append({"TP": n, "measured": "yes", "files": ", ".join(sorted(d["file"].unique())),
                    "ranks": int(d["rank"].nunique()),
                    "configurations": int(d.groupby(["model", "T", "block", "strategy"]).ngroups),
                    "blocks": ", ".join(sorted(d["block"].unique())), "device": ", ".join(sorted(d["device"].unique())),
                    "git_commit": ", ".join(sorted(d["git_commit"].astype(str).unique())), "note": ""})
    return pd.DataFrame(out)


def tp_rank_table(world_sizes=WORLD_SIZES, gpu: str = "h200", root: str | Path | None = None, calibration=None):
    """One row per real rank: measured ``block_ms``, ``compute_ms``, ``allreduce_ms``, ``sim_compute_ms`` (the
    one-GPU simulation), ``peak_MiB`` / ``sim_peak_MiB``, ``nccl_MiB``; modelled ``model_allreduce_ms``
    (``comm_source``); the errors ``compute_err_%``, ``block_err_%`` (sim compute + modelled all-reduce vs the block),
    ``allreduce_err_%``. Raises ValueError: as :func:`load_tp_runs`."""
    runs = load_tp_runs(world_sizes, gpu, root)
    if not len(runs):
        return pd.DataFrame()
    cal = resolve_calibration(calibration)
    arch = get_arch(gpu)
    keys = ["tp", "model", "T", "block", "strategy"]  # a sim row has world_size 1 and the tp it simulates
    runs = runs.drop(columns=[c for c in runs.columns if c.startswith("sim_")])
    sim = runs[runs["run"] == "sim"]
    sim = sim.groupby(keys, as_index=False).agg(sim_compute_ms=("compute_ms", "median"),
                                                sim_peak=("peak_extra_bytes", "max"),
                                                sim_used=("device_used_bytes", "max"))
    tp = runs[runs["run"] == "tp"].merge(sim, on=keys, how="left")
    tp["model_allreduce_ms"] = [comm_time_ms("allreduce", b, int(n), arch, cal)
                                for b, n in zip(tp["allreduce_bytes"], tp["world_size"])]
    tp["comm_source"] = [cal.comm_source(int(n), arch=arch) for n in tp["world_size"]]
    nccl = (pd.to_numeric(tp["nccl_bytes"], errors="coerce") if "nccl_bytes" in tp
            else pd.to_numeric(tp["device_used_bytes"], errors="coerce") - pd.to_numeric(tp["sim_used"],
                                                                                         errors="coerce"))
    out = pd.DataFrame({
        "TP": tp["world_size"], "model": tp["model"], "T": tp["T"], "block": tp["block"], "strategy": tp["strategy"],
        "rank": tp["rank"], "heads/rank": tp["num_heads"], "block_ms": tp["block_ms"], "compute_ms": tp["compute_ms"],
        "allreduce_ms": tp["allreduce_ms"], "sim_compute_ms": tp["sim_compute_ms"],
        "model_allreduce_ms": tp["model_allreduce_ms"], "comm_source": tp["comm_source"],
        "compute_err_%": 100 * (tp["sim_compute_ms"] - tp["compute_ms"]) / tp["compute_ms"],
        "block_err_%": 100 * (tp["sim_compute_ms"] + tp["model_allreduce_ms"] - tp["block_ms"]) / tp["block_ms"],
        "allreduce_err_%": 100 * (tp["model_allreduce_ms"] - tp["allreduce_ms"]) / tp["allreduce_ms"],
        "peak_MiB": pd.to_numeric(tp["peak_extra_bytes"], errors="coerce") / MIB,
        "sim_peak_MiB": pd.to_numeric(tp["sim_peak"], errors="coerce") / MIB,
        "nccl_MiB": nccl / MIB, "file": tp["file"],
    })
    return out.sort_values(["TP", "model", "T", "block", "strategy", "rank"]).reset_index(drop=True)


def comm_fit_table(world_sizes=WORLD_SIZES, calibration=None, gpu: str = "h200", root: str | Path | None = None):
    """Per world size: what prices its all-reduce (``priced by``), the fit's ``latency_us`` / ``bw_gbps`` / ``sizes``
    / MAPEs where measured, and the assumption's mean error against the measured rows (``assumption error %``).
    Raises ValueError: as :func:`load_tp_runs`; a malformed measured all-reduce file."""
    world_sizes, gpu = _checked(world_sizes, gpu)
    cal = resolve_calibration(calibration)
    arch = get_arch(gpu)
    assumed = cal.with_comm(cal.comm_efficiency, cal.comm_latency_us)
    rows, _ = measured_allreduce_rows(gpu, root)
    out = []
    for n in world_sizes:
        fit = cal.comm_fit_for(n, arch=arch)
        mine = [r for r in rows if int(r["world_size"]) == n]
        err = (sum(abs(comm_time_ms("allreduce", r["nbytes"], n, arch, assumed) - r["ms"]) / r["ms"] for r in mine)
               / len(mine) * 100) if mine else None
        out.append({"TP": n, "priced by": cal.comm_source(n, arch=arch),
                    "latency_us": fit.latency_us if fit else cal.comm_latency_us,
                    "bw_gbps": fit.bw_gbps if fit else arch.nvlink_gbps / 2 * cal.comm_efficiency,
                    "sizes": f"{fit.n_sizes} ({fit.min_bytes / MIB:.0f}-{fit.max_bytes / MIB:.0f} MiB)" if fit else "-",
                    "rank rows": len(mine), "MAPE %": fit.mape_pct if fit else None,
                    "leave-one-size-out MAPE %": fit.loo_mape_pct if fit else None, "assumption error %": err})
    return pd.DataFrame(out)
