"""Paths, helpers and facts shared by several engine-version modules (not a preset: the registry skips ``_`` names)."""

from __future__ import annotations

from ..record import Fact

FM = "vllm/v1/attention/backends/mla/flashmla_sparse.py"
FA = "vllm/v1/attention/backends/mla/flashattn_mla_sparse.py"
CUDA = "vllm/platforms/cuda.py"
REG = "vllm/model_executor/models/registry.py"
IMPL = "FlashMLASparseImpl.__init__"
BLD = "FlashMLASparseMetadataBuilder"
CG_UNIFORM = ("uniform decode batches as full CUDA graphs (AttentionCGSupport.UNIFORM_BATCH); mixed and prefill "
              "batches piecewise, attention eager")
FORCED = Fact("forced_backend", "FLASHMLA_SPARSE", "--attention-backend FLASHMLA_SPARSE, as PR #53878's server", ())


def backend_list(*names) -> str:
    """``[AttentionBackendEnum.A, ...]`` as vLLM's ``cuda.py`` writes a priority list."""
    return "[" + ", ".join(f"AttentionBackendEnum.{n}" for n in names) + "]"
