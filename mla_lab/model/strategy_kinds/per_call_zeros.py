"""``per_call_zeros``: SGLang's ``q_all.new_zeros(...)`` + copy per call."""

from functools import partial

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops

KIND = StrategyKind("per_call_zeros", 1, "sglang-flashmla", "per_call", "flashmla_pad64",
                    partial(padded_path_ops, pad="pad"),
                    fixed=(Strategy("per_call_zeros", "zeros"),))
