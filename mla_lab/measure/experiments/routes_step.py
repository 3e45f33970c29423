"""The attention path per route at prompt lengths 512..8192 in a 16384-token step (issue 25): padded sparse MQA
(W_UK bmm + concat + [pad] + FlashMLA + W_UV bmm) against dense causal MHA on the real heads (kv_b_proj
up-projection, K with the shared RoPE key, SDPA FLASH or cuDNN; V padded where a backend needs equal head dims).
Plus at 1024 tokens the MHA route's output against the MQA route's (top-k = every earlier token). Rows:
``routes.csv`` (ms), ``routes_check.csv`` (relative error)."""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import math
import statistics

import torch
import torch.nn.functional as F

from mla_lab.kernels import last_backend
from mla_lab.measure.attention import make_step_inputs, padded_path, sm_scale
from mla_lab.measure.sink import log
from mla_lab.measure.timer import interleaved
from mla_lab.workload import Step

from ._common import ranks_of
from .engine_presets import causal_indices

OUTPUTS = {"routes.csv": ["model", "num_heads", "prompt_len", "num_prompts", "T", "route", "round", "ms", "median_ms",
                          "sdpa_backend", "v_padded", "exact_topk", "qk_head_dim", "v_head_dim", "repeats"],
           "routes_check.csv": ["model", "num_heads", "prompt_len", "T", "sdpa_backend", "rel_err", "kernel_backend"]}
#: (model, prompt_len, T)
SHAPES = [(m, L, 16384) for m in ("glm-5", "deepseek-v3.2") for L in (512, 1024, 2048, 4096, 8192)]

#: SDPA backend name -> its torch.nn.attention.SDPBackend member.
_SDPA = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


class MHARoute:
    """Dense causal MHA with the real heads for B prompts of L tokens (T = B L), vLLM #47327's route: the step's
    latent ``kv_c [T, 512]`` up-projected by ``kv_b_proj`` (``[T, 512] x [512, H (qk_nope + v)]``), ``k = [k_nope,
    k_pe]`` (the RoPE key shared by all heads), ``q [T, H, qk_nope + qk_rope]`` (q_b_proj output: no W_UK
    absorption on this route), SDPA causal per prompt ``[B, H, L, D]``."""

    def __init__(self, m, H, B, L, backend, g):
        self.m, self.H, self.B, self.L = m, H, B, L
        T = B * L
        dn, dr, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        self.dq = dn + dr
        self.q = torch.randn(T, H, self.dq, device="cuda", dtype=torch.bfloat16, generator=g)
        self.kv_c = torch.randn(T, m.kv_lora_rank, device="cuda", dtype=torch.bfloat16, generator=g)
        self.k_pe = torch.randn(T, 1, dr, device="cuda", dtype=torch.bfloat16, generator=g)
        self.w_kvb = (torch.randn(H * (dn + dv), m.kv_lora_rank, device="cuda", generator=g)
                      / math.sqrt(m.kv_lora_rank)).to(torch.bfloat16)
        self.backend = backend
        self.pad_v = backend == "flash" and dv != self.dq
        self.sm = 1.0 / math.sqrt(self.dq)

    def upproj(self):
        return F.linear(self.kv_c, self.w_kvb)

    def assemble(self, kvb):
        m, H, T = self.m, self.H, self.B * self.L
        dn, dv = m.qk_nope_head_dim, m.v_head_dim
        kvb = kvb.view(T, H, dn + dv)
        k = torch.cat([kvb[..., :dn], self.k_pe.expand(T, H, m.qk_rope_head_dim)], dim=-1)
        v = kvb[..., dn:]
        if self.pad_v:
            v = F.pad(v, (0, self.dq - dv))
        return k, v

    def attend(self, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        B, L, H = self.B, self.L, self.H
        q = self.q.view(B, L, H, self.dq).transpose(1, 2)
        kk = k.view(B, L, H, self.dq).transpose(1, 2)
        vv = v.reshape(B, L, H, v.shape[-1]).transpose(1, 2)
        with sdpa_kernel(getattr(SDPBackend, _SDPA[self.backend])):
            o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, scale=self.sm)
        return o[..., : self.m.v_head_dim] if self.pad_v else o

    def __call__(self):
        k, v = self.assemble(self.upproj())
        return self.attend(k, v)


def _working_backends(m, H):
    """SDPA backends that run this model's shapes (flash pads V to the qk head dim when they differ), in the order
    flash, cuDNN, efficient; and why the others were refused."""
    g = torch.Generator(device="cuda").manual_seed(0)
    ok, errs = [], {}
    for b in ("flash", "cudnn", "efficient"):
        try:
            r = MHARoute(m, H, 2, 256, b, g)
            r()
            torch.cuda.synchronize()
            ok.append(b)
        except Exception as e:  # noqa: BLE001 - record why a backend was not used
            errs[b] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return ok, errs


def _mqa_calls(rank, L: int, g) -> dict:
    """The padded sparse MQA route's calls for B = T // L prompts of L tokens: W_UK bmm + path + W_UV bmm per
    placement, and the path alone."""
    m, H = rank.model, rank.num_heads
    B = rank.max_num_batched_tokens // L
    T, dn, dv = B * L, m.qk_nope_head_dim, m.v_head_dim
    ql, qpe, kv, idx, tl = make_step_inputs(rank, Step([(j, 0, L) for j in range(B)]), L, seed=L)
    if L <= m.topk:  # top-k = every earlier token: sparse attention equals dense causal attention
        idx, tl, _ = causal_indices(T, L, m.topk, "cuda")
    sm = sm_scale(m)
    q_nope = torch.randn(H, T, dn, device="cuda", dtype=torch.bfloat16, generator=g)
    w_uk = (torch.randn(H, dn, m.kv_lora_rank, device="cuda", generator=g) / math.sqrt(dn)).to(torch.bfloat16)
    w_uv = (torch.randn(H, m.kv_lora_rank, dv, device="cuda", generator=g) / math.sqrt(m.kv_lora_rank)).to(
        torch.bfloat16)
    ql_buf = torch.empty(H, T, m.kv_lora_rank, device="cuda", dtype=torch.bfloat16)
    paths = {s: padded_path(rank, s, T, reuse_pad_block=True) for s in ("private_workspace", "per_call_empty:zeros")}

    def mqa(p):
        torch.bmm(q_nope, w_uk, out=ql_buf)  # W_UK absorption: [H, T, 512]
        o, _ = p(ql_buf.transpose(0, 1), qpe, kv, idx, sm, tl)
        return torch.bmm(o.transpose(0, 1), w_uv)  # W_UV: [H, T, v]

    fns = {f"mqa:{s}": (lambda p=p: mqa(p)) for s, p in paths.items()}
    fns["mqa_kernel_only:private_workspace"] = lambda: paths["private_workspace"](ql_buf.transpose(0, 1), qpe, kv,
                                                                                  idx, sm, tl)
    return fns


def _mha_calls(rank, L: int, backends, g) -> dict:
    """The dense MHA route's calls (the first working SDPA backend: total, up-projection, assembly, SDPA; the other
    backends' SDPA)."""
    m, H, B = rank.model, rank.num_heads, rank.max_num_batched_tokens // L
    fns = {}
    for i, b in enumerate(backends):
        r = MHARoute(m, H, B, L, b, g)
        kvb = r.upproj()
        k, v = r.assemble(kvb)
        if i == 0:
            fns.update({"mha:total": r, "mha:upproj": r.upproj, "mha:assemble": lambda r=r, kvb=kvb: r.assemble(kvb)})
        fns[f"mha:sdpa:{b}"] = lambda r=r, k=k, v=v: r.attend(k, v)
    return fns


def _route_rows(sink, rank, L, backend, samples, reps) -> None:
    m = rank.model
    dn, dv, B = m.qk_nope_head_dim, m.v_head_dim, rank.max_num_batched_tokens // L
    for name, xs in samples.items():
        sdpa = name.startswith("mha:sdpa:")
        for i, ms in enumerate(xs):
            sink.write("routes.csv", {
                "model": m.name, "num_heads": rank.num_heads, "prompt_len": L, "num_prompts": B, "T": B * L,
                "route": name, "round": i, "ms": round(ms, 5), "median_ms": round(statistics.median(xs), 5),
                "sdpa_backend": (name.rsplit(":", 1)[1] if sdpa else backend) or "",
                "v_padded": bool(dv != dn + m.qk_rope_head_dim and (
                    name.endswith(":flash") or (backend == "flash" and not sdpa))),
                "exact_topk": L <= m.topk, "qk_head_dim": dn + m.qk_rope_head_dim, "v_head_dim": dv,
                "repeats": reps})


def run(rank, sink, options) -> None:
    """Models ``models`` (glm-5, deepseek-v3.2) at the rank's TP; prompt lengths 512..8192 (1024, 2048 under
    smoke); the accuracy check at 1024."""
    lens = (1024, 2048) if options.smoke else (512, 1024, 2048, 4096, 8192)
    for r in ranks_of(rank, options.param("models", ("glm-5", "deepseek-v3.2"))):
        backends, errs = _working_backends(r.model, r.num_heads)
        backend = backends[0] if backends else None
        log(f"routes {r.model.name}: SDPA backends {backends} (refused: {errs})")
        for L in lens:
            g = torch.Generator(device="cuda").manual_seed(L)
            fns = {**_mqa_calls(r, L, g), **_mha_calls(r, L, backends, g)}
            samples = interleaved(fns, repeats=options.reps, device="cuda")
            _route_rows(sink, r, L, backend, samples, options.reps)
            log(f"routes {r.model.name} L={L}: " + ", ".join(f"{n} {statistics.median(x):.3f}"
                                                              for n, x in samples.items()))
            if L == 1024 and backend is not None:
                _route_check(sink, r, L, backend, g)
            torch.cuda.empty_cache()


def _route_check(sink, rank, L, backend, g):
    """MHA route == MQA route when top-k covers every earlier token (consistent weights: W_UK / W_UV are the
    nope / v halves of kv_b_proj; the MQA query is q_nope absorbed by W_UK and the RoPE part; kv latent = [kv_c,
    k_pe]). Relative Frobenius error of the [T, H, v] outputs, bf16 inputs."""
    m, H, B = rank.model, rank.num_heads, rank.max_num_batched_tokens // L
    T, mname = B * L, rank.model.name
    dn, dr, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    r = MHARoute(m, H, B, L, backend, g)
    o_mha = r().transpose(1, 2).reshape(T, H, dv).float()
    w = r.w_kvb.view(H, dn + dv, m.kv_lora_rank)
    w_uk, w_uv = w[:, :dn], w[:, dn:]  # [H, dn, 512], [H, dv, 512]
    q_nope, q_pe = r.q[..., :dn], r.q[..., dn:]
    ql = torch.einsum("thd,hdc->thc", q_nope.float(), w_uk.float()).to(torch.bfloat16)
    kv = torch.cat([r.kv_c, r.k_pe[:, 0]], dim=-1).view(T, 1, m.kv_lora_rank + dr)
    idx, tl, _ = causal_indices(T, L, m.topk, "cuda")
    p = padded_path(rank, "private_workspace", T)
    o_lat, _ = p(ql, q_pe, kv, idx, r.sm, tl)
    o_mqa = torch.einsum("thc,hvc->thv", o_lat.float(), w_uv.float())
    rel = float((o_mha - o_mqa).norm() / o_mqa.norm())
    sink.write("routes_check.csv", {"model": mname, "num_heads": H, "prompt_len": L, "T": T, "sdpa_backend": backend,
                                    "rel_err": rel, "kernel_backend": str(last_backend("sparse_mla_prefill"))})
    log(f"route check {mname} L={L}: rel err MHA vs MQA {rel:.2e}")

