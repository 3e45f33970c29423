"""Workload -> time to first token (TTFT), modelled.

``predict_ttft`` schedules the workload into chunked-prefill steps (:func:`mla_lab.workload.schedule`), prices every
step on one rank, and returns each prompt's TTFT = sum of step times up to the step holding its last prompt token.

Scope ``attention_path``: a step costs ``num_hidden_layers x`` the sparse attention path of
:mod:`mla_lab.costmodel` (concat, pad, sparse kernel, output slice). This is only the part of TTFT that the
strategies change plus the attention kernel; it is a lower bound on TTFT and overstates the *relative* change.
"""

from __future__ import annotations

from .arch import GPUArch, get_arch
from .costmodel import Calibration, attention_path_ms
from .models import ModelConfig, load_model
from .workload import Workload, schedule

__all__ = ["predict_ttft", "SCOPES"]

SCOPES = ("attention_path",)


def predict_ttft(
    model: ModelConfig | str,
    tp: int,
    arch: str | GPUArch,
    workload: Workload,
    max_num_batched_tokens: int,
    strategy: str,
    kv_cache_dtype: str = "bf16",
    calibration: Calibration | None = None,
    scope: str = "attention_path",
) -> dict:
    """Modelled TTFT of ``workload`` on one rank.

    Returns a dict: ``ttft_ms_mean`` and ``ttft_ms_max`` over prompts (ms), ``num_steps``, ``step_ms`` (list, ms
    per step), ``ops_ms`` (per-op ms summed over all steps and layers), ``scope``.

    Raises:
        ValueError: unknown scope; anything :func:`mla_lab.costmodel.attention_path_ms` raises.
    """
    if scope not in SCOPES:
        raise ValueError(f"scope={scope!r} is not known; allowed: {list(SCOPES)}")
    model = load_model(model)
    arch = get_arch(arch)
    steps = schedule(workload, max_num_batched_tokens)
    step_ms, ops_ms, ttfts = [], {}, []
    elapsed = 0.0
    for st in steps:
        per = attention_path_ms(model, tp, arch, strategy, st, kv_cache_dtype, calibration)
        t = per["total"] * model.num_hidden_layers
        for k, v in per.items():
            if k != "total":
                ops_ms[k] = ops_ms.get(k, 0.0) + v * model.num_hidden_layers
        elapsed += t
        step_ms.append(t)
        ttfts.extend([elapsed] * len(st.finished_prompts(workload.prompt_len)))
    return {
        "ttft_ms_mean": sum(ttfts) / len(ttfts),
        "ttft_ms_max": max(ttfts),
        "num_steps": len(steps),
        "step_ms": step_ms,
        "ops_ms": ops_ms,
        "scope": scope,
    }
