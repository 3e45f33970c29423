"""GPU measurement: the timer, the attention path, the layer runner, the TP harness, validation. Submodules load on
first use (PEP 562), so the row builder (``mla-lab advise``, ``sweep --dry-run``) starts without torch (issue 22).
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("attention", "layer", "layer_runs", "sink", "spread", "timer", "tp",
               "tp_blocks", "triton_ops", "validate")


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
