"""Engine versions as an axis (a foundation package: stdlib only, imported by :mod:`mla_lab.routes`).

- :mod:`mla_lab.engines.versions`: :class:`EngineVersion`, :class:`EnginePreset` and each preset's facts as data,
  each with the ``file:line`` inside the release wheel it comes from.
- :mod:`mla_lab.engines.wheel_check`: reads a release wheel's sources with :mod:`ast` (never installs or imports the
  engine) and reports which of those facts still hold.
"""

from .versions import (
                       BACKENDS,
                       ENGINE_PRESETS,
                       ENGINE_VERSIONS,
                       LAB_CLAIMS,
                       UNPADDED_BACKENDS,
                       EnginePreset,
                       EngineVersion,
                       Fact,
                       Source,
                       decode_threshold,
                       engine_names,
                       engine_preset,
                       engine_version,
                       fact,
                       fp8_reserved_bytes,
                       padding_for,
                       resolve_engine,
                       sparse_backend,
                       version_facts,
)

__all__ = ["BACKENDS", "ENGINE_PRESETS", "ENGINE_VERSIONS", "LAB_CLAIMS", "UNPADDED_BACKENDS", "EnginePreset",
           "EngineVersion", "Fact", "Source", "decode_threshold", "engine_names", "engine_preset", "engine_version",
           "fact", "fp8_reserved_bytes", "padding_for", "resolve_engine", "sparse_backend", "version_facts"]
