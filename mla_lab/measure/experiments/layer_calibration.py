"""Calibrate and validate the per-rank layer model (:mod:`mla_lab.model`): the layer :mod:`mla_lab.measure.layer`,
loops and extras :mod:`~mla_lab.measure.layer_runs`, fit
:mod:`~mla_lab.measure.validate`; :func:`mla_lab.measure.timer.median_ms`, random bf16 weights scaled 1/sqrt(K).

1. ``layer_ops.csv``: every op of :func:`mla_lab.model.ops.layer_ops` at its per-rank shape per model x TP x T (MoE
   also under ep = tp), fp8 GEMMs at the first model's shapes.
2. ``layer_e2e.csv``: the layer end to end per strategy (:data:`mla_lab.measure.layer.LAYER_STRATEGIES`:
   ``per_call_zeros``, ``private_workspace``), modes ``eager``, ``graph`` (T <= 4096), ``paired`` (``pairs`` N); no communication.
3. ``layer_extras.csv``: kernel checks, ceilings, the W_UV slice, peak memory, causal ``topk_length``, padded heads.
4. ``h200_ops.csv`` and ``layer_validation.csv``: :func:`mla_lab.measure.validate.fit_and_validate`.

Parameters also ``budget_s`` (400 s; smoke 60). Grid: GLM-5 and DeepSeek-V3.2 at TP 8, 4, 2, 1, T 1024, 4096, 16384
(smoke: the rank's model and TP, T 1024); do_bench budgets and workspace content: :class:`MeasureSettings`'s.
"""

from __future__ import annotations

import dataclasses
import time
import traceback

import torch

from mla_lab.measure.layer import MeasureSettings, run_kernel_checks, select_implementations
from mla_lab.measure.layer_runs import LAYER_OUTPUTS, OPS_CSV, fp8_gemm_rows, run_extras, run_layer_benchmark
from mla_lab.measure.sink import log
from mla_lab.measure.validate import VALIDATION_COLUMNS, fit_and_validate

from ._common import ranks_of

OUTPUTS = {**LAYER_OUTPUTS, "layer_validation.csv": VALIDATION_COLUMNS}
#: (model, tp, T) of the default grid
SHAPES = [(m, tp, T) for m in ("glm-5", "deepseek-v3.2") for tp in (1, 2, 4, 8) for T in (1024, 4096, 16384)]


def _grid(rank, smoke: bool) -> tuple[list, list, list]:
    """(models as (name, config), TP sizes, token counts): the defaults, or the rank's model, TP and 1024 tokens
    under smoke."""
    names = (rank.model.name,) if smoke else ("glm-5", "deepseek-v3.2")
    models = [(r.model.name, r.model) for r in ranks_of(rank, names)]
    return models, [rank.tp] if smoke else [8, 4, 2, 1], [1024] if smoke else [1024, 4096, 16384]


def run(rank, sink, options) -> None:
    settings = MeasureSettings(device="cuda", dtype=torch.bfloat16,
                               deadline=time.time() + options.param("budget_s", 60.0 if options.smoke else 400.0))
    implementations = select_implementations(settings, flash_mla_version=sink.prov["flash_mla"], log=log)
    log(f"kernel: {implementations.kernel_detail}; concat: {implementations.concat_detail}")
    settings = dataclasses.replace(settings, disabled_kernels=run_kernel_checks(settings, sink, log))
    models, tps, tokens = _grid(rank, options.smoke)
    try:
        run_extras(sink, settings, implementations, models, rank.arch, max(tokens), log)
        for row in fp8_gemm_rows(settings, models[0][1], rank.arch, [tokens[0], tokens[-1]]):
            sink.write(OPS_CSV, row)
    except Exception as e:  # noqa: BLE001 - the extras are extra: the layer rows still come
        log(f"extras / fp8 gemms failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    run_layer_benchmark(models, tps, tokens, rank.arch, settings, implementations, sink, log,
                        pairs=options.param("pairs", 0))
    fit_and_validate(options.out, rank.arch, {**sink.prov, "fit_commit": sink.prov["git_commit"]}, dict(models),
                     log=log)
