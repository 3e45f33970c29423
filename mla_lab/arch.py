"""GPU architecture specs and detection of the running GPU.

Every number here is a vendor datasheet figure (a *lead*, not a measurement); the lab's measured ceilings live
in ``data/`` rows labelled ``measured``. Units: HBM capacity in decimal GB as printed on the datasheet (``hbm_gib``
converts), bandwidth in GB/s (1e9 bytes/s), dense bf16 rate in TFLOP/s (1e12 FLOP/s, no sparsity), NVLink in
GB/s total per GPU (both directions).

``prefill_padding`` follows vLLM ``vllm/v1/attention/backends/mla/flashmla_sparse.py`` (PR #53878): 128 on
Blackwell (compute capability family 100), 64 otherwise. It is the head multiple FlashMLA's sparse prefill kernel
needs on that architecture (FlashMLA ``csrc/api/sparse_fwd.h``: sm90 h_q multiple of 64; sm100 h_q 64 or 128, vLLM
uses 128 there).

Sources:
- H100 SXM: NVIDIA H100 Tensor Core GPU datasheet (80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16, NVLink 900 GB/s).
- H200 SXM: NVIDIA H200 Tensor Core GPU datasheet (141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s dense BF16, NVLink 900 GB/s).
- H800 SXM: NVIDIA H800 datasheet (H100 silicon, 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16, NVLink 400 GB/s).
- H20: NVIDIA H20 product brief (96 GB HBM3, 4.0 TB/s, 148 TFLOP/s dense BF16, NVLink 900 GB/s).
- B200: NVIDIA DGX/HGX B200 datasheet (180 GB HBM3e per GPU in HGX B200, 8 TB/s, 2.25 PFLOP/s dense BF16,
  NVLink 5 1800 GB/s).

Memory as the software sees it (``torch_total_bytes``): what ``torch.cuda.mem_get_info()`` (``cudaMemGetInfo``)
returns as the total, the figure vLLM multiplies by ``gpu_memory_utilization`` (vLLM 0.33.0
``vllm/utils/mem_utils.py:143`` ``torch.accelerator.get_memory_info``; ``vllm/v1/worker/utils.py:724-726``
``ceil(total_memory * gpu_memory_utilization)``). It is *above* the datasheet figure read as decimal GB (``hbm_gb``:
H200 150.1e9 bytes against "141 GB") and below ``nvidia-smi``'s memory.total (the driver keeps part of the
framebuffer). Each card's figure has a
``torch_total_status``: ``measured`` (a reading on the lab's GPU), ``cited`` (a public log printing torch's total)
or ``assumed`` (an ``nvidia-smi`` total from a public log minus the H200's measured gap of 616 MiB between the
two); ``torch_total_source`` names it. Every KV-capacity figure of the lab uses ``torch_total_bytes``
(:func:`mla_lab.model.memory.memory_tradeoff`); ``hbm_gb`` stays the datasheet figure.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = ["GPUArch", "ARCHS", "TORCH_TOTALS", "SMI_TORCH_GAP_MIB", "get_arch", "detect_arch", "arch_names", "prefill_padding_for_capability"]

GIB = 1024**3


@dataclass(frozen=True)
class GPUArch:
    """One GPU model's datasheet figures.

    Attributes:
        name: short lab name (``"h200"``).
        product: marketing name as ``torch.cuda.get_device_name`` prints it (``"NVIDIA H200"``).
        family: ``"hopper"`` or ``"blackwell"``.
        capability: CUDA compute capability ``(major, minor)``; sm90 = (9, 0), sm100 = (10, 0).
        hbm_gb: HBM capacity, decimal GB (datasheet).
        hbm_gbps: HBM bandwidth, GB/s (datasheet).
        bf16_tflops: dense (non-sparse) bf16 tensor-core rate, TFLOP/s (datasheet).
        nvlink_gbps: NVLink bandwidth per GPU, GB/s, both directions together (datasheet).
        source: where the figures come from.
        sparse_prefill_tflops: FlashMLA's published sparse-prefill rate on this GPU, TFLOP/s (FlashMLA README:
            "up to 640 TFLOP/s on H800, 1450 on B200"); the cost model prices the Blackwell kernel with it
            instead of H200 efficiencies (None: use the calibration).
        torch_total_bytes: device memory as torch reports it (``torch.cuda.mem_get_info()[1]``), bytes: the total
            vLLM sizes its KV cache from (module docstring).
        torch_total_status: ``measured`` / ``cited`` / ``assumed`` (module docstring).
        torch_total_source: where ``torch_total_bytes`` comes from (a device reading with date, driver and torch,
            or a public log with its address).
    """

    name: str
    product: str
    family: str
    capability: tuple[int, int]
    hbm_gb: float
    hbm_gbps: float
    bf16_tflops: float
    nvlink_gbps: float
    source: str
    sparse_prefill_tflops: float | None = None
    torch_total_bytes: int = 0
    torch_total_status: str = ""
    torch_total_source: str = ""

    @property
    def sm(self) -> str:
        """``"sm90"`` / ``"sm100"``."""
        return f"sm{self.capability[0]}{self.capability[1]}"

    @property
    def prefill_padding(self) -> int:
        """Head multiple for the bf16 sparse prefill workspace: 128 on Blackwell (family 100), else 64 (vLLM)."""
        return prefill_padding_for_capability(self.capability)

    @property
    def hbm_gib(self) -> float:
        """HBM capacity in GiB (2**30 bytes)."""
        return self.hbm_gb * 1e9 / GIB

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(sm=self.sm, prefill_padding=self.prefill_padding, hbm_gib=round(self.hbm_gib, 2),
                 torch_total_gib=round(self.torch_total_bytes / GIB, 2))
        return d


def prefill_padding_for_capability(capability: tuple[int, int]) -> int:
    """vLLM's ``prefill_padding``: 128 when ``capability`` is in the family-100 (Blackwell datacenter) family, else 64.

    Source: vLLM ``flashmla_sparse.py`` (PR #53878), ``128 if current_platform.is_device_capability_family(100)
    else 64``.
    """
    return 128 if capability[0] == 10 else 64


_DS_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"
MIB_BYTES = 1024**2
#: The H200's measured gap between ``nvidia-smi`` memory.total (143,771 MiB) and torch's total (150,109,880,320 B =
#: 143,155.9 MiB): 616 MiB (rounded up) the driver keeps (lab's lent H200, driver 580.159.04, torch 2.11.0+cu130, 2026-12-03).
SMI_TORCH_GAP_MIB = 143_771 - 150_109_880_320 // MIB_BYTES
#: torch's total of each card: (bytes, status, source). The ``assumed`` rows are an nvidia-smi total minus
#: :data:`SMI_TORCH_GAP_MIB`; H100's ``cited`` figure is printed to 0.01 GiB (+-5 MiB), and other H100 logs print
#: 79.11-79.33 GiB (the driver's reserve varies by driver version: +-0.15 %).
TORCH_TOTALS = {
    "h100": (round(79.22 * GIB), "cited",
             "vllm-project/vllm#10511 (youkaichao, 2024-12-13): 'total_gpu_memory 79.22GiB' on an H100 80GB "
             "(torch.cuda.mem_get_info total; printed to 0.01 GiB); nvidia-smi 81559MiB (NVIDIA/nccl#1264)"),
    "h200": (150_109_880_320, "measured",
             "torch.cuda.mem_get_info() total on the lab's lent H200 (2026-12-03, driver 580.159.04, torch "
             "2.11.0+cu130; data/measured/h200/mem_get_info.json); nvidia-smi memory.total 143771 MiB "
             "(data/measured/h200/round3/gpu.txt); a public vLLM log prints 'total_gpu_memory (139.81GiB)' on an H200"),
    "h800": (round(79.22 * GIB), "assumed",
             "the H100 80GB figure (vllm-project/vllm#10511, 79.22 GiB): the H800 is H100 silicon with the same 80 GB "
             "HBM3 stack; no H800 torch total read"),
    "h20": ((97_871 - SMI_TORCH_GAP_MIB) * MIB_BYTES, "assumed",
            "nvidia-smi 97871MiB on an H20 (deepseek-ai/DeepGEMM#268) minus the H200's measured 616 MiB gap "
            "(SMI_TORCH_GAP_MIB)"),
    "b200": (round(178.35 * GIB), "cited",
             "pytorch/ao#4002 (2026-03-05): cudaGetDeviceProperties 'Total Global Memory: 178.35 GB' on a B200 "
             "(GiB: /2**30; equal to cudaMemGetInfo's total; printed to 0.01 GiB); nvidia-smi 183359MiB "
             "(NVIDIA/TensorRT-LLM#10278)"),
}


def _card(name, product, family, cap, hbm, gbps, tflops, nvlink, source, **kw) -> GPUArch:
    b, status, src = TORCH_TOTALS[name]
    return GPUArch(name, product, family, cap, hbm, gbps, tflops, nvlink, source, torch_total_bytes=int(b),
                   torch_total_status=status, torch_total_source=src, **kw)


ARCHS: dict[str, GPUArch] = {
    a.name: a
    for a in (
        _card("h100", "NVIDIA H100 80GB HBM3", "hopper", (9, 0), 80, 3350, 989, 900, _DS_H100),
        _card("h200", "NVIDIA H200", "hopper", (9, 0), 141, 4800, 989, 900, "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
        _card("h800", "NVIDIA H800", "hopper", (9, 0), 80, 3350, 989, 400, "NVIDIA H800 datasheet (SXM)"),
        _card("h20", "NVIDIA H20", "hopper", (9, 0), 96, 4000, 148, 900, "NVIDIA H20 product brief"),
        _card("b200", "NVIDIA B200", "blackwell", (10, 0), 180, 8000, 2250, 1800, "NVIDIA HGX/DGX B200 datasheet",
              sparse_prefill_tflops=1450),
    )
}

# Family aliases accepted wherever an arch name is: the family's reference card.
_ALIASES = {"hopper": "h200", "sm90": "h200", "blackwell": "b200", "sm100": "b200", "h100-sxm": "h100"}


def arch_names() -> list[str]:
    """Accepted arch names: the cards plus the aliases ``hopper``/``sm90`` (-> h200), ``blackwell``/``sm100`` (-> b200)."""
    return sorted(ARCHS) + sorted(_ALIASES)


def get_arch(name: str | GPUArch) -> GPUArch:
    """Look up an architecture by lab name or alias (case-insensitive).

    Raises:
        ValueError: ``name`` is not a known card or alias; the message lists the allowed names.
    """
    if isinstance(name, GPUArch):
        return name
    if not isinstance(name, str):
        raise ValueError(f"arch must be a str, got {type(name).__name__} {name!r}; allowed: {arch_names()}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in ARCHS:
        raise ValueError(f"arch={name!r} is not a known GPU architecture; allowed: {arch_names()}")
    return ARCHS[key]


def _match_product(device_name: str) -> GPUArch | None:
    # Longest token first so "H200" is not read as "H20".
    for arch in sorted(ARCHS.values(), key=lambda a: -len(a.name)):
        if re.search(rf"\b{arch.name}\b", device_name, flags=re.IGNORECASE):
            return arch
    return None


def detect_arch() -> dict:
    """Describe the GPU this process would run on.

    Returns a dict with ``device`` (``"cpu"`` when torch sees no CUDA device, else the device name),
    ``capability`` (``None`` or ``(major, minor)``), ``arch`` (the matching lab name or ``None`` for an unknown card),
    ``sm`` and ``prefill_padding`` (from the capability, so an unknown card still gets vLLM's rule).
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is None or not torch.cuda.is_available():
        return {"device": "cpu", "capability": None, "arch": None, "sm": None, "prefill_padding": None}
    name = torch.cuda.get_device_name()
    cap = tuple(torch.cuda.get_device_capability())
    arch = _match_product(name)
    return {
        "device": name,
        "capability": cap,
        "arch": arch.name if arch else None,
        "sm": f"sm{cap[0]}{cap[1]}",
        "prefill_padding": prefill_padding_for_capability(cap),
    }
