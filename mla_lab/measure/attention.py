"""Measurement on a GPU: the sparse-MLA prefill attention path per strategy, per op and end to end, plus peak memory.

Timing: :func:`mla_lab.measure.timer.median_ms` (do_bench medians on CUDA). Inputs are
fresh random bf16 tensors (never zeros) shaped as vLLM hands them over: ``ql_nope`` is the transposed output of the
W_UK bmm (``[H, T, 512]`` viewed as ``[T, H, 512]``, head-major strides) and ``q_pe`` a slice of the q_b projection
output (``[T, H, qk_nope_head_dim + 64][..., -64:]``). Causal prompts: the token at position p of its prompt sees
``min(p + 1, topk)`` keys of its own prompt (``topk_length``); indices are random among those keys.

Peak memory: ``torch.cuda.reset_peak_memory_stats`` then ``max_memory_allocated`` minus the bytes allocated before
the call, i.e. what one layer call of the strategy adds on top of its inputs and persistent workspace.

Timing goes through :mod:`mla_lab.measure.timer`. This module returns timings; sweep rows are built by
:mod:`mla_lab.sweep.rows`.
"""

from __future__ import annotations

import math

import torch

from ..kernels import last_backend
from ..models import ModelConfig, load_model
from ..placement import MEASURED_STRATEGIES, parse_strategy
from ..strategies import PaddedQPath
from ..workload import Step
from .timer import interleaved, summarize

__all__ = ["make_step_inputs", "time_attention_path", "nan_padding_check", "MEASURED_STRATEGIES"]


def _require_cuda():


    if not torch.cuda.is_available():
        raise RuntimeError("measurement needs a CUDA GPU; torch sees none (use device='cpu' for modelled rows)")
    return torch

def make_step_inputs(model, tp: int, step: Step, prompt_len: int, seed: int = 0, full_topk: bool = False,
                     device: str = "cuda"):
    """Random inputs for one step on the GPU: ``ql_nope [T,H,512]``, ``q_pe [T,H,64]`` (strided like vLLM), ``kv
    [s_kv,1,576]`` (one region of ``prompt_len`` keys per prompt in the step), ``indices [T,1,topk]`` int32 and
    ``topk_length [T]`` int32 (``None`` when ``full_topk``: every token uses all topk random keys)."""


    if device == "cuda":
        _require_cuda()
    g = torch.Generator(device=device).manual_seed(seed)
    H = model.heads_per_rank(tp)
    T = step.num_tokens
    topk = model.topk
    dev = device
    ql_nope = torch.randn(H, T, model.kv_lora_rank, device=dev, dtype=torch.bfloat16, generator=g).transpose(0, 1)
    q_full = torch.randn(T, H, model.qk_nope_head_dim + model.qk_rope_head_dim, device=dev, dtype=torch.bfloat16,
                         generator=g)
    q_pe = q_full[..., model.qk_nope_head_dim:]
    n_prompts = len(step.chunks)
    s_kv = max(n_prompts * prompt_len, topk)
    kv = torch.randn(s_kv, 1, model.head_size, device=dev, dtype=torch.bfloat16, generator=g)
    pos = torch.cat([torch.arange(s, s + n, device=dev) for _, s, n in step.chunks])
    base = torch.cat([torch.full((n,), j * prompt_len, device=dev) for j, (_, s, n) in enumerate(step.chunks)])
    if full_topk:
        idx = torch.randint(0, s_kv, (T, topk), device=dev, generator=g)
        tl = None
    else:
        visible = pos + 1
        r = torch.rand(T, topk, device=dev, generator=g)
        idx = base[:, None] + (r * visible[:, None]).long()
        tl = torch.clamp(visible, max=topk).to(torch.int32)
    return ql_nope, q_pe, kv, idx.to(torch.int32).view(T, 1, topk), tl



def time_attention_path(model: ModelConfig, tp: int, step: Step, prompt_len: int, arch_name: str,
                        strategies=MEASURED_STRATEGIES, full_topk: bool = False, seed: int = 0,
                        device: str = "cuda", repeats: int = 7) -> dict:
    """The attention path of one layer call per strategy, timed interleaved, and each strategy's call peak.

    Every strategy runs as :class:`mla_lab.strategies.PaddedQPath` on the same inputs. ``repeats`` rounds of
    :func:`mla_lab.measure.timer.interleaved` (order rotated each round, L2 flushed before each sample) give each
    strategy its samples; ``per_call_empty`` takes its pad tensor from a block filled once with its content (what
    the caching allocator hands back, no GPU work). The call peak (bytes above what was allocated before the call)
    comes from one further call with a fresh ``new_empty`` tensor, as the engine allocates it.

    Returns:
        ``{name: {"total": median ms, "samples": [ms, ...], "q1", "q3", "ci_lo", "ci_hi", "peak_bytes",
        "workspace_bytes"}, "kernel_backend", "concat_backend", "repeats"}`` (``peak_bytes`` None on CPU and for
        ``subchunk:<S>:graph2``, whose replay allocates nothing: its chunk outputs live in the graph's pool).

    Raises:
        RuntimeError: ``device="cuda"`` without a GPU; ValueError: an unknown strategy or ``kernel_native``.
    """
    if device == "cuda":
        _require_cuda()
    H = model.heads_per_rank(tp)
    T = step.num_tokens
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(model, tp, step, prompt_len, seed, full_topk, device)
    sm_scale = 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)
    kw = dict(num_heads=H, max_num_batched_tokens=T, arch=arch_name, device=device)
    paths = {name: PaddedQPath(name, **kw, reuse_pad_block=True) for name in strategies}
    def consumer_of(path):
        # ``subchunk:<S>:views`` hands each chunk's view to the consumer (the W_UV bmm, timed by the layer model):
        # the attention path itself ends there, without gathering the chunks
        return (lambda s, o, lse: None) if path.spec.views_handoff else None  # views / graph2

    samples = interleaved({n: (lambda p=p: p(ql_nope, q_pe, kv, idx, sm_scale, tl, consumer=consumer_of(p)))
                           for n, p in paths.items()}, repeats=repeats, device=device)
    res: dict = {}
    for name, path in paths.items():
        r = summarize(samples[name])
        res[name] = {"total": r["median"], "samples": samples[name], "q1": r["q1"], "q3": r["q3"],
                     "ci_lo": r["ci_lo"], "ci_hi": r["ci_hi"],
                     "workspace_bytes": sum(w.nbytes for w in path.workspaces),  # graph2: two
                     "peak_bytes": None}
    del paths
    if device == "cuda":
        for name in strategies:
            if parse_strategy(name).graphed:
                continue  # graph2: a replay allocates nothing (its memory is the graph's pool): no call peak (None)
            path = PaddedQPath(name, **kw)  # per_call_empty allocates its pad per call here, as vLLM does
            path(ql_nope, q_pe, kv, idx, sm_scale, tl, consumer=consumer_of(path))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = path(ql_nope, q_pe, kv, idx, sm_scale, tl, consumer=consumer_of(path))
            torch.cuda.synchronize()
            res[name]["peak_bytes"] = torch.cuda.max_memory_allocated() - before
            del out, path
    res["kernel_backend"] = str(last_backend("sparse_mla_prefill"))
    res["concat_backend"] = str(last_backend("concat_mla_q"))
    res["repeats"] = repeats
    return res


def nan_padding_check(model_name: str = "glm-5", tp: int = 8, T: int = 4096, prompt_len: int = 4096,
                      arch_name: str = "hopper") -> dict:
    """Does garbage in the private workspace's padded heads reach the real heads' output?

    Runs the ``private_workspace`` path on the same inputs: padded heads filled with NaN, then with zeros; compares the real
    heads' outputs (``nan_in_real_heads``, ``max_abs_diff``). vLLM leaves those heads uninitialized; some vLLM
    variants zero them because the kernel reduces across the head group.
    """
    torch = _require_cuda()
    model = load_model(model_name)
    H = model.heads_per_rank(tp)
    step = Step([(0, 0, T)])
    ql_nope, q_pe, kv, idx, tl = make_step_inputs(model, tp, step, prompt_len, seed=1)
    sm = 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)
    outs = {}
    for fill in ("nan", "zero", "inf"):
        s = PaddedQPath("private_workspace", num_heads=H, max_num_batched_tokens=T, arch=arch_name, device="cuda")
        s.workspace.buffer.fill_({"nan": float("nan"), "zero": 0.0, "inf": float("inf")}[fill])
        o, lse = s(ql_nope, q_pe, kv, idx, sm, tl)
        outs[fill] = (o.float().clone(), lse.clone())
    zo, zl = outs["zero"]
    res = {"model": model_name, "tp": tp, "num_heads": H, "T": T}
    for fill in ("nan", "inf"):
        o, lse = outs[fill]
        res[f"{fill}_in_real_heads"] = bool(torch.isnan(o).any().item())
        res[f"{fill}_max_abs_diff"] = float((o - zo).abs().nan_to_num(float("inf")).max().item())
    return res
