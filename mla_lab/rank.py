"""What one tensor-parallel rank of a deployment holds, derived once: :class:`RankView`.
Below the door everything takes it instead of loose ``(model, tp, ...)`` scalars. The constructor does not validate."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ._validate import check_int, divisors
from .arch import GPUArch
from .models import ModelConfig
from .placement import resolve_engine

__all__ = ["RankView", "pad_heads"]


def pad_heads(num_heads: int, prefill_padding: int, kv_cache_dtype: str) -> int:
    """vLLM's padding rule (``flashmla_sparse.py``, PR #53878): ``ceil(num_heads / prefill_padding) *
    prefill_padding`` heads for a bf16 KV cache, ``num_heads`` for fp8. Unchecked."""
    return num_heads if kv_cache_dtype == "fp8" else math.ceil(num_heads / prefill_padding) * prefill_padding


@dataclass(frozen=True)
class RankView:
    """One TP rank of a deployment: ``num_heads`` real, ``padded_num_heads`` (:func:`pad_heads`), ``ep_size`` (None
    under ``moe_parallel="tp"``), ``experts_per_rank``, ``kv_bytes_per_token`` (all layers), ``engine`` (a preset
    name or None)."""

    model: ModelConfig
    arch: GPUArch
    tp: int
    num_heads: int
    padded_num_heads: int
    prefill_padding: int
    kv_cache_dtype: str
    weight_dtype: str
    moe_parallel: str
    ep_size: int | None
    experts_per_rank: int
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_bytes_per_token: int
    engine: str | None = None

    @classmethod
    def derive(cls, model: ModelConfig, arch: GPUArch, tp: int, kv_cache_dtype: str, weight_dtype: str,
               moe_parallel: str, max_num_batched_tokens: int, max_num_seqs: int,
               engine: str | None = None) -> RankView:
        """The view of already-checked values (a Deployment's: :attr:`mla_lab.deployment.Deployment.rank`)."""
        H = model.num_attention_heads // tp
        pad = arch.prefill_padding
        ep = tp if moe_parallel == "ep" else None
        experts = model.n_routed_experts // tp if moe_parallel == "ep" else model.n_routed_experts
        return cls(model, arch, tp, H, pad_heads(H, pad, kv_cache_dtype), pad, kv_cache_dtype, weight_dtype,
                   moe_parallel, ep, experts, max_num_batched_tokens, max_num_seqs,
                   model.kv_cache_bytes_per_token(kv_cache_dtype), engine)

    @staticmethod
    def require(value, name: str = "rank") -> None:
        """Raises ValueError unless ``value`` (argument ``name``) is a RankView."""
        if not isinstance(value, RankView):
            raise ValueError(f"{name}= a {type(value).__name__} is not a RankView; allowed: Deployment.of(...).rank, "
                             "Deployment.seed().rank or Deployment.rank_of(...)")

    def with_ep_size(self, ep_size: int | None) -> RankView:
        """This rank at another expert-parallel size (None keeps it). Raises ValueError: not dividing
        n_routed_experts, or given under ``moe_parallel="tp"``."""
        if ep_size is None or ep_size == self.ep_size:
            return self
        if self.moe_parallel != "ep":
            raise ValueError(f"ep_size={ep_size!r} is given with moe_parallel='tp'; allowed: None (every expert is "
                             "sharded over the TP ranks)")
        ep = check_int("ep_size", ep_size)
        E = self.model.n_routed_experts
        if E % ep:
            raise ValueError(f"ep_size={ep} does not divide n_routed_experts={E}; allowed: {divisors(E)}")
        return replace(self, ep_size=ep, experts_per_rank=E // ep)

    def with_engine(self, engine: str | None) -> RankView:
        """This rank under an engine preset (or a first name) or None. Raises ValueError: unknown engine."""
        return replace(self, engine=None if engine is None else resolve_engine(engine))

    def describe(self) -> str:
        """One line: ``glm-5 TP8 h200: 8 heads (64 padded, prefill_padding 64), ...``."""
        ep = f"ep {self.ep_size}" if self.ep_size else "tp-sharded"
        return (f"{self.model.name} TP{self.tp} {self.arch.name}: {self.num_heads} heads ({self.padded_num_heads} "
                f"padded, prefill_padding {self.prefill_padding}), {self.experts_per_rank} experts per rank ({ep}), "
                f"{self.weight_dtype} weights, {self.kv_cache_dtype} KV ({self.kv_bytes_per_token:,} B/token), "
                f"max_num_batched_tokens {self.max_num_batched_tokens}, max_num_seqs {self.max_num_seqs}, engine "
                f"{self.engine or '-'}")
