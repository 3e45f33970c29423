"""mla_lab: should a serving engine pre-pad the sparse-MLA prefill Q workspace? Memory vs TTFT, measured or modelled.

The package is layered; imports flow one way (``tests/test_architecture.py`` enforces it):

- foundations: :mod:`~mla_lab.paths`, :mod:`~mla_lab.seed` (the PR's setup), :mod:`~mla_lab.placement`
  (strategies = placement x padded-head content, engine presets), :mod:`~mla_lab.models`, :mod:`~mla_lab.arch`,
  :mod:`~mla_lab.workload`, :mod:`~mla_lab.provenance`
- :mod:`mla_lab.kernels` (``concat_mla_q``, ``sparse_mla_prefill``; the contract) and :mod:`mla_lab.buffers`
  (padding rule, workspaces, byte accounting)
- :mod:`mla_lab.strategies` every real strategy on tensors and the equivalence check
- :mod:`mla_lab.model` the cost model (ops, calibration, content factor, timing, memory, TTFT)
- :mod:`mla_lab.measure` GPU measurement (the one timer, attention path, layer runner, TP harness) and
  :mod:`mla_lab.serving` (the ``vllm bench serve`` simulation)
- :mod:`mla_lab.sweep` parameters, THE row builder, store, executors, run loop, ``advise``
- :mod:`mla_lab.report` data, figures, tables, the seed answer, serving, site, browser check
- :mod:`mla_lab.explore` (widgets) and :mod:`mla_lab.cli` (``mla-lab``)
"""

from .arch import detect_arch, get_arch
from .buffers import QConcatWorkspace, memory_account, padded_num_heads
from .model import strategy_kinds  # noqa: F401  (registers every strategy kind: mla_lab.placement.KINDS)
from .models import load_model

__version__ = "0.1.0"
__all__ = ["get_arch", "detect_arch", "load_model", "padded_num_heads", "QConcatWorkspace", "memory_account"]
