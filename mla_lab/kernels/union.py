"""Union builders for the packed sparse-MLA prefill kernel (docs/packed.md "Union builder and index data"): per group
of ``g`` consecutive query tokens, the union of their top-k key sets as ``shared`` keys (every present token selects
them: FlashMLA runs them unmasked) and ``rest`` keys with a ``g``-bit membership mask (the masked Triton kernel).

Definitions (:func:`build_union_ref` and :func:`build_union` give the same sets):

- entry ``indices[t, i]`` is valid iff ``0 <= indices[t, i] < s_kv`` and ``i < topk_length[t]`` (FlashMLA's rule);
  duplicates in one token's list count once.
- group ``q`` holds tokens ``q*g .. q*g+g-1``; tokens ``>= T`` are absent; ``G = ceil(T / g)``.
- a key is *shared* iff every present token of the group selects it and no present token has zero valid keys
  (else ``shared`` is empty); every other union key is in ``rest``, bit ``j`` of its mask set iff token ``q*g+j``
  selects it. Order inside a list: sorted (ref), first selection (Triton); consumers must not rely on either.
- ``-1`` (mask 0) padding from each length to the next multiple of 64 (the consumers' key block); past that,
  unspecified. Consumers use the lengths.

**The Triton kernel** (:func:`build_union`): a persistent grid of ``P`` programs (2 x the SM count), each owning a
zeroed slice of ``scratch [P, W]`` int32, one field per key: ``g`` membership bits plus a claim bit (bit ``g``), in
8-bit fields for g <= 4, 16-bit for g = 8, 32-bit for g = 16. Per group: (1) ``atomic_or`` bit ``j`` for every valid
entry of token ``j``; (2) re-read each field (``.cg``, L1-bypassing); an entry whose token is the lowest membership
bit claims the key (``atomic_or`` of the claim bit; kept iff it was clear, which drops duplicates), is classified
shared / rest and compacted by ``tl.cumsum``; lengths and padding written; (3) the words of every union key stored
back to 0. The scratch is left zeroed, so one cached allocation serves every call (:func:`union_scratch`; bytes:
:func:`union_buffer_bytes`). L2 round trips set its time: 0.98 ms at T 16384 x topk 2048 on the H200
(docs/perf-notes.md "Packed kernel"). :mod:`.union_cuda` is the shared-memory CUDA builder (same contract).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..union_layout import (
    REST_CAP_MULTIPLE,
    SHARED_CAP_MULTIPLE,
    UNION_GROUP_SIZES,
    union_buffer_bytes,
    union_caps,
)
from ..union_layout import check_union_group as _check_g
from ..union_layout import union_field_bits as _field_bits
from ..union_layout import union_scratch_words as _scratch_words
from .contract import first_failure, shape_of
from .triton_concat import triton_available, triton_interpreting

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["UnionSets", "build_union_ref", "build_union", "union_buffer_bytes", "union_scratch", "union_caps",
           "UNION_GROUP_SIZES", "SHARED_CAP_MULTIPLE", "REST_CAP_MULTIPLE", "PAD_MULTIPLE"]

# the layout lives in mla_lab.union_layout (the memory account prices it without torch), re-exported here
#: ``-1`` padding is written up to the next multiple of this past each length.
PAD_MULTIPLE = 64
#: Programs per SM of the persistent grid (the brief's suggestion; to be swept on the GPU).
DEFAULT_PROGRAMS_PER_SM = 2
#: Programs under the Triton interpreter (it runs them one after another; 3 exercises the persistent loop).
INTERPRETER_PROGRAMS = 3


@dataclass(frozen=True)
class UnionSets:
    """Per-group union lists (module docstring), ``G = ceil(T / g)``, on the indices' device: ``shared_idx [G,
    cap_s]`` int32 (``cap_s`` a multiple of 128, >= topk), ``rest_idx [G, cap_r]`` int32 (``cap_r`` a multiple of 64,
    >= g x topk), ``rest_mask [G, cap_r]`` (bit ``j``: token ``q*g+j``; uint8 for g <= 8, int32 for g = 16),
    ``shared_len`` / ``rest_len`` / ``union_len [G]`` int32 (``union = shared + rest``), ``g``, ``T``."""

    shared_idx: torch.Tensor
    shared_len: torch.Tensor
    rest_idx: torch.Tensor
    rest_mask: torch.Tensor
    rest_len: torch.Tensor
    union_len: torch.Tensor
    g: int
    T: int

    num_groups = property(lambda self: self.shared_len.shape[0])


def _mask_dtype(g: int) -> torch.dtype:
    return torch.uint8 if g <= 8 else torch.int32


def _validate(indices, topk_length, g, s_kv) -> None:
    """One ``ValueError`` line for the first broken rule: the argument, its value, what is allowed."""
    first_failure(_rules(indices, topk_length, g, s_kv))


def _rules(indices, topk_length, g, s_kv):
    yield not isinstance(indices, torch.Tensor), (f"indices must be a torch.Tensor [T, topk] int32; got "
                                                  f"{type(indices).__name__}")
    yield indices.dim() != 2, f"indices must be 2-D [T, topk]; got indices.shape={tuple(indices.shape)}"
    yield indices.dtype != torch.int32, f"indices.dtype must be torch.int32; got {indices.dtype}"
    _check_g(g)
    yield (isinstance(s_kv, bool) or not isinstance(s_kv, int) or s_kv < 1,
           f"s_kv must be an int >= 1 (keys in the kv cache); got s_kv={s_kv!r}")
    if topk_length is not None:
        tl_, T = topk_length, indices.shape[0]
        yield (not isinstance(tl_, torch.Tensor) or tl_.dim() != 1 or tl_.shape[0] != T,
               f"topk_length must be None or a 1-D tensor [T={T}]; got topk_length.shape={shape_of(tl_)}")
        yield tl_.dtype != torch.int32, f"topk_length.dtype must be torch.int32; got {tl_.dtype}"
        yield (tl_.device != indices.device,
               f"topk_length must be on indices' device {indices.device}; got {tl_.device}")


def _empty_sets(G, cap_s, cap_r, g, T, device) -> UnionSets:
    i32 = dict(dtype=torch.int32, device=device)
    zeros = torch.zeros(G, **i32)
    return UnionSets(torch.full((G, cap_s), -1, **i32), zeros, torch.full((G, cap_r), -1, **i32),
                     torch.zeros(G, cap_r, dtype=_mask_dtype(g), device=device), zeros.clone(), zeros.clone(), g, T)


def _scatter_list(dst, dst_mask, grp, key, mask, G):
    """Write ``key`` (sorted by group, then key) into ``dst[grp, rank within grp]``; returns the lengths ``[G]``."""
    counts = torch.bincount(grp, minlength=G)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(grp.numel(), device=grp.device) - starts[grp]
    dst[grp, pos] = key.to(torch.int32)
    if dst_mask is not None:
        dst_mask[grp, pos] = mask.to(dst_mask.dtype)
    return counts.to(torch.int32)


def build_union_ref(indices: torch.Tensor, topk_length: torch.Tensor | None, g: int, s_kv: int) -> UnionSets:
    """The union lists by torch sort-and-scatter of codes ``(group * s_kv + key) * g + j`` (any device; each list
    sorted by key; ``-1`` padded to the width).

    Args:
        indices: ``[T, topk]`` int32 key rows into the kv cache; topk_length: ``[T]`` int32 or None; g: one of
            :data:`UNION_GROUP_SIZES`; s_kv: keys in the kv cache (int >= 1).

    Raises:
        ValueError: indices not a 2-D int32 tensor; g not allowed; s_kv not an int >= 1; topk_length not None or a
            ``[T]`` int32 tensor on indices' device.
    """
    _validate(indices, topk_length, g, s_kv)
    T, topk = indices.shape
    G = -(-T // g)
    dev = indices.device
    cap_s, cap_r = union_caps(topk, g)
    out = _empty_sets(G, cap_s, cap_r, g, T, dev)
    if G == 0:
        return out
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        valid &= torch.arange(topk, device=dev)[None, :] < topk_length[:, None].long()
    t = torch.arange(T, device=dev)
    per_tok = valid.sum(1)
    n_present = torch.bincount(t // g, minlength=G)
    has_empty = torch.bincount(t // g, weights=(per_tok == 0).to(torch.float64), minlength=G) > 0
    tt = t[:, None].expand(T, topk)[valid]
    code = ((tt // g) * s_kv + indices[valid].long()) * g + (tt % g)
    code = torch.unique(code)  # sorted; duplicates within a token gone
    gk, j = code // g, code % g
    uniq, inv = torch.unique(gk, return_inverse=True)
    mask = torch.zeros(uniq.numel(), dtype=torch.int64, device=dev).index_add_(0, inv, torch.ones_like(j) << j)
    grp, key = uniq // s_kv, uniq % s_kv
    full = (torch.ones_like(n_present) << n_present) - 1
    shared = (mask == full[grp]) & ~has_empty[grp]
    s_len = _scatter_list(out.shared_idx, None, grp[shared], key[shared], None, G)
    r_len = _scatter_list(out.rest_idx, out.rest_mask, grp[~shared], key[~shared], mask[~shared], G)
    out.shared_len.copy_(s_len)
    out.rest_len.copy_(r_len)
    out.union_len.copy_(s_len + r_len)
    return out


if triton is not None:

    @triton.jit
    def _entries(len_ptr, t, T, topk, HAS_LEN: tl.constexpr):
        """Entries of token ``t`` to consider: 0 if absent, else ``min(topk, topk_length[t])``."""
        lim = tl.where(t < T, topk, 0)
        if HAS_LEN:
            lim = tl.minimum(lim, tl.load(len_ptr + tl.minimum(t, T - 1)))
        return lim

    @triton.jit
    def _union_kernel(idx_ptr, len_ptr, scratch_ptr, sh_idx_ptr, sh_len_ptr, rs_idx_ptr, rs_mask_ptr, rs_len_ptr,
                      un_len_ptr, T, topk, s_kv, num_groups, words, cap_s, cap_r, stride_t,
                      G_TOK: tl.constexpr, BITS: tl.constexpr, HAS_LEN: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        KPW: tl.constexpr = 32 // BITS  # keys per scratch word (4, 2 or 1)
        LOG_KPW: tl.constexpr = 2 if BITS == 8 else (1 if BITS == 16 else 0)
        MEMB: tl.constexpr = (1 << G_TOK) - 1  # membership bits of a field
        CLAIM: tl.constexpr = 1 << G_TOK  # the claim bit (never bit 31: no sign trouble in the shifts)
        offs = tl.arange(0, BLOCK)
        pad = tl.arange(0, 64)
        zero64 = pid.to(tl.int64) * 0  # int64 row offsets (tl.range yields plain ints in the interpreter)
        my_scratch = scratch_ptr + (zero64 + pid) * words
        for grp in tl.range(pid, num_groups, nprog):
            t0 = grp * G_TOK
            # ---- phase 1: mark every valid entry's bit; count each present token's valid keys
            n_present = tl.minimum(T - t0, G_TOK)
            any_empty = tl.zeros([], tl.int32)
            for j in tl.range(0, G_TOK):
                t = t0 + j
                lim = _entries(len_ptr, t, T, topk, HAS_LEN)
                n_valid = tl.zeros([], tl.int32)
                row = idx_ptr + (zero64 + t) * stride_t
                for k0 in tl.range(0, topk, BLOCK):
                    i = k0 + offs
                    key = tl.load(row + i, mask=i < lim, other=-1)
                    ok = (key >= 0) & (key < s_kv) & (i < lim)
                    shift = (key & (KPW - 1)) * BITS
                    bit = tl.full([BLOCK], 1, tl.int32) << (shift + j)
                    tl.atomic_or(my_scratch + (key >> LOG_KPW), bit, mask=ok, sem="relaxed")
                    n_valid += tl.sum(ok.to(tl.int32), 0)
                any_empty = any_empty | ((t < T) & (n_valid == 0)).to(tl.int32)
            # all present tokens' bits; -1 (matches no mask) when a present token has no valid key: no shared keys
            full = tl.where(any_empty == 0, (tl.full((), 1, tl.int32) << n_present) - 1, -1)
            tl.debug_barrier()
            # ---- phase 2: keep an entry iff its token is the lowest set bit and it claims the key first; compact
            n_sh = tl.zeros([], tl.int32)
            n_rs = tl.zeros([], tl.int32)
            sh_row = sh_idx_ptr + (zero64 + grp) * cap_s
            rs_row = rs_idx_ptr + (zero64 + grp) * cap_r
            rm_row = rs_mask_ptr + (zero64 + grp) * cap_r
            for j in tl.range(0, G_TOK):
                t = t0 + j
                lim = _entries(len_ptr, t, T, topk, HAS_LEN)
                row = idx_ptr + (zero64 + t) * stride_t
                for k0 in tl.range(0, topk, BLOCK):
                    i = k0 + offs
                    key = tl.load(row + i, mask=i < lim, other=-1)
                    ok = (key >= 0) & (key < s_kv) & (i < lim)
                    word = my_scratch + (key >> LOG_KPW)
                    shift = (key & (KPW - 1)) * BITS
                    w = tl.load(word, mask=ok, other=0, cache_modifier=".cg")
                    m = (w >> shift) & MEMB
                    cand = ok & ((m & ((tl.full([], 1, tl.int32) << j) - 1)) == 0)
                    claim = tl.full([BLOCK], CLAIM, tl.int32) << shift
                    old = tl.atomic_or(word, claim, mask=cand, sem="relaxed")
                    keep = cand & (((old >> shift) & CLAIM) == 0)
                    is_sh = keep & (m == full)
                    is_rs = keep & ~is_sh
                    p_sh = n_sh + tl.cumsum(is_sh.to(tl.int32), 0) - 1
                    p_rs = n_rs + tl.cumsum(is_rs.to(tl.int32), 0) - 1
                    tl.store(sh_row + p_sh, key, mask=is_sh)
                    tl.store(rs_row + p_rs, key, mask=is_rs)
                    tl.store(rm_row + p_rs, m.to(rs_mask_ptr.dtype.element_ty), mask=is_rs)
                    n_sh += tl.sum(is_sh.to(tl.int32), 0)
                    n_rs += tl.sum(is_rs.to(tl.int32), 0)
            tl.store(sh_len_ptr + grp, n_sh)
            tl.store(rs_len_ptr + grp, n_rs)
            tl.store(un_len_ptr + grp, n_sh + n_rs)
            # -1 padding up to the next multiple of 64 past each length (mask 0 for rest)
            p = n_sh + pad
            tl.store(sh_row + p, -1, mask=p < ((n_sh + 63) // 64) * 64)
            p = n_rs + pad
            tl.store(rs_row + p, -1, mask=p < ((n_rs + 63) // 64) * 64)
            tl.store(rm_row + p, 0, mask=p < ((n_rs + 63) // 64) * 64)
            tl.debug_barrier()
            # ---- phase 3: clear the words of every union key (read back from the lists just written)
            for k0 in tl.range(0, n_sh, BLOCK):
                i = k0 + offs
                key = tl.load(sh_row + i, mask=i < n_sh, other=0, cache_modifier=".cg")
                tl.store(my_scratch + (key >> LOG_KPW), 0, mask=i < n_sh)
            for k0 in tl.range(0, n_rs, BLOCK):
                i = k0 + offs
                key = tl.load(rs_row + i, mask=i < n_rs, other=0, cache_modifier=".cg")
                tl.store(my_scratch + (key >> LOG_KPW), 0, mask=i < n_rs)
            tl.debug_barrier()


_SCRATCH: dict = {}


def union_scratch(device, num_programs: int, s_kv: int, g: int) -> torch.Tensor:
    """The zeroed ``[num_programs, W]`` int32 scratch of :func:`build_union`, cached per ``(device, num_programs)``
    and reused while it has ``W`` words (``mla_lab.union_layout.union_scratch_words``)."""
    words = _scratch_words(s_kv, g)
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    key = (str(d), num_programs)
    buf = _SCRATCH.get(key)
    if buf is None or buf.shape[1] < words:
        buf = torch.zeros(num_programs, words, dtype=torch.int32, device=d)
        _SCRATCH[key] = buf
    return buf


def _default_programs(device) -> int:
    if torch.device(device).type != "cuda":
        return INTERPRETER_PROGRAMS
    return DEFAULT_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def output_sets(indices: torch.Tensor, g: int, out: UnionSets | None = None) -> UnionSets:
    """The builders' output: ``out`` checked against ``indices`` and ``g`` (same T, g, caps, device; else one
    ``ValueError`` line), or a new ``-1``-filled :class:`UnionSets`."""
    T, topk = indices.shape
    G, (cap_s, cap_r), device = -(-T // g), union_caps(topk, g), indices.device
    if out is None:
        return _empty_sets(G, cap_s, cap_r, g, T, device)
    want = {"shared_idx": ((G, cap_s), torch.int32), "shared_len": ((G,), torch.int32),
            "rest_idx": ((G, cap_r), torch.int32), "rest_mask": ((G, cap_r), _mask_dtype(g)),
            "rest_len": ((G,), torch.int32), "union_len": ((G,), torch.int32)}
    if not isinstance(out, UnionSets):
        raise ValueError(f"out must be None or a UnionSets; got {type(out).__name__}")
    for name, (shape, dt) in want.items():
        t = getattr(out, name)
        if tuple(t.shape) != shape or t.dtype != dt or t.device != device or not t.is_contiguous():
            raise ValueError(f"out.{name} must be a contiguous {dt} tensor of shape {shape} on {device}; got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    if out.g != g or out.T != T:
        raise ValueError(f"out must be built for g={g}, T={T}; got out.g={out.g}, out.T={out.T}")
    return out


def build_union(indices: torch.Tensor, topk_length: torch.Tensor | None, g: int, s_kv: int, *,
                out: UnionSets | None = None, num_programs: int | None = None, scratch: torch.Tensor | None = None,
                block: int = 1024, num_warps: int = 4) -> UnionSets:
    """The union lists by the Triton kernel (module docstring); same sets as :func:`build_union_ref`.

    Args:
        indices, topk_length, g, s_kv: as :func:`build_union_ref`; ``indices`` contiguous along topk, on CUDA (CPU
            under ``TRITON_INTERPRET=1``).
        out: a :class:`UnionSets` to write into (same T, g, topk, device); None allocates one (:func:`output_sets`).
        num_programs: persistent programs (default :data:`DEFAULT_PROGRAMS_PER_SM` x SMs; 3 in the interpreter).
        scratch: ``[num_programs, >= W]`` int32, all zero; None: :func:`union_scratch`'s cached buffer.
        block: entries per vector step (power of two >= 64); num_warps: warps per program.

    Returns:
        :class:`UnionSets` (``out`` when given); with ``out`` and a cached or given scratch, one launch that
        allocates nothing and does not synchronise (CUDA-graph capturable).

    Raises:
        ValueError: every rule of :func:`build_union_ref`; indices not contiguous along topk; triton missing; CPU
            tensors outside the interpreter; ``out``, ``scratch``, ``num_programs`` or ``block`` not as stated.
    """
    _validate(indices, topk_length, g, s_kv)
    ok, why = triton_available()
    if not ok:
        raise ValueError(f"build_union needs triton: {why}")
    dev = indices.device
    if dev.type != "cuda" and not triton_interpreting():
        raise ValueError(f"indices must be a CUDA tensor (or TRITON_INTERPRET=1 for CPU); got device={dev}")
    if indices.shape[1] > 1 and indices.stride(1) != 1:
        raise ValueError(f"indices must be contiguous along topk (stride 1); got indices.stride()={indices.stride()}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 64 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 64; got block={block!r}")
    out = output_sets(indices, g, out)
    T, topk = indices.shape
    G = out.num_groups
    cap_s, cap_r = out.shared_idx.shape[1], out.rest_idx.shape[1]
    P = _default_programs(dev) if num_programs is None else num_programs
    if isinstance(P, bool) or not isinstance(P, int) or P < 1:
        raise ValueError(f"num_programs must be an int >= 1; got num_programs={num_programs!r}")
    words = _scratch_words(s_kv, g)
    if scratch is None:
        scratch = union_scratch(dev, P, s_kv, g)
    elif (scratch.dtype != torch.int32 or scratch.dim() != 2 or scratch.shape[0] != P or scratch.shape[1] < words
          or scratch.device != dev or not scratch.is_contiguous()):
        raise ValueError(f"scratch must be a contiguous zeroed int32 [{P}, >= {words}] tensor on {dev}; got "
                         f"{scratch.dtype} {tuple(scratch.shape)} on {scratch.device}")
    if G == 0:
        return out
    # the kernel reads topk_length[t] at t: a strided view is copied (a no-op when contiguous)
    lens = topk_length.contiguous() if topk_length is not None else out.shared_len  # else a pointer never read
    _union_kernel[(min(P, G),)](
        indices, lens, scratch, out.shared_idx, out.shared_len, out.rest_idx, out.rest_mask, out.rest_len,
        out.union_len, T, topk, s_kv, G, scratch.shape[1], cap_s, cap_r, indices.stride(0),
        G_TOK=g, BITS=_field_bits(g), HAS_LEN=topk_length is not None, BLOCK=block, num_warps=num_warps)
    return out
