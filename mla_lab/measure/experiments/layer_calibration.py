"""Calibrate and validate the per-rank layer model (:mod:`mla_lab.model`) on a GPU.

The command line over :mod:`mla_lab.measure.layer` (the layer), :mod:`mla_lab.measure.layer_runs` (the loops),
:mod:`mla_lab.measure.triton_ops` (its Triton kernels),
:mod:`mla_lab.measure.layer_experiments` (the extras) and :mod:`mla_lab.measure.validate` (the fit). What it
measures (:func:`mla_lab.measure.timer.median_ms`: ``triton.testing.do_bench(..., return_mode="median")``, warm-up,
L2 flushed before every repetition, CUDA events; random bf16 weights and inputs scaled 1/sqrt(K), never zeros):

1. ``layer_ops.csv``: every op of :func:`mla_lab.model.ops.layer_ops` that has an ``impl``, at its real per-rank
   shape, for each model x TP x T (and the MoE ops again under expert parallelism, ep = tp), each unique shape once
   (implementations: :mod:`mla_lab.measure.layer`), and fp8 GEMMs (``torch._scaled_mm``, per-tensor scales) at the
   first model's TP8 shapes.
2. ``layer_e2e.csv``: the synthetic per-rank layer end to end, per strategy (``--strategies``, default
   ``per_call_zeros,private_workspace``: what the first version's rows call ``unfused`` / ``fused``) —
   ``per_call_zeros`` = concat into an H-head buffer + ``new_zeros`` pad + copy + kernel + ``out[:, :H]`` (a view,
   as vLLM); ``private_workspace`` = concat into the padded workspace + kernel + the same view; ``per_call_empty``
   takes its pad from a block holding its content — for the MoE layer (TP-sharded experts; EP at the largest tp)
   and the dense layer. No communication (one GPU); the model's prediction for these rows leaves comm and
   modelled-only ops out. ``mode``: ``eager``; ``graph`` (CUDA-graph replay, T <= 4096); ``paired`` (``--pairs
   N``: the first two strategies timed alternately N times, drift cancelled; the median paired difference goes to
   ``layer_extras.csv``). The private workspace's padded heads hold zeros (``--workspace-content``; the first H200
   run, before this option, had stale N(0, 1) values there while the per-call pad is zeros); every row records
   its ``strategy`` and ``content``.
3. ``layer_extras.csv``: the Triton kernels' correctness checks; copy and matmul ceilings; whether the W_UV bmm
   copies the ``[:, :H]`` slice; peak memory per strategy against :func:`mla_lab.buffers.memory_account`; the
   sparse kernel with causal ``topk_length`` (the seed step: 16 prompts x 1024 tokens; one 4096-token prompt); the
   kernel with the padded heads zeros / stale / NaN (:mod:`mla_lab.measure.layer_experiments`).
4. ``h200_ops.csv``: the efficiencies fitted by :func:`mla_lab.model.calibration.fit_calibration`, and
   ``layer_validation.csv``: predicted vs measured per op and per layer, in-sample and leave-one-model-out
   (:func:`mla_lab.measure.validate.fit_and_validate`).

Every row carries :func:`mla_lab.provenance.provenance` ``("measured")`` columns (validation rows: ``modelled``).
The run stops measuring at ``--budget-s`` and still fits and writes what it has (CSV rows are appended as they are
measured, so a kill loses nothing measured); the log goes to ``bench_layer_log.txt`` in the output folder.

CPU check of the logic: ``python -m mla_lab.measure.experiments.layer_calibration --dry-run`` (a tiny model, float32, Triton interpreter,
the torch reference kernel); ``--fit-only DIR`` refits from the CSVs in DIR.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from pathlib import Path

from mla_lab.arch import get_arch
from mla_lab.measure.layer import (
    OPS_CSV,
    KernelCheckError,
    MeasureSettings,
    layer_strategies,
    run_kernel_checks,
    select_implementations,
    tiny_model,
)
from mla_lab.measure.layer_experiments import fp8_gemm_rows, run_extras
from mla_lab.measure.layer_runs import RunLog, open_sinks, read_rows, run_layer_benchmark
from mla_lab.measure.validate import fit_and_validate
from mla_lab.models import load_model
from mla_lab.paths import data_dir, is_committed
from mla_lab.provenance import PROVENANCE_COLUMNS, provenance

DRY_RUN_OUT = Path("/tmp/bench_layer_dry")
#: ``--fused-pad-fill`` (the first version's flag) -> ``--workspace-content``.
_LEGACY_PAD_FILL = {"zero": "zeros", "random": "stale"}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny model, Triton interpreter, float32")
    ap.add_argument("--out", default=None, help="output dir (default: a temp dir for --dry-run, else data/)")
    ap.add_argument("--models", default="glm-5,deepseek-v3.2")
    ap.add_argument("--tp", default="8,4,2,1")
    ap.add_argument("--tokens", default="1024,4096,16384")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop measuring after this many seconds")
    ap.add_argument("--warmup", type=float, default=20.0, help="do_bench warm-up (ms)")
    ap.add_argument("--rep", type=float, default=60.0, help="do_bench repetition time (ms)")
    ap.add_argument("--fit-only", default=None, help="refit from the CSVs in this dir (read only: writes nothing there)")
    ap.add_argument("--cal-out", default=None, help="with --fit-only (required): the calibration CSV to write")
    ap.add_argument("--validation-out", default=None,
                    help="with --fit-only: the validation CSV to write (default: layer_validation.csv beside --cal-out)")
    ap.add_argument("--overwrite", action="store_true",
                    help="with --fit-only: let --cal-out / --validation-out replace a committed file")
    ap.add_argument("--skip-e2e", action="store_true")
    ap.add_argument("--workspace-content", choices=("zeros", "stale"), default=None,
                    help="padded heads of the private workspace (default zeros; the first H200 run had stale)")
    ap.add_argument("--fused-pad-fill", choices=tuple(_LEGACY_PAD_FILL), default=None,
                    help="the first version's name of --workspace-content (zero = zeros, random = stale)")
    ap.add_argument("--strategies", default="per_call_zeros,private_workspace",
                    help="layer strategies (mla_lab.placement names; placements per_call_zeros, per_call_empty, "
                         "private_workspace)")
    ap.add_argument("--pairs", type=int, default=0,
                    help="interleaved e2e pairs of the first two strategies per config (0: off; the first H200 run "
                         "had none)")
    ap.add_argument("--no-flash-mla", action="store_true", help="do not import flash_mla (kernel op skipped)")
    return ap


OUTPUTS = {"layer_ops.csv": ["model", "tp", "moe_parallel", "ep", "T", "op", "op_class", "impl", "impl_detail",
                             "dims", "dtype", "flops", "bytes", "ms", "status"],
           "layer_e2e.csv": ["model", "tp", "moe_parallel", "ep", "T", "layer_kind", "strategy", "mode", "ms",
                             "excluded_ops", "impl_detail", "status"],
           "layer_extras.csv": ["experiment", "model", "tp", "T", "H", "Hp", "name", "ms", "flops", "bytes", "value",
                                "unit", "note"],
           "layer_validation.csv": ["level", "split", "model", "tp", "moe_parallel", "T", "name", "op_class",
                                    "measured_ms", "predicted_ms", "ape_pct"]}
PROVENANCE = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp")
#: (model, tp, T) of the default grid
SHAPES = [(m, tp, T) for m in ("glm-5", "deepseek-v3.2") for tp in (1, 2, 4, 8) for T in (1024, 4096, 16384)]


def _fit_only_outputs(ap, args) -> tuple[Path, Path]:
    """``--fit-only``'s two outputs, checked before anything is fitted: ``--cal-out`` (required: the measured folder
    read is never written) and ``--validation-out`` (default ``layer_validation.csv`` beside ``--cal-out``); a
    committed file (tracked by git) is replaced only with ``--overwrite``, a folder or an unwritable path never."""
    if not args.cal_out:
        ap.error(f"--fit-only {args.fit_only} needs --cal-out PATH (the calibration CSV to write; nothing is written "
                 "into the folder read), e.g. --cal-out /tmp/h200_ops.csv")
    cal = Path(args.cal_out)
    val = Path(args.validation_out) if args.validation_out else cal.with_name("layer_validation.csv")
    if cal.resolve() == val.resolve():
        ap.error(f"--cal-out and --validation-out are one file ({cal}); allowed: two paths")
    for flag, p in (("--cal-out", cal), ("--validation-out", val)):
        if p.is_dir() or (p.exists() and not p.is_file()):
            ap.error(f"{flag} {p} is not a regular file; allowed: a CSV path")
        if is_committed(p) and not args.overwrite:
            ap.error(f"{flag} {p} is a committed file (tracked by git); allowed: another path, or --overwrite to "
                     "replace it")
        folder = next((q for q in [p.parent.absolute(), *p.parent.absolute().parents] if q.exists()), None)
        if folder is None or not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK) or \
                (p.exists() and not os.access(p, os.W_OK)):
            ap.error(f"{flag} {p} is not writable; allowed: a path in a writable folder")
        p.parent.mkdir(parents=True, exist_ok=True)
    return cal, val


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.fused_pad_fill and args.workspace_content and _LEGACY_PAD_FILL[args.fused_pad_fill] != args.workspace_content:
        ap.error(f"--fused-pad-fill {args.fused_pad_fill} contradicts --workspace-content {args.workspace_content}")
    content = args.workspace_content or _LEGACY_PAD_FILL.get(args.fused_pad_fill, "zeros")
    if args.dry_run:  # before triton is imported (by mla_lab.measure.layer, through mla_lab.kernels)
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--dry-run: triton was imported before TRITON_INTERPRET=1 could be set; run this script "
                             "on its own (or set TRITON_INTERPRET=1 in the environment)")
        os.environ["TRITON_INTERPRET"] = "1"
    import torch


    try:
        strategies = layer_strategies([s for s in args.strategies.split(",") if s])
    except ValueError as e:
        ap.error(f"--strategies {args.strategies}: {e}")
    log = RunLog()
    arch = get_arch("h200")
    if args.fit_only:
        cal_out, val_out = _fit_only_outputs(ap, args)
        models = {n: load_model(n) for n in ("glm-5", "deepseek-v3.2")}
        ops_rows = read_rows(Path(args.fit_only) / OPS_CSV)
        # the fitted efficiencies inherit the provenance of the measurements they come from
        fit_provenance = ({k: ops_rows[0][k] for k in PROVENANCE_COLUMNS if k in ops_rows[0]} if ops_rows
                          else provenance("modelled"))
        fit_provenance["fit_commit"] = provenance("modelled")["git_commit"]
        fit_and_validate(args.fit_only, arch, fit_provenance, models, cal_out, log=log, validation_path=val_out)
        return 0
    gpu = torch.cuda.is_available() and not args.dry_run
    if not gpu and not args.dry_run:
        ap.error("no CUDA GPU: use --dry-run on CPU (or --fit-only DIR)")
    settings = MeasureSettings(device="cuda" if gpu else "cpu", dtype=torch.bfloat16 if gpu else torch.float32,
                               interpret=not gpu, warmup_ms=args.warmup, rep_ms=args.rep,
                               deadline=log.start + args.budget_s, content=content)
    out = Path(args.out) if args.out else (DRY_RUN_OUT if args.dry_run else data_dir())
    measured_provenance = provenance("measured")
    log(f"device={measured_provenance['device']} torch={measured_provenance['torch']} triton={measured_provenance['triton']} flash_mla={measured_provenance['flash_mla']} "
        f"commit={measured_provenance['git_commit']}")
    implementations = select_implementations(settings, use_flash_mla=not args.no_flash_mla,
                                             flash_mla_version=measured_provenance["flash_mla"], log=log)
    log(f"kernel: {implementations.kernel_detail}; concat: {implementations.concat_detail}")
    sinks = open_sinks(out, measured_provenance)
    try:
        disabled = run_kernel_checks(settings, sinks.extras, log)
    except KernelCheckError as e:
        raise SystemExit(str(e)) from None
    settings = dataclasses.replace(settings, disabled_kernels=disabled)

    if args.dry_run:
        models = [("tiny", tiny_model())]
        tps, tokens = [2, 1], [64]
    else:
        models = [(n, load_model(n)) for n in args.models.split(",")]
        tps = [int(x) for x in args.tp.split(",")]
        tokens = [int(x) for x in args.tokens.split(",")]
    try:
        run_extras(sinks.extras, settings, implementations, models, arch, max(tokens), log)
    except Exception as e:
        log(f"extras failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    if gpu:
        try:
            for row in fp8_gemm_rows(settings, models[0][1], arch, [tokens[0], tokens[-1]]):
                sinks.ops.write(row)
            log("fp8 gemms done")
        except Exception as e:
            log(f"fp8 gemms failed: {type(e).__name__}: {e}")
    run_layer_benchmark(models, tps, tokens, arch, settings, implementations, sinks, log, pairs=args.pairs,
                        skip_e2e=args.skip_e2e, strategies=strategies)
    log(f"measuring done at {log.elapsed():.0f}s")
    try:
        fit_and_validate(out, arch, {**provenance("measured"), "fit_commit": measured_provenance["git_commit"]}, dict(models),
                         log=log)
    except Exception as e:
        log(f"fit failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    log.write(out / "bench_layer_log.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
