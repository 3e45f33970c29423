"""One module per engine version: each defines ``PRESET`` (an :class:`mla_lab.engines.record.EnginePreset`).
:mod:`mla_lab.engines.registry` imports every module here whose name does not start with ``_``."""
