"""Kernels of the sparse-MLA prefill Q path: Q concat into a head-padded workspace, and sparse prefill attention.

Public API:

- :func:`concat_mla_q` — vLLM's ``concat_mla_q`` op (``vllm/v1/attention/backends/mla/flashmla_sparse.py``,
  PR #53878): ``ql_nope [T,H,512]`` and ``q_pe [T,H,64]`` into the first ``H`` heads of ``out [T,H',576]``.
  Backends: ``triton`` (:mod:`.triton_concat`) and ``torch`` (:mod:`.reference`).
- :func:`make_concat_launcher` — the same op's hot path: validate once, return a callable that relaunches the compiled
  Triton kernel with no per-call checks (CUDA-graph capturable), or the torch op on CPU.
- :func:`sparse_mla_prefill` — FlashMLA's ``flash_mla_sparse_fwd`` on a head-padded ``q``, output sliced back to
  the real heads as vLLM's ``_bf16_flash_mla_kernel`` does. Backends: ``flash_mla`` (:mod:`.flashmla`) and
  ``reference`` (FlashMLA ``tests/ref.py`` math, :func:`.reference.sparse_mla_prefill_ref`).
- :func:`last_backend` — which backend the last call of each op ran (for benchmark and sweep rows).
- :func:`flash_mla_info`, :func:`validate_sparse_prefill_inputs` — re-exported from :mod:`.flashmla`.
- :func:`build_union` (Triton) / :func:`build_union_ref` (torch) — per group of ``g`` consecutive tokens, the union
  of their top-k sets split into ``shared`` keys and ``rest`` keys with a g-bit mask (:class:`UnionSets`), for the
  packed prefill kernel; :func:`union_buffer_bytes`, :func:`union_caps`, :func:`union_scratch` (:mod:`.union`;
  timed by ``python -m mla_lab.kernels.union_bench``).
- Index data with known overlap (:mod:`.index_sets`): :func:`overlap_indices`, :func:`causal_indices`,
  :func:`structured_indices`, :func:`union_sizes`, :func:`overlap_union_expected`, :func:`union_ratio_common_core`,
  :func:`published_overlaps`.

Constants: 512 = ``kv_lora_rank``, 64 = ``qk_rope_head_dim``, 576 = head_size (GLM-5 / DeepSeek-V3.2 config.json;
vLLM flashmla_sparse.py); d_v 512, d_qk 576/512, h_q 64/128 and the topk multiples come from FlashMLA
``csrc/api/sparse_fwd.h`` and its kernels.
"""

from __future__ import annotations

import torch

from .flashmla import flash_mla_info, flash_mla_sparse_prefill, validate_sparse_prefill_inputs
from .index_sets import (
    IndexData,
    UnionSizeSummary,
    causal_indices,
    overlap_indices,
    overlap_union_expected,
    published_overlaps,
    structured_indices,
    union_ratio_common_core,
    union_sizes,
)
from .reference import D_NOPE, D_PE, D_QK, concat_mla_q_torch, sparse_mla_prefill_ref
from .triton_concat import DEFAULT_VARIANT as CONCAT_DEFAULT_VARIANT
from .triton_concat import VARIANTS as CONCAT_VARIANTS
from .triton_concat import (
    ConcatLauncher,
    concat_mla_q_triton,
    make_concat_launcher_triton,
    triton_available,
    triton_interpreting,
)
from .union import (
    UNION_GROUP_SIZES,
    UnionSets,
    build_union,
    build_union_ref,
    union_buffer_bytes,
    union_caps,
    union_scratch,
)

__all__ = [
    "concat_mla_q", "make_concat_launcher", "ConcatLauncher", "CONCAT_VARIANTS", "CONCAT_DEFAULT_VARIANT",
    "sparse_mla_prefill", "last_backend", "flash_mla_info", "validate_sparse_prefill_inputs",
    "concat_mla_q_torch", "sparse_mla_prefill_ref", "triton_available", "CONCAT_BACKENDS", "PREFILL_BACKENDS",
    "CONCAT_DTYPES", "D_NOPE", "D_PE", "D_QK",
    "UnionSets", "build_union", "build_union_ref", "union_buffer_bytes", "union_caps", "union_scratch",
    "UNION_GROUP_SIZES", "IndexData", "UnionSizeSummary", "overlap_indices", "overlap_union_expected",
    "causal_indices", "structured_indices", "union_sizes", "union_ratio_common_core", "published_overlaps",
]

CONCAT_BACKENDS = ("auto", "torch", "triton")
PREFILL_BACKENDS = ("auto", "flash_mla", "reference")
CONCAT_DTYPES = (torch.float16, torch.bfloat16)
_REF_PREFILL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_LAST: dict[str, str] = {}


def last_backend(op: str | None = None):
    """Backend the most recent call ran, per op (process-wide, not thread-local).

    Args:
        op: ``"concat_mla_q"`` or ``"sparse_mla_prefill"``; None returns a dict of both (missing = never called).

    Returns:
        ``"triton"`` | ``"torch"`` for concat, ``"flash_mla"`` | ``"reference"`` for prefill, or None if the op has
        not run; with ``op=None`` a copy of the dict.

    Raises:
        ValueError: unknown op.
    """
    if op is None:
        return dict(_LAST)
    if op not in ("concat_mla_q", "sparse_mla_prefill"):
        raise ValueError(f"op={op!r} is not known; allowed: ['concat_mla_q', 'sparse_mla_prefill', None]")
    return _LAST.get(op)


# --------------------------------------------------------------------------------------------------- concat_mla_q


def _shape(t) -> tuple:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _concat_fast_ok(a, b, o) -> bool:
    """The common valid case with few attribute reads (this op runs once per layer per step; the detailed checks
    below only run when this says no, to find the rule that failed)."""
    try:
        sa, sb, so = a.shape, b.shape, o.shape
        dt = a.dtype
        return (len(sa) == 3 and len(sb) == 3 and len(so) == 3 and sa[2] == D_NOPE and sb[2] == D_PE
                and so[2] == D_QK and sa[0] == sb[0] == so[0] and sa[1] == sb[1] and so[1] >= sa[1]
                and (dt is torch.bfloat16 or dt is torch.float16) and b.dtype is dt and o.dtype is dt
                and a.stride(2) == 1 and b.stride(2) == 1 and o.stride(2) == 1 and a.device == b.device == o.device)
    except (AttributeError, TypeError):
        return False


def _validate_concat(ql_nope, q_pe, out) -> None:
    if _concat_fast_ok(ql_nope, q_pe, out):
        return
    for name, t in (("ql_nope", ql_nope), ("q_pe", q_pe), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [T, heads, dim]; got {name}.shape={_shape(t)}")
    for name, t, d in (("ql_nope", ql_nope, D_NOPE), ("q_pe", q_pe, D_PE), ("out", out, D_QK)):
        if t.shape[-1] != d:
            raise ValueError(f"{name}.shape[-1] must be {d}; got {name}.shape={_shape(t)}")
    T, H = ql_nope.shape[0], ql_nope.shape[1]
    if q_pe.shape[0] != T or q_pe.shape[1] != H:
        raise ValueError(f"q_pe.shape[:2] must equal ql_nope.shape[:2]={(T, H)}; got q_pe.shape={_shape(q_pe)}")
    if out.shape[0] != T:
        raise ValueError(f"out.shape[0] must equal T={T} (ql_nope.shape[0]); got out.shape={_shape(out)}")
    if out.shape[1] < H:
        raise ValueError(f"out.shape[1] (padded heads) must be >= H={H}; got out.shape={_shape(out)}")
    for name, t in (("ql_nope", ql_nope), ("q_pe", q_pe), ("out", out)):
        if t.dtype not in CONCAT_DTYPES:
            raise ValueError(f"{name}.dtype must be one of [torch.float16, torch.bfloat16]; got {t.dtype}")
    if not (ql_nope.dtype == q_pe.dtype == out.dtype):
        raise ValueError(f"ql_nope, q_pe and out must share one dtype; got ql_nope.dtype={ql_nope.dtype}, "
                         f"q_pe.dtype={q_pe.dtype}, out.dtype={out.dtype}")
    for name, t in (("ql_nope", ql_nope), ("q_pe", q_pe), ("out", out)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dim must be contiguous (stride 1); got {name}.stride()={t.stride()}")
    if not (ql_nope.device == q_pe.device == out.device):
        raise ValueError(f"ql_nope, q_pe and out must be on one device; got ql_nope.device={ql_nope.device}, "
                         f"q_pe.device={q_pe.device}, out.device={out.device}")


_TRITON_OK, _TRITON_WHY = triton_available()


def _concat_backend(backend: str, device: torch.device) -> str:
    ok, why = _TRITON_OK, _TRITON_WHY
    if backend == "auto":
        return "triton" if (ok and device.type == "cuda") else "torch"
    if backend == "triton":
        if not ok:
            raise ValueError(f"backend='triton' requested but triton is unavailable: {why}")
        if device.type != "cuda" and not triton_interpreting():
            raise ValueError(f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter); "
                             f"got device={device}")
        return backend
    if backend == "torch":
        return backend
    raise ValueError(f"backend={backend!r} is not known; allowed: {list(CONCAT_BACKENDS)}")


def concat_mla_q(
    ql_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
    *,
    zero_padding: bool = False,
    backend: str = "auto",
    variant: str | None = None,
) -> torch.Tensor:
    """Write ``ql_nope`` and ``q_pe`` into the first ``H`` heads of ``out`` (vLLM ``concat_mla_q`` semantics).

    ``out[:, :H, :512] = ql_nope`` and ``out[:, :H, 512:] = q_pe``. Heads ``H..H'-1`` are left untouched (vLLM leaves
    them uninitialised: the sparse kernel computes garbage rows for them that are sliced away) unless
    ``zero_padding=True``, which writes zeros there in the same pass.

    Args:
        ql_nope: ``[T, H, 512]`` (absorbed NoPE query, ``kv_lora_rank`` wide), fp16 or bf16, last dim contiguous
            (stride 1); token and head strides arbitrary (slices and transposed views are fine). ``T`` may be 0.
        q_pe: ``[T, H, 64]`` (RoPE query, ``qk_rope_head_dim`` wide), same dtype/device, last dim contiguous.
        out: ``[T, H', 576]`` with ``H' >= H`` (the padded workspace view ``workspace[:T]``), same dtype/device,
            last dim contiguous. Written in place.
        zero_padding: also zero heads ``H..H'-1`` (default False: vLLM behaviour, padded heads untouched).
        backend: ``"auto"`` (Triton for CUDA tensors when triton imports, else torch), ``"triton"`` or ``"torch"``.
        variant: the Triton kernel variant, one of :data:`CONCAT_VARIANTS` (``"v2"`` rows, ``"v3"`` token runs,
            ``"v4"`` persistent spans, ``"v5"`` spans + TMA stores: :mod:`.triton_concat`); None =
            :data:`CONCAT_DEFAULT_VARIANT` (v2). Ignored by the torch backend.

    Returns:
        ``out``. :func:`last_backend` ``("concat_mla_q")`` tells which backend ran.

    Raises:
        ValueError: a tensor not 3-D; last dims not 512/64/576; T or H mismatch between the inputs; ``out.shape[0]``
            != T or ``out.shape[1]`` < H; dtype not fp16/bf16 or not all equal; a last dim not contiguous; tensors on
            different devices; unknown backend; ``"triton"`` requested without triton or on CPU tensors outside
            the Triton interpreter; unknown ``variant``; ``variant="v5"`` with what it cannot run (zero_padding, H not
            a power of two <= 32, ``out`` not 16-byte aligned or with strides not 16-byte multiples, a GPU below
            sm90, a Triton without host tensor descriptors). Each message names the argument, its value and what is allowed.
    """
    _validate_concat(ql_nope, q_pe, out)
    which = _concat_backend(backend, out.device)
    if variant is None:
        variant = CONCAT_DEFAULT_VARIANT
    elif variant not in CONCAT_VARIANTS:
        raise ValueError(f"variant={variant!r} is not known; allowed: {list(CONCAT_VARIANTS)} or None")
    if which == "triton":
        concat_mla_q_triton(ql_nope, q_pe, out, zero_padding=zero_padding, variant=variant)
    else:
        concat_mla_q_torch(ql_nope, q_pe, out)
        if zero_padding and out.shape[1] > ql_nope.shape[1] and out.shape[0] > 0:
            out[:, ql_nope.shape[1]:].zero_()
    _LAST["concat_mla_q"] = which
    return out


def make_concat_launcher(
    ql_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
    *,
    zero_padding: bool = False,
    backend: str = "auto",
    variant: str | None = None,
    **config,
):
    """Validate once and return a no-argument callable that performs this :func:`concat_mla_q` call again.

    The checks of :func:`concat_mla_q` run here, at the door; the callable does no per-call Python checks. With the
    Triton backend it is a :class:`ConcatLauncher` (``.path``: ``"compiled"`` = the compiled kernel's launcher
    called directly, ``"jit"`` = ``kernel[grid]`` with precomputed arguments, e.g. under the interpreter); make it
    before ``torch.cuda.graph`` capture (it compiles and writes ``out`` once) and it can be captured. It is bound to
    these three tensors (pointers, shapes, strides): when they change, make a new one. With the torch backend it
    is a closure over :func:`concat_mla_q` with ``backend="torch"`` (no fast path to offer).

    Args:
        ql_nope, q_pe, out, zero_padding, backend, variant: as :func:`concat_mla_q`.
        **config: Triton kernel knobs passed to :func:`.triton_concat.make_concat_launcher_triton`
            (``block_rows``, ``num_warps``, ``streaming``, ``block_t``, ``block_h``, ``head_tiles``, ``progs_per_sm``,
            ``order``).

    Returns:
        a callable returning ``out``; ``out`` holds the result once on return.

    Raises:
        ValueError: every rule of :func:`concat_mla_q`; an unknown config key; a knob the variant does not read
            (``triton_concat.KNOBS``) or that is not an int; a knob out of range.
    """
    _validate_concat(ql_nope, q_pe, out)
    which = _concat_backend(backend, out.device)
    if variant is None:
        variant = CONCAT_DEFAULT_VARIANT
    elif variant not in CONCAT_VARIANTS:
        raise ValueError(f"variant={variant!r} is not known; allowed: {list(CONCAT_VARIANTS)} or None")
    if which == "triton":
        launcher = make_concat_launcher_triton(ql_nope, q_pe, out, zero_padding=zero_padding, variant=variant,
                                               **config)
    else:
        if config:
            raise ValueError(f"config {sorted(config)} applies to the triton backend only; got backend={which!r}")

        def launcher():
            return concat_mla_q(ql_nope, q_pe, out, zero_padding=zero_padding, backend="torch")

        launcher()
    _LAST["concat_mla_q"] = which
    return launcher


# --------------------------------------------------------------------------------------------- sparse_mla_prefill


def _validate_prefill_common(q, kv, indices, sm_scale, d_v, topk_length, actual_num_heads) -> None:
    """Rules that hold for every backend (the reference accepts any h_q and topk)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be a 3-D tensor [s_q, h_q, d_qk]; got q.shape={_shape(q)}")
    s_q, h_q, d_qk = q.shape
    if q.dtype not in _REF_PREFILL_DTYPES:
        raise ValueError(f"q.dtype must be bfloat16 (float16/float32 accepted by the reference); got {q.dtype}")
    if not isinstance(kv, torch.Tensor) or kv.dim() not in (2, 3):
        raise ValueError(f"kv must be [s_kv, 1, d_qk] or [s_kv, d_qk]; got kv.shape={_shape(kv)}")
    if kv.dim() == 3 and kv.shape[1] != 1:
        raise ValueError(f"kv.shape[1] (h_kv) must be 1; got kv.shape={_shape(kv)}")
    if kv.shape[-1] != d_qk:
        raise ValueError(f"kv.shape[-1] must equal q.shape[-1]={d_qk}; got kv.shape={_shape(kv)}")
    if kv.dtype != q.dtype:
        raise ValueError(f"kv.dtype must equal q.dtype={q.dtype}; got kv.dtype={kv.dtype}")
    if kv.shape[0] < 1:
        raise ValueError(f"s_kv (kv.shape[0]) must be >= 1: there is no key to attend to; got kv.shape={_shape(kv)}")
    if not isinstance(indices, torch.Tensor) or indices.dim() not in (2, 3):
        raise ValueError(f"indices must be [s_q, 1, topk] or [s_q, topk]; got indices.shape={_shape(indices)}")
    if indices.dim() == 3 and indices.shape[1] != 1:
        raise ValueError(f"indices.shape[1] must be 1 (h_kv); got indices.shape={_shape(indices)}")
    if indices.shape[0] != s_q:
        raise ValueError(f"indices.shape[0] must equal s_q={s_q} (q.shape[0]); got indices.shape={_shape(indices)}")
    if indices.dtype != torch.int32:
        raise ValueError(f"indices.dtype must be torch.int32; got {indices.dtype}")
    if isinstance(d_v, bool) or not isinstance(d_v, int) or not (0 < d_v <= d_qk):
        raise ValueError(f"d_v must be an int in [1, d_qk={d_qk}] (FlashMLA: 512); got d_v={d_v!r}")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise ValueError(f"sm_scale must be a float; got sm_scale={sm_scale!r}")
    if topk_length is not None:
        if not isinstance(topk_length, torch.Tensor) or topk_length.dim() != 1 or topk_length.shape[0] != s_q:
            raise ValueError(f"topk_length must be a 1-D tensor [s_q={s_q}]; got topk_length.shape="
                             f"{_shape(topk_length)}")
        if topk_length.dtype != torch.int32:
            raise ValueError(f"topk_length.dtype must be torch.int32; got {topk_length.dtype}")
        topk = indices.shape[-1]
        # values are checked for CPU tensors only: on a GPU the check would synchronise every layer call
        if topk_length.device.type == "cpu" and topk_length.numel():
            lo, hi = int(topk_length.min()), int(topk_length.max())
            if lo < 0 or hi > topk:
                raise ValueError(f"topk_length values must lie in [0, topk={topk}]; got min {lo}, max {hi}")
    if actual_num_heads is not None:
        if isinstance(actual_num_heads, bool) or not isinstance(actual_num_heads, int) or \
                not (1 <= actual_num_heads <= h_q):
            raise ValueError(f"actual_num_heads must be an int in [1, h_q={h_q}]; got {actual_num_heads!r}")
    devs = {"q": q.device, "kv": kv.device, "indices": indices.device}
    if topk_length is not None:
        devs["topk_length"] = topk_length.device
    if len(set(devs.values())) != 1:
        raise ValueError(f"q, kv, indices and topk_length must be on one device; got "
                         f"{ {k: str(v) for k, v in devs.items()} }")


def _prefill_backend(backend: str, device: torch.device) -> str:
    if backend not in PREFILL_BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; allowed: {list(PREFILL_BACKENDS)}")
    if backend != "auto":
        return backend
    if device.type != "cuda" or not flash_mla_info()["available"]:
        return "reference"
    major = torch.cuda.get_device_capability(device)[0]
    return "flash_mla" if major in (9, 10) else "reference"


def sparse_mla_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    topk_length: torch.Tensor | None = None,
    actual_num_heads: int | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill attention on a (head-padded) ``q``; outputs sliced to the real heads.

    Semantics are FlashMLA's (``flash_mla_interface.py`` docstring, ``tests/ref.py``): for token ``i`` and head
    ``h``, attend to ``kv`` rows ``indices[i, 0, :topk_length[i]]`` (all ``topk`` without ``topk_length``); an index
    ``< 0`` or ``>= s_kv`` is invalid and skipped. ``P = q . k * sm_scale``; ``lse`` = natural-log logsumexp of
    ``P``; ``out = softmax(P) @ kv[..., :d_v]``. A row with no valid index gives ``out = 0``, ``lse = +inf``,
    ``max_logits = -inf``.

    Args:
        q: ``[s_q, h_q, d_qk]`` bf16, last dim contiguous. With ``flash_mla``: d_qk 576 or 512, h_q 64 or 128 (pad
            the real heads to vLLM's ``prefill_padding``, :func:`mla_lab.buffers.padded_num_heads`). The reference
            accepts any h_q/d_qk and also fp16/fp32.
        kv: ``[s_kv, 1, d_qk]`` or ``[s_kv, d_qk]``, same dtype as ``q`` (the flash path views it as
            ``kv.view(-1, 1, d_qk)``, as vLLM does).
        indices: ``[s_q, 1, topk]`` or ``[s_q, topk]`` int32. ``flash_mla``: topk a multiple of 128 on sm90, 64 on
            sm100 (kernel B_TOPK); the reference accepts any topk >= 0.
        sm_scale: softmax scale (float).
        d_v: value width; 512 for ``flash_mla`` (sparse_fwd.h); the reference accepts 1..d_qk.
        topk_length: optional ``[s_q]`` int32; token ``i`` uses only its first ``topk_length[i]`` indices.
        actual_num_heads: real heads ``H`` (1..h_q); outputs are sliced ``[:, :H]`` (views of the full outputs, like
            vLLM's ``_bf16_flash_mla_kernel``). None = no slicing.
        backend: ``"auto"`` (``flash_mla`` when it imports, tensors are on CUDA and the GPU is sm90/sm100 —
            capability major 9 or 10; otherwise ``reference``), ``"flash_mla"`` or ``"reference"``. ``auto`` does
            not fall back when ``flash_mla`` is chosen and the inputs break its contract: it raises.

    Returns:
        ``(out [s_q, H, d_v] bf16, max_logits [s_q, H] fp32, lse [s_q, H] fp32)``, ``H = actual_num_heads or h_q``.
        :func:`last_backend` ``("sparse_mla_prefill")`` tells which backend ran.

    NaN/inf inputs: the reference propagates them as the math does (a NaN in ``q[i, h]`` or in a kv row that a
    valid index of token ``i`` references gives NaN ``out[i, h]``, ``lse[i, h]`` and ``max_logits[i, h]``; kv rows
    that only invalid indices reference are never read). FlashMLA documents one case where it differs: with
    ``topk_length``, a NaN kv row referenced by a valid index past ``topk_length[i]`` can still give NaN output.

    Raises:
        ValueError: shapes/dtypes/devices as listed (message names the argument, its value, what is allowed); for
            ``flash_mla`` the full contract (:func:`validate_sparse_prefill_inputs`), including non-CUDA tensors.
        RuntimeError: ``backend="flash_mla"`` while ``flash_mla`` is unavailable (reason from :func:`flash_mla_info`).
    """
    _validate_prefill_common(q, kv, indices, sm_scale, d_v, topk_length, actual_num_heads)
    which = _prefill_backend(backend, q.device)
    if which == "flash_mla":
        out, max_logits, lse = flash_mla_sparse_prefill(q, kv, indices, float(sm_scale), d_v=d_v,
                                                        topk_length=topk_length)
    else:
        out, max_logits, lse = sparse_mla_prefill_ref(q, kv, indices, float(sm_scale), d_v=d_v,
                                                      topk_length=topk_length)
    _LAST["sparse_mla_prefill"] = which
    if actual_num_heads is not None:
        out, max_logits, lse = out[:, :actual_num_heads], max_logits[:, :actual_num_heads], lse[:, :actual_num_heads]
    return out, max_logits, lse
