"""``kernel_native``: a FlashMLA-style kernel taking the real heads (modelled only; padded inside the kernel to its
64-row wgmma tile, so priced at the padded kernel's time). No engine runs it: ``advise`` shows it, never ranks it."""

from functools import partial

from ...labels import KERNEL_NATIVE_LABEL, KERNEL_NATIVE_NOTE
from ...placement import Strategy, StrategyKind
from ..ops import padded_path_ops

#: The line on a GPU where nothing was measured (the H200 kernel timings are not its evidence).
SHORT_NOTE = (f"{KERNEL_NATIVE_LABEL}: a FlashMLA-style kernel taking the real head count, which no engine's backend "
              "runs; priced as the padded kernel's time without the padded heads' Q reads and output writes, always "
              "on the sparse route, so it is shown, not ranked")

KIND = StrategyKind("kernel_native", 5, None, "real", "flashmla_pad64", partial(padded_path_ops, native=True),
                    fixed=(Strategy("kernel_native", "zeros"),), shown="modelled_only", display=KERNEL_NATIVE_LABEL,
                    notes=(KERNEL_NATIVE_NOTE, SHORT_NOTE))
