"""The engines' own sparse-MLA kernels on one GPU (issue 29): prefill, decode sizes, gather vs MMA, vLLM's
``concat_mla_q`` (calls: :func:`mla_lab.kernels.engine_libs.engine_calls`). Graph timing, round-robin, L2 flushed
(:func:`~mla_lab.measure.timer.interleaved`); each attention kernel first checked against the fp32 reference
(``check`` rows). ``H`` = the model's heads at TP 8, 4, 2, 1; prefill at the rank's step (``seed``, ``full_topk``),
decode at B x ctx_len. Parameters ``parts`` (``check,prefill,decode``; ``content``: zero vs stale padded heads into
``engine_kernels_content.csv``), ``rounds`` (5)."""

from __future__ import annotations

import torch

from mla_lab.kernels.engine_libs import TOPK, backend_names, engine_calls, engine_inputs, load
from mla_lab.kernels.reference import sparse_mla_prefill_ref
from mla_lab.measure.attention import sm_scale
from mla_lab.measure.sink import log
from mla_lab.measure.timer import graphed, interleaved

PREFILL_H = (8, 16, 32, 64)
DECODE_B = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: 1088: the PR's benchmark mid-decode (1024 prompt + 64 generated, fewer keys than topk); 8192: topk-bound
DECODE_CTX = (1088, 8192)
DECODE_H = (8, 16)
COLUMNS = ["experiment", "shape", "kernel", "kernel_backend", "T", "H", "h_q", "topk", "ctx_len", "num_splits",
           "round", "ms", "bytes", "max_abs_err", "engine_sources"]
OUTPUTS = {"engine_kernels.csv": COLUMNS, "engine_kernels_content.csv": COLUMNS}
#: (shape, H, B, ctx_len)
SHAPES = ([(s, H, None, None) for s in ("seed", "full_topk") for H in PREFILL_H]
          + [("decode", H, B, c) for H in DECODE_H for B in DECODE_B for c in DECODE_CTX])
_FAMILIES = ("fa3", "flashmla_vllm", "flashmla_ts", "sglang", "concat_vllm")


class _Run:
    """One process's state: the loaded libraries, the sink, the row writer."""

    def __init__(self, rank, sink, options):
        self.ek, self.sink, self.options = load(options.engine_root), sink, options
        self.names = backend_names(self.ek)
        try:
            from flash_mla import flash_mla_sparse_fwd as ts_fwd
        except ImportError:  # the tokenspeed build is optional beside the engine's own
            ts_fwd = None
        self.ts_fwd = ts_fwd
        m = rank.model
        self.sm_scale = sm_scale(m)
        self.T = rank.max_num_batched_tokens
        self.heads = sorted({m.num_attention_heads // t for t in (8, 4, 2, 1)})
        self.file = "engine_kernels.csv"

    def backend_of(self, kernel: str) -> str:
        key = next((k for k in _FAMILIES if kernel.startswith(k)), None)
        if key:
            return self.names[key]
        if kernel.startswith("copy"):
            return self.names["torch"]
        return self.names["lab"] if "lab" in kernel or "gather" in kernel else self.names["flashmla_vllm"]

    def write(self, row: dict) -> None:
        self.sink.write(self.file, {**row, "kernel_backend": self.backend_of(row["kernel"]), "topk": TOPK,
                                    "engine_sources": self.ek.sources.get("vllm_wheel", "")})

    def timed(self, shape, T, H, which, ctx_len="", num_splits=(0,), seed=0, drop=()):
        """Time the calls of ``which`` at one shape; one row per round and kernel."""
        inp = engine_inputs(T, H, "decode" if ctx_len else shape, seed, ctx_len or None)
        ks, _ = engine_calls(self.ek, self.ts_fwd, *inp, H, self.sm_scale, which, num_splits=num_splits)
        ks = {n: v for n, v in ks.items() if not n.startswith(drop)} if drop else ks
        rounds = 3 if self.options.smoke else self.options.param("rounds", 5)
        samples = interleaved({n: graphed(fn) for n, (fn, *_r) in ks.items()}, repeats=rounds)
        for name, xs in samples.items():
            _fn, h_q, ns, nbytes = ks[name]
            for r, ms in enumerate(xs):
                self.write({"experiment": "engine_kernels", "shape": shape, "kernel": name.split("@")[0], "T": T,
                            "H": H, "h_q": h_q, "ctx_len": ctx_len, "num_splits": ns, "round": r, "ms": ms,
                            "bytes": nbytes})
        log(f"p{self.options.process} {shape} T={T} H={H} {ctx_len}: " + ", ".join(
            f"{n}={sorted(v)[len(v) // 2]:.3f}" for n, v in samples.items()))
        torch.cuda.empty_cache()

    def check(self) -> None:
        """Each attention kernel on a small seed-like shape against the fp32 reference (max abs error)."""
        for H in (8, 64):
            ql_nope, q_pe, kv, idx, tlen = engine_inputs(2048, H, "seed", seed=123)
            ks, q = engine_calls(self.ek, self.ts_fwd, ql_nope, q_pe, kv, idx, tlen, H, self.sm_scale,
                                 {"fa3", "flashmla_vllm", "flashmla_ts", "sglang"}, num_splits=(0, 1))
            ref, _, _ = sparse_mla_prefill_ref(q, kv, idx.view(-1, 1, TOPK), self.sm_scale, 512, tlen)
            for name, (fn, h_q, ns, _) in ks.items():
                if name != "flashmla_ts_h128":
                    r = fn()
                    o = r[0] if isinstance(r, (tuple, list)) else r
                    err = (o[:, :H].float() - ref.float()).abs().max().item()
                    log(f"check H={H} {name}: max abs err {err:.3e}")
                    self.write({"experiment": "check", "shape": "seed2048", "kernel": name.split("@")[0],
                                "T": 2048, "H": H, "h_q": h_q, "num_splits": ns, "max_abs_err": err})
            del ks
            torch.cuda.empty_cache()


def _content(x, heads) -> None:
    x.file = "engine_kernels_content.csv"
    for shape in ("seed", "full_topk"):
        for H in heads[:2]:
            x.timed(shape, x.T, H, {"fa3", "flashmla_vllm", "flashmla_ts", "content", "concat"},
                    seed=x.options.process * 100 + H, drop=("concat", "copy"))
    x.file = "engine_kernels.csv"


def _prefill(x, heads) -> None:
    for shape in ("seed", "full_topk"):
        for H in heads:
            x.timed(shape, x.T, H, {"fa3", "flashmla_vllm", "flashmla_ts", "sglang", "gather", "concat"},
                    seed=x.options.process * 100 + H)


def _decode(x, heads) -> None:
    smoke = x.options.smoke
    for H in heads[:2]:
        for ctx in DECODE_CTX[:1] if smoke else DECODE_CTX:
            for B in (1, 16) if smoke else DECODE_B:
                x.timed("decode", B, H, {"fa3", "flashmla_vllm"}, ctx_len=ctx, num_splits=(0, 1),
                        seed=x.options.process * 1000 + B)


_PARTS = {"check": lambda x, heads: x.check(), "content": _content, "prefill": _prefill, "decode": _decode}


def run(rank, sink, options) -> None:
    """The parts of ``parts`` (smoke: H 8, decode B 1 and 16, one context). Raises FileNotFoundError / RuntimeError: the
    packed engine kernels missing or failing (:func:`mla_lab.kernels.engine_libs.load`); ValueError: an unknown part."""
    parts = options.param("parts", ("check", "prefill", "decode"))
    bad = set(parts) - set(_PARTS)
    if bad:
        raise ValueError(f"--param parts={','.join(parts)} holds {sorted(bad)}; allowed: {', '.join(_PARTS)}")
    x = _Run(rank, sink, options)
    for part in _PARTS:  # in this order
        if part in parts:
            _PARTS[part](x, x.heads[:1] if options.smoke else x.heads)
