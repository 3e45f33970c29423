"""The per-rank layer on one GPU (or on CPU through the Triton interpreter, to check the logic): every op of
:func:`mla_lab.model.ops.layer_ops` at its real shape (:meth:`Layer.runner`) and the layer end to end
(:meth:`Layer.e2e`); the run's state (:class:`MeasureSettings`, :class:`Implementations`) and the files it writes.
Loops: :mod:`.layer_runs`; Triton stand-ins: :mod:`.triton_ops` (CPU runs need ``TRITON_INTERPRET=1`` set before
import); extras: :mod:`.layer_runs`; fit: :mod:`.validate`.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from ..buffers import padded_num_heads
from ..kernels import concat_mla_q
from ..kernels.reference import concat_mla_q_torch, sparse_mla_prefill_ref
from ..model.ops import LayerOp
from ..models import ModelConfig
from ..placement import CONTENTS, Strategy, expand_strategies, parse_strategy
from .attention import sm_scale
from .timer import median_ms
from .triton_ops import KernelCheck, KernelCheckError, check_kernels, mqa_logits, rmsnorm, silu_mul

#: Files one run writes into its output folder (and :mod:`.validate` reads back).
OPS_CSV, E2E_CSV, EXTRAS_CSV, VALIDATION_CSV, CALIBRATION_CSV = (
    "layer_ops.csv", "layer_e2e.csv", "layer_extras.csv", "layer_validation.csv", "h200_ops.csv")

#: Columns of ``layer_ops.csv``: one op at one shape (``ms`` the median, NaN with an ``error ...`` status).
#: ``content``: what the padded heads held for the op that reads them (``attn_kernel``), empty for the others.
OPS_COLUMNS = ["model", "tp", "moe_parallel", "ep", "T", "op", "op_class", "impl", "impl_detail", "dims", "dtype",
               "flops", "bytes", "ms", "content", "status"]
#: Columns of ``layer_e2e.csv``: the synthetic per-rank layer end to end (``mode`` eager, graph or paired).
#: ``strategy`` a canonical name, ``content`` what the padded heads held (``zeros`` / ``stale``).
E2E_COLUMNS = ["model", "tp", "moe_parallel", "ep", "T", "layer_kind", "strategy", "content", "mode", "ms",
               "excluded_ops", "impl_detail", "status"]
#: Columns of ``layer_extras.csv``: ceilings, kernel checks and the extras of :mod:`.layer_runs`.
#: ``content`` as in :data:`OPS_COLUMNS` (empty where no padded heads are read).
EXTRAS_COLUMNS = ["experiment", "model", "tp", "T", "H", "Hp", "name", "ms", "flops", "bytes", "value", "unit",
                  "content", "note"]

#: Placements :meth:`Layer.e2e` runs.
LAYER_PLACEMENTS = ("per_call_zeros", "per_call_empty", "private_workspace")
#: The strategies a layer run times by default: what the first version timed as ``unfused`` and ``fused``
#: (:data:`mla_lab.placement.LEGACY_MEASURED`), so new rows stay comparable with the committed H200 run.
LAYER_STRATEGIES = (parse_strategy("per_call_zeros"), parse_strategy("private_workspace"))


def _check_content(content: str) -> None:
    if content not in CONTENTS:
        raise ValueError(f"content={content!r} is not valid; allowed: {list(CONTENTS)}")


def layer_strategies(names) -> tuple[Strategy, ...]:
    """Strategy names (as :func:`mla_lab.placement.expand_strategies` reads them) or objects -> the
    :class:`Strategy` s the layer runs, order kept, duplicates dropped.

    Raises:
        ValueError: an unknown name, or a placement :meth:`Layer.e2e` does not run (names the allowed ones).
    """
    out = []
    for name in names:
        for strategy in ([name] if isinstance(name, Strategy) else map(parse_strategy, expand_strategies([name]))):
            if strategy.placement not in LAYER_PLACEMENTS:
                raise ValueError(f"strategy={strategy.name!r}: the layer runs placements {list(LAYER_PLACEMENTS)}")
            out.append(strategy)
    return tuple(dict.fromkeys(out))


def tiny_model() -> ModelConfig:
    """A GLM-5-shaped model for CPU dry runs: 16 heads, hidden 256, 16 experts of 64, topk 128, head size 576."""
    return ModelConfig(name="tiny", num_attention_heads=16, num_hidden_layers=4, hidden_size=256, q_lora_rank=128,
                       kv_lora_rank=512, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, index_topk=128,
                       index_n_heads=4, index_head_dim=32, first_k_dense_replace=1, n_routed_experts=16,
                       num_experts_per_tok=4, moe_intermediate_size=64, intermediate_size=256, vocab_size=1000)


@dataclass(frozen=True)
class MeasureSettings:
    """How a layer run measures: ``device`` (``cuda``, or ``cpu``: a dry run), ``dtype`` (bf16 on a GPU, fp32 on
    CPU), ``interpret`` (Triton's interpreter), ``warmup_ms`` / ``rep_ms`` (do_bench budgets, ms), ``cpu_calls``,
    ``deadline`` (``time.time()`` after which nothing starts), ``content`` (the private workspace's padded heads:
    ``zeros``, what a fresh cudaMalloc segment most likely gives vLLM at PR #53878, or ``stale`` N(0, 1), as the
    first H200 run left them), ``disabled_kernels`` (failed :func:`run_kernel_checks`: not timed, ``excluded_ops``).
    """

    device: str = "cuda"
    dtype: torch.dtype = torch.bfloat16
    interpret: bool = False
    warmup_ms: float = 20.0
    rep_ms: float = 60.0
    cpu_calls: int = 3
    deadline: float = math.inf
    content: str = "zeros"
    disabled_kernels: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        _check_content(self.content)

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
    """The attention path a run times and the text its rows record: ``kernel`` ``(q [T, H', 576], kv [s_kv, 1,
    576], indices [T, 1, topk] int32, sm_scale, topk_length=None) -> [T, H', 512]`` or None (skipped, ``excluded_ops``
    ``kernel``); ``concat`` ``(ql_nope [T, H, 512], q_pe [T, H, 64], out [T, H', 576])`` writing out's first H heads.
    """

    kernel: Callable | None
    kernel_detail: str
    concat: Callable
    concat_detail: str


def select_implementations(settings: MeasureSettings, use_flash_mla: bool = True, flash_mla_version: str = "",
                           log: Callable[[str], None] = print) -> Implementations:
    """GPU: ``flash_mla.flash_mla_sparse_fwd`` (unless ``use_flash_mla`` is False or it fails to import) and the
    lab's Triton ``concat_mla_q`` if it passes a NaN-poisoned check, else two ``copy_``. CPU: the reference kernel
    and two ``copy_``. Fallbacks are logged."""
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
    """:func:`check_kernels`, a ``correctness`` row per kernel into ``layer_extras.csv`` (tolerance 2e-2 in bf16,
    1e-4 otherwise). Returns the kernels to leave out: ``{"mqa_logits"}`` when it raised or is wrong.

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
        sink.write(EXTRAS_CSV, {"experiment": "correctness", "name": check.name, "value": check.error,
                    "note": f"aux={check.aux_error} tol={tol} ok={ok}"})
        log(f"check {check.name}: rel err {check.error:.2e} aux {check.aux_error:.2e} ok={ok}")
        if not ok and check.name == "mqa_logits":
            disabled.add("mqa_logits")
            log("mqa_logits is wrong or failed: the idx_logits op is not timed and is left out of the e2e layer")
        elif not ok:
            raise KernelCheckError(f"Triton kernel {check.name} is wrong (rel err {check.error}); refusing to time it")
    return frozenset(disabled)


class Layer:
    """Random weights (``N(0, 1) / sqrt(fan_in)``, never zeros) and buffers of one per-rank layer, and its runners.

    Args:
        rank: the :class:`~mla_lab.deployment.RankView` measured: ``H`` heads, ``Hp`` its GPU's padded heads.
        max_T: rows of the Q workspaces (``workspace_unfused [max_T, H, 576]`` for per-call pads,
            ``workspace_fused [max_T, Hp, 576]`` the private one); KV cache ``kv [max(max_T, 2 topk), 1, 576]``.
        kernel_fn, concat_fn: :attr:`Implementations.kernel` / ``.concat``; interpret: Triton's interpreter.
        moe_variants: ``("tp", 1)`` (experts TP-sharded) and/or ``("ep", ep)`` (``E / ep`` whole experts), one
            expert weight pair each (``moe_weights``: ``w13 [E_loc, 2 I_loc, hidden]``, ``w2 [E_loc, hidden, I_loc]``).
        content: the private workspace's padded heads (:attr:`MeasureSettings.content`).
        disabled_kernels: Triton kernels not to run (``{"mqa_logits"}`` after a failed check).
    """

    def __init__(self, rank, device: str, dtype: torch.dtype,
                 max_T: int, kernel_fn: Callable | None, concat_fn: Callable, interpret: bool,
                 moe_variants: Iterable[tuple[str, int]], content: str = "zeros",
                 disabled_kernels: Iterable[str] = ()):
        _check_content(content)
        self.content = content
        model, tp = rank.model, rank.tp
        self.model, self.tp, self.device, self.dtype, self.interpret = model, tp, device, dtype, interpret
        self.kernel_fn, self.concat_fn = kernel_fn, concat_fn
        self.disabled_kernels = frozenset(disabled_kernels)
        self.H = H = rank.num_heads
        self.Hp = padded_num_heads(H, rank.arch, "bf16")
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
        self.workspace_unfused = torch.empty(max_T, H, 576, device=device, dtype=dtype).normal_()
        self.workspace_fused = torch.empty(max_T, self.Hp, 576, device=device, dtype=dtype).normal_()
        # vLLM never writes heads H..H'-1 of the private workspace: they keep what the fresh allocation held (zeros
        # from a new cudaMalloc segment, most likely). The first H200 run left them N(0, 1) ("stale"; see
        # docs/ttft-model.md: the kernel runs faster on zero operands).
        if content == "zeros":
            self.workspace_fused[:, H:].zero_()
        self._pad_blocks: dict = {}
        self.s_kv = max(max_T, 2 * model.topk)
        self.kv = torch.randn(self.s_kv, 1, 576, device=device, dtype=dtype)
        self.sm_scale = sm_scale(model)

    def content_of(self, strategy: Strategy) -> str:
        """What the padded heads hold under ``strategy``: :attr:`content` for the private workspace, else its own."""
        return self.content if strategy.placement == "private_workspace" else strategy.content

    def pad_block(self, content: str) -> torch.Tensor:
        """``[max_T, Hp, 576]`` filled once with ``content`` (zeros or N(0, 1)): ``per_call_empty``'s pad."""
        if content not in self._pad_blocks:
            block = torch.empty(self.max_T, self.Hp, 576, device=self.device, dtype=self.dtype)
            # its own generator: building a pad block leaves the inputs' random stream alone
            generator = torch.Generator(device=self.device).manual_seed(1234)
            block.zero_() if content == "zeros" else block.normal_(generator=generator)
            self._pad_blocks[content] = block
        return self._pad_blocks[content]

    def random_tensor(self, *shape: int, k: int | None = None) -> torch.Tensor:
        """Contiguous ``randn(*shape) / sqrt(k)`` (``k`` default the last dim: a GEMM weight's fan-in)."""
        fan_in = k if k is not None else shape[-1]
        return (torch.randn(*shape, device=self.device, dtype=self.dtype) / math.sqrt(fan_in)).contiguous()

    def indices(self, T: int) -> torch.Tensor:
        """Random sparse-attention indices ``[T, 1, topk]`` int32 over the ``s_kv`` keys (full topk)."""
        return torch.randint(0, self.s_kv, (T, 1, self.model.topk), device=self.device, dtype=torch.int32)

    # ---- op runners: a zero-arg closure that runs the op once on prepared inputs (None: not run here)
    def runner(self, op: LayerOp, T: int, variant=None) -> Callable[[], object] | None:
        """A closure running ``op`` once at ``op.dims`` on fresh random inputs, or None (not run here: ``lm_head``,
        a disabled kernel, no sparse kernel, an unknown ``impl``). ``variant``: the concat's Strategy, or the MoE
        variant for ``moe_bmm``."""
        build = getattr(self, f"_op_{op.impl}", None)
        return None if build is None else build(op, op.dims, T, variant)

    def _op_linear(self, op, dims, T, variant):
        x, w = self.random_tensor(dims["M"], dims["K"]), self.weights.get(op.name)
        return None if op.name == "lm_head" else (lambda: F.linear(x, w))

    def _op_moe_bmm(self, op, dims, T, variant):
        w13, w2 = self.moe_weights[variant]
        x, w = self.random_tensor(dims["E"], int(round(dims["M"])), dims["K"]), w13 if op.name == "moe_gate_up" else w2
        return lambda: torch.bmm(x, w.transpose(1, 2))

    def _op_rmsnorm(self, op, dims, T, variant):
        rand, w = self.random_tensor, self.norm_weights[dims["N"]]
        x = rand(dims["M"], dims["N"], k=1)
        o = torch.empty_like(x)
        if op.impl == "rmsnorm_add":
            r = rand(dims["M"], dims["N"], k=1)
            return lambda: rmsnorm(x, w, o, residual=r)
        if op.name == "kv_a_norm":  # vLLM normalises the kv_c slice of the kv_a output (row stride 576)
            kv_c = rand(dims["M"], dims["N"] + self.model.qk_rope_head_dim, k=1)[:, : dims["N"]]
            return lambda: rmsnorm(kv_c, w, o)
        return lambda: rmsnorm(x, w, o)

    _op_rmsnorm_add = _op_rmsnorm

    def _op_silu_mul(self, op, dims, T, variant):
        M = int(round(dims["M"]))
        x, o = self.random_tensor(M, 2 * dims["N"], k=1), self._empty(M, dims["N"])
        return lambda: silu_mul(x, o)

    def _op_bmm_uk(self, op, dims, T, variant):
        m = self.model
        q_nope = self.random_tensor(T, self.H, m.qk_nope_head_dim + m.qk_rope_head_dim)[..., :m.qk_nope_head_dim]
        return lambda: torch.bmm(q_nope.transpose(0, 1), self.W_UK)

    def _op_bmm_uv(self, op, dims, T, variant):
        H, d_v = self.H, self.model.v_head_dim
        x = self.random_tensor(T, self.Hp, 512)[:, :H].transpose(0, 1)
        out_view = self._empty(T, H * d_v).view(T, H, d_v).transpose(0, 1)
        return lambda: torch.bmm(x, self.W_UV, out=out_view)

    def _op_mqa_logits(self, op, dims, T, variant):
        if "mqa_logits" in self.disabled_kernels:
            return None
        m, dev = self.model, self.device
        q, k = self.random_tensor(T, m.index_n_heads, m.index_head_dim), self.random_tensor(T, m.index_head_dim)
        w = torch.rand(T, m.index_n_heads, device=dev, dtype=torch.float32)
        o = torch.empty(T, T, device=dev, dtype=torch.float32)
        return lambda: mqa_logits(q, k, w, o, self.interpret)

    def _op_topk(self, op, dims, T, variant):
        logits = torch.randn(T, T, device=self.device, dtype=torch.float32)
        logits.masked_fill_(~torch.ones(T, T, dtype=torch.bool, device=self.device).tril(), float("-inf"))
        k = min(self.model.topk, T)
        return lambda: torch.topk(logits, k, dim=-1, sorted=False)

    def _op_moe_sum(self, op, dims, T, variant):
        x = self.random_tensor(T, int(round(dims["k"])), dims["N"], k=1)
        return lambda: x.sum(1)

    def _op_attn_concat(self, op, dims, T, variant):
        q_nope, q_pe = self.random_tensor(T, self.H, 512, k=1), self.random_tensor(T, self.H, 64, k=1)
        buf = self.workspace_unfused[:T] if variant.per_call_pad else self.workspace_fused[:T]
        return lambda: self.concat_fn(q_nope, q_pe, buf)

    def _op_attn_pad(self, op, dims, T, variant):
        q, H, Hp = self.random_tensor(T, self.H, 576, k=1), self.H, self.Hp

        def pad():
            q_padded = q.new_zeros((T, Hp, 576))
            q_padded[:, :H] = q
            return q_padded
        return pad

    def _op_attn_pad_copy(self, op, dims, T, variant):
        q, block = self.random_tensor(T, self.H, 576, k=1), self.pad_block(self.content)[:T]
        return lambda: block[:, :self.H].copy_(q)

    def _op_attn_kernel(self, op, dims, T, variant):
        if self.kernel_fn is None:
            return None
        q = self.random_tensor(T, self.Hp, 576, k=1)
        if self.content == "zeros":
            q[:, self.H:].zero_()
        indices = self.indices(T)
        return lambda: self.kernel_fn(q, self.kv, indices, self.sm_scale)

    def _op_attn_out_slice(self, op, dims, T, variant):
        o = self.random_tensor(T, self.Hp, 512, k=1)
        return lambda: o[:, :self.H].contiguous()

    def _empty(self, *shape: int) -> torch.Tensor:
        return torch.empty(*shape, device=self.device, dtype=self.dtype)

    def _mlp(self, x: torch.Tensor, up: str, down: str) -> torch.Tensor:
        """``weights[down] (silu_mul(weights[up] x))`` of ``x [T, hidden]``: the dense MLP or the shared experts."""
        g = F.linear(x, self.weights[up])
        a = torch.empty(x.shape[0], g.shape[1] // 2, device=self.device, dtype=self.dtype)
        silu_mul(g, a)
        return F.linear(a, self.weights[down])

    def e2e(self, T: int, strategy: Strategy, kind: str, moe_var=None) -> tuple[Callable[[], torch.Tensor], list[str]]:
        """``(layer, excluded)``: a closure running the per-rank layer once (no communication) and returning its
        ``[T, hidden]`` output (``moe``: the routed experts' sum), and the ops it leaves out (``kernel`` without
        one, ``idx_logits`` with ``mqa_logits`` disabled). ``strategy``: ``per_call_zeros`` concat into the H-head
        buffer, then (``Hp > H``) a ``new_zeros`` pad and a copy; ``per_call_empty`` the pad from :meth:`pad_block`;
        ``private_workspace`` concat into the padded workspace; then the kernel and the ``out[:, :H]`` view.
        ``kind``: ``moe`` (router, routed experts of variant ``moe_var`` over balanced tokens, shared experts) or
        ``dense``. The residual is updated in place on every call.

        Raises:
            ValueError: ``strategy`` is not a Strategy of :data:`LAYER_PLACEMENTS`.
        """
        if not isinstance(strategy, Strategy) or strategy.placement not in LAYER_PLACEMENTS:
            raise ValueError(f"strategy={strategy!r} must be a mla_lab.placement.Strategy of placement "
                             f"{list(LAYER_PLACEMENTS)} (parse names with layer_strategies)")
        placement = strategy.placement
        pad_block = self.pad_block(strategy.content) if placement == "per_call_empty" and self.Hp > self.H else None
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
            if placement != "private_workspace":
                buf = self.workspace_unfused[:T]
                self.concat_fn(ql_nope, q_pe, buf)
                if Hp > H:  # the engines pad only when H is below the kernel's head multiple
                    qk = buf.new_zeros((T, Hp, 576)) if placement == "per_call_zeros" else pad_block[:T]
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
                return self._mlp(y_normed, "mlp_gate_up", "mlp_down")
            F.linear(y_normed, W["router"])
            h1 = torch.bmm(expert_in, w13.transpose(1, 2))
            silu_mul(h1.view(-1, two_inter), activation)
            h2 = torch.bmm(activation.view(experts_local, rows_per_expert, -1), w2.transpose(1, 2))
            routed = h2.view(T, k_local, hidden).sum(1)
            if "shared_gate_up" in W:
                self._mlp(y_normed, "shared_gate_up", "shared_down")
            return routed

        return layer, excluded
