"""The sparse-MLA attention block and the MoE block (EP = TP) sharded over the rank's TP GPUs (NCCL, rank r on GPU
r) against the one-GPU simulation of one rank's share and the all-reduce model term, plus the all-reduce alone (for
the comm fit). Logic, shapes, columns: :mod:`mla_lab.measure.tp`; NVLink multicast off
(:data:`~mla_lab.measure.tp.SAFE_ENV`).

Options (``--param key=value``, :data:`PARAMS`; ``runs``: the registry's ``sim``, the one-GPU share alone, or
``tp,sim`` on ``--tp`` GPUs). Writes ``tp_block.csv`` + ``allreduce.csv`` or, ``runs=sim``, ``tp<N>_sim_block.csv``
into ``--out``, per model into ``<file>.partial``, replaced when every model is done. Refused before anything runs
(:func:`check`: one line, exit 2): a bad option, too few GPUs, no flash_mla for the attention block, a file there
without this experiment's header; ``cpu_dry_run=1`` (gloo, tiny shapes) never writes under ``data/measured``. Usage::

    python -m mla_lab.measure.experiments tp_block --tp 8 --param runs=tp,sim --out data/measured/h200x8
    python -m mla_lab.measure.experiments tp_block --tp 8 --out data/measured/h200    # the TP-8 share on one GPU
    python -m mla_lab.measure.experiments tp_block --tp 4 --param cpu_dry_run=1 --out /tmp/x   # the logic on CPU
"""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
from pathlib import Path

import torch

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
)
from mla_lab.measure.tp_blocks import tiny_overrides
from mla_lab.paths import measured_dir
from mla_lab.provenance import PROVENANCE_COLUMNS

#: The engine presets' members that run on tensors (pre-#53878 zero / stale pads, #53878, #56902 without / with
#: per-call zeroing, SGLang); ``unfused`` / ``fused`` by their alias names as in the TP=2 file.
DEFAULT_STRATEGIES = ["unfused", "per_call_empty:stale", "fused", "shared_workspace:none",
                      "shared_workspace:zero_per_call", "per_call_zeros"]
#: The options and their defaults (:class:`~mla_lab.measure.tp.TPBenchmarkConfig`'s fields; ``kernel_backend``
#: ``reference`` on a GPU gathers [T, topk, 576] per call: small ``tokens`` only; ``moe_impl`` ``grouped_mm``: two
#: ``torch._grouped_mm`` calls, ``loop``: a GEMM pair per expert); ``cpu_dry_run``: gloo on CPU, tiny shapes (8 heads,
#: hidden 64, 8 experts), the reference kernel: the logic only.
PARAMS = dict(models=("glm-5", "deepseek-v3.2"), tokens=(4096, 16384), blocks=("attention", "moe"),
              strategies=tuple(DEFAULT_STRATEGIES), runs=("tp", "sim"), allreduce_tokens=(1024, 4096, 16384),
              allreduce_mib=(1.0, 4.0, 16.0, 64.0, 256.0), warmup=5, iters=20, kernel_backend="auto",
              concat_backend="auto", moe_impl="auto", cpu_dry_run=False)
#: What ``--smoke`` sets (and the rank's model alone).
SMOKE = dict(tokens=[1024], iters=3, allreduce_mib=[1])

_BLOCK = BLOCK_COLUMNS + COMPARE_COLUMNS
OUTPUTS = {"tp_block.csv": _BLOCK, "allreduce.csv": ALLREDUCE_COLUMNS,
           **{f"tp{n}_sim_block.csv": _BLOCK for n in (2, 4, 8)}}
#: (model, block) per TP size
SHAPES = [(m, b) for m in ("glm-5", "deepseek-v3.2") for b in ("attention", "moe")]


def _files(runs, tp: int) -> dict:
    """``{file: columns}`` a run writes: ``tp<N>_sim_block.csv`` (sim alone) or ``tp_block.csv`` + allreduce."""
    sim_only = list(runs) == ["sim"]
    return ({f"tp{tp}_sim_block.csv": _BLOCK} if sim_only
            else {"tp_block.csv": _BLOCK, "allreduce.csv": ALLREDUCE_COLUMNS})


def _blank(v):
    """None for a missing value (None, pandas NA, NaN): an empty CSV field."""
    return None if v is None or type(v).__name__ == "NAType" or (isinstance(v, float) and v != v) else v


def _config(rank, options) -> TPBenchmarkConfig:
    """The run's config: :data:`PARAMS` as set (``--smoke``: :data:`SMOKE`, the rank's model), the rank's ``tp`` and
    GPU. Raises ValueError (one line): a bad option (:func:`~mla_lab.measure.tp.check_config`), too few GPUs, no
    flash_mla for the attention block, this GPU not the rank's (``--arch``)."""
    p = {k: list(v) if isinstance(v, tuple) else v for k, v in ((k, options.param(k, d)) for k, d in PARAMS.items())}
    if options.smoke:
        p.update(models=[rank.model.name], **SMOKE)
    if p.pop("cpu_dry_run"):
        return _dry_config(TPBenchmarkConfig(**p, tp=rank.tp, device="cpu", model_overrides=tiny_overrides()))
    cfg = TPBenchmarkConfig(**p, tp=rank.tp, arch=rank.arch.name, device="cuda")
    n, need = torch.cuda.device_count(), cfg.tp if "tp" in cfg.runs else 1
    if n < need:
        raise ValueError(f"runs={','.join(cfg.runs)} --tp {cfg.tp} needs {need} CUDA GPUs; torch sees {n} (runs=sim "
                         "needs one; cpu_dry_run=1 checks the logic on CPU)")
    if "attention" in cfg.blocks and cfg.kernel_backend != "reference" and not flash_mla_info()["available"]:
        raise ValueError(f"flash_mla is not available ({flash_mla_info()}); install the gpu extra, or pass "
                         "--param kernel_backend=reference with small tokens")
    gpu = detect_arch()
    if (gpu["arch"] or ("b200" if gpu["prefill_padding"] == 128 else "h200")) != cfg.arch:
        raise ValueError(f"--arch {cfg.arch}: this GPU is {gpu['device']}; allowed: its --arch")
    check_config(cfg)
    return cfg


def _dry_config(asked: TPBenchmarkConfig) -> TPBenchmarkConfig:
    """The CPU dry run's tiny config (reference kernel, torch concat); the sizes asked for still checked."""
    tiny = dataclasses.replace(asked, kernel_backend="reference", concat_backend="torch", moe_impl="auto")
    try:
        check_config(tiny)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"{e} (cpu_dry_run=1: the tiny models, 8 heads and 8 experts each)") from None
    return dataclasses.replace(tiny, tokens=[16], warmup=1, iters=3, allreduce_tokens=[16, 64], allreduce_mib=[0.25, 1])


def _header(path: Path):
    with open(path, newline="") as f:
        return next(csv.reader(f), None)


def _check_out(out: Path, files: dict, dry: bool) -> None:
    """``out`` a folder (created), not under data/measured for a dry run, no file there without this experiment's
    header. Raises ValueError (one line)."""
    measured_root = measured_dir().resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is an existing file; allowed: a folder (new or holding this "
                         "experiment's CSVs)")
    if dry and (out.resolve() == measured_root or measured_root in out.resolve().parents):
        raise ValueError(f"--out {str(out)!r} is under {measured_root}: a cpu_dry_run (gloo, tiny shapes) never "
                         "writes there; allowed: a folder outside it, e.g. /tmp/x")
    for name, cols in files.items():
        header = cols + list(PROVENANCE_COLUMNS)
        if (out / name).is_dir():
            raise ValueError(f"{out / name} is a folder, not a file")
        if (out / name).exists() and _header(out / name) not in (header, [c for c in header if c != "content"]):
            raise ValueError(f"{out / name} exists and was not written by tp_block.py (its header differs); refusing "
                             "to overwrite it: pass another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {str(out)!r} cannot be created ({e.strerror}); allowed: a writable folder") from None


def check(rank, options) -> None:
    """The entry's refusals before anything runs (:func:`_config`, :func:`_check_out`): ValueError, one line."""
    try:
        cfg = _config(rank, options)
        _check_out(options.out, _files(cfg.runs, cfg.tp), cfg.device == "cpu")
    except ValueError as e:
        raise ValueError(f"tp_block: {e}") from None


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


def run(rank, sink, options) -> None:
    """Every model's rows into ``<file>.partial`` under ``sink.out``, each file replaced when all are done (a failure
    keeps the earlier file and the rows so far), then the summary on stdout."""
    cfg, out = _config(rank, options), Path(sink.out)
    files = _files(cfg.runs, cfg.tp)
    if cfg.device == "cuda":
        info = flash_mla_info()
        log(f"{cfg.arch}; flash_mla {info.get('provider')} {info.get('version')}; env {SAFE_ENV}")
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
    _print_summary(blocks, ars, cfg.tp)
    log(f"wrote {', '.join(str(out / f) for f in files)}")
