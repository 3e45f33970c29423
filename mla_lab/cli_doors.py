"""The CLI's doors: every O(1) check made before anything is priced, planned or written.

Each refusal is one :class:`DoorError` (a ``ValueError``) line naming the argument, the value and what is allowed
(exit 2): ranges (:data:`BOUNDS`), step counts, vLLM's ``max_num_batched_tokens >= max_num_seqs``
(``vllm/config/scheduler.py``), memory fit, paths. Nothing here writes a file; heavy imports are function-local.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path

__all__ = ["CLIError", "DoorError", "BOUNDS", "MAX_PRICED_STEPS", "MAX_SERVE_STEPS", "MAX_SERVE_TOTAL_STEPS",
           "MIN_NOISE_RUNS", "check_notebook", "MAX_GRID_POINTS", "MAX_REPORT_POINTS", "MAX_TP_BARS", "MAX_NOISE_STEPS",
           "VLLM_FLAGS", "arg_type", "budget_type", "check_sweep_serving", "fraction_type", "rate_type", "merge_flags",
           "check_sweep", "rel_path", "check_deployment", "check_strategies", "check_report_name", "file_in_the_way",
           "plan_without_writing", "GRID_KEYS", "check_sim_time", "acceptance_type", "deployment_options",
           "overlap_type", "range_help", "check_engine", "deployment_flags", "number_type"]


class CLIError(Exception):
    """A run failure or a bad file (exit 1), one line."""


class DoorError(ValueError):
    """One line: ``<argument>=<value> ...; allowed: ...``."""


#: ``name -> (lowest, highest, why the highest)``: every integer the CLI takes, its flag and its -p name.
BOUNDS = {
    "tp": (1, 1024, "no sparse-MLA model has more attention heads than 1024 to shard"),
    "max_num_batched_tokens": (1, 2**20, "2**20 = 1,048,576 tokens per step: above any served context "
                                         "(GLM-5 and DeepSeek-V3.2: <= 202,752)"),
    "prompt_len": (1, 2**20, "2**20 = 1,048,576 tokens: above the context of every model the lab knows "
                             "(GLM-5 and DeepSeek-V3.2: <= 202,752)"),
    "output_len": (1, 2**20, "2**20 tokens: above the context of every model the lab knows"),
    "num_prompts": (1, 100_000, "100x vllm bench serve's default of 1000; the simulation keeps one record per "
                                "request"),
    "concurrency": (1, 100_000, "at most num_prompts, itself at most 100,000"),
    "max_num_seqs": (1, 65_536, "256x vLLM's default of 256"),
    "num_runs": (1, 1000, "each run repeats every strategy; 1000 is past any useful interval"),
    "seed": (0, 2**32 - 1, "numpy's RandomState takes seeds in [0, 2**32 - 1]"),
    "timeout": (1, 7 * 86400, "one week per cell"),
    "shared_workspace_bytes": (0, 2**40, "1 TiB: above any GPU's memory"),
    "num_speculative_tokens": (0, 16, "MTP / EAGLE drafts per step; public runs use 1-5 (0: off)"),
    "dp_attention": (1, 1024, "SGLang --dp with --enable-dp-attention, a divisor of tp (1: off)"),
}
#: -p names holding a list of ints, and the bound each entry takes.
_LIST_BOUNDS = {"tp_sizes": "tp", "max_num_batched_tokens": "max_num_batched_tokens", "prompt_lens": "prompt_len"}
#: -p names holding one int (each bounded by its own entry of :data:`BOUNDS`).
_SCALAR_BOUNDS = ("num_prompts", "concurrency", "output_len", "max_num_seqs", "num_runs", "seed",
                  "shared_workspace_bytes")
#: The most prefill steps one sweep point or one advise call prices (the row builder prices every step of the
#: schedule for every strategy, ~1-2 ms each on a 2-core machine: 2048 steps ~ a minute for advise's candidates).
MAX_PRICED_STEPS = 2048
#: The most engine steps (prefill + decode) one serving strategy simulates (an upper bound, :func:`serve_step_bound`).
MAX_SERVE_STEPS = 50_000
#: The most request-steps (a request's prefill chunk or decode token in one step) one ``mla-lab serve`` simulates
#: over its strategies: measured on 2 cores, ~0.04-0.06 ms each plus ~1.5 s of imports (516,000: 31 s; 132,096:
#: 9.0 s), so <= ~14 s.
MAX_SERVE_TOTAL_STEPS = 200_000
#: ``--num-runs``: 1 or at least this many (below 20 runs the 2.5th and 97.5th percentiles are the min and max).
MIN_NOISE_RUNS = 20
#: The most request-steps of serve's noise runs (runs x strategies x request-steps; ~0.03 ms each, measured:
#: 330,240 in 11.6 s, 348,160 in 12.2 s): <= ~13 s.
MAX_NOISE_STEPS = 350_000
#: The longest simulated benchmark (num_prompts / request_rate, s): at 1e8 s a float64 ulp is 15 ns, so step times
#: and ITLs stay exact; at 1e12 s it is 0.12 ms, a step's parts (issue 39).
MAX_SIM_SECONDS = 1e8
#: The most points x strategies one sweep grid may hold, and the most entries one grid list may hold.
MAX_GRID_POINTS = 4096
MAX_LIST_LEN = 64
#: The most grid points one sweep's report draws, one frontier panel each (~0.4 s apiece on 2 cores; a 3,360-point
#: grid took 8 minutes, then failed).
MAX_REPORT_POINTS = 256
#: The most (model, TP) bars one row of the report's TP bar chart holds before its labels print over each other
#: (:func:`mla_lab.report.layout_check.label_overlaps`; measured: 2 models x 5 TP sizes overlap, 3 x 3 do not).
MAX_TP_BARS = 9
#: ``mla-lab sweep`` flags with vLLM's spellings -> sweep parameter (README "vLLM spellings").
VLLM_FLAGS = (("--tensor-parallel-size", "tp_sizes"), ("--max-num-batched-tokens", "max_num_batched_tokens"),
              ("--max-num-seqs", "max_num_seqs"), ("--kv-cache-dtype", "kv_cache_dtype"),
              ("--gpu-memory-utilization", "gpu_memory_utilization"), ("--num-prompts", "num_prompts"),
              ("--random-input-len", "prompt_lens"), ("--random-output-len", "output_len"),
              ("--max-concurrency", "concurrency"), ("--request-rate", "request_rate"))
#: vLLM's requirement on the engine limits (``vllm/config/scheduler.py``, ``SchedulerConfig._verify_args``).
VLLM_MBT_RULE = "vLLM requires max_num_batched_tokens >= max_num_seqs (vllm/config/scheduler.py)"
_REPORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def _short(v, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def check_bounded_int(name: str, value, label: str | None = None) -> int:
    """``value`` as an int within :data:`BOUNDS` ``[name]`` (DoorError naming ``label``, else ``name``, otherwise)."""
    lo, hi, why = BOUNDS[name]
    label = label or name
    if isinstance(value, bool) or not isinstance(value, int):
        raise DoorError(f"{label}={_short(value)} must be an int in [{lo}, {hi:,}]")
    if not lo <= value <= hi:
        raise DoorError(f"{label}={_short(value)} is out of range; allowed: {lo}..{hi:,} ({why})")
    return value


def _int(text) -> int:
    return int(str(text).strip().replace("_", ""), 10)


def number_type(ok, why: str, not_a_number: str = "is not a number", convert=float):
    """An argparse ``type=``: ``v = convert(text)`` with ``ok(v)``; else one line ``'<text>' <why>`` (``<not_a_number>``
    when ``convert`` raises)."""

    def parse(text: str):
        try:
            v = convert(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{_short(text)} {not_a_number}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"{_short(text)} {why}")
        return v

    return parse


def arg_type(name: str):
    """An argparse ``type=`` for an integer flag bounded by :data:`BOUNDS` ``[name]``."""
    lo, hi, why = BOUNDS[name]
    parse = number_type(lambda v: lo <= v <= hi, f"is out of range; allowed: {lo}..{hi:,} ({why})",
                        f"is not an integer; allowed: {lo}..{hi:,}", convert=_int)
    parse.bound = name  # which BOUNDS row it checks (the help-line test reads it)
    return parse


def budget_type(flag: str, integer: bool = False):
    """argparse ``type=`` for a memory budget: a finite number >= 0 (``integer``: a whole number, e.g. KV tokens)."""
    if integer:
        return number_type(lambda v: v >= 0, "must be >= 0 tokens (omit it: no limit)", "is not an integer; allowed: "
                           "a whole number of tokens >= 0 (omit it: no limit)", convert=_int)
    return number_type(lambda v: math.isfinite(v) and v >= 0, "must be a finite number >= 0 (omit it: no limit)")


#: ``--gpu-memory-utilization``, ``--acceptance-length`` (its upper bound ``num_speculative_tokens + 1`` is the
#: Deployment's door), ``--request-rate`` (requests/s or inf), ``--packed-overlap`` (its range [0, 1] is checked by
#: :func:`mla_lab.model.packed_kernel.packed_strategy`, whose one line the CLI prints).
fraction_type = number_type(lambda v: 0 < v <= 1, "is out of range; allowed: a number in (0, 1]")
acceptance_type = number_type(lambda v: 1 <= v <= BOUNDS["num_speculative_tokens"][1] + 1,
                              "is out of range; allowed: a number in [1, num_speculative_tokens + 1]")
rate_type = number_type(lambda v: v > 0, "must be > 0 requests/s, or inf (every request at t = 0)")
overlap_type = number_type(lambda v: True, "", "is not a number; allowed: a number in [0, 1] (the assumed pairwise "
                           "overlap of neighbouring tokens' top-k sets past the top-k)")


def deployment_options(args) -> dict:
    """``--num-speculative-tokens``, ``--acceptance-length``, ``--dp-attention`` as
    :meth:`mla_lab.deployment.Deployment.of` arguments (their cross-checks are the Deployment's). Raises DoorError for
    ``--acceptance-length`` without ``--num-speculative-tokens``.
    """
    k = getattr(args, "num_speculative_tokens", 0) or 0
    a = getattr(args, "acceptance_length", None)
    if a is not None and k == 0 and a != 1:
        raise DoorError(f"--acceptance-length={a!r} is given without --num-speculative-tokens; allowed: "
                        "--num-speculative-tokens k >= 1 with it (acceptance length in [1, k + 1])")
    return {"num_speculative_tokens": k, "acceptance_length": 1.0 if a is None else a,
            "dp_attention": getattr(args, "dp_attention", 1) or 1}


# ----------------------------------------------------------------------------------------------------- sweep
def merge_flags(params: dict, flags: dict) -> dict:
    """``params`` (-f / -p, any spelling) with the CLI's ``flags`` (``{sweep name: (flag, value)}``) added, names
    normalised. Raises DoorError for a flag and its -p/-f twin with different values, or a name under two spellings.
    """
    from .sweep.params import normalize_names

    out = normalize_names(params)
    for name, (flag, value) in flags.items():
        if name in out and _as_list(out[name]) != _as_list(value):
            raise DoorError(f"{flag} {_short(value)} conflicts with -p/-f {name}={_short(out[name])}; allowed: one "
                            "of the two, or the same value in both")
        out[name] = value
    return out


def _as_list(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def check_sweep(params: dict) -> None:
    """The sweep's cheap checks on normalised parameters (bounds, list lengths, grid size, steps per point, vLLM's
    engine rule, paths), then :func:`mla_lab.sweep.params.validate_params` and ``check_tp_sizes``; DoorError /
    ValueError, one line.
    """
    from .sweep.params import DEFAULTS, check_tp_sizes, validate_params

    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise DoorError(f"unknown sweep parameter(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    for name in _SCALAR_BOUNDS:
        if _is_int(params.get(name)):
            check_bounded_int(name, params[name])
    _check_grid_lists(params)
    for k in ("store_dir", "data_file", "report_dir"):
        v = params.get(k)
        if isinstance(v, str) and v:
            _check_path(k, v, folder=(k != "data_file"))
    checked = validate_params(params)
    check_tp_sizes(checked)
    _check_grid_size(checked)
    for mbt in checked.max_num_batched_tokens:
        if mbt < checked.max_num_seqs:
            raise DoorError(f"max_num_batched_tokens={mbt} is below max_num_seqs={checked.max_num_seqs}; allowed: "
                            f">= max_num_seqs ({VLLM_MBT_RULE})")
        for L in checked.prompt_lens:
            _check_steps(checked.num_prompts, L, mbt, "sweep point")
    check_sweep_serving(checked)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_grid_lists(params: dict) -> None:
    """The grid's lists before the sweep parses them: at most :data:`MAX_LIST_LEN` entries, integer entries within
    :data:`BOUNDS`, at most :data:`MAX_GRID_POINTS` combinations."""
    sizes = 1
    for name in ("models", "tp_sizes", "archs", "max_num_batched_tokens", "prompt_lens", "kv_cache_dtype",
                 "strategies"):
        v = params.get(name)
        if isinstance(v, (list, tuple)) and len(v) > MAX_LIST_LEN:
            raise DoorError(f"{name} holds {len(v)} entries; allowed: at most {MAX_LIST_LEN}")
        values = v if isinstance(v, (list, tuple)) else [v]
        sizes *= max(len(values), 1)
        label = f"{name} entry" if isinstance(v, (list, tuple)) else name
        for x in values if name in _LIST_BOUNDS else ():
            if _is_int(x):
                check_bounded_int(_LIST_BOUNDS[name], x, label)
    if sizes > MAX_GRID_POINTS:
        raise DoorError(f"the grid spans {sizes:,} points; allowed: at most {MAX_GRID_POINTS:,} per sweep (split it)")


def _check_grid_size(checked) -> None:
    """At most :data:`MAX_REPORT_POINTS` report panels and :data:`MAX_TP_BARS` bars per row of the TP chart."""
    points = math.prod(len(getattr(checked, k)) for k in ("models", "tp_sizes", "archs", "max_num_batched_tokens",
                                                          "prompt_lens", "kv_cache_dtype"))
    if points > MAX_REPORT_POINTS:
        raise DoorError(f"the grid spans {points:,} points (models x tp_sizes x archs x max_num_batched_tokens x "
                        f"prompt_lens x kv_cache_dtype); allowed: at most {MAX_REPORT_POINTS} per sweep, one report "
                        "panel each (split it)")
    bars = len(checked.models) * len(checked.tp_sizes)
    if len(checked.models) > 1 and bars > MAX_TP_BARS:
        raise DoorError(f"models x tp_sizes = {len(checked.models)} x {len(checked.tp_sizes)} = {bars} bars per row of "
                        f"the report's TP chart; allowed: at most {MAX_TP_BARS} (fewer TP sizes, or one model per "
                        "sweep)")


def check_sweep_serving(checked) -> None:
    """``mla-lab serve``'s bound (:data:`MAX_SERVE_TOTAL_STEPS` request-steps) for every simulation the sweep's report
    runs (every engine preset and the baseline) on the grid's costliest prompt length and max_num_batched_tokens
    (DoorError naming num_prompts, output_len and the prompt length).
    """
    from .placement import BASELINE, PRESETS, expand_strategies

    check_sim_time(checked.num_prompts, checked.request_rate, "request_rate")
    n_strat = len(set(expand_strategies(list(PRESETS))) | {BASELINE})
    L, mbt = max(((L, T) for L in checked.prompt_lens for T in checked.max_num_batched_tokens),
                 key=lambda lt: math.ceil(lt[0] / lt[1]))
    work = checked.num_prompts * (2 * math.ceil(L / mbt) + checked.output_len)
    if work * n_strat > MAX_SERVE_TOTAL_STEPS:
        raise DoorError(f"num_prompts={checked.num_prompts} x (2 x ceil(prompt_len {L} / max_num_batched_tokens {mbt}) "
                        f"+ output_len={checked.output_len}) x {n_strat} strategies is {work * n_strat:,} request-steps "
                        f"for the report's serving simulation; allowed: at most {MAX_SERVE_TOTAL_STEPS:,}, the bound "
                        "of 'mla-lab serve' (fewer prompts or output tokens)")


def check_sim_time(num_prompts: int, request_rate: float, label: str) -> None:
    """``num_prompts / request_rate`` <= :data:`MAX_SIM_SECONDS` simulated seconds, else DoorError naming ``label``."""
    request_rate = float(request_rate)  # the sweep's parameter is 'inf' or a number
    if math.isinf(request_rate) or num_prompts / request_rate <= MAX_SIM_SECONDS:
        return
    raise DoorError(f"{label}={request_rate:g} req/s spreads {num_prompts} prompts over ~{num_prompts / request_rate:.3g} "
                    f"simulated seconds; allowed: >= {num_prompts / MAX_SIM_SECONDS:.3g} req/s (a benchmark of at "
                    f"most {MAX_SIM_SECONDS:.0e} s, where float64 timestamps keep step times exact), or inf")


def _check_steps(num_prompts: int, prompt_len: int, mbt: int, what: str) -> None:
    steps = math.ceil(num_prompts * prompt_len / mbt)
    if steps > MAX_PRICED_STEPS:
        raise DoorError(f"num_prompts={num_prompts} x prompt_len={prompt_len} at max_num_batched_tokens={mbt} is "
                        f"{steps:,} prefill steps to price per strategy for one {what}; allowed: at most "
                        f"{MAX_PRICED_STEPS:,} (fewer prompts, shorter prompts or a larger max_num_batched_tokens)")


def file_in_the_way(path: str | Path) -> Path | None:
    """The path itself or its nearest existing ancestor when that is a file (so no folder can be made there)."""
    p = Path(path).expanduser().absolute()
    for q in [p, *p.parents]:
        if q.exists():
            return q if not q.is_dir() else None
    return None


def _check_path(name: str, value: str, folder: bool) -> None:
    p = Path(value)
    if "\x00" in value:
        raise DoorError(f"{name}={_short(value)} holds a NUL byte; allowed: a path")
    from .paths import committed_data_folder, special_filesystem

    fs = special_filesystem(value)  # /proc, /sys, /dev: the run would fail late
    if fs:
        raise DoorError(f"{name}={_short(str(value))} is on the {fs} filesystem (kernel or device files, not a place "
                        "for results); allowed: a path on an ordinary disk")
    home = p if folder else p.parent
    if committed_data_folder(home, direct=not folder):
        raise DoorError(f"{name}={_short(value)} is in a committed data folder (git tracks the files there); the lab "
                        "never writes its outputs there, --overwrite or not; allowed: a path outside it, e.g. the "
                        "default")
    blocker = file_in_the_way(home)
    if blocker is not None:
        where = "is a file" if blocker == home.expanduser().absolute() else f"lies under {blocker}, a file"
        raise DoorError(f"{name}={value!r} {where}; allowed: a folder (created when the run starts)"
                        if folder else f"{name}={value!r}: its folder {where}; allowed: a path in a folder")
    target = p.expanduser().absolute()
    if not folder and target.is_dir():
        raise DoorError(f"{name}={value!r} is a directory; give a file path such as "
                        f"{str(Path(value) / 'padding_sweep.csv')!r}")
    if not folder and target.exists() and (not target.is_file() or not os.access(target, os.W_OK)):
        raise DoorError(f"{name}={value!r} is not a writable regular file; allowed: a writable file or a new path in "
                        "a writable folder")
    near = next((q for q in [target, *target.parents] if q.exists()), None)
    if near is not None and near.is_dir() and not (near == target and not folder) and \
            not os.access(near, os.W_OK | os.X_OK):
        raise DoorError(f"{name}={value!r}: {near} is not writable; allowed: a path in a folder the lab can write")


def check_report_name(name: str) -> str:
    """``--report-name``: a basename of letters, digits, ``.``, ``_``, ``-``, no folder (else DoorError)."""
    if not isinstance(name, str) or not _REPORT_NAME.match(name) or name.endswith((".html", ".ipynb")):
        raise DoorError(f"--report-name={_short(name)} is not allowed; allowed: a basename of letters, digits, '.', "
                        "'_' and '-' (at most 100, no folder, no extension), e.g. padding_sweep")
    return name


def plan_without_writing(params: dict) -> dict:
    """:func:`mla_lab.sweep.run.plan_sweep` of ``params`` creating nothing: a store that does not exist yet is planned
    in a temporary one (``stored`` 0), reported at its real path. ValueError as ``check_output_file``, ``plan_sweep``.
    """
    import dataclasses
    import tempfile

    from .paths import resolve
    from .sweep.executors import resolve_device
    from .sweep.params import validate_params
    from .sweep.run import check_not_locked, check_output_file, plan_sweep

    checked = validate_params(params)
    if checked.device == "cuda":
        resolve_device(checked.device)
    check_output_file(checked.data_file, checked.overwrite, checked, create=False)  # nothing is made
    check_not_locked(checked.data_file)  # another sweep writing it: the run would be refused
    store = resolve(checked.store_dir)
    if store.is_dir():
        plan = plan_sweep(checked)
    else:
        with tempfile.TemporaryDirectory(prefix="mla-lab-dry-run-") as tmp:
            plan = plan_sweep(dataclasses.replace(checked, store_dir=str(Path(tmp) / "store")))
        plan["store_dir"] = str(store)
        plan["store_exists"] = False
    plan["params"] = dataclasses.asdict(checked)  # every parameter the run would get, after validation
    return plan


#: Sweep parameters that make a sweep's results what they are (the main report of one grid is not replaced by another
#: grid's without --overwrite); paths, force, the executor and the device do not.
GRID_KEYS = ("models", "tp_sizes", "archs", "max_num_batched_tokens", "prompt_lens", "kv_cache_dtype", "num_prompts",
             "concurrency", "strategies", "weight_dtype", "moe_parallel", "shared_workspace_bytes",
             "gpu_memory_utilization", "output_len", "max_num_seqs", "request_rate", "seed")


# ----------------------------------------------------------------------------------------------------- advise/serve
def check_strategies(names) -> list[str]:
    """Canonical names of ``names`` (presets, aliases, canonical strategies); DoorError for an unknown one."""
    from .placement import ALIASES, ENGINE_PRESETS, PRESETS, canonical_names, expand_strategies

    out = []
    for n in names:
        try:
            out += expand_strategies([n])
        except ValueError:
            raise DoorError(f"--strategies holds {_short(n)}; allowed: presets {list(PRESETS)}, engine presets "
                            f"{list(ENGINE_PRESETS)}, aliases {list(ALIASES)} or canonical strategies "
                            f"{canonical_names()}") from None
    return list(dict.fromkeys(out))


def check_deployment(args, workload_in_flight: bool = True) -> tuple:
    """O(1) checks of the deployment of ``advise`` / ``serve``'s ``args`` (:func:`deployment_flags`, ``prompt_len``,
    ``num_prompts``, ``concurrency``; ``output_len``, ``max_num_seqs`` where given) before any step is priced:
    :meth:`mla_lab.deployment.Deployment.of`, vLLM's engine rule, the step bound, whether the weights and KV tokens
    fit (:func:`mla_lab.model.memory.memory_tradeoff`). Returns ``(deployment, memory_tradeoff's result)``.
    ``workload_in_flight``: ``concurrency x prompt_len`` tokens must fit at once (advise); False (serve): one request.
    DoorError / ValueError: one line.
    """
    from .deployment import Deployment
    from .model.memory import memory_tradeoff
    from .placement import BASELINE

    num_prompts, prompt_len, output_len = args.num_prompts, args.prompt_len, getattr(args, "output_len", 0)
    conc = args.concurrency if args.concurrency is not None else num_prompts
    if conc > num_prompts:
        raise DoorError(f"concurrency={conc} exceeds num_prompts={num_prompts}; allowed: 1..{num_prompts} or omit it "
                        "(= num_prompts)")
    seqs = getattr(args, "max_num_seqs", None)
    dep = Deployment.of(**{k: getattr(args, k) for k in ("model", "tp", "arch", "max_num_batched_tokens",
                                                         "kv_cache_dtype", "weight_dtype", "moe_parallel",
                                                         "gpu_memory_utilization")},
                        prompt_len=prompt_len, num_prompts=num_prompts, concurrency=conc, output_len=max(output_len, 1),
                        **({} if seqs is None else {"max_num_seqs": seqs}),  # vLLM's rule: there
                        **deployment_options(args))
    if workload_in_flight:
        _check_steps(num_prompts, prompt_len, args.max_num_batched_tokens, "deployment")
    mem = memory_tradeoff(dep, strategies=[BASELINE])
    cap = mem["kv_capacity_tokens"]
    where = f"{dep.model.name} TP{dep.tp} {dep.arch.name} ({dep.weight_dtype} weights, experts {dep.moe_parallel})"
    if not cap > 0:
        total = float(mem.get("total_memory_bytes") or 0)
        ways = ["a larger TP", *(["fp8 weights"] if dep.weight_dtype != "fp8" else []),
                *(["a higher --gpu-memory-utilization"]  # more of the GPU can help only then
                  if dep.gpu_memory_utilization < 1 and mem["weights_bytes"] < total else [])]
        raise DoorError(f"this deployment does not fit: {where}: weights "
                        f"({mem['weights_bytes'] / 2**30:.1f} GiB per rank; the GPU has {total / 2**30:.1f} GiB) and "
                        f"activations leave no KV cache at gpu_memory_utilization {dep.gpu_memory_utilization}; "
                        f"allowed: a deployment whose weights fit ({', '.join(ways)})")
    need = conc * prompt_len if workload_in_flight else prompt_len + output_len
    if need > cap:
        if workload_in_flight:
            raise DoorError(f"this deployment does not fit advise's TTFT model, which holds every prompt's KV in "
                            f"flight at once: {where}: the workload needs {need:,} KV tokens in flight (concurrency "
                            f"{conc} x {prompt_len}); KV capacity {int(cap):,} tokens; allowed: fewer tokens in flight "
                            "(--concurrency, --prompt-len), a larger TP or a higher --gpu-memory-utilization; "
                            "'mla-lab serve' (the vllm bench serve simulation) queues the requests vLLM cannot hold "
                            "and runs this workload")
        raise DoorError(f"this deployment does not fit: {where}: one request needs {need:,} KV tokens "
                        f"({prompt_len} + {output_len}); KV capacity {int(cap):,} tokens; allowed: shorter requests, "
                        "a larger TP or a higher --gpu-memory-utilization")
    return dep, mem


# ----------------------------------------------------------------------------------------------------- files
def check_notebook(path: str) -> Path:
    """``--notebook``: an existing ``.ipynb`` of notebook JSON with a cell tagged ``parameters``, read with :mod:`json`
    (``sweep --dry-run`` stays fast). DoorError: empty, missing, not a file, not ``.ipynb``, not JSON, no such cell.
    """
    import json

    allowed = "allowed: a Jupyter notebook (.ipynb) with a cell tagged 'parameters', e.g. notebooks/padding_sweep.ipynb"
    if not isinstance(path, str) or not path.strip():
        raise DoorError(f"--notebook={_short(path)} is empty; {allowed}")
    p = Path(path).expanduser()
    for bad, what in ((not p.exists(), ": no such file"), (not p.is_file(), " is not a regular file"),
                      (p.suffix != ".ipynb", " is not a .ipynb file")):
        if bad:
            raise DoorError(f"--notebook={path!r}{what}; {allowed}")
    try:
        nb = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DoorError(f"--notebook={path!r} is not readable notebook JSON ({type(e).__name__}); {allowed}") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise DoorError(f"--notebook={path!r} holds no 'cells' list (not a notebook); {allowed}")
    if not any(isinstance(c, dict) and "parameters" in ((c.get("metadata") or {}).get("tags") or []) for c in cells):
        raise DoorError(f"--notebook={path!r} has no cell tagged 'parameters' (papermill could not inject the "
                        f"sweep's parameters); {allowed}")
    return p


def rel_path(p) -> str:
    """``p`` relative to the working folder when it lies inside it (for the one-line messages), else as given."""
    try:
        return str(Path(p).relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def range_help(name: str) -> str:
    """``lo..hi`` of :data:`BOUNDS` ``[name]``, for a flag's help."""
    lo, hi, _ = BOUNDS[name]
    return f"{lo}..{hi:,}"


def check_engine(engine) -> None:
    """One line naming --engine, the value and the allowed values (DoorError), before anything is priced."""
    if engine is None:
        return
    from .placement import resolve_engine

    try:
        resolve_engine(engine)
    except ValueError as e:
        raise DoorError(str(e)) from None


def deployment_flags(p, tp_flags) -> None:
    """The deployment flags ``advise`` and ``serve`` share, on parser ``p`` (``tp_flags``: the tensor-parallel spellings)."""
    B = arg_type
    p.add_argument("--model", default="glm-5", help="a model the lab knows, e.g. glm-5 or deepseek-v3.2 (default "
                                                   "glm-5; an unknown name lists them)")
    p.add_argument(*tp_flags, dest="tp", metavar=tp_flags[0][2:].upper().replace("-", "_"), type=B("tp"), default=8,
                   help=f"tensor-parallel size (GPUs), {range_help('tp')}, dividing the model's num_heads (default 8)")
    p.add_argument("--arch", default="h200", help="GPU, e.g. h200 (sm90) or b200 (sm100) (default h200; an unknown "
                                                 "name lists them)")
    p.add_argument("--max-num-batched-tokens", type=B("max_num_batched_tokens"), default=16384,
                   help=f"vLLM's token budget per engine step, {range_help('max_num_batched_tokens')}, >= max_num_seqs "
                        "(default 16384)")
    p.add_argument("--kv-cache-dtype", default="bf16", help="KV-cache dtype, e.g. bf16 or fp8_ds_mla (default bf16; "
                                                           "an unknown one lists them)")
    p.add_argument("--weight-dtype", default="fp8", choices=["fp8", "bf16"], help="weight dtype: fp8 or bf16 "
                                                                                  "(default fp8)")
    p.add_argument("--moe-parallel", default="ep", choices=["ep", "tp"],
                   help="how the experts are split: ep (expert parallel) or tp (default ep)")
    p.add_argument("--gpu-memory-utilization", type=fraction_type, default=0.9,
                   help="vLLM's fraction of GPU memory for weights, activations and KV cache, in (0, 1] "
                        "(default 0.9)")
    p.add_argument("--num-speculative-tokens", type=B("num_speculative_tokens"), default=0,
                   help="MTP / EAGLE draft tokens per step (vLLM --speculative-config num_speculative_tokens), "
                        f"{range_help('num_speculative_tokens')} (default 0: off; modelled)")
    p.add_argument("--acceptance-length", type=acceptance_type, default=None,
                   help="mean tokens accepted per request per step, the bonus token included: an input, in "
                        "[1, num_speculative_tokens + 1] (default 1)")
    p.add_argument("--dp-attention", type=B("dp_attention"), default=1,
                   help="SGLang --dp N --enable-dp-attention: attention data-parallel over N ranks (all heads of "
                        f"the group per rank, KV per rank), MoE over all GPUs; {range_help('dp_attention')}, a divisor "
                        "of tp (default 1: off; modelled)")
