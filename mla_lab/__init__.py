"""mla_lab: should a serving engine pre-pad the sparse-MLA prefill Q workspace? Memory vs TTFT, measured or modelled.
A layered package, imports flowing one way (foundations -> kernels -> strategies -> model -> measure -> sweep ->
report -> cli): ``docs/design.md`` draws it, ``tests/test_architecture.py`` enforces it."""

from .arch import detect_arch, get_arch
from .buffers import QConcatWorkspace, memory_account, padded_num_heads
from .model import strategy_kinds  # noqa: F401  (registers every strategy kind: mla_lab.placement.KINDS)
from .models import load_model

__version__ = "0.1.0"
__all__ = ["get_arch", "detect_arch", "load_model", "padded_num_heads", "QConcatWorkspace", "memory_account"]
