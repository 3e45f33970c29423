"""The padding sweep: a grid of deployments, each priced for every strategy, stored point by point.

- :mod:`.params` — the parameter schema, validation and the grid.
- :mod:`.rows` — THE row builder: :func:`~.rows.price` (a Deployment -> typed rows) and the sweep's writers.
- :mod:`.store` — the resumable, crash-safe point store (one JSON file per point, per-point claims).
- :mod:`.executors` — where points run (local or Ray), given a compute function.
- :mod:`.run` — the run loop (resume, claims, CSV).
"""

from .advise import advise, format_advice
from .params import DEFAULTS, SweepParams, expand_grid, validate_params
from .rows import Row, compute_rows, measured_rows, modelled_rows, price, reprice_measured_rows
from .run import plan_sweep, run_sweep

__all__ = ["advise", "format_advice", "DEFAULTS", "SweepParams", "expand_grid", "validate_params", "compute_rows", "measured_rows",
           "modelled_rows", "price", "Row", "reprice_measured_rows", "plan_sweep", "run_sweep"]
