"""The padded Q-concat workspace (vLLM PR #53878, ``flashmla_sparse.py``) and its byte accounting. Bytes; Q bf16,
``head_size`` 576 (kv_lora_rank 512 + rope 64), output ``d_v`` 512 bf16, lse and max_logits fp32."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ._validate import check_int
from .arch import GPUArch, get_arch
from .models import ModelConfig, normalize_kv_cache_dtype
from .placement import Strategy, as_strategy, strategy_route
from .rank import RankView, pad_heads

__all__ = ["memory_account_of", "padded_num_heads", "QConcatWorkspace", "MemoryAccount", "memory_account", "MIB",
           "call_peak_bytes", "shared_workspace_other_bytes", "dense_route_transient_bytes"]

MIB = 1024**2
BF16_BYTES = 2
FP32_BYTES = 4


def shared_workspace_other_bytes(rank: RankView) -> int:
    """Bytes the shared workspace holds for its largest other user, the fused-MoE scratch (vLLM
    ``vllm/model_executor/layers/fused_moe``: ``(M*topk, max(N/2, K)) + (M*topk, max(N, K))`` bf16); an estimate."""
    model = rank.model
    inter = model.moe_intermediate_size if rank.moe_parallel == "ep" else model.moe_intermediate_size // rank.tp
    m = rank.max_num_batched_tokens * model.num_experts_per_tok
    n, k = 2 * inter, model.hidden_size
    return m * (max(n // 2, k) + max(n, k)) * BF16_BYTES


def padded_num_heads(num_heads: int, arch: str | GPUArch | int = "hopper", kv_cache_dtype: str = "bf16") -> int:
    """``q_concat_heads``: :func:`mla_lab.rank.pad_heads` for an arch, a :class:`GPUArch` or a ``prefill_padding``
    (64 / 128); fp8 KV does not pad. Raises ValueError: bad num_heads, arch or kv_cache_dtype."""
    check_int("num_heads", num_heads)
    if isinstance(arch, int) and not isinstance(arch, bool) and arch not in (64, 128):
        raise ValueError(f"prefill_padding={arch!r} must be 64 or 128")
    pad = arch if isinstance(arch, int) and not isinstance(arch, bool) else get_arch(arch).prefill_padding
    return pad_heads(num_heads, pad, normalize_kv_cache_dtype(kv_cache_dtype))


@dataclass(frozen=True)
class MemoryAccount:
    """Bytes one rank spends on the sparse-prefill Q path for one strategy (one workspace per rank).

    Attributes:
        persistent_bytes: budgeted before the KV cache: the Q-concat buffer ``rows * q_concat_heads * head_size * 2``
            (``shared_workspace``: beyond the workspace's other users; ``packed``: plus the union builder's).
        step_transient_bytes: the per-call pad tensor (``per_call_*``).
        kernel_out_bytes: out + lse + max_logits alive at once at the kernel's heads.
        call_transient_bytes: step_transient + kernel_out, unbudgeted (vLLM's profile run skips the kernel).
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

    call_transient_bytes = property(lambda self: self.step_transient_bytes + self.kernel_out_bytes)
    peak_bytes = property(lambda self: self.persistent_bytes + self.call_transient_bytes)

    def to_dict(self) -> dict:
        return asdict(self) | {"peak_bytes": self.peak_bytes, "call_transient_bytes": self.call_transient_bytes}


def memory_account(strategy: Strategy | str, num_heads: int, max_num_batched_tokens: int,
                   arch: str | GPUArch | int = "hopper", kv_cache_dtype: str = "bf16", num_tokens: int | None = None,
                   head_size: int = 576, d_v: int = 512, shared_other_bytes: int = 0, model: ModelConfig | None = None,
                   prompt_len: int | None = None) -> MemoryAccount:
    """Exact byte accounting for one strategy, allocating nothing. ``num_tokens`` T (default all rows);
    ``shared_other_bytes``: see :func:`shared_workspace_other_bytes`; with ``model`` and ``prompt_len`` a dense MHA
    route pads nothing. Raises ValueError: unknown strategy; bad sizes; num_tokens out of range."""
    st = as_strategy(strategy)
    for name, v in (("max_num_batched_tokens", max_num_batched_tokens), ("head_size", head_size), ("d_v", d_v)):
        check_int(name, v)
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
                      prompt_len: int | None) -> MemoryAccount:
    """:func:`memory_account` of a checked rank at its full budget, unchecked, with the kind's ``extra_bytes``."""
    m, st = rank.model, as_strategy(strategy)
    extra = st.kind.extra_bytes(rank, prompt_len) if st.kind.extra_bytes else 0
    return _account(st, rank.num_heads, rank.padded_num_heads, rank.kv_cache_dtype, rank.max_num_batched_tokens,
                    rank.max_num_batched_tokens, m.head_size, m.d_v, shared_other_bytes, m, prompt_len, extra)


@dataclass(frozen=True)
class QShape:
    """What a :class:`~mla_lab.placement.StrategyKind`'s ``memory`` hook reads: ``H`` real heads, ``hp`` the padded
    kernel's heads, ``rows`` max_num_batched_tokens, ``T`` the call's tokens, ``padded`` (hp != H on bf16 KV),
    ``shared_other_bytes``; ``row`` Q bytes per head (bf16), ``out`` out + lse + max_logits bytes per head,
    ``out_lse`` out + lse (real-head kernels), ``unpadded`` the ``[rows, H, head_size]`` Q buffer."""

    H: int
    hp: int
    rows: int
    T: int
    head_size: int
    d_v: int
    padded: bool
    shared_other_bytes: int

    row = property(lambda s: s.head_size * BF16_BYTES)
    out = property(lambda s: s.d_v * BF16_BYTES + 2 * FP32_BYTES)
    out_lse = property(lambda s: s.d_v * BF16_BYTES + FP32_BYTES)
    unpadded = property(lambda s: s.rows * s.H * s.row)


def _layout_bytes(layout: str, s: QShape) -> dict:
    """The account of a layout (``persistent``, ``transient``, ``q_heads``, ``kernel_heads``, ``kernel_out``)."""
    if layout == "per_call":  # the [rows, H] Q buffer and a [T, hp] pad tensor per call
        return dict(persistent=s.unpadded, transient=s.T * s.hp * s.row if s.padded else 0, q_heads=s.H,
                    kernel_heads=s.hp, kernel_out=s.T * s.hp * s.out)
    if layout == "workspace":  # a [rows, hp] padded workspace
        return dict(persistent=s.rows * s.hp * s.row, transient=0, q_heads=s.hp, kernel_heads=s.hp,
                    kernel_out=s.T * s.hp * s.out)
    return dict(persistent=s.unpadded, transient=0, q_heads=s.H, kernel_heads=s.H, kernel_out=s.T * s.H * s.out)


def _account(st: Strategy, H: int, hp: int, kvd: str, max_num_batched_tokens: int, T: int, head_size: int, d_v: int,
             shared_other_bytes: int, model: ModelConfig | None, prompt_len: int | None,
             extra: int | None = None) -> MemoryAccount:
    """The layout's account, the kind's ``memory`` over it, plus its ``extra_bytes``; a dense route pads nothing.
    Raises ValueError: a kind with ``extra_bytes`` and ``extra`` None (no rank to compute it from)."""
    if extra is None and st.kind.extra_bytes:
        raise ValueError(f"strategy={st.name!r} needs union_bytes (its kind's extra_bytes: union buffers and "
                         "scratch); allowed: the accounts of mla_lab.model.memory.memory_tradeoff or "
                         "buffers.memory_account_of(rank, ...)")
    padded = hp != H and kvd == "bf16"
    s = QShape(H, hp, max_num_batched_tokens, T, head_size, d_v, padded, shared_other_bytes)
    b = _layout_bytes(st.kind.layout, s) | (st.kind.memory(st, s) if st.kind.memory else {})
    route = "sparse-mqa"
    if model is not None and prompt_len is not None and T:
        route = strategy_route(st, model, model.topk, [prompt_len], [min(prompt_len, max_num_batched_tokens)])
        if route in ("mha-dense", "mha-masked"):
            b |= dict(transient=0, kernel_heads=H, kernel_out=dense_route_transient_bytes(model, H, T, T))
    return MemoryAccount(
        strategy=st.name, num_heads=H, q_concat_heads=b["q_heads"] if padded else H, kernel_heads=b["kernel_heads"],
        max_num_batched_tokens=max_num_batched_tokens, num_tokens=T, head_size=head_size, d_v=d_v,
        persistent_bytes=b["persistent"] + (extra or 0), step_transient_bytes=b["transient"],
        kernel_out_bytes=b["kernel_out"], route=route,
    )


def dense_route_transient_bytes(model: ModelConfig, num_heads: int, num_tokens: int, num_keys: int) -> int:
    """Transient bytes of one dense-MHA layer call (vLLM ``forward_mha``): ``kv_b_proj`` out ``[Tk, H, nope + v]``,
    ``k [Tk, H, nope + rope]``, out ``[T, H, v]`` bf16 and lse ``[T, H]`` fp32; unbudgeted by vLLM."""
    dn, dr, dv = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
    H = num_heads
    return (num_keys * H * (dn + dv) + num_keys * H * (dn + dr) + num_tokens * H * dv) * BF16_BYTES \
        + num_tokens * H * FP32_BYTES


class QConcatWorkspace:
    """A ``(max_num_batched_tokens, q_concat_heads, head_size)`` bf16/fp16 buffer allocated once; hands out ``[:T]``
    views. ``pad=False``: ``num_heads`` wide. ``zero_init`` (default) keeps the padded heads zero (FlashMLA ran 12 %
    faster so on an H200: ``data/measured/h200/layer_run2/layer_extras.csv``); False is ``torch.empty``, as vLLM.
    Raises ValueError: as :func:`padded_num_heads`; dtype not bf16/fp16."""

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

    #: Bytes held: ``max_num_batched_tokens * q_concat_heads * head_size * element_size``.
    nbytes = property(lambda self: self.buffer.numel() * self.buffer.element_size())

    def view(self, num_tokens: int):
        """``[:num_tokens]``, a view. Raises ValueError: not an int in 0..max_num_batched_tokens."""
        check_int("num_tokens", num_tokens, allow_zero=True)
        if num_tokens > self.max_num_batched_tokens:
            raise ValueError(f"num_tokens={num_tokens} exceeds the workspace's max_num_batched_tokens="
                             f"{self.max_num_batched_tokens}; allowed: 0..{self.max_num_batched_tokens}")
        return self.buffer[:num_tokens]

    def __repr__(self) -> str:
        return (f"QConcatWorkspace(max_num_batched_tokens={self.max_num_batched_tokens}, num_heads={self.num_heads}, "
                f"q_concat_heads={self.q_concat_heads}, head_size={self.head_size}, dtype={self.buffer.dtype}, "
                f"device={self.buffer.device}, {self.nbytes / MIB:.1f} MiB)")


def call_peak_bytes(strategy: Strategy | str, num_heads: int, max_num_batched_tokens: int, arch: str | GPUArch,
                    num_tokens: int, model: ModelConfig) -> int:
    """Bytes ``torch.cuda.max_memory_allocated`` should add above inputs and workspace for one attention-path call
    (:attr:`MemoryAccount.call_transient_bytes`)."""
    return memory_account(strategy, num_heads, max_num_batched_tokens, arch, "bf16", num_tokens=num_tokens,
                          head_size=model.head_size, d_v=model.d_v).call_transient_bytes
