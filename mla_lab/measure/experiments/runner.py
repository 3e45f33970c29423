"""``mla-lab measure``: the chosen experiments in fresh processes (:meth:`.Experiment.command`) on this GPU. A
between-process one runs ``processes`` times into ``<run>/.processes/<name>/p<k>/``, merged with ``process`` = k
first (:func:`merge_processes`); the others once. ``provenance.json`` (provenance, command lines, exit codes) is
rewritten after every process (``--resume`` finishes a cut run). A file under ``--out`` (default
``data/measured/<gpu>``) is never replaced without ``overwrite``: the run goes to ``<out>/runs/<UTC timestamp>/``.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from mla_lab.paths import measured_dir
from mla_lab.provenance import provenance

from . import Experiment

DEFAULT_PROCESSES = 5


def gpu_slug(name: str) -> str:
    """A GPU's folder: the model word of ``torch.cuda.get_device_name`` ("NVIDIA H100 80GB HBM3" -> ``h100``), else
    the name lower-cased, non-alphanumerics as ``-``. Raises ValueError on an empty name."""
    s = (name or "").strip()
    if not s:
        raise ValueError("gpu name: '' (torch.cuda.get_device_name gave nothing)")
    m = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", s.upper())
    return m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def dry_run_lines(experiments: list[Experiment], processes: int, out: str) -> list[str]:
    """What ``--dry-run`` prints: per experiment its processes, ``python -m`` entry, shapes, needs, then its files
    (imports the modules; CPU)."""
    lines = [f"mla-lab measure --dry-run: {len(experiments)} experiments, {processes} processes each for the "
             f"between-process ones, into {out}/ (nothing is run; * = run without --experiments)"]
    for e in experiments:
        entry = e.module if e.argv else f"{__package__} {e.name}"  # what `python -m` runs
        lines.append(f"{e.name:<22}{'*' if e.default else ' '}{processes if e.between_process else 1} x python -m "
                     f"{entry}  ({len(e.shapes())} shapes; {e.summary}{'; needs ' + e.needs if e.needs else ''})")
        lines += [f"    -> {e.folder + '/' if e.folder else ''}{f}" for f in e.outputs()]
    return lines


def merge_processes(parts: list[tuple[int, Path]], dest: Path) -> int:
    """The per-process CSVs ``parts`` ((k, path)) into ``dest``, ``process`` = k first, the columns' union in
    first-seen order; returns the row count. Raises FileExistsError when ``dest`` exists."""
    if dest.exists():
        raise FileExistsError(f"{dest} exists")
    cols, rows = ["process"], []
    for k, path in sorted(parts):
        with open(path, newline="") as f:
            r = csv.DictReader(f)
            for c in r.fieldnames or []:
                if c not in cols:
                    cols.append(c)
            rows += [{**row, "process": k} for row in r]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return len(rows)


def run_dir(out: Path, experiments: list[Experiment], overwrite: bool) -> tuple[Path, list[Path]]:
    """(``out``, or ``out/runs/<UTC timestamp>/`` when a file it would write exists and not ``overwrite``; those
    files)."""
    clash = [out / (f"{e.folder}/" if e.folder else "") / f for e in experiments for f in e.outputs()]
    clash = [p for p in clash if p.exists()]
    if clash and not overwrite:
        return out / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), clash
    return out, []


def read_record(run_folder: Path, processes: int) -> dict:
    """The ``provenance.json`` of a run to resume. Raises ValueError (one line): not a folder, no record, or
    another process count."""
    if not run_folder.is_dir():
        raise ValueError(f"--resume={str(run_folder)!r} is not a folder; allowed: a run folder mla-lab measure wrote")
    if not (run_folder / "provenance.json").is_file():
        raise ValueError(f"--resume={str(run_folder)!r} holds no provenance.json; allowed: a run folder mla-lab "
                         "measure wrote")
    record = _checked_record(run_folder / "provenance.json")
    if record.get("processes") != processes:
        raise ValueError(f"--processes={processes}: the run in {run_folder} was started with "
                         f"{record.get('processes')}; allowed: --processes {record.get('processes')} to resume it")
    return record


def _checked_record(path: Path) -> dict:
    """A run's (hand-editable) ``provenance.json``, checked: a JSON object, ``processes`` an int >= 1,
    ``experiments`` name -> {``commands``: strings, ``exit``: ints or nulls, ``merged``: bool}. Raises ValueError
    (one line: the file, the key, what is allowed)."""
    fix = "allowed: the provenance.json mla-lab measure wrote (restore it, or start a new run without --resume)"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--resume: {path} is not readable JSON ({' '.join(str(e).split())[:80]}); {fix}") from None
    if not isinstance(record, dict):
        raise ValueError(f"--resume: {path} holds a JSON {type(record).__name__}, not an object; {fix}")
    n = record.get("processes")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--resume: {path}: processes={str(n)[:40]!r} is not an int >= 1; {fix}")
    exps = record.get("experiments")
    if not isinstance(exps, dict):
        raise ValueError(f"--resume: {path}: experiments is {type(exps).__name__}, not an object of experiment name "
                         f"-> its record; {fix}")
    for name, entry in exps.items():
        where = f"--resume: {path}: experiments[{name[:40]!r}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is {type(entry).__name__}, not an object; {fix}")
        cmds, exits, merged = entry.get("commands", []), entry.get("exit", []), entry.get("merged", False)
        if not (isinstance(cmds, list) and all(isinstance(c, str) for c in cmds)):
            raise ValueError(f"{where}.commands is not a list of strings; {fix}")
        if not (isinstance(exits, list) and all(x is None or (isinstance(x, int) and not isinstance(x, bool))
                                                 for x in exits)):
            raise ValueError(f"{where}.exit is not a list of exit codes (ints or null); {fix}")
        if not isinstance(merged, bool):
            raise ValueError(f"{where}.merged is not true or false; {fix}")
        entry.setdefault("commands", [])
        entry.setdefault("exit", [])
    return record


def resume_lines(record: dict, experiments: list[Experiment], processes: int) -> str:
    """What ``--resume`` would run for ``record``: per experiment, merged (kept) or the processes left."""
    lines, left_total = ["--resume: what this run still needs"], 0
    for e in experiments:
        entry = record.get("experiments", {}).get(e.name, {})
        n = processes if e.between_process else 1
        left = [k for k in range(1, n + 1) if not _done(entry, k)]
        left_total += len(left)
        state = "merged; kept" if entry.get("merged") else (f"processes {left} left" if left else "all ran; merge")
        lines.append(f"  {e.name:<22}{state}")
    lines.append(f"  {left_total} processes to run" if left_total else "  nothing left to run")
    return "\n".join(lines)


def _done(entry: dict, k: int) -> bool:
    ex = entry.get("exit", [])
    return len(ex) >= k and ex[k - 1] == 0


def _start(experiments, processes, out, overwrite, resume, log) -> tuple[Path, dict]:
    """The run folder and its record (a resumed run's, the resumption noted, or a new one)."""
    if resume is not None:
        dest = Path(resume)
        record = read_record(dest, processes)
        record.setdefault("resumed_utc", []).append(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        record.setdefault("resumed_provenance", []).append(provenance("measured"))
        return dest, record
    dest, clash = run_dir(out, experiments, overwrite)
    if clash:
        log(f"{len(clash)} files exist under {out} (e.g. {clash[0]}); not overwriting them (--overwrite): this run "
            f"goes to {dest}")
    dest.mkdir(parents=True, exist_ok=True)
    prov = provenance("measured")
    return dest, {"provenance": prov, "processes": processes, "started_utc": prov.get("timestamp"), "experiments": {}}


def _kept(e, entry: dict, folder: Path, log) -> bool:
    """Merged in the resumed run with its files there: kept; its files gone: its record cleared, run again."""
    if not entry.get("merged"):
        return False
    missing = [f for f in e.outputs() if not (folder / f).is_file()]
    if not missing:
        log(f"[measure] {e.name}: merged in the run being resumed; kept")
        return True
    log(f"[measure] {e.name}: merged in the run being resumed, but {missing} are gone: run again")
    entry.update(commands=[], exit=[], merged=False)
    return False


class _Run:
    """One call of :func:`run`: folder, record (saved after every process), budget."""

    def __init__(self, dest: Path, record: dict, opts: dict, log):
        self.dest, self.record, self.opts, self.log = dest, record, opts, log
        self.t0, self.failed, self.left = time.time(), 0, 0

    def save(self) -> None:
        (self.dest / "provenance.json").write_text(json.dumps(self.record, indent=1, default=str) + "\n")

    def process(self, e, entry: dict, k: int, n: int, pdir: Path) -> None:
        """Process ``k`` of ``e`` into ``pdir``, unless it ran (exit 0) before or the budget is spent."""
        budget = self.opts["budget_s"]
        if _done(entry, k):
            return
        if budget is not None and time.time() - self.t0 > budget:
            self.left += 1
            return
        pdir.mkdir(parents=True, exist_ok=True)
        if not e.between_process:  # its rows are appended: a file left there (--overwrite, --resume) is replaced
            for f in e.outputs():
                (pdir / f).unlink(missing_ok=True)
        cmd = [self.opts["python"], *e.command(str(pdir), k, self.opts["engine_root"], self.opts["smoke"])]
        self.log(f"[measure] {e.name} process {k}/{n}: {' '.join(cmd[1:])}")
        t0 = time.time()
        try:
            rc = subprocess.run(cmd, timeout=e.timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        self.log(f"[measure] {e.name} process {k}: exit {rc} in {time.time() - t0:.0f} s")
        cmds, exits = entry["commands"], entry["exit"]
        while len(exits) < k:  # a resumed entry keeps one slot per process
            cmds.append("")
            exits.append(None)
        cmds[k - 1], exits[k - 1] = " ".join(cmd[1:]), rc
        self.failed += rc != 0
        self.save()

    def experiment(self, e, processes: int) -> None:
        """Every process of ``e``, then (between-process, all ran) the merge."""
        folder = self.dest / e.folder if e.folder else self.dest
        n = processes if e.between_process else 1
        entry = self.record["experiments"].setdefault(e.name, {"module": e.module, "processes": n, "commands": [],
                                                               "exit": []})
        if _kept(e, entry, folder, self.log):
            return
        pdirs = {k: self.dest / ".processes" / e.name / f"p{k}" if e.between_process else folder
                 for k in range(1, n + 1)}
        for k, pdir in pdirs.items():
            self.process(e, entry, k, n, pdir)
        exits = entry["exit"]
        if len(exits) < n or any(x is None for x in exits[:n]):
            return  # not merged: a process the budget left is for --resume
        for f in e.outputs() if e.between_process else ():
            parts = [(k, pdirs[k] / f) for k in pdirs if _done(entry, k) and (pdirs[k] / f).is_file()]
            target = folder / f
            if parts and target.exists() and (self.opts["overwrite"] or self.opts["resumed"]):
                target.unlink()
            if parts:
                self.log(f"[measure] {e.name}: {merge_processes(parts, target)} rows from {len(parts)} processes -> "
                         f"{target}")
        entry["merged"] = all(_done(entry, k) for k in pdirs)  # a failed one: --resume retries it
        self.save()


def run(experiments: list[Experiment], processes: int, out: Path, overwrite: bool = False,
        engine_root: str = ".engine", python: str = sys.executable, log=print, resume: Path | None = None,
        budget_s: float | None = None, smoke: bool = False) -> int:
    """Run ``experiments``: 0 when every process exited 0, 3 when ``budget_s`` ran out first (resumable), else 1.
    ``resume``: a cut run's folder (processes that exited 0 keep their rows; a merged experiment whose files are gone
    runs again). ``budget_s``: no process starts after it. ``smoke``: every process with ``--smoke``. Needs CUDA."""
    dest, record = _start(experiments, processes, out, overwrite, resume, log)
    r = _Run(dest, record, {"python": python, "engine_root": engine_root, "budget_s": budget_s, "smoke": smoke,
                            "overwrite": overwrite, "resumed": resume is not None}, log)
    for e in experiments:
        r.experiment(e, processes)
    r.save()
    if r.left:
        log(f"[measure] budget {budget_s:.0f} s spent: {r.left} processes left; finish with --resume {dest}")
    log(f"[measure] provenance -> {dest / 'provenance.json'}")
    return 3 if r.left else 1 if r.failed else 0


def default_out(gpu: str) -> Path:
    return measured_dir(gpu)
