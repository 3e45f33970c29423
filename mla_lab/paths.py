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

import json
import os
from pathlib import Path

__all__ = ["REPO_ROOT", "data_dir", "models_dir", "calibration_dir", "measured_dir", "calibration_measurements_dir",
           "notebooks_dir", "cache_dir", "resolve", "is_committed", "MANIFEST_NAME", "find_manifest", "read_measured_csv"]

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


#: The measured root's manifest (written by ``python -m mla_lab.report.stamp_measured``): config digests of the
#: measured sweep rows and the row count of every measured CSV (``csv_rows``).
MANIFEST_NAME = "config_digests.json"


def find_manifest(root: str | Path) -> Path | None:
    """The nearest ``config_digests.json`` in ``root`` or a folder above it, or None."""
    r = Path(root).resolve()
    for d in (r, *r.parents):
        p = d / MANIFEST_NAME
        if p.is_file():
            return p
    return None


def read_measured_csv(p: str | Path):
    """A measured CSV read whole, or refused in one line naming the file: every row has the header's number of
    fields, and when the manifest (``config_digests.json`` in the file's folder or above) counts the file's rows
    (``csv_rows``, written by ``python -m mla_lab.report.stamp_measured``), the file holds at least that many. A
    manifest that exists but cannot be read is refused too (it would hide lost rows).

    Returns:
        the DataFrame (pandas).

    Raises:
        ValueError: ``<file>: ...`` (a short row, fewer rows than stamped, not a CSV) or ``<manifest> cannot be read``.
    """
    import csv as _csv

    import pandas as pd

    p = Path(p)
    fix = f"restore it (git checkout -- {p}) or re-stamp the folder (python -m mla_lab.report.stamp_measured)"
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = _csv.reader(f, strict=True)
            head = next(reader, None)
            if not head:
                raise ValueError(f"{p}: empty (no header); {fix}")
            n = 0
            for n, row in enumerate(reader, start=1):
                if len(row) != len(head):
                    raise ValueError(f"{p}: row {n + 1} has {len(row)} fields, the header {len(head)} (a truncated "
                                     f"or edited file); {fix}")
    except (UnicodeDecodeError, _csv.Error) as e:
        raise ValueError(f"{p}: not a readable CSV ({' '.join(str(e).split())[:80]}); {fix}") from None
    manifest = find_manifest(p.parent)
    if manifest is not None:
        try:
            counts = json.loads(manifest.read_text()).get("csv_rows", {})
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"{manifest} cannot be read ({' '.join(str(e).split())[:80]}): it guards the measured "
                             f"rows against loss; restore it (git checkout -- {manifest})") from None
        try:
            key = p.resolve().relative_to(manifest.parent.resolve()).as_posix()
        except ValueError:
            key = None
        want = counts.get(key) if isinstance(counts, dict) and key else None
        if isinstance(want, int) and n < want:
            raise ValueError(f"{p} holds {n} rows; its stamp in {manifest} counts {want} (rows were lost: a truncated "
                             f"or cut file); {fix}")
    return pd.read_csv(p)


