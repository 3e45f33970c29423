"""Headless-browser check of published reports: playwright driving the system Chromium (no browser download).

:func:`check_in_browser` opens a page as a reader would (1280 px wide, scale 1) with the network blocked (a report is
self-contained), collects console errors, page errors and failed requests, takes a full-page screenshot (never into
:data:`PROTECTED_DIRS`) and checks every ``<img>`` (loaded, visible, not blank), the page's and tables' widths, and
that no matplotlib legend or text group of an SVG reaches past its box.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..paths import REPO_ROOT

__all__ = ["find_chromium", "check_in_browser", "CHROMIUM_NAMES", "CHROMIUM_ARGS", "PLAYWRIGHT_HINT"]

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

#: Extra command-line flags of the headless system Chromium (playwright adds ``--headless`` itself).
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", "--mute-audio")

PLAYWRIGHT_HINT = "pip install -e '.[lab]' (playwright; the system Chromium is used, no `playwright install`)"

#: Folders a screenshot is never written into (tracked, committed reports).
PROTECTED_DIRS = (REPO_ROOT / "reports" / "h200",)

_IMAGES_JS = """async () => {
  await Promise.all(Array.from(document.images).map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  const de = document.documentElement;
  const svgDoc = de.tagName.toLowerCase() === 'svg';
  const box = svgDoc ? de.getBoundingClientRect() : null;
  return {
    svg_document: svgDoc,
    viewport: window.innerWidth,
    // tables wider than the block holding them (cut off, or scrolled inside it): those that are on screen
    wide_tables: svgDoc ? [] : Array.from(document.querySelectorAll('table')).map((t, k) => {
      const r = t.getBoundingClientRect();
      const c = t.parentElement;
      const avail = c ? c.clientWidth : window.innerWidth;
      const cap = t.querySelector('caption, th');
      return {index: k + 1, width: Math.max(r.width, t.scrollWidth), container: avail,
              visible: r.width > 0 && r.height > 0 && !t.closest('details:not([open])'),
              head: cap ? cap.textContent.trim().slice(0, 40) : ''};
    }).filter(t => t.visible && t.width > t.container + 1),
    width: svgDoc ? box.width : Math.max(de.scrollWidth, document.body ? document.body.scrollWidth : 0),
    height: svgDoc ? box.height : Math.max(de.scrollHeight, document.body ? document.body.scrollHeight : 0),
    title: document.title,
    images: Array.from(document.images).map(i => {
      const r = i.getBoundingClientRect();
      return {src: i.currentSrc.slice(0, 80), alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth,
              naturalHeight: i.naturalHeight, x: r.left + window.scrollX, y: r.top + window.scrollY,
              width: r.width, height: r.height};
    }),
    // matplotlib SVGs (inline, or the page itself): legend and text groups reaching past the SVG's box are clipped
    svgs: Array.from(document.querySelectorAll('svg')).filter(s => !s.parentElement || !s.parentElement.closest('svg'))
      .map((s, k) => {
        const b = s.getBoundingClientRect();
        const clipped = Array.from(s.querySelectorAll('g[id^="legend_"], g[id^="text_"]'))
          .filter(g => !(g.parentElement && g.parentElement.closest('g[id^="legend_"]'))).map(g => {
          const r = g.getBoundingClientRect();
          const out = {left: b.left - r.left, right: r.right - b.right, top: b.top - r.top,
                       bottom: r.bottom - b.bottom};
          const sides = Object.entries(out).filter(([_, v]) => v > 1 && r.width > 0 && r.height > 0)
            .map(([side, v]) => `${Math.round(v)} px past the ${side}`);
          return sides.length ? `${g.id}: ${sides.join(', ')} edge` : null;
        }).filter(x => x);
        return {index: k + 1, width: b.width, height: b.height, clipped: clipped};
      }),
  };
}"""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary (env ``CHROMIUM`` first, then the usual names on PATH), or None."""
    names = [n for n in (os.environ.get("CHROMIUM"), *CHROMIUM_NAMES) if n]
    return next(filter(None, map(shutil.which, names)), None)


def _ink_fraction(img) -> float:
    """Fraction of pixels differing (max channel difference > 40) from the most common colour of ``img``."""
    rgb = img.convert("RGB")
    colors = rgb.getcolors(maxcolors=rgb.width * rgb.height) or []
    if not colors:
        return 0.0
    bg = max(colors, key=lambda c: c[0])[1]
    ink = sum(n for n, c in colors if max(abs(c[k] - bg[k]) for k in range(3)) > 40)
    return ink / (rgb.width * rgb.height)


def _screenshot_path(html_path: Path, screenshot) -> Path:
    if screenshot is None:  # its folder is made where the screenshot is written
        return Path(tempfile.gettempdir()) / "mla-lab-check" / f"{html_path.stem}.screenshot.png"
    out = Path(screenshot).resolve()
    for p in PROTECTED_DIRS:
        if out.is_relative_to(p.resolve()):
            raise RuntimeError(f"screenshot={str(screenshot)!r} is inside the committed report folder {p}; give a "
                               "path elsewhere (default: a temporary folder)")
    return out


def _listen(page):
    """Block ``page``'s network and collect its console errors, page errors and failed requests; returns a function
    giving them as lines (a console's "Failed to load resource" of a failed request is that request's line)."""
    errors, failed, console = [], set(), []

    def on_console(msg) -> None:
        if msg.type in ("error", "assert"):
            console.append((msg.text, (msg.location or {}).get("url", "")))

    def on_request_failed(req) -> None:
        failed.add(req.url)
        errors.append(f"request failed: {req.url} ({req.failure or 'unknown error'})")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"JS exception: {exc}"))
    page.on("requestfailed", on_request_failed)
    for pattern in ("http://**/*", "https://**/*", "ws://**/*", "wss://**/*"):
        page.route(pattern, lambda route: route.abort("blockedbyclient"))
    return lambda: errors + [f"console.error: {text}" + (f" ({loc})" if loc and loc not in text else "")
                             for text, loc in console
                             if not (text.startswith("Failed to load resource") and loc in failed)]


def _shoot(page, uri: str, width: int) -> tuple[dict, bytes]:
    page.goto(uri, wait_until="load")
    info = page.evaluate(_IMAGES_JS)
    if info["svg_document"]:  # an .svg opened as the page: no scrolling document to capture in full
        page.set_viewport_size({"width": max(width, int(info["width"]) + 1),
                                "height": max(1, min(int(info["height"]) + 1, 30000))})
    png = page.screenshot(full_page=not info["svg_document"], type="png")
    return page.evaluate(_IMAGES_JS), png  # boxes as in the full-page screenshot


def _render(binary: str, uri: str, width: int, timeout: float) -> tuple[dict, bytes, list[str]]:
    """Open ``uri`` in headless Chromium; returns (page info with images, full-page PNG, errors seen)."""
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise RuntimeError(f"the browser check needs playwright, which is not installed: {PLAYWRIGHT_HINT}") from None
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=binary, args=list(CHROMIUM_ARGS), timeout=timeout * 1000)
            try:
                page = browser.new_page(viewport={"width": width, "height": 900}, device_scale_factor=1)
                page.set_default_timeout(timeout * 1000)
                lines = _listen(page)
                info, png = _shoot(page, uri, width)
            finally:
                browser.close()
    except PlaywrightError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"chromium ({binary}) via playwright: {first}") from None
    return info, png, lines()


def _image_problems(info: dict, page, min_ink: float) -> tuple[list[str], list[dict]]:
    """``(problems, images with their "ink")``: each ``<img>`` loaded, visible and not blank on screen."""
    problems, images = [], []
    for i, im in enumerate(info["images"]):
        im = dict(im)
        label = f"image {i + 1} ({im['alt'] or im['src'][:40]})"
        if not im["complete"] or im["naturalWidth"] == 0 or im["naturalHeight"] == 0:
            problems.append(f"{label} did not load (complete={im['complete']}, naturalWidth={im['naturalWidth']})")
        im["ink"] = 0.0
        if im["width"] < 20 or im["height"] < 20:
            problems.append(f"{label} is not visible ({im['width']:.0f} x {im['height']:.0f} px)")
        else:
            box = (max(0, int(im["x"])), max(0, int(im["y"])), min(page.width, int(im["x"] + im["width"])),
                   min(page.height, int(im["y"] + im["height"])))
            im["ink"] = _ink_fraction(page.crop(box)) if box[2] > box[0] and box[3] > box[1] else 0.0
            if im["ink"] < min_ink:
                problems.append(f"{label} looks blank on screen: {100 * im['ink']:.2f}% non-background pixels "
                                f"(< {100 * min_ink:.1f}%)")
        images.append(im)
    return problems, images


def _layout_problems(info: dict, width: int) -> list[str]:
    """The page wider than the window, tables wider than their box, SVG legends or texts past the SVG's box."""
    out = []
    if not info["svg_document"] and info["width"] > info.get("viewport", width) + 1:
        out.append(f"the page is {info['width']:.0f} px wide, wider than the {info.get('viewport', width)} px "
                   "window: the reader must scroll sideways (narrow or collapse what is wider)")
    out += [f"table {t['index']} ({t['head'] or 'no header'}) is {t['width']:.0f} px wide in a "
            f"{t['container']:.0f} px container: columns are cut off or scroll out of sight"
            for t in info.get("wide_tables", [])]
    return out + [f"svg {sv['index']} is clipped: {c} of its {sv['width']:.0f} x {sv['height']:.0f} px box"
                  for sv in info.get("svgs", []) for c in sv["clipped"]]


def check_in_browser(html_path: str | Path, screenshot: str | Path | None = None, min_ink: float = 0.01,
                     width: int = 1280, timeout: float = 60.0, chromium: str | None = None) -> dict:
    """Render ``html_path`` in headless Chromium and check it (module docstring); the screenshot goes to ``screenshot``
    or ``<tmp>/mla-lab-check/<page>.screenshot.png``. Returns ``{"ok", "problems", "images" (with "ink"), "errors",
    "screenshot", "page" ({width, height, title})}``. Raises RuntimeError: no Chromium found, playwright not installed,
    the page missing, or the browser failed."""
    from PIL import Image

    binary = chromium or find_chromium()
    if not binary:
        raise RuntimeError(f"no Chromium found (looked for {list(CHROMIUM_NAMES)} and $CHROMIUM); on Debian: "
                           "apt-get update && apt-get install -y chromium")
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise RuntimeError(f"{html_path}: no such file")
    shot_path = _screenshot_path(html_path, screenshot)
    with ThreadPoolExecutor(1) as pool:  # a thread: playwright's sync API refuses a running event loop (Jupyter)
        info, png, errors = pool.submit(_render, binary, html_path.as_uri(), width, timeout).result()
    shot_path.parent.mkdir(parents=True, exist_ok=True)
    shot_path.write_bytes(png)
    problems, images = _image_problems(info, Image.open(io.BytesIO(png)), min_ink)
    problems += _layout_problems(info, width) + errors
    return {"ok": not problems, "problems": problems, "images": images, "errors": errors,
            "screenshot": shot_path, "page": {k: info[k] for k in ("width", "height", "title")}}
