"""Which model config each measured row was measured with: the committed manifest ``config_digests.json``, written
next to the CSVs by ``mla_lab/report/stamp_measured.py``: per file (relative to the manifest's folder), per GPU
(``device``) and FlashMLA provider (``flash_mla``), the SHA-256 of each model's canonical config JSON
(``json.dumps(obj, sort_keys=True, separators=(",", ":"))``: re-indenting keeps the rows, any edited value detaches
them in :func:`mla_lab.report.data.load_measured`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from ..paths import MANIFEST_NAME, find_manifest

__all__ = ["MANIFEST_NAME", "config_digest_of_bytes", "config_digest", "find_manifest", "read_manifest",
           "stamp_for"]



def config_digest_of_bytes(raw: bytes) -> str:
    """SHA-256 (64 hex) of a config.json's canonical JSON. Raises ValueError: ``raw`` is not a JSON object."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"config.json is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(obj).__name__}")
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=64)
def _digest_cached(path: str, mtime_ns: int, size: int) -> str:
    return config_digest_of_bytes(Path(path).read_bytes())


def config_digest(path: str | Path) -> str:
    """:func:`config_digest_of_bytes` of the file at ``path``, once per (path, mtime, size). Raises ValueError: the
    file does not exist or is not a JSON object."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise ValueError(f"config.json path={str(p)!r} does not exist") from None
    return _digest_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


def read_manifest(path: Path | None) -> tuple[dict, str]:
    """``(files mapping, problem)``: the manifest's ``files`` (``{}`` when ``path`` is None) and ``""``, or ``{}`` and
    one line saying why a manifest that exists cannot be read (then every row counts as unstamped)."""
    if path is None:
        return {}, ""
    try:
        doc = json.loads(path.read_text())
        files = doc["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
        return files, ""
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {}, f"{path} cannot be read ({' '.join(str(e).split())[:120]}): every measured row counts as unstamped"


def _s(v) -> str:
    """A provenance cell as text: a missing one (None, NaN) is ``""``, as the stamp script writes it."""
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def stamp_for(files: dict, file: str, device, flash_mla, model) -> str | None:
    """The digest the manifest records for ``model`` in rows of ``file`` measured on ``device`` with ``flash_mla``,
    or None when it records none (an entry whose device or provider differs is another run's stamp)."""
    for entry in files.get(str(file), []) or []:
        if not isinstance(entry, dict):
            continue
        if _s(entry.get("device")) == _s(device) and _s(entry.get("flash_mla")) == _s(flash_mla):
            got = (entry.get("models") or {}).get(str(model))
            if isinstance(got, str):
                return got
    return None
