"""The two real ways to feed FlashMLA's sparse prefill kernel fewer than 64/128 heads, run on real tensors.

- ``unfused`` (vLLM before PR #53878): ``concat_mla_q`` into an ``H``-head workspace; then, on every layer call, a
  fresh ``(T, H', 576)`` tensor is allocated, its padded heads zeroed (``q.new_zeros``, as current vLLM does for
  the remaining padded path) and the real heads copied in; the kernel runs at ``H'`` heads; the output is sliced
  back to ``H``.
- ``fused`` (the PR): ``concat_mla_q`` writes the real heads straight into a workspace allocated once with ``H'``
  heads (:class:`~mla_lab.buffers.QConcatWorkspace`); the kernel gets the ``[:T]`` view and ``actual_num_heads=H``.
  The workspace is zeroed once at allocation (:class:`~mla_lab.buffers.QConcatWorkspace` ``zero_init``), so its
  padded heads stay zero (vLLM leaves them uninitialized; the kernel's time depends on their contents, see
  buffers); pass ``zero_padding=True`` to have the concat zero them on every call instead.

Both return the attention output for the real heads, ``[T, H, d_v]`` bf16, which must be identical.
"""

from __future__ import annotations

from dataclasses import dataclass

from .buffers import QConcatWorkspace, padded_num_heads
from .kernels import concat_mla_q, sparse_mla_prefill

__all__ = ["PrefillStrategy", "UnfusedStrategy", "FusedStrategy", "make_strategy", "REAL_STRATEGIES", "equivalence_check"]

REAL_STRATEGIES = ("unfused", "fused")


@dataclass
class PrefillStrategy:
    """Common state: ``num_heads`` real heads, ``max_num_batched_tokens`` rows, ``arch``/``kv_cache_dtype`` for the
    padding rule, head_size 576 (kv_lora_rank 512 + qk_rope_head_dim 64), device and dtype of the workspace."""

    num_heads: int
    max_num_batched_tokens: int
    arch: str = "hopper"
    kv_cache_dtype: str = "bf16"
    head_size: int = 576
    device: str = "cpu"
    dtype: object = None
    kernel_backend: str = "auto"
    concat_backend: str = "auto"

    name = "base"
    pad_workspace = False

    def __post_init__(self):
        self.workspace = QConcatWorkspace(self.max_num_batched_tokens, self.num_heads, self.arch,
                                          self.kv_cache_dtype, self.head_size, self.device, self.dtype,
                                          pad=self.pad_workspace)

    @property
    def padded_heads(self) -> int:
        return padded_num_heads(self.num_heads, self.arch, self.kv_cache_dtype)

    def _check_heads(self, ql_nope, q_pe):
        for name, t in (("ql_nope", ql_nope), ("q_pe", q_pe)):
            if getattr(t, "dim", lambda: 0)() != 3 or t.shape[1] != self.num_heads:
                raise ValueError(f"{name}.shape={tuple(getattr(t, 'shape', ()))} must be [T, num_heads={self.num_heads}, "
                                 f"{512 if name == 'ql_nope' else 64}] for this strategy")

    def __call__(self, ql_nope, q_pe, kv, indices, sm_scale: float, topk_length=None):
        """Run the prefill attention path.

        Args:
            ql_nope: ``[T, H, 512]`` bf16 (``H = num_heads``); q_pe: ``[T, H, 64]`` bf16; strided token/head dims ok.
            kv: ``[s_kv, 1, 576]`` bf16 latent cache; indices: ``[T, 1, topk]`` int32 (-1 = invalid);
            sm_scale: softmax scale; topk_length: optional ``[T]`` int32.

        Returns:
            ``(out [T, H, 512] bf16, lse [T, H] fp32)`` for the real heads.

        Raises:
            ValueError: ql_nope/q_pe do not hold ``num_heads`` heads; T exceeds the workspace; as
                :func:`mla_lab.kernels.concat_mla_q` and :func:`mla_lab.kernels.sparse_mla_prefill`.
        """
        raise NotImplementedError


class UnfusedStrategy(PrefillStrategy):
    name = "unfused"

    def __call__(self, ql_nope, q_pe, kv, indices, sm_scale, topk_length=None):
        self._check_heads(ql_nope, q_pe)
        T = ql_nope.shape[0]
        q = self.workspace.view(T)
        concat_mla_q(ql_nope, q_pe, q, backend=self.concat_backend)
        hp = self.padded_heads
        if hp > self.num_heads:
            q_padded = q.new_zeros((T, hp, self.head_size))
            q_padded[:, : self.num_heads] = q
            q = q_padded
        out, _, lse = sparse_mla_prefill(q, kv, indices, sm_scale, topk_length=topk_length,
                                         actual_num_heads=self.num_heads, backend=self.kernel_backend)
        return out, lse


class FusedStrategy(PrefillStrategy):
    name = "fused"
    pad_workspace = True
    zero_padding: bool = False

    def __call__(self, ql_nope, q_pe, kv, indices, sm_scale, topk_length=None):
        self._check_heads(ql_nope, q_pe)
        T = ql_nope.shape[0]
        q = self.workspace.view(T)
        concat_mla_q(ql_nope, q_pe, q, zero_padding=self.zero_padding, backend=self.concat_backend)
        out, _, lse = sparse_mla_prefill(q, kv, indices, sm_scale, topk_length=topk_length,
                                         actual_num_heads=self.num_heads, backend=self.kernel_backend)
        return out, lse


def make_strategy(name: str, **kwargs) -> PrefillStrategy:
    """Build ``unfused`` or ``fused`` (``zero_padding=True`` only for fused); kwargs as :class:`PrefillStrategy`.

    Raises:
        ValueError: unknown name (``kernel_native`` is modelled only: no kernel takes the real head count).
    """
    zero_padding = kwargs.pop("zero_padding", False)
    if name == "unfused":
        if zero_padding:
            raise ValueError("zero_padding=True applies only to strategy='fused'")
        return UnfusedStrategy(**kwargs)
    if name == "fused":
        s = FusedStrategy(**kwargs)
        s.zero_padding = bool(zero_padding)
        return s
    raise ValueError(f"strategy={name!r} cannot be run on tensors; allowed: {list(REAL_STRATEGIES)} "
                     "('kernel_native' is modelled only)")


def equivalence_check(num_heads: int = 8, arch: str = "hopper", num_tokens: int = 24, s_kv: int = 96,
                      topk: int = 32, seed: int = 0, device: str = "cpu") -> dict:
    """Run ``unfused`` and ``fused`` on the same random inputs (with invalid indices and causal topk_length) and
    compare their real-head outputs and lse. Padded heads of the fused workspace are poisoned with NaN first, so a
    leak from uninitialized heads would show.

    Returns ``{"num_heads", "padded_heads", "max_abs_diff_out", "max_abs_diff_lse", "equal"}`` (``equal`` is exact
    equality, NaN-aware for the +inf lse of empty rows).
    """
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    T = num_tokens
    ql_nope = torch.randn(T, num_heads, 512, generator=g).to(torch.bfloat16).to(device)
    q_pe = torch.randn(T, num_heads, 64, generator=g).to(torch.bfloat16).to(device)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(torch.bfloat16).to(device)
    idx = torch.randint(-1, s_kv + 8, (T, 1, topk), generator=g, dtype=torch.int32).to(device)
    idx[0] = -1  # a row with no valid index
    topk_length = torch.clamp(torch.arange(1, T + 1, dtype=torch.int32), max=topk).to(device)
    kw = dict(num_heads=num_heads, max_num_batched_tokens=T, arch=arch, device=device)
    unf = make_strategy("unfused", **kw)
    fus = make_strategy("fused", **kw)
    fus.workspace.buffer.fill_(float("nan"))
    sm_scale = 576 ** -0.5
    out_u, lse_u = unf(ql_nope, q_pe, kv, idx, sm_scale, topk_length)
    out_f, lse_f = fus(ql_nope, q_pe, kv, idx, sm_scale, topk_length)
    d_out = (out_u.float() - out_f.float()).abs().max().item()
    finite = torch.isfinite(lse_u)
    d_lse = (lse_u[finite] - lse_f[finite]).abs().max().item() if finite.any() else 0.0
    equal = bool(torch.equal(out_u, out_f) and torch.equal(torch.isinf(lse_u), torch.isinf(lse_f)) and d_lse == 0.0)
    return {"num_heads": num_heads, "padded_heads": fus.padded_heads, "max_abs_diff_out": d_out,
            "max_abs_diff_lse": d_lse, "equal": equal}
