"""The padded Q-concat workspace and its byte accounting.

vLLM PR #53878 (``vllm/v1/attention/backends/mla/flashmla_sparse.py``) allocates the Q-concat workspace with
``q_concat_heads = ceil(num_heads / prefill_padding) * prefill_padding`` heads when the KV cache is bf16, and with
``num_heads`` heads when it is fp8 (the fp8 path does not use the bf16 sparse prefill kernel's padding).
``prefill_padding`` is 128 on Blackwell (capability family 100) and 64 otherwise (:mod:`mla_lab.arch`).

Byte accounting here allocates nothing. All sizes are bytes; Q is bf16 (2 bytes), ``head_size`` 576
(kv_lora_rank 512 + qk_rope_head_dim 64), kernel output ``d_v`` 512, kernel lse and max_logits fp32.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ._validate import check_int
from .arch import GPUArch, get_arch
from .models import ModelConfig, normalize_kv_cache_dtype

__all__ = [
    "padded_num_heads", "QConcatWorkspace", "MemoryAccount", "memory_account", "STRATEGIES", "MIB",
    "kv_tokens_lost", "check_strategy", "call_peak_bytes",
]

MIB = 1024**2
BF16_BYTES = 2
FP32_BYTES = 4
STRATEGIES = ("unfused", "fused", "kernel_native")




def check_strategy(strategy: str) -> str:
    """``strategy`` if it is one of :data:`STRATEGIES`.

    Raises:
        ValueError: naming the value and the allowed names.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not known; allowed: {list(STRATEGIES)}")
    return strategy


def _padding_of(arch: str | GPUArch | int) -> int:
    if isinstance(arch, int) and not isinstance(arch, bool):
        if arch not in (64, 128):
            raise ValueError(f"prefill_padding={arch!r} must be 64 or 128")
        return arch
    return get_arch(arch).prefill_padding


def padded_num_heads(num_heads: int, arch: str | GPUArch | int = "hopper", kv_cache_dtype: str = "bf16") -> int:
    """Heads of the Q-concat workspace (``q_concat_heads``), vLLM's rule exactly.

    Args:
        num_heads: attention heads on this rank (``num_attention_heads // tp``), > 0.
        arch: arch name/alias, a :class:`GPUArch`, or the ``prefill_padding`` itself (64 or 128).
        kv_cache_dtype: ``"bf16"`` (also ``auto``/``bfloat16``) pads; ``"fp8"`` (also ``fp8_ds_mla``) does not.

    Returns:
        ``ceil(num_heads / prefill_padding) * prefill_padding`` for bf16, ``num_heads`` for fp8.

    Raises:
        ValueError: num_heads not a positive int; unknown arch; unsupported kv_cache_dtype.
    """
    check_int("num_heads", num_heads)
    padding = _padding_of(arch)
    if normalize_kv_cache_dtype(kv_cache_dtype) == "fp8":
        return num_heads
    return math.ceil(num_heads / padding) * padding


def kv_tokens_lost(extra_bytes: int, model: ModelConfig, kv_cache_dtype: str = "bf16",
                   include_indexer: bool = True) -> float:
    """``extra_bytes`` of workspace expressed as KV-cache tokens that no longer fit on one rank."""
    return extra_bytes / model.kv_cache_bytes_per_token(kv_cache_dtype, include_indexer)


@dataclass(frozen=True)
class MemoryAccount:
    """Bytes one rank spends on the sparse-prefill Q path for one strategy (one layer's workspace; vLLM shares the
    workspace across layers, so it is allocated once per rank).

    Attributes:
        strategy: ``unfused`` | ``fused`` | ``kernel_native``.
        num_heads: real heads per rank (H); q_concat_heads: workspace heads; kernel_heads: h_q the kernel runs at.
        persistent_bytes: the Q-concat workspace, ``max_num_batched_tokens * q_concat_heads * head_size * 2``.
        step_transient_bytes: allocated and freed inside one step of ``num_tokens`` tokens by the Q path itself:
            the unfused pad tensor ``T * kernel_heads * head_size * 2`` (0 when no padding is needed).
        kernel_out_bytes: kernel output + lse + max_logits at ``kernel_heads``: ``T*h*(d_v*2 + 2*4)``.
        peak_bytes: persistent + step_transient + kernel_out (the Q path's high-water mark in a step).
    """

    strategy: str
    num_heads: int
    q_concat_heads: int
    kernel_heads: int
    max_num_batched_tokens: int
    num_tokens: int
    head_size: int
    d_v: int
    persistent_bytes: int
    step_transient_bytes: int
    kernel_out_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.step_transient_bytes + self.kernel_out_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["peak_bytes"] = self.peak_bytes
        return d


def memory_account(
    strategy: str,
    num_heads: int,
    max_num_batched_tokens: int,
    arch: str | GPUArch | int = "hopper",
    kv_cache_dtype: str = "bf16",
    num_tokens: int | None = None,
    head_size: int = 576,
    d_v: int = 512,
) -> MemoryAccount:
    """Exact byte accounting for one strategy, allocating nothing.

    Args:
        strategy: ``"unfused"`` (vLLM before PR #53878: H-head workspace, then a fresh ``(T, H', head_size)`` pad
            tensor each call), ``"fused"`` (the PR: H'-head workspace, no pad tensor) or ``"kernel_native"``
            (modelled: a kernel that takes H heads; H-head workspace, no pad tensor, output at H heads).
        num_heads: real heads per rank (H).
        max_num_batched_tokens: workspace rows, > 0.
        arch, kv_cache_dtype: as in :func:`padded_num_heads`.
        num_tokens: tokens in the step (T), 0 <= T <= max_num_batched_tokens; default max_num_batched_tokens.
        head_size: q/k head size (576 = kv_lora_rank 512 + qk_rope_head_dim 64); d_v: output head dim (512).

    Raises:
        ValueError: unknown strategy; non-positive sizes; num_tokens out of range; as :func:`padded_num_heads`.
    """
    check_strategy(strategy)
    check_int("max_num_batched_tokens", max_num_batched_tokens)
    check_int("head_size", head_size)
    check_int("d_v", d_v)
    T = max_num_batched_tokens if num_tokens is None else num_tokens
    check_int("num_tokens", T, allow_zero=True)
    if T > max_num_batched_tokens:
        raise ValueError(f"num_tokens={T} exceeds max_num_batched_tokens={max_num_batched_tokens}; "
                         f"allowed: 0..{max_num_batched_tokens}")
    hp = padded_num_heads(num_heads, arch, kv_cache_dtype)
    dt = normalize_kv_cache_dtype(kv_cache_dtype)
    # bf16: the kernel runs at the padded head count in both real strategies. fp8: no Q padding in the workspace.
    kernel_heads = hp
    if strategy == "unfused":
        q_heads = num_heads
        transient = T * hp * head_size * BF16_BYTES if (hp != num_heads and dt == "bf16") else 0
    elif strategy == "fused":
        q_heads = hp
        transient = 0
    else:
        q_heads = num_heads
        kernel_heads = num_heads
        transient = 0
    return MemoryAccount(
        strategy=strategy,
        num_heads=num_heads,
        q_concat_heads=q_heads,
        kernel_heads=kernel_heads,
        max_num_batched_tokens=max_num_batched_tokens,
        num_tokens=T,
        head_size=head_size,
        d_v=d_v,
        persistent_bytes=max_num_batched_tokens * q_heads * head_size * BF16_BYTES,
        step_transient_bytes=transient,
        kernel_out_bytes=T * kernel_heads * (d_v * BF16_BYTES + 2 * FP32_BYTES),
    )


class QConcatWorkspace:
    """A ``(max_num_batched_tokens, q_concat_heads, head_size)`` buffer allocated once; hands out ``[:T]`` views.

    The real heads occupy ``[:, :num_heads]``; heads ``num_heads..q_concat_heads-1`` are never written by
    :func:`mla_lab.kernels.concat_mla_q`. With ``zero_init=True`` (default) the buffer is zeroed once at allocation,
    so the padded heads stay zero for the workspace's life at the cost of one memset; ``zero_init=False`` leaves
    them as the allocator gave them (``torch.empty``), as vLLM does. Why zero: on an H200 FlashMLA's sparse prefill
    kernel ran 12 % faster with zero padded heads than with random ones (GLM-5 TP8, T = 16384: 7.19 vs 8.14 ms,
    NaN 8.95 ms; ``data/measured/h200/layer_run2/layer_extras.csv``, experiment ``kernel_pad_values``), and the
    unfused path's ``new_zeros`` pad tensor always gives zeros.

    Args:
        max_num_batched_tokens: rows, > 0.
        num_heads: real heads per rank, > 0.
        arch, kv_cache_dtype: decide ``q_concat_heads`` (:func:`padded_num_heads`). Pass ``pad=False`` to get an
            unpadded (``num_heads``) workspace, as the unfused strategy uses.
        head_size: 576 (kv_lora_rank 512 + qk_rope_head_dim 64).
        device, dtype: torch device and dtype (bf16 by default; fp16 also accepted).
        zero_init: zero the buffer once at allocation (default True; False = ``torch.empty`` as in vLLM).

    Raises:
        ValueError: as :func:`padded_num_heads`; dtype not bf16/fp16.
    """

    def __init__(self, max_num_batched_tokens: int, num_heads: int, arch="hopper", kv_cache_dtype: str = "bf16",
                 head_size: int = 576, device="cpu", dtype=None, pad: bool = True, zero_init: bool = True):
        import torch

        check_int("max_num_batched_tokens", max_num_batched_tokens)
        check_int("head_size", head_size)
        dtype = torch.bfloat16 if dtype is None else dtype
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"dtype={dtype} is not supported; allowed: torch.bfloat16, torch.float16")
        self.num_heads = num_heads
        self.q_concat_heads = padded_num_heads(num_heads, arch, kv_cache_dtype) if pad else num_heads
        check_int("num_heads", num_heads)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.head_size = head_size
        alloc = torch.zeros if zero_init else torch.empty
        self.buffer = alloc((max_num_batched_tokens, self.q_concat_heads, head_size), dtype=dtype, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes held: ``max_num_batched_tokens * q_concat_heads * head_size * element_size``."""
        return self.buffer.numel() * self.buffer.element_size()

    def view(self, num_tokens: int):
        """The first ``num_tokens`` rows, ``[T, q_concat_heads, head_size]`` (a view, no copy).

        Raises:
            ValueError: num_tokens negative, not an int, or larger than max_num_batched_tokens.
        """
        check_int("num_tokens", num_tokens, allow_zero=True)
        if num_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"num_tokens={num_tokens} exceeds the workspace's max_num_batched_tokens={self.max_num_batched_tokens}; "
                f"allowed: 0..{self.max_num_batched_tokens}"
            )
        return self.buffer[:num_tokens]

    def __repr__(self) -> str:
        return (f"QConcatWorkspace(max_num_batched_tokens={self.max_num_batched_tokens}, num_heads={self.num_heads}, "
                f"q_concat_heads={self.q_concat_heads}, head_size={self.head_size}, dtype={self.buffer.dtype}, "
                f"device={self.buffer.device}, {self.nbytes / MIB:.1f} MiB)")


def call_peak_bytes(strategy: str, num_heads: int, max_num_batched_tokens: int, arch: str | GPUArch, num_tokens: int,
                    model: ModelConfig) -> int:
    """Analytic extra bytes of one measured layer call of the attention path (``out[:, :H].contiguous()`` included)
    at step size ``num_tokens``: what ``torch.cuda.max_memory_allocated`` should add above the inputs and workspace.

    While the kernel runs, the pad tensor (``unfused`` only) and the kernel's ``out [T, H', d_v]`` bf16,
    ``max_logits`` and ``lse [T, H']`` fp32 are alive; the caller drops max_logits and lse, then copies the real
    heads out of the full ``out`` (no copy when ``H' == H``: the slice is the whole, already contiguous tensor). The
    peak is the larger phase (bytes).
    """
    acc = memory_account(strategy, num_heads, max_num_batched_tokens, arch, "bf16", num_tokens=num_tokens)
    kh = acc.kernel_heads
    T = num_tokens
    during_kernel = acc.step_transient_bytes + acc.kernel_out_bytes
    during_copy = T * kh * model.d_v * BF16_BYTES + T * num_heads * model.d_v * BF16_BYTES if kh > num_heads else 0
    return max(during_kernel, during_copy)
