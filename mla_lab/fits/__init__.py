"""Computed from committed measurements: the calibration fits (one module per file of ``data/calibration/``; which
rows and which function give each file: :data:`mla_lab.measure.experiments.CALIBRATION`) and the lab's written
prediction of vLLM PR #53878's run (:mod:`.predict_pr53878`). Each module is a command: ``python -m mla_lab.fits.<name>``.
It sits beside :mod:`mla_lab.sweep` (above :mod:`mla_lab.measure` and :mod:`mla_lab.serving`, whose pricer the decode
fit and the prediction use)."""
