"""GPU measurement: the one timer, the attention path, the layer runner, the TP harness, validation helpers.

Submodules load on first use (PEP 562): ``from mla_lab import measure`` costs nothing and ``measure.attention``
imports torch only when a measured point first needs it, so the sweep's row builder (and with it ``mla-lab
advise`` and ``mla-lab sweep --dry-run``) starts without torch (issue 22).
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("attention", "bandwidth", "layer", "layer_experiments", "layer_runs", "sink", "spread", "timer", "tp",
               "tp_blocks", "triton_ops", "validate")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
