"""Argument checks shared by the modules (one message format everywhere)."""

from __future__ import annotations


def check_int(name: str, value, allow_zero: bool = False) -> int:
    """Return ``value`` if it is an int (not bool) > 0 (>= 0 with ``allow_zero``).

    Raises:
        ValueError: ``"<name>=<value> must be a positive int"`` (``non-negative`` with ``allow_zero``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise ValueError(f"{name}={value!r} must be a {'non-negative' if allow_zero else 'positive'} int")
    return value
