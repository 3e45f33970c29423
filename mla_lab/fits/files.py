"""The fits of the calibration files but the decode one (:mod:`.decode`): each ``measured folder -> {file: rows}``,
registered in :data:`mla_lab.fits.FITS`; methods and sources: the docstrings of the model functions each calls."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from ..arch import get_arch
from ..measure.spread import MIN_PROCESSES, between_process, paired_change, process_medians
from ..model.calibration import CALIBRATION_COLUMNS, fit_subchunk_overhead
from ..model.comm import COMM_CSV, FIT_COLUMNS, fit_comm, measured_allreduce_rows
from ..model.content import (
    CONTENT_CSV,
    STEP_CONTENT_CSV,
    STEP_CONTENT_PER_PROCESS_CSV,
    fit_content_factor,
    fit_step_content,
    load_content_model,
)
from ..model.route_ops import route_calibration_rows
from ..paths import REPO_ROOT
from ..provenance import git_commit

_PROV = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit")
_ROUND2_PROV = ("gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "date_utc")
#: The tokens of one step in ``subgraph.csv`` (the seed's ``max_num_batched_tokens``, :data:`mla_lab.deployment.SEED_ARGS`).
SUBGRAPH_T = 16384
#: FlashMLA's sparse prefill pads h_q to 64 on sm90 (FlashMLA ``csrc/api/sparse_fwd.h``).
PADDED_HEADS = 64


def rel(path: Path) -> str:
    """``path`` relative to the repository when it lies in it."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO_ROOT)) if p.is_relative_to(REPO_ROOT) else str(path)


def provenance(df: pd.DataFrame, cols=_PROV) -> dict:
    """The first row's value of each provenance column ``df`` has (str)."""
    return {k: str(df[k].iloc[0]) for k in cols if k in df.columns}


def _read(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ValueError(f"{path} does not exist; the fit needs it")
    return pd.read_csv(path)


# ---------------------------------------------------------------- all-reduce: latency + bandwidth per world size
def fit_comm_file(measured: Path) -> dict:
    """The all-reduce rows under ``h200x<n>/`` -> one :func:`~mla_lab.model.comm.fit_comm` row per world size."""
    rows, files = measured_allreduce_rows("h200", measured)
    model = fit_comm(rows, name=COMM_CSV)
    if not model.fits:
        raise ValueError(f"no all-reduce rows at a world size >= 2 under {measured}/h200x<n>/")
    prov: dict = {}
    for f in files:
        d = pd.read_csv(REPO_ROOT / f)
        for k in (*_PROV, "timestamp", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"):
            if k in d.columns and k not in prov:
                prov[k] = ";".join(sorted({str(v) for v in d[k].dropna()}))
    prov.update(source="measured", data_files=";".join(files))
    return {COMM_CSV: [{**{c: getattr(f, c) for c in FIT_COLUMNS}, **prov} for _, f in sorted(model.fits.items())]}


# ------------------------------------------------- padded-head content, kernel only (round 2 interleaved rows)
def _round2_provenance(measured: Path) -> dict:
    path = measured / "h200/round2/content.csv"
    prov = provenance(_read(path), _ROUND2_PROV)
    return {**prov, "source": "measured", "device": prov.get("gpu", "?"), "data_file": rel(path)}


def fit_content_file(measured: Path) -> dict:
    """``content.csv`` -> :func:`~mla_lab.model.content.fit_content_factor` on the per (shape, mode) medians of
    ``ms_median`` with zeros and stale padded heads, and ``content_fit.csv`` per shape."""
    df = _read(measured / "h200/round2/content.csv")
    d = df[(df["experiment"] == "content_factor") & (df["status"] == "ok")]
    keys = ["shape_id", "H", "Hp", "T", "pattern", "prompt_len", "mode"]
    g = d.groupby(keys + ["content"])["ms_median"].median().unstack("content").reset_index()
    shapes = [{"shape": f"{r.shape_id}:{r.mode}", "num_heads": int(r.H), "padded_heads": int(r.Hp), "T": int(r.T),
               "pattern": r.pattern, "mode": r.mode, "zeros_ms": float(r.zeros), "stale_ms": float(r.stale)}
              for r in g.itertuples()]
    model, per = fit_content_factor(shapes, name=CONTENT_CSV)
    row = {k: getattr(model, k) for k in ("a", "b", "c_ms", "n", "mape_pct", "loso_mape_pct")}
    return {CONTENT_CSV: [{**row, **_round2_provenance(measured)}], "h200/round2/content_fit.csv": pd.DataFrame(per)}


# ------------------------------------------------------------------------------ sub-chunk cost per extra chunk
def fit_subchunk_file(measured: Path) -> dict:
    """``presets.csv`` (S = 1024 .. 16384) -> :func:`~mla_lab.model.calibration.fit_subchunk_overhead` on the
    per (model, pattern, hand-off) median ms at each chunk count minus the one-chunk median."""
    path = measured / "h200/round2/presets.csv"
    presets = _read(path)
    d = presets[(presets["status"] == "ok") & presets["preset"].isin(["subchunk", "subchunk_views"])]
    g = d.groupby(["model", "pattern", "preset", "n_chunks"])["ms_median"].median().reset_index()
    rows = []
    for _, part in g.groupby(["model", "pattern", "preset"]):
        one = part[part["n_chunks"] == 1]["ms_median"]
        rows += [{"extra_chunks": int(r.n_chunks) - 1, "extra_ms": float(r.ms_median) - float(one.iloc[0])}
                 for r in part[part["n_chunks"] > 1].itertuples() if not one.empty]
    us, resid = fit_subchunk_overhead(rows)
    return {"h200_subchunk.csv": [{"chunk_overhead_us": us, "mean_abs_residual_us": resid, "n": len(rows),
                                   **_round2_provenance(measured), "data_file": rel(path)}]}


def graph_chunk_rows(df: pd.DataFrame) -> list[dict]:
    """Per (shape, S): ``extra_chunks = T / S - 1`` and ``extra_ms`` = median over processes of the per-process
    ``median(subchunk:S:2stream_graph) - median(pr:graph)`` (ms; both graphed, interleaved in the same rounds)."""
    pm = process_medians(df, ["shape", "variant"])
    rows = []
    for shape in sorted(df["shape"].unique()):
        for v in sorted(x for x in df["variant"].unique() if x.startswith("subchunk:") and x.endswith(":2stream_graph")):
            S = int(v.split(":")[1])
            d = pm.loc[(shape, v)] - pm.loc[(shape, "pr:graph")]
            rows.append({"shape": shape, "S": S, "extra_chunks": -(-SUBGRAPH_T // S) - 1,
                         "extra_ms": statistics.median(d), "n_processes": len(d)})
    return rows


def fit_subchunk_graph_file(measured: Path) -> dict:
    """``subgraph.csv`` -> ``subchunk:<S>:graph2``'s cost per extra chunk, least squares through 0 (0.001 us)."""
    path = measured / "h200/between_process/subgraph.csv"
    df = _read(path)
    rows = graph_chunk_rows(df)
    us, resid = fit_subchunk_overhead(rows)
    return {"h200_subchunk_graph.csv": [{
        "graph_chunk_overhead_us": round(us, 3), "mean_abs_residual_us": round(resid, 3), "n": len(rows),
        "n_processes": min(r["n_processes"] for r in rows),
        "method": "least squares through 0 of median-over-processes (2stream_graph - pr:graph) vs extra chunks",
        "source": "measured-fit", **provenance(df), "data_file": rel(path)}]}


# ---------------------------------------------------------- padded-head content over the whole step (issue 21)
#: Issue 21's block experiments: (GEMMs per kernel, block change measured %, kernel-only prediction %); measured by
#: the lab's lead on one H200, rows not committed. The seed kernel's zero-content time there: 2.31 ms.
BLOCKS = ((1, 6.3, 8.0), (6, 1.7, 3.3))
BLOCK_KERNEL_ZEROS_MS = 2.31
STEP_METHOD = ("per process: median over rounds of step_ms and attn_path_ms for zeros and stale (process_medians); "
               "s = attn_zeros/step_zeros, rest change r = (step-attn)_stale/(step-attn)_zeros - 1, attention change "
               "a; u + v = median_p(step change / s), u = median_p(r / s); errors in sample and leaving one process out")


def fit_content_step_file(measured: Path) -> dict:
    """``content_loop.csv`` (>= 5 fresh processes) -> :func:`~mla_lab.model.content.fit_step_content`, the changes
    it is fitted to, the block check and the per-process table."""
    path = measured / "h200/between_process/content_loop.csv"
    df = _read(path)
    if df["num_heads"].nunique() != 1 or df["process"].nunique() < MIN_PROCESSES:
        raise ValueError(f"{path}: needs one num_heads and >= {MIN_PROCESSES} processes")
    H = int(df["num_heads"].iloc[0])
    # per process: medians over rounds of the step and the attention path, zeros and stale (ms)
    step, attn = (process_medians(df, ["content"], c) for c in ("step_ms", "attn_path_ms"))
    rows = [{"process": int(p), "step_zeros_ms": float(step[("zeros", p)]), "step_stale_ms": float(step[("stale", p)]),
             "attn_zeros_ms": float(attn[("zeros", p)]), "attn_stale_ms": float(attn[("stale", p)])}
            for p in sorted(df["process"].unique())]
    model, per = fit_step_content(rows, H, PADDED_HEADS, name=STEP_CONTENT_CSV)
    df = df.assign(rest_ms=df["step_ms"] - df["attn_path_ms"])
    ch = {c: paired_change(df, [], "content", "stale", "zeros", value=c)[()]
          for c in ("step_ms", "attn_path_ms", "rest_ms", "sm_clock_mhz")}
    kernel_model = load_content_model()
    # issue 21's block figures against the step model; the kernel's share s of each block backed out of the
    # kernel-only figure (s = figure / (factor - 1), the factor at the seed kernel's zero-content time)
    k, blocks = kernel_model.factor(8, PADDED_HEADS, BLOCK_KERNEL_ZEROS_MS) - 1.0, {}
    for n, measured_pct, kernel_only_pct in BLOCKS:
        s = kernel_only_pct / 100 / k
        blocks.update({f"block{n}_share": s, f"block{n}_measured_pct": measured_pct,
                       f"block{n}_kernel_only_pct": kernel_only_pct,
                       f"block{n}_step_model_pct": 100 * model.step_change(s, 8, PADDED_HEADS)})
    layers = int(df["layers"].iloc[0])
    # the kernel-only factor on the loop, applied to the whole attention path (an upper bound: the concat is in it)
    kernel_only = sorted(100 * r["attn_zeros_ms"] / r["step_zeros_ms"]
                         * (kernel_model.factor(H, PADDED_HEADS, r["attn_zeros_ms"] / layers) - 1) for r in rows)
    extra = {"num_heads": H, "padded_heads": PADDED_HEADS,
             **{f"measured_{c}_change_{k}": ch[c][q] for k, q in (("pct", "median"), ("lo", "lo"), ("hi", "hi"))
                for c in ch},
             "lopo_max_step_err_pts": max(abs(r["lopo_step_err_pts"]) for r in per),
             "kernel_only_loop_step_pct": kernel_only[len(kernel_only) // 2], **blocks,
             "method": STEP_METHOD, "source": "measured", "data_file": rel(path),
             **provenance(df, (*_PROV, "timestamp"))}
    fitted = {k: getattr(model, k) for k in ("uniform_per_share", "attention_excess", "fit_share", "padded_fraction",
                                             "n_processes", "mape_step_pct", "lopo_mape_step_pct")}
    return {STEP_CONTENT_CSV: [{**fitted, **extra}], STEP_CONTENT_PER_PROCESS_CSV: pd.DataFrame(per)}


# -------------------------------------------------------------------- the fp8 routed experts at decode sizes
_MOE_IMPL = "fp8_scaled_grouped_mm"


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    (a, b), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
    return float(a), float(b)


def fit_moe_decode_file(measured: Path) -> dict:
    """``moe_decode.csv`` (T = 1..256, 5 fresh processes) -> ``ms = a + weight_bytes / BW``, least squares on the
    per-T median over processes; MAPE in sample and leave-one-T-out; one row per parameter."""
    path = measured / "h200/between_process/moe_decode.csv"
    df = _read(path)
    df = df[df["impl"] == _MOE_IMPL]
    Ts = sorted(int(t) for t in df["T"].unique())
    bp = between_process(df, ["T"], "ms")
    x = np.array([float(df.loc[df["T"] == T, "weight_bytes"].median()) for T in Ts])
    y = np.array([float(bp[(T,)]["median"]) for T in Ts])
    a, b = _line(x, y)
    ape_in = np.abs(a + b * x - y) / y * 100
    loo = [_line(np.delete(x, i), np.delete(y, i)) for i in range(len(Ts))]
    ape_out = np.array([abs(ai + bi * x[i] - y[i]) / y[i] * 100 for i, (ai, bi) in enumerate(loo)])
    bw, hbm = 1.0 / b / 1e6, get_arch("h200").hbm_gbps  # bytes per ms -> GB/s
    prov = {k: df[k].iloc[0] for k in (*_PROV, "timing") if k in df}
    prov.update(source="measured-fit", n_processes=int(df["process"].nunique()), data_file=rel(path), impl=_MOE_IMPL,
                method="per T: median over processes of per-process ms (mla_lab.measure.spread.between_process); "
                       "least squares ms = a + weight_bytes / BW on the per-T figures", fit_commit=git_commit())
    rows = [("a_us", a * 1e3, "us", "fixed cost of one MoE block (gate_up + down + activation quantization)"),
            ("bw_gbps", bw, "GB/s", "achieved fp8 weight-read bandwidth"),
            ("eff_bytes", bw / hbm, "fraction", f"bw_gbps / H200 datasheet HBM {hbm:g} GB/s"),
            ("mape_in_pct", float(ape_in.mean()), "%", "in-sample MAPE over T"),
            ("max_ape_in_pct", float(ape_in.max()), "%", "in-sample max APE over T"),
            ("mape_loo_pct", float(ape_out.mean()), "%", "leave-one-T-out MAPE"),
            ("max_ape_loo_pct", float(ape_out.max()), "%", "leave-one-T-out max APE"),
            ("n_T", len(Ts), "count", f"T values {','.join(str(t) for t in Ts)}")]
    return {"h200_moe_decode.csv": [{"key": k, "value": v, "unit": u, "meaning": m, **prov} for k, v, u, m in rows]}


# ------------------------------------------------------- the sparse kernel's roofline, the dense routes' classes
_ROUTE_INPUTS = ("data/measured/h200/{round2/content.csv,layer_ops.csv,attention_path.csv}, "
                 "data/calibration/h200_reference.csv, data/measured/h200/between_process/routes.csv")


def fit_routes_file(measured: Path) -> dict:
    """:func:`mla_lab.model.route_ops.route_calibration_rows` (it reads the files in ``fit_inputs``, not ``measured``)."""
    prov = {"source": "measured", "device": "NVIDIA H200", "fit_inputs": _ROUTE_INPUTS, "fit_commit": git_commit()}
    return {"h200_routes.csv": [{**{c: r.get(c, "") for c in CALIBRATION_COLUMNS}, **prov}
                                for r in route_calibration_rows()]}
