"""Triton kernel for vLLM's ``concat_mla_q``: ``[T,H,512]`` + ``[T,H,64]`` -> first ``H`` heads of ``[T,H',576]``.

Design (v2; v1 and the measurements that led here are in ``docs/perf-notes.md``):

- The ``T*H`` (token, head) pairs are flattened into *rows*; one program copies ``BLOCK_R`` consecutive rows.
  A row is 512 + 64 elements (1152 bytes in bf16/fp16), so one program moves ``BLOCK_R * 1152`` bytes each way.
- Each row is handled as two power-of-two tiles, ``[BLOCK_R, 512]`` and ``[BLOCK_R, 64]``: no column masks, and
  with strides that are multiples of 8 elements (Triton specialises integer arguments divisible by 16) the loads
  and stores are 16-byte vectors.
- The only mask is per row (a tail block when ``BLOCK_R`` does not divide the row count, or the padded heads with
  ``zero_padding``); it is constant along the contiguous dim, so it does not break vectorisation. When the row
  count is a multiple of ``BLOCK_R`` and no padding is written, the kernel is compiled without any mask.
- Both tiles are loaded before either is stored (v2; v1 did load/store/load/store, which the compiler cannot
  reorder because ``out`` might alias an input, so each program paid two memory round trips; v1 is gone, its
  measurements stay in ``docs/perf-notes.md`` and ``data/measured/h200/concat_bench_run1_v1*.csv``).
- Row indices are int32 (int64 only if ``T * H'`` nears 2**31); all element offsets are int64 (``T * H' * 576``
  exceeds 2**31 at T = 131072, H' = 64).
- ``zero_padding=True`` runs over the ``T*H'`` rows of ``out`` instead: rows of padded heads load nothing (masked)
  and store zeros, in the same launch.

Under ``TRITON_INTERPRET=1`` (set before ``triton`` is imported) the same kernel runs on CPU tensors through
Triton's interpreter; the lab's CPU tests use that.
"""

from __future__ import annotations

import torch

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as e:  # pragma: no cover
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = f"{type(e).__name__}: {e}"

__all__ = ["triton_available", "triton_interpreting", "concat_mla_q_triton", "DEFAULT_BLOCK_ROWS",
           "DEFAULT_NUM_WARPS"]

D_NOPE = 512
D_PE = 64

#: Rows ((token, head) pairs) per program and warps per program. v1: 16 rows / 4 warps (chosen before measuring).
#: GPU run 1's sweep -> 4 rows / 4 warps (v2 as measured in run 2's main table). GPU run 2's sweep of 17 variants at
#: all 20 shapes (data/measured/h200/concat_bench_tune.csv) found 2 rows / 1 warp faster than 4 x 4 at each of the
#: 15 shapes with T >= 4096 (by 0.6-1.9 points of the copy ceiling; 91.4-100% of it), so that is the default now:
#: 2.25 KiB read + 2.25 KiB written per 32-thread program. See docs/perf-notes.md.
DEFAULT_BLOCK_ROWS = 2
DEFAULT_NUM_WARPS = 1


def triton_available() -> tuple[bool, str | None]:
    """``(True, None)`` when ``triton`` imported, else ``(False, reason)``."""
    return (_TRITON_IMPORT_ERROR is None, _TRITON_IMPORT_ERROR)


def triton_interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1`` at import time)."""
    if triton is None:
        return False
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # pragma: no cover - older triton
        import os

        return os.environ.get("TRITON_INTERPRET", "0") == "1"


if triton is not None:

    @triton.jit
    def _concat_mla_q_kernel(
        nope_ptr, pe_ptr, out_ptr,
        n_rows, rows_per_token, real_heads,
        nope_st, nope_sh, pe_st, pe_sh, out_st, out_sh,
        D_NOPE_C: tl.constexpr, D_PE_C: tl.constexpr, BLOCK_R: tl.constexpr,
        ZERO_PAD: tl.constexpr, EVEN_ROWS: tl.constexpr, ROWS_I64: tl.constexpr,
        LOAD_EVICT: tl.constexpr, STORE_CACHE: tl.constexpr,
    ):
        pid = tl.program_id(0)
        if ROWS_I64:  # only when T * rows_per_token (+ a block) does not fit in int32
            rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        else:
            rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        tok = rows // rows_per_token
        head = rows - tok * rows_per_token
        tok64 = tok.to(tl.int64)  # element offsets exceed 2**31 at T = 131072, H' = 64
        head64 = head.to(tl.int64)
        cn = tl.arange(0, D_NOPE_C)
        cp = tl.arange(0, D_PE_C)

        src_n = nope_ptr + (tok64 * nope_st + head64 * nope_sh)[:, None] + cn[None, :]
        src_p = pe_ptr + (tok64 * pe_st + head64 * pe_sh)[:, None] + cp[None, :]
        o_row = (tok64 * out_st + head64 * out_sh)[:, None]
        dst_n = out_ptr + o_row + cn[None, :]
        dst_p = out_ptr + o_row + D_NOPE_C + cp[None, :]

        if ZERO_PAD:
            in_rows = rows < n_rows
            real = in_rows & (head < real_heads)
            vn = tl.load(src_n, mask=real[:, None], other=0.0, eviction_policy=LOAD_EVICT)
            vp = tl.load(src_p, mask=real[:, None], other=0.0, eviction_policy=LOAD_EVICT)
            tl.store(dst_n, vn, mask=in_rows[:, None], cache_modifier=STORE_CACHE)
            tl.store(dst_p, vp, mask=in_rows[:, None], cache_modifier=STORE_CACHE)
        elif EVEN_ROWS:
            # Both loads are issued before either store: out may alias nothing we read, but the compiler
            # cannot know that, so load -> store -> load -> store would cost two memory round trips.
            vn = tl.load(src_n, eviction_policy=LOAD_EVICT)
            vp = tl.load(src_p, eviction_policy=LOAD_EVICT)
            tl.store(dst_n, vn, cache_modifier=STORE_CACHE)
            tl.store(dst_p, vp, cache_modifier=STORE_CACHE)
        else:
            in_rows = (rows < n_rows)[:, None]
            vn = tl.load(src_n, mask=in_rows, eviction_policy=LOAD_EVICT)
            vp = tl.load(src_p, mask=in_rows, eviction_policy=LOAD_EVICT)
            tl.store(dst_n, vn, mask=in_rows, cache_modifier=STORE_CACHE)
            tl.store(dst_p, vp, mask=in_rows, cache_modifier=STORE_CACHE)


def concat_mla_q_triton(
    ql_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
    zero_padding: bool = False,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    num_warps: int = DEFAULT_NUM_WARPS,
    streaming: bool = False,
) -> torch.Tensor:
    """Launch the kernel (no validation: :func:`mla_lab.kernels.concat_mla_q` validates).

    Args:
        ql_nope: ``[T, H, 512]``; q_pe: ``[T, H, 64]``; out: ``[T, H', 576]``, H' >= H; one dtype (fp16/bf16),
            last dims contiguous, any token/head strides.
        zero_padding: also write zeros into heads ``H..H'-1`` of ``out`` (same launch).
        block_rows: (token, head) rows per program, a power of two (tuning knob; default
            :data:`DEFAULT_BLOCK_ROWS`).
        num_warps: warps per program (tuning knob; default :data:`DEFAULT_NUM_WARPS`).
        streaming: cache hints for data touched once (loads ``evict_first``, stores ``.cs``); off by default.

    Returns:
        ``out``. ``T == 0`` launches nothing.

    Raises:
        RuntimeError: triton did not import.
    """
    if triton is None:
        raise RuntimeError(f"triton is not available: {_TRITON_IMPORT_ERROR}")
    T, H, _ = ql_nope.shape
    Hp = out.shape[1]
    rows_per_token = Hp if zero_padding else H
    n_rows = T * rows_per_token
    if n_rows == 0:
        return out
    grid = (triton.cdiv(n_rows, block_rows),)
    rows_i64 = n_rows + block_rows >= 2**31
    _concat_mla_q_kernel[grid](
        ql_nope, q_pe, out,
        n_rows, rows_per_token, H,
        ql_nope.stride(0), ql_nope.stride(1), q_pe.stride(0), q_pe.stride(1), out.stride(0), out.stride(1),
        D_NOPE_C=D_NOPE, D_PE_C=D_PE, BLOCK_R=block_rows,
        ZERO_PAD=bool(zero_padding) and Hp > H, EVEN_ROWS=(n_rows % block_rows == 0), ROWS_I64=rows_i64,
        LOAD_EVICT="evict_first" if streaming else "",
        STORE_CACHE=".cs" if streaming else "",
        num_warps=num_warps,
    )
    return out
