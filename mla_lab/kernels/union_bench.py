"""Time the union builders on the GPU: ``python -m mla_lab.kernels.union_bench [--sweep]``.

The Triton kernel (:func:`.union.build_union`) and the CUDA one (:func:`.union_cuda.build_union_cuda`, g <= 8, each
row checked exact against the reference: ``cuda exact``) against the torch sort-and-scatter build
(:func:`.union.build_union_ref`),
``triton.testing.do_bench`` medians (one process: an indication, not a committed measurement; committed rows go
through the lab's measure runner), at T 16384, topk 2048, g 8, s_kv 4096 / 32768 / 131072, on the generators of
:mod:`.index_sets`: the common-core overlap model (random top-k, overlap 0.5, 0.8, 1.0), the structured generator
(s_kv >= T only: the chunk is the last T positions) and the seed's causal case (1024-token prompts). Each row checks
the Triton lists' lengths against the reference's (``lens ok``). ``--sweep`` also times the kernel's knobs
(programs per SM, block, warps) at s_kv 32768, overlap 0.8.

A separate module because it needs both the builders and the generators, and :mod:`.index_sets` imports
:mod:`.union` (the package's import graph has no cycles: tests/test_architecture.py).
"""

from __future__ import annotations

import torch

from .index_sets import causal_indices, overlap_indices, structured_indices
from .union import DEFAULT_PROGRAMS_PER_SM, build_union, build_union_ref
from .union_cuda import build_union_cuda, union_mismatch

try:  # pragma: no cover - triton is optional on CPU machines
    import triton
except Exception:  # pragma: no cover
    triton = None

__all__ = ["bench_rows", "sweep_rows", "main"]

S_KVS = (4096, 32768, 131072)
OVERLAPS = (None, 0.5, 0.8, 1.0)


def _datasets(T, topk, g, s_kv):
    """``(label, IndexData)`` pairs at one s_kv."""
    out = []
    for o in OVERLAPS:
        ov = topk / s_kv if o is None else max(o, topk / s_kv)
        label = "random top-k" if o is None else f"overlap {ov:.3g}"
        out.append((label, overlap_indices(T, topk, s_kv, ov, g, seed=0, device="cuda")))
    if s_kv >= T:
        out.append(("structured f=0.5", structured_indices(T, topk, s_kv=s_kv, window=128, toeplitz_fraction=0.5,
                                                           content_keys=64, seed=0, device="cuda")))
    return out


def _time(fn) -> float:
    return 1e3 * triton.testing.do_bench(fn, return_mode="median")


def _row(label, data, g, **knobs) -> dict:
    idx, tlen, s_kv = data.indices, data.topk_length, data.s_kv
    ref = build_union_ref(idx, tlen, g, s_kv)
    got = build_union(idx, tlen, g, s_kv, **knobs)  # also compiles
    ok = torch.equal(got.shared_len, ref.shared_len) and torch.equal(got.rest_len, ref.rest_len)
    row = {"s_kv": s_kv, "data": label, "mean_U": float(ref.union_len.float().mean()), "lens_ok": ok,
           "triton_us": _time(lambda: build_union(idx, tlen, g, s_kv, out=got, **knobs)),
           "torch_us": _time(lambda: build_union_ref(idx, tlen, g, s_kv)), "cuda_exact": None, "cuda_us": None}
    if g <= 8 and not knobs:  # the CUDA builder takes g <= 8; the knob sweep is the Triton kernel's
        cu = build_union_cuda(idx, tlen, g, s_kv)  # also compiles
        row["cuda_exact"] = union_mismatch(cu, ref) is None
        row["cuda_us"] = _time(lambda: build_union_cuda(idx, tlen, g, s_kv, out=cu))
    return row


def bench_rows(T=16384, topk=2048, g=8, s_kvs=S_KVS) -> list[dict]:
    """Rows ``{s_kv, data, mean_U, lens_ok, triton_us, torch_us, cuda_exact, cuda_us}`` (CUDA; the last two None
    at g > 8)."""
    rows = []
    for s_kv in s_kvs:
        for label, data in _datasets(T, topk, g, s_kv):
            rows.append(_row(label, data, g))
    seed = causal_indices([1024] * (T // 1024), topk, seed=0, device="cuda")
    rows.append(_row("seed (1024-token prompts)", seed, g))
    return rows


def sweep_rows(T=16384, topk=2048, g=8, s_kv=32768, overlap=0.8) -> list[dict]:
    """The kernel's knobs at one shape: programs per SM {1, 2, 4, 8} x block {1024, 4096} x warps {4, 8, 16} (the
    kernel waits on L2 round trips: more programs and warps in flight should help; the sweep says how much)."""
    data = overlap_indices(T, topk, s_kv, overlap, g, seed=0, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for per_sm in (1, 2, 4, 8):
        for block in (1024, 4096):
            for warps in (4, 8, 16):
                r = _row(f"overlap {overlap}", data, g, num_programs=per_sm * sms, block=block, num_warps=warps)
                rows.append({**r, "programs_per_sm": per_sm, "block": block, "num_warps": warps})
    return rows


def main(argv=None) -> int:
    """Print the table (and the knob sweep with ``--sweep``); without CUDA say so and return 1."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mla_lab.kernels.union_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=16384)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--g", type=int, default=8, choices=(1, 2, 4, 8, 16))
    ap.add_argument("--sweep", action="store_true", help="also time the kernel's knobs")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or triton is None:
        print("no CUDA GPU (or no triton): this benchmark needs one; the kernel's CPU checks are the tests")
        return 1
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"T={args.T}, topk={args.topk}, g={args.g}; do_bench median, us; default programs = "
          f"{DEFAULT_PROGRAMS_PER_SM} x SMs")
    print(f"{'s_kv':>7} {'data':>26} {'mean U':>8} {'lens ok':>7} {'triton':>9} {'torch':>9} {'torch/triton':>12} "
          f"{'cuda exact':>10} {'cuda':>9}")
    for r in bench_rows(args.T, args.topk, args.g):
        cu = "-" if r["cuda_us"] is None else f"{r['cuda_us']:.1f}"
        print(f"{r['s_kv']:>7} {r['data']:>26} {r['mean_U']:>8.0f} {r['lens_ok']!s:>7} {r['triton_us']:>9.1f} "
              f"{r['torch_us']:>9.1f} {r['torch_us'] / r['triton_us']:>11.1f}x {r['cuda_exact']!s:>10} {cu:>9}")
    if args.sweep:
        print("\nknob sweep (s_kv 32768, overlap 0.8)")
        print(f"{'progs/SM':>8} {'block':>6} {'warps':>5} {'triton us':>10} {'lens ok':>7}")
        for r in sweep_rows(args.T, args.topk, args.g):
            print(f"{r['programs_per_sm']:>8} {r['block']:>6} {r['num_warps']:>5} {r['triton_us']:>10.1f} "
                  f"{r['lens_ok']!s:>7}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
