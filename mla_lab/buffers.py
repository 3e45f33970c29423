"""The padded Q-concat workspace and its byte accounting (allocating nothing but :class:`QConcatWorkspace`).

vLLM PR #53878 (``vllm/v1/attention/backends/mla/flashmla_sparse.py``) sizes the workspace at ``q_concat_heads``
(:func:`mla_lab.rank.pad_heads`: padded to the GPU's ``prefill_padding`` for a bf16 KV cache, the real heads for
fp8). Bytes throughout; Q bf16 (2 B), ``head_size`` 576 (kv_lora_rank 512 + qk_rope_head_dim 64), kernel output
``d_v`` 512 bf16, lse and max_logits fp32.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ._validate import check_int
from .arch import GPUArch, get_arch
from .models import ModelConfig, normalize_kv_cache_dtype
from .placement import Strategy, as_strategy, fixed_strategies, strategy_route
from .rank import RankView, pad_heads

__all__ = [
    "memory_account_of",
    "padded_num_heads", "QConcatWorkspace", "MemoryAccount", "memory_account", "STRATEGIES", "MIB",
    "kv_tokens_lost", "call_peak_bytes", "shared_workspace_other_bytes",
    "dense_route_transient_bytes",
]

MIB = 1024**2
BF16_BYTES = 2
FP32_BYTES = 4
#: Every fixed canonical strategy (:func:`mla_lab.placement.fixed_strategies`); ``subchunk:<S>`` takes any positive S.
STRATEGIES = tuple(fixed_strategies())


def shared_workspace_other_bytes(rank: RankView) -> int:
    """Bytes the shared workspace holds for its other users at the rank's ``max_num_batched_tokens``: the fused-MoE
    kernel's two scratch buffers (vLLM ``vllm/v1/worker/workspace.py``; DeepGEMM experts in
    ``vllm/model_executor/layers/fused_moe``: ``workspace13 = (M*topk, max(N/2, K))``, ``workspace2 = (M*topk,
    max(N, K))``, bf16, ``N = 2 x`` the local intermediate size by ``moe_parallel``, ``K`` hidden). An estimate of
    the largest other user (the indexer's K-gather scratch is smaller); ``shared_workspace_bytes`` overrides it.
    """
    model = rank.model
    inter = model.moe_intermediate_size if rank.moe_parallel == "ep" else model.moe_intermediate_size // rank.tp
    m = rank.max_num_batched_tokens * model.num_experts_per_tok
    n, k = 2 * inter, model.hidden_size
    return m * (max(n // 2, k) + max(n, k)) * BF16_BYTES


def _padding_of(arch: str | GPUArch | int) -> int:
    if isinstance(arch, int) and not isinstance(arch, bool):
        if arch not in (64, 128):
            raise ValueError(f"prefill_padding={arch!r} must be 64 or 128")
        return arch
    return get_arch(arch).prefill_padding


def padded_num_heads(num_heads: int, arch: str | GPUArch | int = "hopper", kv_cache_dtype: str = "bf16") -> int:
    """Heads of the Q-concat workspace (``q_concat_heads``): :func:`mla_lab.rank.pad_heads` after checking.

    Args:
        num_heads: attention heads on this rank (``num_attention_heads // tp``), > 0.
        arch: arch name/alias, a :class:`GPUArch`, or the ``prefill_padding`` itself (64 or 128).
        kv_cache_dtype: ``bf16`` (``auto``/``bfloat16``) pads; ``fp8`` (``fp8_ds_mla``) does not.

    Raises:
        ValueError: num_heads not a positive int; unknown arch; unsupported kv_cache_dtype.
    """
    check_int("num_heads", num_heads)
    return pad_heads(num_heads, _padding_of(arch), normalize_kv_cache_dtype(kv_cache_dtype))


def kv_tokens_lost(extra_bytes: int, model: ModelConfig, kv_cache_dtype: str = "bf16",
                   include_indexer: bool = True) -> float:
    """``extra_bytes`` of workspace expressed as KV-cache tokens that no longer fit on one rank."""
    return extra_bytes / model.kv_cache_bytes_per_token(kv_cache_dtype, include_indexer)


@dataclass(frozen=True)
class MemoryAccount:
    """Bytes one rank spends on the sparse-prefill Q path for one strategy (one layer's workspace; vLLM shares the
    workspace across layers, so it is allocated once per rank).

    Attributes:
        strategy: canonical strategy name (:mod:`mla_lab.placement`).
        num_heads: real heads per rank (H); q_concat_heads: workspace heads; kernel_heads: h_q the kernel runs at.
        persistent_bytes: held for the engine's life and budgeted before the KV cache (costs KV tokens): the
            Q-concat buffer ``rows * q_concat_heads * head_size * 2`` (rows = max_num_batched_tokens, or S for
            ``subchunk``, twice for ``:graph2``); ``shared_workspace`` (vLLM #56902) only what the padded view adds
            beyond the shared workspace's other users; 0 for ``fa3_sparse`` (no concat buffer); ``packed`` the
            real-head buffer plus the union builder's (:func:`mla_lab.model.packed_kernel.packed_union_bytes`).
        step_transient_bytes: the per-call pad tensor ``T * kernel_heads * head_size * 2`` (``per_call_*``).
        kernel_out_bytes: out + lse + max_logits alive at once, ``T*h*(d_v*2 + 2*4)`` at the kernel's heads
            (``fa3_sparse``: out + lse at the real heads; ``subchunk``: two chunks' outputs plus the delivered
            ``[T, H, d_v]``).
        call_transient_bytes: step_transient + kernel_out, unbudgeted (vLLM's profile run skips the sparse kernel).
        peak_bytes: persistent + call_transient.
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
    route: str = "sparse-mqa"

    @property
    def call_transient_bytes(self) -> int:
        return self.step_transient_bytes + self.kernel_out_bytes

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.call_transient_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["peak_bytes"] = self.peak_bytes
        d["call_transient_bytes"] = self.call_transient_bytes
        return d


def memory_account(
    strategy: Strategy | str,
    num_heads: int,
    max_num_batched_tokens: int,
    arch: str | GPUArch | int = "hopper",
    kv_cache_dtype: str = "bf16",
    num_tokens: int | None = None,
    head_size: int = 576,
    d_v: int = 512,
    shared_other_bytes: int = 0,
    model: ModelConfig | None = None,
    prompt_len: int | None = None,
) -> MemoryAccount:
    """Exact byte accounting for one strategy, allocating nothing.

    Args:
        strategy: a :class:`~mla_lab.placement.Strategy` or canonical name; num_heads: real heads per rank (H).
        max_num_batched_tokens: workspace rows; num_tokens: T of the step, 0..max_num_batched_tokens (default all).
        arch, kv_cache_dtype: as :func:`padded_num_heads` (fp8 KV cache: no padding).
        head_size, d_v: 576 and 512 (absorbed MLA).
        shared_other_bytes: ``shared_workspace`` only: the workspace's other users (:func:`shared_workspace_other_bytes`).
        model, prompt_len: with both, the step's route (:func:`mla_lab.placement.strategy_route`): on a dense MHA
            route nothing is padded and the transient is :func:`dense_route_transient_bytes`.

    Raises:
        ValueError: unknown strategy; non-positive sizes; num_tokens out of range; as :func:`padded_num_heads`.
    """
    st = as_strategy(strategy)
    check_int("max_num_batched_tokens", max_num_batched_tokens)
    check_int("head_size", head_size)
    check_int("d_v", d_v)
    check_int("shared_other_bytes", shared_other_bytes, allow_zero=True)
    T = max_num_batched_tokens if num_tokens is None else num_tokens
    check_int("num_tokens", T, allow_zero=True)
    if T > max_num_batched_tokens:
        raise ValueError(f"num_tokens={T} exceeds max_num_batched_tokens={max_num_batched_tokens}; "
                         f"allowed: 0..{max_num_batched_tokens}")
    if model is not None and prompt_len is not None:
        check_int("prompt_len", prompt_len)
    kvd = normalize_kv_cache_dtype(kv_cache_dtype)
    return _account(st, num_heads, padded_num_heads(num_heads, arch, kvd), kvd, max_num_batched_tokens, T, head_size,
                    d_v, shared_other_bytes, model, prompt_len)


def memory_account_of(rank: RankView, strategy: Strategy | str, shared_other_bytes: int,
                      prompt_len: int | None, union_bytes: int | None = None) -> MemoryAccount:
    """:func:`memory_account` of one TP rank (:class:`~mla_lab.rank.RankView`, derived from a checked
    Deployment) at its ``max_num_batched_tokens`` (``num_tokens`` = the workspace rows), with the model's head_size
    and d_v: nothing re-checked. ``shared_other_bytes`` a checked non-negative int; ``prompt_len`` the deployment's
    (or None: the padded route); ``union_bytes``: ``packed`` only, the union builder's buffers and scratch
    (:func:`mla_lab.model.packed_kernel.packed_union_bytes`; 0 where the heads cannot be packed).

    Raises:
        ValueError: ``packed`` without ``union_bytes`` (its account needs them).
    """
    m = rank.model
    return _account(as_strategy(strategy), rank.num_heads, rank.padded_num_heads, rank.kv_cache_dtype,
                    rank.max_num_batched_tokens, rank.max_num_batched_tokens, m.head_size, m.d_v, shared_other_bytes,
                    m, prompt_len, union_bytes)


def _account(st: Strategy, H: int, hp: int, kvd: str, max_num_batched_tokens: int, T: int, head_size: int, d_v: int,
             shared_other_bytes: int, model: ModelConfig | None, prompt_len: int | None,
             union_bytes: int | None = None) -> MemoryAccount:
    padded = hp != H and kvd == "bf16"
    row = head_size * BF16_BYTES
    out_per_token = d_v * BF16_BYTES + 2 * FP32_BYTES
    unpadded = max_num_batched_tokens * H * row
    kernel_heads, q_heads, transient = hp, H, 0
    kernel_out = T * hp * out_per_token
    if st.per_call_pad:
        persistent = unpadded
        transient = T * hp * row if padded else 0
    elif st.placement == "private_workspace":
        q_heads, persistent = hp, max_num_batched_tokens * hp * row
    elif st.placement == "shared_workspace":
        # after vLLM #56902 the padded view is taken per call at offset 0 of the shared workspace: no separate
        # unpadded Q buffer remains; only what the padded view needs beyond the workspace's other users is extra
        q_heads = hp
        persistent = max(0, max_num_batched_tokens * hp * row - shared_other_bytes)
    elif st.placement == "subchunk":
        # chunked whether or not heads are padded (the path runs the same code): an S-row workspace, two chunks'
        # kernel outputs alive at once, and (copy hand-off) the step's [T, H, d_v] output and [T, H] lse
        q_heads = hp
        S = min(st.rows, max_num_batched_tokens)
        persistent = st.workspaces * S * hp * row  # graph2: two S-row workspaces (chunk i on stream i % 2)
        n_chunks = -(-T // S) if T else 0
        delivered = 0 if st.views_handoff else T * H * (d_v * BF16_BYTES + FP32_BYTES)
        kernel_out = min(2, n_chunks) * min(S, T) * hp * out_per_token + delivered
    elif st.placement == "fa3_sparse":
        # FA3 takes q_nope / q_rope as they are (no concat buffer) and writes out [T, H, d_v] + lse [T, H]
        kernel_heads = H
        persistent = 0
        kernel_out = T * H * (d_v * BF16_BYTES + FP32_BYTES)
    elif st.placement == "packed":
        # the lab's packed kernel: Q concatenated at the real heads (as kernel_native), the union builder's buffers
        # and scratch at max_num_batched_tokens, no padded workspace; out + lse at the real heads
        if union_bytes is None:
            raise ValueError("strategy='packed' needs union_bytes (its union buffers and scratch); allowed: the "
                             "account of mla_lab.model.memory.memory_tradeoff / buffers.memory_account_of(..., "
                             "union_bytes=mla_lab.model.packed_kernel.packed_union_bytes(rank, prompt_len))")
        kernel_heads = H
        persistent = unpadded + union_bytes
        kernel_out = T * H * (d_v * BF16_BYTES + FP32_BYTES)
    else:  # kernel_native
        kernel_heads = H
        persistent = unpadded
        kernel_out = T * H * out_per_token
    route = "sparse-mqa"
    if model is not None and prompt_len is not None and T:
        route = strategy_route(st, model, model.topk, [prompt_len], [min(prompt_len, max_num_batched_tokens)])
        if route in ("mha-dense", "mha-masked"):
            transient, kernel_heads = 0, H
            kernel_out = dense_route_transient_bytes(model, H, T, T)
    return MemoryAccount(
        strategy=st.name, num_heads=H, q_concat_heads=q_heads if padded else H, kernel_heads=kernel_heads,
        max_num_batched_tokens=max_num_batched_tokens, num_tokens=T, head_size=head_size, d_v=d_v,
        persistent_bytes=persistent, step_transient_bytes=transient, kernel_out_bytes=kernel_out, route=route,
    )


def dense_route_transient_bytes(model: ModelConfig, num_heads: int, num_tokens: int, num_keys: int) -> int:
    """Transient bytes of one dense-MHA layer call (bf16; vLLM ``forward_mha`` / SGLang ``_forward_standard_mha``):
    the ``kv_b_proj`` output ``[Tk, H, qk_nope + v]``, the assembled ``k [Tk, H, qk_nope + qk_rope]``, the output
    ``[T, H, v]`` and lse ``[T, H]`` fp32 (``Tk = num_keys`` up-projected, ``T = num_tokens`` queries). None of it is
    budgeted by vLLM's profile run (it runs no attention: ``attn_metadata=None``)."""
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    H = num_heads
    return (num_keys * H * (dn + dv) + num_keys * H * (dn + dr) + num_tokens * H * dv) * BF16_BYTES \
        + num_tokens * H * FP32_BYTES


class QConcatWorkspace:
    """A ``(max_num_batched_tokens, q_concat_heads, head_size)`` buffer allocated once; hands out ``[:T]`` views.

    The real heads occupy ``[:, :num_heads]``; :func:`mla_lab.kernels.concat_mla_q` never writes the padded ones.
    ``zero_init=True`` (default) zeroes the buffer once, so they stay zero: FlashMLA's sparse prefill ran 12 % faster
    with zero padded heads than with random ones on an H200 (GLM-5 TP8, T = 16384: 7.19 vs 8.14 ms;
    ``data/measured/h200/layer_run2/layer_extras.csv``, ``kernel_pad_values``); ``False`` is ``torch.empty``, as vLLM.

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


def call_peak_bytes(strategy: Strategy | str, num_heads: int, max_num_batched_tokens: int, arch: str | GPUArch, num_tokens: int,
                    model: ModelConfig) -> int:
    """Analytic extra bytes of one measured layer call of the attention path at step size ``num_tokens``: what
    ``torch.cuda.max_memory_allocated`` should add above the inputs and the persistent workspace — the call's
    transient peak (:attr:`MemoryAccount.call_transient_bytes`: the per-call pad tensor and the kernel's padded
    ``out [T, H', d_v]`` bf16 with ``max_logits`` / ``lse [T, H']`` fp32, handed on as views; for ``subchunk`` two
    chunks' outputs and the step's output). Bytes."""
    acc = memory_account(strategy, num_heads, max_num_batched_tokens, arch, "bf16", num_tokens=num_tokens,
                         head_size=model.head_size, d_v=model.d_v)
    return acc.call_transient_bytes
