"""The strategy kinds: the ``KIND`` (:class:`mla_lab.placement.StrategyKind`) of every module here, registered
into :data:`mla_lab.placement.KINDS` on import (``import mla_lab`` imports this package). Adding a strategy is one
module here: its record and its pricing."""

from __future__ import annotations

import importlib
import pkgutil

from ...placement import register_kind

for _m in pkgutil.iter_modules(__path__):
    register_kind(importlib.import_module(f"{__name__}.{_m.name}").KIND)
