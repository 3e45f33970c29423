"""Argument checks shared by the modules (one message format everywhere)."""

from __future__ import annotations

import numbers
import reprlib

#: How an error message echoes a value: at most 60 characters, 6 entries of a list, 3 levels deep (a parsed value
#: can be 10**8 nodes behind a few bytes of YAML; the message never formats more than this).
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def short_repr(value) -> str:
    """``repr(value)`` bounded (:data:`_REPR`): what every error message echoing a user's value prints."""
    return _REPR.repr(value)


def check_int(name: str, value, allow_zero: bool = False) -> int:
    """``value`` as an ``int`` if an integer (Python or numpy, not bool) > 0 (>= 0 with ``allow_zero``).
    Raises ValueError: ``"<name>=<value> must be a positive int"`` (``non-negative`` with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < (0 if allow_zero else 1):
        raise ValueError(f"{name}={value!r} must be a {'non-negative' if allow_zero else 'positive'} int")
    return int(value)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` (the values a tp or ep size may take), ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def read_csv_checked(path, need, writer: str):
    """``pandas.read_csv(path)`` that names the file in one ``ValueError`` line when it is not a readable CSV or
    lacks a column of ``need`` (``writer``: what writes such files, for the "allowed" part of the message)."""
    import pandas as pd

    try:
        t = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable CSV ({type(e).__name__}: {str(e).strip()[:120]}); allowed: what "
                         f"{writer} writes") from None
    missing = [c for c in need if c not in t.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; allowed: a file with columns {list(need)} (what "
                         f"{writer} writes)")
    return t
