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

import contextlib
import csv
import datetime as _dt
import hashlib
import html as _html
import itertools
import json
import os
import shutil
from pathlib import Path

__all__ = ["params_hash", "new_run_id", "write_json_atomic", "notebook_to_html", "publish_latest", "list_runs",
           "build_index", "run_headline", "RUNS_DIR", "H200_REPORT"]

RUNS_DIR = "runs"

# nbconvert's lab template, minus everything it would fetch from a CDN: the reports are read offline; printed text
# wraps between words (the lab theme's ``word-break: break-all`` split words mid-way in the advice block).
_OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_css -%}<style>.jp-OutputArea-output pre { word-break: normal; }</style>{%- endblock html_head_css -%}
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
    """A run id not yet used in ``runs_dir`` (``-N`` appended if taken), claimed by creating its figure folder
    ``runs_dir/<id>`` (exclusive: concurrent runs never share an id)."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = f"{now:%Y%m%d-%H%M%S}-{params_hash(params)}"
    runs = Path(runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        rid = base if n == 1 else f"{base}-{n}"
        if not any(runs.glob(f"{rid}.*")):
            with contextlib.suppress(FileExistsError):
                (runs / rid).mkdir()  # atomic claim: two runs started in the same second get different ids
                return rid

def _replace(dst: Path, write) -> None:
    """``write(tmp)`` then rename it to ``dst``: a reader never sees a half-written file."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    write(tmp)
    os.replace(tmp, dst)


def write_json_atomic(path: Path, data) -> None:
    _replace(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1, default=str)))


def notebook_to_html(executed: str | Path, title: str) -> str:
    """HTML of an executed notebook, inputs and prompts hidden, figures embedded, no CDN scripts; outputs of cells
    tagged ``remove-output`` and cells tagged ``remove-cell`` left out."""
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
            out[ext] = report_dir / f"{report_name}.{ext}"
            _replace(out[ext], lambda tmp, src=src: shutil.copyfile(src, tmp))
    figs_src, figs_dst = runs / run_id, report_dir / report_name
    if figs_src.is_dir():
        figs_dst.mkdir(parents=True, exist_ok=True)
        for p in figs_src.iterdir():
            if p.suffix in (".png", ".svg"):
                shutil.copyfile(p, figs_dst / p.name)
                if p.stem == "frontier_1":  # the headline chart beside the latest HTML
                    shutil.copyfile(p, report_dir / f"{report_name}{p.suffix}")
        out["figures"] = figs_dst
    return out

#: The keys of a run's metadata (``runs/<run_id>.json``, hand-editable) the index reads, and their types.
_META_TYPES = {"run_id": str, "html": str, "created_utc": str, "report_name": str, "csv": str, "ipynb": str,
               "params": dict, "figures": dict, "provenance": dict, "duration_s": (int, float)}


def _meta_problem(meta) -> str | None:
    """Why a run's metadata cannot be listed (one phrase), or None: a JSON object with ``run_id`` and ``html``
    strings and every key of :data:`_META_TYPES` of its type; figures and provenance sources objects of objects."""
    if not isinstance(meta, dict):
        return f"a JSON {type(meta).__name__}, not an object"
    for k in ("run_id", "html"):
        if not meta.get(k):
            return f"no {k}"
    for k, t in _META_TYPES.items():
        if k in meta and meta[k] is not None and (isinstance(meta[k], bool) or not isinstance(meta[k], t)):
            return f"{k} is a {type(meta[k]).__name__}"
    if any(not isinstance(v, dict) for v in (meta.get("figures") or {}).values()):
        return "figures holds an entry that is not an object"
    src = (meta.get("provenance") or {}).get("sources") or {}
    if not isinstance(src, dict) or any(v is not None and not isinstance(v, dict) for v in src.values()):
        return "provenance.sources is not an object of objects"
    return None


def list_runs(report_dir: str | Path, skipped: list | None = None) -> list[dict]:
    """Metadata of every published run under ``<report_dir>/runs`` (newest first); a file that is not a run's
    metadata (:func:`_meta_problem`) is skipped and named in ``skipped`` (``[(path, reason)]``), a run whose
    ``.html`` is gone skipped silently."""
    runs = Path(report_dir) / RUNS_DIR
    out = []
    for p in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        try:
            meta = json.loads(p.read_text(encoding="utf-8"))
            why = _meta_problem(meta)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            why = f"not readable UTF-8 JSON ({type(e).__name__})"
        if why is not None:
            if skipped is not None:
                skipped.append((p, why))
            continue
        if (runs / f"{meta['run_id']}.html").is_file():
            out.append(meta)
    return sorted(out, key=lambda m: (m.get("created_utc") or "", m["run_id"]), reverse=True)

def _fmt_val(v) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list) else "-" if v is None else str(v)

def _prov_cell(meta: dict) -> str:
    src = (meta.get("provenance") or {}).get("sources") or {}
    if not src:
        return "<i>unknown</i>"
    m, d = src.get("measured"), src.get("modelled")
    j = lambda s, k: _html.escape(", ".join(s.get(k, ["?"])))  # noqa: E731
    parts = [f"<b>measured</b> {m['rows']} rows on {j(m, 'device')} (torch {j(m, 'torch')}, flash_mla "
             f"{j(m, 'flash_mla')}, commit {j(m, 'git_commit')})" if m else "<b>measured</b>: none"]
    if d:
        parts.append(f"<b>modelled</b> {d['rows']} rows (TTFT scope {j(d, 'ttft_scope')}; calibration "
                     f"{j(d, 'calibration')}; commit {j(d, 'git_commit')})")
    return "<br>".join(parts)

#: The seed point the index's headline reads from each run's rows (the PR's setup: GLM-5 TP8 H200, 1024-token
#: prompts, max_num_batched_tokens 16384; vLLM PR #53878's benchmark) and the PR's strategy.
HEADLINE_POINT = {"model": "glm-5", "tp": "8", "arch": "h200", "max_num_batched_tokens": "16384", "prompt_len": "1024"}
HEADLINE_STRATEGY = "private_workspace"
#: The committed H200 report (measured on a lent H200), linked from every index.
H200_REPORT = "h200/padding_sweep_h200.html"

#: The index page's title: what marks an ``index.html`` as the lab's (a sweep rewrites only its own index).
INDEX_TITLE = "<title>mla_lab reports</title>"
_INDEX_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>mla_lab reports</title>
<style>
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1100px; padding: 0 16px; color: #222; }
.run { border: 1px solid #ccc; border-radius: 4px; padding: 10px 14px; margin: 12px 0; overflow-wrap: anywhere; }
.run h2 { font-size: 15px; margin: 0 0 4px; }
.headline { font-size: 14px; margin: 6px 0; }
.meta, .links { font-size: 12px; color: #444; }
img.thumb { max-width: 100%; width: 420px; border: 1px solid #ddd; display: block; margin: 6px 0; }
details { font-size: 12px; margin-top: 4px; }
code { font-size: 12px; overflow-wrap: anywhere; }
ul.params { margin: 4px 0; padding-left: 18px; }
</style></head><body>
<h1>mla_lab: published reports</h1>
<p>Sparse-MLA prefill Q-concat workspace: memory vs TTFT (vLLM PR #53878). One entry per sweep run, newest first;
{{ runs|length }} report(s). Each report's provenance banner says which rows are measured (GPU, software, commit)
and which modelled (TTFT model, calibration).</p>
<p>{% if latest %}Latest report: <a href="{{ latest }}">{{ latest }}</a> &middot; {% endif %}{% if h200 %}the
committed H200 report (measured on an H200): <a href="{{ h200 }}">{{ h200 }}</a>{% else %}no committed H200 report
here{% endif %}</p>
{% for r in runs %}
<div class="run">
<h2><a href="{{ r.html }}">{{ r.run_id }}</a> <span class="meta">{{ r.created }}{% if r.duration %}, {{ r.duration }}
{% endif %} &middot; {{ r.report_name }} &middot; commit {{ r.commit }}</span></h2>
<p class="headline">{{ r.headline }}</p>
{% if r.thumb %}<a href="{{ r.thumb }}"><img class="thumb" alt="memory vs TTFT, run {{ r.run_id }}"
 src="{{ r.thumb }}"></a>{% endif %}
<div class="meta">{{ r.provenance|safe }}</div>
<div class="links">{% for n, f in r.figures %}{{ n }}: <a href="{{ f.png }}">PNG</a> <a href="{{ f.svg }}">SVG</a>
{% if not loop.last %}&middot; {% endif %}{% endfor %}{% if r.data %} &middot; {% endif %}{% for href, label in r.data %}
<a href="{{ href }}">{{ label }}</a>{% if not loop.last %} &middot; {% endif %}{% endfor %}</div>
<details><summary>parameters</summary><ul class="params">{% for k, v in r.params %}<li>{{ k }}: <code>{{ v }}</code>
</li>{% endfor %}</ul></details>
</div>
{% else %}
<p><i>No published reports yet: run <code>make report</code> (or <code>mla-lab sweep</code>).</i></p>
{% endfor %}
</body></html>
"""


def run_headline(report_dir: str | Path, meta: dict) -> str:
    """One sentence of a run's result at :data:`HEADLINE_POINT`: the PR's TTFT change (measured where the run has
    measured rows, else modelled, and says which), extra persistent MiB and KV lost; or why there is none."""
    path = Path(report_dir) / meta["csv"] if meta.get("csv") else None
    if path is None or not path.is_file():
        return "no rows published with this run"
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("strategy") == HEADLINE_STRATEGY
                    and all(str(r.get(k)) == v for k, v in HEADLINE_POINT.items())]
    except (OSError, csv.Error, UnicodeDecodeError):
        return "the run's rows cannot be read"
    best = next((r for r in rows if r.get("source") == "measured"), rows[0] if rows else None)  # measured first
    where = "GLM-5 TP8 H200, 32 x 1024-token prompts, max_num_batched_tokens 16384"
    if best is None:
        return f"the grid of this run does not hold the PR's point ({where})"
    if best.get("fits_in_memory") == "False" or best.get("status") not in (None, "", "ok"):
        return f"PR #53878 at {where}: not priced ({best.get('fit_reason') or best.get('reason') or 'failed'})"

    def num(k):
        try:
            return float(best.get(k))
        except (TypeError, ValueError):
            return float("nan")

    ch, mib, lost, pct = map(num, ("ttft_change_pct", "extra_persistent_mib", "kv_tokens_lost", "kv_capacity_pct_lost"))
    src = best.get("source") or "modelled"
    ttft = f"TTFT {ch:+.1f} % ({src})" if ch == ch else "TTFT not priced"
    mem = f"+{mib:,.0f} MiB extra per rank = {lost:,.0f} KV tokens lost ({pct:.1f} % of KV capacity)" if mib == mib else ""
    return f"PR #53878 (private pre-padded workspace) at {where}: {ttft}, {mem}".rstrip(", ")


def build_index(report_dir: str | Path, latest_name: str = "padding_sweep", skipped: list | None = None) -> Path:
    """Write ``<report_dir>/index.html`` (:data:`_INDEX_TEMPLATE`): every published run, newest first, with its
    headline, thumbnail, provenance, links and parameters. ``skipped``: as :func:`list_runs`. Returns its path."""
    import jinja2

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for m in list_runs(report_dir, skipped):
        p, figs = m.get("params") or {}, m.get("figures") or {}
        runs.append({"run_id": m["run_id"], "html": m["html"],
                     "created": m.get("created_utc", "?").replace("T", " ").replace("+00:00", " UTC"),
                     "duration": f"{m['duration_s']:.0f} s" if isinstance(m.get("duration_s"), (int, float)) else "",
                     "report_name": m.get("report_name", ""), "commit": str(m.get("git_commit", "?")),
                     "headline": run_headline(report_dir, m), "thumb": figs.get("frontier_1", {}).get("png"),
                     "provenance": _prov_cell(m), "figures": sorted(figs.items()),
                     "data": [(m[k], lbl) for k, lbl in (("csv", "rows (CSV)"), ("ipynb", "notebook")) if m.get(k)],
                     "params": [(k, "= num_prompts" if k == "concurrency" and p[k] is None else _fmt_val(p[k]))
                                for k in _GRID_KEYS if k in p]})
    latest = report_dir / f"{latest_name}.html"
    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    page = env.from_string(_INDEX_TEMPLATE).render(runs=runs, latest=latest.name if latest.is_file() else "",
                                                   h200=H200_REPORT if (report_dir / H200_REPORT).is_file() else "")
    _replace(report_dir / "index.html", lambda tmp: tmp.write_text(page))
    return report_dir / "index.html"
