"""The packed kernel (8 tokens x 8 heads per 64-row tile) beside every engine's sparse-MLA prefill kernel (issue 36).

One process = one call of :func:`run`; ``mla-lab measure --experiments packed_kernels`` starts >= 5 fresh processes
(the between-process spread). **Graph timing**: each callable is captured in a CUDA graph and the replays are timed
round-robin with the order rotated each round and L2 flushed before each sample (:func:`mla_lab.measure.timer
.interleaved`). Inputs: fresh random bf16 q and kv (never zeros), T = 16384 query tokens, H = 8 heads per rank (GLM-5
TP8), topk 2048 (``index_topk``, config.json), index sets from :mod:`mla_lab.kernels.index_sets` (synthetic,
modelled overlap).

Shapes (``shape`` column): ``seed`` (16 prompts x 1024 tokens, causal: every token's set is its prefix), ``o<x>``
(the common-core model at pairwise overlap x, s_kv 65536), ``ctx<n>`` (each token 2048 random keys of an
n-key context: the union cannot exceed n), ``structured`` (window + Toeplitz + content keys, 32K context).

Kernels (``kernel`` column):

========================  ============================================================================================
``packed``                the union build + the packed kernel (FlashMLA over the shared keys, the lab's Triton
                          kernel over the rest with the per-row mask): what the path costs per call
``packed_kernel``         the packed kernel alone (sets built beforehand)
``union_build``           the union builder alone (``builder`` column: ``cuda`` / ``triton``)
``packed_triton``         the lab's Triton masked kernel over the whole union (no FlashMLA)
``flashmla_bound``        FlashMLA with s_q = T / 8, h_q = 64, topk = U (all rows real, no mask): the upper bound
``flashmla_ts_pad64``     tokenspeed-flashmla on Q padded to 64 heads (per token), padded heads stale (random);
                          ``_zeros``: zero padded heads (the dispatch's fallback runs this one)
``flashmla_vllm_pad64``   vLLM 0.33.0's bundled FlashMLA on Q padded to 64 heads (FLASHMLA_SPARSE)
``fa3_sparse``            vLLM 0.33.0's FA3 sparse on the real heads (FLASH_ATTN_MLA_SPARSE, vLLM's sm90 default)
``sglang_triton``         SGLang 0.5.23's 16-row Triton tile; ``sglang_triton_union4``: its ``union=4`` option
                          (4 tokens x 8 heads = 32 rows, its own sort-based union build included)
``dispatched``            the sampled union build (every 16th group) + the path :func:`mla_lab.kernels.packed
                          .choose_path` picks (``path`` column: packed, packed_triton or padded), the union
                          build included where a packed path is picked
========================  ============================================================================================

``U`` / ``S`` columns: the mean union and shared sizes per group over topk; ``max_abs_err``: the ``check`` rows
(packed vs the fp32 reference, :func:`mla_lab.kernels.reference.sparse_mla_prefill_ref`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zlib
from pathlib import Path

from mla_lab.kernels import flash_mla_info
from mla_lab.kernels import index_sets as ix
from mla_lab.kernels.packed import choose_path, full_union, packed_sparse_prefill, rest_config, sample_sets
from mla_lab.kernels.reference import sparse_mla_prefill_ref
from mla_lab.kernels.union import build_union, build_union_ref
from mla_lab.kernels.union_cuda import build_union_cuda, union_mismatch
from mla_lab.measure.engine_kernels import _backend_names, _kernels
from mla_lab.measure.engine_libs import load
from mla_lab.measure.record import CsvSink, bench_provenance
from mla_lab.measure.timer import graphed, interleaved

__all__ = ["run", "main", "OUTPUTS", "SHAPES", "PROVENANCE", "COLUMNS"]

T_TOKENS, HEADS, TOPK = 16384, 8, 2048
OVERLAPS = (1.0, 0.9, 0.8, 0.6, 0.4, 0.2, 0.0)
CONTEXTS = (4096, 8192, 32768, 131072)
COLUMNS = ["experiment", "shape", "kernel", "kernel_backend", "builder", "path", "T", "H", "topk", "s_kv", "U", "S",
           "process", "round", "ms", "max_abs_err"]
OUTPUTS = {"packed_kernels.csv": [c for c in COLUMNS if c != "process"] + ["engine_sources"]}
PROVENANCE: tuple[str, ...] = ("source", "gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit",
                               "date_utc", "engine_sources")
SHAPES = ([("seed", HEADS, None)] + [(f"o{o}", HEADS, 65536) for o in OVERLAPS]
          + [(f"ctx{c}", HEADS, c) for c in CONTEXTS] + [("structured", HEADS, 32768)])


def _index_data(shape: str, seed: int):

    if shape == "seed":
        return ix.causal_indices([1024] * (T_TOKENS // 1024), TOPK, seed=seed, device="cuda")
    if shape.startswith("o"):  # overlap 0 means the random baseline topk / s_kv (the model's floor)
        o = max(float(shape[1:]), TOPK / 65536)
        return ix.overlap_indices(T_TOKENS, TOPK, 65536, o, 8, seed=seed, device="cuda")
    if shape.startswith("ctx"):  # random top-k of an n-key context: the model's baseline overlap topk / n
        n = int(shape[3:])
        return ix.overlap_indices(T_TOKENS, TOPK, n, TOPK / n, 8, seed=seed, device="cuda")
    return ix.structured_indices(T_TOKENS, TOPK, s_kv=32768, seed=seed, device="cuda")


def _builder(log=print):
    """``(name, build)``: the CUDA shared-memory builder where it compiles and matches the reference on a small
    case, else the Triton one (said in the log and the ``builder`` column)."""
    import torch


    try:
        d = ix.overlap_indices(1024, TOPK, 65536, 0.8, 8, seed=5, device="cuda")
        bad = union_mismatch(build_union_cuda(d.indices, d.topk_length, 8, d.s_kv),
                             build_union_ref(d.indices, d.topk_length, 8, d.s_kv))
        torch.cuda.synchronize()
        if bad is None:
            return "cuda", build_union_cuda
        log(f"CUDA union builder differs from the reference ({bad}): using the Triton builder")
    except Exception as e:  # the CUDA builder is optional (needs nvcc); the Triton one always runs
        log(f"CUDA union builder unavailable ({type(e).__name__}: {str(e)[:200]}): using the Triton builder")
    return "triton", build_union


def _check(build, sm_scale, log) -> list[dict]:
    """The packed kernel (both modes) against the fp32 reference on small cases with request boundaries inside
    groups, a partial last group and tokens with no valid key."""
    import torch


    rows = []
    for H in (8, 16, 32):
        d = ix.causal_indices([37, 300, 5, 700], 256, seed=H, device="cuda")
        idx, tlen = d.indices.clone(), d.topk_length.clone()
        tlen[10] = 0
        idx[11] = -1
        T = idx.shape[0]
        q = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(d.s_kv, 1, 576, device="cuda", dtype=torch.bfloat16)
        sets = build(idx, tlen, 64 // H, d.s_kv)
        ref, _, _ = sparse_mla_prefill_ref(q, kv, idx.view(T, 1, -1), sm_scale, 512, tlen)
        for mode in ("hybrid", "triton"):
            o, _ = packed_sparse_prefill(q, kv, sets, sm_scale, mode=mode)
            err = (o.float() - ref.float()).abs().max().item()
            log(f"check H={H} {mode}: max abs err {err:.3e}")
            rows.append({"experiment": "check", "shape": "boundaries", "kernel": f"packed_{mode}", "T": T, "H": H,
                         "topk": 256, "s_kv": d.s_kv, "max_abs_err": err})
    return rows


def _callables(ek, ts_fwd, build, d, q, kv, sm_scale):
    """``{kernel: (callable, backend, path)}`` for one shape, and the (U, S) means."""
    import torch


    T, H = q.shape[0], q.shape[1]
    idx, tlen, s_kv = d.indices, d.topk_length, d.s_kv
    sets = build(idx, tlen, 8, s_kv)
    G = sets.num_groups
    cfg = rest_config(sets.rest_len.float().mean().item())
    full = full_union(sets)
    S = sets.shared_len.float().mean().item() / idx.shape[1]
    ql_nope = q[..., :512]
    q_pe = q[..., 512:]
    ks, _ = _kernels(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, {"fa3", "flashmla_vllm", "flashmla_ts",
                                                                            "sglang"}, q=q)
    out = {n: (fn, n) for n, (fn, *_r) in ks.items() if n in ("flashmla_vllm_pad64", "flashmla_ts_pad64",
                                                              "sglang_triton") or n.startswith("fa3")}
    out = {n.split("@")[0]: v for n, v in out.items()}
    if ek.sglang_sparse_mla_prefill is not None:
        out["sglang_triton_union4"] = (lambda: ek.sglang_sparse_mla_prefill(q, kv, idx, sm_scale, 512, union=4),
                                       "sglang_triton_union4")

    def packed():
        s = build(idx, tlen, 8, s_kv, out=sets)
        return packed_sparse_prefill(q, kv, s, sm_scale, mode="hybrid", flash_fwd=ts_fwd, config=cfg)

    out["packed"] = (packed, "packed")
    out["packed_kernel"] = (lambda: packed_sparse_prefill(q, kv, sets, sm_scale, mode="hybrid", flash_fwd=ts_fwd,
                                                          config=cfg), "packed")
    out["union_build"] = (lambda: build(idx, tlen, 8, s_kv, out=sets), "packed")
    cfg_t = rest_config(sets.union_len.float().mean().item())
    out["packed_triton"] = (lambda: packed_sparse_prefill(q, kv, sets, sm_scale, mode="triton", config=cfg_t),
                            "packed")
    out["flashmla_bound"] = (lambda: ts_fwd(q.view(G, 64, 576), kv, full[0].view(G, 1, -1), sm_scale, 512,
                                            topk_length=full[2]), "flashmla_bound")
    smp, stride = sample_sets(idx, tlen, 8, s_kv, builder=build)
    path, _ = choose_path(smp, stride, T, idx.shape[1], float(tlen.double().sum().item()))
    q64 = torch.zeros(T, 64, 576, device="cuda", dtype=torch.bfloat16)  # the fallback's padded Q: zero heads
    q64[:, :H] = q
    out["flashmla_ts_pad64_zeros"] = (lambda: ts_fwd(q64, kv, idx.view(T, 1, -1), sm_scale, 512, topk_length=tlen),
                                      "flashmla_ts_pad64")
    rows = (torch.arange(0, G, stride, device="cuda")[:, None] * 8 + torch.arange(8, device="cuda")).reshape(-1)
    idx_s, tl_s = idx[rows].contiguous(), tlen[rows].contiguous()

    def dispatched():
        build(idx_s, tl_s, 8, s_kv)
        if path == "padded":
            return ts_fwd(q64, kv, idx.view(T, 1, -1), sm_scale, 512, topk_length=tlen)
        s = build(idx, tlen, 8, s_kv, out=sets)
        hybrid = path == "packed"
        return packed_sparse_prefill(q, kv, s, sm_scale, mode="hybrid" if hybrid else "triton", flash_fwd=ts_fwd,
                                     config=cfg if hybrid else cfg_t)

    out["dispatched"] = (dispatched, path)
    U = sets.union_len.float().mean().item() / idx.shape[1]
    return out, U, S, q64


def run(engine_root: str, out_csv: str, process: int, rounds: int = 5, shapes=None, log=print) -> int:
    """Time every kernel at every shape once in this process, appending rows to ``out_csv`` (created).

    Raises:
        RuntimeError: no CUDA GPU, no flash_mla, or an engine library failed to load.
    """
    import torch


    if not torch.cuda.is_available():
        raise RuntimeError("packed_kernels needs a CUDA GPU; torch sees none")
    from flash_mla import flash_mla_sparse_fwd as ts_fwd

    ek = load(engine_root, need_concat=False)
    names = _backend_names(ek)
    bname, build = _builder(log)
    sink = CsvSink(out_csv, COLUMNS + ["engine_sources"], {**bench_provenance(flash_mla_info()),
                                                          "engine_sources": ek.sources.get("vllm_wheel", "")})
    sm_scale = 1.0 / math.sqrt(192 + 64)  # GLM-5: qk_nope_head_dim 192 + qk_rope_head_dim 64 (config.json)
    backend = {"fa3_sparse": names["fa3"], "flashmla_vllm_pad64": names["flashmla_vllm"],
               "flashmla_ts_pad64": names["flashmla_ts"], "flashmla_bound": names["flashmla_ts"],
               "sglang_triton": names["sglang"], "sglang_triton_union4": names["sglang"] + " union=4",
               "packed": f"mla_lab packed (triton rest + {names['flashmla_ts']})"}
    for row in _check(build, sm_scale, log):
        sink.write({**row, "kernel_backend": backend["packed"], "builder": bname, "process": process})
    for shape in (shapes or [s[0] for s in SHAPES]):
        d = _index_data(shape, seed=process * 1000 + zlib.crc32(shape.encode()) % 997)
        q = torch.randn(T_TOKENS, HEADS, 576, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(d.s_kv, 1, 576, device="cuda", dtype=torch.bfloat16)
        ks, U, S, _q64 = _callables(ek, ts_fwd, build, d, q, kv, sm_scale)
        fns = {n: graphed(fn) for n, (fn, _b) in ks.items()}
        samples = interleaved(fns, repeats=rounds)
        for n, xs in samples.items():
            path = ks[n][1] if n == "dispatched" else ""
            kb = backend.get(ks[n][1], backend.get(n, backend["packed"]))
            for r, ms in enumerate(xs):
                sink.write({"experiment": "packed_kernels", "shape": shape, "kernel": n, "kernel_backend": kb,
                            "builder": bname if n in ("packed", "packed_kernel", "union_build", "dispatched") else "",
                            "path": path, "T": T_TOKENS, "H": HEADS, "topk": TOPK, "s_kv": d.s_kv, "U": round(U, 4),
                            "S": round(S, 4), "process": process, "round": r, "ms": ms})
        med = {n: sorted(v)[len(v) // 2] for n, v in samples.items()}
        log(f"p{process} {shape} U={U:.2f} S={S:.2f}: " + ", ".join(f"{n}={m:.3f}" for n, m in med.items()))
        del fns, ks, samples, q, kv, d
        torch.cuda.empty_cache()
    return sink.n


def main(argv=None) -> int:
    """``python -m mla_lab.measure.experiments.packed_kernels --engine-root .engine --out DIR --process K``."""
    ap = argparse.ArgumentParser(prog="python -m mla_lab.measure.experiments.packed_kernels")
    ap.add_argument("--engine-root", required=True, help="a folder packed by mla_lab.measure.engine_libs pack")
    ap.add_argument("--out", required=True, help="folder for packed_kernels.csv (the file must not exist)")
    ap.add_argument("--process", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="", help="comma-separated subset of the shapes (default: all)")
    a = ap.parse_args(argv)
    known = [s[0] for s in SHAPES]
    shapes = [s for s in a.shapes.split(",") if s] or None
    if shapes and set(shapes) - set(known):
        ap.error(f"--shapes={a.shapes} holds {sorted(set(shapes) - set(known))}; allowed: {', '.join(known)}")
    if a.rounds < 1:
        ap.error(f"--rounds={a.rounds} must be >= 1")
    out = Path(a.out) / "packed_kernels.csv"
    if out.exists():
        ap.error(f"--out={a.out} already holds packed_kernels.csv: the experiment writes a new file only")
    if not Path(a.engine_root).is_dir():
        ap.error(f"--engine-root={a.engine_root} is not a folder: pack one with python -m "
                 "mla_lab.measure.engine_libs pack VLLM_WHEEL SGLANG_WHEEL OUT")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    n = run(a.engine_root, str(out), a.process, a.rounds, shapes)
    print(f"wrote {n} rows to {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
