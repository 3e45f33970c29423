"""``mla-lab`` command line: run the papermill-parameterized sweep notebook and publish it as HTML.

    mla-lab sweep [-f params.yaml] [-p name value ...] [--notebook PATH] [--report-name NAME] [--timeout S]

Parameters are validated before any kernel starts (unknown names, wrong types, empty grids are errors: papermill
itself would silently inject them). ``-p`` values are parsed as YAML (``-p tp_sizes "[1, 8]"``, ``-p force true``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_NOTEBOOK = REPO / "notebooks" / "padding_sweep.ipynb"


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


def run_notebook(params: dict, notebook: Path, report_name: str, timeout: int, cwd: Path) -> Path:
    """Execute ``notebook`` with papermill (kernel ``mla-lab``, this interpreter, per-cell ``timeout`` seconds), write the executed
    copy and an HTML export with inputs hidden into ``report_dir``. Returns the HTML path.

    Raises:
        CLIError: the notebook is missing or has no cell tagged ``parameters``; a cell failed (its error is named).
    """
    import nbformat
    import papermill as pm
    from nbconvert import HTMLExporter

    from .sweep import validate_params

    if not notebook.is_file():
        raise CLIError(f"--notebook {notebook}: no such notebook")
    nb = nbformat.read(notebook, as_version=4)
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        raise CLIError(f"notebook {notebook} has no cell tagged 'parameters'; papermill cannot inject parameters")
    validate_params(params)  # fail before starting a kernel
    from .kernelspec import ensure_kernel

    kernel = ensure_kernel()
    report_dir = Path(params.get("report_dir", "reports"))
    report_dir = report_dir if report_dir.is_absolute() else cwd / report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    executed = report_dir / f"{report_name}.ipynb"
    try:
        pm.execute_notebook(str(notebook), str(executed), parameters=params, kernel_name=kernel,
                            execution_timeout=timeout, progress_bar=False, cwd=str(cwd), log_output=False)
    except pm.PapermillExecutionError as e:
        raise CLIError(f"notebook cell {e.exec_count} failed: {e.ename}: {e.evalue} "
                       f"(executed copy with the traceback: {executed})") from None
    html, _ = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True).from_filename(
        str(executed))
    out = report_dir / f"{report_name}.html"
    out.write_text(html)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mla-lab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sw = sub.add_parser("sweep", help="run the padding sweep notebook through papermill and publish HTML")
    sw.add_argument("-f", "--params-file", action="append", default=[], help="YAML file of parameters")
    sw.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    sw.add_argument("--notebook", default=str(DEFAULT_NOTEBOOK))
    sw.add_argument("--report-name", default="padding_sweep", help="basename of the report files")
    sw.add_argument("--timeout", type=int, default=600, help="per-cell execution timeout, seconds")
    sw.add_argument("--force", action="store_true", help="recompute points already stored")
    args = ap.parse_args(argv)
    try:
        params = _load_params(args.params_file, args.param)
        if args.force:
            params["force"] = True
        # relative paths resolve against the directory the command runs in
        html = run_notebook(params, Path(args.notebook), args.report_name, args.timeout, Path.cwd())
    except (CLIError, ValueError) as e:
        print(f"mla-lab: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1
    print(f"mla-lab: report written to {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
