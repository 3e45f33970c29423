"""Fit the per-extra-chunk cost of ``subchunk:<S>:graph2`` to the H200 round-3 rows and write it.

    python -m mla_lab.fits.subgraph [--data data/measured/h200/between_process/subgraph.csv]

``subgraph.csv`` (``mla_lab/measure/experiments/subgraph.py``, 5 fresh processes, interleaved rounds) times, at the
seed shape (16 x 1024 causal prompts, T = 16384) and at full topk (topk 2048 over s_kv 32768), GLM-5 TP8 (H 8 -> 64
padded heads), the PR's private-workspace path eager and graphed (``pr:eager`` / ``pr:graph``) beside the chunk loop
over two S-row workspaces on two streams captured in one CUDA graph (``subchunk:S:2stream_graph``, S 2048 / 4096).

Method (measured-fit): per (shape, S) the median over the 5 processes of the per-process difference of medians
``t(subchunk:S:2stream_graph) - t(pr:graph)`` (both graphed, interleaved in the same rounds: the graph's saving over
eager launches cancels; :func:`mla_lab.measure.spread.process_medians`), against the extra chunk count
``T / S - 1`` (7 or 3); a least-squares line through the origin (:func:`mla_lab.model.calibration.fit_subchunk_overhead`)
-> ``graph_chunk_overhead_us`` and the mean absolute residual over the 4 points ->
``data/calibration/h200_subchunk_graph.csv`` (with the rows' provenance).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from mla_lab.measure.spread import process_medians
from mla_lab.model.calibration import SUBCHUNK_GRAPH_CSV, fit_subchunk_overhead
from mla_lab.paths import REPO_ROOT as REPO
from mla_lab.paths import calibration_dir

PROVENANCE = ("device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit")
DATA = REPO / "data/measured/h200/between_process/subgraph.csv"
T = 16384  # the step's tokens in subgraph.csv (mla_lab.measure.experiments._common.SEED_T)


def graph_chunk_rows(df) -> list[dict]:
    """Per (shape, S): ``extra_chunks = T / S - 1`` and ``extra_ms`` = median over processes of the per-process
    ``median(subchunk:S:2stream_graph) - median(pr:graph)`` (ms)."""
    pm = process_medians(df, ["shape", "variant"])
    rows = []
    for shape in sorted(df["shape"].unique()):
        for v in sorted(df["variant"].unique()):
            if not (v.startswith("subchunk:") and v.endswith(":2stream_graph")):
                continue
            S = int(v.split(":")[1])
            d = pm.loc[(shape, v)] - pm.loc[(shape, "pr:graph")]
            rows.append({"shape": shape, "S": S, "extra_chunks": -(-T // S) - 1, "extra_ms": statistics.median(d),
                         "n_processes": len(d)})
    return rows


def main(argv=None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out-dir", default=str(calibration_dir()))
    args = ap.parse_args(argv)
    df = pd.read_csv(args.data)
    rows = graph_chunk_rows(df)
    us, resid = fit_subchunk_overhead(rows)
    for r in rows:
        print(f"{r['shape']:>4} S={r['S']}: {r['extra_chunks']} extra chunks, {r['extra_ms'] * 1e3:+.1f} us "
              f"(fit {us * r['extra_chunks']:+.1f} us)")
    prov = {k: str(df[k].iloc[0]) for k in PROVENANCE if k in df.columns}
    data_file = Path(args.data).resolve()
    data_file = str(data_file.relative_to(REPO)) if data_file.is_relative_to(REPO) else str(data_file)
    path = Path(args.out_dir) / SUBCHUNK_GRAPH_CSV
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["graph_chunk_overhead_us", "mean_abs_residual_us", "n", "n_processes",
                                          "method", "source", *prov, "data_file"])
        w.writeheader()
        w.writerow({"graph_chunk_overhead_us": round(us, 3), "mean_abs_residual_us": round(resid, 3), "n": len(rows),
                    "n_processes": min(r["n_processes"] for r in rows),
                    "method": "least squares through 0 of median-over-processes (2stream_graph - pr:graph) vs "
                              "extra chunks", "source": "measured-fit", **prov, "data_file": data_file})
    print(f"graph2: {us:.2f} us per extra chunk (mean abs residual {resid:.1f} us over {len(rows)} points) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
