"""Kernels of the sparse-MLA prefill Q path: Q concat into a head-padded workspace, and sparse prefill attention.

:mod:`.contract` (the two ops), :mod:`.flashmla` (FlashMLA's contract), :mod:`.reference` (torch semantics),
:mod:`.triton_concat` (the concat's Triton kernel), :mod:`.packed` with :mod:`.union` / :mod:`.union_cuda` (per-group
unions), :mod:`.index_sets` (index data with known overlap), :mod:`.device`, :mod:`.engine_libs` (the engines' kernels
from their wheels).
"""

from __future__ import annotations

from .contract import concat_mla_q, last_backend, make_concat_launcher, sparse_mla_prefill
from .flashmla import flash_mla_info, validate_sparse_prefill_inputs
from .index_sets import IndexData, causal_indices, overlap_indices, published_overlaps, structured_indices, union_sizes
from .reference import concat_mla_q_torch, sparse_mla_prefill_ref
from .union import UnionSets, build_union, build_union_ref, union_buffer_bytes

__all__ = ["concat_mla_q", "make_concat_launcher", "sparse_mla_prefill", "last_backend", "flash_mla_info",
           "validate_sparse_prefill_inputs", "concat_mla_q_torch", "sparse_mla_prefill_ref", "UnionSets",
           "build_union", "build_union_ref", "union_buffer_bytes", "IndexData", "causal_indices", "overlap_indices",
           "structured_indices", "union_sizes", "published_overlaps"]
