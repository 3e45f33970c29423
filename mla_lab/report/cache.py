"""Deterministic report results computed once: kept on disk named by the digest of everything they are computed
from, so a re-run of the notebook with the same inputs reads them back instead of recomputing (issue 22: a
one-point sweep is the notebook's fixed cost, not the point).

- :func:`inputs_digest`: SHA-256 of the package's sources, the model configs, the calibration and every file
  under the measured root (:func:`mla_lab.report.data._cache_inputs`, the same inputs as the measured-row cache):
  any edit to the cost model, a calibration or a measurement changes it, and every cached result with it.
- :func:`cached_call`: ``fn(*args, **kw)`` (a deterministic, picklable result: the serving simulation of the PR's
  or the swept deployment, a request-rate curve) keyed by the inputs' digest, ``fn``'s module and name and the
  ``repr`` of its arguments (dataclasses, numbers, strings and lists: a ``repr`` that names every value); the
  same-input equivalence check of every strategy (seeded inputs) is one of them. Every key also holds the
  versions of :data:`VERSIONED` and Python.
- :func:`publish_cached` (one figure) and :func:`publish_cached_many` (a list, the frontier grid):
  :func:`mla_lab.report.figures.publish_figure` for a figure built from ``key`` (the frame or dict it plots; sweep
  rows through :func:`plotted_rows`, without the pricing timestamp and commit): the PNG and SVG are rendered once and copied into the run's figure folder afterwards (the
  layout checks ran when they were first rendered; a figure that fails them is never stored).

Everything lives under :func:`mla_lab.paths.cache_dir` (``data/sweeps/.cache``, env ``MLA_LAB_CACHE``): safe to
delete. A cache that cannot be written (read-only checkout) or read (a truncated file) is skipped, never an error;
env ``MLA_LAB_NO_CACHE=1`` turns it off (every result recomputed).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
from pathlib import Path

from ..paths import cache_dir, measured_dir
from .data import _cache_inputs
from .figures import publish_figure

__all__ = ["inputs_digest", "cached_call", "publish_cached", "publish_cached_many", "plotted_rows", "CACHE_KEEP",
           "VERSIONED"]

#: Columns of sweep rows that no figure plots and that change from run to run (when the point was priced, at
#: which commit): provenance, shown in the banner and the tables, not in a figure.
UNPLOTTED = ("timestamp", "git_commit")


def plotted_rows(df):
    """``df`` without :data:`UNPLOTTED` columns: the key of a figure of sweep rows (a re-run of the same points
    renders nothing again)."""
    return df.drop(columns=[c for c in UNPLOTTED if c in df.columns])

#: Files kept per kind of cached result (older ones are removed when a new one is written).
CACHE_KEEP = 32

_DIGEST: dict = {}


def _enabled() -> bool:
    return os.environ.get("MLA_LAB_NO_CACHE", "").strip() not in ("1", "true", "yes")


def inputs_digest(refresh: bool = False) -> str:
    """SHA-256 (16 hex) of the names and contents of every input file of the lab's results (module docstring),
    computed once per process (``refresh=True`` recomputes it); ~10-30 ms."""
    root = measured_dir()
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


def _canonical(key):
    """``key`` with every DataFrame as its CSV text and dtypes (what it holds, not how pandas laid it out in memory:
    a frame read back from a pickle pickles to other bytes than the frame it was written from), recursively
    through tuples, lists and dicts."""
    import pandas as pd

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


def _key(kind: str, what: bytes) -> str:
    return hashlib.sha256(inputs_digest().encode() + _versions().encode() + kind.encode() + what).hexdigest()[:24]


def _write_atomic(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, folder / name)


def _prune(folder: Path, pattern: str) -> None:
    old = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)[:-CACHE_KEEP]
    for p in old:
        p.unlink(missing_ok=True)


def cached_call(fn, *args, **kw):
    """``fn(*args, **kw)``, computed once per (inputs' digest, ``fn``, ``repr`` of the arguments) and read back from
    ``<cache_dir>/results/<key>.pkl`` afterwards. ``fn`` must be deterministic in its arguments and the lab's input
    files (no clock, no unseeded randomness) and its arguments' ``repr`` must name every value that matters.
    Errors of ``fn`` propagate (nothing is stored)."""
    if not _enabled():
        return fn(*args, **kw)
    name = f"{fn.__module__}.{fn.__qualname__}"
    key = _key("call", repr((name, args, sorted(kw.items()))).encode())
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


def publish_cached(build, name: str, figure_dir, key, show: bool = True) -> dict:
    """:func:`~mla_lab.report.figures.publish_figure` of ``build()`` (a function returning the figure), rendered
    once per (inputs' digest, ``name``, ``key``: what the figure plots, e.g. its DataFrame, as :func:`_canonical`) and copied
    from ``<cache_dir>/figures/<digest>.png|.svg`` afterwards; ``show`` displays the PNG as publish_figure does.
    Returns ``{"png": path, "svg": path}`` (None when ``figure_dir`` is None). Raises as publish_figure (a figure
    that fails its layout check is never stored)."""
    digest = _figure_key("figure", name, key)
    folder = cache_dir() / "figures"
    png_c, svg_c = folder / f"{digest}.png", folder / f"{digest}.svg"
    if digest is not None and _enabled() and png_c.is_file() and svg_c.is_file():
        try:
            png = png_c.read_bytes()
            out = {"png": None, "svg": None}
            if figure_dir is not None:
                d = Path(figure_dir)
                d.mkdir(parents=True, exist_ok=True)
                out["png"], out["svg"] = d / f"{name}.png", d / f"{name}.svg"
                out["png"].write_bytes(png)
                shutil.copyfile(svg_c, out["svg"])
            if show:
                from IPython.display import Image, display

                display(Image(data=png, format="png"))
            return out
        except OSError:
            pass
    tmp = None
    if figure_dir is None and digest is not None and _enabled():
        tmp = Path(tempfile.mkdtemp(prefix="mla-lab-fig-"))
    out = publish_figure(build(), name, figure_dir if tmp is None else tmp, show=show)
    if digest is not None and _enabled() and out["png"] is not None:
        try:
            _write_atomic(folder, png_c.name, Path(out["png"]).read_bytes())
            _write_atomic(folder, svg_c.name, Path(out["svg"]).read_bytes())
            _prune(folder, "*.png")
            _prune(folder, "*.svg")
        except OSError:
            pass
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        out = {"png": None, "svg": None}
    return out


def publish_cached_many(build, prefix: str, figure_dir, key, show: bool = True) -> list[dict]:
    """:func:`publish_cached` for a builder of several figures (``build()`` returns a list, e.g.
    :func:`mla_lab.report.figures.plot_frontier_grid`): published as ``<prefix>1``, ``<prefix>2``, ... and
    rendered once per (inputs' digest, ``prefix``, pickled ``key``). Returns one ``{"png", "svg"}`` per figure."""
    import json

    digest = _figure_key("figures", prefix, key)
    folder = cache_dir() / "figures"
    manifest = folder / f"{digest}.json"
    if digest is not None and _enabled() and figure_dir is not None and manifest.is_file():
        try:
            n = int(json.loads(manifest.read_text())["figures"])
            pairs = [(folder / f"{digest}-{i}.png", folder / f"{digest}-{i}.svg") for i in range(n)]
            if all(p.is_file() and s.is_file() for p, s in pairs):
                outs = []
                d = Path(figure_dir)
                d.mkdir(parents=True, exist_ok=True)
                for i, (p, s) in enumerate(pairs):
                    png = p.read_bytes()
                    out = {"png": d / f"{prefix}{i + 1}.png", "svg": d / f"{prefix}{i + 1}.svg"}
                    out["png"].write_bytes(png)
                    shutil.copyfile(s, out["svg"])
                    if show:
                        from IPython.display import Image, display

                        display(Image(data=png, format="png"))
                    outs.append(out)
                return outs
        except (OSError, ValueError, KeyError):
            pass
    outs = [publish_figure(fig, f"{prefix}{i + 1}", figure_dir, show=show) for i, fig in enumerate(build())]
    if digest is not None and _enabled() and figure_dir is not None:
        try:
            for i, out in enumerate(outs):
                _write_atomic(folder, f"{digest}-{i}.png", Path(out["png"]).read_bytes())
                _write_atomic(folder, f"{digest}-{i}.svg", Path(out["svg"]).read_bytes())
            _write_atomic(folder, manifest.name, json.dumps({"figures": len(outs)}).encode())
            for pattern in ("*.png", "*.svg", "*.json"):
                _prune(folder, pattern)
        except OSError:
            pass
    return outs
