"""NVIDIA H20 (sm90)."""

from .h200 import SMI_TORCH_GAP_MIB
from .record import FLASHMLA_TILE_SOURCE, MIB, GPUArch

GPU = GPUArch(
    name="h20", product="NVIDIA H20", family="hopper", sm="sm90", capability=(9, 0), sm_count=78,
    prefill_padding=64, hbm_gb=96, hbm_gbps=4000, bf16_tflops=148, nvlink_gbps=900,
    torch_total_bytes=(97_871 - SMI_TORCH_GAP_MIB) * MIB, torch_total_status="assumed",
    torch_total_source="nvidia-smi 97871MiB on an H20 (deepseek-ai/DeepGEMM#268) minus the H200's measured 616 MiB "
                       "gap (mla_lab/arch/h200.py SMI_TORCH_GAP_MIB)",
    source="NVIDIA H20 product brief: 96 GB HBM3, 4.0 TB/s, 148 TFLOP/s dense BF16, NVLink 900 GB/s; 78 SMs; tile: "
           + FLASHMLA_TILE_SOURCE,
)
