"""One GPU as one record (:class:`GPUArch`); each GPU is one module of :mod:`mla_lab.arch` defining ``GPU``.
Units: HBM capacity in decimal GB as the datasheet prints it, bandwidths in GB/s (1e9 B/s; NVLink both directions
together), dense bf16 rate in TFLOP/s (no sparsity), device memory as torch reports it in bytes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUArch", "GIB", "MIB", "TORCH_STATUS", "FLASHMLA_TILE_SOURCE"]

GIB = 1024**3
MIB = 1024**2
#: How a record's ``torch_total_bytes`` is known.
TORCH_STATUS = ("measured", "cited", "assumed")
#: FlashMLA's sparse prefill tile (``prefill_padding``).
FLASHMLA_TILE_SOURCE = ("vLLM flashmla_sparse.py (PR #53878) prefill_padding; FlashMLA csrc/api/sparse_fwd.h "
                        "(sm90 h_q multiple of 64, sm100 128)")


@dataclass(frozen=True)
class GPUArch:
    """One GPU's record.

    Attributes:
        name: equal to its module's name; product: what ``torch.cuda.get_device_name`` prints.
        sm: vLLM's family key (``sm90`` / ``sm100``); family: NVIDIA's architecture name (code keys on ``sm``).
        prefill_padding: the head multiple vLLM pads Q to (:data:`FLASHMLA_TILE_SOURCE`).
        sm_count, hbm_gb, hbm_gbps, bf16_tflops, nvlink_gbps: datasheet figures (``source``).
        torch_total_bytes: ``torch.cuda.mem_get_info()[1]``, the total vLLM multiplies by ``gpu_memory_utilization``
            (vLLM 0.33.0 ``vllm/v1/worker/utils.py:724-726``), with its status and source.
        sparse_prefill_tflops: FlashMLA README's rate here (None: calibrated); aliases: other names accepted.

    Raises ValueError: ``sm`` not matching ``capability``; an unknown ``torch_total_status``."""

    name: str
    product: str
    family: str
    sm: str
    capability: tuple[int, int]
    sm_count: int
    prefill_padding: int
    hbm_gb: float
    hbm_gbps: float
    bf16_tflops: float
    nvlink_gbps: float
    torch_total_bytes: int
    torch_total_status: str
    torch_total_source: str
    source: str
    sparse_prefill_tflops: float | None = None
    aliases: tuple[str, ...] = ()

    def __post_init__(self):
        if self.sm != f"sm{self.capability[0]}0":
            raise ValueError(f"GPU {self.name!r}: sm={self.sm!r} does not match capability={self.capability}; "
                             f"allowed: 'sm{self.capability[0]}0' (vLLM's family key)")
        if self.torch_total_status not in TORCH_STATUS or not self.torch_total_source:
            raise ValueError(f"GPU {self.name!r}: torch_total_status={self.torch_total_status!r} needs a source; "
                             f"allowed: {TORCH_STATUS}")
