"""``python -m mla_lab.fits NAME``: refit one calibration file (:func:`mla_lab.fits.main`)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
