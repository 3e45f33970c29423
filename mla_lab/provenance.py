"""Provenance of every row the lab writes: measured (on which GPU and software) or modelled (from which model).
Columns (:data:`PROVENANCE_COLUMNS`, all strings; ``"none"`` when absent): ``source`` (``measured`` |
``modelled``), ``device`` (GPU name or ``cpu``), ``sm``, ``driver``, ``cuda``, ``torch``, ``triton``, ``flash_mla``
(``distribution==version`` or ``none``), ``git_commit`` (short hash, ``+dirty`` when tracked files differ),
``timestamp`` (UTC ISO-8601). Committed round-2 files spell ``device`` / ``timestamp`` as ``gpu`` / ``date_utc``."""

from __future__ import annotations

import datetime as _dt
import functools
import os
from importlib import metadata

from .paths import REPO_ROOT, command_output

__all__ = ["provenance", "git_commit", "PROVENANCE_COLUMNS"]

PROVENANCE_COLUMNS = ("source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit",
                      "timestamp")
SOURCES = ("measured", "modelled")
#: The distributions that provide ``import flash_mla``, in the order they are looked for.
FLASH_MLA_DISTS = ("tokenspeed-flashmla", "sgl-flash-mla", "flash-mla", "flash_mla")


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """Short commit of the repository holding this package, ``+dirty`` if tracked files differ; ``unknown`` outside
    git (env ``MLA_LAB_COMMIT`` overrides, for copies of the tree without ``.git``)."""
    if os.environ.get("MLA_LAB_COMMIT"):
        return os.environ["MLA_LAB_COMMIT"]
    sha = command_output("git", "rev-parse", "--short=12", "HEAD", cwd=REPO_ROOT)
    if not sha:
        return "unknown"
    dirty = command_output("git", "status", "--porcelain", "--untracked-files=no", cwd=REPO_ROOT)
    return sha + ("+dirty" if dirty else "")


def _dist(*dists: str) -> tuple[str, str] | None:
    """``(name, version)`` of the first installed distribution, from its metadata (no import)."""
    for d in dists:
        try:
            return d, metadata.version(d)
        except metadata.PackageNotFoundError:
            pass
    return None


@functools.lru_cache(maxsize=2)
def _versions(measured: bool) -> dict:
    """Every column but ``source`` and ``timestamp``. Measured: the GPU torch sees and the driver (nvidia-smi, else
    NVML), ``flash_mla`` only if it imports. Modelled: the cost model is Python on the CPU (``device`` ``cpu``), the
    packages' versions from their metadata, nothing imported (``mla-lab advise`` starts without torch, issue 22)."""
    fm = _dist(*FLASH_MLA_DISTS)
    out = {"device": "cpu", "sm": "none", "driver": "none", "cuda": "none",
           "torch": (_dist("torch") or ("", "none"))[1], "triton": (_dist("triton") or ("", "none"))[1],
           "flash_mla": f"{fm[0]}=={fm[1]}" if fm else "none", "git_commit": git_commit()}
    if not measured:
        return out
    import torch

    try:
        import flash_mla
    except Exception:  # noqa: BLE001 - not importable here: the rows say none
        out["flash_mla"] = "none"
    else:  # a build without distribution metadata says its own version
        out["flash_mla"] = out["flash_mla"] if fm else f"flash_mla=={getattr(flash_mla, '__version__', 'unknown')}"
    if torch.cuda.is_available():
        smi = command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        out.update(device=torch.cuda.get_device_name(), sm="sm%d%d" % torch.cuda.get_device_capability(),
                   driver=smi.splitlines()[0] if smi else _nvml_driver(), cuda=str(torch.version.cuda))
    return {**out, "torch": torch.__version__}


def _nvml_driver() -> str:
    """The driver version NVML reports, or ``none``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # noqa: BLE001 - no NVML either
        return "none"


def provenance(source: str) -> dict:
    """The provenance columns for a row produced now: ``source`` ``"measured"`` (timed on ``device``) or
    ``"modelled"`` (a formula; the device fields say where the model ran: the CPU).
    Raises ValueError: another source."""
    if source not in SOURCES:
        raise ValueError(f"source={source!r} must be one of {list(SOURCES)}")
    return {"source": source, **_versions(source == "measured"),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
