"""The one fresh-process entry of the suite: ``python -m mla_lab.measure.experiments NAME --out DIR [--process K]
[--smoke] [--repeats N] [--engine-root DIR] [--param key=value ...] [--model M --tp N --arch A] [--dry-run]``
(:func:`main`): builds the rank (:func:`rank_of`), the options and the sink, and calls the experiment's ``run``."""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import time
import traceback
from pathlib import Path

from mla_lab.deployment import Deployment

from ..sink import Sink, log
from . import EXPERIMENTS, SMOKE_TOKENS, Options
from ._common import stale_fill_on_gpu


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mla_lab.measure.experiments",
                                 description="one process of one experiment (mla-lab measure starts these)")
    ap.add_argument("name", help="an experiment of the registry (mla-lab measure --dry-run lists them)")
    ap.add_argument("--out", default=None, help="folder for its CSVs (rows appended; created)")
    ap.add_argument("--process", type=int, default=1, help="index of this fresh process (1..N)")
    ap.add_argument("--repeats", type=int, default=11, help="interleaved rounds per measured set")
    ap.add_argument("--smoke", action="store_true", help=f"tiny shapes ({SMOKE_TOKENS} tokens), 3 repeats")
    ap.add_argument("--engine-root", default=".engine", help="the packed engine kernels")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="the experiment's own")
    ap.add_argument("--model", default=None, help="the rank's model (default the seed's, glm-5)")
    ap.add_argument("--tp", type=int, default=None, help="the rank's tensor-parallel size (default the seed's, 8)")
    ap.add_argument("--arch", default=None, help="the rank's GPU (default the seed's, h200)")
    ap.add_argument("--dry-run", action="store_true", help="print the outputs, shapes and plan as JSON; run nothing")
    return ap


def _options(a) -> Options:
    """The :class:`Options` of parsed arguments. Raises ValueError (one line) on a bad value."""
    if a.process < 1 or a.repeats < 1:
        raise ValueError(f"--process={a.process} / --repeats={a.repeats}: allowed: integers >= 1")
    bad = [p for p in a.param if "=" not in p]
    if bad:
        raise ValueError(f"--param={bad[0]!r}: allowed: KEY=VALUE")
    e = EXPERIMENTS[a.name]
    params = {**dict(e.params), **dict(p.split("=", 1) for p in a.param)}
    return Options(Path(a.out or "."), a.process, a.smoke, a.repeats, a.engine_root, params)


def param_names(mod) -> list[str]:
    """The ``--param`` keys an experiment module reads: each ``options.param("KEY", ...)`` in its source, and the
    keys of its ``PARAMS`` (``tp_block`` reads those in a loop)."""
    read = re.findall(r"""\.param\(\s*["'](\w+)["']""", inspect.getsource(mod))
    return sorted({*read, *getattr(mod, "PARAMS", {})})


def check_params(name: str, mod, params: dict) -> None:
    """Raises ValueError (one line: the key, its value, the keys allowed) for a ``--param`` key ``mod`` never reads."""
    allowed = param_names(mod)
    for key, value in params.items():
        if key not in allowed:
            raise ValueError(f"--param {key}={value!r}: {name} reads no such parameter; allowed: "
                             f"{', '.join(allowed) or 'none'}")


def rank_of(model: str | None = None, tp: int | None = None, arch: str | None = None, smoke: bool = False):
    """The rank an experiment measures: the seed (:meth:`mla_lab.deployment.Deployment.seed`) with the given
    changes, ``max_num_batched_tokens`` :data:`SMOKE_TOKENS` under smoke. Raises ValueError as the Deployment."""
    changes = {k: v for k, v in (("model", model), ("tp", tp), ("arch", arch)) if v is not None}
    if smoke:
        changes["max_num_batched_tokens"] = SMOKE_TOKENS
    return Deployment.seed(**changes).rank


def needs_cuda(rank, options) -> None:
    """An experiment's ``check`` unless it has its own: a CUDA GPU. Raises ValueError (one line) without one."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("this experiment needs a CUDA GPU (torch.cuda.is_available() is False)")


def main(argv=None) -> int:
    """``python -m mla_lab.measure.experiments NAME --out DIR [--process K] [--smoke] [--param k=v] ...``: one
    fresh process of one experiment. Exit 2 (one line on stderr) on a bad argument or when the experiment's
    ``check(rank, options)`` (default :func:`needs_cuda`) refuses; 1 when the experiment raised (the rows written
    before stay); 0 otherwise."""
    a = _parser().parse_args(argv)
    try:
        if a.name not in EXPERIMENTS or EXPERIMENTS[a.name].argv:
            allowed = ", ".join(n for n, e in EXPERIMENTS.items() if not e.argv)
            raise ValueError(f"name={a.name!r}; allowed: {allowed} (retired ones: docs/retired.md)")
        if a.out is None and not a.dry_run:
            raise ValueError("--out: missing; allowed: a folder for the rows (a run needs one)")
        options, rank = _options(a), rank_of(a.model, a.tp, a.arch, a.smoke)
        mod = EXPERIMENTS[a.name].module_obj()
        check_params(a.name, mod, options.params)
        if not a.dry_run:
            getattr(mod, "check", needs_cuda)(rank, options)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    if a.dry_run:
        plan = mod.plan(rank, options) if hasattr(mod, "plan") else []
        print(json.dumps({"outputs": mod.OUTPUTS, "shapes": mod.SHAPES, "plan": plan}, default=str))
        return 0
    return _run(mod, rank, options, EXPERIMENTS[a.name].between_process)


def _run(mod, rank, options: Options, between_process: bool) -> int:
    stale_fill_on_gpu()
    sink = Sink(options.out, mod.OUTPUTS, options.process if between_process else None)
    t0 = time.perf_counter()
    log(f"{mod.__name__} process {options.process}: {rank.describe()}")
    try:
        mod.run(rank, sink, options)
    except Exception as e:  # noqa: BLE001 - say what failed; the rows measured before it stay
        traceback.print_exc()
        log(f"FAILED: {type(e).__name__}: {e}")
        return 1
    log(f"done in {time.perf_counter() - t0:.1f} s: {sink.n} rows (process {options.process})")
    return 0
