"""``kernel_native``: a FlashMLA-style kernel taking the real heads (modelled only; padded inside the kernel to its
64-row wgmma tile, so priced at the padded kernel's time)."""

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops


def price(rank, spec, T, sum_topk, step):
    return padded_path_ops(rank, spec, T, sum_topk, native=True)


KIND = StrategyKind("kernel_native", 5, None, "real", "flashmla_pad64", price, fixed=(Strategy("kernel_native", "zeros"),))
