"""The decode experiment: one per-rank MoE decode layer (and mixed prefill + decode steps), its attention path and
every op alone; the bf16 sparse kernel reads the padded Q workspace (vLLM sends every token of a bf16-KV step down
the sparse path: vLLM ``mla_attention.py``). Weights: :class:`mla_lab.measure.layer.Layer` (TP attention, EP
experts; no communication, KV-cache write or RoPE). Rows (ms): ``decode_layer.csv`` per (B, c, strategy, mode:
``eager`` / ``graph`` replay as vLLM's full decode graphs; mixed steps eager only), ``decode_attn.csv`` the attention
path alone, ``decode_ops.csv`` each op alone (graph replay of ``op_inner`` calls, per B and, c-dependent, per c).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from mla_lab.kernels.device import Kernels
from mla_lab.measure.layer import Layer
from mla_lab.measure.sink import NvmlSampler, log
from mla_lab.measure.timer import est_ms, graphed, timed_window
from mla_lab.measure.triton_ops import mqa_logits, rmsnorm, silu_mul

from ._common import ranks_of
from .engine_presets import D_QK, causal_indices

#: The attention paths timed (the first version's rows label them unfused / fused: mla_lab.placement.measured_as).
STRATEGIES = ("per_call_zeros", "private_workspace")
ATTN_OPS = ("concat_unfused", "pad_new_zeros_copy", "concat_fused", "sparse_kernel")
C_DEPENDENT = {"idx_logits_prefill", "idx_topk_prefill", "idx_logits_decode", "idx_topk_decode", "idx_to_global",
               "sparse_kernel"}
_HEAD = ("input_norm", "q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "w_uk_bmm", "idx_q_proj",
         "idx_k_proj", "idx_weights_proj")
_TAIL = ("w_uv_bmm", "o_proj", "post_attn_norm", "router", "moe_gate_up", "moe_silu_mul", "moe_down", "moe_sum")
LAYER_COLS = ["experiment", "model", "tp", "ep", "H", "Hp", "batch", "context", "prefill_tokens", "decode_tokens",
              "T_total", "topk_length_decode", "strategy", "content", "mode", "repeat", "order", "n_calls",
              "ms_median", "ms_mean", "ms_p10", "ms_p90", "window_s", "n_act_experts", "tokens_per_expert",
              "sm_clock_mhz", "power_w", "temp_c", "n_samples", "layer_impl", "concat_impl", "kernel_impl", "status",
              "notes"]
OPS_COLS = ["experiment", "model", "tp", "ep", "H", "Hp", "batch", "context", "op", "strategy", "content",
            "c_dependent", "repeat", "inner", "ms", "status"]
OUTPUTS = {"decode_layer.csv": LAYER_COLS, "decode_attn.csv": LAYER_COLS, "decode_ops.csv": OPS_COLS}
#: The models measured, each at the rank's TP and GPU.
MODELS = ("glm-5", "deepseek-v3.2")
#: (B, c) of a full run per model; the mixed steps (P prefill tokens + 32 decode tokens at c 4096) follow them.
SHAPES = [(B, c) for B in (1, 4, 16, 64, 128, 256) for c in (1024, 4096, 8192)]
MIXED = (2048, 8192)
#: The smoke run's shapes and mixed step.
SMOKE_SHAPES, SMOKE_MIXED = [(1, 128), (4, 256)], (64,)


@functools.cache
def _decode_logits_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(q_ptr, k_ptr, w_ptr, o_ptr, C, sq_b, sq_h, sk_b, sk_s, sw_b, so_b, NH: tl.constexpr,
               NHP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        offs_h, offs_d = tl.arange(0, NHP), tl.arange(0, D)
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
        hm, nm = offs_h < NH, offs_n < C
        q = tl.load(q_ptr + b * sq_b + offs_h[:, None] * sq_h + offs_d[None, :], mask=hm[:, None], other=0.0)
        k = tl.load(k_ptr + b * sk_b + offs_n[:, None] * sk_s + offs_d[None, :], mask=nm[:, None], other=0.0)
        w = tl.load(w_ptr + b * sw_b + offs_h, mask=hm, other=0.0)
        acc = tl.sum(tl.maximum(tl.dot(q, tl.trans(k)), 0.0) * w[:, None], axis=0)
        tl.store(o_ptr + b * so_b + offs_n, acc, mask=nm)

    return triton, kernel


def decode_logits(q, kc, w, out):
    """``out[b, s] = sum_h w[b, h] relu(q[b, h] . kc[b, s])`` (Triton): q [B, NH, D] bf16, kc [B, C, D] bf16 (cached
    indexer keys), w [B, NH] fp32 -> out [B, C] fp32."""
    triton, kernel = _decode_logits_kernel()
    B, NH, D = q.shape
    kernel[(B, triton.cdiv(kc.shape[1], 64))](
        q, kc, w, out, kc.shape[1], q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), w.stride(0), out.stride(0),
        NH=NH, NHP=max(16, triton.next_power_of_2(NH)), D=D, BN=64, num_warps=4)
    return out


def check_decode_logits(dev="cuda", dtype=torch.bfloat16) -> None:
    """:func:`decode_logits` against fp64 torch (NaN-poisoned output). Raises RuntimeError at relative error >= 2e-2."""
    g = torch.Generator(device=dev).manual_seed(11)
    for NH in (4, 32, 64):
        q = torch.randn(3, NH, 128, device=dev, dtype=dtype, generator=g)
        kc = torch.randn(3, 200, q.shape[2], device=dev, dtype=dtype, generator=g)
        w = torch.rand(3, NH, device=dev, generator=g)
        o = decode_logits(q, kc, w, torch.full((3, 200), float("nan"), device=dev))
        ref = (torch.relu(torch.einsum("bhd,bsd->bhs", q.double(), kc.double())) * w.double()[:, :, None]).sum(1)
        err = float((o.double() - ref).norm() / ref.norm())
        if not err < 2e-2:
            raise RuntimeError(f"decode_logits NH={NH}: relative error {err:.2e} >= 2e-2; refusing to time")


def active_experts(tokens: int, model, ep: int) -> tuple[int, int, int]:
    """(expected local experts hit under uniform routing, tokens per active expert, routed pairs on this rank)."""
    E, k = model.n_routed_experts, model.num_experts_per_tok
    local = E // ep
    pairs = max(1, round(tokens * k / ep))
    active = max(1, min(local, int(round(local * (1 - (1 - 1 / E) ** (tokens * k))))))
    return active, math.ceil(pairs / active), pairs


class DecodeLayer:
    """One rank's weights (EP experts, zero padded heads) and KV / indexer-key caches of ``max_rows`` tokens."""

    def __init__(self, rank, max_T, max_rows, dev="cuda", dtype=torch.bfloat16):
        self.rank, self.m, self.dev, self.dtype, self.k = rank, rank.model, dev, dtype, Kernels(dev)
        self.ep = rank.ep_size or rank.tp
        self.L = Layer(rank, dev, dtype, max_T, None, None, False, [("ep", self.ep)], content="zeros")
        self.H, self.Hp = self.L.H, self.L.Hp
        self.g = torch.Generator(device=dev).manual_seed(5)
        self.kv_all = torch.randn(max_rows, 1, D_QK, device=dev, dtype=dtype, generator=self.g)
        self.ik_all = torch.randn(max_rows, self.m.index_head_dim, device=dev, dtype=dtype, generator=self.g)


class Step:
    """One step: P prefill tokens of one new prompt (kv rows 0..P-1) and Bd decode tokens of context c (request b's
    rows P + b c ..); each op a method on these attributes, :meth:`ops` in layer order."""

    def __init__(self, D: DecodeLayer, Bd, c, P=0):
        m, L, dev, dt = D.m, D.L, D.dev, D.dtype
        self.D, self.m, self.L, self.Bd, self.c, self.P, self.T = D, m, L, Bd, c, P, P + Bd
        T, h = self.T, m.hidden_size
        self.x, self.res = L.random_tensor(T, h, k=1), L.random_tensor(T, h, k=1)
        self.xn, self.yn = torch.empty_like(self.x), torch.empty_like(self.x)
        self.qa_n = torch.empty(T, m.q_lora_rank, device=dev, dtype=dt)
        self.kvn = torch.empty(T, m.kv_lora_rank, device=dev, dtype=dt)
        self.attn = torch.empty(T, D.H * m.v_head_dim, device=dev, dtype=dt)
        self.k_dec = min(c, m.topk) if Bd else 0
        self.kv = D.kv_all[:P + Bd * c]
        self._indices()
        self.n_act, self.M_e, pairs = active_experts(T, m, D.ep)
        w13, w2 = L.moe_weights[("ep", D.ep)]
        self.w13a, self.w2a = w13[:self.n_act], w2[:self.n_act]
        self.xe = L.random_tensor(self.n_act, self.M_e, h, k=1)
        self.act = torch.empty(self.n_act * self.M_e, w13.shape[1] // 2, device=dev, dtype=dt)
        self.kloc = max(1, pairs // T)
        if "shared_gate_up" in L.weights:
            self.sh_a = torch.empty(T, L.weights["shared_gate_up"].shape[0] // 2, device=dev, dtype=dt)

    def _indices(self):
        """Fixed indices: the prompt's causal window, per decode token k_dec random distinct keys of its context."""
        D, m, P, Bd, c, dev = self.D, self.m, self.P, self.Bd, self.c, self.D.dev
        width = m.topk if P else self.k_dec
        parts_i, parts_l = [], []
        if P:
            idx, tl, _ = causal_indices(P, P, m.topk, dev)
            self.logits_p = torch.full((P, P), float("-inf"), device=dev, dtype=torch.float32)
            parts_i.append(idx.view(P, -1))
            parts_l.append(tl)
        if Bd:
            self.kc = D.ik_all[P:P + Bd * c].view(Bd, c, -1)
            self.logits = torch.empty(Bd, c, device=dev, dtype=torch.float32)
            self.base = P + torch.arange(Bd, device=dev, dtype=torch.int64) * c
            ii = torch.rand(Bd, c, device=dev, generator=D.g).topk(self.k_dec, dim=-1).indices + self.base[:, None]
            parts_i.append(torch.cat([ii, ii.new_full((Bd, width - self.k_dec), -1)], 1).to(torch.int32))
            parts_l.append(torch.full((Bd,), self.k_dec, device=dev, dtype=torch.int32))
        self.idx_fixed = torch.cat(parts_i, 0).view(self.T, 1, width).contiguous()
        self.topk_length = torch.cat(parts_l, 0).contiguous()

    def ops(self, strategy: str, topk_indices: bool = True) -> list[tuple[str, object, bool]]:
        """``[(name, fn, c_dependent)]`` of the layer under ``strategy``; ``topk_indices``: a pure decode step's
        kernel reads the indexer's top-k (else the fixed indices of the same pattern)."""
        names = list(_HEAD)
        names += ["idx_logits_prefill", "idx_topk_prefill"] if self.P else []
        names += ["idx_logits_decode", "idx_topk_decode", "idx_to_global"] if self.Bd else []
        names += ["concat_unfused", "pad_new_zeros_copy"] if strategy == STRATEGIES[0] else ["concat_fused"]
        fns = {n: getattr(self, n) for n in names + list(_TAIL)}
        fns["sparse_kernel"] = self.sparse_kernel if topk_indices and self.Bd and not self.P else self.kernel_fixed
        if "shared_gate_up" in self.L.weights:
            fns.update(shared_gate_up=self.shared_gate_up, shared_silu_mul=self.shared_silu_mul,
                       shared_down=self.shared_down)
        order = names + ["sparse_kernel"] + list(_TAIL) + [n for n in fns if n.startswith("shared")]
        return [(n, fns[n], n in C_DEPENDENT) for n in order]

    # ---- the ops
    def input_norm(self):
        rmsnorm(self.x, self.L.norm_weights[self.m.hidden_size], self.xn, residual=self.res)

    def q_a_proj(self):
        self.qa = F.linear(self.xn, self.L.weights["q_a_proj"])

    def q_a_norm(self):
        rmsnorm(self.qa, self.L.norm_weights[self.m.q_lora_rank], self.qa_n)

    def q_b_proj(self):
        self.q = F.linear(self.qa_n, self.L.weights["q_b_proj"]).view(self.T, self.D.H, -1)

    def kv_a_proj(self):
        self.kva = F.linear(self.xn, self.L.weights["kv_a_proj"])

    def kv_a_norm(self):
        rmsnorm(self.kva[:, :self.m.kv_lora_rank], self.L.norm_weights[self.m.kv_lora_rank], self.kvn)

    def w_uk_bmm(self):
        self.ql_nope = torch.bmm(self.q[..., :self.m.qk_nope_head_dim].transpose(0, 1), self.L.W_UK).transpose(0, 1)

    def idx_q_proj(self):
        self.iq = F.linear(self.qa_n, self.L.weights["idx_wq_b"]).view(self.T, self.m.index_n_heads, -1)

    def idx_k_proj(self):
        self.ik = F.linear(self.xn, self.L.weights["idx_wk"])

    def idx_weights_proj(self):
        self.iw = F.linear(self.xn, self.L.weights["idx_weights_proj"]).float()

    def idx_logits_prefill(self):
        P = self.P
        mqa_logits(self.iq[:P], self.ik[:P], self.iw[:P], self.logits_p, False)

    def idx_topk_prefill(self):
        self.tk_p = torch.topk(self.logits_p, min(self.P, self.m.topk), dim=-1, sorted=False).indices

    def idx_logits_decode(self):
        decode_logits(self.iq[self.P:], self.kc, self.iw[self.P:], self.logits)

    def idx_topk_decode(self):
        self.tk = torch.topk(self.logits, self.k_dec, dim=-1, sorted=False).indices

    def idx_to_global(self):
        self.gidx_t = (self.tk + self.base[:, None]).to(torch.int32).view(self.Bd, 1, self.k_dec)

    def concat_unfused(self):
        self.D.k.concat(self.ql_nope, self.q[..., self.m.qk_nope_head_dim:], self.L.workspace_unfused[:self.T])

    def pad_new_zeros_copy(self):
        buf = self.L.workspace_unfused[:self.T]
        self.qk = buf.new_zeros((self.T, self.D.Hp, D_QK))
        self.qk[:, :self.D.H] = buf

    def concat_fused(self):
        self.qk = self.D.k.concat(self.ql_nope, self.q[..., self.m.qk_nope_head_dim:], self.L.workspace_fused[:self.T])

    def sparse_kernel(self):
        self.o = self.D.k.kernel(self.qk, self.kv, self.gidx_t, D_QK ** -0.5, self.topk_length)[:, :self.D.H]

    def kernel_fixed(self):
        self.o = self.D.k.kernel(self.qk, self.kv, self.idx_fixed, D_QK ** -0.5, self.topk_length)[:, :self.D.H]

    def w_uv_bmm(self):
        out = self.attn.view(self.T, self.D.H, self.m.v_head_dim).transpose(0, 1)
        torch.bmm(self.o.transpose(0, 1), self.L.W_UV, out=out)

    def o_proj(self):
        self.y = F.linear(self.attn, self.L.weights["o_proj"])

    def post_attn_norm(self):
        rmsnorm(self.y, self.L.norm_weights[self.m.hidden_size], self.yn, residual=self.res)

    def router(self):
        self.rl = F.linear(self.yn, self.L.weights["router"])

    def moe_gate_up(self):
        self.h1 = torch.bmm(self.xe, self.w13a.transpose(1, 2))

    def moe_silu_mul(self):
        silu_mul(self.h1.view(self.n_act * self.M_e, -1), self.act)

    def moe_down(self):
        self.h2 = torch.bmm(self.act.view(self.n_act, self.M_e, -1), self.w2a.transpose(1, 2))

    def moe_sum(self):
        h = self.m.hidden_size
        self.routed = self.h2.view(-1, h)[:self.kloc * self.T].view(self.T, self.kloc, h).sum(1)

    def shared_gate_up(self):
        self.sg = F.linear(self.yn, self.L.weights["shared_gate_up"])

    def shared_silu_mul(self):
        silu_mul(self.sg, self.sh_a)

    def shared_down(self):
        self.sh = F.linear(self.sh_a, self.L.weights["shared_down"])


def as_fn(ops):
    """One callable running ``ops`` (``[(name, fn, c_dependent)]``) in order."""
    fs = [f for _, f, _ in ops]

    def run():
        for f in fs:
            f()
    return run


def _paths(S: Step, graph: bool) -> dict:
    """``{(strategy, kind, mode): fn}``: layer and attention path per strategy, eager and (``graph``) replayed."""
    fns = {}
    for strat in STRATEGIES:
        lay = as_fn(S.ops(strat))
        lay()
        att = as_fn([op for op in S.ops(strat, topk_indices=False) if op[0] in ATTN_OPS])
        for kind, f in (("layer", lay), ("attn", att)):
            fns[(strat, kind, "eager")] = f
            if graph:
                fns[(strat, kind, "graph")] = graphed(f)
    return fns


def time_step(ctx, S: Step, cfg: dict, mixed: bool) -> None:
    """Layer and attention path of ``S`` per strategy and mode, ``ctx.repeats`` repeats (order flipped every other)."""
    fns = _paths(S, graph=not mixed)
    if not mixed:  # the two paths' attention outputs (same inputs) differ by rounding at most
        fns[(STRATEGIES[0], "attn", "eager")]()
        o1 = S.o.clone()
        fns[(STRATEGIES[1], "attn", "eager")]()
        cfg["notes"] = (f"attention output {STRATEGIES[0]} vs {STRATEGIES[1]}: max_abs_diff "
                        f"{float((o1.float() - S.o.float()).abs().max())}")
    window, cap = (ctx.window_ms * 2, 100) if mixed else (ctx.window_ms, 200)
    n_of = {k: max(3, min(cap, round(window / max(est_ms(f), 1e-3)))) for k, f in fns.items()}  # calls per window
    for r in range(ctx.repeats):
        for o, strat in enumerate(STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]):
            for (s, kind, mode), f in fns.items():
                if s != strat:
                    continue
                res = timed_window(f, n_of[(s, kind, mode)], sampler=ctx.sampler, reasons=False)
                ctx.sink.write(f"decode_{kind}.csv" if kind == "attn" else "decode_layer.csv", {
                    "experiment": f"{'mixed' if mixed else 'decode'}_{kind}", **cfg, "strategy": strat,
                    "content": "zeros", "mode": mode, "repeat": r, "order": o, **res, "status": "ok"})


def time_ops(ctx, S: Step, base: dict, done: set) -> None:
    """Each op alone (graph replay of ``ctx.op_inner`` calls), ``ctx.op_repeats`` rows; once per B (and c)."""
    for strat in STRATEGIES:
        for name, f, dep in S.ops(strat):
            shared = name not in ("concat_unfused", "pad_new_zeros_copy", "concat_fused")
            if (S.Bd, name, S.c if dep else None) in done:
                continue
            done.add((S.Bd, name, S.c if dep else None))
            rep = graphed(f, ctx.op_inner)
            for r in range(ctx.op_repeats):
                res = timed_window(rep, 1, sampler=ctx.sampler, per=ctx.op_inner, reasons=False)
                ctx.sink.write("decode_ops.csv", {
                    "experiment": "decode_op", **base, "batch": S.Bd, "context": S.c if dep else "", "op": name,
                    "strategy": "" if shared else strat, "c_dependent": dep, "repeat": r, "inner": ctx.op_inner,
                    "content": "zeros" if not shared or name == "sparse_kernel" else "", "ms": res["ms_median"],
                    "status": "ok"})


def _config(D: DecodeLayer, S: Step, base: dict) -> dict:
    return {**base, "batch": S.Bd, "context": S.c, "prefill_tokens": S.P, "decode_tokens": S.Bd, "T_total": S.T,
            "topk_length_decode": S.k_dec, "n_act_experts": S.n_act, "tokens_per_expert": S.M_e,
            "layer_impl": "mla_lab.measure.layer.Layer weights; mla_lab.measure.triton_ops rmsnorm/silu_mul/mqa_logits",
            "concat_impl": D.k.concat_impl, "kernel_impl": D.k.kernel_impl}


def _settings(smoke: bool) -> dict:
    """Shapes, mixed steps, repeats, window (ms), op graph size (smoke: :data:`SMOKE_SHAPES` / :data:`SMOKE_MIXED`)."""
    return {"shapes": SMOKE_SHAPES if smoke else SHAPES, "mixed": SMOKE_MIXED if smoke else MIXED,
            "mixed_decode": 4 if smoke else 32, "mixed_context": 128 if smoke else 4096, "repeats": 2 if smoke else 5,
            "window_ms": 15.0, "op_inner": 10, "op_repeats": 2 if smoke else 5}


def plan(rank, options) -> list[dict]:
    """One entry per decode shape and mixed step (per model)."""
    s = _settings(options.smoke)
    return ([{"what": "decode", "batch": B, "context": c} for B, c in s["shapes"]]
            + [{"what": "mixed", "prefill_tokens": P, "batch": s["mixed_decode"], "context": s["mixed_context"]}
               for P in s["mixed"]])


_MIXED_NOTE = ("one new prompt of P tokens (causal, topk_length min(p+1,2048)) + decode tokens; kernel reads fixed "
               "indices; indexer top-k computed, not used")


def measure_rank(ctx, rank) -> None:
    """Every decode shape (layer, attention path, ops) and mixed step of ``ctx`` on ``rank``."""
    steps = ([(B, c, 0, False) for B, c in ctx.shapes]
             + [(ctx.mixed_decode, ctx.mixed_context, P, True) for P in ctx.mixed])
    D = DecodeLayer(rank, max(P + B for B, c, P, _ in steps), max(P + B * c for B, c, P, _ in steps))
    base = {"model": rank.model.name, "tp": rank.tp, "ep": D.ep, "H": D.H, "Hp": D.Hp}
    done: set = set()
    for B, c, P, mixed in steps:
        S = Step(D, B, c, P=P)
        cfg = _config(D, S, base)
        time_step(ctx, S, {**cfg, "notes": _MIXED_NOTE} if mixed else cfg, mixed=mixed)
        if not mixed:
            time_ops(ctx, S, base, done)
        log(f"{rank.model.name} {f'mixed P={P}+{B}x{c}' if mixed else f'B={B} c={c}'}: done")
        del S
        torch.cuda.empty_cache()


def run(rank, sink, options) -> None:
    """:func:`measure_rank` per ``models`` (smoke: the rank's). Raises RuntimeError: the decode logits kernel wrong."""
    check_decode_logits()
    ranks = [rank] if options.smoke else ranks_of(rank, MODELS)
    with NvmlSampler(0.02) as sampler:
        ctx = SimpleNamespace(sink=sink, sampler=sampler, **_settings(options.smoke))
        for r in ranks:
            measure_rank(ctx, r)
            torch.cuda.empty_cache()
