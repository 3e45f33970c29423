"""Where the lab's files live: the repository root and its ``data/`` folders, resolved once.

Environment overrides (read on every call, so tests and CI can point elsewhere):

- ``MLA_LAB_DATA``: the ``data/`` folder (model configs under ``models/``, ``calibration/``, ``measured/``).
- ``MLA_LAB_MEASURED``: the measured-data folder only (default ``<data>/measured``): the measured rows the views
  show beside the modelled numbers. It never moves a modelled number: the committed measurement files the model's
  fits read (the padded-kernel roofline, the route classes) are part of its calibration and come from
  :func:`calibration_measurements_dir` (the repository's ``data/measured``, which no variable moves).
- ``MLA_LAB_CACHE``: where the lab caches derived data keyed by the digest of its inputs (default
  ``<data>/sweeps/.cache``, an output folder the lab owns; git ignores ``data/sweeps/``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO_ROOT", "data_dir", "models_dir", "calibration_dir", "measured_dir", "calibration_measurements_dir",
           "notebooks_dir", "cache_dir", "resolve", "is_committed"]

#: The repository this package sits in (``mla_lab/..``).
REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """``data/`` of the repository, or env ``MLA_LAB_DATA``."""
    root = os.environ.get("MLA_LAB_DATA")
    return Path(root) if root else REPO_ROOT / "data"


def models_dir() -> Path:
    """``<data>/models``: one folder per model holding an HF ``config.json``."""
    return data_dir() / "models"


def calibration_dir() -> Path:
    """``<data>/calibration``: the fitted calibration CSVs."""
    return data_dir() / "calibration"


def measured_dir(gpu: str | None = None) -> Path:
    """``<data>/measured`` (env ``MLA_LAB_MEASURED`` overrides), or its ``gpu`` subfolder."""
    root = os.environ.get("MLA_LAB_MEASURED")
    base = Path(root) if root else data_dir() / "measured"
    return base / gpu if gpu else base


def calibration_measurements_dir(gpu: str | None = None) -> Path:
    """The repository's ``data/measured`` (or its ``gpu`` subfolder) as the model's calibration reads it: the
    committed measurement files the modelled numbers are fitted on (:func:`mla_lab.model.routes.padded_kernel_rows`,
    :func:`mla_lab.model.routes.route_rows`). No environment variable moves it: ``MLA_LAB_MEASURED`` chooses the
    measured rows the views show, never a modelled number (issue 32: an empty measured folder moved the modelled
    ``fa3_sparse`` from -9.08 % to -2.89 %), and a copy of ``data/`` under ``MLA_LAB_DATA`` without ``measured/``
    must not re-fit the kernel model either."""
    base = REPO_ROOT / "data" / "measured"
    return base / gpu if gpu else base


def cache_dir() -> Path:
    """``<data>/sweeps/.cache`` (env ``MLA_LAB_CACHE`` overrides): derived data, each file named by the digest of
    what it was derived from (safe to delete: it is rebuilt on the next use)."""
    root = os.environ.get("MLA_LAB_CACHE")
    return Path(root) if root else data_dir() / "sweeps" / ".cache"


def notebooks_dir() -> Path:
    """``notebooks/`` of the repository."""
    return REPO_ROOT / "notebooks"


def resolve(p: str | Path) -> Path:
    """A user-given path: absolute as given, relative to the current directory otherwise."""
    path = Path(p)
    return path if path.is_absolute() else Path.cwd() / path


def is_committed(p: str | Path) -> bool:
    """True when ``p`` is an existing file tracked by the git repository it lies in (``git ls-files
    --error-unmatch``): a committed file, which no lab command replaces without ``--overwrite``. False outside a
    repository, for an untracked or ignored file, or where git is not installed."""
    import subprocess

    path = Path(p).expanduser().absolute()
    if not path.is_file():
        return False
    try:
        r = subprocess.run(["git", "-C", str(path.parent), "ls-files", "--error-unmatch", "--", path.name],
                           capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0
