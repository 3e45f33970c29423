"""``mla-lab`` command line: run the papermill-parameterized sweep notebook and publish it as HTML.

    mla-lab sweep [-f params.yaml] [-p name value ...] [--notebook PATH] [--report-name NAME] [--timeout S]
    mla-lab advise [--model M --tp N --arch A --max-num-batched-tokens T --prompt-len L --memory-budget-mib X]
    mla-lab serve [--model M --tensor-parallel-size N --random-input-len L --num-prompts P ... --json]
    mla-lab index [--report-dir DIR]
    mla-lab check-report [HTML ...]     (headless Chromium: figures loaded and not blank, no JavaScript error)

Every door refuses bad input in one line (``mla-lab: error: <argument>=<value> ...; allowed: ...``, exit 2) before
anything is priced or written: the cheap checks (:mod:`mla_lab.cli_doors`: integer ranges with stated upper bounds,
the number of engine steps a run would price, weights and the workload's KV tokens) come first. Parameters are
validated before any kernel starts (unknown names, wrong types, empty grids are errors: papermill itself would
silently inject them). ``-p`` values are parsed as YAML (``-p tp_sizes "[1, 8]"``, ``-p force true``). Every sweep
run publishes its own report under ``<report_dir>/runs/`` and refreshes the latest copy
(``<report_dir>/<report-name>.html``) and the index (``<report_dir>/index.html``); layout in :mod:`mla_lab.report.site`.

Imports are lazy: ``mla-lab --help`` and ``mla-lab sweep --dry-run`` load neither torch nor pandas (README
"Command timings").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from . import cli_doors as doors
from . import cli_engines, cli_measure, cli_report, cli_serve
from .cli_doors import CLIError, DoorError, rel_path
from .placement import SERVE_PRESETS

LAB_EXTRA_HINT = "pip install -e '.[lab]' (papermill, nbconvert, matplotlib, ipykernel)"
# Injected by the CLI, not sweep parameters (a user passing them gets the unknown-parameter error).
CLI_PARAMETERS = ("figure_dir", "run_id")
#: The main report's basename (``make report``): replaced only by a sweep of its grid or with --overwrite.
DEFAULT_REPORT_NAME = "padding_sweep"
#: ``mla-lab sweep`` flags with vLLM's spellings -> sweep parameter (README "vLLM spellings").
VLLM_FLAGS = doors.VLLM_FLAGS


def _default_notebook() -> Path:
    from .paths import notebooks_dir

    return notebooks_dir() / "padding_sweep.ipynb"




class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``mla-lab: error: <what>; see mla-lab <cmd> --help`` (exit 2)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        msg = " ".join(str(message).split())
        self.exit(2, f"mla-lab: error: {msg} (see {self.prog} --help)\n")


# ----------------------------------------------------------------------------------------------------- sweep
#: The largest ``-f`` file and ``-p`` value read (bytes): the default grid's YAML is ~0.5 KB, a full one a few KB.
MAX_PARAM_BYTES = 64 * 1024
#: The deepest nesting a parameter file may have: a parameter is a value or a list (a mapping of them at the top).
MAX_PARAM_DEPTH = 16


def _yaml_load(text: str, where: str):
    """``text`` parsed as YAML without anchors or aliases (an alias bomb of 491 bytes expands to 10**8 nodes the
    moment anything formats it, issue 39): a parameter file has no use for them.

    Raises:
        DoorError: an anchor or alias in ``text`` (``where`` names the file or the ``-p`` name); yaml.YAMLError
        for text that is not YAML.
    """
    import yaml

    class _NoAliasLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise DoorError(f"{where}: holds a YAML anchor or alias (line {event.start_mark.line + 1}); "
                                "allowed: plain YAML values, each written out")
            self.depth += 1
            if self.depth > MAX_PARAM_DEPTH:
                raise DoorError(f"{where}: nests values more than {MAX_PARAM_DEPTH} levels deep (line "
                                f"{event.start_mark.line + 1}); allowed: a parameter is a value or a list of values")
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass


def _load_params(files: list[str], pairs: list[list[str]]) -> dict:
    import yaml

    raw: dict = {}
    for f in files or []:
        raw.update(_load_param_file(f))
    for name, value in pairs or []:
        if len(value) > MAX_PARAM_BYTES:
            raise DoorError(f"-p {name}: a value of {len(value):,} characters; allowed: at most {MAX_PARAM_BYTES:,}")
        try:
            raw[name] = _yaml_load(value, f"-p {name}")
        except yaml.YAMLError as e:
            raise DoorError(f"-p {name} {value!r}: not a valid YAML value: {' '.join(str(e).split())}") from None
    return raw


def _load_param_file(f: str) -> dict:
    """One ``-f`` file: a regular UTF-8 file of at most :data:`MAX_PARAM_BYTES` holding a YAML mapping.

    Raises:
        DoorError: one line naming the file.
    """
    import yaml

    path = Path(f)
    if not path.exists():
        raise DoorError(f"-f {f}: no such file; allowed: a YAML file of sweep parameters")
    if not path.is_file():
        raise DoorError(f"-f {f!r} is not a regular file (a device, a folder or a pipe holds no parameters); "
                        "allowed: a YAML file mapping sweep parameter names to values")
    if path.stat().st_size > MAX_PARAM_BYTES:
        raise DoorError(f"-f {f}: {path.stat().st_size:,} bytes; allowed: a YAML file of sweep parameters of at "
                        f"most {MAX_PARAM_BYTES:,} bytes")
    try:
        data = _yaml_load(path.read_text(), f"-f {f}")
    except UnicodeDecodeError:
        raise DoorError(f"-f {f}: not a text file; allowed: a UTF-8 YAML mapping of parameter names") from None
    except yaml.YAMLError as e:
        raise DoorError(f"-f {f}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        raise DoorError(f"-f {f!r} is empty (no YAML mapping in it); allowed: a YAML file mapping sweep "
                        "parameter names to values, e.g. 'tp_sizes: [8]'")
    if not isinstance(data, dict):
        raise DoorError(f"-f {f}: must hold a mapping of parameter names to values, got {type(data).__name__}")
    return data


def _resolve(p: str, cwd: Path) -> Path:
    path = Path(p)
    return path if path.is_absolute() else cwd / path


def _require_lab_extra() -> None:
    """One line naming the extra to install when the notebook toolchain is missing.

    Raises:
        CLIError: papermill, nbformat, nbconvert or matplotlib does not import.
    """
    import importlib.util

    missing = [m for m in ("papermill", "nbformat", "nbconvert", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise CLIError(f"mla-lab sweep needs the 'lab' extra ({', '.join(missing)} not installed): {LAB_EXTRA_HINT}")


def _check_notebook(notebook: Path) -> None:
    import nbformat

    if not notebook.is_file():
        raise CLIError(f"--notebook {notebook}: no such notebook")
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception as e:  # nbformat raises several types for a file that is not a notebook
        raise CLIError(f"--notebook {notebook}: not a readable .ipynb ({type(e).__name__}); allowed: a Jupyter "
                       "notebook with a cell tagged 'parameters'") from None
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        raise CLIError(f"notebook {notebook} has no cell tagged 'parameters'; papermill cannot inject parameters")


def _kernel_manager_logging_to(log_path: Path):
    """An ``AsyncKernelManager`` whose kernel writes its own stderr (ipykernel's ``[IPKernelApp]`` warnings, a
    ZMQError when Ctrl-C closes the sockets under it) to ``log_path`` instead of the terminal; the notebook's output
    (the sweep's progress) still reaches the terminal through papermill's ``stderr_file``."""
    from jupyter_client import AsyncKernelManager

    class _KernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd, **kw):
            kw["stderr"] = open(log_path, "ab")  # noqa: SIM115 - the kernel process holds it; closed with it
            return await super()._async_launch_kernel(kernel_cmd, **kw)

    return _KernelManager


def publish(params: dict, notebook: Path, report_name: str, timeout: int, cwd: Path) -> dict:
    """Execute ``notebook`` with papermill (kernel ``mla-lab``, this interpreter, per-cell ``timeout`` seconds) as a
    new run, export it to HTML with inputs hidden, and publish it: the run's own files under
    ``<report_dir>/runs/<run_id>.*``, the latest copy ``<report_dir>/<report_name>.html`` and the index.

    ``params`` must have passed :func:`mla_lab.cli_doors.check_sweep` (the CLI does it first); papermill's progress
    bar is on when stderr is a terminal; the kernel's own stderr goes to ``runs/<run_id>.kernel.log``.

    Returns ``{"run_id", "run_html", "html", "index", "figures"}`` (paths).

    Raises:
        CLIError: the notebook is missing or has no cell tagged ``parameters``; a cell failed (its error is named).
        ValueError: invalid sweep parameters (before any kernel starts).
    """
    import dataclasses
    import uuid

    _require_lab_extra()
    doors.check_notebook(str(notebook))
    _check_notebook(notebook)

    from .sweep.executors import resolve_device
    from .sweep.params import check_tp_sizes, validate_params
    from .sweep.run import LOCK_ENV, check_output_file, data_file_lock

    checked = validate_params(params)  # fail before starting a kernel
    check_tp_sizes(checked)
    validated = dataclasses.asdict(checked)
    check_output_file(validated["data_file"], validated["overwrite"], checked)  # refused before the kernel
    if validated["device"] == "cuda":  # refused before the kernel without a GPU; 'auto' is resolved in the kernel
        resolve_device("cuda")  # (importing torch here too cost ~2-4 s of a one-point sweep, issue 22)
    token = uuid.uuid4().hex
    # the data file is this run's from the kernel's sweep to the copy under runs/ (a second sweep into it is refused)
    with data_file_lock(_resolve(validated["data_file"], cwd), token) as lock:
        os.environ[LOCK_ENV] = f"{lock}|{token}"  # the kernel inherits it: its sweep runs under this lock
        try:
            return _publish_locked(params, notebook, report_name, timeout, cwd, validated)
        finally:
            os.environ.pop(LOCK_ENV, None)


def _publish_locked(params: dict, notebook: Path, report_name: str, timeout: int, cwd: Path, validated: dict) -> dict:
    """:func:`publish` after its checks, under the data file's lock."""
    import datetime as _dt
    import shutil
    import time

    import papermill as pm

    from .kernelspec import ensure_kernel
    from .provenance import git_commit
    from .report import site
    from .sweep.store import code_version

    kernel = ensure_kernel()
    report_dir = _resolve(validated["report_dir"], cwd)
    runs_dir = report_dir / site.RUNS_DIR
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"report_dir={validated['report_dir']!r} cannot hold reports ({e.strerror}: {e.filename}); "
                       "choose a writable folder") from None
    started = _dt.datetime.now(_dt.timezone.utc)
    run_id = site.new_run_id(runs_dir, {**validated, "notebook": notebook.name}, started)
    figure_dir = runs_dir / run_id
    executed = runs_dir / f"{run_id}.ipynb"
    t0 = time.time()
    try:
        pm.execute_notebook(str(notebook), str(executed),
                            parameters={**params, "figure_dir": str(figure_dir), "run_id": run_id},
                            kernel_name=kernel, execution_timeout=timeout, progress_bar=sys.stderr.isatty(),
                            cwd=str(cwd), log_output=False, stderr_file=sys.stderr,  # the sweep's progress, live
                            kernel_manager_class=_kernel_manager_logging_to(runs_dir / f"{run_id}.kernel.log"))
    except pm.PapermillExecutionError as e:
        raise CLIError(f"notebook cell {e.exec_count} failed: {e.ename}: {' '.join(str(e.evalue).split())} "
                       f"(executed copy with the traceback: {executed})") from None
    except Exception as e:  # nbclient's CellTimeoutError, a dead kernel: one line, not a traceback wall
        if type(e).__name__ in ("CellTimeoutError", "DeadKernelError", "TimeoutError"):
            raise CLIError(f"notebook run stopped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                           f"(--timeout {timeout} s is per cell and the whole sweep runs in one cell; points "
                           f"finished so far are stored and a re-run resumes)") from None
        raise
    duration = time.time() - t0
    run_html = runs_dir / f"{run_id}.html"
    run_html.write_text(site.notebook_to_html(executed, f"mla_lab {report_name} {run_id}"))
    meta = {"run_id": run_id, "report_name": report_name, "created_utc": started.isoformat(timespec="seconds"),
            "duration_s": round(duration, 1), "notebook": notebook.name, "params": validated,
            "params_hash": site.params_hash(validated), "git_commit": git_commit(), "code_version": code_version(),
            "html": f"{site.RUNS_DIR}/{run_id}.html", "ipynb": f"{site.RUNS_DIR}/{run_id}.ipynb"}
    data_file = _resolve(validated["data_file"], cwd)
    if data_file.is_file():
        shutil.copyfile(data_file, runs_dir / f"{run_id}.csv")
        meta["csv"] = f"{site.RUNS_DIR}/{run_id}.csv"
    figures = {}
    if figure_dir.is_dir():
        for png in sorted(figure_dir.glob("*.png")):
            if png.with_suffix(".svg").is_file():
                figures[png.stem] = {"png": f"{site.RUNS_DIR}/{run_id}/{png.name}",
                                     "svg": f"{site.RUNS_DIR}/{run_id}/{png.stem}.svg"}
        prov = figure_dir / "provenance.json"
        if prov.is_file():
            meta["provenance"] = json.loads(prov.read_text())
    meta["figures"] = figures
    site.write_json_atomic(runs_dir / f"{run_id}.json", meta)
    latest = site.publish_latest(report_dir, report_name, run_id)
    index = site.build_index(report_dir, report_name)
    return {"run_id": run_id, "run_html": run_html, "html": latest.get("html", run_html), "index": index,
            "figures": figure_dir, "csv": data_file}


def _failed_points(csv_path) -> tuple[int, int] | None:
    """``(failed points, points)`` of a sweep CSV, or None when it cannot be read."""
    import pandas as pd

    try:
        df = pd.read_csv(csv_path)
    except (OSError, ValueError, TypeError):
        return None
    if "point_key" not in df.columns or "status" not in df.columns:
        return None
    by = df.groupby("point_key")["status"].apply(lambda s: bool((s == "failed").all()))
    return int(by.sum()), int(len(by))



def _sweep_params(args) -> dict:
    """The sweep's parameters from -f files, -p pairs and the flags, names normalised to the sweep's; a flag and
    its -p/-f twin with different values are refused (:func:`mla_lab.cli_doors.merge_flags`)."""
    params = _load_params(args.params_file, args.param)
    flags: dict = {}
    for flag, name in VLLM_FLAGS:
        v = getattr(args, f"vllm_{name}")
        if v is not None:
            flags[name] = (flag, _load_params([], [[name, v]])[name])
    for attr, name, flag in (("force", "force", "--force"), ("overwrite", "overwrite", "--overwrite")):
        if getattr(args, attr):
            flags[name] = (flag, True)
    for attr, name, flag in (("num_runs", "num_runs", "--num-runs"), ("executor", "executor", "--executor"),
                             ("address", "ray_address", "--address"), ("seed", "seed", "--seed")):
        v = getattr(args, attr)
        if v is not None:
            flags[name] = (flag, v)
    return doors.merge_flags(params, flags)


def plan_outputs(params: dict, report_name: str, report_name_given: bool = False) -> tuple[dict, str, list[str]]:
    """Where a sweep writes, decided before anything runs: ``(params, report_name, notes)``.

    The main report (``<report_dir>/<report_name>.html``, the newest run published under that name) and the
    default ``data_file`` are replaced only by a sweep of the same grid (:data:`mla_lab.cli_doors.GRID_KEYS`) or with ``--overwrite``.
    Otherwise this sweep writes a named report, ``<report_name>-<hash of its grid>`` (or the ``--report-name``
    given), and, when ``data_file`` was not given, ``<its folder>/<that name>.csv``; each ``note`` says so in one
    line. A ``data_file`` given with ``-p``/``-f`` is never redirected: :func:`mla_lab.sweep.run.check_output_file`
    refuses it instead.

    Raises:
        ValueError: as :func:`mla_lab.sweep.params.validate_params` and
            :func:`~mla_lab.sweep.run.check_output_file` (of the path finally chosen).
    """
    import dataclasses

    from .paths import resolve
    from .report import site
    from .sweep.params import validate_params
    from .sweep.run import check_output_file

    checked = validate_params(params)
    _check_report_dir_files(resolve(checked.report_dir), report_name, checked.overwrite)
    if checked.overwrite:
        return params, report_name, []
    grid = {k: getattr(checked, k) for k in doors.GRID_KEYS}
    named = report_name if report_name_given else f"{report_name}-{site.params_hash(grid)}"
    notes = []
    report_dir = resolve(checked.report_dir)
    latest = report_dir / f"{report_name}.html"
    if latest.is_file() and not report_name_given:  # (a --report-name given is replaced as asked)
        runs = [m for m in site.list_runs(report_dir) if m.get("report_name") == report_name]
        last = (runs[0].get("params") or {}) if runs else {}
        if not runs or any(last.get(k) != v for k, v in _jsonable(grid).items()):
            notes.append(f"{rel_path(latest)} is another sweep's report: kept; this run writes "
                         f"{rel_path(report_dir / named)}.html (--overwrite replaces the main one)")
    if "data_file" not in params:
        try:
            check_output_file(checked.data_file, False, checked, create=False)
        except ValueError as e:
            if not resolve(checked.data_file).is_file():
                raise
            data_file = str(Path(checked.data_file).with_name(f"{named}.csv"))
            check_output_file(data_file, False, dataclasses.replace(checked, data_file=data_file), create=False)
            params = {**params, "data_file": data_file}
            why = str(e).split("; ")[0].replace(f"data_file={checked.data_file!r} ", "")
            notes.append(f"{checked.data_file} {why}: kept; this run writes {data_file} (--overwrite replaces the "
                         "default one)")
    return params, named if notes else report_name, notes


def _check_report_dir_files(report_dir: Path, report_name: str, overwrite: bool) -> None:
    """The files a sweep rewrites in ``report_dir`` whatever the grid (its ``index.html``, and with ``--overwrite``
    ``<report_name>.html``) must be the lab's: an index carrying the lab's title, a report a published run names
    (:func:`mla_lab.report.site.list_runs`). A user's page of that name is refused, ``--overwrite`` or not (issue 39).

    Raises:
        DoorError: one line naming the file.
    """
    from .report import site

    index = report_dir / "index.html"
    if index.is_file():
        try:
            ours = site.INDEX_TITLE in index.read_text(encoding="utf-8", errors="replace")[:4096]
        except OSError:
            ours = False
        if not ours:
            raise DoorError(f"report_dir={str(report_dir)!r} holds index.html, which the lab did not write (each "
                            "sweep rewrites the index there); allowed: another report_dir, or move that file")
    latest = report_dir / f"{report_name}.html"  # without --overwrite another's report is kept (a named one written)
    if overwrite and latest.is_file() and not any(m.get("report_name") == report_name for m in site.list_runs(report_dir)):
        raise DoorError(f"report_dir={str(report_dir)!r} holds {latest.name}, which no run the lab published there "
                        "names; the lab replaces only its own reports; allowed: another --report-name or report_dir")


def _jsonable(d: dict) -> dict:
    import json

    return json.loads(json.dumps(d, default=str))




def _cmd_sweep(args) -> int:
    given = args.report_name is not None
    report_name = doors.check_report_name(args.report_name if given else DEFAULT_REPORT_NAME)
    doors.check_notebook(args.notebook)  # the dry run refuses what the real run would (--timeout: argparse)
    params = _sweep_params(args)
    doors.check_sweep(params)  # bounds, step counts and paths: O(1), before anything is priced or written
    params, report_name, notes = plan_outputs(params, report_name, given)  # the main report kept
    if args.dry_run:  # the same refusals as a run, before anything is planned; nothing is created
        _require_lab_extra()  # the run needs the notebook toolchain: said by the dry run too (find_spec, no import)
        plan = doors.plan_without_writing(params)
        plan.update(notebook=args.notebook, report_name=report_name, timeout_s=args.timeout, notes=notes)
        print(json.dumps(plan, indent=1))
        return 0
    args.report_name = report_name
    for n in notes:
        print(f"mla-lab: {n}", file=sys.stderr)
    # relative paths resolve against the directory the command runs in
    res = publish(params, Path(args.notebook), args.report_name, args.timeout, Path.cwd())
    failed = _failed_points(res.get("csv"))
    if failed is not None and failed[0] == failed[1] and failed[1] > 0:
        print(f"mla-lab: error: every point failed ({failed[1]} points; the report lists each reason: "
              f"{rel_path(res['html'])})", file=sys.stderr)
        return 1
    print(f"mla-lab: report written to {rel_path(res['html'])}")
    print(f"mla-lab: this run: {rel_path(res['run_html'])} (figures as PNG + SVG in {rel_path(res['figures'])}/)")
    print(f"mla-lab: index of all published reports: {rel_path(res['index'])}")
    return 0


# ----------------------------------------------------------------------------------------------------- advise
def _cmd_advise(args) -> int:
    for flag, v in (("--random-output-len", args.random_output_len), ("--request-rate", args.request_rate)):
        if v is not None:
            raise DoorError(f"{flag}={v!r} is not used by advise: it ranks strategies by the modelled TTFT of the "
                            "prefill, which neither the output length nor the request rate changes; allowed: omit "
                            "it here, or use 'mla-lab serve' (the vllm bench serve simulation) with it")
    dep, _ = doors.check_deployment(args.model, args.tp, args.arch, args.max_num_batched_tokens, args.prompt_len,
                                    args.kv_cache_dtype, args.num_prompts, args.concurrency, args.weight_dtype,
                                    args.moe_parallel, args.gpu_memory_utilization, strategies=None,
                                    options=doors.deployment_options(args))
    from .sweep.advise import advise, format_advice

    _check_engine(args.engine)
    measured = None
    if not args.no_measured:
        from .report.data import load_measured_cached

        measured = load_measured_cached()
    try:
        res = advise(dep, memory_budget_mib=args.memory_budget_mib, memory_budget_tokens=args.memory_budget_tokens,
                     measured=measured, engine=args.engine, packed_overlap=args.packed_overlap)
    except ValueError as e:  # the deployment was built (and checked) once, above; a bad --packed-overlap is refused
        if "packed_overlap" in str(e):
            raise DoorError(str(e).replace("packed_overlap=", "--packed-overlap=")) from None
        raise
    attrs = getattr(measured, "attrs", {}) if measured is not None else {}
    detached = list(attrs.get("detached", [])) + [  # rows no manifest counts: a cut file could not be detected
        f"{u} (no stamp in a manifest: lost rows cannot be detected; python -m mla_lab.report.stamp_measured)"
        for u in attrs.get("unstamped", [])]
    if args.json:
        print(json.dumps({**res, "measured_detached": detached}, indent=1, default=str))
    else:
        print(format_advice(res) + "".join(f"\nnote: {n}" for n in detached))
    return 0


# ----------------------------------------------------------------------------------------------------- serve
def _check_engine(engine) -> None:
    """One line naming --engine, the value and the allowed values (DoorError), before anything is priced."""
    if engine is None:
        return
    from .placement import resolve_engine

    try:
        resolve_engine(engine)
    except ValueError as e:
        raise DoorError(str(e)) from None


def _cmd_serve(args) -> int:
    _check_engine(args.engine)
    if args.engine is not None:
        from .placement import engine_strategies

        args.strategies = list(args.strategies) + engine_strategies(args.engine)
    strategies = doors.check_strategies(args.strategies)
    if args.num_runs is None:  # a finite rate: one run's change is noise-sized, so the band is the default
        args.num_runs = 1 if math.isinf(args.request_rate) else doors.MIN_NOISE_RUNS
    dep = cli_serve.check_serve(args, strategies)  # the Deployment, checked once
    from .serving import BenchConfig, serve_benchmark

    bench = BenchConfig(num_prompts=args.num_prompts, random_input_len=args.random_input_len,
                        random_output_len=args.random_output_len, request_rate=args.request_rate,
                        max_concurrency=args.max_concurrency, seed=args.seed)
    res = serve_benchmark(dep, strategies, bench)
    runs = None
    if args.num_runs > 1:
        runs = cli_serve.serve_noise_runs(args, dep, strategies, bench)
    out = cli_serve.serve_summary(res, runs, num_runs=args.num_runs)
    print(json.dumps(out, indent=1, default=str) if args.json else cli_serve.format_serve(out))
    return 0


def _range(name: str) -> str:
    """``lo..hi`` of :data:`mla_lab.cli_doors.BOUNDS` ``[name]``, for a flag's help."""
    lo, hi, _ = doors.BOUNDS[name]
    return f"{lo}..{hi:,}"


def build_parser() -> argparse.ArgumentParser:
    """The ``mla-lab`` argument parser (every integer flag bounded: :data:`mla_lab.cli_doors.BOUNDS`; every option
    has a one-line help with its unit and allowed range)."""
    B, R = doors.arg_type, _range
    ap = _Parser(prog="mla-lab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sw = sub.add_parser("sweep", help="run the padding sweep notebook through papermill and publish HTML")
    sw.add_argument("-f", "--params-file", action="append", default=[], help="YAML file mapping sweep parameter names to values (repeatable; "
                                                                 "later files win)")
    sw.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="one sweep parameter as a YAML value (-p tp_sizes '[4, 8]'; every name with its type: papermill "
                         "--help-notebook notebooks/padding_sweep.ipynb)")
    sw.add_argument("--notebook", default=None, help="the notebook to run (default notebooks/padding_sweep.ipynb)")
    sw.add_argument("--report-name", default=None,
                    help="basename of the latest report's files (letters, digits, '.', '_', '-'; no folders; default "
                         f"{DEFAULT_REPORT_NAME}, or {DEFAULT_REPORT_NAME}-<grid hash> when that one holds another "
                         "grid's sweep and --overwrite is not given)")
    sw.add_argument("--timeout", type=B("timeout"), default=3600,
                    help=f"per-cell execution timeout, seconds, {R('timeout')} (the sweep itself runs in one cell; default 3600)")
    sw.add_argument("--force", action="store_true", help="recompute points already stored")
    sw.add_argument("--executor", choices=["local", "ray"], default=None,
                    help="where grid points run (= -p executor; ray needs pip install 'mla_lab[ray]')")
    sw.add_argument("--address", default=None, help="Ray cluster address with --executor ray (= -p ray_address)")
    for flag, name in VLLM_FLAGS:
        sw.add_argument(flag, dest=f"vllm_{name}", default=None, metavar="VALUE",
                        help=f"vLLM spelling of -p {name} (a YAML value: 8 or [4, 8])")
    sw.add_argument("--num-runs", type=B("num_runs"), default=None,
                    help=f"interleaved repeats of each measured strategy on a GPU, {R('num_runs')} (= -p num_runs; "
                         "default 7)")
    sw.add_argument("--seed", type=B("seed"), default=None,
                    help=f"vllm bench serve --seed of the report's serving simulation, {R('seed')} (= -p seed; default 0)")
    sw.add_argument("--dry-run", action="store_true",
                    help="print the grid, the point count and what is already stored; run nothing, write nothing")
    sw.add_argument("--overwrite", action="store_true",
                    help="allow data_file to replace an existing file the lab did not write")
    ad = sub.add_parser("advise", help="for one deployment and a memory budget: the strategy (and S) with the "
                                       "lowest TTFT, ranked alternatives, what does not fit")
    _deployment_flags(ad, tp_flags=("--tp", "--tensor-parallel-size"), tp_dest="tp")
    ad.add_argument("--prompt-len", "--random-input-len", dest="prompt_len", type=B("prompt_len"), default=1024,
                    help=f"tokens per prompt, {R('prompt_len')} (default 1024)")
    ad.add_argument("--num-prompts", type=B("num_prompts"), default=32,
                    help=f"prompts in the workload, {R('num_prompts')} (default 32)")
    ad.add_argument("--concurrency", "--max-concurrency", dest="concurrency", type=B("concurrency"), default=None,
                    help="prompts in flight at once, 1..num_prompts (default num_prompts); advise's TTFT model holds "
                         "their KV at once")
    ad.add_argument("--memory-budget-mib", type=doors.budget_type("--memory-budget-mib"), default=None,
                    help="most persistent extra MiB per rank a strategy may take, a number >= 0 (default no limit)")
    ad.add_argument("--memory-budget-tokens", type=doors.budget_type("--memory-budget-tokens", integer=True),
                    default=None, help="most KV-cache tokens per rank a strategy may cost, a whole number >= 0 "
                                       "(default no limit)")
    ad.add_argument("--random-output-len", default=None, help=argparse.SUPPRESS)  # refused with a reason
    ad.add_argument("--request-rate", default=None, help=argparse.SUPPRESS)  # refused with a reason
    ad.add_argument("--no-measured", action="store_true", help="use modelled TTFT only (ignore data/measured)")
    ad.add_argument("--engine", default=None,
                    help="the engine version to answer within (default vllm@0.33.0; e.g. sglang@0.5.23, vllm@pr53878: "
                         "mla-lab engines lists them; first names such as vllm-53878 map to theirs): only its "
                         "strategies are ranked, other engines' options are listed in their own section")
    ad.add_argument("--packed-overlap", type=doors.overlap_type, default=None,
                    help="the pairwise overlap of neighbouring tokens' top-k sets past the top-k that the lab's "
                         "packed kernel is priced at, 0..1 (default 0.44: TensorRT-LLM tech blog 21, an assumption)")
    ad.add_argument("--json", action="store_true", help="print the result as JSON")
    sv = sub.add_parser("serve", help="the vllm bench serve simulation for one deployment: every metric per "
                                      "strategy and its change vs the baseline (modelled)")
    _deployment_flags(sv, tp_flags=("--tensor-parallel-size", "--tp"), tp_dest="tensor_parallel_size")
    sv.add_argument("--random-input-len", "--prompt-len", dest="random_input_len", type=B("prompt_len"),
                    default=1024, help=f"input tokens per request, {R('prompt_len')} (default 1024)")
    sv.add_argument("--random-output-len", type=B("output_len"), default=128,
                    help=f"output tokens per request, {R('output_len')} (default 128)")
    sv.add_argument("--num-prompts", type=B("num_prompts"), default=32,
                    help=f"requests, {R('num_prompts')} (default 32; with the step bound below)")
    sv.add_argument("--max-concurrency", type=B("concurrency"), default=None,
                    help="most requests in flight, 1..num_prompts (default unlimited)")
    sv.add_argument("--request-rate", type=doors.rate_type, default=float("inf"),
                    help="requests/s, a number > 0 or inf (default inf: every request at t = 0, vLLM's default); a "
                         "finite rate is bounded as serial requests: num_prompts x (prefill steps + output_len) "
                         f"<= {doors.MAX_SERVE_STEPS:,} steps per strategy")
    sv.add_argument("--max-num-seqs", type=B("max_num_seqs"), default=256,
                    help=f"vLLM's most sequences per engine step, {R('max_num_seqs')} (default 256)")
    sv.add_argument("--seed", type=B("seed"), default=0,
                    help=f"vllm bench serve --seed (arrival times), {R('seed')} (default 0)")
    sv.add_argument("--num-runs", type=B("num_runs"), default=None,
                    help=f"noise Monte-Carlo runs per strategy (mla_lab.serving.noise): 1 = one deterministic run, "
                         f"or {doors.MIN_NOISE_RUNS}..{doors.BOUNDS['num_runs'][1]:,} (a 95 %% band needs at least "
                         f"{doors.MIN_NOISE_RUNS} runs); default 1 at --request-rate inf, {doors.MIN_NOISE_RUNS} at a "
                         "finite rate (one run there flips sign from seed to seed: its band is shown)")
    sv.add_argument("--strategies", nargs="+", default=list(SERVE_PRESETS),
                    help="presets, aliases or canonical strategies (default vllm-pre-53878 vllm-53878 vllm-56902; "
                         "the baseline is always run)")
    sv.add_argument("--json", action="store_true", help="print the result as JSON")
    sv.add_argument("--engine", default=None,
                    help="an engine version preset, e.g. vllm@0.33.0 or sglang@0.5.23 (mla-lab engines lists them; "
                         "first names such as vllm-53878 map to theirs): its strategies join --strategies")
    en = sub.add_parser("engines", help="the engine versions the lab describes (vLLM / SGLang releases and PR-era "
                                        "builds): route, padding, decode backend, sources; or check a wheel")
    en.add_argument("--json", action="store_true", help="every preset with its facts and their file:line")
    en.add_argument("--arch", default="h200",
                    help="the GPU whose backends and padding to show: h200 (sm90, default) or b200 (sm100; modelled "
                         "from the engines' sources, nothing ran on a B200)")
    en.add_argument("--check-wheel", nargs="+", default=None, metavar="WHEEL",
                    help="release wheel(s) to check the facts against (read with ast; never installed or imported)")
    en.add_argument("--download", nargs="+", default=None, metavar="ENGINE==VERSION",
                    help="pip download --no-deps the release wheel(s) first (e.g. vllm==0.33.0; ~336 MB), then check")
    en.add_argument("--wheel-dir", default=os.environ.get("MLA_LAB_WHEELS", "wheels"),
                    help="where --download puts wheels (default env MLA_LAB_WHEELS or ./wheels)")
    en.add_argument("--write", action="store_true",
                    help="write data/engines/wheel_facts_<engine>-<version>.json and .md")
    en.add_argument("--overwrite", action="store_true", help="with --write: replace existing report files")
    ix = sub.add_parser("index", help="rebuild <report-dir>/index.html from the published runs")
    ix.add_argument("--report-dir", default="reports",
                    help="an existing folder 'mla-lab sweep' published reports into (default reports)")
    ix.add_argument("--report-name", default="padding_sweep", help="basename of the latest report (linked)")
    ck = sub.add_parser("check-report", help="render reports in headless Chromium: every figure loaded and not "
                                             "blank, no JavaScript error, nothing wider than the window")
    ck.add_argument("html", nargs="*", default=["reports/padding_sweep.html", "reports/index.html"],
                    help="existing HTML report files (default reports/padding_sweep.html reports/index.html)")
    cli_measure.add_parsers(sub)
    return ap


def _deployment_flags(p, tp_flags, tp_dest) -> None:
    B = doors.arg_type
    lo, hi, _ = doors.BOUNDS["tp"]
    p.add_argument("--model", default="glm-5", help="a model the lab knows, e.g. glm-5 or deepseek-v3.2 (default "
                                                   "glm-5; an unknown name lists them)")
    p.add_argument(*tp_flags, dest=tp_dest, type=B("tp"), default=8,
                   help=f"tensor-parallel size (GPUs), {lo}..{hi:,}, dividing the model's num_heads (default 8)")
    p.add_argument("--arch", default="h200", help="GPU, e.g. h200 (sm90) or b200 (sm100) (default h200; an unknown "
                                                 "name lists them)")
    p.add_argument("--max-num-batched-tokens", type=B("max_num_batched_tokens"), default=16384,
                   help=f"vLLM's token budget per engine step, {_range('max_num_batched_tokens')}, >= max_num_seqs "
                        "(default 16384)")
    p.add_argument("--kv-cache-dtype", default="bf16", help="KV-cache dtype, e.g. bf16 or fp8_ds_mla (default bf16; "
                                                           "an unknown one lists them)")
    p.add_argument("--weight-dtype", default="fp8", choices=["fp8", "bf16"], help="weight dtype: fp8 or bf16 "
                                                                                  "(default fp8)")
    p.add_argument("--moe-parallel", default="ep", choices=["ep", "tp"],
                   help="how the experts are split: ep (expert parallel) or tp (default ep)")
    p.add_argument("--gpu-memory-utilization", type=doors.fraction_type, default=0.9,
                   help="vLLM's fraction of GPU memory for weights, activations and KV cache, in (0, 1] "
                        "(default 0.9)")
    p.add_argument("--num-speculative-tokens", type=B("num_speculative_tokens"), default=0,
                   help="MTP / EAGLE draft tokens per step (vLLM --speculative-config num_speculative_tokens), "
                        f"{_range('num_speculative_tokens')} (default 0: off; modelled)")
    p.add_argument("--acceptance-length", type=doors.acceptance_type, default=None,
                   help="mean tokens accepted per request per step, the bonus token included: an input, in "
                        "[1, num_speculative_tokens + 1] (default 1)")
    p.add_argument("--dp-attention", type=B("dp_attention"), default=1,
                   help="SGLang --dp N --enable-dp-attention: attention data-parallel over N ranks (all heads of "
                        f"the group per rank, KV per rank), MoE over all GPUs; {_range('dp_attention')}, a divisor "
                        "of tp (default 1: off; modelled)")


_COMMANDS = {"sweep": _cmd_sweep, "advise": _cmd_advise, "serve": _cmd_serve, "engines": cli_engines.cmd_engines,
             "index": cli_report.cmd_index, "check-report": cli_report.cmd_check_report,
             "measure": lambda args: cli_measure.cmd_measure(args, _stamp),
             "report": lambda args: cli_measure.cmd_report(args, main)}


def _stamp(root) -> int:
    """Stamp the measured rows under ``root`` with the model configs they were measured on (issue 24)."""
    from .report.stamp_measured import main as stamp

    return stamp(["--root", str(root)])


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (0 ok, 1 a run failure, 2 bad input, 130 interrupted).

    Every failure is one line on stderr (``MLA_LAB_TRACEBACK=1`` re-raises unexpected errors with their traceback).
    """
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "notebook", "") is None:
            args.notebook = str(_default_notebook())
        rc = _COMMANDS[args.cmd](args)
        sys.stdout.flush()  # a closed pipe raises here, inside the handler below, not at interpreter exit
        return rc
    except (DoorError, ValueError) as e:
        print(f"mla-lab: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except CLIError as e:
        print(f"mla-lab: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # stdout closed by the reader (mla-lab advise | head): quiet, as SIGPIPE would be
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
        except (OSError, ValueError):
            pass
        return 128 + 13  # 141: the shell's status for a process ended by SIGPIPE
    except KeyboardInterrupt:
        print("mla-lab: interrupted; every point finished so far is stored (one file per point) and the same "
              "command resumes from them", file=sys.stderr)
        return 130
    except (OSError, OverflowError, MemoryError, RecursionError) as e:
        if os.environ.get("MLA_LAB_TRACEBACK"):
            raise
        print(f"mla-lab: error: {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug or a broken install, not bad input: one line, the traceback on request
        if os.environ.get("MLA_LAB_TRACEBACK"):
            raise
        print(f"mla-lab: error: internal error {type(e).__name__}: {_one_line(e)[:300]} (MLA_LAB_TRACEBACK=1 shows "
              "the traceback)", file=sys.stderr)
        return 1


#: The longest error line printed (characters): a message that echoes a value is cut, never the terminal flooded.
MAX_ERROR_CHARS = 1500


def _one_line(e: BaseException) -> str:
    s = " ".join(str(e)[: 4 * MAX_ERROR_CHARS].split()) or type(e).__name__
    return s if len(s) <= MAX_ERROR_CHARS else s[: MAX_ERROR_CHARS - 5] + " ..."


if __name__ == "__main__":
    sys.exit(main())
