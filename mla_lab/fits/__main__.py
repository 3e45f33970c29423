"""``python -m mla_lab.fits NAME``: refit one calibration file (:func:`mla_lab.fits.main`)."""

import sys

from . import main

sys.exit(main())
