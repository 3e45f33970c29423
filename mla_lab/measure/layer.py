"""The per-rank layer runner: every op of :func:`mla_lab.model.ops.layer_ops` at its real shape, and the layer end
to end, on one GPU (or on CPU through the Triton interpreter, to check the logic).

What is here (the measurements that calibrate and validate :mod:`mla_lab.model`; ``benchmarks/bench_layer.py`` is
the command line over it, :mod:`.layer_experiments` the extra experiments, :mod:`.validate` the fit):

- Triton kernels for the ops torch has no single kernel for, defined on first use (:func:`triton_kernels`):
  :func:`rmsnorm` (optionally fused with the residual add), :func:`silu_mul` and :func:`mqa_logits` (the DSA
  indexer's weighted-ReLU MQA logits over one causal prompt). :func:`check_kernels` compares them with torch; :func:`run_kernel_checks` records the
  comparison and says which kernels are too wrong to time.
- :class:`Layer`: random bf16 weights (scaled ``1/sqrt(K)``, never zeros) and buffers of one per-rank layer
  (model, tp, MoE variants), :meth:`Layer.runner` (a closure running one op on prepared inputs) and
  :meth:`Layer.e2e` (a closure running the whole layer, per strategy).
- :class:`MeasureSettings` (device, dtype, timer budgets, deadline, what the fused workspace's padded heads hold,
  kernels left out) and :class:`Implementations` (the sparse prefill kernel and the Q concat in use, with the text
  every row records): the run's state, passed explicitly.
- :func:`measure_ops`, :func:`measure_layers`, :func:`measure_layer_pairs`, :func:`run_layer_benchmark`: the
  measurement loops; they yield or write rows of measurements (the columns :data:`OPS_COLUMNS`,
  :data:`E2E_COLUMNS`, :data:`EXTRAS_COLUMNS`), never sweep rows.
- :class:`CsvSink` (rows appended as they are measured, so a killed run loses nothing measured), :func:`read_rows`,
  :class:`RunLog` (timestamped progress lines, kept for the run's log file).

Op implementations (the ``impl`` of a :class:`~mla_lab.model.ops.LayerOp`): ``linear`` ``F.linear``; ``moe_bmm``
``torch.bmm`` over balanced experts (``E_loc x [T*k/E, K] @ [K, N]``; the token gather vLLM's fused_moe folds
into its GEMM is not timed); ``bmm_uk`` / ``bmm_uv`` ``torch.bmm`` in vLLM's absorbed layouts (W_UK on the
strided ``q_nope`` view; W_UV reading ``out[:, :H]`` and writing a transposed view of ``[T, H*d_v]``);
``rmsnorm`` / ``rmsnorm_add`` / ``silu_mul`` / ``mqa_logits`` the Triton kernels here; ``topk`` ``torch.topk``
(``sorted=False``); ``moe_sum`` ``torch.sum`` over the k expert outputs; ``attn_concat`` the Q concat into the
H-head buffer (unfused) or the padded workspace (fused); ``attn_pad`` ``new_zeros`` + copy; ``attn_kernel`` the
sparse prefill at full topk, random indices over ``s_kv = max(max_T, 2 topk)`` keys; ``attn_out_slice``
``out[:, :H].contiguous()``.

CPU runs go through Triton's interpreter: set ``TRITON_INTERPRET=1`` *before this module is imported* (it imports
:mod:`mla_lab.kernels`, which imports triton, and triton decorates its own library functions such as ``tl.sum`` at
import; ``benchmarks/bench_layer.py --dry-run`` and ``tests/test_measure_layer.py`` do so).

Timing: :func:`mla_lab.measure.timer.median_ms` (do_bench medians on CUDA: warm-up, L2 flushed before every
repetition, CUDA events; CPU: wall-clock median, meaningless as GPU numbers), :func:`mla_lab.measure.timer.graphed`
for CUDA-graph replay, :func:`mla_lab.measure.timer.interleaved` for paired unfused/fused timings.
"""

from __future__ import annotations

import csv
import functools
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

import torch
import torch.nn.functional as F

from ..arch import GPUArch
from ..buffers import padded_num_heads
from ..kernels import concat_mla_q
from ..kernels.reference import concat_mla_q_torch, sparse_mla_prefill_ref
from ..model.ops import LayerOp, layer_ops
from ..models import ModelConfig
from ..placement import measured_as
from .timer import interleaved, median_ms, summarize

__all__ = [
    "OPS_CSV", "E2E_CSV", "EXTRAS_CSV", "VALIDATION_CSV", "CALIBRATION_CSV", "OPS_COLUMNS", "E2E_COLUMNS",
    "EXTRAS_COLUMNS", "PAD_FILLS", "triton_kernels", "rmsnorm", "silu_mul", "mqa_logits", "KernelCheck",
    "check_kernels", "KernelCheckError", "run_kernel_checks", "tiny_model", "MeasureSettings", "Implementations",
    "select_implementations", "Layer", "PairedTiming", "paired_timing", "moe_variants", "layer_kinds",
    "ops_to_time", "measure_ops", "measure_layers", "measure_layer_pairs", "run_layer_benchmark", "CsvSink", "RowList",
    "LayerSinks", "open_sinks", "read_rows", "RunLog",
]

#: Files one run writes into its output folder (and :mod:`.validate` reads back).
OPS_CSV, E2E_CSV, EXTRAS_CSV, VALIDATION_CSV, CALIBRATION_CSV = (
    "layer_ops.csv", "layer_e2e.csv", "layer_extras.csv", "layer_validation.csv", "h200_ops.csv")

#: Columns of ``layer_ops.csv``: one op at one shape (``ms`` the median, NaN with an ``error ...`` status).
OPS_COLUMNS = ["model", "tp", "moe_parallel", "ep", "T", "op", "op_class", "impl", "impl_detail", "dims", "dtype",
               "flops", "bytes", "ms", "status"]
#: Columns of ``layer_e2e.csv``: the synthetic per-rank layer end to end (``mode`` eager, graph or paired).
E2E_COLUMNS = ["model", "tp", "moe_parallel", "ep", "T", "layer_kind", "strategy", "mode", "ms", "excluded_ops",
               "impl_detail", "status"]
#: Columns of ``layer_extras.csv``: ceilings, kernel checks and the experiments of :mod:`.layer_experiments`.
EXTRAS_COLUMNS = ["experiment", "model", "tp", "T", "H", "Hp", "name", "ms", "flops", "bytes", "value", "unit",
                  "note"]

#: What the fused workspace's padded heads hold while timed: ``zero`` (what a fresh cudaMalloc segment most likely
#: gives vLLM, and what the unfused pad tensor holds) or ``random`` (the first H200 run).
PAD_FILLS = ("zero", "random")


# ------------------------------------------------------------------------------------------- Triton kernels


@functools.cache
def triton_kernels():
    """The three Triton kernels, decorated on the first call (interpreted when ``TRITON_INTERPRET=1`` was set before
    triton was imported: see the module docstring). Returns a namespace with ``rmsnorm``, ``silu_mul``,
    ``mqa_logits`` (``triton.jit`` functions; launch them through the wrappers below).

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
    """RMSNorm per row, in fp32: ``out = s / sqrt(mean(s^2) + eps) * weight`` with ``s = x`` or, with
    ``residual``, ``s = x + residual`` (and ``residual`` overwritten with ``s``, vLLM's fused add).

    Args:
        x: ``[M, N]``, last dim contiguous (row stride free: a column slice works).
        weight: ``[N]``; out: ``[M, N]``; residual: ``[M, N]`` or None. One dtype (bf16/fp16/fp32), one device.

    Returns:
        ``out``.
    """
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
    """The DSA indexer's logits over one causal prompt: ``out[t, s] = sum_h weights[t, h] relu(q[t, h] . k[s])``
    for ``s <= t``; above the diagonal ``-inf`` inside computed blocks, untouched in blocks wholly above it.

    Args:
        q: ``[T, NH, D]`` (bf16/fp32; D a power of two >= 16); k: ``[S, D]``; weights: ``[T, NH]`` fp32;
            out: ``[T, S]`` fp32. Last dims contiguous.
        interpret: smaller blocks (16 x 16) and no launch options, for Triton's interpreter.

    Returns:
        ``out``.
    """
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
    """One kernel against torch: ``error`` the relative L2 error of the output; ``aux_error`` the residual's error
    (``rmsnorm_add``), 1.0 when ``mqa_logits`` left NaN in the causal part or wrote finite values above it, else
    0.0."""

    name: str
    error: float
    aux_error: float


def check_kernels(device: str, dtype: torch.dtype, interpret: bool, with_mqa: bool = True,
                  seed: int | None = None) -> list[KernelCheck]:
    """Run the Triton kernels on fresh random inputs (NaN-poisoned outputs) and compare with torch in fp32.

    Shapes are odd on purpose (37 x 300, 19 x 2*70; mqa 40 tokens, 4 heads, dim 32). ``seed`` None: a new seed
    each run (``time.time()``), so a run never re-checks the same inputs. Returns ``[rmsnorm_add, silu_mul,
    mqa_logits]`` (the last left out when ``with_mqa`` is False).
    """
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


# ------------------------------------------------------------------------------------------- settings


def tiny_model() -> ModelConfig:
    """A GLM-5-shaped model small enough for CPU dry runs: 16 heads, hidden 256, 16 experts of 64, topk 128,
    indexer 4 x 32, the absorbed head size 576 (= 512 + 64) the kernels require."""
    return ModelConfig(name="tiny", num_attention_heads=16, num_hidden_layers=4, hidden_size=256, q_lora_rank=128,
                       kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, index_topk=128,
                       index_n_heads=4, index_head_dim=32, first_k_dense_replace=1, n_routed_experts=16,
                       num_experts_per_tok=4, moe_intermediate_size=64, intermediate_size=256, vocab_size=1000)


@dataclass(frozen=True)
class MeasureSettings:
    """How a layer run measures (passed to every measuring function; nothing lives in module globals).

    Attributes:
        device: ``cuda`` or ``cpu`` (a dry run of the logic).
        dtype: of weights and activations (bf16 on a GPU, fp32 on CPU).
        interpret: the Triton kernels run through Triton's interpreter (small ``mqa_logits`` blocks).
        warmup_ms, rep_ms: do_bench's warm-up and repetition budgets (ms).
        cpu_calls: timed calls per median on CPU (after one warm-up call).
        deadline: ``time.time()`` after which nothing new is started (``inf``: none).
        pad_fill: what the fused workspace's padded heads hold (:data:`PAD_FILLS`).
        disabled_kernels: Triton kernels that failed their check (:func:`run_kernel_checks`): their ops are not
            timed and the end-to-end layer leaves them out (``excluded_ops``).
    """

    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16
    interpret: bool = False
    warmup_ms: float = 20.0
    rep_ms: float = 60.0
    cpu_calls: int = 3
    deadline: float = math.inf
    pad_fill: str = "zero"
    disabled_kernels: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        if self.pad_fill not in PAD_FILLS:
            raise ValueError(f"pad_fill={self.pad_fill!r} is not valid; allowed: {list(PAD_FILLS)}")

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def median_ms(self, fn: Callable[[], object], graph: bool = False) -> float:
        """:func:`mla_lab.measure.timer.median_ms` of ``fn`` with these budgets (``graph``: CUDA-graph replay)."""
        return median_ms(fn, device=self.device, warmup=self.warmup_ms, rep=self.rep_ms, n_cpu=self.cpu_calls,
                         graph=graph)

    def out_of_time(self) -> bool:
        return time.time() > self.deadline


@dataclass(frozen=True)
class Implementations:
    """The attention-path implementations a run times, and the text its rows record.

    Attributes:
        kernel: ``(q [T, H', 576], kv [s_kv, 1, 576], indices [T, 1, topk] int32, sm_scale, topk_length=None) ->
            out [T, H', 512]`` (the sparse prefill), or None (no kernel: its op is skipped and the end-to-end layer
            runs without it, ``excluded_ops`` ``kernel``).
        kernel_detail: e.g. ``flash_mla.flash_mla_sparse_fwd (<version>)``.
        concat: ``(ql_nope [T, H, 512], q_pe [T, H, 64], out [T, H', 576])``, writing the first H heads of ``out``.
        concat_detail: e.g. ``mla_lab.kernels.concat_mla_q triton``.
    """

    kernel: Callable | None
    kernel_detail: str
    concat: Callable
    concat_detail: str


def select_implementations(settings: MeasureSettings, use_flash_mla: bool = True, flash_mla_version: str = "",
                           log: Callable[[str], None] = print) -> Implementations:
    """On a GPU: ``flash_mla.flash_mla_sparse_fwd`` (unless ``use_flash_mla`` is False or it does not import) and
    the lab's Triton ``concat_mla_q`` (if it imports and passes a NaN-poisoned check; else two ``copy_``). On CPU:
    the reference kernel (:func:`mla_lab.kernels.reference.sparse_mla_prefill_ref`) and two ``copy_``. What it
    falls back on, and why, goes to ``log``."""
    kernel, kernel_detail = None, "none"
    if settings.gpu and not use_flash_mla:
        log("--no-flash-mla: the sparse kernel op is skipped")
    elif settings.gpu:
        try:
            from flash_mla import flash_mla_sparse_fwd

            def kernel(q, kv, indices, sm_scale, topk_length=None):
                return flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, topk_length=topk_length)[0]
            kernel_detail = f"flash_mla.flash_mla_sparse_fwd ({flash_mla_version})"
        except Exception as e:
            log(f"flash_mla import failed, the kernel op is skipped: {type(e).__name__}: {e}")
    else:
        def kernel(q, kv, indices, sm_scale, topk_length=None):
            return sparse_mla_prefill_ref(q, kv, indices, sm_scale, 512, topk_length=topk_length)[0].to(q.dtype)
        kernel_detail = "reference (CPU dry run)"
    concat, concat_detail = concat_mla_q_torch, "torch two copy_ (mla_lab.kernels.reference)"
    if settings.gpu:
        try:
            device, dtype = settings.device, settings.dtype
            a = torch.randn(100, 8, 512, device=device, dtype=dtype)
            b = torch.randn(100, 8, 64, device=device, dtype=dtype)
            o = torch.full((100, 64, 576), float("nan"), device=device, dtype=dtype)
            concat_mla_q(a, b, o, backend="triton")
            if torch.equal(o[:, :8], torch.cat([a, b], -1)):
                def concat(ql_nope, q_pe, out):
                    return concat_mla_q(ql_nope, q_pe, out, backend="triton")
                concat_detail = "mla_lab.kernels.concat_mla_q triton"
            else:
                log("lab Triton concat gave a wrong result; using torch copy_")
        except Exception as e:
            log(f"lab Triton concat unavailable ({type(e).__name__}: {str(e)[:120]}); using torch copy_")
    return Implementations(kernel, kernel_detail, concat, concat_detail)


def run_kernel_checks(settings: MeasureSettings, sink, log: Callable[[str], None] = print) -> frozenset:
    """:func:`check_kernels`, one ``correctness`` row per kernel into ``sink`` (tolerance 2e-2 in bf16, 1e-4
    otherwise). Returns the kernels to leave out: ``{"mqa_logits"}`` when that kernel raised or is wrong, else
    empty.

    Raises:
        KernelCheckError: rmsnorm or silu_mul raised or is wrong (the layer cannot be timed without them).
    """
    try:
        checks = check_kernels(settings.device, settings.dtype, settings.interpret)
    except Exception as e:
        log(f"kernel checks raised {type(e).__name__}: {e}\n{traceback.format_exc()}")
        try:  # the simple kernels alone
            checks = check_kernels(settings.device, settings.dtype, settings.interpret, with_mqa=False)
        except Exception as e2:
            raise KernelCheckError(f"Triton norm/silu kernels fail: {e2}") from None
        checks.append(KernelCheck("mqa_logits", float("nan"), 1.0))
    disabled = set()
    tol = 2e-2 if settings.dtype == torch.bfloat16 else 1e-4
    for check in checks:
        ok = check.error < tol and check.aux_error < tol
        sink.write({"experiment": "correctness", "name": check.name, "value": check.error,
                    "note": f"aux={check.aux_error} tol={tol} ok={ok}"})
        log(f"check {check.name}: rel err {check.error:.2e} aux {check.aux_error:.2e} ok={ok}")
        if not ok and check.name == "mqa_logits":
            disabled.add("mqa_logits")
            log("mqa_logits is wrong or failed: the idx_logits op is not timed and is left out of the e2e layer")
        elif not ok:
            raise KernelCheckError(f"Triton kernel {check.name} is wrong (rel err {check.error}); refusing to time it")
    return frozenset(disabled)


# ------------------------------------------------------------------------------------------------ the layer


class Layer:
    """Weights and buffers of one per-rank layer (model, tp, MoE variants), and runners for each op.

    Args:
        model: the model (:class:`~mla_lab.models.ModelConfig`).
        tp: TP size; the rank holds ``H = num_attention_heads / tp`` heads, ``Hp = padded_num_heads(H, arch)``
            in the fused workspace and the unfused pad tensor.
        arch: arch name or :class:`~mla_lab.arch.GPUArch` (the padding rule).
        device, dtype: where and in what the weights and activations live.
        max_T: rows of both Q workspaces (``[max_T, H, 576]`` unfused, ``[max_T, Hp, 576]`` fused) and the KV
            cache size ``s_kv = max(max_T, 2 topk)``.
        kernel_fn, concat_fn: :attr:`Implementations.kernel` / :attr:`Implementations.concat`.
        interpret: the Triton kernels run through the interpreter (see :func:`mqa_logits`).
        moe_variants: ``[("tp", 1)]`` (experts TP-sharded) and/or ``[("ep", ep)]`` (``E / ep`` whole experts per
            rank); one expert weight pair is allocated per variant (:func:`moe_variants`).
        pad_fill: ``zero`` or ``random``: the fused workspace's padded heads (:data:`PAD_FILLS`).
        disabled_kernels: Triton kernels not to run (``{"mqa_logits"}`` after a failed check).

    Attributes: ``model, tp, device, dtype, interpret, H, Hp, weights`` (``{name: [N, K]}`` of the GEMMs),
    ``W_UK [H, qk_nope, kv_lora]``, ``W_UV [H, kv_lora, v_head_dim]``, ``norm_weights`` (``{N: [N]}``),
    ``moe_weights`` (``{variant: (w13 [E_loc, 2 I_loc, hidden], w2 [E_loc, hidden, I_loc])}``),
    ``workspace_unfused``, ``workspace_fused``, ``kv [s_kv, 1, 576]``, ``s_kv``, ``sm_scale``.
    """

    def __init__(self, model: ModelConfig, tp: int, arch: str | GPUArch, device: str, dtype: torch.dtype,
                 max_T: int, kernel_fn: Callable | None, concat_fn: Callable, interpret: bool,
                 moe_variants: Iterable[tuple[str, int]], pad_fill: str = "zero",
                 disabled_kernels: Iterable[str] = ()):
        if pad_fill not in PAD_FILLS:
            raise ValueError(f"pad_fill={pad_fill!r} is not valid; allowed: {list(PAD_FILLS)}")
        self.model, self.tp, self.device, self.dtype, self.interpret = model, tp, device, dtype, interpret
        self.kernel_fn, self.concat_fn = kernel_fn, concat_fn
        self.disabled_kernels = frozenset(disabled_kernels)
        self.H = H = model.heads_per_rank(tp)
        self.Hp = padded_num_heads(H, arch, "bf16")
        hidden, q_rank, kv_rank = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
        d_nope, d_rope, d_v = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        index_heads, index_dim = model.index_n_heads, model.index_head_dim
        rand = self.random_tensor
        self.weights = {
            "q_a_proj": rand(q_rank, hidden), "q_b_proj": rand(H * (d_nope + d_rope), q_rank),
            "kv_a_proj": rand(kv_rank + d_rope, hidden), "idx_wq_b": rand(index_heads * index_dim, q_rank),
            "idx_wk": rand(index_dim, hidden), "idx_weights_proj": rand(index_heads, hidden),
            "o_proj": rand(hidden, H * d_v), "router": rand(model.n_routed_experts, hidden),
            "mlp_gate_up": rand(2 * model.intermediate_size // tp, hidden),
            "mlp_down": rand(hidden, model.intermediate_size // tp),
        }
        shared_inter = model.n_shared_experts * model.moe_intermediate_size // tp
        if shared_inter:
            self.weights["shared_gate_up"] = rand(2 * shared_inter, hidden)
            self.weights["shared_down"] = rand(hidden, shared_inter)
        self.W_UK = rand(H, d_nope, kv_rank, k=d_nope)
        self.W_UV = rand(H, kv_rank, d_v, k=kv_rank)
        self.norm_weights = {n: (1 + 0.1 * torch.randn(n, device=device)).to(dtype) for n in {hidden, q_rank, kv_rank}}
        self.moe_weights = {}
        for variant in moe_variants:  # ("tp", 1) or ("ep", ep)
            parallel, ep = variant
            experts = model.n_routed_experts
            experts_local, inter_local = ((experts, model.moe_intermediate_size // tp) if parallel == "tp"
                                          else (experts // ep, model.moe_intermediate_size))
            self.moe_weights[variant] = (rand(experts_local, 2 * inter_local, hidden),
                                         rand(experts_local, hidden, inter_local))
        self.max_T = max_T
        self.workspace_unfused = torch.empty(max_T, H, 576, device=device, dtype=dtype)
        self.workspace_fused = torch.empty(max_T, self.Hp, 576, device=device, dtype=dtype)
        self.workspace_unfused.normal_()
        self.workspace_fused.normal_()
        # vLLM never writes heads H..H'-1 of the fused workspace: they keep what the fresh allocation held (zeros
        # from a new cudaMalloc segment, most likely), and the unfused pad tensor is zeroed on every call. The first
        # H200 run left them random here (see docs/ttft-model.md: the kernel may run faster on zero operands).
        if pad_fill == "zero":
            self.workspace_fused[:, H:].zero_()
        self.s_kv = max(max_T, 2 * model.topk)
        self.kv = torch.randn(self.s_kv, 1, 576, device=device, dtype=dtype)
        self.sm_scale = 1.0 / math.sqrt(d_nope + d_rope)

    def random_tensor(self, *shape: int, k: int | None = None) -> torch.Tensor:
        """Contiguous ``randn(*shape) / sqrt(k)`` (``k`` default the last dim: a GEMM weight's fan-in)."""
        fan_in = k if k is not None else shape[-1]
        return (torch.randn(*shape, device=self.device, dtype=self.dtype) / math.sqrt(fan_in)).contiguous()

    def indices(self, T: int) -> torch.Tensor:
        """Random sparse-attention indices ``[T, 1, topk]`` int32 over the ``s_kv`` keys (full topk)."""
        return torch.randint(0, self.s_kv, (T, 1, self.model.topk), device=self.device, dtype=torch.int32)

    # ---- op runners: return a zero-arg closure that runs the op once on prepared inputs
    def runner(self, op: LayerOp, T: int, variant=None) -> Callable[[], object] | None:
        """A closure running ``op`` once at its shape (``op.dims``) on fresh random inputs, or None when the op is
        not run here (``lm_head``; ``idx_logits`` with ``mqa_logits`` disabled; the kernel without one; an unknown
        ``impl``).

        Args:
            op: an op of :func:`~mla_lab.model.ops.layer_ops` with an ``impl``.
            T: tokens of the step (the attention ops' rows).
            variant: ``unfused`` / ``fused`` for ``attn_concat`` (which buffer it writes); the MoE variant
                (``("tp", 1)`` / ``("ep", ep)``) for ``moe_bmm``.
        """
        dims, model, H, Hp = op.dims, self.model, self.H, self.Hp
        rand, device, dtype = self.random_tensor, self.device, self.dtype
        impl = op.impl
        if impl == "linear":
            x = rand(dims["M"], dims["K"])
            if op.name == "lm_head":
                return None
            w = self.weights[op.name]
            return lambda: F.linear(x, w)
        if impl == "moe_bmm":
            w13, w2 = self.moe_weights[variant]
            rows_per_expert = int(round(dims["M"]))
            x = rand(dims["E"], rows_per_expert, dims["K"])
            w = w13 if op.name == "moe_gate_up" else w2
            return lambda: torch.bmm(x, w.transpose(1, 2))
        if impl in ("rmsnorm", "rmsnorm_add"):
            x = rand(dims["M"], dims["N"], k=1)
            w = self.norm_weights[dims["N"]]
            o = torch.empty_like(x)
            if impl == "rmsnorm_add":
                r = rand(dims["M"], dims["N"], k=1)
                return lambda: rmsnorm(x, w, o, residual=r)
            if op.name == "kv_a_norm":  # vLLM normalises the kv_c slice of the kv_a output (row stride 576)
                full = rand(dims["M"], dims["N"] + model.qk_rope_head_dim, k=1)
                kv_c = full[:, : dims["N"]]
                return lambda: rmsnorm(kv_c, w, o)
            return lambda: rmsnorm(x, w, o)
        if impl == "silu_mul":
            M = int(round(dims["M"]))
            x = rand(M, 2 * dims["N"], k=1)
            o = torch.empty(M, dims["N"], device=device, dtype=dtype)
            return lambda: silu_mul(x, o)
        if impl == "bmm_uk":
            q = rand(T, H, model.qk_nope_head_dim + model.qk_rope_head_dim)
            q_nope = q[..., : model.qk_nope_head_dim].transpose(0, 1)
            return lambda: torch.bmm(q_nope, self.W_UK)
        if impl == "bmm_uv":
            attention = rand(T, Hp, 512)
            x = attention[:, :H].transpose(0, 1)
            out = torch.empty(T, H * model.v_head_dim, device=device, dtype=dtype)
            out_view = out.view(T, H, model.v_head_dim).transpose(0, 1)
            return lambda: torch.bmm(x, self.W_UV, out=out_view)
        if impl == "mqa_logits":
            if "mqa_logits" in self.disabled_kernels:
                return None
            q = rand(T, model.index_n_heads, model.index_head_dim)
            k = rand(T, model.index_head_dim)
            w = torch.rand(T, model.index_n_heads, device=device, dtype=torch.float32)
            o = torch.empty(T, T, device=device, dtype=torch.float32)
            return lambda: mqa_logits(q, k, w, o, self.interpret)
        if impl == "topk":
            logits = torch.randn(T, T, device=device, dtype=torch.float32)
            logits.masked_fill_(~torch.ones(T, T, dtype=torch.bool, device=device).tril(), float("-inf"))
            k = min(model.topk, T)
            return lambda: torch.topk(logits, k, dim=-1, sorted=False)
        if impl == "moe_sum":
            k = int(round(dims["k"]))
            x = rand(T, k, dims["N"], k=1)
            return lambda: x.sum(1)
        if impl == "attn_concat":
            q_nope = rand(T, H, 512, k=1)
            q_pe = rand(T, H, 64, k=1)
            buf = self.workspace_unfused[:T] if variant == "unfused" else self.workspace_fused[:T]
            return lambda: self.concat_fn(q_nope, q_pe, buf)
        if impl == "attn_pad":
            q = rand(T, H, 576, k=1)

            def pad():
                q_padded = q.new_zeros((T, Hp, 576))
                q_padded[:, :H] = q
                return q_padded
            return pad
        if impl == "attn_kernel":
            if self.kernel_fn is None:
                return None
            q = rand(T, Hp, 576, k=1)
            indices = self.indices(T)
            return lambda: self.kernel_fn(q, self.kv, indices, self.sm_scale)
        if impl == "attn_out_slice":
            o = rand(T, Hp, 512, k=1)
            return lambda: o[:, :H].contiguous()
        return None

    def e2e(self, T: int, strategy: str, kind: str, moe_var=None) -> tuple[Callable[[], torch.Tensor], list[str]]:
        """A closure running the whole per-rank layer once (no communication), and the ops it leaves out.

        ``strategy`` ``unfused``: concat into the H-head buffer, then (when ``Hp > H``) a ``new_zeros`` pad tensor
        and a copy, as vLLM before PR #53878; ``fused``: concat into the padded workspace. Then the kernel and
        ``out[:, :H]`` (a view, as vLLM). ``kind`` ``moe`` (router, routed experts over balanced random tokens of
        variant ``moe_var``, shared experts) or ``dense`` (MLP). The closure returns the layer's ``[T, hidden]``
        output (for ``moe``: the routed experts' sum). Left out (second item): ``kernel`` without a kernel,
        ``idx_logits`` with ``mqa_logits`` disabled. The residual ``[T, hidden]`` is updated in place on every
        call, as in a real forward.
        """
        model, H, Hp, rand, device, dtype = self.model, self.H, self.Hp, self.random_tensor, self.device, self.dtype
        hidden, q_rank, kv_rank = model.hidden_size, model.q_lora_rank, model.kv_lora_rank
        d_nope, d_v = model.qk_nope_head_dim, model.v_head_dim
        index_heads, index_dim = model.index_n_heads, model.index_head_dim
        W = self.weights
        x = rand(T, hidden, k=1)
        residual = rand(T, hidden, k=1)
        indices = self.indices(T)
        logits = torch.full((T, T), float("-inf"), device=device, dtype=torch.float32)
        k_top = min(model.topk, T)
        attention_out = torch.empty(T, H * d_v, device=device, dtype=dtype)
        x_normed = torch.empty_like(x)
        q_a_normed = torch.empty(T, q_rank, device=device, dtype=dtype)
        kv_normed = torch.empty(T, kv_rank, device=device, dtype=dtype)
        if kind == "moe":
            w13, w2 = self.moe_weights[moe_var]
            experts_local, two_inter, _ = w13.shape
            pairs = T * model.num_experts_per_tok // (1 if moe_var[0] == "tp" else moe_var[1])
            rows_per_expert = pairs // experts_local
            expert_in = rand(experts_local, rows_per_expert, hidden, k=1)
            activation = torch.empty(experts_local * rows_per_expert, two_inter // 2, device=device, dtype=dtype)
            k_local = pairs // T
        have_kernel = self.kernel_fn is not None
        have_mqa = "mqa_logits" not in self.disabled_kernels
        excluded = [n for n, ok in (("kernel", have_kernel), ("idx_logits", have_mqa)) if not ok]

        def layer():
            rmsnorm(x, self.norm_weights[hidden], x_normed, residual=residual)
            qa = F.linear(x_normed, W["q_a_proj"])
            rmsnorm(qa, self.norm_weights[q_rank], q_a_normed)
            q = F.linear(q_a_normed, W["q_b_proj"]).view(T, H, -1)
            kv_a = F.linear(x_normed, W["kv_a_proj"])
            rmsnorm(kv_a[:, :kv_rank], self.norm_weights[kv_rank], kv_normed)
            ql_nope = torch.bmm(q[..., :d_nope].transpose(0, 1), self.W_UK).transpose(0, 1)
            q_pe = q[..., d_nope:]
            index_q = F.linear(q_a_normed, W["idx_wq_b"]).view(T, index_heads, index_dim)
            index_k = F.linear(x_normed, W["idx_wk"])
            index_w = F.linear(x_normed, W["idx_weights_proj"]).float()
            if have_mqa:
                mqa_logits(index_q, index_k, index_w, logits, self.interpret)
            torch.topk(logits, k_top, dim=-1, sorted=False)
            if strategy == "unfused":
                buf = self.workspace_unfused[:T]
                self.concat_fn(ql_nope, q_pe, buf)
                if Hp > H:  # vLLM before the PR pads only when H is below the kernel's head multiple
                    qk = buf.new_zeros((T, Hp, 576))
                    qk[:, :H] = buf
                else:
                    qk = buf
            else:
                qk = self.workspace_fused[:T]
                self.concat_fn(ql_nope, q_pe, qk)
            if have_kernel:
                out = self.kernel_fn(qk, self.kv, indices, self.sm_scale)
            else:
                out = torch.empty(T, Hp, 512, device=device, dtype=dtype)
            o = out[:, :H]
            torch.bmm(o.transpose(0, 1), self.W_UV, out=attention_out.view(T, H, d_v).transpose(0, 1))
            y = F.linear(attention_out, W["o_proj"])
            y_normed = torch.empty_like(y)
            rmsnorm(y, self.norm_weights[hidden], y_normed, residual=residual)
            if kind == "dense":
                g = F.linear(y_normed, W["mlp_gate_up"])
                a = torch.empty(T, g.shape[1] // 2, device=device, dtype=dtype)
                silu_mul(g, a)
                return F.linear(a, W["mlp_down"])
            F.linear(y_normed, W["router"])
            h1 = torch.bmm(expert_in, w13.transpose(1, 2))
            silu_mul(h1.view(-1, two_inter), activation)
            h2 = torch.bmm(activation.view(experts_local, rows_per_expert, -1), w2.transpose(1, 2))
            routed = h2.view(T, k_local, hidden).sum(1)
            if "shared_gate_up" in W:
                g = F.linear(y_normed, W["shared_gate_up"])
                a = torch.empty(T, g.shape[1] // 2, device=device, dtype=dtype)
                silu_mul(g, a)
                F.linear(a, W["shared_down"])
            return routed

        return layer, excluded


class PairedTiming(NamedTuple):
    """Medians (ms) of two callables timed alternately, and the median and IQR of their per-pair difference."""

    a_ms: float
    b_ms: float
    difference_ms: float
    difference_iqr_ms: float


def paired_timing(fa: Callable[[], object], fb: Callable[[], object], pairs: int, device: str) -> PairedTiming:
    """Time ``fa`` and ``fb`` alternately ``pairs`` times each (order flipped every pair, L2 flushed before each
    call on CUDA: :func:`mla_lab.measure.timer.interleaved`), so that clock and thermal drift hit both alike.
    The difference of pair ``i`` is ``a_i - b_i``."""
    samples = interleaved({"a": fa, "b": fb}, repeats=pairs, device=device)
    differences = summarize([a - b for a, b in zip(samples["a"], samples["b"])])
    return PairedTiming(summarize(samples["a"])["median"], summarize(samples["b"])["median"],
                        differences["median"], differences["iqr"])


# ------------------------------------------------------------------------------------------------ the loops


def moe_variants(tp: int) -> list[tuple[str, int]]:
    """MoE layouts measured at ``tp``: TP-sharded experts, and expert parallelism over the TP group (ep = tp)."""
    return [("tp", 1)] + ([("ep", tp)] if tp > 1 else [])


def layer_kinds(variant: tuple[str, int]) -> tuple[str, ...]:
    """Layer kinds measured end to end under a MoE variant: ``moe`` and ``dense`` under TP-sharded experts (the
    dense layer has no experts, so once), ``moe`` alone under expert parallelism."""
    return ("moe", "dense") if variant[0] == "tp" else ("moe",)


def ops_to_time(model: ModelConfig, tp: int, arch: GPUArch, T: int, variant: tuple[str, int]) -> dict:
    """The measurable ops of both strategies and both layer kinds (``moe``; ``dense`` under TP-sharded experts)
    at ``T`` tokens: ``{(op name, concat strategy or None): LayerOp}``, each op once (``concat`` once per
    strategy: it writes a different buffer); communication and modelled-only ops left out. Under ``ep`` only the
    ``moe_*`` ops (the rest is the same as under ``tp``)."""
    parallel, ep = variant
    ops = {}
    for kind in layer_kinds(variant):
        for strategy in ("unfused", "fused"):
            for op in layer_ops(model, tp, arch, measured_as(strategy), T, layer_kind=kind, moe_parallel=parallel, ep_size=ep):
                if op.impl and not op.is_comm:
                    concat_strategy = strategy if op.name == "concat" else None
                    ops[(op.name, concat_strategy)] = op
    if parallel == "ep":
        ops = {key: op for key, op in ops.items() if key[0].startswith("moe_")}
    return ops


def measure_ops(layer: Layer, model_name: str, T: int, variant: tuple[str, int], arch: GPUArch,
                settings: MeasureSettings, implementations: Implementations, measured: dict,
                log: Callable[[str], None] = print) -> Iterator[dict]:
    """Time every op of :func:`ops_to_time` once per unique shape; yield one ``layer_ops.csv`` row each.

    ``measured`` (``{shape key: ms or None}``, shared by the caller across tp and T) skips shapes already timed.
    An op that raises gets ``ms`` NaN and status ``error <type>: <message>``; the loop goes on. Stops at the
    deadline.
    """
    parallel, ep = variant
    tp = layer.tp
    for (op_name, concat_strategy), op in ops_to_time(layer.model, tp, arch, T, variant).items():
        if settings.out_of_time():
            break
        shape = (tuple(sorted(op.dims.items())) if op.op_class != "attn_kernel" else (op.dims["T"], op.dims["Hp"]))
        key = (model_name, op.impl, concat_strategy, shape, parallel if op.impl == "moe_bmm" else None)
        if key in measured:
            continue
        status = "ok"
        try:
            fn = layer.runner(op, T, variant=concat_strategy or (variant if op.impl == "moe_bmm" else None))
            if fn is None:
                measured[key] = None
                continue
            fn()
            ms = settings.median_ms(fn)
            del fn
        except Exception as e:
            ms, status = float("nan"), f"error {type(e).__name__}: {str(e)[:150]}"
            log(f"op {op_name} {model_name} tp={tp} T={T}: {status}")
            if settings.gpu:
                torch.cuda.empty_cache()
        measured[key] = ms
        detail = {"attn_concat": implementations.concat_detail,
                  "attn_kernel": implementations.kernel_detail}.get(op.op_class, "")
        if concat_strategy:
            detail += f" into {'H-head buffer' if concat_strategy == 'unfused' else 'padded workspace'}"
        yield {"model": model_name, "tp": tp, "moe_parallel": parallel, "ep": ep, "T": T, "op": op_name,
               "op_class": op.op_class, "impl": op.impl, "impl_detail": detail, "dims": op.to_dict()["dims"],
               "dtype": op.dtype, "flops": op.flops, "bytes": op.bytes, "ms": ms, "status": status}


def measure_layers(layer: Layer, model_name: str, T: int, variant: tuple[str, int], kind: str,
                   settings: MeasureSettings, implementations: Implementations,
                   log: Callable[[str], None] = print) -> Iterator[dict]:
    """Time the whole layer of ``kind`` (:meth:`Layer.e2e`) per strategy; yield ``layer_e2e.csv`` rows.

    Modes: ``eager``, and on a GPU for ``T <= 4096`` also ``graph`` (CUDA-graph replay). A failing call gets
    ``ms`` NaN and an ``error`` status. Stops at the deadline.
    """
    parallel, ep = variant
    detail = f"{implementations.kernel_detail}; {implementations.concat_detail}"
    for strategy in ("unfused", "fused"):
        for mode in ["eager"] + (["graph"] if settings.gpu and T <= 4096 else []):
            if settings.out_of_time():
                break
            status = "ok"
            try:
                fn, excluded = layer.e2e(T, strategy, kind, variant)
                fn()
                ms = settings.median_ms(fn, graph=mode == "graph")
                del fn
            except Exception as e:
                ms, excluded, status = float("nan"), [], f"error {type(e).__name__}: {str(e)[:150]}"
                log(f"e2e {kind} {strategy} {mode} {model_name} tp={layer.tp} T={T}: {status}")
                if settings.gpu:
                    torch.cuda.empty_cache()
            yield {"model": model_name, "tp": layer.tp, "moe_parallel": parallel, "ep": ep, "T": T,
                   "layer_kind": kind, "strategy": strategy, "mode": mode, "ms": ms,
                   "excluded_ops": ";".join(excluded), "impl_detail": detail, "status": status}


def measure_layer_pairs(layer: Layer, model_name: str, T: int, variant: tuple[str, int], kind: str, pairs: int,
                        settings: MeasureSettings, implementations: Implementations) -> tuple[list[dict], dict]:
    """Unfused and fused layers timed alternately (:func:`paired_timing`): the difference with drift cancelled
    (also where ``H == H'``, where both run the same code: a null control for the noise).

    Returns ``(two layer_e2e.csv rows with mode "paired", one layer_extras.csv row "e2e_paired_delta")``; the
    extras row's ``ms`` is the median of ``unfused - fused`` and its ``value`` that difference's IQR.
    """
    parallel, ep = variant
    unfused, excluded = layer.e2e(T, "unfused", kind, variant)
    fused, _ = layer.e2e(T, "fused", kind, variant)
    timing = paired_timing(unfused, fused, pairs, settings.device)
    del unfused, fused
    detail = f"{implementations.kernel_detail}; {implementations.concat_detail}"
    layer_rows = [{"model": model_name, "tp": layer.tp, "moe_parallel": parallel, "ep": ep, "T": T,
                   "layer_kind": kind, "strategy": strategy, "mode": "paired", "ms": ms,
                   "excluded_ops": ";".join(excluded), "impl_detail": detail, "status": "ok"}
                  for strategy, ms in (("unfused", timing.a_ms), ("fused", timing.b_ms))]
    delta_row = {"experiment": "e2e_paired_delta", "model": model_name, "tp": layer.tp, "T": T, "H": layer.H,
                 "Hp": layer.Hp, "name": f"{kind}_{parallel}", "ms": timing.difference_ms,
                 "value": timing.difference_iqr_ms, "unit": "ms: median(unfused - fused); value: IQR",
                 "note": f"{pairs} interleaved pairs"}
    return layer_rows, delta_row


def run_layer_benchmark(models: list[tuple[str, ModelConfig]], tps: list[int], tokens: list[int], arch: GPUArch,
                        settings: MeasureSettings, implementations: Implementations, sinks: "LayerSinks",
                        log: Callable[[str], None] = print, pairs: int = 0, skip_e2e: bool = False) -> None:
    """Every model x TP x T: the ops (:func:`measure_ops`, each unique shape once over the whole run) and, unless
    ``skip_e2e``, per layer kind the layer end to end (:func:`measure_layers`; under ``ep`` only at the largest
    TP) then, with ``pairs`` > 0, its interleaved pairs (:func:`measure_layer_pairs`). One :class:`Layer` per (model, tp), sized
    for ``max(tokens)``. Rows go to ``sinks`` as they are measured. Failures are logged and skipped (a failed
    allocation skips that (model, tp)); the deadline stops the run.
    """
    max_T = max(tokens)
    measured: dict = {}
    for tp in tps:
        for model_name, model in models:
            if settings.out_of_time():
                log(f"budget reached before {model_name} tp={tp}")
                break
            variants = moe_variants(tp)
            try:
                layer = Layer(model, tp, arch, settings.device, settings.dtype, max_T, implementations.kernel,
                              implementations.concat, settings.interpret, variants, pad_fill=settings.pad_fill,
                              disabled_kernels=settings.disabled_kernels)
            except Exception as e:
                log(f"alloc failed {model_name} tp={tp}: {type(e).__name__}: {e}")
                if settings.gpu:
                    torch.cuda.empty_cache()
                continue
            for T in tokens:
                for variant in variants:
                    for row in measure_ops(layer, model_name, T, variant, arch, settings, implementations, measured,
                                           log):
                        sinks.ops.write(row)
                    if skip_e2e or (variant[0] == "ep" and tp != max(tps)):
                        continue
                    for kind in layer_kinds(variant):
                        for row in measure_layers(layer, model_name, T, variant, kind, settings, implementations,
                                                  log):
                            sinks.e2e.write(row)
                        if not pairs or settings.out_of_time():
                            continue
                        try:
                            layer_rows, delta_row = measure_layer_pairs(layer, model_name, T, variant, kind, pairs,
                                                                        settings, implementations)
                        except Exception as e:
                            log(f"paired {kind} {model_name} tp={tp} T={T}: {type(e).__name__}: {e}")
                            if settings.gpu:
                                torch.cuda.empty_cache()
                            continue
                        for row in layer_rows:
                            sinks.e2e.write(row)
                        sinks.extras.write(delta_row)
                log(f"{model_name} tp={tp} T={T}: {sinks.ops.n} op rows, {sinks.e2e.n} e2e rows")
            del layer
            if settings.gpu:
                torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ rows, log


class CsvSink:
    """Append rows to a CSV as they come (fixed columns + provenance; a row with an unknown column is an error).

    The file is created (header only) at construction, overwriting an older one; ``n`` counts rows written.
    """

    def __init__(self, path: str | Path, provenance: dict, columns: list[str]):
        self.path, self.provenance, self.n = Path(path), dict(provenance), 0
        self.columns = list(columns) + list(provenance)
        with open(self.path, "w", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writeheader()

    def write(self, row: dict) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.columns).writerow({**row, **self.provenance})
        self.n += 1


class RowList(list):
    """A sink that keeps rows in memory (``write`` appends; ``n`` the count): for tests and notebooks."""

    def write(self, row: dict) -> None:
        self.append(dict(row))

    @property
    def n(self) -> int:
        return len(self)


@dataclass
class LayerSinks:
    """Where a run's rows go: ``ops`` (``layer_ops.csv``), ``e2e`` (``layer_e2e.csv``), ``extras``
    (``layer_extras.csv``); anything with ``write(row)`` and ``n``."""

    ops: object
    e2e: object
    extras: object


def open_sinks(out_dir: str | Path, provenance: dict) -> LayerSinks:
    """:class:`CsvSink` s for the three files in ``out_dir`` (created), every row carrying ``provenance``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return LayerSinks(CsvSink(out_dir / OPS_CSV, provenance, OPS_COLUMNS),
                      CsvSink(out_dir / E2E_CSV, provenance, E2E_COLUMNS),
                      CsvSink(out_dir / EXTRAS_CSV, provenance, EXTRAS_COLUMNS))


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a CSV as dicts of strings; ``[]`` when the file does not exist."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class RunLog:
    """Progress lines stamped with the seconds since ``start`` (default: now), printed as they come (``echo``) and
    kept in ``lines`` for the run's log file (:meth:`write`). Call it like ``print``."""

    def __init__(self, start: float | None = None, echo: bool = True):
        self.start = time.time() if start is None else start
        self.echo = echo
        self.lines: list[str] = []

    def __call__(self, *parts) -> None:
        line = f"[{self.elapsed():7.1f}s] " + " ".join(str(p) for p in parts)
        self.lines.append(line)
        if self.echo:
            print(line, flush=True)

    def elapsed(self) -> float:
        return time.time() - self.start

    def write(self, path: str | Path) -> None:
        Path(path).write_text("\n".join(self.lines) + "\n")
