"""A resumable, crash-safe store of sweep results: one JSON file per completed grid point.

Layout: ``<root>/points/<key>.json`` where ``key`` hashes the point's parameters and the code version
(:func:`code_version`). A point file is written to a temporary file in the same folder and moved into place with
``os.replace`` (atomic on POSIX), so a killed sweep leaves either the whole point or nothing. A re-run skips points
stored with ``status="ok"`` (same parameters, same code) unless ``force``; rows never duplicate because a point owns
exactly one file. Failed points are stored too, with ``status="failed"`` and the reason, so reports can show them; a
re-run retries them (and recomputes a point file that cannot be read), overwriting the file in place.

Temporary files are named ``.<key>.<host>.<pid>.<random>.tmp``: they never match ``*.json``, so a write cut short by
a kill is never read as a point, and :meth:`ResultStore.clean_stale_tmp` removes those left by dead processes of
this host.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import socket
import tempfile
from pathlib import Path

__all__ = ["ResultStore", "code_version", "point_key"]

_PKG = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """SHA-256 (12 hex) over the package's ``.py`` sources and ``data/calibration`` files: changes whenever code or
    calibration that produce rows change, not on docs-only commits."""
    h = hashlib.sha256()
    files = sorted(_PKG.rglob("*.py"))
    cal = _PKG.parent / "data" / "calibration"
    if cal.is_dir():
        files += sorted(p for p in cal.rglob("*") if p.is_file())
    for p in files:
        h.update(str(p.relative_to(_PKG.parent)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def point_key(point: dict, version: str | None = None) -> str:
    """Stable key of a grid point: SHA-1 of its canonical JSON plus the code version."""
    blob = json.dumps(point, sort_keys=True, default=str) + "|" + (version or code_version())
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


class ResultStore:
    """Point-per-file result store under ``root`` (created if missing)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.points = self.root / "points"
        self.points.mkdir(parents=True, exist_ok=True)
        self.corrupt: list[str] = []

    def path(self, key: str) -> Path:
        return self.points / f"{key}.json"

    def has(self, key: str) -> bool:
        """A file for ``key`` exists (whatever its status; see :meth:`status`)."""
        return self.path(key).is_file()

    def status(self, key: str) -> str | None:
        """``"ok"`` / ``"failed"`` (the stored point's status), or None when no readable point file exists."""
        try:
            payload = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        return payload.get("status") if isinstance(payload, dict) else None

    def completed(self, key: str) -> bool:
        """The point is stored with ``status == "ok"`` (what a resumed sweep skips)."""
        return self.status(key) == "ok"

    def tmp_files(self) -> list[Path]:
        """Temporary files in the points folder (writes in progress, or cut short by a kill)."""
        return sorted(self.points.glob(".*.tmp"))

    def clean_stale_tmp(self) -> list[Path]:
        """Remove temporary files left by processes of this host that no longer run (a killed sweep); files of live
        processes and of other hosts are kept. Returns the removed paths."""
        host = _host()
        removed = []
        for p in self.tmp_files():
            m = re.match(r"^\.[0-9a-f]+\.(?P<host>[^.]+)\.(?P<pid>\d+)\.", p.name)
            if not m or m["host"] != host or _pid_alive(int(m["pid"])):
                continue
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:  # another process cleaned it
                pass
        return removed

    def write(self, key: str, point: dict, rows: list[dict], status: str = "ok", reason: str = "") -> Path:
        """Atomically store one point's rows (all strategies together)."""
        payload = {"key": key, "point": point, "status": status, "reason": reason, "rows": rows}
        fd, tmp = tempfile.mkstemp(dir=self.points, prefix=f".{key}.{_host()}.{os.getpid()}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(key))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return self.path(key)

    def load(self, keys: list[str] | None = None) -> list[dict]:
        """Payloads of stored points (only ``keys`` when given); unreadable files are skipped and reported via the
        ``corrupt`` attribute (they can only come from outside writers, never from a killed sweep)."""
        self.corrupt: list[str] = []
        paths = [self.path(k) for k in keys] if keys is not None else sorted(self.points.glob("*.json"))
        out = []
        for p in paths:
            if not p.is_file():
                continue
            try:
                out.append(json.loads(p.read_text()))
            except (json.JSONDecodeError, OSError, UnicodeDecodeError):
                self.corrupt.append(str(p))
        return out

    def rows(self, keys: list[str] | None = None) -> list[dict]:
        """All rows of the stored points, a failed point contributing one row with its status and reason."""
        rows = []
        for payload in self.load(keys):
            if payload["rows"]:
                rows.extend(payload["rows"])
            else:
                rows.append({**payload["point"], "status": payload["status"], "reason": payload["reason"],
                             "point_key": payload["key"]})
        return rows


def _host() -> str:
    """This host's name, reduced to characters safe in a file name without dots."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
