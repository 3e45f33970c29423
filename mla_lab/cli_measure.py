"""``mla-lab measure`` and ``mla-lab report --measured <gpu>`` (the work: :mod:`mla_lab.measure.experiments`).

- ``measure``: the chosen experiments (default the between-process set) in ``--processes`` fresh processes into
  ``data/measured/<gpu>/`` (``torch.cuda.get_device_name``: "NVIDIA H200" -> ``h200``); an existing file is
  replaced only with ``--overwrite`` (else ``<out>/runs/<timestamp>/``); a measured ``padding_sweep.csv`` is
  stamped (:mod:`mla_lab.report.stamp_measured`). ``--dry-run`` lists experiments, shapes and files (CPU is
  enough); without CUDA a real run is refused (exit 2). ``--budget-s`` starts no process after S seconds (exit 3,
  resumable with ``--resume RUN_DIR``). ``--smoke``: tiny shapes into a temp folder, never ``data/measured``.
- ``report --measured GPU``: the sweep notebook over the measured grid into ``reports/<gpu>/``, browser-checked.

torch and the suite are imported inside the functions (``mla-lab --help`` loads neither, issue 22).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


def _flag_type(flag: str, convert, ok, allowed: str):
    """An argparse ``type=``: ``convert(text)`` where ``ok`` holds, else ``<flag>='<text>': <allowed> is allowed``."""

    def parse(s: str):
        try:
            v = convert(s)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"{flag}={s!r}: {allowed} is allowed")
        return v

    return parse


#: ``--processes`` (64: more fresh processes than one GPU session holds) and ``--budget-s`` (finite seconds).
processes_type = _flag_type("--processes", int, lambda n: 1 <= n <= 64, "an integer 1..64")
budget_type = _flag_type("--budget-s", float, lambda v: 0 < v < float("inf"), "a number of seconds > 0")


def add_parsers(sub) -> None:
    """The ``measure`` and ``report`` sub-commands on ``sub`` (argparse sub-parsers)."""
    ms = sub.add_parser("measure", help="run the measurement suite on this GPU in fresh processes; writes "
                                        "data/measured/<gpu>/")
    ms.add_argument("--experiments", default=None,
                    help="comma-separated experiment names (default: the between-process set; --dry-run lists all)")
    ms.add_argument("--processes", type=processes_type, default=5,
                    help="fresh processes per between-process experiment, 1..64 (default 5)")
    ms.add_argument("--out", default=None, help="output folder (default data/measured/<gpu>)")
    ms.add_argument("--overwrite", action="store_true", help="replace files that exist in --out (default: a new "
                                                              "run folder <out>/runs/<timestamp>/)")
    ms.add_argument("--engine-root", default=None,
                    help="the packed engine kernels for engine_kernels (python -m mla_lab.kernels.engine_libs pack)")
    ms.add_argument("--dry-run", action="store_true", help="list the experiments, shapes and files; run nothing")
    ms.add_argument("--resume", default=None, metavar="RUN_DIR",
                    help="finish a run a budget or a kill cut: its processes that exited 0 keep their rows")
    ms.add_argument("--budget-s", type=budget_type, default=None, metavar="S",
                    help="start no new process after S seconds (a lent machine's per-call limit); exit 3 and "
                         "--resume when processes are left")
    ms.add_argument("--smoke", action="store_true", help="tiny shapes, one process per chosen experiment (default "
                                                         "set: the * ones of --dry-run), into a temp folder")
    rp = sub.add_parser("report", help="render the report for one GPU from data/measured/<gpu>/")
    rp.add_argument("--measured", required=True, help="a GPU folder under data/measured, e.g. h200")
    rp.add_argument("--report-dir", default=None, help="where the report goes (default reports/<gpu>)")
    rp.add_argument("--overwrite", action="store_true",
                    help="replace the files of a report the lab wrote in --report-dir (listed in its "
                         ".mla_lab_manifest.json; the committed reports/h200/ among them); a folder holding any other "
                         "file is refused")


def cmd_measure(args, stamp) -> int:
    """``stamp(root)``: :func:`mla_lab.report.stamp_measured.main` for ``root`` (passed in by :mod:`mla_lab.cli`: the
    report layer is not below this one)."""
    from mla_lab.measure.experiments import resolve, runner

    if args.experiments is not None and not args.experiments.strip(" ,"):
        raise ValueError(f"--experiments={args.experiments!r} names no experiment; allowed: comma-separated names "
                         "(mla-lab measure --dry-run lists them), or leave it out for the default set")
    resume, record = None, None
    if args.resume is not None:
        resume = Path(args.resume)
        record = runner.read_record(resume, args.processes)  # ValueError: one line
        if args.experiments is None:  # the run's own experiments
            args.experiments = ",".join(record["experiments"])
    experiments = resolve(args.experiments)  # ValueError: one line naming the allowed names
    if args.out:
        _check_out_folder("--out", args.out, Path(args.out))
    root_msg = _engine_root_refusal(args, experiments)
    if args.dry_run:
        return _dry_run(args, experiments, record, root_msg)
    if root_msg:
        raise ValueError(root_msg)
    return _run(args, experiments, resume, stamp)


def _run(args, experiments, resume, stamp) -> int:
    """The run on this machine's GPU (refused in one line without one); a run that wrote the measured sweep under
    the measured root is stamped."""
    import torch

    from mla_lab.measure.experiments import runner

    if not torch.cuda.is_available():
        raise ValueError("mla-lab measure needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run lists "
                         "what it would run")
    gpu = runner.gpu_slug(torch.cuda.get_device_name(0))
    out = Path(args.out) if args.out else runner.default_out(gpu)
    if args.smoke:  # rows of tiny shapes never go where the measured rows live
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix=f"mla_lab_smoke_{gpu}_"))
        print(f"--smoke: one process per experiment, tiny shapes, into {out}")
    rc = runner.run(experiments, 1 if args.smoke else args.processes, out, overwrite=args.overwrite,
                    engine_root=args.engine_root, resume=resume, budget_s=args.budget_s, smoke=args.smoke)
    if any(e.name == "padding_sweep" for e in experiments) and not args.smoke:
        from mla_lab.paths import measured_dir

        root = measured_dir().resolve()
        if out.resolve().is_relative_to(root):
            stamp(root)
    return rc


def _engine_root_refusal(args, experiments) -> str:
    """The refusal of a missing ``--engine-root`` the chosen experiments need ("" when none); an explicit one
    missing is refused now, dry run included (the default ``.engine`` missing only by a real run)."""
    explicit = args.engine_root is not None
    args.engine_root = args.engine_root if explicit else ".engine"
    needs = any("engine kernels packed" in e.needs for e in experiments)
    if not needs or Path(args.engine_root).is_dir():
        return ""
    msg = (f"--engine-root={args.engine_root!r} is not a folder; allowed: a folder packed by python -m "
           "mla_lab.kernels.engine_libs pack VLLM_WHEEL SGLANG_WHEEL OUT (engine_kernels needs it)")
    if explicit:
        raise ValueError(msg)
    return msg


def _dry_run(args, experiments, record, root_msg: str) -> int:
    """``--dry-run``: every experiment (without ``--experiments``; the default set marked) or the chosen ones."""
    from mla_lab.measure.experiments import EXPERIMENTS, SMOKE_TOKENS, runner

    temp = f"{tempfile.gettempdir()}/mla_lab_smoke_<gpu>_*"  # what _run makes under --smoke
    out = args.resume or args.out or (temp if args.smoke else "data/measured/<gpu>")
    listed = list(EXPERIMENTS.values()) if not args.experiments else experiments
    print("\n".join(runner.dry_run_lines(listed, 1 if args.smoke else args.processes, out)))
    if args.smoke:
        print(f"--smoke: the * experiments (or --experiments), tiny shapes ({SMOKE_TOKENS} tokens), one process each")
    if record is not None:
        print(runner.resume_lines(record, experiments, args.processes))
    if root_msg:
        print(f"note: the run would refuse: {root_msg}")
    if args.budget_s is not None:
        print(f"--budget-s {args.budget_s:g}: no process starts after {args.budget_s:g} s (exit 3; finish with "
              "--resume)")
    return 0


def _check_out_folder(flag: str, value: str, p: Path) -> None:
    """A folder path that can be created or written: not a file, not under a file, in a writable parent. Raises
    ValueError naming the flag, the value and what is allowed."""
    from mla_lab.paths import special_filesystem

    allowed = "allowed: a folder path in a writable folder"
    fs = special_filesystem(p)
    if fs:
        raise ValueError(f"{flag}={value!r} is on the {fs} filesystem (kernel or device files, not a place for "
                         f"results); {allowed} on an ordinary disk")
    for q in [p, *p.parents]:
        if q.exists() and not q.is_dir():
            raise ValueError(f"{flag}={value!r}: {q} is a file, not a folder; {allowed}")
        if q.exists():
            if not os.access(q, os.W_OK | os.X_OK):
                raise ValueError(f"{flag}={value!r}: {q} is not writable; {allowed}")
            break


#: What one ``mla-lab report`` writes besides its figure folder ``<name>/`` (``<name>`` = the run's report_name).
REPORT_SUFFIXES = (".html", ".ipynb", ".png", ".svg", "_rows.csv")


def legacy_report_files(folder: Path) -> list[str]:
    """The lab's files in a report folder written before :data:`mla_lab.paths.OUTPUT_MANIFEST` (the committed
    ``reports/h200/``), known by its stamp (``run_metadata.json`` naming ``report_name`` R and a ``run_id`` that
    ``R.html`` holds): it, ``R`` + :data:`REPORT_SUFFIXES`, and ``R/*.png`` / ``.svg`` pairs; [] without the stamp.
    """
    try:
        meta = json.loads((folder / "run_metadata.json").read_text(encoding="utf-8"))
        name, run_id = meta["report_name"], meta["run_id"]
        if not (isinstance(name, str) and isinstance(run_id, str) and run_id and "/" not in name):
            return []
        if run_id not in (folder / f"{name}.html").read_text(encoding="utf-8", errors="replace"):
            return []
    except (OSError, ValueError, KeyError, TypeError):
        return []
    files = ["run_metadata.json"] + [f"{name}{s}" for s in REPORT_SUFFIXES if (folder / f"{name}{s}").is_file()]
    figs = folder / name
    if figs.is_dir():
        files += [f"{name}/{p.name}" for p in sorted(figs.iterdir()) if p.is_file() and p.suffix in (".png", ".svg")
                  and (figs / (p.stem + (".svg" if p.suffix == ".png" else ".png"))).is_file()]
    return files


def report_plan(gpu: str, report_dir: str | None, overwrite: bool = False):
    """The ``mla-lab sweep`` argument list that renders the report of ``gpu`` into a temporary folder, and the
    function that moves it to ``report_dir`` (default ``reports/<gpu>``) once rendered. Raises ValueError for a GPU
    without measured rows or unknown to the lab."""
    from mla_lab import paths
    from mla_lab.arch import get_arch
    from mla_lab.sweep.measured import GRID

    folder = paths.measured_dir(gpu)
    if not (folder / "padding_sweep.csv").is_file():
        have = sorted(p.parent.name for p in paths.measured_dir().glob("*/padding_sweep.csv"))
        raise ValueError(f"--measured={gpu!r}: no {folder}/padding_sweep.csv (run mla-lab measure --experiments "
                        f"padding_sweep on that GPU); GPUs with measured rows: {', '.join(have) or 'none'}")
    try:
        get_arch(gpu)
    except (KeyError, ValueError) as e:
        raise ValueError(f"--measured={gpu!r}: not a GPU the lab models ({e})") from None
    dest = Path(report_dir) if report_dir else paths.REPO_ROOT / "reports" / gpu
    lab_files = functools.partial(paths.replaceable_files, dest, "--report-dir", overwrite, legacy=legacy_report_files)
    lab_files()  # before the render: one line
    _check_out_folder("--report-dir", str(report_dir or dest), dest)
    tmp = Path(tempfile.mkdtemp(prefix=f"mla_lab_report_{gpu}_"))
    name = f"padding_sweep_{gpu}"
    grid = dict(GRID, archs=[gpu] + ([] if gpu == "b200" else ["b200"]))
    argv = ["sweep", *(x for k, v in grid.items() for x in ("-p", k, json.dumps(v))), "-p", "device", "cpu",
            "-p", "store_dir", str(tmp / "st"), "-p", "data_file", str(tmp / f"{name}_rows.csv"),
            "-p", "report_dir", str(tmp / "reports"), "--report-name", name]

    def finish() -> Path:
        # checked again: a file that appeared during the render is refused, never removed
        paths.remove_lab_files(dest, lab_files())
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(tmp / "reports" / name, dest / name, dirs_exist_ok=True)
        for ext in ("html", "ipynb", "png", "svg"):
            src = tmp / "reports" / f"{name}.{ext}"
            if src.is_file():
                shutil.copy2(src, dest)
        shutil.copy2(tmp / f"{name}_rows.csv", dest)
        runs = sorted((tmp / "reports" / "runs").glob("*.json"))
        if runs:
            shutil.copy2(runs[-1], dest / "run_metadata.json")
        written = [p for p in dest.rglob("*") if p.is_file() and p.name != paths.OUTPUT_MANIFEST]
        paths.write_output_manifest(dest, written, "mla-lab report --measured " + gpu)
        shutil.rmtree(tmp, ignore_errors=True)
        return dest / f"{name}.html"

    return argv, finish, functools.partial(shutil.rmtree, tmp, ignore_errors=True)


def cmd_report(args, run_cli) -> int:
    """``run_cli``: :func:`mla_lab.cli.main` (renders through ``mla-lab sweep`` and ``check-report``). Every path is
    checked before the render; the temporary folder goes away whatever happens."""
    argv, finish, cleanup = report_plan(args.measured, args.report_dir, args.overwrite)
    try:
        rc = run_cli(argv)
        if rc:
            return rc
        html = finish()
    finally:
        cleanup()
    print(f"mla-lab: report for {args.measured} -> {html}", file=sys.stderr)
    return run_cli(["check-report", str(html)])
