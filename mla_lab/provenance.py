"""Provenance of every row the lab writes: measured (on which GPU and software) or modelled (from which model).

Columns (all strings; ``"none"`` when absent): ``source`` (``measured`` | ``modelled``), ``device`` (GPU name or
``cpu``), ``sm``, ``driver``, ``cuda``, ``torch``, ``triton``, ``flash_mla`` (``provider==version`` or ``none``),
``git_commit`` (short hash, ``+dirty`` when the tree has uncommitted changes), ``timestamp`` (UTC ISO-8601).
"""

from __future__ import annotations

import datetime as _dt
import functools
import subprocess

from .paths import REPO_ROOT

__all__ = ["provenance", "git_commit", "software_versions", "flash_mla_version", "modelled_versions",
           "PROVENANCE_COLUMNS"]

PROVENANCE_COLUMNS = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit",
                      "timestamp")
SOURCES = ("measured", "modelled")


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short commit of the repository holding this package, ``+dirty`` if tracked files differ; ``unknown`` outside
    git (env ``MLA_LAB_COMMIT`` overrides, for copies of the tree without ``.git``)."""
    import os

    if os.environ.get("MLA_LAB_COMMIT"):
        return os.environ["MLA_LAB_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.lru_cache(maxsize=1)
def flash_mla_version() -> str:
    """``<distribution>==<version>`` of the installed ``flash_mla`` provider, or ``none``."""
    try:
        import flash_mla  # noqa: F401
    except Exception:
        return "none"
    from importlib import metadata

    for dist in ("tokenspeed-flashmla", "sgl-flash-mla", "flash-mla", "flash_mla"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return f"flash_mla=={getattr(flash_mla, '__version__', 'unknown')}"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "none"
    except (OSError, subprocess.SubprocessError):
        return "none"


@functools.lru_cache(maxsize=1)
def software_versions() -> dict:
    """Device and software fields of :data:`PROVENANCE_COLUMNS` (everything but ``source`` and ``timestamp``)."""
    import torch

    try:
        import triton

        triton_v = triton.__version__
    except Exception:
        triton_v = "none"
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        device, sm, driver, cuda = torch.cuda.get_device_name(), f"sm{cap[0]}{cap[1]}", _driver(), str(torch.version.cuda)
    else:
        device, sm, driver, cuda = "cpu", "none", "none", "none"
    return {"device": device, "sm": sm, "driver": driver, "cuda": cuda, "torch": torch.__version__,
            "triton": triton_v, "flash_mla": flash_mla_version(), "git_commit": git_commit()}


@functools.lru_cache(maxsize=1)
def modelled_versions() -> dict:
    """:func:`software_versions` for a modelled row, read without importing torch, triton or flash_mla: the cost
    model is Python on the CPU (``device`` ``cpu``, no sm/driver/cuda), the packages' versions come from their
    installed metadata (so ``mla-lab advise`` and the explorer start without torch, issue 22)."""
    from importlib import metadata

    def version(*dists) -> str:
        for d in dists:
            try:
                return metadata.version(d)
            except metadata.PackageNotFoundError:
                continue
        return "none"

    fm = next((f"{d}=={version(d)}" for d in ("tokenspeed-flashmla", "sgl-flash-mla", "flash-mla", "flash_mla")
               if version(d) != "none"), "none")
    return {"device": "cpu", "sm": "none", "driver": "none", "cuda": "none", "torch": version("torch"),
            "triton": version("triton"), "flash_mla": fm, "git_commit": git_commit()}


def provenance(source: str) -> dict:
    """The provenance columns for a row produced now.

    Args:
        source: ``"measured"`` (timed/allocated on ``device``) or ``"modelled"`` (computed from a formula; the
            device fields then say where the model ran, the CPU, not what it models: :func:`modelled_versions`).

    Raises:
        ValueError: source not one of ``measured``/``modelled``.
    """
    if source not in SOURCES:
        raise ValueError(f"source={source!r} must be one of {list(SOURCES)}")
    d = {"source": source}
    d.update(software_versions() if source == "measured" else modelled_versions())
    d["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return d
