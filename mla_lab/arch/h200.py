"""NVIDIA H200 SXM (sm90): the GPU the lab measures on."""

from .record import FLASHMLA_TILE_SOURCE, MIB, GPUArch

#: nvidia-smi memory.total (143,771 MiB) minus torch's total (150,109,880,320 B = 143,155.9 MiB) on the lab's H200:
#: 616 MiB (rounded up) the driver keeps (driver 580.159.04, torch 2.11.0+cu130, 2026-12-03).
SMI_TORCH_GAP_MIB = 143_771 - 150_109_880_320 // MIB

GPU = GPUArch(
    name="h200", product="NVIDIA H200", family="hopper", sm="sm90", capability=(9, 0), sm_count=132,
    prefill_padding=64, hbm_gb=141, hbm_gbps=4800, bf16_tflops=989, nvlink_gbps=900,
    torch_total_bytes=150_109_880_320, torch_total_status="measured",
    torch_total_source="torch.cuda.mem_get_info() total on the lab's lent H200 (2026-12-03, driver 580.159.04, torch "
                       "2.11.0+cu130; data/measured/h200/mem_get_info.json); nvidia-smi memory.total 143771 MiB "
                       "(data/measured/h200/round3/gpu.txt); a public vLLM log prints 'total_gpu_memory (139.81GiB)'",
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s dense BF16, NVLink "
           "900 GB/s; 132 SMs (the GH100 die of the H100 SXM5, H100 whitepaper); tile: " + FLASHMLA_TILE_SOURCE,
    aliases=("hopper", "sm90"),
)
