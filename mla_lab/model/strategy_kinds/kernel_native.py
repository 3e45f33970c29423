"""``kernel_native``: a FlashMLA-style kernel taking the real heads (modelled only; padded inside the kernel to its
64-row wgmma tile, so priced at the padded kernel's time)."""

from functools import partial

from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops

KIND = StrategyKind("kernel_native", 5, None, "real", "flashmla_pad64", partial(padded_path_ops, native=True),
                    fixed=(Strategy("kernel_native", "zeros"),))
