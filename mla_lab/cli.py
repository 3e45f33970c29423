"""``mla-lab`` command line: run the papermill-parameterized sweep notebook and publish it as HTML.

    mla-lab sweep [-f params.yaml] [-p name value ...] [--notebook PATH] [--report-name NAME] [--timeout S]
    mla-lab advise [--model M --tp N --arch A --max-num-batched-tokens T --prompt-len L --memory-budget-mib X]
    mla-lab index [--report-dir DIR]
    mla-lab check-report [HTML ...]     (headless Chromium: figures loaded and not blank, no JavaScript error)

Parameters are validated before any kernel starts (unknown names, wrong types, empty grids are errors: papermill
itself would silently inject them). ``-p`` values are parsed as YAML (``-p tp_sizes "[1, 8]"``, ``-p force true``).
Every sweep run publishes its own report under ``<report_dir>/runs/`` and refreshes the latest copy
(``<report_dir>/<report-name>.html``) and the index (``<report_dir>/index.html``); layout in :mod:`mla_lab.report.site`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import shutil
import sys
import time
from pathlib import Path

from .kernelspec import ensure_kernel
from .paths import notebooks_dir
from .provenance import git_commit
from .report import site
from .report.browser import check_in_browser
from .report.data import load_measured
from .sweep.advise import advise, format_advice
from .sweep.executors import resolve_device
from .sweep.params import check_tp_sizes, validate_params
from .sweep.run import check_output_file, plan_sweep
from .sweep.store import code_version

DEFAULT_NOTEBOOK = notebooks_dir() / "padding_sweep.ipynb"
LAB_EXTRA_HINT = "pip install -e '.[lab]' (papermill, nbconvert, matplotlib, ipykernel)"
# Injected by the CLI, not sweep parameters (a user passing them gets the unknown-parameter error).
CLI_PARAMETERS = ("figure_dir", "run_id")


#: ``mla-lab sweep`` flags with vLLM's spellings -> sweep parameter (README "vLLM spellings").
VLLM_FLAGS = (("--tensor-parallel-size", "tp_sizes"), ("--max-num-batched-tokens", "max_num_batched_tokens"),
              ("--max-num-seqs", "max_num_seqs"), ("--kv-cache-dtype", "kv_cache_dtype"),
              ("--gpu-memory-utilization", "gpu_memory_utilization"), ("--num-prompts", "num_prompts"),
              ("--random-input-len", "prompt_lens"), ("--random-output-len", "output_len"),
              ("--max-concurrency", "concurrency"), ("--request-rate", "request_rate"))


class CLIError(Exception):
    pass


def _load_params(files: list[str], pairs: list[list[str]]) -> dict:
    import yaml

    raw: dict = {}
    for f in files or []:
        path = Path(f)
        if not path.is_file():
            raise CLIError(f"-f {f}: no such file")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise CLIError(f"-f {f}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise CLIError(f"-f {f}: must hold a mapping of parameter names to values, got {type(data).__name__}")
        raw.update(data)
    for name, value in pairs or []:
        try:
            raw[name] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            raise CLIError(f"-p {name} {value!r}: not a valid YAML value: {e}") from None
    return raw


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


def publish(params: dict, notebook: Path, report_name: str, timeout: int, cwd: Path) -> dict:
    """Execute ``notebook`` with papermill (kernel ``mla-lab``, this interpreter, per-cell ``timeout`` seconds) as a
    new run, export it to HTML with inputs hidden, and publish it: the run's own files under
    ``<report_dir>/runs/<run_id>.*``, the latest copy ``<report_dir>/<report_name>.html`` and the index.

    Returns ``{"run_id", "run_html", "html", "index", "figures"}`` (paths).

    Raises:
        CLIError: the notebook is missing or has no cell tagged ``parameters``; a cell failed (its error is named).
        ValueError: invalid sweep parameters (before any kernel starts).
    """
    _require_lab_extra()
    import nbformat
    import papermill as pm

    if not notebook.is_file():
        raise CLIError(f"--notebook {notebook}: no such notebook")
    nb = nbformat.read(notebook, as_version=4)
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        raise CLIError(f"notebook {notebook} has no cell tagged 'parameters'; papermill cannot inject parameters")
    checked = validate_params(params)  # fail before starting a kernel
    check_tp_sizes(checked)
    validated = dataclasses.asdict(checked)
    check_output_file(validated["data_file"], validated["overwrite"])  # refused before the kernel (cwd-relative)
    resolve_device(validated["device"])  # device='cuda' without a GPU: refused before the kernel
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
                            kernel_name=kernel, execution_timeout=timeout, progress_bar=False, cwd=str(cwd),
                            log_output=False, stderr_file=sys.stderr)  # the sweep's progress, live
    except pm.PapermillExecutionError as e:
        raise CLIError(f"notebook cell {e.exec_count} failed: {e.ename}: {e.evalue} "
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


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mla-lab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sw = sub.add_parser("sweep", help="run the padding sweep notebook through papermill and publish HTML")
    sw.add_argument("-f", "--params-file", action="append", default=[], help="YAML file of parameters")
    sw.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    sw.add_argument("--notebook", default=str(DEFAULT_NOTEBOOK))
    sw.add_argument("--report-name", default="padding_sweep", help="basename of the latest report's files")
    sw.add_argument("--timeout", type=int, default=3600,
                    help="per-cell execution timeout, seconds (the sweep itself runs in one cell)")
    sw.add_argument("--force", action="store_true", help="recompute points already stored")
    sw.add_argument("--executor", choices=["local", "ray"], default=None,
                    help="where grid points run (= -p executor; ray needs pip install 'mla_lab[ray]')")
    sw.add_argument("--address", default=None, help="Ray cluster address with --executor ray (= -p ray_address)")
    for flag, name in VLLM_FLAGS:
        sw.add_argument(flag, dest=f"vllm_{name}", default=None, metavar="VALUE",
                        help=f"vLLM spelling of -p {name} (a YAML value: 8 or [4, 8])")
    sw.add_argument("--num-runs", type=int, default=None,
                    help="interleaved repeats of each measured strategy on a GPU (= -p num_runs; default 7)")
    sw.add_argument("--dry-run", action="store_true",
                    help="print the grid, the point count and what is already stored; run nothing")
    sw.add_argument("--overwrite", action="store_true",
                    help="allow data_file to replace an existing file the lab did not write")
    ad = sub.add_parser("advise", help="for one deployment and a memory budget: the strategy (and S) with the "
                                       "lowest TTFT, ranked alternatives, what does not fit")
    ad.add_argument("--model", default="glm-5")
    ad.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int, default=8)
    ad.add_argument("--arch", default="h200")
    ad.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ad.add_argument("--prompt-len", "--random-input-len", dest="prompt_len", type=int, default=1024)
    ad.add_argument("--kv-cache-dtype", default="bf16")
    ad.add_argument("--num-prompts", type=int, default=32)
    ad.add_argument("--concurrency", "--max-concurrency", dest="concurrency", type=int, default=None)
    ad.add_argument("--weight-dtype", default="fp8", choices=["fp8", "bf16"])
    ad.add_argument("--moe-parallel", default="ep", choices=["ep", "tp"])
    ad.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vLLM's KV-cache budget fraction")
    ad.add_argument("--memory-budget-mib", type=float, default=None, help="most persistent extra MiB per rank")
    ad.add_argument("--memory-budget-tokens", type=float, default=None, help="most KV-cache tokens lost per rank")
    ad.add_argument("--no-measured", action="store_true", help="use modelled TTFT only (ignore data/measured)")
    ad.add_argument("--json", action="store_true", help="print the result as JSON")
    ix = sub.add_parser("index", help="rebuild <report-dir>/index.html from the published runs")
    ix.add_argument("--report-dir", default="reports")
    ix.add_argument("--report-name", default="padding_sweep", help="basename of the latest report (linked)")
    ck = sub.add_parser("check-report", help="render reports in headless Chromium: every figure loaded and not "
                                             "blank, no JavaScript error")
    ck.add_argument("html", nargs="*", default=["reports/padding_sweep.html", "reports/index.html"])
    args = ap.parse_args(argv)
    if args.cmd == "check-report":
        bad = 0
        for h in args.html:
            try:
                r = check_in_browser(h)
            except RuntimeError as e:
                print(f"mla-lab: error: {e}", file=sys.stderr)
                return 1
            inks = ", ".join(f"{100 * i['ink']:.1f}%" for i in r["images"])
            print(f"mla-lab: {h}: {'ok' if r['ok'] else 'FAILED'} ({len(r['images'])} figure(s), non-background "
                  f"pixels {inks or '-'}; screenshot {_rel(r['screenshot'])})")
            for p in r["problems"]:
                print(f"  - {p}")
            bad += not r["ok"]
        return 1 if bad else 0
    if args.cmd == "advise":
        try:
            measured = None if args.no_measured else load_measured()
            res = advise(args.model, args.tp, args.arch, args.max_num_batched_tokens, args.prompt_len,
                         args.kv_cache_dtype, args.num_prompts, args.concurrency, args.weight_dtype,
                         args.moe_parallel, args.memory_budget_mib, args.memory_budget_tokens, measured=measured,
                         gpu_memory_utilization=args.gpu_memory_utilization)
        except ValueError as e:
            print(f"mla-lab: error: {e}", file=sys.stderr)
            return 2
        print(json.dumps(res, indent=1, default=str) if args.json else format_advice(res))
        return 0
    if args.cmd == "index":
        try:
            out = site.build_index(Path(args.report_dir), args.report_name)
        except (OSError, ValueError) as e:
            what = "is a file, not a folder" if Path(args.report_dir).is_file() else \
                (getattr(e, "strerror", None) or str(e))
            print(f"mla-lab: error: --report-dir {args.report_dir}: {what}; give the folder the reports are in",
                  file=sys.stderr)
            return 2
        print(f"mla-lab: index of {len(site.list_runs(args.report_dir))} report(s) written to {_rel(out)}")
        return 0
    try:
        params = _load_params(args.params_file, args.param)
        if args.force:
            params["force"] = True
        if args.overwrite:
            params["overwrite"] = True
        if args.num_runs is not None:
            params["num_runs"] = args.num_runs
        for _, name in VLLM_FLAGS:
            v = getattr(args, f"vllm_{name}")
            if v is not None:
                params[name] = _load_params([], [[name, v]])[name]
        if args.executor is not None:
            params["executor"] = args.executor
        if args.address is not None:
            params["ray_address"] = args.address
        if args.timeout <= 0:
            raise ValueError(f"--timeout={args.timeout} must be a positive number of seconds")
        if args.dry_run:  # the same refusals as a run, before anything is planned
            checked = validate_params(params)
            check_tp_sizes(checked)
            check_output_file(checked.data_file, checked.overwrite)
            resolve_device(checked.device)
            plan = plan_sweep(checked)
            print(json.dumps(plan, indent=1))
            return 0
        # relative paths resolve against the directory the command runs in
        res = publish(params, Path(args.notebook), args.report_name, args.timeout, Path.cwd())
    except (CLIError, ValueError) as e:
        print(f"mla-lab: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    except KeyboardInterrupt:
        print("mla-lab: interrupted; every point finished so far is stored (one file per point) and the same "
              "command resumes from them", file=sys.stderr)
        return 130
    failed = _failed_points(res.get("csv"))
    if failed is not None and failed[0] == failed[1] and failed[1] > 0:
        print(f"mla-lab: error: every point failed ({failed[1]} points; the report lists each reason: "
              f"{_rel(res['html'])})", file=sys.stderr)
        return 1
    print(f"mla-lab: report written to {_rel(res['html'])}")
    print(f"mla-lab: this run: {_rel(res['run_html'])} (figures as PNG + SVG in {_rel(res['figures'])}/)")
    print(f"mla-lab: index of all published reports: {_rel(res['index'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
