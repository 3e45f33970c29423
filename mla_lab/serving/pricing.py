"""Step pricers: a :class:`~mla_lab.serving.step.Step` -> ms (finite, > 0; docs/serving.md, "How the pricer plugs in").
A prompt token at position ``p`` sees ``min(p + 1, topk)`` keys, a decode token of context ``c`` ``min(c, topk)``
(``index_topk`` of config.json: 2048 for GLM-5 and DeepSeek-V3.2); :func:`step_topk_lengths` is the padded
``flash_mla_sparse_fwd`` call's ``topk_length`` (decodes first, as vLLM reorders the batch; bf16 KV sends every token
down the sparse path, vLLM ``mla_attention.py``). :class:`LinearStepPricer` and :class:`ConstantPricer` are for tests;
:func:`make_pricer` adapts ``fn(prefill_topk, decode_topk, cuda_graph)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._checks import check_float, check_int, check_ms
from .step import DecodeToken, PrefillChunk, Step, StepPricer

DEFAULT_TOPK = 2048


def prefill_topk_lengths(chunk: PrefillChunk, topk: int = DEFAULT_TOPK) -> np.ndarray:
    """Per-token ``topk_length`` of a prefill chunk (int32, ``chunk.num_tokens``). Raises ValueError: a bad topk."""
    check_int("topk", topk)
    return np.minimum(np.arange(chunk.start, chunk.end, dtype=np.int64) + 1, topk).astype(np.int32)


def decode_topk_length(token: DecodeToken, topk: int = DEFAULT_TOPK) -> int:
    """``min(context_len, topk)`` keys. Raises ValueError: ``topk`` not a positive int."""
    check_int("topk", topk)
    return min(token.context_len, topk)


def step_topk_lengths(step: Step, topk: int = DEFAULT_TOPK) -> np.ndarray:
    """The step's whole ``topk_length`` vector (int32, ``step.num_tokens``): decode tokens, then chunks."""
    parts = [np.array([decode_topk_length(d, topk) for d in step.decode], dtype=np.int32)]
    parts += [prefill_topk_lengths(c, topk) for c in step.prefill_chunks]
    return np.concatenate(parts).astype(np.int32)


@dataclass(frozen=True)
class LinearStepPricer:
    """Reference pricer, linear in the step (ms per step / token / key): ``per_step_ms + per_token_ms * num_tokens
    + per_prefill_ctx_ms * sum(prefill topk) + per_decode_ctx_ms * sum(decode topk) + (0 if cuda_graph else
    eager_step_ms)``. Raises ValueError: a negative or non-finite coefficient, a bad ``topk``, all coefficients 0."""

    per_token_ms: float = 0.0
    per_step_ms: float = 0.0
    per_decode_ctx_ms: float = 0.0
    per_prefill_ctx_ms: float = 0.0
    eager_step_ms: float = 0.0
    topk: int = DEFAULT_TOPK

    def __post_init__(self) -> None:
        for name in ("per_token_ms", "per_step_ms", "per_decode_ctx_ms", "per_prefill_ctx_ms", "eager_step_ms"):
            check_float(name, getattr(self, name), low=0.0, low_inclusive=True)
        check_int("topk", self.topk)
        if not any(getattr(self, name) for name in ("per_token_ms", "per_step_ms", "per_decode_ctx_ms",
                                                    "per_prefill_ctx_ms", "eager_step_ms")):
            raise ValueError("LinearStepPricer() with every coefficient 0 prices steps at 0 ms; set per_step_ms or "
                             "per_token_ms > 0")

    def __call__(self, step: Step) -> float:
        pre = sum(int(prefill_topk_lengths(c, self.topk).sum()) for c in step.prefill_chunks)
        dec = sum(decode_topk_length(d, self.topk) for d in step.decode)
        ms = (self.per_step_ms + self.per_token_ms * step.num_tokens + self.per_prefill_ctx_ms * pre
              + self.per_decode_ctx_ms * dec + (0.0 if step.cuda_graph else self.eager_step_ms))
        return check_ms(ms, "LinearStepPricer")


@dataclass(frozen=True)
class ConstantPricer:
    """Every step costs ``ms``. Raises ValueError: ``ms`` not a finite float > 0."""

    ms: float

    def __post_init__(self) -> None:
        check_float("ms", self.ms, low=0.0)

    def __call__(self, step: Step) -> float:
        return float(self.ms)


def make_pricer(fn: Callable[[list[np.ndarray], np.ndarray, bool], float], topk: int = DEFAULT_TOPK) -> StepPricer:
    """A :data:`StepPricer` from ``fn(prefill_topk, decode_topk, cuda_graph) -> ms``: ``prefill_topk`` one int32
    array per chunk (:func:`prefill_topk_lengths`), ``decode_topk`` int32, one per decode token, ``cuda_graph``
    ``step.cuda_graph``. Raises ValueError: ``fn`` not callable, a bad ``topk``; at call time, ``fn`` returning
    anything but a finite number > 0."""
    if not callable(fn):
        raise ValueError(f"fn={fn!r} must be callable as fn(prefill_topk, decode_topk, cuda_graph) -> ms")
    check_int("topk", topk)
    name = getattr(fn, "__name__", type(fn).__name__)

    def pricer(step: Step) -> float:
        pre = [prefill_topk_lengths(c, topk) for c in step.prefill_chunks]
        dec = np.array([decode_topk_length(d, topk) for d in step.decode], dtype=np.int32)
        return check_ms(fn(pre, dec, step.cuda_graph), f"pricer fn {name}")

    pricer.__name__ = f"make_pricer({name})"
    return pricer
