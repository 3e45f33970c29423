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
import io
import json
import os
import shutil
from pathlib import Path

__all__ = ["params_hash", "new_run_id", "notebook_to_html", "list_runs", "build_index", "publish_latest",
           "write_json_atomic", "RUNS_DIR"]

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
            p = figs_src / f"memory_vs_ttft.{ext}"
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
        if "memory_vs_ttft" in figs:
            thumb = (f"<a href='{e(figs['memory_vs_ttft']['png'])}'><img class='thumb' alt='memory vs TTFT, run "
                     f"{e(rid)}' src='{e(figs['memory_vs_ttft']['png'])}'></a><br>")
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


# ------------------------------------------------------------------------------------------- browser check
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary (env ``CHROMIUM`` first, then the usual names on PATH), or None."""
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CHROMIUM_NAMES:
        p = shutil.which(name)
        if p:
            return p
    return None


class _CDP:
    """Chrome DevTools Protocol over ``--remote-debugging-pipe`` (fd 3: commands in, fd 4: messages out, each JSON
    message ends with a NUL byte). Stdlib only."""

    def __init__(self, binary: str, user_data_dir: str, timeout: float):
        import subprocess
        import threading

        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def child_fds():  # runs in the child before exec: put the pipe ends where Chromium expects them
            import fcntl

            hi_r, hi_w = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(res_w, fcntl.F_DUPFD, 10)
            os.dup2(hi_r, 3)  # dup2 to another fd number clears close-on-exec
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}",
                                      "--remote-debugging-pipe", "about:blank"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=False,
                                     preexec_fn=child_fds)
        os.close(cmd_r)
        os.close(res_w)
        self._next = 0
        self._msgs: list[dict] = []
        self._cv = threading.Condition()
        self._eof = False
        self._stderr = b""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def _drain_stderr(self):
        for line in self.proc.stderr:
            self._stderr = (self._stderr + line)[-4000:]

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._res_r, 1 << 16)
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                with self._cv:
                    self._msgs.append(json.loads(raw))
                    self._cv.notify_all()
        with self._cv:
            self._eof = True
            self._cv.notify_all()

    def _wait(self, pred, what: str):
        import time

        end = time.time() + self.timeout
        with self._cv:
            while True:
                for i, m in enumerate(self._msgs):
                    if pred(m):
                        return self._msgs.pop(i)
                left = end - time.time()
                if left <= 0 or self._eof:
                    err = self._stderr.decode(errors="replace")[-1500:]
                    raise RuntimeError(f"chromium: no {what} within {self.timeout:.0f} s"
                                       f"{' (browser exited)' if self._eof else ''}; stderr tail: {err}")
                self._cv.wait(min(left, 0.5))

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        mid = self._next
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        r = self._wait(lambda m: m.get("id") == mid, f"reply to {method}")
        if "error" in r:
            raise RuntimeError(f"chromium: {method} failed: {r['error']}")
        return r.get("result", {})

    def events(self) -> list[dict]:
        with self._cv:
            ev = [m for m in self._msgs if "method" in m]
            self._msgs = [m for m in self._msgs if "method" not in m]
        return ev

    def wait_event(self, method: str, session: str) -> dict:
        return self._wait(lambda m: m.get("method") == method and m.get("sessionId") == session, f"{method} event")

    def close(self):
        import subprocess

        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for fd in (self._cmd_w, self._res_r):
            try:
                os.close(fd)
            except OSError:
                pass


_IMAGES_JS = """(async () => {
  await Promise.all(Array.from(document.images).map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  const de = document.documentElement;
  return {
    width: Math.max(de.scrollWidth, document.body ? document.body.scrollWidth : 0),
    height: Math.max(de.scrollHeight, document.body ? document.body.scrollHeight : 0),
    title: document.title,
    images: Array.from(document.images).map(i => {
      const r = i.getBoundingClientRect();
      return {src: i.currentSrc.slice(0, 80), alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth,
              naturalHeight: i.naturalHeight, x: r.left + window.scrollX, y: r.top + window.scrollY,
              width: r.width, height: r.height};
    }),
  };
})()"""


def _ink_fraction(img) -> float:
    """Fraction of pixels differing (max channel difference > 40) from the most common colour of ``img``."""
    rgb = img.convert("RGB")
    colors = rgb.getcolors(maxcolors=rgb.width * rgb.height) or []
    if not colors:
        return 0.0
    bg = max(colors, key=lambda c: c[0])[1]
    ink = sum(n for n, c in colors if max(abs(c[k] - bg[k]) for k in range(3)) > 40)
    return ink / (rgb.width * rgb.height)


def check_in_browser(html_path: str | Path, screenshot: str | Path | None = None, min_ink: float = 0.01,
                     width: int = 1280, timeout: float = 60.0, chromium: str | None = None) -> dict:
    """Render ``html_path`` in headless Chromium and check it as a reader would see it.

    Checks: every ``<img>`` finished loading with a non-zero natural size and a visible box; in a full-page
    screenshot, each image's box has at least ``min_ink`` of its pixels differing from its dominant (background)
    colour (a blank or single-colour figure fails); no JavaScript exception, ``console.error`` or browser error log
    entry (e.g. a resource that failed to load) occurred.

    Returns ``{"ok", "problems" (list of str), "images" (list of dicts with "ink"), "errors" (list of str),
    "screenshot" (path), "page" ({width, height, title})}``.

    Raises:
        RuntimeError: no Chromium found, or the browser did not answer.
    """
    import base64
    import tempfile

    from PIL import Image

    binary = chromium or find_chromium()
    if not binary:
        raise RuntimeError(f"no Chromium found (looked for {list(CHROMIUM_NAMES)} and $CHROMIUM); on Debian: "
                           "apt-get update && apt-get install -y chromium")
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise RuntimeError(f"{html_path}: no such file")
    problems, errors = [], []
    with tempfile.TemporaryDirectory(prefix="mla-lab-chromium-") as profile:
        cdp = _CDP(binary, profile, timeout)
        try:
            target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sess = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for dom in ("Page", "Runtime", "Log"):
                cdp.send(f"{dom}.enable", session=sess)
            cdp.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                            "mobile": False}, session=sess)
            cdp.events()  # drop what about:blank produced
            nav = cdp.send("Page.navigate", {"url": html_path.as_uri()}, session=sess)
            if nav.get("errorText"):
                problems.append(f"navigation failed: {nav['errorText']}")
            cdp.wait_event("Page.loadEventFired", sess)
            info = cdp.send("Runtime.evaluate", {"expression": _IMAGES_JS, "awaitPromise": True,
                                                 "returnByValue": True}, session=sess)["result"]["value"]
            full_h = int(min(max(info["height"], 1), 30000))
            full_w = int(max(info["width"], width))
            cdp.send("Emulation.setDeviceMetricsOverride", {"width": full_w, "height": full_h,
                                                            "deviceScaleFactor": 1, "mobile": False}, session=sess)
            info = cdp.send("Runtime.evaluate", {"expression": _IMAGES_JS, "awaitPromise": True,
                                                 "returnByValue": True}, session=sess)["result"]["value"]
            shot = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                       "clip": {"x": 0, "y": 0, "width": full_w, "height": full_h,
                                                                "scale": 1}}, session=sess)
            for ev in cdp.events():
                if ev.get("sessionId") != sess:
                    continue
                p = ev.get("params", {})
                if ev["method"] == "Runtime.exceptionThrown":
                    d = p.get("exceptionDetails", {})
                    errors.append("JS exception: " + (d.get("exception", {}).get("description") or d.get("text", "")))
                elif ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    errors.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                               for a in p.get("args", [])))
                elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                    e = p["entry"]
                    errors.append(f"browser log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
        finally:
            cdp.close()
    png = base64.b64decode(shot["data"])
    if screenshot is None:
        screenshot = html_path.with_suffix(".screenshot.png")
    screenshot = Path(screenshot)
    screenshot.write_bytes(png)
    page = Image.open(io.BytesIO(png))
    images = []
    for i, im in enumerate(info["images"]):
        im = dict(im)
        label = f"image {i + 1} ({im['alt'] or im['src'][:40]})"
        if not im["complete"] or im["naturalWidth"] == 0 or im["naturalHeight"] == 0:
            problems.append(f"{label} did not load (complete={im['complete']}, naturalWidth={im['naturalWidth']})")
        if im["width"] < 20 or im["height"] < 20:
            problems.append(f"{label} is not visible ({im['width']:.0f} x {im['height']:.0f} px)")
            im["ink"] = 0.0
        else:
            box = (int(im["x"]), int(im["y"]), int(im["x"] + im["width"]), int(im["y"] + im["height"]))
            box = (max(0, box[0]), max(0, box[1]), min(page.width, box[2]), min(page.height, box[3]))
            im["ink"] = _ink_fraction(page.crop(box)) if box[2] > box[0] and box[3] > box[1] else 0.0
            if im["ink"] < min_ink:
                problems.append(f"{label} looks blank on screen: {100 * im['ink']:.2f}% non-background pixels "
                                f"(< {100 * min_ink:.1f}%)")
        images.append(im)
    problems += errors
    return {"ok": not problems, "problems": problems, "images": images, "errors": errors,
            "screenshot": screenshot, "page": {k: info[k] for k in ("width", "height", "title")}}
