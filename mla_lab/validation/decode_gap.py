"""PR #46189's FA3-vs-FLASHMLA_SPARSE decode gap per layer beside the H200 kernel rows (issue 37; nothing fitted;
which row matches was seen after reading: any agreement is in-sample). Per GLM-5.1 run at concurrency 1 and 8
(``blind_2026-12_results.json``): mean TPOT FLASHMLA_SPARSE minus FLASH_ATTN_MLA_SPARSE over 78 layers (us), beside
``flashmla_vllm_pad64`` / ``flashmla_vllm_native`` minus ``fa3_sparse`` at T = concurrency (``engine_kernels.csv``,
vLLM 0.33.0's kernels) and ``june_path_us``: vLLM 0.24.0's decode path (``flashmla_vllm_path_june``: concat,
``new_empty`` pad to 64 heads, its FlashMLA, slice) minus ``fa3_sparse`` at ``num_splits`` 0 (vLLM passes none;
``engine_kernels_june.csv``), interpolated linearly in keys between 1088 and 2048.

    python -m mla_lab.validation.decode_gap
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd

from ..paths import REPO_ROOT
from . import BLIND_RESULTS as RESULTS

KERNEL_ROWS = REPO_ROOT / "data" / "measured" / "h200" / "between_process" / "engine_kernels.csv"
JUNE_ROWS = KERNEL_ROWS.with_name("engine_kernels_june.csv")
#: GLM-5's num_hidden_layers and index_topk (data/models/glm-5/config.json)
LAYERS, TOPK = 78, 2048
_KEYS_AT_CTX = {1088: 1088, 8192: TOPK}


def _kernel_table(path=KERNEL_ROWS) -> dict:
    """(kernel, T, keys) -> median us of the H = 8 rows (module docstring)."""
    d = pd.read_csv(path, dtype=str, keep_default_na=False)
    d = d[(d["experiment"] == "engine_kernels") & (d["H"] == "8") & (d["ms"] != "") & (d["ctx_len"] != "")]
    return _us(d, d["ctx_len"].astype(int)).groupby(["kernel", "T", "keys"])["us"].median().to_dict()


def _june_table(path=JUNE_ROWS) -> dict:
    """(kernel, T, keys) -> us of the June build's H = 8 decode rows: median over processes of their medians."""
    d = pd.read_csv(path, dtype=str, keep_default_na=False)
    june = (d["kernel"] == "flashmla_vllm_path_june") & d["kernel_backend"].str.contains("0.24.0", regex=False)
    fa3 = ((d["kernel"] == "fa3_sparse") & d["num_splits"].isin(["0", "0.0"])
           & d["engine_sources"].str.contains("0.24.0", regex=False))
    d = d[(d["shape"] == "decode") & (d["H"] == "8") & (june | fa3)]
    per = _us(d, d["ctx_len"].astype(float).astype(int)).groupby(["kernel", "T", "keys", "process"])["us"].median()
    return per.groupby(level=[0, 1, 2]).median().to_dict()


def _us(d: pd.DataFrame, ctx: pd.Series) -> pd.DataFrame:
    """Rows ``d`` at a context of :data:`_KEYS_AT_CTX`, with ``keys``, ``T`` (int) and ``us``."""
    d = d.assign(keys=ctx.map(_KEYS_AT_CTX), T=d["T"].astype(int), us=d["ms"].astype(float) * 1e3)
    return d.dropna(subset=["keys"]).astype({"keys": int})


def _kernel_us(table: dict, kernel: str, T: int, keys: float) -> float:
    a, b = table[(kernel, T, 1088)], table[(kernel, T, TOPK)]
    return a + (b - a) * (keys - 1088) / (TOPK - 1088)


def decode_gap_rows(results: dict | None = None, table: dict | None = None) -> list[dict]:
    """Per PR #46189 workload at concurrency 1 and 8: ``real_us_per_layer``, ``pad64_us`` / ``native_us`` /
    ``june_path_us`` (us per layer), ``mean_keys``."""
    results = results or json.loads(RESULTS.read_text())
    table = table or _kernel_table()
    june = _june_table()
    case = next(c for c in results["cases"] if c["id"] == "pr46189")
    tpot = {(r["workload"]["random_input_len"], r["workload"]["random_output_len"], r["workload"]["max_concurrency"],
             r["backend"]): r["metrics"]["mean_tpot_ms"] for r in case["runs"]}
    rows = []
    for (i, o, c, b) in sorted(tpot):
        if b != "FLASHMLA_SPARSE" or c not in (1, 8):
            continue
        keys = sum(min(c, TOPK) for c in range(i + 1, i + o + 1)) / o
        fa3 = _kernel_us(table, "fa3_sparse", c, keys)
        rows.append({"workload": {"random_input_len": i, "random_output_len": o, "max_concurrency": c},
                     "mean_keys": keys,
                     "real_us_per_layer": (tpot[(i, o, c, b)] - tpot[(i, o, c, "FLASH_ATTN_MLA_SPARSE")]) / LAYERS * 1e3,
                     "pad64_us": _kernel_us(table, "flashmla_vllm_pad64", c, keys) - fa3,
                     "native_us": _kernel_us(table, "flashmla_vllm_native", c, keys) - fa3,
                     "june_path_us": _kernel_us(june, "flashmla_vllm_path_june", c, keys)
                     - _kernel_us(june, "fa3_sparse", c, keys)})
    return rows


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m mla_lab.validation.decode_gap", description="print PR #46189's decode "
                            "gap per layer beside the H200 kernel rows; writes nothing").parse_args(argv)
    for r in decode_gap_rows():
        w = r["workload"]
        print(f"{w['random_input_len']}/{w['random_output_len']} conc {w['max_concurrency']}: keys "
              f"{r['mean_keys']:.0f}, real {r['real_us_per_layer']:.0f} us/layer, pad64 kernels {r['pad64_us']:.0f}, "
              f"native-8 kernels {r['native_us']:.0f}, June path {r['june_path_us']:.0f} "
              f"({100 * r['june_path_us'] / r['real_us_per_layer']:.0f} % of the gap)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
