"""Is the concat's pass needed at all (issue 23)? Per T (the step and a quarter), graph timing
(:func:`mla_lab.measure.timer.median_ms` ``graph=True``, L2 flushed), rounds rotated: ``pr`` (the W_UK bmm ``[H, T,
d_nope] x [H, d_nope, 512]`` into a contiguous buffer, then the v2 concat into the padded workspace, vLLM PR #53878),
``fused`` (the bmm with ``out=`` the workspace view ``ws[:, :H, :512].transpose(0, 1)``, then ``q_pe`` alone) and
``bmm`` (the bmm alone). ``max_abs_diff``: fused vs pr real heads (cuBLAS may pick another algorithm); fused's padded
heads must stay NaN. Rows: ``fused_bmm.csv`` (us). Parameters ``models``, ``rounds`` (5), ``rep`` (50 ms).
"""

from __future__ import annotations

import statistics

import torch

from mla_lab.kernels import make_concat_launcher
from mla_lab.measure.sink import log
from mla_lab.measure.timer import median_ms

from ._common import ranks_of

METHODS = ("pr", "fused", "bmm")
OUTPUTS = {"fused_bmm.csv": ["model", "T", "H", "Hp", "d_nope", "method", "timer", "round", "us", "max_abs_diff"]}
#: (model, T) on the seed rank (TP 8, T 16384 and a quarter of it)
SHAPES = [(m, T) for m in ("glm-5", "deepseek-v3.2") for T in (4096, 16384)]


def _methods(T, H, d, Hp) -> tuple[dict, float]:
    """``({method: fn}, max_abs_diff of fused vs pr)``. Raises RuntimeError when ``fused`` writes a padded head."""
    torch.manual_seed(T + H)
    q = torch.randn(T, H, d + 64, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(H, d, 512, device="cuda") / d ** 0.5).to(torch.bfloat16)
    ql = torch.empty(H, T, 512, device="cuda", dtype=torch.bfloat16)
    ws_pr = torch.full((T, Hp, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
    ws_f = ws_pr.clone()
    q_nope_t, q_pe, out_view = q[..., :d].transpose(0, 1), q[..., d:], ws_f[:, :H, :512].transpose(0, 1)
    launch = make_concat_launcher(ql.transpose(0, 1), q_pe, ws_pr, backend="triton")

    def pr():
        torch.bmm(q_nope_t, w, out=ql)
        launch()

    def fused():
        torch.bmm(q_nope_t, w, out=out_view)
        ws_f[:, :H, 512:].copy_(q_pe)

    pr()
    fused()
    torch.cuda.synchronize()
    if not ws_f[:, H:].isnan().all():
        raise RuntimeError(f"T={T}: the fused path wrote into the padded heads")
    diff = float((ws_f[:, :H].float() - ws_pr[:, :H].float()).abs().max())
    return {"pr": pr, "fused": fused, "bmm": lambda: torch.bmm(q_nope_t, w, out=ql)}, diff


def run(rank, sink, options) -> None:
    """Each of parameter ``models`` (``glm-5,deepseek-v3.2``; smoke: the rank's model) at the rank's TP and GPU."""
    rounds, rep = options.param("rounds", 5), options.param("rep", 50)
    for r in [rank] if options.smoke else ranks_of(rank, options.param("models", ("glm-5", "deepseek-v3.2"))):
        for T in sorted({r.max_num_batched_tokens // 4, r.max_num_batched_tokens}):
            measure(sink, r, T, rounds, rep)


def measure(sink, rank, T, rounds, rep) -> None:
    """The three methods at T tokens on ``rank``, ``rounds`` rotated rounds, one row each."""
    H, d, Hp = rank.num_heads, rank.model.qk_nope_head_dim, rank.padded_num_heads
    fns, diff = _methods(T, H, d, Hp)
    times = {m: [] for m in METHODS}
    for r in range(rounds):
        for m in METHODS[r % 3:] + METHODS[:r % 3]:
            times[m].append(median_ms(fns[m], warmup=10, rep=rep, graph=True) * 1e3)
    for m in METHODS:
        for r, us in enumerate(times[m]):
            sink.write("fused_bmm.csv", {"model": rank.model.name, "T": T, "H": H, "Hp": Hp, "d_nope": d,
                                         "method": m, "timer": "graph", "round": r, "us": us,
                                         "max_abs_diff": diff if m == "fused" else ""})
    med = {m: statistics.median(times[m]) for m in METHODS}
    log(f"fused_bmm {rank.model.name} T={T} H={H}: pr {med['pr']:.1f} us, fused {med['fused']:.1f} us, bmm "
        f"{med['bmm']:.1f} us (max |diff| {diff:.2e})")
    del fns
    torch.cuda.empty_cache()
