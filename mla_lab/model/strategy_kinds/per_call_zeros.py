"""``per_call_zeros``: SGLang's ``q_all.new_zeros(...)`` + copy per call."""

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops


def price(rank, spec, T, sum_topk, step):
    return padded_path_ops(rank, spec, T, sum_topk, pad="pad")


KIND = StrategyKind("per_call_zeros", 1, "sglang-flashmla", "per_call", "flashmla_pad64", price,
                    fixed=(Strategy("per_call_zeros", "zeros"),))
