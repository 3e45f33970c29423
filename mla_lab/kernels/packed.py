"""Packed sparse-MLA prefill (docs/packed.md): ``g = 64 // H`` consecutive tokens x H real heads fill one 64-row
FlashMLA tile (row ``r`` = token ``r // H`` of the group, head ``r % H``), which gathers the union of the g tokens'
top-k sets once, each row masked to its own token's set: exact attention, work scaling with the union size.

The union (:func:`.union.build_union`) splits into *shared* keys (FlashMLA itself, ``s_q = G``, ``h_q = 64``) and
*rest* keys with a g-bit mask (the Triton :func:`_packed_kernel`, continuing FlashMLA's online softmax from its
output and LSE in place); ``mode="triton"`` runs the Triton kernel over both. Constants: 512 = kv_lora_rank, 64 =
qk_rope_head_dim (GLM-5 / DeepSeek-V3.2 config.json), 576 = head_size; 64 rows = FlashMLA's sm90 tile
(``csrc/api/sparse_fwd.h``), 128 on sm100 (modelled only: the lab has no Blackwell).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .union import build_union

__all__ = ["packed_sparse_prefill", "packed_group_size", "full_union", "TILE_ROWS_SM90", "REST_CONFIG", "PackedCost",
           "H200_PACKED_COST", "DISPATCH_MARGIN", "sample_sets", "choose_path", "rest_config", "REST_CONFIG_SHORT",
           "PACKED_MODES"]

#: FlashMLA's sm90 sparse prefill tile: h_q is a multiple of 64 (csrc/api/sparse_fwd.h).
TILE_ROWS_SM90 = 64
#: (BLOCK_N, num_warps, num_stages) of the rest kernel, chosen on the lent H200 (docs/perf-notes.md, "Packed
#: kernel", calls 1-2 of 2026-12-04): 64-key blocks, 8 warps, 2 stages for long rest lists (0 spills, 255 registers,
#: 221 KB shared memory; 3 stages and Triton's warp specialization gave the same time, 128-key blocks half the speed);
#: 16-key blocks for short ones (the seed: <= 7 rest keys per group), where the pass is set by loading Q and the
#: FlashMLA output.
REST_CONFIG = (64, 8, 2)
REST_CONFIG_SHORT = (16, 8, 2)
#: Mean rest keys per group below which :data:`REST_CONFIG_SHORT` is used.
SHORT_REST = 64
#: ``hybrid``: FlashMLA over the shared keys + the Triton masked kernel over the rest; ``triton``: Triton only.
PACKED_MODES = ("hybrid", "triton")
_D_V, _D_T, _D_QK = 512, 64, 576
_LOG2E = 1.4426950408889634
_DTYPES = (torch.bfloat16, torch.float16)


def packed_group_size(num_heads: int, tile_rows: int = TILE_ROWS_SM90) -> int:
    """Tokens per tile, ``tile_rows // num_heads`` (8 at 8 heads on sm90, 16 on sm100's 128 rows).

    Raises:
        ValueError: ``num_heads`` not one of 8, 16, 32 (64 needs no packing), or ``tile_rows`` not 64 / 128.
    """
    if tile_rows not in (64, 128):
        raise ValueError(f"tile_rows={tile_rows!r} is not a FlashMLA tile; allowed: 64 (sm90), 128 (sm100)")
    if num_heads not in (8, 16, 32):
        raise ValueError(f"num_heads={num_heads!r} cannot be packed; allowed: 8, 16, 32 (64 fills the tile)")
    return tile_rows // num_heads


try:  # Triton is in the lab's environment; without it only the torch reference runs
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

if triton is not None:

    @triton.jit
    def _rows(gid, T, H: tl.constexpr, G: tl.constexpr):
        # rows r = (token j of the group) * H + head h; G * H = 64 rows
        r = tl.arange(0, G * H)
        j = r // H
        tok = gid * G + j
        return j, tok.to(tl.int64), r % H, tok < T

    @triton.jit
    def _body(q_ptr, kv_ptr, idx_ptr, mask_ptr, n_keys, STRIDE, out_ptr, lse_ptr, gid, T, sq_t, sq_h, qk_scale_log2,
              H: tl.constexpr, G: tl.constexpr, HAS_INIT: tl.constexpr, ALL_PRESENT: tl.constexpr,
              BLOCK_N: tl.constexpr):
        D_V: tl.constexpr = 512
        D_T: tl.constexpr = 64
        j, tok64, hh, present = _rows(gid, T, H, G)
        dv = tl.arange(0, D_V)
        dt = tl.arange(0, D_T)
        qrow = q_ptr + tok64 * sq_t + hh * sq_h
        q_main = tl.load(qrow[:, None] + dv[None, :], mask=present[:, None], other=0.0)
        q_tail = tl.load(qrow[:, None] + D_V + dt[None, :], mask=present[:, None], other=0.0)
        orow = out_ptr + (tok64 * H + hh) * D_V
        if HAS_INIT:
            # a result over other keys already in out / lse (FlashMLA's, or this kernel's first pass): out
            # normalised, lse natural log (+inf: no key)
            lse0 = tl.load(lse_ptr + tok64 * H + hh, mask=present, other=float("inf"))
            fin = (lse0 < float("inf")) & (lse0 > -float("inf"))
            m_i = tl.where(fin, lse0 * 1.4426950408889634, -float("inf"))
            l_i = tl.where(fin, 1.0, 0.0)
            acc = tl.load(orow[:, None] + dv[None, :], mask=present[:, None] & fin[:, None], other=0.0).to(tl.float32)
        else:
            m_i = tl.full([G * H], -float("inf"), tl.float32)
            l_i = tl.zeros([G * H], tl.float32)
            acc = tl.zeros([G * H, D_V], tl.float32)
        n = tl.arange(0, BLOCK_N)
        base = gid.to(tl.int64) * STRIDE
        for k0 in tl.range(0, n_keys, BLOCK_N):
            inb = (k0 + n) < n_keys
            idx = tl.load(idx_ptr + base + k0 + n, mask=inb, other=-1)
            valid = idx >= 0
            if ALL_PRESENT:  # the shared list: every present row attends every key
                sel = present[:, None] & valid[None, :]
            else:
                bits = tl.load(mask_ptr + base + k0 + n, mask=inb, other=0).to(tl.int32)
                sel = (((bits[None, :] >> j[:, None]) & 1) != 0) & valid[None, :]
            kb = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * 576
            k_main = tl.load(kb[:, None] + dv[None, :], mask=valid[:, None], other=0.0)
            k_tail = tl.load(kb[:, None] + D_V + dt[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q_main, tl.trans(k_main))
            s = tl.dot(q_tail, tl.trans(k_tail), s) * qk_scale_log2
            s = tl.where(sel, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(k_main.dtype), k_main)
            m_i = m_new
        empty = l_i == 0.0
        o = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        tl.store(orow[:, None] + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=present[:, None])
        tl.store(lse_ptr + tok64 * H + hh, lse, mask=present)

    @triton.jit
    def _packed_kernel(q_ptr, kv_ptr, idx_ptr, mask_ptr, len_ptr, STRIDE, out_ptr, lse_ptr, T, sq_t, sq_h,
                       qk_scale_log2, H: tl.constexpr, G: tl.constexpr, HAS_INIT: tl.constexpr,
                       ALL_PRESENT: tl.constexpr, BLOCK_N: tl.constexpr):
        # one program per group of G tokens (64 rows), one key list (one loop: two loops in one program spilled,
        # ncu on the H200, docs/perf-notes.md). HAS_INIT 1: continue the softmax of the result in out / lse and
        # leave groups with no key in this list untouched. ALL_PRESENT 1: the list is the shared one (no masks)
        gid = tl.program_id(0)
        nk = tl.load(len_ptr + gid)
        if HAS_INIT:
            if nk > 0:
                _body(q_ptr, kv_ptr, idx_ptr, mask_ptr, nk, STRIDE, out_ptr, lse_ptr, gid, T, sq_t, sq_h,
                      qk_scale_log2, H, G, HAS_INIT, ALL_PRESENT, BLOCK_N)
        else:
            _body(q_ptr, kv_ptr, idx_ptr, mask_ptr, nk, STRIDE, out_ptr, lse_ptr, gid, T, sq_t, sq_h, qk_scale_log2,
                  H, G, HAS_INIT, ALL_PRESENT, BLOCK_N)


def rest_config(mean_rest_len: float) -> tuple[int, int, int]:
    """The rest kernel's ``(BLOCK_N, num_warps, num_stages)`` for a chunk whose groups hold ``mean_rest_len`` rest
    keys on average."""
    return REST_CONFIG_SHORT if mean_rest_len < SHORT_REST else REST_CONFIG


def full_union(sets):
    """Each group's whole union as one masked list, the shared keys with the present tokens' mask: ``(idx [G, cap]
    int32, mask [G, cap] uint8, len [G])``, for FlashMLA's unmasked upper bound (a torch build, not timed)."""
    G, cap_s = sets.shared_idx.shape
    cap = sets.rest_idx.shape[1] + cap_s
    cap = -(-cap // 128) * 128
    dev = sets.shared_idx.device
    idx = torch.full((G, cap), -1, dtype=torch.int32, device=dev)
    mask = torch.zeros((G, cap), dtype=sets.rest_mask.dtype, device=dev)
    ar_s = torch.arange(cap_s, device=dev)[None, :]
    ls = sets.shared_len.long()[:, None]
    keep_s = ar_s < ls
    idx[:, :cap_s] = torch.where(keep_s, sets.shared_idx, torch.full_like(sets.shared_idx, -1))
    present = _present_bits(sets.T, sets.g, G, dev).to(mask.dtype)
    mask[:, :cap_s] = torch.where(keep_s, present[:, None], torch.zeros_like(present)[:, None])
    cap_r = sets.rest_idx.shape[1]
    ar_r = torch.arange(cap_r, device=dev)[None, :]
    keep_r = ar_r < sets.rest_len.long()[:, None]
    pos = (ls + ar_r).clamp(max=cap - 1)
    src_i = torch.where(keep_r, sets.rest_idx, idx.gather(1, pos))
    src_m = torch.where(keep_r, sets.rest_mask, mask.gather(1, pos))
    idx.scatter_(1, pos, src_i)
    mask.scatter_(1, pos, src_m)
    return idx, mask, (sets.shared_len + sets.rest_len).to(torch.int32)


def _present_bits(T: int, g: int, G: int, device) -> torch.Tensor:
    """``[G]`` int32: bit j set where token ``q * g + j`` exists (< T)."""
    tok = torch.arange(G * g, device=device).view(G, g)
    w = (1 << torch.arange(g, device=device))[None, :]
    return ((tok < T).to(torch.int64) * w).sum(1).to(torch.int32)


def _check(q, kv, sets, sm_scale, mode):
    # fp16 is taken too, for the CPU tests under Triton's interpreter (Triton 3.9's interpreter computes bf16 dots
    # wrongly: seen on this lab's CPU venv, 2026-12-04); FlashMLA and the engines run bf16
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.shape[2] != _D_QK or q.dtype not in _DTYPES:
        raise ValueError(f"q={tuple(q.shape) if isinstance(q, torch.Tensor) else q!r} must be [T, H, 576] bf16")
    H = q.shape[1]
    g = packed_group_size(H)
    if sets.g != g:
        raise ValueError(f"sets.g={sets.g} must be 64 // num_heads = {g} for q with {H} heads")
    if sets.T != q.shape[0]:
        raise ValueError(f"sets.T={sets.T} must equal q.shape[0]={q.shape[0]}")
    if q.stride(2) != 1:
        raise ValueError("q's last dim must be contiguous (stride 1)")
    if kv.dtype != q.dtype or kv.shape[-1] != _D_QK or not kv.is_contiguous():
        raise ValueError(f"kv={tuple(kv.shape)} {kv.dtype} must be a contiguous [s_kv, 1, 576] bf16 tensor")
    if not (isinstance(sm_scale, float) and math.isfinite(sm_scale) and sm_scale > 0):
        raise ValueError(f"sm_scale={sm_scale!r} must be a positive finite float")
    if mode not in PACKED_MODES:
        raise ValueError(f"mode={mode!r} is not known; allowed: {list(PACKED_MODES)}")


def packed_sparse_prefill(q: torch.Tensor, kv: torch.Tensor, sets, sm_scale: float, mode: str = "hybrid",
                          flash_fwd=None, config: tuple[int, int, int] = REST_CONFIG):
    """Exact sparse MLA prefill of every token over its own top-k set, tokens packed g per 64-row tile.

    Args:
        q: ``[T, H, 576]`` bf16, H in {8, 16, 32}; last dim contiguous.
        kv: ``[s_kv, 1, 576]`` bf16, contiguous.
        sets: :class:`mla_lab.kernels.union.UnionSets` for the same tokens with ``g = 64 // H``.
        sm_scale: softmax scale (GLM-5: 1 / sqrt(192 + 64), qk_nope_head_dim + qk_rope_head_dim, config.json).
        mode: :data:`PACKED_MODES`; flash_fwd: ``flash_mla_sparse_fwd`` (the ``flash_mla`` module's by default);
            config: ``(BLOCK_N, num_warps, num_stages)`` of the Triton kernel.

    Returns:
        ``(out [T, H, 512] bf16, lse [T, H] fp32)``, natural-log LSE (FlashMLA's); no valid key: out 0, lse +inf.

    Raises:
        ValueError: a tensor of the wrong shape/dtype, ``sets`` built for another g or T, an unknown mode.
        RuntimeError: hybrid mode without a FlashMLA provider.
    """
    _check(q, kv, sets, sm_scale, mode)
    T, H, _ = q.shape
    g = sets.g
    G = -(-T // g)
    bn, warps, stages = config
    if triton is None:
        raise RuntimeError("the packed kernel needs Triton (pip install triton)")
    kern = _packed_kernel
    q_strides = (q.stride(0), q.stride(1))
    if mode == "triton":
        # two passes of the one-list kernel: the rest (masked) from scratch, then the shared keys on top of it
        out = torch.empty(T, H, _D_V, dtype=q.dtype, device=q.device)
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device)
        for lst, mask, length, init, allp in ((sets.rest_idx, sets.rest_mask, sets.rest_len, 0, 0),
                                              (sets.shared_idx, sets.shared_idx, sets.shared_len, 1, 1)):
            kern[(G,)](q, kv, lst, mask, length, lst.stride(0), out, lse, T, *q_strides, sm_scale * _LOG2E, H=H,
                       G=g, HAS_INIT=init, ALL_PRESENT=allp, BLOCK_N=bn, num_warps=warps, num_stages=stages)
        return out, lse
    if flash_fwd is None:
        try:
            from flash_mla import flash_mla_sparse_fwd as flash_fwd
        except Exception as e:  # the provider is optional on CPU machines
            raise RuntimeError(f"packed hybrid mode needs FlashMLA (flash_mla module): {e}") from e
    qg = q
    if T % g or not q.is_contiguous():  # copied into a contiguous [G * g, H, 576] buffer, zero tail
        qg = torch.zeros(G * g, H, _D_QK, dtype=q.dtype, device=q.device)
        qg[:T] = q
    out_g, _, lse_g = flash_fwd(qg.view(G, g * H, _D_QK), kv.view(-1, 1, _D_QK),
                                sets.shared_idx.view(G, 1, -1), sm_scale, _D_V, topk_length=sets.shared_len)
    out = out_g.view(G * g, H, _D_V)
    lse = lse_g.view(G * g, H)
    kern[(G,)](q, kv, sets.rest_idx, sets.rest_mask, sets.rest_len, sets.rest_idx.stride(0), out, lse, T, *q_strides,
               sm_scale * _LOG2E, H=H, G=g, HAS_INIT=1, ALL_PRESENT=0, BLOCK_N=bn, num_warps=warps,
               num_stages=stages)
    return out[:T], lse[:T]


@dataclass(frozen=True)
class PackedCost:
    """Per-chunk time model of the paths on one GPU, in ns (measured coefficients, see ``source``).

    A key-tile = one key of one 64-row tile (one gathered 576-wide row, 64 x (576 + 512) MACs). Per chunk:
    ``hybrid = flash_tile * sum(shared_len) + rest_tile * sum(rest_len)``, ``triton = triton_tile * sum(union_len)
    + triton_group * groups``, both ``+ build_entry * T * topk``; ``padded = padded_tile * sum(topk_length) +
    padded_token * T``.
    """

    flash_tile: float
    rest_tile: float
    triton_tile: float
    triton_group: float
    build_entry: float
    padded_tile: float
    padded_token: float
    source: str

    def paths_ns(self, shared: float, rest: float, groups: float, entries: float, sum_topk_length: float,
                 tokens: float) -> dict:
        """``{"packed": hybrid, "packed_triton": Triton only, "padded": padded FlashMLA}`` in ns."""
        build = self.build_entry * entries
        return {"packed": self.flash_tile * shared + self.rest_tile * rest + build,
                "packed_triton": self.triton_tile * (shared + rest) + self.triton_group * groups + build,
                "padded": self.padded_tile * sum_topk_length + self.padded_token * tokens}


#: Fitted (non-negative least squares over the per-shape medians) on the lent H200's rows of 2026-12-04, call 3
#: (data/measured/h200/runs/2026-12-04T1547_packed/packed_kernels.csv: 5 fresh processes, graph timing, T 16384,
#: H 8, topk 2048, 13 shapes): hybrid within 5 % of its rows from 0.0 to 0.9 overlap and 4K-128K contexts, 34 %
#: under at the seed and 30 % over at overlap 1.0 (where packing wins 3-6x either way); Triton only within 8 %;
#: padded (tokenspeed-flashmla, stale padded heads) 0.213 ns per key-tile + 35 ns per token; the CUDA union build
#: 0.22-0.35 ms per 16384 x 2048 entries. In-sample for those rows; the adopted run (call 4) tests it out of sample.
H200_PACKED_COST = PackedCost(flash_tile=0.328, rest_tile=0.738, triton_tile=0.687, triton_group=15.6,
                              build_entry=0.0098, padded_tile=0.213, padded_token=34.9,
                              source="lent H200, 2026-12-04, call 3 rows (docs/perf-notes.md, Packed kernel)")
#: The dispatch keeps the padded path unless packing is predicted this much faster (the 2 % rule of issue 36).
DISPATCH_MARGIN = 0.98


def sample_sets(indices: torch.Tensor, topk_length, g: int, s_kv: int, stride: int = 16, builder=None):
    """``(union sets of every stride-th group, stride)``: the dispatch's cheap estimate of the chunk's union sizes
    (``builder``: :func:`.union.build_union` by default)."""
    T, K = indices.shape
    G = T // g
    if G < 1:
        return None, stride
    rows = (torch.arange(0, G, stride, device=indices.device)[:, None] * g
            + torch.arange(g, device=indices.device)[None, :]).reshape(-1)
    tl_ = None if topk_length is None else topk_length[rows].contiguous()
    return (builder or build_union)(indices[rows].contiguous(), tl_, g, s_kv), stride


def choose_path(sets, stride: int, T: int, topk: int, sum_topk_length: float,
                cost: PackedCost = H200_PACKED_COST) -> tuple[str, dict]:
    """``(path, {path: predicted ms})`` for one chunk from (sampled) union sets: ``"packed"`` (hybrid),
    ``"packed_triton"`` (Triton only) or ``"padded"``; a packed path only when predicted below
    :data:`DISPATCH_MARGIN` x the padded time (host-side; an engine would take the lengths from the previous step)."""
    sl = sets.shared_len.double().sum().item() * stride
    rl = sets.rest_len.double().sum().item() * stride
    ms = {k: v / 1e6 for k, v in cost.paths_ns(sl, rl, -(-T // sets.g), T * topk, sum_topk_length, T).items()}
    best = min(("packed", "packed_triton"), key=ms.get)
    return (best if ms[best] < DISPATCH_MARGIN * ms["padded"] else "padded"), ms
