"""``per_call_empty:<content>``: vLLM before PR #53878, ``q.new_empty((T, prefill_padding, 576))`` + slice copy per
call; the padded heads hold the caching allocator's block (zeros or stale)."""

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops


def price(rank, spec, T, sum_topk, step):
    return padded_path_ops(rank, spec, T, sum_topk, pad="pad_copy")


KIND = StrategyKind("per_call_empty", 0, "vllm-flashmla", "per_call", "flashmla_pad64", price,
                    fixed=(Strategy("per_call_empty", "zeros"), Strategy("per_call_empty", "stale")),
                    label=lambda s: f"per_call_empty:{s.content}")
