"""``subchunk:<S>[:<handoff>]``: the step's Q concatenated S rows at a time into one S-row padded workspace (two for
``graph2``), the kernel run per chunk; hand-off ``copy`` (default), ``views`` or ``graph2``."""

from ..._validate import check_int
from ...placement import Strategy, StrategyKind
from ..ops import LayerOp, padded_path_ops, path_op

HANDOFFS = ("copy", "views", "graph2")


def parse(name: str) -> Strategy:
    """``subchunk:<S>[:<handoff>]`` -> Strategy. Raises ValueError: S not a positive int; a hand-off not in
    :data:`HANDOFFS`."""
    parts = name.split(":")
    try:
        rows = int(parts[1])
    except ValueError:
        raise ValueError(f"strategy={name!r}: subchunk rows {parts[1]!r} must be a positive int "
                         "(e.g. subchunk:4096 or subchunk:4096:views)") from None
    check_int("subchunk rows", rows)
    if len(parts) > 3 or (len(parts) == 3 and parts[2] not in HANDOFFS):
        raise ValueError(f"strategy={name!r}: the subchunk hand-off must be 'copy' (default), 'views' or "
                         "'graph2' (e.g. subchunk:4096:views, subchunk:2048:graph2)")
    return Strategy("subchunk", "zeros", "zero_once", rows, parts[2] if len(parts) == 3 else "copy")


def price(rank, spec, T, sum_topk, step):
    """The padded path plus ``chunk_out`` (copy hand-off) and ``chunk_overhead`` (launches past the first chunk)."""
    chunks = -(-T // spec.rows) if T else 0
    extra = [] if spec.views_handoff else [path_op(rank, "chunk_out", T, sum_topk)]
    extra.append(LayerOp("chunk_overhead", "attn_chunk_overhead", impl="attn_chunk_overhead", dims={
        "T": T, "H": rank.num_heads, "Hp": rank.padded_num_heads, "sum_topk": sum_topk, "chunks": max(0, chunks - 1),
        "graphed": int(spec.graphed), "consumer_launches": max(0, chunks - 1) if spec.handoff == "views" else 0}))
    return padded_path_ops(rank, spec, T, sum_topk, chunk_ops=extra)


def memory(spec, s) -> dict:
    """``workspaces`` S-row workspaces, two chunks' outputs alive and (copy hand-off) the step's out + lse."""
    S = min(spec.rows, s.rows)
    chunks = -(-s.T // S) if s.T else 0
    delivered = 0 if spec.views_handoff else s.T * s.H * s.out_lse
    return {"persistent": spec.workspaces * S * s.hp * s.row, "kernel_out": min(2, chunks) * min(S, s.T) * s.hp * s.out
            + delivered}


KIND = StrategyKind("subchunk", 4, "vllm-flashmla", "workspace", "flashmla_pad64", price, parse=parse,
                    patterns=("subchunk:<S>", "subchunk:<S>:views", "subchunk:<S>:graph2"),
                    label=lambda s: f"subchunk:{s.rows}" + (f":{s.handoff}" if s.views_handoff else ""), memory=memory)
