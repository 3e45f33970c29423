"""The registry's entry for :mod:`mla_lab.measure.engine_kernels` (the engines' own sparse-MLA kernels: FA3 sparse,
vLLM FlashMLA pad64 / native, tokenspeed FlashMLA, SGLang Triton, gather floor, vLLM ``concat_mla_q``; prefill,
decode sizes, gather vs MMA). The experiment itself lives there; this module gives the registry its rows, shapes and
provenance and runs its ``main`` (``python -m mla_lab.measure.experiments.engine_kernels`` = ``python -m
mla_lab.measure.engine_kernels``)."""

from __future__ import annotations

from mla_lab.measure.engine_kernels import COLUMNS, DECODE_B, DECODE_CTX, DECODE_H, PREFILL_H, main, run

__all__ = ["OUTPUTS", "SHAPES", "PROVENANCE", "main", "run"]

OUTPUTS = {"engine_kernels.csv": [c for c in COLUMNS if c != "process"] + ["engine_sources"],
           # --parts content (padded FlashMLA with zero vs stale padded heads, paired with FA3): a second lease
           "engine_kernels_content.csv": [c for c in COLUMNS if c != "process"] + ["engine_sources"]}
#: Every row carries mla_lab.measure.record.bench_provenance's columns and ``engine_sources`` (the vLLM wheel the
#: kernels were packed from, mla_lab.measure.engine_libs).
PROVENANCE: tuple[str, ...] = ("source", "gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit",
                               "date_utc", "engine_sources")
#: (shape, H, B, ctx_len): the prefill shapes per heads-per-rank, the decode sizes
SHAPES = ([(s, H, None, None) for s in ("seed", "full_topk") for H in PREFILL_H]
          + [("decode", H, B, c) for H in DECODE_H for B in DECODE_B for c in DECODE_CTX])

if __name__ == "__main__":
    raise SystemExit(main())
