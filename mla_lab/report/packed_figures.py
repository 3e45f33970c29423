"""The packed kernel on the H200 beside every engine's kernel (issue 36): the one place the answer block,
docs/packed.md and the tests take its figures from.

Source: ``data/measured/h200/between_process/packed_kernels.csv`` (:mod:`mla_lab.measure.experiments.packed_kernels`;
one H200, 5 fresh processes x 5 interleaved rounds, graph timing; T = 16384, H = 8, topk 2048). Every figure: the
median over processes of the per-process medians, ``[lo, hi]`` over processes. ``--update-docs``: docs/packed.md.
"""

from __future__ import annotations

import sys

import pandas as pd

from ..paths import REPO_ROOT
from .blocks import block_main, update_block
from .engine_kernel_figures import between_process_ms, experiment_rows

__all__ = ["PACKED_CSV", "kernel_ms", "speedup", "targets", "shape_table", "TARGETS", "SHAPE_ORDER", "KERNELS",
           "update_docs", "main"]

PACKED_CSV = REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "packed_kernels.csv"
DOC = REPO_ROOT / "docs" / "packed.md"
#: the reference every speedup is taken against: padded FlashMLA (tokenspeed build), the padded heads stale (as in
#: vLLM 0.33.0's shared workspace); ``_zeros`` is the same kernel with zero padded heads (the dispatch's fallback)
PADDED = "flashmla_ts_pad64"
SHAPE_ORDER = ("seed", "o1.0", "o0.9", "o0.8", "o0.6", "o0.4", "o0.2", "o0.0", "ctx4096", "ctx8192", "ctx32768",
               "ctx131072", "structured")
#: kernel -> label, in the order the tables show them
KERNELS = {
    "packed": "packed: union build + kernel (the lab's)",
    "packed_kernel": "packed kernel alone (FlashMLA shared + Triton rest)",
    "packed_triton": "packed, Triton only (rest, then shared)",
    "union_build": "union build alone (CUDA, shared memory)",
    "dispatched": "dispatched: sampled build + the chosen path",
    "flashmla_bound": "FlashMLA, s_q = T/8, h_q = 64, topk = U (bound)",
    "flashmla_ts_pad64": "FlashMLA padded to 64 (tokenspeed)",
    "flashmla_ts_pad64_zeros": "FlashMLA padded to 64, zero heads (tokenspeed)",
    "flashmla_vllm_pad64": "FlashMLA padded to 64 (vLLM 0.33.0)",
    "fa3_sparse": "FA3 sparse, real heads (vLLM 0.33.0)",
    "sglang_triton": "SGLang 0.5.23 Triton, 16-row tile",
    "sglang_triton_union4": "SGLang 0.5.23 Triton, union=4",
}


def _rows(path) -> pd.DataFrame:
    return experiment_rows(str(path), "packed_kernels")


def kernel_ms(kernel: str, shape: str, path=PACKED_CSV) -> dict:
    """:func:`mla_lab.report.engine_kernel_figures.between_process_ms` of one kernel at one shape (``median``, ``lo``,
    ``hi`` in ms, ``n_processes``). Raises ValueError: no rows match."""
    return between_process_ms(path, "packed_kernels", kernel=kernel, shape=shape)


def dispatch_path(shape: str, path=PACKED_CSV) -> str:
    """The path the dispatch chose at ``shape`` (``packed``, ``packed_triton`` or ``padded``)."""
    d = _rows(path)
    return str(d[(d["shape"] == shape) & (d["kernel"] == "dispatched")]["path"].iloc[0])


def speedup(kernel: str, shape: str, against: str = PADDED, path=PACKED_CSV) -> float:
    """``time(against) / time(kernel)`` at ``shape`` (between-process medians)."""
    return kernel_ms(against, shape, path)["median"] / kernel_ms(kernel, shape, path)["median"]


#: issue 36's done-when bars on the H200: (name, kernel, shape, quantity, bar, "min" = at least / "max" = at most)
TARGETS = (
    ("packed >= 5x padded FlashMLA at the seed (union build included)", "packed", ("seed",), "speedup", 5.0, "min"),
    ("packed >= 2x at 80 % pairwise overlap (U ~ 2.4 x topk)", "packed", ("o0.8",), "speedup", 2.0, "min"),
    ("packed >= 2.5x at a 4096-token context, random top-k", "packed", ("ctx4096",), "speedup", 2.5, "min"),
    ("dispatched never > 2 % slower than padded FlashMLA (the same kernel it falls back to, zero padded heads)",
     "dispatched", SHAPE_ORDER, "slowdown_vs_zeros", 1.02, "max"),
    ("union build <= 5 % of the packed kernel where the dispatch packs", "union_build", SHAPE_ORDER, "build_share",
     0.05, "max"),
)


#: quantity of :data:`TARGETS` -> the kernels of its time ratio ``time(a) / time(b)`` (None: the target's kernel)
_RATIOS = {"speedup": (PADDED, None), "slowdown_vs_zeros": (None, "flashmla_ts_pad64_zeros"),
           "build_share": ("union_build", "packed_kernel")}


def targets(path=PACKED_CSV) -> list[dict]:
    """Each target: ``{"target", "value", "worst_shape", "bar", "met"}`` (value: the worst over its shapes; the build
    share only over the shapes where the dispatch packs)."""
    out = []
    for name, kernel, shapes, q, bar, kind in TARGETS:
        if q == "build_share":
            shapes = tuple(s for s in shapes if dispatch_path(s, path) != "padded")
        a, b = (k or kernel for k in _RATIOS[q])
        vals = {s: kernel_ms(a, s, path)["median"] / kernel_ms(b, s, path)["median"] for s in shapes}
        worst = (min if kind == "min" else max)(vals, key=vals.get)
        v = vals[worst]
        out.append({"target": name, "value": v, "worst_shape": worst, "bar": bar,
                    "met": v >= bar if kind == "min" else v <= bar, "per_shape": vals})
    return out


def shape_table(path=PACKED_CSV) -> list[dict]:
    """One row per shape: U, S, the padded time, each kernel's speedup against it, the dispatch's choice, the packed
    kernel's efficiency against the FlashMLA bound (bound / packed kernel)."""
    rows, d = [], _rows(path)
    for s in SHAPE_ORDER:
        u = d[d["shape"] == s].iloc[0]  # the shape's mean union and shared keys per group, over topk
        pad = kernel_ms(PADDED, s, path)
        r = {"shape": s, "U": float(u["U"]), "S": float(u["S"]), "padded_ms": pad["median"], "padded_lo": pad["lo"], "padded_hi": pad["hi"],
             "path": dispatch_path(s, path),
             "efficiency": kernel_ms("flashmla_bound", s, path)["median"] / kernel_ms("packed_kernel", s, path)["median"]}
        for k in KERNELS:
            if k != PADDED:
                r[k] = speedup(k, s, path=path)
        rows.append(r)
    return rows


def _markdown(path=PACKED_CSV) -> str:
    cols = ["packed", "packed_kernel", "packed_triton", "dispatched", "flashmla_bound", "flashmla_vllm_pad64",
            "fa3_sparse", "sglang_triton", "sglang_triton_union4"]
    lines = ["| shape | U / topk | S / topk | padded ms [min, max] | " + " | ".join(cols) + " | dispatch | "
             "kernel / bound |", "|" + "---|" * (len(cols) + 6)]
    lines += [f"| {r['shape']} | {r['U']:.2f} | {r['S']:.2f} | {r['padded_ms']:.2f} [{r['padded_lo']:.2f}, "
              f"{r['padded_hi']:.2f}] | " + " | ".join(f"{r[c]:.2f}x" for c in cols) + f" | {r['path']} | "
              f"{r['efficiency']:.2f} |" for r in shape_table(path)]
    lines += ["", "| target (issue 36) | value | worst at | bar | met |", "|---|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['value']:.3f} | {t['worst_shape']} | {t['bar']} | {'yes' if t['met'] else 'no'} |"
              for t in targets(path)]
    return "\n".join(lines)


_BEGIN = "<!-- packed-table:begin (python -m mla_lab.report.packed_figures --update-docs) -->"
_END = "<!-- packed-table:end -->"


def update_docs(doc=DOC, path=PACKED_CSV) -> bool:
    """Rewrite the generated block of ``doc`` from the rows; True when it changed. Raises ValueError: no markers."""
    return update_block(doc, _BEGIN, _END, _markdown(path), "packed-table")


def main(argv=None) -> int:
    return block_main(argv, __spec__.name, DOC, _BEGIN, _END, _markdown, "packed-table")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
