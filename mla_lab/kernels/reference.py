"""Plain-torch reference kernels (run on CPU and GPU): the semantics every fast kernel is checked against.

:func:`concat_mla_q_torch` (vLLM's ``concat_mla_q``), :func:`sparse_mla_prefill_ref` (FlashMLA ``tests/ref.py``
``ref_sparse_attn_fwd``, fp32, token chunks), :func:`mha_causal_varlen_ref` (dense causal varlen attention, the
``mha-dense`` route; fp32). No argument checks beyond running: :mod:`mla_lab.kernels.contract` checks the contract.
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
    """Query tokens per chunk so that the fp32 temporaries of one chunk stay under ``budget_bytes`` (256 MiB).

    Per token the reference holds the gathered kv rows (``topk * d_qk * 4`` bytes) and the logits/probabilities
    (``h_q * topk * 4`` bytes, twice: P and exp(P - lse)); the larger of the two sets the chunk.
    """
    per_token = max(topk * d_qk * 4, 2 * h_q * topk * 4, 1)
    return max(1, budget_bytes // per_token)


def sparse_mla_prefill_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    topk_length: torch.Tensor | None = None,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill attention, FlashMLA ``tests/ref.py`` (``ref_sparse_attn_fwd``) math, in fp32.

    For query token ``i`` and head ``h``, over the ``topk`` entries ``j`` of ``indices[i]``:

    - entry ``j`` is *invalid* if ``indices[i, j] < 0`` or ``>= s_kv``, or (with ``topk_length``)
      ``j >= topk_length[i]``;
    - ``P[i, h, j] = (q[i, h] . kv[indices[i, j]]) * sm_scale`` (fp32), ``-inf`` at invalid entries;
    - ``max_logits[i, h] = max_j P`` (``-inf`` when no entry is valid);
    - ``lse[i, h] = logsumexp_j P`` (natural log; ``+inf`` when no entry is valid, as FlashMLA returns);
    - ``out[i, h] = softmax_j(P) @ kv[indices[i, j], :d_v]``, cast to bf16; ``0`` when no entry is valid.

    One deliberate difference from ``tests/ref.py``: kv rows of invalid entries are never read (their gathered
    rows are zeroed), so a NaN in some kv row that only invalid entries point at cannot leak into ``out``
    (``tests/ref.py`` gathers row 0 for them and multiplies it by a zero weight, which gives NaN for NaN rows).

    NaN/inf inputs: the math propagates them. A NaN in ``q[i, h]`` or in a kv row that a *valid* entry of token
    ``i`` references makes ``P`` NaN, hence ``lse``/``max_logits`` (``max`` propagates NaN) and ``out[i, h]``
    NaN; an ``inf`` logit gives ``lse = inf`` and ``exp(inf - inf) = NaN`` in ``out``.

    Args:
        q: ``[s_q, h_q, d_qk]``, bf16 (fp16/fp32 also computed, in fp32), last dim contiguous or not.
        kv: ``[s_kv, 1, d_qk]`` or ``[s_kv, d_qk]``, same dtype as ``q``.
        indices: ``[s_q, 1, topk]`` or ``[s_q, topk]``, int32 (int64 also works).
        sm_scale: softmax scale applied to ``q . k`` (vLLM passes ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``
            of the un-absorbed model).
        d_v: value width, the first ``d_v`` columns of ``kv`` (512 for absorbed MLA).
        topk_length: optional ``[s_q]`` int; token ``i`` uses only ``indices[i, :topk_length[i]]``.
        chunk_tokens: query tokens per chunk; default :func:`default_chunk_tokens` (fp32 temporaries under
            ~256 MiB). Results do not depend on it (each token is computed independently).

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
        if topk > 0:
            max_logits[start:stop] = P.amax(dim=-1)
        else:
            max_logits[start:stop] = float("-inf")
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
    """Dense causal MHA over packed variable-length sequences, in fp32 (FlashAttention varlen semantics).

    Sequence ``b`` has queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]`` (``n_b`` of them) and keys/values
    ``k, v[cu_seqlens_k[b]:cu_seqlens_k[b+1]]`` (``s_b >= n_b``: a context of ``s_b - n_b`` earlier tokens plus the
    queries' own). Query ``i`` of the sequence sits at position ``s_b - n_b + i`` and attends keys ``0..s_b - n_b +
    i`` (causal, aligned bottom-right as ``flash_attn_varlen_func(causal=True)``):
    ``P = q . k^T * sm_scale``; ``lse = logsumexp(P)`` (natural log); ``out = softmax(P) @ v``.

    Args:
        q: ``[T, H, d_qk]``; k: ``[Tk, H, d_qk]``; v: ``[Tk, H, d_v]`` (any float dtype; computed in fp32).
        cu_seqlens_q, cu_seqlens_k: ``[B + 1]`` int offsets (lists or tensors), starting at 0, non-decreasing.
        sm_scale: softmax scale (``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` in vLLM's MLA).

    Returns:
        ``(out [T, H, d_v] fp32, lse [T, H] fp32)``; a sequence with no query contributes nothing.

    No validation here (shapes must agree; ``n_b <= s_b``).
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
