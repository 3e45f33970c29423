"""Plain-torch reference kernels (CPU and GPU), the semantics every fast kernel is checked against; unchecked
(:mod:`.contract` checks): :func:`concat_mla_q_torch`, :func:`sparse_mla_prefill_ref`, :func:`mha_causal_varlen_ref`.
"""

from __future__ import annotations

import torch

__all__ = ["concat_mla_q_torch", "sparse_mla_prefill_ref", "mha_causal_varlen_ref", "default_chunk_tokens", "D_NOPE", "D_PE", "D_QK"]

#: Widths of absorbed MLA Q: ``kv_lora_rank`` (512) + ``qk_rope_head_dim`` (64) = head_size 576
#: (vLLM ``flashmla_sparse.py``; GLM-5 and DeepSeek-V3.2 config.json).
D_NOPE = 512
D_PE = 64
D_QK = D_NOPE + D_PE

#: Target for the largest per-chunk fp32 temporary of the reference (gathered kv, or the logits P).
_CHUNK_BYTES = 256 * 1024**2


def concat_mla_q_torch(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:, :H, :512] = ql_nope``; ``out[:, :H, 512:] = q_pe``; heads ``H..H'-1`` untouched; returns ``out``.
    Tensors as :func:`mla_lab.kernels.concat_mla_q`, which validates them (not here); ``T == 0`` is a no-op."""
    H = ql_nope.shape[1]
    d_nope = ql_nope.shape[-1]
    if out.shape[0] == 0:
        return out
    out[:, :H, :d_nope].copy_(ql_nope)
    out[:, :H, d_nope:].copy_(q_pe)
    return out


def default_chunk_tokens(h_q: int, topk: int, d_qk: int, budget_bytes: int = _CHUNK_BYTES) -> int:
    """Query tokens per chunk keeping one chunk's fp32 temporaries under ``budget_bytes``: per token the larger of the
    gathered kv rows (``topk * d_qk * 4`` B) and the logits P and exp(P - lse) (``2 * h_q * topk * 4`` B)."""
    per_token = max(topk * d_qk * 4, 2 * h_q * topk * 4, 1)
    return max(1, budget_bytes // per_token)


def sparse_mla_prefill_ref(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                           topk_length: torch.Tensor | None = None,
                           chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill attention, FlashMLA ``tests/ref.py`` (``ref_sparse_attn_fwd``) math, in fp32.

    Per token ``i`` and head ``h``: entry ``j`` is invalid if ``indices[i, j] < 0``, ``>= s_kv`` or ``j >=
    topk_length[i]``; ``P = q[i, h] . kv[indices[i, j]] * sm_scale`` (``-inf`` where invalid); ``max_logits = max_j
    P``; ``lse = logsumexp_j P`` (natural log, ``+inf`` with no valid entry, as FlashMLA); ``out = softmax_j(P) @
    kv[indices[i, j], :d_v]`` in bf16 (0 with no valid entry). Unlike ``tests/ref.py`` the kv rows of invalid entries
    are never read, so a NaN row only they point at cannot leak into ``out``; NaN/inf in what valid entries read
    propagates.

    Args:
        q: ``[s_q, h_q, d_qk]`` bf16 (fp16/fp32 too, computed in fp32).
        kv: ``[s_kv, 1, d_qk]`` or ``[s_kv, d_qk]``, ``q``'s dtype.
        indices: ``[s_q, 1, topk]`` or ``[s_q, topk]`` int32 (int64 works).
        sm_scale: softmax scale (vLLM: ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` of the un-absorbed model).
        d_v: value width, the first ``d_v`` columns of ``kv`` (512 for absorbed MLA).
        topk_length: optional ``[s_q]`` int.
        chunk_tokens: query tokens per chunk (default :func:`default_chunk_tokens`); results do not depend on it.

    Returns:
        ``(out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)`` on ``q``'s device.
    """
    s_q, h_q, d_qk = q.shape
    kv2 = kv.reshape(kv.shape[0], kv.shape[-1]) if kv.dim() == 3 else kv
    s_kv = kv2.shape[0]
    idx2 = indices.reshape(indices.shape[0], indices.shape[-1]) if indices.dim() == 3 else indices
    topk = idx2.shape[-1]
    dev = q.device

    out = torch.empty((s_q, h_q, d_v), dtype=torch.bfloat16, device=dev)
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=dev)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=dev)
    if s_q == 0:
        return out, max_logits, lse
    if chunk_tokens is None:
        chunk_tokens = default_chunk_tokens(h_q, topk, d_qk)
    chunk_tokens = max(1, int(chunk_tokens))

    cols = torch.arange(topk, device=dev)
    for start in range(0, s_q, chunk_tokens):
        stop = min(s_q, start + chunk_tokens)
        n = stop - start
        idx = idx2[start:stop].to(torch.int64)  # [n, topk]
        invalid = (idx < 0) | (idx >= s_kv)
        if topk_length is not None:
            invalid |= cols.unsqueeze(0) >= topk_length[start:stop].to(torch.int64).unsqueeze(1)
        safe = idx.masked_fill(invalid, 0)
        gathered = kv2.index_select(0, safe.reshape(-1)).reshape(n, topk, d_qk).float()  # [n, topk, d_qk]
        gathered.masked_fill_(invalid.unsqueeze(-1), 0.0)
        qc = q[start:stop].float()  # [n, h_q, d_qk]
        P = torch.bmm(qc, gathered.transpose(1, 2))  # [n, h_q, topk]
        P.mul_(sm_scale)
        P.masked_fill_(invalid.unsqueeze(1), float("-inf"))

        row_lse = torch.logsumexp(P, dim=-1)  # [n, h_q]; -inf on rows with no valid entry
        max_logits[start:stop] = P.amax(dim=-1) if topk > 0 else float("-inf")
        # Empty rows: subtract +inf so every weight is exp(-inf) = 0 and the row's output is 0.
        empty = row_lse == float("-inf")
        lse_for_o = row_lse.masked_fill(empty, float("inf"))
        P.sub_(lse_for_o.unsqueeze(-1)).exp_()
        o = torch.bmm(P, gathered[..., :d_v])  # [n, h_q, d_v]
        out[start:stop] = o.to(torch.bfloat16)
        lse[start:stop] = lse_for_o
    return out, max_logits, lse


def mha_causal_varlen_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k,
                          sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense causal MHA over packed variable-length sequences in fp32 (the ``mha-dense`` route;
    ``flash_attn_varlen_func(causal=True)`` semantics, aligned bottom-right): query ``i`` of sequence ``b`` (``n_b``
    queries, ``s_b >= n_b`` keys) attends keys ``0 .. s_b - n_b + i``; ``lse`` natural log.

    Args:
        q: ``[T, H, d_qk]``; k: ``[Tk, H, d_qk]``; v: ``[Tk, H, d_v]``, any float dtype.
        cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int offsets from 0, non-decreasing (lists or tensors).
        sm_scale: softmax scale.

    Returns:
        ``(out [T, H, d_v] fp32, lse [T, H] fp32)``.
    """
    cq = [int(x) for x in cu_seqlens_q]
    ck = [int(x) for x in cu_seqlens_k]
    T, H, _ = q.shape
    out = torch.zeros((T, H, v.shape[-1]), dtype=torch.float32, device=q.device)
    lse = torch.zeros((T, H), dtype=torch.float32, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        n, s = q1 - q0, k1 - k0
        if n == 0:
            continue
        qb = q[q0:q1].float().transpose(0, 1)  # [H, n, d_qk]
        kb = k[k0:k1].float().transpose(0, 1)  # [H, s, d_qk]
        vb = v[k0:k1].float().transpose(0, 1)  # [H, s, d_v]
        P = torch.matmul(qb, kb.transpose(1, 2)) * sm_scale  # [H, n, s]
        pos = torch.arange(n, device=q.device).unsqueeze(1) + (s - n)
        P.masked_fill_(torch.arange(s, device=q.device).unsqueeze(0) > pos, float("-inf"))
        row_lse = torch.logsumexp(P, dim=-1)  # [H, n]
        o = torch.matmul(torch.exp(P - row_lse.unsqueeze(-1)), vb)  # [H, n, d_v]
        out[q0:q1] = o.transpose(0, 1)
        lse[q0:q1] = row_lse.transpose(0, 1)
    return out, lse
