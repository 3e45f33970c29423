"""vLLM PR #53878's benchmark — the lab's seed setup — written once.

Source: vLLM PR #53878 "[Perf][GLM5.2] Fuse sparse MLA Q concatenation with head padding" (merged 2026-08-26):
``vllm serve zai-org/GLM-5.2-FP8 --tensor-parallel-size 8 -ep --max-num-batched-tokens 16384
--attention-backend FLASHMLA_SPARSE --no-enable-prefix-caching --max-model-len 131072`` (bf16 KV cache) on Hopper,
driven by ``vllm bench serve`` with the random dataset, 1024 input / 128 output tokens, 32 prompts, max
concurrency 32. Reported: TTFT -9.5 %, total token throughput +6 %, peak memory 131753 -> 132785 MiB per GPU.
"""

from __future__ import annotations

__all__ = ["SEED", "SEED_REPORTED", "seed_point"]

#: The PR's deployment and workload, in the sweep's parameter names.
SEED = {
    "model": "glm-5", "tp": 8, "arch": "h200", "max_num_batched_tokens": 16384, "prompt_len": 1024,
    "output_len": 128, "num_prompts": 32, "concurrency": 32, "kv_cache_dtype": "bf16", "weight_dtype": "fp8",
    "moe_parallel": "ep",
}

#: What the PR reported (per GPU). ``analytic_extra_bytes`` = 16384 x (64 - 8) x 576 x 2 B, the padded heads of
#: the workspace (vLLM flashmla_sparse.py workspace shape ``(max_num_batched_tokens, q_concat_heads, 576)``).
SEED_REPORTED = {
    "ttft_change_pct": -9.5, "throughput_change_pct": 6.0, "peak_mib_before": 131753, "peak_mib_after": 132785,
    "extra_peak_mib": 1032, "analytic_extra_bytes": 1_056_964_608,
}


def seed_point(**overrides) -> dict:
    """The seed setup as a sweep point (``strategies`` added by the caller), with ``overrides`` applied."""
    p = {k: v for k, v in SEED.items() if k != "output_len"}
    p.update(overrides)
    return p
