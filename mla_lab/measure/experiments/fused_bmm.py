"""Is the concat's pass needed at all? The W_UK bmm writing ql_nope straight into the padded workspace (issue 23).

Run on a CUDA GPU (torch + triton + mla_lab)::

    python -m mla_lab.measure.experiments.fused_bmm --out DIR       # writes DIR/fused_bmm.csv, prints a table
    python -m mla_lab.measure.experiments.fused_bmm --dry-run       # CPU: prints the plan, exits 0

The absorbed-MLA prefill Q path computes ``ql_nope = bmm(q_nope^T [H, T, d_nope], W_UK [H, d_nope, 512])`` and
then ``concat_mla_q`` copies ``ql_nope`` and ``q_pe`` into the first H heads of the padded ``[T, H', 576]``
workspace (vLLM PR #53878). Timed here, per (model, T), graph timing (:func:`mla_lab.measure.timer.median_ms`,
``graph=True``: one call per CUDA-graph replay, L2 flushed before each), ``--rounds`` rotated rounds:

- ``pr``: the bmm into a contiguous ``[H, T, 512]`` buffer, then the concat (the launcher, v2) into the workspace;
- ``fused``: the bmm with ``out=`` the workspace view ``ws[:T, :H, :512].transpose(0, 1)`` (strides ``576,
  H' * 576, 1``: a strided-batched GEMM output), then ``q_pe`` alone into ``ws[:T, :H, 512:]`` (``copy_``);
- ``bmm``: the bmm alone into the contiguous buffer (what the concat adds is ``pr - bmm``).

Shapes (config.json): GLM-5 TP8 ``H = 8``, ``d_nope = 192``; DeepSeek-V3.2 TP8 ``H = 16``, ``d_nope = 128``;
``kv_lora_rank = 512``, ``qk_rope_head_dim = 64``, ``H' = 64`` (sm90 ``prefill_padding``), bf16. Before timing,
``fused``'s workspace is compared with ``pr``'s (real heads; max abs difference recorded: cuBLAS may pick another
algorithm for the strided output) and its padded heads must stay NaN-poisoned.

Rows carry :func:`mla_lab.provenance.provenance` ``("measured")`` columns. Bad arguments: one line, exit 2; an
existing ``fused_bmm.csv`` not written by this script is never overwritten.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from mla_lab.kernels import make_concat_launcher
from mla_lab.measure.timer import median_ms
from mla_lab.provenance import provenance

CSV_NAME = "fused_bmm.csv"
#: (model, H per rank at TP8, qk_nope_head_dim) from data/models/<model>/config.json.
MODELS = {"glm-5": (8, 192), "deepseek-v3.2": (16, 128)}
METHODS = ("pr", "fused", "bmm")
FIELDS = ["model", "T", "H", "Hp", "d_nope", "method", "timer", "round", "us", "max_abs_diff"]
PROV_FIELDS = ["source", "device", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "timestamp"]


def _die(msg: str) -> int:
    print(f"bench_fused_bmm: {msg}", file=sys.stderr)
    return 2


def _one(model, H, d, T, Hp, rounds, rep) -> list[dict]:
    """Rows of one (model, T): every method x round (see the module docstring)."""
    import torch


    torch.manual_seed(T + H)
    q = torch.randn(T, H, d + 64, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(H, d, 512, device="cuda") / d ** 0.5).to(torch.bfloat16)
    ql = torch.empty(H, T, 512, device="cuda", dtype=torch.bfloat16)
    ws_pr = torch.full((T, Hp, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
    ws_f = ws_pr.clone()
    q_nope_t, q_pe = q[..., :d].transpose(0, 1), q[..., d:]
    launch = make_concat_launcher(ql.transpose(0, 1), q_pe, ws_pr, backend="triton")
    out_view = ws_f[:, :H, :512].transpose(0, 1)

    def pr():
        torch.bmm(q_nope_t, w, out=ql)
        launch()

    def fused():
        torch.bmm(q_nope_t, w, out=out_view)
        ws_f[:, :H, 512:].copy_(q_pe)

    def bmm():
        torch.bmm(q_nope_t, w, out=ql)

    pr()
    fused()
    torch.cuda.synchronize()
    if not ws_f[:, H:].isnan().all():
        raise RuntimeError(f"{model} T={T}: the fused path wrote into the padded heads")
    diff = float((ws_f[:, :H].float() - ws_pr[:, :H].float()).abs().max())
    fns = {"pr": pr, "fused": fused, "bmm": bmm}
    times = {m: [] for m in METHODS}
    for r in range(rounds):
        for m in METHODS[r % 3:] + METHODS[:r % 3]:
            times[m].append(median_ms(fns[m], device="cuda", warmup=10, rep=rep, graph=True))
    med = {m: statistics.median(times[m]) * 1e3 for m in METHODS}
    print(f"{model:14s} T={T:6d} H={H:3d}: pr {med['pr']:8.1f} us  fused {med['fused']:8.1f} us  "
          f"bmm {med['bmm']:8.1f} us  (fused/pr {med['fused'] / med['pr']:.3f}, max |diff| {diff:.2e})", flush=True)
    return [dict(model=model, T=T, H=H, Hp=Hp, d_nope=d, method=m, timer="graph", round=r, us=ms * 1e3,
                 max_abs_diff=diff if m == "fused" else "")
            for m in METHODS for r, ms in enumerate(times[m])]


def bench(T_list, Hp, rounds, rep) -> list[dict]:
    """Every (model, T) of :data:`MODELS` x ``T_list``; microseconds per row."""
    import torch

    rows = []
    for model, (H, d) in MODELS.items():
        for T in T_list:
            rows += _one(model, H, d, T, Hp, rounds, rep)
            torch.cuda.empty_cache()
    return rows


OUTPUTS = {CSV_NAME: FIELDS}
PROVENANCE = tuple(PROV_FIELDS)
#: (model, T): both models at the default T list
SHAPES = [(m, T) for m in MODELS for T in (4096, 16384)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help=f"directory for {CSV_NAME} (required unless --dry-run)")
    ap.add_argument("--T", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--Hp", type=int, default=64, help="padded heads H' (sm90 prefill_padding: 64); >= 16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep", type=int, default=50, help="do_bench repetition budget per timing, ms")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit 0 (no GPU needed)")
    args = ap.parse_args(argv)
    for t in args.T:
        if t < 1:
            return _die(f"--T values must be >= 1; got {t}")
    if args.Hp < max(h for h, _ in MODELS.values()):
        return _die(f"--Hp must be >= {max(h for h, _ in MODELS.values())} (the largest H per rank); got {args.Hp}")
    for name in ("rounds", "rep"):
        if getattr(args, name) < 1:
            return _die(f"--{name} must be >= 1; got {getattr(args, name)}")
    plan = [f"{m}: H={h}, d_nope={d}, T {args.T}, H'={args.Hp}; methods {list(METHODS)}; {args.rounds} rounds"
            for m, (h, d) in MODELS.items()]
    if args.dry_run:
        print("bench_fused_bmm plan (dry run, nothing timed):\n" + "\n".join(plan))
        return 0
    if args.out is None:
        return _die("--out DIR is required (or --dry-run)")
    outp = Path(args.out) / CSV_NAME
    if outp.exists():
        with open(outp) as f:
            if f.readline().strip().split(",")[: len(FIELDS)] != FIELDS:
                return _die(f"--out: {outp} exists and was not written by this script; not overwriting it")
    import torch

    if not torch.cuda.is_available():
        return _die("needs a CUDA GPU (torch.cuda.is_available() is False); --dry-run prints the plan on CPU")

    print("\n".join(plan), flush=True)
    rows = bench(args.T, args.Hp, args.rounds, args.rep)
    prov = provenance("measured")
    outp.parent.mkdir(parents=True, exist_ok=True)
    with open(outp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS + PROV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, **{k: prov.get(k, "none") for k in PROV_FIELDS}})
    print(f"{prov['device']}, torch {prov['torch']}, commit {prov['git_commit']}; wrote {outp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
