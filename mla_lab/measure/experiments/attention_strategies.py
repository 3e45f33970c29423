"""Named strategies (``--strategies``, canonical names) through
:func:`mla_lab.measure.attention.time_attention_path` at the seed and full-topk shapes, GLM-5 TP 8 (rows as
``presets``). Rows: ``strategies.csv`` (ms)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

from mla_lab.measure.attention import time_attention_path
from mla_lab.models import load_model
from mla_lab.placement import TIMED_STRATEGIES

from ._common import (
    PROMPT,
    PROVENANCE,  # noqa: F401 (re-exported: the provenance columns of its rows)
    SEED_T,
    Sink,
    full_step,
    log,
    part_main,
    seed_step,
)

OUTPUTS = {"strategies.csv": ["shape", "strategy", "round", "ms", "median_ms", "workspace_bytes", "peak_bytes",
                              "repeats"]}
#: (shape, T, strategy) at the default ``--strategies``
SHAPES = [(s, SEED_T, n) for s in ("seed", "full") for n in TIMED_STRATEGIES]



def part_strategies(sink: Sink, repeats: int, names) -> None:
    """Named strategies through the package (``time_attention_path``) at the seed and full-topk shapes: rows as
    ``presets`` (file ``strategies.csv``)."""
    m = load_model("glm-5")
    for shape, step, plen, full in (("seed", seed_step(), PROMPT, False), ("full", full_step(), 2 * SEED_T, True)):
        res = time_attention_path(m, 8, step, plen, "h200", strategies=tuple(names), full_topk=full,
                                  seed=0, device="cuda", repeats=repeats)
        for name in names:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write("strategies.csv", {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                              "median_ms": round(r["total"], 5),
                                              "workspace_bytes": r["workspace_bytes"],
                                              "peak_bytes": r["peak_bytes"], "repeats": repeats})
        log(f"strategies {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in names))


def run(sink: Sink, a) -> None:
    """This experiment's part of one fresh process (``a``: the parsed arguments of :func:`~._common.part_main`)."""
    part_strategies(sink, a.reps, a.strategies.split(','))


def main(argv=None) -> int:
    return part_main(run, __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
