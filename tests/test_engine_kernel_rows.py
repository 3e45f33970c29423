"""The H200 rows of the engines' own kernels (data/measured/h200/between_process/engine_kernels.csv): provenance,
correctness checks, >= 5 fresh processes, and the between-process summaries the answer block quotes."""

import pandas as pd
import pytest

from mla_lab.measure.spread import MIN_PROCESSES
from mla_lab.report.engine_kernel_figures import (
    ENGINE_KERNELS_CSV,
    decode_table,
    gather_share,
    kernel_ms,
    prefill_table,
)

ROWS = pd.read_csv(ENGINE_KERNELS_CSV)


def test_rows_name_the_engine_library_and_version():
    ek = ROWS[ROWS["experiment"] == "engine_kernels"]
    backends = set(ek["kernel_backend"])
    assert "vllm-0.33.0 _vllm_fa3_C (FA3)" in backends
    assert "vllm-0.33.0 _C_stable_libtorch concat_mla_q (CUDA)" in backends
    assert "vllm-0.33.0 _flashmla_C (FlashMLA)" in backends
    assert "sglang-0.5.23 triton_sparse_mla_prefill" in backends
    assert set(ek["gpu"]) == {"NVIDIA H200"} and set(ek["source"]) == {"measured"}
    assert ek["process"].nunique() >= MIN_PROCESSES
    # decode rows from 1 to >= 128 query tokens
    dec = ek[ek["shape"] == "decode"]
    assert dec["T"].min() == 1 and dec["T"].max() >= 128


def test_every_engine_kernel_matched_the_reference_before_it_was_timed():
    chk = ROWS[ROWS["experiment"] == "check"]
    assert set(chk["kernel"]) >= {"fa3_sparse", "flashmla_vllm_pad64", "flashmla_vllm_native", "sglang_triton"}
    # bf16 outputs against the fp32 reference: one bf16 ulp at |x| ~ 2-4 (2**-6)
    assert chk["max_abs_err"].max() <= 2 ** -6 + 1e-9


def test_seed_shape_figures():
    t = {r["kernel"]: r for r in prefill_table("seed", 8)}
    assert t["fa3_sparse"]["median"] == pytest.approx(2.214, abs=0.0005)
    assert t["flashmla_vllm_pad64"]["median"] == pytest.approx(2.487, abs=0.0005)
    assert t["flashmla_vllm_native"]["median"] == pytest.approx(2.728, abs=0.0005)
    assert t["sglang_triton"]["median"] == pytest.approx(2.350, abs=0.0005)
    assert t["gather_only"]["median"] == pytest.approx(1.615, abs=0.0005)
    # the native 8-head FlashMLA path is slower than padding to 64 in every process
    assert t["flashmla_vllm_native"]["min"] > t["flashmla_vllm_pad64"]["max"]
    # FA3 with the real heads beats the padded FlashMLA in every process
    assert t["fa3_sparse"]["max"] < t["flashmla_vllm_pad64"]["min"]


def test_gather_bounds_the_kernels_not_the_padded_mmas():
    g = gather_share("seed", 8)
    assert 0.6 < g["of_flashmla_pad64"] < 0.7
    full = gather_share("full_topk", 8)
    assert full["of_flashmla_pad64"] > 0.8
    # h_q 128 gathers every token's rows twice and doubles the MMAs: ~2x; the doubled gather alone is 1.85x
    r = kernel_ms("flashmla_ts_h128", "seed", 64)["median"] / kernel_ms("flashmla_ts_pad64", "seed", 64)["median"]
    assert 1.85 < r < 2.05


def test_decode_parallelism():
    rows = {r["B"]: r for r in decode_table(8, 8192)}
    assert rows[1]["flashmla_pad64"] / rows[1]["fa3_split"] > 3.0
    assert rows[256]["flashmla_pad64"] / rows[256]["fa3_split"] == pytest.approx(1.0, abs=0.05)


def test_findings_state_the_rows():
    """docs/findings.md's engine-kernel table and sentences, recomputed from the rows."""
    from mla_lab.paths import REPO_ROOT
    from mla_lab.report.engine_kernel_figures import fmt

    flat = " ".join((REPO_ROOT / "docs" / "findings.md").read_text().split())
    t = {r["kernel"]: r for r in prefill_table("seed", 8)}
    for k in ("fa3_sparse", "flashmla_vllm_pad64", "flashmla_ts_pad64", "flashmla_vllm_native", "sglang_triton",
              "gather_only"):
        assert fmt(t[k]).replace(" ms", "").split(" ", 1)[0] in flat, k
        assert f"| {fmt(t[k]).replace(' ms', '')} |" in flat, k
    rows = {r["B"]: r for r in decode_table(8, 8192)}
    assert (f"takes {rows[1]['fa3_split']:.3f} ms against {rows[1]['flashmla_pad64']:.3f} ms for padded FlashMLA"
            in flat)
    assert f"at 256 tokens {rows[256]['fa3_split']:.3f} vs {rows[256]['flashmla_pad64']:.3f} ms" in flat
