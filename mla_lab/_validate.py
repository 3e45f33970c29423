"""Argument checks shared by the modules (one message format everywhere)."""

from __future__ import annotations

import numbers


def check_int(name: str, value, allow_zero: bool = False) -> int:
    """Return ``value`` as an ``int`` if it is an integer (Python or numpy, not bool) > 0 (>= 0 with
    ``allow_zero``).

    Raises:
        ValueError: ``"<name>=<value> must be a positive int"`` (``non-negative`` with ``allow_zero``).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < (0 if allow_zero else 1):
        raise ValueError(f"{name}={value!r} must be a {'non-negative' if allow_zero else 'positive'} int")
    return int(value)


def check_choice(name: str, value, allowed) -> object:
    """Return ``value`` if it is one of ``allowed``.

    Raises:
        ValueError: ``"<name>=<value> is not allowed; allowed: [...]"``.
    """
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {list(allowed)}")
    return value
