"""The digest cache of deterministic results (issue 22): :func:`cached_call` keeps ``fn(*args)`` under
:func:`mla_lab.paths.cache_dir` named by :func:`inputs_digest` (the package's sources, the model configs, the
calibration, every file under the measured root), the versions of :data:`VERSIONED` and Python, and the call. Safe to
delete; a cache that cannot be written or read is skipped, never an error; ``MLA_LAB_NO_CACHE=1`` turns it off. The
figure cache on top of it: :mod:`.cache`."""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path

from ..paths import REPO_ROOT, cache_dir, data_dir, measured_dir
from .stamps import find_manifest

__all__ = ["inputs_digest", "cached_call", "cached_under", "CACHE_KEEP", "VERSIONED"]

#: Files kept per kind of cached result (older ones are removed when a new one is written).
CACHE_KEEP = 32

_DIGEST: dict = {}


def _enabled() -> bool:
    return os.environ.get("MLA_LAB_NO_CACHE", "").strip() not in ("1", "true", "yes")


def inputs_digest(refresh: bool = False, root: Path | None = None) -> str:
    """SHA-256 (16 hex) of the names and contents of every input file ((:func:`_cache_inputs`) of
    ``root``, default the measured root), once per process (``refresh=True`` recomputes it); ~10-30 ms."""
    root = root or measured_dir()
    if refresh or str(root) not in _DIGEST:
        h = hashlib.sha256(str(root).encode())
        for p in _cache_inputs(root):
            h.update(str(p).encode())
            h.update(p.read_bytes())
        _DIGEST[str(root)] = h.hexdigest()[:16]
    return _DIGEST[str(root)]


#: Libraries whose version enters every key (a result computed with another torch, numpy, pandas or matplotlib is
#: recomputed, not read back).
VERSIONED = ("torch", "numpy", "pandas", "matplotlib")


def _versions() -> str:
    import platform
    from importlib import metadata

    if "versions" not in _DIGEST:
        got = []
        for lib in VERSIONED:
            try:
                got.append(f"{lib}={metadata.version(lib)}")
            except metadata.PackageNotFoundError:
                got.append(f"{lib}=none")
        _DIGEST["versions"] = ";".join(got + [f"python={platform.python_version()}"])
    return _DIGEST["versions"]


def _key(kind: str, what: bytes, root: Path | None = None) -> str:
    return hashlib.sha256(inputs_digest(root=root).encode() + _versions().encode() + kind.encode()
                          + what).hexdigest()[:24]


def _write_atomic(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, folder / name)


def _prune(folder: Path, *patterns: str) -> None:
    for pattern in patterns:
        for p in sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)[:-CACHE_KEEP]:
            p.unlink(missing_ok=True)


def cached_call(fn, *args, **kw):
    """``fn(*args, **kw)``, computed once per (inputs' digest, ``fn``, ``repr`` of the arguments) and read back from
    ``<cache_dir>/results/<key>.pkl`` afterwards. ``fn`` must be deterministic in its arguments and the lab's input
    files (no clock, no unseeded randomness) and its arguments' ``repr`` must name every value that matters.
    Errors of ``fn`` propagate (nothing is stored)."""
    return cached_under(None, fn, *args, **kw)


def cached_under(root: Path | None, fn, *args, **kw):
    """:func:`cached_call` with the inputs of the measured root ``root`` (None: the default one) in its key."""
    if not _enabled():
        return fn(*args, **kw)
    key = _key("call", repr((f"{fn.__module__}.{fn.__qualname__}", args, sorted(kw.items()))).encode(), root)
    folder = cache_dir() / "results"
    path = folder / f"{key}.pkl"
    if path.is_file():
        try:
            return pickle.loads(path.read_bytes())
        except Exception:  # a truncated or foreign file: recompute below and replace it
            pass
    out = fn(*args, **kw)
    try:
        _write_atomic(folder, path.name, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
        _prune(folder, "*.pkl")
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass
    return out


def _cache_inputs(root: Path) -> list[Path]:
    """Every file a priced measured frame depends on: the package's sources, the model configs, the calibration, every
    file under the measured root, and the manifest stamping it."""
    files = sorted((REPO_ROOT / "mla_lab").rglob("*.py"))
    for d in (data_dir() / "models", data_dir() / "calibration", root):
        if d.is_dir():
            files += sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    manifest = find_manifest(root) if root.is_dir() else None
    if manifest is not None and manifest not in files:
        files.append(manifest)  # a manifest in a folder above root stamps its rows too
    return files
