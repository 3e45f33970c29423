"""``per_call_empty:<content>``: vLLM before PR #53878, ``q.new_empty((T, prefill_padding, 576))`` + slice copy per
call; the padded heads hold the caching allocator's block (zeros or stale)."""

from functools import partial

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops

KIND = StrategyKind("per_call_empty", 0, "vllm-flashmla", "per_call", "flashmla_pad64",
                    partial(padded_path_ops, pad="pad_copy"),
                    fixed=(Strategy("per_call_empty", "zeros"), Strategy("per_call_empty", "stale")),
                    label=lambda s: f"per_call_empty:{s.content}")
