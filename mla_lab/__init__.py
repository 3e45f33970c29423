"""mla_lab: should a serving engine pre-pad the sparse-MLA prefill Q workspace? Memory vs TTFT, measured or modelled.

Public API (one concept per module):
- :mod:`mla_lab.arch` GPU specs (``get_arch``, ``detect_arch``)
- :mod:`mla_lab.models` model geometry (``load_model``)
- :mod:`mla_lab.buffers` padded workspace and byte accounting (``padded_num_heads``, ``QConcatWorkspace``,
  ``memory_account``)
- :mod:`mla_lab.kernels` ``concat_mla_q``, ``sparse_mla_prefill``
- :mod:`mla_lab.strategies` ``unfused`` / ``fused`` on real tensors
- :mod:`mla_lab.costmodel`, :mod:`mla_lab.ttft` modelled times; :mod:`mla_lab.sweep` the sweep; :mod:`mla_lab.report`
"""

from .arch import detect_arch, get_arch
from .buffers import QConcatWorkspace, memory_account, padded_num_heads
from .models import load_model

__version__ = "0.1.0"
__all__ = ["get_arch", "detect_arch", "load_model", "padded_num_heads", "QConcatWorkspace", "memory_account"]
