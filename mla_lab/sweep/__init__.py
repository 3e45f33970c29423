"""The padding sweep: a grid of deployments, each priced for every strategy, stored point by point.

:mod:`.params` (schema, validation, grid), :mod:`.rows` (THE row builder, :func:`~.rows.price`), :mod:`.store`
(the crash-safe point store), :mod:`.executors` (local or Ray), :mod:`.run` (the run loop).
"""

from .advise import advise, format_advice
from .params import DEFAULTS, SweepParams, expand_grid, validate_params
from .rows import Row, compute_rows, measured_rows, modelled_rows, price, reprice_measured_rows
from .run import plan_sweep, run_sweep

__all__ = ["advise", "format_advice", "DEFAULTS", "SweepParams", "expand_grid", "validate_params", "compute_rows", "measured_rows",
           "modelled_rows", "price", "Row", "reprice_measured_rows", "plan_sweep", "run_sweep"]
