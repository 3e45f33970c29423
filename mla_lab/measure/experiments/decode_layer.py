"""GPU round 2, serving / decode: per-rank decode layer time with the bf16 sparse kernel's 64-head padding.

:meth:`mla_lab.measure.layer.Layer.e2e` models one causal prompt of T tokens (indexer logits [T, T], full
top-k, random indices); a decode batch of B tokens each with its own context c does not map onto it (its
indexer reads c cached keys per token, its kernel sees topk_length = min(c, 2048) keys of the token's own
request). So this script builds a decode layer of its own from the package's pieces:
:class:`mla_lab.measure.layer.Layer`'s weights (q/kv projections, W_UK / W_UV, indexer projections, o_proj,
router, EP experts, shared expert), the Triton RMSNorm and SiLU*mul kernels and the causal indexer kernel
(prefill part of mixed steps) of :mod:`mla_lab.measure.triton_ops`, :func:`mla_lab.measure.timer.graphed` and
:func:`~mla_lab.measure.timer.timed_window`; plus a
decode indexer-logits Triton kernel defined here (B x c, no causal mask) and the lab's ``concat_mla_q``. The
sparse kernel is ``flash_mla.flash_mla_sparse_fwd`` (vLLM sends every token of a bf16-KV-cache step through it,
decode included: vLLM mla_attention.py sends every token down the sparse path).

Decode layer per rank (MoE layer, TP8 attention, experts EP8, no communication, KV-cache write and RoPE not
timed): input RMSNorm (fused add) -> q_a_proj -> RMSNorm -> q_b_proj; kv_a_proj -> RMSNorm; W_UK bmm; indexer q /
k / weights projections, decode logits over the request's c cached indexer keys, top-k (k = min(c, 2048)),
local -> global slot indices; attention (strategy, :data:`STRATEGIES`): ``per_call_zeros`` = concat into an
[B, H, 576] buffer + ``new_zeros((B, 64, 576))`` + copy (the first version's rows: ``unfused``),
``private_workspace`` = concat into the zero-initialised padded workspace (``fused``); FlashMLA
sparse kernel (topk_length = min(c, 2048), indices from the top-k above); W_UV bmm on ``out[:, :H]`` (a view);
o_proj; RMSNorm; router; routed experts as ``bmm`` over the *active* local experts (expected distinct experts hit
by B x 8 routed pairs among 256, EP8 -> 32 local; tokens per active expert = ceil(pairs / active)); SiLU*mul;
down bmm; sum; shared expert (TP-sharded).

Outputs (CSV rows appended as measured; provenance columns on each; ``strategy`` canonical, ``content`` what the
padded heads held, zeros for both paths):
- ``decode_layer.csv``: the layer per (model, B, c, strategy, mode): ``eager`` and ``graph`` (CUDA-graph replay,
  as vLLM's UNIFORM_BATCH full graphs); mixed steps (a prefill chunk of 2048 or 8192 tokens of one new prompt +
  32 decode tokens at context 4096), eager (vLLM runs mixed batches piecewise, attention eager).
- ``decode_attn.csv``: the attention path alone (concat [+ pad] + kernel) per (model, B, c, strategy), eager
  and graph.
- ``decode_ops.csv``: every op of the decode layer alone (graph replay of ``--op-inner`` back-to-back calls,
  device time per call), per (model, B) and, for the ops that depend on it, per c.
>= 5 repeats, strategies interleaved (order flipped every repeat). ``--smoke``: tiny model on CPU (Triton
interpreter, float32, reference kernel) or GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from mla_lab import kernels as K
from mla_lab.measure.layer import Layer, tiny_model
from mla_lab.measure.record import CsvSink, NvmlSampler, bench_provenance
from mla_lab.measure.timer import est_ms, graphed, timed_window
from mla_lab.measure.triton_ops import mqa_logits, rmsnorm, silu_mul
from mla_lab.models import load_model
from mla_lab.paths import REPO_ROOT as REPO
from mla_lab.placement import parse_strategy

T0 = time.time()
D_NOPE, D_PE, D_QK, D_V, HP = 512, 64, 576, 512, 64
#: The attention paths timed: a new_zeros pad per call, the private padded workspace (the first version's rows
#: label them unfused / fused: mla_lab.placement.measured_as).
STRATEGIES = ("per_call_zeros", "private_workspace")


def log(*a):
    print(f"[{time.time() - T0:7.1f}s] " + " ".join(str(x) for x in a), flush=True)


def sync(dev):
    if dev == "cuda":
        import torch

        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------- kernels

DEC = {}


def define_decode_logits():
    import triton
    import triton.language as tl

    @triton.jit
    def dec_logits_kernel(q_ptr, k_ptr, w_ptr, o_ptr, C, sq_b, sq_h, sk_b, sk_s, sw_b, so_b,
                          NH: tl.constexpr, NHP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr):
        # logits[b, s] = sum_h w[b, h] * relu(q[b, h, :] . k[b, s, :]) over the request's C cached keys
        b = tl.program_id(0).to(tl.int64)
        n0 = tl.program_id(1) * BN
        offs_h = tl.arange(0, NHP)
        offs_d = tl.arange(0, D)
        offs_n = n0 + tl.arange(0, BN)
        hm = offs_h < NH
        nm = offs_n < C
        q = tl.load(q_ptr + b * sq_b + offs_h[:, None] * sq_h + offs_d[None, :], mask=hm[:, None], other=0.0)
        k = tl.load(k_ptr + b * sk_b + offs_n[:, None] * sk_s + offs_d[None, :], mask=nm[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k))
        w = tl.load(w_ptr + b * sw_b + offs_h, mask=hm, other=0.0)
        acc = tl.sum(tl.maximum(s, 0.0) * w[:, None], axis=0)
        tl.store(o_ptr + b * so_b + offs_n, acc, mask=nm)

    DEC["k"] = dec_logits_kernel
    DEC["triton"] = triton


def decode_logits(q, kc, w, out, interp=False):
    """q [B, NH, D], kc [B, C, D] (the requests' cached indexer keys), w [B, NH] fp32 -> out [B, C] fp32."""
    triton = DEC["triton"]
    B, NH, D = q.shape
    C = kc.shape[1]
    BN = 16 if interp else 64
    NHP = max(16, triton.next_power_of_2(NH))
    DEC["k"][(B, triton.cdiv(C, BN))](q, kc, w, out, C, q.stride(0), q.stride(1), kc.stride(0), kc.stride(1),
                                      w.stride(0), out.stride(0), NH=NH, NHP=NHP, D=D, BN=BN,
                                      **({} if interp else {"num_warps": 4}))
    return out


class Kernels:
    def __init__(self, dev):
        import torch

        self.dev, self.torch = dev, torch
        self.info, self.K, self._fm = {"available": False, "reason": "not probed"}, None, None
        try:

            self.K, self.info = K, K.flash_mla_info()
            self.concat_impl = "mla_lab.kernels.concat_mla_q(" + ("triton" if dev == "cuda" else "torch") + ")"
        except Exception as e:
            log(f"mla_lab.kernels import failed ({type(e).__name__}: {e}); torch copy_ concat")
            self.concat_impl = "torch copy_ (fallback)"
        if dev == "cuda":
            import flash_mla

            self._fm = flash_mla.flash_mla_sparse_fwd
            self.kernel_impl = "flash_mla.flash_mla_sparse_fwd"
        else:
            self.kernel_impl = "mla_lab.kernels.sparse_mla_prefill(reference)"

    def concat(self, qn, qp, out):
        if self.K is not None and qn.dtype in (self.torch.bfloat16, self.torch.float16):
            return self.K.concat_mla_q(qn, qp, out, backend="triton" if self.dev == "cuda" else "torch")
        H = qn.shape[1]
        out[:, :H, :D_NOPE].copy_(qn)
        out[:, :H, D_NOPE:].copy_(qp)
        return out

    def kernel(self, q, kv, idx, sm, topk_length=None):
        if self._fm is not None:
            return self._fm(q, kv, idx, sm, d_v=D_V, topk_length=topk_length)[0]
        return self.K.sparse_mla_prefill(q, kv, idx, sm, d_v=D_V, topk_length=topk_length,
                                         backend="reference")[0].to(q.dtype)


# ----------------------------------------------------------------------------------------------- the layer


def active_experts(B_tokens, model, ep):
    """Expected distinct local experts hit by B x k routed pairs (uniform routing), and tokens per active one."""
    E, k = model.n_routed_experts, model.num_experts_per_tok
    e_loc = E // ep
    pairs = max(1, round(B_tokens * k / ep))
    n_act = e_loc * (1 - (1 - 1 / E) ** (B_tokens * k))
    n_act = max(1, min(e_loc, int(round(n_act))))
    return n_act, math.ceil(pairs / n_act), pairs



# ------------------------------------------------------------------------------------- the package's pieces


def package():
    """The package's layer pieces, imported after ``TRITON_INTERPRET`` is set (CPU runs; triton reads it at import):
    ``Layer``, ``tiny_model``, ``rmsnorm``, ``silu_mul``, ``mqa_logits``, ``load_model``."""

    return SimpleNamespace(Layer=Layer, tiny_model=tiny_model, rmsnorm=rmsnorm, silu_mul=silu_mul,
                           mqa_logits=mqa_logits, load_model=load_model,
                           impl="mla_lab.measure.layer.Layer weights; mla_lab.measure.triton_ops "
                                "rmsnorm/silu_mul/mqa_logits")


class LayerWeights:
    """The weights and Q workspaces of one per-rank layer (:class:`mla_lab.measure.layer.Layer`, EP experts; the
    private workspace's padded heads zero)."""

    def __init__(self, kit, model, tp, ep, dev, dtype, max_T, interp):
        L = kit.Layer(model, tp, "h200", dev, dtype, max_T, None, None, interp, [("ep", ep)], content="zeros")
        self.H, self.Hp = L.H, L.Hp
        self.W, self.norm = L.weights, L.norm_weights
        self.moe = L.moe_weights[("ep", ep)]
        self.W_UK, self.W_UV = L.W_UK, L.W_UV
        self.ws_unfused, self.ws_fused = L.workspace_unfused, L.workspace_fused
        self.rnd = L.random_tensor
        self.impl = kit.impl
        self._L = L


class DecodeLayer:
    """One per-rank MoE decode layer over a shared weight set (bench_layer.Layer's) and shared KV caches."""

    def __init__(self, kit, model, tp, ep, dev, dtype, kern, max_T, max_rows, interp):
        import torch

        self.torch, self.kit, self.m, self.tp, self.ep = torch, kit, model, tp, ep
        self.dev, self.dtype, self.kern, self.interp = dev, dtype, kern, interp
        self.L = L = LayerWeights(kit, model, tp, ep, dev, dtype, max_T, interp)
        self.layer_impl = L.impl
        self.H, self.Hp = L.H, L.Hp
        assert self.Hp == HP, (self.H, self.Hp)
        g = torch.Generator(device=dev).manual_seed(5)
        # the KV cache (MLA latent, 576 per token) and the indexer key cache of all requests, [rows, ...]
        self.kv_all = torch.randn(max_rows, 1, D_QK, device=dev, dtype=dtype, generator=g)
        self.ik_all = torch.randn(max_rows, model.index_head_dim, device=dev, dtype=dtype, generator=g)
        self.sm = D_QK ** -0.5
        self.g = g

    def state(self, Bd, c, P=0):
        """Inputs and buffers for a step of P prefill tokens (one new prompt, kv rows 0..P-1) + Bd decode tokens
        with context c each (request b's cached rows P + b*c .. P + b*c + c - 1)."""
        torch, m, L, dev, dt = self.torch, self.m, self.L, self.dev, self.dtype
        T = P + Bd
        h, qr, kr = m.hidden_size, m.q_lora_rank, m.kv_lora_rank
        S = SimpleNamespace(T=T, Bd=Bd, c=c, P=P)
        S.x = L.rnd(T, h, k=1)
        S.res = L.rnd(T, h, k=1)
        S.xn = torch.empty_like(S.x)
        S.yn = torch.empty_like(S.x)
        S.qa_n = torch.empty(T, qr, device=dev, dtype=dt)
        S.kvn = torch.empty(T, kr, device=dev, dtype=dt)
        S.attn = torch.empty(T, self.H * m.v_head_dim, device=dev, dtype=dt)
        S.k_dec = min(c, m.topk) if Bd else 0
        rows = P + Bd * c
        S.kv = self.kv_all[:rows]
        if Bd:
            S.kc = self.ik_all[P:P + Bd * c].view(Bd, c, -1)
            S.logits = torch.empty(Bd, c, device=dev, dtype=torch.float32)
            S.base = (P + torch.arange(Bd, device=dev, dtype=torch.int64) * c)
        if P:
            S.logits_p = torch.full((P, P), float("-inf"), device=dev, dtype=torch.float32)
        width = m.topk if P else S.k_dec
        parts_i, parts_l = [], []
        if P:  # one causal prompt of P tokens: the last min(p+1, topk) keys
            p = torch.arange(P, device=dev)
            tl_ = torch.clamp(p + 1, max=m.topk)
            ar = torch.arange(width, device=dev)
            ii = (p + 1 - tl_)[:, None] + ar[None, :]
            parts_i.append(torch.where(ar[None, :] < tl_[:, None], ii, torch.full_like(ii, -1)))
            parts_l.append(tl_)
        if Bd:  # random distinct keys of the request's own context (what a top-k over random logits gives)
            loc = torch.rand(Bd, c, device=dev, generator=self.g).topk(S.k_dec, dim=-1).indices
            ii = loc + S.base[:, None]
            if width > S.k_dec:
                ii = torch.cat([ii, torch.full((Bd, width - S.k_dec), -1, device=dev, dtype=ii.dtype)], 1)
            parts_i.append(ii)
            parts_l.append(torch.full((Bd,), S.k_dec, device=dev, dtype=torch.int64))
        S.idx_fixed = torch.cat(parts_i, 0).to(torch.int32).view(T, 1, width).contiguous()
        S.topk_length = torch.cat(parts_l, 0).to(torch.int32).contiguous()
        # MoE: active local experts
        n_act, M_e, pairs = active_experts(T, m, self.ep)
        w13, w2 = L.moe
        S.n_act, S.M_e, S.pairs = n_act, M_e, pairs
        S.w13a, S.w2a = w13[:n_act], w2[:n_act]
        S.xe = L.rnd(n_act, M_e, h, k=1)
        S.act = torch.empty(n_act * M_e, w13.shape[1] // 2, device=dev, dtype=dt)
        S.kloc = max(1, pairs // T)
        S.pairs_used = S.kloc * T
        if "shared_gate_up" in L.W:
            S.sh_a = torch.empty(T, L.W["shared_gate_up"].shape[0] // 2, device=dev, dtype=dt)
        return S

    def steps(self, S, strategy, use_topk_indices=True):
        """[(name, fn, c_dependent)] of the layer; running them in order is the layer."""
        import torch.nn.functional as F

        torch, BL, m, L, kern = self.torch, self.kit, self.m, self.L, self.kern
        W, nw = L.W, L.norm
        T, Bd, P = S.T, S.Bd, S.P
        H, Hp = self.H, self.Hp
        h, qr, kr = m.hidden_size, m.q_lora_rank, m.kv_lora_rank
        dn, dv, nih, dih = m.qk_nope_head_dim, m.v_head_dim, m.index_n_heads, m.index_head_dim
        interp = self.interp
        st = []

        def add(name, dep=False):
            def deco(f):
                st.append((name, f, dep))
                return f
            return deco

        @add("input_norm")
        def _():
            BL.rmsnorm(S.x, nw[h], S.xn, residual=S.res)

        @add("q_a_proj")
        def _():
            S.qa = F.linear(S.xn, W["q_a_proj"])

        @add("q_a_norm")
        def _():
            BL.rmsnorm(S.qa, nw[qr], S.qa_n)

        @add("q_b_proj")
        def _():
            S.q = F.linear(S.qa_n, W["q_b_proj"]).view(T, H, -1)

        @add("kv_a_proj")
        def _():
            S.kva = F.linear(S.xn, W["kv_a_proj"])

        @add("kv_a_norm")
        def _():
            BL.rmsnorm(S.kva[:, :kr], nw[kr], S.kvn)

        @add("w_uk_bmm")
        def _():
            S.ql_nope = torch.bmm(S.q[..., :dn].transpose(0, 1), L.W_UK).transpose(0, 1)

        @add("idx_q_proj")
        def _():
            S.iq = F.linear(S.qa_n, W["idx_wq_b"]).view(T, nih, dih)

        @add("idx_k_proj")
        def _():
            S.ik = F.linear(S.xn, W["idx_wk"])

        @add("idx_weights_proj")
        def _():
            S.iw = F.linear(S.xn, W["idx_weights_proj"]).float()

        if P:
            @add("idx_logits_prefill", True)
            def _():
                BL.mqa_logits(S.iq[:P], S.ik[:P], S.iw[:P], S.logits_p, interp)

            @add("idx_topk_prefill", True)
            def _():
                S.tk_p = torch.topk(S.logits_p, min(P, m.topk), dim=-1, sorted=False).indices
        if Bd:
            @add("idx_logits_decode", True)
            def _():
                decode_logits(S.iq[P:], S.kc, S.iw[P:], S.logits, interp)

            @add("idx_topk_decode", True)
            def _():
                S.tk = torch.topk(S.logits, S.k_dec, dim=-1, sorted=False).indices

            @add("idx_to_global", True)
            def _():
                S.gidx_t = (S.tk + S.base[:, None]).to(torch.int32).view(Bd, 1, S.k_dec)
        # attention path
        if parse_strategy(strategy).per_call_pad:
            buf = L.ws_unfused[:T]

            @add("concat_unfused")
            def _():
                kern.concat(S.ql_nope, S.q[..., dn:], buf)

            @add("pad_new_zeros_copy")
            def _():
                qk = buf.new_zeros((T, Hp, D_QK))
                qk[:, :H] = buf
                S.qk = qk
        else:
            ws = L.ws_fused[:T]

            @add("concat_fused")
            def _():
                kern.concat(S.ql_nope, S.q[..., dn:], ws)
                S.qk = ws

        # pure decode: the kernel reads the indexer's top-k (global slots); mixed steps and the attention path
        # alone read the fixed indices built in state() (same pattern)
        topk_idx = use_topk_indices and Bd and not P

        @add("sparse_kernel", True)
        def _():
            S.o = kern.kernel(S.qk, S.kv, S.gidx_t if topk_idx else S.idx_fixed, self.sm, S.topk_length)[:, :H]

        @add("w_uv_bmm")
        def _():
            torch.bmm(S.o.transpose(0, 1), L.W_UV, out=S.attn.view(T, H, dv).transpose(0, 1))

        @add("o_proj")
        def _():
            S.y = F.linear(S.attn, W["o_proj"])

        @add("post_attn_norm")
        def _():
            BL.rmsnorm(S.y, nw[h], S.yn, residual=S.res)

        @add("router")
        def _():
            S.rl = F.linear(S.yn, W["router"])

        @add("moe_gate_up")
        def _():
            S.h1 = torch.bmm(S.xe, S.w13a.transpose(1, 2))

        @add("moe_silu_mul")
        def _():
            BL.silu_mul(S.h1.view(S.n_act * S.M_e, -1), S.act)

        @add("moe_down")
        def _():
            S.h2 = torch.bmm(S.act.view(S.n_act, S.M_e, -1), S.w2a.transpose(1, 2))

        @add("moe_sum")
        def _():
            S.routed = S.h2.view(-1, h)[: S.pairs_used].view(T, S.kloc, h).sum(1)

        if "shared_gate_up" in W:
            @add("shared_gate_up")
            def _():
                S.g = F.linear(S.yn, W["shared_gate_up"])

            @add("shared_silu_mul")
            def _():
                BL.silu_mul(S.g, S.sh_a)

            @add("shared_down")
            def _():
                S.sh = F.linear(S.sh_a, W["shared_down"])
        return st


def as_fn(steps, names=None):
    fs = [f for n, f, _ in steps if names is None or n in names]

    def run():
        for f in fs:
            f()
    return run


# ---------------------------------------------------------------------------------------------------- main

LAYER_COLS = ["experiment", "model", "tp", "ep", "H", "Hp", "batch", "context", "prefill_tokens", "decode_tokens",
              "T_total", "topk_length_decode", "strategy", "content", "mode", "repeat", "order", "n_calls", "ms_median",
              "ms_mean", "ms_p10", "ms_p90", "window_s", "n_act_experts", "tokens_per_expert", "sm_clock_mhz",
              "power_w", "temp_c", "n_samples", "layer_impl", "concat_impl", "kernel_impl", "status", "notes"]
OPS_COLS = ["experiment", "model", "tp", "ep", "H", "Hp", "batch", "context", "op", "strategy", "content",
            "c_dependent",
            "repeat", "inner", "ms", "status"]


#: Files and their row columns (plus :func:`mla_lab.measure.record.bench_provenance`'s columns).
OUTPUTS = {"decode_layer.csv": LAYER_COLS, "decode_attn.csv": LAYER_COLS, "decode_ops.csv": OPS_COLS}
PROVENANCE = ("gpu", "sm", "driver", "cuda", "torch", "triton", "flash_mla", "git_commit", "date_utc")
#: (model, batch, context): the default --batches x --contexts per model (the mixed steps beside them).
SHAPES = [(m, B, c) for m in ("glm-5", "deepseek-v3.2") for B in (1, 4, 16, 64, 128, 256) for c in (1024, 4096, 8192)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--models", default="glm-5,deepseek-v3.2")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--batches", default="1,4,16,64,128,256")
    ap.add_argument("--contexts", default="1024,4096,8192")
    ap.add_argument("--mixed-prefill", default="2048,8192")
    ap.add_argument("--mixed-decode", type=int, default=32)
    ap.add_argument("--mixed-context", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--window-ms", type=float, default=15.0)
    ap.add_argument("--op-inner", type=int, default=10)
    ap.add_argument("--op-repeats", type=int, default=5)
    ap.add_argument("--no-ops", action="store_true", help="skip the per-op table")
    ap.add_argument("--budget-s", type=float, default=160.0)
    args = ap.parse_args(argv)
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.smoke:
        ap.error("no CUDA GPU: use --smoke on CPU")
    interp = dev == "cpu"
    if interp:
        os.environ["TRITON_INTERPRET"] = "1"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    kit = package()
    define_decode_logits()
    kern = Kernels(dev)
    prov = bench_provenance(kern.info)
    sampler = NvmlSampler(0.02)
    out = Path(args.out) if args.out else (Path("/tmp/bench_decode_smoke") if args.smoke
                                           else REPO / "data/measured/h200/round2")
    out.mkdir(parents=True, exist_ok=True)
    log(f"device={prov['gpu']} torch={prov['torch']} triton={prov['triton']} flash_mla={prov['flash_mla']} "
        f"commit={prov['git_commit']} concat={kern.concat_impl} kernel={kern.kernel_impl} "
        f"nvml={'ok' if sampler.ok else sampler.why}")
    deadline = T0 + args.budget_s
    if args.smoke:
        models = [("tiny", kit.tiny_model())]
        tp, Bs, Cs, Ps, mdec, mctx = 2, [1, 4], [128, 256], [64], 4, 128
        args.repeats, args.op_repeats, args.window_ms, args.op_inner = 2, 2, 1.0, 2
    else:
        models = [(n, kit.load_model(n)) for n in args.models.split(",")]
        tp = args.tp
        Bs = [int(x) for x in args.batches.split(",")]
        Cs = [int(x) for x in args.contexts.split(",")]
        Ps = [int(x) for x in args.mixed_prefill.split(",") if x]
        mdec, mctx = args.mixed_decode, args.mixed_context
    sink_l = CsvSink(out / "decode_layer.csv", LAYER_COLS, prov)
    sink_a = CsvSink(out / "decode_attn.csv", LAYER_COLS, prov)
    sink_o = CsvSink(out / "decode_ops.csv", OPS_COLS, prov)
    # correctness of the decode logits kernel (fresh random inputs, poisoned output)
    g = torch.Generator(device=dev).manual_seed(int(time.time()) % 1000)
    for NH in (4, 32, 64):
        q = torch.randn(3, NH, 128 if not interp else 32, device=dev, dtype=dtype, generator=g)
        kc = torch.randn(3, 200, q.shape[2], device=dev, dtype=dtype, generator=g)
        w = torch.rand(3, NH, device=dev, generator=g)
        o = torch.full((3, 200), float("nan"), device=dev)
        decode_logits(q, kc, w, o, interp)
        ref = (torch.relu(torch.einsum("bhd,bsd->bhs", q.double(), kc.double())) * w.double()[:, :, None]).sum(1)
        err = float((o.double() - ref).norm() / ref.norm())
        log(f"decode_logits check NH={NH}: rel err {err:.2e}")
        if not err < 2e-2:
            raise SystemExit(f"decode_logits wrong (rel err {err}); refusing to time")
    ep = tp
    for mname, model in models:
        if time.time() > deadline:
            break
        max_T = max([max(Bs)] + [P + mdec for P in Ps])
        max_rows = max(max(Bs) * max(Cs), max([P + mdec * mctx for P in Ps] or [0]))
        try:
            DL = DecodeLayer(kit, model, tp, ep, dev, dtype, kern, max_T, max_rows, interp)
        except Exception as e:
            log(f"{mname}: layer setup failed {type(e).__name__}: {e}\n{traceback.format_exc()}")
            continue
        base = {"model": mname, "tp": tp, "ep": ep, "H": DL.H, "Hp": DL.Hp}
        log(f"{mname}: H={DL.H} -> {DL.Hp}, kv rows {max_rows}; {DL.layer_impl}")
        op_done = set()
        for B in Bs:
            for c in Cs:
                if time.time() > deadline:
                    log(f"deadline before {mname} B={B} c={c}")
                    break
                try:
                    S = DL.state(B, c)
                    cfg = {**base, "batch": B, "context": c, "prefill_tokens": 0, "decode_tokens": B, "T_total": B,
                           "topk_length_decode": S.k_dec, "n_act_experts": S.n_act, "tokens_per_expert": S.M_e,
                           "layer_impl": DL.layer_impl, "concat_impl": kern.concat_impl,
                           "kernel_impl": kern.kernel_impl}
                    fns = {}
                    for strat in STRATEGIES:
                        st = DL.steps(S, strat)
                        lay = as_fn(st)
                        att_names = {"concat_unfused", "pad_new_zeros_copy", "concat_fused", "sparse_kernel"}
                        lay()  # populate the state
                        # the attention path alone reads the fixed indices (same pattern as the top-k gives)
                        att = as_fn([(n, f, d) for n, f, d in DL.steps(S, strat, use_topk_indices=False)
                                     if n in att_names])
                        fns[(strat, "layer", "eager")] = lay
                        fns[(strat, "attn", "eager")] = att
                        if dev == "cuda":
                            for kind, f in (("layer", lay), ("attn", att)):
                                try:
                                    rep = graphed(f)
                                    gr = rep.graph
                                    fns[(strat, kind, "graph")] = rep
                                    fns[(strat, kind, "graph_obj")] = gr
                                except Exception as e:
                                    log(f"graph capture {mname} B={B} c={c} {strat} {kind}: {type(e).__name__}: {e}")
                                    torch.cuda.synchronize()
                        fns[(strat, "steps")] = st
                    fns[(STRATEGIES[0], "attn", "eager")]()
                    o1 = S.o.clone()
                    fns[(STRATEGIES[1], "attn", "eager")]()
                    sync(dev)
                    cfg["notes"] = (f"attention output {STRATEGIES[0]} vs {STRATEGIES[1]}: max_abs_diff "
                                    f"{float((o1.float() - S.o.float()).abs().max())}")
                    del o1
                    n_of = {}
                    for key, f in list(fns.items()):
                        if len(key) == 3 and key[2] in ("eager", "graph"):
                            n_of[key] = max(3, min(200, int(round(args.window_ms / max(est_ms(f, dev), 1e-3)))))
                    for r in range(args.repeats):
                        order = STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]
                        for o, strat in enumerate(order):
                            for kind, sink in (("layer", sink_l), ("attn", sink_a)):
                                for mode in ("eager", "graph"):
                                    f = fns.get((strat, kind, mode))
                                    if f is None:
                                        continue
                                    res = timed_window(f, n_of[(strat, kind, mode)], dev, sampler, reasons=False)
                                    sink.write({"experiment": f"decode_{kind}", **cfg, "strategy": strat, "content": "zeros",
                                                "mode": mode, "repeat": r, "order": o, **res, "status": "ok"})
                    # per-op device times (graph of `inner` calls), c-independent ops once per B
                    if not args.no_ops:
                        for strat in STRATEGIES:
                            for name, f, dep in fns[(strat, "steps")]:
                                shared = name not in ("concat_unfused", "pad_new_zeros_copy", "concat_fused")
                                key = (B, name if shared else f"{name}", c if dep else None)
                                if key in op_done or time.time() > deadline:
                                    continue
                                op_done.add(key)
                                try:
                                    if dev == "cuda":
                                        rep = graphed(f, args.op_inner)
                                        gr = rep.graph
                                    else:
                                        rep, gr = (lambda f=f: [f() for _ in range(args.op_inner)]), None
                                    for r in range(args.op_repeats):
                                        res = timed_window(rep, 1, dev, sampler, per=args.op_inner, reasons=False)
                                        sink_o.write({"experiment": "decode_op", **base, "batch": B,
                                                      "context": c if dep else "", "op": name,
                                                      "strategy": "" if shared else strat,
                                                      "content": "zeros" if not shared or name == "sparse_kernel"
                                                      else "", "c_dependent": dep,
                                                      "repeat": r, "inner": args.op_inner, "ms": res["ms_median"],
                                                      "status": "ok"})
                                    del rep, gr
                                except Exception as e:
                                    sink_o.write({"experiment": "decode_op", **base, "batch": B, "op": name,
                                                  "status": f"error {type(e).__name__}: {str(e)[:150]}"})
                    log(f"{mname} B={B} c={c}: done ({sink_l.n} layer rows, {sink_o.n} op rows)")
                    del fns, S
                except Exception as e:
                    log(f"{mname} B={B} c={c} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                    sink_l.write({**base, "experiment": "decode_layer", "batch": B, "context": c,
                                  "status": f"error {type(e).__name__}: {str(e)[:200]}"})
                if dev == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
        # mixed steps: a prefill chunk + decode tokens, eager (vLLM: piecewise graphs, attention eager)
        for P in Ps:
            if time.time() > deadline:
                log(f"deadline before mixed {mname} P={P}")
                break
            try:
                S = DL.state(mdec, mctx, P=P)
                cfg = {**base, "batch": mdec, "context": mctx, "prefill_tokens": P, "decode_tokens": mdec,
                       "T_total": P + mdec, "topk_length_decode": S.k_dec, "n_act_experts": S.n_act,
                       "tokens_per_expert": S.M_e, "layer_impl": DL.layer_impl, "concat_impl": kern.concat_impl,
                       "kernel_impl": kern.kernel_impl,
                       "notes": "one new prompt of P tokens (causal, topk_length min(p+1,2048)) + decode tokens; "
                                "kernel reads fixed indices; indexer top-k computed, not used"}
                fns = {}
                for strat in STRATEGIES:
                    st = DL.steps(S, strat)
                    lay = as_fn(st)
                    lay()
                    att = as_fn([(n, f, d) for n, f, d in st if n in {"concat_unfused", "pad_new_zeros_copy",
                                                                       "concat_fused", "sparse_kernel"}])
                    fns[(strat, "layer")] = lay
                    fns[(strat, "attn")] = att
                n_of = {k: max(3, min(100, int(round(args.window_ms * 2 / max(est_ms(f, dev), 1e-3)))))
                        for k, f in fns.items()}
                for r in range(args.repeats):
                    order = STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]
                    for o, strat in enumerate(order):
                        for kind, sink in (("layer", sink_l), ("attn", sink_a)):
                            res = timed_window(fns[(strat, kind)], n_of[(strat, kind)], dev, sampler, reasons=False)
                            sink.write({"experiment": f"mixed_{kind}", **cfg, "strategy": strat, "content": "zeros",
                                        "mode": "eager",
                                        "repeat": r, "order": o, **res, "status": "ok"})
                log(f"{mname} mixed P={P}+{mdec}x{mctx}: done")
                del fns, S
            except Exception as e:
                log(f"{mname} mixed P={P} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                sink_l.write({**base, "experiment": "mixed_layer", "prefill_tokens": P,
                              "status": f"error {type(e).__name__}: {str(e)[:200]}"})
            if dev == "cuda":
                torch.cuda.empty_cache()
        del DL
        if dev == "cuda":
            torch.cuda.empty_cache()
    sampler.stop()
    summary(out)
    log(f"bench_decode done in {time.time() - T0:.0f}s -> {out}")
    return 0


def summary(out):
    try:
        import pandas as pd
    except Exception:
        return
    pd.set_option("display.width", 220)
    pd.set_option("display.max_rows", 300)
    for name in ("decode_layer.csv", "decode_attn.csv"):
        f = out / name
        if not f.exists():
            continue
        d = pd.read_csv(f)
        d = d[d.status == "ok"]
        if not len(d):
            continue
        p = d.pivot_table(index=["model", "experiment", "batch", "context", "prefill_tokens"],
                          columns=["mode", "strategy"], values="ms_median", aggfunc="median")
        print(f"{name} (median ms over repeats):\n" + p.round(4).to_string())


if __name__ == "__main__":
    sys.exit(main())
