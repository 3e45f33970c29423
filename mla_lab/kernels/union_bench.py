"""Time the union builders on the GPU: ``python -m mla_lab.kernels.union_bench [--sweep]``.

Both kernels of :func:`.union.build_union` (``triton``: L2 fields; ``cuda``: shared-memory fields) against the torch
sort-and-scatter build (:func:`.union.build_union_ref`),
``triton.testing.do_bench`` medians (one process: an indication, not a committed measurement; committed rows go
through the lab's measure runner), at T 16384, topk 2048, g 8, s_kv 4096 / 32768 / 131072, on the generators of
:mod:`.index_sets`: the common-core overlap model (random top-k, overlap 0.5, 0.8, 1.0), the structured generator
(s_kv >= T only: the chunk is the last T positions) and the seed's causal case (1024-token prompts). Each row checks
each kernel's list lengths against the reference's. ``--sweep`` also times the kernels' knobs (Triton: programs
per SM, block, warps; CUDA: threads per CTA) at s_kv 32768, overlap 0.8.

A separate module because it needs both the builders and the generators, and :mod:`.index_sets` imports
:mod:`.union` (the package's import graph has no cycles: tests/test_architecture.py).
"""

from __future__ import annotations

import torch

from .index_sets import causal_indices, overlap_indices, structured_indices
from .union import DEFAULT_PROGRAMS_PER_SM, build_union, build_union_ref

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


def _row(label, data, g, variants=("triton", "cuda"), **knobs) -> dict:
    """One data set: the reference once, each variant timed into a preallocated ``out`` (checked: lengths equal the
    reference's, ``<variant>_lens_ok``)."""
    idx, tlen, s_kv = data.indices, data.topk_length, data.s_kv
    ref = build_union_ref(idx, tlen, g, s_kv)
    row = {"s_kv": s_kv, "data": label, "mean_U": float(ref.union_len.float().mean()),
           "torch_us": _time(lambda: build_union_ref(idx, tlen, g, s_kv))}
    for v in variants:
        kw = {k: x for k, x in knobs.items() if (k == "threads") == (v == "cuda")}
        got = build_union(idx, tlen, g, s_kv, variant=v, **kw)  # also compiles
        row[f"{v}_lens_ok"] = torch.equal(got.shared_len, ref.shared_len) and torch.equal(got.rest_len, ref.rest_len)
        row[f"{v}_us"] = _time(lambda v=v, got=got, kw=kw: build_union(idx, tlen, g, s_kv, out=got, variant=v, **kw))
    return row


def bench_rows(T=16384, topk=2048, g=8, s_kvs=S_KVS) -> list[dict]:
    """Rows ``{s_kv, data, mean_U, lens_ok, triton_us, torch_us}`` (CUDA)."""
    rows = []
    for s_kv in s_kvs:
        for label, data in _datasets(T, topk, g, s_kv):
            rows.append(_row(label, data, g))
    seed = causal_indices([1024] * (T // 1024), topk, seed=0, device="cuda")
    rows.append(_row("seed (1024-token prompts)", seed, g))
    return rows


def sweep_rows(T=16384, topk=2048, g=8, s_kv=32768, overlap=0.8) -> list[dict]:
    """The kernels' knobs at one shape: Triton programs per SM {1, 2, 4, 8} x block {1024, 4096} x warps {4, 8, 16};
    CUDA threads per CTA {256, 512, 1024}."""
    data = overlap_indices(T, topk, s_kv, overlap, g, seed=0, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for per_sm in (1, 2, 4, 8):
        for block in (1024, 4096):
            for warps in (4, 8, 16):
                knobs = {"num_programs": per_sm * sms, "block": block, "num_warps": warps}
                r = _row(f"overlap {overlap}", data, g, variants=("triton",), **knobs)
                rows.append({"variant": "triton", "knobs": f"programs/SM {per_sm}, block {block}, warps {warps}",
                             "us": r["triton_us"], "lens_ok": r["triton_lens_ok"]})
    for threads in (256, 512, 1024):
        r = _row(f"overlap {overlap}", data, g, variants=("cuda",), threads=threads)
        rows.append({"variant": "cuda", "knobs": f"threads {threads}", "us": r["cuda_us"],
                     "lens_ok": r["cuda_lens_ok"]})
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
    print(f"{'s_kv':>7} {'data':>26} {'mean U':>8} {'triton':>9} {'cuda':>9} {'torch':>9}  lengths = reference")
    for r in bench_rows(args.T, args.topk, args.g):
        ok = "yes" if r["triton_lens_ok"] and r["cuda_lens_ok"] else f"NO (triton {r['triton_lens_ok']}, cuda " \
            f"{r['cuda_lens_ok']})"
        print(f"{r['s_kv']:>7} {r['data']:>26} {r['mean_U']:>8.0f} {r['triton_us']:>9.1f} {r['cuda_us']:>9.1f} "
              f"{r['torch_us']:>9.1f}  {ok}")
    if args.sweep:
        print("\nknob sweep (s_kv 32768, overlap 0.8)")
        for r in sweep_rows(args.T, args.topk, args.g):
            print(f"{r['variant']:>7} {r['knobs']:<36} {r['us']:>9.1f} us  lengths ok {r['lens_ok']}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
