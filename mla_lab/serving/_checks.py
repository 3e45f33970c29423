"""Argument checks of the serving simulation: one-line ``ValueError`` messages naming the argument, the value and
what is allowed (the format of :func:`mla_lab._validate.check_int`, which the integer checks reuse)."""

from __future__ import annotations

import math
import numbers

from mla_lab._validate import check_int


def check_float(name: str, value, *, low: float = 0.0, low_inclusive: bool = False, high: float = math.inf,
                high_inclusive: bool = False, allow_inf: bool = False) -> float:
    """``value`` as a float if it is a real number (not bool, not NaN) in the interval; ``allow_inf`` admits +inf.

    Raises:
        ValueError: ``"<name>=<value> must be a float in <interval>[ or inf]"``.
    """
    lo, hi = "[" if low_inclusive else "(", "]" if high_inclusive else ")"
    if allow_inf and math.isinf(high):
        allowed = f"{lo}{low:g}, inf]"
    else:
        allowed = f"{lo}{low:g}, {'inf' if math.isinf(high) else f'{high:g}'}{hi}" + (" or inf" if allow_inf else "")
    v = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if v == math.inf and allow_inf:
        return v
    if not math.isfinite(v) or (v < low if low_inclusive else v <= low) or (v > high if high_inclusive else v >= high):
        raise ValueError(f"{name}={value!r} must be a float in {allowed}")
    return v


def check_ms(value, who: str, where: str = "") -> float:
    """A pricer's answer as ms when it is a finite number > 0. Raises ValueError: ``"<who> returned <value> ms
    <where>; it must be a finite float > 0"`` (no "ms" after a non-number when the simulation gives ``where``)."""
    number = not isinstance(value, (bool, str)) and hasattr(value, "__float__")
    v = float(value) if number else math.nan
    if not (math.isfinite(v) and v > 0):
        unit = " ms" if number or not where else ""
        raise ValueError(f"{who} returned {value!r}{unit}{where}; it must be a finite float > 0")
    return v


def check_bool(name: str, value) -> bool:
    """``value`` if it is a bool. Raises ValueError: ``"<name>=<value> must be a bool"``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a bool")
    return value


def check_int_or_none(name: str, value, *, allow_zero: bool = False) -> int | None:
    """None or :func:`check_int`. Raises ValueError: ``"<name>=<value> must be a positive int or None"``."""
    try:
        return None if value is None else check_int(name, value, allow_zero=allow_zero)
    except ValueError as e:
        raise ValueError(f"{e} or None") from None
