"""Triton kernels for vLLM's ``concat_mla_q``: ``[T,H,512]`` + ``[T,H,64]`` -> first ``H`` heads of ``[T,H',576]``.

Variants: **v2** (default, "rows": ``BLOCK_R`` (token, head) rows per program, tiles ``[BLOCK_R, 512]`` +
``[BLOCK_R, 64]`` both loaded before either is stored), **v3** ("token runs": a token block x ``HEAD_TILES`` tiles
of ``BLOCK_H`` heads, tile ``i + 1`` loaded before tile ``i`` is stored); v4 / v5 in
:mod:`.triton_concat_persistent`. v2 stays the fastest into the padded workspace on the H200 (93.7-94.4 % of a
same-byte copy: ``data/measured/h200/between_process/concat_round4.csv``; docs/perf-notes.md "Round 3: concat",
"Round 4"). :func:`make_concat_launcher_triton` compiles once and calls the compiled launcher directly (CUDA-graph
capturable). Under ``TRITON_INTERPRET=1`` the kernels run on CPU tensors.
"""

from __future__ import annotations

import torch

from .reference import D_NOPE, D_PE
from .triton_concat_persistent import _knobs, _pow2, plan_v4, plan_v5

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

#: Kernel variants; v2 the default: no other beat it on the H200 (rounds 3-4, docs/perf-notes.md).
VARIANTS = ("v2", "v3", "v4", "v5")
DEFAULT_VARIANT = "v2"

#: v2: rows ((token, head) pairs) and warps per program: 2 rows / 1 warp beat every other setting at the 15 shapes
#: with T >= 4096 (data/measured/h200/concat_bench_tune.csv; docs/perf-notes.md).
DEFAULT_BLOCK_ROWS = 2
DEFAULT_NUM_WARPS = 1
_V2_DEFAULTS = {"block_rows": DEFAULT_BLOCK_ROWS, "num_warps": DEFAULT_NUM_WARPS}

#: The knobs each variant reads (``streaming``, loads ``evict_first`` and stores ``.cs``, applies to all); any other
#: knob given is refused, so nothing is silently ignored.
KNOBS = {"v2": ("block_rows", "num_warps"), "v3": ("block_t", "block_h", "head_tiles", "num_warps"),
         "v4": ("block_rows", "num_warps", "progs_per_sm", "order"), "v5": ("block_t", "num_warps", "progs_per_sm")}
_CONFIG_KEYS = sorted({"streaming", *(k for ks in KNOBS.values() for k in ks)})

#: v3 defaults: a tile of 1 token x 2 heads (v2's winning per-warp tile), up to 8 tiles per program (a run of 16
#: heads: one whole token at H <= 16), 1 warp.
V3_DEFAULTS = {"block_t": 1, "block_h": 2, "num_warps": 1}
V3_MAX_HEAD_TILES = 8


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


def v3_config(H: int, heads_written: int, block_t: int | None = None, block_h: int | None = None,
              head_tiles: int | None = None, num_warps: int | None = None) -> dict:
    """v3's ``{"block_t", "block_h", "head_tiles", "num_warps", "num_runs"}`` for ``H`` real heads and
    ``heads_written`` (H, or H' with ``zero_padding``); None = :data:`V3_DEFAULTS` (``head_tiles``: enough to
    cover ``heads_written``, at most :data:`V3_MAX_HEAD_TILES`); ``num_runs`` = head runs per token block.

    Raises:
        ValueError: ``block_t`` / ``block_h`` / ``num_warps`` not a power of two, or ``head_tiles`` < 1.
    """
    bt, bh, nw = _knobs({"block_t": block_t, "block_h": block_h, "num_warps": num_warps}, V3_DEFAULTS).values()
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


def _plan(ql_nope, q_pe, out, zero_padding, variant, config: dict):
    """``(kernel, grid, args, constexprs, num_warps)`` for one call, or None when there is nothing to write.

    ``args``: the runtime arguments in signature order; ``constexprs``: a dict in signature order (every kernel
    declares its constexprs after its runtime arguments; :func:`make_concat_launcher_triton` relies on it)."""
    if triton is None:
        raise RuntimeError(f"triton is not available: {_TRITON_IMPORT_ERROR}")
    _check_knobs(variant, config)
    T, H, _ = ql_nope.shape
    Hp = out.shape[1]
    zp = bool(zero_padding) and Hp > H
    heads_written = Hp if zp else H
    if T * heads_written == 0:
        return None
    streaming = bool(config.get("streaming", False))
    hints = {"LOAD_EVICT": "evict_first" if streaming else "", "STORE_CACHE": ".cs" if streaming else ""}
    strides = (ql_nope.stride(0), ql_nope.stride(1), q_pe.stride(0), q_pe.stride(1), out.stride(0), out.stride(1))
    if variant != "v2":
        plan = {"v3": _plan_v3, "v4": plan_v4, "v5": plan_v5}[variant]
        return plan(ql_nope, q_pe, out, zp, heads_written, strides, hints, config)
    br, nw = _knobs(config, _V2_DEFAULTS).values()
    n_rows = T * heads_written
    grid = (triton.cdiv(n_rows, br),)
    args = (ql_nope, q_pe, out, n_rows, heads_written, H) + strides
    cx = {"D_NOPE_C": D_NOPE, "D_PE_C": D_PE, "BLOCK_R": br, "ZERO_PAD": zp, "EVEN_ROWS": n_rows % br == 0,
          "ROWS_I64": n_rows + br >= 2**31, **hints}
    return _concat_mla_q_kernel, grid, args, cx, nw


def _check_knobs(variant: str, config: dict) -> None:
    """Each knob given is known, one ``variant`` reads (:data:`KNOBS`) and an int (``order``: v4's string).

    Raises:
        ValueError: an unknown variant or knob, or the first knob that breaks a rule (named with its value).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not known; allowed: {list(VARIANTS)}")
    bad = sorted(set(config) - set(_CONFIG_KEYS))
    if bad:
        raise ValueError(f"config key(s) {bad} not known; allowed: {_CONFIG_KEYS}")
    for name, v in config.items():
        if v is None or name == "streaming":
            continue
        if name not in KNOBS[variant]:
            users = [k for k, ks in KNOBS.items() if name in ks]
            raise ValueError(f"{name} applies to variant {' / '.join(map(repr, users))} only; got variant={variant!r}")
        if name != "order" and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{name} must be an int; got {name}={v!r}")


def _plan_v3(ql_nope, q_pe, out, zp, heads_written, strides, hints, config):
    """:func:`_plan` for v3 (token runs)."""
    T, H, _ = ql_nope.shape
    cfg = v3_config(H, heads_written, *(config.get(k) for k in ("block_t", "block_h", "head_tiles", "num_warps")))
    bt, bh, ht, runs = cfg["block_t"], cfg["block_h"], cfg["head_tiles"], cfg["num_runs"]
    n_prog = triton.cdiv(T, bt) * runs
    if n_prog >= 2**31:  # pragma: no cover - T >= 2**31 / runs tokens
        raise ValueError(f"T={T} gives {n_prog} programs (> 2**31 - 1); use block_t > {bt}")
    use_mask = zp or (T % bt != 0) or (heads_written % (bh * ht) != 0)
    args = (ql_nope, q_pe, out, T, H, heads_written) + strides
    cx = {"D_NOPE_C": D_NOPE, "D_PE_C": D_PE, "BLOCK_T": bt, "BLOCK_H": bh, "HEAD_TILES": ht, "NUM_RUNS": runs,
          "USE_MASK": use_mask, "PE_RUN": _pow2(ht) and ht > 1, **hints}
    return _concat_mla_q_v3_kernel, (n_prog,), args, cx, cfg["num_warps"]


def concat_mla_q_triton(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor, zero_padding: bool = False,
                        variant: str = DEFAULT_VARIANT, **config) -> torch.Tensor:
    """Launch one variant, unchecked (:func:`mla_lab.kernels.concat_mla_q` checks the tensors); returns ``out``.

    Args:
        ql_nope, q_pe, out, zero_padding: as :func:`mla_lab.kernels.concat_mla_q`; variant: one of :data:`VARIANTS`.
        **config: the variant's knobs (:data:`KNOBS`; None = default): ``block_rows`` (v2/v4: rows per program),
            ``num_warps``, ``block_t`` / ``block_h`` / ``head_tiles`` (v3: :func:`v3_config`; ``block_t`` also v5's
            tokens per tile), ``progs_per_sm`` / ``order`` (v4/v5: :mod:`.triton_concat_persistent`), ``streaming``.

    Raises:
        RuntimeError: triton did not import.
        ValueError: unknown ``variant`` or knob; a knob the variant does not read or not an int; a block size not a
            power of two; what v5 cannot run.
    """
    plan = _plan(ql_nope, q_pe, out, zero_padding, variant, config)
    if plan is not None:
        kernel, grid, args, cx, nw = plan
        kernel[grid](*args, **cx, num_warps=nw)
    return out


class ConcatLauncher:
    """A planned concat launch bound to three tensors; calling it relaunches the kernel (returns ``out``).

    Attributes:
        path: ``"compiled"`` (the compiled kernel's launcher), ``"jit"`` (``kernel[grid](...)``: the interpreter, or
            a Triton whose compiled handle is not usable) or ``"noop"`` (``T == 0``).
        variant, grid, num_warps, constexprs: what it launches; out: the tensor it writes.
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


def make_concat_launcher_triton(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor,
                                zero_padding: bool = False, variant: str = DEFAULT_VARIANT,
                                force_path: str | None = None, **config) -> ConcatLauncher:
    """Plan, compile and launch once; return a :class:`ConcatLauncher` that relaunches with no per-call work.

    ``path == "compiled"`` calls ``CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata, None,
    None, None, *args)`` as Triton 3.3+'s ``JITFunction.run`` (``triton/runtime/jit.py``) does (a launcher that
    rejects it falls back to ``jit``), reading the stream per call (capturable by ``torch.cuda.graph``) and going
    through ``kernel[grid](...)`` while a launch hook (a profiler) is set. Bound to these tensors and the current
    device. ``force_path``: None (best available) or ``"jit"`` (for A/B timing and tests); the rest as
    :func:`concat_mla_q_triton` (tensors not validated here).

    Raises:
        RuntimeError: triton did not import. ValueError: as :func:`concat_mla_q_triton`; unknown ``force_path``.
    """
    if force_path not in (None, "jit"):
        raise ValueError(f"force_path={force_path!r} is not known; allowed: [None, 'jit']")
    plan = _plan(ql_nope, q_pe, out, zero_padding, variant, config)
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
