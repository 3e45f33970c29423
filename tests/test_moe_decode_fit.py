"""The fp8 MoE decode fit (``python -m mla_lab.fits moe_decode``) and the cited decode all-reduce latency in the pricer."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from mla_lab.arch import get_arch
from mla_lab.measure.spread import between_process
from mla_lab.model.calibration import resolve_calibration
from mla_lab.model.decode_calibration import (
    DECODE_ALLREDUCE_LATENCY_US,
    DECODE_ALLREDUCE_MAX_BYTES,
    load_decode_calibration,
    load_moe_decode_fit,
)
from mla_lab.model.ops import LayerOp
from mla_lab.model.timing import comm_time_ms, op_time_ms

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data/measured/h200/between_process/moe_decode.csv"
FIT = ROOT / "data/calibration/h200_moe_decode.csv"


def test_fit_file_has_provenance_and_loads():
    fit = load_moe_decode_fit(FIT)
    assert fit is not None and fit["n_processes"] == 5
    assert fit["source"].startswith("measured-fit")
    df = pd.read_csv(FIT)
    for col in ("device", "git_commit", "method", "n_processes", "data_file", "impl"):
        assert col in df.columns and df[col].notna().all()
    assert load_moe_decode_fit(ROOT / "no_such_file.csv") is None
    assert load_decode_calibration().moe_fp8["a_us"] == pytest.approx(fit["a_us"], rel=1e-12)


def test_graph_class_reproduces_measured_blocks():
    """The pricer's moe_gemm_fp8 class (two grouped GEMMs of one MoE block) against the between-process figure per T
    >= 8, within 6 % (the fit's leave-one-T-out error there is 1.0-4.7 %; T = 1 has no expert hit)."""
    gcal = load_decode_calibration().graph_calibration(resolve_calibration(None))
    arch = get_arch("h200")
    df = pd.read_csv(DATA)
    df = df[df["impl"] == "fp8_scaled_grouped_mm"]
    bp = between_process(df, ["T"], "ms")
    for T in (8, 16, 32, 64, 128, 256):
        wb = float(df.loc[df["T"] == T, "weight_bytes"].median())
        ms = sum(op_time_ms(LayerOp(n, "moe_gemm_fp8", weight_bytes=wb * share), arch, gcal)
                 for n, share in (("gate_up", 2 / 3), ("down", 1 / 3)))
        meas = bp[(T,)]["median"]
        assert ms == pytest.approx(meas, rel=0.06), (T, ms, meas)


def test_decode_allreduce_latency_only_below_the_bound():
    cal = resolve_calibration(None)
    gcal = load_decode_calibration().graph_calibration(cal)
    arch = get_arch("h200")
    small, large = 32 * 6144 * 2, 2 * DECODE_ALLREDUCE_MAX_BYTES
    d_small = comm_time_ms("allreduce", small, 8, arch, gcal) - comm_time_ms("allreduce", small, 8, arch, cal)
    d_large = comm_time_ms("allreduce", large, 8, arch, gcal) - comm_time_ms("allreduce", large, 8, arch, cal)
    assert d_small == pytest.approx(DECODE_ALLREDUCE_LATENCY_US * 1e-3, rel=1e-9)
    assert math.isclose(d_large, 0.0, abs_tol=1e-12)
    assert "assumption (cited)" in gcal.comm_source(8) and "nccl/issues/1453" in gcal.comm_source(8)
    assert "cited" not in cal.comm_source(8)
