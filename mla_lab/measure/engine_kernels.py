"""The engines' own sparse-MLA kernels timed side by side on one GPU (issue 29): prefill, decode, gather vs MMA.

One process = one call of :func:`run` (the driver starts >= 5 fresh processes; :mod:`mla_lab.measure.spread` takes
the between-process spread). Every timing is **graph timing**: each callable is captured in a CUDA graph
(:func:`mla_lab.measure.timer.graphed`) and the replays are timed round-robin, order rotated each round, L2 flushed
before each sample (:func:`mla_lab.measure.timer.interleaved`). Inputs are fresh random bf16 (never zeros).

Geometry: GLM-5 (``data/models/glm-5/config.json``: kv_lora_rank 512, qk_rope_head_dim 64, index_topk 2048,
64 heads; head_size 576 = 512 + 64), ``H`` heads per rank = 64 / TP (8, 16, 32, 64 at TP 8, 4, 2, 1).

Kernels (``kernel`` column; ``kernel_backend`` names the library and version):

===========================  =========================================================================================
``fa3_sparse``               vLLM 0.33.0 FA3 (``_vllm_fa3_C``), vLLM's call (``flashattn_mla_sparse.py:215-259``):
                             ``q=q_rope [T,H,64]``, ``q_v=q_nope [T,H,512]``, k/v = the latent cache as page-size-1
                             blocks, ``block_table`` = top-k indices ``[T, topk]``, ``seqused_k`` = valid counts,
                             ``cu_seqlens_q = arange(T+1)``, ``max_seqlen_q = 1``, ``causal``; ``num_splits`` 0 (the
                             kernel's split-KV heuristic, vLLM's default) or 1 (split-KV off)
``flashmla_vllm_pad64``      vLLM 0.33.0's bundled FlashMLA (``_flashmla_C``) on Q padded to 64 heads (what
                             ``FLASHMLA_SPARSE`` runs: ``prefill_padding = 64``); the padded Q is pre-built (kernel
                             only)
``flashmla_vllm_native``     the same library with ``h_q = H`` (its interface: "SM90 supports 8, 16, 32, 64 or 128
                             heads"), no padding
``flashmla_ts_pad64``        ``tokenspeed-flashmla`` (the lab's FlashMLA build) on Q padded to 64 heads
``flashmla_ts_h128``         the same at ``h_q = 128`` (each token's rows gathered by two CTAs)
``sglang_triton``            SGLang 0.5.23's Triton ``sparse_mla_prefill`` (heads padded to a 16-row tile)
``gather_only``              the lab's Triton kernel that gathers each token's top-k 576-wide rows as FlashMLA's CTAs do
                             (one program per token, 16-row blocks up to its valid count) and adds them (no MMA): the gather floor;
                             ``gather_only_x2``: two programs per token (the gather of ``h_q = 128``)
``concat_vllm_padded``       vLLM's CUDA ``concat_mla_q`` into ``[T, 64, 576]`` (the PR's write); ``_unpadded``: into
                             ``[T, H, 576]``; ``concat_lab_padded``: the lab's Triton concat (v2) into ``[T, 64, 576]``
``copy_same_bytes``          ``torch.Tensor.copy_`` of a contiguous buffer of the concat's bytes (the ceiling)
``path_pr53878``             vLLM's concat into the padded workspace + vLLM FlashMLA pad64 (the PR's attention path;
                             the workspace zeroed once: the PR's is never written)
``*_pad64_zeros``            (part ``content``) the padded FlashMLA kernels with zeros in the padded heads; the plain
                             ``*_pad64`` rows hold random (stale) padded heads
===========================  =========================================================================================

Shapes (``shape`` column): ``seed`` (16 prompts x 1024 tokens in a 16384-token step, causal top-k:
``topk_length = min(pos + 1, 2048)``), ``full_topk`` (16384 tokens, 2048 random keys each), ``decode`` (``B`` query
tokens, one per request, each request ``ctx_len`` keys long, ``min(ctx_len, 2048)`` keys per token).

Correctness: before timing, every attention kernel's output on a small shape is compared with
:func:`mla_lab.kernels.reference.sparse_mla_prefill_ref` (``check`` rows: max abs error over the real heads).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from ..kernels import flash_mla_info, make_concat_launcher
from ..kernels.reference import sparse_mla_prefill_ref
from .engine_libs import load
from .record import CsvSink, bench_provenance
from .timer import graphed, interleaved

__all__ = ["run", "main", "PREFILL_H", "DECODE_B", "DECODE_CTX", "COLUMNS"]

PREFILL_H = (8, 16, 32, 64)
DECODE_B = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: decode contexts: 1088 (the PR's benchmark mid-decode: 1024 prompt + 64 generated, fewer keys than topk) and 8192
#: (top-k bound: 2048 keys per token)
DECODE_CTX = (1088, 8192)
DECODE_H = (8, 16)
COLUMNS = ["experiment", "shape", "kernel", "kernel_backend", "T", "H", "h_q", "topk", "ctx_len", "num_splits",
           "process", "round", "ms", "bytes", "max_abs_err"]
KV_LORA, ROPE, TOPK, D_QK = 512, 64, 2048, 576


def _backend_names(ek) -> dict:
    v, s = ek.versions["vllm"], ek.versions["sglang"]

    fi = flash_mla_info()
    ts = f"{fi.get('provider')}=={fi.get('version')}" if fi.get("available") else "none"
    return {"fa3": f"vllm-{v} _vllm_fa3_C (FA3)", "flashmla_vllm": f"vllm-{v} _flashmla_C (FlashMLA)",
            "flashmla_ts": f"{ts} (FlashMLA)", "sglang": f"sglang-{s} triton_sparse_mla_prefill",
            "concat_vllm": f"vllm-{v} _C_stable_libtorch concat_mla_q (CUDA)", "lab": "mla_lab triton",
            "torch": "torch copy_"}


def _gather_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gather_sum(kv, idx, tlen, out, topk, REPS: tl.constexpr, BN: tl.constexpr):
        # one program per (token, rep): stream the token's valid top-k rows (512 + 64 bf16 each) through registers,
        # elementwise fp32 adds only (no reduction inside the loop, no MMA), one [576] row written at the end
        pid = tl.program_id(0)
        t = pid // REPS
        n = tl.load(tlen + t)
        ca = tl.arange(0, 512)
        cb = tl.arange(0, 64)
        acc_a = tl.zeros([BN, 512], dtype=tl.float32)
        acc_b = tl.zeros([BN, 64], dtype=tl.float32)
        for k0 in range(0, n, BN):
            r = k0 + tl.arange(0, BN)
            m = r < n
            i = tl.load(idx + t.to(tl.int64) * topk + r, mask=m, other=0).to(tl.int64)
            acc_a += tl.load(kv + i[:, None] * 576 + ca[None, :], mask=m[:, None], other=0.0).to(tl.float32)
            acc_b += tl.load(kv + i[:, None] * 576 + 512 + cb[None, :], mask=m[:, None], other=0.0).to(tl.float32)
        o = out + pid.to(tl.int64) * 576
        tl.store(o + ca, tl.sum(acc_a, axis=0))
        tl.store(o + 512 + cb, tl.sum(acc_b, axis=0))

    return gather_sum


def _inputs(T, H, kind, seed, ctx_len=None, B=None):
    """``(ql_nope [T,H,512] head-major strides, q_pe [T,H,64] strided, kv [s_kv,1,576], idx [T,topk] int32,
    tl [T] int32)`` bf16 on CUDA."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    ql_nope = torch.randn(H, T, KV_LORA, device=dev, dtype=torch.bfloat16, generator=g).transpose(0, 1)
    q_pe = torch.randn(T, H, 192 + ROPE, device=dev, dtype=torch.bfloat16, generator=g)[..., 192:]
    if kind == "seed":
        n_prompts, L = T // 1024, 1024
        s_kv = max(n_prompts * L, TOPK)
        pos = torch.arange(T, device=dev) % L
        base = (torch.arange(T, device=dev) // L) * L
        visible = pos + 1
        r = torch.rand(T, TOPK, device=dev, generator=g)
        idx = base[:, None] + (r * visible[:, None]).long()
        tlen = torch.clamp(visible, max=TOPK)
    elif kind == "full_topk":
        s_kv = T
        idx = torch.randint(0, s_kv, (T, TOPK), device=dev, generator=g)
        tlen = torch.full((T,), TOPK, device=dev)
    else:  # decode: T = B tokens, request j owns keys [j*ctx_len, (j+1)*ctx_len)
        s_kv = T * ctx_len
        n = min(ctx_len, TOPK)
        base = torch.arange(T, device=dev)[:, None] * ctx_len
        idx = base + torch.stack([torch.randperm(ctx_len, device=dev, generator=g)[:TOPK] for _ in range(T)])
        if n < TOPK:
            idx = torch.cat([idx, torch.full((T, TOPK - n), -1, device=dev, dtype=idx.dtype)], 1)
        tlen = torch.full((T,), n, device=dev)
    kv = torch.randn(s_kv, 1, D_QK, device=dev, dtype=torch.bfloat16, generator=g)
    return ql_nope, q_pe, kv, idx.to(torch.int32).contiguous(), tlen.to(torch.int32)


def _kernels(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, which, num_splits=(0,), q=None):
    """``{kernel name: (callable, h_q, num_splits, bytes or None)}`` for the kernels in ``which``; ``q`` (``[T, H,
    576]``) given: used as it is (no concat: ``ql_nope`` / ``q_pe`` are then its views)."""
    import torch

    T = ql_nope.shape[0]
    if q is None:
        q = torch.empty(T, H, D_QK, device="cuda", dtype=torch.bfloat16)
        ek.concat_mla_q(ql_nope, q_pe, q)
    q64 = torch.zeros(T, 64, D_QK, device="cuda", dtype=torch.bfloat16)
    q64[:, :H] = q
    q64[:, H:] = torch.randn_like(q64[:, H:]) if H < 64 else q64[:, H:]  # stale, as vLLM 0.33.0's shared workspace
    idx3 = idx.view(T, 1, TOPK)
    kv_rows = kv.view(-1, D_QK)
    k_cache = kv_rows[:, KV_LORA:].unsqueeze(1).unsqueeze(1)
    v_cache = kv_rows[:, :KV_LORA].unsqueeze(1).unsqueeze(1)
    cu = torch.arange(T + 1, device="cuda", dtype=torch.int32)
    q_rope, q_nope = q[..., KV_LORA:], q[..., :KV_LORA]
    out = {}
    if "fa3" in which:
        for ns in num_splits:
            out[f"fa3_sparse@{ns}"] = (lambda ns=ns: ek.fa3_varlen(
                q=q_rope, k=k_cache, v=v_cache, q_v=q_nope, max_seqlen_q=1, cu_seqlens_q=cu, max_seqlen_k=TOPK,
                seqused_k=tlen, block_table=idx, softmax_scale=sm_scale, causal=True, num_splits=ns,
                fa_version=3), H, ns, None)
    if "flashmla_vllm" in which:
        out["flashmla_vllm_pad64"] = (lambda: ek.flashmla_sparse_fwd(q64, kv, idx3, sm_scale, 512, None, tlen),
                                      64, None, None)
        if H < 64:
            out["flashmla_vllm_native"] = (lambda: ek.flashmla_sparse_fwd(q, kv, idx3, sm_scale, 512, None, tlen),
                                           H, None, None)
    if "content" in which and H < 64:
        # the padded heads holding zeros (the PR's never-written workspace, SGLang's new_zeros) beside the stale
        # (random) heads above: the same kernels, the same real heads
        q64z = torch.zeros_like(q64)
        q64z[:, :H] = q
        out["flashmla_vllm_pad64_zeros"] = (lambda: ek.flashmla_sparse_fwd(q64z, kv, idx3, sm_scale, 512, None,
                                                                           tlen), 64, None, None)
        if ts_fwd is not None:
            out["flashmla_ts_pad64_zeros"] = (lambda: ts_fwd(q64z, kv, idx3, sm_scale, 512, topk_length=tlen), 64,
                                              None, None)
    if "flashmla_ts" in which and ts_fwd is not None:
        out["flashmla_ts_pad64"] = (lambda: ts_fwd(q64, kv, idx3, sm_scale, 512, topk_length=tlen), 64, None, None)
        if H == 64:
            q128 = torch.cat([q64, q64], 1)
            out["flashmla_ts_h128"] = (lambda: ts_fwd(q128, kv, idx3, sm_scale, 512, topk_length=tlen), 128, None,
                                       None)
    if "sglang" in which and ek.sglang_sparse_mla_prefill is not None:
        out["sglang_triton"] = (lambda: ek.sglang_sparse_mla_prefill(q, kv, idx, sm_scale, 512, topk_length=tlen),
                                H, None, None)
    if "gather" in which:
        gk = _gather_kernel()
        for reps, name in ((1, "gather_only"), (2, "gather_only_x2")):
            g_out = torch.empty(T * reps, D_QK, device="cuda", dtype=torch.float32)
            out[name] = (lambda reps=reps, g_out=g_out: gk[(T * reps,)](kv_rows, idx, tlen, g_out, TOPK, REPS=reps,
                                                                         BN=16, num_warps=4), 64 * reps, None, None)
    if "concat" in which:
        ws = torch.zeros(T, 64, D_QK, device="cuda", dtype=torch.bfloat16)  # the PR's workspace: never written
        un = torch.empty(T, H, D_QK, device="cuda", dtype=torch.bfloat16)
        nbytes = 2 * T * H * D_QK * 2
        src = torch.empty(nbytes // 4, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        lab = make_concat_launcher(ql_nope, q_pe, ws[:, :H])
        out["concat_vllm_padded"] = (lambda: ek.concat_mla_q(ql_nope, q_pe, ws[:, :H]), 64, None, nbytes)
        out["concat_vllm_unpadded"] = (lambda: ek.concat_mla_q(ql_nope, q_pe, un), H, None, nbytes)
        out["concat_lab_padded"] = (lab, 64, None, nbytes)
        out["copy_same_bytes"] = (lambda: dst.copy_(src), H, None, nbytes)
        if "flashmla_vllm" in which:
            def pr_path():
                ek.concat_mla_q(ql_nope, q_pe, ws[:, :H])
                return ek.flashmla_sparse_fwd(ws, kv, idx3, sm_scale, 512, None, tlen)
            out["path_pr53878"] = (pr_path, 64, None, None)
    return out, q


def _check(ek, ts_fwd, sm_scale, log) -> list[dict]:
    """Each attention kernel's output on a small seed-like shape against the fp32 reference (max abs error)."""
    import torch

    rows = []
    for H in (8, 64):
        ql_nope, q_pe, kv, idx, tlen = _inputs(2048, H, "seed", seed=123)
        ks, q = _kernels(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale,
                         {"fa3", "flashmla_vllm", "flashmla_ts", "sglang"}, num_splits=(0, 1))
        ref, _, _ = sparse_mla_prefill_ref(q, kv, idx.view(-1, 1, TOPK), sm_scale, 512, tlen)
        for name, (fn, h_q, ns, _) in ks.items():
            if name == "flashmla_ts_h128":
                continue
            r = fn()
            o = r[0] if isinstance(r, (tuple, list)) else r
            err = (o[:, :H].float() - ref.float()).abs().max().item()
            log(f"check H={H} {name}: max abs err {err:.3e}")
            rows.append({"experiment": "check", "shape": "seed2048", "kernel": name.split("@")[0], "T": 2048,
                         "H": H, "h_q": h_q, "topk": TOPK, "num_splits": ns, "max_abs_err": err})
        del ks
        torch.cuda.empty_cache()
    return rows


def run(engine_root: str, out_csv: str, process: int, rounds: int = 5, parts=("check", "prefill", "decode"),
        log=print) -> int:
    """Time the engine kernels once in this process, appending rows to ``out_csv`` (created). Returns rows written.

    Raises:
        RuntimeError: no CUDA GPU, or an engine library failed to load (:func:`mla_lab.measure.engine_libs.load`).
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("engine_kernels needs a CUDA GPU; torch sees none")

    ek = load(engine_root)
    names = _backend_names(ek)
    try:
        from flash_mla import flash_mla_sparse_fwd as ts_fwd
    except Exception:  # the tokenspeed build is optional beside the engine's own
        ts_fwd = None
    sink = CsvSink(out_csv, COLUMNS + ["engine_sources"], {**bench_provenance(flash_mla_info()),
                                                          "engine_sources": ek.sources.get("vllm_wheel", "")})
    sm_scale = 1.0 / math.sqrt(192 + 64)  # GLM-5: qk_nope_head_dim 192 + qk_rope_head_dim 64 (config.json)

    def backend_of(kernel):
        for key in ("fa3", "flashmla_vllm", "flashmla_ts", "sglang", "concat_vllm"):
            if kernel.startswith(key):
                return names[key]
        return names["torch"] if kernel.startswith("copy") else (names["lab"] if "lab" in kernel or "gather" in
                                                                 kernel else names["flashmla_vllm"])

    def emit(samples, meta, shape, T, H, ctx_len):
        for name, xs in samples.items():
            fn, h_q, ns, nbytes = meta[name]
            kern = name.split("@")[0]
            for r, ms in enumerate(xs):
                sink.write({"experiment": "engine_kernels", "shape": shape, "kernel": kern,
                            "kernel_backend": backend_of(kern), "T": T, "H": H, "h_q": h_q, "topk": TOPK,
                            "ctx_len": ctx_len, "num_splits": ns, "process": process, "round": r, "ms": ms,
                            "bytes": nbytes})

    if "check" in parts:
        for row in _check(ek, ts_fwd, sm_scale, log):
            sink.write({**row, "kernel_backend": backend_of(row["kernel"]), "process": process})
    if "content" in parts:  # the padded kernels with zero padded heads beside stale ones, and the paths
        for shape in ("seed", "full_topk"):
            for H in (8, 16):
                ql_nope, q_pe, kv, idx, tlen = _inputs(16384, H, shape, seed=process * 100 + H)
                ks, _ = _kernels(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale,
                                 {"fa3", "flashmla_vllm", "flashmla_ts", "content", "concat"}, num_splits=(0,))
                ks = {n: v for n, v in ks.items() if not n.startswith(("concat", "copy"))}
                fns = {n: graphed(fn) for n, (fn, *_r) in ks.items()}
                samples = interleaved(fns, repeats=rounds)
                emit(samples, ks, shape, 16384, H, "")
                log(f"p{process} content {shape} H={H}: " + ", ".join(
                    f"{n}={sorted(v)[len(v) // 2]:.3f}" for n, v in samples.items()))
                del fns, ks, samples
                torch.cuda.empty_cache()
    if "prefill" in parts:
        for shape in ("seed", "full_topk"):
            for H in PREFILL_H:
                ql_nope, q_pe, kv, idx, tlen = _inputs(16384, H, shape, seed=process * 100 + H)
                which = {"fa3", "flashmla_vllm", "flashmla_ts", "sglang", "gather", "concat"}
                ks, _ = _kernels(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale, which, num_splits=(0,))
                fns = {n: graphed(fn) for n, (fn, *_r) in ks.items()}
                samples = interleaved(fns, repeats=rounds)
                emit(samples, ks, shape, 16384, H, "")
                log(f"p{process} {shape} H={H}: " + ", ".join(
                    f"{n}={sorted(v)[len(v) // 2]:.3f}" for n, v in samples.items()))
                del fns, ks, samples, ql_nope, q_pe, kv, idx, tlen
                torch.cuda.empty_cache()
    if "decode" in parts:
        for H in DECODE_H:
            for ctx in DECODE_CTX:
                for B in DECODE_B:
                    ql_nope, q_pe, kv, idx, tlen = _inputs(B, H, "decode", seed=process * 1000 + B, ctx_len=ctx)
                    ks, _ = _kernels(ek, ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, sm_scale,
                                     {"fa3", "flashmla_vllm"}, num_splits=(0, 1))
                    fns = {n: graphed(fn) for n, (fn, *_r) in ks.items()}
                    samples = interleaved(fns, repeats=rounds, inner=1)
                    emit(samples, ks, "decode", B, H, ctx)
                    del fns, ks
                log(f"p{process} decode H={H} ctx={ctx}: done")
                torch.cuda.empty_cache()
    return sink.n


def main(argv=None) -> int:
    """``python -m mla_lab.measure.engine_kernels --engine-root .engine --out DIR/engine_kernels_pK.csv
    --process K [--rounds 5] [--parts check,prefill,decode]``."""
    ap = argparse.ArgumentParser(prog="python -m mla_lab.measure.engine_kernels")
    ap.add_argument("--engine-root", required=True, help="a folder packed by mla_lab.measure.engine_libs pack")
    ap.add_argument("--out", required=True, help="CSV to create (must not exist)")
    ap.add_argument("--process", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parts", default="check,prefill,decode")
    a = ap.parse_args(argv)
    parts = tuple(p for p in a.parts.split(",") if p)
    bad = set(parts) - {"check", "prefill", "decode", "content"}
    if bad:
        ap.error(f"--parts={a.parts} holds {sorted(bad)}; allowed: check, prefill, decode, content")
    if a.rounds < 1:
        ap.error(f"--rounds={a.rounds} must be >= 1")
    if Path(a.out).exists():
        ap.error(f"--out={a.out} exists: the experiment writes a new file only")
    if not Path(a.engine_root).is_dir():
        ap.error(f"--engine-root={a.engine_root} is not a folder: pack one with python -m "
                 "mla_lab.measure.engine_libs pack VLLM_WHEEL SGLANG_WHEEL OUT")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    n = run(a.engine_root, a.out, a.process, a.rounds, parts)
    print(f"wrote {n} rows to {a.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
