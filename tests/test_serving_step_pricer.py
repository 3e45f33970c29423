"""The cost model as a serving pricer (mla_lab.serving.step_pricer): hand-checkable steps (the step conversion,
the launch model, the strategies' decode costs, the decode terms per layer). The decode calibration's own tests:
tests/test_model_decode_calibration.py; the benchmark per strategy: tests/test_serving_benchmark.py."""

from dataclasses import replace
from pathlib import Path

import pytest

from mla_lab.arch import get_arch
from mla_lab.deployment import Deployment
from mla_lab.model.calibration import load_calibration
from mla_lab.model.decode_calibration import DECODE_CSV, load_decode_calibration
from mla_lab.model.ops import attention_path_ops, step_ops, step_stats
from mla_lab.model.timing import op_time_ms, step_time_ms
from mla_lab.models import load_model
from mla_lab.placement import BASELINE
from mla_lab.serving.step import DecodeToken, PrefillChunk, Step
from mla_lab.serving.step_pricer import CostModelPricer, _Parts, layer_decode_ms
from mla_lab.workload import Step as WorkStep
from mla_lab.workload import sum_topk_lengths

DATA = Path(__file__).resolve().parent.parent / "data"
CAL_CSV = DATA / "calibration" / DECODE_CSV
VALIDATION = DATA / "measured" / "h200" / "round2" / "decode_validation.csv"
H200 = get_arch("h200")
DCAL = load_decode_calibration()
GLM = load_model("glm-5")
SEED = Deployment.seed().rank  # GLM-5 TP8 H200, fp8 weights, EP, bf16 KV (the PR's deployment)
#: the decode measurements' rank: bf16 weights (benchmarks/bench_decode.py)
BF16_WEIGHTS = Deployment.rank_of(model="glm-5", tp=8, arch="h200", kv_cache_dtype="bf16", weight_dtype="bf16",
                                  moe_parallel="ep", max_num_batched_tokens=16384)


def decode_step(B, c, mode="FULL"):
    return Step(tuple(DecodeToken(i, c) for i in range(B)), (), mode, B if mode != "NONE" else None)


@pytest.fixture(scope="module")
def pricer():
    return CostModelPricer(SEED, "private_workspace")


# ------------------------------------------------------------------------------------------ step conversion
def test_a_decode_token_is_the_chunk_ending_at_its_context():
    """The pricer's conversion (shared with the decode fit): decode tokens first, each ``(req, c - 1, 1)``, then the
    prefill chunks ``(req, start, n)`` (requests renumbered apart)."""
    from mla_lab.model.calibration import resolve_calibration

    parts = _Parts(SEED, "private_workspace", [(3, 100, 50)], [1500, 5000], resolve_calibration(None), DCAL)
    ws = parts.ws
    assert [(s, n) for _, s, n in ws.chunks] == [(1499, 1), (4999, 1), (100, 50)]
    assert len({r for r, _, _ in ws.chunks}) == 3
    st = step_stats(GLM, ws)
    # a decode token attends min(c, topk) keys and its indexer sees c keys
    assert st.sum_topk == 1500 + 2048 + sum_topk_lengths(100, 50, 2048)
    assert st.sum_visible == 1500 + 5000 + sum_topk_lengths(100, 50, 1 << 62)
    assert st.num_tokens == 52 and st.num_seqs == 3


# ------------------------------------------------------------------------------------------- launch model
def test_decode_only_step_runs_as_a_graph_without_the_eager_term(pricer):
    s = decode_step(32, 1100)
    assert s.cuda_graph and s.kind == "decode"
    r = pricer.price(s)
    assert r["launch"] == "graph" and r["host_ms"] == 0.0
    assert r["total_ms"] == r["gpu_ms"] == pricer(s)
    # the same tokens launched eagerly pay max(GPU + n x gap, n x host)
    e = pricer.price(decode_step(32, 1100, "NONE"))
    n = pricer.n_ops
    assert e["launch"] == "eager" and e["gpu_ms"] == pytest.approx(r["gpu_ms"])
    assert e["total_ms"] == pytest.approx(max(r["gpu_ms"] + n * DCAL.eager_gap_us * 1e-3,
                                              n * DCAL.host_us_per_op * 1e-3))
    assert e["total_ms"] > r["total_ms"]
    # a host-bound calibration: 1 ms per launch makes the eager step exactly n ms; the graph step is unchanged
    slow = CostModelPricer(SEED, "private_workspace",
                        decode_cal=replace(DCAL, host_us_per_op=1000.0, eager_gap_us=0.0))
    assert slow(decode_step(32, 1100, "NONE")) == pytest.approx(n * 1.0)
    assert slow(s) == pytest.approx(r["total_ms"])


def test_launches_counted_once_per_op_of_every_layer(pricer):
    expect = sum(n for _, n in step_ops(SEED, "private_workspace", WorkStep([(0, 9, 1)])))
    assert pricer.n_ops == expect and expect > GLM.num_hidden_layers * 20


def test_mixed_step_pays_the_eager_term():
    gap = CostModelPricer(SEED, "private_workspace",
                       decode_cal=replace(DCAL, host_us_per_op=0.0, eager_gap_us=2.0))
    s = Step((DecodeToken(0, 1030), DecodeToken(1, 1031)), (PrefillChunk(2, 0, 512),), "PIECEWISE", 520)
    assert s.kind == "mixed" and not s.cuda_graph
    r = gap.price(s)
    assert r["launch"] == "eager"
    assert r["total_ms"] == pytest.approx(r["gpu_ms"] + gap.n_ops * 2.0e-3)


# ------------------------------------------------------------------------------------------- strategies
def test_per_call_pad_costs_on_decode_steps_with_bf16_kv_only():
    s = decode_step(32, 1100)
    pre = CostModelPricer(SEED, BASELINE)
    fused = CostModelPricer(SEED, "private_workspace")
    sglang = CostModelPricer(SEED, "per_call_zeros")
    assert sglang(s) > pre(s) > fused(s)
    # the difference is the pad copy of every layer: its roofline plus one kernel's graph overhead
    pad = next(op for op in attention_path_ops(SEED, BASELINE, 32, 32 * 1100) if op.name == "pad_copy")
    per_layer = op_time_ms(pad, H200, DCAL.graph_calibration(load_calibration())) + DCAL.attn_floor_us["pad_copy"] * 1e-3
    assert pre(s) - fused(s) == pytest.approx(GLM.num_hidden_layers * per_layer, rel=1e-9)
    fp8_kv = Deployment.seed(kv_cache_dtype="fp8").rank
    fp8 = {n: CostModelPricer(fp8_kv, n)(s)
           for n in (BASELINE, "private_workspace", "per_call_zeros", "kernel_native")}
    assert len(set(fp8.values())) == 1, fp8


def test_prefill_only_step_keeps_the_layer_model_for_the_decode_terms(pricer):
    s = Step((), (PrefillChunk(0, 0, 1024), PrefillChunk(1, 0, 1024)), "NONE", None)
    r = pricer.price(s)
    base = step_time_ms(SEED, "private_workspace", WorkStep([(0, 0, 1024), (1, 0, 1024)]), pricer.gcal)
    for op in ("idx_logits", "idx_topk", "kernel"):
        assert r["by_op"][op] == pytest.approx(base["by_op"][op], rel=1e-12)


def test_decode_terms_counted_over_the_right_layers():
    """GLM-5.2 has a DSA indexer on 21 of 78 layers: the decode indexer is charged 21 times, the kernel 78."""
    rank = Deployment.seed(model="glm-5.2").rank
    p = CostModelPricer(rank, "private_workspace")
    s = decode_step(16, 3000)
    per = layer_decode_ms(rank, "private_workspace", decode_contexts=[3000] * 16, measured_subset=False)["ops"]
    by = p.price(s)["by_op"]
    assert by["idx_logits"] == pytest.approx(21 * per["idx_logits"])
    assert by["idx_topk"] == pytest.approx(21 * per["idx_topk"])
    assert by["kernel"] == pytest.approx(78 * per["kernel"])


def test_decode_kernel_is_flat_then_bandwidth_bound():
    """The decode kernel against vLLM 0.33.0's FlashMLA padded to 64 heads measured at 2048 keys per token (one H200,
    5 fresh processes, engine_kernels.csv): flat from B = 1 to 16, bandwidth-bound at 256; within 10 %."""
    from mla_lab.report.engine_kernel_figures import decode_table

    measured = {r["B"]: r["flashmla_pad64"] * 1e3 for r in decode_table(8, 8192)}

    def kernel_us(B):
        return layer_decode_ms(BF16_WEIGHTS, "private_workspace", decode_contexts=[4096] * B)["ops"]["kernel"] * 1e3

    for B in (1, 16, 256):
        assert kernel_us(B) == pytest.approx(measured[B], rel=0.10), B
    assert kernel_us(16) / kernel_us(1) < 1.15 and kernel_us(256) / kernel_us(16) > 2


