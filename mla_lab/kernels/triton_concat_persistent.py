"""Persistent Triton kernels for ``concat_mla_q`` (docs/perf-notes.md "Round 4"): same op and bytes as
:mod:`.triton_concat`, another order of writes. **v4**: ``progs_per_sm x`` SMs programs, program ``p`` walking the
row chunks ``[p * n, (p + 1) * n)`` in order, chunk ``i + 1`` loaded before chunk ``i`` is stored (``order="stride"``:
``p, p + grid, ...``, v2's address pattern, the control). **v5**: v4's spans in chunks of ``BLOCK_T`` whole tokens,
stored by the Hopper TMA engine (host ``TensorDescriptor`` over ``out [T, H', 576]``, boxes ``[BLOCK_T, H, 256]`` x 2
+ ``[BLOCK_T, H, 64]``, each dim <= 256: ``cuTensorMapEncodeTiled``; what it needs: :func:`v5_unsupported`). Under
``TRITON_INTERPRET=1`` both run on CPU with :data:`INTERPRET_SMS` "SMs".
"""

from __future__ import annotations

import torch

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover
    triton = None
    tl = None

__all__ = ["V4_DEFAULTS", "V5_DEFAULTS", "ORDERS", "num_sms", "plan_v4", "plan_v5", "v5_unsupported"]

#: v4 defaults before the H200 A/B of round 4 (docs/perf-notes.md): v2's per-warp tile (2 rows, 1 warp), 16
#: programs per SM (16 warps per SM, 2 chunks in flight each: 32 x 2.25 KiB per SM, v2's resident bytes).
V4_DEFAULTS = {"block_rows": 2, "num_warps": 1, "progs_per_sm": 16, "order": "span"}
#: v5 defaults: one token per tile (9 KiB at H = 8), 2 warps, 8 programs per SM.
V5_DEFAULTS = {"block_t": 1, "num_warps": 2, "progs_per_sm": 8}
ORDERS = ("span", "stride")
#: v5: at most this many (token, head) rows per tile: 64 x 1152 B = 72 KiB per stage; Triton's compiled v5 used 14 KiB
#: of shared memory for 8 rows (Triton 3.6, sm90), about 2 x the tile; 227 KiB is sm90's per-block opt-in maximum
#: (NVIDIA Hopper tuning guide).
V5_MAX_ROWS = 64
#: multiprocessors assumed under the interpreter (no device to ask).
INTERPRET_SMS = 4
_SMS: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of ``device`` (``torch.cuda.get_device_properties``; cached), or
    :data:`INTERPRET_SMS` for a CPU tensor (the interpreter)."""
    if device.type != "cuda":
        return INTERPRET_SMS
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = int(torch.cuda.get_device_properties(i).multi_processor_count)
    return _SMS[i]


def _pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def _knobs(cfg: dict, defaults: dict) -> dict:
    """``defaults`` overridden by ``cfg``'s non-None values, as ints (``order`` as is); raises ``ValueError`` for the
    first not a power of two (``progs_per_sm``: < 1)."""
    k = {n: d if cfg.get(n) is None else cfg[n] for n, d in defaults.items()}
    for n, v in k.items():
        if n != "order":
            k[n] = v = int(v)
        if n == "progs_per_sm" and v < 1:
            raise ValueError(f"progs_per_sm must be >= 1; got progs_per_sm={v}")
        if n not in ("progs_per_sm", "order") and not _pow2(v):
            raise ValueError(f"{n} must be a power of two >= 1; got {n}={v}")
    return k


if triton is not None:

    @triton.jit
    def _v4_ld(nope_ptr, pe_ptr, rows, n_rows, real_heads, nope_st, nope_sh, pe_st, pe_sh,
               D_NOPE_C: tl.constexpr, D_PE_C: tl.constexpr, ROWS_PER_TOKEN: tl.constexpr, ZERO_PAD: tl.constexpr,
               LOAD_EVICT: tl.constexpr):
        tok = (rows // ROWS_PER_TOKEN).to(tl.int64)
        head = rows % ROWS_PER_TOKEN
        m = rows < n_rows
        if ZERO_PAD:
            m = m & (head < real_heads)
        h64 = head.to(tl.int64)
        src_n = nope_ptr + (tok * nope_st + h64 * nope_sh)[:, None] + tl.arange(0, D_NOPE_C)[None, :]
        src_p = pe_ptr + (tok * pe_st + h64 * pe_sh)[:, None] + tl.arange(0, D_PE_C)[None, :]
        vn = tl.load(src_n, mask=m[:, None], other=0.0, eviction_policy=LOAD_EVICT)
        vp = tl.load(src_p, mask=m[:, None], other=0.0, eviction_policy=LOAD_EVICT)
        return vn, vp

    @triton.jit
    def _v4_st(out_ptr, rows, n_rows, out_st, out_sh, vn, vp, D_NOPE_C: tl.constexpr, D_PE_C: tl.constexpr,
               ROWS_PER_TOKEN: tl.constexpr, STORE_CACHE: tl.constexpr):
        tok = (rows // ROWS_PER_TOKEN).to(tl.int64)
        head = (rows % ROWS_PER_TOKEN).to(tl.int64)
        m = (rows < n_rows)[:, None]
        o = out_ptr + (tok * out_st + head * out_sh)[:, None]
        tl.store(o + tl.arange(0, D_NOPE_C)[None, :], vn, mask=m, cache_modifier=STORE_CACHE)
        tl.store(o + D_NOPE_C + tl.arange(0, D_PE_C)[None, :], vp, mask=m, cache_modifier=STORE_CACHE)

    @triton.jit
    def _concat_mla_q_v4_kernel(
        nope_ptr, pe_ptr, out_ptr,
        n_rows, chunks_per_prog, real_heads,
        nope_st, nope_sh, pe_st, pe_sh, out_st, out_sh,
        D_NOPE_C: tl.constexpr, D_PE_C: tl.constexpr, BLOCK_R: tl.constexpr, ROWS_PER_TOKEN: tl.constexpr,
        ZERO_PAD: tl.constexpr, SPAN: tl.constexpr, ROWS_I64: tl.constexpr,
        LOAD_EVICT: tl.constexpr, STORE_CACHE: tl.constexpr,
    ):
        pid = tl.program_id(0)
        ar = tl.arange(0, BLOCK_R)
        if ROWS_I64:
            pid = pid.to(tl.int64)
            ar = ar.to(tl.int64)
        if SPAN:  # chunks pid * n .. pid * n + n - 1, in order
            c0 = pid * chunks_per_prog
            step = 1
        else:  # chunks pid, pid + grid, ... (v2's address pattern, persistent)
            c0 = pid
            step = tl.num_programs(0)
        rows = c0 * BLOCK_R + ar
        vn, vp = _v4_ld(nope_ptr, pe_ptr, rows, n_rows, real_heads, nope_st, nope_sh, pe_st, pe_sh, D_NOPE_C,
                        D_PE_C, ROWS_PER_TOKEN, ZERO_PAD, LOAD_EVICT)
        for i in range(1, chunks_per_prog):
            nrows = (c0 + i * step) * BLOCK_R + ar
            nn, npe = _v4_ld(nope_ptr, pe_ptr, nrows, n_rows, real_heads, nope_st, nope_sh, pe_st, pe_sh, D_NOPE_C,
                             D_PE_C, ROWS_PER_TOKEN, ZERO_PAD, LOAD_EVICT)
            _v4_st(out_ptr, rows, n_rows, out_st, out_sh, vn, vp, D_NOPE_C, D_PE_C, ROWS_PER_TOKEN, STORE_CACHE)
            rows = nrows
            vn = nn
            vp = npe
        _v4_st(out_ptr, rows, n_rows, out_st, out_sh, vn, vp, D_NOPE_C, D_PE_C, ROWS_PER_TOKEN, STORE_CACHE)

    @triton.jit
    def _v5_ld(nope_ptr, pe_ptr, t0, T, nope_st, nope_sh, pe_st, pe_sh, BLOCK_T: tl.constexpr, H: tl.constexpr,
               HALF: tl.constexpr, D_PE_C: tl.constexpr, LOAD_EVICT: tl.constexpr):
        tok = t0 + tl.arange(0, BLOCK_T)
        m = (tok < T)[:, None, None]
        t3 = tok.to(tl.int64)[:, None, None]
        h3 = tl.arange(0, H).to(tl.int64)[None, :, None]
        base_n = nope_ptr + t3 * nope_st + h3 * nope_sh + tl.arange(0, HALF)[None, None, :]
        lo = tl.load(base_n, mask=m, other=0.0, eviction_policy=LOAD_EVICT)
        hi = tl.load(base_n + HALF, mask=m, other=0.0, eviction_policy=LOAD_EVICT)
        pe = tl.load(pe_ptr + t3 * pe_st + h3 * pe_sh + tl.arange(0, D_PE_C)[None, None, :], mask=m, other=0.0,
                     eviction_policy=LOAD_EVICT)
        return lo, hi, pe

    @triton.jit
    def _v5_st(out_nope_desc, out_pe_desc, t0, lo, hi, pe, HALF: tl.constexpr):
        out_nope_desc.store([t0, 0, 0], lo)
        out_nope_desc.store([t0, 0, HALF], hi)
        out_pe_desc.store([t0, 0, 2 * HALF], pe)

    @triton.jit
    def _concat_mla_q_v5_kernel(
        nope_ptr, pe_ptr, out_nope_desc, out_pe_desc,
        T, chunks_per_prog,
        nope_st, nope_sh, pe_st, pe_sh,
        BLOCK_T: tl.constexpr, H: tl.constexpr, HALF: tl.constexpr, D_PE_C: tl.constexpr,
        LOAD_EVICT: tl.constexpr,
    ):
        pid = tl.program_id(0)
        t0 = pid * chunks_per_prog * BLOCK_T
        lo, hi, pe = _v5_ld(nope_ptr, pe_ptr, t0, T, nope_st, nope_sh, pe_st, pe_sh, BLOCK_T, H, HALF, D_PE_C,
                            LOAD_EVICT)
        for _i in range(1, chunks_per_prog):
            t1 = t0 + BLOCK_T
            nlo, nhi, npe = _v5_ld(nope_ptr, pe_ptr, t1, T, nope_st, nope_sh, pe_st, pe_sh, BLOCK_T, H, HALF,
                                   D_PE_C, LOAD_EVICT)
            _v5_st(out_nope_desc, out_pe_desc, t0, lo, hi, pe, HALF)
            t0 = t1
            lo = nlo
            hi = nhi
            pe = npe
        _v5_st(out_nope_desc, out_pe_desc, t0, lo, hi, pe, HALF)


def plan_v4(ql_nope, q_pe, out, zp: bool, rows_per_token: int, strides: tuple, hints: dict, cfg: dict):
    """``(kernel, grid, args, constexprs, num_warps)`` for v4 (``T * rows_per_token > 0``, planned by
    :func:`.triton_concat._plan`); ``cfg``: the knobs of :data:`V4_DEFAULTS` (None = default).

    Raises:
        ValueError: a knob out of range (names the knob, its value and what is allowed).
    """
    br, nw, pps, order = _knobs(cfg, V4_DEFAULTS).values()
    if order not in ORDERS:
        raise ValueError(f"order must be one of {list(ORDERS)}; got order={order!r}")
    n_rows = ql_nope.shape[0] * rows_per_token
    n_chunks = -(-n_rows // br)
    grid = min(n_chunks, pps * num_sms(out.device))
    cpp = -(-n_chunks // grid)
    args = (ql_nope, q_pe, out, n_rows, cpp, ql_nope.shape[1]) + strides
    cx = {"D_NOPE_C": 512, "D_PE_C": 64, "BLOCK_R": br, "ROWS_PER_TOKEN": rows_per_token, "ZERO_PAD": zp,
          "SPAN": order == "span", "ROWS_I64": (grid * cpp + 1) * br >= 2**31, **hints}
    return _concat_mla_q_v4_kernel, (grid,), args, cx, nw


def v5_unsupported(ql_nope, q_pe, out, zero_padding: bool) -> str | None:
    """Why v5 cannot run these tensors (one line), or None when it can."""
    if triton is None:
        return "triton is not available"
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except Exception:
        return f"this Triton ({getattr(triton, '__version__', '?')}) has no host tensor descriptors (3.4+)"
    T, H, _ = ql_nope.shape
    if zero_padding and out.shape[1] > H:
        return "zero_padding=True is not supported by v5 (use v4 or v2)"
    if not _pow2(H) or H > 32:
        return f"H={H} real heads: v5 needs a power of two <= 32 (every real head of a token is one tile)"
    es = out.element_size()
    if out.data_ptr() % 16:
        return f"out must start 16-byte aligned (a TMA base); got data_ptr() % 16 = {out.data_ptr() % 16}"
    if any((s * es) % 16 for s in out.stride()[:2]):
        return f"out's token/head strides must be 16-byte multiples (TMA); got strides {out.stride()}"
    if out.device.type == "cuda" and torch.cuda.get_device_capability(out.device)[0] < 9:
        return f"TMA stores need sm90+; got sm{''.join(map(str, torch.cuda.get_device_capability(out.device)))}"
    return None


def plan_v5(ql_nope, q_pe, out, zp: bool, rows_per_token: int, strides: tuple, hints: dict, cfg: dict):
    """``(kernel, grid, args, constexprs, num_warps)`` for v5 (``T > 0``, planned by :func:`.triton_concat._plan`);
    ``cfg``: the knobs of :data:`V5_DEFAULTS` (None = default); ``hints``' store modifier unused (the copy engine
    stores).

    Raises:
        ValueError: :func:`v5_unsupported` says why these tensors cannot run; a knob out of range.
    """
    why = v5_unsupported(ql_nope, q_pe, out, zp)
    if why is not None:
        raise ValueError(f"variant='v5': {why}")
    from triton.tools.tensor_descriptor import TensorDescriptor

    bt, nw, pps = _knobs(cfg, V5_DEFAULTS).values()
    T, H, _ = ql_nope.shape
    if bt > 256:  # a TMA box dimension is at most 256 elements (CUDA driver API, cuTensorMapEncodeTiled)
        raise ValueError(f"block_t must be <= 256 (a TMA box dimension); got block_t={bt}")
    if bt * H > V5_MAX_ROWS:
        raise ValueError(f"block_t * H must be <= {V5_MAX_ROWS} (the tile's shared memory, {V5_MAX_ROWS} x 1152 B "
                         f"x 2 stages, fits the 227 KiB a block may use on sm90); got block_t={bt}, H={H}")
    half = 256  # TMA box dims are <= 256 elements: the 512-wide part as two boxes
    n_chunks = -(-T // bt)
    grid = min(n_chunks, pps * num_sms(out.device))
    cpp = -(-n_chunks // grid)
    d_nope = TensorDescriptor(out, list(out.shape), list(out.stride()), [bt, H, half])
    d_pe = TensorDescriptor(out, list(out.shape), list(out.stride()), [bt, H, 64])
    args = (ql_nope, q_pe, d_nope, d_pe, T, cpp, *strides[:4])
    cx = {"BLOCK_T": bt, "H": H, "HALF": half, "D_PE_C": 64, "LOAD_EVICT": hints.get("LOAD_EVICT", "")}
    return _concat_mla_q_v5_kernel, (grid,), args, cx, nw
