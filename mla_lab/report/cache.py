"""Figures rendered once (issue 22): :func:`publish_cached` / :func:`publish_cached_many` render a figure per
(:func:`mla_lab.report.cache_core.inputs_digest`, name, the data it plots), layout-checked when first rendered, and
copy it into the run's figure folder afterwards; results: :func:`mla_lab.report.cache_core.cached_call` (re-exported).
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from pathlib import Path

from ..paths import cache_dir, measured_dir  # noqa: F401 - measured_dir: the inputs' default root
from . import cache_core as core
from .figures import publish_figure

__all__ = ["inputs_digest", "cached_call", "publish_cached", "publish_cached_many", "plotted_rows", "CACHE_KEEP",
           "VERSIONED"]

#: The one cache core's names, re-exported (``_DIGEST``: the digest per measured root).
cached_call, inputs_digest, CACHE_KEEP, VERSIONED, _DIGEST = (core.cached_call, core.inputs_digest, core.CACHE_KEEP,
                                                             core.VERSIONED, core._DIGEST)

#: Columns of sweep rows that no figure plots and that change from run to run (provenance, not figure data).
UNPLOTTED = ("timestamp", "git_commit")


def plotted_rows(df):
    """``df`` without :data:`UNPLOTTED` columns: the key of a figure of sweep rows."""
    return df.drop(columns=[c for c in UNPLOTTED if c in df.columns])


def _canonical(key):
    """``key`` with every DataFrame as its CSV text and dtypes (what it holds, not its memory layout), recursively."""
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
        return core._key(kind, name.encode() + pickle.dumps(_canonical(key), protocol=pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, TypeError, AttributeError):
        return None


def publish_cached(build, name: str, figure_dir, key, show: bool = True) -> dict:
    """:func:`~mla_lab.report.figures.publish_figure` of ``build()`` (a function returning the figure), rendered
    once per (inputs' digest, ``name``, ``key``: what the figure plots, as :func:`_canonical`) and copied from the
    cache afterwards. Returns ``{"png": path, "svg": path}`` (None when ``figure_dir`` is None). Raises as
    publish_figure (a figure that fails its layout check is never stored)."""
    return _publish(lambda: [build()], lambda i: name, name, figure_dir, key, show)[0]


def publish_cached_many(build, prefix: str, figure_dir, key, show: bool = True) -> list[dict]:
    """:func:`publish_cached` for a builder of several figures (``build()`` returns a list, e.g.
    :func:`mla_lab.report.figures.plot_frontier_grid`), published as ``<prefix>1``, ``<prefix>2``, ...; one
    ``{"png", "svg"}`` per figure."""
    return _publish(build, lambda i: f"{prefix}{i + 1}", prefix, figure_dir, key, show)


def _display(png: bytes) -> None:
    from IPython.display import Image, display

    display(Image(data=png, format="png"))


def _restore(stems: list[Path], name_of, figure_dir, show: bool) -> list[dict]:
    """The cached figures ``<stem>.png|.svg`` copied to ``figure_dir`` as ``name_of(i)`` (and shown)."""
    if not all(s.with_suffix(e).is_file() for s in stems for e in (".png", ".svg")):
        raise OSError("a cached figure is missing")
    outs = []
    for i, stem in enumerate(stems):
        png, out = stem.with_suffix(".png").read_bytes(), {"png": None, "svg": None}
        if figure_dir is not None:
            out = {e: Path(figure_dir) / f"{name_of(i)}.{e}" for e in ("png", "svg")}
            out["png"].parent.mkdir(parents=True, exist_ok=True)
            out["png"].write_bytes(png)
            shutil.copyfile(stem.with_suffix(".svg"), out["svg"])
        if show:
            _display(png)
        outs.append(out)
    return outs


def _publish(build, name_of, name: str, figure_dir, key, show: bool) -> list[dict]:
    digest = _figure_key("figures", name, key) if core._enabled() else None
    folder = cache_dir() / "figures"
    if digest is not None:
        try:
            n = int(json.loads((folder / f"{digest}.json").read_text())["figures"])
            return _restore([folder / f"{digest}-{i}" for i in range(n)], name_of, figure_dir, show)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    tmp = Path(tempfile.mkdtemp(prefix="mla-lab-fig-")) if figure_dir is None and digest is not None else None
    outs = [publish_figure(fig, name_of(i), figure_dir or tmp, show=show) for i, fig in enumerate(build())]
    if digest is not None:
        try:
            for i, out in enumerate(outs):
                for e in ("png", "svg"):
                    core._write_atomic(folder, f"{digest}-{i}.{e}", Path(out[e]).read_bytes())
            core._write_atomic(folder, f"{digest}.json", json.dumps({"figures": len(outs)}).encode())
            core._prune(folder, "*.png", "*.svg", "*.json")
        except OSError:
            pass
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        outs = [{"png": None, "svg": None} for _ in outs]
    return outs
