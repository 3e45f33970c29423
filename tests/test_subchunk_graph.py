"""``subchunk:<S>:graph2`` (issue 23): two S-row workspaces, the chunk loop on two streams captured in one CUDA graph.

CPU side: the eager two-workspace loop equals every other strategy bit for bit and really alternates the two
workspaces; the cost model's pricing of it against the measured H200 rows (``data/measured/h200/between_process/
subgraph.csv``, 5 fresh processes, :func:`mla_lab.measure.spread.paired_change`).
"""

import torch

from mla_lab.kernels import concat_mla_q
from mla_lab.strategies import PaddedQPath, equivalence_check


def test_graph2_eager_loop_equals_every_strategy_on_cpu():
    # T = 24 tokens: S = 5 -> 5 chunks over two workspaces (the last short), S = 24 one chunk, S = 100 > T
    names = ["subchunk:5:graph2", "subchunk:7:graph2", "subchunk:24:graph2", "subchunk:100:graph2",
             "private_workspace", "subchunk:5:views"]
    for H in (8, 16):
        r = equivalence_check(num_heads=H, strategies=names)
        assert r["equal"], r["per_strategy"]
        assert r["max_abs_diff_out"] == 0.0 and r["max_abs_diff_lse"] == 0.0


def test_graph2_alternates_its_two_workspaces():
    """Chunk i goes through workspace i % 2: after a step of 24 tokens at S = 5 workspace 0 holds chunk 4's real
    heads (tokens 20..23), workspace 1 chunk 3's (tokens 15..19); the padded heads stay zero."""
    H, T = 8, 24
    g = torch.Generator().manual_seed(3)
    ql = torch.randn(T, H, 512, generator=g).to(torch.bfloat16)
    qpe = torch.randn(T, H, 64, generator=g).to(torch.bfloat16)
    kv = torch.randn(40, 1, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 40, (T, 1, 16), generator=g, dtype=torch.int32)
    path = PaddedQPath("subchunk:5:graph2", num_heads=H, max_num_batched_tokens=T)
    assert [w.buffer.shape for w in path.workspaces] == [torch.Size([5, 64, 576])] * 2
    out, lse = path(ql, qpe, kv, idx, 576 ** -0.5)
    assert out.shape == (T, H, 512) and lse.shape == (T, H)

    def real(a, b):
        q = torch.zeros(b - a, H, 576, dtype=torch.bfloat16)
        concat_mla_q(ql[a:b], qpe[a:b], q)
        return q

    w0, w1 = (w.buffer for w in path.workspaces)
    assert torch.equal(w0[:4, :H], real(20, 24)) and torch.equal(w0[4, :H], real(10, 15)[4])  # chunk 2's last row
    assert torch.equal(w1[:, :H], real(15, 20))
    assert not w0[:, H:].any() and not w1[:, H:].any()
