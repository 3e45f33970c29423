"""Issue 37: memory as torch reports it, and the KV capacity as vLLM 0.33.0 computes it, term by term.

Every figure is recomputed here from a committed file (data/measured/h200/mem_get_info.json, data/models/*/config.json)
or from the terms memory_tradeoff returns, never copied from its output."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from mla_lab.arch import ARCHS, SMI_TORCH_GAP_MIB, get_arch
from mla_lab.deployment import Deployment
from mla_lab.model.memory import (
    CUDAGRAPH_ESTIMATE_BYTES,
    KV_BLOCK_SIZE,
    NON_TORCH_AFTER_SNAPSHOT_BYTES,
    activation_peak_bytes,
    memory_tradeoff,
    mtp_weights_bytes,
    weights_bytes_per_rank,
)
from mla_lab.placement import BASELINE

ROOT = Path(__file__).resolve().parents[1]
MiB, GiB = 2**20, 2**30


def test_h200_torch_total_is_the_measured_reading():
    rec = json.loads((ROOT / "data/measured/h200/mem_get_info.json").read_text())
    h200 = get_arch("h200")
    assert h200.torch_total_bytes == rec["total_bytes"] == 150_109_880_320
    assert h200.torch_total_status == "measured"
    # the gap nvidia-smi -> torch the assumed cards use
    assert SMI_TORCH_GAP_MIB == math.ceil(rec["nvidia_smi_memory_total_mib"] - rec["total_bytes"] / MiB) == 616
    assert h200.hbm_gb == 141  # the datasheet figure stays


def test_every_card_has_a_sourced_torch_total():
    for a in ARCHS.values():
        assert a.torch_total_status in ("measured", "cited", "assumed") and a.torch_total_source
        # torch's total sits between the datasheet's decimal GB and 1.1x it (a wrong unit would be off by 7 %+)
        assert a.hbm_gb * 1e9 < a.torch_total_bytes < 1.1 * a.hbm_gb * 1e9
    assert get_arch("h20").torch_total_bytes == (97_871 - 616) * MiB  # DeepGEMM#268's nvidia-smi minus the gap
    assert get_arch("h100").torch_total_bytes == round(79.22 * GiB)   # vllm#10511
    assert get_arch("b200").torch_total_bytes == round(178.35 * GiB)  # pytorch/ao#4002


def _by_term(kv):
    return {t["term"]: t for t in kv["terms"]}


def test_seed_capacity_recomputed_from_its_terms():
    d = Deployment.seed()
    mem = memory_tradeoff(d, strategies=[BASELINE])
    kv = mem["kv_capacity"]
    t = _by_term(kv)
    total = 150_109_880_320
    requested = math.ceil(total * 0.9)
    weights = weights_bytes_per_rank(d.rank)
    topk = 16384 * 2048 * 4
    q_ws = 16384 * 8 * 576 * 2  # the baseline's private unpadded Q buffer
    act = activation_peak_bytes(d.rank)
    # at max_num_seqs 256 the forward's 4 T x h bf16 outweighs the dummy sampler's 256 x 154,880 x 14 B + hidden rows
    assert act == 4 * 16384 * 6144 * 2 > 256 * 154_880 * 14 + 2 * 6144 * (16384 + 2 * 256)
    logits = 512 * MiB  # VLLM_SPARSE_INDEXER_MAX_LOGITS_MB
    moe_ws = 16384 * 8 * (6144 + 6144) * 2  # TritonExperts workspace13 + workspace2, bf16
    sampler_buf = 132 * 154_880 * 4  # the Triton top-k/top-p buffer: 132 SMs x vocab fp32
    available = (requested - weights - topk - q_ws - logits - moe_ws - sampler_buf - act
                 - NON_TORCH_AFTER_SNAPSHOT_BYTES - CUDAGRAPH_ESTIMATE_BYTES)
    per_tok = 78 * (1152 + 132)  # GLM-5 config.json: 78 layers, bf16 MLA 576 x 2 B + indexer 128 + 4 B
    assert t["requested = ceil(total x utilization)"]["value"] == requested
    assert t["indexer top-k buffer"]["value"] == topk and t["baseline Q-concat workspace"]["value"] == q_ws
    assert kv["available_bytes"] == available and kv["bytes_per_token"] == per_tok == 100_152
    assert t["fused-MoE workspace (workspace manager)"]["value"] == moe_ws
    assert t["sampler top-k/top-p buffer"]["value"] == sampler_buf
    assert kv["tokens"] == available // (KV_BLOCK_SIZE * per_tok) * KV_BLOCK_SIZE == 329_280
    # 271,663 before issue 37 (141e9 B, no non-torch / graph term); 330,688 before the post-hoc read of the wheels
    assert mem["kv_capacity_tokens"] == 329_280
    assert t["sparse prefill workspaces beyond the MoE scratch"]["value"] == 0  # no max_model_len given
    for term in kv["terms"]:
        assert {"term", "value", "unit", "status", "source"} <= set(term) and term["source"]


def test_graph_term_by_version_and_mtp_and_max_model_len():
    d = Deployment.seed()
    new = memory_tradeoff(d, strategies=[BASELINE])["kv_capacity"]
    old = memory_tradeoff(d, strategies=[BASELINE], vllm_version="0.20.0")["kv_capacity"]
    assert _by_term(old)["CUDA-graph estimate"]["value"] == 0
    assert old["available_bytes"] - new["available_bytes"] == CUDAGRAPH_ESTIMATE_BYTES
    mtp = memory_tradeoff(d, strategies=[BASELINE], mtp_layers=1)["kv_capacity"]
    assert mtp["bytes_per_token"] == new["bytes_per_token"] + 1284
    assert new["available_bytes"] - mtp["available_bytes"] == mtp_weights_bytes(d.rank)
    mml = memory_tradeoff(d, strategies=[BASELINE], max_model_len=131_000)["kv_capacity"]
    assert mml["tokens"] == int(mml["num_blocks"] / math.ceil(131_000 / 64) * 131_000)
    # a 1M-token context: the indexer's K gather (1M x 8 x 2 x 132 B) and FlashMLA's workspace (1M x 2 x 1152 B)
    # stay below the seed's fused-MoE scratch (16384 x 8 x (6144 + 6144) x 2 B), so they add nothing; at TP8 with
    # max_num_batched_tokens 256 the scratch is small and FlashMLA's workspace sets the size
    assert _by_term(memory_tradeoff(d, strategies=[BASELINE], max_model_len=2**20)["kv_capacity"])[
        "sparse prefill workspaces beyond the MoE scratch"]["value"] == 0
    small = d.replace(max_num_batched_tokens=256)
    got = _by_term(memory_tradeoff(small, strategies=[BASELINE], max_model_len=2**20)["kv_capacity"])
    moe = 256 * 8 * (6144 + 6144) * 2
    assert got["sparse prefill workspaces beyond the MoE scratch"]["value"] == 2**20 * 2 * 1152 - moe


def test_dummy_sampler_sets_the_transient_peak_at_h200_max_num_seqs():
    """vLLM's profile run samples min(T, max_num_seqs) rows over the whole vocab: at 1024 rows (its H200 default)
    the logits (bf16), their fp32 copy, probs and exponential noise (fp32) outweigh the forward's 4 T x h."""
    d = Deployment.seed(model="glm-5.2", tp=8, arch="h200", max_num_batched_tokens=8192, kv_cache_dtype="fp8",
                        weight_dtype="fp8", moe_parallel="tp", max_num_seqs=1024)
    assert activation_peak_bytes(d.rank) == 1024 * 154_880 * (2 + 3 * 4) + 2 * 6144 * (8192 + 2 * 1024)
    assert activation_peak_bytes(d.replace(max_num_seqs=256).rank) == max(
        4 * 8192 * 6144 * 2, 256 * 154_880 * 14 + 2 * 6144 * (8192 + 512))
    t = _by_term(memory_tradeoff(d, strategies=[BASELINE])["kv_capacity"])
    assert t["profile-run activation peak"]["status"] == "cited"
    assert t["fused-MoE workspace (workspace manager)"]["value"] == 8192 * 8 * (6144 + 6144) * 2


def test_indexer_weights_only_on_indexer_layers():
    """GLM-5.2 (index_topk_freq 4) builds an indexer on 21 of 78 layers: its weights are wq_b (2048 x 4096 fp8 + a
    16 x 32 fp32 block scale), wk_weights_proj (6144 x (128 + 32) bf16) and k_norm (2 x 128 fp32), replicated."""
    kw = dict(tp=8, arch="h200", kv_cache_dtype="fp8", weight_dtype="fp8", moe_parallel="tp")
    every, shared = Deployment.seed(model="glm-5", **kw).rank, Deployment.seed(model="glm-5.2", **kw).rank
    assert len(shared.model.indexer_layers) == 21
    one = 2048 * 4096 + 16 * 32 * 4 + 6144 * 160 * 2 + 2 * 128 * 4
    assert weights_bytes_per_rank(every) - weights_bytes_per_rank(shared) == (78 - 21) * one


@pytest.mark.parametrize("kw, match", [({"vllm_version": "latest"}, "vllm_version='latest'"),
                                       ({"mtp_layers": 2}, "mtp_layers=2"),
                                       ({"max_model_len": 0}, "max_model_len")])
def test_bad_rule_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        memory_tradeoff(Deployment.seed(), strategies=[BASELINE], **kw)


def test_advise_json_reports_the_terms():
    out = subprocess.run([sys.executable, "-m", "mla_lab.cli", "advise", "--json", "--no-measured"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    kv = json.loads(out)["kv_capacity"]
    assert kv["tokens"] == 329_280 and kv["vllm_version"] == "0.33.0"
    t = _by_term(kv)
    assert t["total memory (torch)"]["value"] == 150_109_880_320 and t["total memory (torch)"]["unit"] == "bytes"
    assert "vllm/utils/mem_utils.py" in t["total memory (torch)"]["source"]
