"""The serving scheduler (mla_lab.serving.scheduler) against hand-worked traces: running requests' tokens first,
chunked prefill within max_num_batched_tokens, max_num_seqs, KV blocks (requests wait; lazy admission raises where
vLLM would preempt), long_prefill_token_threshold, CUDA-graph launch modes.

Every expected step list below is worked out by hand in the comments (P = prompt tokens, O = output tokens, budget =
max_num_batched_tokens); a decode token's context is its position + 1.
"""

from __future__ import annotations

import pytest

from mla_lab.serving.scheduler import PreemptionRequired, Scheduler, SchedulerConfig
from mla_lab.serving.step import DecodeToken as D
from mla_lab.serving.step import PrefillChunk as P
from mla_lab.serving.step import Step, cudagraph_capture_sizes

BIG_KV = 1 << 20  # never the limit
SEQS = 256  # capture sizes up to min(2 * 256, 512) = 512



def schedule_all(config, requests):
    """All steps for ``requests`` = ``[(prompt_len, output_len), ...]`` (ids 0, 1, ...), all waiting at t = 0."""
    s = Scheduler(config)
    for i, (p, o) in enumerate(requests):
        s.add_request(i, p, o)
    steps = []
    while s.has_unfinished:
        step = s.schedule()
        assert step is not None, "scheduler made no progress"
        s.update_from_step(step)
        steps.append(step)
    return steps

def _cfg(**kw) -> SchedulerConfig:
    base = dict(max_num_batched_tokens=2048, max_num_seqs=SEQS, kv_capacity_tokens=BIG_KV)
    return SchedulerConfig(**{**base, **kw})


def _content(steps):
    """Steps without their launch mode: (decode tuple, prefill tuple)."""
    return [(s.decode, s.prefill_chunks) for s in steps]


# ------------------------------------------------------------------------------------ the brief's trace, exactly


def test_three_1500_token_prompts_budget_2048():
    # 3 requests, P=1500, O=3, budget 2048, all waiting at t=0.
    # step 1: r0[0:1500] (1500) + r1[0:548] (548)                  = 2048 -> r0 samples token 1
    # step 2: r0 decode @1501 (1) first, r1[548:1500] (952), r2[0:1095] = 2048 -> r0 token 2, r1 token 1
    # step 3: r0 @1502, r1 @1501, r2[1095:1500] (405)                = 407  -> r0 token 3 (done), r1 t2, r2 t1
    # step 4: r1 @1502, r2 @1501                                     = 2    -> r1 done, r2 token 2
    # step 5: r2 @1502                                               = 1    -> r2 done
    # launch: 2048 > 512 (largest capture size) -> eager; 407 mixed -> piecewise, padded to 416 (256 + 10*16);
    # uniform decode batches -> full CUDA graph at sizes 2 and 1.
    steps = schedule_all(_cfg(), [(1500, 3)] * 3)
    assert steps == [
        Step((), (P(0, 0, 1500), P(1, 0, 548)), "NONE", None),
        Step((D(0, 1501),), (P(1, 548, 952), P(2, 0, 1095)), "NONE", None),
        Step((D(0, 1502), D(1, 1501)), (P(2, 1095, 405),), "PIECEWISE", 416),
        Step((D(1, 1502), D(2, 1501)), (), "FULL", 2),
        Step((D(2, 1502),), (), "FULL", 1),
    ]
    assert [s.kind for s in steps] == ["prefill", "mixed", "mixed", "decode", "decode"]
    assert [s.cuda_graph for s in steps] == [False, False, False, True, True]
    assert [s.num_tokens for s in steps] == [2048, 2048, 407, 2, 1]


# ------------------------------------------------------------------------------ running requests' tokens first


def test_decode_tokens_take_the_budget_before_a_waiting_prefill():
    # budget 2; r0, r1, r2 each P=2, O=3.
    # 1: r0[0:2]                      (r0 t1)
    # 2: r0 @3, r1[0:1]               (r0 t2)      - the decode comes first, the waiting prompt gets what is left
    # 3: r0 @4, r1[1:2]               (r0 t3 done, r1 t1)
    # 4: r1 @3, r2[0:1]               (r1 t2)
    # 5: r1 @4, r2[1:2]               (r1 done, r2 t1)
    # 6: r2 @3   7: r2 @4             (r2 done)
    steps = schedule_all(_cfg(max_num_batched_tokens=2), [(2, 3)] * 3)
    assert _content(steps) == [
        ((), (P(0, 0, 2),)),
        ((D(0, 3),), (P(1, 0, 1),)),
        ((D(0, 4),), (P(1, 1, 1),)),
        ((D(1, 3),), (P(2, 0, 1),)),
        ((D(1, 4),), (P(2, 1, 1),)),
        ((D(2, 3),), ()),
        ((D(2, 4),), ()),
    ]


def test_running_partial_prefill_is_continued_before_new_requests():
    # budget 5; r0 P=3 O=4, r1 P=10 O=2.
    # 1: r0[0:3], r1[0:2]   2: r0 @4, r1[2:6]   3: r0 @5, r1[6:10]   4: r0 @6 (done), r1 @11 (done)
    steps = schedule_all(_cfg(max_num_batched_tokens=5), [(3, 4), (10, 2)])
    assert _content(steps) == [
        ((), (P(0, 0, 3), P(1, 0, 2))),
        ((D(0, 4),), (P(1, 2, 4),)),
        ((D(0, 5),), (P(1, 6, 4),)),
        ((D(0, 6), D(1, 11)), ()),
    ]


# -------------------------------------------------------------------------------------------------- max_num_seqs


def test_max_num_seqs_holds_the_third_request_back():
    # max_num_seqs 2, budget 100, 3 x (P=4, O=2).
    # 1: r0[0:4], r1[0:4] (r2 waits: 2 running)   2: r0 @5, r1 @5 (both done; they still count while scheduling)
    # 3: r2[0:4]   4: r2 @5
    steps = schedule_all(_cfg(max_num_batched_tokens=100, max_num_seqs=2), [(4, 2)] * 3)
    assert _content(steps) == [
        ((), (P(0, 0, 4), P(1, 0, 4))),
        ((D(0, 5), D(1, 5)), ()),
        ((), (P(2, 0, 4),)),
        ((D(2, 5),), ()),
    ]


# ------------------------------------------------------------------------------------------------------ KV cache

KV_TIGHT = 3200  # 200 blocks of 16; a (1500, 3) request peaks at ceil(1502 / 16) = 94 blocks


@pytest.mark.parametrize("admission", ["reserve", "lazy"])
def test_kv_capacity_makes_the_third_request_wait(admission):
    # budget 4096, 3 x (1500, 3), 200 blocks.
    # reserve: r0 promises 94, r1 188, r2 would need 282 > 200 -> waits.
    # lazy: r0, r1 hold 94 each (188); r2's chunk min(1500, 4096 - 3000) = 1096 tokens needs 69 > 12 free -> waits;
    #       r0 / r1 decode within their 94th block (1504 slots), so nobody needs a new block.
    # 1: r0[0:1500] r1[0:1500]   2: r0 @1501 r1 @1501   3: r0 @1502 r1 @1502 (done, blocks freed)
    # 4: r2[0:1500]   5: r2 @1501   6: r2 @1502
    cfg = _cfg(max_num_batched_tokens=4096, kv_capacity_tokens=KV_TIGHT, kv_admission=admission)
    s = Scheduler(cfg)
    for i in range(3):
        s.add_request(i, 1500, 3)
    steps, waits, used = [], [], []
    while s.has_unfinished:
        st = s.schedule()
        steps.append(st)
        waits.append(s.last_kv_wait)
        used.append(s.used_blocks)
        s.update_from_step(st)
    assert _content(steps) == [
        ((), (P(0, 0, 1500), P(1, 0, 1500))),
        ((D(0, 1501), D(1, 1501)), ()),
        ((D(0, 1502), D(1, 1502)), ()),
        ((), (P(2, 0, 1500),)),
        ((D(2, 1501),), ()),
        ((D(2, 1502),), ()),
    ]
    assert waits == [True, True, True, False, False, False]
    assert used == [188, 188, 188, 94, 94, 94]
    assert s.used_blocks == 0 and s.reserved_blocks == 0


def test_lazy_admission_raises_where_vllm_would_preempt_and_reserve_waits():
    # 189 blocks of 16 (3024 tokens); 2 x (1500, 40): peak ceil(1539 / 16) = 97 blocks each.
    # lazy admits both (94 + 94 = 188 <= 189); at context 1505 each needs a 95th block: r0 takes the last one,
    # r1 cannot get one -> vLLM would preempt -> PreemptionRequired.
    # reserve admits r0 only (97 + 97 > 189); r1 starts after r0 finishes.
    reqs = [(1500, 40)] * 2
    with pytest.raises(PreemptionRequired, match=r"request 1 needs 1 more KV block\(s\) with 0 free of 189"):
        schedule_all(_cfg(max_num_batched_tokens=4096, kv_capacity_tokens=3024, kv_admission="lazy"), reqs)
    steps = schedule_all(_cfg(max_num_batched_tokens=4096, kv_capacity_tokens=3024, kv_admission="reserve"), reqs)
    assert len(steps) == 2 * 40  # r0: 1 prefill + 39 decodes, then r1 alone the same
    assert steps[0].prefill_chunks == (P(0, 0, 1500),) and steps[40].prefill_chunks == (P(1, 0, 1500),)
    assert all(s.decode[0].req_id == 0 for s in steps[1:40]) and all(s.decode[0].req_id == 1 for s in steps[41:])


def test_request_that_can_never_fit_is_refused():
    s = Scheduler(_cfg(kv_capacity_tokens=1024))
    with pytest.raises(ValueError, match=r"request 7 needs 94 KV blocks \(1502 tokens = prompt 1500 \+ output 3 - 1\) "
                                         r"but kv_capacity_tokens=1024 holds 64 blocks of 16"):
        s.add_request(7, 1500, 3)


def test_exact_fit_is_allowed():
    # peak 1500 + 17 - 1 = 1516 tokens = 94.75 -> 95 blocks; 95 blocks = 1520 tokens of capacity suffice.
    steps = schedule_all(_cfg(kv_capacity_tokens=1520, kv_admission="lazy"), [(1500, 17)])
    assert len(steps) == 17 and steps[-1].decode == (D(0, 1516),)


# ------------------------------------------------------------------------------ long_prefill_token_threshold


def test_long_prefill_token_threshold_caps_each_chunk():
    # budget 2048, threshold 1000, 3 x (1500, 3).
    # 1: r0[0:1000], r1[0:1000], r2[0:48]            (1048, 48 left)
    # 2: r0[1000:1500] (500), r1[1000:1500] (500), r2[48:1048] (capped at 1000)  = 2000
    # 3: r0 @1501, r1 @1501, r2[1048:1500] (452)    4: r0 @1502, r1 @1502, r2 @1501    5: r2 @1502
    steps = schedule_all(_cfg(long_prefill_token_threshold=1000), [(1500, 3)] * 3)
    assert _content(steps) == [
        ((), (P(0, 0, 1000), P(1, 0, 1000), P(2, 0, 48))),
        ((), (P(0, 1000, 500), P(1, 1000, 500), P(2, 48, 1000))),
        ((D(0, 1501), D(1, 1501)), (P(2, 1048, 452),)),
        ((D(0, 1502), D(1, 1502), D(2, 1501)), ()),
        ((D(2, 1502),), ()),
    ]


# ------------------------------------------------------------------------------------------ CUDA-graph launch

CAPTURE_GRID = [(256, None, 512, 51), (256, 64, 64, 11), (1024, None, 512, 51)]  # seqs, cap, top, count


@pytest.mark.parametrize("seqs, cap, top, count", CAPTURE_GRID)
def test_capture_sizes(seqs, cap, top, count):
    # 256 -> [1, 2, 4] + 31 multiples of 8 below 256 + 256..512 step 16 (17) = 51 sizes
    sizes = cudagraph_capture_sizes(seqs, cap)
    assert sizes[-1] == top and len(sizes) == count and list(sizes) == sorted(set(sizes))


def test_small_max_num_seqs_capture_sizes_stop_at_twice_max_num_seqs():
    assert cudagraph_capture_sizes(8) == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("kw, modes", [
    (dict(), ["NONE", "NONE", "PIECEWISE", "FULL", "FULL"]),
    (dict(enforce_eager=True), ["NONE"] * 5),
    (dict(max_cudagraph_capture_size=1), ["NONE", "NONE", "NONE", "NONE", "FULL"]),  # 2-token decode > 1
])
def test_launch_modes_of_the_hand_worked_trace(kw, modes):
    steps = schedule_all(_cfg(**kw), [(1500, 3)] * 3)
    assert [s.cudagraph_mode for s in steps] == modes
    assert [s.cuda_graph for s in steps] == [m == "FULL" for m in modes]


def test_one_token_prefill_chunks_count_as_a_uniform_batch():
    # vLLM decides "uniform decode" by query lengths (max_query_len == 1, num_tokens == num_reqs): step 2 of the
    # budget-2 trace (r0's decode + r1[0:1]) replays the full graph although a prefill chunk is in it.
    steps = schedule_all(_cfg(max_num_batched_tokens=2), [(2, 3)] * 3)
    assert [(s.kind, s.cudagraph_mode) for s in steps[:3]] == [("prefill", "PIECEWISE"), ("mixed", "FULL"),
                                                                ("mixed", "FULL")]
    assert steps[1].cuda_graph and steps[1].cudagraph_num_tokens == 2


def test_schedule_twice_without_update_is_refused():
    s = Scheduler(_cfg())
    s.add_request(0, 10, 2)
    st = s.schedule()
    with pytest.raises(RuntimeError, match="schedule\\(\\) called twice"):
        s.schedule()
    s.update_from_step(st)
    assert s.schedule().decode == (D(0, 11),)


def test_pr_benchmark_headline_schedule_carries_decode_tokens_and_spills_prompt_32_into_a_third_step():
    # vLLM PR #53878's benchmark, every request at t = 0: 32 x 1024 / 128, budget 16384 (issue 20: "prompt 32
    # spills into a third step", with the decode tokens of the requests already past their prompts)
    cfg = SchedulerConfig(max_num_batched_tokens=16384, max_num_seqs=256, kv_capacity_tokens=300_000, block_size=64)
    steps = schedule_all(cfg, [(1024, 128)] * 32)
    s0, s1, s2 = steps[:3]
    assert (len(s0.decode), [c.req_id for c in s0.prefill_chunks]) == (0, list(range(16)))
    assert [d.req_id for d in s1.decode] == list(range(16)) and {d.context_len for d in s1.decode} == {1025}
    assert [(c.req_id, c.start, c.num_tokens) for c in s1.prefill_chunks][-1] == (31, 0, 1008)
    assert s1.num_tokens == 16384
    assert len(s2.decode) == 31 and [(c.req_id, c.start, c.num_tokens) for c in s2.prefill_chunks] == [(31, 1008, 16)]
    assert (s2.num_tokens, s2.cudagraph_mode) == (47, "PIECEWISE")
    assert all(s.kind == "decode" and s.cudagraph_mode == "FULL" for s in steps[3:])
    assert len(steps) == 3 + 127
