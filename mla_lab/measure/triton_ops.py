"""Triton stand-ins for the layer ops torch has no single kernel for: ``rmsnorm`` (with the residual add: vLLM's
``fused_add_rms_norm``), ``silu_mul`` (``SiluAndMul``), ``mqa_logits`` (the DSA indexer's logits over one causal
prompt); :func:`check_kernels` against torch. CPU runs need ``TRITON_INTERPRET=1`` set before import.
"""

from __future__ import annotations

import functools
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F


@functools.cache
def triton_kernels():
    """The three ``triton.jit`` kernels (``rmsnorm``, ``silu_mul``, ``mqa_logits``), decorated on the first call;
    launch them through the wrappers below.

    Raises:
        ImportError: triton is not installed.
    """
    import types

    import triton
    import triton.language as tl

    @triton.jit
    def rmsnorm_kernel(x_ptr, r_ptr, w_ptr, o_ptr, N, sx, sr, so, eps, ADD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        m = offs < N
        x = tl.load(x_ptr + row * sx + offs, mask=m, other=0.0).to(tl.float32)
        if ADD:
            r = tl.load(r_ptr + row * sr + offs, mask=m, other=0.0).to(tl.float32)
            x = x + r
            tl.store(r_ptr + row * sr + offs, x.to(r_ptr.dtype.element_ty), mask=m)
        var = tl.sum(x * x, axis=0) / N
        w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        y = x * (1.0 / tl.sqrt(var + eps)) * w
        tl.store(o_ptr + row * so + offs, y.to(o_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def silu_mul_kernel(x_ptr, o_ptr, N, sx, so, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = col < N
        g = tl.load(x_ptr + row * sx + col, mask=m, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * sx + N + col, mask=m, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(o_ptr + row * so + col, y.to(o_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def mqa_logits_kernel(q_ptr, k_ptr, w_ptr, o_ptr, T, S, sq_t, sq_h, sk_s, sw_t, so_t,
                          NH: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        # logits[t, s] = sum_h w[t, h] * relu(q[t, h, :] . k[s, :]) for s <= t (one causal prompt), -inf above.
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        m0 = pid_m * BM
        n0 = pid_n * BN
        if n0 <= m0 + BM - 1:
            offs_m = m0 + tl.arange(0, BM)
            offs_n = n0 + tl.arange(0, BN)
            offs_d = tl.arange(0, D)
            mm = offs_m < T
            nm = offs_n < S
            kt = tl.load(k_ptr + offs_n[:, None] * sk_s + offs_d[None, :], mask=nm[:, None], other=0.0)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for h in range(NH):
                q = tl.load(q_ptr + offs_m[:, None] * sq_t + h * sq_h + offs_d[None, :], mask=mm[:, None], other=0.0)
                s = tl.dot(q, tl.trans(kt))
                w = tl.load(w_ptr + offs_m * sw_t + h, mask=mm, other=0.0)
                acc += tl.maximum(s, 0.0) * w[:, None]
            acc = tl.where(offs_n[None, :] <= offs_m[:, None], acc, float("-inf"))
            tl.store(o_ptr + offs_m[:, None] * so_t + offs_n[None, :], acc, mask=mm[:, None] & nm[None, :])

    return types.SimpleNamespace(rmsnorm=rmsnorm_kernel, silu_mul=silu_mul_kernel, mqa_logits=mqa_logits_kernel)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None = None,
            eps: float = 1e-6) -> torch.Tensor:
    """``out [M, N] = s / sqrt(mean(s^2) + eps) * weight [N]`` per row in fp32, ``s = x [M, N]`` (last dim
    contiguous; a column slice works) or ``x + residual`` (``residual`` overwritten with ``s``). One dtype
    (bf16/fp16/fp32). Returns ``out``."""
    import triton

    M, N = x.shape
    BLOCK = triton.next_power_of_2(N)
    num_warps = 16 if BLOCK >= 8192 else (8 if BLOCK >= 2048 else 4)
    r = residual if residual is not None else x
    triton_kernels().rmsnorm[(M,)](x, r, weight, out, N, x.stride(0), r.stride(0), out.stride(0), eps,
                                   ADD=residual is not None, BLOCK=BLOCK, num_warps=num_warps)
    return out


def silu_mul(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """vLLM's ``SiluAndMul``: ``out = silu(x[:, :N]) * x[:, N:]`` (fp32 math) for ``x [M, 2N]``, ``out [M, N]``
    (last dims contiguous, one dtype). Returns ``out``."""
    import triton

    M, N2 = x.shape
    N = N2 // 2
    BLOCK = min(1024, triton.next_power_of_2(N))
    triton_kernels().silu_mul[(M, triton.cdiv(N, BLOCK))](x, out, N, x.stride(0), out.stride(0), BLOCK=BLOCK,
                                                          num_warps=4)
    return out


def mqa_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, out: torch.Tensor,
               interpret: bool = False) -> torch.Tensor:
    """``out[t, s] = sum_h weights[t, h] relu(q[t, h] . k[s])`` for ``s <= t`` (``-inf`` above the diagonal in
    computed blocks, untouched in blocks wholly above it). ``q [T, NH, D]`` (D a power of two >= 16), ``k [S, D]``,
    ``weights [T, NH]`` fp32, ``out [T, S]`` fp32, last dims contiguous; ``interpret``: 16 x 16 blocks for Triton's
    interpreter. Returns ``out``."""
    import triton

    T, NH, D = q.shape
    S = k.shape[0]
    BM, BN = (16, 16) if interpret else (128, 64)
    grid = (triton.cdiv(T, BM), triton.cdiv(S, BN))
    triton_kernels().mqa_logits[grid](q, k, weights, out, T, S, q.stride(0), q.stride(1), k.stride(0),
                                      weights.stride(0), out.stride(0), NH=NH, D=D, BM=BM, BN=BN,
                                      **({} if interpret else {"num_warps": 8, "num_stages": 2}))
    return out


class KernelCheck(NamedTuple):
    """``error``: the output's relative L2 error against torch; ``aux_error``: the residual's (``rmsnorm_add``), 1.0
    when ``mqa_logits``'s mask is wrong, else 0.0."""

    name: str
    error: float
    aux_error: float


def check_kernels(device: str, dtype: torch.dtype, interpret: bool, with_mqa: bool = True,
                  seed: int | None = None) -> list[KernelCheck]:
    """The kernels on random odd-shaped inputs (NaN-poisoned outputs) against torch in fp32: ``[rmsnorm_add,
    silu_mul, mqa_logits]`` (the last only ``with_mqa``). ``seed`` None: a new seed each run (``time.time()``)."""
    generator = torch.Generator(device=device).manual_seed(int(time.time()) % 10000 if seed is None else seed)
    checks = []
    x = torch.randn(37, 300, device=device, dtype=dtype, generator=generator)
    r = torch.randn(37, 300, device=device, dtype=dtype, generator=generator)
    w = torch.randn(300, device=device, dtype=dtype, generator=generator)
    o = torch.full_like(x, float("nan"))
    r2 = r.clone()
    rmsnorm(x, w, o, residual=r2)
    s = x.float() + r.float()
    ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    checks.append(KernelCheck("rmsnorm_add", float((o.float() - ref).norm() / ref.norm()),
                              float((r2.float() - s).norm() / s.norm())))
    xx = torch.randn(19, 2 * 70, device=device, dtype=dtype, generator=generator)
    o = torch.full((19, 70), float("nan"), device=device, dtype=dtype)
    silu_mul(xx, o)
    ref = F.silu(xx[:, :70].float()) * xx[:, 70:].float()
    checks.append(KernelCheck("silu_mul", float((o.float() - ref).norm() / ref.norm()), 0.0))
    if not with_mqa:
        return checks
    T, NH, D = 40, 4, 32
    q = torch.randn(T, NH, D, device=device, dtype=dtype, generator=generator)
    keys = torch.randn(T, D, device=device, dtype=dtype, generator=generator)
    head_weights = torch.rand(T, NH, device=device, dtype=torch.float32, generator=generator)
    o = torch.full((T, T), float("nan"), device=device, dtype=torch.float32)
    mqa_logits(q, keys, head_weights, o, interpret=interpret)
    ref = (torch.relu(torch.einsum("thd,sd->ths", q.float(), keys.float())) * head_weights[:, :, None]).sum(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    err = float((o[causal] - ref[causal]).norm() / ref[causal].norm())
    # above the diagonal: -inf inside computed blocks, untouched (still the NaN poison) in skipped blocks
    above = o[~causal]
    mask_ok = bool((torch.isneginf(above) | above.isnan()).all()) and not bool(o[causal].isnan().any())
    checks.append(KernelCheck("mqa_logits", err, 0.0 if mask_ok else 1.0))
    return checks


class KernelCheckError(RuntimeError):
    """A Triton kernel the layer cannot do without (rmsnorm, silu_mul) failed or is wrong."""
