"""The published report site under ``reports/``: one report per sweep run, the latest copy, and an index.

Layout (``report_dir`` is ``reports`` by default)::

    reports/index.html                     every published run: date, parameters, provenance, links
    reports/<name>.html, <name>.ipynb      the latest run's report and executed notebook (name: padding_sweep)
    reports/<name>.png, <name>.svg         the latest memory-vs-TTFT chart
    reports/<name>/<figure>.png|svg        the latest run's figures
    reports/runs/<run_id>.html|.ipynb      each run's report and executed notebook (never overwritten)
    reports/runs/<run_id>.json             its metadata (what the index is built from)
    reports/runs/<run_id>.csv              a copy of the rows it reported
    reports/runs/<run_id>/<figure>.png|svg its figures; provenance.json

``run_id`` is ``<UTC yyyymmdd-HHMMSS>-<8 hex of the parameters' hash>`` (a suffix ``-2``, ``-3``... when two runs
share a second and parameters). The HTML reports are self-contained (figures embedded) and load nothing from the
network: nbconvert's CDN scripts (require.js, MathJax, mermaid) are left out.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import html as _html
import json
import os
import shutil
from pathlib import Path

__all__ = ["params_hash", "new_run_id", "write_json_atomic", "notebook_to_html", "publish_latest", "list_runs",
           "build_index", "RUNS_DIR"]

RUNS_DIR = "runs"

# nbconvert's lab template, minus everything it would fetch from a CDN: the reports are read offline.
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""

_GRID_KEYS = ("models", "tp_sizes", "archs", "max_num_batched_tokens", "prompt_lens", "kv_cache_dtype", "num_prompts",
              "concurrency", "strategies", "device")

def params_hash(params: dict) -> str:
    """SHA-1 (8 hex) of the parameters' canonical JSON."""
    return hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]

def new_run_id(runs_dir: str | Path, params: dict, now: _dt.datetime | None = None) -> str:
    """A run id not yet used in ``runs_dir``: ``<UTC yyyymmdd-HHMMSS>-<params_hash>`` (+ ``-N`` if taken), claimed by
    creating its figure folder ``runs_dir/<id>`` (exclusive), so concurrent runs never share an id."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = f"{now:%Y%m%d-%H%M%S}-{params_hash(params)}"
    runs = Path(runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    rid, n = base, 1
    while True:
        if not any(runs.glob(f"{rid}.*")):
            try:
                (runs / rid).mkdir()  # atomic claim: two runs started in the same second get different ids
                return rid
            except FileExistsError:
                pass
        n += 1
        rid = f"{base}-{n}"

def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)

def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

def notebook_to_html(executed: str | Path, title: str) -> str:
    """HTML of an executed notebook with inputs and prompts hidden, figures embedded, no CDN scripts. Outputs of
    cells tagged ``remove-output`` (the sweep's progress log) and cells tagged ``remove-cell`` are left out; the
    executed notebook keeps them."""
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import TagRemovePreprocessor

    nb = nbformat.read(str(executed), as_version=4)
    nb.metadata["title"] = title
    exp = HTMLExporter(extra_loaders=[DictLoader({"mla_offline.html.j2": _OFFLINE_TEMPLATE})],
                       template_file="mla_offline.html.j2", exclude_input=True, exclude_input_prompt=True,
                       exclude_output_prompt=True)
    exp.register_preprocessor(TagRemovePreprocessor(remove_all_outputs_tags={"remove-output"},
                                                    remove_cell_tags={"remove-cell"}), enabled=True)
    body, _ = exp.from_notebook_node(nb)
    return body

def publish_latest(report_dir: Path, report_name: str, run_id: str) -> dict:
    """Copy run ``run_id``'s HTML, executed notebook and figures to the latest-report paths. Returns their paths."""
    runs = report_dir / RUNS_DIR
    out = {}
    for ext in ("html", "ipynb"):
        src = runs / f"{run_id}.{ext}"
        if src.is_file():
            dst = report_dir / f"{report_name}.{ext}"
            tmp = dst.with_name(f".{dst.name}.tmp")
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
            out[ext] = dst
    figs_src, figs_dst = runs / run_id, report_dir / report_name
    if figs_src.is_dir():
        figs_dst.mkdir(parents=True, exist_ok=True)
        for p in figs_src.iterdir():
            if p.suffix in (".png", ".svg"):
                shutil.copyfile(p, figs_dst / p.name)
        for ext in ("png", "svg"):  # the headline chart beside the latest HTML
            p = figs_src / f"frontier_1.{ext}"
            if p.is_file():
                shutil.copyfile(p, report_dir / f"{report_name}.{ext}")
        out["figures"] = figs_dst
    return out

def list_runs(report_dir: str | Path) -> list[dict]:
    """Metadata of every published run under ``<report_dir>/runs`` (newest first); unreadable files are skipped."""
    runs = Path(report_dir) / RUNS_DIR
    out = []
    for p in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        try:
            meta = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(meta, dict) and meta.get("run_id") and (runs / f"{meta['run_id']}.html").is_file():
            out.append(meta)
    return sorted(out, key=lambda m: (m.get("created_utc", ""), m["run_id"]), reverse=True)

def _fmt_val(v) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return "-" if v is None else str(v)

def _prov_cell(meta: dict) -> str:
    e = _html.escape
    prov = meta.get("provenance") or {}
    src = prov.get("sources") or {}
    if not src:
        return "<i>unknown</i>"
    parts = []
    m = src.get("measured")
    if m:
        parts.append(f"<b>measured</b> {m['rows']} rows on {e(', '.join(m.get('device', ['?'])))} "
                     f"(torch {e(', '.join(m.get('torch', ['?'])))}, flash_mla {e(', '.join(m.get('flash_mla', ['?'])))}"
                     f", commit {e(', '.join(m.get('git_commit', ['?'])))})")
    else:
        parts.append("<b>measured</b>: none")
    m = src.get("modelled")
    if m:
        cal = ", ".join(m.get("calibration", ["?"]))
        parts.append(f"<b>modelled</b> {m['rows']} rows (TTFT scope {e(', '.join(m.get('ttft_scope', ['?'])))}; "
                     f"calibration {e(cal)}; commit {e(', '.join(m.get('git_commit', ['?'])))})")
    return "<br>".join(parts)

def build_index(report_dir: str | Path, latest_name: str = "padding_sweep") -> Path:
    """Write ``<report_dir>/index.html`` listing every published run (newest first) with its date, parameters,
    provenance, figures (thumbnail + PNG/SVG links), data and notebook. Returns its path."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    e = _html.escape
    runs = list_runs(report_dir)
    rows = []
    for m in runs:
        rid = m["run_id"]
        p = m.get("params") or {}
        params = "<br>".join(f"{k}: <code>{e('= num_prompts' if k == 'concurrency' and p[k] is None else _fmt_val(p[k]))}"
                             "</code>" for k in _GRID_KEYS if k in p)
        figs = m.get("figures") or {}
        thumb = ""
        if "frontier_1" in figs:
            thumb = (f"<a href='{e(figs['frontier_1']['png'])}'><img class='thumb' alt='memory vs TTFT, run "
                     f"{e(rid)}' src='{e(figs['frontier_1']['png'])}'></a><br>")
        flinks = "<br>".join(f"{e(n)}: <a href='{e(f['png'])}'>PNG</a> <a href='{e(f['svg'])}'>SVG</a>"
                             for n, f in sorted(figs.items()))
        data = " &middot; ".join(f"<a href='{e(m[k])}'>{lbl}</a>" for k, lbl in (("csv", "rows (CSV)"),
                                                                                  ("ipynb", "notebook"))
                                 if m.get(k))
        created = m.get("created_utc", "?").replace("T", " ").replace("+00:00", " UTC")
        dur = f"<br><small>{m['duration_s']:.0f} s</small>" if isinstance(m.get("duration_s"), (int, float)) else ""
        rows.append(f"<tr><td>{e(created)}{dur}</td><td><a href='{e(m['html'])}'>{e(rid)}</a><br>"
                    f"<small>{e(m.get('report_name', ''))} &middot; commit {e(str(m.get('git_commit', '?')))}"
                    f"</small></td><td class='params'>{params}</td><td>{_prov_cell(m)}</td>"
                    f"<td>{thumb}{flinks}</td><td>{data}</td></tr>")
    latest = report_dir / f"{latest_name}.html"
    latest_line = (f"<p>Latest report: <a href='{e(latest.name)}'>{e(latest.name)}</a></p>" if latest.is_file()
                   else "")
    body = ("<table><thead><tr><th>date</th><th>report</th><th>parameters</th><th>provenance</th><th>figures</th>"
            "<th>data</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>") if rows else \
        "<p><i>No published reports yet: run <code>make report</code> (or <code>mla-lab sweep</code>).</i></p>"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mla_lab reports</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; width: 100%; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 6px 8px; vertical-align: top; text-align: left; }}
th {{ background: #eef3f8; }}
td.params, td:first-child {{ white-space: nowrap; }}
code {{ font-size: 12px; }}
img.thumb {{ width: 260px; border: 1px solid #ddd; }}
</style></head><body>
<h1>mla_lab: published reports</h1>
<p>Sparse-MLA prefill Q-concat workspace: memory vs TTFT (vLLM PR #53878). One row per sweep run, newest first;
{len(runs)} report(s). Each report's provenance banner says which rows are measured (GPU, software, commit) and which
modelled (TTFT model, calibration).</p>
{latest_line}
{body}
</body></html>
"""
    out = report_dir / "index.html"
    _write_text_atomic(out, page)
    return out
