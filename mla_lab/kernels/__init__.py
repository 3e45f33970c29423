"""Kernels of the sparse-MLA prefill Q path: Q concat into a head-padded workspace, and sparse prefill attention.

The public API: :mod:`.contract` (the two ops), :mod:`.flashmla` (FlashMLA's contract), :mod:`.reference` (torch
semantics), :mod:`.triton_concat` / :mod:`.triton_concat_persistent` (concat variants), :mod:`.union` /
:mod:`.union_cuda` (per-group unions for :mod:`.packed`), :mod:`.index_sets` (index data with known overlap).
"""

from __future__ import annotations

from .contract import (
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
