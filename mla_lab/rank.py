"""What one tensor-parallel rank of a deployment holds, derived once: :class:`RankView`.

:attr:`Deployment.rank <mla_lab.deployment.Deployment.rank>` derives this frozen view from a checked deployment;
everything below the door (the cost model, the memory account, the serving simulation) takes it instead of loose
``(model, tp, ...)`` scalars and re-checks nothing. The constructor does not validate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ._validate import check_int
from .arch import GPUArch
from .models import ModelConfig
from .placement import resolve_engine

__all__ = ["RankView", "pad_heads"]


def pad_heads(num_heads: int, prefill_padding: int, kv_cache_dtype: str) -> int:
    """vLLM's padding rule for the sparse-prefill Q workspace (``vllm/v1/attention/backends/mla/flashmla_sparse.py``,
    PR #53878): ``ceil(num_heads / prefill_padding) * prefill_padding`` heads for a bf16 KV cache, ``num_heads``
    for fp8 (``fp8_ds_mla`` takes the real heads). Unchecked: ``num_heads`` a positive int, ``prefill_padding``
    64 or 128 and ``kv_cache_dtype`` normalised (``bf16`` / ``fp8``) are the caller's (a door's) to check."""
    if kv_cache_dtype == "fp8":
        return num_heads
    return math.ceil(num_heads / prefill_padding) * prefill_padding


@dataclass(frozen=True)
class RankView:
    """One TP rank of a deployment.

    Attributes:
        model, arch: :class:`~mla_lab.models.ModelConfig`, :class:`~mla_lab.arch.GPUArch`; tp: the TP size.
        num_heads: ``num_attention_heads // tp``; padded_num_heads: the Q-concat workspace's heads
            (:func:`pad_heads`); prefill_padding: the GPU record's (64 sm90, 128 sm100).
        ep_size: ``tp`` under ``moe_parallel="ep"``, None under ``tp``; experts_per_rank: routed experts whose
            weights the rank holds (``n_routed_experts / ep_size`` under ``ep``; each expert's 1/tp slice under ``tp``).
        kv_cache_dtype, weight_dtype: ``bf16`` / ``fp8``; moe_parallel: ``ep`` / ``tp``.
        max_num_batched_tokens, max_num_seqs: the engine limits.
        kv_bytes_per_token: KV-cache bytes per token on this rank, all layers (latent cache, replicated on every TP
            rank, + indexer keys: :meth:`~mla_lab.models.ModelConfig.kv_cache_bytes_per_token`).
        engine: an engine preset (``vllm@0.33.0``) or None (the lab's strategies); set by :meth:`with_engine`.
    """

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
        """``value`` must be a RankView (an entry point's argument ``name``).

        Raises:
            ValueError: one line naming ``name``, the type given and the allowed doors.
        """
        if not isinstance(value, RankView):
            raise ValueError(f"{name}= a {type(value).__name__} is not a RankView; allowed: Deployment.of(...).rank, "
                             "Deployment.seed().rank or Deployment.rank_of(...)")

    def with_ep_size(self, ep_size: int | None) -> RankView:
        """This rank with another expert-parallel group size (a layer option of the cost model: ``ep_size``
        ranks hold whole experts; None keeps this view's). A door: checked here.

        Raises:
            ValueError: ``ep_size`` not a positive int, not dividing n_routed_experts, or given under
                ``moe_parallel="tp"`` (allowed: None there).
        """
        if ep_size is None or ep_size == self.ep_size:
            return self
        if self.moe_parallel != "ep":
            raise ValueError(f"ep_size={ep_size!r} is given with moe_parallel='tp'; allowed: None (every expert is "
                             "sharded over the TP ranks)")
        ep = check_int("ep_size", ep_size)
        E = self.model.n_routed_experts
        if E % ep:
            raise ValueError(f"ep_size={ep} does not divide n_routed_experts={E}; allowed: "
                             f"{[d for d in range(1, E + 1) if E % d == 0]}")
        return replace(self, ep_size=ep, experts_per_rank=E // ep)

    def with_engine(self, engine: str | None) -> RankView:
        """This rank under an engine preset (``vllm@0.33.0``; first names such as ``vllm-53878`` map to theirs) or
        None. A door: :func:`mla_lab.placement.resolve_engine`.

        Raises:
            ValueError: an unknown engine (one line, the allowed values).
        """
        return replace(self, engine=None if engine is None else resolve_engine(engine))

    def describe(self) -> str:
        """One line: ``glm-5 TP8 h200: 8 heads (64 padded, prefill_padding 64), 32 experts per rank (ep 8), fp8
        weights, bf16 KV (... B/token), max_num_batched_tokens 16384, max_num_seqs 256, engine -``."""
        ep = f"ep {self.ep_size}" if self.ep_size else "tp-sharded"
        return (f"{self.model.name} TP{self.tp} {self.arch.name}: {self.num_heads} heads ({self.padded_num_heads} "
                f"padded, prefill_padding {self.prefill_padding}), {self.experts_per_rank} experts per rank ({ep}), "
                f"{self.weight_dtype} weights, {self.kv_cache_dtype} KV ({self.kv_bytes_per_token:,} B/token), "
                f"max_num_batched_tokens {self.max_num_batched_tokens}, max_num_seqs {self.max_num_seqs}, engine "
                f"{self.engine or '-'}")
