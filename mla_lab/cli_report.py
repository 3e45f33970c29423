"""``mla-lab index`` and ``mla-lab check-report``: the published reports' index and their browser check."""

from __future__ import annotations

import sys
from pathlib import Path

from . import cli_doors as doors
from .cli_doors import CLIError, DoorError, rel_path

__all__ = ["add_parsers", "cmd_index", "cmd_check_report"]


def _check_report_dir(report_dir: str) -> Path:
    """``--report-dir``: an existing folder holding a report the lab published (:func:`mla_lab.report.site.list_runs`);
    nothing is created. DoorError: empty, missing, a file (or under one), no published run.
    """
    from .report.site import RUNS_DIR, list_runs

    allowed = "allowed: the folder 'mla-lab sweep' published reports into (default reports)"
    if not isinstance(report_dir, str) or not report_dir.strip():
        raise DoorError(f"--report-dir {report_dir!r}: empty; {allowed}")
    if "\x00" in report_dir:
        raise DoorError(f"--report-dir {report_dir!r}: holds a NUL byte; {allowed}")
    p = Path(report_dir).expanduser()
    blocker = doors.file_in_the_way(p)
    if blocker is not None:
        raise DoorError(f"--report-dir {report_dir}: {blocker} is a file, not a folder; {allowed}")
    if not p.exists():
        raise DoorError(f"--report-dir {report_dir}: no such folder; {allowed}")
    if not list_runs(p):
        raise DoorError(f"--report-dir {report_dir}: holds no report the lab published (no {RUNS_DIR}/<run_id>.json "
                        f"with its .html); {allowed}")
    return p


def cmd_index(args) -> int:
    from .report import site

    name = doors.check_report_name("padding_sweep" if args.report_name is None else args.report_name)
    rd = _check_report_dir(args.report_dir)  # exists, a folder, holds a published run: nothing is created
    if args.report_name is not None and not (rd / f"{name}.html").is_file():  # a typo would drop the index's latest link
        have = sorted(p.stem for p in rd.glob("*.html") if p.name != "index.html")
        raise DoorError(f"--report-name={name!r}: no {name}.html in {args.report_dir}; allowed: {have}")
    skipped: list = []
    try:
        out = site.build_index(rd, name, skipped)
    except (OSError, ValueError) as e:
        what = getattr(e, "strerror", None) or str(e)
        raise DoorError(f"--report-dir {args.report_dir}: {what}; give the folder the reports are in") from None
    for path, why in skipped:  # a hand-edited or corrupt run record is named, never a traceback
        print(f"mla-lab: note: {rel_path(path)} skipped: {why}", file=sys.stderr)
    print(f"mla-lab: index of {len(site.list_runs(args.report_dir))} report(s) written to {rel_path(out)}")
    return 0


def cmd_check_report(args) -> int:
    from .report.browser import check_in_browser

    for h in args.html:  # bad input (exit 2) before any browser starts
        if not h or not Path(h).is_file():
            raise DoorError(f"check-report {h}: no such file; allowed: an HTML report 'mla-lab sweep' wrote "
                            "(default reports/padding_sweep.html reports/index.html)")
        if Path(h).suffix.lower() not in (".html", ".htm"):
            raise DoorError(f"check-report {h}: not an .html file; allowed: an HTML report 'mla-lab sweep' "
                            "wrote")
    bad = 0
    for h in args.html:
        try:
            r = check_in_browser(h)
        except RuntimeError as e:
            raise CLIError(str(e)) from None
        inks = ", ".join(f"{100 * i['ink']:.1f}%" for i in r["images"])
        print(f"mla-lab: {h}: {'ok' if r['ok'] else 'FAILED'} ({len(r['images'])} figure(s), non-background "
              f"pixels {inks or '-'}; screenshot {rel_path(r['screenshot'])})")
        for p in r["problems"]:
            print(f"  - {p}")
        bad += not r["ok"]
    return 1 if bad else 0


def add_parsers(sub) -> None:
    """The ``index`` and ``check-report`` sub-commands on ``sub`` (argparse sub-parsers)."""
    ix = sub.add_parser("index", help="rebuild <report-dir>/index.html from the published runs")
    ix.add_argument("--report-dir", default="reports",
                    help="an existing folder 'mla-lab sweep' published reports into (default reports)")
    ix.add_argument("--report-name", help="basename of the latest report there (linked; default padding_sweep)")
    ck = sub.add_parser("check-report", help="render reports in headless Chromium: every figure loaded and not "
                                             "blank, no JavaScript error, nothing wider than the window")
    ck.add_argument("html", nargs="*", default=["reports/padding_sweep.html", "reports/index.html"],
                    help="existing HTML report files (default reports/padding_sweep.html reports/index.html)")
