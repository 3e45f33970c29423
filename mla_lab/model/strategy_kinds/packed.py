"""``packed[:<overlap>]``: the lab's packed kernel (:mod:`mla_lab.kernels.packed`, in no engine) on the real heads,
priced by :func:`mla_lab.model.packed_kernel.packed_plan`; FA3 sparse where the dispatch falls back."""

from dataclasses import replace

from ...labels import PACKED_LABEL, PACKED_NOTE
from ...placement import Strategy, StrategyKind
from ...workload import Step
from ..ops import LayerOp, attention_op_work
from ..packed_kernel import packed_plan, packed_union_bytes
from .fa3_sparse import price as fa3_price


def parse(name: str) -> Strategy:
    """``packed:<overlap>`` -> Strategy. Raises ValueError: the overlap not a number in [0, 1]."""
    raw = name.partition(":")[2]
    try:
        o = float(raw)
    except ValueError:
        o = float("nan")
    if not 0.0 <= o <= 1.0:
        raise ValueError(f"strategy={name!r}: the packed overlap {raw!r} must be a number in [0, 1] "
                         "(e.g. packed:0.44; plain 'packed' takes the default)")
    return Strategy("packed", "zeros", overlap=o)


def price(rank, spec, T, sum_topk, step):
    """The real-head concat and one ``kernel`` op carrying the plan's ms (H200 rates); FA3 sparse's ops where the
    dispatch falls back (``dims["packed_path"]``)."""
    model, H = rank.model, rank.num_heads
    plan = packed_plan(rank, step if step is not None else Step([(0, model.topk - 1, T)] if T else []), spec.overlap)
    info = {"packed_path": plan.path, "packed_reason": plan.reason, "packed_source": plan.source}
    if plan.path == "fallback":
        return [replace(o, dims={**o.dims, **info}) for o in fa3_price(rank, spec, T, sum_topk, step)]
    s = plan.stats
    dims = {"T": T, "H": H, "Hp": H, "sum_topk": sum_topk, "content": "zeros", "native": 1,
            "packed_ms": plan.packed_ms, "padded_ms": plan.padded_ms, "packed_mode": plan.mode,
            "tile_rows": plan.tile_rows, "g": s.g, "overlap": s.overlap, "shared": s.shared, "rest": s.rest,
            "groups_with_rest": s.groups_with_rest, **info}
    concat = attention_op_work("concat", T, H, H, sum_topk, model.head_size, model.d_v)
    tok = model.head_size * 2 + model.d_v * 2 + 4
    return [LayerOp("concat", "attn_concat", act_bytes=concat, dims={"T": T, "H": H, "Hp": H, "sum_topk": sum_topk},
                    impl="attn_concat"),
            LayerOp("kernel", "attn_kernel", flops=2.0 * s.union * plan.tile_rows * (model.head_size + model.d_v),
                    act_bytes=T * H * tok, dims=dims, impl="attn_packed")]


KIND = StrategyKind("packed", 7, "mla_lab-packed", "real", "fa3_sparse", price, fixed=(Strategy("packed", "zeros"),),
                    parse=parse, patterns=("packed:<overlap>",), extra_bytes=packed_union_bytes,
                    memory=lambda st, s: {"kernel_out": s.T * s.H * s.out_lse}, shown="lab", display=PACKED_LABEL,
                    notes=(PACKED_NOTE,),
                    label=lambda s: "packed" if s.overlap is None else f"packed:{s.overlap:g}")
