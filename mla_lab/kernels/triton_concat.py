"""The Triton kernel of vLLM's ``concat_mla_q``: ``[T,H,512]`` + ``[T,H,64]`` -> first ``H`` heads of ``[T,H',576]``.

"v2", the variant kept: ``BLOCK_R`` (token, head) rows per program, tiles ``[BLOCK_R, 512]`` + ``[BLOCK_R, 64]``
both loaded before either is stored; 93.7-94.4 % of a same-byte copy into the padded workspace on the H200
(``data/measured/h200/between_process/concat_round4.csv``; docs/perf-notes.md "Round 3: concat", "Round 4"; the
variants tried beside it: docs/retired.md). :func:`make_concat_launcher_triton` compiles once and calls the compiled
launcher directly (CUDA-graph capturable). Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors.
"""

from __future__ import annotations

import torch

from .reference import D_NOPE, D_PE

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as e:  # pragma: no cover
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = f"{type(e).__name__}: {e}"

__all__ = ["triton_available", "triton_interpreting", "concat_mla_q_triton", "make_concat_launcher_triton",
           "ConcatLauncher", "DEFAULT_BLOCK_ROWS", "DEFAULT_NUM_WARPS"]

#: Rows ((token, head) pairs) and warps per program: 2 rows / 1 warp beat every other setting at the 15 shapes with
#: T >= 4096 (data/measured/h200/concat_bench_tune.csv; docs/perf-notes.md).
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
            vn = tl.load(src_n, mask=real[:, None], other=0.0)
            vp = tl.load(src_p, mask=real[:, None], other=0.0)
            tl.store(dst_n, vn, mask=in_rows[:, None])
            tl.store(dst_p, vp, mask=in_rows[:, None])
        elif EVEN_ROWS:
            # Both loads are issued before either store: out may alias nothing we read, but the compiler
            # cannot know that, so load -> store -> load -> store would cost two memory round trips.
            vn = tl.load(src_n)
            vp = tl.load(src_p)
            tl.store(dst_n, vn)
            tl.store(dst_p, vp)
        else:
            in_rows = (rows < n_rows)[:, None]
            vn = tl.load(src_n, mask=in_rows)
            vp = tl.load(src_p, mask=in_rows)
            tl.store(dst_n, vn, mask=in_rows)
            tl.store(dst_p, vp, mask=in_rows)


def _plan(ql_nope, q_pe, out, zero_padding, block_rows: int = DEFAULT_BLOCK_ROWS):
    """``(kernel, grid, args, constexprs, num_warps)`` for one call, or None when there is nothing to write.

    ``args``: the runtime arguments in signature order; ``constexprs``: a dict in signature order (the kernel declares
    its constexprs after its runtime arguments; :func:`make_concat_launcher_triton` relies on it).

    Raises:
        RuntimeError: triton did not import. ValueError: ``block_rows`` not a power of two >= 1.
    """
    if triton is None:
        raise RuntimeError(f"triton is not available: {_TRITON_IMPORT_ERROR}")
    br = block_rows
    if isinstance(br, bool) or not isinstance(br, int) or br < 1 or br & (br - 1):
        raise ValueError(f"block_rows must be a power of two >= 1; got block_rows={br!r}")
    T, H, _ = ql_nope.shape
    zp = bool(zero_padding) and out.shape[1] > H
    heads_written = out.shape[1] if zp else H
    n_rows = T * heads_written
    if n_rows == 0:
        return None
    strides = (ql_nope.stride(0), ql_nope.stride(1), q_pe.stride(0), q_pe.stride(1), out.stride(0), out.stride(1))
    args = (ql_nope, q_pe, out, n_rows, heads_written, H) + strides
    cx = {"D_NOPE_C": D_NOPE, "D_PE_C": D_PE, "BLOCK_R": block_rows, "ZERO_PAD": zp,
          "EVEN_ROWS": n_rows % block_rows == 0, "ROWS_I64": n_rows + block_rows >= 2**31}
    return _concat_mla_q_kernel, (triton.cdiv(n_rows, block_rows),), args, cx, DEFAULT_NUM_WARPS


def concat_mla_q_triton(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor, zero_padding: bool = False,
                        block_rows: int = DEFAULT_BLOCK_ROWS) -> torch.Tensor:
    """Launch the kernel, unchecked (:func:`mla_lab.kernels.concat_mla_q` checks the tensors); returns ``out``.

    Args:
        ql_nope, q_pe, out, zero_padding: as :func:`mla_lab.kernels.concat_mla_q`; block_rows: rows per program.

    Raises:
        RuntimeError: triton did not import. ValueError: ``block_rows`` not a power of two >= 1.
    """
    plan = _plan(ql_nope, q_pe, out, zero_padding, block_rows)
    if plan is not None:
        kernel, grid, args, cx, nw = plan
        kernel[grid](*args, **cx, num_warps=nw)
    return out


class ConcatLauncher:
    """A planned concat launch bound to three tensors; calling it relaunches the kernel (returns ``out``).

    Attributes:
        path: ``"compiled"`` (the compiled kernel's launcher), ``"jit"`` (``kernel[grid](...)``: the interpreter, or
            a Triton whose compiled handle is not usable) or ``"noop"`` (``T == 0``).
        grid, num_warps: what it launches; out: the tensor it writes.
    """

    __slots__ = ("path", "grid", "num_warps", "out", "_call")

    def __init__(self, path, grid, num_warps, out, call):
        self.path, self.grid, self.num_warps, self.out, self._call = path, grid, num_warps, out, call

    def __call__(self) -> torch.Tensor:
        self._call()
        return self.out

    def __repr__(self) -> str:
        return f"ConcatLauncher(path={self.path!r}, grid={self.grid}, num_warps={self.num_warps})"


def _runtime_knobs():
    """Triton's runtime knobs object (3.4+), or None (older Triton: hooks lived on ``CompiledKernel``)."""
    try:
        from triton import knobs

        return knobs.runtime
    except Exception:  # pragma: no cover - older triton
        return None


def _hook_active(h) -> bool:
    """A launch hook that would run: a callable (Triton <= 3.6 style), or a non-empty ``HookChain`` (newer)."""
    return h is not None and bool(getattr(h, "calls", True))


def make_concat_launcher_triton(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor,
                                zero_padding: bool = False) -> ConcatLauncher:
    """Plan, compile and launch once; return a :class:`ConcatLauncher` that relaunches with no per-call work.

    ``path == "compiled"`` calls ``CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata, None,
    None, None, *args)`` as Triton 3.3+'s ``JITFunction.run`` (``triton/runtime/jit.py``) does (a launcher that
    rejects it falls back to ``jit``), reading the stream per call (capturable by ``torch.cuda.graph``) and going
    through ``kernel[grid](...)`` while a launch hook (a profiler) is set. Bound to these tensors and the current
    device; tensors as :func:`concat_mla_q_triton` (not validated here).

    Raises:
        RuntimeError: triton did not import.
    """
    plan = _plan(ql_nope, q_pe, out, zero_padding)
    if plan is None:
        return ConcatLauncher("noop", (0,), 0, out, lambda: None)
    kernel, grid, args, cx, nw = plan

    def jit_call(kernel=kernel, grid=grid, args=args, cx=cx, nw=nw):
        kernel[grid](*args, **cx, num_warps=nw)

    compiled = kernel[grid](*args, **cx, num_warps=nw)  # compile (or hit the cache) and write out once
    full = args + tuple(cx.values())
    fast = None
    if not triton_interpreting() and all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        try:
            from triton.runtime import driver

            get_stream = driver.active.get_current_stream
            dev = out.device.index if out.device.index is not None else torch.cuda.current_device()
            run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
            g0 = grid[0]
            rt = _runtime_knobs() or getattr(getattr(triton, "compiler", None), "CompiledKernel", None)
            active = _hook_active

            def fast(run=run, function=function, packed=packed, g0=g0, full=full, dev=dev, rt=rt):
                if rt is not None and (active(rt.launch_enter_hook) or active(rt.launch_exit_hook)):
                    return jit_call()  # a profiler's hook is set: let Triton's own path call it
                run(g0, 1, 1, get_stream(dev), function, packed, None, None, None, *full)

            fast()  # a launcher that rejects the arguments raises here, before anything is relied on
        except Exception:
            fast = None
    if fast is not None:
        return ConcatLauncher("compiled", grid, nw, out, fast)
    return ConcatLauncher("jit", grid, nw, out, jit_call)
