"""A deterministic model of vLLM v1's scheduler (FCFS, chunked prefill, prefix caching off; rules in docs/serving.md,
"Engine"), read in ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule`` @ 00024d31) and
``vllm/v1/core/kv_cache_manager.py`` (``allocate_slots`` @ 003df296). Each step: running requests first, then waiting
ones in arrival order while budget, a ``max_num_seqs`` slot and KV blocks last (FCFS ``break``). No preemption:
``kv_admission="reserve"`` admits a request only when its whole footprint fits; ``"lazy"`` admits as vLLM and raises
:class:`PreemptionRequired` where vLLM would preempt. ``async_scheduling`` (vLLM v1's default,
``vllm/config/scheduler.py``; ``EngineCore.step_with_batch_queue`` @ 00080ee1) builds the same steps; its timing is
:func:`mla_lab.serving.simulate.simulate`'s. ``block_size`` 16 is ``CacheConfig.DEFAULT_BLOCK_SIZE``
(``vllm/config/cache.py`` @ 002f10e0); FlashMLA sparse supports only 64."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ._checks import check_bool, check_int, check_int_or_none
from .step import DecodeToken, PrefillChunk, Step, cudagraph_capture_sizes, launch_mode

KV_ADMISSIONS = ("reserve", "lazy")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class PreemptionRequired(RuntimeError):
    """Raised in ``kv_admission="lazy"`` mode at the step where vLLM would preempt a request (not modelled)."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Engine limits, vLLM's flags (tokens): ``kv_capacity_tokens`` from the memory model, ``// block_size`` blocks;
    ``long_prefill_token_threshold`` 0 = off; ``max_cudagraph_capture_size`` None = ``min(2 * max_num_seqs, 512)``;
    ``async_scheduling`` off by default (vLLM's is on) so that runs with spread arrivals keep the lab's earlier
    numbers (with every request at t = 0 both give the same run).

    Raises:
        ValueError: one line naming the field, its value and what is allowed (also ``kv_capacity_tokens <
            block_size``: not one block).
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    kv_capacity_tokens: int
    block_size: int = 16
    long_prefill_token_threshold: int = 0
    kv_admission: str = "reserve"
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = None
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        for k in ("max_num_batched_tokens", "max_num_seqs", "kv_capacity_tokens", "block_size"):
            check_int(k, getattr(self, k))
        if self.kv_capacity_tokens < self.block_size:
            raise ValueError(f"kv_capacity_tokens={self.kv_capacity_tokens!r} must be >= block_size="
                             f"{self.block_size} (at least one KV block)")
        check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, allow_zero=True)
        if isinstance(self.kv_admission, bool) or self.kv_admission not in KV_ADMISSIONS:
            raise ValueError(f"kv_admission={self.kv_admission!r} must be one of {list(KV_ADMISSIONS)}")
        check_bool("enforce_eager", self.enforce_eager)
        check_int_or_none("max_cudagraph_capture_size", self.max_cudagraph_capture_size)
        check_bool("async_scheduling", self.async_scheduling)

    @property
    def num_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def footprint_blocks(self, prompt_len: int, output_len: int) -> int:
        """Blocks a request holds at its peak: ``ceil((prompt_len + output_len - 1) / block_size)``."""
        return _cdiv(prompt_len + output_len - 1, self.block_size)


@dataclass(frozen=True)
class TokenEvent:
    """An output token sampled at the end of a step: ``index`` 0 is the first token; ``finished`` on the last."""

    req_id: int
    index: int
    finished: bool


@dataclass
class _Req:
    req_id: int
    prompt_len: int
    output_len: int
    num_computed: int = 0
    num_output: int = 0
    blocks: int = 0
    reserved: int = 0

    @property
    def num_tokens(self) -> int:  # prompt + sampled output tokens (vLLM's request.num_tokens)
        return self.prompt_len + self.num_output


@dataclass
class Scheduler:
    """:meth:`add_request`, then alternately :meth:`schedule` and :meth:`update_from_step`. Raises ValueError (a
    request that never fits the KV cache, a duplicate id), RuntimeError (``schedule`` twice without
    ``update_from_step``), :class:`PreemptionRequired` (``"lazy"``, where vLLM would preempt)."""

    config: SchedulerConfig
    waiting: deque = field(default_factory=deque, init=False)
    running: list = field(default_factory=list, init=False)
    used_blocks: int = field(default=0, init=False)
    reserved_blocks: int = field(default=0, init=False)
    last_kv_wait: bool = field(default=False, init=False)
    _known: set = field(default_factory=set, init=False)
    _pending: Step | None = field(default=None, init=False)
    _capture: tuple = field(default=(), init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, SchedulerConfig):
            raise ValueError(f"config={self.config!r} must be a SchedulerConfig")
        self._capture = cudagraph_capture_sizes(self.config.max_num_seqs, self.config.max_cudagraph_capture_size)

    def check_fits(self, req_id: int, prompt_len: int, output_len: int) -> None:
        """Raise ``ValueError`` if the request's peak footprint exceeds the whole KV cache."""
        c = self.config
        need = c.footprint_blocks(prompt_len, output_len)
        if need > c.num_blocks:
            raise ValueError(f"request {req_id} needs {need} KV blocks ({prompt_len + output_len - 1} tokens = "
                             f"prompt {prompt_len} + output {output_len} - 1) but kv_capacity_tokens="
                             f"{c.kv_capacity_tokens} holds {c.num_blocks} blocks of {c.block_size}; it can never "
                             "run (raise kv_capacity_tokens or shorten the request)")

    def add_request(self, req_id: int, prompt_len: int, output_len: int) -> None:
        """Append a request to the waiting queue (FCFS; lengths in tokens >= 1). Raises ValueError: bad lengths, a
        duplicate ``req_id``, a request that can never fit the KV cache."""
        check_int("req_id", req_id, allow_zero=True)
        check_int("prompt_len", prompt_len)
        check_int("output_len", output_len)
        if req_id in self._known:
            raise ValueError(f"req_id={req_id!r} was already added; ids must be unique")
        self.check_fits(req_id, prompt_len, output_len)
        self._known.add(req_id)
        self.waiting.append(_Req(req_id, prompt_len, output_len))

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _chunk_cap(self, n: int) -> int:
        t = self.config.long_prefill_token_threshold
        return t if 0 < t < n else n

    def _schedule_running(self, budget: int, decode: list, chunks: list) -> int:
        """The running requests' next tokens, in order, while budget lasts; the budget left."""
        c = self.config
        for req in self.running:
            if budget <= 0:
                break
            n = min(self._chunk_cap(req.num_tokens - req.num_computed), budget)  # >= 1: finished requests left
            need = _cdiv(req.num_computed + n, c.block_size) - req.blocks
            if need > c.num_blocks - self.used_blocks:
                raise PreemptionRequired(
                    f"request {req.req_id} needs {need} more KV block(s) with {c.num_blocks - self.used_blocks} free "
                    f"of {c.num_blocks}: vLLM would preempt a running request here, which is not modelled; use "
                    "kv_admission='reserve' or more kv_capacity_tokens")
            req.blocks += need
            self.used_blocks += need
            if req.num_computed >= req.prompt_len:
                decode.append(DecodeToken(req.req_id, req.num_computed + 1))
            else:
                chunks.append(PrefillChunk(req.req_id, req.num_computed, n))
            req.num_computed += n
            budget -= n
        return budget

    def _kv_admits(self, req, need: int) -> bool:
        """Whether the KV cache admits ``req`` now (reserving its whole footprint under ``kv_admission="reserve"``);
        sets :attr:`last_kv_wait` when it does not."""
        c = self.config
        reserve = c.kv_admission == "reserve"
        promise = c.footprint_blocks(req.prompt_len, req.output_len) if reserve else 0
        if (self.reserved_blocks + promise > c.num_blocks) if reserve else (need > c.num_blocks - self.used_blocks):
            self.last_kv_wait = True
            return False
        req.reserved, self.reserved_blocks = promise, self.reserved_blocks + promise
        return True

    def _schedule_waiting(self, budget: int, chunks: list) -> None:
        """Waiting requests admitted in FIFO order while budget, a free slot and KV blocks last."""
        c = self.config
        while self.waiting and budget > 0 and len(self.running) < c.max_num_seqs:
            req = self.waiting[0]
            n = min(self._chunk_cap(req.prompt_len), budget)
            need = _cdiv(n, c.block_size)
            if not self._kv_admits(req, need):
                break
            self.running.append(self.waiting.popleft())
            req.blocks = need
            self.used_blocks += need
            chunks.append(PrefillChunk(req.req_id, 0, n))
            req.num_computed = n
            budget -= n

    def schedule(self) -> Step | None:
        """The next step (None: nothing can run); advances the scheduled requests' computed tokens. Sets
        :attr:`last_kv_wait` when the queue's head had budget and a slot but waited for KV blocks."""
        if self._pending is not None:
            raise RuntimeError("schedule() called twice without update_from_step(); apply the previous step first")
        decode, chunks = [], []
        self.last_kv_wait = False
        self._schedule_waiting(self._schedule_running(self.config.max_num_batched_tokens, decode, chunks), chunks)
        if not decode and not chunks:
            return None
        dec, ch = tuple(decode), tuple(chunks)
        self._pending = Step(dec, ch, *launch_mode(dec, ch, self._capture, self.config.enforce_eager))
        return self._pending

    def update_from_step(self, step: Step) -> list[TokenEvent]:
        """Sample the step's tokens, finish requests, free their KV blocks; the tokens in scheduling order. Raises
        RuntimeError: ``step`` is not the one :meth:`schedule` returned last."""
        if step is not self._pending:
            raise RuntimeError("update_from_step() must get the step schedule() returned last")
        self._pending = None
        by_id = {r.req_id: r for r in self.running}
        events: list[TokenEvent] = []
        for rid in [d.req_id for d in step.decode] + [ch.req_id for ch in step.prefill_chunks]:
            req = by_id[rid]
            if req.num_computed < req.num_tokens:  # a prompt chunk that does not reach the prompt's end
                continue
            req.num_output += 1
            done = req.num_output == req.output_len
            events.append(TokenEvent(rid, req.num_output - 1, done))
            if done:
                self.used_blocks -= req.blocks
                self.reserved_blocks -= req.reserved
                req.blocks = req.reserved = 0
        self.running = [r for r in self.running if r.num_output < r.output_len]
        return events
