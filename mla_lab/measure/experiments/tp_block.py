"""Benchmark: the sparse-MLA attention block and the MoE block (EP = TP) really sharded over ``--tp`` GPUs (NCCL, one
process per GPU, rank r on GPU r) against the lab's one-GPU simulation of one rank's share and the all-reduce model
term, plus the all-reduce alone per rank (at [T, hidden] and over a bytes sweep, for the comm-model fit).

Logic, shapes and columns: :mod:`mla_lab.measure.tp` (its module docstring is the contract). Per rank and (model,
T, block, strategy): medians of ``--iters`` barrier-started calls after ``--warmup`` (CUDA events), peak memory per
call, device used / torch reserved bytes and NCCL's own bytes. NVLink multicast stays off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).

Writes, with ``--runs tp`` (and ``sim``): ``data/measured/<arch>x<tp>/tp_block.csv`` (block rows, every rank and the
sim) and ``.../allreduce.csv`` (all-reduce rows); with ``--runs sim`` alone (a one-GPU machine):
``data/measured/<arch>/tp<N>_sim_block.csv``. ``--out DIR`` puts the same file names in DIR. Rows are written per
model as each model's run completes, to ``<file>.partial``; the files are replaced when every model is done, so a
failure later keeps both the earlier file and this run's rows so far. A file that exists and does not carry this
script's header (columns :data:`mla_lab.measure.tp.BLOCK_COLUMNS` / ``ALLREDUCE_COLUMNS`` + provenance) was not
written by it: the script refuses to overwrite it and exits 2 before running anything (the TP=2 evidence
``data/measured/h200x2/tp2_attention.csv`` has another name and is never touched). ``--out`` that is an existing
file, or a folder that cannot be created, is refused likewise. A ``--cpu-dry-run`` never writes under
``data/measured`` (its gloo rows would replace GPU evidence under the same header; default ``/tmp/tp_block_cpu_dry_run``)
and uses its own tiny sizes, but ``--tokens``, ``--iters``, ``--warmup`` and the all-reduce sizes are still checked.
Every refusal is one line on stderr, exit status 2. Usage::

    python -m mla_lab.measure.experiments.tp_block --tp 8                      # 8 GPUs, flash_mla installed
    python -m mla_lab.measure.experiments.tp_block --tp 8 --runs sim           # the TP-8 share on one GPU
    python -m mla_lab.measure.experiments.tp_block --cpu-dry-run --tp 4 --out /tmp/x   # the logic on CPU (gloo, tiny shapes)

Expected run time on 8 H200s (both models, both blocks, default strategies and sizes): a few minutes (process
start, NCCL init, Triton JIT, random expert weights; the timed calls take seconds).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

from mla_lab.arch import detect_arch
from mla_lab.kernels import flash_mla_info
from mla_lab.measure import tp as _tp
from mla_lab.measure.record import CsvSink
from mla_lab.measure.tp import (
    ALLREDUCE_COLUMNS,
    BLOCK_COLUMNS,
    COMPARE_COLUMNS,
    SAFE_ENV,
    TPBenchmarkConfig,
    check_config,
    summary_table,
    tiny_overrides,
)
from mla_lab.paths import measured_dir
from mla_lab.provenance import PROVENANCE_COLUMNS

#: The default attention strategies: the members of the engine presets that run on tensors (vLLM before PR
#: #53878 with zero and stale pads, #53878, #56902 without and with its per-call zeroing, SGLang), ``unfused`` and
#: ``fused`` by their alias names as in the TP=2 file (they are per_call_empty:zeros and private_workspace).
DEFAULT_STRATEGIES = ["unfused", "per_call_empty:stale", "fused", "shared_workspace:none",
                      "shared_workspace:zero_per_call", "per_call_zeros"]


def _header(path: Path):
    with open(path, newline="") as f:
        return next(csv.reader(f), None)


def _blank(v):
    """None for a missing value (None, pandas NA, NaN): an empty CSV field."""
    if v is None or type(v).__name__ == "NAType":
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


OUTPUTS = {"tp_block.csv": BLOCK_COLUMNS + COMPARE_COLUMNS, "allreduce.csv": ALLREDUCE_COLUMNS}
PROVENANCE = tuple(PROVENANCE_COLUMNS)
#: (model, block) per TP size given by --tp
SHAPES = [(m, b) for m in ("glm-5", "deepseek-v3.2") for b in ("attention", "moe")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["glm-5", "deepseek-v3.2"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[4096, 16384])
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--blocks", nargs="+", default=["attention", "moe"], choices=["attention", "moe"])
    ap.add_argument("--strategies", nargs="+", default=DEFAULT_STRATEGIES)
    ap.add_argument("--runs", nargs="+", default=["tp", "sim"], choices=["tp", "sim"])
    ap.add_argument("--allreduce-tokens", nargs="+", type=int, default=[1024, 4096, 16384])
    ap.add_argument("--allreduce-mib", nargs="+", type=float, default=[1, 4, 16, 64, 256])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--kernel-backend", default="auto", choices=["auto", "flash_mla", "reference"],
                    help="reference on a GPU gathers [T, topk, 576] per call: only for small --tokens")
    ap.add_argument("--concat-backend", default="auto", choices=["auto", "triton", "torch"])
    ap.add_argument("--moe-impl", default="auto", choices=["auto", "grouped_mm", "loop"],
                    help="routed experts: two torch._grouped_mm calls (auto on sm90+) or a GEMM pair per expert")
    ap.add_argument("--out", default=None, help="output folder (default data/measured/<arch>x<tp> or <arch>)")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="gloo on CPU, tiny shapes (8 heads, hidden 64, 8 experts), reference kernel: the logic only")
    args = ap.parse_args(argv)

    import torch


    def refuse(msg: str) -> int:
        print(f"tp_block: {msg}", file=sys.stderr)
        return 2

    t0 = time.time()
    common = dict(tp=args.tp, blocks=args.blocks, strategies=args.strategies, runs=args.runs)
    if args.cpu_dry_run:
        # the dry run replaces these by tiny sizes; a bad value is still refused rather than silently ignored
        asked = TPBenchmarkConfig(models=args.models, tokens=args.tokens, device="cpu", warmup=args.warmup,
                                  iters=args.iters, allreduce_tokens=args.allreduce_tokens,
                                  allreduce_mib=args.allreduce_mib, model_overrides=tiny_overrides(), **common)
        try:
            check_config(asked)
        except (ValueError, RuntimeError) as e:
            return refuse(f"{e} (--cpu-dry-run: the tiny models, 8 heads and 8 experts each)")
        cfg = TPBenchmarkConfig(models=args.models, tokens=[16], device="cpu", warmup=1, iters=3,
                                kernel_backend="reference", concat_backend="torch", model_overrides=tiny_overrides(),
                                allreduce_tokens=[16, 64], allreduce_mib=[0.25, 1], **common)
        arch = "cpu"
    else:
        n = torch.cuda.device_count()
        need = args.tp if "tp" in args.runs else 1
        if n < need:
            print(f"tp_block: --runs {' '.join(args.runs)} --tp {args.tp} needs {need} CUDA GPUs; torch sees {n} "
                  "(--runs sim needs one; --cpu-dry-run checks the logic on CPU)", file=sys.stderr)
            return 2
        info = flash_mla_info()
        if "attention" in args.blocks and args.kernel_backend != "reference" and not info["available"]:
            print(f"tp_block: flash_mla is not available ({info}); install the gpu extra, or pass "
                  "--kernel-backend reference with small --tokens", file=sys.stderr)
            return 2
        gpu = detect_arch()
        arch = gpu["arch"] or ("b200" if gpu["prefill_padding"] == 128 else "h200")
        cfg = TPBenchmarkConfig(models=args.models, tokens=args.tokens, arch=arch, device="cuda",
                                warmup=args.warmup, iters=args.iters, kernel_backend=args.kernel_backend,
                                concat_backend=args.concat_backend, allreduce_tokens=args.allreduce_tokens,
                                allreduce_mib=args.allreduce_mib, moe_impl=args.moe_impl, **common)
        print(f"{n} x {gpu['device']} ({arch}); flash_mla {info.get('provider')} {info.get('version')}; "
              f"env {SAFE_ENV}", flush=True)
    try:
        check_config(cfg)
    except (ValueError, RuntimeError) as e:
        print(f"tp_block: {e}", file=sys.stderr)
        return 2

    sim_only = args.runs == ["sim"]
    if args.out:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            return refuse(f"--out {args.out!r} is an existing file; allowed: a folder (new or holding this script's "
                          "CSVs)")
        measured_root = measured_dir().resolve()
        if args.cpu_dry_run and (out.resolve() == measured_root or measured_root in out.resolve().parents):
            return refuse(f"--out {args.out!r} is under {measured_root}: a --cpu-dry-run (gloo, tiny shapes) never "
                          "writes there; allowed: a folder outside it, e.g. /tmp/x")
    elif args.cpu_dry_run:
        out = Path("/tmp") / "tp_block_cpu_dry_run"  # never mix a dry run into data/measured
    else:
        out = measured_dir(arch if sim_only else f"{arch}x{args.tp}")
    block_path = out / (f"tp{args.tp}_sim_block.csv" if sim_only else "tp_block.csv")
    ar_path = None if sim_only else out / "allreduce.csv"
    block_cols = BLOCK_COLUMNS + COMPARE_COLUMNS
    headers = {block_path: block_cols + list(PROVENANCE_COLUMNS)}
    if ar_path is not None:
        headers[ar_path] = ALLREDUCE_COLUMNS + list(PROVENANCE_COLUMNS)
    for path, header in headers.items():
        if path.is_dir():
            print(f"tp_block: {path} is a folder, not a file", file=sys.stderr)
            return 2
        # this script's header, or the one it wrote before block rows had a content column
        if path.exists() and _header(path) not in (header, [c for c in header if c != "content"]):
            print(f"tp_block: {path} exists and was not written by tp_block.py (its header differs); refusing to "
                  "overwrite it: pass another --out", file=sys.stderr)
            return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return refuse(f"--out {str(out)!r} cannot be created ({e.strerror}); allowed: a writable folder")

    import dataclasses

    import pandas as pd

    # rows go to <file>.partial as each model completes; the files are replaced only when every model is done, so a
    # failure keeps both the earlier file (untouched) and this run's rows so far (the .partial)
    partial = {path: path.with_name(path.name + ".partial") for path in headers}
    sinks, blocks, ars = {}, [], []
    try:
        for i, name in enumerate(cfg.models):
            # one model per spawn: its rows are on disk before the next model runs; the bytes sweep once
            sub = dataclasses.replace(cfg, models=[name], allreduce_mib=cfg.allreduce_mib if i == 0 else [])
            res = _tp.run_tp_benchmark(sub)  # looked up on the module: the seam the tests patch
            prov = {k: res.blocks[k].iloc[0] for k in PROVENANCE_COLUMNS} if len(res.blocks) else {}
            if not sinks:
                sinks["blocks"] = CsvSink(partial[block_path], block_cols, prov)
                if ar_path is not None:
                    sinks["allreduce"] = CsvSink(partial[ar_path], ALLREDUCE_COLUMNS, prov)
            for key, df, cols in (("blocks", res.blocks, block_cols), ("allreduce", res.allreduce, ALLREDUCE_COLUMNS)):
                if key in sinks:
                    for rec in df[cols].to_dict("records"):
                        sinks[key].write({k: _blank(v) for k, v in rec.items()})
            blocks.append(res.blocks)
            ars.append(res.allreduce)
            print(f"[{time.time() - t0:6.0f}s] {name}: {len(res.blocks)} block rows, {len(res.allreduce)} all-reduce "
                  "rows", flush=True)
    except BaseException as e:
        kept = [str(p) for p in partial.values() if p.exists()]
        print(f"tp_block: stopped at {type(e).__name__}: {e}; rows so far kept in {kept or 'nothing'}; "
              f"{', '.join(str(p) for p in headers)} left as they were", file=sys.stderr)
        raise
    for path, tmp in partial.items():
        if tmp.exists():
            os.replace(tmp, path)
    df, ar = pd.concat(blocks, ignore_index=True), pd.concat(ars, ignore_index=True)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    cols = ["run", "rank", "model", "T", "block", "strategy", "num_heads", "experts_per_rank", "routed_pairs",
            "attn_ms", "compute_ms", "block_ms", "allreduce_ms", "allreduce_model_ms", "peak_extra_bytes",
            "nccl_bytes", "kernel_backend"]
    print(df[cols].round(3).to_string(index=False))
    if len(ar):
        print("\nall-reduce alone (median over ranks of each rank's median):")
        print(ar.groupby(["nbytes", "T", "hidden_size"], dropna=False)["ms"].median().round(4).to_string())
    s = summary_table(df)
    if len(s):
        print(f"\nTP={args.tp} (min/median/max over ranks, slowest rank) vs one-GPU simulation + modelled all-reduce:")
        print(s.round(3).to_string(index=False))
    written = [str(block_path)] + ([str(ar_path)] if ar_path is not None else [])
    print(f"\nwrote {', '.join(written)} ({len(df)} block rows, {len(ar)} all-reduce rows) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
