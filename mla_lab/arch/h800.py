"""NVIDIA H800 SXM (sm90): H100 silicon with a 400 GB/s NVLink."""

from .record import FLASHMLA_TILE_SOURCE, GIB, GPUArch

GPU = GPUArch(
    name="h800", product="NVIDIA H800", family="hopper", sm="sm90", capability=(9, 0), sm_count=132,
    prefill_padding=64, hbm_gb=80, hbm_gbps=3350, bf16_tflops=989, nvlink_gbps=400,
    torch_total_bytes=round(79.22 * GIB), torch_total_status="assumed",
    torch_total_source="the H100 80GB figure (vllm-project/vllm#10511, 79.22 GiB): the H800 is H100 silicon with the "
                       "same 80 GB HBM3 stack; no H800 torch total read",
    source="NVIDIA H800 datasheet (SXM): 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16, NVLink 400 GB/s; 132 SMs "
           "(H100 silicon); tile: " + FLASHMLA_TILE_SOURCE,
)
