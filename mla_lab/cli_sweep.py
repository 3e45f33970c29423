"""The sweep door: ``mla-lab sweep`` reads ``-f`` / ``-p`` / flag parameters, plans where it writes, runs the sweep
notebook through papermill and publishes it (``<report_dir>/runs/``, the latest copy, the index:
:mod:`mla_lab.report.site`). ``-p`` values are YAML (``-p tp_sizes "[1, 8]"``); unknown names, wrong types and empty
grids are refused before a kernel starts (papermill itself would inject them silently).

Imports of the lab's heavier modules are function-local (``mla-lab sweep --dry-run`` loads neither torch nor pandas).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import cli_doors as doors
from .cli_doors import CLIError, DoorError, range_help, rel_path

__all__ = ["CLI_PARAMETERS", "DEFAULT_REPORT_NAME", "add_parser", "cmd_sweep", "publish", "plan_outputs"]

LAB_EXTRA_HINT = "pip install -e '.[lab]' (papermill, nbconvert, matplotlib, ipykernel)"
# Injected by the CLI, not sweep parameters (a user passing them gets the unknown-parameter error).
CLI_PARAMETERS = ("figure_dir", "run_id")
#: The main report's basename (``make report``): replaced only by a sweep of its grid or with --overwrite.
DEFAULT_REPORT_NAME = "padding_sweep"


def _default_notebook() -> Path:
    from .paths import notebooks_dir

    return notebooks_dir() / "padding_sweep.ipynb"


#: The largest ``-f`` file and ``-p`` value read (bytes): the default grid's YAML is ~0.5 KB, a full one a few KB.
MAX_PARAM_BYTES = 64 * 1024
#: The deepest nesting a parameter file may have: a parameter is a value or a list (a mapping of them at the top).
MAX_PARAM_DEPTH = 16


def _yaml_load(text: str, where: str):
    """``text`` as YAML without anchors or aliases (a 491-byte alias bomb expands to 10**8 nodes, issue 39) or nesting
    past :data:`MAX_PARAM_DEPTH` (DoorError naming ``where``); yaml.YAMLError for text that is not YAML.
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
    """One ``-f`` file: a regular UTF-8 file of at most :data:`MAX_PARAM_BYTES` holding a YAML mapping (DoorError)."""
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


def _require_lab_extra() -> None:
    """CLIError naming the extra to install when papermill, nbformat, nbconvert or matplotlib is missing."""
    import importlib.util

    missing = [m for m in ("papermill", "nbformat", "nbconvert", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        raise CLIError(f"mla-lab sweep needs the 'lab' extra ({', '.join(missing)} not installed): {LAB_EXTRA_HINT}")


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
    """Execute ``notebook`` with papermill (kernel ``mla-lab``, ``timeout`` s per cell; the kernel's stderr to
    ``runs/<run_id>.kernel.log``), export it to HTML with inputs hidden, and publish ``<report_dir>/runs/<run_id>.*``,
    the latest ``<report_name>.html`` and the index; returns ``{"run_id", "run_html", "html", "index", "figures",
    "csv"}``. CLIError: no notebook / ``parameters`` cell, or a failed cell (named); ValueError: bad parameters.
    """
    import dataclasses
    import uuid

    _require_lab_extra()
    doors.check_notebook(str(notebook))

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
    with data_file_lock(cwd / validated["data_file"], token) as lock:
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
    report_dir = cwd / validated["report_dir"]
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
    duration, rel = time.time() - t0, f"{site.RUNS_DIR}/{run_id}"
    run_html = runs_dir / f"{run_id}.html"
    run_html.write_text(site.notebook_to_html(executed, f"mla_lab {report_name} {run_id}"))
    meta = {"run_id": run_id, "report_name": report_name, "created_utc": started.isoformat(timespec="seconds"),
            "duration_s": round(duration, 1), "notebook": notebook.name, "params": validated,
            "params_hash": site.params_hash(validated), "git_commit": git_commit(), "code_version": code_version(),
            "html": f"{rel}.html", "ipynb": f"{rel}.ipynb"}
    data_file = cwd / validated["data_file"]
    if data_file.is_file():
        shutil.copyfile(data_file, runs_dir / f"{run_id}.csv")
        meta["csv"] = f"{rel}.csv"
    prov = figure_dir / "provenance.json"
    if prov.is_file():
        meta["provenance"] = json.loads(prov.read_text())
    meta["figures"] = {png.stem: {"png": f"{rel}/{png.name}", "svg": f"{rel}/{png.stem}.svg"}
                       for png in sorted(figure_dir.glob("*.png")) if png.with_suffix(".svg").is_file()}
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
    for flag, name in doors.VLLM_FLAGS:
        v = getattr(args, f"vllm_{name}")
        if v is not None:
            flags[name] = (flag, _load_params([], [[name, v]])[name])
    for attr, name, flag in (("force", "force", "--force"), ("overwrite", "overwrite", "--overwrite"),
                             ("num_runs", "num_runs", "--num-runs"), ("executor", "executor", "--executor"),
                             ("address", "ray_address", "--address"), ("seed", "seed", "--seed")):
        v = getattr(args, attr)
        if v is not None and v is not False:  # store_true flags: only when given
            flags[name] = (flag, v)
    return doors.merge_flags(params, flags)


def plan_outputs(params: dict, report_name: str, report_name_given: bool = False) -> tuple[dict, str, list[str]]:
    """Where a sweep writes, decided before anything runs: ``(params, report_name, notes)``. The main report and the
    default ``data_file`` are replaced only by a sweep of the same grid (:data:`mla_lab.cli_doors.GRID_KEYS`) or with
    ``--overwrite``; otherwise this sweep writes ``<report_name>-<grid hash>`` (or the ``--report-name`` given) and
    ``<that name>.csv``, a note saying so; a ``data_file`` given is never redirected. ValueError: as check_output_file.
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
    """The files a sweep rewrites in ``report_dir`` (``index.html``; with ``--overwrite`` ``<report_name>.html``) must
    be the lab's (its index title; a report a published run names); else DoorError, ``--overwrite`` or not (issue 39).
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


def cmd_sweep(args) -> int:
    """``mla-lab sweep``: checks, plan, then the run (or the plan as JSON with ``--dry-run``); returns the exit status."""
    if args.notebook is None:
        args.notebook = str(_default_notebook())
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


def add_parser(sub) -> None:
    """The ``sweep`` sub-command on ``sub`` (argparse sub-parsers)."""
    B, R = doors.arg_type, range_help
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
    for flag, name in doors.VLLM_FLAGS:
        sw.add_argument(flag, dest=f"vllm_{name}", default=None, metavar="VALUE",
                        help=f"vLLM spelling of -p {name} (a YAML value, as -p {name} takes it)")
    sw.add_argument("--num-runs", type=B("num_runs"), default=None,
                    help=f"interleaved repeats of each measured strategy on a GPU, {R('num_runs')} (= -p num_runs; "
                         "default 7)")
    sw.add_argument("--seed", type=B("seed"), default=None,
                    help=f"vllm bench serve --seed of the report's serving simulation, {R('seed')} (= -p seed; default 0)")
    sw.add_argument("--dry-run", action="store_true",
                    help="print the grid, the point count and what is already stored; run nothing, write nothing")
    sw.add_argument("--overwrite", action="store_true",
                    help="allow data_file to replace an existing file the lab did not write")
