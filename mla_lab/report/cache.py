"""The digest cache of deterministic results and figures (issue 22), under :func:`mla_lab.paths.cache_dir`, keyed by
:func:`inputs_digest` (the package's sources, the model configs, the calibration, every file under the measured
root), the versions of :data:`VERSIONED` and Python, and the call: :func:`cached_call` keeps ``fn(*args)``;
:func:`publish_figure` saves a layout-checked figure as PNG + SVG, :func:`publish_cached` renders it once per (digest,
name, the data it plots) and copies it afterwards. Safe to delete; a cache that cannot be written or read is skipped,
never an error; ``MLA_LAB_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from ..paths import REPO_ROOT, cache_dir, data_dir, find_manifest, measured_dir
from .layout_check import figure_clipping, label_overlaps

__all__ = ["inputs_digest", "cached_call", "cached_under", "publish_figure", "publish_cached", "publish_cached_many",
           "plotted_rows", "CACHE_KEEP", "VERSIONED"]

#: Files kept per kind of cached result (older ones are removed when a new one is written).
CACHE_KEEP = 32
#: Libraries whose version enters every key (a result computed with another torch, numpy, pandas or matplotlib is
#: recomputed, not read back).
VERSIONED = ("torch", "numpy", "pandas", "matplotlib")
#: Columns of sweep rows that no figure plots and that change from run to run (provenance, not figure data).
UNPLOTTED = ("timestamp", "git_commit")
_DIGEST: dict = {}  # measured root -> its inputs' digest; "versions" -> the libraries'


def _enabled() -> bool:
    return os.environ.get("MLA_LAB_NO_CACHE", "").strip() not in ("1", "true", "yes")


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


def inputs_digest(refresh: bool = False, root: Path | None = None) -> str:
    """SHA-256 (16 hex) of the names and contents of :func:`_cache_inputs` of ``root`` (default the measured root),
    once per process (``refresh=True`` recomputes it); ~10-30 ms."""
    root = root or measured_dir()
    if refresh or str(root) not in _DIGEST:
        h = hashlib.sha256(str(root).encode())
        for p in _cache_inputs(root):
            h.update(str(p).encode())
            h.update(p.read_bytes())
        _DIGEST[str(root)] = h.hexdigest()[:16]
    return _DIGEST[str(root)]


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
    files and its arguments' ``repr`` must name every value that matters. Errors of ``fn`` propagate."""
    return cached_under(None, fn, *args, **kw)


def cached_under(root: Path | None, fn, *args, **kw):
    """:func:`cached_call` with the inputs of the measured root ``root`` (None: the default one) in its key."""
    if not _enabled():
        return fn(*args, **kw)
    key = _key("call", repr((f"{fn.__module__}.{fn.__qualname__}", args, sorted(kw.items()))).encode(), root)
    folder = cache_dir() / "results"
    path = folder / f"{key}.pkl"
    if path.is_file():
        with contextlib.suppress(Exception):  # a truncated or foreign file: recompute below and replace it
            return pickle.loads(path.read_bytes())
    out = fn(*args, **kw)
    with contextlib.suppress(OSError, pickle.PicklingError, TypeError, AttributeError):
        _write_atomic(folder, path.name, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
        _prune(folder, "*.pkl")
    return out


def save_pair(png: bytes, write_svg, name: str, figure_dir, show: bool) -> dict:
    """``png`` and ``write_svg(path)`` as ``<figure_dir>/<name>.png|.svg`` (``{"png": path, "svg": path}``; None
    when ``figure_dir`` is None), and (``show``) the PNG displayed in the notebook."""
    out = {"png": None, "svg": None}
    if figure_dir is not None:
        out = {e: Path(figure_dir) / f"{name}.{e}" for e in ("png", "svg")}
        out["png"].parent.mkdir(parents=True, exist_ok=True)
        out["png"].write_bytes(png)
        write_svg(out["svg"])
    if show:
        from IPython.display import Image, display

        display(Image(data=png, format="png"))
    return out


def publish_figure(fig, name: str, figure_dir: str | Path | None, dpi: int = 110, show: bool = True) -> dict:
    """:func:`save_pair` of ``fig`` (PNG at ``dpi``; what nbconvert embeds in the HTML report). Raises ValueError: a
    legend or title cut off at the figure's edge, or two labels of one axes printed over each other
    (:mod:`mla_lab.report.layout_check`, naming the artists); nothing is written."""
    clipped = figure_clipping(fig) + label_overlaps(fig)
    if clipped:
        raise ValueError(f"figure {name!r}: " + "; ".join(clipped))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return save_pair(buf.getvalue(), lambda p: fig.savefig(p, format="svg"), name, figure_dir, show)


def plotted_rows(df):
    """``df`` without :data:`UNPLOTTED` columns: the key of a figure of sweep rows."""
    return df.drop(columns=[c for c in UNPLOTTED if c in df.columns])


def _canonical(key):
    """``key`` with every DataFrame as its CSV text and dtypes (what it holds, not its memory layout), recursively."""
    if isinstance(key, pd.DataFrame):
        return ("DataFrame", [str(c) for c in key.columns], [str(t) for t in key.dtypes], key.to_csv())
    if isinstance(key, (list, tuple)):
        return type(key).__name__, [_canonical(k) for k in key]
    if isinstance(key, dict):
        return "dict", [(repr(k), _canonical(v)) for k, v in key.items()]
    return key


def _figure_key(kind: str, name: str, key) -> str | None:
    try:
        return _key(kind, name.encode() + pickle.dumps(_canonical(key), protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


def publish_cached(build, name: str, figure_dir, key, show: bool = True) -> dict:
    """:func:`publish_figure` of ``build()`` (a function returning the figure), rendered
    once per (inputs' digest, ``name``, ``key``: what the figure plots, as :func:`_canonical`) and copied from the
    cache afterwards. Returns ``{"png": path, "svg": path}`` (None when ``figure_dir`` is None). Raises as
    publish_figure (a figure that fails its layout check is never stored)."""
    return _publish(lambda: [build()], lambda i: name, name, figure_dir, key, show)[0]


def publish_cached_many(build, prefix: str, figure_dir, key, show: bool = True) -> list[dict]:
    """:func:`publish_cached` for a builder of several figures (``build()`` returns a list), published as
    ``<prefix>1``, ``<prefix>2``, ...; one ``{"png", "svg"}`` per figure."""
    return _publish(build, lambda i: f"{prefix}{i + 1}", prefix, figure_dir, key, show)


def _restore(stems: list[Path], name_of, figure_dir, show: bool) -> list[dict]:
    """The cached figures ``<stem>.png|.svg`` copied to ``figure_dir`` as ``name_of(i)`` (and shown)."""
    if not all(s.with_suffix(e).is_file() for s in stems for e in (".png", ".svg")):
        raise OSError("a cached figure is missing")
    return [save_pair(stem.with_suffix(".png").read_bytes(), lambda p, s=stem: shutil.copyfile(s.with_suffix(".svg"), p),
                      name_of(i), figure_dir, show) for i, stem in enumerate(stems)]


def _publish(build, name_of, name: str, figure_dir, key, show: bool) -> list[dict]:
    digest = _figure_key("figures", name, key) if _enabled() else None
    folder = cache_dir() / "figures"
    if digest is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            n = int(json.loads((folder / f"{digest}.json").read_text())["figures"])
            return _restore([folder / f"{digest}-{i}" for i in range(n)], name_of, figure_dir, show)
    tmp = Path(tempfile.mkdtemp(prefix="mla-lab-fig-")) if figure_dir is None and digest is not None else None
    outs = [publish_figure(fig, name_of(i), figure_dir or tmp, show=show) for i, fig in enumerate(build())]
    if digest is not None:
        with contextlib.suppress(OSError):
            for i, out in enumerate(outs):
                for e in ("png", "svg"):
                    _write_atomic(folder, f"{digest}-{i}.{e}", Path(out[e]).read_bytes())
            _write_atomic(folder, f"{digest}.json", json.dumps({"figures": len(outs)}).encode())
            _prune(folder, "*.png", "*.svg", "*.json")
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        outs = [{"png": None, "svg": None} for _ in outs]
    return outs
