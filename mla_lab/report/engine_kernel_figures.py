"""The engines' own kernels on the H200 (issue 29): ``data/measured/h200/between_process/engine_kernels.csv``
(:mod:`mla_lab.measure.experiments.engine_kernels`; one H200, the engines' release-wheel kernels, graph timing, 5 fresh
processes x 5 interleaved rounds; the software in the file's provenance columns). Every figure: the median over
processes of the per-process medians, ``[min, max]`` over processes.
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from ..measure.spread import between_process
from ..paths import REPO_ROOT, read_measured_csv

__all__ = ["ENGINE_KERNELS_CSV", "kernel_ms", "prefill_table", "decode_table", "gather_share", "fmt"]

ENGINE_KERNELS_CSV = REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "engine_kernels.csv"
#: labels of the prefill kernels, in the order the tables show them
PREFILL_KERNELS = {
    "fa3_sparse": "FA3 sparse, real heads (vLLM 0.33.0 default)",
    "flashmla_vllm_pad64": "FlashMLA padded to 64 (vLLM 0.33.0 build)",
    "flashmla_ts_pad64": "FlashMLA padded to 64 (tokenspeed build)",
    "flashmla_vllm_native": "FlashMLA with h_q = H (vLLM 0.33.0 build)",
    "sglang_triton": "SGLang 0.5.23 Triton (16-row head tile)",
    "gather_only": "gather only (no MMA; the lab's Triton)",
    "path_pr53878": "PR #53878's path: vLLM concat into [T, 64, 576] + FlashMLA",
}


@lru_cache(maxsize=8)
def experiment_rows(path: str, experiment: str) -> pd.DataFrame:
    """The rows of ``experiment`` in the measured CSV ``path`` (whole or refused in one line); ``num_splits``
    (-1: unset) and ``ctx_len`` (0) as integers where the file has them."""
    d = read_measured_csv(path)
    d = d[d["experiment"] == experiment].copy()
    for c, unset in (("num_splits", -1), ("ctx_len", 0)):
        if c in d.columns:
            d[c] = d[c].fillna(unset).astype(int)
    return d


def between_process_ms(path, experiment: str, **where) -> dict:
    """:func:`mla_lab.measure.spread.between_process` of the ``ms`` of ``experiment``'s rows matching ``where``
    (a None value: any). Raises ValueError: no rows match (names the selection and the file)."""
    d = experiment_rows(str(path), experiment)
    for k, v in where.items():
        d = d if v is None else d[d[k] == v]
    if d.empty:
        raise ValueError(f"no rows for {' '.join(f'{k}={v!r}' for k, v in where.items())} in {path}")
    return next(iter(between_process(d, ["kernel"], "ms").values()))


def kernel_ms(kernel: str, shape: str, H: int, T: int = 16384, ctx_len: int = 0, num_splits: int | None = None,
              path=ENGINE_KERNELS_CSV) -> dict:
    """``{"median", "min", "max", "n"}`` (ms) of one kernel at one shape (:func:`between_process_ms`)."""
    r = between_process_ms(path, "engine_kernels", kernel=kernel, shape=shape, H=H, T=T, ctx_len=ctx_len,
                           num_splits=num_splits)
    return {"median": r["median"], "min": r["lo"], "max": r["hi"], "n": r["n_processes"]}


def prefill_table(shape: str = "seed", H: int = 8) -> list[dict]:
    """One row per prefill kernel at ``shape`` (``seed`` | ``full_topk``) and ``H`` heads per rank."""
    out = []
    for k, label in PREFILL_KERNELS.items():
        try:
            r = kernel_ms(k, shape, H, num_splits=0 if k == "fa3_sparse" else None)
        except ValueError:
            continue
        out.append({"kernel": k, "label": label, **r})
    return out


def decode_table(H: int = 8, ctx_len: int = 8192) -> list[dict]:
    """Decode kernels per batch size ``B``: FlashMLA padded (vLLM build), FA3 sparse with its split-KV heuristic
    (``num_splits`` 0, vLLM's call) and with split-KV off (1)."""
    d = experiment_rows(str(ENGINE_KERNELS_CSV), "engine_kernels")
    cols = (("flashmla_pad64", "flashmla_vllm_pad64", None), ("fa3_split", "fa3_sparse", 0),
            ("fa3_nosplit", "fa3_sparse", 1))
    return [{"B": int(B), **{c: kernel_ms(k, "decode", H, int(B), ctx_len, ns)["median"] for c, k, ns in cols}}
            for B in sorted(d[d["shape"] == "decode"]["T"].unique())]


def gather_share(shape: str = "seed", H: int = 8) -> dict:
    """The gather-only kernel's time as a share of FlashMLA padded (vLLM build) and of FA3 sparse at one shape."""
    g = kernel_ms("gather_only", shape, H)["median"]
    return {"gather_ms": g, "of_flashmla_pad64": g / kernel_ms("flashmla_vllm_pad64", shape, H)["median"],
            "of_fa3": g / kernel_ms("fa3_sparse", shape, H, num_splits=0)["median"]}


def fmt(r: dict, nd: int = 2) -> str:
    """``2.21 ms [2.20, 2.22]``."""
    return f"{r['median']:.{nd}f} ms [{r['min']:.{nd}f}, {r['max']:.{nd}f}]"
