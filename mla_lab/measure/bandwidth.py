"""A bandwidth probe for the padded Q workspace (issue 23: is the concat's gap to a contiguous copy the kernel's or the
layout's?): :func:`gapped_write`, one Triton kernel with the concat's v2 tiling (:mod:`mla_lab.kernels.triton_concat`);
on an unpadded ``out`` it writes contiguously, and the ratio is the layout's cost (docs/perf-notes.md "Round 4").
"""

from __future__ import annotations

import torch

from mla_lab.kernels.triton_concat import DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover
    triton = None
    tl = None

if triton is not None:

    @triton.jit
    def _gapped_rows_kernel(src_ptr, out_ptr, n_rows, src_st, src_sh, out_st, out_sh,
                            ROWS_PER_TOKEN: tl.constexpr, BLOCK_R: tl.constexpr, FILL: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        tok = (rows // ROWS_PER_TOKEN).to(tl.int64)
        head = (rows % ROWS_PER_TOKEN).to(tl.int64)
        m = (rows < n_rows)[:, None]
        cn = tl.arange(0, 512)[None, :]
        cp = tl.arange(0, 64)[None, :]
        o = out_ptr + (tok * out_st + head * out_sh)[:, None]
        if FILL:
            tl.store(o + cn, tl.zeros([BLOCK_R, 512], dtype=out_ptr.dtype.element_ty), mask=m)
            tl.store(o + 512 + cp, tl.zeros([BLOCK_R, 64], dtype=out_ptr.dtype.element_ty), mask=m)
        else:
            s = src_ptr + (tok * src_st + head * src_sh)[:, None]
            vn = tl.load(s + cn, mask=m)
            vp = tl.load(s + 512 + cp, mask=m)
            tl.store(o + cn, vn, mask=m)
            tl.store(o + 512 + cp, vp, mask=m)


def gapped_write(out: torch.Tensor, H: int, src: torch.Tensor | None = None) -> torch.Tensor:
    """Write zeros (``src=None``) or ``src [T, H, 576]`` (``out``'s dtype and device) into ``out[:, :H]`` of ``out
    [T, H', 576]`` (fp16/bf16, H' >= H; last dims contiguous) with v2's tiling; returns ``out``.

    Raises:
        RuntimeError: triton did not import.
        ValueError: shapes, dtypes or ``H`` out of range (names the argument and what is allowed).
    """
    if triton is None:
        raise RuntimeError("triton is not available")
    if out.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"out.dtype must be float16 or bfloat16; got {out.dtype}")
    if isinstance(H, bool) or not isinstance(H, int):
        raise ValueError(f"H must be an int; got H={H!r}")
    if out.dim() != 3 or out.shape[2] != 576 or out.stride(2) != 1:
        raise ValueError(f"out must be [T, H', 576] with a contiguous last dim; got shape {tuple(out.shape)}")
    if not 1 <= H <= out.shape[1]:
        raise ValueError(f"H must be in 1..{out.shape[1]} (out's heads); got H={H}")
    if src is not None and (tuple(src.shape) != (out.shape[0], H, 576) or src.dtype != out.dtype
                            or src.stride(2) != 1 or src.device != out.device):
        raise ValueError(f"src must be [T, H, 576] = {(out.shape[0], H, 576)} of dtype {out.dtype} on {out.device} "
                         f"with a contiguous last dim; got {tuple(src.shape)} {src.dtype} on {src.device}")
    n_rows = out.shape[0] * H
    if n_rows == 0:
        return out
    s = out if src is None else src
    _gapped_rows_kernel[(triton.cdiv(n_rows, DEFAULT_BLOCK_ROWS),)](  # v2's defaults: they cannot drift
        s, out, n_rows, s.stride(0), s.stride(1), out.stride(0), out.stride(1),
        ROWS_PER_TOKEN=H, BLOCK_R=DEFAULT_BLOCK_ROWS, FILL=src is None, num_warps=DEFAULT_NUM_WARPS)
    return out
