#!/usr/bin/env python3
"""GPU round 3 on one H200: ONE fresh process's share of the between-process measurements (issues 20, 21, 23, 25).

``benchmarks/h200_round3.sh`` runs this script N >= 5 times, each time in a new Python process (a fresh CUDA
context, caching allocator, Triton in-memory cache, FlashMLA module load), with ``--process k``; every row carries
``process`` so the between-process spread is computed from the committed CSVs (``mla_lab.measure.spread``).

Parts (``--parts``, comma separated, run in this order):

- ``cold``: the first calls of the seed attention path (vLLM PR #53878's private workspace and the pre-PR
  ``new_empty`` pad) and of one layer's blocks (attention block, MoE block, TP-8 rank share) in this fresh process:
  call 1, 2, 3 (host wall and CUDA-event time) against the steady-state median of 20 calls. Rows:
  ``cold_start.csv``.
- ``presets``: the attention path of every real preset and the lab's sub-chunk strategies at the seed shape (16 x
  1024-token causal prompts in one 16384-token step) and at full topk (16384 tokens, random topk 2048 over s_kv
  32768), ``--repeats`` interleaved rounds (``mla_lab.measure.attention.time_attention_path``). Rows:
  ``presets.csv`` (one per sample).
- ``subgraph``: sub-chunking without the per-chunk cost (issue 23): for S in 2048 / 4096 the chunk loop eager
  (``views``), captured in ONE CUDA graph (``graph``: the chunk count depends only on T and S), and spread over two
  streams with two S-row workspaces (``2stream``: chunk i+1's kernel may start in chunk i's tail wave); beside the
  PR's private workspace, eager and graphed. Interleaved rounds; rows in ``subgraph.csv``.
- ``routes``: the attention path per route at prompt lengths 512..8192 in a 16384-token step (issue 25): padded
  sparse MQA (W_UK bmm + concat + [pad] + FlashMLA + W_UV bmm; the PR's path and the pre-PR pad) against dense
  causal MHA with the real heads (kv_b_proj up-projection of the step's latent K/V, K assembly with the shared
  RoPE key, torch SDPA with the FLASH or cuDNN backend; V padded to the qk head dim where a backend needs equal
  head dims, recorded). GLM-5 TP8 (8 heads, qk 256 / v 256) and DeepSeek-V3.2 TP8 (16 heads, qk 192 / v 128).
  Plus one accuracy check at 1024 tokens: the MHA route's output equals the MQA route's (top-k = every earlier
  token). Rows: ``routes.csv``, ``routes_check.csv``.
- ``moe_decode``: the routed experts of one MoE layer at decode sizes (T = 1..256 tokens), GLM-5 EP8 rank share
  (32 local experts, hidden 6144, moe_intermediate 2048, top-8 of 256, random routing), graph timing: bf16
  ``torch._grouped_mm`` and fp8 e4m3 ``torch._scaled_grouped_mm`` (row-wise scales) where this torch has it
  (recorded: ``impl``). Rows: ``moe_decode.csv``.
- ``concat_ceiling``: the concat into the padded workspace vs a contiguous copy and torch's strided copy of the same
  bytes into the same padded layout (is ~95 % the gapped write's ceiling?), graph timing. Rows:
  ``concat_ceiling.csv``.
- ``strategies``: ``--strategies`` (canonical names) through ``mla_lab.measure.attention.time_attention_path`` at
  the seed and full-topk shapes (as ``presets``). Rows: ``strategies.csv``.
- ``content``: padded-head content over the whole step (issue 21): a sustained 78-layer loop at the seed shape,
  each layer = the attention block (PR path: concat, FlashMLA, W_UV bmm, o_proj) + q/kv projections + the MoE
  block (TP-8 / EP-8 rank share, grouped GEMMs), with the padded heads zero (``private_workspace``) or stale
  (N(0,1): ``shared_workspace:none``), steps interleaved; per step: total, attention-kernel sum and the rest
  (CUDA events per layer), SM clock and power sampled by NVML during the step. Rows: ``content_loop.csv``.

Every CSV row carries provenance (GPU, driver, torch, triton, flash_mla, commit: ``mla_lab.provenance``). Times
in ms. ``--smoke``: tiny repeats, for the first call of a session.
"""

# ruff: noqa: B023  (the closures are timed inside the loop iteration that defines them)
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from mla_lab.kernels import concat_mla_q, last_backend, sparse_mla_prefill
from mla_lab.measure.attention import make_step_inputs, time_attention_path
from mla_lab.measure.timer import graphed, interleaved
from mla_lab.measure.tp import block_forward, make_block_inputs, make_moe_inputs, moe_forward
from mla_lab.models import load_model
from mla_lab.provenance import provenance
from mla_lab.strategies import PaddedQPath
from mla_lab.workload import Step

SEED_T = 16384
PROMPT = 1024
PRESET_STRATEGIES = ("per_call_empty:zeros", "per_call_empty:stale", "per_call_zeros", "private_workspace",
                     "shared_workspace:none", "shared_workspace:zero_per_call", "subchunk:2048:views",
                     "subchunk:4096:views", "subchunk:8192:views", "subchunk:4096")


class Sink:
    """Rows appended to ``out/name`` as they are measured (a kill keeps what was measured)."""

    def __init__(self, out: Path, prov: dict, process: int):
        self.out, self.prov, self.process = out, prov, process
        self.files: dict = {}

    def write(self, name: str, row: dict) -> None:
        row = {"process": self.process, **row, **self.prov}
        path = self.out / name
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new:
                w.writeheader()
            w.writerow(row)


def log(*a):
    print(f"[round3 {time.strftime('%H:%M:%S')}]", *a, flush=True)


def seed_step(prompt_len: int = PROMPT, T: int = SEED_T) -> Step:
    return Step([(j, 0, prompt_len) for j in range(T // prompt_len)])


def full_step(T: int = SEED_T) -> Step:
    return Step([(0, 0, T)])


def sm_scale_of(model) -> float:
    return 1.0 / math.sqrt(model.qk_nope_head_dim + model.qk_rope_head_dim)


def wall_and_gpu(fn):
    """(host wall ms until the GPU finished, CUDA-event ms) of one call."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    fn()
    b.record()
    b.synchronize()
    return (time.perf_counter() - t0) * 1e3, a.elapsed_time(b)


# ----------------------------------------------------------------------------------------------------------- cold


def part_cold(sink: Sink, smoke: bool) -> None:
    m = load_model("glm-5")
    H = m.heads_per_rank(8)
    step = seed_step()
    sm = sm_scale_of(m)
    inp = make_step_inputs(m, 8, step, PROMPT, seed=0)
    ql, qpe, kv, idx, tl = inp
    blk = make_block_inputs(m, 8, 0, SEED_T, seed=0, device="cuda")
    moe = make_moe_inputs(m, 8, 0, SEED_T, seed=0, device="cuda")
    cases = []
    for name in ("private_workspace", "per_call_empty:zeros"):
        p = PaddedQPath(name, num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
        cases.append((f"attention_path:{name}", lambda p=p: p(ql, qpe, kv, idx, sm, tl)))
    pb = PaddedQPath("private_workspace", num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
    cases.append(("attention_block:private_workspace", lambda: block_forward(pb, blk, sm, parts="compute")))
    cases.append(("moe_block:grouped_mm", lambda: moe_forward(moe, parts="compute", impl="grouped_mm")))
    steady_n = 5 if smoke else 20
    for what, fn in cases:
        firsts = [wall_and_gpu(fn) for _ in range(3)]
        steady = [wall_and_gpu(fn) for _ in range(steady_n)]
        med_w = statistics.median(w for w, _ in steady)
        med_g = statistics.median(g for _, g in steady)
        for i, (w, g) in enumerate(firsts, 1):
            sink.write("cold_start.csv", {"what": what, "call": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4),
                                          "steady_wall_ms": round(med_w, 4), "steady_gpu_ms": round(med_g, 4),
                                          "steady_n": steady_n, "T": SEED_T, "num_heads": H})
        log(f"cold {what}: call1 wall {firsts[0][0]:.1f} gpu {firsts[0][1]:.2f} | call2 gpu {firsts[1][1]:.2f} "
            f"| steady gpu {med_g:.3f} ms")
        # step-time spread within the process: every steady sample
        for i, (w, g) in enumerate(steady):
            sink.write("step_spread.csv", {"what": what, "sample": i, "wall_ms": round(w, 4), "gpu_ms": round(g, 4)})
    torch.cuda.empty_cache()


# -------------------------------------------------------------------------------------------------------- presets


def part_presets(sink: Sink, repeats: int) -> None:
    m = load_model("glm-5")
    for shape, step, plen, full in (("seed", seed_step(), PROMPT, False), ("full", full_step(), 2 * SEED_T, True)):
        res = time_attention_path(m, 8, step, plen, "h200", strategies=PRESET_STRATEGIES, full_topk=full,
                                  seed=0, device="cuda", repeats=repeats)
        for name in PRESET_STRATEGIES:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write("presets.csv", {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                           "median_ms": round(r["total"], 5), "workspace_bytes": r["workspace_bytes"],
                                           "peak_bytes": r["peak_bytes"], "repeats": repeats,
                                           "kernel_backend": res["kernel_backend"],
                                           "concat_backend": res["concat_backend"]})
        log(f"presets {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in PRESET_STRATEGIES))
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------------- subgraph


class ChunkLoop:
    """The sub-chunked attention path on ``n_ws`` workspaces of ``S`` rows (zeroed once), chunk i on stream
    i % n_ws (n_ws = 1: the current stream), views hand-off (the consumer, the W_UV bmm, is timed by the layer
    model; here the chunk's outputs are dropped, as ``time_attention_path`` does for ``:views``)."""

    def __init__(self, H, Hp, S, n_ws, T):
        self.H, self.S, self.T = H, S, T
        self.ws = [torch.zeros(S, Hp, 576, dtype=torch.bfloat16, device="cuda") for _ in range(n_ws)]
        # one workspace: the caller's (capturing) stream; two: side streams forked from it and joined back
        self.streams = [] if n_ws == 1 else [torch.cuda.Stream() for _ in range(n_ws)]
        self.bounds = [(s, min(s + S, T)) for s in range(0, T, S)]

    def _chunk(self, i, a, b, ql, qpe, kv, idx, sm, tl):
        q = self.ws[i % len(self.ws)][: b - a]
        concat_mla_q(ql[a:b], qpe[a:b], q)
        sparse_mla_prefill(q, kv, idx[a:b], sm, topk_length=None if tl is None else tl[a:b], actual_num_heads=self.H)

    def __call__(self, ql, qpe, kv, idx, sm, tl):
        if not self.streams:
            for i, (a, b) in enumerate(self.bounds):
                self._chunk(i, a, b, ql, qpe, kv, idx, sm, tl)
            return
        main = torch.cuda.current_stream()
        for s in self.streams:
            s.wait_stream(main)
        for i, (a, b) in enumerate(self.bounds):
            with torch.cuda.stream(self.streams[i % len(self.streams)]):
                self._chunk(i, a, b, ql, qpe, kv, idx, sm, tl)
        for s in self.streams:
            main.wait_stream(s)


def part_subgraph(sink: Sink, repeats: int) -> None:
    m = load_model("glm-5")
    H, Hp = m.heads_per_rank(8), 64
    sm = sm_scale_of(m)
    for shape, step, plen, full in (("seed", seed_step(), PROMPT, False), ("full", full_step(), 2 * SEED_T, True)):
        ql, qpe, kv, idx, tl = make_step_inputs(m, 8, step, plen, seed=0, full_topk=full)
        pr = PaddedQPath("private_workspace", num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
        fns = {"pr:eager": lambda: pr(ql, qpe, kv, idx, sm, tl)}
        fns["pr:graph"] = graphed(lambda: pr(ql, qpe, kv, idx, sm, tl))
        loops = []
        for S in (2048, 4096):
            one = ChunkLoop(H, Hp, S, 1, SEED_T)
            two = ChunkLoop(H, Hp, S, 2, SEED_T)
            loops += [one, two]
            fns[f"subchunk:{S}:views"] = lambda one=one: one(ql, qpe, kv, idx, sm, tl)
            fns[f"subchunk:{S}:graph"] = graphed(lambda one=one: one(ql, qpe, kv, idx, sm, tl))
            fns[f"subchunk:{S}:2stream"] = lambda two=two: two(ql, qpe, kv, idx, sm, tl)
            fns[f"subchunk:{S}:2stream_graph"] = graphed(lambda two=two: two(ql, qpe, kv, idx, sm, tl))
        samples = interleaved(fns, repeats=repeats, device="cuda")
        for name, xs in samples.items():
            ws_bytes = {"pr": SEED_T * Hp * 576 * 2}.get(name.split(":")[0])
            if ws_bytes is None:
                S = int(name.split(":")[1])
                ws_bytes = (2 if "2stream" in name else 1) * S * Hp * 576 * 2
            for i, ms in enumerate(xs):
                sink.write("subgraph.csv", {"shape": shape, "variant": name, "round": i, "ms": round(ms, 5),
                                            "median_ms": round(statistics.median(xs), 5),
                                            "workspace_bytes": ws_bytes, "repeats": repeats})
        log(f"subgraph {shape}: " + ", ".join(f"{n} {statistics.median(x):.3f}" for n, x in samples.items()))
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------------------- routes


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


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
        from torch.nn.attention import sdpa_kernel

        B, L, H = self.B, self.L, self.H
        q = self.q.view(B, L, H, self.dq).transpose(1, 2)
        kk = k.view(B, L, H, self.dq).transpose(1, 2)
        vv = v.reshape(B, L, H, v.shape[-1]).transpose(1, 2)
        with sdpa_kernel(_sdpa_backends()[self.backend]):
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


def exact_inputs(m, H, B, L, g):
    """MQA inputs for B prompts of L <= topk tokens where top-k = every earlier token (indices = the prompt's keys
    0..p, topk_length p + 1): the case where sparse attention equals dense causal attention."""
    T, topk = B * L, m.topk
    pos = torch.arange(L, device="cuda").repeat(B)
    base = torch.arange(B, device="cuda").repeat_interleave(L) * L
    j = torch.arange(topk, device="cuda")
    idx = torch.where(j[None, :] <= pos[:, None], base[:, None] + j[None, :], torch.full_like(j[None, :], -1))
    tl = (pos + 1).clamp(max=topk).to(torch.int32)
    return idx.to(torch.int32).view(T, 1, topk), tl


def part_routes(sink: Sink, repeats: int, smoke: bool) -> None:
    lens = (1024, 2048) if smoke else (512, 1024, 2048, 4096, 8192)
    for mname in ("glm-5", "deepseek-v3.2"):
        m = load_model(mname)
        H = m.heads_per_rank(8)
        backends, errs = _working_backends(m, H)
        backend = backends[0] if backends else None
        log(f"routes {mname}: SDPA backends {backends} (refused: {errs})")
        dn, dv = m.qk_nope_head_dim, m.v_head_dim
        for L in lens:
            B = SEED_T // L
            T = B * L
            g = torch.Generator(device="cuda").manual_seed(L)
            step = Step([(j, 0, L) for j in range(B)])
            ql, qpe, kv, idx, tl = make_step_inputs(m, 8, step, L, seed=L)
            if L <= m.topk:
                idx, tl = exact_inputs(m, H, B, L, g)
            sm = sm_scale_of(m)
            q_nope = torch.randn(H, T, dn, device="cuda", dtype=torch.bfloat16, generator=g)
            w_uk = (torch.randn(H, dn, m.kv_lora_rank, device="cuda", generator=g) / math.sqrt(dn)).to(torch.bfloat16)
            w_uv = (torch.randn(H, m.kv_lora_rank, dv, device="cuda", generator=g)
                    / math.sqrt(m.kv_lora_rank)).to(torch.bfloat16)
            ql_buf = torch.empty(H, T, m.kv_lora_rank, device="cuda", dtype=torch.bfloat16)
            paths = {s: PaddedQPath(s, num_heads=H, max_num_batched_tokens=T, arch="h200", device="cuda",
                                    reuse_pad_block=True) for s in ("private_workspace", "per_call_empty:zeros")}

            def mqa(p):
                torch.bmm(q_nope, w_uk, out=ql_buf)  # W_UK absorption: [H, T, 512]
                o, _ = p(ql_buf.transpose(0, 1), qpe, kv, idx, sm, tl)
                return torch.bmm(o.transpose(0, 1), w_uv)  # W_UV: [H, T, v]

            fns = {f"mqa:{s}": (lambda p=p: mqa(p)) for s, p in paths.items()}
            fns["mqa_kernel_only:private_workspace"] = lambda: paths["private_workspace"](
                ql_buf.transpose(0, 1), qpe, kv, idx, sm, tl)
            if backend is not None:
                r = MHARoute(m, H, B, L, backend, g)
                kvb = r.upproj()
                k, v = r.assemble(kvb)
                fns["mha:total"] = r
                fns["mha:upproj"] = r.upproj
                fns["mha:assemble"] = lambda r=r, kvb=kvb: r.assemble(kvb)
                fns[f"mha:sdpa:{backend}"] = lambda r=r, k=k, v=v: r.attend(k, v)
                for other in backends[1:]:
                    r2 = MHARoute(m, H, B, L, other, g)
                    k2, v2 = r2.assemble(r2.upproj())
                    fns[f"mha:sdpa:{other}"] = lambda r2=r2, k2=k2, v2=v2: r2.attend(k2, v2)
            samples = interleaved(fns, repeats=repeats, device="cuda")
            for name, xs in samples.items():
                for i, ms in enumerate(xs):
                    sink.write("routes.csv", {
                        "model": mname, "num_heads": H, "prompt_len": L, "num_prompts": B, "T": T, "route": name,
                        "round": i, "ms": round(ms, 5), "median_ms": round(statistics.median(xs), 5),
                        "sdpa_backend": (name.rsplit(":", 1)[1] if name.startswith("mha:sdpa:") else backend) or "",
                        "v_padded": bool(dv != dn + m.qk_rope_head_dim and (
                            name.endswith(":flash") or (backend == "flash" and not name.startswith("mha:sdpa:")))),
                        "exact_topk": L <= m.topk, "qk_head_dim": dn + m.qk_rope_head_dim, "v_head_dim": dv,
                        "repeats": repeats})
            log(f"routes {mname} L={L}: " + ", ".join(f"{n} {statistics.median(x):.3f}" for n, x in samples.items()))
            if L == 1024 and backend is not None:
                _route_check(sink, m, H, B, L, backend, g, mname)
            torch.cuda.empty_cache()


def _route_check(sink, m, H, B, L, backend, g, mname):
    """MHA route == MQA route when top-k covers every earlier token (consistent weights: W_UK / W_UV are the
    nope / v halves of kv_b_proj; the MQA query is q_nope absorbed by W_UK and the RoPE part; kv latent = [kv_c,
    k_pe]). Relative Frobenius error of the [T, H, v] outputs, bf16 inputs."""
    T = B * L
    dn, dr, dv = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    r = MHARoute(m, H, B, L, backend, g)
    o_mha = r().transpose(1, 2).reshape(T, H, dv).float()
    w = r.w_kvb.view(H, dn + dv, m.kv_lora_rank)
    w_uk, w_uv = w[:, :dn], w[:, dn:]  # [H, dn, 512], [H, dv, 512]
    q_nope, q_pe = r.q[..., :dn], r.q[..., dn:]
    ql = torch.einsum("thd,hdc->thc", q_nope.float(), w_uk.float()).to(torch.bfloat16)
    kv = torch.cat([r.kv_c, r.k_pe[:, 0]], dim=-1).view(T, 1, m.kv_lora_rank + dr)
    idx, tl = exact_inputs(m, H, B, L, g)
    p = PaddedQPath("private_workspace", num_heads=H, max_num_batched_tokens=T, arch="h200", device="cuda")
    o_lat, _ = p(ql, q_pe, kv, idx, r.sm, tl)
    o_mqa = torch.einsum("thc,hvc->thv", o_lat.float(), w_uv.float())
    rel = float((o_mha - o_mqa).norm() / o_mqa.norm())
    sink.write("routes_check.csv", {"model": mname, "num_heads": H, "prompt_len": L, "T": T, "sdpa_backend": backend,
                                    "rel_err": rel, "kernel_backend": str(last_backend("sparse_mla_prefill"))})
    log(f"route check {mname} L={L}: rel err MHA vs MQA {rel:.2e}")


# ----------------------------------------------------------------------------------------------------- moe_decode


def part_moe_decode(sink: Sink, smoke: bool) -> None:
    from triton.testing import do_bench_cudagraph

    m = load_model("glm-5")
    ep = 8
    E, k, I, h = m.n_routed_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.hidden_size  # noqa: E741
    e_loc = E // ep
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(e_loc, 2 * I, h, device="cuda", dtype=torch.bfloat16, generator=g).div_(math.sqrt(h))
    w2 = torch.randn(e_loc, h, I, device="cuda", dtype=torch.bfloat16, generator=g).div_(math.sqrt(I))
    f8 = torch.float8_e4m3fn
    # fp8 weights with per-output-row scales (row-wise), column-major views as the grouped ops take them
    s13 = (w13.abs().amax(dim=2).float() / 448.0).clamp(min=1e-8)  # [e, 2I]
    s2 = (w2.abs().amax(dim=2).float() / 448.0).clamp(min=1e-8)  # [e, h]
    w13_8 = (w13.float() / s13[..., None]).to(f8)
    w2_8 = (w2.float() / s2[..., None]).to(f8)
    has_scaled = hasattr(torch, "_scaled_grouped_mm")
    for T in ((1, 32) if smoke else (1, 8, 16, 32, 64, 128, 256)):
        top = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(T)])
        local = top[(top < e_loc)]  # experts 0..e_loc-1 are this rank's
        counts = torch.bincount(local.flatten(), minlength=e_loc)
        P = int(counts.sum())
        pairs = max(P, 1)
        pad_counts = counts.clone()
        if P == 0:
            pad_counts[0] = 1
        offs = torch.cumsum(pad_counts, 0).to(torch.int32)
        xs = torch.randn(pairs, h, device="cuda", dtype=torch.bfloat16, generator=g)
        experts_hit = int((counts > 0).sum())

        def bf16():
            gu = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
            a = (F.silu(gu[:, :I]) * gu[:, I:]).contiguous()
            return torch._grouped_mm(a, w2.transpose(1, 2), offs=offs)

        impls = {"bf16_grouped_mm": bf16}
        if has_scaled:
            def fp8():
                xa = xs.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 448.0
                x8 = (xs.float() / xa).to(f8)
                gu = torch._scaled_grouped_mm(x8, w13_8.transpose(1, 2), xa.view(-1), s13, offs=offs,
                                              out_dtype=torch.bfloat16)
                a = F.silu(gu[:, :I]) * gu[:, I:]
                aa = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-8) / 448.0
                a8 = (a.float() / aa).to(f8)
                return torch._scaled_grouped_mm(a8, w2_8.transpose(1, 2), aa.view(-1), s2, offs=offs,
                                                out_dtype=torch.bfloat16)

            impls["fp8_scaled_grouped_mm"] = fp8
        ref = bf16().float()
        for name, fn in impls.items():
            try:
                out = fn().float()
                torch.cuda.synchronize()
                rel = float((out - ref).norm() / ref.norm().clamp(min=1e-12))
                ms = float(do_bench_cudagraph(fn, rep=50 if smoke else 200, return_mode="median"))
                wbytes = experts_hit * 3 * I * h * (1 if "fp8" in name else 2)
                sink.write("moe_decode.csv", {"model": "glm-5", "ep": ep, "T": T, "pairs": P,
                                              "experts_hit": experts_hit, "local_experts": e_loc, "impl": name,
                                              "ms": round(ms, 5), "weight_bytes": wbytes,
                                              "gbps": round(wbytes / ms / 1e6, 1), "rel_err_vs_bf16": rel,
                                              "timing": "graph (do_bench_cudagraph median)"})
                log(f"moe decode T={T} {name}: {ms:.4f} ms ({wbytes / ms / 1e6:.0f} GB/s weights), rel {rel:.1e}")
            except Exception as e:  # noqa: BLE001 - the fp8 op's support varies by torch build; recorded
                sink.write("moe_decode.csv", {"model": "glm-5", "ep": ep, "T": T, "pairs": P,
                                              "experts_hit": experts_hit, "local_experts": e_loc, "impl": name,
                                              "ms": "", "weight_bytes": "", "gbps": "", "rel_err_vs_bf16": "",
                                              "timing": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}"})
                log(f"moe decode T={T} {name} failed: {e}")
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------- concat_ceiling


def part_concat_ceiling(sink: Sink, repeats: int) -> None:
    """Is ~95 % of a contiguous copy the ceiling of a gapped write? The concat into the padded [T, 64, 576]
    workspace against a contiguous copy of the same bytes and against torch's strided copy of the same bytes into
    the same padded layout (``out[:, :H].copy_(src)``), graph timing (one call captured, replayed under do_bench
    with L2 flushed: ``mla_lab.measure.timer.median_ms(graph=True)``), rounds rotated."""
    from mla_lab.measure.timer import median_ms

    for T in (4096, 16384):
        for H in (8, 16):
            g = torch.Generator(device="cuda").manual_seed(T + H)
            ql = torch.randn(H, T, 512, device="cuda", dtype=torch.bfloat16, generator=g).transpose(0, 1)
            qpe = torch.randn(T, H, 192 + 64, device="cuda", dtype=torch.bfloat16, generator=g)[..., 192:]
            ws = torch.zeros(T, 64, 576, device="cuda", dtype=torch.bfloat16)
            src = torch.randn(T, H, 576, device="cuda", dtype=torch.bfloat16, generator=g)
            dst = torch.empty_like(src)
            fns = {"concat_v2_padded": lambda: concat_mla_q(ql, qpe, ws[:T]),
                   "strided_copy_padded": lambda: ws[:T, :H].copy_(src),
                   "copy_contiguous": lambda: dst.copy_(src)}
            names = list(fns)
            for r in range(repeats):
                k = r % len(names)
                for n in names[k:] + names[:k]:
                    us = 1e3 * median_ms(fns[n], graph=True, rep=50)
                    sink.write("concat_ceiling.csv", {"T": T, "num_heads": H, "padded_heads": 64, "method": n,
                                                      "round": r, "us": round(us, 3),
                                                      "bytes": 2 * T * H * 576 * 2,
                                                      "timer": "graph (median_ms graph=True, L2 flushed)"})
            log(f"concat ceiling T={T} H={H} done")


# ---------------------------------------------------------------------------------------------------- strategies


def part_strategies(sink: Sink, repeats: int, names) -> None:
    """Named strategies through the package (``time_attention_path``) at the seed and full-topk shapes: rows as
    ``presets`` (file ``strategies.csv``)."""
    m = load_model("glm-5")
    for shape, step, plen, full in (("seed", seed_step(), PROMPT, False), ("full", full_step(), 2 * SEED_T, True)):
        res = time_attention_path(m, 8, step, plen, "h200", strategies=tuple(names), full_topk=full,
                                  seed=0, device="cuda", repeats=repeats)
        for name in names:
            r = res[name]
            for i, ms in enumerate(r["samples"]):
                sink.write("strategies.csv", {"shape": shape, "strategy": name, "round": i, "ms": round(ms, 5),
                                              "median_ms": round(r["total"], 5),
                                              "workspace_bytes": r["workspace_bytes"],
                                              "peak_bytes": r["peak_bytes"], "repeats": repeats})
        log(f"strategies {shape}: " + ", ".join(f"{n} {res[n]['total']:.3f}" for n in names))


# -------------------------------------------------------------------------------------------------------- content


class NvmlSampler:
    """SM clock (MHz) and power (W) sampled every ``period_s`` in a thread, with host timestamps."""

    def __init__(self, period_s=0.02):
        self.samples, self.period, self.stop = [], period_s, threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML: no clock columns
            self.nv = None

    def run(self):
        while not self.stop.is_set():
            try:
                clk = self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM)
                pw = self.nv.nvmlDeviceGetPowerUsage(self.h) / 1e3
                self.samples.append((time.perf_counter(), clk, pw))
            except Exception:  # noqa: BLE001
                pass
            time.sleep(self.period)

    def __enter__(self):
        if self.nv:
            self.t = threading.Thread(target=self.run, daemon=True)
            self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        if self.nv:
            self.t.join()

    def window(self, t0, t1):
        xs = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        if not xs:
            return None, None
        return statistics.median(c for c, _ in xs), statistics.median(p for _, p in xs)


def part_content(sink: Sink, rounds: int, smoke: bool) -> None:
    m = load_model("glm-5")
    tp = 8
    H = m.heads_per_rank(tp)
    sm = sm_scale_of(m)
    layers = 6 if smoke else 78
    step = seed_step()
    ql, qpe, kv, idx, tl = make_step_inputs(m, tp, step, PROMPT, seed=0)
    blk = make_block_inputs(m, tp, 0, SEED_T, seed=0, device="cuda")
    blk.update({"ql_nope": ql, "q_pe": qpe, "kv": kv, "indices": idx, "topk_length": tl})
    moe = make_moe_inputs(m, tp, 0, SEED_T, seed=0, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    hid = torch.randn(SEED_T, m.hidden_size, device="cuda", dtype=torch.bfloat16, generator=g)
    w_qa = torch.randn(m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim, m.hidden_size, device="cuda",
                       dtype=torch.bfloat16, generator=g).div_(math.sqrt(m.hidden_size))  # fused q_a + kv_a
    w_qb = torch.randn(H * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank, device="cuda",
                       dtype=torch.bfloat16, generator=g).div_(math.sqrt(m.q_lora_rank))
    paths = {c: PaddedQPath(s, num_heads=H, max_num_batched_tokens=SEED_T, arch="h200", device="cuda")
             for c, s in (("zeros", "private_workspace"), ("stale", "shared_workspace:none"))}

    def run_step(content):
        p = paths[content]
        evs = [[torch.cuda.Event(enable_timing=True) for _ in range(5)] for _ in range(layers)]
        for i in range(layers):
            e0, e1, e2, e3, e4 = evs[i]
            e0.record()
            qkv = F.linear(hid, w_qa)  # fused q_a + kv_a (+ k_pe)
            F.linear(qkv[:, : m.q_lora_rank], w_qb)  # q_b
            e1.record()
            o, _ = p(blk["ql_nope"], blk["q_pe"], blk["kv"], blk["indices"], sm, blk["topk_length"])  # concat+kernel
            e2.record()
            x = torch.bmm(o.transpose(0, 1), blk["w_uv"]).transpose(0, 1).reshape(SEED_T, -1)  # W_UV
            F.linear(x, blk["w_o"])  # o_proj
            e3.record()
            moe_forward(moe, parts="compute", impl="grouped_mm")
            e4.record()
        e4.synchronize()
        parts = {k: sum(evs[i][j].elapsed_time(evs[i][j + 1]) for i in range(layers))
                 for j, k in enumerate(("proj_ms", "attn_path_ms", "post_ms", "moe_ms"))}
        total = evs[0][0].elapsed_time(evs[-1][4])
        return total, parts

    run_step("zeros")
    run_step("stale")  # warm-up both
    with NvmlSampler() as nv:
        for r in range(rounds):
            order = ("zeros", "stale") if r % 2 == 0 else ("stale", "zeros")
            for c in order:
                t0 = time.perf_counter()
                total, parts = run_step(c)
                t1 = time.perf_counter()
                clk, pw = nv.window(t0, t1)
                sink.write("content_loop.csv", {"content": c, "round": r, "layers": layers, "T": SEED_T,
                                                "num_heads": H, "step_ms": round(total, 4),
                                                **{k: round(v, 4) for k, v in parts.items()},
                                                "sm_clock_mhz": clk, "power_w": pw,
                                                "nvml_samples": len(nv.samples)})
                log(f"content r{r} {c}: step {total:.1f} ms, " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
                    + f", SM {clk} MHz, {pw} W")
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------------------- main


def _stale_fill_on_gpu() -> None:
    """The lab's stale stand-in (N(0, 1), seeded) drawn on the tensor's device instead of on the CPU: the same
    distribution, seconds less per [16384, 56, 576] fill (mla_lab.strategies.stale_fill draws on the CPU)."""
    import mla_lab.strategies as st

    def fill(t, seed: int = 1234):
        g = torch.Generator(device=t.device).manual_seed(seed)
        t.copy_(torch.randn(t.shape, generator=g, device=t.device, dtype=torch.float32).to(t.dtype))
        return t

    st.stale_fill = fill



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the CSVs (rows appended)")
    ap.add_argument("--process", type=int, required=True, help="index of this fresh process (1..N)")
    ap.add_argument("--parts", default="cold,presets,subgraph,routes,moe_decode,content")
    ap.add_argument("--repeats", type=int, default=11, help="interleaved rounds per measured set")
    ap.add_argument("--content-rounds", type=int, default=6)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--strategies", default="per_call_empty:zeros,private_workspace",
                    help="part 'strategies': canonical names timed through mla_lab.measure.attention")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("round3.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    _stale_fill_on_gpu()
    prov = provenance("measured")
    sink = Sink(out, prov, a.process)
    reps = 3 if a.smoke else a.repeats
    t_start = time.perf_counter()
    for part in a.parts.split(","):
        t0 = time.perf_counter()
        try:
            if part == "cold":
                part_cold(sink, a.smoke)
            elif part == "presets":
                part_presets(sink, reps)
            elif part == "subgraph":
                part_subgraph(sink, reps)
            elif part == "routes":
                part_routes(sink, reps, a.smoke)
            elif part == "moe_decode":
                part_moe_decode(sink, a.smoke)
            elif part == "concat_ceiling":
                part_concat_ceiling(sink, 2 if a.smoke else 5)
            elif part == "strategies":
                part_strategies(sink, reps, a.strategies.split(","))
            elif part == "content":
                part_content(sink, 2 if a.smoke else a.content_rounds, a.smoke)
            else:
                print(f"--parts: {part!r} is not a part", file=sys.stderr)
                return 2
        except Exception as e:  # noqa: BLE001 - one part failing must not lose the others' rows
            import traceback

            traceback.print_exc()
            log(f"part {part} FAILED: {type(e).__name__}: {e}")
        log(f"part {part} done in {time.perf_counter() - t0:.1f} s (process {a.process}, "
            f"{time.perf_counter() - t_start:.0f} s so far)")
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
