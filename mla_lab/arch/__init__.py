"""GPU records and detection of the running GPU: one module per GPU in this package, each defining ``GPU`` (a
:class:`~mla_lab.arch.record.GPUArch`); :data:`ARCHS` holds every module found here at import.

To add a GPU: add ``mla_lab/arch/<name>.py`` with ``GPU = GPUArch(name="<name>", ...)``; nothing else names it.
Datasheet figures are leads, not measurements."""

from __future__ import annotations

import importlib
import pkgutil
import re

from .record import GIB, MIB, GPUArch

__all__ = ["GPUArch", "ARCHS", "GIB", "MIB", "SMI_TORCH_GAP_MIB", "get_arch", "detect_arch", "arch_names"]

#: name -> record, one per module of this package (:func:`_load`).
ARCHS: dict[str, GPUArch] = {}
_ALIASES: dict[str, str] = {}


def _load() -> None:
    """Fill :data:`ARCHS` and the aliases from this package's modules (``record`` and ``_``-names excepted).
    Raises ValueError: a module without ``GPU``, a record named unlike its module, an alias taken twice."""
    for m in pkgutil.iter_modules(__path__):
        if m.name == "record" or m.name.startswith("_"):
            continue
        gpu = getattr(importlib.import_module(f"{__name__}.{m.name}"), "GPU", None)
        if not isinstance(gpu, GPUArch) or gpu.name != m.name:
            raise ValueError(f"mla_lab/arch/{m.name}.py must define GPU = GPUArch(name={m.name!r}, ...)")
        ARCHS[gpu.name] = gpu
        for a in gpu.aliases:
            if _ALIASES.setdefault(a, gpu.name) != gpu.name:
                raise ValueError(f"alias {a!r} is claimed by {_ALIASES[a]!r} and {gpu.name!r}; allowed: one record")


_load()
from .h200 import SMI_TORCH_GAP_MIB  # noqa: E402  (the H200's measured nvidia-smi - torch gap, read by h20)


def arch_names() -> list[str]:
    """Accepted arch names: the records, then their aliases (``sm90``/``hopper`` -> h200, ...)."""
    return sorted(ARCHS) + sorted(_ALIASES)


def get_arch(name: str | GPUArch) -> GPUArch:
    """The record named ``name`` (a record name or alias, case-insensitive), or ``name`` itself if a record.
    Raises ValueError: not a known record or alias (one line listing the allowed names)."""
    if isinstance(name, GPUArch):
        return name
    if not isinstance(name, str):
        raise ValueError(f"arch must be a str, got {type(name).__name__} {name!r}; allowed: {arch_names()}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in ARCHS:
        raise ValueError(f"arch={name!r} is not a known GPU architecture; allowed: {arch_names()}")
    return ARCHS[key]


def _match_product(device_name: str) -> GPUArch | None:
    """The record whose name is a word of ``device_name``, longest name first (``H200`` is not ``H20``)."""
    return next((a for a in sorted(ARCHS.values(), key=lambda a: -len(a.name))
                 if re.search(rf"\b{a.name}\b", device_name, flags=re.IGNORECASE)), None)


def detect_arch() -> dict:
    """The GPU this process would run on: ``device`` (``"cpu"`` without CUDA, else the device name), ``capability``
    (None or ``(major, minor)``), ``arch`` (the matching record's name, None for a GPU without a record), ``sm`` and
    ``prefill_padding`` (an unknown card of a known family takes its family's tile; None otherwise)."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "capability": None, "arch": None, "sm": None, "prefill_padding": None}
    name = torch.cuda.get_device_name()
    cap = tuple(torch.cuda.get_device_capability())
    arch = _match_product(name)
    family_pads = {a.prefill_padding for a in ARCHS.values() if a.capability[0] == cap[0]}  # used when they agree
    return {"device": name, "capability": cap, "arch": arch.name if arch else None,
            "sm": arch.sm if arch else f"sm{cap[0]}0",
            "prefill_padding": arch.prefill_padding if arch else (family_pads.pop() if len(family_pads) == 1 else None)}
