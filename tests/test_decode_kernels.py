"""The decode-kernel model (mla_lab.model.decode_kernels): FA3's split heuristic, the committed fit reproduced from
the committed H200 rows, and the parallelism it prices (FlashMLA one CTA per token vs FA3 split-KV)."""

import pytest

from mla_lab.arch import get_arch
from mla_lab.model.decode_kernels import (
    DECODE_KERNELS_CSV,
    ROWS_CSV,
    DecodeKernel,
    fa3_num_splits,
    fit_decode_kernels,
    load_decode_kernels,
)
from mla_lab.paths import REPO_ROOT, calibration_dir

H200 = get_arch("h200")


@pytest.mark.parametrize("mblocks, n_blocks, expect", [
    (1, 32, 28),     # one token, 2048 keys: 28 splits reach >= 85 % of the best wave efficiency (32 splits)
    (106, 32, 1),    # >= 0.8 x 132 SMs: no split
    (200, 32, 1),
    (1, 1, 1),       # one key block: nothing to split
])
def test_fa3_num_splits(mblocks, n_blocks, expect):
    assert fa3_num_splits(mblocks, 132, n_blocks) == expect


def test_fa3_num_splits_refuses_zero():
    with pytest.raises(ValueError, match="total_mblocks=0"):
        fa3_num_splits(0, 132, 4)


def test_committed_fit_is_reproduced_from_the_committed_rows():
    committed = load_decode_kernels(calibration_dir() / DECODE_KERNELS_CSV)
    fresh = fit_decode_kernels(REPO_ROOT / ROWS_CSV, H200)
    for fam, k in fresh.items():
        c = committed[fam]
        assert k.a_us == pytest.approx(c.a_us, abs=1e-3)
        assert k.us_per_key == pytest.approx(c.us_per_key, rel=1e-3)
        assert k.eff_bytes == pytest.approx(c.eff_bytes, abs=1e-3)
        assert k.p == c.p
        assert k.mape_pct == pytest.approx(c.mape_pct, abs=0.01)
        assert k.mape_pct < 5 and k.loco_mape_pct < 10  # the fit describes the rows it was fitted on


def test_parallelism_is_priced():
    k = load_decode_kernels()
    fm, fa = k["flashmla_pad64"], k["fa3_sparse"]
    # one decode token with 2048 keys: FlashMLA walks them on one CTA, FA3 splits them: the measured ratio (0.063 vs
    # 0.019 ms, engine_kernels.csv) is about 3x
    assert fm.ms(1, 2048, H200) / fa.ms(1, 2048, H200) > 2.5
    # at 256 tokens both are bound by the gathered bytes: within 15 % of each other
    assert fm.ms(256, 2048, H200) / fa.ms(256, 2048, H200) == pytest.approx(1.0, abs=0.15)
    # FlashMLA at 1 token: fixed cost + one CTA's walk
    assert fm.ms(1, 2048, H200) * 1e3 == pytest.approx(fm.a_us + ((fm.us_per_key * 2048) ** fm.p + (
        2048 * 1152 / (H200.hbm_gbps * 1e3 * fm.eff_bytes)) ** fm.p) ** (1 / fm.p), rel=1e-9)


def test_bad_calibration_row_is_named(tmp_path):
    p = tmp_path / "k.csv"
    p.write_text("family,a_us,us_per_key,eff_bytes,p,mape_pct,loco_mape_pct\nfa3_sparse,x,1,1,1,1,1\n")
    with pytest.raises(ValueError, match=r"k.csv: row 2 is malformed"):
        load_decode_kernels(p)


def test_decode_kernel_refuses_empty_batch():
    with pytest.raises(ValueError, match="B=0"):
        DecodeKernel("fa3_sparse", 1, 1, 1, 1).ms(0, 10, H200)


def test_fa3_prefill_priced_against_the_padded_kernel_by_the_paired_ratio():
    """FA3 sparse at prefill: the padded kernel's modelled time x vLLM 0.33.0's FA3 / its FlashMLA padded with zero
    heads, paired in the same processes (engine_kernels_content.csv)."""
    from mla_lab.deployment import Deployment
    from mla_lab.model.fa3_kernel import fit_fa3_ratio
    from mla_lab.model.timing import attention_path_ms
    from mla_lab.workload import Step

    r = fit_fa3_ratio()
    assert r.table[("seed", 8)]["median"] == pytest.approx(0.894, abs=0.0005)
    assert r.table[("full_topk", 8)]["median"] == pytest.approx(0.926, abs=0.0005)
    assert r.ratio(8, 512.5) == pytest.approx(r.table[("seed", 8)]["median"])
    assert r.ratio(12, 2048) == pytest.approx((r.table[("full_topk", 8)]["median"]
                                               + r.table[("full_topk", 16)]["median"]) / 2)
    rank = Deployment.seed().rank  # GLM-5 TP8 H200, bf16 KV
    seed = Step([(i, 0, 1024) for i in range(16)])
    fa3 = attention_path_ms(rank, "fa3_sparse", seed)["kernel"]
    padded = attention_path_ms(rank, "private_workspace", seed)["kernel"]
    assert fa3 / padded == pytest.approx(r.ratio(8, 512.5), rel=1e-6)
