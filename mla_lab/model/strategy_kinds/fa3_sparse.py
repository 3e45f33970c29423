"""``fa3_sparse``: vLLM FLASH_ATTN_MLA_SPARSE (FA3 varlen on the real heads): no concat, no padded Q; its MMAs issue
at ``ceil(H / 64) * 64`` rows (the 64-row wgmma tile). Memory: no Q buffer; out + lse at the real heads."""

from ...placement import Strategy, StrategyKind
from ..ops import LayerOp


def price(rank, spec, T, sum_topk, step):
    m, H = rank.model, rank.num_heads
    tile, width = -(-H // 64) * 64, m.head_size + m.d_v
    return [LayerOp("kernel", "attn_kernel", flops=2.0 * sum_topk * tile * width,
                    act_bytes=T * H * (m.head_size * 2 + m.d_v * 2 + 4),
                    dims={"T": T, "H": H, "Hp": tile, "sum_topk": sum_topk, "content": "zeros", "native": 1,
                          "real_flops": 2.0 * sum_topk * H * width, "gather_bytes": sum_topk * m.head_size * 2},
                    impl="attn_fa3_sparse")]


KIND = StrategyKind("fa3_sparse", 6, "vllm-fa3", "real", "fa3_sparse", price, fixed=(Strategy("fa3_sparse", "zeros"),),
                    memory=lambda st, s: {"persistent": 0, "kernel_out": s.T * s.H * s.out_lse})
