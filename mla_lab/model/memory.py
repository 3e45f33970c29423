"""Memory per rank: weights, the profile-run activation estimate, and the KV-cache budget they leave, by vLLM
0.33.0's rule (read in the release wheel): total memory as torch reports it x ``gpu_memory_utilization``, minus
the profile run's consumption and transient peak (weights, persistent buffers, activation peak, non-torch memory),
minus the CUDA-graph estimate, in whole blocks of every layer's MLA and indexer cache. One term per entry of
:data:`KV_RULE_SOURCES` (file:line each); :func:`memory_tradeoff` is the one function that computes the capacity.
The Q path's own bytes per strategy: :func:`mla_lab.buffers.memory_account`.
"""

from __future__ import annotations

import math
import re

from .._validate import check_int
from ..buffers import MIB, memory_account_of, shared_workspace_other_bytes
from ..deployment import Deployment
from ..placement import BASELINE, expand, fixed_strategies
from ..rank import RankView
from .ops import BF16, FP32, WEIGHT_DTYPES

_W = "vllm-0.33.0 wheel: "
#: Where each term of vLLM's KV budget is written (vLLM 0.33.0 release wheel; file:line).
KV_RULE_SOURCES = {
    "total": "arch.torch_total_bytes (the GPU record, mla_lab/arch/<gpu>.py); vLLM reads it with "
             "torch.accelerator.get_memory_info: " + _W + "vllm/utils/mem_utils.py:143",
    "requested": _W + "vllm/v1/worker/utils.py:724-726 requested_memory = ceil(total_memory * "
                 "gpu_memory_utilization)",
    "non_kv": _W + "vllm/utils/mem_utils.py:312-321 non_kv_cache_memory = total_consumed (free memory before the "
              "engine - after the profile run) + transient_peak_headroom (torch peak - allocated)",
    "weights": "config count at weight_dtype (mla_lab.model.memory.weights_bytes_per_rank); vLLM passes "
               "model_memory_usage to memory_profiling: " + _W + "vllm/v1/worker/gpu_worker.py:686-689; the indexer "
               "only on its layers (vllm/models/deepseek_v32/attention.py:166-174, 190), wq_b at weight_dtype, "
               "wk_weights_proj [index_head_dim + index_n_heads, h] bf16 (quant_config=None), k_norm fp32 (71-87)",
    "mtp": "one MTP layer (a decoder layer with its MoE, eh_proj 2h x h bf16 nn.Linear, two norms; embedding and "
           "head shared with the target): " + _W + "vllm/model_executor/models/deepseek_mtp.py:87, "
           "vllm/v1/spec_decode/llm_base_proposer.py:1418-1457",
    "topk_buffer": _W + "vllm/model_executor/models/deepseek_v2.py:1442-1447 topk_indices_buffer "
                   "[max_num_batched_tokens, index_topk] int32",
    "logits_reserve": _W + "vllm/model_executor/layers/sparse_attn_indexer.py:501-506 the profile run's dummy "
                      "indexer logits tensor of VLLM_SPARSE_INDEXER_MAX_LOGITS_MB (default 512: vllm/envs.py:1095-1097)",
    "sparse_workspace": "what the sparse-attention prefill workspaces add to the shared workspace beyond the fused-MoE "
                        "scratch (the workspace manager keeps one buffer at the largest demand): the indexer's K "
                        "gather (max_model_len x 8 x factor rows of 128 fp8 + 4 B scale: " + _W +
                        "vllm/v1/attention/backends/mla/indexer.py:916-927, sparse_attn_indexer.py:327-345, 487-499) "
                        "and FlashMLA's (max_model_len x factor x 576 x 2 B: flashmla_sparse.py:337-344); factor 5, "
                        "2 above 256K tokens (vllm/config/vllm.py:1866-1874); 0 without max_model_len",
    "q_workspace": "the lab's baseline Q workspace (mla_lab.placement.BASELINE; mla_lab.buffers.memory_account)",
    "activation": "the profile run's transient peak (mla_lab.model.memory.activation_peak_bytes; vLLM: "
                  "transient_peak_headroom, " + _W + "vllm/utils/mem_utils.py:318-320): the larger of the forward's "
                  "4 T x h bf16 (estimate) and the dummy sampler's, B = min(T, max_num_seqs) rows "
                  "(vllm/v1/worker/gpu_model_runner.py:5545, 6132-6139): logits B x V bf16 (5881) + an fp32 copy "
                  "(vllm/v1/sample/sampler.py:158) + probs fp32 (vllm/v1/sample/ops/topk_topp_sampler.py:309) + "
                  "exponential noise fp32 (616) in the second, forward_native call (gpu_model_runner.py:5918-5926, "
                  "topk_topp_sampler.py:326-333), + the T x h hidden states and 2 B x h rows; same path in the "
                  "vllm-0.24.0 wheel (gpu_model_runner.py:6045-6104)",
    "moe_workspace": _W + "the fused-MoE scratch the workspace manager keeps (mla_lab.buffers.shared_workspace_other_"
                     "bytes): TritonExperts (Hopper block-fp8 under TP: vllm/model_executor/layers/fused_moe/oracle/"
                     "fp8.py:122-132) workspace_shapes (M x topk x max(N/2, K)) + (M x topk x max(N, K)) bf16 "
                     "(fused_moe/experts/triton_moe.py:240-255), one get_simultaneous buffer (fused_moe/"
                     "modular_kernel.py:1188, 1207-1210)",
    "sampler_buffer": _W + "the Triton top-k/top-p buffer the profile's sampler caches: min(next_pow2(min(SMs, B)), "
                      "SMs) x V fp32 (vllm/v1/sample/ops/topk_topp_triton.py:1688-1695)",
    "non_torch": "assumed 0.5 GiB: CUDA modules and library handles loaded during load/profile, after the "
                 "snapshot (" + _W + "vllm/utils/mem_utils.py:160 non_torch_memory = cuda_memory - "
                 "torch_memory, counted in total_consumed); not measured",
    "nccl": _W + "vllm/v1/worker/gpu_worker.py:499-509 init_worker_distributed_environment runs BEFORE the "
            "snapshot (534-536), so NCCL buffers and custom all-reduce cost the budget nothing",
    "cudagraph": "assumed 1.0 GiB (not measured for these models; public logs of other models print 0.17 GiB "
                 "(noonghunna/club-3090#127), 2.51 GiB (vllm-project/vllm#50576), 5.97 GiB (zai-org/GLM-V#208) and "
                 "20.88 GiB with MTP at a 1M context (local-inference-lab/vllm#501)); subtracted since v0.21.0 by "
                 "default: " + _W +
                 "vllm/v1/worker/gpu_worker.py:707-757, vllm/envs.py:2219-2221 "
                 "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the log text at gpu_worker.py:787-788",
    "bytes_per_token": "every layer's MLA cache (1152 B bf16 = 576 x 2; 656 B fp8_ds_mla: " + _W +
                       "vllm/model_executor/layers/attention/mla_attention.py:1386) + the indexer cache (128 fp8 + "
                       "4 B scale = 132 B uint8: vllm/model_executor/models/deepseek_v2.py:731-736) on its "
                       "layers, one group: vllm/v1/kv_cache_interface.py:1319-1320 (page = sum of pages)",
    "blocks": _W + "vllm/v1/core/kv_cache_planning.py:681 num_blocks = available_memory // bytes_per_block; "
              "tokens: vllm/v1/core/kv_cache_utils.py:1061-1127 int(num_blocks / cdiv(max_model_len, block_size) "
              "x max_model_len)",
}
#: vLLM releases whose rule the lab knows (read: 0.33.0; earlier ones differ in the CUDA-graph term only as far
#: as the lab knows: on by default since 0.21.0, per 0.33.0's own log text, gpu_worker.py:787-788).
VLLM_MEMORY_VERSIONS = ("0.33.0",)
#: Non-torch memory allocated after vLLM's snapshot (assumed; :data:`KV_RULE_SOURCES` ``non_torch``).
NON_TORCH_AFTER_SNAPSHOT_BYTES = 512 * 2**20
#: vLLM's CUDA-graph memory estimate (assumed; :data:`KV_RULE_SOURCES` ``cudagraph``).
CUDAGRAPH_ESTIMATE_BYTES = 2**30
#: KV-cache block size of the sparse MLA backends, tokens (FlashMLA's 64-token pages: vllm-0.33.0 wheel
#: vllm/v1/attention/backends/mla/flashmla_sparse.py:136-144).
KV_BLOCK_SIZE = 64

def weights_bytes_per_rank(rank: RankView) -> int:
    """Estimated weight bytes one rank holds (vLLM layout), from the config: attention (q_b, kv_b, o_proj 1/tp;
    plus bf16 W_UK/W_UV copies), the indexer (replicated, on ``model.indexer_layers`` only), dense MLP or router +
    experts (1/tp under TP, ``E/ep`` whole experts under EP) + shared experts, embedding and LM head (1/tp). Linears
    at ``weight_dtype`` (fp8: 1 B + an fp32 scale per 128x128 block), the rest bf16. No MTP layer
    (:func:`mtp_weights_bytes`)."""
    model = rank.model
    attn, idx, dense, moe, emb = _layer_bytes(rank)
    n_dense = min(model.first_k_dense_replace, model.num_hidden_layers)
    n_moe = model.num_hidden_layers - n_dense
    return int(model.num_hidden_layers * attn + len(model.indexer_layers) * idx + n_dense * dense + n_moe * moe + emb)


def _layer_bytes(rank: RankView) -> tuple[int, int, int, int, int]:
    """Bytes one rank holds of (one attention block without its indexer, one indexer, one dense MLP, one MoE block,
    embedding + LM head)."""
    model, tp, H, weight_dtype, moe_parallel = rank.model, rank.tp, rank.num_heads, rank.weight_dtype, rank.moe_parallel
    ep = rank.ep_size
    wb = WEIGHT_DTYPES[weight_dtype]

    def lin(K, N):
        return K * N * wb + (math.ceil(K / 128) * math.ceil(N / 128) * FP32 if wb == 1 else 0)

    h, qr, kr = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    attn = (lin(h, qr) + lin(qr, H * (dn + dr)) + lin(h, kr + dr) + lin(kr, H * (dn + dv)) + lin(H * dv, h)
            + H * kr * (dn + dv) * BF16  # W_UK_T / W_UV bf16 copies
            + (2 * h + qr + kr) * BF16)
    nh, hd = model.index_n_heads, model.index_head_dim  # wq_b; wk_weights_proj bf16; k_norm fp32 (KV_RULE_SOURCES)
    idx = lin(qr, nh * hd) + h * (hd + nh) * BF16 + 2 * hd * FP32
    dense = 3 * lin(h, model.intermediate_size // tp)
    E, im = model.n_routed_experts, model.moe_intermediate_size
    experts = E * 3 * lin(h, im // tp) if moe_parallel == "tp" else (E // ep) * 3 * lin(h, im)
    moe = h * E * BF16 + E * FP32 + experts + model.n_shared_experts * 3 * lin(h, im // tp)
    emb = 2 * (model.vocab_size // tp) * h * BF16 + h * BF16
    return attn, idx, dense, moe, emb


def mtp_weights_bytes(rank: RankView) -> int:
    """Bytes one rank holds of one MTP layer (speculative decoding only): a decoder layer (attention + MoE),
    ``eh_proj`` ``[2h, h]`` bf16 and two norms; embedding and head shared (:data:`KV_RULE_SOURCES` ``mtp``)."""
    attn, idx, _, moe, _ = _layer_bytes(rank)  # the MTP layer has its own indexer (attention.py:190)
    h = rank.model.hidden_size
    return int(attn + idx + moe + 2 * h * h * BF16 + 2 * h * BF16)


def activation_peak_bytes(rank: RankView) -> int:
    """The profile run's transient peak over what it leaves allocated, bytes (:data:`KV_RULE_SOURCES`
    ``activation``): ``max(4 T h x 2, B V (2 + 3 x 4) + 2 h (T + 2 B))``, ``T = max_num_batched_tokens``,
    ``B = min(T, max_num_seqs)``, ``V = vocab_size``; the first is an estimate, the second the dummy sampler's
    tensors. The fused-MoE scratch is persistent (:func:`mla_lab.buffers.shared_workspace_other_bytes`)."""
    T, h = rank.max_num_batched_tokens, rank.model.hidden_size
    B = min(T, rank.max_num_seqs)
    sampler = B * rank.model.vocab_size * (BF16 + 3 * FP32) + BF16 * h * (T + 2 * B)
    return int(max(4 * T * h * BF16, sampler))


def sampler_buffer_bytes(rank: RankView) -> int:
    """The Triton top-k/top-p buffer vLLM's sampler caches in the profile run, bytes: ``rows x vocab_size`` fp32,
    ``rows = min(next_pow2(min(SMs, B)), SMs)`` (:data:`KV_RULE_SOURCES` ``sampler_buffer``)."""
    sms = rank.arch.sm_count
    rows = min(1 << (min(sms, rank.max_num_batched_tokens, rank.max_num_seqs) - 1).bit_length(), sms)
    return rows * rank.model.vocab_size * FP32


_PERSISTENT_NAMES = {"topk_buffer": "indexer top-k buffer", "q_workspace": "baseline Q-concat workspace",
                     "logits_reserve": "indexer logits reserve (profile run)",
                     "moe_workspace": "fused-MoE workspace (workspace manager)",
                     "sparse_workspace": "sparse prefill workspaces beyond the MoE scratch",
                     "sampler_buffer": "sampler top-k/top-p buffer"}
_PERSISTENT_STATUS = {"topk_buffer": "cited", "logits_reserve": "cited", "q_workspace": "exact",
                      "moe_workspace": "cited", "sparse_workspace": "estimate", "sampler_buffer": "cited"}
#: The profile run's dummy indexer logits tensor, bytes (KV_RULE_SOURCES logits_reserve).
INDEXER_LOGITS_RESERVE_BYTES = 512 * 2**20


def sparse_workspace_extra_bytes(rank: RankView, max_model_len: int | None, moe_scratch: int) -> int:
    """``max(0, max(indexer K gather, FlashMLA prefill workspace) - moe_scratch)`` bytes at ``max_model_len`` (0
    when None), as vLLM 0.33.0 reserves them (:data:`KV_RULE_SOURCES` ``sparse_workspace``)."""
    if max_model_len is None:
        return 0
    factor = 5 if max_model_len <= 256 * 1024 else 2
    idx = max_model_len * (576 * 2 // 132) * factor * (rank.model.index_head_dim + 4)
    fm = max_model_len * factor * rank.model.head_size * BF16
    return max(0, max(idx, fm) - moe_scratch)


def _persistent_status(key: str, rank: RankView) -> str:
    """A persistent term's status; the fused-MoE workspace is cited for the Triton path (TP on Hopper) only."""
    if key == "moe_workspace" and (rank.moe_parallel != "tp" or rank.arch.family != "hopper"):
        return "estimate"
    return _PERSISTENT_STATUS.get(key, "estimate")


def _term(name: str, value: float, status: str, key: str, unit: str = "bytes") -> dict:
    return {"term": name, "value": value, "unit": unit, "status": status, "source": KV_RULE_SOURCES[key]}


def kv_capacity_terms(deployment: Deployment, persistent: dict, activation: int, per_tok: int, *,
                      vllm_version: str = "0.33.0", max_model_len: int | None = None, mtp_layers: int = 0) -> dict:
    """vLLM's KV-cache capacity of one rank of a checked ``deployment``, term by term (:data:`KV_RULE_SOURCES`).
    ``persistent``: ``{term key: bytes}``; ``activation``, ``per_tok`` (all layers, no MTP): bytes; the CUDA-graph
    estimate counts from vLLM 0.21.0; ``max_model_len`` None: whole blocks x block size; ``mtp_layers`` 0 or 1 (its
    weights and one more KV layer per token). Returns ``{"tokens" (int, 0 when nothing is left), "available_bytes",
    "requested_bytes", "non_kv_bytes", "bytes_per_token", "num_blocks", "block_size", "vllm_version", "max_model_len",
    "terms": [{term, value, unit, status, source}]}``."""
    rank, total, gpu_memory_utilization = deployment.rank, deployment.arch.torch_total_bytes, \
        deployment.gpu_memory_utilization
    requested = math.ceil(total * gpu_memory_utilization)
    weights = weights_bytes_per_rank(rank)
    mtp = mtp_layers * mtp_weights_bytes(rank)
    layer = rank.model.kv_cache_bytes_per_token_layer(rank.kv_cache_dtype)
    bpt = per_tok + mtp_layers * layer
    cg = CUDAGRAPH_ESTIMATE_BYTES if tuple(int(x) for x in vllm_version.split(".")[:3]) >= (0, 21, 0) else 0
    terms = [_term("total memory (torch)", int(total), rank.arch.torch_total_status or "given", "total"),
             _term("gpu_memory_utilization", gpu_memory_utilization, "given", "requested", unit="fraction"),
             _term("requested = ceil(total x utilization)", requested, "cited", "requested"),
             _term("weights", weights, "estimate", "weights"),
             _term("MTP layer weights", mtp, "estimate", "mtp"),
             *[_term(_PERSISTENT_NAMES.get(k, k), v, _persistent_status(k, rank), k) for k, v in persistent.items()],
             _term("profile-run activation peak", activation,
                   "estimate" if activation == 4 * rank.max_num_batched_tokens * rank.model.hidden_size * BF16
                   else "cited", "activation"),
             _term("non-torch memory after the snapshot", NON_TORCH_AFTER_SNAPSHOT_BYTES, "assumed", "non_torch"),
             _term("NCCL buffers", 0, "cited", "nccl"),
             _term("CUDA-graph estimate", cg, "assumed" if cg else "cited", "cudagraph")]
    non_kv = weights + mtp + sum(persistent.values()) + activation + NON_TORCH_AFTER_SNAPSHOT_BYTES
    available = requested - non_kv - cg
    num_blocks = max(int(available // (KV_BLOCK_SIZE * bpt)), 0)
    if max_model_len is None:
        tokens = num_blocks * KV_BLOCK_SIZE
    else:
        tokens = int(num_blocks / math.ceil(max_model_len / KV_BLOCK_SIZE) * max_model_len)
    terms += [_term("available KV memory", available, "computed", "non_kv"),
              _term("KV bytes per token (all layers)", bpt, "cited", "bytes_per_token", unit="bytes/token"),
              _term("KV blocks", num_blocks, "computed", "blocks", unit="blocks"),
              _term("KV capacity", tokens, "computed", "blocks", unit="tokens")]
    return {"tokens": tokens, "available_bytes": available, "requested_bytes": requested, "non_kv_bytes": non_kv,
            "bytes_per_token": bpt, "num_blocks": num_blocks, "block_size": KV_BLOCK_SIZE,
            "vllm_version": vllm_version, "max_model_len": max_model_len, "terms": terms}


def _check_rule_args(vllm_version, max_model_len, mtp_layers) -> None:
    if not isinstance(vllm_version, str) or not re.fullmatch(r"\d+\.\d+\.\d+", vllm_version):
        raise ValueError(f"vllm_version={vllm_version!r} must be a release 'X.Y.Z'; allowed: e.g. "
                         f"{list(VLLM_MEMORY_VERSIONS)}")
    if max_model_len is not None:
        check_int("max_model_len", max_model_len)
    if isinstance(mtp_layers, bool) or mtp_layers not in (0, 1):
        raise ValueError(f"mtp_layers={mtp_layers!r} is not allowed; allowed: 0 or 1 (the MTP layer vLLM loads "
                         "for speculative decoding)")


def _accounts(d: Deployment, rank: RankView, strategies, shared: int) -> dict:
    """``{name: MemoryAccount}`` of the baseline and ``strategies`` at the deployment's prompt length (a strategy
    whose route is dense MHA there pads nothing: :func:`mla_lab.buffers.memory_account`)."""
    sts = expand(strategies if strategies is not None else fixed_strategies())
    sts = sts if any(st.name == BASELINE for st in sts) else [*expand(BASELINE), *sts]
    return {st.name: memory_account_of(rank, st, shared, d.prompt_len) for st in sts}


def _costs(accounts: dict, per_tok: int, capacity: float) -> dict:
    """Each strategy's persistent bytes over the baseline's, as KV tokens and % of the KV capacity."""
    base = accounts[BASELINE].persistent_bytes
    out = {}
    for s, a in accounts.items():
        extra = a.persistent_bytes - base
        lost = extra / per_tok
        out[s] = {"persistent_bytes": a.persistent_bytes, "extra_bytes": extra, "extra_mib": extra / MIB,
                  "kv_tokens_lost": lost, "kv_capacity_pct_lost": (lost / capacity * 100) if capacity > 0 else math.nan,
                  "step_transient_bytes": a.step_transient_bytes, "call_transient_bytes": a.call_transient_bytes}
    return out


def memory_tradeoff(deployment: Deployment, *, strategies=None, shared_workspace_bytes: int | None = None,
                    vllm_version: str = "0.33.0", max_model_len: int | None = None, mtp_layers: int = 0) -> dict:
    """The persistent Q-workspace bytes of each strategy as KV-cache tokens lost per rank and % of KV capacity
    (:func:`kv_capacity_terms`); only persistent bytes count (vLLM's profile run skips the sparse kernel).

    Args:
        deployment: a :class:`~mla_lab.deployment.Deployment` (checked at its door; nothing re-checked).
        strategies: :class:`~mla_lab.placement.Strategy` objects or door names (default every fixed strategy).
        shared_workspace_bytes: the shared workspace's size from its other users (default
            :func:`mla_lab.buffers.shared_workspace_other_bytes`, the fused-MoE scratch).
        vllm_version, max_model_len, mtp_layers: as :func:`kv_capacity_terms`.

    Returns:
        ``{"strategies": {s: {persistent_bytes, extra_bytes, extra_mib, kv_tokens_lost, kv_capacity_pct_lost,
        step_transient_bytes, call_transient_bytes}}, "accounts": {s: MemoryAccount}, "kv_capacity_tokens" (>= 0),
        "fits", "fit_reason", "kv_budget_bytes", "weights_bytes", "activation_bytes", "kv_bytes_per_token",
        "total_memory_bytes", "gpu_memory_utilization", "shared_workspace_bytes", "kv_capacity":
        kv_capacity_terms(...)}`` (bytes, tokens).

    Raises:
        ValueError: a bad ``shared_workspace_bytes`` / ``vllm_version`` / ``max_model_len`` / ``mtp_layers`` (one
            line).
    """
    d, total = deployment, deployment.arch.torch_total_bytes
    _check_rule_args(vllm_version, max_model_len, mtp_layers)
    rank = d.rank  # derived once from the checked deployment
    shared = shared_workspace_other_bytes(rank) if shared_workspace_bytes is None else \
        check_int("shared_workspace_bytes", shared_workspace_bytes, allow_zero=True)
    accounts = _accounts(d, rank, strategies, shared)
    per_tok = d.model.kv_cache_bytes_per_token(d.kv_cache_dtype)
    weights, act = weights_bytes_per_rank(rank), activation_peak_bytes(rank)
    persistent = {"topk_buffer": rank.max_num_batched_tokens * d.model.index_topk * 4,  # int32 (KV_RULE_SOURCES)
                  "q_workspace": accounts[BASELINE].persistent_bytes, "logits_reserve": INDEXER_LOGITS_RESERVE_BYTES,
                  "moe_workspace": shared, "sparse_workspace": sparse_workspace_extra_bytes(rank, max_model_len, shared),
                  "sampler_buffer": sampler_buffer_bytes(rank)}
    kv = kv_capacity_terms(d, persistent, act, per_tok, vllm_version=vllm_version, max_model_len=max_model_len,
                           mtp_layers=mtp_layers)
    capacity, fits = float(kv["tokens"]), kv["available_bytes"] > 0 and kv["tokens"] > 0
    return {"strategies": _costs(accounts, per_tok, capacity), "accounts": accounts,
            "kv_capacity_tokens": max(capacity, 0.0),  # never negative: "fits" and "fit_reason" say why it is 0
            "fit_reason": "" if fits else (
                f"weights ({weights / 2**30:.1f} GiB per rank), activations ({act / 2**30:.1f} GiB) and the baseline "
                f"workspace leave no KV cache in {d.gpu_memory_utilization} x {total / 2**30:.1f} GiB"),
            "kv_budget_bytes": kv["available_bytes"], "weights_bytes": weights, "activation_bytes": act,
            "kv_bytes_per_token": per_tok, "total_memory_bytes": total,
            "gpu_memory_utilization": d.gpu_memory_utilization, "shared_workspace_bytes": shared, "fits": fits,
            "kv_capacity": kv}
