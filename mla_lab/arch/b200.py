"""NVIDIA B200 (sm100), HGX/DGX B200."""

from .record import FLASHMLA_TILE_SOURCE, GIB, GPUArch

GPU = GPUArch(
    name="b200", product="NVIDIA B200", family="blackwell", sm="sm100", capability=(10, 0), sm_count=148,
    prefill_padding=128, hbm_gb=180, hbm_gbps=8000, bf16_tflops=2250, nvlink_gbps=1800,
    torch_total_bytes=round(178.35 * GIB), torch_total_status="cited",
    torch_total_source="pytorch/ao#4002 (2026-03-05): cudaGetDeviceProperties 'Total Global Memory: 178.35 GB' on a "
                       "B200 (GiB: /2**30; equal to cudaMemGetInfo's total; printed to 0.01 GiB); nvidia-smi "
                       "183359MiB (NVIDIA/TensorRT-LLM#10278)",
    source="NVIDIA HGX/DGX B200 datasheet: 180 GB HBM3e per GPU, 8 TB/s, 2.25 PFLOP/s dense BF16, NVLink 5 1800 GB/s; "
           "148 SMs (NVIDIA Blackwell datasheet); tile: " + FLASHMLA_TILE_SOURCE,
    sparse_prefill_tflops=1450,  # FlashMLA README: "up to 640 TFLOP/s on H800, 1450 on B200"
    aliases=("blackwell", "sm100"),
)
