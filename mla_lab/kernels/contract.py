"""The two public ops of the sparse-MLA prefill Q path, their contract checks and backend choice.

:func:`concat_mla_q` (vLLM's ``concat_mla_q``, PR #53878; hot path :func:`make_concat_launcher`) and
:func:`sparse_mla_prefill` (FlashMLA's ``flash_mla_sparse_fwd`` on a head-padded ``q``, sliced to the real heads as
vLLM's ``_bf16_flash_mla_kernel``). Every check raises one ``ValueError`` naming the argument, its value and what is
allowed. Widths 512 / 64 / 576: ``kv_lora_rank``, ``qk_rope_head_dim``, head_size (GLM-5 / DeepSeek-V3.2 config.json).
"""

from __future__ import annotations

import torch

from .flashmla import flash_mla_info, flash_mla_sparse_prefill, prefill_devices
from .reference import D_NOPE, D_PE, D_QK, concat_mla_q_torch, sparse_mla_prefill_ref
from .triton_concat import concat_mla_q_triton, make_concat_launcher_triton, triton_available, triton_interpreting

__all__ = ["concat_mla_q", "make_concat_launcher", "sparse_mla_prefill", "last_backend", "CONCAT_BACKENDS",
           "PREFILL_BACKENDS", "CONCAT_DTYPES"]

CONCAT_BACKENDS = ("auto", "torch", "triton")
PREFILL_BACKENDS = ("auto", "flash_mla", "reference")
CONCAT_DTYPES = (torch.float16, torch.bfloat16)
_REF_PREFILL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_OPS = ("concat_mla_q", "sparse_mla_prefill")
_LAST: dict[str, str] = {}
_TRITON_OK, _TRITON_WHY = triton_available()


def last_backend(op: str | None = None):
    """Backend the last call of ``op`` (``"concat_mla_q"`` | ``"sparse_mla_prefill"``) ran, process-wide: ``"triton"``
    | ``"torch"``, ``"flash_mla"`` | ``"reference"``, or None if it has not run; ``op=None``: a dict of both.

    Raises:
        ValueError: unknown op.
    """
    if op is None:
        return dict(_LAST)
    if op not in _OPS:
        raise ValueError(f"op={op!r} is not known; allowed: {list(_OPS)} or None")
    return _LAST.get(op)


def shape_of(t) -> tuple | str:
    """``tuple(t.shape)`` of a tensor, else its type's name (what a message echoes)."""
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def first_failure(rules) -> None:
    """Raise ``ValueError(message)`` for the first ``(broken, message)`` of ``rules`` (a generator: a rule is only
    evaluated once the rules before it hold); the kernels' one rule runner."""
    for broken, message in rules:
        if broken:
            raise ValueError(message)


def _concat_fast_ok(a, b, o) -> bool:
    """The common valid case with few attribute reads (this op runs once per layer per step; the detailed rules
    only run when this says no, to find the one that failed)."""
    try:
        sa, sb, so = a.shape, b.shape, o.shape
        dt = a.dtype
        return (len(sa) == 3 and len(sb) == 3 and len(so) == 3 and sa[2] == D_NOPE and sb[2] == D_PE
                and so[2] == D_QK and sa[0] == sb[0] == so[0] and sa[1] == sb[1] and so[1] >= sa[1]
                and (dt is torch.bfloat16 or dt is torch.float16) and b.dtype is dt and o.dtype is dt
                and a.stride(2) == 1 and b.stride(2) == 1 and o.stride(2) == 1 and a.device == b.device == o.device)
    except (AttributeError, TypeError):
        return False


def _concat_rules(ql_nope, q_pe, out):
    named = (("ql_nope", ql_nope, D_NOPE), ("q_pe", q_pe, D_PE), ("out", out, D_QK))
    for name, t, _ in named:
        yield not isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}"
        yield t.dim() != 3, f"{name} must be 3-D [T, heads, dim]; got {name}.shape={shape_of(t)}"
    for name, t, d in named:
        yield t.shape[-1] != d, f"{name}.shape[-1] must be {d}; got {name}.shape={shape_of(t)}"
    T, H = ql_nope.shape[0], ql_nope.shape[1]
    yield tuple(q_pe.shape[:2]) != (T, H), (f"q_pe.shape[:2] must equal ql_nope.shape[:2]={(T, H)}; got "
                                            f"q_pe.shape={shape_of(q_pe)}")
    yield out.shape[0] != T, f"out.shape[0] must equal T={T} (ql_nope.shape[0]); got out.shape={shape_of(out)}"
    yield out.shape[1] < H, f"out.shape[1] (padded heads) must be >= H={H}; got out.shape={shape_of(out)}"
    for name, t, _ in named:
        yield t.dtype not in CONCAT_DTYPES, f"{name}.dtype must be one of [torch.float16, torch.bfloat16]; got {t.dtype}"
    yield not (ql_nope.dtype == q_pe.dtype == out.dtype), (
        f"ql_nope, q_pe and out must share one dtype; got ql_nope.dtype={ql_nope.dtype}, q_pe.dtype={q_pe.dtype}, "
        f"out.dtype={out.dtype}")
    for name, t, _ in named:
        yield t.stride(-1) != 1, f"{name}'s last dim must be contiguous (stride 1); got {name}.stride()={t.stride()}"
    yield not (ql_nope.device == q_pe.device == out.device), (
        f"ql_nope, q_pe and out must be on one device; got ql_nope.device={ql_nope.device}, "
        f"q_pe.device={q_pe.device}, out.device={out.device}")


def _concat_backend(backend: str, device: torch.device) -> str:
    if backend == "auto":
        return "triton" if (_TRITON_OK and device.type == "cuda") else "torch"
    if backend not in CONCAT_BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; allowed: {list(CONCAT_BACKENDS)}")
    if backend == "triton" and not _TRITON_OK:
        raise ValueError(f"backend='triton' requested but triton is unavailable: {_TRITON_WHY}")
    if backend == "triton" and device.type != "cuda" and not triton_interpreting():
        raise ValueError(f"backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU interpreter); "
                         f"got device={device}")
    return backend


def _concat_call(ql_nope, q_pe, out, backend: str) -> str:
    """The checks of one concat call: the backend that runs."""
    if not _concat_fast_ok(ql_nope, q_pe, out):
        first_failure(_concat_rules(ql_nope, q_pe, out))
    return _concat_backend(backend, out.device)


def concat_mla_q(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor, *, zero_padding: bool = False,
                 backend: str = "auto") -> torch.Tensor:
    """``out[:, :H, :512] = ql_nope``, ``out[:, :H, 512:] = q_pe`` (vLLM ``concat_mla_q``); returns ``out``.

    Heads ``H..H'-1`` are left untouched (vLLM leaves them uninitialised; the kernel's rows for them are sliced away)
    unless ``zero_padding=True`` zeroes them in the same pass.

    Args:
        ql_nope: ``[T, H, 512]`` fp16 or bf16, last dim contiguous; ``T`` may be 0.
        q_pe: ``[T, H, 64]``, same dtype/device, last dim contiguous.
        out: ``[T, H', 576]``, ``H' >= H`` (the padded workspace ``workspace[:T]``), same dtype/device, last dim
            contiguous; written in place.
        backend: ``"auto"`` (Triton for CUDA tensors when triton imports, else torch), ``"triton"`` or ``"torch"``.

    Raises:
        ValueError: a shape, dtype, contiguity or device rule; unknown backend; ``"triton"`` without triton or on
            CPU outside the interpreter.
    """
    which = _concat_call(ql_nope, q_pe, out, backend)
    if which == "triton":
        concat_mla_q_triton(ql_nope, q_pe, out, zero_padding=zero_padding)
    else:
        concat_mla_q_torch(ql_nope, q_pe, out)
        if zero_padding and out.shape[1] > ql_nope.shape[1] and out.shape[0] > 0:
            out[:, ql_nope.shape[1]:].zero_()
    _LAST["concat_mla_q"] = which
    return out


def make_concat_launcher(ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor, *,
                         zero_padding: bool = False, backend: str = "auto"):
    """Check once; return a no-argument callable that repeats this :func:`concat_mla_q` call (``out`` written once).

    Triton: a :class:`.triton_concat.ConcatLauncher` bound to these tensors, capturable by ``torch.cuda.graph`` when
    made before capture; torch: a closure over :func:`concat_mla_q`.

    Raises:
        ValueError: every rule of :func:`concat_mla_q`.
    """
    which = _concat_call(ql_nope, q_pe, out, backend)
    if which == "triton":
        launcher = make_concat_launcher_triton(ql_nope, q_pe, out, zero_padding=zero_padding)
    else:
        def launcher():
            return concat_mla_q(ql_nope, q_pe, out, zero_padding=zero_padding, backend="torch")

        launcher()
    _LAST["concat_mla_q"] = which
    return launcher


def _tensor_rules(q, kv, indices):
    """Shapes and dtypes of ``q``, ``kv`` and ``indices`` that hold for every backend."""
    yield not isinstance(q, torch.Tensor) or q.dim() != 3, (f"q must be a 3-D tensor [s_q, h_q, d_qk]; got "
                                                            f"q.shape={shape_of(q)}")
    s_q, _, d_qk = q.shape
    yield q.dtype not in _REF_PREFILL_DTYPES, (f"q.dtype must be bfloat16 (float16/float32 accepted by the "
                                               f"reference); got {q.dtype}")
    yield not isinstance(kv, torch.Tensor) or kv.dim() not in (2, 3), (f"kv must be [s_kv, 1, d_qk] or [s_kv, d_qk]; "
                                                                       f"got kv.shape={shape_of(kv)}")
    yield kv.dim() == 3 and kv.shape[1] != 1, f"kv.shape[1] (h_kv) must be 1; got kv.shape={shape_of(kv)}"
    yield kv.shape[-1] != d_qk, f"kv.shape[-1] must equal q.shape[-1]={d_qk}; got kv.shape={shape_of(kv)}"
    yield kv.dtype != q.dtype, f"kv.dtype must equal q.dtype={q.dtype}; got kv.dtype={kv.dtype}"
    yield kv.shape[0] < 1, (f"s_kv (kv.shape[0]) must be >= 1: there is no key to attend to; got "
                            f"kv.shape={shape_of(kv)}")
    yield not isinstance(indices, torch.Tensor) or indices.dim() not in (2, 3), (
        f"indices must be [s_q, 1, topk] or [s_q, topk]; got indices.shape={shape_of(indices)}")
    yield indices.dim() == 3 and indices.shape[1] != 1, (f"indices.shape[1] must be 1 (h_kv); got "
                                                         f"indices.shape={shape_of(indices)}")
    yield indices.shape[0] != s_q, (f"indices.shape[0] must equal s_q={s_q} (q.shape[0]); got "
                                    f"indices.shape={shape_of(indices)}")
    yield indices.dtype != torch.int32, f"indices.dtype must be torch.int32; got {indices.dtype}"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scalar_rules(q, kv, indices, sm_scale, d_v, topk_length, actual_num_heads):
    """``d_v``, ``sm_scale``, ``topk_length``, ``actual_num_heads`` and the tensors' one device."""
    s_q, h_q, d_qk = q.shape
    yield not (_is_int(d_v) and 0 < d_v <= d_qk), f"d_v must be an int in [1, d_qk={d_qk}] (FlashMLA: 512); got d_v={d_v!r}"
    yield isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)), (f"sm_scale must be a float; got "
                                                                                 f"sm_scale={sm_scale!r}")
    tl = topk_length
    yield tl is not None and not (isinstance(tl, torch.Tensor) and tl.dim() == 1 and tl.shape[0] == s_q), (
        f"topk_length must be a 1-D tensor [s_q={s_q}]; got topk_length.shape={shape_of(tl)}")
    yield tl is not None and tl.dtype != torch.int32, f"topk_length.dtype must be torch.int32; got {getattr(tl, 'dtype', None)}"
    # values are checked for CPU tensors only: on a GPU the check would synchronise every layer call
    lo, hi = (int(tl.min()), int(tl.max())) if tl is not None and tl.device.type == "cpu" and tl.numel() else (0, 0)
    topk = indices.shape[-1]
    yield lo < 0 or hi > topk, f"topk_length values must lie in [0, topk={topk}]; got min {lo}, max {hi}"
    n = actual_num_heads
    yield n is not None and not (_is_int(n) and 1 <= n <= h_q), (f"actual_num_heads must be an int in [1, h_q={h_q}]; "
                                                                 f"got {n!r}")
    devs = prefill_devices(q, kv, indices, topk_length)
    yield len(set(devs.values())) != 1, f"q, kv, indices and topk_length must be on one device; got {devs}"


def _prefill_backend(backend: str, device: torch.device) -> str:
    if backend not in PREFILL_BACKENDS:
        raise ValueError(f"backend={backend!r} is not known; allowed: {list(PREFILL_BACKENDS)}")
    if backend != "auto":
        return backend
    if device.type != "cuda" or not flash_mla_info()["available"]:
        return "reference"
    return "flash_mla" if torch.cuda.get_device_capability(device)[0] in (9, 10) else "reference"


def sparse_mla_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                       topk_length: torch.Tensor | None = None, actual_num_heads: int | None = None,
                       backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA prefill on a (head-padded) ``q`` (semantics: :func:`.reference.sparse_mla_prefill_ref`).

    Args:
        q: ``[s_q, h_q, d_qk]`` bf16, last dim contiguous; ``flash_mla``: d_qk 576 or 512, h_q 64 or 128 (vLLM's
            ``prefill_padding``, :func:`mla_lab.buffers.padded_num_heads`); the reference: any, fp16/fp32 too.
        kv: ``[s_kv, 1, d_qk]`` or ``[s_kv, d_qk]``, ``q``'s dtype.
        indices: ``[s_q, 1, topk]`` or ``[s_q, topk]`` int32; ``flash_mla``: topk a multiple of 128 (sm90) / 64
            (sm100), the kernel's B_TOPK.
        sm_scale: softmax scale; d_v: 512 for ``flash_mla`` (sparse_fwd.h), 1..d_qk for the reference.
        topk_length: optional ``[s_q]`` int32: token ``i`` uses its first ``topk_length[i]`` indices.
        actual_num_heads: real heads ``H`` in 1..h_q (outputs are views ``[:, :H]``); None = h_q.
        backend: ``"auto"`` (``flash_mla`` when it imports and the tensors are on an sm90/sm100 GPU, else
            ``reference``; no fallback once chosen), ``"flash_mla"`` or ``"reference"``.

    Returns:
        ``(out [s_q, H, d_v] bf16, max_logits [s_q, H] fp32, lse [s_q, H] fp32)``.

    Raises:
        ValueError: shapes/dtypes/devices as listed; for ``flash_mla`` the full contract
            (:func:`.flashmla.validate_sparse_prefill_inputs`), including non-CUDA tensors.
        RuntimeError: ``backend="flash_mla"`` while ``flash_mla`` is unavailable (:func:`.flashmla.flash_mla_info`).
    """
    first_failure(_tensor_rules(q, kv, indices))
    first_failure(_scalar_rules(q, kv, indices, sm_scale, d_v, topk_length, actual_num_heads))
    which = _prefill_backend(backend, q.device)
    run = flash_mla_sparse_prefill if which == "flash_mla" else sparse_mla_prefill_ref
    out, max_logits, lse = run(q, kv, indices, float(sm_scale), d_v=d_v, topk_length=topk_length)
    _LAST["sparse_mla_prefill"] = which
    if actual_num_heads is not None:
        out, max_logits, lse = out[:, :actual_num_heads], max_logits[:, :actual_num_heads], lse[:, :actual_num_heads]
    return out, max_logits, lse
