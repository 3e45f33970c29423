"""The sparse-MLA attention block and the MoE block (EP = TP) sharded over ``--tp`` GPUs (NCCL, rank r on GPU r)
against the one-GPU simulation of one rank's share and the all-reduce model term, plus the all-reduce alone (for the
comm fit). Logic, shapes, columns: :mod:`mla_lab.measure.tp`; NVLink multicast off
(:data:`~mla_lab.measure.tp.SAFE_ENV`).

Two doors: ``run`` (the registry's; parameter ``runs``: ``sim`` on one GPU, ``tp,sim`` on the rank's TP GPUs) and
:func:`main`, writing ``data/measured/<arch>x<tp>/tp_block.csv`` + ``allreduce.csv`` or, ``--runs sim``,
``data/measured/<arch>/tp<N>_sim_block.csv`` (``--out DIR``: the same names there), per model into ``<file>.partial``,
replaced when every model is done. A file without this experiment's header is never replaced; ``--cpu-dry-run``
(gloo, tiny shapes) never writes under ``data/measured``. Refusals: one line on stderr, exit 2. Usage::

    python -m mla_lab.measure.experiments.tp_block --tp 8                      # 8 GPUs, flash_mla installed
    python -m mla_lab.measure.experiments.tp_block --tp 8 --runs sim           # the TP-8 share on one GPU
    python -m mla_lab.measure.experiments.tp_block --cpu-dry-run --tp 4 --out /tmp/x   # the logic on CPU
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
from pathlib import Path

from mla_lab.arch import detect_arch
from mla_lab.kernels import flash_mla_info
from mla_lab.measure import tp as _tp
from mla_lab.measure.sink import Sink, log
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

#: The engine presets' members that run on tensors (pre-#53878 zero / stale pads, #53878, #56902 without / with
#: per-call zeroing, SGLang); ``unfused`` / ``fused`` by their alias names as in the TP=2 file.
DEFAULT_STRATEGIES = ["unfused", "per_call_empty:stale", "fused", "shared_workspace:none",
                      "shared_workspace:zero_per_call", "per_call_zeros"]


def _header(path: Path):
    with open(path, newline="") as f:
        return next(csv.reader(f), None)


def _files(runs, tp: int) -> dict:
    """``{file: columns}`` a run writes: ``tp<N>_sim_block.csv`` (sim alone) or ``tp_block.csv`` + allreduce."""
    sim_only = list(runs) == ["sim"]
    return ({f"tp{tp}_sim_block.csv": _BLOCK} if sim_only
            else {"tp_block.csv": _BLOCK, "allreduce.csv": ALLREDUCE_COLUMNS})


def _blank(v):
    """None for a missing value (None, pandas NA, NaN): an empty CSV field."""
    return None if v is None or type(v).__name__ == "NAType" or (isinstance(v, float) and v != v) else v


_BLOCK = BLOCK_COLUMNS + COMPARE_COLUMNS
OUTPUTS = {"tp_block.csv": _BLOCK, "allreduce.csv": ALLREDUCE_COLUMNS,
           **{f"tp{n}_sim_block.csv": _BLOCK for n in (2, 4, 8)}}
#: (model, block) per TP size
SHAPES = [(m, b) for m in ("glm-5", "deepseek-v3.2") for b in ("attention", "moe")]


class _Refused(ValueError):
    """A bad argument: one line on stderr, exit 2."""


def _parser() -> argparse.ArgumentParser:
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
    return ap


def _dry_config(a, common: dict) -> TPBenchmarkConfig:
    """The CPU dry run's tiny config; the sizes asked for still checked."""
    asked = TPBenchmarkConfig(models=a.models, tokens=a.tokens, device="cpu", warmup=a.warmup, iters=a.iters,
                              allreduce_tokens=a.allreduce_tokens, allreduce_mib=a.allreduce_mib,
                              model_overrides=tiny_overrides(), **common)
    try:
        check_config(asked)
    except (ValueError, RuntimeError) as e:
        raise _Refused(f"{e} (--cpu-dry-run: the tiny models, 8 heads and 8 experts each)") from None
    return TPBenchmarkConfig(models=a.models, tokens=[16], device="cpu", warmup=1, iters=3, kernel_backend="reference",
                             concat_backend="torch", model_overrides=tiny_overrides(), allreduce_tokens=[16, 64],
                             allreduce_mib=[0.25, 1], **common)


def _gpu_config(a, common: dict) -> tuple[TPBenchmarkConfig, str]:
    """The GPU run's config and arch (refused: too few GPUs, no flash_mla for the attention block)."""
    import torch

    n, need = torch.cuda.device_count(), a.tp if "tp" in a.runs else 1
    if n < need:
        raise _Refused(f"--runs {' '.join(a.runs)} --tp {a.tp} needs {need} CUDA GPUs; torch sees {n} (--runs sim "
                       "needs one; --cpu-dry-run checks the logic on CPU)")
    info = flash_mla_info()
    if "attention" in a.blocks and a.kernel_backend != "reference" and not info["available"]:
        raise _Refused(f"flash_mla is not available ({info}); install the gpu extra, or pass --kernel-backend "
                       "reference with small --tokens")
    gpu = detect_arch()
    arch = gpu["arch"] or ("b200" if gpu["prefill_padding"] == 128 else "h200")
    log(f"{n} x {gpu['device']} ({arch}); flash_mla {info.get('provider')} {info.get('version')}; env {SAFE_ENV}")
    return TPBenchmarkConfig(models=a.models, tokens=a.tokens, arch=arch, device="cuda", warmup=a.warmup,
                             iters=a.iters, kernel_backend=a.kernel_backend, concat_backend=a.concat_backend,
                             allreduce_tokens=a.allreduce_tokens, allreduce_mib=a.allreduce_mib,
                             moe_impl=a.moe_impl, **common), arch


def _outputs(a, arch: str) -> tuple[Path, dict]:
    """The output folder and ``{file: columns}``, checked (a folder, not data/measured for a dry run, no foreign
    file, creatable)."""
    sim_only = a.runs == ["sim"]
    measured_root = measured_dir().resolve()
    if a.out:
        out = Path(a.out)
        if out.exists() and not out.is_dir():
            raise _Refused(f"--out {a.out!r} is an existing file; allowed: a folder (new or holding this script's "
                           "CSVs)")
        if a.cpu_dry_run and (out.resolve() == measured_root or measured_root in out.resolve().parents):
            raise _Refused(f"--out {a.out!r} is under {measured_root}: a --cpu-dry-run (gloo, tiny shapes) never "
                           "writes there; allowed: a folder outside it, e.g. /tmp/x")
    else:
        out = Path("/tmp/tp_block_cpu_dry_run") if a.cpu_dry_run else measured_dir(arch if sim_only
                                                                                   else f"{arch}x{a.tp}")
    files = _files(a.runs, a.tp)
    for name, cols in files.items():
        header = cols + list(PROVENANCE_COLUMNS)
        if (out / name).is_dir():
            raise _Refused(f"{out / name} is a folder, not a file")
        if (out / name).exists() and _header(out / name) not in (header, [c for c in header if c != "content"]):
            raise _Refused(f"{out / name} exists and was not written by tp_block.py (its header differs); refusing "
                           "to overwrite it: pass another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _Refused(f"--out {str(out)!r} cannot be created ({e.strerror}); allowed: a writable folder") from None
    return out, files


def _measure(cfg: TPBenchmarkConfig, files: dict[str, list], make_sink, suffix: str = "") -> tuple[list, list]:
    """One spawn per model (rows on disk before the next; the bytes sweep once): block rows to the first of
    ``files``, all-reduce rows to the second, each + ``suffix``, via ``make_sink(provenance)``. Returns the frames."""
    names = list(files)
    sink, blocks, ars = None, [], []
    for i, name in enumerate(cfg.models):
        sub = dataclasses.replace(cfg, models=[name], allreduce_mib=cfg.allreduce_mib if i == 0 else [])
        res = _tp.run_tp_benchmark(sub)  # looked up on the module: the seam the tests patch
        if sink is None:  # the provenance of the rows (a dry run says it ran on the CPU)
            prov = {k: res.blocks[k].iloc[0] for k in PROVENANCE_COLUMNS} if len(res.blocks) else None
            sink = make_sink(prov)
        for file, df in zip(names, (res.blocks, res.allreduce)):
            for rec in df[files[file]].to_dict("records"):
                sink.write(file + suffix, {k: _blank(v) for k, v in rec.items()})
        blocks.append(res.blocks)
        ars.append(res.allreduce)
        log(f"{name}: {len(res.blocks)} block rows, {len(res.allreduce)} all-reduce rows")
    return blocks, ars


def _print_summary(blocks: list, ars: list, tp: int) -> None:
    import pandas as pd

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
        print(f"\nTP={tp} (min/median/max over ranks, slowest rank) vs one-GPU simulation + modelled all-reduce:")
        print(s.round(3).to_string(index=False))


def main(argv=None) -> int:
    """The multi-GPU command line (module docstring)."""
    a = _parser().parse_args(argv)
    common = dict(tp=a.tp, blocks=a.blocks, strategies=a.strategies, runs=a.runs)
    try:
        cfg, arch = (_dry_config(a, common), "cpu") if a.cpu_dry_run else _gpu_config(a, common)
        check_config(cfg)
        out, files = _outputs(a, arch)
    except (_Refused, ValueError, RuntimeError) as e:
        print(f"tp_block: {e}", file=sys.stderr)
        return 2
    try:
        blocks, ars = _measure(cfg, files, lambda prov: Sink(out, {f + ".partial": c for f, c in files.items()},
                                                             prov=prov), ".partial")
    except BaseException as e:
        kept = [str(out / (f + ".partial")) for f in files if (out / (f + ".partial")).exists()]
        print(f"tp_block: stopped at {type(e).__name__}: {e}; rows so far kept in {kept or 'nothing'}; "
              f"{', '.join(str(out / f) for f in files)} left as they were", file=sys.stderr)
        raise
    for f in files:
        if (out / (f + ".partial")).exists():
            os.replace(out / (f + ".partial"), out / f)
    _print_summary(blocks, ars, a.tp)
    log(f"wrote {', '.join(str(out / f) for f in files)}")
    return 0


def run(rank, sink, options) -> None:
    """The registry's door: both blocks, :data:`DEFAULT_STRATEGIES`; smoke: T 1024, 3 iterations, the rank's model."""
    runs = list(options.param("runs", ("sim",)))
    smoke = options.smoke
    cfg = TPBenchmarkConfig(models=[rank.model.name] if smoke else ["glm-5", "deepseek-v3.2"],
                            tokens=[1024] if smoke else [4096, 16384], tp=rank.tp, blocks=["attention", "moe"],
                            strategies=DEFAULT_STRATEGIES, arch=rank.arch.name, iters=3 if smoke else 20,
                            runs=runs, allreduce_mib=[1] if smoke else [1, 4, 16, 64, 256])
    check_config(cfg)
    _measure(cfg, _files(runs, rank.tp), lambda prov: sink)


if __name__ == "__main__":
    sys.exit(main())
