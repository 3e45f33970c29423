"""Triton kernels for vLLM's ``concat_mla_q``: ``[T,H,512]`` + ``[T,H,64]`` -> first ``H`` heads of ``[T,H',576]``.

Four variants (``variant=``): v2 and v3 here, v4 (persistent spans) and v5 (spans + TMA stores) in
:mod:`.triton_concat_persistent`. On the H200 v2 stays the fastest into the padded workspace (round 4:
93.7-94.4 % of a contiguous copy of the same bytes; ``data/measured/h200/between_process/concat_round4.csv``); the
design and every round's numbers are in docs/perf-notes.md ("Round 3: concat", "Round 4").

- **v2** (default, "rows"): the ``T*H`` (token, head) pairs flattened into rows; one program copies ``BLOCK_R``
  rows (default 2 x 1 warp) as two power-of-two tiles ``[BLOCK_R, 512]`` + ``[BLOCK_R, 64]``, both loaded before
  either is stored; only a per-row mask (tail, padded heads); row indices int32 unless ``T * H'`` nears 2**31.
- **v3** ("token runs"): one program owns a token block and a run of consecutive heads (``HEAD_TILES`` tiles of
  ``BLOCK_H`` heads x ``BLOCK_T`` tokens), tile ``i + 1`` loaded before tile ``i`` is stored.

``zero_padding=True`` writes zeros into heads ``H..H'-1`` in the same launch. :func:`make_concat_launcher_triton`
plans and compiles once, then calls the compiled kernel's launcher directly (``CompiledKernel.run`` with the
arguments Triton 3.3+'s ``JITFunction.run`` passes), CUDA-graph capturable; under the interpreter it falls back to
``kernel[grid](...)`` (``launcher.path`` says which). Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors.
"""

from __future__ import annotations

import torch

from .triton_concat_persistent import plan_v4, plan_v5

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as e:  # pragma: no cover
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = f"{type(e).__name__}: {e}"

__all__ = ["triton_available", "triton_interpreting", "concat_mla_q_triton", "make_concat_launcher_triton",
           "ConcatLauncher", "VARIANTS", "DEFAULT_VARIANT", "DEFAULT_BLOCK_ROWS", "DEFAULT_NUM_WARPS",
           "v3_config"]

D_NOPE = 512
D_PE = 64

#: Kernel variants (see the module docstring). v2 is the default: no other variant beat it on the H200 (rounds 3-4,
#: docs/perf-notes.md).
VARIANTS = ("v2", "v3", "v4", "v5")
DEFAULT_VARIANT = "v2"

#: v2: rows ((token, head) pairs) per program and warps per program. v1: 16 rows / 4 warps (chosen before measuring).
#: GPU run 1's sweep -> 4 rows / 4 warps (v2 as measured in run 2's main table). GPU run 2's sweep of 17 variants at
#: all 20 shapes (data/measured/h200/concat_bench_tune.csv) found 2 rows / 1 warp faster than 4 x 4 at each of the
#: 15 shapes with T >= 4096 (by 0.6-1.9 points of the copy ceiling; 91.4-100% of it), so that is the default now:
#: 2.25 KiB read + 2.25 KiB written per 32-thread program. See docs/perf-notes.md.
DEFAULT_BLOCK_ROWS = 2
DEFAULT_NUM_WARPS = 1

#: The knobs each variant reads (``streaming`` applies to all: v5 uses only its evict_first loads); any other knob
#: given is refused, so nothing is silently ignored.
KNOBS = {"v2": ("block_rows", "num_warps"), "v3": ("block_t", "block_h", "head_tiles", "num_warps"),
         "v4": ("block_rows", "num_warps", "progs_per_sm", "order"), "v5": ("block_t", "num_warps", "progs_per_sm")}

#: v3 defaults: a tile of 1 token x 2 heads (the per-warp tile size that won v2's sweep: 2 rows per warp), up to
#: 8 tiles per program (a run of up to 16 heads: one whole token at H <= 16), 1 warp.
V3_BLOCK_T = 1
V3_BLOCK_H = 2
V3_MAX_HEAD_TILES = 8
V3_NUM_WARPS = 1


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


def _pow2(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def v3_config(H: int, heads_written: int, block_t: int | None = None, block_h: int | None = None,
              head_tiles: int | None = None, num_warps: int | None = None) -> dict:
    """v3 launch configuration for ``H`` real heads and ``heads_written`` (H, or H' with ``zero_padding``).

    None fields take the defaults (:data:`V3_BLOCK_T`, :data:`V3_BLOCK_H`, ``head_tiles`` = enough tiles to cover
    ``heads_written`` capped at :data:`V3_MAX_HEAD_TILES`, :data:`V3_NUM_WARPS`).

    Returns:
        ``{"block_t", "block_h", "head_tiles", "num_warps", "num_runs"}``; ``num_runs`` = head runs per token
        block (``ceil(heads_written / (block_h * head_tiles))``).

    Raises:
        ValueError: ``block_t``/``block_h``/``num_warps`` not a power of two, or ``head_tiles`` < 1.
    """
    bt = V3_BLOCK_T if block_t is None else int(block_t)
    bh = V3_BLOCK_H if block_h is None else int(block_h)
    nw = V3_NUM_WARPS if num_warps is None else int(num_warps)
    for name, v in (("block_t", bt), ("block_h", bh), ("num_warps", nw)):
        if not _pow2(v):
            raise ValueError(f"{name} must be a power of two >= 1; got {name}={v}")
    ht = min(V3_MAX_HEAD_TILES, -(-max(1, heads_written) // bh)) if head_tiles is None else int(head_tiles)
    if ht < 1:
        raise ValueError(f"head_tiles must be >= 1; got head_tiles={ht}")
    return {"block_t": bt, "block_h": bh, "head_tiles": ht, "num_warps": nw,
            "num_runs": -(-max(1, heads_written) // (bh * ht))}


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

    @triton.jit
    def _v3_ld(ptr, tok, head, T, real_heads, st, sh, D: tl.constexpr, USE_MASK: tl.constexpr,
               LOAD_EVICT: tl.constexpr):
        src = ptr + (tok.to(tl.int64) * st + head.to(tl.int64) * sh)[:, None] + tl.arange(0, D)[None, :]
        if USE_MASK:
            return tl.load(src, mask=((tok < T) & (head < real_heads))[:, None], other=0.0,
                           eviction_policy=LOAD_EVICT)
        return tl.load(src, eviction_policy=LOAD_EVICT)

    @triton.jit
    def _v3_st(out_ptr, tok, head, T, heads_written, out_st, out_sh, v, COL0: tl.constexpr, D: tl.constexpr,
               USE_MASK: tl.constexpr, STORE_CACHE: tl.constexpr):
        dst = (out_ptr + (tok.to(tl.int64) * out_st + head.to(tl.int64) * out_sh)[:, None] + COL0
               + tl.arange(0, D)[None, :])
        if USE_MASK:
            tl.store(dst, v, mask=((tok < T) & (head < heads_written))[:, None], cache_modifier=STORE_CACHE)
        else:
            tl.store(dst, v, cache_modifier=STORE_CACHE)

    @triton.jit
    def _concat_mla_q_v3_kernel(
        nope_ptr, pe_ptr, out_ptr,
        T, real_heads, heads_written,
        nope_st, nope_sh, pe_st, pe_sh, out_st, out_sh,
        D_NOPE_C: tl.constexpr, D_PE_C: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
        HEAD_TILES: tl.constexpr, NUM_RUNS: tl.constexpr, USE_MASK: tl.constexpr, PE_RUN: tl.constexpr,
        LOAD_EVICT: tl.constexpr, STORE_CACHE: tl.constexpr,
    ):
        # program -> (token block, head run); NUM_RUNS is a constexpr, so // and % are a multiply-shift
        pid = tl.program_id(0)
        tb = pid // NUM_RUNS
        run = pid - tb * NUM_RUNS
        r = tl.arange(0, BLOCK_T * BLOCK_H)
        tok = tb * BLOCK_T + r // BLOCK_H  # BLOCK_H is a power of two: a shift
        head0 = run * (BLOCK_H * HEAD_TILES) + (r % BLOCK_H)
        if PE_RUN:
            # the 64-wide part of the whole run in one tile (HEAD_TILES a power of two): >= 16 B per thread, so
            # 16-byte vectors (a 2-row [2, 64] tile over 32 threads is 8 B per thread: 8-byte vectors)
            r2 = tl.arange(0, BLOCK_T * BLOCK_H * HEAD_TILES)
            tok2 = tb * BLOCK_T + r2 // (BLOCK_H * HEAD_TILES)
            head2 = run * (BLOCK_H * HEAD_TILES) + r2 % (BLOCK_H * HEAD_TILES)
            vp_run = _v3_ld(pe_ptr, tok2, head2, T, real_heads, pe_st, pe_sh, D_PE_C, USE_MASK, LOAD_EVICT)
            # tile i + 1 is loaded before tile i is stored (the compiler keeps the order written: out may alias)
            vn = _v3_ld(nope_ptr, tok, head0, T, real_heads, nope_st, nope_sh, D_NOPE_C, USE_MASK, LOAD_EVICT)
            for i in tl.static_range(1, HEAD_TILES):
                nn = _v3_ld(nope_ptr, tok, head0 + i * BLOCK_H, T, real_heads, nope_st, nope_sh, D_NOPE_C,
                            USE_MASK, LOAD_EVICT)
                _v3_st(out_ptr, tok, head0 + (i - 1) * BLOCK_H, T, heads_written, out_st, out_sh, vn, 0, D_NOPE_C,
                       USE_MASK, STORE_CACHE)
                vn = nn
            _v3_st(out_ptr, tok, head0 + (HEAD_TILES - 1) * BLOCK_H, T, heads_written, out_st, out_sh, vn, 0,
                   D_NOPE_C, USE_MASK, STORE_CACHE)
            _v3_st(out_ptr, tok2, head2, T, heads_written, out_st, out_sh, vp_run, D_NOPE_C, D_PE_C, USE_MASK,
                   STORE_CACHE)
        else:
            vn = _v3_ld(nope_ptr, tok, head0, T, real_heads, nope_st, nope_sh, D_NOPE_C, USE_MASK, LOAD_EVICT)
            vp = _v3_ld(pe_ptr, tok, head0, T, real_heads, pe_st, pe_sh, D_PE_C, USE_MASK, LOAD_EVICT)
            for i in tl.static_range(1, HEAD_TILES):
                h = head0 + i * BLOCK_H
                nn = _v3_ld(nope_ptr, tok, h, T, real_heads, nope_st, nope_sh, D_NOPE_C, USE_MASK, LOAD_EVICT)
                npe = _v3_ld(pe_ptr, tok, h, T, real_heads, pe_st, pe_sh, D_PE_C, USE_MASK, LOAD_EVICT)
                hp = head0 + (i - 1) * BLOCK_H
                _v3_st(out_ptr, tok, hp, T, heads_written, out_st, out_sh, vn, 0, D_NOPE_C, USE_MASK, STORE_CACHE)
                _v3_st(out_ptr, tok, hp, T, heads_written, out_st, out_sh, vp, D_NOPE_C, D_PE_C, USE_MASK,
                       STORE_CACHE)
                vn = nn
                vp = npe
            hl = head0 + (HEAD_TILES - 1) * BLOCK_H
            _v3_st(out_ptr, tok, hl, T, heads_written, out_st, out_sh, vn, 0, D_NOPE_C, USE_MASK, STORE_CACHE)
            _v3_st(out_ptr, tok, hl, T, heads_written, out_st, out_sh, vp, D_NOPE_C, D_PE_C, USE_MASK, STORE_CACHE)


def _plan(ql_nope, q_pe, out, zero_padding, variant, block_rows, num_warps, streaming, block_t, block_h,
          head_tiles, progs_per_sm=None, order=None):
    """``(kernel, grid, args, constexprs, num_warps)`` for one call, or None when there is nothing to write.

    ``args`` are the runtime arguments in signature order; ``constexprs`` a dict in signature order (the kernels
    declare every constexpr after every runtime argument; :func:`make_concat_launcher_triton` relies on it)."""
    if triton is None:
        raise RuntimeError(f"triton is not available: {_TRITON_IMPORT_ERROR}")
    _check_knobs(variant, {"block_rows": block_rows, "num_warps": num_warps, "block_t": block_t, "block_h": block_h,
                           "head_tiles": head_tiles, "progs_per_sm": progs_per_sm}, order)
    T, H, _ = ql_nope.shape
    Hp = out.shape[1]
    zp = bool(zero_padding) and Hp > H
    heads_written = Hp if zp else H
    if T * heads_written == 0:
        return None
    strides = (ql_nope.stride(0), ql_nope.stride(1), q_pe.stride(0), q_pe.stride(1), out.stride(0), out.stride(1))
    hints = {"LOAD_EVICT": "evict_first" if streaming else "", "STORE_CACHE": ".cs" if streaming else ""}
    if variant == "v4":
        return plan_v4(ql_nope, q_pe, out, zero_padding, hints,
                       {"block_rows": block_rows, "num_warps": num_warps, "progs_per_sm": progs_per_sm,
                        "order": order})
    if variant == "v5":
        return plan_v5(ql_nope, q_pe, out, zero_padding, hints,
                       {"block_t": block_t, "num_warps": num_warps, "progs_per_sm": progs_per_sm})
    if variant == "v2":
        br = DEFAULT_BLOCK_ROWS if block_rows is None else int(block_rows)
        nw = DEFAULT_NUM_WARPS if num_warps is None else int(num_warps)
        n_rows = T * heads_written
        grid = (triton.cdiv(n_rows, br),)
        args = (ql_nope, q_pe, out, n_rows, heads_written, H) + strides
        cx = {"D_NOPE_C": D_NOPE, "D_PE_C": D_PE, "BLOCK_R": br, "ZERO_PAD": zp, "EVEN_ROWS": n_rows % br == 0,
              "ROWS_I64": n_rows + br >= 2**31, **hints}
        return _concat_mla_q_kernel, grid, args, cx, nw
    return _plan_v3(ql_nope, q_pe, out, zp, heads_written, strides, hints, (block_t, block_h, head_tiles, num_warps))


def _check_knobs(variant: str, knobs: dict, order) -> None:
    """Each knob given is one ``variant`` reads (:data:`KNOBS`) and an int; ``order`` only for v4.

    Raises:
        ValueError: an unknown variant, or the first knob that breaks a rule (named with its value).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not known; allowed: {list(VARIANTS)}")
    for name, v in knobs.items():
        if v is not None and name not in KNOBS[variant]:
            users = [k for k, ks in KNOBS.items() if name in ks]
            raise ValueError(f"{name} applies to variant {' / '.join(map(repr, users))} only; got variant={variant!r}")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{name} must be an int; got {name}={v!r}")
    if order is not None and "order" not in KNOBS[variant]:
        raise ValueError(f"order applies to variant 'v4' only; got variant={variant!r}")


def _plan_v3(ql_nope, q_pe, out, zp, heads_written, strides, hints, knobs):
    """:func:`_plan` for v3 (token runs); ``knobs``: ``(block_t, block_h, head_tiles, num_warps)``."""
    T, H, _ = ql_nope.shape
    cfg = v3_config(H, heads_written, *knobs)
    bt, bh, ht, runs = cfg["block_t"], cfg["block_h"], cfg["head_tiles"], cfg["num_runs"]
    n_prog = triton.cdiv(T, bt) * runs
    if n_prog >= 2**31:  # pragma: no cover - T >= 2**31 / runs tokens
        raise ValueError(f"T={T} gives {n_prog} programs (> 2**31 - 1); use block_t > {bt}")
    use_mask = zp or (T % bt != 0) or (heads_written % (bh * ht) != 0)
    args = (ql_nope, q_pe, out, T, H, heads_written) + strides
    cx = {"D_NOPE_C": D_NOPE, "D_PE_C": D_PE, "BLOCK_T": bt, "BLOCK_H": bh, "HEAD_TILES": ht, "NUM_RUNS": runs,
          "USE_MASK": use_mask, "PE_RUN": _pow2(ht) and ht > 1, **hints}
    return _concat_mla_q_v3_kernel, (n_prog,), args, cx, cfg["num_warps"]


def concat_mla_q_triton(
    ql_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
    zero_padding: bool = False,
    block_rows: int | None = None,
    num_warps: int | None = None,
    streaming: bool = False,
    variant: str = DEFAULT_VARIANT,
    block_t: int | None = None,
    block_h: int | None = None,
    head_tiles: int | None = None,
    progs_per_sm: int | None = None,
    order: str | None = None,
) -> torch.Tensor:
    """Launch one variant of the kernel (no validation: :func:`mla_lab.kernels.concat_mla_q` validates).

    Args:
        ql_nope: ``[T, H, 512]``; q_pe: ``[T, H, 64]``; out: ``[T, H', 576]``, H' >= H; one dtype (fp16/bf16),
            last dims contiguous, any token/head strides.
        zero_padding: also write zeros into heads ``H..H'-1`` of ``out`` (same launch).
        block_rows: v2 only: (token, head) rows per program, a power of two (default :data:`DEFAULT_BLOCK_ROWS`).
        num_warps: warps per program (default :data:`DEFAULT_NUM_WARPS` for v2, :data:`V3_NUM_WARPS` for v3).
        streaming: cache hints for data touched once (loads ``evict_first``, stores ``.cs``); off by default.
        variant: ``"v2"`` (rows), ``"v3"`` (token runs), ``"v4"`` (persistent spans) or ``"v5"`` (spans + TMA
            stores; refuses ``zero_padding`` and H not a power of two <= 32 with ValueError); see the module
            docstring.
        block_t, block_h, head_tiles: v3 only: tokens and heads per tile (powers of two) and tiles per program
            (see :func:`v3_config`; None = defaults); ``block_t`` is also v5's tokens per tile.
        progs_per_sm, order: v4/v5 only: programs per multiprocessor of the persistent grid, and v4's chunk order
            (``"span"`` | ``"stride"``) (:mod:`.triton_concat_persistent`).

    Returns:
        ``out``. ``T == 0`` launches nothing.

    Raises:
        RuntimeError: triton did not import.
        ValueError: unknown ``variant``; a knob the variant does not read (:data:`KNOBS`) or not an int; a block
            size not a power of two; what v5 cannot run.
    """
    plan = _plan(ql_nope, q_pe, out, zero_padding, variant, block_rows, num_warps, streaming, block_t, block_h,
                 head_tiles, progs_per_sm, order)
    if plan is not None:
        kernel, grid, args, cx, nw = plan
        kernel[grid](*args, **cx, num_warps=nw)
    return out


class ConcatLauncher:
    """A planned concat launch bound to three tensors; calling it relaunches the kernel (returns ``out``).

    Attributes:
        path: ``"compiled"`` (calls the compiled kernel's launcher directly), ``"jit"`` (``kernel[grid](...)``
            with the precomputed arguments: the interpreter, or a Triton whose compiled handle is not usable here),
            or ``"noop"`` (nothing to write: ``T == 0``).
        variant, grid, num_warps, constexprs: what it launches.
        out: the output tensor it writes.
    """

    __slots__ = ("path", "variant", "grid", "num_warps", "constexprs", "out", "_call")

    def __init__(self, path, variant, grid, num_warps, constexprs, out, call):
        self.path, self.variant, self.grid, self.num_warps = path, variant, grid, num_warps
        self.constexprs, self.out, self._call = constexprs, out, call

    def __call__(self) -> torch.Tensor:
        self._call()
        return self.out

    def __repr__(self) -> str:
        return (f"ConcatLauncher(path={self.path!r}, variant={self.variant!r}, grid={self.grid}, "
                f"num_warps={self.num_warps})")


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


def make_concat_launcher_triton(
    ql_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
    zero_padding: bool = False,
    variant: str = DEFAULT_VARIANT,
    force_path: str | None = None,
    **config,
) -> ConcatLauncher:
    """Plan, compile and launch once; return a :class:`ConcatLauncher` that relaunches with no per-call work.

    The hot path (``path == "compiled"``) calls ``CompiledKernel.run(grid0, grid1, grid2, stream, function,
    packed_metadata, None, None, None, *args)``: the call Triton 3.3+'s ``JITFunction.run``
    (``triton/runtime/jit.py``) makes after its binder and cache lookup, with every kernel argument in signature
    order (Triton < 3.3 passed only the runtime arguments; the kernels declare their constexprs last, so those
    versions bind the same runtime arguments; a launcher that rejects the argument count falls back to ``jit``).
    The stream is read on every call (``triton.runtime.driver.active.get_current_stream``), so a launcher made
    before ``torch.cuda.graph`` capture is captured on the capture stream. If a Triton launch hook is set
    (e.g. a profiler) the call goes through ``kernel[grid](...)`` so the hook sees it.

    Call it on the device that was current when it was made. It is bound to these tensors (their data pointers,
    shapes and strides): make a new one for other tensors.

    Args:
        ql_nope, q_pe, out, zero_padding: as :func:`concat_mla_q_triton` (not validated here).
        variant: one of :data:`VARIANTS`.
        force_path: None (best available), or ``"jit"`` to force the fallback (for A/B timing and tests).
        **config: the variant's knobs (``block_rows``, ``num_warps``, ``streaming``, ``block_t``, ``block_h``,
            ``head_tiles``, ``progs_per_sm``, ``order``).

    Returns:
        a :class:`ConcatLauncher`; ``out`` has already been written once.

    Raises:
        RuntimeError: triton did not import.
        ValueError: unknown ``variant``, config key or ``force_path``.
    """
    allowed = {"block_rows", "num_warps", "streaming", "block_t", "block_h", "head_tiles", "progs_per_sm", "order"}
    bad = sorted(set(config) - allowed)
    if bad:
        raise ValueError(f"config key(s) {bad} not known; allowed: {sorted(allowed)}")
    if force_path not in (None, "jit"):
        raise ValueError(f"force_path={force_path!r} is not known; allowed: [None, 'jit']")
    plan = _plan(ql_nope, q_pe, out, zero_padding, variant, config.get("block_rows"), config.get("num_warps"),
                 bool(config.get("streaming", False)), config.get("block_t"), config.get("block_h"),
                 config.get("head_tiles"), config.get("progs_per_sm"), config.get("order"))
    if plan is None:
        return ConcatLauncher("noop", variant, (0,), 0, {}, out, lambda: None)
    kernel, grid, args, cx, nw = plan

    def jit_call(kernel=kernel, grid=grid, args=args, cx=cx, nw=nw):
        kernel[grid](*args, **cx, num_warps=nw)

    compiled = kernel[grid](*args, **cx, num_warps=nw)  # compile (or hit the cache) and write out once
    full = args + tuple(cx.values())
    fast = None
    if force_path is None and not triton_interpreting() and all(
            hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
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
        return ConcatLauncher("compiled", variant, grid, nw, cx, out, fast)
    return ConcatLauncher("jit", variant, grid, nw, cx, out, jit_call)
