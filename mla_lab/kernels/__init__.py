"""Kernels of the sparse-MLA prefill Q path: Q concat into a head-padded workspace, and sparse prefill attention.

This is the public API; each concept lives in its module:

- :mod:`.ops`: :func:`concat_mla_q` (vLLM's Q concat into a head-padded workspace), :func:`make_concat_launcher`
  (its hot path), :func:`sparse_mla_prefill` (FlashMLA's sparse prefill, sliced to the real heads),
  :func:`last_backend`.
- :mod:`.flashmla`: :func:`flash_mla_info`, :func:`validate_sparse_prefill_inputs` (FlashMLA's contract).
- :mod:`.reference`: the torch semantics every fast kernel is checked against.
- :mod:`.triton_concat`, :mod:`.triton_concat_persistent`: the Triton concat variants.
- :mod:`.union`, :mod:`.union_cuda`: the per-group union of top-k sets (:class:`UnionSets`) for the packed kernel
  (:mod:`.packed`); :mod:`.index_sets`: index data with known overlap.
"""

from __future__ import annotations

from .flashmla import flash_mla_info, validate_sparse_prefill_inputs
from .index_sets import (
    IndexData,
    UnionSizeSummary,
    causal_indices,
    overlap_indices,
    overlap_union_expected,
    published_overlaps,
    structured_indices,
    union_ratio_common_core,
    union_sizes,
)
from .ops import (
    CONCAT_BACKENDS,
    CONCAT_DEFAULT_VARIANT,
    CONCAT_DTYPES,
    CONCAT_VARIANTS,
    PREFILL_BACKENDS,
    concat_mla_q,
    last_backend,
    make_concat_launcher,
    sparse_mla_prefill,
)
from .reference import D_NOPE, D_PE, D_QK, concat_mla_q_torch, sparse_mla_prefill_ref
from .triton_concat import ConcatLauncher, triton_available
from .union import (
    UNION_GROUP_SIZES,
    UnionSets,
    build_union,
    build_union_ref,
    union_buffer_bytes,
    union_caps,
    union_scratch,
)

__all__ = [
    "concat_mla_q", "make_concat_launcher", "ConcatLauncher", "CONCAT_VARIANTS", "CONCAT_DEFAULT_VARIANT",
    "sparse_mla_prefill", "last_backend", "flash_mla_info", "validate_sparse_prefill_inputs",
    "concat_mla_q_torch", "sparse_mla_prefill_ref", "triton_available", "CONCAT_BACKENDS", "PREFILL_BACKENDS",
    "CONCAT_DTYPES", "D_NOPE", "D_PE", "D_QK",
    "UnionSets", "build_union", "build_union_ref", "union_buffer_bytes", "union_caps", "union_scratch",
    "UNION_GROUP_SIZES", "IndexData", "UnionSizeSummary", "overlap_indices", "overlap_union_expected",
    "causal_indices", "structured_indices", "union_sizes", "union_ratio_common_core", "published_overlaps",
]
