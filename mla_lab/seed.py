"""vLLM PR #53878's benchmark — the lab's seed setup — as :meth:`mla_lab.deployment.Deployment.seed` builds it.
Source: vLLM PR #53878 "[Perf][GLM5.2] Fuse sparse MLA Q concatenation with head padding" (merged 2026-08-26; the
command: :mod:`mla_lab.deployment`). Written once, in :data:`mla_lab.deployment.SEED_ARGS`."""

from __future__ import annotations

from .deployment import Deployment

__all__ = ["SEED", "SEED_REPORTED", "seed_point", "SEED_DEPLOYMENT"]

#: The PR's deployment (validated).
SEED_DEPLOYMENT = Deployment.seed()
#: The PR's deployment and workload, in the sweep's parameter names (derived from :data:`SEED_DEPLOYMENT`).
SEED = {k: SEED_DEPLOYMENT.args()[k] for k in (
    "model", "tp", "arch", "max_num_batched_tokens", "prompt_len", "output_len", "num_prompts", "concurrency",
    "kv_cache_dtype", "weight_dtype", "moe_parallel", "gpu_memory_utilization")}

#: What the PR reported (per GPU). ``analytic_extra_bytes`` = 16384 x (64 - 8) x 576 x 2 B, the padded heads of
#: the workspace (vLLM flashmla_sparse.py workspace shape ``(max_num_batched_tokens, q_concat_heads, 576)``).
SEED_REPORTED = {"ttft_change_pct": -9.5, "throughput_change_pct": 6.0, "peak_mib_before": 131753,
                 "peak_mib_after": 132785, "extra_peak_mib": 1032, "analytic_extra_bytes": 1_056_964_608}


def seed_point(**overrides) -> dict:
    """The seed setup as a sweep point (``strategies`` added by the caller), with ``overrides`` applied."""
    return SEED_DEPLOYMENT.to_point(**overrides)
