"""A rank's sparse-MLA prefill attention path per strategy, timed on a GPU, and each call's peak memory (bytes one call
allocates on top of its inputs and workspace). Inputs: :func:`make_step_inputs`. Sweep rows: :mod:`mla_lab.sweep.rows`.
"""

from __future__ import annotations

import math

import torch

from ..kernels import last_backend
from ..placement import MEASURED_STRATEGIES, parse_strategy
from ..strategies import PaddedQPath
from ..workload import Step
from .timer import interleaved, summarize


def _require_cuda(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("measurement needs a CUDA GPU; torch sees none (use device='cpu' for modelled rows)")


def sm_scale(model) -> float:
    """The softmax scale the lab passes, ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` (no rope-scaling factor:
    the value does not change the work)."""
    return 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)


def padded_path(rank, strategy, max_num_batched_tokens: int | None = None, device: str = "cuda", **kw) -> PaddedQPath:
    """:class:`~mla_lab.strategies.PaddedQPath` of ``strategy`` with the rank's heads, GPU and KV dtype, buffers of
    ``max_num_batched_tokens`` rows (default the rank's); ``kw`` as PaddedQPath's."""
    T = rank.max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    return PaddedQPath(strategy, num_heads=rank.num_heads, max_num_batched_tokens=T, arch=rank.arch.name,
                       kv_cache_dtype=rank.kv_cache_dtype, device=device, **kw)


def make_step_inputs(rank, step: Step, prompt_len: int, seed: int = 0, full_topk: bool = False, device: str = "cuda"):
    """Random bf16 inputs of one step (never zeros): ``ql_nope [T,H,512]``, ``q_pe [T,H,64]`` (strided like vLLM),
    ``kv [s_kv,1,576]`` (``prompt_len`` keys per prompt), causal ``indices [T,1,topk]`` int32 and ``topk_length
    [T]`` int32 (the token at position p sees ``min(p + 1, topk)`` keys of its prompt; ``full_topk``: all topk
    random keys, ``None``).

    Raises:
        RuntimeError: ``device="cuda"`` without a GPU."""
    _require_cuda(device)
    m, g, dev = rank.model, torch.Generator(device=device).manual_seed(seed), device
    H, T, topk = rank.num_heads, step.num_tokens, m.topk
    ql_nope = torch.randn(H, T, m.kv_lora_rank, device=dev, dtype=torch.bfloat16, generator=g).transpose(0, 1)
    q_full = torch.randn(T, H, m.qk_nope_head_dim + m.qk_rope_head_dim, device=dev, dtype=torch.bfloat16, generator=g)
    q_pe = q_full[..., m.qk_nope_head_dim:]
    s_kv = max(len(step.chunks) * prompt_len, topk)
    kv = torch.randn(s_kv, 1, m.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    pos = torch.cat([torch.arange(s, s + n, device=dev) for _, s, n in step.chunks])
    base = torch.cat([torch.full((n,), j * prompt_len, device=dev) for j, (_, s, n) in enumerate(step.chunks)])
    if full_topk:
        idx, tl = torch.randint(0, s_kv, (T, topk), device=dev, generator=g), None
    else:
        visible = pos + 1
        r = torch.rand(T, topk, device=dev, generator=g)
        idx = base[:, None] + (r * visible[:, None]).long()
        tl = torch.clamp(visible, max=topk).to(torch.int32)
    return ql_nope, q_pe, kv, idx.to(torch.int32).view(T, 1, topk), tl


def _consumer(path):
    """``subchunk:<S>:views`` ends at the consumer (the W_UV bmm, timed by the layer model): no gather."""
    return (lambda s, o, lse: None) if path.spec.views_handoff else None


def call_peak_bytes(fn) -> int:
    """Bytes one call of ``fn`` allocates above what was allocated before it (``max_memory_allocated`` after
    ``reset_peak_memory_stats``; its result held until the call is done). CUDA only."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - before


def _call_peak(rank, name, T, inputs, sm_scale, device) -> int:
    """:func:`call_peak_bytes` of ``name`` (a fresh ``new_empty`` pad, as the engine's), after a warm-up call."""
    path = padded_path(rank, name, T, device)
    path(*inputs[:4], sm_scale, inputs[4], consumer=_consumer(path))
    return call_peak_bytes(lambda: path(*inputs[:4], sm_scale, inputs[4], consumer=_consumer(path)))


def time_attention_path(rank, step: Step, prompt_len: int, strategies=MEASURED_STRATEGIES, full_topk: bool = False,
                        seed: int = 0, device: str = "cuda", repeats: int = 7) -> dict:
    """Each strategy's attention path (:func:`padded_path`, buffers of the step's tokens) on the same inputs,
    ``repeats`` rounds of :func:`mla_lab.measure.timer.interleaved` (``per_call_empty``'s pad from a block filled
    once: what the caching allocator hands back), then each call's peak (:func:`_call_peak`).

    Returns:
        ``{name: {"total": median ms, "samples": [ms, ...], "q1", "q3", "ci_lo", "ci_hi", "peak_bytes",
        "workspace_bytes"}, "kernel_backend", "concat_backend", "repeats"}`` (``peak_bytes`` None on CPU and for
        ``subchunk:<S>:graph2``, whose replay allocates nothing: its chunk outputs live in the graph's pool).

    Raises:
        RuntimeError: ``device="cuda"`` without a GPU; ValueError: an unknown strategy or ``kernel_native``.
    """
    _require_cuda(device)
    T = step.num_tokens
    inputs = make_step_inputs(rank, step, prompt_len, seed, full_topk, device)
    ql_nope, q_pe, kv, idx, tl = inputs
    sm = sm_scale(rank.model)
    paths = {name: padded_path(rank, name, T, device, reuse_pad_block=True) for name in strategies}
    samples = interleaved({n: (lambda p=p: p(ql_nope, q_pe, kv, idx, sm, tl, consumer=_consumer(p)))
                           for n, p in paths.items()}, repeats=repeats, device=device)
    res: dict = {}
    for name, path in paths.items():
        r = summarize(samples[name])
        res[name] = {"total": r["median"], "samples": samples[name], "q1": r["q1"], "q3": r["q3"],
                     "ci_lo": r["ci_lo"], "ci_hi": r["ci_hi"],
                     "workspace_bytes": sum(w.nbytes for w in path.workspaces), "peak_bytes": None}
    del paths
    if device == "cuda":
        for name in strategies:
            if not parse_strategy(name).graphed:  # graph2: a replay allocates nothing (its memory: the graph's pool)
                res[name]["peak_bytes"] = _call_peak(rank, name, T, inputs, sm, device)
    return res | {"kernel_backend": str(last_backend("sparse_mla_prefill")),
                  "concat_backend": str(last_backend("concat_mla_q")), "repeats": repeats}


def nan_padding_check(rank, T: int = 4096) -> dict:
    """Does garbage in the private workspace's padded heads (vLLM leaves them uninitialized) reach the real heads?
    ``private_workspace`` on one ``T``-token prompt, padded heads NaN, inf, then zeros: ``nan_in_real_heads``,
    ``nan_max_abs_diff``, ``inf_...`` against zeros.

    Raises:
        RuntimeError: no GPU.
    """
    _require_cuda("cuda")
    step = Step([(0, 0, T)])
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(rank, step, T, seed=1)
    outs = {}
    for fill in ("nan", "zero", "inf"):
        s = padded_path(rank, "private_workspace", T)
        s.workspace.buffer.fill_({"nan": float("nan"), "zero": 0.0, "inf": float("inf")}[fill])
        o, lse = s(ql_nope, q_pe, kv, idx, sm_scale(rank.model), tl)
        outs[fill] = o.float().clone()
    res = {"model": rank.model.name, "tp": rank.tp, "num_heads": rank.num_heads, "T": T}
    for fill in ("nan", "inf"):
        res[f"{fill}_in_real_heads"] = bool(torch.isnan(outs[fill]).any().item())
        res[f"{fill}_max_abs_diff"] = float((outs[fill] - outs["zero"]).abs().nan_to_num(float("inf")).max().item())
    return res
