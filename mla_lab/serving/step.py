"""One engine step of a vLLM v1 serving run: its decode tokens (``context_len`` = position + 1), prefill chunks and
launch (docs/serving.md). ``cudagraph_mode`` under vLLM's default ``FULL_AND_PIECEWISE`` (``docs/design/cuda_graphs.md``
@ 0045689b): ``"FULL"`` for a uniform batch (``max_query_len == 1 and num_tokens == num_reqs``,
``vllm/v1/worker/gpu_model_runner.py``; FlashMLA sparse declares ``AttentionCGSupport.UNIFORM_BATCH``,
``flashmla_sparse.py`` @ 008a0c31) up to the largest capture size, ``"PIECEWISE"`` for other batches up to it,
``"NONE"`` above or with ``enforce_eager``. Capture sizes: ``VllmConfig._set_cudagraph_sizes``
(``vllm/config/vllm.py``)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt positions ``[start, end)`` of request ``req_id`` computed in one step (tokens)."""

    req_id: int
    start: int
    num_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class DecodeToken:
    """One decode token of request ``req_id``; it attends to ``context_len`` KV entries, itself included."""

    req_id: int
    context_len: int


@dataclass(frozen=True)
class Step:
    """The tokens one engine step computes, in scheduling order (module docstring)."""

    decode: tuple[DecodeToken, ...] = ()
    prefill_chunks: tuple[PrefillChunk, ...] = ()
    cudagraph_mode: str = "NONE"
    cudagraph_num_tokens: int | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens computed (decode + prefill chunk tokens), before any CUDA-graph padding."""
        return len(self.decode) + sum(c.num_tokens for c in self.prefill_chunks)

    @property
    def kind(self) -> str:
        """``"prefill"`` (no decode token), ``"decode"`` (no chunk) or ``"mixed"``."""
        return ("mixed" if self.decode else "prefill") if self.prefill_chunks else "decode"

    @property
    def cuda_graph(self) -> bool:
        """True when the whole step, attention included, replays one full CUDA graph (``"FULL"``)."""
        return self.cudagraph_mode == "FULL"


StepPricer = Callable[[Step], float]
"""A pricer: the step's duration in milliseconds (finite, > 0)."""


def cudagraph_capture_sizes(max_num_seqs: int, max_capture_size: int | None = None) -> tuple[int, ...]:
    """``[1, 2, 4] + range(8, 256, 8) + range(256, top + 1, 16)`` up to ``top`` (tokens; default
    ``min(max_num_seqs * 2, 512)``)."""
    top = min(max_num_seqs * 2, 512) if max_capture_size is None else max_capture_size
    return tuple(s for s in [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16)) if s <= top)


def launch_mode(decode: tuple[DecodeToken, ...], prefill_chunks: tuple[PrefillChunk, ...],
                capture_sizes: tuple[int, ...], enforce_eager: bool) -> tuple[str, int | None]:
    """(cudagraph_mode, padded tokens) of a batch under ``FULL_AND_PIECEWISE`` (module docstring)."""
    n = len(decode) + sum(c.num_tokens for c in prefill_chunks)
    if enforce_eager or not capture_sizes or n > capture_sizes[-1]:
        return "NONE", None
    uniform = all(c.num_tokens == 1 for c in prefill_chunks)  # max_query_len == 1 and num_tokens == num_reqs
    return ("FULL" if uniform else "PIECEWISE"), capture_sizes[bisect.bisect_left(capture_sizes, n)]
