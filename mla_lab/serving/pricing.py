"""Step pricers: a :class:`~mla_lab.serving.step.Step` -> milliseconds (any ``StepPricer = Callable[[Step],
float]`` returning a finite ms > 0; docs/serving.md, "How the pricer plugs in").

- The sparse-attention view of a step: a prompt token at position ``p`` sees ``min(p + 1, topk)`` keys, a decode
  token of context ``c`` ``min(c, topk)`` (``index_topk`` of the model's config.json: 2048 for GLM-5 and
  DeepSeek-V3.2); :func:`step_topk_lengths` is the one padded ``flash_mla_sparse_fwd`` call's ``topk_length``
  (decodes first, as vLLM reorders the batch; bf16 KV sends every token down the sparse path, vLLM
  ``mla_attention.py``).
- :class:`LinearStepPricer` (illustrative coefficients, for tests) and :class:`ConstantPricer`.
- :func:`make_pricer`: the adapter hook ``fn(prefill_topk, decode_topk, cuda_graph)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._checks import check_float, check_int
from .step import DecodeToken, PrefillChunk, Step, StepPricer

__all__ = ["StepPricer", "DEFAULT_TOPK", "prefill_topk_lengths", "decode_topk_length", "step_topk_lengths",
           "index_topk_from_config", "LinearStepPricer", "make_pricer", "ConstantPricer"]

DEFAULT_TOPK = 2048


def prefill_topk_lengths(chunk: PrefillChunk, topk: int = DEFAULT_TOPK) -> np.ndarray:
    """Per-token ``topk_length`` of a prefill chunk (int32 array of ``chunk.num_tokens``): token at prompt
    position ``p`` sees ``min(p + 1, topk)`` keys.

    Raises:
        ValueError: ``topk`` not a positive int.
    """
    check_int("topk", topk)
    pos = np.arange(chunk.start, chunk.end, dtype=np.int64)
    return np.minimum(pos + 1, topk).astype(np.int32)


def decode_topk_length(token: DecodeToken, topk: int = DEFAULT_TOPK) -> int:
    """``topk_length`` of a decode token: ``min(context_len, topk)`` keys.

    Raises:
        ValueError: ``topk`` not a positive int.
    """
    check_int("topk", topk)
    return min(token.context_len, topk)


def step_topk_lengths(step: Step, topk: int = DEFAULT_TOPK) -> np.ndarray:
    """The step's whole ``topk_length`` vector (int32, ``step.num_tokens``): decode tokens, then chunks."""
    parts = [np.array([decode_topk_length(d, topk) for d in step.decode], dtype=np.int32)]
    parts += [prefill_topk_lengths(c, topk) for c in step.prefill_chunks]
    return np.concatenate(parts).astype(np.int32)


def index_topk_from_config(path: str | Path) -> int:
    """``index_topk`` of an HF ``config.json`` (a file or the folder holding it).

    Raises:
        ValueError: the file is missing or has no positive int ``index_topk``.
    """
    p = Path(path)
    p = p / "config.json" if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"path={str(path)!r} must be a config.json or a folder holding one")
    topk = json.loads(p.read_text()).get("index_topk")
    return check_int(f"index_topk (in {p})", topk)


def _check_ms(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"{what} returned {value!r} ms; it must be a finite float > 0")
    return float(value)


@dataclass(frozen=True)
class LinearStepPricer:
    """Reference pricer (ms), explicit and linear in the step's contents:

    ``per_step_ms + per_token_ms * num_tokens + per_prefill_ctx_ms * sum(prefill topk lengths)
    + per_decode_ctx_ms * sum(decode topk lengths) + (0 if cuda_graph else eager_step_ms)``

    ``topk``: the sparse-attention top-k (``index_topk``). Coefficients are ms per step / token / key.

    Raises:
        ValueError: a coefficient that is negative, NaN or inf; ``topk`` not a positive int; all coefficients 0.
    """

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
        if self.per_step_ms == 0 and self.per_token_ms == 0 and self.eager_step_ms == 0 \
                and self.per_prefill_ctx_ms == 0 and self.per_decode_ctx_ms == 0:
            raise ValueError("LinearStepPricer() with every coefficient 0 prices steps at 0 ms; set per_step_ms or "
                             "per_token_ms > 0")

    def __call__(self, step: Step) -> float:
        pre = sum(int(prefill_topk_lengths(c, self.topk).sum()) for c in step.prefill_chunks)
        dec = sum(decode_topk_length(d, self.topk) for d in step.decode)
        ms = (self.per_step_ms + self.per_token_ms * step.num_tokens + self.per_prefill_ctx_ms * pre
              + self.per_decode_ctx_ms * dec + (0.0 if step.cuda_graph else self.eager_step_ms))
        return _check_ms(ms, "LinearStepPricer")


@dataclass(frozen=True)
class ConstantPricer:
    """Every step costs ``ms`` (tests and hand-worked examples).

    Raises:
        ValueError: ``ms`` not a finite float > 0.
    """

    ms: float

    def __post_init__(self) -> None:
        check_float("ms", self.ms, low=0.0)

    def __call__(self, step: Step) -> float:
        return float(self.ms)


def make_pricer(fn: Callable[[list[np.ndarray], np.ndarray, bool], float], topk: int = DEFAULT_TOPK) -> StepPricer:
    """Adapt a cost function of the step's attention shape to a :data:`StepPricer`.

    ``fn(prefill_topk, decode_topk, cuda_graph) -> ms`` where

    - ``prefill_topk``: one int32 array per prefill chunk, in scheduling order: the chunk's per-token
      ``topk_length`` (:func:`prefill_topk_lengths`); ``len(a)`` is the chunk's token count;
    - ``decode_topk``: int32 array, one ``min(context_len, topk)`` per decode token;
    - ``cuda_graph``: ``step.cuda_graph`` (True only for a uniform decode batch run as a full CUDA graph).

    A pricer that needs more (the padded CUDA-graph size ``step.cudagraph_num_tokens``, request ids) can be any
    ``Callable[[Step], float]`` instead.

    Raises:
        ValueError: ``fn`` not callable, ``topk`` not a positive int; at call time, ``fn`` returning anything but
            a finite number > 0.
    """
    if not callable(fn):
        raise ValueError(f"fn={fn!r} must be callable as fn(prefill_topk, decode_topk, cuda_graph) -> ms")
    check_int("topk", topk)
    name = getattr(fn, "__name__", type(fn).__name__)

    def pricer(step: Step) -> float:
        pre = [prefill_topk_lengths(c, topk) for c in step.prefill_chunks]
        dec = np.array([decode_topk_length(d, topk) for d in step.decode], dtype=np.int32)
        return _check_ms(fn(pre, dec, step.cuda_graph), f"pricer fn {name}")

    pricer.__name__ = f"make_pricer({name})"
    return pricer
