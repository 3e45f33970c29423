"""A resumable, crash-safe store of sweep results: ``<root>/points/<key>.json``, one file per grid point.

``key`` hashes the point and the code version (:func:`code_version`). A point is written to a temporary
``.<key>.<host>.<pid>.<random>.tmp`` (never matching ``*.json``) and moved into place with ``os.replace``, so a
killed sweep leaves the whole point or nothing (:meth:`ResultStore.clean_stale_tmp` removes dead processes' temps).
A re-run skips ``ok`` points unless ``force``; ``failed`` ones (with the reason) and unreadable files are retried.
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

from ..paths import REPO_ROOT, measured_row_problem

_PKG = REPO_ROOT / "mla_lab"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """SHA-256 (12 hex) over the package's ``.py`` sources: changes whenever code that produces rows changes, not
    on docs-only commits. The input files a point reads are hashed per point (:func:`inputs_digest`)."""
    h = hashlib.sha256()
    for p in sorted(_PKG.rglob("*.py")):
        h.update(str(p.relative_to(REPO_ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def inputs_digest(paths) -> str:
    """SHA-256 (12 hex) over the names and contents of the input files a point reads (model config.json, the
    calibration CSVs, measured data it splices in): editing any of them changes the point's key, so no stale row
    is reused. Missing files hash as absent."""
    h = hashlib.sha256()
    for p in sorted({Path(x) for x in paths}, key=str):
        h.update(p.name.encode())
        h.update(p.read_bytes() if p.is_file() else b"<absent>")
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
        """``"ok"`` / ``"failed"`` (the stored point's status), or None when no readable, complete point file exists
        (:func:`payload_problem`: a sweep computes that point again and replaces the file)."""
        payload, problem = _read(self.path(key))
        return None if problem else payload["status"]

    def broken(self, key: str) -> str | None:
        """One line naming ``key``'s point file and what is wrong with it, or None (absent, or a whole point)."""
        p = self.path(key)
        problem = _read(p)[1] if p.is_file() else ""
        return f"point file {p} is {problem}" if problem else None

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

    def claim_path(self, key: str) -> Path:
        return self.points / f"{key}.claim"

    def claim(self, key: str) -> bool:
        """Claim ``key`` for this process (True when held): exactly one of several sweeps on one store wins. The claim
        (host and pid) is written to a temp file, then hard-linked into place (``os.link`` fails when the name exists);
        a dead process's claim of this host is taken over under a store-wide lock.
        """
        p = self.claim_path(key)
        fd, tmp = tempfile.mkstemp(dir=self.points, prefix=f".{key}.{_host()}.{os.getpid()}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{_host()} {os.getpid()}\n")
            for _ in range(2):
                try:
                    os.link(tmp, p)
                    return True
                except FileExistsError:
                    pass
                if not self._remove_dead_claim(key):
                    return False
            return False
        finally:
            os.unlink(tmp)

    def _remove_dead_claim(self, key: str) -> bool:
        """Under the store's claim lock: remove ``key``'s claim if its owner is dead (or the claim is gone). Returns
        False when a live process holds it."""
        import fcntl

        with open(self.points / ".claims.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.claim_alive(key):
                    return False
                self.claim_path(key).unlink()
            except FileNotFoundError:
                pass
            return True

    def claim_alive(self, key: str) -> bool:
        """A claim file for ``key`` exists and its process still runs (claims of other hosts count as alive)."""
        try:
            owner = _claim_owner(self.claim_path(key).read_text())
        except OSError:
            return False
        return owner is not None and (owner[0] != _host() or owner[1] == os.getpid() or _pid_alive(owner[1]))

    def release(self, key: str) -> None:
        """Drop this process's claim on ``key`` (no error if absent; a claim another process holds is kept)."""
        try:
            if _claim_owner(self.claim_path(key).read_text()) == (_host(), os.getpid()):
                self.claim_path(key).unlink()
        except FileNotFoundError:
            pass

    def clean_stale_claims(self) -> list[Path]:
        """Remove claim files left by processes of this host that no longer run (a killed sweep: its points are
        either stored or computed again by whoever claims them next). Returns the removed paths."""
        removed = []
        for p in sorted(self.points.glob("*.claim")):
            key = p.name[: -len(".claim")]
            try:
                owner = _claim_owner(p.read_text())
            except FileNotFoundError:
                continue
            if owner is not None and owner[0] != _host():
                continue  # another host's: its liveness cannot be seen from here
            if not self.claim_alive(key) and self._remove_dead_claim(key):
                removed.append(p)
        return removed

    def write(self, key: str, point: dict, rows: list[dict], status: str = "ok", reason: str = "") -> Path:
        """Atomically store one point's rows (all strategies together)."""
        payload = {"key": key, "point": point, "status": status, "reason": reason, "rows": rows}
        return atomic_write(self.path(key), lambda f: json.dump(payload, f, default=str),
                            f".{key}.{_host()}.{os.getpid()}.")

    def load(self, keys: list[str] | None = None) -> list[dict]:
        """Payloads of stored points (only ``keys`` when given); unreadable files are skipped and reported via the
        ``corrupt`` attribute (they can only come from outside writers, never from a killed sweep)."""
        self.corrupt: list[str] = []
        paths = [self.path(k) for k in keys] if keys is not None else sorted(self.points.glob("*.json"))
        out = []
        for p in paths:
            if not p.is_file():
                continue
            payload, problem = _read(p)
            if problem:
                self.corrupt.append(str(p))
            else:
                out.append(payload)
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


def atomic_write(path: Path, write, prefix: str, newline: str | None = None, chmod: bool = False) -> Path:
    """``write(f)`` into a temporary ``<prefix><random>.tmp`` beside ``path`` (fsync'd), then ``os.replace``: a
    reader sees the whole new file or the old one. ``chmod``: give it the mode a new file gets (mkstemp's is 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline=newline) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if chmod:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _read(p: Path) -> tuple:
    """``(payload, problem)`` of a point file: its JSON and :func:`payload_problem` (or why it cannot be read)."""
    try:
        payload = json.loads(p.read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None, f"not readable JSON ({type(e).__name__})"
    return payload, payload_problem(payload)


def payload_problem(payload) -> str:
    """What makes ``payload`` not a whole point (``""`` when it is one): a JSON object with ``key`` (str),
    ``point`` (object), ``status`` (``ok`` / ``failed``), ``reason`` (str) and ``rows`` (a list of objects), as :meth:`ResultStore.write` writes it."""
    if not isinstance(payload, dict):
        return f"not a JSON object ({type(payload).__name__})"
    for k, t in (("key", str), ("point", dict), ("status", str), ("reason", str), ("rows", list)):
        if not isinstance(payload.get(k), t):
            return f"missing {k!r}" if k not in payload else f"holding {k}={str(payload[k])[:30]!r} (not a {t.__name__})"
    if payload["status"] not in ("ok", "failed"):
        return f"holding status={payload['status'][:30]!r} (allowed: ok, failed)"
    if not all(isinstance(r, dict) for r in payload["rows"]):
        return "holding rows that are not objects"
    for i, r in enumerate(payload["rows"]):  # a measured value out of its range never reaches the CSV (issue 39)
        why = measured_row_problem(r)
        if why:
            return f"holding an implausible measured value in rows[{i}]: {why}"
    return ""


def _claim_owner(text: str) -> tuple[str, int] | None:
    """(host, pid) of a claim file's text, or None when it is not a claim (a file of an older layout, cut short)."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


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
