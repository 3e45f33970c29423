"""``python -m mla_lab.measure.experiments NAME ...``: :func:`mla_lab.measure.experiments.entry.main`."""

import sys

from .entry import main

sys.exit(main())
