"""NVIDIA H100 SXM5 80GB (sm90)."""

from .record import FLASHMLA_TILE_SOURCE, GIB, GPUArch

GPU = GPUArch(
    name="h100", product="NVIDIA H100 80GB HBM3", family="hopper", sm="sm90", capability=(9, 0), sm_count=132,
    prefill_padding=64, hbm_gb=80, hbm_gbps=3350, bf16_tflops=989, nvlink_gbps=900,
    torch_total_bytes=round(79.22 * GIB), torch_total_status="cited",
    torch_total_source="vllm-project/vllm#10511 (youkaichao, 2024-12-13): 'total_gpu_memory 79.22GiB' on an H100 80GB "
                       "(torch.cuda.mem_get_info total; printed to 0.01 GiB, +-5 MiB; other H100 logs print "
                       "79.11-79.33 GiB by driver); nvidia-smi 81559MiB (NVIDIA/nccl#1264)",
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16, NVLink "
           "900 GB/s; 132 SMs (H100 whitepaper); tile: " + FLASHMLA_TILE_SOURCE,
    aliases=("h100-sxm",),
)
