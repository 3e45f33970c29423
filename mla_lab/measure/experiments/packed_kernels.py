"""The packed kernel (g = H' / H tokens x H heads per tile) beside every engine's sparse-MLA prefill kernel (issue
36): graph timing, round-robin, L2 flushed (:func:`mla_lab.measure.timer.interleaved`), parameter ``rounds`` (5);
random bf16 q / kv at the rank's T and H, topk (``index_topk``, config.json), index sets from
:mod:`mla_lab.kernels.index_sets`. Shapes (``shapes``): ``seed`` (1024-token causal prompts), ``o<x>`` (pairwise
overlap x, s_kv 4 T), ``ctx<n>`` (topk random keys of n), ``structured`` (window + Toeplitz + content, 2 T).
Kernels: ``packed`` (union build + kernel), ``packed_kernel`` (sets built before), ``union_build`` (``builder``),
``packed_triton``, ``flashmla_bound`` (FlashMLA on T / g rows of H' heads, topk = U: the bound), the engines'
(``flashmla_ts_pad64[_zeros]``, ``flashmla_vllm_pad64``, ``fa3_sparse``, ``sglang_triton[_union4]``: vLLM 0.33.0,
SGLang 0.5.23, tokenspeed-flashmla) and ``dispatched`` (:func:`mla_lab.kernels.packed.choose_path`, ``path``).
``U`` / ``S``: mean union / shared size per group over topk; ``max_abs_err``: ``check`` rows vs the fp32 reference.
"""

from __future__ import annotations

import zlib

import torch

from mla_lab.kernels import index_sets as ix
from mla_lab.kernels.engine_libs import backend_names, engine_calls, load
from mla_lab.kernels.packed import choose_path, full_union, packed_sparse_prefill, rest_config, sample_sets
from mla_lab.kernels.reference import sparse_mla_prefill_ref
from mla_lab.kernels.union import build_union, build_union_ref
from mla_lab.kernels.union_cuda import build_union_cuda, union_mismatch
from mla_lab.measure.attention import sm_scale as scale_of
from mla_lab.measure.sink import log
from mla_lab.measure.timer import graphed, interleaved

from ._common import PROMPT

OVERLAPS = (1.0, 0.9, 0.8, 0.6, 0.4, 0.2, 0.0)
CONTEXTS = (4096, 8192, 32768, 131072)
OUTPUTS = {"packed_kernels.csv": ["experiment", "shape", "kernel", "kernel_backend", "builder", "path", "T", "H",
                                  "topk", "s_kv", "U", "S", "round", "ms", "max_abs_err", "engine_sources"]}
#: (shape, s_kv) on the seed rank (T 16384: s_kv 4 T for the overlaps, 2 T structured)
SHAPES = ([("seed", None)] + [(f"o{o}", 65536) for o in OVERLAPS] + [(f"ctx{c}", c) for c in CONTEXTS]
          + [("structured", 32768)])
_BUILT = ("packed", "packed_kernel", "union_build", "dispatched")


def _index_data(shape: str, T: int, topk: int, g: int, seed: int):
    if shape == "seed":
        return ix.causal_indices([PROMPT] * (T // PROMPT), topk, seed=seed, device="cuda")
    if shape.startswith("o"):  # overlap 0: the random baseline topk / s_kv (the model's floor)
        return ix.overlap_indices(T, topk, 4 * T, max(float(shape[1:]), topk / (4 * T)), g, seed=seed, device="cuda")
    if shape.startswith("ctx"):  # random top-k of an n-key context: the baseline overlap topk / n
        n = int(shape[3:])
        return ix.overlap_indices(T, topk, n, topk / n, g, seed=seed, device="cuda")
    return ix.structured_indices(T, topk, s_kv=2 * T, seed=seed, device="cuda")


def _builder(topk, g):
    """``(name, build)``: the CUDA builder where it compiles and matches the reference on a small case, else
    Triton's."""
    try:
        d = ix.overlap_indices(1024, topk, 65536, 0.8, g, seed=5, device="cuda")
        bad = union_mismatch(build_union_cuda(d.indices, d.topk_length, g, d.s_kv),
                             build_union_ref(d.indices, d.topk_length, g, d.s_kv))
        torch.cuda.synchronize()
        if bad is None:
            return "cuda", build_union_cuda
        log(f"CUDA union builder differs from the reference ({bad}): using the Triton builder")
    except Exception as e:  # noqa: BLE001 - the CUDA builder is optional (needs nvcc); the Triton one always runs
        log(f"CUDA union builder unavailable ({type(e).__name__}: {str(e)[:200]}): using the Triton builder")
    return "triton", build_union


def _check(build, sm_scale, Hp) -> list[dict]:
    """The packed kernel (both modes) against the fp32 reference: request boundaries inside groups, a partial last
    group, tokens with no valid key."""
    rows = []
    for H in (8, 16, 32):
        d = ix.causal_indices([37, 300, 5, 700], 256, seed=H, device="cuda")
        idx, tlen = d.indices.clone(), d.topk_length.clone()
        tlen[10], idx[11] = 0, -1
        T = idx.shape[0]
        q = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(d.s_kv, 1, 576, device="cuda", dtype=torch.bfloat16)
        sets = build(idx, tlen, Hp // H, d.s_kv)
        ref, _, _ = sparse_mla_prefill_ref(q, kv, idx.view(T, 1, -1), sm_scale, 512, tlen)
        for mode in ("hybrid", "triton"):
            err = (packed_sparse_prefill(q, kv, sets, sm_scale, mode=mode)[0].float() - ref.float()).abs().max().item()
            log(f"check H={H} {mode}: max abs err {err:.3e}")
            rows.append({"experiment": "check", "shape": "boundaries", "kernel": f"packed_{mode}", "T": T, "H": H,
                         "topk": 256, "s_kv": d.s_kv, "max_abs_err": err})
    return rows


def _engine_calls(ek, ts_fwd, d, q, kv, sm_scale) -> dict:
    """``{kernel: (callable, backend family)}`` of the engines' kernels on one shape."""
    ks, _ = engine_calls(ek, ts_fwd, q[..., :512], q[..., 512:], kv, d.indices, d.topk_length, q.shape[1], sm_scale,
                         {"fa3", "flashmla_vllm", "flashmla_ts", "sglang"}, q=q)
    fam = {"flashmla_vllm_pad64": "flashmla_vllm", "flashmla_ts_pad64": "flashmla_ts", "sglang_triton": "sglang",
           "fa3_sparse": "fa3"}
    out = {n.split("@")[0]: (fn, fam[n.split("@")[0]]) for n, (fn, *_r) in ks.items() if n.split("@")[0] in fam}
    if ek.sglang_sparse_mla_prefill is not None:
        out["sglang_triton_union4"] = (lambda: ek.sglang_sparse_mla_prefill(q, kv, d.indices, sm_scale, 512, union=4),
                                       "sglang_union4")
    return out


def _packed_calls(ts_fwd, build, d, q, kv, sm_scale, Hp) -> tuple[dict, float, float]:
    """``({kernel: (callable, backend family or the dispatched path)}, U, S)`` of the packed paths on one shape."""
    T, H = q.shape[:2]
    g, idx, tlen, s_kv = Hp // H, d.indices, d.topk_length, d.s_kv
    sets = build(idx, tlen, g, s_kv)
    cfg, cfg_t = rest_config(sets.rest_len.float().mean().item()), rest_config(sets.union_len.float().mean().item())
    full, G = full_union(sets), sets.num_groups
    q_pad = torch.zeros(T, Hp, 576, device="cuda", dtype=torch.bfloat16)  # the fallback's padded Q: zero heads
    q_pad[:, :H] = q
    padded = lambda: ts_fwd(q_pad, kv, idx.view(T, 1, -1), sm_scale, 512, topk_length=tlen)  # noqa: E731
    hybrid = lambda s: packed_sparse_prefill(q, kv, s, sm_scale, mode="hybrid", flash_fwd=ts_fwd, config=cfg)  # noqa
    smp, stride = sample_sets(idx, tlen, g, s_kv, builder=build)
    path, _ = choose_path(smp, stride, T, idx.shape[1], float(tlen.double().sum().item()))
    rows = (torch.arange(0, G, stride, device="cuda")[:, None] * g + torch.arange(g, device="cuda")).reshape(-1)
    idx_s, tl_s = idx[rows].contiguous(), tlen[rows].contiguous()

    def dispatched():
        build(idx_s, tl_s, g, s_kv)
        if path == "padded":
            return padded()
        s = build(idx, tlen, g, s_kv, out=sets)
        return hybrid(s) if path == "packed" else packed_sparse_prefill(q, kv, s, sm_scale, mode="triton", config=cfg_t)

    out = {"packed": (lambda: hybrid(build(idx, tlen, g, s_kv, out=sets)), "packed"),
           "packed_kernel": (lambda: hybrid(sets), "packed"),
           "union_build": (lambda: build(idx, tlen, g, s_kv, out=sets), "packed"),
           "packed_triton": (lambda: packed_sparse_prefill(q, kv, sets, sm_scale, mode="triton", config=cfg_t),
                             "packed"),
           "flashmla_bound": (lambda: ts_fwd(q.view(G, Hp, 576), kv, full[0].view(G, 1, -1), sm_scale, 512,
                                             topk_length=full[2]), "flashmla_ts"),
           "flashmla_ts_pad64_zeros": (padded, "flashmla_ts"), "dispatched": (dispatched, path)}
    mean = lambda x: x.float().mean().item() / idx.shape[1]  # noqa: E731
    return out, mean(sets.union_len), mean(sets.shared_len)


def run(rank, sink, options) -> None:
    """Every shape of :data:`SHAPES` (smoke: seed and o0.8, 2 rounds). Raises ImportError / RuntimeError /
    FileNotFoundError: no flash_mla, the packed engine kernels missing or failing."""
    from flash_mla import flash_mla_sparse_fwd as ts_fwd

    shapes = ("seed", "o0.8") if options.smoke else tuple(s for s, _ in SHAPES)
    rounds = 2 if options.smoke else options.param("rounds", 5)
    T, H, Hp, topk, sm_scale = (rank.max_num_batched_tokens, rank.num_heads, rank.padded_num_heads, rank.model.topk,
                                scale_of(rank.model))
    ek = load(options.engine_root, need_concat=False)
    names, (bname, build) = backend_names(ek), _builder(topk, Hp // H)
    names.update(sglang_union4=names["sglang"] + " union=4", packed=f"mla_lab packed (triton rest + "
                 f"{names['flashmla_ts']})")
    src = ek.sources.get("vllm_wheel", "")
    for row in _check(build, sm_scale, Hp):
        sink.write("packed_kernels.csv", {**row, "kernel_backend": names["packed"], "builder": bname,
                                          "engine_sources": src})
    for shape in shapes:
        d = _index_data(shape, T, topk, Hp // H, seed=options.process * 1000 + zlib.crc32(shape.encode()) % 997)
        q = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(d.s_kv, 1, 576, device="cuda", dtype=torch.bfloat16)
        ks, U, S = _packed_calls(ts_fwd, build, d, q, kv, sm_scale, Hp)
        ks = {**_engine_calls(ek, ts_fwd, d, q, kv, sm_scale), **ks}
        samples = interleaved({n: graphed(fn) for n, (fn, _) in ks.items()}, repeats=rounds)
        for n, xs in samples.items():
            fam = ks[n][1]
            for r, ms in enumerate(xs):
                sink.write("packed_kernels.csv", {
                    "experiment": "packed_kernels", "shape": shape, "kernel": n, "path": fam if n == "dispatched"
                    else "", "kernel_backend": names.get(fam, names["packed"]), "builder": bname if n in _BUILT
                    else "", "T": T, "H": H, "topk": topk, "s_kv": d.s_kv, "U": round(U, 4), "S": round(S, 4),
                    "round": r, "ms": ms, "engine_sources": src})
        log(f"p{options.process} {shape} U={U:.2f} S={S:.2f}: " + ", ".join(
            f"{n}={sorted(v)[len(v) // 2]:.3f}" for n, v in samples.items()))
        del ks, samples, q, kv, d
        torch.cuda.empty_cache()
