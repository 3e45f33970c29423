"""Engine versions as an axis (a foundation package: stdlib only, imported by `mla_lab.routes`).
One record (:class:`~mla_lab.engines.record.EnginePreset`) per module of :mod:`mla_lab.engines.presets`."""

from .record import EnginePreset, EngineRule, EngineVersion, Fact, Source, rule_name
from .registry import (
    BACKENDS,
    ENGINE_PRESETS,
    LAB_CLAIMS,
    UNPADDED_BACKENDS,
    decode_threshold,
    engine_names,
    engine_preset,
    engine_version,
    fact,
    first_names,
    fp8_reserved_bytes,
    padding_for,
    preset_of_rule,
    register,
    resolve_engine,
    sparse_backend,
    version_facts,
)

__all__ = ["BACKENDS", "ENGINE_PRESETS", "LAB_CLAIMS", "UNPADDED_BACKENDS", "EnginePreset", "EngineRule",
           "EngineVersion", "Fact", "Source", "decode_threshold", "engine_names", "engine_preset", "engine_version",
           "fact", "first_names", "fp8_reserved_bytes", "padding_for", "preset_of_rule",
           "register", "resolve_engine", "rule_name", "sparse_backend", "version_facts"]
