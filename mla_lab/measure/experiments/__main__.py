"""``python -m mla_lab.measure.experiments NAME ...``: :func:`mla_lab.measure.experiments.main`."""

import sys

from . import main

sys.exit(main())
