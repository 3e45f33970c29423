"""The lab's two kernels bound to one device, as the measurement experiments call them: :class:`Kernels`."""

from __future__ import annotations

import torch

from . import concat_mla_q, flash_mla_info, sparse_mla_prefill

__all__ = ["Kernels"]

#: d_v of the sparse kernel: the latent width ``kv_lora_rank`` 512 (GLM-5 / DeepSeek-V3.2 config.json).
D_V = 512


class Kernels:
    """``concat`` (the lab's ``concat_mla_q``: Triton on CUDA, torch on CPU) and ``kernel`` (FlashMLA's
    ``flash_mla_sparse_fwd`` called directly on CUDA, as vLLM does; the fp32 reference on CPU) on ``device``;
    ``concat_impl`` / ``kernel_impl`` name what runs (for rows), ``info`` is :func:`flash_mla_info`.

    Raises:
        ImportError: ``device="cuda"`` without an importable ``flash_mla`` (no silent fallback).
    """

    def __init__(self, device: str):
        self.device, self.info = device, flash_mla_info()
        self.concat_backend = "triton" if device == "cuda" else "torch"
        self.concat_impl = f"mla_lab.kernels.concat_mla_q({self.concat_backend})"
        self._fm = None
        if device == "cuda":
            import flash_mla

            self._fm = flash_mla.flash_mla_sparse_fwd
            self.kernel_impl = "flash_mla.flash_mla_sparse_fwd"
        else:
            self.kernel_impl = "mla_lab.kernels.sparse_mla_prefill(reference)"

    def concat(self, ql_nope: torch.Tensor, q_pe: torch.Tensor, out: torch.Tensor,
               zero_padding: bool = False) -> torch.Tensor:
        """``ql_nope [T,H,512]`` and ``q_pe [T,H,64]`` into the first H heads of ``out [T,H',576]`` (fp16/bf16);
        ``zero_padding`` also zeroes heads H..H'-1. Returns ``out``."""
        return concat_mla_q(ql_nope, q_pe, out, zero_padding=zero_padding, backend=self.concat_backend)

    def kernel(self, q: torch.Tensor, kv: torch.Tensor, idx: torch.Tensor, sm_scale: float,
               topk_length: torch.Tensor | None = None) -> torch.Tensor:
        """Sparse prefill of ``q [T,h_q,576]`` over ``kv [s_kv,1,576]`` at ``idx [T,1,topk]`` int32: the full
        output ``[T, h_q, 512]`` in ``q``'s dtype (the caller slices the real heads, a view, as vLLM does)."""
        if self._fm is not None:
            return self._fm(q, kv, idx, sm_scale, d_v=D_V, topk_length=topk_length)[0]
        return sparse_mla_prefill(q, kv, idx, sm_scale, d_v=D_V, topk_length=topk_length,
                                  backend="reference")[0].to(q.dtype)
