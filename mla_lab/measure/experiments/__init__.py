"""The measurement suite: the registry :data:`EXPERIMENTS`, their :class:`Options` (one fresh-process entry:
:mod:`.entry`) and the calibration files fitted on their rows (:data:`CALIBRATION`).

An experiment is a module with ``OUTPUTS`` (file -> row columns, before the provenance columns), ``SHAPES`` (what it
measures at its defaults) and ``run(rank, sink, options)``: a :class:`~mla_lab.rank.RankView` (the seed unless
``--model/--tp/--arch``; ``--smoke``: :data:`SMOKE_TOKENS` tokens), a :class:`~mla_lab.measure.sink.Sink`, an
:class:`Options`; optionally ``check(rank, options)`` (refusals, ValueError, before anything runs; default: a CUDA
GPU). ``mla-lab measure`` (:mod:`.runner`) runs each as ``python -m mla_lab.measure.experiments NAME``,
a between-process one once per fresh process (``--processes``, default 5), into ``data/measured/<gpu>/``. Modules are
imported only when asked (``mla-lab --help`` loads no torch).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

#: ``max_num_batched_tokens`` under ``--smoke`` (two 1024-token prompts; rows never reported).
SMOKE_TOKENS = 2048


@dataclass(frozen=True)
class Options:
    """One process's settings: ``out`` folder, ``process`` (1..N), ``smoke``, ``repeats`` (interleaved rounds;
    :attr:`reps` 3 under smoke), ``engine_root`` (:mod:`mla_lab.kernels.engine_libs`), ``params`` (the registry's,
    then ``--param key=value``: :meth:`param`)."""

    out: Path
    process: int = 1
    smoke: bool = False
    repeats: int = 11
    engine_root: str = ".engine"
    params: dict = field(default_factory=dict)

    @property
    def reps(self) -> int:
        return 3 if self.smoke else self.repeats

    def param(self, name: str, default):
        """``params[name]`` as the type of ``default`` (a tuple: comma-separated values of its first element's
        type), else ``default``. Raises ValueError (the parameter, value and type allowed) when it does not convert."""
        if name not in self.params:
            return default
        v = self.params[name]
        try:
            if isinstance(default, tuple):
                kind = type(default[0]) if default else str
                return tuple(kind(x) for x in str(v).split(",") if x)
            if isinstance(default, bool):
                return str(v).lower() in ("1", "true", "yes")
            return type(default)(v)
        except (TypeError, ValueError):
            raise ValueError(f"--param {name}={v!r}: allowed: a {type(default).__name__} like {default!r}") from None


@dataclass(frozen=True)
class Experiment:
    """One experiment: ``module``, ``folder`` (under ``data/measured/<gpu>/``), ``between_process`` (once per fresh
    process), ``default`` (run without ``--experiments``), ``timeout_s`` (per process), ``needs`` (beyond torch +
    triton), ``params`` (:meth:`Options.param`), ``argv`` / ``smoke_argv`` (an experiment above this layer with its
    own command line, ``{out}`` replaced: ``padding_sweep``)."""

    name: str
    module: str
    summary: str
    folder: str
    between_process: bool
    default: bool = False
    timeout_s: int = 300
    needs: str = "flash_mla"
    params: tuple[tuple[str, str], ...] = ()
    argv: tuple[str, ...] = ()
    smoke_argv: tuple[str, ...] = ()

    def module_obj(self):
        return importlib.import_module(self.module)

    def outputs(self) -> dict[str, list[str]]:
        return dict(self.module_obj().OUTPUTS)

    def shapes(self) -> list:
        return list(self.module_obj().SHAPES)

    def command(self, out, process: int, engine_root: str = ".engine", smoke: bool = False) -> list[str]:
        """``[-m, module-or-entry, args...]`` for one fresh process (``python`` is the caller's)."""
        if self.argv:
            return ["-m", self.module, *(a.replace("{out}", str(out)) for a in (self.smoke_argv if smoke else
                                                                                 self.argv))]
        params = [x for k, v in self.params for x in ("--param", f"{k}={v}")]
        return ["-m", __name__, self.name, "--out", str(out), "--process", str(process), "--engine-root",
                str(engine_root), *params, *(["--smoke"] if smoke else [])]


_E = "mla_lab.measure.experiments."
_BP = "between_process"
_PACKED = "engine kernels packed by python -m mla_lab.kernels.engine_libs pack (--engine-root); flash_mla"
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    # --- between-process (>= 5 fresh processes): data/measured/<gpu>/between_process/
    Experiment("cold_start", _E + "cold_start", "first calls vs steady state in a fresh process; step spread", _BP,
               True, default=True, timeout_s=150),
    Experiment("presets", _E + "presets", "attention path per engine preset (seed and full topk)", _BP, True,
               default=True, timeout_s=200),
    Experiment("subgraph", _E + "subgraph", "sub-chunk loops eager / one CUDA graph / two streams", _BP, True,
               default=True, timeout_s=200),
    Experiment("routes", _E + "routes_step", "attention route per prompt length: padded sparse MQA vs dense MHA",
               _BP, True, default=True, timeout_s=300),
    Experiment("moe_decode", _E + "moe_decode", "routed experts at decode sizes (bf16 / fp8 grouped GEMMs)", _BP,
               True, default=True, timeout_s=150, needs=""),
    Experiment("content_step", _E + "content_step", "padded-head content over a 78-layer step (zeros vs stale)",
               _BP, True, default=True, timeout_s=300),
    Experiment("attention_strategies", _E + "attention_strategies", "named strategies' attention path", _BP, True,
               timeout_s=200),
    Experiment("first_token", _E + "first_token", "first calls at new shapes (cold Triton JIT) and allocator growth "
               "from an empty cache to the step's peak (issue 37)", _BP, True, timeout_s=200, needs=""),
    Experiment("engine_kernels", _E + "engine_kernels",
               "the engines' own sparse-MLA kernels: prefill, decode sizes, gather vs MMA, concat_mla_q", _BP, True,
               timeout_s=300, needs=_PACKED),
    Experiment("packed_kernels", _E + "packed_kernels",
               "the packed kernel (8 tokens x 8 heads per tile) beside every engine's kernel, over union size", _BP,
               True, timeout_s=420, needs=_PACKED + "; nvcc for the CUDA union builder (else the Triton one)"),
    # --- once: data/measured/<gpu>/ and its round2/ folder
    Experiment("padding_sweep", "mla_lab.sweep.measured",
               "the measured sweep: every real strategy's attention path per grid point, the rest modelled", "",
               False, timeout_s=420, argv=("--out", "{out}/padding_sweep.csv"),
               smoke_argv=("--out", "{out}/padding_sweep.csv", "--quick", "--num-runs", "3")),
    Experiment("attention_path", _E + "attention_path", "attention path per strategy x model x TP x T; NaN check",
               "", False, timeout_s=420),
    Experiment("layer_calibration", _E + "layer_calibration",
               "every op of the layer model at its per-rank shape, the layer end to end, the fit (h200_ops.csv)", "",
               False, timeout_s=600),
    Experiment("engines", _E + "engines", "content factor, engine presets, sub-chunking, NaN check", "round2",
               False, timeout_s=480),
    Experiment("decode_layer", _E + "decode_layer", "per-rank decode / mixed layer, attention path, per op",
               "round2", False, timeout_s=300),
    Experiment("tp_block", _E + "tp_block", "attention and MoE blocks sharded over TP GPUs vs the one-GPU share "
               "(runs=sim: the one-GPU share alone)", "", False, timeout_s=450, params=(("runs", "sim"),)),
)}


@dataclass(frozen=True)
class Fit:
    """How a calibration file is made: ``inputs`` (under ``data/measured``, or a description), ``experiments``
    (registry names), ``function`` (``module:function`` that writes it)."""

    inputs: tuple[str, ...]
    experiments: tuple[str, ...]
    function: str


_H = "h200/between_process/"
#: data/calibration/<file> -> the data and the fit that produce it.
CALIBRATION: dict[str, Fit] = {
    "h200_ops.csv": Fit(("h200/layer_ops.csv", "h200/layer_e2e.csv", "h200/layer_extras.csv"),
                        ("layer_calibration",), "mla_lab.measure.validate:fit_and_validate"),
    "h200_reference.csv": Fit(("attention-path do_bench medians on one H200 (torch 2.11.0+cu130, driver 580.159.04; "
                               "rows in the file)",), ("attention_path",),
                              "mla_lab.model.calibration:attention_from_reference (reads it; no writer)"),
    "h200_comm.csv": Fit(("h200x<n>/allreduce.csv", "h200x2/tp2_attention.csv"), ("tp_block",),
                         "mla_lab.fits.files:fit_comm_file"),
    "h200_content.csv": Fit(("h200/round2/content.csv",), ("engines",), "mla_lab.fits.files:fit_content_file"),
    "h200_subchunk.csv": Fit(("h200/round2/presets.csv",), ("engines",), "mla_lab.fits.files:fit_subchunk_file"),
    "h200_content_step.csv": Fit((_H + "content_loop.csv",), ("content_step",), "mla_lab.fits.files:fit_content_step_file"),
    "h200_content_step_per_process.csv": Fit((_H + "content_loop.csv",), ("content_step",),
                                             "mla_lab.fits.files:fit_content_step_file"),
    "h200_decode.csv": Fit(("h200/round2/decode_ops.csv", "h200/round2/decode_layer.csv"), ("decode_layer",),
                           "mla_lab.fits.decode:fit_decode_file"),
    "h200_moe_decode.csv": Fit((_H + "moe_decode.csv",), ("moe_decode",), "mla_lab.fits.files:fit_moe_decode_file"),
    "h200_routes.csv": Fit(("h200/round2/content.csv", "h200/layer_ops.csv", "h200/attention_path.csv",
                            _H + "routes.csv"), ("engines", "layer_calibration", "attention_path", "routes"),
                           "mla_lab.fits.files:fit_routes_file"),
    "h200_subchunk_graph.csv": Fit((_H + "subgraph.csv",), ("subgraph",), "mla_lab.fits.files:fit_subchunk_graph_file"),
    "h200_decode_kernels.csv": Fit((_H + "engine_kernels.csv",), ("engine_kernels",),
                                   "mla_lab.model.decode_kernels:fit_decode_kernels_file"),
    "h200_packed.csv": Fit((_H + "packed_kernels.csv",), ("packed_kernels",),
                           "mla_lab.model.packed_kernel:fit_packed_file"),
}


def resolve(names: str | None) -> list[Experiment]:
    """The experiments of ``names`` (comma separated; None or "": the defaults) in registry order. Raises ValueError
    naming the unknown ones and the allowed names."""
    if not names:
        return [e for e in EXPERIMENTS.values() if e.default]
    asked = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in asked if n not in EXPERIMENTS]
    if bad or not asked:
        raise ValueError(f"--experiments={names!r}: unknown {bad or names!r}; allowed: {', '.join(EXPERIMENTS)} "
                         "(retired ones: docs/retired.md)")
    return [e for e in EXPERIMENTS.values() if e.name in asked]

