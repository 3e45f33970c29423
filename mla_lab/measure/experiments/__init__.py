"""The lab's measurement suite: one registry of experiments (:data:`EXPERIMENTS`) and one table of the calibration
files fitted on their rows (:data:`CALIBRATION`).

Each experiment is a module run as a fresh process (``python -m <module> ...``); the module holds its shapes
(``SHAPES``: what it measures at its defaults), its rows (``OUTPUTS``: file name -> row columns, before the
provenance columns) and its provenance (``PROVENANCE``: the columns every row carries: GPU, driver, torch, triton,
flash_mla, commit). ``mla-lab measure`` runs the chosen experiments (:mod:`.runner`): a between-process experiment
once per fresh process (``--processes N``, default 5: the between-process spread of
:mod:`mla_lab.measure.spread`), the others once, into ``data/measured/<gpu>/`` (``<gpu>``: :func:`.runner.gpu_slug`).

The registry names modules by their import path and imports one only when asked (:meth:`Experiment.module_obj`):
``mla-lab --help`` loads no torch, and two experiments live above this layer (``padding_sweep`` in
:mod:`mla_lab.sweep`, which this package may not import).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

#: The registry's own arguments in an experiment's command line: ``{out}`` (its output folder for this process),
#: ``{process}`` (1..N), ``{engine_root}`` (``--engine-root`` of ``mla-lab measure``: the packed engine kernels).
PLACEHOLDERS = ("{out}", "{process}", "{engine_root}")


@dataclass(frozen=True)
class Experiment:
    """One experiment of the suite.

    ``module``: its ``python -m`` target; ``folder``: where its files go under ``data/measured/<gpu>/`` ("" = the
    GPU's folder itself); ``between_process``: run once per fresh process (rows carry ``process``) rather than once;
    ``argv``: its command line after the module (placeholders :data:`PLACEHOLDERS`); ``default``: run by
    ``mla-lab measure`` without ``--experiments``; ``timeout_s``: per process; ``needs``: what the GPU machine must
    have beyond torch + triton (said by ``--dry-run``); ``replaces``: the script it replaced (history); ``files``: the
    module's output files this command line writes (default: all of ``OUTPUTS``)."""

    name: str
    module: str
    summary: str
    folder: str
    between_process: bool
    argv: tuple[str, ...] = ("--out", "{out}", "--process", "{process}")
    default: bool = False
    timeout_s: int = 300
    needs: str = "flash_mla"
    replaces: str = ""
    files: tuple[str, ...] = ()

    def module_obj(self):
        """The experiment's module (imported now: torch and the package's kernels load)."""
        return importlib.import_module(self.module)

    def outputs(self) -> dict[str, list[str]]:
        """File name -> row columns (provenance columns follow them in every file); ``files``, where given, the
        module's files this command line writes (a module with several method sets writes one per run)."""
        out = dict(self.module_obj().OUTPUTS)
        return {f: out[f] for f in self.files} if self.files else out

    def shapes(self) -> list:
        """The shapes it measures at its defaults (one tuple each)."""
        return list(self.module_obj().SHAPES)

    def provenance(self) -> tuple[str, ...]:
        return tuple(self.module_obj().PROVENANCE)

    def command(self, out: str, process: int, engine_root: str = ".engine") -> list[str]:
        """``[python -m module, *argv]`` with the placeholders filled (``python`` is the caller's)."""
        fill = {"{out}": str(out), "{process}": str(process), "{engine_root}": str(engine_root)}
        args = []
        for a in self.argv:
            for k, v in fill.items():
                a = a.replace(k, v)
            args.append(a)
        return ["-m", self.module, *args]


_E = "mla_lab.measure.experiments."
_BP = "between_process"
EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    # --- between-process (>= 5 fresh processes): data/measured/<gpu>/between_process/
    Experiment("cold_start", _E + "cold_start", "first calls vs steady state in a fresh process; step spread", _BP,
               True, default=True, timeout_s=150, replaces="benchmarks/round3.py --parts cold"),
    Experiment("presets", _E + "presets", "attention path per engine preset (seed and full topk)", _BP, True,
               default=True, timeout_s=200, replaces="benchmarks/round3.py --parts presets"),
    Experiment("subgraph", _E + "subgraph", "sub-chunk loops eager / one CUDA graph / two streams", _BP, True,
               default=True, timeout_s=200, replaces="benchmarks/round3.py --parts subgraph"),
    Experiment("routes", _E + "routes_step", "attention route per prompt length: padded sparse MQA vs dense MHA",
               _BP, True, default=True, timeout_s=300, replaces="benchmarks/round3.py --parts routes"),
    Experiment("moe_decode", _E + "moe_decode", "routed experts at decode sizes (bf16 / fp8 grouped GEMMs)", _BP,
               True, default=True, timeout_s=150, needs="", replaces="benchmarks/round3.py --parts moe_decode"),
    Experiment("content_step", _E + "content_step", "padded-head content over a 78-layer step (zeros vs stale)",
               _BP, True, default=True, timeout_s=300, replaces="benchmarks/round3.py --parts content"),
    Experiment("attention_strategies", _E + "attention_strategies", "named strategies' attention path", _BP, True,
               timeout_s=200, replaces="benchmarks/round3.py --parts strategies"),
    Experiment("concat_ceiling", _E + "concat_ceiling", "concat vs contiguous / strided copy of the same bytes",
               _BP, True, timeout_s=150, needs="", replaces="benchmarks/round3.py --parts concat_ceiling"),
    Experiment("concat", _E + "concat_variants", "concat kernel variants, cache hints, host launch (set round4)",
               _BP, True, ("--set", "round4", "--rounds", "5", "--rep", "50", "--host-calls", "1000", "--out",
                           "{out}"), default=True, timeout_s=150, needs="",
               replaces="benchmarks/bench_concat_round3.py", files=("concat_round4.csv",)),
    Experiment("fused_bmm", _E + "fused_bmm", "W_UK bmm writing into the padded workspace vs bmm + concat", _BP,
               True, ("--out", "{out}"), default=True, timeout_s=90, needs="",
               replaces="benchmarks/bench_fused_bmm.py"),
    Experiment("first_token", _E + "first_token", "first calls at new shapes (cold Triton JIT) and allocator growth "
               "from an empty cache to the step's peak (issue 37)", _BP, True,
               ("--out", "{out}", "--process", "{process}"), timeout_s=200, needs=""),
    Experiment("engine_kernels", _E + "engine_kernels",
               "the engines' own sparse-MLA kernels: prefill, decode sizes, gather vs MMA, concat_mla_q", _BP, True,
               ("--engine-root", "{engine_root}", "--process", "{process}", "--out", "{out}/engine_kernels.csv"),
               timeout_s=300, needs="engine kernels packed by python -m mla_lab.measure.engine_libs pack "
               "(--engine-root); flash_mla"),
    Experiment("packed_kernels", _E + "packed_kernels",
               "the packed kernel (8 tokens x 8 heads per tile) beside every engine's kernel, over union size", _BP,
               True, ("--engine-root", "{engine_root}", "--process", "{process}", "--out", "{out}"), timeout_s=420,
               needs="engine kernels packed by python -m mla_lab.measure.engine_libs pack (--engine-root); flash_mla; "
               "nvcc for the CUDA union builder (else the Triton one)"),
    # --- once: data/measured/<gpu>/ and its round2/ folder
    Experiment("padding_sweep", "mla_lab.sweep.measured",
               "the measured sweep: every real strategy's attention path per grid point, the rest modelled", "",
               False, ("--out", "{out}/padding_sweep.csv"), timeout_s=420, replaces="benchmarks/measured_sweep.py"),
    Experiment("attention_path", _E + "attention_path", "attention path per strategy x model x TP x T; NaN check",
               "", False, ("--out", "{out}/attention_path.csv"), timeout_s=420,
               replaces="benchmarks/bench_attention.py"),
    Experiment("layer_calibration", _E + "layer_calibration",
               "every op of the layer model at its per-rank shape, the layer end to end, the fit (h200_ops.csv)", "",
               False, ("--out", "{out}"), timeout_s=600, replaces="benchmarks/bench_layer.py"),
    Experiment("concat_sweep", _E + "concat_sweep", "the concat into the padded workspace over T x H, tuning", "",
               False, ("--out", "{out}/concat_bench.csv"), timeout_s=420, needs="",
               replaces="benchmarks/bench_concat.py"),
    Experiment("routes_sweep", _E + "routes_sweep", "route ops beside the lab's model of them", "", False,
               ("--out", "{out}/routes_sweep.csv"), timeout_s=300, replaces="benchmarks/bench_routes.py"),
    Experiment("engines", _E + "engines", "content factor, engine presets, sub-chunking, NaN check", "round2",
               False, ("--out", "{out}"), timeout_s=480, replaces="benchmarks/bench_engines.py"),
    Experiment("decode_layer", _E + "decode_layer", "per-rank decode / mixed layer, attention path, per op",
               "round2", False, ("--out", "{out}"), timeout_s=300, replaces="benchmarks/bench_decode.py"),
    Experiment("tp_block", _E + "tp_block", "attention and MoE blocks sharded over TP GPUs vs the one-GPU share",
               "", False, ("--tp", "8", "--runs", "sim", "--out", "{out}"), timeout_s=450,
               replaces="benchmarks/tp_block.py"),
)}


@dataclass(frozen=True)
class Fit:
    """How one calibration file is produced: ``inputs`` (committed measured files, relative to ``data/measured``,
    or a description), ``experiments`` (the registry's names that measure them), ``function`` (``module:function``
    that writes it; run as ``python -m <module>``)."""

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
                                   "mla_lab.model.decode_kernels:main (--write)"),
    "h200_packed.csv": Fit((_H + "packed_kernels.csv",), ("packed_kernels",),
                           "mla_lab.model.packed_kernel:main (--write)"),
}


def resolve(names: str | None) -> list[Experiment]:
    """The experiments named in ``names`` (comma separated; None or "" = the defaults), in registry order.
    Raises ValueError naming the unknown ones and the allowed names."""
    if not names:
        return [e for e in EXPERIMENTS.values() if e.default]
    asked = [n.strip() for n in names.split(",") if n.strip()]
    bad = [n for n in asked if n not in EXPERIMENTS]
    if bad or not asked:
        raise ValueError(f"--experiments={names!r}: unknown {bad or names!r}; allowed: {', '.join(EXPERIMENTS)}")
    return [e for e in EXPERIMENTS.values() if e.name in asked]
