"""Run-to-run spread: every measured figure is stated from ``n >= 5`` fresh processes (a ``process`` column on every
row), because one process's within-process interval (:func:`mla_lab.measure.timer.summarize`) does not cover a
second fresh process (vLLM PR #53878's seed path, four processes: -0.9 .. -1.7 % where one claimed [-1.90, -1.56] %).

The figure is the median over processes of each process's median (:func:`process_medians`); its between-process
interval is ``[min, max]`` over them, with distribution-free coverage ``1 - 2 / 2**n`` of the process-level median
(:func:`coverage`: 93.8 % for n = 5). A change A vs B (:func:`paired_change`, A and B interleaved in the same
process): per process ``median_A / median_B - 1``, then the same summary. Inputs: DataFrames; outputs: dicts.
"""

from __future__ import annotations

import math
import statistics

#: Fewest fresh processes a between-process figure is stated from (issue: ">= 5 fresh processes").
MIN_PROCESSES = 5


def coverage(n: int) -> float:
    """Coverage of ``[min, max]`` of ``n`` independent draws for the median: ``1 - 2 / 2**n``.

    Raises:
        ValueError: ``n`` not an int >= 2.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n={n!r} must be an int >= 2 (processes)")
    return 1.0 - 2.0 / 2**n


def _check(df, keys, value):
    missing = [c for c in [*keys, "process", value] if c not in df.columns]
    if missing:
        raise ValueError(f"rows lack the column(s) {missing}; they have {list(df.columns)}")


def process_medians(df, keys, value: str = "ms"):
    """Median of ``value`` per (``keys``..., ``process``): a Series indexed by keys + process.

    Raises:
        ValueError: a column is missing (names it).
    """
    keys = list(keys)
    _check(df, keys, value)
    return df.groupby(keys + ["process"])[value].median()


def _summary(xs) -> dict:
    xs = sorted(float(x) for x in xs if not math.isnan(float(x)))
    n = len(xs)
    if n == 0:
        raise ValueError("no process has a value")
    return {"median": statistics.median(xs), "lo": xs[0], "hi": xs[-1], "n_processes": n,
            "coverage": coverage(n) if n >= 2 else float("nan"), "per_process": xs}


def between_process(df, keys, value: str = "ms") -> dict:
    """``{key tuple: {"median", "lo", "hi", "n_processes", "coverage", "per_process"}}`` over the process medians
    of ``value``.

    Raises:
        ValueError: a column is missing.
    """
    s = process_medians(df, keys, value)
    out = {}
    for key, grp in s.groupby(level=list(range(len(list(keys))))):
        out[key if isinstance(key, tuple) else (key,)] = _summary(grp.values)
    return out


def paired_change(df, keys, column: str, a: str, b: str, value: str = "ms") -> dict:
    """Percent change of ``column == a`` against ``column == b`` per process (same ``keys``), summarised over
    processes as :func:`between_process` (%).

    Raises:
        ValueError: a column is missing, or ``a`` / ``b`` has no rows.
    """
    keys = list(keys)
    _check(df, keys + [column], value)
    for v in (a, b):
        if not (df[column] == v).any():
            raise ValueError(f"{column}={v!r} has no rows; it has {sorted(df[column].astype(str).unique())}")
    med = df.groupby(keys + [column, "process"])[value].median()
    out = {}
    groups = [()] if not keys else sorted(set(df[keys].itertuples(index=False, name=None)))
    for key in groups:
        sel = med.loc[key] if key else med
        pa, pb = sel.xs(a, level=column), sel.xs(b, level=column)
        common = pa.index.intersection(pb.index)
        out[key] = _summary(((pa.loc[common] / pb.loc[common] - 1.0) * 100.0).values)
    return out
