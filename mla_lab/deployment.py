"""One deployment, validated once in :meth:`Deployment.of`: what ``vllm serve`` + ``vllm bench serve`` fix for one run,
in vLLM's spellings (``dp_attention``: SGLang ``--dp <n> --enable-dp-attention``; MTP: ``num_speculative_tokens``).

The seed is vLLM PR #53878's benchmark (merged 2026-08-26): ``vllm serve zai-org/GLM-5.2-FP8
--tensor-parallel-size 8 -ep --max-num-batched-tokens 16384 --attention-backend FLASHMLA_SPARSE
--no-enable-prefix-caching --max-model-len 131072`` (bf16 KV) on Hopper, ``vllm bench serve`` random dataset,
1024 in / 128 out, 32 prompts at concurrency 32; priced with GLM-5's geometry on an H200 unless told otherwise."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from functools import cached_property

from ._validate import check_int, divisors
from .arch import GPUArch, arch_names, get_arch
from .models import ModelConfig, load_model, normalize_kv_cache_dtype
from .rank import RankView
from .workload import Workload

__all__ = ["Deployment", "WEIGHT_DTYPES", "MOE_PARALLEL", "SEED_ARGS", "DEFAULT_GPU_MEMORY_UTILIZATION",
           "DEFAULT_OUTPUT_LEN", "DEFAULT_MAX_NUM_SEQS", "VLLM_MBT_RULE", "RankView"]

#: Linear-weight dtypes the cost model prices (bytes per value: bf16 2, fp8 1 + fp32 block scales).
WEIGHT_DTYPES = ("bf16", "fp8")
#: MoE layouts: ``ep`` (``--enable-expert-parallel``: whole experts per rank) or ``tp`` (every expert sharded).
MOE_PARALLEL = ("ep", "tp")
#: vLLM's default ``--gpu-memory-utilization``.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: ``vllm bench serve``'s default ``--random-output-len``.
DEFAULT_OUTPUT_LEN = 128
#: ``--max-num-seqs`` when none is given (``mla-lab serve``'s figure).
DEFAULT_MAX_NUM_SEQS = 256
#: vLLM's engine rule, checked by :meth:`Deployment.of`.
VLLM_MBT_RULE = "vLLM requires max_num_batched_tokens >= max_num_seqs (vllm/config/scheduler.py)"

#: vLLM PR #53878's benchmark as :meth:`Deployment.of` arguments (the module docstring gives the command).
SEED_ARGS = {"model": "glm-5", "tp": 8, "arch": "h200", "max_num_batched_tokens": 16384, "kv_cache_dtype": "bf16",
             "weight_dtype": "fp8", "moe_parallel": "ep", "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION,
             "prompt_len": 1024, "output_len": 128, "num_prompts": 32, "concurrency": 32}


def _choice(name: str, value, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {list(allowed)}")
    return value


def _check_options(num_speculative_tokens, acceptance_length, dp_attention, tp: int) -> tuple[int, float, int]:
    """The deployment options (speculative decoding, DP attention) checked: ``(k, acceptance_length, dp)``."""
    k = check_int("num_speculative_tokens", num_speculative_tokens, allow_zero=True)
    a = acceptance_length
    if isinstance(a, bool) or not isinstance(a, numbers.Real) or not 1 <= a <= k + 1:
        raise ValueError(f"acceptance_length={a!r} is not allowed; allowed: a number in [1, num_speculative_tokens "
                         f"+ 1] = [1, {k + 1}] (mean tokens accepted per step, the bonus token included)")
    dp = check_int("dp_attention", dp_attention)
    if tp % dp:
        raise ValueError(f"dp_attention={dp} does not divide tp={tp}; allowed: {divisors(tp)}")
    return k, float(a), dp


def _check_tp(model: ModelConfig, tp, moe_parallel: str) -> int:
    """``tp`` as an int that divides every size a TP rank splits (one message naming the first it does not)."""
    tp = check_int("tp", tp)
    sizes = [("num_attention_heads", model.num_attention_heads), ("intermediate_size", model.intermediate_size),
             ("moe_intermediate_size", model.moe_intermediate_size), ("vocab_size", model.vocab_size)]
    if moe_parallel == "ep":
        sizes.append(("n_routed_experts", model.n_routed_experts))
    ok = [d for d in divisors(model.num_attention_heads) if all(s % d == 0 for _, s in sizes)]
    for field_name, size in sizes:
        if size % tp:
            raise ValueError(f"tp={tp} does not divide {field_name}={size} of model {model.name!r}"
                             f"{' (moe_parallel=ep)' if field_name == 'n_routed_experts' else ''}; allowed tp: {ok}")
    return tp


def _check_rank_args(model, tp, arch, max_num_batched_tokens, kv_cache_dtype, weight_dtype, moe_parallel,
                     max_num_seqs) -> tuple:
    """The engine-side arguments of both doors, checked and normalised."""
    model = load_model(model)
    if not isinstance(arch, GPUArch):
        if not isinstance(arch, str):
            raise ValueError(f"arch={arch!r} must be a str; allowed: {arch_names()}")
        arch = get_arch(arch)
    weight_dtype = _choice("weight_dtype", weight_dtype, WEIGHT_DTYPES)
    moe_parallel = _choice("moe_parallel", moe_parallel, MOE_PARALLEL)
    tp = _check_tp(model, tp, moe_parallel)
    mbt = check_int("max_num_batched_tokens", max_num_batched_tokens)
    mns = check_int("max_num_seqs", max_num_seqs)
    if mbt < mns:
        raise ValueError(f"max_num_batched_tokens={mbt} is below max_num_seqs={mns}; allowed: >= max_num_seqs "
                         f"({VLLM_MBT_RULE})")
    kv = normalize_kv_cache_dtype(kv_cache_dtype)
    return model, arch, tp, mbt, mns, kv, weight_dtype, moe_parallel


@dataclass(frozen=True)
class Deployment:
    """One engine deployment and its benchmark workload. Build it with :meth:`of` or :meth:`seed`; the constructor
    does not validate."""

    model: ModelConfig
    arch: GPUArch
    tp: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    weight_dtype: str
    moe_parallel: str
    gpu_memory_utilization: float
    workload: Workload
    output_len: int = DEFAULT_OUTPUT_LEN
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    num_speculative_tokens: int = 0
    acceptance_length: float = 1.0
    dp_attention: int = 1

    @classmethod
    def of(cls, *, model: str | ModelConfig, tp: int, arch: str | GPUArch, max_num_batched_tokens: int,
           kv_cache_dtype: str, weight_dtype: str, moe_parallel: str, prompt_len: int, num_prompts: int = 1,
           concurrency: int | None = None, output_len: int = DEFAULT_OUTPUT_LEN,
           gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
           max_num_seqs: int = DEFAULT_MAX_NUM_SEQS, num_speculative_tokens: int = 0,
           acceptance_length: float = 1.0, dp_attention: int = 1) -> Deployment:
        """Validate and build a deployment. ``tp`` divides every size a rank splits; ``concurrency`` None =
        ``num_prompts``; ``max_num_seqs <= max_num_batched_tokens`` (:data:`VLLM_MBT_RULE`).
        Raises ValueError: one line naming the first bad argument, its value and what is allowed."""
        model, arch, tp, mbt, mns, kv, weight_dtype, moe_parallel = _check_rank_args(
            model, tp, arch, max_num_batched_tokens, kv_cache_dtype, weight_dtype, moe_parallel, max_num_seqs)
        g = gpu_memory_utilization
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or not 0 < g <= 1:
            raise ValueError(f"gpu_memory_utilization={g!r} must be a number in (0, 1]")
        output_len = check_int("output_len", output_len)
        num_prompts = check_int("num_prompts", num_prompts)
        wl = Workload(check_int("prompt_len", prompt_len), num_prompts,
                      num_prompts if concurrency is None else check_int("concurrency", concurrency))
        k, acc, dp = _check_options(num_speculative_tokens, acceptance_length, dp_attention, tp)
        return cls(model, arch, tp, mbt, kv, weight_dtype, moe_parallel, float(g), wl, output_len, mns, k, acc, dp)

    @classmethod
    def seed(cls, **overrides) -> Deployment:
        """:data:`SEED_ARGS` with ``overrides`` (a smaller ``num_prompts`` caps concurrency, as ``vllm bench serve``).
        Raises ValueError: an unknown override, or as :meth:`of`."""
        # the PR's command leaves --max-num-seqs at its default
        allowed = set(SEED_ARGS) | {"max_num_seqs", "num_speculative_tokens", "acceptance_length", "dp_attention"}
        unknown = sorted(set(overrides) - allowed)
        if unknown:
            raise ValueError(f"Deployment.seed() got unknown argument(s) {unknown}; allowed: {sorted(allowed)}")
        args = {**SEED_ARGS, **overrides}
        n = args["num_prompts"]
        if "concurrency" not in overrides and type(n) is int and 0 < n < SEED_ARGS["concurrency"]:
            args["concurrency"] = n
        return cls.of(**args)

    @staticmethod
    def require(value, name: str = "deployment") -> None:
        """Raises ValueError unless ``value`` (argument ``name``) is a Deployment."""
        if not isinstance(value, Deployment):
            raise ValueError(f"{name}= a {type(value).__name__} is not a Deployment; allowed: "
                             "mla_lab.deployment.Deployment.of(...) or Deployment.seed(...)")

    @staticmethod
    def rank_of(*, model: str | ModelConfig, tp: int, arch: str | GPUArch, kv_cache_dtype: str, weight_dtype: str,
                moe_parallel: str, max_num_batched_tokens: int, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                engine: str | None = None) -> RankView:
        """The door without a workload: a checked :class:`~mla_lab.rank.RankView`. Raises ValueError as :meth:`of`."""
        model, arch, tp, mbt, mns, kv, weight_dtype, moe_parallel = _check_rank_args(
            model, tp, arch, max_num_batched_tokens, kv_cache_dtype, weight_dtype, moe_parallel, max_num_seqs)
        view = RankView.derive(model, arch, tp, kv, weight_dtype, moe_parallel, mbt, mns)
        return view if engine is None else view.with_engine(engine)

    @classmethod
    def from_point(cls, point: dict) -> Deployment:
        """A flat sweep point as a deployment. Raises ValueError: as :meth:`of`; a missing key."""
        need = ("model", "tp", "arch", "max_num_batched_tokens", "kv_cache_dtype", "weight_dtype", "moe_parallel",
                "prompt_len")
        missing = [k for k in need if point.get(k) is None]
        if missing:
            raise ValueError(f"point lacks {missing}; allowed: a point with {list(need)}")
        optional = ("num_prompts", "concurrency", "output_len", "gpu_memory_utilization", "max_num_seqs",
                    "num_speculative_tokens", "acceptance_length", "dp_attention")
        return cls.of(**{k: point[k] for k in need + optional if point.get(k) is not None})

    def replace(self, **changes) -> Deployment:
        """A copy with some :meth:`of` arguments changed, validated again. Raises ValueError as :meth:`of`."""
        return Deployment.of(**{**self.args(), **changes})

    def args(self) -> dict:
        """The :meth:`of` arguments that rebuild this deployment (model and arch as their names)."""
        rest = ("max_num_batched_tokens", "kv_cache_dtype", "weight_dtype", "moe_parallel", "gpu_memory_utilization",
                "prompt_len", "output_len", "num_prompts", "concurrency", "max_num_seqs", "num_speculative_tokens",
                "acceptance_length", "dp_attention")
        return {"model": self.model.name, "tp": self.tp, "arch": self.arch.name} | {k: getattr(self, k) for k in rest}

    def to_point(self, **extra) -> dict:
        """A flat sweep point, ``extra`` added (``output_len``, ``max_num_seqs`` and the options left out)."""
        left_out = ("output_len", "max_num_seqs", "num_speculative_tokens", "acceptance_length", "dp_attention")
        return {k: v for k, v in self.args().items() if k not in left_out} | extra

    @cached_property
    def rank(self) -> RankView:
        """What one TP rank holds, derived once."""
        return RankView.derive(self.model, self.arch, self.tp, self.kv_cache_dtype, self.weight_dtype,
                               self.moe_parallel, self.max_num_batched_tokens, self.max_num_seqs)

    @cached_property
    def attention_rank(self) -> RankView:
        """The attention side's rank: at ``tp / dp_attention`` (the MoE stays on :attr:`rank`)."""
        if self.dp_attention == 1:
            return self.rank
        return RankView.derive(self.model, self.arch, self.tp // self.dp_attention, self.kv_cache_dtype,
                               self.weight_dtype, self.moe_parallel, self.max_num_batched_tokens, self.max_num_seqs)

    prompt_len = property(lambda self: self.workload.prompt_len)
    num_prompts = property(lambda self: self.workload.num_prompts)
    concurrency = property(lambda self: self.workload.concurrency)
    #: Attention heads per rank: ``num_attention_heads // tp``.
    num_heads = property(lambda self: self.model.num_attention_heads // self.tp)
    #: Expert-parallel size (``tp`` under ``ep``, None under ``tp``).
    ep_size = property(lambda self: self.tp if self.moe_parallel == "ep" else None)

    def describe(self) -> str:
        """One line: ``glm-5 TP8 h200, max_num_batched_tokens 16384, ...``."""
        wl = self.workload
        return (f"{self.model.name} TP{self.tp} {self.arch.name}, max_num_batched_tokens "
                f"{self.max_num_batched_tokens}, {self.kv_cache_dtype} KV, {self.weight_dtype} weights, experts "
                f"{self.moe_parallel}, {wl.num_prompts} x {wl.prompt_len}-token prompts ({self.output_len} out) at "
                f"concurrency {wl.concurrency}, gpu_memory_utilization {self.gpu_memory_utilization:g}"
                + (f", MTP {self.num_speculative_tokens} draft tokens (acceptance length {self.acceptance_length:g})"
                   if self.num_speculative_tokens else "")
                + (f", DP attention {self.dp_attention}" if self.dp_attention > 1 else ""))
