"""FlashMLA sparse prefill (``flash_mla.flash_mla_sparse_fwd``): provider detection, contract check, call.

Providers of the ``flash_mla`` module (FlashMLA README; the distributions' PyPI pages): ``tokenspeed-flashmla``
(cp312 wheels per torch version; sm90a + sm100f), ``sgl-flash-mla`` 1.0.0 (abi3; the sm90 kernel only through
``use_legacy=True``), a source build of deepseek-ai/FlashMLA. The contract: FlashMLA's ``csrc/api/sparse_fwd.h``
(``sparse_attn_prefill_interface``) plus the kernels' ``topk % B_TOPK == 0``, raised as one ``ValueError`` instead
of a ``RuntimeError`` or a device fault from inside the extension.
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["flash_mla_info", "validate_sparse_prefill_inputs", "flash_mla_sparse_prefill", "KNOWN_PROVIDERS",
           "SUPPORTED_D_QK", "SUPPORTED_D_V"]

KNOWN_PROVIDERS = ("tokenspeed-flashmla", "sgl-flash-mla", "flash-mla", "flash_mla")
#: FlashMLA csrc/api/sparse_fwd.h: ``TORCH_CHECK(d_qk == 576 || d_qk == 512)`` and ``TORCH_CHECK(d_v == 512)``.
SUPPORTED_D_QK = (576, 512)
SUPPORTED_D_V = (512,)
#: FlashMLA sparse prefill kernels' B_TOPK ("topk (%d) mod B_TOPK (%d) must be 0"): 128 on sm90, 64 on sm100.
_TOPK_MULTIPLE = {9: 128, 10: 64}
#: h_q the kernels are dispatched for (sparse_fwd.h: ``h_q == 64`` -> HEAD_64, ``h_q == 128`` -> HEAD_128, else
#: "Unsupported h_q"). vLLM pads to 64 on Hopper and 128 on Blackwell (vLLM flashmla_sparse.py, PR #53878).
_HEADS = {9: (64, 128), 10: (64, 128)}


def _provider_of_module() -> tuple[str, str]:
    """``(provider, version)`` of the imported ``flash_mla``: the distribution that installed it, else ``source``."""
    from importlib import metadata

    import flash_mla

    # a known provider first; packages_distributions may return the dist's own spelling
    dists = list(metadata.packages_distributions().get("flash_mla", []))
    norm = {d.lower().replace("_", "-"): d for d in dists}
    for key in [n.replace("_", "-") for n in KNOWN_PROVIDERS if n.replace("_", "-") in norm] + dists[:1]:
        try:
            return key, metadata.version(norm.get(key, key))
        except metadata.PackageNotFoundError:  # pragma: no cover
            pass
    return "source", str(getattr(flash_mla, "__version__", "unknown"))


@functools.lru_cache(maxsize=1)
def flash_mla_info() -> dict:
    """What ``flash_mla`` provides here (cached: importing it loads a large CUDA extension): ``available``,
    ``provider`` (``tokenspeed-flashmla`` | ``sgl-flash-mla`` | ``flash-mla`` | ``source`` | None), ``version``,
    ``has_sparse_fwd``, ``takes_topk_length`` / ``takes_use_legacy`` (from the signature), ``signature``, ``reason``
    (why unavailable, else None)."""
    info = {"available": False, "provider": None, "version": None, "has_sparse_fwd": False,
            "takes_topk_length": False, "takes_use_legacy": False, "signature": None, "reason": None}
    try:
        import flash_mla
    except Exception as e:  # ImportError, or an OSError/undefined symbol from a wheel built for another torch
        info["reason"] = f"import flash_mla failed: {type(e).__name__}: {e}"
        return info
    try:
        info["provider"], info["version"] = _provider_of_module()
    except Exception as e:  # pragma: no cover
        info["provider"], info["version"] = "unknown", f"unknown ({type(e).__name__})"
    fn = getattr(flash_mla, "flash_mla_sparse_fwd", None)
    if fn is None:
        info["reason"] = f"flash_mla ({info['provider']}=={info['version']}) has no flash_mla_sparse_fwd"
        return info
    info["has_sparse_fwd"] = True
    try:
        sig = inspect.signature(fn)
        info["signature"] = str(sig)
        info["takes_topk_length"] = "topk_length" in sig.parameters
        info["takes_use_legacy"] = "use_legacy" in sig.parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        info["takes_topk_length"] = True
    info["available"] = True
    return info


def validate_sparse_prefill_inputs(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                                   topk_length: torch.Tensor | None, d_v: int,
                                   arch_capability: tuple[int, int]) -> None:
    """Check FlashMLA's sparse-prefill contract (``csrc/api/sparse_fwd.h`` and the kernels' B_TOPK) for the GPU of
    ``arch_capability`` (``torch.cuda.get_device_capability``): sm90 / sm100; ``q [s_q, h_q, d_qk]`` bf16, d_qk 576
    or 512, h_q 64 or 128; ``kv [s_kv, 1, d_qk]`` (or 2-D) bf16; ``indices [s_q, 1, topk]`` (or 2-D) int32, topk a
    positive multiple of 128 (sm90) / 64 (sm100); ``topk_length`` None or ``[s_q]`` int32; ``d_v`` 512; last dims
    contiguous; one device.

    Raises:
        ValueError: the first violated rule, naming the rule, the argument and the value.
    """
    cap = tuple(arch_capability)
    for broken, rule, arg, value in _contract_rules(q, kv, indices, topk_length, d_v, cap):
        if broken:
            raise ValueError(f"flash_mla_sparse_fwd contract: {rule}; got {arg}={value}")


def prefill_devices(q, kv, indices, topk_length) -> dict[str, str]:
    """``{"q": device, "kv": ..., "indices": ..., "topk_length": ... (when given)}`` as strings."""
    named = {"q": q, "kv": kv, "indices": indices, "topk_length": topk_length}
    return {k: str(t.device) for k, t in named.items() if t is not None}


def _shape(t) -> tuple:
    return tuple(getattr(t, "shape", ()))


def _contract_rules(q, kv, indices, topk_length, d_v, cap):
    """``(broken, rule, argument, value)`` per rule of :func:`validate_sparse_prefill_inputs`, in order; a rule is
    evaluated only once the rules before it hold."""
    sm = f"sm{cap[0]}0"
    yield cap[0] not in _TOPK_MULTIPLE, ("the GPU must be sm90 (Hopper) or sm100 (Blackwell), capability major 9 or "
                                         "10"), "arch_capability", cap
    yield not isinstance(q, torch.Tensor) or q.dim() != 3, "q must be a 3-D tensor [s_q, h_q, d_qk]", "q.shape", _shape(q)
    yield q.dtype != torch.bfloat16, "q must be bfloat16", "q.dtype", q.dtype
    s_q, h_q, d_qk = q.shape
    yield d_qk not in SUPPORTED_D_QK, f"d_qk (q.shape[-1]) must be one of {SUPPORTED_D_QK}", "q.shape", _shape(q)
    yield h_q not in _HEADS[cap[0]], (f"h_q must be one of {_HEADS[cap[0]]} on {sm} (pad the heads: vLLM "
                                      "prefill_padding)"), "q.shape[1] (h_q)", h_q
    yield q.stride(-1) != 1, "q's last dim must be contiguous (stride 1)", "q.stride()", q.stride()
    yield d_v not in SUPPORTED_D_V, f"d_v must be one of {SUPPORTED_D_V}", "d_v", d_v
    yield (not isinstance(kv, torch.Tensor) or kv.dim() not in (2, 3), "kv must be [s_kv, 1, d_qk] (or [s_kv, d_qk])",
           "kv.shape", _shape(kv))
    yield kv.dim() == 3 and kv.shape[1] != 1, "kv must have h_kv == 1 (kv.shape[1])", "kv.shape", _shape(kv)
    yield kv.shape[-1] != d_qk, f"kv.shape[-1] must equal q's d_qk={d_qk}", "kv.shape", _shape(kv)
    yield kv.dtype != torch.bfloat16, "kv must be bfloat16", "kv.dtype", kv.dtype
    yield kv.stride(-1) != 1, "kv's last dim must be contiguous (stride 1)", "kv.stride()", kv.stride()
    yield (not isinstance(indices, torch.Tensor) or indices.dim() not in (2, 3),
           "indices must be [s_q, 1, topk] (or [s_q, topk])", "indices.shape", _shape(indices))
    yield indices.dtype != torch.int32, "indices must be int32", "indices.dtype", indices.dtype
    yield (indices.dim() == 3 and indices.shape[1] != 1, "indices must be [s_q, 1, topk] (h_kv == 1)", "indices.shape",
           _shape(indices))
    yield indices.shape[0] != s_q, f"indices.shape[0] must equal q's s_q={s_q}", "indices.shape", _shape(indices)
    topk, mult = indices.shape[-1], _TOPK_MULTIPLE[cap[0]]
    yield (topk <= 0 or topk % mult, f"topk (indices.shape[-1]) must be a positive multiple of {mult} on {sm}",
           "indices.shape", _shape(indices))
    yield indices.stride(-1) != 1, "indices' last dim must be contiguous (stride 1)", "indices.stride()", indices.stride()
    tl = topk_length
    yield (tl is not None and not (isinstance(tl, torch.Tensor) and tl.dim() == 1 and tl.shape[0] == s_q),
           f"topk_length must be a 1-D tensor [s_q={s_q}]", "topk_length.shape", _shape(tl))
    yield tl is not None and tl.dtype != torch.int32, "topk_length must be int32", "topk_length.dtype", getattr(tl, "dtype", None)
    devices = prefill_devices(q, kv, indices, tl)
    yield len(set(devices.values())) != 1, "all tensors must be on one device", "devices", devices


def flash_mla_sparse_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                             topk_length: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate, then call ``flash_mla_sparse_fwd(q, kv.view(-1, 1, d_qk), indices.view(s_q, 1, -1), sm_scale,
    d_v=d_v, topk_length=topk_length)`` as vLLM's ``_bf16_flash_mla_kernel`` does (``use_legacy=True`` on sm90 when
    the provider takes it: sgl-flash-mla 1.0.0).

    Returns:
        ``(out [s_q, h_q, 512] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)``.

    Raises:
        RuntimeError: ``flash_mla`` unavailable (the message carries :func:`flash_mla_info`'s reason), or the
            provider's function lacks ``topk_length`` while one was given.
        ValueError: a contract violation (:func:`validate_sparse_prefill_inputs`), or tensors not on CUDA.
    """
    info = flash_mla_info()
    if not info["available"]:
        raise RuntimeError(f"flash_mla backend unavailable: {info['reason']}")
    if q.device.type != "cuda":
        raise ValueError(f"flash_mla needs CUDA tensors; got q.device={q.device}")
    cap = torch.cuda.get_device_capability(q.device)
    validate_sparse_prefill_inputs(q, kv, indices, topk_length, d_v, cap)
    import flash_mla

    s_q, _, d_qk = q.shape
    kwargs = {"d_v": d_v}
    if topk_length is not None:
        if not info["takes_topk_length"]:
            raise RuntimeError(f"{info['provider']}=={info['version']} flash_mla_sparse_fwd takes no topk_length "
                               f"(signature {info['signature']})")
        kwargs["topk_length"] = topk_length
    if info["takes_use_legacy"] and cap[0] == 9:
        kwargs["use_legacy"] = True
    res = flash_mla.flash_mla_sparse_fwd(q, kv.view(-1, 1, d_qk), indices.view(s_q, 1, -1), sm_scale, **kwargs)
    return res[0], res[1], res[2]
