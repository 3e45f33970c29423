"""Headless-browser check of published reports (system Chromium)."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

__all__ = ["find_chromium", "check_in_browser"]

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
